#!/usr/bin/env python3
"""A smoke test of the Slurm test fixture itself (slurm_cluster.py and
remora_mpi_ranks), run by hand; not a ctest entry. Each run:

1. starts a two-node cluster;
2. MPI mode: launches remora_mpi_ranks with 2 ranks per node (srun
   --mpi=pmi2), waits for the 4 ready files; job.pids() shows 2 tasks on
   each node, each task's /proc/PID/environ names its rank, node and local
   id, and each ready file holds the pid listpids gave for that rank;
   `srun --jobid=J --overlap -N1 -n1 -w n2 hostname` prints n2; then the stop
   file ends the job with exit 0 and exactly the line "mpi_ranks: ok ...";
3. standalone mode (no MPI, srun -K0): one rank is SIGKILLed, the other three
   still finish and say ok after the stop file;
4. with --faults: a SIGSTOPped slurmd makes srun to its node hang, a killed
   one makes it fail after about MessageTimeout, a restarted one serves again;
5. stops the cluster: no process of it is left, its directory is gone.

It prints the cluster's start time, each job's time to ready, the overlap
srun's time and the teardown time.

  python3 tests/slurm/fixture_smoke.py --program build/bin/remora_mpi_ranks [--runs 3] [--load 2] [--faults]

--load N runs N busy loops (`yes > /dev/null`) for the whole run, to see the
fixture hold up on a loaded machine. Exit status 0 when every check held, 1
otherwise, 77 when the cluster cannot start here (the reason printed).
"""
import argparse
import glob
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import SlurmCluster, Unavailable, _marked_pids  # noqa: E402

OK_MPI = re.compile(r"^mpi_ranks: ok ranks=4 iterations=\d+ checksum=[0-9a-f]{16}$")
OK_STANDALONE = re.compile(r"^mpi_ranks: ok rank=(\d+) ranks=4 iterations=\d+ checksum=[0-9a-f]{16}$")
SKIP = 77


class Failure(Exception):
    pass


def check(cond, what):
    """`what` may be a callable, called only on failure."""
    if not cond:
        raise Failure(what() if callable(what) else what)


def wait_for(condition, timeout, what):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise Failure("timed out after %s s waiting for %s" % (timeout, what))
        time.sleep(0.02)


def proc_environ(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        pairs = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


class Timer:
    def __init__(self):
        self.start = time.monotonic()

    def __call__(self):
        return time.monotonic() - self.start


def launch_until_ready(cluster, program, tag, standalone, timeout=60):
    """Launches the 4 ranks and waits for their ready files: (job, dir, seconds)."""
    d = os.path.join(cluster.workdir, tag)
    os.mkdir(d)
    argv = [program, "--ready-dir", d, "--stop-file", os.path.join(d, "stop"), "--max-seconds", "120"]
    t = Timer()
    if standalone:
        job = cluster.launch(argv + ["--standalone"], mpi=None, kill_on_bad_exit=False, name="smoke-" + tag)
    else:
        job = cluster.launch(argv, name="smoke-" + tag)
    wait_for(lambda: len(glob.glob(os.path.join(d, "ready.*"))) == 4 or job.proc.poll() is not None, timeout,
             "4 ready files in " + d)
    check(job.proc.poll() is None, lambda: "srun exited before all ranks were ready: %s" % (job.wait(1),))
    return job, d, t()


def check_tasks(cluster, job, ready_dir):
    """2 tasks per node, each with its Slurm identity in its environment and
    its pid in its ready file."""
    tasks = job.wait_pids(4, timeout=10)
    per_node = {n: sorted(p["local_id"] for p in tasks if p["node"] == n) for n in cluster.nodes}
    check(per_node == {"n1": [0, 1], "n2": [0, 1]}, "listpids tasks per node: %s" % tasks)
    for p in tasks:
        env = proc_environ(p["pid"])
        want = {"SLURM_PROCID": str(p["global_id"]), "SLURMD_NODENAME": p["node"], "SLURM_LOCALID": str(p["local_id"])}
        got = {k: env.get(k) for k in want}
        check(got == want, "pid %d: environment %s, expected %s" % (p["pid"], got, want))
        with open(os.path.join(ready_dir, "ready.%d" % p["global_id"])) as f:
            check(int(f.read()) == p["pid"], "ready.%d does not hold pid %d" % (p["global_id"], p["pid"]))
    return tasks


def overlap_hostname(cluster, job):
    t = Timer()
    r = cluster.run(["srun", "--jobid=%s" % job.id, "--overlap", "-N1", "-n1", "-w", "n2", "hostname"], timeout=30)
    took = t()
    check(r.returncode == 0 and r.stdout.strip() == "n2",
          "srun --overlap -w n2 hostname: status %d, stdout %r, stderr %r" % (r.returncode, r.stdout, r.stderr))
    return took


def mpi_job(cluster, program, times):
    job, d, times["mpi ready"] = launch_until_ready(cluster, program, "mpi", standalone=False)
    check_tasks(cluster, job, d)
    times["srun --overlap n2"] = overlap_hostname(cluster, job)
    open(os.path.join(d, "stop"), "w").close()
    rc, out, err = job.wait(60)
    check(rc == 0, "MPI job exited %d; stdout %r; stderr %r" % (rc, out, err))
    check(OK_MPI.match(out.rstrip("\n")) and out.count("\n") == 1, "MPI job's stdout: %r" % out)


def standalone_job(cluster, program, times):
    job, d, times["standalone ready"] = launch_until_ready(cluster, program, "standalone", standalone=True)
    tasks = check_tasks(cluster, job, d)
    victim = next(p for p in tasks if p["global_id"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(lambda: victim["pid"] not in [p["pid"] for p in job.pids()], 10, "rank 1 to be gone")
    check(job.proc.poll() is None, "srun -K0 ended when one rank was killed")
    check(len(job.pids()) == 3, "3 ranks left after the kill: %s" % job.pids())
    open(os.path.join(d, "stop"), "w").close()
    rc, out, err = job.wait(60)
    ranks = sorted(int(m.group(1)) for m in map(OK_STANDALONE.match, out.splitlines()) if m)
    check(ranks == [0, 2, 3] and len(out.splitlines()) == 3,
          "standalone job (status %d): stdout %r, stderr %r" % (rc, out, err))


def faults(cluster, times):
    """The behaviours the attach --slurm code has to live with."""
    srun_n2 = ["srun", "-N1", "-n1", "-w", "n2", "hostname"]
    cluster.stop_slurmd("n2")
    t = Timer()
    try:
        r = cluster.run(srun_n2, timeout=8)
        raise Failure("srun to a stopped slurmd returned %d after %.1f s: %r" % (r.returncode, t(), r.stderr))
    except subprocess.TimeoutExpired:
        times["srun to a stopped slurmd: still hanging after"] = t()
    cluster.cont_slurmd("n2")
    cluster.kill_slurmd("n2")
    t = Timer()
    r = cluster.run(srun_n2, timeout=60)
    times["srun to a killed slurmd: fails after"] = t()
    check(r.returncode != 0, "srun to a killed slurmd succeeded: %r" % r.stdout)
    t = Timer()
    cluster.restart_slurmd("n2")
    times["slurmd restart"] = t()
    # The node may still be completing the failed job; srun waits for it.
    r = cluster.run(srun_n2, timeout=60)
    check(r.returncode == 0 and r.stdout.strip() == "n2", "srun after restart: %d %r %r" % (r.returncode, r.stdout, r.stderr))


def one_run(program, with_faults):
    times = {}
    t = Timer()
    cluster = SlurmCluster()
    try:
        cluster.start()
        times["cluster start"] = t()
        mpi_job(cluster, program, times)
        standalone_job(cluster, program, times)
        if with_faults:
            faults(cluster, times)
    finally:
        t = Timer()
        cluster.stop()
        times["teardown"] = t()
    check(not _marked_pids(cluster.token), "processes left after stop(): %s" % _marked_pids(cluster.token))
    check(os.environ.get("REMORA_KEEP_SLURM") or not os.path.exists(cluster.workdir),
          "%s still exists after stop()" % cluster.workdir)
    return times


def start_load(count):
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True) for _ in range(count)]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default=os.path.join(here, "..", "..", "build", "bin", "remora_mpi_ranks"))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--load", type=int, default=0, help="busy processes to run meanwhile")
    ap.add_argument("--faults", action="store_true", help="also stop, kill and restart a slurmd")
    args = ap.parse_args()
    program = os.path.abspath(args.program)
    if not os.access(program, os.X_OK):
        print("fixture_smoke: %s missing: cmake --build build --target remora_mpi_ranks" % program)
        return 1
    load = start_load(args.load)
    try:
        for run in range(1, args.runs + 1):
            times = one_run(program, args.faults)
            print("run %d/%d ok (load %d): %s" % (run, args.runs, args.load,
                                                  ", ".join("%s %.2f s" % kv for kv in times.items())), flush=True)
    except Unavailable as e:
        print("fixture_smoke: skipped: %s" % e)
        return SKIP
    except Failure as e:
        print("fixture_smoke: FAILED: %s" % e)
        return 1
    finally:
        for p in load:
            p.kill()
            p.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
