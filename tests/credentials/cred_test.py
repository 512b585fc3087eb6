#!/usr/bin/env python3
"""A preloaded agent and programs that change their credentials.

glibc aborts a process whose set*id broadcast fails on one thread and not on
another; a thread started before main lacks the per-thread state (keepcaps,
raised capabilities) that setpriv or libcap-ng give the main thread. The agent
starts no thread until an attach is asked for, so that such programs run as
without it; `remora attach` then starts the listener on request, after the
drop, and `remora run` attaches the program once its start-up settled (a
launcher such as setpriv has exec'ed the real program by then).

Every process started here gets a deadline and is killed on the way out, even
when a check fails. Needs root (it drops to uid/gid 65534); skips otherwise.
"""
import argparse
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ARGS = None
NOBODY = "65534"
DEADLINE = 60.0  # per step; a step that needs it is a hang, not a slow machine


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))
    print("ok: " + what)


def preload_env(extra=None):
    env = dict(os.environ)
    env["LD_PRELOAD"] = ARGS.agent
    env.update(extra or {})
    return env


def run(argv, env=None, timeout=DEADLINE):
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def show(rc, out, err):
    return "exit %s\nstdout: %s\nstderr: %s" % (rc, out, err)


class Spawned:
    """A process with a pipe on stdin (closing it ends a "work" target), in a
    process group of its own: kill() takes the programs it started too."""

    def __init__(self, argv, env=None):
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines = []
        self.partial = b""

    def wait_line(self, prefix, timeout=DEADLINE):
        """Reads the raw pipe (select on a buffered reader would miss lines it buffered)."""
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        seen = 0
        while True:
            for line in self.lines[seen:]:
                if line.startswith(prefix):
                    return line
            seen = len(self.lines)
            left = end - time.monotonic()
            r, _, _ = select.select([fd], [], [], max(0.0, left)) if left > 0 else ([], [], [])
            chunk = os.read(fd, 4096) if r else b""
            if not chunk:
                break
            self.partial += chunk
            *done, self.partial = self.partial.split(b"\n")
            self.lines += [l.decode(errors="replace") for l in done]
        raise Failure("no line '%s' from %s; got %r; stderr %r" % (prefix, self.p.args, self.lines, self.stderr()))

    def stderr(self):
        if self.p.poll() is None:
            return "(running)"
        return self.p.stderr.read()

    def finish(self, timeout=DEADLINE):
        # communicate() closes stdin (the target's cue to finish) and reads the rest.
        out, err = self.p.communicate(timeout=timeout)
        self.lines += (self.partial.decode(errors="replace") + out).splitlines()
        self.partial = b""
        return self.p.returncode, err

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)  # remora and the program it runs
        except ProcessLookupError:
            pass
        self.p.wait()


def test_preloaded_agent_starts_no_thread():
    for mode in ("setpriv", "capng", "plain"):
        rc, out, err = run([ARGS.target, mode, NOBODY, NOBODY], env=preload_env())
        check(rc == 0, "%s drop with the agent preloaded exits 0 (no SIGABRT)" % mode, show(rc, out, err))
        check("threads-before=1 uid=65534 gid=65534" in out,
              "%s: the program had one thread (no thread of the agent's) and dropped to 65534" % mode, out)


def test_setpriv():
    argv = ["setpriv", "--reuid=" + NOBODY, "--regid=" + NOBODY, "--clear-groups", "/bin/echo", "hi"]
    rc, out, err = run(argv, env=preload_env())
    check(rc == 0 and out == "hi\n", "setpriv with LD_PRELOAD=libremora-agent.so runs echo", show(rc, out, err))
    for extra in (["--no-tool"], ["-t", ARGS.hook_tool]):
        rc, out, err = run([ARGS.remora, "run"] + extra + ["--"] + argv)
        check(rc == 0 and out == "hi\n", "remora run %s -- setpriv ... echo hi exits 0" % extra[0],
              show(rc, out, err))


def read_log(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_attach_after_drop(tmp):
    """The listener is started on request, in a process that dropped to 65534."""
    for mode in ("setpriv", "capng", "plain"):
        log = os.path.join(tmp, "attach-%s.log" % mode)
        t = Spawned([ARGS.remora, "run", "--no-tool", "--", ARGS.target, mode, NOBODY, NOBODY, "work"])
        try:
            t.wait_line("ready")
            pid = int(subprocess.check_output(["pgrep", "-P", str(t.p.pid), "-f", ARGS.target]).split()[0])
            tasks = os.listdir("/proc/%d/task" % pid)
            check(len(tasks) == 1, "%s: no thread of the agent's before the attach (%d)" % (mode, len(tasks)))
            rc, out, err = run([ARGS.remora, "attach", "-p", str(pid), "-t", ARGS.hook_tool,
                                "-e", "REMORA_HOOK_LOG=" + log, "-d", "100"])
            check(rc == 0, "%s: remora attach -p starts the listener on request and attaches" % mode,
                  show(rc, out, err))
            hooks = [l.split()[0] for l in read_log(log)]
            check("a:tool_attach" in hooks and "a:tool_detach" in hooks,
                  "%s: the tool was attached and detached in the dropped process" % mode, str(hooks))
            rc, err = t.finish()
            check(rc == 0 and any(l.startswith("sum=") and "wrong" not in l for l in t.lines),
                  "%s: the program's computation is right and it exits 0" % mode, show(rc, t.lines, err))
        finally:
            t.kill()


def test_run_attaches_the_final_program(tmp):
    """remora run -- setpriv ... PROG: the tools land in PROG, after the exec."""
    log = os.path.join(tmp, "run.log")
    argv = [ARGS.remora, "run", "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "--",
            "setpriv", "--reuid=" + NOBODY, "--regid=" + NOBODY, "--clear-groups",
            ARGS.target, "none", NOBODY, NOBODY, "work"]
    t = Spawned(argv)
    try:
        t.wait_line("ready")
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end and not any(l.startswith("a:tool_attach") for l in read_log(log)):
            r, _, _ = select.select([t.p.stderr], [], [], 0.05)  # remora's own notes; nothing to wait on else
            if r and not t.p.stderr.readline():
                break
        hooks = read_log(log)
        check(any(l.startswith("a:tool_attach") for l in hooks), "remora run attached the program setpriv ran",
              str(hooks))
        pid = int(hooks[0].split()[1].split("=")[1])
        with open("/proc/%d/comm" % pid) as f:
            comm = f.read().strip()
        check(comm == os.path.basename(ARGS.target)[:15], "the tool is in the final program (%s)" % comm)
        rc, err = t.finish()
        check(rc == 0, "remora run exits with the program's status 0", show(rc, t.lines, err))
        check(any(l.startswith("a:tool_detach") for l in read_log(log)), "the tool detached at the program's exit")
    finally:
        t.kill()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--hook-tool", required=True)
    ARGS = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root to drop credentials to uid/gid 65534")
        return 0
    if shutil.which("setpriv") is None:
        print("SKIP: setpriv (util-linux) is not installed")
        return 0
    tmp = tempfile.mkdtemp(prefix="remora-cred-")
    os.chmod(tmp, 0o1777)  # the dropped programs write the tool's log here
    failed = 0
    tests = [test_preloaded_agent_starts_no_thread, test_setpriv, lambda: test_attach_after_drop(tmp),
             lambda: test_run_attaches_the_final_program(tmp)]
    for test in tests:
        try:
            test()
        except (Failure, subprocess.TimeoutExpired) as e:
            failed += 1
            print("FAIL: %s" % e)
    shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
