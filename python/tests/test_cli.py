"""The rocprof-attach command (python/rocprof-attach, python3 -m remora)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import PYTHON_DIR, _readline, gone_pid, run_command

from remora import cli

ENV_VARS = [var for _, var in cli.ENV_FALLBACKS]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a command: ours without ROCPROF_ATTACH_*, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROCPROF_ATTACH_")}
    env.update(extra)
    return env


def test_attach_for_a_duration(library, hook_tool, hook_log, make_target):
    target = make_target(2)
    env = clean_env(REMORA_HOOK_LOG=str(hook_log.path))
    start = time.monotonic()
    r = run_command(["-p", str(target.pid), "-t", hook_tool, "-d", "300"], env=env)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert elapsed >= 0.3
    assert hook_log.pids("tool_attach") == target.all
    assert hook_log.pids("tool_detach") == target.all
    assert f"attached {hook_tool} to process {target.pid} and its children" in r.stderr
    assert "detached" in r.stderr


def test_default_tool_sessions_are_rendered(library, make_target, tmp_path):
    # The default tool leaves raw records (profile.remora); rocprof-attach
    # renders them as `remora report` does and prints the summary.
    tool = os.path.join(os.path.dirname(library), "libremora-tool.so")
    render = os.path.join(os.path.dirname(library), "libremora-render.so")
    if not (os.path.exists(tool) and os.path.exists(render)):
        pytest.skip(f"{tool} or {render} is not built")
    target = make_target(0)
    out = tmp_path / "out"
    env = clean_env(REMORA_OUTPUT_PATH=str(out))
    r = run_command(["-p", str(target.pid), "-d", "300", "--attach-children=false"], env=env)
    assert r.returncode == 0, r.stderr
    sessions = [d for d in out.iterdir() if d.is_dir() and not d.is_symlink()]
    assert len(sessions) == 1, (list(out.iterdir()), r.stderr)
    for f in ("profile.remora", "summary.txt", "trace.perfetto", "profile.pb.gz", "flamegraph.svg"):
        assert (sessions[0] / f).exists(), (f, r.stderr)
    assert "Remora profile of" in r.stdout, r.stdout
    assert f"rendered {sessions[0]}" in r.stderr, r.stderr


def test_attach_children_false(library, hook_tool, hook_log, make_target):
    target = make_target(2)
    env = clean_env(REMORA_HOOK_LOG=str(hook_log.path))
    r = run_command(["-p", str(target.pid), "-t", hook_tool, "-d", "50", "--attach-children=false"], env=env)
    assert r.returncode == 0, r.stderr
    assert hook_log.pids("tool_attach") == {target.pid}
    assert hook_log.pids("tool_detach") == {target.pid}


def test_environment_fallbacks(library, hook_tool, hook_log, make_target):
    target = make_target(1)
    env = clean_env(
        REMORA_HOOK_LOG=str(hook_log.path),
        ROCPROF_ATTACH_PID=str(target.pid),
        ROCPROF_ATTACH_TOOL_LIBRARY=hook_tool,
        ROCPROF_ATTACH_DURATION="100",
        ROCPROF_ATTACH_LIBRARY=library,
        ROCPROF_ATTACH_CHILDREN="no",
    )
    del env["REMORA_LIBRARY"]  # so that only ROCPROF_ATTACH_LIBRARY names the library
    r = run_command([], env=env)
    assert r.returncode == 0, r.stderr
    assert "detaching after 100 ms" in r.stderr
    assert hook_log.pids("tool_attach") == {target.pid}
    assert hook_log.pids("tool_detach") == {target.pid}


def test_command_line_wins_over_the_environment(library, hook_tool, hook_log, make_target):
    target = make_target(1)
    env = clean_env(
        REMORA_HOOK_LOG=str(hook_log.path),
        ROCPROF_ATTACH_PID=str(gone_pid()),
        ROCPROF_ATTACH_TOOL_LIBRARY="/no/such/tool.so",
        ROCPROF_ATTACH_DURATION="60000",
        ROCPROF_ATTACH_CHILDREN="0",
    )
    r = run_command(["-p", str(target.pid), "-t", hook_tool, "-d", "0", "--attach-children", "yes"], env=env)
    assert r.returncode == 0, r.stderr
    assert hook_log.pids("tool_detach") == target.all


@pytest.mark.parametrize("text,value", [("true", True), ("FALSE", False), ("yes", True), ("No", False), ("1", True), ("0", False)])
def test_booleans(text, value):
    assert cli.parse_bool(text) is value


def start_interactive(target, hook_tool, hook_log) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, str(PYTHON_DIR / "rocprof-attach"), "-p", str(target.pid), "-t", hook_tool],
        env=clean_env(REMORA_HOOK_LOG=str(hook_log.path)),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    line = _readline(proc.stderr, 20.0).decode()
    if "press Enter" not in line:
        proc.kill()
        raise AssertionError(f"rocprof-attach did not attach: {line!r} {proc.stderr.read()!r}")
    return proc


def test_enter_detaches(library, hook_tool, hook_log, make_target):
    target = make_target(1)
    proc = start_interactive(target, hook_tool, hook_log)
    try:
        time.sleep(0.2)
        assert proc.poll() is None, "without -d it must wait"
        assert not hook_log.pids("tool_detach")
        proc.stdin.write(b"\n")
        proc.stdin.flush()
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stderr.close()
    assert hook_log.pids("tool_detach") == target.all


def test_sigint_detaches(library, hook_tool, hook_log, make_target):
    target = make_target(1)
    proc = start_interactive(target, hook_tool, hook_log)
    try:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert "(signal)" in proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stderr.close()
    assert hook_log.pids("tool_detach") == target.all


def test_killed_command_leaves_no_tools_attached(library, hook_tool, hook_log, make_target):
    # The lease: when the command dies, the agents detach the tools themselves.
    target = make_target(1)
    proc = start_interactive(target, hook_tool, hook_log)
    proc.kill()
    proc.wait()
    proc.stdin.close()
    proc.stderr.close()
    assert hook_log.wait_for("tool_detach", target.all) == target.all


def test_errors_and_exit_codes(library, hook_tool, make_target):
    r = run_command(["-p", str(gone_pid()), "-t", hook_tool, "-d", "0"], env=clean_env())
    assert r.returncode == 2
    assert "REMORA_STATUS_NO_SUCH_PROCESS" in r.stderr

    r = run_command(["-t", hook_tool], env=clean_env())
    assert r.returncode == 1 and "-p PID" in r.stderr

    r = run_command(["-p", "abc"], env=clean_env())
    assert r.returncode == 1

    r = run_command(["-p", "1"], env=clean_env(ROCPROF_ATTACH_CHILDREN="maybe"))
    assert r.returncode == 1 and "ROCPROF_ATTACH_CHILDREN" in r.stderr

    r = run_command(["-p", "1", "-d", "-5"], env=clean_env())
    assert r.returncode == 1

    target = make_target(0)
    r = run_command(["-p", str(target.pid), "-t", library, "-d", "0"], env=clean_env())  # not a tool
    assert r.returncode not in (0, 1) and "error:" in r.stderr


def test_help_mentions_every_option_and_variable():
    r = run_command(["-h"], env=clean_env())
    assert r.returncode == 0
    for text in [
        "-p",
        "--pid",
        "-t",
        "--attach-tool-library",
        "-d",
        "--attach-duration-msec",
        "--attach-library",
        "--attach-children",
        *ENV_VARS,
        "Exit codes",
    ]:
        assert text in r.stdout, text
    for code in range(14):
        assert f"\n  {code:>2}  " in r.stdout


def test_python_dash_m():
    r = subprocess.run(
        [sys.executable, "-m", "remora", "--help"],
        cwd=PYTHON_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and "ROCPROF_ATTACH_PID" in r.stdout
