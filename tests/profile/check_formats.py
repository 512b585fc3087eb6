#!/usr/bin/env python3
"""Reads every output of one session with independent, strict readers.

usage: check_formats.py DIR [--profile PROFILE.json]

DIR holds trace.json, trace.perfetto, profile.pb.gz, flamegraph.svg,
folded.txt, stats.csv and summary.txt. Each is parsed by a reader that owes
nothing to Remora's writers: json (over a strict UTF-8 decode), gzip, the
protobuf modules protoc generates from the project's .proto files (PYTHONPATH
holds them: REMORA_PROTO_PYTHON_DIR), xml.etree and csv.

With --profile, the profile the files were written from (the test's own
description of it: every name as hex bytes) is the reference: the content is
checked, not only the syntax. Names are compared as Python decodes their
bytes with errors="replace" (one U+FFFD per maximal subpart, as the writers
do). Exits 1 with the reasons on failure."""
import collections
import csv
import gzip
import io
import json
import re
import sys
import time
import xml.etree.ElementTree as ET

try:
    import google.protobuf  # noqa: F401
except ImportError:
    sys.exit("python3 cannot import google.protobuf: install Debian's python3-protobuf "
             "(apt-get install python3-protobuf), a declared dependency of the tests")
import perfetto_trace_pb2 as perfetto
import pprof_profile_pb2 as pprof

STATS_HEADER = ["kind", "name", "calls", "total_ns", "mean_ns", "max_ns", "samples", "inclusive_samples", "share"]
MAX_REPEAT = 1000  # perfetto.cc: a sample of weight w is written min(w, 1000) times
errors = []


def fail(msg):
    errors.append(msg)


def text(raw):
    return raw.decode("utf-8", "replace")


def read_text(path):
    """The file as strict UTF-8: a reader that rejects what the writers must never write."""
    data = open(path, "rb").read()
    try:
        return data.decode("utf-8", "strict")
    except UnicodeDecodeError as e:
        fail("%s: not valid UTF-8: %s" % (path, e))
        return data.decode("utf-8", "replace")


class Model:
    """The test's profile, names decoded as the writers must show them."""

    def __init__(self, d):
        h = lambda s: text(bytes.fromhex(s))  # noqa: E731
        self.pid, self.ns_pid = d["pid"], d["ns_pid"]
        self.trace_pid = self.ns_pid if self.ns_pid > 0 else self.pid
        self.comm = h(d["comm"])
        self.start_ns, self.end_ns, self.hz = d["start_ns"], d["end_ns"], d["hz"]
        self.fold_threads = d["fold_threads"]
        self.threads = {t: (h(n) or "thread") for t, n in d["threads"]}
        self.fn_names = [h(n) for n in d["fn_names"]]
        self.frames = []
        for f in d["frames"]:
            f = dict(f)
            for k in ("function", "module", "file"):
                f[k] = h(f[k])
            if not f["function"]:
                f["function"] = "[unknown]"
            self.frames.append(f)
        self.stacks = d["stacks"]
        self.weights = [tuple(w) for w in d["stack_weights"]]  # (tid, stack, weight)
        self.samples = [tuple(s) for s in d["samples"]]  # (tid, weight, stack, ts)
        self.calls = [tuple(c) for c in d["calls"]]  # (tid, fn, start, dur)
        self.func_stats = [(h(n), c, t, m) for n, c, t, m in d["func_stats"]]
        self.counters = [tuple(c) for c in d["counters"]]  # (kind, tid, ts, value)
        self.modules = {h(p): (b, bid) for p, b, bid in d["modules"]}
        self.maps = [(s, e, o, h(p)) for s, e, o, p in d["maps"]]
        self.total = sum(w for _, _, w in self.weights)

    def frame(self, i):
        return self.frames[i] if i < len(self.frames) else {"function": "[unknown]", "module": "", "file": "",
                                                            "line": 0, "inlined": False, "address": 0,
                                                            "module_offset": 0, "kind": 2}

    def stack(self, i):
        return self.stacks[i] if i < len(self.stacks) else []

    def names(self, i):
        return [self.frame(f)["function"] for f in self.stack(i)]

    def thread_name(self, tid):
        return self.threads.get(tid, "thread")

    def tids(self):
        t = set(self.threads) | {w[0] for w in self.weights} | {s[0] for s in self.samples}
        t |= {c[0] for c in self.calls} | {c[1] for c in self.counters if c[0] == 2}
        return sorted(t)


def source(f):
    if not f["file"]:
        return ""
    return "%s:%d" % (f["file"], f["line"]) if f["line"] else f["file"]


def check_json(d, m):
    try:
        trace = json.loads(read_text(d + "/trace.json"))  # strict: no raw control characters in strings
    except ValueError as e:
        return fail("trace.json: not JSON: %s" % e)
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return fail("trace.json: no traceEvents list")
    for e in events:
        if any(k not in e for k in ("ph", "pid", "tid", "name")):
            fail("trace.json: event without ph/pid/tid/name: %r" % e)
    xs = [e for e in events if e.get("ph") == "X"]
    for e in xs:
        if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0 or not isinstance(e.get("ts"), (int, float)):
            fail("trace.json: bad X event %r" % e)
    for e in events:
        if e.get("ph") == "i" and e.get("s") not in ("t", "p", "g"):
            fail("trace.json: instant event without scope %r" % e)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if any(e.get("ph") in ("X", "i") for e in events) and not names:
        fail("trace.json: events but no thread_name metadata")
    if m is None:
        return
    for tid in m.tids():
        if names.get(tid) != m.thread_name(tid):
            fail("trace.json: thread %d named %r, want %r" % (tid, names.get(tid), m.thread_name(tid)))
    procs = [e for e in events if e.get("ph") == "M" and e.get("name") == "process_name"]
    if len(procs) != 1 or not procs[0]["args"]["name"].startswith(m.comm + " (pid %d" % m.pid):
        fail("trace.json: process_name %r, want %r (pid %d...)" % (procs, m.comm, m.pid))
    if any(e["pid"] != m.trace_pid for e in events):
        fail("trace.json: an event of another pid than %d" % m.trace_pid)
    want = sorted((m.fn_names[fn] if fn < len(m.fn_names) else "?", tid,
                   round(max(start - m.start_ns, 0) / 1000, 3), round(dur / 1000, 3)) for tid, fn, start, dur in m.calls)
    got = sorted((e["name"], e["tid"], round(e["ts"], 3), round(e["dur"], 3)) for e in xs)
    if got != want:
        fail("trace.json: calls %r, want %r" % (got[:5], want[:5]))
    samples = [e for e in events if e.get("ph") == "i" and e.get("cat") == "sample"]
    want = []
    for tid, weight, stack, ts in m.samples:
        names_ = m.names(stack)
        args = {"weight": weight, "stack": ";".join(names_[-32:])}
        if m.stack(stack):
            leaf = m.frame(m.stack(stack)[-1])
            if leaf["file"]:
                args["source"] = source(leaf)
            if leaf["module"]:
                args["module"] = leaf["module"]
        want.append((names_[-1] if names_ else "?", tid, json.dumps(args, sort_keys=True)))
    got = [(e["name"], e["tid"], json.dumps(e["args"], sort_keys=True)) for e in samples]
    if sorted(got) != sorted(want):
        fail("trace.json: samples %r, want %r" % (sorted(got)[:3], sorted(want)[:3]))


def perfetto_packets(d):
    data = open(d + "/trace.perfetto", "rb").read()
    trace = perfetto.Trace()
    trace.ParseFromString(data)
    if trace.SerializeToString() != data:
        fail("trace.perfetto: fields the reader does not know (or a re-encoding that differs)")
    return list(trace.packet)


def check_perfetto_structure(packets):
    if not packets:
        return fail("trace.perfetto: no packet")
    first = packets[0]
    if not first.HasField("clock_snapshot") or first.clock_snapshot.primary_trace_clock != perfetto.BUILTIN_CLOCK_MONOTONIC:
        fail("trace.perfetto: the first packet is no ClockSnapshot naming CLOCK_MONOTONIC the trace clock")
    if not first.sequence_flags & perfetto.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
        fail("trace.perfetto: the first packet does not clear the sequence's incremental state")
    seqs = {p.trusted_packet_sequence_id for p in packets}
    if seqs != {1}:
        fail("trace.perfetto: sequences %r, want the one sequence 1" % seqs)
    last_ts, seen_interned = 0, False
    for p in packets[1:]:
        if p.HasField("interned_data"):
            seen_interned = True
        if p.HasField("timestamp"):
            if p.timestamp_clock_id != perfetto.BUILTIN_CLOCK_MONOTONIC:
                fail("trace.perfetto: a timed packet without timestamp_clock_id MONOTONIC")
            if p.timestamp < last_ts:
                fail("trace.perfetto: packets out of time order (%d after %d)" % (p.timestamp, last_ts))
            last_ts = p.timestamp
        if p.HasField("perf_sample"):
            if not seen_interned:
                fail("trace.perfetto: a PerfSample before the interned data")
            if not p.sequence_flags & perfetto.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
                fail("trace.perfetto: a PerfSample without SEQ_NEEDS_INCREMENTAL_STATE")


class Interned:
    def __init__(self, packets):
        self.tables = collections.defaultdict(dict)
        for p in packets:
            if not p.HasField("interned_data"):
                continue
            i = p.interned_data
            for field in ("function_names", "source_paths", "build_ids", "mapping_paths"):
                for s in getattr(i, field):
                    self.tables[field][s.iid] = s.str
            for field in ("mappings", "frames", "callstacks"):
                for x in getattr(i, field):
                    if x.iid in self.tables[field]:
                        fail("trace.perfetto: %s iid %d interned twice" % (field, x.iid))
                    self.tables[field][x.iid] = x

    def get(self, field, iid, what):
        if iid not in self.tables[field]:
            fail("trace.perfetto: %s refers to %s iid %d, not interned" % (what, field, iid))
            return None
        return self.tables[field][iid]


def check_perfetto_frames(m, interned, stack_index, callstack_iid):
    cs = interned.get("callstacks", callstack_iid, "a PerfSample")
    if cs is None:
        return
    want = m.stack(stack_index)
    if len(cs.frame_ids) != len(want):
        return fail("trace.perfetto: callstack %d has %d frames, want %d" % (callstack_iid, len(cs.frame_ids), len(want)))
    for fid, fi in zip(cs.frame_ids, want):  # both root first
        fr, f = interned.get("frames", fid, "a callstack"), m.frame(fi)
        if fr is None:
            continue
        name = interned.get("function_names", fr.function_name_id, "a frame")
        if name is not None and text(name) != f["function"]:
            fail("trace.perfetto: frame named %r, want %r" % (name, f["function"]))
        if fr.rel_pc != f["module_offset"]:
            fail("trace.perfetto: frame %r rel_pc %#x, want %#x" % (f["function"], fr.rel_pc, f["module_offset"]))
        src = interned.get("source_paths", fr.source_path_iid, "a frame") if fr.source_path_iid else b""
        if (text(src or b""), fr.line_number) != (f["file"], f["line"]):
            fail("trace.perfetto: frame %r at %r:%d, want %r:%d" % (f["function"], src, fr.line_number,
                                                                     f["file"], f["line"]))
        mp = interned.get("mappings", fr.mapping_id, "a frame")
        if mp is None:
            continue
        path = "".join("/" + text(interned.get("mapping_paths", c, "a mapping") or b"") for c in mp.path_string_ids)
        module = f["module"] or "[unknown]"
        if path != (module if module.startswith("/") else "/" + module):
            fail("trace.perfetto: frame %r in mapping %r, want %r" % (f["function"], path, module))
        build_id = interned.get("build_ids", mp.build_id, "a mapping").hex() if mp.build_id else ""
        if build_id != m.modules.get(f["module"], (0, ""))[1].lower():
            fail("trace.perfetto: mapping %r build id %r, want %r" % (module, build_id, m.modules.get(f["module"])))


def check_perfetto_tracks(m, packets):
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in packets if p.HasField("track_descriptor")}
    procs = [t for t in tracks.values() if t.HasField("process")]
    if len(procs) != 1 or procs[0].process.pid != m.trace_pid or procs[0].process.process_name != m.comm:
        fail("trace.perfetto: process tracks %r, want pid %d named %r" % (procs, m.trace_pid, m.comm))
    threads = {t.thread.tid: t for t in tracks.values() if t.HasField("thread")}
    for tid in m.tids():
        t = threads.get(tid)
        if t is None or t.thread.thread_name != m.thread_name(tid) or t.thread.pid != m.trace_pid:
            fail("trace.perfetto: thread %d track %r, want named %r" % (tid, t, m.thread_name(tid)))
    # Slices: balanced per track, in file order; read back as a reader does
    # (each end closes the innermost open slice), each is one of the calls,
    # ending when it did or (a call that outlasts its parent's) earlier.
    depth, begun = collections.Counter(), collections.Counter()
    open_slices = collections.defaultdict(list)
    ends = collections.defaultdict(list)
    for tid, fn, start, dur in m.calls:
        ends[(tid, m.fn_names[fn] if fn < len(m.fn_names) else "?", start)].append(start + dur)
    counters = collections.defaultdict(list)
    for p in packets:
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        if e.track_uuid not in tracks:
            fail("trace.perfetto: an event on track %d, never described" % e.track_uuid)
            continue
        if e.type == perfetto.TrackEvent.TYPE_SLICE_BEGIN:
            depth[e.track_uuid] += 1
            begun[(tracks[e.track_uuid].thread.tid, e.name)] += 1
            open_slices[e.track_uuid].append((tracks[e.track_uuid].thread.tid, e.name, p.timestamp))
        elif e.type == perfetto.TrackEvent.TYPE_SLICE_END:
            depth[e.track_uuid] -= 1
            if depth[e.track_uuid] < 0:
                fail("trace.perfetto: a slice ends on track %d with none open" % e.track_uuid)
                continue
            key = open_slices[e.track_uuid].pop()
            if key not in ends or p.timestamp > max(ends[key]):
                fail("trace.perfetto: slice %r ends at %d, after its call (%r)" % (key, p.timestamp, ends.get(key)))
        elif e.type == perfetto.TrackEvent.TYPE_COUNTER:
            t = tracks[e.track_uuid]
            if not t.HasField("counter"):
                fail("trace.perfetto: a counter value on a track with no CounterDescriptor")
            counters[e.track_uuid].append((p.timestamp, e.counter_value))
    if any(depth.values()):
        fail("trace.perfetto: unbalanced slices %r" % depth)
    want = collections.Counter((tid, m.fn_names[fn] if fn < len(m.fn_names) else "?") for tid, fn, _, _ in m.calls)
    if begun != want:
        fail("trace.perfetto: slices %r, want %r" % (begun, want))
    # Counters: RSS on a bytes track under the process, CPU on a ns track under each thread.
    want = collections.defaultdict(list)
    for kind, tid, ts, value in m.counters:
        want[("rss", 0) if kind == 1 else ("cpu", tid)].append((ts, value))
    got = {}
    for uuid, values in counters.items():
        t = tracks[uuid]
        parent = tracks.get(t.parent_uuid)
        if t.counter.unit == perfetto.CounterDescriptor.UNIT_SIZE_BYTES and parent is not None and parent.HasField("process"):
            got[("rss", 0)] = values
        elif t.counter.unit == perfetto.CounterDescriptor.UNIT_TIME_NS and parent is not None and parent.HasField("thread"):
            got[("cpu", parent.thread.tid)] = values
        else:
            fail("trace.perfetto: counter track %r" % t)
    for k in set(want) | set(got):
        if sorted(want.get(k, [])) != sorted(got.get(k, [])):
            fail("trace.perfetto: counter %r values %r, want %r" % (k, got.get(k), want.get(k)))


def check_perfetto(d, m):
    try:
        packets = perfetto_packets(d)
    except Exception as e:  # protobuf's DecodeError and what a truncated file raises
        return fail("trace.perfetto: not a Perfetto trace: %s" % e)
    check_perfetto_structure(packets)
    if m is None:
        return
    interned = Interned(packets)
    check_perfetto_tracks(m, packets)
    got = collections.Counter()
    for p in packets:
        if not p.HasField("perf_sample"):
            continue
        s = p.perf_sample
        if s.pid != m.trace_pid:
            fail("trace.perfetto: a sample of pid %d, want %d" % (s.pid, m.trace_pid))
        got[(s.tid, s.callstack_iid, p.timestamp)] += 1
    want = collections.Counter()
    resolved = {}
    for tid, weight, stack, ts in m.samples:
        want[(tid, stack, ts)] += min(max(weight, 1), MAX_REPEAT)
    # Match each sample to the model's by thread and time, then resolve its callstack.
    by_key = {(tid, ts): stack for tid, _, stack, ts in m.samples}
    got_by_stack = collections.Counter()
    for (tid, iid, ts), n in got.items():
        stack = by_key.get((tid, ts))
        if stack is None:
            fail("trace.perfetto: a sample of thread %d at %d the profile does not have" % (tid, ts))
            continue
        if not m.stack(stack):
            if iid:
                fail("trace.perfetto: a sample of an empty stack has callstack %d" % iid)
        elif (stack, iid) not in resolved:
            resolved[(stack, iid)] = True
            check_perfetto_frames(m, interned, stack, iid)
        got_by_stack[(tid, stack, ts)] += n
    if got_by_stack != want:
        fail("trace.perfetto: samples %r, want %r" % (sorted(got_by_stack.items())[:4], sorted(want.items())[:4]))


def check_pprof(d, m):
    raw = open(d + "/profile.pb.gz", "rb").read()
    if raw[:2] != b"\x1f\x8b":
        return fail("profile.pb.gz: no gzip header")
    try:
        prof = pprof.Profile()
        prof.ParseFromString(gzip.decompress(raw))
    except Exception as e:  # gzip's and protobuf's errors
        return fail("profile.pb.gz: not a gzip'ed pprof profile: %s" % e)
    st = list(prof.string_table)
    if not st or st[0] != "":
        return fail("profile.pb.gz: string_table[0] is not \"\"")

    def s(i):
        if not 0 <= i < len(st):
            fail("profile.pb.gz: string index %d out of the table" % i)
            return ""
        return st[i]
    types = [(s(t.type), s(t.unit)) for t in prof.sample_type]
    if types != [("samples", "count"), ("cpu", "nanoseconds")]:
        fail("profile.pb.gz: sample types %r" % types)
    if (s(prof.period_type.type), s(prof.period_type.unit)) != ("cpu", "nanoseconds"):
        fail("profile.pb.gz: period type")
    fns = {f.id: f for f in prof.function}
    maps = {mp.id: mp for mp in prof.mapping}
    locs = {loc.id: loc for loc in prof.location}
    for loc in prof.location:
        if loc.mapping_id and loc.mapping_id not in maps:
            fail("profile.pb.gz: location %d in mapping %d, absent" % (loc.id, loc.mapping_id))
        for line in loc.line:
            if line.function_id not in fns:
                fail("profile.pb.gz: location %d line of function %d, absent" % (loc.id, line.function_id))
    if m is None:
        return
    period = 10**9 // m.hz if m.hz > 0 else 0
    if prof.period != period:
        fail("profile.pb.gz: period %d, want %d" % (prof.period, period))
    if prof.duration_nanos != max(m.end_ns - m.start_ns, 0):
        fail("profile.pb.gz: duration %d" % prof.duration_nanos)
    wall = time.time_ns() - time.monotonic_ns() + m.start_ns
    if abs(prof.time_nanos - wall) > 60 * 10**9:
        fail("profile.pb.gz: time_nanos %d, want about %d (wall clock at the start)" % (prof.time_nanos, wall))
    got = collections.Counter()
    for smp in prof.sample:
        labels = {s(lb.key): (s(lb.str) if lb.str else lb.num) for lb in smp.label}
        frames = []  # leaf first
        for lid in smp.location_id:
            loc = locs.get(lid)
            if loc is None:
                fail("profile.pb.gz: sample of location %d, absent" % lid)
                continue
            for line in loc.line:  # innermost first
                f = fns.get(line.function_id)
                frames.append((s(f.name) if f else "?", s(f.filename) if f else "", line.line))
        if len(smp.value) != 2 or smp.value[1] != smp.value[0] * period:
            fail("profile.pb.gz: sample values %r" % list(smp.value))
        got[(labels.get("tid"), labels.get("thread"), tuple(frames))] += smp.value[0] if smp.value else 0
    want = collections.Counter()
    for tid, stack, weight in m.weights:
        frames = tuple((m.frame(f)["function"], m.frame(f)["file"], m.frame(f)["line"]) for f in reversed(m.stack(stack)))
        want[(tid, m.thread_name(tid), frames)] += weight
    if got != want:
        fail("profile.pb.gz: samples %r, want %r" % (sorted(got.items())[:3], sorted(want.items())[:3]))
    if sum(got.values()) != m.total:
        fail("profile.pb.gz: %d samples in all, want %d" % (sum(got.values()), m.total))
    # Inlined code: one Location holding every function inlined at its
    # address, the innermost first, the function they were inlined into last
    # (the sample check above has their order along the stack).
    multi = [loc for loc in prof.location if len(loc.line) > 1]
    if any(m.frame(fi)["inlined"] for _, st, _ in m.weights for fi in m.stack(st)) and not multi:
        fail("profile.pb.gz: inlined frames, but no location with several lines")
    for loc in multi:
        names = [s(fns[line.function_id].name) for line in loc.line]
        inlined = {f["function"]: f["inlined"] for f in m.frames if f["address"] == loc.address}
        if not all(inlined.get(n) for n in names[:-1]) or inlined.get(names[-1], True):
            fail("profile.pb.gz: location at %#x lines %r: not the inlined ones first (%r)" % (loc.address, names, inlined))
    for mp in prof.mapping:
        path = s(mp.filename)
        if path not in m.modules and path != "[jit]":
            fail("profile.pb.gz: mapping %r of no module" % path)
        elif path in m.modules and s(mp.build_id) != m.modules[path][1]:
            fail("profile.pb.gz: mapping %r build id %r, want %r" % (path, s(mp.build_id), m.modules[path][1]))


def check_svg(d, m):
    try:
        root = ET.fromstring(open(d + "/flamegraph.svg", "rb").read())
    except ET.ParseError as e:
        return fail("flamegraph.svg: not well-formed XML: %s" % e)
    ns = "{http://www.w3.org/2000/svg}"
    if root.tag != ns + "svg":
        return fail("flamegraph.svg: root is %s" % root.tag)
    script = "".join(e.text or "" for e in root.iter(ns + "script"))
    for needle in ("function search", "new RegExp", "data-s"):
        if needle not in script:
            fail("flamegraph.svg: the search script lacks %r" % needle)
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    if not {"search", "reset", "matched"} <= ids:
        fail("flamegraph.svg: controls %r" % ids)
    boxes, values = {}, {}
    for g in root.iter(ns + "g"):
        if g.get("class") != "f":
            continue
        title = g.find(ns + "title").text or ""
        mt = re.fullmatch(r"(.*) \((\d+) samples, ([0-9.]+)%\)", title, re.S)
        if not mt:
            fail("flamegraph.svg: title %r" % title)
            continue
        label, src = mt.group(1), g.get("data-s")
        if src is not None:
            if not label.endswith(" (" + src + ")"):
                fail("flamegraph.svg: title %r does not end with its data-s %r" % (label, src))
            label = label[: -len(src) - 3]
        if int(g.get("data-v")) != int(mt.group(2)):
            fail("flamegraph.svg: data-v %s, title %s" % (g.get("data-v"), mt.group(2)))
        boxes.setdefault(label, set()).add(src)
        values[label] = max(values.get(label, 0), int(g.get("data-v")))
    if m is None:
        return
    drawn = sum(w for _, st, w in m.weights if m.stack(st) or m.fold_threads)
    if drawn and values.get("all") != drawn:
        fail("flamegraph.svg: the root box holds %r samples, want all %d" % (values.get("all"), drawn))
    # Each function shows its source: where all its frames agree, file:line.
    by_name = collections.defaultdict(set)
    for tid, stack, weight in m.weights:
        for fi in m.stack(stack):
            f = m.frame(fi)
            by_name[f["function"]].add(source(f))
    for name, srcs in by_name.items():
        if name not in boxes:
            fail("flamegraph.svg: no box for %r (have %r)" % (name, sorted(boxes)[:10]))
        elif len(srcs) == 1:
            want = next(iter(srcs)) or None
            if want not in boxes[name]:
                fail("flamegraph.svg: %r shows source %r, want %r" % (name, boxes[name], want))


def check_csv(d, m):
    rows = list(csv.reader(io.StringIO(read_text(d + "/stats.csv"), newline="")))
    if not rows or rows[0] != STATS_HEADER:
        return fail("stats.csv: header is %r" % (rows[0] if rows else None))
    for r in rows[1:]:
        if len(r) != len(STATS_HEADER) or r[0] not in ("call", "sample"):
            fail("stats.csv: bad row %r" % r)
    if m is None:
        return
    calls = [(r[1], int(r[2]), int(r[3]), int(r[5])) for r in rows[1:] if r[0] == "call"]
    want = sorted([f for f in m.func_stats if f[1] > 0], key=lambda f: -f[2])
    if sorted(calls) != sorted(want):
        fail("stats.csv: calls %r, want %r" % (calls, want))
    samples = {r[1]: (int(r[6]), int(r[7])) for r in rows[1:] if r[0] == "sample"}
    self_, incl = collections.Counter(), collections.Counter()
    for tid, stack, weight in m.weights:
        fr = [m.frame(f) for f in m.stack(stack)]
        if not fr:
            continue
        labels = [f["function"] + (" (%s)" % source(f) if f["file"] else "") for f in fr]
        self_[labels[-1]] += weight
        for lb in set(labels):
            incl[lb] += weight
    want = {lb: (self_[lb], incl[lb]) for lb in incl}
    if samples != want:
        fail("stats.csv: samples %r, want %r" % (sorted(samples.items())[:4], sorted(want.items())[:4]))


def check_folded(d, m):
    folded = {}
    for line in read_text(d + "/folded.txt").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            return fail("folded.txt: bad line %r" % line)
        folded[stack] = folded.get(stack, 0) + int(count)
    if m is None:
        return
    want = collections.Counter()
    for tid, stack, weight in m.weights:
        names = [n.replace(";", ":").replace("\n", " ") for n in m.names(stack)]
        if m.fold_threads:
            names.insert(0, ("%s-%d" % (m.thread_name(tid), tid)).replace(";", ":").replace("\n", " "))
        if names:
            want[";".join(names)] += weight
    if folded != dict(want):
        fail("folded.txt: %r, want %r" % (sorted(folded.items())[:4], sorted(want.items())[:4]))


def check_summary(d, m):
    summary = read_text(d + "/summary.txt")
    for needle in ("Remora profile of", "trace.perfetto", "profile.pb.gz", "flamegraph.svg"):
        if needle not in summary:
            fail("summary.txt: no %r" % needle)
    if m is not None and m.comm not in summary:
        fail("summary.txt: no %r" % m.comm)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    d, model = args[0], None
    if len(args) == 3 and args[1] == "--profile":
        model = Model(json.load(open(args[2], encoding="utf-8")))
    elif len(args) != 1:
        sys.exit(__doc__)
    for check in (check_json, check_perfetto, check_pprof, check_svg, check_csv, check_folded, check_summary):
        try:
            check(d, model)
        except (OSError, KeyError, IndexError, TypeError, ValueError) as e:
            fail("%s: %s: %s" % (check.__name__, type(e).__name__, e))
    if errors:
        print("\n".join(errors))
        sys.exit(1)
    print("all outputs of %s read back%s" % (d, " and match the profile" if model else ""))


if __name__ == "__main__":
    main()
