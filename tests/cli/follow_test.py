#!/usr/bin/env python3
"""End-to-end tests of `remora attach` following the tree (docs/cli.md,
"Following the tree"), against remora_follow_target (tests/attach/
follow_target.cc: a pre-fork server and a shell pipeline on command) with
the hook test tool, whose log ("a:tool_attach pid=..." ...) is written from
each process itself. Every wait has a deadline; every process started here
is killed and reaped, whatever happens. Exit status 0 when every test passed.

  follow_test.py --remora build/bin/remora --target build/bin/remora_follow_target \\
                 --hook-tool build/lib/libremora-hook-tool-a.so [TEST...]
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
PROCS = []


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


class Reader:
    """Line-less reads of a pipe with deadlines; keeps everything read."""

    def __init__(self, f):
        self.fd = f.fileno()
        self.text = ""

    def until(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.text)
            if m:
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise Failure("timed out after %.1f s waiting for /%s/; read so far:\n%s" %
                              (timeout, pattern, self.text))
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise Failure("the output ended before /%s/; read:\n%s" % (pattern, self.text))
            self.text += chunk.decode(errors="replace")


def spawn(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    PROCS.append(p)
    return p


def cleanup():
    for p in PROCS:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print("warning: pid %d could not be reaped" % p.pid)
    PROCS.clear()


class Target:
    """remora_follow_target, talked to over its stdin/stdout."""

    def __init__(self):
        self.proc = spawn([ARGS.target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self.out = Reader(self.proc.stdout)
        self.pid = int(self.out.until(r"ready (\d+)\n", 10).group(1))
        self.out.text = ""

    def command(self, cmd, timeout=30):
        self.proc.stdin.write((cmd + "\n").encode())
        self.proc.stdin.flush()
        m = self.out.until(r"([^\n]*)\n", timeout)
        self.out.text = self.out.text[m.end():]
        return m.group(1)

    def pids(self, cmd, word):
        reply = self.command(cmd).split()
        check(reply and reply[0] == word, "%r answers %s ..." % (cmd, word), " ".join(reply))
        return [int(x) for x in reply[1:]]

    def stop(self):
        self.command("stop-workers")
        self.proc.stdin.close()
        check(self.proc.wait(timeout=10) == 0, "the target exits cleanly")


def hook_events(log):
    events = {}
    if os.path.exists(log):
        for line in open(log):
            m = re.match(r"a:(\w+) pid=(\d+)", line)
            if m:
                events.setdefault(int(m.group(2)), []).append(m.group(1))
    return events


def wait_hooks(log, pids, hook, timeout):
    deadline = time.monotonic() + timeout
    while True:
        ev = hook_events(log)
        missing = [p for p in pids if hook not in ev.get(p, [])]
        if not missing:
            return ev
        if time.monotonic() > deadline:
            raise Failure("no %s from %s within %.1f s; log:\n%s" %
                          (hook, missing, timeout, open(log).read() if os.path.exists(log) else ""))
        time.sleep(0.02)


def start_remora(log, *extra):
    env = dict(os.environ)
    p = spawn([ARGS.remora, "attach", "-p", str(extra[0]), "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log] +
              [str(a) for a in extra[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, env=env, start_new_session=True)
    return p, Reader(p.stdout)


def test_follows_forks_and_execs(tmp):
    """Default: pre-fork workers are followed, a pipeline's exec'ed stages
    attached; all are detached at the end and listed in the count."""
    log = os.path.join(tmp, "hooks.log")
    t = Target()
    p, out = start_remora(log, t.pid)
    out.until(r"Attached to 1 process", 20)
    workers = t.pids("prefork 2", "workers")
    for w in workers:
        out.until(r"followed: pid %d \(\S+\), forked from %d" % (w, t.pid), 10)
    sh, s1, s2 = t.pids("pipeline", "pipeline")
    for s in (s1, s2):
        out.until(r"attached: pid %d \(" % s, 15)
    for i, w in enumerate(workers):
        check(t.command("ask %d" % i) == "served %d" % w, "worker %d serves while followed" % w)
    p.send_signal(signal.SIGINT)
    rest, err = p.communicate(timeout=30)
    text = out.text + rest.decode(errors="replace")
    check(p.returncode == 0, "remora exits 0", "exit %d\n%s\n%s" % (p.returncode, text, err.decode()))
    m = re.search(r"Detached from (\d+) processes", text)
    check(m and int(m.group(1)) >= 5, "remora detached the root, both workers and both stages", text)
    ev = wait_hooks(log, [t.pid] + workers + [s1, s2], "tool_detach", 5)
    for s in (s1, s2):
        check(ev[s].count("tool_attach") == 1, "stage %d was attached once" % s, str(ev))
    check(t.command("pipeline-end") == "ended 0", "the pipeline ends cleanly")
    t.stop()


def test_no_follow(tmp):
    """--no-follow: nothing is followed; a fork made during the session
    still inherits it and its copy of the lease detaches it at the end."""
    log = os.path.join(tmp, "hooks.log")
    t = Target()
    p, out = start_remora(log, t.pid, "--no-follow", "-d", 1500)
    out.until(r"Attached to 1 process", 20)
    w = t.pids("prefork 1", "workers")[0]
    rest, err = p.communicate(timeout=30)
    text = out.text + rest.decode(errors="replace")
    check(p.returncode == 0, "remora exits 0", "exit %d\n%s\n%s" % (p.returncode, text, err.decode()))
    check("followed:" not in text, "--no-follow follows nothing", text)
    check(re.search(r"Detached from 1 process\b", text), "remora detached the root alone", text)
    wait_hooks(log, [t.pid, w], "tool_detach", 5)
    check(t.command("ask 0") == "served %d" % w, "the worker serves after the session")
    t.stop()


def test_sessions_one_after_another(tmp):
    """The issue's pgbench case: connections forked during one session
    outlive it; the next remora attach of the tree finds none of them still
    attached (no exit 13), with or without following."""
    log = os.path.join(tmp, "hooks.log")
    t = Target()
    conns = []
    for i, extra in enumerate([[], ["--no-follow"], []]):
        p, out = start_remora(log, t.pid, "-d", 800, *extra)
        out.until(r"Attached to \d+ process", 20)
        conns.append(t.pids("conn", "conn")[0])
        rest, err = p.communicate(timeout=30)
        text = out.text + rest.decode(errors="replace")
        check(p.returncode == 0, "session %d (%s) exits 0" % (i + 1, " ".join(extra) or "following"),
              "exit %d\n%s\n%s" % (p.returncode, text, err.decode()))
        # Every connection of this and the earlier sessions was attached in
        # this one and is detached after it.
        check(re.search(r"Attached to %d process" % (1 + i), text), "session %d attached the root and %d "
              "connections" % (i + 1, i), text)
        deadline = time.monotonic() + 5
        while True:  # connection k was in sessions k..i: detached that many times
            ev = hook_events(log)
            short = [c for k, c in enumerate(conns) if ev.get(c, []).count("tool_detach") < i - k + 1]
            if not short:
                break
            check(time.monotonic() < deadline, "every connection is detached after session %d" % (i + 1),
                  "not yet: %s\n%s" % (short, open(log).read()))
            time.sleep(0.02)
        for c in conns:
            check(t.command("conn-ask %d" % c) == "served %d" % c, "connection %d still served" % c)
    for c in conns:
        check(t.command("conn-close %d" % c) == "closed 0", "connection %d closes cleanly" % c)
    t.stop()


TESTS = [test_follows_forks_and_execs, test_no_follow, test_sessions_one_after_another]


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--hook-tool", required=True)
    ap.add_argument("tests", nargs="*")
    ARGS = ap.parse_args()
    failed = 0
    for test in TESTS:
        if ARGS.tests and test.__name__ not in ARGS.tests:
            continue
        with tempfile.TemporaryDirectory(prefix="remora-follow-") as tmp:
            t0 = time.monotonic()
            try:
                test(tmp)
                print("PASS %s (%.1f s)" % (test.__name__, time.monotonic() - t0))
            except Exception:
                failed += 1
                print("FAIL %s\n%s" % (test.__name__, traceback.format_exc()))
            finally:
                cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
