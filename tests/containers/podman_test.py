#!/usr/bin/env python3
"""Targets by the names users know them by: `remora attach|status|detach
--container NAME` against a real podman container (cli/container.h).

The container is built here from a local root (no registry): a program that
forks a worker, both computing, with the loader and libc it needs, imported
with `podman import`. It runs as users harden services: read-only root,
every capability dropped, podman's default seccomp profile, no network; with
runc and explicit ulimits (crun refuses hybrid cgroups on such machines).

  - attach --container NAME -d 1000: both processes profiled, the results on
    this side in ./remora-output, each naming the program's own function;
  - attach --container ID --keep, status --container NAME (both attached),
    detach --container NAME (both detached), status again;
  - a stopped container and an unknown name: exit 2, with the fix;
  - the container and both its processes keep running, undisturbed.
Skips (exit 77, reason printed) without podman or runc.

  podman_test.py --remora build/bin/remora --cc cc --work DIR
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SPIN_C = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((noinline)) double ctr_spin(int n) {
  volatile double x = 1;
  for (int i = 0; i < n; ++i) x = x * 1.0000001 + 0.5;
  return x;
}
int main(void) {
  if (fork() < 0) return 1;  /* a worker: the container's tree */
  double s = 0;
  for (;;) {
    s += ctr_spin(200000);
    if (s < 0) break;
  }
  return (int)s;
}
"""


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def run(cmd, what=None, ok=(0,), cwd=None, timeout=120, stdin=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, input=stdin)
    if what is not None:
        check(r.returncode in ok, "%s: exit %d" % (what, r.returncode),
              "$ %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r


def children(pid):
    out = []
    for tid in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
            out += [int(c) for c in f.read().split()]
    return out


def state(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def build_root(cc, root):
    """root/spin and the loader and libraries it needs, at their paths."""
    os.makedirs(root)
    src = os.path.join(os.path.dirname(root), "spin.c")
    with open(src, "w") as f:
        f.write(SPIN_C)
    prog = os.path.join(root, "spin")
    run([cc, "-O1", "-g", src, "-o", prog], "build the container's program")
    for lib in re.findall(r"(/\S+) \(0x", run(["ldd", prog], "ldd").stdout):
        dest = root + lib
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy(os.path.realpath(lib), dest)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remora", required=True)
    ap.add_argument("--cc", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    args.remora = os.path.abspath(args.remora)
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            print("SKIP: %s is not installed (make test-deps installs it)" % tool)
            return 77
    os.makedirs(args.work, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="podman-", dir=args.work)
    tag = "remora-test-%d" % os.getpid()
    image = "localhost/%s:1" % tag
    ok = False
    try:
        build_root(args.cc, os.path.join(tmp, "root"))
        tar = subprocess.run(["tar", "-C", os.path.join(tmp, "root"), "-c", "."], capture_output=True, check=True)
        r = subprocess.run(["podman", "import", "-", image], input=tar.stdout, capture_output=True, timeout=120)
        if r.returncode != 0:
            print("SKIP: podman cannot import an image on this machine:\n%s" % r.stderr.decode())
            return 77
        r = run(["podman", "--runtime", "runc", "run", "-d", "--name", tag, "--read-only", "--cap-drop=all",
                 "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", image, "/spin"])
        if r.returncode != 0:
            # The runtime, not remora: a machine where podman cannot run a
            # container at all (no cgroups, no storage driver).
            print("SKIP: podman cannot run a container here (runc, read-only, no capabilities):\n%s" % r.stderr)
            return 77
        cid = run(["podman", "inspect", "--format", "{{.Id}}", tag], "podman inspect").stdout.strip()
        pid = int(run(["podman", "inspect", "--format", "{{.State.Pid}}", tag], "podman inspect").stdout)
        deadline = time.monotonic() + 30
        while not children(pid):
            check(time.monotonic() < deadline, "the container's worker within 30 s")
            time.sleep(0.05)
        worker = children(pid)[0]
        with open("/proc/%d/status" % pid) as f:
            check(re.search(r"^CapEff:\s*0+$", f.read(), re.M) is not None, "the container has no capabilities")

        out = os.path.join(tmp, "here")
        os.makedirs(out)
        r = run([args.remora, "attach", "--container", tag, "-d", "1000"], "attach --container NAME", cwd=out)
        dirs = sorted(os.listdir(os.path.join(out, "remora-output")))
        check(len(dirs) == 2, "two sessions (the main process and its worker) on this side", "\n".join(dirs) + r.stdout)
        for d in dirs:
            with open(os.path.join(out, "remora-output", d, "folded.txt")) as f:
                check("ctr_spin" in f.read(), "%s names the program's own function" % d)
        check("main process %d" % pid in r.stderr, "remora says which process the container's is", r.stderr)
        print("attach --container %s: %s" % (tag, ", ".join(dirs)))

        run([args.remora, "attach", "--container", cid[:12], "--keep"], "attach --container ID --keep", cwd=out)
        r = run([args.remora, "status", "--container", tag], "status --container NAME")
        for p in (pid, worker):
            check(re.search(r"^%d\s+\S+\s+yes\s+yes\b" % p, r.stdout, re.M) is not None,
                  "status lists %d as attached" % p, r.stdout)
        run([args.remora, "detach", "--container", tag], "detach --container NAME", cwd=out)
        r = run([args.remora, "status", "--container", tag], "status after the detach")
        for p in (pid, worker):
            check(re.search(r"^%d\s+\S+\s+yes\s+no\b" % p, r.stdout, re.M) is not None,
                  "%d is detached" % p, r.stdout)
        print("attach --keep, status, detach --container: both processes, both ways")

        for p in (pid, worker):
            check(state(p) in ("R", "S"), "process %d runs on, undisturbed (state %s)" % (p, state(p)))
        check(run(["podman", "inspect", "--format", "{{.State.Status}}", tag]).stdout.strip() == "running",
              "the container is still running")

        r = run([args.remora, "attach", "--container", "remora-no-such-container", "-d", "100"])
        check(r.returncode == 2 and "podman ps" in r.stderr, "an unknown container: exit 2 and the fix", r.stderr)
        run(["podman", "stop", "-t", "0", tag], "podman stop")
        r = run([args.remora, "status", "--container", tag])
        check(r.returncode == 2 and "podman start " + tag in r.stderr, "a stopped container: exit 2 and the fix",
              r.stderr)
        print("an unknown and a stopped container: exit 2, each with what to do")
        ok = True
    except Failure as e:
        print("FAIL: %s" % e)
    finally:
        run(["podman", "rm", "-f", "-t", "0", tag])
        run(["podman", "rmi", "-f", image])
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("kept for inspection: %s" % tmp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
