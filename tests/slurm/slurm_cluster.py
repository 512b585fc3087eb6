#!/usr/bin/env python3
"""A real Slurm cluster of two (or more) nodes on this one machine, started
and stopped by a test. Python 3 standard library only.

    from slurm_cluster import SlurmCluster, Unavailable

    try:
        with SlurmCluster() as cluster:              # start(): nodes idle, or Unavailable
            job = cluster.launch([prog, "--ready-dir", d])   # srun -N2 --ntasks-per-node=2 --mpi=pmi2
            ... job.pids(), cluster.run(["srun", "--jobid", job.id, "--overlap", ...]) ...
            rc, out, err = job.wait(60)
    except Unavailable as e:
        skip(str(e))                                  # no Slurm here, or it would not start

How: one slurmctld and one slurmd per node (Debian's slurmd is built with
multiple-slurmd support: `slurmd -N n1`), each slurmd in a UTS namespace of
its own whose hostname is the node's name, so that `hostname`, a plain
`scontrol listpids` and MPI's idea of which ranks share a node behave as on a
real cluster. AuthType=auth/none and CredType=cred/none: no munge daemon.
Ports are picked free at start, so a Slurm already running here, or another
test's cluster, is not disturbed. Everything lives in one fresh directory.

Cleanup, on every exit path: each daemon and each srun is in a session of its
own; stop() (also on `with` exit, at exit and on SIGTERM/SIGHUP) cancels the
jobs, waits for an empty queue, stops the slurmds, then slurmctld, each with a
deadline, then kills whatever is left. What is left is found by a marker in
the environment (REMORA_SLURM_CLUSTER=<token>) that every daemon, slurmstepd,
srun, task and client command started through env() inherits. A guardian
process (this file run with --guard) holds a pipe from the test: if the test
dies without stop(), killed by a ctest timeout say, the pipe closes and the
guardian kills everything bearing the marker and removes the directory.

REMORA_KEEP_SLURM=1 keeps the directory (config, logs, job output) after
stop() and says where it is.

Thread use: one thread drives a cluster; start() from the main thread also
installs the SIGTERM/SIGHUP handlers (where those signals are not handled
already).
"""
import atexit
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["SlurmCluster", "Job", "Unavailable"]

MARKER_VAR = "REMORA_SLURM_CLUSTER"
KEEP_VAR = "REMORA_KEEP_SLURM"
# Variables that would make srun/squeue/sinfo act on another job or print in
# another format, or make an MPI library think it was launched by someone else.
_FOREIGN_PREFIXES = ("SLURM_", "SRUN_", "SALLOC_", "SBATCH_", "SQUEUE_", "SINFO_", "SACCT_", "SCANCEL_",
                     "SCONTROL_", "PMI_", "PMIX_", "OMPI_", MARKER_VAR)
_CLIENTS = ("srun", "squeue", "sinfo", "scontrol", "scancel")
_DAEMONS = ("slurmctld", "slurmd")
_SBIN_PATH = ":/usr/sbin:/sbin:/usr/local/sbin"
# A unix socket per job step goes into each node's spool directory; sun_path
# holds 107 bytes, and the socket's name adds about 30 to the directory.
_MAX_WORKDIR_LEN = 70
# What a cluster keeps in its workdir (besides slurm.conf): emptied at start.
_WORKDIR_SUBDIRS = ("state", "spool", "tmp", "log", "jobs")


class Unavailable(Exception):
    """Slurm is not installed here, or the cluster would not start. The
    message's first line says which, and what to do; when daemons ran, the
    tails of their logs follow on the next lines."""


# ---- small helpers ------------------------------------------------------------


def _poll(condition, timeout, interval=0.05):
    """Calls condition() until it returns something true, or timeout seconds
    pass; returns that value, or None at the deadline."""
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            return None
        time.sleep(interval)


def _tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _free_ports(count):
    """count distinct TCP ports free right now on every address. All are held
    open together, so none is picked twice; a daemon started a moment later
    could still lose the race to another program, which start() retries."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _reap(proc, timeout):
    """Waits for proc; True when it has exited."""
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _end_groups(procs, grace):
    """SIGTERM to each proc's session (its own: start_new_session), SIGKILL to
    those still there after grace seconds, then reaps them. All at once, so
    that n sruns stuck on a dead node cost one grace, not n. A stopped
    process gets SIGCONT first, or it would never act on the SIGTERM."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            _signal_group(p.pid, sig)
    end = time.monotonic() + grace
    for p in procs:
        if not _reap(p, max(0.0, end - time.monotonic())):
            _signal_group(p.pid, signal.SIGKILL)
            _reap(p, 5)
        # Children it left in its group (a task's own children, say).
        _signal_group(p.pid, signal.SIGKILL)


def _marked_pids(token):
    """Processes whose initial environment holds MARKER_VAR=token: everything
    this cluster started, including slurmstepd and tasks, which are in
    sessions of their own that no process group kill reaches."""
    needle = ("%s=%s" % (MARKER_VAR, token)).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone, or not ours to read
            pass
    return pids


def _kill_marked(token, timeout=5.0):
    """SIGKILLs every marked process until none is left (a dying slurmstepd may
    still fork); returns the pids that were killed."""
    killed = set()

    def sweep():
        pids = _marked_pids(token)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        return not pids

    _poll(sweep, timeout, interval=0.1)
    return sorted(killed)


# ---- the guardian --------------------------------------------------------------


def _guard_main(token, workdir, remove):
    """Run as a process of its own (--guard): waits for EOF on stdin. "done"
    before EOF means stop() did its job; anything else means the test died
    without stop(), and the guardian cleans up after it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    said = sys.stdin.buffer.read()
    if b"done" in said:
        return 0
    killed = _kill_marked(token, timeout=10)
    if remove == "1" and not os.environ.get(KEEP_VAR):
        shutil.rmtree(workdir, ignore_errors=True)
    print("slurm_cluster guardian: the test ended without stop(); killed %d processes of the cluster in %s"
          % (len(killed), workdir), file=sys.stderr)
    return 0


# ---- the process-wide registry: atexit and signals -----------------------------

_live = []  # clusters started and not yet stopped
_pending_signal = []  # a SIGTERM that came while a stop() was running
_stopping_depth = [0]


def _stop_all():
    for cluster in list(_live):
        cluster.stop()


def _on_signal(signum, frame):
    if _stopping_depth[0]:
        # stop() is running: let it finish; it raises SystemExit itself.
        _pending_signal.append(signum)
        return
    _stop_all()
    raise SystemExit(128 + signum)


def _install_signal_handlers():
    """SIGTERM and SIGHUP would end the test without any cleanup: turn them
    into stop() plus SystemExit, but only where nobody handles them already."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _on_signal)


atexit.register(_stop_all)


# ---- jobs -----------------------------------------------------------------------


class Job:
    """One srun started by SlurmCluster.launch(), running in the background.

    id: the Slurm job id (str); name: its job name; proc: the srun Popen (in a
    session of its own); stdout_path/stderr_path: srun's output files."""

    def __init__(self, cluster, name, proc, stdout_path, stderr_path):
        self.cluster = cluster
        self.name = name
        self.proc = proc
        self.stdout_path = stdout_path
        self.stderr_path = stderr_path
        self.id = None

    def __repr__(self):
        return "Job(id=%s, name=%s, srun pid=%d)" % (self.id, self.name, self.proc.pid)

    def wait(self, timeout):
        """Waits for srun to exit: (returncode, stdout, stderr), the whole
        output as text. Raises subprocess.TimeoutExpired after timeout seconds
        (the job still runs: kill() it)."""
        self.proc.wait(timeout=timeout)
        return self.proc.returncode, self.stdout(), self.stderr()

    def stdout(self):
        with open(self.stdout_path, errors="replace") as f:
            return f.read()

    def stderr(self):
        with open(self.stderr_path, errors="replace") as f:
            return f.read()

    def state(self):
        """The job's state in squeue (RUNNING, COMPLETING, ...), or "" once it
        has left the queue."""
        r = self.cluster.run(["squeue", "-h", "-j", self.id, "-o", "%T"], timeout=15)
        return r.stdout.strip() if r.returncode == 0 else ""

    def pids(self, tasks_only=True, nodes=None, timeout=15):
        """The job's processes as `scontrol listpids JOB NODE` shows them on each
        node (default: every node of the cluster): dicts {node, pid, job, step,
        local_id, global_id}; local_id and global_id are ints, or None for a
        process that is not a task (then left out when tasks_only). listpids
        asks each slurmstepd on the node, not slurmd: a dead slurmd does not
        matter, a stopped slurmstepd makes it hang, and this raises
        subprocess.TimeoutExpired after timeout seconds per node."""
        found = []
        for node in nodes or self.cluster.nodes:
            r = self.cluster.run(["scontrol", "listpids", self.id, node], timeout=timeout)
            found.extend(_parse_listpids(node, r.stdout))
        return [p for p in found if p["local_id"] is not None or not tasks_only]

    def wait_pids(self, count, timeout=30):
        """Polls pids() until it lists count tasks: launch() returns when the
        job is RUNNING, which can be before the slurmds have started the
        tasks. Returns the list; raises TimeoutError at the deadline."""
        def enough():
            tasks = self.pids()
            return tasks if len(tasks) >= count else None

        found = _poll(enough, timeout)
        if not found:
            raise TimeoutError("job %s: %d tasks expected within %s s, listpids shows %s"
                               % (self.id, count, timeout, self.pids()))
        return found

    def kill(self, grace=5.0):
        """scancel, then the srun's session: SIGTERM, SIGKILL after grace s."""
        if self.id:
            self.cluster.run(["scancel", self.id], timeout=15)
        _end_groups([self.proc], grace)


def _parse_listpids(node, text):
    """`scontrol listpids` prints a header, then PID JOBID STEPID LOCALID
    GLOBALID, with '-' in LOCALID and GLOBALID for a process that is not a
    task (slurmstepd's helpers, a task's own children)."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 5 or not fields[0].isdigit():
            continue
        as_int = lambda s: int(s) if s.isdigit() else None
        rows.append({"node": node, "pid": int(fields[0]), "job": fields[1], "step": fields[2],
                     "local_id": as_int(fields[3]), "global_id": as_int(fields[4])})
    return rows


# ---- the cluster -------------------------------------------------------------------


@dataclasses.dataclass
class _Daemon:
    name: str  # "slurmctld" or the node's name
    argv: list
    out_path: str  # its stdout and stderr (the real log is in SlurmctldLogFile/SlurmdLogFile)
    log_path: str
    proc: subprocess.Popen = None


class SlurmCluster:
    """A Slurm cluster on this machine; a context manager (start()/stop()).

    nodes: the node names (each slurmd's hostname in its UTS namespace);
    cpus: CPUs per node as Slurm sees them (not bound to real cores);
    workdir: where config, state, spool, logs and job output go (default: a
    fresh temporary directory, removed by stop()).

    Attributes after start(): workdir, conf_path, nodes, partition, ports
    ({"slurmctld": port, node: port, ...}), token (the environment marker)."""

    def __init__(self, nodes=("n1", "n2"), cpus=2, workdir=None):
        self.nodes = tuple(nodes)
        self.cpus = cpus
        self.workdir = workdir
        self.conf_path = None
        self.partition = "remora"
        self.ports = {}
        self.token = secrets.token_hex(8)
        self._own_workdir = workdir is None
        self._daemons = {}
        self._jobs = []
        self._guardian = None
        self._state = "new"  # new, running, stopping, stopped

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    # ---- start ----

    def start(self, deadline=60):
        """Writes the config, starts slurmctld and the slurmds, and waits until
        every node is idle, all within deadline seconds. Returns self. Raises
        Unavailable (after cleaning up) when Slurm is missing or will not start;
        the message ends with the daemons' log tails."""
        if self._state != "new":
            raise RuntimeError("SlurmCluster.start(): already %s; make a new SlurmCluster" % self._state)
        self._check_installed()
        end = time.monotonic() + deadline
        self._state = "running"
        _live.append(self)
        _install_signal_handlers()
        try:
            self._make_workdir()
            self._start_guardian()
            # Ports are free when picked, but another program may take one
            # before the daemon binds it: one more try with fresh ports.
            for attempt in (1, 2):
                try:
                    self._start_daemons(end)
                    return self
                except Unavailable as e:
                    if attempt == 2 or "in use" not in str(e):
                        raise
                    self._stop_daemons()
        except BaseException:
            self.stop()
            raise

    def _check_installed(self):
        path = os.environ.get("PATH", "") + _SBIN_PATH
        missing = [n for n in _DAEMONS + _CLIENTS + ("unshare", "hostname") if not shutil.which(n, path=path)]
        if missing:
            raise Unavailable("%s not found: apt-get install slurm-wlm (slurmctld, slurmd, slurm-client)"
                              % ", ".join(missing))
        if os.geteuid() != 0:
            raise Unavailable("the Slurm test cluster needs root (slurmd, and unshare --uts for node hostnames)")

    def _make_workdir(self):
        if self._own_workdir:
            self.workdir = tempfile.mkdtemp(prefix="remora-slurm-")
        self.workdir = os.path.abspath(self.workdir)
        if len(self.workdir) > _MAX_WORKDIR_LEN:
            raise Unavailable("workdir %s is too long for Slurm's step sockets (at most %d characters)"
                              % (self.workdir, _MAX_WORKDIR_LEN))
        # A workdir used before holds the last cluster's state (slurmctld
        # refuses another ClusterName's), sockets and logs: start afresh.
        for sub in _WORKDIR_SUBDIRS:
            shutil.rmtree(os.path.join(self.workdir, sub), ignore_errors=True)
        for sub in _WORKDIR_SUBDIRS:
            os.makedirs(os.path.join(self.workdir, sub))
        for sub in ("spool", "tmp"):
            for node in self.nodes:
                os.mkdir(os.path.join(self.workdir, sub, node))

    def _start_guardian(self):
        self._guardian = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--guard", self.token, self.workdir,
             "1" if self._own_workdir else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True, env=self._base_env())

    def _start_daemons(self, end):
        ports = _free_ports(1 + len(self.nodes))
        self.ports = dict(zip(("slurmctld",) + self.nodes, ports))
        self.conf_path = os.path.join(self.workdir, "slurm.conf")
        with open(self.conf_path, "w") as f:
            f.write(self._config())
        self._spawn(self._ctld_daemon())
        for node in self.nodes:
            self._spawn(self._slurmd_daemon(node))
        self._wait_idle(end)

    def _config(self):
        d = self.workdir
        lines = [
            "# Written by tests/slurm/slurm_cluster.py: a test cluster on one machine.",
            "ClusterName=remora%s" % self.token[:6],
            "SlurmctldHost=localhost",
            "SlurmctldPort=%d" % self.ports["slurmctld"],
            "SlurmdPort=%d" % self.ports[self.nodes[0]],
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/none",
            "CredType=cred/none",
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool/%%n" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd.%%n.pid" % d,
            "SlurmctldLogFile=%s/log/slurmctld.log" % d,
            "SlurmdLogFile=%s/log/slurmd.%%n.log" % d,
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # pmix keeps its per-job files here; a shared /tmp would mix nodes.
            "TmpFS=%s/tmp/%%n" % d,
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SwitchType=switch/none",
            # A dead slurmd makes srun fail after MessageTimeout, not minutes.
            "MessageTimeout=5",
            # scancel's SIGTERM-to-SIGKILL delay (default 30 s): teardown speed.
            "KillWait=2",
            "InactiveLimit=0",
            "ReturnToService=2",
            # Trust the node lines below, not the hardware: cpus=4 on a 2-core
            # machine must not drain the node.
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
        ]
        for node in self.nodes:
            lines.append("NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=%d RealMemory=1000 State=UNKNOWN"
                         % (node, node, self.ports[node], self.cpus))
        lines.append("PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
                     % (self.partition, ",".join(self.nodes)))
        return "\n".join(lines) + "\n"

    def _ctld_daemon(self):
        which = shutil.which("slurmctld", path=os.environ.get("PATH", "") + _SBIN_PATH)
        return _Daemon("slurmctld", [which, "-D", "-c", "-i"], os.path.join(self.workdir, "log", "slurmctld.out"),
                       os.path.join(self.workdir, "log", "slurmctld.log"))

    def _slurmd_daemon(self, node):
        which = shutil.which("slurmd", path=os.environ.get("PATH", "") + _SBIN_PATH)
        # unshare and sh both exec: the Popen's pid is slurmd's own.
        argv = ["unshare", "--uts", "--", "/bin/sh", "-c", 'hostname "$1" && exec "$2" -D -N "$1"', "sh", node, which]
        return _Daemon(node, argv, os.path.join(self.workdir, "log", "slurmd.%s.out" % node),
                       os.path.join(self.workdir, "log", "slurmd.%s.log" % node))

    def _spawn(self, daemon):
        with open(daemon.out_path, "ab") as out:
            daemon.proc = subprocess.Popen(daemon.argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        self._daemons[daemon.name] = daemon

    def _wait_idle(self, end):
        def ready():
            self._check_daemons_alive()
            return all(s == "idle" for s in self.node_states().values())

        if not _poll(ready, max(0.0, end - time.monotonic()), interval=0.1):
            raise Unavailable("the Slurm test cluster did not come up (nodes: %s)%s"
                              % (self.node_states(), self._log_tails()))

    def _check_daemons_alive(self):
        for d in self._daemons.values():
            if d.proc.poll() is not None:
                raise Unavailable("%s exited with status %s while the cluster started%s"
                                  % (d.name, d.proc.returncode, self._log_tails()))

    def _log_tails(self):
        """The last lines of each daemon's log file, or of its stderr when it
        died before opening the log (a bad config, a port in use)."""
        parts = []
        for d in self._daemons.values():
            path = d.log_path if os.path.exists(d.log_path) else d.out_path
            text = _tail(path, 6).strip()
            if text:
                parts.append("--- %s\n%s" % (path, text))
        return ("; logs follow\n" + "\n".join(parts)) if parts else ""

    # ---- environment and client commands ----

    def _base_env(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_PREFIXES)}
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + _SBIN_PATH
        return env

    def env(self):
        """A copy of os.environ for Slurm commands on this cluster: SLURM_CONF
        set, the cluster's marker set (stop() kills what carries it), and every
        inherited SLURM_*, SRUN_*, SQUEUE_*, PMI_*, OMPI_* ... variable removed,
        which could point srun at another job or change squeue's output."""
        env = self._base_env()
        env["SLURM_CONF"] = self.conf_path or ""
        env[MARKER_VAR] = self.token
        return env

    def run(self, argv, timeout=30, check=False, extra_env=None):
        """Runs a client command (scontrol, squeue, srun ...) against this
        cluster with env(): CompletedProcess with text stdout/stderr. Raises
        subprocess.TimeoutExpired after timeout seconds (the command is then
        killed, with its process group), CalledProcessError when check and it
        failed."""
        env = self.env()
        env.update(extra_env or {})
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def node_states(self):
        """{node: state} from sinfo ("idle", "allocated", "mixed", "down*", ...;
        a trailing '*' means the slurmd does not respond); {} when slurmctld
        does not answer."""
        try:
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        states = {}
        for line in r.stdout.splitlines():
            fields = line.split()
            if len(fields) == 2:
                states[fields[0]] = fields[1]
        return states

    # ---- jobs ----

    def launch(self, argv, nodes=2, ntasks_per_node=2, mpi="pmi2", name=None, extra_env=None,
               kill_on_bad_exit=True, srun_args=(), deadline=30):
        """Starts `srun -N nodes --ntasks-per-node=N [--mpi=MPI] -J name -K1|-K0
        [srun_args] argv` in the background (a session of its own; stdout and
        stderr to files in workdir/jobs) and waits, up to deadline seconds,
        until the job has an id and is RUNNING. mpi=None: no --mpi option
        (MpiDefault=none). Returns a Job; raises RuntimeError with srun's
        output when the job does not get there (the srun is then killed)."""
        name = name or "remora-%s" % secrets.token_hex(4)
        base = os.path.join(self.workdir, "jobs", name)
        # --oversubscribe: an allocation orphaned by an srun that a test
        # killed (InactiveLimit=0 keeps it forever) must not hold up this job.
        cmd = ["srun", "-N", str(nodes), "--ntasks-per-node=%d" % ntasks_per_node, "-J", name,
               "-K1" if kill_on_bad_exit else "-K0", "--oversubscribe"]
        if mpi:
            cmd.append("--mpi=%s" % mpi)
        cmd += list(srun_args) + ["--"] + list(argv)
        env = self.env()
        env.update(extra_env or {})
        with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
        job = Job(self, name, proc, base + ".out", base + ".err")
        self._jobs.append(job)
        self._wait_running(job, deadline)
        return job

    def _wait_running(self, job, deadline):
        def running():
            if job.proc.poll() is not None:
                return "exited"
            r = self.run(["squeue", "-h", "-n", job.name, "-o", "%i %T"], timeout=10)
            # The newest job of that name, should a name be used twice.
            rows = sorted((int(f[0]), f[1]) for f in map(str.split, r.stdout.splitlines()) if len(f) == 2)
            if rows:
                job.id = str(rows[-1][0])
                return rows[-1][1] == "RUNNING" and "running"
            return None

        outcome = _poll(running, deadline)
        if outcome != "running":
            job.kill()
            raise RuntimeError("srun %s did not start (%s; job id %s) within %s s: %s" % (
                job.name, outcome or "deadline passed", job.id, deadline, _tail(job.stderr_path, 10).strip()))

    # ---- faults ----

    def slurmd_pid(self, node):
        """The pid of node's slurmd (the same process in every namespace
        that matters here: no pid namespace is used)."""
        return self._daemons[node].proc.pid

    def stop_slurmd(self, node):
        """SIGSTOP to node's slurmd: it accepts connections but never answers,
        the way a hung node does: a new srun step there (--overlap included)
        waits forever. Steps already running, and listpids, go on."""
        os.kill(self.slurmd_pid(node), signal.SIGSTOP)

    def cont_slurmd(self, node):
        os.kill(self.slurmd_pid(node), signal.SIGCONT)

    def kill_slurmd(self, node):
        """SIGKILL to node's slurmd, reaped. Its slurmstepds and tasks live on
        (as on a real node); srun to that node fails after about MessageTimeout."""
        proc = self._daemons[node].proc
        proc.kill()
        _reap(proc, 10)

    def restart_slurmd(self, node, deadline=30):
        """Kills node's slurmd if it runs, starts a new one, and waits until it
        has registered with slurmctld and the node is no longer not-responding.
        Raises Unavailable with the logs when it does not."""
        old = self._daemons[node]
        if old.proc.poll() is None:
            self.kill_slurmd(node)
        log_offset = os.path.getsize(old.log_path) if os.path.exists(old.log_path) else 0
        self._spawn(self._slurmd_daemon(node))

        def registered():
            self._check_daemons_alive()
            with open(old.log_path, errors="replace") as f:
                f.seek(log_offset)
                started = "started on" in f.read()
            state = self.node_states().get(node, "")
            return started and state and not state.endswith("*") and "down" not in state

        if not _poll(registered, deadline, interval=0.1):
            raise Unavailable("slurmd of %s did not come back (state %s)%s"
                              % (node, self.node_states().get(node), self._log_tails()))

    # ---- stop ----

    def stop(self, deadline=30):
        """Tears everything down: scancel, an empty queue, slurmds, slurmctld,
        then whatever still carries the marker; removes the temporary workdir
        (kept when REMORA_KEEP_SLURM is set, saying where). Idempotent, and
        safe from a signal handler or atexit. Each step has its own deadline
        within `deadline` seconds; a step that misses it is passed over and
        the final kill takes care of what it left."""
        if self._state in ("new", "stopping", "stopped"):
            return
        self._state = "stopping"
        _stopping_depth[0] += 1
        try:
            self._teardown(time.monotonic() + deadline)
        finally:
            _stopping_depth[0] -= 1
            self._state = "stopped"
            if self in _live:
                _live.remove(self)
        if _pending_signal and not _stopping_depth[0] and threading.current_thread() is threading.main_thread():
            raise SystemExit(128 + _pending_signal.pop())

    def _teardown(self, end):
        left = lambda: max(0.5, end - time.monotonic())
        for d in self._daemons.values():  # a stopped slurmd would hold up scancel forever
            if d.proc and d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
        if self._ctld_alive() and self.conf_path:
            # A job with tasks on a dead slurmd's node stays COMPLETING until
            # SlurmdTimeout: do not wait long for it, the final kill ends it.
            any_dead = any(d.proc.poll() is not None for n, d in self._daemons.items() if n != "slurmctld")
            self.cancel_all(min(left(), 3 if any_dead else 15))
        _end_groups([job.proc for job in self._jobs], min(left(), 3))
        self._stop_daemons(grace=min(left(), 5))
        killed = _kill_marked(self.token, timeout=min(left(), 5))
        if killed:
            print("slurm_cluster: killed %d leftover processes: %s" % (len(killed), killed), file=sys.stderr)
        self._dismiss_guardian()
        self._remove_workdir()

    def _ctld_alive(self):
        d = self._daemons.get("slurmctld")
        return d is not None and d.proc.poll() is None

    def cancel_all(self, timeout=15):
        """scancel every job of the cluster, then waits up to timeout seconds
        for squeue to be empty; True when it is. A job on a dead slurmd's node
        stays COMPLETING (stop()'s final kill ends its processes)."""
        end = time.monotonic() + timeout
        try:
            self.run(["scancel", "-p", self.partition], timeout=min(10, timeout))
            return bool(_poll(lambda: self.run(["squeue", "-h", "-o", "%i"], timeout=5).stdout.strip() == "",
                              max(0.0, end - time.monotonic()), interval=0.1))
        except subprocess.TimeoutExpired:
            return False

    def _stop_daemons(self, grace=5.0):
        """slurmds first (they report to slurmctld as they go), slurmctld last."""
        slurmds = [self._daemons.pop(n) for n in self.nodes if n in self._daemons]
        _end_groups([d.proc for d in slurmds], grace)
        ctld = self._daemons.pop("slurmctld", None)
        _end_groups([ctld.proc] if ctld else [], grace)

    def _dismiss_guardian(self):
        if self._guardian is None:
            return
        try:
            self._guardian.stdin.write(b"done\n")
            self._guardian.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        if not _reap(self._guardian, 5):
            self._guardian.kill()
            _reap(self._guardian, 5)
        self._guardian = None

    def _remove_workdir(self):
        if not self.workdir or not self._own_workdir:
            return
        if os.environ.get(KEEP_VAR):
            print("slurm_cluster: %s is set: the cluster's files are kept in %s" % (KEEP_VAR, self.workdir),
                  file=sys.stderr)
            return
        shutil.rmtree(self.workdir, ignore_errors=True)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--guard":
    sys.exit(_guard_main(*sys.argv[2:]))
