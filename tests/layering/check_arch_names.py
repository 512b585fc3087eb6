#!/usr/bin/env python3
"""Architecture seam check: no file outside src/arch/ names x86_64 or aarch64
specifics. Run by ctest (label "layering"); exits 1 listing file:line and the
name for every offender outside the allow-list (arch_names_allowed.txt, one
file per line with the reason; it shrinks as the arch seam lands).

Scanned: src/, agent/, tools/, cli/, compat/ and include/, code only
(comments and string literals are blanked: a comment may explain what
orig_rax is for). Preprocessor lines are scanned too, and #include lines for
the architecture-specific headers of src/arch/.
"""

import os
import re
import sys

import cscan

ALLOW_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arch_names_allowed.txt")

# (pattern, what it is). Register names are those of the kernel's register
# sets (user_regs_struct, user_pt_regs) that no portable code needs; short,
# common words (sp, pc, x0) are left out: they would flag innocent names.
NAMES = [
    (r"\b(?:arch\s*::\s*)?x86_64\s*::", "the x86_64 namespace"),
    (r"\b(?:arch\s*::\s*)?aarch64\s*::", "the aarch64 namespace"),
    (r"\barch\s*::\s*(?:x86_64|aarch64)\b", "an architecture's namespace (a namespace alias of it)"),
    (r"\b(?:orig_rax|rip|rsp|rax|rbp|eflags|fs_base|gs_base)\b", "an x86_64 register"),
    (r"\b(?:orig_x0|pstate)\b", "an aarch64 register"),
    (r"\buser_regs_struct\b|\buser_fpregs_struct\b|\buser_pt_regs\b|\buser_fpsimd_struct\b",
     "a kernel register-set type"),
    (r"\bNT_X86_\w+|\bNT_ARM_\w+", "an architecture's register-set note"),
    (r"\bAUDIT_ARCH_\w+", "an architecture's audit (seccomp) identifier"),
    (r"\b__x86_64__\b|\b__aarch64__\b|\b__amd64__\b|\b__i386__\b|\b__arm__\b", "an architecture macro"),
]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"arch/((?:x86_64|aarch64)[^"]*)"', re.M)


def main():
    root = cscan.repo_root()
    allowed = cscan.read_allow_list(ALLOW_LIST)
    files = [p for p in cscan.source_files(root) if not p.startswith("src/arch/")]
    compiled = [(re.compile(p), what) for p, what in NAMES]
    offenders, skipped = [], {}
    for path in files:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        code = cscan.blank(text)
        hits, taken = [], set()
        for pattern, what in compiled:
            for m in pattern.finditer(code):
                if any(k in taken for k in range(m.start(), m.end())):
                    continue  # "arch::x86_64::" is one use, not two
                taken.update(range(m.start(), m.end()))
                hits.append((cscan.line_of(code, m.start()), m.group().strip(), what))
        for m in INCLUDE_RE.finditer(text):
            if code[m.start():m.end()].lstrip().startswith("#"):  # not inside a comment
                hits.append((cscan.line_of(text, m.start()), "arch/" + m.group(1),
                             "an architecture's own header"))
        if not hits:
            continue
        if path in allowed:
            skipped[path] = (allowed[path], len(hits))
            continue
        for line, name, what in sorted(hits):
            offenders.append("%s:%d: names %s (%s)" % (path, line, name, what))
    print("arch names: checked %d files outside src/arch/ under %s/ for:" % (len(files), "/, ".join(cscan.SCANNED_DIRS)))
    for pattern, what in NAMES:
        print("    %-40s %s" % (what, pattern))
    print("    %-40s #include \"arch/x86_64*\" or \"arch/aarch64*\"" % "an architecture's own header")
    for path, (reason, n) in sorted(skipped.items()):
        print("arch names: SKIPPED %s, %d use(s) (arch_names_allowed.txt: %s)" % (path, n, reason or "no reason given"))
    for path in sorted(set(allowed) - set(skipped)):
        print("arch names: NOTE %s names no architecture any more (or does not exist): remove it from "
              "tests/layering/arch_names_allowed.txt" % path)
    for o in offenders:
        print(o)
    if offenders:
        print("arch names: %d use(s) outside src/arch/: go through the architecture interface "
              "(src/arch/) instead" % len(offenders))
        return 1
    print("arch names: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
