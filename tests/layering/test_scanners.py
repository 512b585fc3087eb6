#!/usr/bin/env python3
"""Self-test of the layering checks' scanners, on sources written here: the
checks are only as good as their reading of C++. Run by ctest (label
"layering"); exits 1 naming the first case that fails."""

import sys

import check_arch_names
import check_function_length as fl
import check_includes as inc
import cscan

CASES = 0


def expect(what, got, want):
    global CASES
    CASES += 1
    if got != want:
        print("FAILED: %s: got %r, want %r" % (what, got, want))
        sys.exit(1)


def body(n):
    return "\n".join("  x += %d;" % i for i in range(n))


def test_blank():
    src = 'a = 1\'000; c = \'{\'; s = "}{ // x"; // { c\n/* { */ r = R"d( } )d"; f() { }\n'
    out = cscan.blank(src)
    expect("blank keeps length", len(out), len(src))
    expect("blank keeps newlines", out.count("\n"), src.count("\n"))
    expect("blank leaves no brace of a literal or comment", out.count("{") + out.count("}"), 2)
    expect("digit separator is no char literal", "1'000" in out, True)
    pre = cscan.blank("#define X { \\\n  }\nint y;\n", blank_preprocessor=True)
    expect("directive with continuation blanked", "{" in pre or "}" in pre, False)


def test_functions():
    src = ("namespace a {\nstruct S {\n  int f() const { return 1; }\n};\n"
           "int long_one(int v) {\n" + body(130) + "\n  auto l = [&]() { return \"}\"; };\n}\n"
           "const int kTable[] = {1, 2, 3};\n"
           "Foo::Foo(int x) : x_(x), y_{x} {\n" + body(3) + "\n}\n}  // namespace a\n")
    fns = {f.name: f for f in fl.functions(src)}
    expect("functions found", sorted(fns), ["Foo::Foo", "f", "long_one"])
    expect("length counts signature to closing brace", fns["long_one"].length, 133)
    expect("start line", fns["long_one"].start, 5)
    expect("constructor with initializer list", fns["Foo::Foo"].length, 5)


def test_include_rules():
    root = cscan.repo_root()
    ho = {"src/base/unique_fd.h"}
    expect("lower layer", inc.rule_for(root, "src/remote/a.cc", "src/ptrace/ptrace.h", ho), None)
    expect("own layer", inc.rule_for(root, "src/remote/a.cc", "src/remote/target.h", ho), None)
    expect("higher layer refused", inc.rule_for(root, "src/ptrace/a.cc", "src/remote/target.h", ho) is None, False)
    expect("peer refused", inc.rule_for(root, "src/control/a.cc", "src/attach/attach.h", ho) is None, False)
    expect("agent: header-only base", inc.rule_for(root, "agent/agent.cc", "src/base/unique_fd.h", ho), None)
    expect("agent: other base refused", inc.rule_for(root, "agent/agent.cc", "src/base/result.h", ho) is None, False)
    expect("protocol for attach", inc.rule_for(root, "src/attach/attach.cc", "agent/protocol.h", ho), None)
    expect("protocol not for remote", inc.rule_for(root, "src/remote/a.cc", "agent/protocol.h", ho) is None, False)
    expect("include/ stays public", inc.rule_for(root, "include/remora/x.h", "src/base/result.h", ho) is None, False)


def test_arch_names():
    import re
    code = cscan.blank("// orig_rax in a comment\nauto r = regs.rip; const char* s = \"rsp\";\n")
    hits = [m.group() for p, _ in check_arch_names.NAMES for m in re.finditer(p, code)]
    expect("arch names in code only", hits, ["rip"])


def main():
    test_blank()
    test_functions()
    test_include_rules()
    test_arch_names()
    print("layering self-test: %d cases OK" % CASES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
