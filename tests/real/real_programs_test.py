#!/usr/bin/env python3
"""The default tool on real programs from Debian's packages (issue 11, "Real
programs"): redis-server under redis-benchmark, nginx (a master and two
workers) and servers of our own in python3, node and a JVM under a pool of
HTTP clients. While the load runs, 3 cycles of `remora attach -p PID -d 1000`
(nginx: its master, the tree); then, with the load stopped:

- the load client saw no error (redis-benchmark exited 0 each run and printed
  its rates; every HTTP answer was a 200 with the right computed body);
- the program is alive and still answers correctly (nginx: the same workers,
  none crashed and respawned);
- remora exited 0 each cycle;
- the last cycle's rendered profile (folded.txt) names the program's real hot
  functions (redis: its command path; nginx: ngx_*; python3: the eval loop;
  node and the JVM: the JIT-compiled functions of our server, named from
  their perf maps).

One program per run (--program); exits 77, the reason printed, when that
program is not installed. Every process it starts is in its own process group
and killed on every exit path.

  real_programs_test.py --program redis --remora build/bin/remora \
      --src tests/real/servers --work build/tests/real
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
import threading
import time
import urllib.request

CYCLES = 3
SESSION_MS = 1000
# The environment the program under test starts with (--channel socket).
OPT_IN_ENV = {}
SKIP = 77


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, what, detail=""):
    """`detail` may be a callable, called only on failure."""
    if not cond:
        detail = detail() if callable(detail) else detail
        raise Failure(what + ("\n" + detail if detail else ""))


def need(*names, package):
    paths = [shutil.which(n, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") for n in names]
    if not all(paths):
        missing = [n for n, p in zip(names, paths) if not p]
        raise Skip("%s not installed (Debian: %s)" % (", ".join(missing), package))
    return paths


def expected_sum(n):
    return sum(k * k % 1000003 for k in range(n))


def die_with_this_test(sig):
    """For the child before exec: a signal when the test dies, even killed
    (ctest's timeout), since then no finally runs (PR_SET_PDEATHSIG)."""
    return lambda: ctypes.CDLL(None).prctl(1, sig)


class Programs:
    """The processes a case started: each is a process-group leader, and
    every group is killed (SIGKILL) when the case ends, however it ends."""

    def __init__(self, tmp):
        self.tmp, self.procs = tmp, []

    def start(self, name, argv, cwd=None, death_signal=signal.SIGKILL, user=None):
        """user: run as this user (and its group), for programs that refuse
        root (bench/soak_real.py's PostgreSQL); the death signal is set after
        the switch, which would clear it."""
        # stderr into a file: a pipe nobody reads could fill and block it.
        err = open(os.path.join(self.tmp, name + ".stderr"), "w+b")
        # --channel socket: the program under test (each case starts it
        # first) opts in at launch; its load clients do not.
        env = dict(os.environ, **OPT_IN_ENV) if OPT_IN_ENV and not self.procs else None
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, cwd=cwd,
                             start_new_session=True, preexec_fn=die_with_this_test(death_signal), env=env,
                             user=user, group=user and pwd.getpwnam(user).pw_gid, extra_groups=user and [])
        p.err_file = err
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                print("warn  pid %d did not die within 30 s of SIGKILL" % p.pid)
            p.stdout.close()
            p.err_file.close()


def stderr_tail(p):
    p.err_file.seek(0)
    return "exit status %s, stderr:\n%s" % (p.poll(), p.err_file.read().decode(errors="replace")[-3000:])


def read_ready(p, deadline_s, what):
    """The target's "ready PORT" line on its stdout, within a deadline."""
    end = time.monotonic() + deadline_s
    buf = b""
    while not buf.endswith(b"\n"):
        left = end - time.monotonic()
        check(left > 0, "%s says ready within %d s" % (what, deadline_s), lambda: "got %r; %s" % (buf, stderr_tail(p)))
        r, _, _ = select.select([p.stdout], [], [], left)
        if r:
            c = os.read(p.stdout.fileno(), 1)
            check(c != b"", "%s says ready" % what, lambda: "it closed its output; " + stderr_tail(p))
            buf += c
    m = re.fullmatch(r"ready (\d+)", buf.decode().strip())
    check(m is not None, "%s prints 'ready PORT'" % what, repr(buf))
    return int(m.group(1))


def until(fn, deadline_s, what, detail=""):
    """Calls fn() until it returns a true value or the deadline passes; the
    pause between tries is a poll interval, not a synchronisation."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise Failure("%s within %d s (last error: %s)%s" % (what, deadline_s, last,
                                                        ("\n" + detail() if callable(detail) else detail)))


def free_port():
    """A port that was free a moment ago, for programs that cannot report the
    one the kernel gave them (redis, nginx): a lost race shows as the program
    exiting at start, which the handshake reports."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=10):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=timeout) as r:
        return r.status, r.read()


def redis_command(port, *words):
    """One RESP command; the first line of the answer."""
    msg = b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(msg)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n")[0]
    if line.startswith(b"$") and line != b"$-1":
        return data.split(b"\r\n")[1]
    return line


class HttpLoad:
    """A pool of urllib clients, each in a loop of GETs until stopped, bounded
    in count and time. Counts answers other than 200 with the expected body,
    and exceptions; keeps the first few for the report."""

    def __init__(self, port, path, expect, threads=3, max_requests=200000, max_s=150):
        self.port, self.path, self.expect = port, path, expect
        self.ok = self.bad = self.errors = 0
        self.first_failures = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.max_requests, self.end = max_requests, time.monotonic() + max_s
        self.threads = [threading.Thread(target=self.loop, daemon=True) for _ in range(threads)]

    def loop(self):
        while not self.stop_event.is_set() and time.monotonic() < self.end:
            with self.lock:
                if self.ok + self.bad + self.errors >= self.max_requests:
                    return
            try:
                status, body = http_get(self.port, self.path)
                good = status == 200 and body == self.expect
                failure = None if good else "status %d, body %r" % (status, body[:100])
            except Exception as e:  # every failure is counted, whatever it is
                good, failure = None, "%s: %s" % (type(e).__name__, e)
            with self.lock:
                if good:
                    self.ok += 1
                elif good is None:
                    self.errors += 1
                else:
                    self.bad += 1
                if failure and len(self.first_failures) < 5:
                    self.first_failures.append(failure)

    def start(self):
        for t in self.threads:
            t.start()

    def wait_for(self, n, deadline_s, what):
        until(lambda: self.ok >= n or self.bad or self.errors, deadline_s, what)
        self.check_clean(what)

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=30)
        check(not any(t.is_alive() for t in self.threads), "the HTTP clients stop within 30 s")

    def check_clean(self, what):
        check(self.bad == 0 and self.errors == 0,
              "%s: the clients saw no error (%d ok, %d wrong answers, %d exceptions)" % (what, self.ok, self.bad,
                                                                                         self.errors),
              "\n".join(self.first_failures))

    def counts(self):
        """(good answers, wrong answers and exceptions, the first few)."""
        return self.ok, self.bad + self.errors, self.first_failures

    def describe(self):
        return "%d requests, all 200 with the right body" % self.ok


class RedisLoad:
    """redis-benchmark in a loop of bounded runs (-n) until stopped; each run
    must exit 0, print a rate for every test and nothing on stderr. A failed
    run stops the loop, unless keep_going (the soak counts them all)."""

    TESTS = "set,get,incr,lpush,lpop"

    def __init__(self, benchmark, port, max_runs=100, max_s=150, keep_going=False):
        self.argv = [benchmark, "-h", "127.0.0.1", "-p", str(port), "-n", "20000", "-c", "8", "-P", "4", "-q", "-t",
                     self.TESTS]
        self.max_runs, self.end, self.keep_going = max_runs, time.monotonic() + max_s, keep_going
        self.runs = self.failed = 0
        self.failures = []  # the first few, for the report
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.proc = None

    def loop(self):
        while not self.stop_event.is_set() and time.monotonic() < self.end and self.runs < self.max_runs:
            # Its own process group, so that a failing test can kill it.
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         start_new_session=True, text=True)
            try:
                out, err = self.proc.communicate(timeout=60)
                failure = None
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                out, err = self.proc.communicate()
                failure = "%s run %d took over 60 s" % (os.path.basename(self.argv[0]), self.runs + 1)
            self.runs += 1
            failure = failure or self.judge(self.proc.returncode, out, err)
            if failure:
                self.failed += 1
                if len(self.failures) < 5:
                    self.failures.append(failure)
                if not self.keep_going:
                    return

    def judge(self, rc, out, err):
        """Why a finished run failed, or None."""
        rates = re.findall(r"^(\S+): [\d.]+ requests per second", out.replace("\r", "\n"), re.M)
        wanted = [t.upper() for t in self.TESTS.split(",")]
        if rc != 0 or err.strip() or sorted(set(rates)) != sorted(wanted):
            return "run %d: rc %d, rates for %s (want %s)\nstdout:\n%s\nstderr:\n%s" % (
                self.runs, rc, rates, wanted, out[-1500:], err[-1500:])
        return None

    def start(self):
        self.thread.start()

    def wait_for(self, runs, deadline_s, what):
        until(lambda: self.runs >= runs or self.failures, deadline_s, what)
        self.check_clean(what)

    def stop(self):
        self.stop_event.set()
        self.thread.join(timeout=70)
        if self.thread.is_alive() and self.proc:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.thread.join(timeout=10)
        check(not self.thread.is_alive(), "redis-benchmark stops within 70 s")

    def check_clean(self, what):
        check(not self.failures, "%s: redis-benchmark saw no error" % what, "\n".join(self.failures))

    def counts(self):
        """(requests or runs that went well, those that did not, the first
        few failures): the same shape for every load."""
        return self.runs - self.failed, self.failed, self.failures

    def describe(self):
        return "%d redis-benchmark runs of 20000 requests x %d tests, all clean" % (self.runs,
                                                                                    len(self.TESTS.split(",")))


def attach_cycles(args, pid, out_dir, alive):
    """CYCLES sessions of SESSION_MS; after each, remora exited 0 and alive()
    holds. Returns the output directories of the last session, by pid. A
    last session that holds no sample at all (its processes got no CPU in
    it: the machine is loaded) is followed by another, up to 3 more: what is
    checked in it needs samples, never a fast machine."""
    dirs = {}
    i, extra = 0, 0
    while True:
        if i >= CYCLES:
            if folded_frames(dirs)[1] > 0 or extra == 3:
                break
            extra += 1
            print("      the last session holds no sample (the program got no CPU in it: a loaded machine): "
                  "one more cycle")
        i += 1
        what = "cycle %d" % i
        start = time.monotonic()
        channel = ["--channel", args.channel] if args.channel else []
        r = subprocess.run([args.remora, "attach", "-p", str(pid), "-d", str(SESSION_MS), "-e",
                            "REMORA_OUTPUT_PATH=" + out_dir] + channel, capture_output=True, text=True, timeout=90)
        took = time.monotonic() - start
        check(r.returncode == 0, "%s: remora attach exits 0" % what,
              "rc %d\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout[-4000:], r.stderr[-4000:]))
        alive(what)
        if args.channel == "socket":
            check("attached through its socket channel" in r.stdout, "%s: attached through the socket channel" % what,
                  r.stdout[-4000:])
        dirs = {int(p): d for p, d in re.findall(r"^==> pid (\d+): (\S+)$", r.stdout, re.M)}
        check(pid in dirs, "%s: remora names the output directory of pid %d" % (what, pid), r.stdout[-4000:])
        print("      %s: remora attach -d %d exited 0 after %.2f s, %d process(es)" % (what, SESSION_MS, took,
                                                                                   len(dirs)))
    return dirs


def folded_frames(dirs):
    """Samples per frame (anywhere on the stack) over the folded.txt of every
    process of the session, and the total."""
    frames, total = {}, 0
    for d in dirs.values():
        path = os.path.join(d, "folded.txt")
        check(os.path.exists(path), "the profile has folded.txt", path)
        with open(path, encoding="utf-8") as f:
            for line in f:
                stack, count = line.rstrip("\n").rsplit(" ", 1)
                total += int(count)
                for frame in set(stack.split(";")):
                    frames[frame] = frames.get(frame, 0) + int(count)
    return frames, total


def check_hot(dirs, matches, what):
    frames, total = folded_frames(dirs)
    top = sorted(frames.items(), key=lambda kv: -kv[1])
    hot = {f: n for f, n in frames.items() if matches(f)}
    check(hot, "the last profile names %s" % what, lambda: "%d samples; hottest frames: %r" % (total, top[:20]))
    best = max(hot, key=hot.get)
    print("      the last profile: %d samples; %s on %d (%.0f %%): %s" % (
        total, what, hot[best], 100.0 * hot[best] / max(total, 1), best))
    print("      its frames on most stacks: %s" % ", ".join("%s %d" % (f[:60], n) for f, n in top[:8]))


class Served:
    """A program started and answering, its load client made but not yet
    started: what run_case (and bench/soak_real.py) drives.

    pid: the process attached (nginx: the master); load: an HttpLoad or a
    RedisLoad; alive(what) and answers(): checks that raise Failure; warm():
    waits, the load started, until it has done some work; matches(frame) and
    hot_what: the hot functions the profile must name; profiled(): the pids
    whose profiles are looked at (None: all)."""

    def __init__(self, name, pid, load, alive, answers, warm, matches, hot_what, profiled=None):
        self.name, self.pid, self.load, self.alive, self.answers, self.warm = name, pid, load, alive, answers, warm
        self.matches, self.hot_what, self.profiled = matches, hot_what, profiled


def run_case(args, tmp, programs, served):
    """The common part: load running, warm-up, cycles, stop, checks. The hot
    functions are looked for in the profiles of the pids served.profiled()
    returns (default: all)."""
    name, load, alive = served.name, served.load, served.alive
    t0 = time.monotonic()
    load.start()
    try:
        served.warm()
        print("      warm-up under load: %.2f s" % (time.monotonic() - t0))
        t1 = time.monotonic()
        dirs = attach_cycles(args, served.pid, os.path.join(tmp, name + "-out"), alive)
        cycles_s = time.monotonic() - t1
    finally:
        load.stop()
    load.check_clean("under %d attach/detach cycles" % CYCLES)
    alive("after the load")
    served.answers()
    if served.profiled:
        dirs = {p: d for p, d in dirs.items() if p in served.profiled()}
        check(dirs, "the last session profiled the processes that do the work", repr(dirs))
    check_hot(dirs, served.matches, served.hot_what)
    print("ok    %s: %s; %d cycles in %.2f s, alive, answers, exits 0" % (name, load.describe(), CYCLES, cycles_s))


def process_alive(p, name):
    def alive(what):
        check(p.poll() is None, "%s: %s is alive" % (what, name), lambda: stderr_tail(p))
    return alive


# --- the programs -----------------------------------------------------------
# start_NAME(args, tmp, programs, **load_kw) starts the program, waits until
# it answers and returns it Served, its load made with load_kw (HttpLoad's or
# RedisLoad's limits); case_NAME runs the test's cycles on it.


def start_redis(args, tmp, programs, **load_kw):
    server, benchmark = need("redis-server", "redis-benchmark", package="redis-server redis-tools")
    port = free_port()
    p = programs.start("redis", [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", tmp, "--daemonize", "no", "--logfile", os.path.join(tmp, "redis.log")],
                       cwd=tmp)
    alive = process_alive(p, "redis-server")
    until(lambda: p.poll() is None and redis_command(port, b"PING") == b"+PONG", 30, "redis-server answers PING",
          lambda: stderr_tail(p))
    load = RedisLoad(benchmark, port, **load_kw)

    def answers():
        check(redis_command(port, b"SET", b"remora-real", b"42") == b"+OK", "redis-server answers SET")
        check(redis_command(port, b"GET", b"remora-real") == b"42", "redis-server answers GET with the value")

    # Its command path, from reading a query to writing the reply: any of
    # them, since which is hottest depends on the machine (here most samples
    # are in the reply's write(2), under handleClientsWithPendingWrites).
    names = {"readQueryFromClient", "processInputBuffer", "processMultibulkBuffer", "processCommand", "call",
             "lookupKey", "dictFind", "setCommand", "getCommand", "incrCommand", "lpushCommand", "lpopCommand",
             "writeToClient", "_writeToClient", "handleClientsWithPendingWrites", "_addReplyToBufferOrList"}
    return Served("redis", p.pid, load, alive, answers, lambda: load.wait_for(1, 60, "a first redis-benchmark run"),
                  lambda f: f in names, "a function of redis's command path")


def case_redis(args, tmp, programs):
    run_case(args, tmp, programs, start_redis(args, tmp, programs))


NGINX_CONF = """\
# real_programs_test.py: a master and two workers, everything in %(tmp)s.
worker_processes 2;
daemon off;
master_process on;
pid %(tmp)s/nginx.pid;
error_log %(tmp)s/error.log notice;
%(user)s
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path %(tmp)s/body;
    proxy_temp_path %(tmp)s/proxy;
    fastcgi_temp_path %(tmp)s/fastcgi;
    uwsgi_temp_path %(tmp)s/uwsgi;
    scgi_temp_path %(tmp)s/scgi;
    server {
        listen 127.0.0.1:%(port)d;
        root %(tmp)s/www;
        location / { }
    }
}
"""


def children(pid):
    with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
        return sorted(int(c) for c in f.read().split())


def start_nginx(args, tmp, programs, **load_kw):
    (nginx,) = need("nginx", package="nginx-light")
    port = free_port()
    os.makedirs(os.path.join(tmp, "www"))
    body = b"".join(b"remora real line %06d\n" % i for i in range(2000))  # 48 KB
    with open(os.path.join(tmp, "www", "index.html"), "wb") as f:
        f.write(body)
    # As root the workers would switch to nobody, who can read nothing in a
    # 0700 temp directory (nor write the profile there): keep them root.
    user = "user root;" if os.geteuid() == 0 else ""
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF % {"tmp": tmp, "port": port, "user": user})
    # SIGTERM if the test dies: the master then stops its workers, which a
    # SIGKILL of the master alone would leave running.
    p = programs.start("nginx", [nginx, "-p", tmp, "-c", conf, "-e", os.path.join(tmp, "error.log")], cwd=tmp,
                       death_signal=signal.SIGTERM)
    until(lambda: p.poll() is None and http_get(port, "/index.html") == (200, body), 30, "nginx answers GET",
          lambda: stderr_tail(p))
    workers = until(lambda: len(children(p.pid)) == 2 and children(p.pid), 30, "nginx has its 2 workers")

    def alive(what):
        check(p.poll() is None, "%s: the nginx master is alive" % what, lambda: stderr_tail(p))
        # A worker that crashed would have been replaced: the same pids, and
        # no "exited on signal" in the log.
        check(children(p.pid) == workers, "%s: the same 2 workers" % what, "%s, were %s" % (children(p.pid), workers))
        with open(os.path.join(tmp, "error.log"), errors="replace") as f:
            log = f.read()
        check("exited on signal" not in log, "%s: no worker died" % what, log[-3000:])

    load = HttpLoad(port, "/index.html", body, **load_kw)
    return Served("nginx", p.pid, load, alive,
                  lambda: check(http_get(port, "/index.html") == (200, body), "nginx still answers"),
                  lambda: load.wait_for(200, 60, "200 answers from nginx"), lambda f: f.startswith("ngx_http_"),
                  "an ngx_http_ function in the workers", profiled=lambda: workers)


def case_nginx(args, tmp, programs):
    run_case(args, tmp, programs, start_nginx(args, tmp, programs))


def http_served(programs, name, argv, n, matches, hot_what, warm_requests, **load_kw):
    # In the case's directory: what the runtime writes in its working
    # directory (node's isolate-*-v8.log, a JVM's hs_err_pid*.log) goes with
    # the case's outputs.
    p = programs.start(name, argv, cwd=programs.tmp)
    port = read_ready(p, 60, name)
    expect = b"%d\n" % expected_sum(n)
    path = "/work?n=%d" % n
    until(lambda: http_get(port, path) == (200, expect), 30, "%s answers GET %s" % (name, path))
    load = HttpLoad(port, path, expect, **load_kw)
    return Served(name, p.pid, load, process_alive(p, name),
                  lambda: check(http_get(port, path) == (200, expect), "%s still answers right" % name),
                  lambda: load.wait_for(warm_requests, 60, "%d answers from %s" % (warm_requests, name)), matches,
                  hot_what)


def start_python(args, tmp, programs, **load_kw):
    # The program under test is Debian's python3, whatever runs this script.
    python = shutil.which("python3", path="/usr/bin:/bin")
    if not python:
        raise Skip("python3 not installed (Debian: python3)")
    return http_served(programs, "python3", [python, os.path.join(args.src, "http_server.py")], 20000,
                       lambda f: f == "_PyEval_EvalFrameDefault" or f.startswith("PyObject_"),
                       "_PyEval_EvalFrameDefault or a PyObject_ function", 20, **load_kw)


def case_python(args, tmp, programs):
    run_case(args, tmp, programs, start_python(args, tmp, programs))


def start_node(args, tmp, programs, **load_kw):
    """The caller removes the perf map (remove_perf_map) when done."""
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        raise Skip("node not installed (Debian: nodejs)")
    return http_served(programs, "node", [node, "--perf-basic-prof", os.path.join(args.src, "http_server.js")],
                       300000, lambda f: "remoraReal" in f, "a JS function of the server (remoraReal*)", 200,
                       **load_kw)


def case_node(args, tmp, programs):
    try:
        run_case(args, tmp, programs, start_node(args, tmp, programs))
    finally:
        remove_perf_map(programs)


def start_java(args, tmp, programs, **load_kw):
    """Compiles the server into args.work first. The caller removes the perf
    map (remove_perf_map) when done."""
    java, javac = need("java", "javac", package="openjdk-17-jdk-headless")
    classes = os.path.join(args.work, "real-classes")
    os.makedirs(classes, exist_ok=True)
    start = time.monotonic()
    r = subprocess.run([javac, "-d", classes, os.path.join(args.src, "RemoraRealServer.java")], capture_output=True,
                       text=True, timeout=120)
    check(r.returncode == 0, "javac RemoraRealServer.java", r.stdout + r.stderr)
    print("      javac: %.2f s" % (time.monotonic() - start))
    # C2 inlines work() into the HTTP server's filter chain, and the perf
    # map knows no inlining: keep the server's methods whole, so that the
    # profile can be checked for them by name.
    return http_served(programs, "java", [java, "-Xmx128m", "-XX:+UseSerialGC", "-XX:CompileCommand=quiet",
                                          "-XX:CompileCommand=dontinline,RemoraRealServer::*", "-cp", classes,
                                          "RemoraRealServer"], 300000,
                       lambda f: "RemoraRealServer" in f, "a Java method of the server (RemoraRealServer.*)", 300,
                       **load_kw)


def case_java(args, tmp, programs):
    try:
        run_case(args, tmp, programs, start_java(args, tmp, programs))
    finally:
        remove_perf_map(programs)


def remove_perf_map(programs):
    """The runtime's /tmp/perf-PID.map (node writes it, jcmd writes the JVM's)
    outlives the process: remove it."""
    for p in programs.procs:
        path = "/tmp/perf-%d.map" % p.pid
        if os.path.exists(path):
            os.unlink(path)


def zoo_report(port):
    """The zoo's "ok loops=N bad=M" line (one connection, served by its main
    thread from accept)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.settimeout(10)
        buf = b""
        while not buf.endswith(b"\n"):
            c = s.recv(256)
            if not c:
                break
            buf += c
    m = re.fullmatch(r"ok loops=(\d+) bad=(\d+)", buf.decode(errors="replace").strip())
    check(m is not None, "the JVM answers 'ok loops=N bad=M'", repr(buf))
    return int(m.group(1)), int(m.group(2))


def case_java_calls(args, tmp, programs):
    """`remora call --ret int getpid` on every thread of a JVM whose threads
    stand in every state (RemoraThreadZoo.java: JIT code with safepoint
    polls, allocation and GC, monitors, park, sleep, wait, deep recursion,
    accept), ROUNDS times over: every call returns the JVM's pid; a thread
    that vanished meanwhile (the JVM starts and stops compiler threads as it
    likes) may say "no such thread", nothing else; the JVM lives, its own
    checks found nothing wrong, and its compute loops went on."""
    java, javac = need("java", "javac", package="openjdk-17-jdk-headless")
    classes = os.path.join(args.work, "real-classes")
    os.makedirs(classes, exist_ok=True)
    r = subprocess.run([javac, "-d", classes, os.path.join(args.src, "RemoraThreadZoo.java")], capture_output=True,
                       text=True, timeout=120)
    check(r.returncode == 0, "javac RemoraThreadZoo.java", r.stdout + r.stderr)
    p = programs.start("java", [java, "-Xmx64m", "-cp", classes, "RemoraThreadZoo"])
    port = read_ready(p, 60, "java")
    loops0, _ = zoo_report(port)
    rounds, calls, gone = 3, 0, 0
    start = time.monotonic()
    for rnd in range(rounds):
        tids = sorted(int(t) for t in os.listdir("/proc/%d/task" % p.pid))
        for tid in tids:
            c = subprocess.run([args.remora, "call", "-p", str(p.pid), "-T", str(tid), "--ret", "int", "getpid"],
                               capture_output=True, text=True, timeout=60)
            out = c.stdout + c.stderr
            if c.returncode == 2 and not os.path.exists("/proc/%d/task/%d" % (p.pid, tid)):
                gone += 1
                continue
            check(c.returncode == 0 and re.search(r"= %d " % p.pid, c.stdout) is not None,
                  "round %d: remora call getpid on thread %d (%s) returns the JVM's pid" % (rnd, tid, comm(p.pid, tid)),
                  "exit %d: %s" % (c.returncode, out.strip()))
            calls += 1
        check(p.poll() is None, "the JVM is alive after round %d" % rnd, lambda: stderr_tail(p))
    print("      %d calls on %d threads in %.2f s, %d threads gone meanwhile" % (
        calls, len(tids), time.monotonic() - start, gone))
    loops1, bad = zoo_report(port)
    check(bad == 0, "the JVM's own checks found nothing wrong", "bad=%d" % bad)
    check(loops1 > loops0, "the JVM's compute loops went on", "loops %d then %d" % (loops0, loops1))


def comm(pid, tid):
    try:
        with open("/proc/%d/task/%d/comm" % (pid, tid)) as f:
            return f.read().strip()
    except OSError:
        return "gone"


CASES = {"redis": case_redis, "nginx": case_nginx, "python3": case_python, "node": case_node, "java": case_java,
         "java_calls": case_java_calls}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--program", required=True, choices=sorted(CASES))
    ap.add_argument("--remora", required=True)
    ap.add_argument("--src", required=True, help="the directory of the servers (tests/real/servers)")
    ap.add_argument("--work", required=True, help="a build directory (the compiled Java class)")
    ap.add_argument("--channel", choices=("socket",), help="the program opts in at launch (the agent preloaded, "
                    "REMORA_TOOL_ATTACH=1) and is attached through its socket channel (no ptrace)")
    ap.add_argument("--agent", help="libremora-agent.so, for --channel socket")
    args = ap.parse_args()
    if args.channel:
        OPT_IN_ENV.update(LD_PRELOAD=args.agent, REMORA_TOOL_ATTACH="1")
    tmp = tempfile.mkdtemp(prefix="remora-real-%s-" % args.program)
    programs = Programs(tmp)
    start = time.monotonic()
    failed = False
    try:
        print("real  %s" % args.program)
        CASES[args.program](args, tmp, programs)
    except Skip as e:
        print("skip  %s: %s" % (args.program, e))
        return SKIP
    except (Failure, OSError, subprocess.SubprocessError) as e:
        print("FAIL  %s: %s" % (args.program, e))
        failed = True
    finally:
        programs.stop_all()
        print("      %s: %.2f s in all" % (args.program, time.monotonic() - start))
        if failed:
            print("outputs kept in %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
