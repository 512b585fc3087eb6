#!/usr/bin/env python3
"""Processes that Remora must refuse, for the refusal tests of every entry
point (cli_test.py, python/tests). Knows nothing about Remora.

  refusal_helper.py zombie-parent
      Forks a child that exits at once and does not reap it. Prints
      "ready PID ZOMBIE" once the child is a zombie, then waits for the end
      of stdin (or SIGTERM), reaps the child and exits 0.
  refusal_helper.py trace PID
      PTRACE_SEIZEs PID (which stops nothing: the process runs on, with
      TracerPid set to this helper), prints "ready TRACER", then waits for
      the end of stdin (or SIGTERM) and exits: the kernel detaches a tracer
      that exits. Prints "refused ERRNO MESSAGE" and exits 3 when the seize
      is refused (Yama, another tracer, no permission).

Every wait has a deadline; the parent reads the ready line with its own.
"""
import ctypes
import os
import signal
import sys
import time

PTRACE_SEIZE = 0x4206


def state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def wait_stdin_end():
    # SIGTERM ends the wait as the end of stdin does.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        while os.read(0, 4096):
            pass
    except InterruptedError:
        pass
    except OSError:
        pass


def zombie_parent():
    child = os.fork()
    if child == 0:
        os._exit(0)
    deadline = time.monotonic() + 10
    while state(child) != "Z":
        if time.monotonic() > deadline:
            print("not ready: the child did not turn zombie", flush=True)
            return 2
        time.sleep(0.005)
    print("ready %d %d" % (os.getpid(), child), flush=True)
    wait_stdin_end()
    os.waitpid(child, 0)
    return 0


def trace(pid):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0:
        err = ctypes.get_errno()
        print("refused %d %s" % (err, os.strerror(err)), flush=True)
        return 3
    print("ready %d" % os.getpid(), flush=True)
    wait_stdin_end()
    return 0


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "zombie-parent":
        return zombie_parent()
    if len(sys.argv) == 3 and sys.argv[1] == "trace":
        return trace(int(sys.argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
