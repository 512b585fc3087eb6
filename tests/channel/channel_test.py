#!/usr/bin/env python3
"""The socket channel end to end: `remora attach`, `status` and `run --listen`
against a process that opted in (the agent preloaded with
REMORA_TOOL_ATTACH=1), where ptrace is refused or not wanted.

The target (remora_channel_target, channel_target.c) has threads in
epoll_wait, nanosleep, poll, read, pthread_cond_wait and a computation, and
counts every EINTR its calls see: the channel wakes the agent with a signal,
which the program must not notice. Each test starts its own targets and
checks what they report at exit (zero EINTR, right results, exit 0), what
the hook test tool logged (REMORA_HOOK_LOG), and what remora printed.

Every wait has a deadline, none is a speed assumption; every process started
here runs in a process group of its own and is killed and reaped after each
test, whatever happened. Needs root (it runs targets and remora as other
uids, and enters namespaces); skips otherwise.

  channel_test.py --remora build/bin/remora --agent build/lib/libremora-agent.so \\
      --default-tool build/lib/libremora-tool.so --target build/bin/remora_channel_target \\
      --hook-tool build/lib/libremora-hook-tool-a.so --no-ptrace build/bin/remora_no_ptrace [TEST...]
"""
import argparse
import ctypes
import os
import pwd
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

ARGS = None
PROCS = []  # every Popen started here: its group is killed and reaped after each test
NOBODY = 65534
STEP = 60.0  # deadline of one step; one that needs it hangs, it is not slow
# The agent's channel thread (agent/channel_wire.h): it leaves once no
# connection came for a while; waits for that have a deadline of STEP.
CHANNEL_THREAD = "remora-channel"
ALREADY_ATTACHED_EXIT = 13  # cli/exit_codes.h, kSessionState
PTRACE_DENIED_EXIT = 3  # kPermission


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))
    print("  ok: " + what, flush=True)


def wait_for(pred, what, timeout=STEP, interval=0.02, quiet=False):
    """pred()'s first true value; a Failure after `timeout` (None if quiet)."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            if quiet:
                return None
            raise Failure("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(interval)


def show(rc, out, err):
    return "exit %s\n--- stdout:\n%s--- stderr:\n%s" % (rc, out, err)


def spawn(argv, uid=None, **kw):
    """A process in a session (and process group) of its own; uid: run as
    that uid and gid, no supplementary groups."""
    if uid is not None:
        kw.update(user=uid, group=uid, extra_groups=[])
    p = subprocess.Popen([str(a) for a in argv], start_new_session=True, **kw)
    PROCS.append(p)
    return p


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cleanup():
    for p in reversed(PROCS):
        if p.poll() is None:
            kill_group(p)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print("warning: pid %d could not be reaped" % p.pid)
        for f in (p.stdin, p.stdout, p.stderr):
            if f:
                try:
                    f.close()
                except OSError:
                    pass
    PROCS.clear()


def base_env(extra=None):
    """Our environment without an opt-in or a preload of its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "REMORA_TOOL_ATTACH", "ROCP_TOOL_ATTACH", "REMORA_ATTACH_UIDS",
                        "REMORA_HOOK_LOG", "REMORA_OUTPUT_PATH")}
    env.update(extra or {})
    return env


def remora(*args, uid=None, prefix=(), cwd=None, env=None, timeout=STEP):
    """Runs remora to completion (as `uid`, or behind `prefix`, a command
    such as setpriv or remora_no_ptrace); returns (exit code, stdout, stderr)."""
    p = spawn(list(prefix) + [ARGS.remora] + list(args), uid=uid, stdin=subprocess.DEVNULL,
              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env(env), cwd=cwd or "/")
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        raise Failure("remora %s did not finish in %.0f s\n%s" % (" ".join(map(str, args)), timeout,
                                                                 show("-", out, err)))
    return p.returncode, out, err


class Lines:
    """Lines of a pipe, read raw (select on a buffered reader would miss
    what it buffered)."""

    def __init__(self, f):
        self.fd = f.fileno()
        self.lines = []
        self.partial = b""
        self.eof = False

    def wait(self, pattern, what, timeout=STEP):
        end = time.monotonic() + timeout
        seen = 0
        while True:
            for line in self.lines[seen:]:
                m = re.search(pattern, line)
                if m:
                    return m
            seen = len(self.lines)
            left = end - time.monotonic()
            if self.eof or left <= 0:
                raise Failure("no line matching %r (%s) in %.0f s; got %r" % (pattern, what, timeout, self.lines))
            if select.select([self.fd], [], [], left)[0]:
                self.feed(os.read(self.fd, 65536))

    def feed(self, chunk):
        if not chunk:
            self.eof = True
            chunk = b"\n" if self.partial else b""
        self.partial += chunk
        *done, self.partial = self.partial.split(b"\n")
        self.lines += [l.decode(errors="replace") for l in done]

    def rest(self, timeout=STEP):
        """Everything up to EOF."""
        end = time.monotonic() + timeout
        while not self.eof:
            left = end - time.monotonic()
            if left <= 0:
                raise Failure("the output did not end in %.0f s; got %r" % (timeout, self.lines))
            if select.select([self.fd], [], [], left)[0]:
                self.feed(os.read(self.fd, 65536))
        return self.lines


def children_of(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def comm(pid, tid=None):
    try:
        with open("/proc/%d/task/%d/comm" % (pid, tid or pid)) as f:
            return f.read().strip()
    except OSError:
        return ""


def tasks(pid):
    return sorted(int(t) for t in os.listdir("/proc/%d/task" % pid))


def channel_thread_runs(pid):
    return any(comm(pid, t) == CHANNEL_THREAD for t in tasks(pid))


def read_lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def hooks(log):
    """[(hook, pid)] from the hook tool's log."""
    out = []
    for line in read_lines(log):
        m = re.match(r"a:(\w+) pid=(\d+)", line)
        if m:
            out.append((m.group(1), int(m.group(2))))
    return out


class Target:
    """remora_channel_target, opted in (the agent preloaded with
    REMORA_TOOL_ATTACH=1) unless opt_in is false; as `uid`; behind `wrap`
    (a command that runs it, e.g. unshare: the target is then its child);
    on CPU `cpu` alone.
    Ready once it printed "ready <pid> threads=<n>"; `pid` is the pid here,
    `own_pid` the one it calls itself."""

    def __init__(self, tmp, opt_in=True, uid=None, flags=(), env=None, wrap=(), cpu=None):
        extra = dict(env or {})
        if opt_in:
            extra.update(LD_PRELOAD=ARGS.agent, REMORA_TOOL_ATTACH="1")
        if wrap:
            # The variables are set past the wrapper: it neither loads the
            # agent nor binds a socket of its own.
            argv = list(wrap) + ["env"] + ["%s=%s" % kv for kv in extra.items()] + [ARGS.target] + list(flags)
            e = base_env()
        else:
            argv = [ARGS.target] + list(flags)
            e = base_env(extra)
        self.err_path = os.path.join(tmp, "target-%d.err" % time.monotonic_ns())
        with open(self.err_path, "w") as err:
            self.p = spawn(argv, uid=uid, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=e,
                           cwd=tmp, preexec_fn=None if cpu is None else lambda: os.sched_setaffinity(0, {cpu}))
        self.out = Lines(self.p.stdout)
        m = self.out.wait(r"^ready (\d+) threads=(\d+)$", "the target is ready")
        self.own_pid, self.threads = int(m.group(1)), int(m.group(2))
        if wrap:
            kids = wait_for(lambda: children_of(self.p.pid), "the wrapper's child")
            self.pid = kids[0]
        else:
            self.pid = self.p.pid
        check(comm(self.pid).startswith("remora_channel"), "target pid %d is ready (its own pid %d)" %
              (self.pid, self.own_pid))

    def stderr(self):
        return "\n".join(read_lines(self.err_path))

    def finish(self):
        """Ends it (EOF on its stdin); checks it exits 0 with no EINTR seen
        and its computations right; returns its counters."""
        self.p.stdin.close()
        lines = self.out.rest()
        try:
            rc = self.p.wait(timeout=STEP)
        except subprocess.TimeoutExpired:
            raise Failure("the target did not exit in %.0f s after its stdin closed" % STEP)
        counters = {}
        for line in lines:
            if line.startswith("eintr "):
                counters = dict(kv.split("=", 1) for kv in line.split()[1:])
        detail = "exit %d, stdout %r, stderr:\n%s" % (rc, lines, self.stderr())
        check(counters, "the target printed its counters", detail)
        eintr = {k: v for k, v in counters.items() if k != "compute"}
        check(rc == 0 and all(v == "0" for v in eintr.values()) and counters.get("compute") in ("ok", "none"),
              "the target exits 0, saw no EINTR and computed right (%s)" %
              " ".join("%s=%s" % kv for kv in counters.items()), detail)
        return counters


def hottest_printed(out):
    """The first entry of remora attach's "Hottest functions"."""
    m = re.search(r"^Hottest functions.*\n\s+1\.\s+\S+%\s+\d+\s+\[\s*\S+%\]\s+(\S+)", out, re.M)
    return m.group(1) if m else None


def hottest_in_stats(root):
    """The function with the most self samples in the stats.csv of the one
    session directory under `root`."""
    dirs = [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and "-s" in d
            and not os.path.islink(os.path.join(root, d))]
    if len(dirs) != 1:
        return None, "session directories under %s: %r" % (root, dirs)
    path = os.path.join(root, dirs[0], "stats.csv")
    totals = {}
    for line in read_lines(path):
        f = line.split(",")
        if f[0] == "sample" and len(f) >= 7 and f[6].isdigit():
            name = re.sub(r" \(.*\)$", "", f[1])
            totals[name] = totals.get(name, 0) + int(f[6])
    if not totals:
        return None, "no sample rows in %s" % path
    best = max(totals, key=totals.get)
    return best, "%s: %r" % (path, sorted(totals.items(), key=lambda kv: -kv[1])[:5])


def check_profile(rc, out, err, root, how):
    check(rc == 0, "%s: remora attach -d 1500 with the default tool succeeds" % how, show(rc, out, err))
    printed = hottest_printed(out)
    check(printed == "channel_target_hot", "%s: the printed hottest function is channel_target_hot (%s)" %
          (how, printed), out)
    best, detail = hottest_in_stats(root)
    check(best == "channel_target_hot", "%s: stats.csv's hottest function is channel_target_hot" % how, detail)


def free_uid():
    """A uid that no user has (nothing of it exists on this machine)."""
    for uid in range(64100, 65000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise Failure("no free uid in 64100..64999")


def as_uid(uid, kill_cap):
    """setpriv to `uid` (its gid the same, no groups), with CAP_KILL or not."""
    argv = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups"]
    if kill_cap:
        argv += ["--inh-caps=+kill", "--ambient-caps=+kill"]
    return argv


def status_of(pid, *extra, uid=None):
    """`remora status -p PID` -> (row of the process, the "pid N:" lines, raw)."""
    rc, out, err = remora("status", "-p", pid, *extra, uid=uid)
    check(rc == 0, "remora status -p %d %s succeeds" % (pid, " ".join(extra)), show(rc, out, err))
    row = None
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[0] == str(pid):
            row = {"agent": f[2], "attached": f[3], "sessions": f[4], "listener": f[5], "lease": f[6],
                   "tools": " ".join(f[7:])}
    notes = [l for l in out.splitlines() if l.startswith("pid %d:" % pid)]
    check(row is not None, "remora status prints a row for pid %d" % pid, out)
    return row, notes, out


# ---- tests ------------------------------------------------------------------

def test_not_dumpable_profile_through_the_socket(tmp):
    """a. A non-dumpable process of uid 65534, attached by remora of uid
    65534: ptrace is refused, the socket serves; the profile is the one
    ptrace gives a dumpable twin."""
    check(os.access(ARGS.default_tool, os.R_OK), "the default tool is built (%s)" % ARGS.default_tool)
    t = Target(tmp, uid=NOBODY, flags=["--nondumpable"])
    rc, out, err = remora("attach", "-p", t.pid, "--channel", "ptrace", "-d", 1500, uid=NOBODY, cwd=tmp)
    check(rc == PTRACE_DENIED_EXIT and "not dumpable" in err,
          "--channel ptrace is refused: exit 3, the message says 'not dumpable'", show(rc, out, err))
    _, notes, sout = status_of(t.pid, uid=NOBODY)
    check(any("socket channel @remora-agent.%d." % t.own_pid in n and "state read through it" in n for n in notes),
          "remora status (auto) reads the state through the socket channel", sout)
    root = os.path.join(tmp, "out-socket")
    rc, out, err = remora("attach", "-p", t.pid, "-d", 1500, "-e", "REMORA_OUTPUT_PATH=" + root, uid=NOBODY,
                          cwd=tmp)
    check(rc == 0 and "attached through its socket channel" in out and
          "Attaching %s to" % os.path.basename(ARGS.default_tool) in out,
          "auto attaches the default tool through the socket channel", show(rc, out, err))
    check_profile(rc, out, err, root, "socket")
    t.finish()

    twin = Target(tmp, uid=NOBODY)
    root = os.path.join(tmp, "out-ptrace")
    rc, out, err = remora("attach", "-p", twin.pid, "--channel", "ptrace", "-d", 1500,
                          "-e", "REMORA_OUTPUT_PATH=" + root, uid=NOBODY, cwd=tmp)
    check(rc == 0 and "socket channel" not in out and re.search(r"attached \(agent was loaded", out),
          "the dumpable twin is attached through ptrace", show(rc, out, err))
    check_profile(rc, out, err, root, "ptrace")
    twin.finish()


def test_seccomp_denied_controller(tmp):
    """b. remora under a seccomp filter that refuses ptrace: the socket
    serves a process that opted in; --channel ptrace names the filter."""
    t = Target(tmp)
    log = os.path.join(tmp, "hook.log")
    rc, out, err = remora("attach", "-p", t.pid, "-d", 1000, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log,
                          prefix=[ARGS.no_ptrace], cwd=tmp)
    check(rc == 0 and "attached through its socket channel" in out,
          "under the filter, auto attaches through the socket channel", show(rc, out, err))
    got = hooks(log)
    check(("tool_attach", t.own_pid) in got and ("tool_detach", t.own_pid) in got,
          "the hook tool was attached and detached in the target", str(got))
    rc, out, err = remora("attach", "-p", t.pid, "--channel", "ptrace", "-d", 1000, "-t", ARGS.hook_tool,
                          "-e", "REMORA_HOOK_LOG=" + log, prefix=[ARGS.no_ptrace], cwd=tmp)
    check(rc == PTRACE_DENIED_EXIT and "seccomp filter" in err,
          "--channel ptrace under the filter fails (exit 3) and names the seccomp filter", show(rc, out, err))
    t.finish()


def test_seccomp_denied_not_opted_in_hint(tmp):
    """b. Under the same filter, a process that did not opt in: the ptrace
    error, and the way to opt in (remora run --listen)."""
    log = os.path.join(tmp, "hook.log")
    plain = Target(tmp, opt_in=False)
    rc, out, err = remora("attach", "-p", plain.pid, "-d", 1000, "-t", ARGS.hook_tool,
                          "-e", "REMORA_HOOK_LOG=" + log, prefix=[ARGS.no_ptrace], cwd=tmp)
    check(rc == PTRACE_DENIED_EXIT and "seccomp filter" in err,
          "a process that did not opt in: the ptrace error (exit 3, the filter named)", show(rc, out, err))
    # The seize is refused after the pre-check passed (the filter is ours):
    # Controller::attach_one adds the way in without ptrace all the same.
    check("remora run --listen" in err,
          "... and the hint to start it with `remora run --listen`", show(rc, out, err))
    plain.finish()


def container_case(tmp, net):
    wrap = ["unshare", "--pid", "--mount", "--fork", "--mount-proc"] + (["--net"] if net else [])
    t = Target(tmp, wrap=wrap)
    what = "pid+mount" + ("+net" if net else "") + " namespaces"
    check(t.own_pid != t.pid, "%s: the target is pid %d inside, %d here" % (what, t.own_pid, t.pid))
    if net:
        check(os.stat("/proc/%d/ns/net" % t.pid).st_ino != os.stat("/proc/self/ns/net").st_ino,
              "%s: the target has a network namespace of its own" % what)
    row, notes, out = status_of(t.pid, "--channel", "socket")
    check(row["agent"] == "yes" and row["attached"] == "no"
          and any("socket channel @remora-agent.%d." % t.own_pid in n and "state read through it" in n
                  for n in notes),
          "%s: remora status --channel socket reads it through @remora-agent.%d.*" % (what, t.own_pid), out)
    log = os.path.join(tmp, "hook-%s.log" % ("net" if net else "pid"))
    rc, out, err = remora("attach", "-p", t.pid, "--channel", "socket", "-d", 1000, "-t", ARGS.hook_tool,
                          "-e", "REMORA_HOOK_LOG=" + log, cwd=tmp)
    check(rc == 0 and "attached through its socket channel" in out,
          "%s: remora attach --channel socket succeeds" % what, show(rc, out, err))
    got = hooks(log)
    check(("tool_attach", t.own_pid) in got and ("tool_detach", t.own_pid) in got,
          "%s: the hook tool ran in the target (pid %d as it sees itself)" % (what, t.own_pid), str(got))
    t.finish()
    rc = t.p.wait(timeout=STEP)
    check(rc == 0, "%s: unshare exits with the target's status 0" % what, "exit %d" % rc)


def test_container_pid_mount_namespaces(tmp):
    """c. A target in pid and mount namespaces of its own."""
    container_case(tmp, net=False)


def test_container_with_its_own_network(tmp):
    """c. The same with a network namespace of its own: the abstract socket
    lives there, and remora enters it to connect."""
    container_case(tmp, net=True)


def test_other_uid_refused(tmp):
    """d. remora of another uid: without CAP_KILL it cannot wake the agent;
    with it, the agent refuses the peer's uid and says how to admit it; a
    target started with REMORA_ATTACH_UIDS admits it."""
    uid = free_uid()
    log = os.path.join(tmp, "hook.log")
    attach = ["attach", "--channel", "socket", "-d", 500, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log]
    t = Target(tmp, uid=NOBODY)
    check(not channel_thread_runs(t.pid), "no channel thread runs yet")
    rc, out, err = remora(attach[0], "-p", t.pid, *attach[1:], prefix=as_uid(uid, False), cwd=tmp)
    check(rc != 0 and "cannot send the wake signal" in err and "CAP_KILL" in err,
          "uid %d without CAP_KILL: the wake signal cannot be sent, and remora says so" % uid, show(rc, out, err))
    rc, out, err = remora(attach[0], "-p", t.pid, *attach[1:], prefix=as_uid(uid, True), cwd=tmp)
    check(rc != 0 and "uid %d may not attach" % uid in err and "REMORA_ATTACH_UIDS=%d" % uid in err,
          "uid %d with CAP_KILL: the agent refuses it, naming the uid and REMORA_ATTACH_UIDS" % uid,
          show(rc, out, err))
    check(hooks(log) == [], "nothing was attached", str(hooks(log)))
    t.finish()

    admitted = Target(tmp, uid=NOBODY, env={"REMORA_ATTACH_UIDS": "1234,%d" % uid})
    rc, out, err = remora(attach[0], "-p", admitted.pid, *attach[1:], prefix=as_uid(uid, True), cwd=tmp)
    check(rc == 0 and "attached through its socket channel" in out,
          "a target started with REMORA_ATTACH_UIDS=1234,%d admits uid %d" % (uid, uid), show(rc, out, err))
    got = hooks(log)
    check(("tool_attach", admitted.own_pid) in got and ("tool_detach", admitted.own_pid) in got,
          "the hook tool ran in the admitting target", str(got))
    admitted.finish()


def test_other_uid_refused_while_the_channel_thread_runs(tmp):
    """d. The same refusal when the channel thread runs already (a status of
    root's just started it): no wake is sent, and the agent may refuse and
    close before remora has sent its request; remora must still report the
    agent's refusal. The target (its threads asleep) and remora share one
    CPU: the woken channel thread then tends to run, refuse and close before
    remora sends (the case that must be handled, not a timing assumption:
    either order must give the refusal)."""
    uid = free_uid()
    cpu = min(os.sched_getaffinity(0))
    t = Target(tmp, uid=NOBODY, flags=["--eintr-waits-only"], cpu=cpu)
    prefix = (["taskset", "-c", str(cpu)] if shutil.which("taskset") else []) + as_uid(uid, True)
    running = 0
    for i in range(5):
        rc, out, err = remora("status", "-p", t.pid, "--channel", "socket")
        check(rc == 0, "status of root's (%d) starts the channel thread" % (i + 1), show(rc, out, err))
        running += channel_thread_runs(t.pid)
        rc, out, err = remora("attach", "-p", t.pid, "--channel", "socket", "-d", 500, "-t", ARGS.hook_tool,
                              prefix=prefix, cwd=tmp)
        # The agent refuses before it reads the request and closes: remora's
        # send may then fail (EPIPE), and the refusal waiting is read anyway.
        check(rc != 0 and "uid %d may not attach" % uid in err and "REMORA_ATTACH_UIDS=%d" % uid in err,
              "attempt %d: uid %d is refused by the agent, naming the uid and REMORA_ATTACH_UIDS" % (i + 1, uid),
              show(rc, out, err))
    print("  (the channel thread ran before %d of the 5 attempts)" % running)
    t.finish()


def test_second_controller_and_the_lease(tmp):
    """e. One remora holds the session; a second is refused, naming the
    first; the first killed, the agent detaches by the lease."""
    t = Target(tmp)
    log = os.path.join(tmp, "hook.log")
    holder = spawn([ARGS.remora, "attach", "-p", t.pid, "--channel", "socket", "-t", ARGS.hook_tool,
                    "-e", "REMORA_HOOK_LOG=" + log], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                   stderr=subprocess.DEVNULL, env=base_env(), cwd=tmp)
    Lines(holder.stdout).wait(r"^Attached to 1 process", "the first remora attached")
    rc, out, err = remora("attach", "-p", t.pid, "--channel", "socket", "-d", 500, "-t", ARGS.hook_tool,
                          "-e", "REMORA_HOOK_LOG=" + log, cwd=tmp)
    check(rc == ALREADY_ATTACHED_EXIT and "attached by remora pid %d" % holder.pid in err,
          "a second remora is refused (exit 13) naming the first (pid %d)" % holder.pid, show(rc, out, err))
    row, notes, out = status_of(t.pid, "--channel", "socket")
    check(row["attached"] == "yes" and row["lease"].startswith(str(holder.pid))
          and any("session through its socket channel" in n for n in notes),
          "status: attached, the lease held by the first remora, the session through the socket", out)
    kill_group(holder)
    holder.wait(timeout=STEP)

    def expired():
        r, _, o = status_of(t.pid, "--channel", "socket")
        return (r, o) if r["attached"] == "no" and r["lease"] == "expired" else None

    row, out = wait_for(expired, "the agent to detach by the lease (ATTACHED no, LEASE expired)", interval=0.2)
    check(True, "the first remora killed, the agent detached by the lease")
    got = hooks(log)
    check(got.count(("tool_attach", t.own_pid)) == 1 and got.count(("tool_detach", t.own_pid)) == 1,
          "the tool was attached once (the second remora's attach did nothing) and detached", str(got))
    t.finish()


def test_run_listen(tmp):
    """f. remora run --listen: the socket, no tool, no thread of ours; an
    attach through the socket; status's channel line; no thread left."""
    err_path = os.path.join(tmp, "run.err")
    with open(err_path, "w") as err:
        run = spawn([ARGS.remora, "run", "--listen", "--", ARGS.target], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=err, env=base_env(), cwd=tmp)
    out = Lines(run.stdout)
    m = out.wait(r"^ready (\d+) threads=(\d+)$", "the target under remora run is ready")
    pid, threads = int(m.group(1)), int(m.group(2))
    check(pid in children_of(run.pid), "the target (pid %d) is remora run's child" % pid)
    note = wait_for(lambda: [l for l in read_lines(err_path) if "listening on its socket channel" in l],
                    "remora run's note on its socket channel")
    check("@remora-agent.%d." % pid in note[0], "remora run names the socket @remora-agent.%d.*" % pid, note[0])
    check(len(tasks(pid)) == threads, "before the attach the target has its own %d threads only (%d)" %
          (threads, len(tasks(pid))))
    row, notes, sout = status_of(pid)
    check(row["agent"] == "yes" and row["attached"] == "no" and row["sessions"] == "0/0" and row["tools"] == "-",
          "the agent is loaded and nothing is attached", sout)
    check(any("socket channel @remora-agent.%d." % pid in n for n in notes), "status names the socket", sout)

    log = os.path.join(tmp, "hook.log")
    rc, o, e = remora("attach", "-p", pid, "--channel", "socket", "-d", 500, "-t", ARGS.hook_tool,
                      "-e", "REMORA_HOOK_LOG=" + log, cwd=tmp)
    check(rc == 0 and "attached through its socket channel" in o, "remora attach --channel socket -d 500 works",
          show(rc, o, e))
    got = hooks(log)
    check(("tool_attach", pid) in got and ("tool_detach", pid) in got, "the hook tool ran", str(got))

    # A session held open: status tells how it came, read either way.
    holder = spawn([ARGS.remora, "attach", "-p", pid, "--channel", "socket", "-t", ARGS.hook_tool,
                    "-e", "REMORA_HOOK_LOG=" + log], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                   stderr=subprocess.DEVNULL, env=base_env(), cwd=tmp)
    hout = Lines(holder.stdout)
    hout.wait(r"^Attached to 1 process", "the holding remora attached")
    row, notes, sout = status_of(pid)
    check(row["attached"] == "yes" and any("session through its socket channel" in n for n in notes),
          "status (auto): 'session through its socket channel'", sout)
    row, notes, sout = status_of(pid, "--channel", "socket")
    check(any("session through its socket channel; socket channel @remora-agent.%d." % pid in n
              and "(state read through it)" in n for n in notes),
          "status --channel socket: the session, the socket, the state read through it", sout)
    holder.send_signal(signal.SIGTERM)
    lines = hout.rest()
    rc = holder.wait(timeout=STEP)
    check(rc == 0 and "Detached from 1 process in " in "\n".join(lines), "SIGTERM ends the held session: exit 0",
          "exit %d, %r" % (rc, lines))

    def own_threads_only():
        return len(tasks(pid)) == threads and not channel_thread_runs(pid)

    wait_for(own_threads_only, "the channel thread to leave (%d threads, the target's own)" % threads)
    check(True, "after the detach the channel thread left: %d threads, the target's own" % threads)
    run.stdin.close()
    lines = out.rest()
    rc = run.wait(timeout=STEP)
    eintr = [l for l in lines if l.startswith("eintr ")]
    check(rc == 0 and eintr and re.fullmatch(r"eintr( \w+=0)+ compute=ok", eintr[0]),
          "the target (and remora run) exit 0, no EINTR seen", "exit %d, %r" % (rc, lines))


def eintr_proof(tmp, flags, calls, wake_every):
    t = Target(tmp, flags=flags)
    woken = []
    for i in range(calls):
        if i % wake_every == 0:
            # Let the channel thread leave: the next call then needs a wake.
            wait_for(lambda: not channel_thread_runs(t.pid), "the channel thread to leave")
        rc, out, err = remora("status", "-p", t.pid, "--channel", "socket", env={"REMORA_LOG": "attach"})
        if rc != 0 or "state read through it" not in out:
            raise Failure("status call %d of %d failed\n%s" % (i + 1, calls, show(rc, out, err)))
        woken += re.findall(r"wake signal \d+ sent to thread (\d+)", err)
    need = (calls + wake_every - 1) // wake_every
    threads = sorted(set(int(x) for x in woken))
    check(len(woken) >= need, "%d status calls, %d of them with a wake (threads woken: %s)" %
          (calls, len(woken), threads))
    t.finish()


def test_eintr_proof(tmp):
    """g. 30 status calls through the socket, a third of them woken anew:
    the target's calls saw no EINTR."""
    eintr_proof(tmp, [], 30, 3)


def test_eintr_proof_every_wait_interruptible(tmp):
    """g. The same on a target whose every thread waits in a call the wake
    signal makes fail (epoll_wait, nanosleep, poll): the agent re-issues it."""
    eintr_proof(tmp, ["--eintr-waits-only"], 12, 2)


def wake_signal(t):
    """The wake signal of the target's socket (@remora-agent.<pid>.<signo>)."""
    with open("/proc/%d/net/unix" % t.pid) as f:
        m = re.search(r"@remora-agent\.%d\.(\d+)$" % t.own_pid, f.read(), re.M)
    check(m, "the target's socket is listed in /proc/%d/net/unix" % t.pid)
    return int(m.group(1))


def tgkill(pid, tid, sig):
    nr = {"x86_64": 234, "aarch64": 131}[os.uname().machine]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(nr, pid, tid, sig) != 0:
        raise Failure("tgkill(%d, %d, %d): %s" % (pid, tid, sig, os.strerror(ctypes.get_errno())))


def direct_wakes(tmp, flags):
    t = Target(tmp, flags=flags)
    sig = wake_signal(t)
    own = tasks(t.pid)
    # Each thread in turn takes a wake that starts the channel thread (the
    # one before it has left); then a burst on every thread while it runs.
    # A wake that lands between two calls of a thread (libc code) is handed
    # on, and where no thread can take it, none starts: sent again, as the
    # controller does.
    for tid in own:
        wait_for(lambda: not channel_thread_runs(t.pid), "the channel thread to leave")
        end = time.monotonic() + STEP
        while not channel_thread_runs(t.pid):
            if time.monotonic() > end:
                raise Failure("wakes on thread %d started no channel thread in %.0f s" % (tid, STEP))
            tgkill(t.pid, tid, sig)
            wait_for(lambda: channel_thread_runs(t.pid), "", timeout=0.5, quiet=True)
    for _ in range(5):
        for tid in own:
            tgkill(t.pid, tid, sig)
    check(True, "the wake signal %d sent to each of the %d threads alone, then 5 times to all" % (sig, len(own)))
    rc, out, err = remora("status", "-p", t.pid, "--channel", "socket")
    check(rc == 0 and "state read through it" in out, "the channel serves a status after that", show(rc, out, err))
    t.finish()


def test_direct_wakes_on_every_thread(tmp):
    """g. The wake signal delivered to each thread itself, whatever wait it
    is in (as a forwarded or a stale wake lands): no call of the target's
    sees EINTR, and each such wake starts the channel thread."""
    direct_wakes(tmp, [])


def test_direct_wakes_every_wait_interruptible(tmp):
    """g. The same where every thread waits in a call that a handler makes
    fail (epoll_wait, nanosleep, poll)."""
    direct_wakes(tmp, ["--eintr-waits-only"])


def impostor(name):
    """A listening socket of ours bound to the abstract `name` (anyone may
    bind an abstract name): remora must neither send it a request nor send
    the signal its name carries to the target."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name)
    s.listen(8)
    s.setblocking(False)
    return s


def impostor_got_nothing(s):
    """No connection reached the impostor, or none that sent a byte."""
    try:
        while True:
            conn, _ = s.accept()
            conn.setblocking(False)
            try:
                if conn.recv(1):
                    return False
            except BlockingIOError:
                pass
            conn.close()
    except BlockingIOError:
        return True


def test_impostor_endpoint(tmp):
    """Another process binds a name of the target's (with signal 40, which
    the target does not handle: sent to it, it would kill it). remora talks
    only to a socket whose listener is the target itself (SO_PEERCRED):
    the opted-in target is served through its own socket, the impostor gets
    nothing, and a target that did not opt in is refused with the impostor
    named, alive."""
    t = Target(tmp)
    fake = impostor("remora-agent.%d.40" % t.own_pid)
    try:
        for i in range(3):
            row, notes, out = status_of(t.pid, "--channel", "socket")
            check(any("state read through it" in n for n in notes), "status %d goes through the target's own "
                  "socket" % (i + 1), out)
        rc, out, err = remora("attach", "-p", t.pid, "--channel", "socket", "-d", 300, "-t", ARGS.hook_tool,
                              cwd=tmp)
        check(rc == 0, "attach through the target's own socket", show(rc, out, err))
        check(impostor_got_nothing(fake), "the impostor got no request")
    finally:
        fake.close()
    t.finish()
    plain = Target(tmp, opt_in=False)
    fake = impostor("remora-agent.%d.40" % plain.own_pid)
    try:
        rc, out, err = remora("status", "-p", plain.pid, "--channel", "socket")
        check(rc != 0 and "is not process %d's" % plain.pid in err, "a name taken by another process is refused",
              show(rc, out, err))
        check(impostor_got_nothing(fake), "the impostor got no request")
    finally:
        fake.close()
    check(plain.p.poll() is None, "the target that did not opt in is alive (no signal 40 reached it)")
    plain.finish()


TESTS = [v for k, v in list(globals().items()) if k.startswith("test_")]


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for a in ("--remora", "--agent", "--default-tool", "--target", "--hook-tool", "--no-ptrace"):
        ap.add_argument(a, required=True)
    ap.add_argument("tests", nargs="*")
    ARGS = ap.parse_args()
    for a in ("remora", "agent", "default_tool", "target", "hook_tool", "no_ptrace"):
        setattr(ARGS, a, os.path.abspath(getattr(ARGS, a)))
    if os.geteuid() != 0:
        print("SKIP: needs root (targets and remora run as other uids, namespaces are entered)")
        return 0
    for tool in ("setpriv", "unshare"):
        if shutil.which(tool) is None:
            print("SKIP: %s (util-linux) is not installed" % tool)
            return 0
    failed = []
    ran = 0
    t_all = time.monotonic()
    for t in TESTS:
        if ARGS.tests and t.__name__ not in ARGS.tests and t.__name__[5:] not in ARGS.tests:
            continue
        ran += 1
        print("--- %s" % t.__name__, flush=True)
        t0 = time.monotonic()
        tmp = tempfile.mkdtemp(prefix="remora-channel-")
        os.chmod(tmp, 0o1777)  # targets and remora of other uids write here
        try:
            t(tmp)
            print("ok    %s (%.1f s)" % (t.__name__, time.monotonic() - t0), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on to the next test
            failed.append(t.__name__)
            detail = str(e) if isinstance(e, Failure) else traceback.format_exc()
            print("FAIL  %s: %s" % (t.__name__, detail), flush=True)
        finally:
            cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
    print("%d of %d tests failed (%.1f s)" % (len(failed), ran, time.monotonic() - t_all) if failed
          else "all %d tests passed (%.1f s)" % (ran, time.monotonic() - t_all))
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
