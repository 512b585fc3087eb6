"""Remora from Python: attach tool libraries to running processes.

    import remora

    # Attach the tool to process 4242 and its children for 5 s, then detach.
    remora.attach(4242, "/opt/tools/libmytool.so", attach_duration_msec=5000)

    # Attached while the block runs; detached on leaving it, also on errors.
    with remora.attached(4242, "/opt/tools/libmytool.so") as session:
        print(remora.status(4242))

Pure ctypes over libremora.so (include/remora/remora.h), or over a
rocattach library (include/rocattach.h) given as attach_library; nothing is
compiled. Failures raise RemoraError, which carries the status code, its
name and Remora's message. See docs/python.md.

Threads. Every function may be called from any thread; calls on one process
are serialised by the library. attach() handles SIGINT/SIGTERM only when it
runs on the main thread.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Callable, Union

from . import _capi, _slurm
from ._capi import EXIT_CODES, RemoraError, Status, exit_code_for
from ._slurm import SlurmJobResult

__all__ = [
    "attach",
    "SlurmJobResult",
    "attached",
    "detach",
    "status",
    "Session",
    "AgentStatus",
    "RemoraError",
    "Status",
    "library_path",
    "default_tool",
    "exit_code_for",
    "EXIT_CODES",
]

__version__ = "0.1.0"

PathLike = Union[str, "os.PathLike[str]"]
Tools = Union[PathLike, Iterable[PathLike], None]
Env = Union[Mapping[str, str], Iterable[str], None]

# The caller's variables that travel to the target, as rocattach does
# (include/rocattach.h): tools are configured through them.
_FORWARDED_PREFIXES = ("ROCP", "REMORA_")


@dataclasses.dataclass(frozen=True)
class AgentStatus:
    """What Remora's agent in a process reports (remora_agent_state_t)."""

    pid: int
    agent_loaded: bool  # libremora-agent.so is loaded in the process
    attached: bool  # tools are attached now
    lease_expired: bool  # the controller holding the lease died and the agent detached
    sessions: int  # attaches so far
    detaches: int  # detaches so far
    listener_tid: int  # the agent's listener thread, 0 if none
    lease_pid: int  # the controller holding the lease, 0 if none
    tools: tuple[str, ...]  # the loaded tool libraries
    message: str  # why the agent's last call failed ("" if it did not)
    session_channel: str = "ptrace"  # how the attached session came: "ptrace" or "socket"


def library_path(attach_library: PathLike | None = None) -> str:
    """The library attach() would use: `attach_library`, else $REMORA_LIBRARY,
    else ../build/lib/libremora.so next to this package, else the soname
    libremora.so.0 (for the dynamic loader)."""
    return _capi.find_library(attach_library)


def default_tool(attach_library: PathLike | None = None) -> str | None:
    """libremora-tool.so next to the library in use, or None when it is not there."""
    return _capi.load(attach_library).default_tools()


def _pid(pid: int, zero_ok: bool = False) -> int:
    pid = operator.index(pid)  # TypeError for non-integers (and floats)
    if not (0 < pid < 2**31 or (zero_ok and pid == 0)):
        raise _capi.invalid_argument(f"pid {pid} is not a process id" + (" (0 means all)" if zero_ok else ""))
    return pid


def _tools(tools: Tools, backend: _capi.Backend) -> str:
    if tools is None:
        found = backend.default_tools()
        if found is None:
            where = backend.directory or "the library's directory"
            raise _capi.invalid_argument(
                f"no tool library given, and the default tool {_capi.DEFAULT_TOOL_FILE} is not in {where}: "
                "pass attach_tool_library (rocprof-attach -t) the path of a tool that implements "
                "Remora's tool ABI (remora/tool.h), or build the default tool (cmake --build build --target remora-tool)"
            )
        return found
    if isinstance(tools, str):
        items = tools.split(":")
    else:
        items = [os.fspath(tools)] if isinstance(tools, os.PathLike) else [os.fspath(t) for t in tools]
        for t in items:
            if ":" in t:
                raise _capi.invalid_argument(f"tool path {t!r} contains ':', which separates tools; rename or link it")
    out = []
    for t in items:
        if not t:
            continue
        # A path that exists here is made absolute: the target's working
        # directory is not ours. Anything else goes as given (a bare name is
        # searched by the target's dynamic loader).
        out.append(os.path.abspath(t) if os.path.exists(t) else t)
    if not out:
        raise _capi.invalid_argument(f"no tool library in {tools!r}: give at least one path")
    return ":".join(out)


def _env(env: Env, forward_environment: bool) -> list[str]:
    merged: dict[str, str] = {}
    if forward_environment:
        merged.update((k, v) for k, v in os.environ.items() if k.startswith(_FORWARDED_PREFIXES))
    if env is not None:
        if isinstance(env, Mapping):
            pairs = list(env.items())
        else:
            if isinstance(env, str):
                raise TypeError("env: give a mapping or a list of 'NAME=VALUE' strings, not one string")
            pairs = []
            for e in env:
                if "=" not in e:
                    raise _capi.invalid_argument(f"environment entry {e!r}: expected NAME=VALUE")
                pairs.append(e.split("=", 1))
        for name, value in pairs:
            if not name or "=" in name:
                raise _capi.invalid_argument(f"environment variable name {name!r}: expected a non-empty name without '='")
            merged[name] = str(value)
    return [f"{k}={v}" for k, v in merged.items()]


@dataclasses.dataclass(frozen=True)
class _AttachOptions:
    """How to attach: the options that attach(), attached() and Session() all
    take, defined here once with their defaults (documented on attach()).
    Plain data: the entry points check the values, in the order they did
    when each spelled the options out."""

    attach_library: PathLike | None = None
    attach_children: bool = True
    env: Env = None
    lease: bool = True
    timeout_msec: int | None = None
    agent_path: PathLike | None = None
    forward_environment: bool = True
    unload: bool = False
    channel: str = "auto"

    def keywords(self) -> dict[str, object]:
        """The options as keyword arguments of another entry point."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _takes_attach_options(*, positional: tuple[str, ...] = ()):
    """Gives the decorated entry point its public signature: its own
    parameters with the _AttachOptions fields in place of its `options`
    parameter. The fields named in `positional` follow its positional
    parameters (attach() takes attach_library, attach_children and env by
    position too), the others are keyword-only, before its own keyword-only
    ones. The body receives the bound fields as one _AttachOptions."""

    def decorate(fn):
        own = inspect.signature(fn)
        options = [
            inspect.Parameter(
                f.name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name in positional else inspect.Parameter.KEYWORD_ONLY,
                default=f.default,
                annotation=f.type,
            )
            for f in dataclasses.fields(_AttachOptions)
        ]
        params = [p for p in own.parameters.values() if p.name != "options"]
        leading = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        trailing = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        options.sort(key=lambda p: p.kind)  # positional ones first, in field order
        public = own.replace(parameters=leading + options + trailing)
        names = [f.name for f in dataclasses.fields(_AttachOptions)]

        @functools.wraps(fn)
        def entry(*args, **kwargs):
            bound = public.bind(*args, **kwargs)  # TypeError as for any call that does not fit
            bound.apply_defaults()
            values = bound.arguments
            chosen = _AttachOptions(**{name: values.pop(name) for name in names})
            return fn(**values, options=chosen)

        entry.__signature__ = public
        return entry

    return decorate


class Session:
    """Tools attached to one process (and its tree, with attach_children).

    Made by attached(). detach() ends it (once; later calls do nothing); so
    does leaving a `with` block, also on exceptions. A Session that is never
    detached stays attached; with lease=True (the default) the agents detach
    the tools themselves when this process exits.
    """

    @_takes_attach_options()
    def __init__(self, pid: int, attach_tool_library: Tools = None, *, options: _AttachOptions):
        self.pid = _pid(pid)
        self._backend = _capi.load(options.attach_library)
        self.library = self._backend.path
        # The process itself first (gone, a zombie, a kernel thread, traced,
        # statically linked, this process), as the remora command refuses
        # it: before the tools are looked for.
        channel = str(options.channel)
        _capi.channel_code(channel)  # an unknown channel is the caller's bug, said first
        self._backend.check(self.pid, bool(options.attach_children), channel)
        self.tools = _tools(attach_tool_library, self._backend).split(":")
        self.children = bool(options.attach_children)
        self.unload = bool(options.unload)
        # (pid, tool) pairs the detach's unload left loaded; () until then.
        self.kept_tools: tuple[tuple[int, str], ...] = ()
        if self.unload and not self._backend.can_unload:
            raise _capi.unload_unsupported(self.library)  # before anything is attached
        timeout_msec = options.timeout_msec
        if timeout_msec is not None and not (0 <= int(timeout_msec) < 2**32):
            raise _capi.invalid_argument(f"timeout_msec {timeout_msec} is out of range")
        self._detached = False
        try:
            self._backend.attach(
                self.pid,
                ":".join(self.tools),
                _env(options.env, options.forward_environment),
                self.children,
                bool(options.lease),
                None if timeout_msec is None else int(timeout_msec),
                os.fspath(options.agent_path) if options.agent_path else None,
                channel,
            )
        except RemoraError as e:
            if self.children:
                # Processes of the tree that did attach stay attached
                # (remora_attach_tree): undo them, so that a failed attach
                # leaves nothing behind.
                try:
                    self._backend.detach(self.pid, True)
                except RemoraError:
                    pass
            self._detached = True
            raise e from None

    @property
    def attached(self) -> bool:
        """False once detach() was called."""
        return not self._detached

    def detach(self) -> None:
        """Detaches the tools (the whole tree with attach_children), and with
        unload=True unloads them and the agent; the tools that could not be
        unloaded are then in `kept_tools`. Raises RemoraError when that
        fails; the session counts as ended anyway."""
        if self._detached:
            return
        self._detached = True
        self.kept_tools = self._backend.detach(self.pid, self.children, self.unload)

    def status(self) -> AgentStatus:
        """status() of the session's process."""
        return status(self.pid, attach_library=self.library)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.detach()
        except RemoraError as e:
            if exc is None:
                raise
            # Keep the body's exception; say that the detach failed too.
            exc.add_note(f"remora: detaching {self.pid} also failed: {e}")

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"<remora.Session pid={self.pid} children={self.children} tools={':'.join(self.tools)!r} {state}>"


@_takes_attach_options()
def attached(pid: int, attach_tool_library: Tools = None, *, options: _AttachOptions) -> Session:
    """Attaches now and returns the Session; use it as a context manager to
    detach on leaving the block:

        with remora.attached(pid, "/opt/tools/libmytool.so") as session:
            ...

    Arguments as for attach(). Raises RemoraError when the attach fails
    (nothing stays attached then)."""
    return Session(pid, attach_tool_library, **options.keywords())


class _Stop:
    """While active on the main thread: SIGINT and SIGTERM set a flag (and
    wake a select() through a pipe) instead of raising. The flag is set even
    while a ctypes call runs, so a Ctrl-C during the attach still detaches."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signalled: int | None = None
        self.fd: int | None = None
        self._saved: dict[int, object] = {}
        self._pipe: tuple[int, int] | None = None
        self._wakeup = -1

    def __enter__(self) -> _Stop:
        if threading.current_thread() is not threading.main_thread():
            return self  # only the main thread may set handlers
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pipe = (r, w)
        self.fd = r
        self._wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for s in self.SIGNALS:
            self._saved[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        del frame
        self.signalled = signum

    def __exit__(self, *exc) -> None:
        for s, h in self._saved.items():
            signal.signal(s, h)
        if self._pipe:
            signal.set_wakeup_fd(self._wakeup)
            for fd in self._pipe:
                os.close(fd)


def _stdin_fd() -> int | None:
    try:
        return sys.stdin.fileno() if sys.stdin is not None else None
    except (OSError, ValueError, AttributeError):
        return None  # closed, or replaced by an object without a descriptor


def _wait(stop: _Stop, duration_msec: float | None) -> str:
    """Waits for the end of the attach: 'duration' when duration_msec passed;
    without a duration, 'enter' on a line on stdin (at end of file, only a
    signal ends the wait); 'signal' on SIGINT/SIGTERM (main thread only)."""
    deadline = None if duration_msec is None else time.monotonic() + duration_msec / 1000.0
    stdin = _stdin_fd() if duration_msec is None else None
    while True:
        if stop.signalled is not None:
            return "signal"
        timeout = None
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return "duration"
        fds = [fd for fd in (stop.fd, stdin) if fd is not None]
        if not fds:
            threading.Event().wait(timeout)  # nothing can end it but the deadline
            continue
        ready, _, _ = select.select(fds, [], [], timeout)
        if stop.fd is not None and stop.fd in ready:
            try:
                os.read(stop.fd, 512)
            except BlockingIOError:
                pass
        if stdin is not None and stdin in ready:
            try:
                data = os.read(stdin, 4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                stdin = None  # end of file: wait for a signal
            elif b"\n" in data:
                return "enter"


@_takes_attach_options(positional=("attach_library", "attach_children", "env"))
def attach(
    pid: int | None = None,
    attach_tool_library: Tools = None,
    attach_duration_msec: float | None = None,
    *,
    options: _AttachOptions,
    on_attached: Callable[[Session], None] | None = None,
    slurm_job: str | int | None = None,
) -> str | SlurmJobResult:
    """Attaches tools to process `pid`, waits, then detaches them.

    pid: the process (as this process sees it).
    attach_tool_library: the tool library path, a colon-separated list, or
        a list of paths; None = libremora-tool.so next to the library in use
        (RemoraError if it is not there).
    attach_duration_msec: detach after this many milliseconds; None = wait
        for Enter on stdin. SIGINT (Ctrl-C) or SIGTERM ends either wait when
        attach() runs on the main thread.
    attach_library: the path of libremora.so, or of a rocattach library
        (librocprofiler-sdk-rocattach.so), instead of library_path()'s search.
    attach_children: True = the whole process tree under pid.
    env: variables set in the target before the tools load (a mapping, or
        "NAME=VALUE" strings). The caller's ROCP* and REMORA_* variables go
        too (forward_environment=False: only `env`).
    lease: should this process die while attached, the agents detach the
        tools themselves (libremora.so only).
    timeout_msec: deadline per remote operation (default 10000).
    agent_path: libremora-agent.so to use (default: found next to libremora.so).
    channel: how the agent is reached: "auto" (ptrace where it is allowed,
        else the socket of a process that opted in at launch with
        REMORA_TOOL_ATTACH=1 or `remora run --listen`), "ptrace", or "socket"
        (no ptrace at all; the process alone, attach_children=False).
    unload: after the detach, unload the tools and the agent too, so that
        the process keeps no descriptor or mapping of Remora's (libremora.so
        only; a tool that cannot be unloaded stays, named in the Session's
        kept_tools).
    on_attached: called with the Session once attached, before waiting.
    slurm_job: instead of pid, every rank of this running Slurm job
        ("JOBID" or "JOBID.STEP") on every node, with its children, through
        the remora command (`remora attach --slurm`, which starts remora on
        each node with srun; docs/cli.md). Takes tools, duration, env,
        timeout_msec, channel and unload; returns a SlurmJobResult (the
        merged profile's directory, and whether some nodes or ranks failed)
        and raises RemoraError when nothing of the job was attached.

    Returns why the wait ended: "duration", "enter" or "signal". Raises
    RemoraError when the attach or the detach fails.
    """
    if attach_duration_msec is not None and not attach_duration_msec >= 0:
        raise _capi.invalid_argument(f"attach_duration_msec {attach_duration_msec} is negative")
    if (pid is None) == (slurm_job is None):
        raise TypeError("attach() takes a pid or a slurm_job (one of them)")
    if slurm_job is not None:
        return _attach_slurm_job(str(slurm_job), attach_tool_library, attach_duration_msec, options, on_attached)
    with _Stop() as stop:
        with attached(pid, attach_tool_library, **options.keywords()) as session:
            if on_attached is not None:
                on_attached(session)
            return _wait(stop, attach_duration_msec)


def _attach_slurm_job(job, tools, duration, options: _AttachOptions, on_attached) -> SlurmJobResult:
    """attach(slurm_job=...): the options a job can take, refused otherwise."""
    refused = {
        "attach_children=False": not options.attach_children,
        "lease=False": not options.lease,
        "agent_path": options.agent_path is not None,
        "on_attached": on_attached is not None,
        "forward_environment=False": not options.forward_environment,
    }
    for what, given in refused.items():
        if given:
            raise _capi.invalid_argument(f"{what} does not apply to slurm_job (each node's remora attaches its "
                                         "ranks with their children, under a lease)")
    argv = _slurm.command_line(job, tools, duration, env=options.env, timeout_msec=options.timeout_msec,
                               channel=options.channel, unload=options.unload, library=options.attach_library)
    return _slurm.attach_job(argv, job)


def detach(
    pid: int,
    attach_library: PathLike | None = None,
    *,
    detach_children: bool | None = None,
    unload: bool = False,
) -> tuple[tuple[int, str], ...]:
    """Detaches the tools from `pid`, whoever attached them; pid 0 = every
    process this process attached. detach_children: True = the tree under
    pid (the processes this process attached from pid, else the tree as it
    is now); False = pid only; None = the tree when this process attached
    one from pid, else pid only. unload: then unload the tools and the agent
    (also after an earlier detach), leaving no descriptor or mapping of
    Remora's; returns the (pid, tool) pairs that could not be unloaded (their
    dlclose failed or left them mapped), () otherwise. Raises RemoraError
    (NOT_ATTACHED, NOT_SUPPORTED for a library or agent that cannot unload,
    ...)."""
    return _capi.load(attach_library).detach(_pid(pid, zero_ok=True), detach_children, bool(unload))


def status(pid: int, attach_library: PathLike | None = None) -> AgentStatus:
    """What the agent in `pid` reports, without stopping the process. A
    process without the agent gives agent_loaded=False. Raises RemoraError
    (NO_SUCH_PROCESS, PTRACE_DENIED, ...)."""
    pid = _pid(pid)
    s = _capi.load(attach_library).status(pid)
    tools = s.tools.decode("utf-8", "replace")
    return AgentStatus(
        pid=pid,
        agent_loaded=bool(s.agent_loaded),
        attached=bool(s.attached),
        lease_expired=bool(s.lease_expired),
        sessions=int(s.sessions),
        detaches=int(s.detaches),
        listener_tid=int(s.listener_tid),
        lease_pid=int(s.lease_pid),
        tools=tuple(t for t in tools.split(":") if t),
        message=s.message.decode("utf-8", "replace"),
        session_channel="socket" if s.session_channel == 2 else "ptrace",
    )
