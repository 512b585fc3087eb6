#!/usr/bin/env python3
"""Recorded once, rendered anywhere (profile/collect.h, profile/names.h).

A program built here (its hot function in a shared library whose DWARF was
stripped, as distributions ship them, the program itself with DWARF) is
profiled through the remora CLI. Then:

1. The process is killed and its binaries deleted; the session directory is
   copied to another path. `remora report` on the copy, and on the original,
   and `remora report -p PID` of the ended process, give the very same seven
   outputs byte for byte (summary.txt apart from the lines naming the
   directory).
2. The library's debug file appears (REMORA_DEBUG_PATH, laid out as
   .build-id/xx/rest.debug): a render names the library's frames with their
   source lines, and the summary says that it did, and why the outputs differ.
3. A session directory without names.json (an older remora's) is collected
   from this machine's files at its first render, and renders the same after.

  recorded_test.py --remora build/bin/remora --cc cc --objcopy objcopy --work DIR
"""
import argparse
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

OUTPUTS = ("summary.txt", "trace.perfetto", "profile.pb.gz", "flamegraph.svg", "folded.txt", "stats.csv",
           "trace.json")

LIB_C = r"""
__attribute__((noinline)) double rec_lib_spin(int n) {
  volatile double x = 1;
  for (int i = 0; i < n; ++i) x = x * 1.0000001 + 0.5;
  return x;
}
"""

MAIN_C = r"""
#include <stdio.h>
extern double rec_lib_spin(int n);
__attribute__((noinline)) double rec_main_loop(void) {
  double s = 0;
  for (;;) {
    s += rec_lib_spin(100000);
    if (s < 0) break;
  }
  return s;
}
int main(void) {
  printf("ready\n");
  fflush(stdout);
  return (int)rec_main_loop();
}
"""


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def run(cmd, what, env=None, timeout=120):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    check(r.returncode == 0, "%s: exit %d" % (what, r.returncode), "$ %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r


def read_line(fd, deadline_s, what):
    end = time.monotonic() + deadline_s
    buf = b""
    while not buf.endswith(b"\n"):
        left = end - time.monotonic()
        check(left > 0, "%s within %d s" % (what, deadline_s), "got so far: %r" % buf)
        r, _, _ = select.select([fd], [], [], left)
        if r:
            c = os.read(fd, 1)
            check(c != b"", "%s: the process closed its output" % what)
            buf += c
    return buf.decode().strip()


def build(args, tmp):
    """bin/rec_prog and bin/librec.so (stripped of DWARF, symbol table kept),
    and librec.debug, kept aside for step 2."""
    src, bindir = os.path.join(tmp, "src"), os.path.join(tmp, "bin")
    os.makedirs(src)
    os.makedirs(bindir)
    with open(os.path.join(src, "lib.c"), "w") as f:
        f.write(LIB_C)
    with open(os.path.join(src, "main.c"), "w") as f:
        f.write(MAIN_C)
    lib = os.path.join(bindir, "librec.so")
    run([args.cc, "-O1", "-g", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-Wl,--build-id",
         os.path.join(src, "lib.c"), "-o", lib], "build librec.so")
    run([args.cc, "-O1", "-g", "-fno-omit-frame-pointer", "-Wl,--build-id", os.path.join(src, "main.c"),
         "-L", bindir, "-lrec", "-Wl,-rpath," + bindir, "-o", os.path.join(bindir, "rec_prog")], "build rec_prog")
    debug = os.path.join(tmp, "librec.debug")
    run([args.objcopy, "--only-keep-debug", lib, debug], "objcopy --only-keep-debug")
    run([args.objcopy, "--strip-debug", lib], "objcopy --strip-debug")
    return os.path.join(bindir, "rec_prog"), lib, debug


def profile(args, prog, out_root):
    """Starts prog, profiles it for a second, kills it; the session directory."""
    r_fd, w_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w_fd, 1)
        os.execv(prog, [prog])
    os.close(w_fd)
    try:
        check(read_line(r_fd, 30, "the program's ready line") == "ready", "the program says ready")
        r = run([args.remora, "attach", "-p", str(pid), "-d", "1000", "--attach-children=false", "-e",
                 "REMORA_OUTPUT_PATH=" + out_root], "remora attach")
        m = re.search(r"^==> pid %d: (\S+)$" % pid, r.stdout, re.M)
        check(m is not None, "remora names the session directory", r.stdout)
        return m.group(1), pid
    finally:
        os.close(r_fd)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def outputs(d):
    out = {}
    for name in OUTPUTS:
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def same_outputs(first, first_dir, again, again_dir, what):
    for name in OUTPUTS:
        a, b = first[name], again[name]
        if name == "summary.txt":  # it names its directory
            a = a.replace(first_dir.encode(), b"DIR")
            b = b.replace(again_dir.encode(), b"DIR")
        check(a == b, "%s: %s is the same byte for byte" % (what, name),
              "first:\n%s\nnow:\n%s" % (a[:3000], b[:3000]) if name.endswith((".txt", ".csv")) else "")


def report(args, d, what, env=None):
    return run([args.remora, "report", d], what, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--cc", required=True)
    ap.add_argument("--objcopy", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="recorded-", dir=args.work)
    env = dict(os.environ)
    env.pop("REMORA_DEBUG_PATH", None)
    os.environ.pop("REMORA_DEBUG_PATH", None)
    ok = False
    try:
        prog, lib, debug = build(args, tmp)
        d, pid = profile(args, prog, os.path.join(tmp, "out"))
        first = outputs(d)
        summary = first["summary.txt"].decode()
        folded = first["folded.txt"].decode()
        check("rec_lib_spin" in folded and "rec_main_loop" in folded, "the first render names both functions",
              folded[:2000])
        check(re.search(r"no debug info for \S*librec\.so", summary) is not None,
              "the first render says the library has no debug info", summary)
        with open(os.path.join(d, "names.json")) as f:
            names = json.load(f)
        lib_obj = [o for o in names["objects"] if o["path"].endswith("/librec.so")]
        check(len(lib_obj) == 1 and lib_obj[0]["level"] == "symtab" and lib_obj[0]["build_id"],
              "names.json records the library, named from its symbol table, with its build ID", str(lib_obj))
        build_id = lib_obj[0]["build_id"]
        print("first render: %d addresses recorded in %d objects; librec.so build ID %s" %
              (len(names["addresses"]), len(names["objects"]), build_id))

        # 1. The process and its binaries gone, the directory elsewhere.
        shutil.rmtree(os.path.join(tmp, "bin"))
        moved = os.path.join(tmp, "elsewhere", "copy-of-" + os.path.basename(d))
        shutil.copytree(d, moved)
        report(args, moved, "remora report on the copy")
        same_outputs(first, d, outputs(moved), moved, "the copy, binaries deleted")
        report(args, d, "remora report in place")
        same_outputs(first, d, outputs(d), d, "in place, binaries deleted")
        # -p asks for a fresh collection; the process is gone: the recorded names stay.
        run([args.remora, "report", "-p", str(pid), moved], "remora report -p PID of the ended process")
        same_outputs(first, d, outputs(moved), moved, "-p of the ended process")
        print("1. binaries deleted, directory copied: the 7 outputs are the same byte for byte")

        # 2. The library's debug file becomes available.
        debug_root = os.path.join(tmp, "debug")
        target = os.path.join(debug_root, ".build-id", build_id[:2], build_id[2:] + ".debug")
        os.makedirs(os.path.dirname(target))
        shutil.copy(debug, target)
        denv = dict(env, REMORA_DEBUG_PATH=debug_root)
        report(args, moved, "remora report with the debug file", env=denv)
        better = outputs(moved)
        summary2 = better["summary.txt"].decode()
        check("is named from debug info found after the session was recorded" in summary2 and build_id in summary2,
              "the summary says the library was named anew, and from which build", summary2)
        check(re.search(r"no debug info for \S*librec\.so", summary2) is None,
              "the library's no-debug-info warning is gone", summary2)
        trace = better["trace.json"].decode()
        check(re.search(r'"source":\s*"[^"]*lib\.c:\d+"', trace) is not None,
              "the library's frames now have their source lines (trace.json)", trace[:2000])
        check("rec_lib_spin" in better["folded.txt"].decode(), "the function keeps its name")
        # Without the debug file, the recorded names again.
        report(args, moved, "remora report without the debug file")
        same_outputs(first, d, outputs(moved), moved, "the debug file gone again")
        print("2. the debug file found by build ID improves the library's frames, and the summary says so")

        # 3. A session of an older remora: no names.json.
        old = os.path.join(tmp, "elsewhere", "older-" + os.path.basename(d))
        shutil.copytree(d, old)
        os.unlink(os.path.join(old, "names.json"))
        report(args, old, "remora report of a session without names")
        check(os.path.exists(os.path.join(old, "names.json")), "the first render records the names")
        older = outputs(old)
        check("rec_main_loop" not in older["folded.txt"].decode(),
              "with the binaries gone, nothing names what only they named")
        report(args, old, "remora report of it again")
        same_outputs(older, old, outputs(old), old, "the older session's second render")
        print("3. a session without names.json: recorded at its first render, the same after")
        ok = True
    except Failure as e:
        print("FAIL: %s" % e)
    finally:
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept for inspection: %s" % tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
