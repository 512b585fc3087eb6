"""Fixtures of the Python tests: the built libraries, target process trees,
the hook tool's log.

The libraries come from the environment (ctest sets them, see
python/CMakeLists.txt) or from build/lib of this checkout:
  REMORA_LIBRARY      libremora.so                  (tests skip without it)
  REMORA_HOOK_TOOL    libremora-hook-tool-a.so      (default: next to libremora.so)
  REMORA_AGENT_PATH   libremora-agent.so            (read by libremora.so itself)
  REMORA_ROCATTACH_LIBRARY  librocprofiler-sdk-rocattach.so (default: next to libremora.so)
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(PYTHON_DIR))  # the tests import the package from this checkout

# A test that runs longer than this dumps every thread's stack and exits,
# instead of hanging ctest until its own timeout.
WATCHDOG_S = 90


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _library() -> str | None:
    path = os.environ.get("REMORA_LIBRARY") or str(PYTHON_DIR.parent / "build" / "lib" / "libremora.so")
    return path if os.path.exists(path) else None


LIBRARY = _library()
if LIBRARY:
    # In-process calls and the commands the tests start find it the same way.
    os.environ["REMORA_LIBRARY"] = LIBRARY


@pytest.fixture(scope="session")
def library() -> str:
    if not LIBRARY:
        pytest.skip(
            "libremora.so is not built: build it (cmake --build build --target remora_capi remora-agent "
            "remora-hook-tool-a) or set REMORA_LIBRARY"
        )
    return LIBRARY


@pytest.fixture(scope="session")
def hook_tool(library) -> str:
    path = os.environ.get("REMORA_HOOK_TOOL") or os.path.join(os.path.dirname(library), "libremora-hook-tool-a.so")
    if not os.path.exists(path):
        pytest.skip(f"the hook test tool {path} is not built: build remora-hook-tool-a or set REMORA_HOOK_TOOL")
    return path


@pytest.fixture(scope="session")
def rocattach_library(library) -> str:
    path = os.environ.get("REMORA_ROCATTACH_LIBRARY") or os.path.join(
        os.path.dirname(library), "librocprofiler-sdk-rocattach.so"
    )
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built: build rocprofiler-sdk-rocattach or set REMORA_ROCATTACH_LIBRARY")
    return path


class HookLog:
    """The hook tool's log: lines "a:HOOK pid=P tid=T t=NS session=N"."""

    def __init__(self, path: Path):
        self.path = path

    def entries(self) -> list[tuple[str, int]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            hook, _, rest = line.partition(" ")
            fields = dict(f.split("=", 1) for f in rest.split())
            out.append((hook.split(":", 1)[1], int(fields["pid"])))
        return out

    def pids(self, hook: str) -> set[int]:
        return {pid for h, pid in self.entries() if h == hook}

    def count(self, hook: str, pid: int) -> int:
        return sum(1 for h, p in self.entries() if h == hook and p == pid)

    def wait_for(self, hook: str, pids: set[int], timeout_s: float = 10.0) -> set[int]:
        """The pids that logged `hook`, once all of `pids` did or at the deadline."""
        deadline = time.monotonic() + timeout_s
        while not pids <= self.pids(hook) and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.pids(hook)


@pytest.fixture
def hook_log(tmp_path) -> HookLog:
    return HookLog(tmp_path / "hook.log")


@dataclass
class Target:
    proc: subprocess.Popen
    pid: int
    children: list[int] = field(default_factory=list)

    @property
    def all(self) -> set[int]:
        return {self.pid, *self.children}


def _readline(stream, timeout_s: float) -> bytes:
    """One line from a pipe, or b"" at the deadline or at end of file."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    fd = stream.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 1)
        if not chunk:
            return buf
        buf += chunk
    return buf


@pytest.fixture
def make_target():
    """make_target(n_children) -> Target: a process tree blocked on stdin,
    ready (the handshake line read) when returned; killed, with its whole
    process group, when the test ends however it ends."""
    started: list[subprocess.Popen] = []

    def make(n_children: int = 2) -> Target:
        proc = subprocess.Popen(
            [sys.executable, str(TESTS_DIR / "target_tree.py"), str(n_children)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        started.append(proc)
        line = _readline(proc.stdout, 20.0)
        if not line:
            raise AssertionError("the target did not say it was ready within 20 s")
        info = json.loads(line)
        return Target(proc, info["pid"], info["children"])

    yield make
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            stream.close()


def gone_pid() -> int:
    """A pid that no process has: one of a process that exited and was reaped."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def run_command(args: list[str], env: dict[str, str] | None = None, timeout_s: float = 30.0, **kw):
    """Runs rocprof-attach with `args`; returns the CompletedProcess (text)."""
    return subprocess.run(
        [sys.executable, str(PYTHON_DIR / "rocprof-attach"), *args],
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        **kw,
    )
