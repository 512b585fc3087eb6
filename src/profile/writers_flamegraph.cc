// flamegraph.svg: the flame graph, with its search script.
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "profile/writers.h"
#include "profile/writers_internal.h"

namespace remora::profile {

using namespace internal;

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

}  // namespace remora::profile
