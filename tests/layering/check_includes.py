#!/usr/bin/env python3
"""Layering check: every #include "..." in src/, agent/, tools/, cli/, compat/
and include/ must name a header of its own module or of a layer its module may
use. Run by ctest (label "layering"); exits 1 naming file:line and the rule
for every include that breaks one.

Layers, lowest first (a layer may include any lower layer, never a peer or a
higher one):
    include/ (public headers; they include only each other)
    base <- procfs, elf <- arch <- ptrace <- remote <- control, attach, profile <- capi <- cli, compat
profile uses base, procfs, elf and arch only (NOT_BELOW): rendering never controls a process.
agent/ and tools/ run inside the target: they may include include/, the
header-only headers of base/ (those without a .cc of their own), the
self-contained header-only ones of arch/ (no .cc, no Remora include), and
their own files. agent/protocol.h and agent/channel_wire.h, the protocols
shared by the agent and the controller (remote calls, the socket channel),
may be included by attach and the layers above it.
"""

import os
import re
import sys

import cscan

RANK = {
    "include": 0,
    "base": 1,
    "procfs": 2,
    "elf": 2,
    "arch": 3,
    "ptrace": 4,
    "remote": 5,
    "control": 6,
    "attach": 6,
    "profile": 6,
    "capi": 7,
    "cli": 8,
    "compat": 8,
}
# Layers that may not use some lower ones, and why.
NOT_BELOW = {
    "profile": ({"ptrace", "remote"},
                "rendering reads only the session directory: the profile layer never controls a process "
                "(what naming needs is collected at the detach, profile/collect.h)"),
}
IN_TARGET = ("agent", "tools")  # code loaded into target processes
PROTOCOL_HEADERS = ("agent/protocol.h", "agent/channel_wire.h")
PROTOCOL_USERS = ("attach", "capi", "cli", "compat")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def module_of(path):
    """The module of a repository path: a layer name, 'agent', 'tools' or None."""
    parts = path.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] in ("agent", "tools", "cli", "compat", "include"):
        return parts[0]
    return None


def resolve(root, including, name):
    """The repository path an include names, or None when it names no file of ours.

    Quoted includes are looked up next to the including file first (as the
    compiler does), then in the include directories the build gives: src/,
    include/ and the repository root (agent/protocol.h)."""
    for base in (os.path.dirname(including), "src", "include", ""):
        candidate = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
        # A header protoc generates into the build tree ("profile/proto/x.pb.h")
        # belongs to the layer of its .proto file (src/profile/proto/x.proto).
        if name.endswith(".pb.h"):
            proto = candidate[: -len(".pb.h")] + ".proto"
            if os.path.isfile(os.path.join(root, proto)):
                return proto
    return None


def header_only_base(root):
    """base/ headers with no .cc of their own, and arch/ headers with no .cc
    that include no other Remora header (the architecture seam's pieces for
    code inside targets: sample_regs.h, relocs.h): safe in code loaded into a
    target, which links no Remora library."""
    out = set()
    for layer, self_contained in (("base", False), ("arch", True)):
        d = os.path.join(root, "src", layer)
        for f in os.listdir(d):
            if not f.endswith(".h") or os.path.exists(os.path.join(d, f[:-2] + ".cc")):
                continue
            if self_contained:
                with open(os.path.join(d, f), encoding="utf-8", errors="replace") as h:
                    if re.search(r'^\s*#\s*include\s*"', h.read(), re.M):
                        continue
            out.add("src/%s/%s" % (layer, f))
    return out


def rule_for(root, src, target, header_only):
    """None when `src` may include `target`; otherwise the rule it breaks."""
    m, t = module_of(src), module_of(target)
    if t is None:
        return "includes %s, which is outside every layer" % target
    if m == "include":
        if t != "include":
            return "public headers (include/) include only other public headers"
        return None
    if m in IN_TARGET:
        if t == "include" or target in header_only:
            return None
        if m == "agent" and target.startswith("agent/"):
            return None
        if m == "tools" and target.split("/")[:2] == src.split("/")[:2]:
            return None
        return ("%s/ runs inside the target: it may include only include/, its own files and the "
                "header-only base/ and arch/ headers (%s)" % (m, ", ".join(sorted(os.path.basename(h) for h in header_only))))
    if target in PROTOCOL_HEADERS:
        if m in PROTOCOL_USERS:
            return None
        return "%s is for attach and the layers above it (%s)" % (target, ", ".join(PROTOCOL_USERS))
    if t in IN_TARGET:
        return "%s/ is code loaded into targets: no layer includes it" % t
    if m not in RANK:
        return "%s is in no layer of the map (tests/layering/check_includes.py)" % src
    if t == m:
        return None
    if m in NOT_BELOW and t in NOT_BELOW[m][0]:
        return "%s may not include %s: %s" % (m, t, NOT_BELOW[m][1])
    if RANK[t] < RANK[m]:
        return None
    kind = "a peer layer" if RANK[t] == RANK[m] else "a higher layer"
    return "%s may not include %s (%s): layers, lowest first: %s" % (m, t, kind, layer_order())


def layer_order():
    by_rank = {}
    for name, r in RANK.items():
        by_rank.setdefault(r, []).append(name)
    return " <- ".join(", ".join(sorted(v)) for _, v in sorted(by_rank.items()))


def main():
    root = cscan.repo_root()
    header_only = header_only_base(root)
    files = cscan.source_files(root)
    problems = []
    count = 0
    for path in files:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        # Includes inside comments are not includes: blank comments, keep strings.
        code = _blank_comments_only(text)
        for m in INCLUDE_RE.finditer(code):
            count += 1
            name = m.group(1)
            line = cscan.line_of(code, m.start())
            target = resolve(root, path, name)
            if target is None:
                problems.append("%s:%d: #include \"%s\" names no file of the repository "
                                "(looked next to the file, in src/, include/ and the root)" % (path, line, name))
                continue
            why = rule_for(root, path, target, header_only)
            if why:
                problems.append("%s:%d: #include \"%s\": %s" % (path, line, name, why))
    print("layering: checked %d #include \"...\" lines in %d files under %s/" %
          (count, len(files), "/, ".join(cscan.SCANNED_DIRS)))
    print("layering: layers, lowest first: %s; agent/ and tools/: include/, own files and header-only base/ and arch/ (%s)" %
          (layer_order(), ", ".join(sorted(os.path.basename(h) for h in header_only))))
    for p in problems:
        print(p)
    if problems:
        print("layering: %d include(s) break the layering: move the code to the right layer, or "
              "change the map in tests/layering/check_includes.py and docs/architecture.md together" % len(problems))
        return 1
    print("layering: OK")
    return 0


def _blank_comments_only(text):
    """Comments blanked, string literals kept (the include names are strings)."""
    blanked = cscan.blank(text)
    out = list(blanked)
    # Restore the string contents on #include lines only.
    for m in re.finditer(r'^[ \t]*#[ \t]*include[^\n]*', text, re.M):
        if blanked[m.start():m.end()].lstrip().startswith("#"):
            out[m.start():m.end()] = text[m.start():m.end()]
    return "".join(out)


if __name__ == "__main__":
    sys.exit(main())
