#!/usr/bin/env python3
"""Function-length check: no function in src/, agent/, tools/, cli/ or compat/ is longer than
120 lines (its first line, the signature, to its closing brace). Run by ctest
(label "layering"); exits 1 listing every offender with file:line and length.

The scan matches braces in the code alone (comments, string and character
literals, raw strings and preprocessor directives blanked: see cscan.py). A
brace opens a function body when it follows a parameter list at namespace or
class scope; lambdas and local classes count as part of their function.
Files in long_functions_allowed.txt are skipped, each for the reason given
there.
"""

import os
import re
import sys

import cscan

LIMIT = 120
DIRS = ("src", "agent", "tools", "cli", "compat")
ALLOW_LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "long_functions_allowed.txt")

SCOPE_RE = re.compile(r"^(?:template\s*<.*>\s*)?(?:export\s+)?(?:inline\s+)?(namespace|class|struct|union|enum)\b|^extern\s*\"\s*\"\s*$", re.S)
LABEL_RE = re.compile(r"^(?:(?:public|private|protected)\s*:\s*)+")
# A head that has reached a constructor's initializer list and ends with a
# member's name: the '{' that follows is that member's brace initializer.
CTOR_INIT_RE = re.compile(r"\)\s*:(?!:)[^;]*[\w>]\s*$")
NOT_NAMES = {"requires", "__attribute__", "alignas", "decltype", "noexcept", "sizeof", "static_assert",
             "__declspec", "throw"}


class Function:
    def __init__(self, name, start, end):
        self.name, self.start, self.end = name, start, end

    @property
    def length(self):
        return self.end - self.start + 1


def function_name(head):
    """The name before the parameter list of a function head ("Controller::attach")."""
    depth = 0
    for m in re.finditer(r"[()<>]", head):
        ch = m.group()
        if ch == "(" and depth == 0:
            before = head[: m.start()].rstrip()
            name = re.search(r"((?:[A-Za-z_~][\w]*\s*::\s*)*(?:operator\s*\S+?|~?[A-Za-z_]\w*))\s*$", before)
            if name and name.group(1).split("::")[-1].strip() not in NOT_NAMES:
                return re.sub(r"\s+", "", name.group(1))
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
    return "?"


def is_function_head(head):
    """Whether the text before a '{' at namespace/class scope is a function's signature."""
    h = head.strip()
    if not h or "(" not in h:
        return False
    if SCOPE_RE.match(h):
        return False
    # `int x[] = {...}`, `auto t = Foo{...}`: an initializer, unless the '=' is
    # inside the parameter list (a default argument) or belongs to an operator.
    depth = 0
    for i, ch in enumerate(h):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "=" and depth == 0:
            prev = h[i - 1] if i else ""
            nxt = h[i + 1] if i + 1 < len(h) else ""
            if prev not in "=!<>+-*/%&|^" and nxt != "=" and "operator" not in h[max(0, i - 12) : i]:
                return False
    # It must end with the parameter list, its qualifiers, a trailing return
    # type or a constructor's initializer list: the last ')' is followed by
    # words, '->', '::', '<>', '&' or ':' only.
    tail = h[h.rfind(")") + 1 :]
    return re.fullmatch(r"[\s\w:&*<>,\->\[\]]*", tail) is not None or re.search(r"\)\s*:\s*\w", h) is not None


def functions(text):
    """Every function body of a source (blanked first), as Function objects."""
    code = cscan.blank(text, blank_preprocessor=True)
    found = []
    stack = []  # per open brace: "scope", "function" or "other"
    head_start = 0
    parens = 0  # open '(' since the head began: a '{' inside them is an argument, not a body
    i = 0
    n = len(code)
    while i < n:
        ch = code[i]
        at_scope = not stack or stack[-1] == "scope"
        if at_scope and ch in "()":
            parens += 1 if ch == "(" else -1
        if at_scope and ch == "{" and (parens > 0 or CTOR_INIT_RE.search(code[head_start:i])):
            # An argument, or a member's brace initializer in a constructor's
            # initializer list (`: a_(x), b_{y} {`): part of the head.
            stack.append("init")
        elif ch in ";{}" and at_scope:
            parens = 0
            if ch == "{":
                head = code[head_start:i]
                stripped = LABEL_RE.sub("", head.strip())
                if is_function_head(stripped):
                    offset = head_start + (len(head) - len(head.lstrip()))
                    offset += len(head.strip()) - len(stripped)
                    start_line = cscan.line_of(code, offset)
                    end = _matching_brace(code, i)
                    found.append(Function(function_name(stripped), start_line, cscan.line_of(code, end)))
                    i = end + 1
                    head_start = i
                    continue
                kind = "scope" if (SCOPE_RE.match(stripped) or not stripped) else "other"
                stack.append(kind)
            elif ch == "}":
                if stack:
                    stack.pop()
            head_start = i + 1
        elif ch == "{":
            stack.append("other")
        elif ch == "}":
            popped = stack.pop() if stack else "scope"
            if popped != "init" and (not stack or stack[-1] == "scope"):
                head_start = i + 1
        i += 1
    return found


def _matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def main():
    root = cscan.repo_root()
    allowed = cscan.read_allow_list(ALLOW_LIST)
    files = cscan.source_files(root, DIRS)
    offenders, skipped, stale = [], [], []
    counted = 0
    for path in files:
        if path.endswith((".S", ".def")):
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            fns = functions(f.read())
        counted += len(fns)
        long_ones = [fn for fn in fns if fn.length > LIMIT]
        if path in allowed:
            skipped.append((path, allowed[path], long_ones))
            if not long_ones:
                stale.append(path)
            continue
        for fn in long_ones:
            offenders.append("%s:%d: %s is %d lines (limit %d)" % (path, fn.start, fn.name, fn.length, LIMIT))
    print("function length: checked %d functions in %d files under %s/ (limit %d lines)" %
          (counted, len(files), "/, ".join(DIRS), LIMIT))
    for path, reason, long_ones in skipped:
        print("function length: SKIPPED %s (long_functions_allowed.txt: %s)%s" %
              (path, reason or "no reason given",
               "".join("\n    %s:%d: %s, %d lines" % (path, fn.start, fn.name, fn.length) for fn in long_ones)))
    for path in stale:
        print("function length: NOTE %s has no function over %d lines any more: remove it from "
              "tests/layering/long_functions_allowed.txt" % (path, LIMIT))
    missing = [p for p in allowed if not os.path.exists(os.path.join(root, p))]
    for p in missing:
        print("function length: NOTE %s (allowed) does not exist: remove it from the list" % p)
    for o in offenders:
        print(o)
    if offenders:
        print("function length: %d function(s) over %d lines: split them (style: a function does one thing)" %
              (len(offenders), LIMIT))
        return 1
    print("function length: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
