"""rocprof-attach: ROCm's attach command, over Remora.

Same options and environment variables as ROCm's rocprof-attach; run as
python/rocprof-attach or `python3 -m remora`. See docs/python.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import EXIT_CODES, RemoraError, Session, _render, attach
from ._capi import EXIT_OK, EXIT_USAGE, find_library

# (option, environment variable) pairs, in the order -h lists them.
ENV_FALLBACKS = [
    ("-p/--pid", "ROCPROF_ATTACH_PID"),
    ("-t/--attach-tool-library", "ROCPROF_ATTACH_TOOL_LIBRARY"),
    ("-d/--attach-duration-msec", "ROCPROF_ATTACH_DURATION"),
    ("--attach-library", "ROCPROF_ATTACH_LIBRARY"),
    ("--attach-children", "ROCPROF_ATTACH_CHILDREN"),
    ("--slurm-job", "ROCPROF_ATTACH_SLURM_JOB"),
]

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


class UsageError(Exception):
    pass


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean: use true/false, yes/no, 1/0 (or on/off)")


def parse_pid(text: str) -> int:
    try:
        pid = int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"{text!r} is not a process id") from None
    if not 0 < pid < 2**31:
        raise ValueError(f"{text!r} is not a process id (a positive integer)")
    return pid


def parse_msec(text: str) -> int:
    try:
        msec = int(text.strip(), 10)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of milliseconds") from None
    if msec < 0:
        raise ValueError(f"{text!r} is negative")
    return msec


def _argtype(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__.replace("parse_", "")
    return convert


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 1, as the remora command's do
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _epilog() -> str:
    env = "\n".join(f"  {var:<29} {opt}" for opt, var in ENV_FALLBACKS)
    codes = "\n".join(f"  {code:>2}  {text}" for code, text in EXIT_CODES)
    return f"""\
Each option falls back to an environment variable when not given:
{env}
The command line wins over the environment. Booleans take true/false,
yes/no, 1/0 (and on/off), in any case.

The caller's ROCP* and REMORA_* variables are set in each target before its
tools load (so REMORA_LOG, or a tool's own settings, reach it).

Without -d, the tools stay attached until Enter is pressed (a line on
stdin), SIGINT (Ctrl-C) or SIGTERM; at the end of stdin, only a signal
detaches. With -d, they are detached after MSEC milliseconds (or at a
signal). Either way the command then detaches and exits 0. Should it die
(SIGKILL) while attached, the agent in each target detaches the tools itself
(with libremora.so; a rocattach library leaves them attached).

Exit codes:
{codes}
With a rocattach library (--attach-library), whose status codes are fewer:
invalid argument 1, process not found 2, not permitted 3, not supported 5,
ptrace error 9, other errors 12.
"""


def build_parser(prog: str = "rocprof-attach") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description=(
            "Attach tool libraries to a running process (and, by default, every process\n"
            "below it), wait, then detach them. Remora's implementation of ROCm's\n"
            "rocprof-attach: the target needs no preparation; each tool implements\n"
            "Remora's tool ABI (remora/tool.h)."
        ),
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-p",
        "--pid",
        type=_argtype(parse_pid),
        metavar="PID",
        help="the process to attach to, as this shell sees it (required; env ROCPROF_ATTACH_PID)",
    )
    p.add_argument(
        "-t",
        "--attach-tool-library",
        metavar="PATHS",
        help=(
            "the tool libraries, colon-separated, attached in that order "
            "(env ROCPROF_ATTACH_TOOL_LIBRARY; default: libremora-tool.so next to the library in use, "
            "when it is there)"
        ),
    )
    p.add_argument(
        "-d",
        "--attach-duration-msec",
        type=_argtype(parse_msec),
        metavar="MSEC",
        help="detach after MSEC milliseconds (env ROCPROF_ATTACH_DURATION; default: at Enter or Ctrl-C)",
    )
    p.add_argument(
        "--attach-library",
        metavar="PATH",
        help=(
            "the library that attaches: libremora.so, or a rocattach library "
            "(librocprofiler-sdk-rocattach.so) (env ROCPROF_ATTACH_LIBRARY; default: $REMORA_LIBRARY, "
            "then build/lib/libremora.so of this checkout, then libremora.so.0 from the dynamic loader)"
        ),
    )
    p.add_argument(
        "--attach-children",
        type=_argtype(parse_bool),
        nargs="?",
        const=True,
        metavar="BOOL",
        help=(
            "also attach every process below PID (default true; --attach-children=false attaches PID only; "
            "env ROCPROF_ATTACH_CHILDREN)"
        ),
    )
    p.add_argument(
        "--slurm-job",
        metavar="JOB",
        help=(
            "instead of -p: every rank of this running Slurm job (JOBID or JOBID.STEP) on every node, "
            "one merged profile (runs remora attach --slurm; env ROCPROF_ATTACH_SLURM_JOB)"
        ),
    )
    from . import __version__

    p.add_argument("--version", action="version", version=f"%(prog)s (Remora {__version__})")
    return p


def _from_env(args: argparse.Namespace, environ) -> None:
    """Fills the options not given from the environment; UsageError names
    the variable when a value is malformed."""

    def get(var: str) -> str | None:
        v = environ.get(var)
        return v if v is not None and v.strip() != "" else None

    for dest, var, parse in (
        ("pid", "ROCPROF_ATTACH_PID", parse_pid),
        ("attach_tool_library", "ROCPROF_ATTACH_TOOL_LIBRARY", str),
        ("attach_duration_msec", "ROCPROF_ATTACH_DURATION", parse_msec),
        ("attach_library", "ROCPROF_ATTACH_LIBRARY", str),
        ("attach_children", "ROCPROF_ATTACH_CHILDREN", parse_bool),
        ("slurm_job", "ROCPROF_ATTACH_SLURM_JOB", str),
    ):
        if getattr(args, dest) is not None:
            continue
        value = get(var)
        if value is None:
            continue
        try:
            setattr(args, dest, parse(value))
        except ValueError as e:
            raise UsageError(f"{var}: {e}") from None
    if args.attach_children is None:
        args.attach_children = True


def main(argv: list[str] | None = None, prog: str = "rocprof-attach", environ=None) -> int:
    environ = os.environ if environ is None else environ
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        _from_env(args, environ)
    except UsageError as e:
        parser.error(str(e))
    if args.slurm_job is not None:
        if args.pid is not None:
            parser.error("give -p PID or --slurm-job JOB, not both")
        try:
            result = attach(
                slurm_job=args.slurm_job,
                attach_tool_library=args.attach_tool_library,
                attach_duration_msec=args.attach_duration_msec,
                attach_library=args.attach_library,
            )
        except RemoraError as e:
            print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
            return e.exit_code
        return 14 if result.partial else EXIT_OK
    if args.pid is None:
        parser.error("no process: give -p PID (or set ROCPROF_ATTACH_PID), or --slurm-job JOB")

    def say(text: str) -> None:
        print(f"{prog}: {text}", file=sys.stderr, flush=True)

    def on_attached(session: Session) -> None:
        what = f"process {session.pid}" + (" and its children" if session.children else "")
        until = (
            f"detaching after {args.attach_duration_msec} ms"
            if args.attach_duration_msec is not None
            else "press Enter (or Ctrl-C) to detach"
        )
        say(f"attached {':'.join(session.tools)} to {what}; {until}")

    started = _render.now()
    try:
        reason = attach(
            args.pid,
            args.attach_tool_library,
            attach_duration_msec=args.attach_duration_msec,
            attach_library=args.attach_library,
            attach_children=args.attach_children,
            on_attached=on_attached,
        )
    except RemoraError as e:
        say(f"error: {e}")
        return e.exit_code
    say(f"detached from process {args.pid} ({reason})")
    if _uses_default_tool(args.attach_tool_library):
        _render_sessions(args, environ, started, say)
    return EXIT_OK


def _uses_default_tool(tools: str | None) -> bool:
    return not tools or any(os.path.basename(t) == _render.DEFAULT_TOOL_FILE for t in tools.split(":"))


def _render_sessions(args: argparse.Namespace, environ, started: float, say) -> None:
    """The default tool leaves raw records; render them as `remora report` does."""
    try:
        root = _render.output_root(args.pid, environ)
    except OSError as e:
        say(f"cannot find the default tool's output: {e}")
        return
    sessions = _render.finished_sessions(root, started)
    if not sessions:
        say(f"no output from the default tool under {root} (a tool error is printed on the target's stderr)")
        return
    library = find_library(args.attach_library)
    for d in sessions:
        try:
            _render.render(d, library)
        except OSError as e:
            say(f"{e}; render it with: remora report {d}")
            continue
        with open(os.path.join(d, "summary.txt"), encoding="utf-8", errors="replace") as f:
            print(f.read(), end="", flush=True)
        say(f"rendered {d} (again with: remora report {d})")


if __name__ == "__main__":
    sys.exit(main())
