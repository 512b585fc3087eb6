// merge_job (merge.h): reads job.json, goes through the ranks in node, then
// rank order, hands each rank's trace.perfetto to the TraceMerger
// (merge_perfetto.cc) and its profile.pb.gz to the PprofMerger and
// StackModel (merge_pprof.cc), and writes ranks.csv and summary.txt
// itself. One rank's files are in memory at a time.
#include "profile/merge.h"

#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include "base/strings.h"
#include "base/unique_fd.h"
#include "profile/merge_internal.h"
#include "profile/writers.h"

namespace remora::profile {

namespace merge {

std::string rank_title(const JobRank& r) {
  if (r.rank < 0) return r.node + " pid " + std::to_string(r.pid);
  return r.node + " rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ")";
}

std::string process_title(const JobRank& r) {
  const std::string process = r.comm + " (pid " + std::to_string(r.pid) + ")";
  if (r.rank < 0) return r.node + ": " + process;
  return "rank " + std::to_string(r.rank) + " on " + r.node + ": " + process;
}

std::string rank_frame(const JobRank& r) {
  if (r.rank < 0) return r.comm + " (pid " + std::to_string(r.pid) + ")";
  return "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ")";
}

Result<std::string> read_file(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::from_errno("cannot open " + path);
  std::string out;
  struct stat st;
  if (::fstat(fd.get(), &st) == 0 && st.st_size > 0) {
    if (static_cast<uint64_t>(st.st_size) > max)
      return Error(Errc::kParse, path + " is larger than " + std::to_string(max >> 20) + " MiB");
    out.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("cannot read " + path);
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max)
      return Error(Errc::kParse, path + " is larger than " + std::to_string(max >> 20) + " MiB");
  }
  return out;
}

}  // namespace merge

namespace {

using merge::RankInput;

constexpr size_t kMaxTraceBytes = 4ull << 30;  // one rank's trace.perfetto
constexpr size_t kMaxStatsBytes = 256u << 20;
constexpr size_t kMaxListed = 10;  // ranks named in one message before "and N more"

// The merge of one job directory, as it goes.
struct Job {
  std::string dir;
  JobManifest manifest;
  std::vector<RankInput> inputs;  // node, then rank order
  std::vector<MergedRank> rows;   // the same order
  std::vector<std::string> warnings;
  std::vector<std::string> left_out;  // why ranks are left out: summary.txt lists them apart
  std::vector<std::string> files;     // written, in order
  uint64_t profile_span_ns = 0;       // the merged pprof's duration

  std::string path(const MergedRank& row, const char* file) const { return dir + "/" + row.dir + "/" + file; }
  // Rank i is (partly) left out: its row says why, and so does a warning.
  void problem(size_t i, const std::string& what, const std::string& left_out_of) {
    rows[i].problem += (rows[i].problem.empty() ? "" : "; ") + what;
    warnings.push_back(merge::rank_title(*inputs[i].rank) + ": " + what + ": left out of " + left_out_of);
    left_out.push_back(warnings.back());
  }
};

Result<void> write_atomically(const std::string& path, const std::function<bool(FILE*)>& fn) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "we");
  if (f == nullptr) return Error::from_errno("cannot create " + tmp + " (make the job's directory writable)");
  bool ok = fn(f);
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    return Error(Errc::kIo, "cannot write " + tmp + ": " + std::strerror(err != 0 ? err : errno), err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = Error::from_errno("cannot rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return e;
  }
  return {};
}

Result<void> write_output(Job& job, const char* name, const std::function<bool(FILE*)>& fn) {
  const std::string path = job.dir + "/" + name;
  REMORA_TRY(write_atomically(path, fn));
  job.files.push_back(path);
  return {};
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The ranks in node, then rank order (the ranks' children, rank -1, after
// the node's ranks, by pid), each with its row and its node's clock.
void order_ranks(Job& job) {
  static const std::vector<ClockSample> kNoClock;
  std::vector<const JobRank*> ranks;
  for (const JobRank& r : job.manifest.ranks) ranks.push_back(&r);
  std::stable_sort(ranks.begin(), ranks.end(), [](const JobRank* a, const JobRank* b) {
    return std::make_tuple(a->node, a->rank < 0, a->rank, a->pid) <
           std::make_tuple(b->node, b->rank < 0, b->rank, b->pid);
  });
  for (const JobRank* r : ranks) {
    const JobNode* node = job.manifest.node(r->node);
    job.inputs.push_back(
        {r, node != nullptr ? &node->clock : &kNoClock, static_cast<int>(job.inputs.size())});
    MergedRank& row = job.rows.emplace_back();
    row.node = r->node, row.rank = r->rank, row.local_rank = r->local_rank, row.pid = r->pid;
    row.comm = r->comm, row.result = r->result, row.end = r->end, row.dir = r->dir;
    if (row.dir.empty()) {
      row.problem = "no output came back";  // job.json's result says why: not a warning of the merge
      job.left_out.push_back(merge::rank_title(*r) + ": " + row.problem);
    } else if (!is_dir(job.dir + "/" + row.dir)) {
      job.problem(job.rows.size() - 1, "its directory " + r->dir + " is missing", "every merged file");
    }
  }
}

bool has_outputs(const Job& job, const MergedRank& row) {
  return !row.dir.empty() && is_dir(job.dir + "/" + row.dir);
}

// trace.perfetto: each rank's packets appended to the temporary file as
// they are remapped, behind the header once the first rank merged.
Result<void> merge_traces(Job& job) {
  const std::string path = job.dir + "/trace.perfetto", tmp = path + ".tmp";
  FILE* out = std::fopen(tmp.c_str(), "we");
  if (out == nullptr)
    return Error::from_errno("cannot create " + tmp + " (make the job's directory writable)");
  merge::TraceMerger merger;
  bool any = false, ok = true;
  for (size_t i = 0; i < job.rows.size() && ok; ++i) {
    MergedRank& row = job.rows[i];
    if (!has_outputs(job, row)) continue;
    const std::string file = row.dir + "/trace.perfetto";
    auto bytes = merge::read_file(job.path(row, "trace.perfetto"), kMaxTraceBytes);
    if (!bytes) {
      job.problem(i, file + " cannot be read (" + bytes.error().to_string() + ")", "trace.perfetto");
      continue;
    }
    auto packets = merger.add(job.inputs[i], *bytes, &job.warnings);
    if (!packets) {
      job.problem(i, file + " does not parse (" + packets.error().to_string() + ")", "trace.perfetto");
      continue;
    }
    if (!any) {
      const JobManifest& m = job.manifest;
      const std::string header =
          merge::TraceMerger::header(m.window ? m.window->start_mono_ns : merger.first_ts());
      ok = std::fwrite(header.data(), 1, header.size(), out) == header.size();
    }
    ok = ok && std::fwrite(packets->data(), 1, packets->size(), out) == packets->size();
    row.in_trace = any = true;
  }
  const int err = errno;
  ok = std::fclose(out) == 0 && ok;
  if (!ok || !any) {
    ::unlink(tmp.c_str());
    if (!ok) return Error(Errc::kIo, "cannot write " + tmp + ": " + std::strerror(err), err);
    ::unlink(path.c_str());  // an earlier merge's, of other outputs: it would mislead
    job.warnings.push_back("no rank's trace.perfetto merged: the job has no trace.perfetto");
    return {};
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = Error::from_errno("cannot rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return e;
  }
  job.files.push_back(path);
  return {};
}

// The flame graph of the job, titled by the job: write_flamegraph_svg
// titles a profile "COMM (pid P), session S", which a job has not; the
// merge's profile says pid 0 and session 0, and that part of the title is
// taken out again.
bool write_job_flamegraph(const Profile& p, FILE* out) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* mem = open_memstream(&buf, &len);
  if (mem == nullptr) return false;
  bool ok = write_flamegraph_svg(p, mem);
  ok = std::fclose(mem) == 0 && ok;
  std::string svg(buf != nullptr ? buf : "", len);
  std::free(buf);
  const std::string from = xml_escape(p.comm + " (pid 0), session 0: "), to = xml_escape(p.comm + ": ");
  if (size_t at = svg.find(from); at != std::string::npos) svg.replace(at, from.size(), to);
  return ok && std::fwrite(svg.data(), 1, svg.size(), out) == svg.size() && std::ferror(out) == 0;
}

std::string job_title(const JobManifest& m) {
  return "Slurm job " + m.job + (m.step.empty() ? " (every step)" : " (step " + m.step + ")");
}

constexpr char kProfileFiles[] = "profile.pb.gz, flamegraph.svg and folded.txt";

// profile.pb.gz, flamegraph.svg and folded.txt, from each rank's pprof.
Result<void> merge_profiles(Job& job) {
  merge::PprofMerger merger;
  merge::StackModel model;
  for (size_t i = 0; i < job.rows.size(); ++i) {
    MergedRank& row = job.rows[i];
    if (!has_outputs(job, row)) continue;
    const std::string file = row.dir + "/profile.pb.gz";
    auto p = merge::read_pprof(job.path(row, "profile.pb.gz"));
    if (!p) {
      job.problem(i, file + " does not merge (" + p.error().to_string() + ")", kProfileFiles);
      continue;
    }
    if (auto added = merger.add(*p, *job.inputs[i].rank); !added) {
      job.problem(i, file + " does not merge: " + added.error().message(), kProfileFiles);
      continue;
    }
    model.add(*p, *job.inputs[i].rank);
    const merge::RankSamples s = merge::rank_samples(*p);
    row.samples = s.total, row.hottest = s.hottest, row.hottest_samples = s.hottest_samples;
    row.in_profile = true;
  }
  if (merger.empty()) {
    for (const char* stale : {"profile.pb.gz", "flamegraph.svg", "folded.txt"})  // an earlier merge's
      ::unlink((job.dir + "/" + stale).c_str());
    job.warnings.push_back(
        "no rank's profile.pb.gz merged: the job has no profile.pb.gz, flamegraph.svg or folded.txt");
    return {};
  }
  const std::string title = job_title(job.manifest);
  const merge::pprof::Profile merged = merger.take("remora merge of " + title);
  job.profile_span_ns = static_cast<uint64_t>(merged.duration_nanos());
  REMORA_TRY(write_output(job, "profile.pb.gz", [&](FILE* f) { return merge::write_pprof_gz(merged, f); }));
  Profile& p = model.profile();
  p.comm = title;
  p.sampling = true;
  REMORA_TRY(write_output(job, "flamegraph.svg", [&](FILE* f) { return write_job_flamegraph(p, f); }));
  REMORA_TRY(write_output(job, "folded.txt", [&](FILE* f) { return write_folded(p, f); }));
  return {};
}

// A CSV text (RFC 4180: quoted fields may hold commas, quotes doubled,
// line breaks) as rows of fields. Lenient: a stray quote is kept.
std::vector<std::vector<std::string>> parse_csv(std::string_view text) {
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    std::string& field = rows.back().back();
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"' && field.empty()) {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\n') {
      rows.emplace_back(1);
    } else if (c != '\r') {
      field += c;
    }
  }
  if (rows.back().size() == 1 && rows.back()[0].empty()) rows.pop_back();
  return rows;
}

// The slowest traced call of a rank, from its stats.csv (writers.cc: rows
// "call,NAME,CALLS,TOTAL_NS,MEAN_NS,MAX_NS,..."); nothing when it traced no
// call or has no stats.csv.
void read_slowest_call(Job& job, MergedRank& row) {
  auto text = merge::read_file(job.path(row, "stats.csv"), kMaxStatsBytes);
  if (!text) return;
  for (const auto& f : parse_csv(*text)) {
    if (f.size() < 6 || f[0] != "call") continue;
    auto max_ns = parse_u64(f[5]);
    if (max_ns && (row.slowest_call.empty() || *max_ns > row.slowest_call_ns))
      row.slowest_call = f[1], row.slowest_call_ns = *max_ns;
  }
}

std::string fmt_duration(uint64_t ns) {
  char buf[64];
  if (ns >= 1000000000ull)
    std::snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(ns) / 1e9);
  else if (ns >= 1000000ull)
    std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  else if (ns >= 1000ull)
    std::snprintf(buf, sizeof buf, "%.3f us", static_cast<double>(ns) / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%" PRIu64 " ns", ns);
  return buf;
}

bool write_ranks_csv(const Job& job, FILE* out) {
  std::fprintf(out,
               "node,rank,local_rank,pid,comm,result,samples,hottest_function,hottest_samples,slowest_call,"
               "slowest_call_us,dir,end,problem\n");
  for (const MergedRank& r : job.rows) {
    const auto field = [](const std::string& s) { return csv_field(valid_utf8(s)); };
    char us[64] = "";
    if (!r.slowest_call.empty())
      std::snprintf(us, sizeof us, "%.3f", static_cast<double>(r.slowest_call_ns) / 1e3);
    std::fprintf(out, "%s,%d,%d,%d,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", field(r.node).c_str(), r.rank,
                 r.local_rank, r.pid, field(r.comm).c_str(), field(r.result).c_str(),
                 r.in_profile ? std::to_string(r.samples).c_str() : "", field(r.hottest).c_str(),
                 r.in_profile ? std::to_string(r.hottest_samples).c_str() : "", field(r.slowest_call).c_str(),
                 us, field(r.dir).c_str(), field(r.end).c_str(), field(r.problem).c_str());
  }
  return std::ferror(out) == 0;
}

// ---- summary.txt ----

// A cell of the terminal's table: on one line, at most kMaxCell bytes (cut
// at a UTF-8 character's start).
constexpr size_t kMaxCell = 48;
std::string cell(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  if (s.size() <= kMaxCell) return s;
  size_t cut = kMaxCell - 3;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

void write_table(const Job& job, std::string& out) {
  std::vector<std::vector<std::string>> rows = {
      {"NODE", "RANK", "PID", "COMMAND", "SAMPLES", "HOTTEST", "SLOWEST CALL"}};
  for (const MergedRank& r : job.rows) {
    std::string hottest = r.hottest.empty() ? "-"
                                            : collapse_template_args(r.hottest) + " (" +
                                                  std::to_string(r.hottest_samples) + ")";
    std::string slowest = r.slowest_call.empty() ? "-"
                                                 : collapse_template_args(r.slowest_call) + " " +
                                                       fmt_duration(r.slowest_call_ns);
    rows.push_back({r.node, r.rank >= 0 ? std::to_string(r.rank) : "-", std::to_string(r.pid), r.comm,
                    r.in_profile ? std::to_string(r.samples) : "-",
                    r.in_profile || r.in_trace ? hottest : "(not merged)", slowest});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], (row[c] = cell(row[c])).size());
  for (const auto& row : rows) {
    std::string line = "  ";
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(width[c] - row[c].size() + 2, ' ');
    }
    out += line + "\n";
  }
}

// The merged files as the summary lists them, with what opens each.
constexpr const char* kMergedFiles[][2] = {
    {"trace.perfetto", "one timeline, a process per rank, by node then rank: ui.perfetto.dev"},
    {"profile.pb.gz",
     "pprof of every rank, labelled node, rank, local_rank, pid: go tool pprof "
     "(-tagfocus=node=NAME), Grafana Pyroscope, speedscope"},
    {"flamegraph.svg", "every rank's stacks under its node and rank, with search: a web browser"},
    {"folded.txt", "the same stacks folded: flamegraph.pl, speedscope"},
    {"ranks.csv", "a row per rank: samples, hottest function, slowest call (RFC 4180)"},
};

void write_lists(const Job& job, std::string& out) {
  std::string failures;
  for (const JobNode& n : job.manifest.nodes)
    if (!n.error.empty()) {  // whole: it says what to do
      std::string why = n.error;
      for (char& c : why)
        if (c == '\n' || c == '\r' || c == '\t') c = ' ';
      failures += "  " + n.name + ": " + why + "\n";
    }
  std::string ended;
  for (size_t i = 0; i < job.rows.size(); ++i) {
    const MergedRank& r = job.rows[i];
    const std::string who = merge::rank_title(*job.inputs[i].rank);
    if (r.result != "attached" && !r.result.empty()) failures += "  " + who + ": " + r.result + "\n";
    if (!r.end.empty()) ended += "  " + who + ": " + r.end + "\n";
  }
  if (!failures.empty()) out += "\nFailures:\n" + failures;
  if (!ended.empty()) out += "\nEnded while attached:\n" + ended;
  if (!job.left_out.empty()) {
    out += "\nLeft out:\n";
    for (const std::string& l : job.left_out) out += "  " + l + "\n";
  }
  // The other warnings: the left-out ranks' are above.
  const std::set<std::string> above(job.left_out.begin(), job.left_out.end());
  std::set<std::string> seen;
  std::string warnings;
  for (const auto& w : job.warnings)
    if (!above.count(w) && seen.insert(w).second) warnings += "  " + w + "\n";
  if (!warnings.empty()) out += "\nWarnings:\n" + warnings;
}

std::string summary_text(const Job& job) {
  const JobManifest& m = job.manifest;
  std::set<std::string> nodes;
  for (const JobNode& n : m.nodes) nodes.insert(n.name);
  for (const JobRank& r : m.ranks) nodes.insert(r.node);
  std::string out = "Remora profile of " + job_title(m) + ": " + std::to_string(m.ranks.size()) +
                    (m.ranks.size() == 1 ? " rank on " : " ranks on ") + std::to_string(nodes.size()) +
                    (nodes.size() == 1 ? " node" : " nodes");
  char buf[96];
  if (m.window && m.window->end_mono_ns > m.window->start_mono_ns) {
    std::snprintf(buf, sizeof buf, ", window %.1f s",
                  static_cast<double>(m.window->end_mono_ns - m.window->start_mono_ns) / 1e9);
    out += buf;
  } else if (job.profile_span_ns > 0) {
    std::snprintf(buf, sizeof buf, ", the sessions span %.1f s",
                  static_cast<double>(job.profile_span_ns) / 1e9);
    out += buf;
  }
  out += "\n  " + describe_alignment(m) + "\n";
  size_t merged = 0;
  for (const MergedRank& r : job.rows) merged += r.in_trace || r.in_profile;
  if (merged < job.rows.size())
    out += "  merged: " + std::to_string(merged) + " of " + std::to_string(job.rows.size()) + " ranks\n";
  out += "  output: " + job.dir + "\n";
  std::set<std::string> written;
  for (const std::string& f : job.files) written.insert(f.substr(f.rfind('/') + 1));
  for (const auto& [file, what] : kMergedFiles)
    if (written.count(file)) {
      std::snprintf(buf, sizeof buf, "    %-15s ", file);
      out += buf + std::string(what) + "\n";
    }
  std::snprintf(buf, sizeof buf, "    %-15s ", "NODE/*/");
  out += buf + std::string("each rank's own outputs; its summary.txt for its threads and calls\n\n");
  write_table(job, out);
  write_lists(job, out);
  return valid_utf8(out);  // names are any bytes; the CLI prints this
}

// Why no rank merged, one rank after another (the first kMaxListed).
std::string nothing_merged(const Job& job) {
  std::string why;
  for (size_t i = 0; i < job.rows.size() && i < kMaxListed; ++i)
    why += (why.empty() ? "" : "; ") + merge::rank_title(*job.inputs[i].rank) + ": " + job.rows[i].problem;
  if (job.rows.size() > kMaxListed) why += "; and " + std::to_string(job.rows.size() - kMaxListed) + " more";
  if (job.rows.empty()) why = "job.json lists no rank";
  return "no rank of " + job_title(job.manifest) + " left outputs that merge (" + why + "): look in " +
         job.dir + "/job.json for each rank's result and in each rank's directory for what came back";
}

}  // namespace

Result<MergeResult> merge_job(const std::string& job_dir) {
  Job job;
  job.dir = job_dir;
  while (job.dir.size() > 1 && job.dir.back() == '/') job.dir.pop_back();
  job.manifest = REMORA_TRY(read_job_manifest(job.dir + "/" + kJobManifestFile));
  order_ranks(job);
  REMORA_TRY(merge_traces(job));
  REMORA_TRY(merge_profiles(job));
  bool any = false;
  for (MergedRank& row : job.rows) {
    any = any || row.in_trace || row.in_profile;
    if (has_outputs(job, row)) read_slowest_call(job, row);
  }
  if (!any) return Error(Errc::kParse, nothing_merged(job));
  REMORA_TRY(write_output(job, kRanksFile, [&](FILE* f) { return write_ranks_csv(job, f); }));
  const std::string summary = summary_text(job);
  REMORA_TRY(write_output(job, "summary.txt", [&](FILE* f) {
    return std::fwrite(summary.data(), 1, summary.size(), f) == summary.size();
  }));
  MergeResult result;
  result.dir = job.dir;
  result.files.push_back(job.files.back());  // summary.txt first
  result.files.insert(result.files.end(), job.files.begin(), job.files.end() - 1);
  result.warnings = std::move(job.warnings);
  result.ranks = std::move(job.rows);
  return result;
}

}  // namespace remora::profile
