#!/usr/bin/env python3
"""Side-by-side profile benchmark (issue 11, part 5): `remora attach` with
the default tool against `perf record -F 99 -g` (frame pointers) and
`perf record -F 99 --call-graph dwarf`, each perf run followed by
`perf script` and a folding of our own, on one workload with known shares
(bench/profile_workload.c: -O2, no frame pointers, -g).

In N interleaved rounds (the order of the three rotates each round), each
profiler gets an unprofiled baseline window, then a profiled one of the same
workload process. Per run it computes, from the folded stacks:

- the shares of the three leaves (leaf_hash/leaf_float/leaf_table, of their
  sum) against the truth the workload measured in that window (about
  50/30/20);
- the inclusive share of driver() (samples with it anywhere on the stack)
  against the driver thread's share of the workload's CPU time;
- the throughput lost: driver rounds/s while profiled against the baseline
  window just before;
- the wall time from the profiler's start to its finished output (remora:
  `remora attach -d` exits with flamegraph.svg and folded.txt written; perf:
  perf record, perf script and the folding done);
- the bytes of data (remora: the session directory, profile.remora and the
  rendered files; perf: perf.data);
- the fraction of frames that are offsets ("libc.so.6+0x1234", "[unknown]")
  instead of names.

Prints every run, then a markdown table of the medians. Needs root (perf on
another process, remora attach) and perf; uses -e cpu-clock when the
hardware cycles event cannot be opened (a VM without a PMU), and says so.

  python3 bench/profile_vs_perf.py --remora build/bin/remora \
      --workload build/bin/remora-bench-profile-workload [--rounds 5] [--duration-ms 5000]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

LEAVES = ("leaf_hash", "leaf_float", "leaf_table")
DRIVER = "driver"
TOOLS = ("remora", "perf -g", "perf dwarf")


class Failure(Exception):
    pass


class Workload:
    """The workload process and its 100 ms ticks (cumulative counters, see
    profile_workload.c), read by a thread as they come."""

    FIELDS = ("mono_ns", "rounds", "hash_ns", "float_ns", "table_ns", "driver_cpu", "libc_cpu", "main_cpu",
              "libc_ops")

    def __init__(self, path):
        self.proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.ticks, self.lock = [], threading.Lock()
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()
        if not self.ready.wait(30):
            self.proc.kill()
            raise Failure("the workload did not say ready within 30 s: " + self.proc.stderr.read(2000))

    def read(self):
        for line in self.proc.stdout:
            if line.strip() == "ready":
                self.ready.set()
            elif line.startswith("tick "):
                values = [int(v) for v in line.split()[1:]]
                tick = dict(zip(self.FIELDS, values))
                tick["t"] = tick["mono_ns"] / 1e9  # CLOCK_MONOTONIC, as time.monotonic()
                with self.lock:
                    self.ticks.append(tick)

    def window(self, t0, t1):
        """Counter deltas between the first and last tick inside [t0, t1]."""
        with self.lock:
            inside = [k for k in self.ticks if t0 <= k["t"] <= t1]
        if len(inside) < 2:
            raise Failure("fewer than 2 workload ticks in a window of %.1f s: is it stalled?" % (t1 - t0))
        a, b = inside[0], inside[-1]
        d = {f: b[f] - a[f] for f in self.FIELDS}
        d["seconds"] = b["t"] - a["t"]
        return d

    def stop(self):
        try:
            self.proc.stdin.close()  # the workload exits when stdin closes
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)


def truth(d):
    leaves = d["hash_ns"] + d["float_ns"] + d["table_ns"]
    cpu = d["driver_cpu"] + d["libc_cpu"] + d["main_cpu"]
    return {
        "leaf_hash": d["hash_ns"] / leaves, "leaf_float": d["float_ns"] / leaves,
        "leaf_table": d["table_ns"] / leaves, "driver": d["driver_cpu"] / cpu,
    }


OFFSET = re.compile(r"(\+0x[0-9a-f]+$)|(^\[unknown\])")


def analyse_folded(path):
    """Shares, inclusive driver share and the offset-frame fraction of a
    folded file ("root;...;leaf COUNT")."""
    total = frames = offsets = 0
    leaf = dict.fromkeys(LEAVES, 0)
    driver = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, count = line.rsplit(" ", 1)
            n = int(count)
            names = stack.split(";")
            total += n
            frames += n * len(names)
            offsets += n * sum(1 for x in names if OFFSET.search(x))
            bare = {x.split(".")[0] for x in names}  # leaf_hash.cold and the like count as the function
            for name in LEAVES:
                if name in bare:
                    leaf[name] += n
            if DRIVER in bare:
                driver += n
    leaves = sum(leaf.values())
    if not total or not leaves:
        raise Failure("%s: no samples of the leaves (%d samples)" % (path, total))
    r = {name: leaf[name] / leaves for name in LEAVES}
    r.update(driver=driver / total, samples=total, offsets=offsets / frames if frames else 0.0)
    return r


PERF_FRAME = re.compile(r"^\s+([0-9a-f]+)\s+(.*?)\s+\((.*)\)$")


def fold_perf_script(lines, out_path):
    """perf script's default output into folded stacks, root first: a sample
    is a header line then one indented line per frame ("ADDR SYM+0xOFF
    (DSO)"), then a blank line. Unnamed frames read DSO+0xADDR."""
    counts, stack = {}, []

    def flush():
        if stack:
            key = ";".join(reversed(stack))
            counts[key] = counts.get(key, 0) + 1
            stack.clear()

    for line in lines:
        if not line.strip():
            flush()
            continue
        m = PERF_FRAME.match(line)
        if not m:  # a header: a new sample
            flush()
            continue
        addr, sym, dso = m.groups()
        if sym.startswith("[unknown]"):
            base = os.path.basename(dso)
            name = "[unknown]" if base in ("", "[unknown]") else "%s+0x%s" % (base, addr)
        else:
            name = re.sub(r"\+0x[0-9a-f]+$", "", sym)
        stack.append(name)
    flush()
    with open(out_path, "w") as f:
        for key, n in sorted(counts.items()):
            f.write("%s %d\n" % (key, n))


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            p = os.path.join(root, name)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def run_remora(args, pid, work):
    out = os.path.join(work, "remora-out")
    start = time.monotonic()
    r = subprocess.run([args.remora, "attach", "-p", str(pid), "-d", str(args.duration_ms),
                        "--attach-children=false", "-e", "REMORA_OUTPUT_PATH=" + out],
                       capture_output=True, text=True, timeout=args.duration_ms / 1000 + 120)
    done = time.monotonic()
    if r.returncode != 0:
        raise Failure("remora attach exited %d:\n%s\n%s" % (r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
    m = re.search(r"^==> pid %d: (\S+)$" % pid, r.stdout, re.M)
    if not m:
        raise Failure("remora named no output directory:\n" + r.stdout[-3000:])
    session = m.group(1)
    for name in ("folded.txt", "flamegraph.svg"):
        if not os.path.exists(os.path.join(session, name)):
            raise Failure("remora wrote no %s in %s" % (name, session))
    return {"start": start, "done": done, "folded": os.path.join(session, "folded.txt"),
            "bytes": dir_bytes(session), "raw_bytes": os.path.getsize(os.path.join(session, "profile.remora"))
            if os.path.exists(os.path.join(session, "profile.remora")) else 0}


def run_perf(args, pid, work, tag, callgraph):
    data = os.path.join(work, "perf-%s.data" % tag)
    folded = os.path.join(work, "perf-%s.folded" % tag)
    start = time.monotonic()
    r = subprocess.run([args.perf, "record", "-F", "99", "-e", args.event] + callgraph +
                       ["-p", str(pid), "-o", data, "--", "sleep", str(args.duration_ms / 1000)],
                       capture_output=True, text=True, timeout=args.duration_ms / 1000 + 120)
    if r.returncode != 0:
        raise Failure("perf record exited %d:\n%s" % (r.returncode, r.stderr[-3000:]))
    # stderr into a file: a pipe read only after stdout could fill and stall it.
    with tempfile.TemporaryFile("w+") as err:
        script = subprocess.Popen([args.perf, "script", "-i", data], stdout=subprocess.PIPE, stderr=err, text=True,
                                  errors="replace")
        fold_perf_script(script.stdout, folded)
        if script.wait(timeout=300) != 0:
            err.seek(0)
            raise Failure("perf script exited %d:\n%s" % (script.returncode, err.read()[-3000:]))
    done = time.monotonic()
    size = os.path.getsize(data)
    return {"start": start, "done": done, "folded": folded, "bytes": size, "raw_bytes": size}


def pick_event():
    """cycles where the CPU's PMU is there, else the cpu-clock software
    event (perf itself falls back to it silently)."""
    devices = "/sys/bus/event_source/devices"
    if any(os.path.isdir(os.path.join(devices, d)) for d in ("cpu", "cpu_core", "cpu_atom")):
        return "cycles"
    print("note: no CPU PMU here (%s has no cpu; a VM): perf records -e cpu-clock" % devices)
    return "cpu-clock"


def one_run(args, wl, tool, work, tag):
    base_t0 = time.monotonic()
    time.sleep(args.baseline_s)  # the unprofiled window: it is measured, nothing waits on it
    base = wl.window(base_t0, time.monotonic())
    if tool == "remora":
        res = run_remora(args, wl.proc.pid, work)
    else:
        cg = ["-g"] if tool == "perf -g" else ["--call-graph", "dwarf"]
        res = run_perf(args, wl.proc.pid, work, tag, cg)
    dur = args.duration_ms / 1000
    # Throughput over the inside of the recording (its edges are attach and
    # detach); the truth over the whole recording.
    prof = wl.window(res["start"] + 0.5, res["start"] + dur - 0.2)
    res["truth"] = truth(wl.window(res["start"], res["start"] + dur))
    res["lost"] = 1 - (prof["rounds"] / prof["seconds"]) / (base["rounds"] / base["seconds"])
    # Per CPU second of the driver thread: what profiling costs the thread
    # itself (signal handlers, the kernel's sample copies), blind to what
    # other programs on a shared machine take from it.
    res["cpu_lost"] = 1 - (prof["rounds"] / prof["driver_cpu"]) / (base["rounds"] / base["driver_cpu"])
    res["wall"] = res["done"] - res["start"]
    res.update(analyse_folded(res["folded"]))
    return res


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def report(results, args):
    tools = args.tools
    pts = lambda x: "%.1f" % (100 * x)
    print("\n### medians of %d rounds, %d ms sessions, perf -e %s\n" % (args.rounds, args.duration_ms, args.event))
    print("| measurement | truth | " + " | ".join(tools) + " |")
    print("|---|---|" + "---|" * len(tools))
    all_rows = [r for t in tools for r in results[t]]
    for name in LEAVES + (DRIVER,):
        label = "%s share %%" % name if name != DRIVER else "driver inclusive %"
        tr = statistics.median(r["truth"][name] for r in all_rows)
        cells = []
        for t in tools:
            cells.append("%s (%+.1f)" % (pts(median(results[t], name)),
                                         100 * statistics.median(r[name] - r["truth"][name] for r in results[t])))
        print("| %s | %s | %s |" % (label, pts(tr), " | ".join(cells)))
    worst = {t: statistics.median(max(abs(r[n] - r["truth"][n]) for n in LEAVES) for r in results[t])
             for t in tools}
    print("| worst leaf error, points | 0 | %s |" % " | ".join("%.1f" % (100 * worst[t]) for t in tools))
    print("| throughput lost (rounds/s) %% | 0 | %s |" % " | ".join(
        "%.1f" % (100 * median(results[t], "lost")) for t in tools))
    print("| throughput lost per driver CPU s %% | 0 | %s |" % " | ".join(
        "%.1f" % (100 * median(results[t], "cpu_lost")) for t in tools))
    dur = args.duration_ms / 1000
    print("| start to finished output, s | %.1f | %s |" % (dur, " | ".join(
        "%.2f (+%.2f)" % (median(results[t], "wall"), median(results[t], "wall") - dur) for t in tools)))
    print("| data, KiB (remora: everything it wrote) | | %s |" % " | ".join(
        "%.0f" % (median(results[t], "bytes") / 1024) for t in tools))
    print("| recorded data, KiB (profile.remora; perf.data) | | %s |" % " | ".join(
        "%.0f" % (median(results[t], "raw_bytes") / 1024) for t in tools))
    print("| frames that are offsets %% | | %s |" % " | ".join(
        "%.1f" % (100 * median(results[t], "offsets")) for t in tools))
    print("| samples | | %s |" % " | ".join("%.0f" % median(results[t], "samples") for t in tools))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--remora", required=True)
    ap.add_argument("--workload", required=True, help="remora-bench-profile-workload")
    ap.add_argument("--perf", default=shutil.which("perf") or "perf")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration-ms", type=int, default=5000)
    ap.add_argument("--baseline-s", type=float, default=3.0)
    ap.add_argument("--event", help="perf's event (default: cycles if it can be opened, else cpu-clock)")
    ap.add_argument("--tools", default=",".join(TOOLS), help="a subset of: " + ", ".join(TOOLS))
    ap.add_argument("--keep", help="keep the data in this directory (default: a temporary one, removed)")
    args = ap.parse_args()
    if not shutil.which(args.perf):
        print("perf not found (Debian: linux-perf)")
        return 1
    args.tools = tuple(t.strip() for t in args.tools.split(","))
    if not set(args.tools) <= set(TOOLS):
        print("--tools: choose among %s" % ", ".join(TOOLS))
        return 1
    args.event = args.event or pick_event()
    work = args.keep or tempfile.mkdtemp(prefix="remora-profile-vs-perf-")
    os.makedirs(work, exist_ok=True)
    results = {t: [] for t in args.tools}
    wl = Workload(args.workload)
    try:
        time.sleep(1.0)  # let the workload settle: measured windows only, nothing waits on it
        for rnd in range(args.rounds):
            k = rnd % len(args.tools)
            order = args.tools[k:] + args.tools[:k]
            for tool in order:
                tag = "%s-%d" % (tool.replace(" ", "-"), rnd)
                r = one_run(args, wl, tool, work, tag)
                results[tool].append(r)
                print("round %d %-10s leaves %s (truth %s)  driver %.1f%% (truth %.1f%%)  lost %.1f%%  "
                      "(per CPU s %.1f%%)  wall %.2f s  %d KiB  offsets %.1f%%  %d samples" % (
                          rnd + 1, tool, "/".join("%.1f" % (100 * r[n]) for n in LEAVES),
                          "/".join("%.1f" % (100 * r["truth"][n]) for n in LEAVES), 100 * r["driver"],
                          100 * r["truth"]["driver"], 100 * r["lost"], 100 * r["cpu_lost"], r["wall"],
                          r["bytes"] // 1024,
                          100 * r["offsets"], r["samples"]), flush=True)
            if wl.proc.poll() is not None:
                raise Failure("the workload exited (status %s)" % wl.proc.returncode)
        report(results, args)
        with open("/proc/loadavg") as f:
            print("\nload average at the end: %s" % " ".join(f.read().split()[:3]))
    except (Failure, OSError, subprocess.SubprocessError) as e:
        print("FAIL: %s" % e)
        return 1
    finally:
        wl.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
