// The helpers every writer shares (writers_internal.h), the text escapes
// and folded.txt; each other format has a file of its own (writers_*.cc,
// perfetto.cc, pprof.cc). Ported from the
// default tool's former in-process writers (tools/default/report.cc), now
// working on symbolised frames: source file and line where known.
#include "profile/writers.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "profile/writers_internal.h"

namespace remora::profile {

namespace {

// One step of the UTF-8 walk shared by the escapes and valid_utf8: the code
// point at the start of `s`, or an ill-formed sequence to be replaced by one
// U+FFFD. Thread and function names are arbitrary bytes.
struct Utf8Step {
  char32_t code_point;  // meaningful only when `valid`
  size_t len;           // bytes consumed, >= 1
  bool valid;
};

// Decodes as strict decoders do (RFC 3629; Unicode 15, table 3-7): no
// overlong forms (C0, C1, E0 80-9F, F0 80-8F), no surrogates (ED A0-BF),
// nothing above U+10FFFF (F4 90-BF, F5-FF), no truncated sequence and no
// stray continuation byte. An ill-formed sequence consumes its maximal
// subpart (Unicode 15, 3.9 "U+FFFD Substitution of Maximal Subparts"): the
// longest prefix of a well-formed sequence, or else the one byte. That is
// what Python's and browsers' decoders do, so a replaced name reads the
// same in every viewer. `s` must not be empty.
Utf8Step next_code_point(std::string_view s) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return {lead, 1, true};
  size_t need;
  char32_t cp;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    need = 2, cp = lead & 0x1f;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    need = 3, cp = lead & 0x0f;
    if (lead == 0xe0) lo = 0xa0;  // overlong below U+0800
    if (lead == 0xed) hi = 0x9f;  // U+D800-DFFF, the surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    need = 4, cp = lead & 0x07;
    if (lead == 0xf0) lo = 0x90;  // overlong below U+10000
    if (lead == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return {0, 1, false};  // a continuation byte, C0, C1 or F5-FF: never a lead
  }
  size_t k = 1;
  for (; k < need && k < s.size(); ++k, lo = 0x80, hi = 0xbf) {
    if (byte(k) < lo || byte(k) > hi) break;
    cp = (cp << 6) | (byte(k) & 0x3f);
  }
  if (k < need) return {0, k, false};
  return {cp, need, true};
}

constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD

// Runs `emit(out, step, bytes)` for each code point or ill-formed sequence
// of `raw`, in order, and returns `out`: what the calls appended.
template <typename Emit>
std::string escape_utf8(const std::string& raw, Emit emit) {
  std::string out;
  out.reserve(raw.size() + 8);
  std::string_view rest = raw;
  while (!rest.empty()) {
    Utf8Step step = next_code_point(rest);
    emit(out, step, rest.substr(0, step.len));
    rest.remove_prefix(step.len);
  }
  return out;
}

}  // namespace

// Each ill-formed sequence replaced, for every output that viewers read as
// UTF-8 (thread and function names are arbitrary bytes).
std::string valid_utf8(const std::string& raw) {
  return escape_utf8(raw, [](std::string& out, const Utf8Step& step, std::string_view bytes) {
    if (step.valid)
      out += bytes;
    else
      out += kReplacement;
  });
}

std::string xml_escape(const std::string& raw) {
  return escape_utf8(raw, [](std::string& out, const Utf8Step& step, std::string_view bytes) {
    if (!step.valid) {
      out += kReplacement;
      return;
    }
    switch (step.code_point) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      // Allowed, but a parser turns a literal one into a space in an
      // attribute (XML 1.0, 3.3.3) and a CR into LF anywhere (2.11):
      // references keep the name as it was.
      case '\t': out += "&#9;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      default:
        // XML 1.0's Char (2.2) excludes the other C0 controls, U+FFFE and
        // U+FFFF, even as references; strict decoding already excludes the
        // surrogates. What a document cannot hold becomes U+FFFD.
        if (step.code_point < 0x20 || step.code_point == 0xfffe || step.code_point == 0xffff)
          out += kReplacement;
        else
          out += bytes;
    }
  });
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

namespace {

constexpr size_t kNpos = std::string_view::npos;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// What "operator" can be followed by, longest spellings first, so that the
// first match is the longest (operator<<= is not operator< then "<=").
constexpr std::string_view kOperatorSymbols[] = {
    "<=>", "<<=", ">>=", "->*", "()", "[]", "<<", ">>", "<=", ">=", "->", "==", "!=",
    "&&",  "||",  "++",  "--",  "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<",
    ">",   "+",   "-",   "*",   "/",  "%",  "^",  "&",  "|",  "~",  "!",  "=",  ","};

// The length of the operator name ("operator" and its symbol) at s[i], or 0.
// "operator new", "operator delete" and conversion operators are the bare
// keyword: what follows is an ordinary name or type.
size_t operator_at(std::string_view s, size_t i) {
  constexpr std::string_view kKeyword = "operator";
  if (s.substr(i, kKeyword.size()) != kKeyword || (i > 0 && name_char(s[i - 1]))) return 0;
  size_t j = i + kKeyword.size();
  if (j < s.size() && name_char(s[j])) return 0;  // "operators", "operator_x": a plain name
  std::string_view rest = s.substr(j);
  for (std::string_view sym : kOperatorSymbols)
    if (rest.substr(0, sym.size()) == sym) return j + sym.size() - i;
  return kKeyword.size();
}

// Whether the '<' at s[i] opens a template argument list: right after a
// name or an ABI tag's ']', or after an operator's name (ending at `op_end`)
// directly or past the one space the demangler puts after a '<'.
bool opens_list(std::string_view s, size_t i, size_t op_end) {
  if (op_end != kNpos && (i == op_end || (i == op_end + 1 && s[op_end] == ' '))) return true;
  return i > 0 && (name_char(s[i - 1]) || s[i - 1] == ']');
}

// The '>' that closes the list opened at s[open], or kNpos. Brackets
// inside parentheses (function types, expressions such as (a>b)) and
// operator names do not count.
size_t close_of(std::string_view s, size_t open) {
  int depth = 0, parens = 0;
  size_t op_end = kNpos;
  for (size_t i = open; i < s.size(); ++i) {
    if (size_t n = operator_at(s, i)) {
      op_end = i + n;
      i = op_end - 1;
      continue;
    }
    char c = s[i];
    if (c == '(') {
      ++parens;
    } else if (c == ')') {
      if (parens > 0) --parens;
    } else if (parens == 0 && c == '<' && (i == open || opens_list(s, i, op_end))) {
      ++depth;
    } else if (parens == 0 && c == '>' && --depth == 0) {
      return i;
    }
  }
  return kNpos;
}

}  // namespace

std::string collapse_template_args(const std::string& name) {
  std::string_view s = name;
  std::string out;
  out.reserve(s.size());
  size_t op_end = kNpos;
  for (size_t i = 0; i < s.size();) {
    if (size_t n = operator_at(s, i)) {
      out.append(s.substr(i, n));
      i += n;
      op_end = i;
      continue;
    }
    if (s[i] == '<' && opens_list(s, i, op_end)) {
      size_t close = close_of(s, i);
      if (close == kNpos) {  // not a list after all: leave the rest as it is
        out.append(s.substr(i));
        break;
      }
      std::string_view inner = s.substr(i + 1, close - i - 1);
      if (inner.find('<') == kNpos && inner.size() <= kShortTemplateArgs)
        out.append(s.substr(i, close + 1 - i));
      else
        out += "<...>";
      i = close + 1;
      continue;
    }
    out += s[i++];
  }
  return out;
}

// ---- shared by the writers (writers_internal.h) ----

namespace internal {

// The pid the traces name the process by: the same namespace as its tids.
int trace_pid(const Profile& p) { return p.host_tids || p.ns_pid <= 0 ? p.pid : p.ns_pid; }

std::string process_label(const Profile& p) {
  std::string s = p.comm + " (pid " + std::to_string(p.pid);
  if (p.ns_pid > 0 && p.ns_pid != p.pid) s += ", " + std::to_string(p.ns_pid) + " in its pid namespace";
  return s + ")";
}

std::string thread_name(const Profile& p, int32_t tid) {
  auto it = p.threads.find(tid);
  return it != p.threads.end() && !it->second.empty() ? it->second : "thread";
}

std::string thread_label(const Profile& p, int32_t tid) {
  return thread_name(p, tid) + "-" + std::to_string(tid);
}

std::vector<int32_t> all_tids(const Profile& p) {
  std::set<int32_t> tids;
  for (const auto& [tid, name] : p.threads) tids.insert(tid);
  for (const auto& [key, weight] : p.stack_weights) tids.insert(key.first);
  for (const SampleEvent& s : p.samples) tids.insert(s.tid);
  for (const CallEvent& c : p.calls) tids.insert(c.tid);
  for (const CounterSample& c : p.counters)
    if (c.kind == CounterKind::kThreadCpuNs) tids.insert(c.tid);
  return {tids.begin(), tids.end()};
}

const std::vector<uint32_t>& stack_at(const Profile& p, uint32_t i) {
  static const std::vector<uint32_t> kEmpty;
  return i < p.stacks.size() ? p.stacks[i] : kEmpty;
}

const Frame& frame_at(const Profile& p, uint32_t i) {
  static const Frame kUnknown = [] {
    Frame f;
    f.function = "[unknown]";
    f.kind = FrameKind::kUnknown;
    return f;
  }();
  return i < p.frames.size() ? p.frames[i] : kUnknown;
}

std::string hex_to_bytes(const std::string& hex) {
  const auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return "";
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out += static_cast<char>(hi << 4 | lo);
  }
  return out;
}

bool write_all(FILE* out, const void* data, size_t size) {
  return size == 0 || fwrite(data, 1, size, out) == size;
}

}  // namespace internal

using internal::folded_name;
using internal::frame_at;
using internal::frame_labels;
using internal::label_at;
using internal::stack_at;
using internal::thread_label;

// ---- frames ----

std::string frame_label(const Frame& f) { return f.function.empty() ? "[unknown]" : f.function; }

std::string frame_source(const Frame& f) {
  if (f.file.empty()) return "";
  return f.line ? f.file + ":" + std::to_string(f.line) : f.file;
}

std::string frame_label_with_line(const Frame& f) {
  std::string src = frame_source(f);
  return src.empty() ? frame_label(f) : frame_label(f) + " (" + src + ")";
}

namespace internal {

// Each frame's label, once: profiles hold many samples of few frames.

const std::string& label_at(const std::vector<std::string>& labels, uint32_t i) {
  static const std::string kUnknown = "[unknown]";
  return i < labels.size() ? labels[i] : kUnknown;
}

// ';' separates frames and the last ' ' separates the count: keep them out
// of names (C++ operator names can contain neither in practice, but
// template arguments can hold spaces; those are fine).
std::string folded_name(const std::string& name) {
  std::string clean = name;
  std::replace(clean.begin(), clean.end(), ';', ':');
  std::replace(clean.begin(), clean.end(), '\n', ' ');
  return clean;
}

double rel_us(const Profile& p, uint64_t ns) {
  return ns >= p.start_ns ? static_cast<double>(ns - p.start_ns) / 1000.0 : 0.0;
}

std::string fmt_duration(uint64_t ns) {
  char buf[64];
  if (ns >= 1000000000ull)
    snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(ns) / 1e9);
  else if (ns >= 1000000ull)
    snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  else if (ns >= 1000ull)
    snprintf(buf, sizeof buf, "%.3f us", static_cast<double>(ns) / 1e3);
  else
    snprintf(buf, sizeof buf, "%" PRIu64 " ns", ns);
  return buf;
}

// Self and inclusive samples per label (a function, or a function at a
// source line), hottest (self, then inclusive) first.
std::vector<SymbolCounts> symbol_counts(const Profile& p, const std::vector<std::string>& labels) {
  std::unordered_map<std::string, SymbolCounts> by_name;
  for (const auto& [key, weight] : p.stack_weights) {
    const auto& frames = stack_at(p, key.second);
    if (frames.empty()) continue;
    std::set<std::string_view> seen;
    for (uint32_t fi : frames) {
      const std::string& name = label_at(labels, fi);
      if (!seen.insert(name).second) continue;  // recursion counts once
      auto& c = by_name[name];
      c.name = name;
      c.inclusive += weight;
    }
    by_name[label_at(labels, frames.back())].self += weight;
  }
  std::vector<SymbolCounts> out;
  out.reserve(by_name.size());
  for (auto& [name, c] : by_name) out.push_back(c);
  std::sort(out.begin(), out.end(), [](const SymbolCounts& a, const SymbolCounts& b) {
    if (a.self != b.self) return a.self > b.self;
    if (a.inclusive != b.inclusive) return a.inclusive > b.inclusive;
    return a.name < b.name;
  });
  return out;
}

uint64_t total_weight(const Profile& p) {
  uint64_t total = 0;
  for (const auto& [key, w] : p.stack_weights) total += w;
  return total;
}

}  // namespace internal

std::map<std::string, uint64_t> folded_stacks(const Profile& p) {
  const std::vector<std::string> labels = frame_labels(p, frame_label);
  std::map<std::string, uint64_t> out;
  for (const auto& [key, weight] : p.stack_weights) {
    std::string line;
    if (p.fold_threads) line = folded_name(thread_label(p, key.first));
    for (uint32_t fi : stack_at(p, key.second)) {
      if (!line.empty()) line += ';';
      line += folded_name(label_at(labels, fi));
    }
    if (line.empty()) continue;
    out[line] += weight;
  }
  return out;
}

bool write_folded(const Profile& p, FILE* out) {
  for (const auto& [line, count] : folded_stacks(p))
    fprintf(out, "%s %" PRIu64 "\n", valid_utf8(line).c_str(), count);
  return ferror(out) == 0;
}

}  // namespace remora::profile
