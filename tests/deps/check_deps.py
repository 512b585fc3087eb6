#!/usr/bin/env python3
"""What the libraries Remora loads into targets ask of the target: run by
ctest (label "deps") on libremora-agent.so and libremora-tool.so.

A library loaded into any glibc container may need nothing but glibc. For each
library given, from `readelf -d`, `-V` and `--dyn-syms`:

  needed    every NEEDED entry is one of glibc's own libraries (GLIBC_LIBS),
            or one let through by --allow-needed NAME=REASON (printed);
  versions  every version it asks for of glibc is at most the stated minimum
            (MIN_GLIBC, per architecture; docs/tool.md states it), and none
            is GLIBC_PRIVATE; versions it asks of another file are refused
            unless that file was let through;
  exports   every symbol it defines and exports matches one of the patterns
            given with --export (its documented entry points), and none is
            a symbol of libstdc++, libgcc, libunwind or liblzma (RUNTIME).

Exit status 1 with one line per finding. --expect-fail turns it round (the
self-test: a library that breaks every rule must be found out on each).
"""
import argparse
import os
import re
import subprocess
import sys

# The minimum glibc, per architecture (uname -m / ELF machine): the highest
# GLIBC_x.y version the two libraries may reference. x86_64's comes from
# agent/glibc_compat.c, which pins every newer symbol to its oldest version.
MIN_GLIBC = {"x86_64": "2.17"}

# glibc's own libraries: present in every glibc installation.
GLIBC_LIBS = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}

# Exported names that would belong to a language runtime linked in: the
# C++ standard library (std:: and __gnu_cxx:: manglings, typeinfo/vtables
# of std types), the C++ ABI, libgcc's unwinder, libunwind, liblzma.
RUNTIME = [
    (re.compile(r"^_Z(?:N[KVL]*)?(?:St|S[absiod]|9__gnu_cxx|N9__gnu_cxx)"), "libstdc++ (std::/__gnu_cxx::)"),
    (re.compile(r"^_Z(?:Z|T[ISVT])N?K?St"), "libstdc++ (a std:: static, typeinfo or vtable)"),
    (re.compile(r"^_ZZ"), "a function-local static of an inline/template function"),
    (re.compile(r"^(?:__cxa_|__gxx_|_ZTVN10__cxxabiv1)"), "the C++ ABI (libstdc++/libsupc++)"),
    (re.compile(r"^(?:_Unwind_|__gcc_|__deregister_frame|__register_frame|__frame_state_for)"),
     "libgcc's unwinder"),
    (re.compile(r"^(?:_U[A-Za-z0-9]*_|_UL?(?:x86_64|aarch64)_|unw_|_U_dyn_)"), "libunwind"),
    (re.compile(r"^lzma_"), "liblzma"),
]


def version_key(v):
    return tuple(int(x) for x in v.split("."))


def readelf(args, path):
    env = dict(os.environ, LC_ALL="C")
    out = subprocess.run(["readelf", "--wide"] + args + [path], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit("readelf %s %s failed: %s" % (" ".join(args), path, out.stderr.strip()))
    return out.stdout


def machine_of(path):
    m = re.search(r"Machine:\s+(.*)", readelf(["-h"], path))
    text = m.group(1) if m else ""
    if "X86-64" in text:
        return "x86_64"
    if "AArch64" in text:
        return "aarch64"
    return text.strip() or "unknown"


def needed_of(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf(["-d"], path))


def version_needs(path):
    """[(file, version)] from .gnu.version_r."""
    needs, current = [], None
    for line in readelf(["-V"], path).splitlines():
        m = re.search(r"Version: \d+\s+File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags:", line)
        if m and current is not None:
            needs.append((current, m.group(1)))
    return needs


def exports_of(path):
    """Names the library defines and exports (default or protected visibility)."""
    names = []
    for line in readelf(["--dyn-syms"], path).splitlines():
        cols = line.split()
        if len(cols) < 8 or not cols[0].rstrip(":").isdigit():
            continue
        bind, vis, ndx, name = cols[4], cols[5], cols[6], cols[7]
        if ndx == "UND" or bind not in ("GLOBAL", "WEAK", "UNIQUE") or vis not in ("DEFAULT", "PROTECTED"):
            continue
        names.append(name.split("@")[0])
    return sorted(set(names))


def check(path, exports, allowed_needed, notes):
    findings = []
    name = os.path.basename(path)
    needed = needed_of(path)
    notes.append("%s: NEEDED %s" % (name, ", ".join(needed) or "(none)"))
    for lib in needed:
        if lib in GLIBC_LIBS:
            continue
        if lib in allowed_needed:
            notes.append("%s: ALLOWED NEEDED %s (%s)" % (name, lib, allowed_needed[lib]))
            continue
        findings.append("%s: NEEDED %s, which is not part of glibc: link it statically "
                        "(see agent/CMakeLists.txt, REMORA_LOADABLE_LINK_OPTIONS)" % (name, lib))

    machine = machine_of(path)
    floor = MIN_GLIBC.get(machine)
    glibc_versions = []
    for file, version in version_needs(path):
        if file not in GLIBC_LIBS:
            if file not in allowed_needed:
                findings.append("%s: asks %s of %s, which is not part of glibc" % (name, version, file))
            continue
        if version == "GLIBC_PRIVATE":
            findings.append("%s: uses GLIBC_PRIVATE symbols of %s: they change with every glibc release"
                            % (name, file))
            continue
        m = re.fullmatch(r"GLIBC_(\d+(?:\.\d+)+)", version)
        if m:
            glibc_versions.append((version_key(m.group(1)), m.group(1), file))
    highest = max(glibc_versions)[1] if glibc_versions else "none"
    notes.append("%s: highest glibc version referenced: %s (%s)" % (name, highest, machine))
    if floor is None:
        notes.append("%s: SKIPPED the glibc floor: none is stated for %s (agent/glibc_compat.c pins "
                     "versions on x86_64 only)" % (name, machine))
    else:
        for key, v, file in sorted(glibc_versions):
            if key > version_key(floor):
                findings.append("%s: needs GLIBC_%s of %s, above the stated minimum glibc %s: pin it in "
                                "agent/glibc_compat.c or avoid the call (objdump -T shows which symbol)"
                                % (name, v, file, floor))

    patterns = [re.compile("^(?:%s)$" % p) for p in exports]
    runtime_syms = []
    for sym in exports_of(path):
        runtime = [what for rx, what in RUNTIME if rx.search(sym)]
        if runtime:
            runtime_syms.append((sym, runtime[0]))
        elif not any(p.match(sym) for p in patterns):
            findings.append("%s: exports %s, which is not one of its entry points (%s)"
                            % (name, sym, " ".join(exports)))
    # One finding per runtime, naming a few of its symbols: a template
    # instantiated once exports dozens.
    for what in sorted(set(w for _, w in runtime_syms)):
        syms = [s for s, w in runtime_syms if w == what]
        findings.append("%s: exports %d symbol(s) of %s (%s%s): hide them (-Wl,--exclude-libs,ALL and a "
                        "version script listing the entry points)"
                        % (name, len(syms), what, ", ".join(syms[:3]), ", ..." if len(syms) > 3 else ""))
    return findings


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library")
    ap.add_argument("--export", action="append", default=[], help="regex of an allowed exported name")
    ap.add_argument("--allow-needed", action="append", default=[], metavar="NAME=REASON")
    ap.add_argument("--expect-fail", action="append", default=[], metavar="WORD",
                    help="self-test: the check must fail, with a finding containing WORD")
    args = ap.parse_args()
    allowed = dict(a.split("=", 1) for a in args.allow_needed)
    notes = []
    findings = check(args.library, args.export, allowed, notes)
    for n in notes:
        print(n)
    for f in findings:
        print(("found (expected): " if args.expect_fail else "") + f)
    if args.expect_fail:
        missing = [w for w in args.expect_fail if not any(w in f for f in findings)]
        for w in missing:
            print("self-test: no finding mentions '%s': the check misses what it is meant to catch" % w)
        return 1 if missing else 0
    if findings:
        print("deps: %d finding(s) in %s" % (len(findings), os.path.basename(args.library)))
        return 1
    print("deps: %s needs only glibc%s" % (os.path.basename(args.library),
                                           " (and what was let through)" if allowed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
