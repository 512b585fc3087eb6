#!/usr/bin/env python3
"""End-to-end tests of `remora attach`, `detach`, `status` and `run`.

Drives the built remora binary against remora_cli_target (a parent with N
children, cli_target.c) and the hook test tool, which appends one line per
lifecycle call ("a:tool_attach pid=..." ...) to $REMORA_HOOK_LOG. Every wait
has a deadline; every process started here is killed and reaped, whatever
happens. Exit status 0 when every test passed.

  cli_test.py --remora build/bin/remora --target build/bin/remora_cli_target \
              --hook-tool build/lib/libremora-hook-tool-a.so \
              --noattach-tool build/lib/libremora-hook-tool-noattach.so [TEST...]
"""
import argparse
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

ARGS = None
PROCS = []  # every Popen started here: killed and reaped after each test


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Failure("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(0.02)


def read_until(p, text, timeout):
    """Reads p's stdout (a pipe) until `text` appears; returns what it read.
    Raw reads: a later p.communicate() returns the rest."""
    fd = p.stdout.fileno()
    got = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise Failure("timed out after %.1f s waiting for %r; read so far:\n%s" %
                          (timeout, text, got.decode(errors="replace")))
        chunk = os.read(fd, 4096)
        if not chunk:
            raise Failure("the output ended before %r; read:\n%s" % (text, got.decode(errors="replace")))
        got += chunk
    return got.decode(errors="replace")


def spawn(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    PROCS.append(p)
    return p


def cleanup():
    for p in PROCS:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL) if getattr(p, "own_group", False) else p.kill()
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print("warning: pid %d could not be reaped" % p.pid)
    PROCS.clear()


def remora(*args, timeout=30, env=None, stdin=subprocess.DEVNULL, cwd=None):
    """Runs remora to completion; returns (exit code, stdout, stderr)."""
    e = dict(os.environ)
    e.update(env or {})
    p = spawn([ARGS.remora] + [str(a) for a in args], stdin=stdin, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, text=True, env=e, cwd=cwd)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            out, err = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process it started still holds the pipes
            out, err = "(not readable)", "(not readable)"
        raise Failure("remora %s did not finish in %d s\nstdout:\n%s\nstderr:\n%s" %
                      (" ".join(map(str, args)), timeout, out, err))
    return p.returncode, out, err


def show(rc, out, err):
    return "exit %d\n--- stdout:\n%s--- stderr:\n%s" % (rc, out, err)


class Tree:
    """remora_cli_target with `children` children, ready when its file is."""

    def __init__(self, tmp, children, extra=()):
        self.ready = os.path.join(tmp, "ready-%d" % time.monotonic_ns())
        # Its own process group: the clean-up kills the children too, which
        # would otherwise hold ctest's output pipe open after a failure.
        self.proc = spawn([ARGS.target, str(children), self.ready] + [str(x) for x in extra],
                          start_new_session=True)
        self.proc.own_group = True
        text = wait_for(lambda: self.proc.poll() is None and os.path.exists(self.ready) and open(self.ready).read(),
                        10, "the target tree to be ready")
        self.pids = [int(x) for x in text.split()]
        self.pid = self.pids[0]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=10)
        check(rc == 0, "the target tree exits cleanly after the session", "exit %d" % rc)


def hook_events(log):
    """{pid: [hook, ...]} from the hook tool's log."""
    events = {}
    if not os.path.exists(log):
        return events
    for line in open(log):
        m = re.match(r"a:(\w+) pid=(\d+)", line)
        if m:
            events.setdefault(int(m.group(2)), []).append(m.group(1))
    return events


def count(events, pid, hook):
    return events.get(pid, []).count(hook)


def status_rows(pid, tree=False):
    rc, out, err = remora("status", "-p", pid, *(["--tree"] if tree else []))
    check(rc == 0, "remora status succeeds", show(rc, out, err))
    lines = out.splitlines()
    check(lines and lines[0].split()[:4] == ["PID", "COMMAND", "AGENT", "ATTACHED"], "status prints its header",
          out)
    rows = {}
    for line in lines[1:]:
        f = line.split()
        if len(f) >= 8 and f[0].isdigit():
            rows[int(f[0])] = {"agent": f[2], "attached": f[3], "sessions": f[4], "listener": f[5],
                               "lease": f[6], "tools": " ".join(f[7:])}
    return rows


# ---- tests ------------------------------------------------------------------

def test_attach_tree_for_a_duration(tmp):
    tree = Tree(tmp, 2)
    log = os.path.join(tmp, "hook.log")
    rows = status_rows(tree.pid, tree=True)
    check(set(rows) == set(tree.pids), "status --tree lists the whole tree", str(rows))
    check(all(r["agent"] == "no" for r in rows.values()), "no agent before the attach", str(rows))
    t0 = time.monotonic()
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log,
                          "-d", 300)
    took = time.monotonic() - t0
    check(rc == 0, "attach -d 300 succeeds", show(rc, out, err))
    check(took >= 0.3, "attach waited for -d 300 (took %.2f s)" % took)
    for pid in tree.pids:
        check(re.search(r"^\s+%d\s+remora_cli_targ\s+attached" % pid, out, re.M),
              "the output lists pid %d as attached" % pid, out)
    check("Detached from 3 processes" in out, "the output says all three were detached", out)
    ev = hook_events(log)
    for pid in tree.pids:
        check(count(ev, pid, "tool_attach") == 1 and count(ev, pid, "tool_detach") == 1,
              "pid %d was attached and detached once" % pid, open(log).read())
    rows = status_rows(tree.pid, tree=True)
    for pid in tree.pids:
        r = rows[pid]
        check(r["agent"] == "yes" and r["attached"] == "no" and r["sessions"] == "1/1" and r["listener"].isdigit()
              and r["lease"] == "-" and r["tools"].endswith(os.path.basename(ARGS.hook_tool)),
              "status of pid %d after the session" % pid, str(r))
    tree.stop()


def test_attach_pid_alone(tmp):
    tree = Tree(tmp, 1)
    log = os.path.join(tmp, "hook.log")
    rc, out, err = remora("attach", "-p", tree.pid, "--attach-children=false", "-t", ARGS.hook_tool,
                          "-e", "REMORA_HOOK_LOG=" + log, "-d", 100)
    check(rc == 0, "attach --attach-children=false succeeds", show(rc, out, err))
    ev = hook_events(log)
    check(count(ev, tree.pid, "tool_attach") == 1 and count(ev, tree.pid, "tool_detach") == 1,
          "the root was attached and detached", str(ev))
    check(tree.pids[1] not in ev, "the child was left alone", str(ev))
    tree.stop()


def test_attach_until_sigint(tmp):
    tree = Tree(tmp, 1)
    log = os.path.join(tmp, "hook.log")
    p = spawn([ARGS.remora, "attach", "-p", str(tree.pid), "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log],
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Printed once every process is attached and its lease armed.
    before = read_until(p, "Attached to", 15)
    ev = hook_events(log)
    for pid in tree.pids:
        check(count(ev, pid, "tool_attach") == 1, "pid %d was attached" % pid, str(ev))
    rows = status_rows(tree.pid, tree=True)
    for pid in tree.pids:
        check(rows[pid]["attached"] == "yes" and rows[pid]["lease"].startswith(str(p.pid)),
              "while attached, status shows pid %d attached with remora's lease" % pid, str(rows[pid]))
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        raise Failure("remora did not exit within 15 s of SIGINT")
    out = before + out
    check(p.returncode == 0, "SIGINT ends the session with exit 0", show(p.returncode, out, err))
    check("Got SIGINT: detaching." in out, "remora says why it detached", out)
    ev = hook_events(log)
    for pid in tree.pids:
        check(count(ev, pid, "tool_detach") == 1, "pid %d was detached" % pid, str(ev))
    tree.stop()


def test_lease_detaches_when_remora_dies(tmp):
    tree = Tree(tmp, 0)
    log = os.path.join(tmp, "hook.log")
    p = spawn([ARGS.remora, "attach", "-p", str(tree.pid), "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log],
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    read_until(p, "Attached to", 15)  # the lease is armed
    check(count(hook_events(log), tree.pid, "tool_attach") == 1, "the attach")
    p.kill()
    p.wait(timeout=10)
    wait_for(lambda: count(hook_events(log), tree.pid, "tool_detach") == 1, 10,
             "the agent to detach the tools itself once remora is gone (lease)")
    r = wait_for(lambda: (status_rows(tree.pid)[tree.pid]["lease"] == "expired") and status_rows(tree.pid)[tree.pid],
                 5, "status to show the expired lease")
    check(r["attached"] == "no", "nothing attached after the lease expired", str(r))
    tree.stop()


def test_keep_then_detach_from_another_invocation(tmp):
    tree = Tree(tmp, 2)
    log = os.path.join(tmp, "hook.log")
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "--keep")
    check(rc == 0, "attach --keep succeeds", show(rc, out, err))
    check("remora detach -p %d --tree" % tree.pid in out, "attach --keep says how to detach", out)
    ev = hook_events(log)
    for pid in tree.pids:
        check(count(ev, pid, "tool_attach") == 1 and count(ev, pid, "tool_detach") == 0,
              "pid %d stays attached after remora exits" % pid, str(ev))
    rows = status_rows(tree.pid, tree=True)
    for pid in tree.pids:
        check(rows[pid]["attached"] == "yes" and rows[pid]["lease"] == "-",
              "status: pid %d attached, no lease" % pid, str(rows[pid]))
    # Detach the root alone first, then the rest of the tree.
    rc, out, err = remora("detach", "-p", tree.pid)
    check(rc == 0 and "Detached" in out, "detach -p ROOT succeeds", show(rc, out, err))
    check(count(hook_events(log), tree.pid, "tool_detach") == 1, "the root was detached")
    rc, out, err = remora("detach", "-p", tree.pid)
    check(rc == 13 and "remora: error:" in err, "a second detach of the root exits 13 (not attached)",
          show(rc, out, err))
    rc, out, err = remora("detach", "-p", tree.pid, "--tree")
    check(rc == 0, "detach --tree detaches the children", show(rc, out, err))
    check(re.search(r"^\s+%d\s+\S+\s+not attached" % tree.pid, out, re.M), "the root is listed as not attached",
          out)
    ev = hook_events(log)
    for pid in tree.pids:
        check(count(ev, pid, "tool_detach") == 1, "pid %d detached exactly once" % pid, str(ev))
    rc, out, err = remora("detach", "-p", tree.pid, "--tree")
    check(rc == 13, "detach --tree with nothing attached exits 13", show(rc, out, err))
    tree.stop()


def test_run(tmp):
    log = os.path.join(tmp, "hook.log")
    ready = os.path.join(tmp, "run-ready")
    p = spawn([ARGS.remora, "run", "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "--",
               ARGS.target, "1", ready, "1500", "3"],
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    text = wait_for(lambda: os.path.exists(ready) and open(ready).read(), 10, "the program started by run")
    pids = [int(x) for x in text.split()]
    rows = wait_for(lambda: (lambda r: r if r.get(pids[0], {}).get("attached") == "yes" else None)(
        status_rows(pids[0], tree=True)), 10, "run to attach the tool")
    for pid in pids:
        check(rows[pid]["agent"] == "yes" and rows[pid]["listener"].isdigit(),
              "pid %d has the agent (preloaded) and its listener" % pid, str(rows[pid]))
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        raise Failure("remora run did not exit after its program")
    check(p.returncode == 3, "remora run exits with the program's status (3)", show(p.returncode, out, err))
    ev = hook_events(log)
    check(count(ev, pids[0], "tool_attach") == 1, "run attached the tool to the program", str(ev))
    check(count(ev, pids[0], "tool_detach") == 1, "the tool was detached when the program exited", str(ev))
    check("preloaded" in err and "attached" in err, "run says what it did on stderr", err)

    rc, out, err = remora("run", "--no-tool", "--", "sh", "-c", "kill -TERM $$")
    check(rc == 128 + signal.SIGTERM, "run exits 128+N when a signal kills the program", show(rc, out, err))
    rc, out, err = remora("run", "--no-tool", "--", "sh", "-c", 'case "$LD_PRELOAD" in *libremora-agent.so) exit 7;; esac')
    check(rc == 7, "run preloads the agent through LD_PRELOAD", show(rc, out, err))
    rc, out, err = remora("run", "--no-tool", "--", os.path.join(tmp, "no-such-program"))
    check(rc == 127 and "remora: error: cannot run" in err, "run of a missing program exits 127", show(rc, out, err))

    # SIGTERM to remora reaches the program, and remora exits with its status.
    ready2 = ready + "2"
    p = spawn([ARGS.remora, "run", "--no-tool", "--", ARGS.target, "0", ready2],
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: os.path.exists(ready2), 10, "the program started by run --no-tool")
    p.send_signal(signal.SIGTERM)
    try:
        out, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        raise Failure("remora run did not forward SIGTERM")
    check(p.returncode == 0, "SIGTERM is forwarded; the program exits 0 and so does run",
          show(p.returncode, out, err))


def test_default_tool_output(tmp):
    tool = os.path.join(os.path.dirname(os.path.abspath(ARGS.remora)), "..", "lib", "libremora-tool.so")
    if not os.path.exists(tool):
        print("      (skipped: %s is not built)" % tool)
        return
    # The target works in its own directory: a relative REMORA_OUTPUT_PATH
    # lands there, the default one in remora's working directory.
    target_cwd = os.path.join(tmp, "target-cwd")
    remora_cwd = os.path.join(tmp, "remora-cwd")
    os.makedirs(target_cwd)
    os.makedirs(remora_cwd)
    ready = os.path.join(tmp, "ready")
    p = spawn([ARGS.target, "1", ready], cwd=target_cwd)
    pids = [int(x) for x in wait_for(lambda: os.path.exists(ready) and open(ready).read(), 10, "the target").split()]
    for where, extra in ((os.path.join(remora_cwd, "remora-output"), []),
                         (os.path.join(target_cwd, "out"), ["-e", "REMORA_OUTPUT_PATH=out"])):
        rc, out, err = remora("attach", "-p", pids[0], "-d", 300, *extra, timeout=60, cwd=remora_cwd)
        check(rc == 0, "attach with the default tool succeeds", show(rc, out, err))
        for pid in pids:
            m = re.search(r"^==> pid %d: (\S+)$" % pid, out, re.M)
            check(m and m.group(1).startswith(where + "/"), "the output of pid %d is under %s" % (pid, where), out)
            for f in ("summary.txt", "trace.json", "flamegraph.svg", "folded.txt", "stats.csv"):
                check(os.path.exists(os.path.join(m.group(1), f)) and os.path.join(m.group(1), f) in out,
                      "%s exists and is named" % f, out)
        check("Remora profile of remora_cli_targ" in out, "the summary is printed", out)
    p.send_signal(signal.SIGTERM)
    check(p.wait(timeout=10) == 0, "the target exits cleanly")


def test_call(tmp):
    # `remora call` end to end (make demo shows attach once the default tool is built).
    tree = Tree(tmp, 0)
    rc, out, err = remora("call", "-p", tree.pid, "--ret", "int", "getpid")
    check(rc == 0 and out.startswith("getpid() = %d " % tree.pid), "remora call getpid returns the pid",
          show(rc, out, err))
    rc, out, err = remora("call", "-p", tree.pid, "libc.so.6:nosuchfunction")
    check(rc == 4, "remora call of a missing symbol exits 4", show(rc, out, err))
    tree.stop()


def test_errors(tmp):
    gone = subprocess.Popen(["true"])  # a pid that existed and was reaped
    gone.wait(timeout=10)
    pid = gone.pid
    for cmd in (["attach", "-p", pid, "-t", ARGS.hook_tool, "-d", 10], ["status", "-p", pid],
                ["detach", "-p", pid], ["status", "-p", pid, "--tree"],
                ["attach", "-p", pid, "--attach-children=false", "-t", ARGS.hook_tool, "-d", 10]):
        if os.path.exists("/proc/%d" % pid):
            break  # reused meanwhile: nothing to learn
        rc, out, err = remora(*cmd)
        check(rc == 2 and err.startswith("remora: error: "),
              "remora %s exits 2 (no such process)" % " ".join(map(str, cmd)), show(rc, out, err))
    tree = Tree(tmp, 1)
    rc, out, err = remora("attach", "-p", tree.pid, "-t", os.path.join(tmp, "libnothere.so"), "-d", 10)
    check(rc == 1 and "not found" in err, "a missing tool file exits 1", show(rc, out, err))
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.noattach_tool, "-d", 10)
    check(rc == 12 and "remora: error:" in err, "a tool that cannot be attached exits 12", show(rc, out, err))
    rc, out, err = remora("attach", "-p", tree.pid, "-d", 10, env={"REMORA_TOOL_PATH": os.path.join(tmp, "none.so")})
    check(rc == 12 and "default tool is missing" in err and "-t" in err,
          "a missing default tool exits 12 and says to pass -t", show(rc, out, err))
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.hook_tool, "-e", "1BAD=x", "-d", 10)
    check(rc == 1, "a bad -e exits 1", show(rc, out, err))
    rc, out, err = remora("attach", "-p", tree.pid, "--keep", "-d", 10, "-t", ARGS.hook_tool)
    check(rc == 1, "--keep with -d is a usage error", show(rc, out, err))
    rc, out, err = remora("detach", "-p", tree.pid)
    check(rc == 13, "detach of a process with no agent exits 13", show(rc, out, err))
    rc, out, err = remora("run")
    check(rc == 1 and "missing CMD" in err, "run without CMD exits 1", show(rc, out, err))
    tree.stop()


TESTS = [v for k, v in list(globals().items()) if k.startswith("test_")]


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for a in ("--remora", "--target", "--hook-tool", "--noattach-tool"):
        ap.add_argument(a, required=True)
    ap.add_argument("tests", nargs="*")
    ARGS = ap.parse_args()
    for a in ("remora", "target", "hook_tool", "noattach_tool"):
        setattr(ARGS, a, os.path.abspath(getattr(ARGS, a)))
    failed = []
    for t in TESTS:
        if ARGS.tests and t.__name__ not in ARGS.tests and t.__name__[5:] not in ARGS.tests:
            continue
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="remora-cli-") as tmp:
            try:
                t(tmp)
                print("ok    %s (%.1f s)" % (t.__name__, time.monotonic() - t0), flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on to the next test
                failed.append(t.__name__)
                detail = str(e) if isinstance(e, Failure) else traceback.format_exc()
                print("FAIL  %s: %s" % (t.__name__, detail), flush=True)
            finally:
                cleanup()
    print("%d of %d tests failed" % (len(failed), len(TESTS)) if failed else "all tests passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
