#!/usr/bin/env python3
"""What `remora attach --slurm JOB` costs on a real Slurm job: a real
two-node cluster on this machine (tests/slurm/slurm_cluster.py: slurmctld
and one slurmd per node, each in a UTS namespace of its own) running the
real MPI program of the Slurm test (remora_mpi_ranks under srun --mpi=pmi2),
with 1, 2 and 4 ranks per node. Python 3 standard library only; needs root.

Per round, for each number of ranks per node, on a fresh job each (the first
attach into a process loads the agent; a process attached before would be a
re-attach, much cheaper), in an order that rotates from round to round so
that the machine's noise falls on every variant alike:

- job: `remora attach --slurm J -d WINDOW`, its standard output read line by
  line and each line timestamped as it arrives:
    to attached   from the command's start to its "Attached to N processes
                  on 2 nodes" line (every rank of every node attached);
    to merged     from the window's end (its "Detaching after" line) to the
                  "==> job J: DIR (merged in N ms)" line: the detach, the
                  render of each rank on its node, the way back, the merge;
    detach, merge the "Detached from N processes in X ms" and "merged in N
                  ms" the command prints itself;
    total         the command's wall time;
    bytes/rank    the size of the files the nodes left under the job
                  directory (NODE/*), per rank.
- marked: the same command, with REMORA_LOG=attach (the node sides' attach
  marks, CLOCK_MONOTONIC, on the front's standard error) and each node's
  `remora slurm-node` behind a small relay (REMORA_SLURM_REMORA) that
  timestamps the commands it gets from the front and the events it sends
  back: where the time goes, node by node. The relay is a Python process in
  the path, so this run's own totals are not the headline; its phases are.
- one by one: the ranks attached one after the other as a user on each node
  would, each with a `remora attach -p PID` session (the default tool, its
  tree, the lease: what the job's node side does for each rank), n1's first,
  each timed from its start to its "Attached to" line; one node's ranks (n1)
  summed, and all ranks summed. The sessions stay until every rank is
  attached, then each gets SIGINT (Ctrl-C) and detaches.
  Then `srun --jobid=J --overlap -N1 -n1 -w NODE true` on n1 and on n2, one
  after the other (the floor of one node's step in the fan-out) and both at
  once (the front starts its sruns together).

The bench measures copies of remora, its agent, default tool and renderer,
and of remora_mpi_ranks, taken at its start (a rebuild of the tree during
the run changes nothing). After every variant it checks with `remora status
-p PID` that no rank is attached, ends the job (its stop file) and checks
that it printed `mpi_ranks: ok`. Every step has a deadline; on any failure,
or Ctrl-C, the cluster's own cleanup (slurm_cluster.py) kills every process
that carries its marker: the daemons, the jobs, and every remora and srun
the bench started. The goals of the issue: the whole job attached in at
most 1.5x the time of attaching one node's ranks one by one; the merged
profile ready at most 1 s after the window.

The front's lines are timestamped when the bench's reader thread gets them:
a few ms late at worst, which is why a phase measured from the window's end
can come out slightly negative.

  python3 bench/bench_slurm.py --remora build/bin/remora \\
      --mpi-ranks build/bin/remora_mpi_ranks [--rounds 7] [--window-ms 1000] \\
      [--transport auto|stream] [--keep-dir]
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "slurm"))
from slurm_cluster import SlurmCluster, Unavailable  # noqa: E402

NODES = ("n1", "n2")
STEP = 60.0  # seconds: the deadline of any one step
SKIP = 77
VARIANTS = ("job", "marked", "one by one")

# The relay between srun and the node's `remora slurm-node` in the marked
# run: byte for byte in both directions, with a timestamped line per command
# and per event (the wire of cli/slurm_job.h: a JSON object per line; a
# "file" event's line is followed by `size` bytes of payload).
RELAY = r'''#!%(python)s -S
import json, os, selectors, signal, subprocess, sys, time
start = time.monotonic()
node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
log = open(os.path.join(os.environ["BENCH_SLURM_WIRE_LOG"], "wire-%%s-%%d.log" %% (node, os.getpid())), "w")
def note(what, t):
    log.write("%%.6f %%s\n" %% (t, what))
    log.flush()
note("start", start)
child = subprocess.Popen([os.environ["BENCH_SLURM_REAL_REMORA"]] + sys.argv[1:], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, lambda signo, frame: child.send_signal(signo))
def write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]
sel = selectors.DefaultSelector()
sel.register(0, selectors.EVENT_READ, "in")
sel.register(child.stdout.fileno(), selectors.EVENT_READ, "out")
inbuf, outbuf, skip, front_gone = b"", b"", 0, False
# Until the node side's output ends: it leaves after its last event, as
# the relay must (the front then closes our input, which may never come).
while child.stdout.fileno() in sel.get_map():
    for key, _ in sel.select():
        data = os.read(key.fd, 65536)
        t = time.monotonic()  # when it came, before it is passed on
        if key.data == "in":
            if not data:
                sel.unregister(0)
                child.stdin.close()
                note("in EOF", t)
                continue
            try:
                write_all(child.stdin.fileno(), data)
            except OSError:
                pass
            inbuf += data
            while b"\n" in inbuf:
                line, inbuf = inbuf.split(b"\n", 1)
                note("in " + line.decode(errors="replace"), t)
            continue
        if not data:
            sel.unregister(key.fd)
            continue
        if not front_gone:
            try:
                write_all(1, data)
            except OSError:
                front_gone = True
        outbuf += data
        while outbuf:
            if skip:
                n = min(skip, len(outbuf))
                outbuf, skip = outbuf[n:], skip - n
                continue
            if b"\n" not in outbuf:
                break
            line, outbuf = outbuf.split(b"\n", 1)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            note("out %%s %%s" %% (ev.get("ev", "?"), ev.get("pid", "")), t)
            if ev.get("ev") == "file":
                skip = int(ev.get("size", 0))
sys.exit(child.wait())
'''


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def wait_for(pred, what, timeout=STEP, interval=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise Failure("timed out after %.0f s waiting for %s" % (timeout, what))


class Timed:
    """A command run to its end with each line of its standard output and
    error timestamped (time.monotonic(), CLOCK_MONOTONIC as remora's marks)
    as it arrives. t0: just before the fork; t_exit: when it was reaped."""

    def __init__(self, argv, env, cwd, timeout):
        self.argv = argv
        self.out, self.err = [], []
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
                   threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True)]
        for r in readers:
            r.start()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise Failure("%s: no end within %.0f s\n%s" % (" ".join(argv), timeout, self.text()))
        self.t_exit = time.monotonic()
        for r in readers:
            r.join(10)
        self.rc = self.proc.returncode

    @staticmethod
    def _read(stream, into):
        for raw in iter(stream.readline, b""):
            into.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)

    def at(self, prefix):
        """(time, line) of the first stdout line starting with prefix, or a Failure."""
        for t, line in self.out:
            if line.startswith(prefix):
                return t, line
        raise Failure("%s: no line '%s...'\n%s" % (" ".join(self.argv[:3]), prefix, self.text()))

    def text(self):
        return "\n".join(l for _, l in self.out) + "\n--- stderr\n" + "\n".join(l for _, l in self.err)


def stable_copy(src, dst):
    """Copies src once it has stood still for a second (executable, same size
    and mtime): a build of the tree may be relinking it right now."""
    def still():
        try:
            a = os.stat(src)
            time.sleep(1)
            b = os.stat(src)
        except OSError:
            return False
        return os.access(src, os.X_OK) and (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)

    wait_for(still, "%s to stand still (a build is writing it?)" % src, timeout=120, interval=0)
    shutil.copy2(src, dst)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(src).st_mtime))


class Bench:
    def __init__(self, args):
        self.args = args
        self.cluster = None
        self.scratch = tempfile.mkdtemp(prefix="remora-bench-slurm-")
        os.chmod(self.scratch, 0o755)
        # The binaries measured are copies: the tree's build may be redone
        # during the run (by someone else), which would change them, or make
        # them unrunnable while they are relinked, half-way. remora finds the
        # agent in ../lib, the default tool and the renderer next to the agent.
        bin_dir, lib_dir = os.path.join(self.scratch, "bin"), os.path.join(self.scratch, "lib")
        os.mkdir(bin_dir)
        os.mkdir(lib_dir)
        built = os.path.join(os.path.dirname(args.remora), "..", "lib")
        self.built = {}
        for src, dst in [(args.remora, os.path.join(bin_dir, "remora")),
                         (args.mpi_ranks, os.path.join(bin_dir, "remora_mpi_ranks"))] + [
                (os.path.join(built, n), os.path.join(lib_dir, n))
                for n in ("libremora-agent.so", "libremora-tool.so", "libremora-render.so")]:
            self.built[os.path.basename(dst)] = stable_copy(src, dst)
        args.remora = os.path.join(bin_dir, "remora")
        args.mpi_ranks = os.path.join(bin_dir, "remora_mpi_ranks")
        self.tmp = os.path.join(self.scratch, "tmp")
        os.mkdir(self.tmp)
        self.relay = os.path.join(self.scratch, "relay.py")
        with open(self.relay, "w") as f:
            f.write(RELAY % {"python": sys.executable})
        os.chmod(self.relay, 0o755)

    def env(self, out_dir):
        env = self.cluster.env()
        env["REMORA_OUTPUT_PATH"] = out_dir
        # Where a node side that does not see the job directory keeps its
        # ranks' outputs until it has sent them (the stream transport: under
        # $TMPDIR, named by job id, which every fresh cluster starts again
        # at 1): the bench's own, removed with it.
        env["TMPDIR"] = self.tmp
        env.pop("REMORA_LOG", None)
        if self.args.transport != "auto":
            env["REMORA_SLURM_TRANSPORT"] = self.args.transport
        return env

    def remora(self, *args, timeout=STEP):
        r = subprocess.run([self.args.remora] + [str(a) for a in args], env=self.cluster.env(),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        return r

    def attached(self, tasks):
        """The ranks whose agent says ATTACHED yes (remora status -p)."""
        still = []
        for t in tasks:
            r = self.remora("status", "-p", t["pid"])
            rows = [l.split() for l in r.stdout.splitlines()[1:2]]
            check(r.returncode == 0 and rows and len(rows[0]) > 3 and rows[0][3] in ("yes", "no"),
                  "remora status -p %d answers" % t["pid"], r.stdout + r.stderr)
            if rows[0][3] == "yes":
                still.append(t["pid"])
        return still

    def check_none_attached(self, job):
        still = self.attached(job.tasks)
        check(not still, "job %s: no rank attached after the variant" % job.job.id, "still attached: %s" % still)


class MpiJob:
    """A fresh job of remora_mpi_ranks, every rank in its loop, in a scratch
    directory of its own (its working directory too)."""

    def __init__(self, bench, per_node):
        self.bench = bench
        self.dir = tempfile.mkdtemp(prefix="job-", dir=bench.scratch)
        os.chmod(self.dir, 0o777)
        self.ready = os.path.join(self.dir, "ready")
        os.mkdir(self.ready)
        os.chmod(self.ready, 0o777)
        self.stop_file = os.path.join(self.dir, "stop")
        self.ranks = per_node * len(NODES)
        argv = [bench.args.mpi_ranks, "--ready-dir", self.ready, "--stop-file", self.stop_file, "--max-seconds", "300"]
        try:
            self.job = bench.cluster.launch(argv, nodes=len(NODES), ntasks_per_node=per_node, mpi="pmi2",
                                            kill_on_bad_exit=True, srun_args=("--chdir", self.dir))
        except RuntimeError as e:
            raise Failure(str(e))
        wait_for(lambda: len(os.listdir(self.ready)) == self.ranks, "%d ranks ready" % self.ranks)
        try:
            self.tasks = sorted(self.job.pids(), key=lambda t: (t["node"], t["global_id"]))
        except subprocess.TimeoutExpired:
            raise Failure("scontrol listpids of job %s hung" % self.job.id)
        check(len(self.tasks) == self.ranks, "job %s runs %d ranks" % (self.job.id, self.ranks), str(self.tasks))

    def finish(self):
        open(self.stop_file, "w").close()
        try:
            rc, out, err = self.job.wait(STEP)
        except subprocess.TimeoutExpired:
            raise Failure("job %s did not end within %.0f s of its stop file" % (self.job.id, STEP))
        check(rc == 0 and "mpi_ranks: ok" in out, "job %s ended with mpi_ranks: ok" % self.job.id,
              "rc %d\n%s\n%s" % (rc, out, err))


def file_bytes(path, name=None):
    """The bytes of the regular files under path (links not followed), or
    of those called name only."""
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            if name is not None and n != name:
                continue
            st = os.lstat(os.path.join(root, n))
            if not os.path.islink(os.path.join(root, n)):
                total += st.st_size
    return total


MERGED = re.compile(r"==> job (\S+): (\S+) \(merged in (\d+) ms\)")
DETACHED = re.compile(r"Detached from (\d+) process(?:es)? in (\d+) ms\.")
MARK = re.compile(r"^(\S+): \[remora ([\d.]+) attach \d+\] pid (\d+): (.*)$")


def run_job(bench, per_node, marked):
    """One `remora attach --slurm` on a fresh job: its times in ms, and in the
    marked run its phases."""
    job = MpiJob(bench, per_node)
    out_root = os.path.join(job.dir, "out")
    env = bench.env(out_root)
    wire_dir = None
    if marked:
        wire_dir = os.path.join(job.dir, "wire")
        os.mkdir(wire_dir)
        env["REMORA_LOG"] = "attach"
        env["REMORA_SLURM_REMORA"] = bench.relay
        env["BENCH_SLURM_REAL_REMORA"] = bench.args.remora
        env["BENCH_SLURM_WIRE_LOG"] = wire_dir
    argv = [bench.args.remora, "attach", "--slurm", job.job.id, "-d", str(bench.args.window_ms)]
    r = Timed(argv, env, job.dir, timeout=STEP * 2)
    check(r.rc == 0, "remora attach --slurm %s exits 0 (got %d)" % (job.job.id, r.rc), r.text())
    t_front, _ = r.at("Attaching to job ")
    t_att, line = r.at("Attached to ")
    check(line.startswith("Attached to %d processes on 2 nodes" % job.ranks), "every rank attached", r.text())
    t_win, _ = r.at("Detaching after ")
    t_det, line = r.at("Detached from ")
    m = DETACHED.match(line)
    check(m and int(m.group(1)) == job.ranks, "every rank detached", r.text())
    detach_ms = int(m.group(2))
    t_job, line = r.at("==> job ")
    m = MERGED.match(line)
    check(m is not None, "the merged profile's line", line)
    job_dir, merged_ms = m.group(2), int(m.group(3))
    bench.check_none_attached(job)
    node_bytes = sum(file_bytes(os.path.join(job_dir, n)) for n in NODES)
    raw_bytes = sum(file_bytes(os.path.join(job_dir, n), "profile.remora") for n in NODES)
    res = {
        "front ready": 1e3 * (t_front - r.t0),
        "to attached": 1e3 * (t_att - r.t0),
        "window end to merged": 1e3 * (t_job - t_win),
        "window end to Detached line": 1e3 * (t_det - t_win),
        "detach (printed)": detach_ms,
        "merged in (printed)": merged_ms,
        "total": 1e3 * (r.t_exit - r.t0),
        "bytes per rank": node_bytes / job.ranks,
        "raw bytes per rank": raw_bytes / job.ranks,
    }
    if marked:
        res.update(phases(r, wire_dir, t_att, t_win, t_det, t_job))
    job.finish()
    return res


def read_wire(wire_dir):
    """{node: [(t, what), ...]} from the relays' logs."""
    logs = {}
    for name in os.listdir(wire_dir):
        node = name.split("-")[1]
        with open(os.path.join(wire_dir, name)) as f:
            rows = []
            for line in f:
                t, _, what = line.rstrip("\n").partition(" ")
                rows.append((float(t), what))
        logs[node] = rows
    return logs


def phases(r, wire_dir, t_att, t_win, t_det, t_job):
    """The marked run's milestones, in ms: attach ones from the command's
    start, detach ones from the window's end; each the latest node's (the
    command waits for the last node), and per-rank spans as medians."""
    wire = read_wire(wire_dir)
    check(sorted(wire) == sorted(NODES), "a relay log from each node", str(sorted(wire)))
    marks = {}  # (node, pid) -> {what: t}
    for _, line in r.err:
        m = MARK.match(line)
        if m:
            marks.setdefault((m.group(1), int(m.group(3))), {}).setdefault(m.group(4), float(m.group(2)))

    def first(rows, what):
        for t, w in rows:
            if w == what or w.startswith(what + " "):
                return t
        raise Failure("relay log: no '%s'" % what)

    def last(rows, what):
        ts = [t for t, w in rows if w == what or w.startswith(what + " ")]
        if not ts:
            raise Failure("relay log: no '%s'" % what)
        return ts[-1]

    ms = lambda t, base: 1e3 * (t - base)
    per_node = {}
    rank_attach, rank_lease, rank_render = [], [], []
    for node, rows in wire.items():
        ready = [v["session ready"] for (n, _), v in marks.items() if n == node and "session ready" in v]
        check(ready, "REMORA_LOG=attach marks from node %s" % node, "\n".join(l for _, l in r.err[:40]))
        for (n, _), v in marks.items():
            if n == node and "session ready" in v and "attached with its lease" in v:
                rank_attach.append(ms(v["attached with its lease"], v["session ready"]))
                if "tools visible" in v:
                    rank_lease.append(ms(v["attached with its lease"], v["tools visible"]))
        # The node renders up to four ranks at a time and announces them
        # after: the span from its last detach to its last output, per rank.
        outputs = [t for t, w in rows if w.startswith("out output ")]
        if outputs:
            rank_render.append(ms(outputs[-1], last(rows, "out detached")) / len(outputs))
        pongs = [t for t, w in rows if w.startswith("out pong")]
        per_node[node] = {
            "relay started": ms(first(rows, "start"), r.t0),
            "node side's hello": ms(first(rows, "out hello"), r.t0),
            "first rank's session ready": ms(min(ready), r.t0),
            "node's ranks attached": ms(first(rows, "out attached"), r.t0),
            "clock measured after the attach (5 pings)": ms(pongs[4] if len(pongs) >= 5 else float("nan"), r.t0),
            "detach asked (clock measured)": ms(first(rows, "in detach"), t_win),
            "node's ranks detached": ms(last(rows, "out detached"), t_win),
            "node's ranks rendered": ms(outputs[-1] if outputs else last(rows, "out detached"), t_win),
            "node done": ms(first(rows, "out done"), t_win),
        }
    res = {"phase " + k: max(p[k] for p in per_node.values()) for k in next(iter(per_node.values()))}
    res["phase Attached line"] = ms(t_att, r.t0)
    res["phase Detached line"] = ms(t_det, t_win)
    res["phase ==> job line"] = ms(t_job, t_win)
    res["phase rank attach (median)"] = statistics.median(rank_attach) if rank_attach else float("nan")
    res["phase rank lease step (median)"] = statistics.median(rank_lease) if rank_lease else float("nan")
    res["phase rank render (median)"] = statistics.median(rank_render) if rank_render else float("nan")
    res["phase node attach span"] = max(p["node's ranks attached"] - p["first rank's session ready"]
                                        for p in per_node.values())
    return res


class Session:
    """`remora attach -p PID` left running in a session of its own; each
    line of its standard output timestamped as it arrives."""

    def __init__(self, argv, env, cwd):
        self.argv = argv
        self.out = []
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.reader = threading.Thread(target=Timed._read, args=(self.proc.stdout, self.out), daemon=True)
        self.reader.start()

    def wait_line(self, prefix, timeout=STEP):
        def seen():
            return next((t for t, line in list(self.out) if line.startswith(prefix)), None)

        t = wait_for(seen, "'%s' from %s" % (prefix, " ".join(self.argv[:4])), timeout)
        return t

    def stop(self):
        """SIGINT, as Ctrl-C: the session detaches and renders; then its exit."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(STEP)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.reader.join(10)
        return self.proc.returncode


def run_one_by_one(bench, per_node):
    """The ranks attached one after the other, each as a user would do it on
    its node: a `remora attach -p PID` session (the default tool, the tree,
    the lease, following), timed to its "Attached to" line; each session
    stays attached until every rank is, then all are stopped with SIGINT."""
    job = MpiJob(bench, per_node)
    env = bench.env(os.path.join(job.dir, "out"))
    times = []  # (node, ms to its "Attached to" line, 0)
    sessions = []
    try:
        for t in job.tasks:
            sess = Session([bench.args.remora, "attach", "-p", str(t["pid"])], env, job.dir)
            sessions.append(sess)
            t_line = sess.wait_line("Attached to")
            times.append((t["node"], 1e3 * (t_line - sess.t0), 0.0))
    finally:
        for sess in sessions:
            rc = sess.stop()
            if rc != 0:
                print("  %s: exit %d\n%s" % (" ".join(sess.argv), rc, "\n".join(l for _, l in sess.out)),
                      file=sys.stderr)
    bench.check_none_attached(job)
    floors = []
    for node in NODES:
        t0 = time.monotonic()
        try:
            s = bench.cluster.run(["srun", "--jobid=" + job.job.id, "--overlap", "-N1", "-n1", "-w", node, "true"],
                                  timeout=STEP)
        except subprocess.TimeoutExpired:
            raise Failure("srun --overlap -w %s true: no end within %.0f s" % (node, STEP))
        floors.append(1e3 * (time.monotonic() - t0))
        check(s.returncode == 0, "srun --overlap -w %s true exits 0" % node, s.stdout + s.stderr)
    # Both at once, as the front starts its sruns: the fan-out's floor.
    t0 = time.monotonic()
    pair = [subprocess.Popen(["srun", "--jobid=" + job.job.id, "--overlap", "-N1", "-n1", "-w", node, "true"],
                             env=bench.cluster.env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, start_new_session=True) for node in NODES]
    for p in pair:
        try:
            p.wait(STEP)
        except subprocess.TimeoutExpired:
            for q in pair:
                os.killpg(q.pid, signal.SIGKILL)
            raise Failure("two sruns --overlap true at once: no end within %.0f s" % STEP)
    pair_ms = 1e3 * (time.monotonic() - t0)
    check(all(p.returncode == 0 for p in pair), "two sruns --overlap true at once exit 0",
          " ".join(p.stderr.read().decode(errors="replace") for p in pair))
    job.finish()
    return {
        "one node one by one": sum(ms for node, ms, _ in times if node == NODES[0]),
        "all ranks one by one": sum(ms for _, ms, _ in times),
        "one rank (median)": statistics.median(ms for _, ms, _ in times),
        "srun floor": statistics.median(floors),
        "srun pair": pair_ms,
    }


def fmt(values):
    """median (min-max), rounded; "-" for none (NaN left out)."""
    values = [v for v in values if v == v]
    if not values:
        return "-"
    return "%.0f (%.0f-%.0f)" % (statistics.median(values), min(values), max(values))


def report(results, per_nodes, rounds_done):
    """Markdown tables of the medians (min-max) over the rounds."""
    def col(k, variant, key):
        return [r[key] for r in results[(k, variant)] if key in r]

    def med(k, variant, key):
        v = col(k, variant, key)
        return statistics.median(v) if v else float("nan")

    head = "| ms, median (min-max) over %d rounds | " % rounds_done + " | ".join(
        "%d rank%s per node (%d ranks)" % (k, "s" if k > 1 else "", 2 * k) for k in per_nodes) + " |"
    sep = "|---|" + "---|" * len(per_nodes)
    rows = [
        ("whole job: start to `Attached to` (attach --slurm)", "job", "to attached"),
        ("  of which start to `Attaching to job` (scontrol show job, show hostnames)", "job", "front ready"),
        ("one node's ranks one by one (n1, `attach -p` sessions, summed)", "one by one", "one node one by one"),
        ("all ranks one by one (both nodes, summed)", "one by one", "all ranks one by one"),
        ("one rank alone (`attach -p`, to its `Attached to` line)", "one by one", "one rank (median)"),
        ("`srun --overlap -N1 -n1 -w NODE true`", "one by one", "srun floor"),
        ("  the same to n1 and n2 at once (wall time of both)", "one by one", "srun pair"),
        ("window end to `==> job` (merged profile)", "job", "window end to merged"),
        ("  window end to `Detached from` line", "job", "window end to Detached line"),
        ("  `Detached from ... in X ms` (printed)", "job", "detach (printed)"),
        ("  `merged in N ms` (printed)", "job", "merged in (printed)"),
        ("command total (`-d %d`)" % ARGS.window_ms, "job", "total"),
        ("bytes per rank under the job directory (NODE/*), B", "job", "bytes per rank"),
        ("  of which profile.remora (the raw records), B", "job", "raw bytes per rank"),
    ]
    print()
    print(head)
    print(sep)
    for label, variant, key in rows:
        print("| %s | %s |" % (label, " | ".join(fmt(col(k, variant, key)) for k in per_nodes)))
    ratio = [med(k, "job", "to attached") / med(k, "one by one", "one node one by one") for k in per_nodes]
    pair = []
    for k in per_nodes:
        js, bs = col(k, "job", "to attached"), col(k, "one by one", "one node one by one")
        pair.append([j / b for j, b in zip(js, bs)])
    print("| goal 1: whole job / one node one by one (ratio of medians; per-round range), <= 1.5 | %s |"
          % " | ".join("%.2f (%.2f-%.2f)" % (q, min(p), max(p)) if p else "-" for q, p in zip(ratio, pair)))
    print("| goal 2: window end to merged profile, median (max), <= 1000 ms | %s |"
          % " | ".join("%.0f (%.0f)" % (med(k, "job", "window end to merged"),
                                        max(col(k, "job", "window end to merged") or [float("nan")]))
                       for k in per_nodes))
    marked = [
        ("`Attaching to job` line (scontrol show job, show hostnames)", "front ready"),
        ("relay started (srun to the node, the relay's Python start)", "phase relay started"),
        ("node side's hello (remora slurm-node started)", "phase node side's hello"),
        ("first rank's session ready (scontrol listpids done)", "phase first rank's session ready"),
        ("node's ranks attached", "phase node's ranks attached"),
        ("clock measured after the attach (5 pings)", "phase clock measured after the attach (5 pings)"),
        ("`Attached to` line", "phase Attached line"),
        ("one rank's attach, session ready to attached (median of ranks)", "phase rank attach (median)"),
        ("  of which tools visible to attached with its lease (median of ranks)", "phase rank lease step (median)"),
        ("a node's attach span, first session ready to all attached", "phase node attach span"),
        ("detach asked (5 clock pings done), from the window's end", "phase detach asked (clock measured)"),
        ("node's ranks detached", "phase node's ranks detached"),
        ("node's ranks rendered", "phase node's ranks rendered"),
        ("a node's render span per rank (up to 4 at a time)", "phase rank render (median)"),
        ("node done (its last event sent)", "phase node done"),
        ("`Detached from` line (the sruns reaped)", "phase Detached line"),
        ("`==> job` line (job.json, merge, summary)", "phase ==> job line"),
    ]
    print()
    print("Where the time goes (the marked run: REMORA_LOG=attach and a relay per node; "
          "the latest node's time, ms from the command's start, then from the window's end):")
    print()
    print(head.replace("| ms, median", "| marked run, ms, median"))
    print(sep)
    for label, key in marked:
        print("| %s | %s |" % (label, " | ".join(fmt(col(k, "marked", key)) for k in per_nodes)))
    print("| (the marked run's own start to `Attached to`, for comparison) | %s |"
          % " | ".join(fmt(col(k, "marked", "to attached")) for k in per_nodes))
    sys.stdout.flush()


ARGS = None


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--remora", required=True)
    ap.add_argument("--mpi-ranks", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--window-ms", type=int, default=1000)
    ap.add_argument("--ranks-per-node", default="1,2,4", help="comma-separated (default 1,2,4)")
    ap.add_argument("--transport", choices=("auto", "stream"), default="auto",
                    help="REMORA_SLURM_TRANSPORT: auto (here: the shared job directory) or stream (srun's output)")
    ap.add_argument("--keep-dir", action="store_true", help="keep the scratch directory (jobs, outputs, logs)")
    ARGS = ap.parse_args()
    ARGS.remora = os.path.abspath(ARGS.remora)
    ARGS.mpi_ranks = os.path.abspath(ARGS.mpi_ranks)
    per_nodes = [int(k) for k in ARGS.ranks_per_node.split(",")]
    if os.geteuid() != 0:
        print("skipped: needs root (the cluster's daemons, ptrace of the ranks)")
        return SKIP
    for p in (ARGS.remora, ARGS.mpi_ranks):
        if not os.access(p, os.X_OK):
            print("%s is not an executable: cmake --build build -j2 --target remora remora_mpi_ranks" % p)
            return 1
    try:
        bench = Bench(ARGS)
    except (Failure, OSError) as e:
        print("cannot copy the binaries: %s" % e)
        return 1
    print("measuring copies of: %s" % ", ".join("%s (built %s)" % kv for kv in sorted(bench.built.items())))
    # Slurm's CPUs per node, not real cores: 4 ranks per node must fit.
    bench.cluster = SlurmCluster(cpus=max(per_nodes + [2]))
    try:
        t0 = time.monotonic()
        bench.cluster.start()
    except Unavailable as e:
        print("skipped: %s" % e)
        shutil.rmtree(bench.scratch, ignore_errors=True)
        return SKIP
    print("Slurm cluster of n1 and n2 up in %.1f s; window %d ms; transport %s; %s" % (
        time.monotonic() - t0, ARGS.window_ms, ARGS.transport, bench.scratch), flush=True)
    items = [(k, v) for v in VARIANTS for k in per_nodes]
    results = {item: [] for item in items}
    rounds_done = 0
    failed = None
    try:
        for rnd in range(ARGS.rounds):
            shift = rnd % len(items)
            for k, variant in items[shift:] + items[:shift]:
                t = time.monotonic()
                if variant == "one by one":
                    res = run_one_by_one(bench, k)
                    what = "one node %.0f ms, all %.0f ms, srun %.0f ms, two at once %.0f ms" % (
                        res["one node one by one"], res["all ranks one by one"], res["srun floor"],
                        res["srun pair"])
                else:
                    res = run_job(bench, k, marked=variant == "marked")
                    what = "to attached %.0f ms, window end to merged %.0f ms (detach %d, merge %d), %.0f B/rank" % (
                        res["to attached"], res["window end to merged"], res["detach (printed)"],
                        res["merged in (printed)"], res["bytes per rank"])
                results[(k, variant)].append(res)
                print("round %d, %d/node, %-10s %s  [%.1f s]" % (rnd + 1, k, variant + ":", what,
                                                                 time.monotonic() - t), flush=True)
            rounds_done += 1
    except (Failure, OSError, subprocess.SubprocessError, KeyboardInterrupt) as e:
        failed = e
        print("FAILED: %s" % ("interrupted" if isinstance(e, KeyboardInterrupt) else "%s: %s" % (type(e).__name__, e)),
              flush=True)
    finally:
        bench.cluster.stop()
        if ARGS.keep_dir or failed:
            print("scratch kept: %s" % bench.scratch)
        else:
            shutil.rmtree(bench.scratch, ignore_errors=True)
    if rounds_done:
        with open("/proc/loadavg") as f:
            print("\nload average at the end: %s" % " ".join(f.read().split()[:3]))
        report(results, per_nodes, rounds_done)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
