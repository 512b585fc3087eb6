#!/usr/bin/env python3
"""One rule for where the results go: `-o, --output DIR` (attach, run).

The default tool's session directory lands in DIR on remora's side, whatever
the target's working directory or user:
  - a target of remora's own user, started in another directory;
  - a target running as nobody, with DIR inside a directory only root may
    enter (the session is staged in the target's /tmp and brought out; no
    staging directory is left there);
  - `remora run -o DIR -- CMD`;
  - -o beside -e REMORA_OUTPUT_PATH, and -o with a -t list without the
    default tool: exit 1, saying what to do.
Nothing is written into remora's own working directory or the target's.

  output_test.py --remora build/bin/remora --hook-tool build/lib/libremora-hook-tool-a.so
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def remora(args, cmd, cwd, ok=(0,)):
    r = subprocess.run([args.remora] + cmd, capture_output=True, text=True, timeout=120, cwd=cwd)
    check(r.returncode in ok, "remora %s: exit %d (want %s)" % (" ".join(cmd), r.returncode, ok),
          r.stdout + r.stderr)
    return r


def start_sleeper(cwd, as_nobody):
    """`sleep 120` in `cwd`; runs once its exec is done (comm is "sleep")."""
    cmd = ["sleep", "120"]
    if as_nobody:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    p = subprocess.Popen(cmd, cwd=cwd)
    deadline = time.monotonic() + 30
    while True:
        with open("/proc/%d/comm" % p.pid) as f:
            if f.read().strip() == "sleep":
                return p
        check(time.monotonic() < deadline, "sleep started within 30 s")
        time.sleep(0.01)


def sessions(d):
    """The session directories in d (not the tool's NAME-PID-latest links)."""
    if not os.path.isdir(d):
        return []
    return sorted(x for x in os.listdir(d)
                  if not os.path.islink(os.path.join(d, x)) and os.path.exists(os.path.join(d, x, "summary.txt")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--hook-tool", required=True)
    args = ap.parse_args()
    args.remora = os.path.abspath(args.remora)
    args.hook_tool = os.path.abspath(args.hook_tool)
    tmp = tempfile.mkdtemp(prefix="remora-output-test-")
    os.chmod(tmp, 0o755)
    here, there = os.path.join(tmp, "here"), os.path.join(tmp, "there")
    for d in (here, there):
        os.makedirs(d)
    os.chmod(there, 0o777)
    procs = []
    ok = False
    try:
        # Our own user, in another directory.
        p = start_sleeper(there, False)
        procs.append(p)
        out = os.path.join(tmp, "out-own")
        r = remora(args, ["attach", "-p", str(p.pid), "-d", "200", "-o", out], here)
        got = sessions(out)
        check(len(got) == 1 and got[0].startswith("sleep-%d-" % p.pid), "the session lands in -o DIR", r.stdout)
        check(out in r.stdout, "the summary names -o DIR", r.stdout)
        print("own user: %s" % got[0])

        # nobody, DIR inside a directory only root enters.
        p = start_sleeper(there, True)
        procs.append(p)
        locked = os.path.join(tmp, "root-only")
        os.makedirs(locked)
        os.chmod(locked, 0o700)
        out = os.path.join(locked, "out")
        before = set(glob.glob("/tmp/.remora-output-*"))
        r = remora(args, ["attach", "-p", str(p.pid), "-d", "200", "--output", out], here)
        got = sessions(out)
        check(len(got) == 1 and got[0].startswith("sleep-%d-" % p.pid),
              "a target that may not write DIR: its session is brought out into DIR", r.stdout + r.stderr)
        check(set(glob.glob("/tmp/.remora-output-*")) == before, "no staging directory is left in /tmp")
        print("nobody, root-only DIR: %s" % got[0])

        # remora run.
        out = os.path.join(tmp, "out-run")
        r = remora(args, ["run", "-o", out, "--", "sleep", "0.3"], here)
        got = sessions(out)
        check(len(got) == 1 and got[0].startswith("sleep-"), "remora run -o DIR: the session there",
              r.stdout + r.stderr)
        print("run: %s" % got[0])

        # Refusals.
        r = remora(args, ["attach", "-p", str(procs[0].pid), "-d", "100", "-o", os.path.join(tmp, "x"), "-e",
                          "REMORA_OUTPUT_PATH=/tmp/y"], here, ok=(1,))
        check("not both" in r.stderr, "-o with REMORA_OUTPUT_PATH says to give one", r.stderr)
        r = remora(args, ["attach", "-p", str(procs[0].pid), "-d", "100", "-o", os.path.join(tmp, "x"), "-t",
                          args.hook_tool], here, ok=(1,))
        check("default tool" in r.stderr, "-o without the default tool says why", r.stderr)
        check(not os.path.exists(os.path.join(tmp, "x")), "a refused -o makes nothing")
        print("-o with REMORA_OUTPUT_PATH, -o without the default tool: exit 1, each with what to do")

        check(os.listdir(here) == [] and os.listdir(there) == [],
              "nothing in remora's working directory or the target's",
              "here: %s\nthere: %s" % (os.listdir(here), os.listdir(there)))
        ok = True
    except Failure as e:
        print("FAIL: %s" % e)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept for inspection: %s" % tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
