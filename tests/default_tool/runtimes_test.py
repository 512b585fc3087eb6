#!/usr/bin/env python3
"""The default tool on JIT runtimes: a JVM and a node process under
`remora attach`, 12 attach/detach cycles of 500 ms each. After every cycle the attach
exited 0, the process is alive and still computes correctly (it answers a
checksum request on stdin); the last cycle's profile has samples.

Why: the sampler once unwound inside its signal handler and killed every JVM
it sampled (JIT frames without unwind information). Skips, with the reason
printed, a runtime that is not installed (exit 77 when both are missing).

  runtimes_test.py --remora build/bin/remora --src tests/default_tool/runtimes --work build/...
"""
import argparse
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# 12 sessions of 500 ms: the 6 s of sampling per runtime that 30 sessions
# of 200 ms gave (what finds JIT frames the unwinder must survive), for
# less than half the command runs (each renders a JIT runtime's profile:
# most of a cycle's time).
CYCLES = 12
WINDOW_MS = 500
N = 200000
EXPECTED_SUM = sum(k * k % 1000003 for k in range(N))


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    """`detail` may be a callable, called only on failure."""
    if not cond:
        detail = detail() if callable(detail) else detail
        raise Failure(what + ("\n" + detail if detail else ""))


def read_line(p, deadline_s, what):
    """One line of the target's stdout, within a deadline."""
    end = time.monotonic() + deadline_s
    buf = b""
    while not buf.endswith(b"\n"):
        left = end - time.monotonic()
        check(left > 0, "%s within %d s" % (what, deadline_s), "got so far: %r" % buf)
        r, _, _ = select.select([p.stdout], [], [], left)
        if not r:
            continue
        c = os.read(p.stdout.fileno(), 1)
        check(c != b"", "%s: the process closed its output (exit status %s)" % (what, p.poll()))
        buf += c
    return buf.decode().strip()


def ask_checksum(p, what):
    p.stdin.write(b"check %d\n" % N)
    p.stdin.flush()
    line = read_line(p, 60, "%s: the checksum answer" % what)
    m = re.fullmatch(r"sum=(\d+) errors=(\d+)", line)
    check(m is not None, "%s: a checksum answer" % what, line)
    check(int(m.group(1)) == EXPECTED_SUM, "%s: the checksum is right" % what,
          "%s, expected %d" % (line, EXPECTED_SUM))
    check(int(m.group(2)) == 0, "%s: the workers' results are right" % what, line)


def tail(f):
    f.seek(0)
    return f.read().decode(errors="replace")[-3000:]


def folded_samples(directory):
    total = 0
    with open(os.path.join(directory, "folded.txt")) as f:
        for line in f:
            total += int(line.rsplit(" ", 1)[1])
    return total


def cycles(args, name, argv, tmp):
    out_dir = os.path.join(tmp, name + "-out")
    # stderr into a file: a pipe nobody reads could fill and block the target.
    err = open(os.path.join(tmp, name + ".stderr"), "w+b")
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        check(read_line(p, 60, "%s says ready" % name) == "ready", "%s says ready" % name)
        ask_checksum(p, name + " before any attach")
        last = None
        samples = 0
        start = time.monotonic()
        for i in range(CYCLES):
            what = "%s cycle %d" % (name, i + 1)
            r = subprocess.run([args.remora, "attach", "-p", str(p.pid), "-d", str(WINDOW_MS), "--attach-children=false",
                                "-e", "REMORA_OUTPUT_PATH=" + out_dir],
                               capture_output=True, text=True, timeout=120)
            check(r.returncode == 0, "%s: remora attach exits 0" % what,
                  "rc %d\nstdout:\n%s\nstderr:\n%s" % (r.returncode, r.stdout, r.stderr))
            check(p.poll() is None, "%s: %s is alive" % (what, name),
                  lambda: "exit status %s, stderr:\n%s" % (p.poll(), tail(err)))
            ask_checksum(p, what)
            m = re.search(r"^==> pid %d: (\S+)$" % p.pid, r.stdout, re.M)
            check(m is not None, "%s: remora names the output directory" % what, r.stdout)
            check(m.group(1) != last, "%s: a new output directory" % what, r.stdout)
            last = m.group(1)
            samples += folded_samples(last)
        # Summed over the cycles: on a loaded machine one short session can
        # end before the collector's first thread scan has armed a timer.
        check(samples > 0, "%s: the profiles have samples" % name, last)
        print("ok    %s: %d cycles in %.1f s, alive and correct; %d samples in all, %d in the last profile"
              % (name, CYCLES, time.monotonic() - start, samples, folded_samples(last)))
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        err.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--src", required=True, help="the directory of AllocWorkers.java and compute.js")
    ap.add_argument("--work", required=True, help="a build directory for the compiled Java class")
    args = ap.parse_args()
    ran = 0
    failed = False
    tmp = tempfile.mkdtemp(prefix="remora-runtimes-")
    try:
        java, javac = shutil.which("java"), shutil.which("javac")
        if java and javac:
            classes = os.path.join(args.work, "runtimes-classes")
            os.makedirs(classes, exist_ok=True)
            r = subprocess.run([javac, "-d", classes, os.path.join(args.src, "AllocWorkers.java")],
                               capture_output=True, text=True, timeout=180)
            if r.returncode != 0:
                print("FAIL  javac AllocWorkers.java:\n" + r.stdout + r.stderr)
                failed = True
            else:
                ran += 1
                try:
                    cycles(args, "java", [java, "-Xmx256m", "-cp", classes, "AllocWorkers"], tmp)
                except (Failure, OSError, subprocess.SubprocessError) as e:
                    print("FAIL  java: %s" % e)
                    failed = True
        else:
            print("skip  java: java or javac is not on PATH (Debian: openjdk-17-jdk-headless)")
        node = shutil.which("node") or shutil.which("nodejs")
        if node:
            ran += 1
            try:
                cycles(args, "node", [node, os.path.join(args.src, "compute.js")], tmp)
            except (Failure, OSError, subprocess.SubprocessError) as e:
                print("FAIL  node: %s" % e)
                failed = True
        else:
            print("skip  node: node is not on PATH (Debian: nodejs)")
    finally:
        if failed:
            print("outputs kept in %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        return 1
    return 0 if ran else 77


if __name__ == "__main__":
    sys.exit(main())
