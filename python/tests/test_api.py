"""The Python API: remora.attach, attached, detach, status, RemoraError."""

from __future__ import annotations

import inspect
import os
import select
import subprocess
import sys
import threading
import time

import pytest
from conftest import gone_pid

import remora


def log_env(hook_log) -> dict[str, str]:
    return {"REMORA_HOOK_LOG": str(hook_log.path)}


def test_attach_with_duration_attaches_the_tree_then_detaches(library, hook_tool, hook_log, make_target):
    target = make_target(2)
    times = {}

    def on_attached(session):
        times["attached"] = time.monotonic()
        # Every process of the tree is attached while we wait.
        assert hook_log.pids("tool_attach") == target.all
        assert all(remora.status(pid).attached for pid in target.all)

    reason = remora.attach(
        target.pid, hook_tool, attach_duration_msec=300, env=log_env(hook_log), on_attached=on_attached
    )
    waited = time.monotonic() - times["attached"]

    assert reason == "duration"
    assert 0.29 <= waited < 5.0, f"attached for {waited:.3f} s, 0.3 s asked"
    assert hook_log.pids("tool_attach") == target.all
    assert hook_log.pids("tool_detach") == target.all
    for pid in target.all:
        st = remora.status(pid)
        assert st.agent_loaded and not st.attached
        assert st.sessions == 1 and st.detaches == 1
        assert st.tools == (hook_tool,)
    assert target.proc.poll() is None, "the target must keep running"


def test_attach_children_false_attaches_only_the_root(library, hook_tool, hook_log, make_target):
    target = make_target(2)
    remora.attach(target.pid, hook_tool, attach_duration_msec=50, attach_children=False, env=log_env(hook_log))
    assert hook_log.pids("tool_attach") == {target.pid}
    assert hook_log.pids("tool_detach") == {target.pid}
    for child in target.children:
        assert not remora.status(child).agent_loaded


def test_tool_list_accepts_a_list(library, hook_tool, hook_log, make_target):
    target = make_target(0)
    remora.attach(target.pid, [hook_tool], attach_duration_msec=0, env=log_env(hook_log))
    assert hook_log.pids("tool_attach") == {target.pid}


def test_callers_remora_variables_are_forwarded(library, hook_tool, hook_log, make_target, monkeypatch):
    target = make_target(1)
    monkeypatch.setenv("REMORA_HOOK_LOG", str(hook_log.path))
    remora.attach(target.pid, hook_tool, attach_duration_msec=0)
    assert hook_log.pids("tool_attach") == target.all


def test_forward_environment_false_sends_only_env(library, hook_tool, hook_log, make_target, monkeypatch, tmp_path):
    target = make_target(0)
    other = tmp_path / "not-forwarded.log"
    monkeypatch.setenv("REMORA_HOOK_LOG", str(other))
    remora.attach(target.pid, hook_tool, attach_duration_msec=0, env=log_env(hook_log), forward_environment=False)
    assert hook_log.pids("tool_attach") == {target.pid}
    assert not other.exists()


def test_context_manager_detaches_on_exit(library, hook_tool, hook_log, make_target):
    target = make_target(2)
    with remora.attached(target.pid, hook_tool, env=log_env(hook_log)) as session:
        assert session.attached and session.children and session.tools == [hook_tool]
        assert hook_log.pids("tool_attach") == target.all
        assert not hook_log.pids("tool_detach")
        st = session.status()
        assert st.attached and st.lease_pid == os.getpid()
    assert not session.attached
    assert hook_log.pids("tool_detach") == target.all
    session.detach()  # a second detach does nothing
    assert all(hook_log.count("tool_detach", pid) == 1 for pid in target.all)


def test_context_manager_detaches_on_exception(library, hook_tool, hook_log, make_target):
    target = make_target(1)
    with pytest.raises(ZeroDivisionError):
        with remora.attached(target.pid, hook_tool, env=log_env(hook_log)):
            1 / 0
    assert hook_log.pids("tool_detach") == target.all
    assert not any(remora.status(pid).attached for pid in target.all)


def test_reattach_after_detach(library, hook_tool, hook_log, make_target):
    target = make_target(0)
    for _ in range(2):
        with remora.attached(target.pid, hook_tool, env=log_env(hook_log)):
            pass
    assert hook_log.count("tool_attach", target.pid) == 2
    assert remora.status(target.pid).sessions == 2


def test_detach_function_detaches_the_tree_it_attached(library, hook_tool, hook_log, make_target):
    target = make_target(2)
    session = remora.attached(target.pid, hook_tool, env=log_env(hook_log))
    remora.detach(target.pid)
    assert hook_log.pids("tool_detach") == target.all
    with pytest.raises(remora.RemoraError) as e:
        remora.detach(target.pid, detach_children=False)
    assert e.value.name == "REMORA_STATUS_NOT_ATTACHED"
    assert e.value.code == remora.Status.NOT_ATTACHED
    assert e.value.exit_code == 13
    del session


def _fds_and_remora_maps(pid):
    maps = open(f"/proc/{pid}/maps").read().splitlines()
    marks = ("libremora-", "remora-hook-tool", "memfd:", "anon:remora")
    return sorted(os.listdir(f"/proc/{pid}/fd")), [m for m in maps if any(k in m for k in marks)]


def test_unload_keyword_takes_the_agent_out(library, hook_tool, hook_log, make_target):
    target = make_target(1)
    fds_before = {pid: _fds_and_remora_maps(pid)[0] for pid in target.all}
    with remora.attached(target.pid, hook_tool, env=log_env(hook_log), unload=True) as session:
        assert session.unload and all(remora.status(pid).attached for pid in target.all)
    assert session.kept_tools == ()
    for pid in target.all:
        assert not remora.status(pid).agent_loaded
        assert hook_log.count("tool_fini", pid) == 1
        fds, maps = _fds_and_remora_maps(pid)
        assert fds == fds_before[pid] and maps == []
    # attach(..., unload=True) and detach(..., unload=True): a fresh agent each time.
    assert remora.attach(target.pid, hook_tool, 0, env=log_env(hook_log), unload=True) == "duration"
    assert all(hook_log.count("configure", pid) == 2 for pid in target.all)
    remora.attached(target.pid, hook_tool, attach_children=False, env=log_env(hook_log))
    remora.detach(target.pid)
    assert remora.status(target.pid).agent_loaded
    assert remora.detach(target.pid, detach_children=False, unload=True) == ()  # after a plain detach
    assert not remora.status(target.pid).agent_loaded
    with pytest.raises(remora.RemoraError) as e:
        remora.detach(target.pid, detach_children=False, unload=True)
    assert e.value.code == remora.Status.NOT_ATTACHED


def test_unload_with_the_rocattach_library_is_refused_before_attaching(
    library, rocattach_library, hook_tool, hook_log, make_target
):
    target = make_target(0)
    with pytest.raises(remora.RemoraError) as e:
        remora.attached(target.pid, hook_tool, attach_library=rocattach_library, unload=True)
    assert e.value.code == remora.Status.NOT_SUPPORTED and "libremora.so" in str(e.value)
    assert not hook_log.pids("tool_attach") and not remora.status(target.pid).agent_loaded


def test_already_attached(library, hook_tool, hook_log, make_target):
    target = make_target(0)
    with remora.attached(target.pid, hook_tool, attach_children=False, env=log_env(hook_log)):
        with pytest.raises(remora.RemoraError) as e:
            remora.attached(target.pid, hook_tool, attach_children=False, env=log_env(hook_log))
        assert e.value.name == "REMORA_STATUS_ALREADY_ATTACHED"
        assert remora.status(target.pid).attached  # the failed attach changed nothing
    assert hook_log.count("tool_attach", target.pid) == 1


def test_no_such_process(library, hook_tool):
    pid = gone_pid()
    for call in (
        lambda: remora.attach(pid, hook_tool, attach_duration_msec=0),
        lambda: remora.attach(pid, hook_tool, attach_duration_msec=0, attach_children=False),
        lambda: remora.detach(pid),
        lambda: remora.status(pid),
    ):
        with pytest.raises(remora.RemoraError) as e:
            call()
        assert e.value.name == "REMORA_STATUS_NO_SUCH_PROCESS"
        assert e.value.code == remora.Status.NO_SUCH_PROCESS == 2
        assert e.value.api == "remora" and e.value.pid == pid
        assert str(pid) in e.value.message  # Remora's message, from remora_last_error
        assert e.value.exit_code == 2


def test_invalid_arguments(library, hook_tool, make_target):
    target = make_target(0)
    cases = [
        lambda: remora.attach(target.pid, "", attach_duration_msec=0),
        lambda: remora.attach(target.pid, hook_tool, attach_duration_msec=-1),
        lambda: remora.attach(target.pid, hook_tool, attach_duration_msec=0, env={"": "x"}),
        lambda: remora.attach(target.pid, hook_tool, attach_duration_msec=0, env=["NOEQUALS"]),
        lambda: remora.attach(-5, hook_tool, attach_duration_msec=0),
        lambda: remora.status(0),
    ]
    for call in cases:
        with pytest.raises(remora.RemoraError) as e:
            call()
        assert e.value.name == "REMORA_STATUS_INVALID_ARGUMENT", e.value
        assert e.value.exit_code == 1
    assert not remora.status(target.pid).agent_loaded


def test_not_a_tool(library, make_target):
    target = make_target(0)
    # libremora.so has no remora_configure_attach: it cannot be attached.
    with pytest.raises(remora.RemoraError) as e:
        remora.attach(target.pid, library, attach_duration_msec=0, attach_children=False)
    assert e.value.code != remora.Status.SUCCESS and e.value.message
    assert not remora.status(target.pid).attached


def test_missing_default_tool(library, make_target, monkeypatch):
    target = make_target(0)
    from remora import _capi

    monkeypatch.setattr(_capi, "DEFAULT_TOOL_FILE", "libremora-no-such-tool.so")
    with pytest.raises(remora.RemoraError) as e:
        remora.attach(target.pid, None, attach_duration_msec=0)
    assert e.value.name == "REMORA_STATUS_INVALID_ARGUMENT"
    assert "attach_tool_library" in e.value.message


def test_default_tool_is_found_next_to_the_library(library):
    expected = os.path.join(os.path.dirname(os.path.realpath(library)), "libremora-tool.so")
    assert remora.default_tool() == (expected if os.path.exists(expected) else None)


def test_attach_library_that_does_not_exist(tmp_path):
    with pytest.raises(remora.RemoraError) as e:
        remora.status(1, attach_library=tmp_path / "libremora.so")
    assert e.value.name == "REMORA_STATUS_INVALID_ARGUMENT"
    assert "does not exist" in e.value.message


def test_attach_from_another_thread(library, hook_tool, hook_log, make_target):
    # Off the main thread there are no signal handlers; the duration still ends it.
    target = make_target(0)
    result = {}

    def run():
        try:
            result["reason"] = remora.attach(target.pid, hook_tool, attach_duration_msec=100, env=log_env(hook_log))
        except BaseException as e:  # reported below
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert result == {"reason": "duration"}
    assert hook_log.pids("tool_detach") == {target.pid}


def test_rocattach_library(library, rocattach_library, hook_tool, hook_log, make_target):
    target = make_target(1)
    reason = remora.attach(
        target.pid, hook_tool, attach_duration_msec=50, attach_library=rocattach_library, env=log_env(hook_log)
    )
    assert reason == "duration"
    assert hook_log.pids("tool_attach") == target.all
    assert hook_log.pids("tool_detach") == target.all
    assert "ROCPROF_ATTACH_TOOL_LIBRARY" not in os.environ  # set for the call only
    assert not remora.status(target.pid, attach_library=rocattach_library).attached

    with pytest.raises(remora.RemoraError) as e:
        remora.attach(gone_pid(), hook_tool, attach_duration_msec=0, attach_library=rocattach_library)
    assert e.value.api == "rocattach"
    assert e.value.name == "ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND"
    assert e.value.exit_code == 2


# The three entry points take their options from one definition
# (remora._AttachOptions); what a caller sees must be what each spelled out
# before: names, order, kinds, defaults, annotations, docstrings.
_OPTIONS = (
    "attach_library: 'PathLike | None' = None, attach_children: 'bool' = True, env: 'Env' = None, "
    "lease: 'bool' = True, timeout_msec: 'int | None' = None, agent_path: 'PathLike | None' = None, "
    "forward_environment: 'bool' = True, unload: 'bool' = False, channel: 'str' = 'auto'"
)
_SIGNATURES = {
    "attach": "(pid: 'int | None' = None, attach_tool_library: 'Tools' = None, "
    "attach_duration_msec: 'float | None' = None, "
    "attach_library: 'PathLike | None' = None, attach_children: 'bool' = True, env: 'Env' = None, *, "
    "lease: 'bool' = True, timeout_msec: 'int | None' = None, agent_path: 'PathLike | None' = None, "
    "forward_environment: 'bool' = True, unload: 'bool' = False, channel: 'str' = 'auto', "
    "on_attached: 'Callable[[Session], None] | None' = None, slurm_job: 'str | int | None' = None) "
    "-> 'str | SlurmJobResult'",
    "attached": f"(pid: 'int', attach_tool_library: 'Tools' = None, *, {_OPTIONS}) -> 'Session'",
    "Session": f"(pid: 'int', attach_tool_library: 'Tools' = None, *, {_OPTIONS})",
}


def test_entry_points_keep_their_signatures_and_docstrings():
    for name, want in _SIGNATURES.items():
        entry = getattr(remora, name)
        assert str(inspect.signature(entry)) == want, name
        assert entry.__name__ == name and entry.__module__ == "remora"
    assert remora.attach.__doc__.startswith("Attaches tools to process `pid`, waits, then detaches them.")
    assert "attach_children: True = the whole process tree under pid." in remora.attach.__doc__
    assert remora.attached.__doc__.startswith("Attaches now and returns the Session;")
    assert remora.Session.__doc__.startswith("Tools attached to one process")


def test_calls_that_do_not_fit_the_signature_raise_type_error():
    # Refused while binding the arguments: no library is loaded, no process touched.
    for call in (
        lambda: remora.attached(1, "tool.so", bogus=1),
        lambda: remora.attached(1, "tool.so", None),  # attach_library is keyword-only here
        lambda: remora.Session(1, "tool.so", options=None),  # the internal parameter is not public
        lambda: remora.attach(1, "tool.so", 0, None, True, None, True),  # lease is keyword-only
        lambda: remora.attach(attach_tool_library="tool.so"),  # pid (or slurm_job) is required
        lambda: remora.attach(1, slurm_job="12"),  # not both
        lambda: remora.attach(1, "tool.so", 0, None, attach_library=None),  # attach_library twice
    ):
        with pytest.raises(TypeError):
            call()


def test_attach_takes_attach_library_and_attach_children_by_position(library, rocattach_library, hook_tool):
    # attach(pid, tools, duration, attach_library, attach_children, env): the
    # error comes from the rocattach library given by position, for the one
    # process (children False).
    pid = gone_pid()
    with pytest.raises(remora.RemoraError) as e:
        remora.attach(pid, hook_tool, 0, rocattach_library, False, {"REMORA_X": "1"})
    assert e.value.api == "rocattach"
    assert e.value.name == "ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND"


def _opted_in_target(library):
    """A process that opted in to the socket channel at launch (the agent
    preloaded, REMORA_TOOL_ATTACH=1), blocked on stdin, ready when returned."""
    agent = os.path.join(os.path.dirname(library), "libremora-agent.so")
    env = dict(os.environ, LD_PRELOAD=agent, REMORA_TOOL_ATTACH="1")
    code = "import os, sys; print(os.getpid(), flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    if not ready:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError("the opted-in target did not start within 20 s")
    pid = int(proc.stdout.readline())
    return proc, pid


def test_socket_channel_attach_status_detach(library, hook_tool, hook_log):
    proc, pid = _opted_in_target(library)
    try:
        with remora.attached(pid, hook_tool, attach_children=False, env=log_env(hook_log), channel="socket"):
            st = remora.status(pid)
            assert st.attached and st.session_channel == "socket"
            assert hook_log.pids("tool_attach") == {pid}
        st = remora.status(pid)
        assert not st.attached and st.detaches == 1
        assert hook_log.pids("tool_detach") == {pid}
        # Through ptrace the same process reports a ptrace session.
        remora.attach(pid, hook_tool, 0, attach_children=False, env=log_env(hook_log), channel="ptrace")
        assert remora.status(pid).session_channel == "ptrace"
        assert proc.poll() is None, "the target must keep running"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdin.close()
        proc.stdout.close()


def test_socket_channel_refusals(library, hook_tool, make_target):
    target = make_target(0)  # did not opt in
    with pytest.raises(remora.RemoraError) as e:
        remora.attach(target.pid, hook_tool, 0, attach_children=False, channel="socket")
    assert e.value.name == "REMORA_STATUS_NOT_SUPPORTED"
    assert "remora run --listen" in str(e.value)
    with pytest.raises(remora.RemoraError) as e:
        remora.attach(target.pid, hook_tool, 0, attach_children=False, channel="carrier pigeon")
    assert e.value.name == "REMORA_STATUS_INVALID_ARGUMENT"
    with pytest.raises(remora.RemoraError) as e:
        remora.attach(target.pid, hook_tool, 0, attach_children=True, channel="socket")
    assert e.value.name in ("REMORA_STATUS_INVALID_ARGUMENT", "REMORA_STATUS_NOT_SUPPORTED")
