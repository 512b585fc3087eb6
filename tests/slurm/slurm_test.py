#!/usr/bin/env python3
"""`remora attach|detach|status --slurm` against a real Slurm job on a real
two-node Slurm cluster on this machine (slurm_cluster.py: slurmctld and one
slurmd per node, each node in a UTS namespace of its own).

The job is a real MPI program (remora_mpi_ranks, mpi_ranks.c: MPICH under
srun --mpi=pmi2), 2 ranks per node, each rank in its own hot function
rank_work_<rank>, communicating every few milliseconds; at the end rank 0
checks the ranks' combined result. The fault tests use its --standalone mode
(no MPI; srun -K0), where one rank's death does not end the others.

What is checked is what the job and the user see: the job finishes with the
right result, every rank is in the merged profile with its own hot function
under its node and rank, the exit code and the lines that name each failure,
and that no rank stays attached after the session (read with remora status
on this machine, which is every node's host).

Every wait has a deadline; every process started here is killed at the end
of each test (the cluster's own cleanup also kills whatever carries its
marker). Without Slurm installed the test says so in one line and exits 77
(ctest: skipped).

  slurm_test.py --remora build/bin/remora --mpi-ranks build/bin/remora_mpi_ranks [TEST...]
"""
import argparse
import csv
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import SlurmCluster, Unavailable  # noqa: E402

ARGS = None
CLUSTER = None
STEP = 60.0
SKIP = 77
EXIT_NO_TARGET, EXIT_PERMISSION, EXIT_NOT_SUPPORTED, EXIT_PARTIAL = 2, 3, 5, 14  # cli/exit_codes.h
NOBODY = 65534


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))
    print("  ok: " + what, flush=True)


def wait_for(pred, what, timeout=STEP, interval=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise Failure("timed out after %.0f s waiting for %s" % (timeout, what))


class Run:
    """A job of remora_mpi_ranks and its scratch directory."""

    def __init__(self, standalone=False, ranks_per_node=2, extra_env=None):
        self.dir = tempfile.mkdtemp(prefix="remora-slurm-test-")
        os.chmod(self.dir, 0o777)
        self.ready = os.path.join(self.dir, "ready")
        os.mkdir(self.ready)
        os.chmod(self.ready, 0o777)
        self.stop_file = os.path.join(self.dir, "stop")
        self.out = os.path.join(self.dir, "out")
        self.ranks = 2 * ranks_per_node
        argv = [ARGS.mpi_ranks, "--ready-dir", self.ready, "--stop-file", self.stop_file, "--max-seconds", "240"]
        if standalone:
            argv.append("--standalone")
        self.job = CLUSTER.launch(argv, nodes=2, ntasks_per_node=ranks_per_node, mpi=None if standalone else "pmi2",
                                  kill_on_bad_exit=not standalone, extra_env=extra_env)
        wait_for(lambda: len(os.listdir(self.ready)) == self.ranks, "%d ranks ready" % self.ranks)
        self.tasks = self.job.pids()
        check(len(self.tasks) == self.ranks, "job %s runs %d ranks on n1 and n2" % (self.job.id, self.ranks),
              str(self.tasks))

    def env(self, **extra):
        env = CLUSTER.env()
        env["REMORA_OUTPUT_PATH"] = self.out
        env.update(extra)
        return env

    def remora(self, *args, timeout=STEP * 2, env=None, user=None):
        argv = [ARGS.remora] + list(args)
        if user is not None:
            argv = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups"] + argv
        r = subprocess.run(argv, env=env or self.env(), cwd=self.dir, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
        print("  $ remora %s -> %d" % (" ".join(args), r.returncode), flush=True)
        return r

    def finish(self, expect_ok=True):
        open(self.stop_file, "w").close()
        rc, out, err = self.job.wait(STEP)
        if expect_ok:
            check(rc == 0 and "mpi_ranks: ok" in out, "the job finished with the right result",
                  "rc %d\n%s\n%s" % (rc, out, err))
        return rc, out, err

    def attached_pids(self):
        """The ranks (on this machine: every node's host) whose agent says attached."""
        still = []
        for t in self.tasks:
            r = subprocess.run([ARGS.remora, "status", "-p", str(t["pid"])], capture_output=True, text=True,
                               timeout=STEP)
            rows = [l.split() for l in r.stdout.splitlines()[1:2]]
            if rows and len(rows[0]) > 3 and rows[0][3] == "yes":
                still.append(t["pid"])
        return still

    def job_dir(self):
        dirs = [d for d in os.listdir(self.out) if d.startswith("slurm-%s-" % self.job.id)]
        check(len(dirs) == 1, "one job directory for job %s" % self.job.id, str(dirs))
        return os.path.join(self.out, dirs[0])


def check_merged_profile(run, job_dir, ranks):
    """The merged outputs name every rank in `ranks` ({pid: (node, rank)}),
    each with its own hot function under its node and rank."""
    with open(os.path.join(job_dir, "job.json")) as f:
        manifest = json.load(f)
    listed = {(r["node"], r["rank"]) for r in manifest["ranks"] if r["dir"]}
    check({v for v in ranks.values()} <= listed, "job.json lists every rank with its outputs", str(manifest["ranks"]))
    for n in manifest["nodes"]:
        if n["name"] in {node for node, _ in ranks.values()}:
            check(len(n["clock"]) >= 1, "node %s's clock was measured (%s)" % (n["name"], n["clock"]))
    folded = open(os.path.join(job_dir, "folded.txt")).read()
    for pid, (node, rank) in ranks.items():
        prefix = "%s;rank %d (pid %d);" % (node, rank, pid)
        lines = [l for l in folded.splitlines() if l.startswith(prefix)]
        hot = sum(int(l.rsplit(" ", 1)[1]) for l in lines if "rank_work_%d" % rank in l)
        other = sum(int(l.rsplit(" ", 1)[1]) for l in lines if re.search(r"rank_work_(?!%d\b)\d" % rank, l))
        check(hot > 0 and other == 0, "rank %d on %s: its own hot function rank_work_%d in the merged folded "
              "stacks (%d samples)" % (rank, node, rank, hot), folded[:2000])
    with open(os.path.join(job_dir, "ranks.csv")) as f:
        rows = list(csv.DictReader(f))
    for pid, (node, rank) in ranks.items():
        row = [r for r in rows if r.get("node") == node and r.get("rank") == str(rank)]
        check(row and "rank_work_%d" % rank in json.dumps(row[0]),
              "ranks.csv: rank %d's hottest function is rank_work_%d" % (rank, rank), str(rows))
    summary = open(os.path.join(job_dir, "summary.txt")).read()
    first = min(rank for _, rank in ranks.values())
    check("rank_work_%d" % first in summary and "aligned" in summary,
          "summary.txt has the rank table and the clock line", summary)
    with open(os.path.join(job_dir, "trace.perfetto"), "rb") as f:
        trace = f.read()
    for pid, (node, rank) in ranks.items():
        check(("rank %d on %s" % (rank, node)).encode() in trace, "the Perfetto trace has a track for rank %d "
              "on %s" % (rank, node))
    with gzip.open(os.path.join(job_dir, "profile.pb.gz")) as f:
        pprof = f.read()
    check(all(("rank_work_%d" % rank).encode() in pprof for _, rank in ranks.values()) and b"node" in pprof,
          "the merged pprof names the ranks' functions and nodes")


def rank_map(run):
    return {t["pid"]: (t["node"], t["global_id"]) for t in run.tasks}


# ---- the tests ----

def test_mpi_job_attach_and_merged_profile():
    """A whole MPI job: attached on both nodes, profiled, detached, one merged profile."""
    run = Run()
    r = run.remora("attach", "--slurm", run.job.id, "-d", "1500")
    print(r.stdout + r.stderr)
    check(r.returncode == 0, "remora attach --slurm exits 0", r.stdout + r.stderr)
    check("Attached to 4 processes on 2 nodes (n1: 2, n2: 2)" in r.stdout, "the summary names nodes and ranks")
    check(not run.attached_pids(), "no rank is attached after the session")
    job_dir = run.job_dir()
    check_merged_profile(run, job_dir, rank_map(run))
    manifest = json.load(open(os.path.join(job_dir, "job.json")))
    check(all(n["transport"] == "shared" for n in manifest["nodes"]), "the nodes wrote into the job directory "
          "(shared)", str(manifest["nodes"]))
    os.unlink(os.path.join(job_dir, "folded.txt"))
    r = run.remora("report", job_dir)
    check(r.returncode == 0 and "rank_work_3" in r.stdout and os.path.exists(os.path.join(job_dir, "folded.txt")),
          "remora report JOBDIR merges the ranks again", r.stdout + r.stderr)
    run.finish()


def test_keep_status_detach_through_the_stream():
    """--keep, then status --slurm and detach --slurm; the outputs travel through srun's stream."""
    run = Run(standalone=True, ranks_per_node=1)
    env = run.env(REMORA_SLURM_TRANSPORT="stream")
    r = run.remora("attach", "--slurm", run.job.id, "--keep", env=env)
    check(r.returncode == 0 and "remora detach --slurm %s" % run.job.id in r.stdout, "attach --keep exits 0 and "
          "says how to detach", r.stdout + r.stderr)
    check(sorted(run.attached_pids()) == sorted(t["pid"] for t in run.tasks), "both ranks stay attached")
    r = run.remora("status", "--slurm", run.job.id, env=env)
    check(r.returncode == 0 and len(re.findall(r"attached \(\S*libremora-tool\.so, through ptrace\)", r.stdout)) == 2,
          "status --slurm shows both ranks attached", r.stdout + r.stderr)
    r = run.remora("detach", "--slurm", run.job.id, env=env)
    print(r.stdout + r.stderr)
    check(r.returncode == 0, "detach --slurm exits 0", r.stdout + r.stderr)
    check(not run.attached_pids(), "no rank is attached after detach --slurm")
    job_dir = run.job_dir()
    manifest = json.load(open(os.path.join(job_dir, "job.json")))
    check(all(n["transport"] == "stream" for n in manifest["nodes"]), "both nodes sent their outputs through "
          "srun's stream", str(manifest["nodes"]))
    check_merged_profile(run, job_dir, rank_map(run))
    run.finish()


def test_stopped_slurmd_and_killed_rank():
    """One node's slurmd stopped during the attach; a rank killed during the session: the rest goes on."""
    run = Run(standalone=True)
    CLUSTER.stop_slurmd("n2")
    try:
        proc = subprocess.Popen([ARGS.remora, "attach", "--slurm", run.job.id, "-d", "1500", "--node-timeout",
                                 "4000"], env=run.env(), cwd=run.dir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        lines = []
        victim = [t for t in run.tasks if t["node"] == "n1"][0]
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Attached to"):
                os.kill(victim["pid"], signal.SIGKILL)
        out = "".join(lines) + proc.stderr.read()
        proc.wait(STEP)
    finally:
        CLUSTER.cont_slurmd("n2")
    print(out)
    check(proc.returncode == EXIT_PARTIAL, "exit code 14: the job was reached in part", out)
    check(re.search(r"node n2 failed: no answer from node n2", out), "node n2 is named with why it failed", out)
    check("Attached to 2 processes on 1 node (n1: 2)" in out, "n1's ranks were attached", out)
    check(re.search(r"rank %d on n1 \(pid %d.*killed by SIGKILL" % (victim["global_id"], victim["pid"]), out),
          "the killed rank is named", out)
    others = {t["pid"]: (t["node"], t["global_id"]) for t in run.tasks if t["node"] == "n1" and t is not victim}
    check_merged_profile(run, run.job_dir(), others)
    rc, out, err = run.finish(expect_ok=False)
    check(out.count("mpi_ranks: ok") == 3, "the other three ranks finished right", out + err)


def dead(pid):
    """Gone, or a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def start_attach(run, env):
    """remora attach --slurm J without -d, read up to its "Attached to" line."""
    proc = subprocess.Popen([ARGS.remora, "attach", "--slurm", run.job.id], env=env, cwd=run.dir,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = ""
    while True:
        line = proc.stdout.readline()
        out += line
        if not line or line.startswith("Attached to"):
            break
    check(line.startswith("Attached to 4 processes on 2 nodes"), "attached on both nodes", out)
    check(len(run.attached_pids()) == 4, "all four ranks are attached")
    return proc, out


def test_ctrl_c_and_controller_killed():
    """Ctrl-C detaches in order; remora killed with SIGKILL, alone or with its sruns: every rank detached."""
    run = Run(standalone=True)
    env = run.env(REMORA_SLURM_FRONT_TIMEOUT="3000")
    # A terminal's Ctrl-C goes to the foreground process group: remora's.
    proc, out = start_attach(run, env)
    os.killpg(proc.pid, signal.SIGINT)
    rest, _ = proc.communicate(timeout=STEP)
    out += rest
    check(proc.returncode == 0 and "Got SIGINT: detaching." in out and "==> job %s" % run.job.id in out,
          "Ctrl-C: every node detached, the profile merged, exit 0", out)
    check(not run.attached_pids(), "no rank is attached after Ctrl-C")
    for how in ("remora", "remora and its sruns", "remora stopped"):
        proc, out = start_attach(run, env)
        sruns = [int(p) for p in open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)).read().split()]
        check(len(sruns) == 2, "remora runs one srun per node", str(sruns))
        t0 = time.monotonic()
        # Alone, its sruns get SIGTERM (PR_SET_PDEATHSIG) and pass it on. With
        # its sruns killed first, the steps live on with their input open, and
        # each node detaches once it heard nothing for 3 s.
        if how == "remora and its sruns":
            for pid in sruns:
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: all(dead(pid) for pid in sruns), "the sruns dead")
        # Stopped, it says nothing while its sruns keep every step's input
        # open: each node detaches after 3 s of silence.
        os.kill(proc.pid, signal.SIGSTOP if how == "remora stopped" else signal.SIGKILL)
        wait_for(lambda: not run.attached_pids(), "every rank detached after " + how)
        check(True, "%s: every rank detached %.1f s later" % (how, time.monotonic() - t0))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(STEP)
    rc, out, err = run.finish(expect_ok=False)
    check(out.count("mpi_ranks: ok") == 4, "every rank finished right", out + err)


def test_refusals():
    """A job that does not exist, another user's job, no Slurm on PATH: a clear refusal, nothing attached."""
    run = Run(standalone=True, ranks_per_node=1)
    r = run.remora("attach", "--slurm", "999999", "-d", "100")
    check(r.returncode == EXIT_NO_TARGET and "Slurm has no job 999999" in r.stderr, "a job that does not exist "
          "is refused (exit 2)", r.stdout + r.stderr)
    # The other user must read the cluster's configuration to ask about the job at all.
    os.chmod(CLUSTER.workdir, 0o755)
    os.chmod(CLUSTER.conf_path, 0o644)
    r = run.remora("attach", "--slurm", run.job.id, "-d", "100", user=NOBODY,
                   env=run.env(REMORA_OUTPUT_PATH=os.path.join(run.dir, "nobody-out")))
    check(r.returncode == EXIT_PERMISSION and "belongs to root" in r.stderr, "another user's job is refused "
          "(exit 3)", r.stdout + r.stderr)
    check(not run.attached_pids(), "nothing was attached")
    r = run.remora("attach", "--slurm", run.job.id + ".batch", "-d", "100")
    check(r.returncode == EXIT_NO_TARGET and r.stdout.count("no task of job %s step batch runs on" % run.job.id) == 2
          and "nothing of job %s.batch was attached" % run.job.id in r.stderr,
          "a step with no task on any node: each node says so, nothing attached (exit 2)", r.stdout + r.stderr)
    env = run.env(PATH="/nonexistent")
    r = run.remora("attach", "--slurm", run.job.id, "-d", "100", env=env)
    check(r.returncode == EXIT_NOT_SUPPORTED and r.stderr.count("\n") == 1 and "srun" in r.stderr,
          "without Slurm: one line and exit 5", r.stderr)
    check(not os.path.exists(run.out) or not os.listdir(run.out), "no job directory was made for a refusal")
    run.finish(expect_ok=False)


def test_python_and_rocprof_attach():
    """remora.attach(slurm_job=...) and rocprof-attach --slurm-job: the same job attach from Python."""
    run = Run(standalone=True, ranks_per_node=1)
    python_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")
    env = run.env(PYTHONPATH=python_dir, REMORA_CLI=ARGS.remora)
    code = ("import remora, sys\n"
            "r = remora.attach(slurm_job=sys.argv[1], attach_duration_msec=800)\n"
            "print('RESULT', r.partial, r.job_dir)\n")
    r = subprocess.run([sys.executable, "-c", code, run.job.id], env=env, cwd=run.dir, capture_output=True,
                       text=True, timeout=STEP * 2)
    m = re.search(r"^RESULT False (\S+)$", r.stdout, re.M)
    check(r.returncode == 0 and m and os.path.exists(os.path.join(m.group(1), "folded.txt")),
          "remora.attach(slurm_job=J) returns the merged profile's directory", r.stdout + r.stderr)
    check_merged_profile(run, m.group(1), rank_map(run))
    r = subprocess.run([sys.executable, "-c", "import remora; remora.attach(slurm_job='999999')"], env=env,
                       cwd=run.dir, capture_output=True, text=True, timeout=STEP)
    check(r.returncode != 0 and "RemoraError" in r.stderr and "Slurm has no job 999999" in r.stderr,
          "a job that does not exist raises RemoraError", r.stdout + r.stderr)
    rocprof = os.path.join(python_dir, "rocprof-attach")
    r = subprocess.run([sys.executable, rocprof, "--slurm-job", run.job.id, "-d", "500"], env=env, cwd=run.dir,
                       capture_output=True, text=True, timeout=STEP * 2)
    check(r.returncode == 0 and "Attached to 2 processes on 2 nodes" in r.stdout,
          "rocprof-attach --slurm-job J attaches the job", r.stdout + r.stderr)
    check(not run.attached_pids(), "nothing stays attached")
    run.finish()


def test_socket_channel_ranks():
    """Ranks that opted in (REMORA_TOOL_ATTACH=1): attached through their socket channel with --channel socket."""
    agent = os.path.join(os.path.dirname(os.path.dirname(ARGS.remora)), "lib", "libremora-agent.so")
    run = Run(standalone=True, ranks_per_node=1, extra_env={"LD_PRELOAD": agent, "REMORA_TOOL_ATTACH": "1"})
    r = run.remora("attach", "--slurm", run.job.id, "--channel", "socket", "-d", "800")
    print(r.stdout + r.stderr)
    check(r.returncode == 0 and r.stdout.count("attached through its socket channel") == 2,
          "both ranks attached through their socket channels", r.stdout + r.stderr)
    check_merged_profile(run, run.job_dir(), rank_map(run))
    check(not run.attached_pids(), "nothing stays attached")
    run.finish()


TESTS = [test_refusals, test_mpi_job_attach_and_merged_profile, test_keep_status_detach_through_the_stream,
         test_stopped_slurmd_and_killed_rank, test_ctrl_c_and_controller_killed, test_python_and_rocprof_attach,
         test_socket_channel_ranks]


def main():
    global ARGS, CLUSTER
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--mpi-ranks", required=True)
    ap.add_argument("tests", nargs="*")
    ARGS = ap.parse_args()
    ARGS.remora = os.path.abspath(ARGS.remora)
    ARGS.mpi_ranks = os.path.abspath(ARGS.mpi_ranks)
    if os.geteuid() != 0:
        print("skipped: needs root (runs the cluster's daemons and remora as another uid)")
        return SKIP
    try:
        CLUSTER = SlurmCluster()
        t0 = time.monotonic()
        CLUSTER.start()
        print("Slurm cluster of n1 and n2 up in %.1f s" % (time.monotonic() - t0), flush=True)
    except Unavailable as e:
        print("skipped: %s" % e)
        return SKIP
    failed = []
    try:
        for t in TESTS:
            if ARGS.tests and t.__name__ not in ARGS.tests:
                continue
            print("== %s: %s" % (t.__name__, t.__doc__), flush=True)
            t0 = time.monotonic()
            try:
                t()
                print("   passed in %.1f s" % (time.monotonic() - t0), flush=True)
            except Exception:
                traceback.print_exc()
                failed.append(t.__name__)
            finally:
                CLUSTER.cancel_all()
    finally:
        CLUSTER.stop()
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
