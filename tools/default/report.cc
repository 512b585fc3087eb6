// Output writers of the default tool: trace.json (Chrome trace-event JSON),
// folded.txt, flamegraph.svg, stats.csv and summary.txt.
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include "profile.h"

namespace remora_tool {

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

// `raw` with each ill-formed sequence replaced, for the plain-text outputs
// (folded.txt, the summary) that viewers and the CLI read as UTF-8.
std::string valid_utf8(const std::string& raw) {
  return escape_utf8(raw, [](std::string& out, const Utf8Step& step, std::string_view bytes) {
    if (step.valid)
      out += bytes;
    else
      out += kReplacement;
  });
}

std::string thread_label(const Profile& p, int32_t tid) {
  auto it = p.threads.find(tid);
  std::string name = it != p.threads.end() && !it->second.empty() ? it->second : "thread";
  return name + "-" + std::to_string(tid);
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

// Self and inclusive samples per symbol, hottest (self, then inclusive) first.
std::vector<SymbolCounts> symbol_counts(const Profile& p) {
  std::unordered_map<std::string, SymbolCounts> by_name;
  for (const auto& [key, weight] : p.stack_weights) {
    const auto& frames = p.stacks[key.second];
    if (frames.empty()) continue;
    std::set<std::string> seen;
    for (const auto& f : frames) {
      if (!seen.insert(f).second) continue;  // recursion counts once
      auto& c = by_name[f];
      c.name = f;
      c.inclusive += weight;
    }
    by_name[frames.back()].self += weight;
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

}  // namespace

std::string json_escape(const std::string& raw) {
  return escape_utf8(raw, [](std::string& out, const Utf8Step& step, std::string_view bytes) {
    if (!step.valid) {
      out += kReplacement;
      return;
    }
    switch (step.code_point) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (step.code_point < 0x20) {  // RFC 8259: control characters must be escaped
          char buf[8];
          snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(step.code_point));
          out += buf;
        } else {
          out += bytes;
        }
    }
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

std::map<std::string, uint64_t> folded_stacks(const Profile& p) {
  std::map<std::string, uint64_t> out;
  for (const auto& [key, weight] : p.stack_weights) {
    std::string line;
    if (p.fold_threads) line = thread_label(p, key.first);
    for (const auto& f : p.stacks[key.second]) {
      if (!line.empty()) line += ';';
      // ';' separates frames and the last ' ' separates the count: keep
      // them out of names (C++ operator names can contain neither in
      // practice, but template arguments can hold spaces; those are fine).
      std::string clean = f;
      std::replace(clean.begin(), clean.end(), ';', ':');
      std::replace(clean.begin(), clean.end(), '\n', ' ');
      line += clean;
    }
    if (line.empty()) continue;
    out[line] += weight;
  }
  return out;
}

bool write_trace_json(const Profile& p, FILE* out) {
  fprintf(out,
          "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"tool\":\"remora\",\"pid\":%d,\"session\":%" PRIu64
          ",\"sample_hz\":%d},\n\"traceEvents\":[\n",
          p.pid, p.session, p.sampling ? p.hz : 0);
  std::string comm = json_escape(p.comm);
  fprintf(
      out,
      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s (pid %d)\"}}",
      p.pid, p.pid, comm.c_str(), p.pid);
  for (const auto& [tid, name] : p.threads) {
    fprintf(out,
            ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
            p.pid, tid, json_escape(name.empty() ? "thread" : name).c_str());
  }
  // Hundreds of thousands of calls are common: escape each name once and
  // format with snprintf into one buffer.
  std::vector<std::string> fn_json(p.fn_names.size());
  for (size_t i = 0; i < p.fn_names.size(); ++i) fn_json[i] = json_escape(p.fn_names[i]);
  std::string buf;
  buf.reserve(1 << 20);
  char line[256];
  for (const CallEvent& c : p.calls) {
    const char* name = c.fn < fn_json.size() ? fn_json[c.fn].c_str() : "?";
    uint64_t ts_ns = c.start_ns >= p.start_ns ? c.start_ns - p.start_ns : 0;
    int n = snprintf(line, sizeof line,
                     ",\n{\"name\":\"%s\",\"cat\":\"call\",\"ph\":\"X\",\"ts\":%" PRIu64
                     ".%03u,\"dur\":%" PRIu64 ".%03u,\"pid\":%d,\"tid\":%d}",
                     name, ts_ns / 1000, static_cast<unsigned>(ts_ns % 1000), c.dur_ns / 1000,
                     static_cast<unsigned>(c.dur_ns % 1000), p.pid, c.tid);
    buf.append(line, static_cast<size_t>(std::min(n, static_cast<int>(sizeof line) - 1)));
    if (buf.size() > (1 << 20) - 512) {
      fwrite(buf.data(), 1, buf.size(), out);
      buf.clear();
    }
  }
  fwrite(buf.data(), 1, buf.size(), out);
  for (const SampleEvent& s : p.samples) {
    const auto& frames = p.stacks[s.stack];
    std::string leaf = frames.empty() ? "?" : frames.back();
    // The stack, leaf last, at most 32 frames nearest the leaf.
    std::string stack;
    size_t first = frames.size() > 32 ? frames.size() - 32 : 0;
    for (size_t i = first; i < frames.size(); ++i) {
      if (!stack.empty()) stack += ';';
      stack += frames[i];
    }
    fprintf(
        out,
        ",\n{\"name\":\"%s\",\"cat\":\"sample\",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d,"
        "\"args\":{\"weight\":%u,\"stack\":\"%s\"}}",
        json_escape(leaf).c_str(), rel_us(p, s.ts_ns), p.pid, s.tid, s.weight, json_escape(stack).c_str());
  }
  fprintf(out, "\n]}\n");
  return ferror(out) == 0;
}

bool write_folded(const Profile& p, FILE* out) {
  for (const auto& [line, count] : folded_stacks(p))
    fprintf(out, "%s %" PRIu64 "\n", valid_utf8(line).c_str(), count);
  return ferror(out) == 0;
}

// ---- flame graph ----

namespace {

struct Node {
  std::string name;
  uint64_t value = 0;
  std::map<std::string, std::unique_ptr<Node>> children;
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
  double pct = 100.0 * static_cast<double>(n.value) / l.total;
  fprintf(out,
          "<g class=\"f\" data-o=\"%" PRIu64 "\" data-v=\"%" PRIu64 "\" data-d=\"%d\"><title>%s (%" PRIu64
          " samples, %.2f%%)</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" "
          "fill=\"rgb(%d,%d,%d)\" "
          "rx=\"2\"/><text x=\"%.2f\" y=\"%.1f\"></text></g>\n",
          offset, n.value, depth, name.c_str(), n.value, pct, x, y, w, l.frame_h - 1, r, g, b, x + 3,
          y + l.frame_h - 4.5);
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
    frames.push({g: g, o: +g.getAttribute('data-o'), v: +g.getAttribute('data-v'), d: +g.getAttribute('data-d'),
                 r: g.getElementsByTagName('rect')[0], t: g.getElementsByTagName('text')[0],
                 name: g.getElementsByTagName('title')[0].textContent.replace(/ \([0-9]+ samples, [0-9.]+%\)$/, '')});
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
    if (!re.test(f.name)) continue;
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

}  // namespace

bool write_flamegraph_svg(const Profile& p, FILE* out) {
  Node root;
  root.name = "all";
  for (const auto& [line, count] : folded_stacks(p)) {
    Node* n = &root;
    root.value += count;
    size_t pos = 0;
    while (pos <= line.size()) {
      size_t semi = line.find(';', pos);
      if (semi == std::string::npos) semi = line.size();
      std::string frame = line.substr(pos, semi - pos);
      auto& child = n->children[frame];
      if (!child) {
        child = std::make_unique<Node>();
        child->name = frame;
      }
      child->value += count;
      n = child.get();
      pos = semi + 1;
    }
  }
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

bool write_stats_csv(const Profile& p, FILE* out) {
  fprintf(out, "kind,name,calls,total_ns,mean_ns,max_ns,samples,inclusive_samples,share\n");
  std::vector<FuncStat> funcs = p.func_stats;
  std::sort(funcs.begin(), funcs.end(),
            [](const FuncStat& a, const FuncStat& b) { return a.total_ns > b.total_ns; });
  for (const FuncStat& f : funcs) {
    if (f.calls == 0) continue;
    fprintf(out, "call,%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",,,\n", csv_field(f.name).c_str(),
            f.calls, f.total_ns, f.total_ns / f.calls, f.max_ns);
  }
  uint64_t total = 0;
  for (const auto& [_, w] : p.stack_weights) total += w;
  for (const SymbolCounts& s : symbol_counts(p)) {
    fprintf(out, "sample,%s,,,,,%" PRIu64 ",%" PRIu64 ",%.6f\n", csv_field(s.name).c_str(), s.self,
            s.inclusive, total ? static_cast<double>(s.self) / static_cast<double>(total) : 0.0);
  }
  return ferror(out) == 0;
}

namespace {
bool write_summary_raw(const Profile& p, const std::string& dir, FILE* out);
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
  fwrite(text.data(), 1, text.size(), out);
  return ok && ferror(out) == 0;
}

namespace {
bool write_summary_raw(const Profile& p, const std::string& dir, FILE* out) {
  double secs = static_cast<double>(p.end_ns - p.start_ns) / 1e9;
  uint64_t calls = 0;
  for (const auto& f : p.func_stats) calls += f.calls;
  uint64_t total = 0;
  for (const auto& [_, w] : p.stack_weights) total += w;
  fprintf(out, "Remora profile of %s (pid %d), session %" PRIu64 ", %.2f s\n", p.comm.c_str(), p.pid,
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
  fprintf(out, "  output: %s\n", dir.c_str());

  if (p.sampling) {
    fprintf(out, "\nHottest functions (self samples; inclusive in brackets):\n");
    std::vector<SymbolCounts> syms = symbol_counts(p);
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
              uses[labels[i]] > 1 ? s.name.c_str() : labels[i].c_str());
    }
    if (shown == 0) fprintf(out, "  (no samples: the process used no CPU while attached)\n");
  }
  if (p.tracing) {
    fprintf(out, "\nSlowest traced calls:\n");
    int i = 0;
    for (const CallEvent& c : p.slowest_calls) {
      fprintf(out, "  %2d. %12s  %-24s %s at +%.3f s\n", ++i, fmt_duration(c.dur_ns).c_str(),
              c.fn < p.fn_names.size() ? p.fn_names[c.fn].c_str() : "?", thread_label(p, c.tid).c_str(),
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
      fprintf(out, "  %-24s calls %10" PRIu64 "  total %12s  mean %12s  max %12s\n", f.name.c_str(), f.calls,
              fmt_duration(f.total_ns).c_str(), fmt_duration(f.total_ns / f.calls).c_str(),
              fmt_duration(f.max_ns).c_str());
    }
    if (shown == 0) fprintf(out, "  (none)\n");
  }
  if (p.samples_dropped || p.calls_dropped || p.events_capped)
    fprintf(out,
            "\nDropped: %" PRIu64 " samples and %" PRIu64
            " call records (per-thread buffers full; call counts "
            "above are still exact); %" PRIu64 " events left out of trace.json (REMORA_MAX_EVENTS)\n",
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

}  // namespace remora_tool
