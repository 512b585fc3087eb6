#!/usr/bin/env python3
"""Names in the default tool's profile, through the remora CLI (issue 11,
"Names people can read"):

- program: a copy of a test program started through a symlink whose name is
  longer than comm's 15 bytes, by path, through $PATH, by execveat(fd, "")
  as systemd starts services, after rewriting its argv[0] as setproctitle
  does, and with an argv[0] that names no file. The profile (its directory,
  summary.txt, trace.json) names the process as it was started.
- jit: a node process started with --perf-basic-prof, whose hot JS function
  is JIT code that only node's perf map (/tmp/perf-PID.map) names: folded.txt
  and stats.csv name the function. Without the flag the summary says how to
  get the names. And a JVM: remora asks it for its perf map when it renders
  the session (jcmd PID Compiler.perfmap), keeps the map with the session and
  removes it from the JVM's /tmp; its Java methods are named. Each runtime is skipped, with the reason
  printed, when missing.

  names_test.py --remora build/bin/remora --target build/bin/remora_default_tool_name_target \
      --src tests/default_tool/runtimes --work build/tests/default_tool
"""
import argparse
import csv
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

LINK_NAME = "remora-started-through-a-link"  # 29 bytes; comm keeps 15
REAL_NAME = "remora-names-real"


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def read_line(fd, deadline_s, what):
    """One line of a child's stdout, within a deadline."""
    end = time.monotonic() + deadline_s
    buf = b""
    while not buf.endswith(b"\n"):
        left = end - time.monotonic()
        check(left > 0, "%s within %d s" % (what, deadline_s), "got so far: %r" % buf)
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        c = os.read(fd, 1)
        check(c != b"", "%s: the process closed its output" % what)
        buf += c
    return buf.decode().strip()


class Child:
    """A started target: its pid, the write end of its stdin (closing it ends
    the target) and the read end of its stdout."""

    def __init__(self, pid, stdin_w, stdout_r):
        self.pid, self.stdin_w, self.stdout_r = pid, stdin_w, stdout_r

    def stop(self):
        for fd in (self.stdin_w, self.stdout_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)


def spawn(exec_path, argv, env, by_fd=False):
    """fork + exec of exec_path with argv (argv[0] as given). by_fd: open
    exec_path and execveat(fd, "", AT_EMPTY_PATH) it, as systemd does."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    fd = os.open(exec_path, os.O_RDONLY) if by_fd else -1
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            if by_fd:
                os.execve(fd, argv, env)
            else:
                os.execve(exec_path, argv, env)
        finally:
            os._exit(127)
    os.close(in_r)
    os.close(out_w)
    if fd >= 0:
        os.close(fd)
    return Child(pid, in_w, out_r)


def attach(args, pid, out_dir, ms, what):
    r = subprocess.run([args.remora, "attach", "-p", str(pid), "-d", str(ms), "--attach-children=false",
                        "-e", "REMORA_OUTPUT_PATH=" + out_dir], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "%s: remora attach exits 0" % what,
          "rc %d\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout, r.stderr))
    m = re.search(r"^==> pid %d: (\S+)$" % pid, r.stdout, re.M)
    check(m is not None, "%s: remora names the output directory" % what, r.stdout)
    return m.group(1), r.stdout


def program_case(args, tmp, what, argv0, expected, by_fd=False, retitle=False, path_env=None):
    exec_path = os.path.join(tmp, LINK_NAME)
    env = {"PATH": path_env or "/usr/bin:/bin"}
    argv = [argv0] + (["--retitle"] if retitle else [])
    child = spawn(exec_path, argv, env, by_fd)
    try:
        check(read_line(child.stdout_r, 30, what + ": says ready") == "ready", what + ": says ready")
        with open("/proc/%d/comm" % child.pid) as f:
            comm = f.read().strip()
        with open("/proc/%d/cmdline" % child.pid, "rb") as f:
            argv0_seen = f.read().split(b"\0")[0].decode()
        out, stdout = attach(args, child.pid, os.path.join(tmp, "out"), 300, what)
        base = os.path.basename(out)
        prefix = "%s-%d-s" % (expected, child.pid)
        check(base.startswith(prefix), "%s: the output directory starts %s" % (what, prefix), base)
        with open(os.path.join(out, "summary.txt"), encoding="utf-8") as f:
            first = f.readline()
        want = "Remora profile of %s (pid %d)" % (expected, child.pid)
        check(first.startswith(want), "%s: summary.txt says %r" % (what, want), first)
        check(want in stdout, "%s: remora prints %r" % (what, want), stdout)
        with open(os.path.join(out, "trace.json"), encoding="utf-8") as f:
            trace = json.load(f)
        names = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
        check(names == ["%s (pid %d)" % (expected, child.pid)], "%s: trace.json's process_name" % what,
              repr(names))
        link = os.path.join(tmp, "out", "%s-%d-latest" % (expected, child.pid))
        check(os.path.realpath(link) == os.path.realpath(out), "%s: the -latest link" % what, link)
        print("ok    program, %s: comm %r, argv[0] %r -> %r" % (what, comm, argv0_seen, expected))
    finally:
        child.stop()


def program_tests(args, tmp):
    shutil.copy(args.target, os.path.join(tmp, REAL_NAME))
    os.symlink(REAL_NAME, os.path.join(tmp, LINK_NAME))
    link = os.path.join(tmp, LINK_NAME)
    program_case(args, tmp, "by the link's path", link, LINK_NAME)
    program_case(args, tmp, "through $PATH", LINK_NAME, LINK_NAME, path_env=tmp + ":/usr/bin:/bin")
    if os.execve in os.supports_fd:
        # comm is the file's name on Linux >= 6.14, the fd's number before.
        program_case(args, tmp, "by execveat(fd)", link, LINK_NAME, by_fd=True)
    else:
        print("skip  program, by execveat(fd): this Python cannot exec an fd")
    program_case(args, tmp, "argv[0] rewritten as by setproctitle", link, LINK_NAME, retitle=True)
    # Nothing says how it was started but the kernel's comm: the link's name
    # cut to 15 bytes.
    program_case(args, tmp, "argv[0] names no file", "no-such-program", LINK_NAME[:15])


def folded_frames(directory):
    frames = {}
    with open(os.path.join(directory, "folded.txt"), encoding="utf-8") as f:
        for line in f:
            stack, count = line.rstrip("\n").rsplit(" ", 1)
            for frame in set(stack.split(";")):
                frames[frame] = frames.get(frame, 0) + int(count)
    return frames


def node_case(args, tmp, node, perf_map):
    what = "node %s --perf-basic-prof" % ("with" if perf_map else "without")
    argv = [node] + (["--perf-basic-prof"] if perf_map else []) + [os.path.join(args.src, "hot_function.js")]
    child = spawn(node, argv, dict(os.environ))
    map_path = "/tmp/perf-%d.map" % child.pid
    try:
        check(read_line(child.stdout_r, 60, what + ": says ready") == "ready", what + ": says ready")
        out, _ = attach(args, child.pid, os.path.join(tmp, "node-out"), 1000, what)
        with open(os.path.join(out, "summary.txt"), encoding="utf-8") as f:
            summary = f.read()
        frames = folded_frames(out)
        total = sum(int(l.rsplit(" ", 1)[1]) for l in open(os.path.join(out, "folded.txt")))
        check(total > 0, what + ": samples", out)
        hot = {f: n for f, n in frames.items() if "remoraHotJsFunction" in f}
        if not perf_map:
            check("no perf map names them" in summary and map_path in summary and "--perf-basic-prof" in summary,
                  what + ": the summary says how to name JIT code", summary)
            print("ok    jit, %s: %d samples, the summary says there is no perf map" % (what, total))
            return
        check(hot, what + ": folded.txt names remoraHotJsFunction",
              "hottest frames: %r" % sorted(frames.items(), key=lambda kv: -kv[1])[:15])
        share = max(hot.values()) / total
        with open(os.path.join(out, "stats.csv"), newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r["kind"] == "sample" and "remoraHotJsFunction" in r["name"]]
        check(rows and sum(int(r["inclusive_samples"]) for r in rows) > 0,
              what + ": stats.csv has samples of remoraHotJsFunction", repr(rows))
        check("perf map" not in summary, what + ": no perf-map warning", summary)
        check(share > 0.5, what + ": remoraHotJsFunction is on most stacks (%.0f %%)" % (100 * share),
              "frames: %r" % sorted(frames.items(), key=lambda kv: -kv[1])[:15])
        print("ok    jit, %s: %d samples, %.0f %% in %s" % (what, total, 100 * share, sorted(hot)[0]))
    finally:
        child.stop()
        if os.path.exists(map_path):
            os.unlink(map_path)


def jvm_case(args, tmp, java, javac, jcmd):
    # remora asks the JVM for its perf map itself (jcmd PID Compiler.perfmap,
    # as the JVM's user) when it renders the session: nothing is run here.
    what = "a JVM, its perf map asked for by remora"
    classes = os.path.join(args.work, "names-classes")
    os.makedirs(classes, exist_ok=True)
    r = subprocess.run([javac, "-d", classes, os.path.join(args.src, "AllocWorkers.java")],
                       capture_output=True, text=True, timeout=180)
    check(r.returncode == 0, "javac AllocWorkers.java", r.stdout + r.stderr)
    child = spawn(java, [java, "-Xmx256m", "-cp", classes, "AllocWorkers"], dict(os.environ))
    map_path = "/tmp/perf-%d.map" % child.pid
    try:
        check(read_line(child.stdout_r, 60, what + ": says ready") == "ready", what + ": says ready")
        check(not os.path.exists(map_path), what + ": no perf map before the attach", map_path)
        out, _ = attach(args, child.pid, os.path.join(tmp, "jvm-out"), 1000, what)
        kept = os.path.join(out, "perf-%d.map" % child.pid)
        check(os.path.exists(kept) and os.path.getsize(kept) > 0,
              what + ": the map remora had the JVM write is kept with the session for `remora report`", kept)
        check(not os.path.exists(map_path), what + ": and removed from the JVM's /tmp once read", map_path)
        frames = folded_frames(out)
        total = sum(int(l.rsplit(" ", 1)[1]) for l in open(os.path.join(out, "folded.txt")))
        hot = {f: n for f, n in frames.items() if "AllocWorkers.work" in f}
        check(hot, what + ": folded.txt names AllocWorkers.work",
              "hottest frames: %r" % sorted(frames.items(), key=lambda kv: -kv[1])[:15])
        print("ok    jit, %s: %d samples, %d in %s" % (what, total, max(hot.values()), sorted(hot)[0]))
    finally:
        child.stop()
        if os.path.exists(map_path):
            os.unlink(map_path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--target", required=True, help="remora_default_tool_name_target")
    ap.add_argument("--src", required=True, help="the directory of hot_function.js and AllocWorkers.java")
    ap.add_argument("--work", required=True, help="a build directory for the compiled Java class")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="remora-names-")
    failed = False
    try:
        for name, fn in (("program", lambda: program_tests(args, tmp)), ("jit", lambda: jit_tests(args, tmp))):
            try:
                fn()
            except (Failure, OSError, subprocess.SubprocessError) as e:
                print("FAIL  %s: %s" % (name, e))
                failed = True
    finally:
        if failed:
            print("outputs kept in %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def jit_tests(args, tmp):
    node = shutil.which("node") or shutil.which("nodejs")
    if node:
        node_case(args, tmp, node, perf_map=True)
        node_case(args, tmp, node, perf_map=False)
    else:
        print("skip  jit, node: node is not on PATH (Debian: nodejs)")
    tools = [shutil.which(t) for t in ("java", "javac", "jcmd")]
    if all(tools):
        jvm_case(args, tmp, *tools)
    else:
        print("skip  jit, JVM: java, javac or jcmd is not on PATH (Debian: openjdk-17-jdk-headless)")


if __name__ == "__main__":
    sys.exit(main())
