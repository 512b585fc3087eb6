#!/usr/bin/env python3
"""Every `remora` subcommand refuses words it does not take.

An unknown long option, an unknown short option and a stray positional each
make remora exit 1 with CLI11's "The following argument(s) was/were not
expected: WORD" and the "Run 'remora --help' ..." hint, before it touches
any process: the pid given is a live process (remora_cli_target, ready when
its file is) that must come out with no agent mapped and no tool called, and
under strace (when it is usable) remora makes no ptrace, pidfd_open or
process_vm_* call and opens nothing under /proc/PID. The words after "--"
(run's and events' command) and call's arguments after SYMBOL still pass
through: a negative number, a program's own --flag.

Every remora run has a deadline; every process started here is killed and
reaped, whatever happens. Exit status 0 when every test passed.

  args_test.py --remora build/bin/remora --target build/bin/remora_cli_target \
               --hook-tool build/lib/libremora-hook-tool-a.so [TEST...]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

ARGS = None
PROCS = []  # every Popen started here: killed and reaped after each test
HINT = "Run 'remora --help' or 'remora <command> --help' for usage."
# The system calls that touch another process; none may happen on a refused
# command line.
TOUCHING = "ptrace,pidfd_open,process_vm_readv,process_vm_writev,kill,tgkill"


class Failure(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failure(what + ("\n" + detail if detail else ""))


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise Failure("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(0.02)


def spawn(argv, **kw):
    p = subprocess.Popen(argv, **kw)
    PROCS.append(p)
    return p


def cleanup():
    for p in reversed(PROCS):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL) if getattr(p, "own_group", False) else p.kill()
            except ProcessLookupError:
                pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print("warning: pid %d could not be reaped" % p.pid)
    PROCS.clear()


def run(argv, timeout=30, cwd=None):
    """Runs argv to completion; returns (exit code, stdout, stderr)."""
    p = spawn([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
              text=True, cwd=cwd, start_new_session=True)
    p.own_group = True  # what it started goes with it
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate(timeout=10)
        raise Failure("%s did not finish in %d s\nstdout:\n%s\nstderr:\n%s" % (" ".join(map(str, argv)), timeout,
                                                                              out, err))
    return p.returncode, out, err


def remora(*args, **kw):
    return run([ARGS.remora] + list(args), **kw)


def show(rc, out, err):
    return "exit %d\n--- stdout:\n%s--- stderr:\n%s" % (rc, out, err)


class Target:
    """remora_cli_target without children, ready when its file is."""

    def __init__(self, tmp):
        ready = os.path.join(tmp, "ready-%d" % time.monotonic_ns())
        self.proc = spawn([ARGS.target, "0", ready], start_new_session=True)
        self.proc.own_group = True
        text = wait_for(lambda: self.proc.poll() is None and os.path.exists(ready) and open(ready).read(), 10,
                        "the target to be ready")
        self.pid = int(text.split()[0])

    def check_untouched(self, what):
        check(self.proc.poll() is None, what + ": the target lives on")
        maps = open("/proc/%d/maps" % self.pid).read()
        check("libremora" not in maps, what + ": nothing of Remora's is mapped in the target",
              "\n".join(line for line in maps.splitlines() if "libremora" in line))
        tracer = re.search(r"^TracerPid:\s+(\d+)", open("/proc/%d/status" % self.pid).read(), re.M)
        check(tracer and tracer.group(1) == "0", what + ": the target is not traced")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=10)
        check(rc == 0, "the target exits cleanly", "exit %d" % rc)


def expect_refused(tmp, word, args, target=None):
    """remora ARGS must exit 1 naming `word` as not expected, print nothing
    else, and (under strace) touch no process."""
    what = "remora " + " ".join(map(str, args))
    trace = os.path.join(tmp, "strace-%d.log" % time.monotonic_ns())
    strace = ARGS.strace
    argv = [ARGS.remora] + list(args)
    if strace:
        argv = [strace, "-f", "-qq", "-o", trace, "-e", "trace=" + TOUCHING + ",openat"] + argv
    rc, out, err = run(argv)
    check(rc == 1, what + ": exit 1", show(rc, out, err))
    check(out == "", what + ": nothing on stdout (the command did not run)", show(rc, out, err))
    lines = err.splitlines()
    check(len(lines) == 2, what + ": two lines on stderr", show(rc, out, err))
    m = re.fullmatch(r"remora: error: The following arguments? (?:was|were) not expected: (.+)", lines[0])
    check(m and word in m.group(1).split(" "), what + ": CLI11's message naming %r" % word, show(rc, out, err))
    check(lines[1] == HINT, what + ": the usage hint", show(rc, out, err))
    if strace:
        calls = open(trace).read()
        touching = [line for line in calls.splitlines() if re.search(r"\b(%s)\(" % TOUCHING.replace(",", "|"), line)]
        check(not touching, what + ": no system call touched a process", "\n".join(touching))
        if target:
            check("/proc/%d/" % target.pid not in calls, what + ": nothing under /proc/%d was opened" % target.pid)
    if target:
        target.check_untouched(what)


def expect_all_refused(tmp, valid, target=None):
    """The valid command line `valid` with an unknown long option, then an
    unknown short option, right after the subcommand and at the end."""
    for word in ("--bogus", "-Q"):
        expect_refused(tmp, word, valid[:1] + [word] + valid[1:], target)
        expect_refused(tmp, word, valid + [word], target)


# ---- tests ------------------------------------------------------------------

def test_attach(tmp):
    t = Target(tmp)
    log = os.path.join(tmp, "hook.log")
    valid = ["attach", "-p", t.pid, "-t", ARGS.hook_tool, "-e", "REMORA_HOOK_LOG=" + log, "-d", "300"]
    expect_all_refused(tmp, valid, t)
    expect_refused(tmp, "stray", valid + ["stray"], t)
    expect_refused(tmp, "stray", valid[:3] + ["stray"] + valid[3:], t)
    expect_refused(tmp, "stray", valid + ["--", "stray"], t)
    # The issue's own example: -o is attach's output directory now, --bogus
    # still refused (and nothing made at -o).
    expect_refused(tmp, "--bogus", valid + ["-o", os.path.join(tmp, "x"), "--bogus"], t)
    check(not os.path.exists(os.path.join(tmp, "x")), "a refused command line makes no -o directory")
    expect_refused(tmp, "--bogus", ["--bogus"] + valid, t)
    check(not os.path.exists(log), "no tool was called", open(log).read() if os.path.exists(log) else "")
    t.stop()


def test_detach(tmp):
    t = Target(tmp)
    valid = ["detach", "-p", t.pid, "--tree"]
    expect_all_refused(tmp, valid, t)
    expect_refused(tmp, "stray", valid + ["stray"], t)
    expect_refused(tmp, "stray", valid + ["--", "stray"], t)
    t.stop()


def test_status(tmp):
    t = Target(tmp)
    valid = ["status", "-p", t.pid]
    expect_all_refused(tmp, valid, t)
    expect_refused(tmp, "stray", valid + ["stray"], t)
    expect_refused(tmp, "stray", ["status", "stray", "-p", t.pid], t)
    expect_refused(tmp, "stray", valid + ["--", "stray"], t)
    t.stop()


def test_call(tmp):
    # Options come before SYMBOL, which begins the call: every positional is
    # SYMBOL or one of its arguments, so the stray words here are an unknown
    # option before SYMBOL, with or without "--" after it.
    t = Target(tmp)
    marker = os.path.join(tmp, "called")
    call = ["creat", marker, "420"]
    for word in ("--bogus", "-Q", "--bogus=1"):
        expect_refused(tmp, word, ["call", word, "-p", t.pid] + call, t)
        expect_refused(tmp, word, ["call", "-p", t.pid, word] + call, t)
        expect_refused(tmp, word, ["call", "-p", t.pid, word, "--"] + call, t)
    check(not os.path.exists(marker), "no call was made")
    # The arguments after SYMBOL are taken verbatim: a negative number, an
    # option of remora's or another word that looks like an option.
    for args, result in ((["labs", "-5"], "labs(-5) = 5 (0x5)"), (["--", "labs", "-7"], "labs(-7) = 7 (0x7)"),
                         (["strlen", "--bogus"], '= 7 (0x7)'), (["strlen", "-p"], '= 2 (0x2)')):
        rc, out, err = remora("call", "-p", t.pid, *args)
        check(rc == 0 and result in out, "remora call -p PID %s prints %r" % (" ".join(args), result),
              show(rc, out, err))
    t.stop()


def test_run(tmp):
    # CMD begins at the first positional ("--" before it is optional), so the
    # stray words here are unknown options before CMD.
    marker = os.path.join(tmp, "started")
    cmd = ["sh", "-c", 'echo "$@" > "$0"', marker, "--its-own-flag", "-x", "word"]
    for word in ("--bogus", "-Q", "--bogus=1"):
        expect_refused(tmp, word, ["run", word, "--no-tool", "--"] + cmd)
        expect_refused(tmp, word, ["run", "--no-tool", word, "--"] + cmd)
        expect_refused(tmp, word, ["run", "--no-tool", word] + cmd)
    check(not os.path.exists(marker), "no program was started")
    for dashes in (["--"], []):
        rc, out, err = remora("run", "--no-tool", *dashes, *cmd)
        check(rc == 0, "remora run --no-tool %s CMD runs CMD" % " ".join(dashes), show(rc, out, err))
        got = open(marker).read() if os.path.exists(marker) else "(no file)"
        check(got == "--its-own-flag -x word\n", "CMD got its own options and arguments", got)
        os.unlink(marker)


def test_events(tmp):
    t = Target(tmp)
    marker = os.path.join(tmp, "started")
    cmd = ["sh", "-c", 'echo "$@" > "$0"; exit 3', marker, "--its-own-flag", "-x"]
    for word in ("--bogus", "-Q"):
        expect_refused(tmp, word, ["events", word, "--follow", "--"] + cmd)
        expect_refused(tmp, word, ["events", "--follow", word, "--"] + cmd)
        expect_refused(tmp, word, ["events", "-p", t.pid, word], t)
    # The command comes after "--" only.
    expect_refused(tmp, "stray", ["events", "-p", t.pid, "stray"], t)
    expect_refused(tmp, "stray", ["events", "stray", "-p", t.pid], t)
    expect_refused(tmp, "stray", ["events", "stray", "--"] + cmd)
    expect_refused(tmp, "touch", ["events", "--follow", "touch", marker])
    expect_refused(tmp, "stray", ["events", "--follow", "stray", "--", "touch", marker])
    check(not os.path.exists(marker), "no program was started")
    rc, out, err = remora("events", "--follow", "--", *cmd)
    check(rc == 3 and "LAUNCHED" in out, "remora events --follow -- CMD runs CMD (exit 3)", show(rc, out, err))
    got = open(marker).read() if os.path.exists(marker) else "(no file)"
    check(got == "--its-own-flag -x\n", "CMD got its own options and arguments", got)
    t.stop()


def test_report(tmp):
    # Every positional is a DIR; a word after "--" that follows them is
    # returned by the subcommand to remora itself, which takes none.
    d = os.path.join(tmp, "session")
    os.mkdir(d)
    for word in ("--bogus", "-Q"):
        expect_refused(tmp, word, ["report", word, d])
        expect_refused(tmp, word, ["report", d, word])
    expect_refused(tmp, "stray", ["report", d, "--", "stray"])
    check(os.listdir(d) == [], "nothing was written into the directory", str(os.listdir(d)))


def test_slurm_node(tmp):
    # Started by srun with the front's command line (slurm_node.cc,
    # node_argv): --env takes one NAME=VALUE each time.
    valid = ["slurm-node", "--op", "status", "--job", "1", "--env", "A=1"]
    expect_all_refused(tmp, valid)
    expect_refused(tmp, "stray", valid + ["stray"])
    expect_refused(tmp, "stray", valid[:3] + ["stray"] + valid[3:])
    expect_refused(tmp, "stray", valid + ["--", "stray"])


TESTS = [v for k, v in list(globals().items()) if k.startswith("test_")]


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    for a in ("--remora", "--target", "--hook-tool"):
        ap.add_argument(a, required=True)
    ap.add_argument("tests", nargs="*")
    ARGS = ap.parse_args()
    for a in ("remora", "target", "hook_tool"):
        setattr(ARGS, a, os.path.abspath(getattr(ARGS, a)))
    # strace, where it is installed and may trace its child here.
    ARGS.strace = shutil.which("strace")
    if ARGS.strace and subprocess.run([ARGS.strace, "-f", "-qq", "-o", os.devnull, "true"], timeout=30,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        ARGS.strace = None
    if not ARGS.strace:
        print("note: no usable strace; the refusals are checked without it")
    failed = []
    for t in TESTS:
        if ARGS.tests and t.__name__ not in ARGS.tests and t.__name__[5:] not in ARGS.tests:
            continue
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="remora-args-") as tmp:
            try:
                t(tmp)
                print("ok    %s (%.1f s)" % (t.__name__, time.monotonic() - t0), flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on to the next test
                failed.append(t.__name__)
                detail = str(e) if isinstance(e, Failure) else traceback.format_exc()
                print("FAIL  %s: %s" % (t.__name__, detail), flush=True)
            finally:
                cleanup()
    print("%d of %d tests failed" % (len(failed), len(TESTS)) if failed else "all tests passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
