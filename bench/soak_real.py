#!/usr/bin/env python3
"""A soak of `remora attach` on real programs, each under its own load client:
redis-server (redis-benchmark), PostgreSQL (pgbench, a throwaway cluster of
its own), nginx (a master and two workers, HTTP clients) and the python3,
node and JVM servers of tests/real/servers (HTTP clients). Per program,
--cycles short sessions `remora attach -p PID -d MSEC` (the tree: nginx's
workers, postgres's backends), then --cycles more with --unload. It counts:

- client errors: the load client's failed runs or wrong answers (goal 0);
- harm: the program died, stopped answering right, or lost a process of its
  tree (an nginx worker respawned, a postgres backend or auxiliary process
  crashed: the same pids, nothing of the kind in its log); the program's soak
  stops at the first (goal 0);
- remora failures: exits other than 0, or no profile of the target, counted
  by kind (the exit code and the first line of the message, numbers made N);
- growth per 1,000 cycles of the target's open descriptors (/proc/PID/fd),
  mappings (/proc/PID/maps lines) and VmRSS, summed over its long-lived
  processes, as the least-squares slope of --samples points per phase taken
  between cycles (the first after the phase's first cycle, so that the agent
  and tool loaded once is a step, not growth). Goal 0 after --unload, whose
  last value is also compared with the one before any attach.

Not part of `make test`: `make soak` runs it (docs/benchmarks.md holds the
results). The servers and load clients are those of
tests/real/real_programs_test.py, imported. Every process it starts is in a
process group of its own and killed on every exit path; every wait has a
deadline.

  bench/soak_real.py --remora build/bin/remora [--cycles 1000] \\
      [--programs redis,postgres,nginx,java,node,python3] [--duration-ms 20]
"""
import argparse
import glob
import json
import os
import pwd
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "real"))
import real_programs_test as real  # noqa: E402  (after the path it is found on)

# The quick ones first: a run cut short still has them.
PROGRAMS = ["redis", "nginx", "python3", "node", "java", "postgres"]


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwinds like Ctrl-C, so that every finally runs."""


def on_signal(signum, frame):
    raise Interrupted("signal %d" % signum)


# --- PostgreSQL ---------------------------------------------------------------


def pg_bindir():
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not dirs:
        raise real.Skip("PostgreSQL not installed (Debian: postgresql)")
    return os.path.dirname(dirs[-1])


# The postmaster's own children that live as long as it does (its backends
# and autovacuum workers come and go with the load). Their titles as ps shows
# them: "postgres: checkpointer".
PG_AUX = {"checkpointer", "background writer", "walwriter", "autovacuum launcher", "logical replication launcher"}
# What the postmaster logs when one of its children crashed, and when it
# restarts them all after one did.
PG_HARM = re.compile(r"terminated by signal|was terminated by exception|exited with exit code|PANIC|"
                     r"reinitializing|all server processes terminated|server process .* was terminated")


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def pg_aux(postmaster):
    out = []
    for c in real.children(postmaster):
        title = cmdline(c)
        if title.startswith("postgres: ") and title[len("postgres: "):].strip() in PG_AUX:
            out.append(c)
    return sorted(out)


class PgbenchLoad(real.RedisLoad):
    """pgbench in a loop of bounded runs (-T) until stopped, counted as
    RedisLoad counts redis-benchmark's: each run must exit 0, have processed
    transactions, none failed, and print nothing on stderr."""

    def __init__(self, pgbench, sockdir, port, seconds=15, **kw):
        super().__init__("", 0, **kw)
        self.argv = [pgbench, "-n", "-c", "4", "-j", "2", "-T", str(seconds), "-h", sockdir, "-p", str(port), "-U",
                     "postgres", "postgres"]

    def judge(self, rc, out, err):
        done = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
        failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
        if rc != 0 or err.strip() or not done or int(done.group(1)) == 0 or not failed or failed.group(1) != "0":
            return "pgbench run %d: rc %d\nstdout:\n%s\nstderr:\n%s" % (self.runs, rc, out[-1500:], err[-1500:])
        return None

    def describe(self):
        return "%d pgbench runs" % self.runs


def start_postgres(args, tmp, programs, **load_kw):
    """A throwaway cluster in tmp, run by the postgres user when this runs as
    root (initdb and postgres refuse root), on a unix socket of its own (no
    TCP), fsync off; pgbench's tables at scale 2."""
    bindir = pg_bindir()
    user = None
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            raise real.Skip("no postgres user (Debian: postgresql)")
        user = "postgres"
        # The postgres user must reach its directory inside the 0700 one.
        os.chmod(tmp, 0o711)
    pgdir = os.path.join(tmp, "pg")
    os.makedirs(pgdir)
    if user:
        os.chown(pgdir, pw.pw_uid, pw.pw_gid)
    data, sock = os.path.join(pgdir, "data"), pgdir
    r = subprocess.run([os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
                        "--locale=C", "--no-sync"], capture_output=True, text=True, timeout=180, user=user,
                       group=user and pw.pw_gid, extra_groups=user and [], start_new_session=True)
    real.check(r.returncode == 0, "initdb", r.stdout[-2000:] + r.stderr[-2000:])
    port = real.free_port()  # names the socket only: .s.PGSQL.PORT
    # SIGQUIT when the soak dies: the postmaster's immediate shutdown, which
    # takes its children (each in a session of its own) with it.
    p = programs.start("postgres", [os.path.join(bindir, "postgres"), "-D", data, "-k", sock, "-p", str(port), "-c",
                                    "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=20"],
                       cwd=pgdir, death_signal=signal.SIGQUIT, user=user)
    psql = [os.path.join(bindir, "psql"), "-X", "-A", "-t", "-q", "-h", sock, "-p", str(port), "-U", "postgres",
            "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c"]

    def query(sql):
        q = subprocess.run(psql + [sql], capture_output=True, text=True, timeout=60, start_new_session=True)
        real.check(q.returncode == 0, "psql %r" % sql, lambda: q.stdout[-1000:] + q.stderr[-1000:])
        return q.stdout.strip()

    def ready():
        return p.poll() is None and subprocess.run(psql + ["select 1"], capture_output=True, text=True, timeout=30,
                                                   start_new_session=True).stdout.strip() == "1"

    real.until(ready, 60, "postgres answers", lambda: real.stderr_tail(p))
    r = subprocess.run([os.path.join(bindir, "pgbench"), "-i", "-s", "2", "-q", "-h", sock, "-p", str(port), "-U",
                        "postgres", "postgres"], capture_output=True, text=True, timeout=300, start_new_session=True)
    real.check(r.returncode == 0, "pgbench -i", r.stdout[-2000:] + r.stderr[-2000:])
    aux = real.until(lambda: len(pg_aux(p.pid)) == len(PG_AUX) and pg_aux(p.pid), 30,
                     "postgres has its %d auxiliary processes" % len(PG_AUX))

    def alive(what):
        real.check(p.poll() is None, "%s: the postmaster is alive" % what, lambda: real.stderr_tail(p))
        real.check(pg_aux(p.pid) == aux, "%s: the same auxiliary processes" % what,
                   lambda: "%s, were %s" % (pg_aux(p.pid), aux))
        p.err_file.seek(0)
        log = p.err_file.read().decode(errors="replace")
        m = PG_HARM.search(log)
        real.check(m is None, "%s: no postgres process crashed" % what, lambda: log[max(0, m.start() - 1500):][:3000])

    expect = str(real.expected_sum(20000))

    def answers():
        real.check(query("select sum(k::bigint * k %% 1000003) from generate_series(0, %d) k" % 19999) == expect,
                   "postgres computes the sum right")
        # TPC-B's invariant: every transaction adds its delta to one account,
        # teller and branch and logs it in the history, atomically; one
        # statement reads one snapshot.
        real.check(query("select (select sum(abalance) from pgbench_accounts) = (select sum(bbalance) from "
                         "pgbench_branches) and (select sum(bbalance) from pgbench_branches) = (select "
                         "sum(tbalance) from pgbench_tellers) and (select sum(tbalance) from pgbench_tellers) = "
                         "(select coalesce(sum(delta), 0) from pgbench_history)") == "t",
                   "pgbench's balances add up")

    load = PgbenchLoad(os.path.join(bindir, "pgbench"), sock, port, **load_kw)
    served = real.Served("postgres", p.pid, load, alive, answers,
                         lambda: load.wait_for(1, 120, "a first pgbench run"), None, None)
    served.tracked = lambda: [p.pid] + aux
    served.stop_first = lambda: stop_postmaster(p)
    served.out_owner = pw if user else None
    return served


def stop_postmaster(p):
    """An immediate shutdown (SIGQUIT): the postmaster signals its children
    and exits once they are gone; Programs.stop_all kills what is left."""
    if p.poll() is None:
        os.kill(p.pid, signal.SIGQUIT)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            print("warn  the postmaster did not stop within 20 s of SIGQUIT")


START = {"redis": real.start_redis, "postgres": start_postgres, "nginx": real.start_nginx,
         "java": real.start_java, "node": real.start_node, "python3": real.start_python}


def load_limits(name, deadline_s):
    """The loads' bounds, for a soak: as long as the program's deadline, and
    counting failures instead of stopping at the first."""
    if name in ("redis", "postgres"):
        return {"max_runs": 10 ** 6, "max_s": deadline_s, "keep_going": True}
    return {"max_requests": 10 ** 9, "max_s": deadline_s}


# --- measuring a process ------------------------------------------------------


def descendants(pid):
    """pid's tree below it, now (pid reuse aside: the soak's own children)."""
    out, todo = [], [pid]
    while todo:
        try:
            kids = real.children(todo.pop())
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def tcp_inodes(pid):
    """The inodes of the TCP sockets of pid's network namespace."""
    out = set()
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                next(f)
                out.update(line.split()[9] for line in f)
        except OSError:
            pass
    return out


def measure(pids):
    """(open descriptors, mapping lines, VmRSS kB, VmSize kB), summed over
    pids. The
    descriptors leave out TCP sockets: they are the load clients'
    connections, as many as happen to be open (redis-benchmark's come and
    go), and nothing of Remora's is one."""
    fds = maps = rss = size = 0
    for pid in pids:
        tcp = tcp_inodes(pid)
        fd_dir = "/proc/%d/fd" % pid
        for fd in os.listdir(fd_dir):
            try:
                link = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue  # closed meanwhile
            m = re.fullmatch(r"socket:\[(\d+)\]", link)
            fds += not (m and m.group(1) in tcp)
        with open("/proc/%d/maps" % pid, "rb") as f:
            maps += sum(1 for _ in f)
        with open("/proc/%d/status" % pid) as f:
            status = f.read()
        rss += int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))
        size += int(re.search(r"^VmSize:\s+(\d+) kB", status, re.M).group(1))
    return fds, maps, rss, size


def slope_per_1000(points):
    """Least-squares slope of [(cycle, value)], per 1,000 cycles."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return None if den == 0 else 1000.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


# --- the cycles ----------------------------------------------------------------


def failure_kind(rc, out, err):
    """(kind, example): the kind is the exit code and the message's first
    line, numbers made N; the example is all that remora printed, cut."""
    said = re.compile(r"rror|fail|remora:|timed out|warning", re.I)
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    out_lines = out.splitlines()
    lines += [ln.strip() for ln in out_lines if said.search(ln)]
    first = lines[0] if lines else "(nothing printed)"
    # The stdout lines that say what failed, each with the two after it
    # ("Detach failed for:" names the process on the next line).
    failed = re.compile(r"fail|rror|timed out", re.I)
    told = [i + k for i, ln in enumerate(out_lines) if failed.search(ln) for k in range(3) if i + k < len(out_lines)]
    told = "\n".join(out_lines[i] for i in sorted(set(told)))
    example = "stderr: %s | stdout: %s" % (err.strip()[:1500], told[:1500] or out.strip()[-500:])
    return "exit %s: %s" % (rc, re.sub(r"\d+", "N", first)[:200]), example.replace("\n", " / ")


class Phase:
    def __init__(self, name):
        self.name = name
        self.cycles = 0
        self.times = []
        self.failures = {}  # kind -> [count, first message]
        self.samples = []  # (cycle, fds, maps, rss)
        self.client = (0, 0)  # the load's (good, bad) over the phase
        self.harm = None

    def fail(self, kind, message):
        self.failures.setdefault(kind, [0, message])[0] += 1

    def slopes(self):
        pts = self.samples
        return [slope_per_1000([(s[0], s[i]) for s in pts]) for i in (1, 2, 3, 4)]

    def as_dict(self):
        return {"name": self.name, "cycles": self.cycles, "median_s": self.median(), "failures": self.failures,
                "samples": self.samples, "client": self.client, "harm": self.harm, "slopes": self.slopes()}

    def median(self):
        return statistics.median(self.times) if self.times else None


class Soak:
    """One program's soak: its cycles, counts and samples."""

    def __init__(self, args, name):
        self.args, self.name = args, name
        self.phases = []
        self.baseline = None
        self.skipped = self.error = None
        self.remora = None  # the running remora, killed on the way out
        self.last_remora = ""  # the last cycle's exit and output
        self.client_failures = []
        self.wall_s = 0.0

    def tracked(self, served):
        """The long-lived processes measured: the program and, by default,
        its children (nginx's workers); postgres names its own."""
        if hasattr(served, "tracked"):
            return served.tracked()
        return [served.pid] + descendants(served.pid)

    def run_remora(self, pid, out_dir, unload):
        argv = [self.args.remora, "attach", "-p", str(pid), "-d", str(self.args.duration_ms), "-e",
                "REMORA_OUTPUT_PATH=" + out_dir] + (["--unload"] if unload else [])
        # SIGTERM if the soak dies: remora then detaches as after Ctrl-C.
        self.remora = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True,
                                       preexec_fn=real.die_with_this_test(signal.SIGTERM))
        try:
            out, err = self.remora.communicate(timeout=self.args.remora_timeout_s)
            rc = self.remora.returncode
        except subprocess.TimeoutExpired:
            self.kill_remora()
            out, err = self.remora.communicate()
            rc = "timeout"
        finally:
            self.remora = None
        return rc, out, err

    def kill_remora(self):
        """SIGTERM first (remora detaches cleanly), SIGKILL after 30 s."""
        p = self.remora
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        except ProcessLookupError:
            pass

    def phase(self, served, tracked, out_dir, unload, end):
        ph = Phase("--unload" if unload else "plain")
        self.phases.append(ph)
        n = self.args.cycles
        at = sorted({1, n} | {max(1, round(k * n / self.args.samples)) for k in range(1, self.args.samples + 1)})
        good0, bad0, _ = served.load.counts()
        try:
            for i in range(1, n + 1):
                if time.monotonic() > end:
                    print("      %s %s: the deadline passed after %d cycles" % (self.name, ph.name, ph.cycles))
                    break
                t = time.monotonic()
                rc, out, err = self.run_remora(served.pid, out_dir, unload)
                ph.times.append(time.monotonic() - t)
                ph.cycles = i
                if rc != 0:
                    ph.fail(*failure_kind(rc, out, err))
                elif not re.search(r"^==> pid %d: " % served.pid, out, re.M):
                    ph.fail("exit 0 without a profile of the target", out[-400:])
                elif err.strip():
                    # remora says on stderr what it could not do (a tool
                    # that stays loaded after --unload): counted too.
                    first = err.strip().splitlines()[0]
                    ph.fail("exit 0, warned: " + re.sub(r"\d+", "N", first)[:200], err.strip()[:1500])
                for entry in os.listdir(out_dir):
                    path = os.path.join(out_dir, entry)
                    if os.path.islink(path):  # NAME-PID-latest
                        os.unlink(path)
                    else:
                        shutil.rmtree(path, ignore_errors=True)
                what = "%s cycle %d" % (ph.name, i)
                self.last_remora = "remora exit %s\nstdout:\n%s\nstderr:\n%s" % (rc, out[-2000:], err[-2000:])
                try:
                    served.alive(what)
                    if i % self.args.answer_every == 0 or i == n:
                        served.answers()
                except (OSError, subprocess.SubprocessError) as e:
                    # No answer at all (a hang, a refused connection) is
                    # harm as much as a wrong one.
                    raise real.Failure("%s: the program answers: %s: %s" % (what, type(e).__name__, e))
                if i in at:
                    ph.samples.append((i,) + measure(tracked))
                    good, bad, _ = served.load.counts()
                    s = ph.samples[-1]
                    print("      %s %s %d/%d: %.3f s/cycle (median), fds %d, maps %d, rss %d kB, vm %d kB; client "
                          "%d ok, %d bad; remora failures %d" % (self.name, ph.name, i, n, ph.median(), *s[1:],
                                                                 good - good0, bad - bad0,
                                                                 sum(c for c, _ in ph.failures.values())), flush=True)
        except real.Failure as e:
            # What the cycle that harmed it said, and where a core went.
            ph.harm = "%s\nthe cycle's %s" % (e, self.last_remora)
            raise
        finally:
            good, bad, _ = served.load.counts()
            ph.client = (good - good0, bad - bad0)
        return ph

    def run(self):
        args = self.args
        tmp = tempfile.mkdtemp(prefix="remora-soak-%s-" % self.name)
        programs = real.Programs(tmp)
        served = None
        started = time.monotonic()
        end = started + args.deadline_s
        load_started = False
        try:
            print("soak  %s" % self.name, flush=True)
            served = START[self.name](args, tmp, programs, **load_limits(self.name, args.deadline_s + 600))
            out_dir = os.path.join(tmp, "out")
            os.makedirs(out_dir)
            owner = getattr(served, "out_owner", None)
            if owner:
                os.chown(out_dir, owner.pw_uid, owner.pw_gid)
            served.load.start()
            load_started = True
            served.warm()
            tracked = self.tracked(served)
            self.baseline = measure(tracked)
            print("      %s: pid %d, measured %s; before any attach: fds %d, maps %d, rss %d kB, vm %d kB" % (
                self.name, served.pid, tracked, *self.baseline), flush=True)
            for unload in (False, True):
                if ("unload" if unload else "plain") in args.phases.split(","):
                    self.phase(served, tracked, out_dir, unload, end)
        except real.Skip as e:
            self.skipped = str(e)
            print("skip  %s: %s" % (self.name, e))
        except real.Failure as e:
            self.error = str(e)
            harm = next((ph.harm for ph in self.phases if ph.harm), None)
            print("HARM  %s: %s" % (self.name, harm or e))
        except (OSError, subprocess.SubprocessError) as e:
            self.error = "%s: %s" % (type(e).__name__, e)
            print("ERROR %s: %s" % (self.name, self.error))
        except BaseException:
            self.error = "interrupted"
            raise
        finally:
            if self.error and self.error != "interrupted" and args.hold_s > 0:
                # The processes as the harm left them, for a look (/proc,
                # gdb) before they are killed.
                print("      holding %s's processes for %d s: %s" % (
                    self.name, args.hold_s, [p.pid for p in programs.procs]), flush=True)
                try:
                    time.sleep(args.hold_s)
                except BaseException:  # a signal ends the hold, not the clean-up
                    print("      the hold ended early")
            self.kill_remora()
            if served is not None and load_started:
                try:
                    served.load.stop()
                except real.Failure as e:
                    print("warn  %s: %s" % (self.name, e))
                _, _, self.client_failures = served.load.counts()
            if served is not None and hasattr(served, "stop_first"):
                served.stop_first()
            # The trees the programs made (postgres's children are in
            # sessions of their own): SIGKILL whatever outlived the groups.
            stragglers = [d for p in programs.procs for d in descendants(p.pid)]
            programs.stop_all()
            for pid in stragglers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            real.remove_perf_map(programs)
            self.wall_s = time.monotonic() - started
            if self.error:
                print("      outputs kept in %s" % tmp)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        return self


# --- the report ----------------------------------------------------------------


def fmt_slope(v):
    return "-" if v is None else "%+.1f" % v


def report(soaks, args):
    lines = ["| program | cycles | median cycle | client errors | harmed | remora failures | "
             "fds /1000 | maps /1000 | RSS kB /1000 | VmSize kB /1000 | fds, maps, RSS kB: before; first; last |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for s in soaks:
        if s.skipped:
            lines.append("| %s | skipped: %s ||||||||||" % (s.name, s.skipped))
            continue
        if not s.phases:
            lines.append("| %s | not started: %s ||||||||||" % (s.name, s.error))
            continue
        for ph in s.phases:
            fails = sum(c for c, _ in ph.failures.values())
            slopes = ph.slopes()
            first, last = (ph.samples[0], ph.samples[-1]) if ph.samples else (None, None)
            levels = "-" if not first else "%d, %d, %d; %d, %d, %d; %d, %d, %d" % (
                *s.baseline[:3], *first[1:4], *last[1:4])
            lines.append("| %s %s | %d | %s | %d | %s | %d | %s | %s | %s | %s | %s |" % (
                s.name, ph.name, ph.cycles, "-" if ph.median() is None else "%.0f ms" % (1000 * ph.median()),
                ph.client[1], "yes" if ph.harm else "0", fails, *(fmt_slope(v) for v in slopes), levels))
            for kind, (count, message) in sorted(ph.failures.items(), key=lambda kv: -kv[1][0]):
                notes.append("- %s %s: %d x `%s` (first: %s)" % (s.name, ph.name, count, kind, message[:300]))
            if ph.harm:
                notes.append("- %s %s: harmed: %s" % (s.name, ph.name, ph.harm.splitlines()[0]))
        if s.error and not any(ph.harm for ph in s.phases):
            notes.append("- %s: stopped: %s" % (s.name, s.error.splitlines()[0]))
        for f in s.client_failures[:2]:
            notes.append("- %s: client: %s" % (s.name, f.replace("\n", " | ")[:400]))
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    root = os.path.normpath(os.path.join(HERE, ".."))
    ap.add_argument("--remora", default=os.path.join(root, "build", "bin", "remora"))
    ap.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated, of " + ",".join(PROGRAMS))
    ap.add_argument("--cycles", type=int, default=1000, help="per phase (plain, then --unload)")
    ap.add_argument("--phases", default="plain,unload", help="plain: the cycles without --unload; unload: with")
    ap.add_argument("--duration-ms", type=int, default=20, help="remora attach -d")
    ap.add_argument("--samples", type=int, default=10, help="growth samples per phase, after its first cycle")
    ap.add_argument("--answer-every", type=int, default=20, help="check the program's answers every N cycles")
    ap.add_argument("--remora-timeout-s", type=int, default=120, help="deadline of one remora attach")
    ap.add_argument("--deadline-s", type=int, default=3600, help="per program: no cycle starts after it")
    ap.add_argument("--src", default=os.path.join(root, "tests", "real", "servers"))
    ap.add_argument("--work", default=os.path.join(root, "build", "bench", "soak"), help="for the compiled Java class")
    ap.add_argument("--hold-s", type=int, default=0, help="on harm, leave the processes for this long first")
    ap.add_argument("--cores", action="store_true", help="let the programs dump core (RLIMIT_CORE unlimited)")
    ap.add_argument("--json", help="write every count and sample here")
    ap.add_argument("--markdown", help="write the table here too")
    args = ap.parse_args()
    args.channel = None
    names = [n.strip() for n in args.programs.split(",") if n.strip()]
    unknown = [n for n in names if n not in START]
    if unknown:
        ap.error("unknown programs %s (known: %s)" % (unknown, ",".join(PROGRAMS)))
    if not os.access(args.remora, os.X_OK):
        ap.error("no remora at %s (build it: make)" % args.remora)
    os.makedirs(args.work, exist_ok=True)
    if args.cores:
        # Inherited by the programs: a crash leaves a core where
        # /proc/sys/kernel/core_pattern says.
        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # nohup's stays ignored
        signal.signal(signal.SIGHUP, on_signal)
    started = time.monotonic()
    soaks = []
    try:
        for n in names:
            soaks.append(Soak(args, n))
            soaks[-1].run()
    finally:
        table = report(soaks, args)
        print("\nsoak: %d cycles per phase, remora attach -d %d, %.1f min in all\n" % (
            args.cycles, args.duration_ms, (time.monotonic() - started) / 60))
        print(table)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(table)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([{"program": s.name, "skipped": s.skipped, "error": s.error, "baseline": s.baseline,
                            "wall_s": s.wall_s, "client_failures": s.client_failures,
                            "phases": [ph.as_dict() for ph in s.phases]} for s in soaks], f, indent=1)
    bad = any(s.error or any(ph.failures or ph.client[1] for ph in s.phases) for s in soaks)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
