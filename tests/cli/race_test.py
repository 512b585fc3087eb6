#!/usr/bin/env python3
"""Controllers that race for one process.

N `remora` commands at a time, M rounds, against each hostile target of
tests/targets (64 threads, a signal storm, a malloc hammer, spinners) and
against opted-in targets reached through both channels (ptrace and the
agent's socket): attach (leased, ending by itself, or with --unload),
detach, detach --unload, status and call, in random mixes, with some
commands SIGKILLed at random instants. Each command's exit code and message
must be one of an explained set (won, lost naming a live owner, nothing to
detach, ...); the hook tool's log must show one session at a time (every
tool_attach followed by its tool_detach before the next); once every
command is gone no session is left (no owner); the target lives, its own
computation is right, and it holds no descriptor beyond its own. The
outcome table is printed at the end.

Nothing waits for time to pass: every wait is for an event (a line, an
exit, a state), each with a deadline that only a hang reaches. The kills
come at random instants on purpose: any instant must be safe. Every process
started here runs in a process group of its own and is killed and reaped
whatever happens. Needs root or ptrace rights over its own children.

  race_test.py --remora build/bin/remora --agent build/lib/libremora-agent.so \\
      --hook-tool build/lib/libremora-hook-tool-a.so --bin-dir build/bin [--rounds M] [--controllers N]

REMORA_RACE_SEED=S replays a run (the seed is printed first).
"""
import argparse
import collections
import ctypes
import os
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ARGS = None
PROCS = []  # every Popen started here: its group is killed and reaped at the end of each scenario
STEP = 60.0  # the deadline of one step: only a hang reaches it
TIMEOUT_MS = "5000"  # each command's --timeout: a bound on a wait, never expected to pass


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def wait_for(pred, what, timeout=STEP):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise Failure("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.02)


def spawn(argv, **kw):
    p = subprocess.Popen([str(a) for a in argv], start_new_session=True, **kw)
    PROCS.append(p)
    return p


def cleanup():
    for p in reversed(PROCS):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
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


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def base_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "REMORA_TOOL_ATTACH", "ROCP_TOOL_ATTACH", "REMORA_HOOK_LOG")}
    env.update(extra or {})
    return env


# ---- targets -----------------------------------------------------------------

class LineReader:
    """Lines of a pipe, read with a deadline (raw reads: a storm of signals
    in the reader's own process is no concern here, but a hang is)."""

    def __init__(self, f):
        self.fd = f.fileno()
        self.buf = b""

    def line(self, what, timeout=STEP):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise Failure("timed out after %.0f s waiting for %s" % (timeout, what))
            chunk = os.read(self.fd, 4096)
            if not chunk:
                raise Failure("the output ended before %s (read %r)" % (what, self.buf))
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")


class HostileTarget:
    """A program of tests/targets: "ready <pid>", then commands on stdin."""

    def __init__(self, name, opt_in=False):
        env = base_env({"LD_PRELOAD": ARGS.agent, "REMORA_TOOL_ATTACH": "1"} if opt_in else None)
        self.name = name
        self.proc = spawn([os.path.join(ARGS.bin_dir, name)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=env)
        self.out = LineReader(self.proc.stdout)
        m = re.match(r"ready (\d+)", self.out.line("%s to be ready" % name))
        check(m, "%s says ready" % name)
        self.pid = int(m.group(1))
        check(self.command("snapshot") == "ok", "%s takes its snapshot" % name)
        self.has_probe = True

    def command(self, cmd):
        self.proc.stdin.write((cmd + "\n").encode())
        self.proc.stdin.flush()
        return self.out.line("%s's reply to %s" % (self.name, cmd))

    def finish(self):
        """The target's own verdict: no anomaly, no descriptor of ours left."""
        rep = self.command("report")
        fields = dict(kv.split("=", 1) for kv in rep.split(" detail:")[0].split() if "=" in kv)
        check(fields.get("anomalies") == "0", "%s: no anomaly in its own computation" % self.name, rep)
        check(fields.get("fds_delta") == "0", "%s: no descriptor left behind" % self.name, rep)
        check(self.command("quit") == "bye", "%s quits" % self.name)
        check(self.proc.wait(timeout=STEP) == 0, "%s exits 0" % self.name)
        return rep


class ChannelTarget:
    """remora_channel_target, opted in (the agent preloaded, REMORA_TOOL_ATTACH=1):
    its waits count every EINTR, its computation checks itself."""

    def __init__(self):
        self.name = "remora_channel_target"
        self.proc = spawn([os.path.join(ARGS.bin_dir, self.name)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          env=base_env({"LD_PRELOAD": ARGS.agent, "REMORA_TOOL_ATTACH": "1"}))
        self.out = LineReader(self.proc.stdout)
        m = re.match(r"ready (\d+) threads=(\d+)", self.out.line("the channel target to be ready"))
        check(m, "the channel target says ready")
        self.pid = int(m.group(1))
        self.fds = fd_count(self.pid)
        self.has_probe = False

    def finish(self):
        fds = fd_count(self.pid)
        check(fds == self.fds, "%s: no descriptor left behind" % self.name, "%d before, %d after" % (self.fds, fds))
        self.proc.stdin.close()
        line = self.out.line("the channel target's verdict")
        check(re.fullmatch(r"eintr epoll=0 nanosleep=0 poll=0 read=0 cond=0 main=0 compute=ok", line),
              "%s: no wait of its own cut short, its computation right" % self.name, line)
        check(self.proc.wait(timeout=STEP) == 0, "%s exits 0" % self.name)
        return line


class SignalStorm:
    """SIGUSR1, SIGUSR2 and queued SIGRTMIN (each carrying its number) sent to
    the signals target while the controllers race; every queued one must
    arrive exactly once."""

    class SigVal(ctypes.Union):
        _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]

    def __init__(self, pid):
        self.pid, self.rt, self.rt_sum, self.stop = pid, 0, 0, threading.Event()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.sigqueue.argtypes = [ctypes.c_int, ctypes.c_int, SignalStorm.SigVal]
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        i = 0
        while not self.stop.is_set() and self.rt < 20000:
            os.kill(self.pid, signal.SIGUSR1)
            os.kill(self.pid, signal.SIGUSR2)
            if self.libc.sigqueue(self.pid, signal.SIGRTMIN, SignalStorm.SigVal(sival_int=i)) == 0:
                self.rt += 1
                self.rt_sum += i
            i += 1
            if i % 32 == 0:
                self.stop.wait(0.0005)  # pacing, not synchronisation: a storm the target survives

    def finish(self, target):
        self.stop.set()
        self.thread.join(timeout=STEP)
        got = {}
        wait_for(lambda: got.update(kv.split("=") for kv in target.command("signals").split()) or
                 int(got["rt"]) >= self.rt, "every queued signal to arrive")
        check(int(got["rt"]) == self.rt and int(got["rt_sum"]) == self.rt_sum and got["rt_bad"] == "0",
              "every queued signal arrived exactly once (%d sent)" % self.rt, str(got))


# ---- the controllers -----------------------------------------------------------

def hook_env(log):
    return ["-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log]


def command_for(op, target, log, hold_ms):
    pid = str(target.pid)
    if op in ("attach", "attach-socket", "attach-unload"):
        argv = ["attach", "-p", pid] + hook_env(log) + ["-d", str(hold_ms), "--timeout", TIMEOUT_MS]
        if op == "attach-socket":
            argv += ["--channel", "socket"]
        if op == "attach-unload":
            argv += ["--unload"]
        return argv
    if op in ("detach", "detach-socket"):
        return ["detach", "-p", pid, "--timeout", TIMEOUT_MS] + (["--channel", "socket"] if op == "detach-socket" else [])
    if op == "unload":
        return ["detach", "-p", pid, "--unload", "--timeout", TIMEOUT_MS]
    if op == "status":
        return ["status", "-p", pid]
    if op == "call":
        return ["call", "-p", pid, "--timeout", TIMEOUT_MS] + (["remora_probe", "3", "4"] if target.has_probe
                                                                else ["getpid"])
    raise ValueError(op)


# What a racing command may answer, and what each answer means. Anything
# else fails the test with the command's full output.
UNLOADING = r"being unloaded|unloaded by another controller"
NOTHING_ATTACHED = r"no tools are attached|no Remora agent in process \d+: nothing is attached|" + UNLOADING
SESSION_ENDED = (r"this controller's session has ended already|no lease waits for this controller's claim|" +
                 NOTHING_ATTACHED)
# The unload is being made stricter: one that refuses, keeping a tool it
# cannot prove safe to unload, says why.
UNLOAD_REFUSED = r"stays loaded|cannot be unloaded|kept|refuse"


def classify(op, rc, out, err, pids):
    """The explained outcome of one command, or None."""
    text = out + err
    owner = re.search(r"attached by remora pid (\d+), lease live", text)
    named_live = owner and int(owner.group(1)) in pids
    if op.startswith("attach"):
        if rc == 0 and "Attached to 1 process" in out and re.search(r"Detached from 1 process", out):
            return "won, ended its own session"
        if rc == 13 and "Attached to" not in out and named_live:
            return "lost, named the owner"
        if rc == 13 and "Attached to" not in out and re.search(UNLOADING, err):
            return "lost to an unload"
        if rc == 13 and "Attached to" not in out and "no lease waits for this controller's claim" in err:
            return "won, its session ended by another before its claim"
        if rc == 13 and "Attached to 1 process" in out and re.search(r"failed: .*(%s)" % SESSION_ENDED, out):
            return "won, its session ended by another"
        if op == "attach-unload" and "Attached to 1 process" in out and re.search(UNLOAD_REFUSED, text):
            return "won, unload refused"
        if op == "attach-unload" and rc == 13 and "Attached to 1 process" in out and re.search(UNLOADING, out):
            return "won, the agent unloaded by another"
        return None
    if op.startswith("detach"):
        if rc == 0 and re.search(r"^Detached .* from process \d+", out, re.M):
            return "detached a session"
        if rc == 13 and re.search(NOTHING_ATTACHED, err):
            return "nothing to detach"
        return None
    if op == "unload":
        if rc == 0 and re.search(r"unloaded\.$", out.strip()):
            return "unloaded"
        if rc == 13 and re.search(UNLOADING, err):
            return "left to another's unload"
        if rc == 13 and re.search(NOTHING_ATTACHED, err):
            return "nothing to unload"
        if rc != 0 and re.search(UNLOAD_REFUSED, err):
            return "unload refused, named why"
        return None
    if op == "status":
        return "read the state" if rc == 0 and re.search(r"^PID\s+COMMAND\s+AGENT", out) else None
    if op == "call":
        want = "= 97 (0x61)" if "remora_probe" in out else "getpid() = "
        return "called" if rc == 0 and want in out else None
    return None


def run_round(target, ops, rng, log, pids, table, kills, state):
    """One round: every op at once, some killed at a random instant."""
    procs = []
    # Known gap, left to the unload's redesign: an unload whose controller
    # dies between its two steps (the tools out, then the agent's dlclose)
    # is finished by the next controller to unload, and two finishing the
    # same one at once would both dlclose the agent. So once an unloading
    # controller was killed, a round has one unload at most; and in a round
    # with two unloads or more, none of them is killed.
    if state.get("unload_killed"):
        first = next((i for i, op in enumerate(ops) if "unload" in op), None)
        ops = [op if "unload" not in op or i == first else "status" for i, op in enumerate(ops)]
    unloads = sum(1 for op in ops if "unload" in op)
    for op in ops:
        p = spawn([ARGS.remora] + command_for(op, target, log, rng.choice((1, 30, 150))),
                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        pids.add(p.pid)
        procs.append((op, p, rng.random() < kills and ("unload" not in op or unloads < 2)))
    killers = []
    for op, p, kill in procs:
        if kill:  # at a random instant: any must be safe
            t = threading.Timer(rng.random() * 0.06, lambda p=p: p.poll() is None and p.send_signal(signal.SIGKILL))
            t.start()
            killers.append(t)
    for t in killers:
        t.join()
    for op, p, kill in procs:
        try:
            out, err = p.communicate(timeout=STEP)
        except subprocess.TimeoutExpired:
            raise Failure("remora %s hung (%.0f s): %s" % (op, STEP, " ".join(map(str, p.args))))
        out, err = out.decode(errors="replace"), err.decode(errors="replace")
        if p.returncode == -signal.SIGKILL:
            outcome = "killed"
            state["unload_killed"] = state.get("unload_killed") or "unload" in op
        else:
            outcome = classify(op, p.returncode, out, err, pids)
        if outcome is None:
            raise Failure("remora %s gave an unexplained outcome:\n%s\nexit %d\n--- stdout:\n%s--- stderr:\n%s" %
                          (op, " ".join(map(str, p.args)), p.returncode, out, err))
        table[(target.name, op, outcome)] += 1


def check_one_session_at_a_time(log, pid, name):
    """tool_attach and tool_detach alternate in the hook tool's log: never two
    sessions at once."""
    if not os.path.exists(log):
        return 0
    events = []
    for line in open(log):
        m = re.match(r"a:(tool_attach|tool_detach) pid=(\d+)", line)
        if m and int(m.group(2)) == pid:
            events.append(m.group(1))
    for i, e in enumerate(events):
        check(e == ("tool_attach" if i % 2 == 0 else "tool_detach"),
              "%s: one session at a time (event %d of the hook log is %s)" % (name, i, e), "".join(open(log)))
    return events.count("tool_attach")


def status_attached(pid):
    p = subprocess.run([ARGS.remora, "status", "-p", str(pid)], capture_output=True, text=True, timeout=STEP)
    check(p.returncode == 0, "remora status -p %d" % pid, p.stdout + p.stderr)
    row = [l.split() for l in p.stdout.splitlines() if l.split()[:1] == [str(pid)]]
    return row[0][3] if row and len(row[0]) > 3 else "?"


def scenario(name, make_target, ops, rng, table, storm=False):
    """M rounds of N controllers against one target; then its checks."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="remora-race-") as tmp:
        log = os.path.join(tmp, "hook.log")
        target = make_target()
        storm_ = SignalStorm(target.pid) if storm else None
        pids, state = set(), {}
        try:
            for _ in range(ARGS.rounds):
                run_round(target, [rng.choice(ops) for _ in range(ARGS.controllers)], rng, log, pids, table,
                          kills=0.25, state=state)
            # No controller is left: every lease has expired, nobody owns a session.
            wait_for(lambda: status_attached(target.pid) in ("no", "-"), "no session once every controller is gone")
            sessions = check_one_session_at_a_time(log, target.pid, name)
            if storm_:
                storm_.finish(target)
            check(target.proc.poll() is None, "%s lives" % name)
            verdict = target.finish()
        finally:
            if storm_:
                storm_.stop.set()
            cleanup()
    print("ok    %-24s %d rounds x %d controllers, %d sessions, %.1f s; target: %s" %
          (name, ARGS.rounds, ARGS.controllers, sessions, time.monotonic() - t0, verdict), flush=True)


def print_table(table):
    print("\nOutcomes (target, command, outcome: count):")
    width = max(len("%s  %s" % (t, o)) for t, o, _ in table) if table else 0
    for (t, op, outcome), n in sorted(table.items()):
        print("  %-*s  %-52s %4d" % (width, "%s  %s" % (t, op), outcome, n))
    totals = collections.Counter()
    for (_, _, outcome), n in table.items():
        totals[outcome] += n
    print("  totals: " + ", ".join("%s %d" % kv for kv in sorted(totals.items())), flush=True)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for a in ("--remora", "--agent", "--hook-tool", "--bin-dir"):
        ap.add_argument(a, required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--controllers", type=int, default=6)
    ap.add_argument("scenarios", nargs="*")
    ARGS = ap.parse_args()
    for a in ("remora", "agent", "hook_tool", "bin_dir"):
        setattr(ARGS, a, os.path.abspath(getattr(ARGS, a)))
    seed = int(os.environ.get("REMORA_RACE_SEED", str(random.SystemRandom().randrange(1 << 31))))
    print("seed %d (REMORA_RACE_SEED=%d replays this run)" % (seed, seed), flush=True)
    rng = random.Random(seed)
    ptrace_ops = ("attach", "attach", "attach-unload", "detach", "unload", "status", "call")
    # Opted in: both channels on one process. No --unload here: an agent
    # preloaded at launch stays in the process (the socket channel's opt-in).
    both_ops = ("attach", "attach-socket", "attach-socket", "detach", "detach-socket", "status", "call")
    scenarios = [
        ("threads64", lambda: HostileTarget("remora_target_threads64"), ptrace_ops, False),
        ("signals", lambda: HostileTarget("remora_target_signals"), ptrace_ops, True),
        ("malloc, opted in", lambda: HostileTarget("remora_target_malloc", opt_in=True), both_ops, False),
        ("spin", lambda: HostileTarget("remora_target_spin"), ptrace_ops, False),
        ("channel target", ChannelTarget, both_ops, False),
    ]
    table = collections.Counter()
    failed = []
    for name, make, ops, storm in scenarios:
        if ARGS.scenarios and name.split(",")[0].split()[0] not in ARGS.scenarios:
            continue
        try:
            scenario(name, make, ops, rng, table, storm)
        except Exception as e:  # noqa: BLE001 - report and go on with the next scenario
            failed.append(name)
            print("FAIL  %s: %s" % (name, str(e) if isinstance(e, Failure) else traceback.format_exc()), flush=True)
        finally:
            cleanup()
    print_table(table)
    print("%d scenarios failed: %s" % (len(failed), ", ".join(failed)) if failed else "all scenarios passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
