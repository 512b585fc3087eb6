"""remora.attach(slurm_job=...): every rank of a running Slurm job, on every
node, through the remora command's --slurm (cli/slurm_front.cc): it starts
remora on each node with srun, so this package needs the command, not the
library (REMORA_CLI, else bin/remora next to the library's lib/, else remora
on PATH)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from . import _capi

PARTIAL_EXIT = 14  # cli/exit_codes.h, kPartial

# The command's exit codes (cli/exit_codes.h) as the status a RemoraError carries.
_EXIT_STATUS = {
    1: _capi.Status.INVALID_ARGUMENT,
    2: _capi.Status.NO_SUCH_PROCESS,
    3: _capi.Status.PTRACE_DENIED,
    4: _capi.Status.SYMBOL_NOT_FOUND,
    5: _capi.Status.NOT_SUPPORTED,
    6: _capi.Status.TIMED_OUT,
    7: _capi.Status.TARGET_EXITED,
    8: _capi.Status.FAULT,
    9: _capi.Status.IO,
    10: _capi.Status.INTERNAL,
    11: _capi.Status.REFUSED,
    12: _capi.Status.TOOL_FAILED,
    13: _capi.Status.ALREADY_ATTACHED,
}


@dataclasses.dataclass(frozen=True)
class SlurmJobResult:
    """What remora.attach(slurm_job=...) did.

    job: the job as given ("1234" or "1234.0"); job_dir: the directory of the
    merged profile (job.json, trace.perfetto, profile.pb.gz, flamegraph.svg,
    ranks.csv, summary.txt, and each rank's own outputs under NODE/), or None
    when no profile came back; partial: some nodes or ranks failed (each is
    named in output), the rest was profiled; output: what the command
    printed."""

    job: str
    job_dir: str | None
    partial: bool
    output: str


def remora_command(library: str | None = None) -> str:
    """The remora command this package runs for a Slurm job."""
    if os.environ.get("REMORA_CLI"):
        return os.environ["REMORA_CLI"]
    lib = _capi.find_library(library)
    if os.path.isabs(lib):
        beside = os.path.join(os.path.dirname(os.path.dirname(lib)), "bin", "remora")
        if os.access(beside, os.X_OK):
            return beside
    found = shutil.which("remora")
    if not found:
        raise _capi.RemoraError(
            _capi.Status.NOT_SUPPORTED,
            "REMORA_STATUS_NOT_SUPPORTED",
            "slurm_job needs the remora command (it starts remora on every node with srun): set REMORA_CLI "
            "to its path, or put it on PATH",
        )
    return found


def _env_args(env) -> list[str]:
    if env is None:
        return []
    items = env.items() if isinstance(env, Mapping) else (e.split("=", 1) for e in env)
    return [arg for name, value in items for arg in ("-e", f"{name}={value}")]


def _tool_args(tools) -> list[str]:
    if tools is None:
        return []
    if isinstance(tools, (str, os.PathLike)):
        return ["-t", os.fspath(tools)]
    return ["-t", ":".join(os.fspath(t) for t in tools)]


def command_line(job, tools, duration_msec, *, env, timeout_msec, channel, unload, library=None) -> list[str]:
    """The remora command line for the job (exposed for the tests)."""
    argv = [remora_command(library), "attach", "--slurm", str(job)]
    argv += _tool_args(tools)
    if duration_msec is not None:
        argv += ["-d", str(max(1, int(duration_msec)))]
    argv += _env_args(env)
    if timeout_msec is not None:
        argv += ["--timeout", str(int(timeout_msec))]
    argv += ["--channel", channel]
    if unload:
        argv.append("--unload")
    return argv


def attach_job(argv: Sequence[str], job: str) -> SlurmJobResult:
    """Runs the command, echoing what it prints; SIGINT or SIGTERM to this
    process is passed on (the command then detaches everywhere) and waited
    for. Raises RemoraError when nothing of the job was attached."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    lines = []
    previous = signal.getsignal(signal.SIGTERM)
    on_main = _on_main_thread()
    if on_main:
        signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signal.SIGTERM))
    try:
        while True:
            try:
                line = proc.stdout.readline()
            except KeyboardInterrupt:
                proc.send_signal(signal.SIGINT)  # remora detaches, then ends
                continue
            if not line:
                break
            lines.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        code = proc.wait()
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)
    output = "".join(lines)
    found = re.findall(r"^==> job \S+: (.*) \(merged in", output, re.M)
    if code not in (0, PARTIAL_EXIT):
        errors = re.findall(r"^remora: error: (.*)$", output, re.M)
        status = _EXIT_STATUS.get(code, _capi.Status.INTERNAL)
        raise _capi.RemoraError(status, "REMORA_STATUS_" + status.name,
                                errors[-1] if errors else f"remora attach --slurm {job} exited with {code}")
    return SlurmJobResult(job=str(job), job_dir=found[-1] if found else None, partial=code == PARTIAL_EXIT,
                          output=output)


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
