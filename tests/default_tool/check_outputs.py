#!/usr/bin/env python3
"""Validates one output directory of the default tool.

usage: check_outputs.py DIR [--expect-calls read,write] [--expect-frame NAME]

trace.json must be JSON in the Chrome trace-event format (what the Perfetto
UI and chrome://tracing open), flamegraph.svg well-formed XML with an <svg>
root, stats.csv a CSV with the documented header, folded.txt lines of
"frame;frame count". Exits 1 with the reasons on failure."""
import csv
import json
import sys
import xml.etree.ElementTree as ET

STATS_HEADER = ["kind", "name", "calls", "total_ns", "mean_ns", "max_ns", "samples", "inclusive_samples", "share"]


def main():
    args = sys.argv[1:]
    d = args[0]
    expect_calls, expect_frames = [], []
    i = 1
    while i < len(args):
        if args[i] == "--expect-calls":
            expect_calls = [x for x in args[i + 1].split(",") if x]
            i += 2
        elif args[i] == "--expect-frame":
            expect_frames.append(args[i + 1])
            i += 2
        else:
            sys.exit("unknown argument " + args[i])
    errors = []

    with open(d + "/trace.json", encoding="utf-8") as f:
        trace = json.load(f)
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        errors.append("trace.json: no traceEvents list")
        events = []
    names = {e.get("args", {}).get("name") for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    if not names and any(e.get("ph") in ("X", "i") for e in events):
        errors.append("trace.json: events but no thread_name metadata")
    calls = set()
    for e in events:
        for k in ("ph", "pid", "tid"):
            if k not in e:
                errors.append("trace.json: event without %s: %r" % (k, e))
                break
        if e.get("ph") == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0 or not isinstance(e.get("ts"), (int, float)):
                errors.append("trace.json: bad X event %r" % e)
            calls.add(e["name"])
        if e.get("ph") == "i" and e.get("s") not in ("t", "p", "g"):
            errors.append("trace.json: instant event without scope %r" % e)
    for c in expect_calls:
        if c not in calls:
            errors.append("trace.json: no traced call of %s (have %s)" % (c, sorted(calls)))

    root = ET.parse(d + "/flamegraph.svg").getroot()
    if not root.tag.endswith("svg"):
        errors.append("flamegraph.svg: root is %s" % root.tag)
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]

    with open(d + "/stats.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != STATS_HEADER:
        errors.append("stats.csv: header is %r" % (rows[0] if rows else None))
    for r in rows[1:]:
        if len(r) != len(STATS_HEADER) or r[0] not in ("call", "sample"):
            errors.append("stats.csv: bad row %r" % r)
    stat_calls = {r[1] for r in rows[1:] if r and r[0] == "call" and int(r[2]) > 0}
    for c in expect_calls:
        if c not in stat_calls:
            errors.append("stats.csv: no calls of %s" % c)

    folded = open(d + "/folded.txt", encoding="utf-8").read().splitlines()
    for line in folded:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            errors.append("folded.txt: bad line %r" % line)
            break
    for frame in expect_frames:
        if not any(frame in line.rpartition(" ")[0].split(";") for line in folded):
            errors.append("folded.txt: no stack with %s" % frame)
        if not any(t.startswith(frame + " (") for t in titles):
            errors.append("flamegraph.svg: no frame %s" % frame)

    summary = open(d + "/summary.txt", encoding="utf-8").read()
    if "Remora profile of" not in summary:
        errors.append("summary.txt: no header")

    if errors:
        print("\n".join(errors))
        sys.exit(1)


if __name__ == "__main__":
    main()
