// The text outputs of a profile: trace.json (Chrome trace-event JSON, with
// nlohmann-json), folded.txt, flamegraph.svg, stats.csv and summary.txt; and
// the helpers every writer shares (writers_internal.h). Ported from the
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

using internal::frame_at;
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

namespace {

// Each frame's label, once: profiles hold many samples of few frames.
template <typename Label>
std::vector<std::string> frame_labels(const Profile& p, Label label) {
  std::vector<std::string> out;
  out.reserve(p.frames.size());
  for (const Frame& f : p.frames) out.push_back(label(f));
  return out;
}

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

struct SymbolCounts {
  std::string name;
  uint64_t self = 0;
  uint64_t inclusive = 0;
};

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

}  // namespace

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

// ---- trace.json ----

namespace {

using nlohmann::json;

// Every string put in a json value is valid_utf8 already; the replace
// handler is the belt to those braces: dump() never fails (with exceptions
// off, nlohmann would abort on invalid UTF-8).
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Buffers events and writes them in large blocks.
class EventSink {
 public:
  explicit EventSink(FILE* out) : out_(out) { buf_.reserve(kFlushAt + 4096); }
  void add(const json& event) {
    if (!first_) buf_ += ",\n";
    first_ = false;
    buf_ += dump(event);
    if (buf_.size() >= kFlushAt) flush();
  }
  void raw(std::string_view s) { buf_ += s; }
  bool flush() {
    ok_ = internal::write_all(out_, buf_.data(), buf_.size()) && ok_;
    buf_.clear();
    return ok_;
  }

 private:
  static constexpr size_t kFlushAt = 1 << 20;
  FILE* out_;
  std::string buf_;
  bool first_ = true;
  bool ok_ = true;
};

// The traced calls as complete ("X") events on their thread. One event
// object, its fields assigned per call: sessions hold up to
// REMORA_MAX_EVENTS (a million) calls, and building each object anew costs
// more than writing it.
void add_call_events(const Profile& p, int pid, EventSink& sink) {
  std::vector<json> fn_names;
  fn_names.reserve(p.fn_names.size());
  for (const std::string& n : p.fn_names) fn_names.emplace_back(valid_utf8(n));
  const json unknown = "?";
  json call = {{"name", ""}, {"cat", "call"}, {"ph", "X"}, {"ts", 0.0},
               {"dur", 0.0}, {"pid", pid},    {"tid", 0}};
  json& name = call["name"];
  json& ts = call["ts"];
  json& dur = call["dur"];
  json& tid = call["tid"];
  for (const CallEvent& c : p.calls) {
    name = c.fn < fn_names.size() ? fn_names[c.fn] : unknown;
    ts = rel_us(p, c.start_ns);
    dur = static_cast<double>(c.dur_ns) / 1000.0;
    tid = c.tid;
    sink.add(call);
  }
}

// The samples of the timeline as instant events on their thread: the leaf
// function is the name, the stack (leaf last, at most 32 frames nearest the
// leaf) and the leaf's source line are in args.
void add_sample_events(const Profile& p, int pid, EventSink& sink) {
  const std::vector<std::string> labels =
      frame_labels(p, [](const Frame& f) { return valid_utf8(frame_label(f)); });
  for (const SampleEvent& s : p.samples) {
    const auto& frames = stack_at(p, s.stack);
    std::string stack;
    size_t first = frames.size() > 32 ? frames.size() - 32 : 0;
    for (size_t i = first; i < frames.size(); ++i) {
      if (!stack.empty()) stack += ';';
      stack += label_at(labels, frames[i]);
    }
    json args = {{"weight", s.weight}, {"stack", stack}};
    if (!frames.empty()) {
      const Frame& leaf = frame_at(p, frames.back());
      if (!leaf.file.empty()) args["source"] = valid_utf8(frame_source(leaf));
      if (!leaf.module.empty()) args["module"] = valid_utf8(leaf.module);
    }
    sink.add({{"name", frames.empty() ? std::string("?") : label_at(labels, frames.back())},
              {"cat", "sample"},
              {"ph", "i"},
              {"s", "t"},
              {"ts", rel_us(p, s.ts_ns)},
              {"pid", pid},
              {"tid", s.tid},
              {"args", std::move(args)}});
  }
}

}  // namespace

bool write_trace_json(const Profile& p, FILE* out) {
  const int pid = internal::trace_pid(p);
  json other = {{"tool", "remora"},
                {"pid", p.pid},
                {"session", p.session},
                {"sample_hz", p.sampling ? p.hz : 0},
                {"events_capped", p.events_capped}};
  if (pid != p.pid) other["ns_pid"] = pid;
  EventSink sink(out);
  sink.raw("{\"displayTimeUnit\":\"ns\",\"otherData\":" + dump(other) + ",\n\"traceEvents\":[\n");
  sink.add({{"name", "process_name"},
            {"ph", "M"},
            {"pid", pid},
            {"tid", pid},
            {"args", {{"name", valid_utf8(internal::process_label(p))}}}});
  for (int32_t tid : internal::all_tids(p))
    sink.add({{"name", "thread_name"},
              {"ph", "M"},
              {"pid", pid},
              {"tid", tid},
              {"args", {{"name", valid_utf8(internal::thread_name(p, tid))}}}});
  add_call_events(p, pid, sink);
  add_sample_events(p, pid, sink);
  sink.raw("\n]}\n");
  return sink.flush() && ferror(out) == 0;
}

// ---- flame graph ----

namespace {

// One box: a function at one place in the call tree. Boxes merge frames by
// function name, as flamegraph.pl does; the source shown is the frames'
// file and line when they agree, the file alone when only the lines differ.
struct Node {
  std::string name;
  std::string file;
  uint32_t line = 0;
  bool mixed_files = false;
  uint64_t value = 0;
  std::map<std::string, std::unique_ptr<Node>> children;

  Node* child(const std::string& child_name, const Frame* f) {
    auto& c = children[child_name];
    if (!c) {
      c = std::make_unique<Node>();
      c->name = child_name;
      if (f) c->file = f->file, c->line = f->line;
    } else if (!c->mixed_files && (f ? f->file : std::string()) != c->file) {
      c->mixed_files = true;
      c->file.clear();
      c->line = 0;
    } else if (f && f->line != c->line) {
      c->line = 0;
    }
    return c.get();
  }
  std::string source() const {
    if (file.empty()) return "";
    return line ? file + ":" + std::to_string(line) : file;
  }
};

uint32_t name_hash(const std::string& s) {
  uint32_t h = 2166136261u;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h;
}

struct SvgLayout {
  double width = 1200, pad = 10, frame_h = 16, top = 60;
  double total = 1;
  int max_depth = 0;
  double height() const { return top + (max_depth + 1) * frame_h + 30; }
};

void measure(const Node& n, int depth, SvgLayout& l) {
  l.max_depth = std::max(l.max_depth, depth);
  for (const auto& [_, c] : n.children) measure(*c, depth + 1, l);
}

void emit(FILE* out, const Node& n, int depth, uint64_t offset, const SvgLayout& l) {
  double scale = (l.width - 2 * l.pad) / l.total;
  double w = static_cast<double>(n.value) * scale;
  if (w < 0.1) return;  // invisible: keep the file small
  double x = l.pad + static_cast<double>(offset) * scale;
  double y = l.height() - 30 - (depth + 1) * l.frame_h;
  uint32_t h = name_hash(n.name);
  int r = 205 + static_cast<int>(h % 50), g = static_cast<int>((h >> 8) % 180),
      b = static_cast<int>((h >> 16) % 55);
  std::string name = xml_escape(n.name);
  // The script takes the source back out of the title for the label: the
  // title holds it escaped exactly as data-s does, so both decode alike.
  std::string src = xml_escape(n.source());
  std::string src_attr = src.empty() ? "" : " data-s=\"" + src + "\"";
  std::string title = src.empty() ? name : name + " (" + src + ")";
  double pct = 100.0 * static_cast<double>(n.value) / l.total;
  fprintf(out,
          "<g class=\"f\" data-o=\"%" PRIu64 "\" data-v=\"%" PRIu64 "\" data-d=\"%d\"%s><title>%s (%" PRIu64
          " samples, %.2f%%)</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
          "fill=\"rgb(%d,%d,%d)\" "
          "rx=\"2\"/><text x=\"%.2f\" y=\"%.1f\"></text></g>\n",
          offset, n.value, depth, src_attr.c_str(), title.c_str(), n.value, pct, x, y, w, l.frame_h - 1, r, g,
          b, x + 3, y + l.frame_h - 4.5);
  uint64_t child_offset = offset;
  // Children in name order, like flamegraph.pl: the x axis is not time.
  for (const auto& [_, c] : n.children) {
    emit(out, *c, depth + 1, child_offset, l);
    child_offset += c->value;
  }
}

// Search (click "Search" or press Ctrl-F / "/") highlights the frames whose
// name matches a regular expression and shows their share; clicking a frame
// zooms to it; "Reset zoom" or Escape goes back. Frame labels are truncated
// to their width by the script, so the file holds each name once (in the
// title). No "]]>" may appear in this text.
const char kFlameScript[] = R"JS(
var svg = document.documentElement, frames = [], W, PAD = 10, total, zoomed = null;
function init() {
  var gs = svg.getElementsByClassName('f');
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i];
    // The title reads "name (file:line) (N samples, P%)"; data-s holds the
    // "file:line" part, so the label shows the name alone.
    var src = g.getAttribute('data-s') || '';
    var name = g.getElementsByTagName('title')[0].textContent.replace(/ \([0-9]+ samples, [0-9.]+%\)$/, '');
    if (src) name = name.substring(0, name.length - src.length - 3);
    frames.push({g: g, o: +g.getAttribute('data-o'), v: +g.getAttribute('data-v'), d: +g.getAttribute('data-d'),
                 r: g.getElementsByTagName('rect')[0], t: g.getElementsByTagName('text')[0], name: name, src: src});
    g.addEventListener('click', (function(f) { return function() { zoom(f); }; })(frames[frames.length - 1]));
  }
  W = +svg.getAttribute('width') - 2 * PAD;
  total = frames.length ? frames[0].v : 1;
  layout(0, total, 0);
  document.getElementById('search').addEventListener('click', search);
  document.getElementById('reset').addEventListener('click', function() { zoomed = null; layout(0, total, 0); });
  document.addEventListener('keydown', function(e) {
    if ((e.ctrlKey && e.key === 'f') || e.key === '/') { e.preventDefault(); search(); }
    if (e.key === 'Escape') { zoomed = null; layout(0, total, 0); clearSearch(); }
  });
}
function label(f, w) {
  var n = Math.floor((w - 6) / 7);
  if (n < 3) return '';
  return f.name.length <= n ? f.name : f.name.substring(0, n - 2) + '..';
}
function layout(o, v, d) {
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i], inside = f.o >= o && f.o + f.v <= o + v && f.d >= d, above = f.d < d && f.o <= o && f.o + f.v >= o + v;
    if (!inside && !above) { f.g.style.display = 'none'; continue; }
    var x = above ? 0 : (f.o - o) / v * W, w = above ? W : f.v / v * W;
    if (w < 0.1) { f.g.style.display = 'none'; continue; }
    f.g.style.display = '';
    f.g.style.opacity = above ? 0.6 : 1;
    f.r.setAttribute('x', PAD + x); f.r.setAttribute('width', w);
    f.t.setAttribute('x', PAD + x + 3); f.t.textContent = label(f, w);
  }
}
function zoom(f) { zoomed = f; layout(f.o, f.v, f.d); }
function clearSearch() {
  for (var i = 0; i < frames.length; i++) frames[i].r.removeAttribute('stroke');
  for (var i = 0; i < frames.length; i++) frames[i].r.style.fill = '';
  document.getElementById('matched').textContent = '';
}
function search() {
  var term = prompt('Search (regular expression):', '');
  clearSearch();
  if (!term) return;
  var re;
  try { re = new RegExp(term); } catch (e) { alert('Invalid regular expression: ' + e.message); return; }
  // Share of samples in matching frames, counting a matching frame nested
  // in another matching frame once.
  var spans = [];
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i];
    if (!re.test(f.name) && !(f.src && re.test(f.src))) continue;  // a name or a source file
    f.r.style.fill = 'rgb(230,0,230)';
    spans.push([f.o, f.o + f.v]);
  }
  spans.sort(function(a, b) { return a[0] - b[0] || b[1] - a[1]; });
  var covered = 0, end = -1;
  for (var i = 0; i < spans.length; i++) {
    if (spans[i][0] >= end) { covered += spans[i][1] - spans[i][0]; end = spans[i][1]; }
    else if (spans[i][1] > end) { covered += spans[i][1] - end; end = spans[i][1]; }
  }
  document.getElementById('matched').textContent =
      'Matched "' + term + '": ' + (100 * covered / total).toFixed(2) + '% of samples';
}
window.addEventListener('load', init);
)JS";

// The call tree of every sample, root first, with the thread at the root
// when folded stacks start with it.
void build_tree(const Profile& p, Node& root) {
  root.name = "all";
  for (const auto& [key, weight] : p.stack_weights) {
    const auto& frames = stack_at(p, key.second);
    if (frames.empty() && !p.fold_threads) continue;
    root.value += weight;
    Node* n = &root;
    if (p.fold_threads) {
      n = n->child(thread_label(p, key.first), nullptr);
      n->value += weight;
    }
    for (uint32_t fi : frames) {
      const Frame& f = frame_at(p, fi);
      n = n->child(frame_label(f), &f);
      n->value += weight;
    }
  }
}

}  // namespace

bool write_flamegraph_svg(const Profile& p, FILE* out) {
  Node root;
  build_tree(p, root);
  SvgLayout l;
  l.total = root.value ? static_cast<double>(root.value) : 1.0;
  measure(root, 0, l);
  std::string title = xml_escape(p.comm + " (pid " + std::to_string(p.pid) + "), session " +
                                 std::to_string(p.session) + ": " + std::to_string(root.value) + " samples");
  fprintf(out,
          "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
          "<svg version=\"1.1\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
          "viewBox=\"0 0 %.0f %.0f\">\n"
          "<style type=\"text/css\">text { font-family: monospace; font-size: 12px; fill: rgb(0,0,0); } "
          ".f:hover rect { stroke: black; stroke-width: 0.5; cursor: pointer; } "
          "#search, #reset { cursor: pointer; } #search:hover, #reset:hover { fill: rgb(0,0,200); }</style>\n"
          "<script type=\"text/ecmascript\"><![CDATA[%s]]></script>\n"
          "<rect x=\"0\" y=\"0\" width=\"100%%\" height=\"100%%\" fill=\"rgb(250,250,245)\"/>\n"
          "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" style=\"font-size:17px\">Flame graph: %s</text>\n"
          "<text id=\"reset\" x=\"10\" y=\"48\">Reset zoom</text>\n"
          "<text id=\"search\" x=\"%.0f\" y=\"48\" text-anchor=\"end\">Search (Ctrl-F)</text>\n"
          "<text id=\"matched\" x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\"></text>\n",
          l.width, l.height(), l.width, l.height(), kFlameScript, l.width / 2, title.c_str(), l.width - 10,
          l.width - 10, l.height() - 10);
  if (root.value == 0) {
    fprintf(out, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">No samples (sampling %s)</text>\n",
            l.width / 2, l.top + 20, p.sampling ? "found no CPU time" : "was off");
  } else {
    emit(out, root, 0, 0, l);
  }
  fprintf(out, "</svg>\n");
  return ferror(out) == 0;
}

// ---- stats.csv ----

bool write_stats_csv(const Profile& p, FILE* out) {
  fprintf(out, "kind,name,calls,total_ns,mean_ns,max_ns,samples,inclusive_samples,share\n");
  std::vector<FuncStat> funcs = p.func_stats;
  std::sort(funcs.begin(), funcs.end(),
            [](const FuncStat& a, const FuncStat& b) { return a.total_ns > b.total_ns; });
  for (const FuncStat& f : funcs) {
    if (f.calls == 0) continue;
    fprintf(out, "call,%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",,,\n",
            csv_field(valid_utf8(f.name)).c_str(), f.calls, f.total_ns, f.total_ns / f.calls, f.max_ns);
  }
  // One row per function and source line ("f (file.cc:12)"): the self
  // samples of a line are where its time went. The columns stay those of
  // the former in-process writer, which scripts read.
  const uint64_t total = total_weight(p);
  for (const SymbolCounts& s : symbol_counts(p, frame_labels(p, frame_label_with_line))) {
    fprintf(out, "sample,%s,,,,,%" PRIu64 ",%" PRIu64 ",%.6f\n", csv_field(valid_utf8(s.name)).c_str(),
            s.self, s.inclusive, total ? static_cast<double>(s.self) / static_cast<double>(total) : 0.0);
  }
  return ferror(out) == 0;
}

// ---- summary.txt ----

namespace {

// The output files, as the summary lists them (`remora attach` prints it).
constexpr const char* kOutputFiles[][2] = {
    {"trace.perfetto", "timeline, CPU samples and counters: ui.perfetto.dev"},
    {"trace.json", "the timeline as Chrome trace JSON: chrome://tracing, ui.perfetto.dev"},
    {"profile.pb.gz", "pprof: go tool pprof, Grafana Pyroscope, speedscope"},
    {"flamegraph.svg", "flame graph with search: a web browser"},
    {"folded.txt", "folded stacks: flamegraph.pl, speedscope"},
    {"stats.csv", "per-function calls and samples"},
};

// A name on one line of the terminal: a newline in a thread's name (names
// are any bytes) would break the table.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return s;
}

void write_hottest(const Profile& p, uint64_t total, FILE* out) {
  fprintf(out, "\nHottest functions (self samples; inclusive in brackets):\n");
  std::vector<SymbolCounts> syms = symbol_counts(p, frame_labels(p, frame_label));
  size_t shown = 0;
  while (shown < syms.size() && shown < 10 && syms[shown].self != 0) ++shown;
  // Template arguments collapsed, but two different functions never read
  // the same (f<std::vector<int>> and f<std::vector<long>>): those keep
  // their full names.
  std::vector<std::string> labels;
  std::map<std::string, int> uses;
  for (size_t i = 0; i < shown; ++i) ++uses[labels.emplace_back(collapse_template_args(syms[i].name))];
  for (size_t i = 0; i < shown; ++i) {
    const SymbolCounts& s = syms[i];
    fprintf(out, "  %2zu. %6.2f%%  %8" PRIu64 "  [%6.2f%%]  %s\n", i + 1,
            100.0 * static_cast<double>(s.self) / static_cast<double>(total ? total : 1), s.self,
            100.0 * static_cast<double>(s.inclusive) / static_cast<double>(total ? total : 1),
            one_line(uses[labels[i]] > 1 ? s.name : labels[i]).c_str());
  }
  if (shown == 0) fprintf(out, "  (no samples: the process used no CPU while attached)\n");
}

void write_traced(const Profile& p, FILE* out) {
  fprintf(out, "\nSlowest traced calls:\n");
  int i = 0;
  for (const CallEvent& c : p.slowest_calls) {
    fprintf(out, "  %2d. %12s  %-24s %s at +%.3f s\n", ++i, fmt_duration(c.dur_ns).c_str(),
            c.fn < p.fn_names.size() ? one_line(p.fn_names[c.fn]).c_str() : "?",
            one_line(thread_label(p, c.tid)).c_str(),
            static_cast<double>(c.start_ns - std::min(c.start_ns, p.start_ns)) / 1e9);
  }
  if (i == 0) fprintf(out, "  (no traced call)\n");
  std::vector<FuncStat> funcs = p.func_stats;
  std::sort(funcs.begin(), funcs.end(),
            [](const FuncStat& a, const FuncStat& b) { return a.total_ns > b.total_ns; });
  fprintf(out, "\nTraced functions by total time:\n");
  int shown = 0;
  for (const auto& f : funcs) {
    if (f.calls == 0 || shown == 10) continue;
    ++shown;
    fprintf(out, "  %-24s calls %10" PRIu64 "  total %12s  mean %12s  max %12s\n", one_line(f.name).c_str(),
            f.calls, fmt_duration(f.total_ns).c_str(), fmt_duration(f.total_ns / f.calls).c_str(),
            fmt_duration(f.max_ns).c_str());
  }
  if (shown == 0) fprintf(out, "  (none)\n");
}

bool write_summary_raw(const Profile& p, const std::string& dir, FILE* out) {
  double secs = p.end_ns > p.start_ns ? static_cast<double>(p.end_ns - p.start_ns) / 1e9 : 0.0;
  uint64_t calls = 0;
  for (const auto& f : p.func_stats) calls += f.calls;
  const uint64_t total = total_weight(p);
  fprintf(out, "Remora profile of %s, session %" PRIu64 ", %.2f s\n", internal::process_label(p).c_str(),
          p.session, secs);
  if (p.sampling)
    fprintf(out,
            "  sampling: %d Hz of CPU time per thread (signal %d), %" PRIu64 " samples from %zu threads\n",
            p.hz, p.signal, total, p.threads.size());
  else
    fprintf(out, "  sampling: off\n");
  if (p.tracing)
    fprintf(out, "  tracing: %u GOT slots patched, %" PRIu64 " calls traced\n", p.patched_slots, calls);
  else
    fprintf(out, "  tracing: off\n");
  if (p.detach_cpu_ns > 0)
    fprintf(out, "  detach: %.2f ms of the target's CPU (the raw records; rendered by remora)\n",
            static_cast<double>(p.detach_cpu_ns) / 1e6);
  fprintf(out, "  output: %s\n", dir.c_str());
  for (const auto& [file, what] : kOutputFiles) fprintf(out, "    %-15s %s\n", file, what);
  if (p.sampling) write_hottest(p, total, out);
  if (p.tracing) write_traced(p, out);
  if (p.samples_dropped || p.calls_dropped || p.events_capped)
    fprintf(out,
            "\nDropped: %" PRIu64 " samples and %" PRIu64
            " call records (per-thread buffers full; call counts above are still exact); %" PRIu64
            " events left out of the timeline in trace.perfetto and trace.json (REMORA_MAX_EVENTS)\n",
            p.samples_dropped, p.calls_dropped, p.events_capped);
  if (!p.warnings.empty()) {
    fprintf(out, "\nWarnings:\n");
    std::set<std::string> seen;
    for (const auto& w : p.warnings)
      if (seen.insert(w).second) fprintf(out, "  %s\n", w.c_str());
  }
  return ferror(out) == 0;
}

}  // namespace

// The summary is printed by the CLI: keep it valid UTF-8 whatever the thread
// and symbol names hold.
bool write_summary(const Profile& p, const std::string& dir, FILE* out) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  if (mem == nullptr) return false;
  bool ok = write_summary_raw(p, dir, mem);
  ok = fclose(mem) == 0 && ok;
  std::string text = valid_utf8(std::string(buf ? buf : "", len));
  free(buf);
  return internal::write_all(out, text.data(), text.size()) && ok && ferror(out) == 0;
}

}  // namespace remora::profile
