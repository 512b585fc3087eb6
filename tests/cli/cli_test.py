#!/usr/bin/env python3
"""End-to-end tests of `remora attach`, `detach`, `status` and `run`.

Drives the built remora binary against remora_cli_target (a parent with N
children, cli_target.c) and the hook test tool, which appends one line per
lifecycle call ("a:tool_attach pid=..." ...) to $REMORA_HOOK_LOG. Every wait
has a deadline; every process started here is killed and reaped, whatever
happens. Exit status 0 when every test passed.

  cli_test.py --remora build/bin/remora --target build/bin/remora_cli_target \
              --hook-tool build/lib/libremora-hook-tool-a.so \
              --noattach-tool build/lib/libremora-hook-tool-noattach.so \
              --static-target build/bin/remora_cli_target_static \
              --rocattach-example build/bin/remora_rocattach_example [TEST...]
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
    # Newest first: a tracer (refusal_helper.py trace) goes before its
    # tracee, which its real parent cannot reap while the tracer holds it.
    for p in reversed(PROCS):
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
        # The preloaded agent starts no thread until asked: the attached
        # program has its listener, a child forked unattached has none.
        want_listener = rows[pid]["attached"] == "yes"
        check(rows[pid]["agent"] == "yes" and rows[pid]["listener"].isdigit() == want_listener,
              "pid %d has the agent (preloaded) and %s" % (pid, "its listener" if want_listener else "no thread of ours"),
              str(rows[pid]))
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
    # The caller's REMORA_* variables reach the target too; -e wins over them.
    from_env = os.path.join(tmp, "from-env")
    for where, extra, env in ((os.path.join(remora_cwd, "remora-output"), [], {}),
                              (os.path.join(target_cwd, "out"), ["-e", "REMORA_OUTPUT_PATH=out"], {}),
                              (from_env, [], {"REMORA_OUTPUT_PATH": from_env}),
                              (os.path.join(target_cwd, "out"), ["-e", "REMORA_OUTPUT_PATH=out"],
                               {"REMORA_OUTPUT_PATH": from_env})):
        rc, out, err = remora("attach", "-p", pids[0], "-d", 300, *extra, timeout=60, cwd=remora_cwd, env=env)
        check(rc == 0, "attach with the default tool succeeds", show(rc, out, err))
        for pid in pids:
            m = re.search(r"^==> pid %d: (\S+)$" % pid, out, re.M)
            check(m and m.group(1).startswith(where + "/"), "the output of pid %d is under %s" % (pid, where), out)
            # The tool left its raw records; remora rendered the rest and
            # printed the summary, which names each file of the directory.
            check("  output: " + m.group(1) + "\n" in out, "the summary names the directory", out)
            for f in ("profile.remora", "trace.perfetto", "profile.pb.gz", "trace.json", "flamegraph.svg",
                      "folded.txt", "stats.csv", "summary.txt"):
                check(os.path.exists(os.path.join(m.group(1), f)), "%s exists" % f, out)
                check(f == "summary.txt" or f == "profile.remora" or "    " + f + " " in out,
                      "%s is named in the summary" % f, out)
            check("Render again with: remora report " + m.group(1) in out, "says how to render again", out)
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


def agent_attached(pid):
    """The agent's own word (remora status): 'yes' or 'no'."""
    return status_rows(pid)[pid]["attached"]


def test_controller_killed_at_any_instant(tmp):
    # Issue 12 part 1: SIGKILL `remora attach -d 3000` at random instants
    # from 0 to 60 ms after it starts, and while attached. After each kill
    # the agent must say "not attached" within 1 s (its lease, armed by the
    # attach call itself, detaches what was attached), and the next attach
    # must succeed. The hook tool's log and remora's own output tell where
    # each kill landed.
    import random
    rnd = random.Random(int(os.environ.get("REMORA_KILL_SEED", str(time.monotonic_ns()))))
    tree = Tree(tmp, 0)
    log = os.path.join(tmp, "hook.log")
    kills = int(os.environ.get("REMORA_KILLS", "200"))
    landed = {"before": 0, "during": 0, "after": 0}
    worst = 0.0
    left_attached = 0
    for i in range(kills):
        attaches_before = count(hook_events(log), tree.pid, "tool_attach")
        p = spawn([ARGS.remora, "attach", "-p", str(tree.pid), "--attach-children=false", "-t", ARGS.hook_tool,
                   "-e", "REMORA_HOOK_LOG=" + log, "-d", "3000"],
                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        said = ""
        if i % 4 == 3:
            said = read_until(p, "Attached to", 15)  # a kill while attached
        else:
            # A random instant 0..60 ms after the start (every other one in
            # the first 6 ms, where remora's start-up and a re-attach run).
            # select() with nothing to watch is the timer.
            delay = rnd.uniform(0, 0.006 if i % 4 == 1 else 0.060)
            select.select([], [], [], delay)
        p.kill()
        p.wait(timeout=10)
        if select.select([p.stdout], [], [], 0)[0]:
            said += os.read(p.stdout.fileno(), 65536).decode(errors="replace")
        p.stdout.close()
        attached_now = count(hook_events(log), tree.pid, "tool_attach") > attaches_before
        if not attached_now:
            landed["before"] += 1
        elif "Attached to" in said:
            landed["after"] += 1
        else:
            landed["during"] += 1
        t0 = time.monotonic()
        try:
            wait_for(lambda: agent_attached(tree.pid) != "yes", 1.0,
                     "the agent to report not attached after kill %d" % i)
        except Failure:
            left_attached += 1
            rows = status_rows(tree.pid)
            raise Failure("kill %d left the process attached: %s\n%s" % (i, rows, open(log).read()[-2000:]))
        worst = max(worst, time.monotonic() - t0)
        if i % 10 == 9:
            rc, out, err = remora("attach", "-p", tree.pid, "--attach-children=false", "-t", ARGS.hook_tool,
                                  "-e", "REMORA_HOOK_LOG=" + log, "-d", 1)
            check(rc == 0, "the attach after kill %d succeeds" % i, show(rc, out, err))
    rc, out, err = remora("attach", "-p", tree.pid, "--attach-children=false", "-t", ARGS.hook_tool,
                          "-e", "REMORA_HOOK_LOG=" + log, "-d", 1)
    check(rc == 0, "the attach after the last kill succeeds", show(rc, out, err))
    ev = hook_events(log)
    check(count(ev, tree.pid, "tool_attach") == count(ev, tree.pid, "tool_detach"),
          "every attach the log shows was detached", str(ev.get(tree.pid, [])[-6:]))
    print("      %d kills: %d before the tools' attach, %d during it (attached, remora not yet told), "
          "%d after (attached); %d left attached; slowest return to 'not attached' %.0f ms" %
          (kills, landed["before"], landed["during"], landed["after"], left_attached, worst * 1000))
    tree.stop()


def test_lease_with_an_agent_of_protocol_1(tmp):
    # The controller's fallback for an agent without the leased attach
    # (REMORA_INJECT_FAULT=old-agent makes it take the agent for one): the
    # lease is armed after the attach, and still expires when remora dies.
    tree = Tree(tmp, 0)
    log = os.path.join(tmp, "hook.log")
    env = dict(os.environ, REMORA_INJECT_FAULT="old-agent")
    p = spawn([ARGS.remora, "attach", "-p", str(tree.pid), "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log],
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    read_until(p, "Attached to", 15)
    r = status_rows(tree.pid)[tree.pid]
    check(r["attached"] == "yes" and r["lease"].startswith(str(p.pid)), "attached with remora's lease", str(r))
    p.kill()
    p.wait(timeout=10)
    wait_for(lambda: agent_attached(tree.pid) == "no", 5, "the lease armed the old way to expire")
    tree.stop()


def test_static_binary(tmp):
    # As `remora call` says it: exit 5, "statically linked", not "load the library first".
    ready = os.path.join(tmp, "ready")
    t = spawn([ARGS.static_target, "0", ready])
    pid = int(wait_for(lambda: os.path.exists(ready) and open(ready).read(), 10, "the static target").split()[0])
    for extra in ([], ["--attach-children=false"]):
        rc, out, err = remora("attach", "-p", pid, "-t", ARGS.hook_tool, "-d", 100, *extra)
        check(rc == 5 and "statically linked" in err and "load the library first" not in err + out,
              "attach %s to a static binary exits 5 and says why" % " ".join(extra), show(rc, out, err))
    rc, out, err = remora("call", "-p", pid, "getpid")
    check(rc == 5 and "statically linked" in err, "call agrees", show(rc, out, err))
    t.send_signal(signal.SIGTERM)
    t.wait(timeout=10)


def test_zombie(tmp):
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        wait_for(lambda: open("/proc/%d/stat" % child).read().rsplit(")", 1)[1].split()[0] == "Z", 10,
                 "the child to be a zombie")
        for extra in ([], ["--attach-children=false"]):
            rc, out, err = remora("attach", "-p", child, "-t", ARGS.hook_tool, "-d", 100, *extra)
            check(rc == 2 and ("is a zombie" in err) and ("waits for its parent (%d)" % os.getpid()) in err,
                  "attach %s to a zombie exits 2 and names its parent" % " ".join(extra), show(rc, out, err))
    finally:
        os.waitpid(child, 0)


def test_kernel_thread(tmp):
    if not os.path.exists("/proc/2/status") or "kthreadd" not in open("/proc/2/status").read():
        print("      (skipped: pid 2 is not kthreadd here, e.g. in a pid namespace)")
        return
    t0 = time.monotonic()
    rc, out, err = remora("attach", "-p", 2, "-t", ARGS.hook_tool, "-d", 100)
    took = time.monotonic() - t0
    check(rc == 2 and "is a kernel thread" in err and len(err.strip().splitlines()) == 1,
          "attach -p 2 exits 2 with one refusal", show(rc, out, err))
    check("kworker" not in out + err and took < 2, "no kernel thread below it was tried (%.2f s)" % took,
          show(rc, out, err))


def test_second_controller_names_the_owner(tmp):
    tree = Tree(tmp, 0)
    log = os.path.join(tmp, "hook.log")
    # One session, then a second controller; then two starting at once.
    a = spawn([ARGS.remora, "attach", "-p", str(tree.pid), "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log,
               "-d", "3000"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_until(a, "Attached to", 15)
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.hook_tool, "-d", 100)
    check(rc == 13 and ("attached by remora pid %d, lease live" % a.pid) in err and "remora detach" not in err + out,
          "the second controller names the owner and suggests no detach", show(rc, out, err))
    check(agent_attached(tree.pid) == "yes" and status_rows(tree.pid)[tree.pid]["lease"].startswith(str(a.pid)),
          "the first session keeps its lease", str(status_rows(tree.pid)))
    a.kill()
    a.wait(timeout=10)
    wait_for(lambda: agent_attached(tree.pid) == "no", 5, "the first session's lease to expire")
    for _ in range(3):
        racers = [spawn([ARGS.remora, "attach", "-p", str(tree.pid), "-t", ARGS.hook_tool, "-d", "300"],
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                  for _ in range(2)]
        results = [(r,) + r.communicate(timeout=30) for r in racers]
        won = [r for r in results if r[0].returncode == 0]
        lost = [r for r in results if r[0].returncode != 0]
        check(len(won) >= 1, "one of two controllers attaching at once wins",
              "\n".join(show(r[0].returncode, r[1], r[2]) for r in results))
        for r in lost:
            check(r[0].returncode == 13 and ("attached by remora pid %d, lease live" % won[0][0].pid) in r[2]
                  and "remora detach" not in r[1] + r[2], "the loser names the winner",
                  show(r[0].returncode, r[1], r[2]))
    tree.stop()


def test_target_dies_during_the_session(tmp):
    tool = os.path.join(os.path.dirname(os.path.abspath(ARGS.remora)), "..", "lib", "libremora-tool.so")
    with_default = os.path.exists(tool)
    if not with_default:
        print("      (the default tool is not built: its outputs are not checked)")
    tools = [] if with_default else ["-t", ARGS.hook_tool]
    out_root = os.path.join(tmp, "out")
    for sig, core in ((signal.SIGKILL, False), (signal.SIGSEGV, False)):
        tree = Tree(tmp, 0)
        if with_default:
            # Session 1 ends normally and writes its output.
            rc, out, err = remora("attach", "-p", tree.pid, "-e", "REMORA_OUTPUT_PATH=" + out_root, "-d", 200,
                                  timeout=60)
            check(rc == 0 and "==> pid %d" % tree.pid in out, "session 1 writes its output", show(rc, out, err))
        p = spawn([ARGS.remora, "attach", "-p", str(tree.pid), "-e", "REMORA_OUTPUT_PATH=" + out_root, "-d", "5000"]
                  + tools, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        before = read_until(p, "Attached to", 15)
        os.kill(tree.pid, sig)
        out, err = p.communicate(timeout=15)
        out = before + out
        name = signal.Signals(sig).name
        check(p.returncode == 7 and ("was killed by %s (signal %d" % (name, sig)) in out + err,
              "a target killed by %s: exit 7, and remora says how it died" % name, show(p.returncode, out, err))
        check("==> pid" not in out, "no older session's profile is printed as this one's",
              show(p.returncode, out, err))
        tree.proc.wait(timeout=10)


def test_rocattach_doc_example(tmp):
    # The documented C++ attach example, built unchanged against
    # include/rocattach.h (it relies on the header for kill()), runs: the
    # tool is attached and detached once, and the target lives on.
    tree = Tree(tmp, 0)
    log = os.path.join(tmp, "hook.log")
    env = dict(os.environ, ROCPROF_ATTACH_TOOL_LIBRARY=ARGS.hook_tool, REMORA_HOOK_LOG=log)
    p = spawn([ARGS.rocattach_example, str(tree.pid), "200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              text=True, env=env)
    out, err = p.communicate(timeout=30)
    check(p.returncode == 0 and "still running" in out, "the example attaches and detaches",
          show(p.returncode, out, err))
    ev = hook_events(log)
    check(count(ev, tree.pid, "tool_attach") == 1 and count(ev, tree.pid, "tool_detach") == 1,
          "the example's session reached the tool", str(ev))
    tree.stop()


def proc_state(pid):
    """(open descriptors, /proc/PID/maps lines) of a process."""
    return sorted(os.listdir("/proc/%d/fd" % pid)), open("/proc/%d/maps" % pid).read().splitlines()


def remora_maps(lines):
    """Lines naming Remora's agent or tool, a memfd or a scratch mapping."""
    marks = ("libremora-", "remora-hook-tool", "memfd:", "anon:remora")
    return [l for l in lines if any(m in l for m in marks)]


def libc_own(line, before):
    """Memory of glibc's malloc that an unload leaves, being the allocator's
    and not Remora's: a thread arena (a 64 MiB-aligned anonymous heap, made by
    the first thread that mallocs while none is free; glibc never unmaps one)
    and the [heap] of a process that had never called malloc before (the
    pthread_create that starts the loader thread allocates)."""
    f = line.split()
    if f[-1] == "[heap]":
        return not any(l.endswith("[heap]") for l in before)
    if len(f) != 5 or f[4] != "0":
        return False  # named or file-backed
    start, end = (int(x, 16) for x in f[0].split("-"))
    heap_max = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: heaps are aligned to it
    return (f[1] == "rw-p" and start % heap_max == 0) or (f[1] == "---p" and end % heap_max == 0)


def check_back(pids, before, what):
    """Every pid has its descriptors back, and its maps the lines it had, save
    glibc's own malloc memory (libc_own). Prints what differs."""
    for pid in pids:
        fds, maps = proc_state(pid)
        added = [l for l in maps if l not in before[pid][1]]
        gone = [l for l in before[pid][1] if l not in maps]
        libc = [l for l in added if libc_own(l, before[pid][1])]
        print("  [unload] %s: pid %d fds %d -> %d, maps lines %d -> %d; glibc's malloc memory left: %s" %
              (what, pid, len(before[pid][0]), len(fds), len(before[pid][1]), len(maps), libc or "none"), flush=True)
        check(fds == before[pid][0], "%s: pid %d has its descriptors back" % (what, pid),
              "before %s, after %s" % (before[pid][0], fds))
        check(remora_maps(maps) == [], "%s: nothing of Remora's is mapped in pid %d" % (what, pid),
              "\n".join(remora_maps(maps)))
        check(len(maps) - len(libc) == len(before[pid][1]),
              "%s: pid %d has its mappings back (but for glibc's malloc memory)" % (what, pid),
              "added:\n%s\ngone:\n%s" % ("\n".join(added), "\n".join(gone)))


def test_detach_unload(tmp):
    tree = Tree(tmp, 1)
    log = os.path.join(tmp, "hook.log")
    before = {pid: proc_state(pid) for pid in tree.pids}
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "--keep")
    check(rc == 0, "attach --keep succeeds", show(rc, out, err))
    rc, out, err = remora("detach", "-p", tree.pid, "--unload")
    check(rc == 0 and "unloaded" in out, "detach --unload of the root succeeds", show(rc, out, err))
    check(count(hook_events(log), tree.pid, "tool_fini") == 1, "the root's tool ran tool_fini", open(log).read())
    rows = status_rows(tree.pid, tree=True)
    check(rows[tree.pid]["agent"] == "no", "status: no agent in the root after the unload", str(rows))
    check(rows[tree.pids[1]]["attached"] == "yes", "status: the child stays attached", str(rows))
    # The child: detached first, then unloaded by a second invocation.
    rc, out, err = remora("detach", "-p", tree.pids[1])
    check(rc == 0, "plain detach of the child", show(rc, out, err))
    rc, out, err = remora("detach", "-p", tree.pid, "--tree", "--unload")
    check(rc == 0, "detach --tree --unload succeeds", show(rc, out, err))
    check(re.search(r"^\s+%d\s+\S+\s+detached, unloaded" % tree.pids[1], out, re.M),
          "the child is listed as unloaded", out)
    check(re.search(r"^\s+%d\s+\S+\s+not attached" % tree.pid, out, re.M), "the root has nothing left", out)
    check_back(tree.pids, before, "detach --unload")
    rc, out, err = remora("detach", "-p", tree.pid, "--unload")
    check(rc == 13, "detach --unload with no agent exits 13", show(rc, out, err))
    # A re-attach loads a fresh agent.
    rc, out, err = remora("attach", "-p", tree.pid, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "-d", 50,
                          "--unload")
    check(rc == 0 and "unloaded Remora" in out, "attach -d 50 --unload after an unload", show(rc, out, err))
    ev = hook_events(log)
    for pid in tree.pids:
        check(count(ev, pid, "configure") == 2 and count(ev, pid, "tool_fini") == 2,
              "pid %d: the tool was loaded afresh and unloaded again" % pid, open(log).read())
    check_back(tree.pids, before, "attach --unload")
    tree.stop()


def test_attach_unload_with_keep_is_a_usage_error(tmp):
    rc, out, err = remora("attach", "-p", os.getpid(), "--keep", "--unload")
    check(rc == 1 and "--unload" in err, "attach --keep --unload is refused as a usage error (exit 1)",
          show(rc, out, err))


HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "refusal_helper.py")


def helper(*args):
    """refusal_helper.py ARGS, its "ready ..." line read (deadline): (Popen, [ints])."""
    p = spawn([sys.executable, HELPER] + [str(a) for a in args], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = read_until(p, "\n", 10).strip()
    if not line.startswith("ready "):
        return p, None, line
    return p, [int(x) for x in line.split()[1:]], line


def end_helper(p):
    p.stdin.close()
    p.wait(timeout=10)


def refusal_of_call(pid):
    """`remora call`'s refusal of `pid`, without its context: the same text
    every other command must give."""
    rc, out, err = remora("call", "-p", pid, "getpid")
    first = err.splitlines()[0] if err else ""
    m = re.match(r"remora: error: (?:.*?: )?(process %d .*|no process %d .*)$" % (pid, pid), first)
    check(m, "remora call refuses process %d" % pid, show(rc, out, err))
    return rc, m.group(1)


def refusal_targets(tmp):
    """(name, pid, cleanup) of each process every entry point must refuse
    for what it is: gone, a zombie, a kernel thread, traced by another,
    statically linked. Skipped ones are said so."""
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    out = [("gone", gone.pid, None)]
    zp, pids, line = helper("zombie-parent")
    check(pids, "the zombie helper is ready", line)
    out.append(("zombie", pids[1], None))
    if os.path.exists("/proc/2/status") and "kthreadd" in open("/proc/2/status").read():
        out.append(("kernel thread", 2, None))
    else:
        print("      (kernel thread skipped: pid 2 is not kthreadd here, e.g. in a pid namespace)")
    tree = Tree(tmp, 0)
    tracer, tpids, line = helper("trace", tree.pid)
    if tpids:
        out.append(("traced", tree.pid, tracer))
    else:
        print("      (traced skipped: the helper could not seize: %s)" % line)
    ready = os.path.join(tmp, "ready-static")
    spawn([ARGS.static_target, "0", ready])
    spid = int(wait_for(lambda: os.path.exists(ready) and open(ready).read(), 10, "the static target").split()[0])
    out.append(("static", spid, None))
    return out, zp


def first_line(err):
    return err.splitlines()[0] if err else ""


def test_refusals_come_before_any_output(tmp):
    # For each entry point of the command, the process is refused first, as
    # `remora call` refuses it (same text, same exit code), before a tool is
    # looked for or an output directory planned: the default tool is used
    # (no -t), and neither remora's working directory nor the directory
    # given with -e REMORA_OUTPUT_PATH gets anything.
    targets, zp = refusal_targets(tmp)
    cwd = os.path.join(tmp, "cwd")
    os.makedirs(cwd)
    given = os.path.join(tmp, "given-output")
    for name, pid, _ in targets:
        if name == "gone" and os.path.exists("/proc/%d" % pid):
            continue  # reused meanwhile
        code, refusal = refusal_of_call(pid)
        if name == "static":
            # Call and attach each say what they cannot do through a static
            # program's libc: the same refusal, each its own ending.
            check(refusal.endswith("Remora calls through the target's shared libc and cannot call into it"),
                  "call's refusal of a static program", refusal)
            refusal = refusal.split(": Remora ")[0] + (": Remora loads its agent and tools through the target's "
                                                       "shared libc and cannot attach tools to it")
        for extra in ([], ["--attach-children=false"], ["-e", "REMORA_OUTPUT_PATH=" + given]):
            rc, out, err = remora("attach", "-p", pid, "-d", 100, *extra, cwd=cwd)
            want = "remora: error: attach to process %d: %s" % (pid, refusal)
            check(rc == code and first_line(err) == want and out == "",
                  "attach %s to a %s process exits %d with: %s" % (" ".join(extra), name, code, want),
                  show(rc, out, err))
            check(os.listdir(cwd) == [] and not os.path.exists(given),
                  "attach to a %s process made no output directory" % name, str(os.listdir(cwd)))
        for tree in ([], ["--tree"]):
            rc, out, err = remora("detach", "-p", pid, *tree)
            want = "remora: error: detach from process %d: %s" % (pid, refusal)
            check(rc == code and first_line(err) == want and out == "",
                  "detach %s from a %s process exits %d with: %s" % (" ".join(tree), name, code, want),
                  show(rc, out, err))
        rc, out, err = remora("status", "-p", pid)
        if name in ("traced", "static"):
            # Status stops nothing and calls nothing: it reads these.
            check(rc == 0 and "\n%-8d" % pid in "\n" + out, "status of a %s process shows it" % name,
                  show(rc, out, err))
        else:
            want = "remora: error: status of process %d: %s" % (pid, refusal)
            check(rc == code and first_line(err) == want and out == "",
                  "status of a %s process exits %d with: %s" % (name, code, want), show(rc, out, err))
    for name, pid, tracer in targets:
        if tracer:
            end_helper(tracer)
    end_helper(zp)


def test_refusal_of_remora_itself(tmp):
    # `remora attach -p` its own pid (a shell exec'ing it): refused as such.
    p = subprocess.run(["sh", "-c", 'exec "$0" attach -p $$ -d 100', ARGS.remora], capture_output=True, text=True,
                       timeout=30, cwd=tmp)
    rc, out, err = p.returncode, p.stdout, p.stderr
    check(rc == 2 and re.match(r"remora: error: attach to process (\d+): pid \1 is this process itself; ",
                               first_line(err)) and out == "" and os.listdir(tmp) == [],
          "remora refuses to attach to itself, first", show(rc, out, err))


def test_zombie_child_in_a_tree(tmp):
    # A zombie below the root is reported on its own line; the others attach.
    zp, pids, line = helper("zombie-parent")
    check(pids, "the zombie helper is ready", line)
    parent, zombie = pids
    log = os.path.join(tmp, "hook.log")
    rc, out, err = remora("attach", "-p", parent, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "-d", 100,
                          "--no-follow")
    row = re.search(r"^  %-8d \S+\s+(.*)$" % zombie, out, re.M)
    check(rc == 0 and row and "is a zombie" in row.group(1), "the zombie child has its own line; exit 0",
          show(rc, out, err))
    check(re.search(r"^  %-8d \S+\s+attached " % parent, out, re.M), "the parent attached", out)
    ev = hook_events(log)
    check(count(ev, parent, "tool_attach") == 1 and count(ev, parent, "tool_detach") == 1,
          "the parent's tool ran", str(ev))
    end_helper(zp)


def test_ptrace_refused_by_our_own_seccomp_filter(tmp):
    # remora under a filter that answers ptrace with EPERM (a container
    # runtime's profile): the refusal names that filter, not the target.
    tree = Tree(tmp, 0)
    p = subprocess.run([ARGS.no_ptrace, ARGS.remora, "attach", "-p", str(tree.pid), "-t", ARGS.hook_tool, "-d", "10"],
                       capture_output=True, text=True, timeout=30, cwd=tmp)
    rc, out, err = p.returncode, p.stdout, p.stderr
    check(rc == 3 and "seccomp filter of remora's own process" in err and "the ptrace system call itself" in err,
          "a seccomp-denied ptrace is told apart (exit 3, the filter named)", show(rc, out, err))
    tree.stop()


NOT_DUMPABLE = """
import ctypes, sys
ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
print("ready", flush=True)
sys.stdin.read()
"""


def test_ptrace_refused_for_a_process_that_is_not_dumpable(tmp):
    # The same uid, no CAP_SYS_PTRACE, a target that made itself non-dumpable.
    if os.geteuid() != 0:
        print("      skipped: needs root to run both sides as uid 65534")
        return
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    target = spawn(drop + ["/usr/bin/python3", "-c", NOT_DUMPABLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                   text=True, cwd="/")
    try:
        r, _, _ = select.select([target.stdout], [], [], 10)
        check(r and target.stdout.readline().strip() == "ready", "the non-dumpable target is ready (10 s)")
        p = subprocess.run(drop + [ARGS.remora, "attach", "-p", str(target.pid), "-t", ARGS.hook_tool, "-d", "10"],
                           capture_output=True, text=True, timeout=30, cwd="/")
        rc, out, err = p.returncode, p.stdout, p.stderr
        check(rc == 3 and "is not dumpable" in err, "a non-dumpable target is told apart (exit 3)", show(rc, out, err))
        check(target.poll() is None, "the target lives on")
    finally:
        target.stdin.close()
        target.wait(timeout=10)


TESTS = [v for k, v in list(globals().items()) if k.startswith("test_")]


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for a in ("--remora", "--target", "--hook-tool", "--noattach-tool", "--static-target", "--rocattach-example",
              "--no-ptrace"):
        ap.add_argument(a, required=True)
    ap.add_argument("tests", nargs="*")
    ARGS = ap.parse_args()
    for a in ("remora", "target", "hook_tool", "noattach_tool", "static_target", "rocattach_example", "no_ptrace"):
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
