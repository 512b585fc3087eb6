"""The refusals about the process itself — gone, a zombie, a kernel thread,
traced by another, statically linked — come first from every Python entry
point, in the words of the remora command (`remora call` refuses the same
way): before a tool is looked for, before an output directory is planned."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import remora
from conftest import _readline, gone_pid, run_command

HELPER = Path(__file__).resolve().parent.parent.parent / "tests" / "cli" / "refusal_helper.py"


class Helper:
    """refusal_helper.py: its ready line read (deadline); ended by closing stdin."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER), *map(str, args)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.line = _readline(self.proc.stdout, 10.0).decode().strip()
        self.pids = [int(x) for x in self.line.split()[1:]] if self.line.startswith("ready ") else None

    def end(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture
def helpers():
    started: list[Helper] = []

    def start(*args) -> Helper:
        h = Helper(*args)
        started.append(h)
        return h

    yield start
    for h in reversed(started):  # a tracer ends before its tracee is killed
        h.end()


@pytest.fixture
def static_target(library, tmp_path):
    path = Path(library).resolve().parent.parent / "bin" / "remora_cli_target_static"
    if not path.exists():
        pytest.skip(f"{path} is not built")
    ready = tmp_path / "ready-static"
    proc = subprocess.Popen([str(path), "0", str(ready)], start_new_session=True)
    try:
        # Its handshake is the ready file (written atomically), polled with a deadline.
        deadline = time.monotonic() + 10
        while not (ready.exists() and ready.read_text()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.exists() and ready.read_text(), "the static target did not get ready within 10 s"
        yield int(ready.read_text().split()[0])
    finally:
        proc.kill()
        proc.wait(timeout=10)


def refusals(make_target, helpers, static_target):
    """(kind, pid, expected status name, expected message) for each process."""
    out = []
    pid = gone_pid()
    out.append(("gone", pid, "REMORA_STATUS_NO_SUCH_PROCESS",
                f"attach to process {pid}: no process {pid} (it may have exited); check the pid with ps"))
    zp = helpers("zombie-parent")
    assert zp.pids, zp.line
    z = zp.pids[1]
    out.append(("zombie", z, "REMORA_STATUS_ZOMBIE",
                f"attach to process {z}: process {z} is a zombie: it has exited and waits for its parent "
                f"({zp.pids[0]}) to reap it; there is nothing left to trace"))
    if os.path.exists("/proc/2/status") and "kthreadd" in Path("/proc/2/status").read_text():
        out.append(("kernel thread", 2, "REMORA_STATUS_KERNEL_THREAD",
                    "attach to process 2: process 2 (kthreadd) is a kernel thread: it has no user space to "
                    "trace; pick a user-space process"))
    target = make_target(0)
    tracer = helpers("trace", target.pid)
    if tracer.pids:
        out.append(("traced", target.pid, "REMORA_STATUS_TRACED_BY_OTHER",
                    f"attach to process {target.pid}: process {target.pid} is already traced by process "
                    f"{tracer.pids[0]} ("))
    s = static_target
    out.append(("static", s, "REMORA_STATUS_STATIC_BINARY",
                f"attach to process {s}: process {s} is statically linked (no dynamic loader, no libc.so): "
                "Remora loads its agent and tools through the target's shared libc and cannot attach tools "
                "to it"))
    return out


def test_attach_refuses_the_process_before_looking_for_tools(
    library, make_target, helpers, static_target, monkeypatch
):
    from remora import _capi

    # No default tool: a refusal that came after the tool search would be
    # INVALID_ARGUMENT ("no tool library given").
    monkeypatch.setattr(_capi, "DEFAULT_TOOL_FILE", "libremora-no-such-tool.so")
    for kind, pid, name, message in refusals(make_target, helpers, static_target):
        for children in (True, False):
            with pytest.raises(remora.RemoraError) as e:
                remora.attach(pid, None, attach_duration_msec=0, attach_children=children)
            got = e.value.message.splitlines()[0]
            assert e.value.name == name, (kind, children, e.value)
            assert got == message or (kind == "traced" and got.startswith(message)), (kind, children, got)
            assert e.value.exit_code == remora.exit_code_for(getattr(remora.Status, name[len("REMORA_STATUS_"):]))


def test_rocprof_attach_refuses_first_and_makes_no_output(library, make_target, helpers, static_target, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    given = tmp_path / "given"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCPROF_ATTACH")}
    env["REMORA_OUTPUT_PATH"] = str(given)
    expected_exit = {"gone": 2, "zombie": 2, "kernel thread": 2, "traced": 3, "static": 5}
    for kind, pid, name, message in refusals(make_target, helpers, static_target):
        r = run_command(["-p", str(pid), "-d", "0"], env=env, cwd=cwd)  # the default tool
        first = r.stderr.splitlines()[0] if r.stderr else ""
        assert r.returncode == expected_exit[kind], (kind, r.stderr)
        assert first.startswith(f"rocprof-attach: error: {message}") and first.endswith(f"[{name}]"), (kind, first)
        assert r.stdout == "" and list(cwd.iterdir()) == [] and not given.exists(), kind


def test_rocattach_library_refuses_first(library, rocattach_library, make_target, helpers, static_target):
    # rocattach_attach without a tool library configured: the process is
    # refused first, with Remora's message on stderr.
    script = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "f = lib.rocattach_attach_tree if sys.argv[3] == 'tree' else lib.rocattach_attach; "
        "print(f(int(sys.argv[2])))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ROCPROF_ATTACH_TOOL_LIBRARY", "REMORA_ATTACH_TOOL_LIBRARY")}
    status = {"gone": 6, "zombie": 6, "kernel thread": 4, "traced": 5, "static": 3}  # rocattach_status_t
    for kind, pid, _, message in refusals(make_target, helpers, static_target):
        for how in ("one", "tree"):
            r = subprocess.run([sys.executable, "-c", script, rocattach_library, str(pid), how], env=env,
                               capture_output=True, text=True, timeout=30)
            what = f"rocattach_attach{'_tree' if how == 'tree' else ''}({pid})"
            assert r.stdout.strip() == str(status[kind]), (kind, how, r.stdout, r.stderr)
            assert r.stderr.startswith(f"[rocprofiler-sdk-rocattach] {what} failed: {message}"), (kind, how, r.stderr)


def test_zombie_child_in_a_tree_does_not_fail_the_others(library, hook_tool, hook_log, helpers):
    zp = helpers("zombie-parent")
    assert zp.pids, zp.line
    parent, zombie = zp.pids
    remora.attach(parent, hook_tool, attach_duration_msec=0, env={"REMORA_HOOK_LOG": str(hook_log.path)})
    assert hook_log.count("tool_attach", parent) == 1
    assert hook_log.count("tool_detach", parent) == 1
    assert hook_log.count("tool_attach", zombie) == 0


def test_detach_and_status_refuse_a_zombie_as_such(library, helpers):
    zp = helpers("zombie-parent")
    assert zp.pids, zp.line
    z = zp.pids[1]
    for call in (lambda: remora.detach(z), lambda: remora.detach(z, detach_children=True), lambda: remora.status(z)):
        with pytest.raises(remora.RemoraError) as e:
            call()
        assert e.value.name == "REMORA_STATUS_ZOMBIE", e.value
        assert f"process {z} is a zombie: it has exited and waits for its parent ({zp.pids[0]})" in e.value.message
        assert e.value.exit_code == 2
