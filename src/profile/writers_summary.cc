// stats.csv and summary.txt.
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
