"""Shared scanning of Remora's C, C++ and assembly sources for the layering checks.

blank() turns a source into the same text with every comment, string literal
and character literal replaced by spaces (newlines kept, quotes kept), so that
braces, identifiers and line numbers can be read off the code alone.
Preprocessor directives can be blanked too (with their continuation lines).
"""

import os

SOURCE_EXTENSIONS = (".c", ".cc", ".cpp", ".h", ".hpp", ".def", ".S")
SCANNED_DIRS = ("src", "agent", "tools", "cli", "compat", "include")


def repo_root():
    return os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def source_files(root, dirs=SCANNED_DIRS):
    """Every source file under `dirs` of `root`, as paths relative to root, sorted."""
    out = []
    for d in dirs:
        for base, subdirs, files in os.walk(os.path.join(root, d)):
            subdirs.sort()
            for f in sorted(files):
                if f.endswith(SOURCE_EXTENSIONS):
                    out.append(os.path.relpath(os.path.join(base, f), root))
    return out


def blank(text, blank_preprocessor=False):
    """The text with comments and literals replaced by spaces (see the module doc)."""
    out = list(text)
    n = len(text)
    i = 0
    at_line_start = True  # only whitespace so far on this line

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c == "#" and blank_preprocessor:
            j = i
            while j < n:
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                if text.startswith("/*", j):  # a comment may span lines within a directive
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                j += 1
            wipe(i, j)
            i = j
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            wipe(i, j)
            i = j
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            j = n if end < 0 else end + 2
            wipe(i, j)
            i = j
            continue
        if c == '"':
            prefix_start = i
            # Raw string: R"delim( ... )delim"
            k = i - 1
            while k >= 0 and (text[k].isalnum() or text[k] == "_"):
                k -= 1
            word = text[k + 1 : i]
            if word in ("R", "u8R", "uR", "UR", "LR"):
                open_paren = text.find("(", i + 1)
                delim = text[i + 1 : open_paren]
                close = text.find(")" + delim + '"', open_paren + 1)
                quote = n if close < 0 else close + len(delim) + 1
                wipe(i + 1, quote)
                i = quote + 1
                continue
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            wipe(prefix_start + 1, min(j, n))
            i = j + 1
            continue
        if c == "'":
            # A digit separator (1'000'000) is not a character literal.
            if i > 0 and text[i - 1].isalnum() and _in_number(text, i):
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            wipe(i + 1, min(j, n))
            i = j + 1
            continue
        i += 1
    return "".join(out)


def _in_number(text, i):
    """Whether the quote at i sits inside a numeric literal (a digit separator)."""
    k = i - 1
    while k >= 0 and (text[k].isalnum() or text[k] in "._"):
        k -= 1
    token = text[k + 1 : i]
    return bool(token) and token[0].isdigit()


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def read_allow_list(path):
    """{relative path: reason} from an allow-list file: one path per line, '#' starts the reason/comment."""
    allowed = {}
    if not os.path.exists(path):
        return allowed
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            path_part, _, reason = line.partition("#")
            allowed[path_part.strip()] = reason.strip()
    return allowed
