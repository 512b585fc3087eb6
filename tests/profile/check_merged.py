#!/usr/bin/env python3
"""Reads a merged job's trace.perfetto and profile.pb.gz with python3's protobuf.

usage: check_merged.py JOBDIR NRANKS

A reader that owes nothing to libprotobuf or to the merge (src/profile/merge.h):
the modules protoc generates from the project's .proto files (PYTHONPATH
holds them: REMORA_PROTO_PYTHON_DIR). Checks what a viewer relies on: one
process per merged rank, no track uuid twice, no sequence shared by two
processes, every sample's callstack interned on its own sequence; in the
pprof, every sample labelled with its node and rank and every index in
range. Exits 1 with the reasons on failure."""
import collections
import gzip
import sys

import perfetto_trace_pb2 as perfetto
import pprof_profile_pb2 as pprof

errors = []


def check_trace(path, nranks):
    trace = perfetto.Trace()
    trace.ParseFromString(open(path, "rb").read())
    uuids, processes = [], []
    seq_pids = collections.defaultdict(set)
    callstacks = collections.defaultdict(set)
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        if p.HasField("interned_data"):
            callstacks[seq].update(c.iid for c in p.interned_data.callstacks)
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.uuid:
                uuids.append(d.uuid)
            if d.HasField("process"):
                processes.append(d.process.process_name)
                seq_pids[seq].add(d.process.pid)
        if p.HasField("perf_sample"):
            seq_pids[seq].add(p.perf_sample.pid)
            if p.perf_sample.callstack_iid not in callstacks[seq]:
                errors.append("a sample of pid %d names callstack %d, not interned on its sequence %d"
                              % (p.perf_sample.pid, p.perf_sample.callstack_iid, seq))
    if len(processes) != nranks:
        errors.append("%d processes in the trace, not %d: %s" % (len(processes), nranks, processes))
    if len(set(uuids)) != len(uuids):
        errors.append("track uuids are not unique")
    for seq, pids in seq_pids.items():
        if len(pids) > 1:
            errors.append("sequence %d holds pids %s" % (seq, sorted(pids)))


def check_pprof(path):
    prof = pprof.Profile()
    prof.ParseFromString(gzip.decompress(open(path, "rb").read()))
    strings = prof.string_table
    if not strings or strings[0] != "":
        errors.append("pprof: string_table[0] is not \"\"")
    locations = {l.id for l in prof.location}
    for s in prof.sample:
        keys = set()
        for l in s.label:
            if not 0 <= l.key < len(strings) or not 0 <= l.str < len(strings):
                errors.append("pprof: a label's string is out of range")
                continue
            keys.add(strings[l.key])
        if not {"node", "rank", "local_rank", "pid"} <= keys:
            errors.append("pprof: a sample lacks its rank's labels: %s" % sorted(keys))
        if any(i not in locations for i in s.location_id):
            errors.append("pprof: a sample names a location it does not hold")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    job, nranks = sys.argv[1], int(sys.argv[2])
    check_trace(job + "/trace.perfetto", nranks)
    check_pprof(job + "/profile.pb.gz")
    for e in errors:
        print(e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
