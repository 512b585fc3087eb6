#include "profile/report.h"

#include <cstdio>
#include <map>

#include "base/strings.h"
#include "profile/collect.h"
#include "profile/names.h"
#include "profile/records.h"
#include "profile/session_files.h"
#include "profile/symbolize.h"
#include "profile/writers.h"

namespace remora::profile {
namespace {

// The threads of a process in a pid namespace of its own are recorded by
// the ids of that namespace. The collection kept each live thread's host id
// in DIR/host-tids ("NS HOST" lines); the records are named by host ids,
// like the pid. Threads that had ended by then keep their namespace's id (a
// warning says how many).
void name_threads_by_host_ids(const std::string& dir, RawProfile* raw, std::vector<std::string>* warnings) {
  std::map<int32_t, int32_t> map;
  if (auto text = read_session_file(dir + "/host-tids", 1u << 20))
    for (auto line : split_fields(*text, "\n")) {
      auto words = split_fields(line);
      auto ns = words.size() == 2 ? parse_i64(words[0]) : std::nullopt;
      auto host = words.size() == 2 ? parse_i64(words[1]) : std::nullopt;
      if (ns && host) map[static_cast<int32_t>(*ns)] = static_cast<int32_t>(*host);
    }
  if (map.empty()) return;
  auto host = [&](int32_t tid) {
    auto it = map.find(tid);
    return it == map.end() ? tid : it->second;
  };
  size_t unnamed = 0;
  std::map<int32_t, std::string> threads;
  for (auto& [tid, name] : raw->threads) {
    unnamed += map.count(tid) == 0;
    threads[host(tid)] = name;
  }
  raw->threads = std::move(threads);
  std::map<std::pair<int32_t, uint32_t>, uint64_t> weights;
  for (const auto& [key, n] : raw->stack_weights) weights[{host(key.first), key.second}] += n;
  raw->stack_weights = std::move(weights);
  for (auto& x : raw->samples) x.tid = host(x.tid);
  for (auto& c : raw->calls) c.tid = host(c.tid);
  for (auto& c : raw->slowest_calls) c.tid = host(c.tid);
  for (auto& c : raw->counters)
    if (c.tid != 0) c.tid = host(c.tid);
  raw->host_tids = true;
  if (unnamed > 0)
    warnings->push_back(
        std::to_string(unnamed) +
        " threads had ended before remora could read their host ids: they keep the ids of the "
        "process's own pid namespace");
}

using Writer = bool (*)(const Profile&, FILE*);
struct Output {
  const char* name;
  Writer write;
};

// After summary.txt, which write_summary writes (it names the directory).
const Output kOutputs[] = {
    {"trace.perfetto", write_perfetto},       {"profile.pb.gz", write_pprof},
    {"flamegraph.svg", write_flamegraph_svg}, {"folded.txt", write_folded},
    {"stats.csv", write_stats_csv},           {"trace.json", write_trace_json},
};

}  // namespace

const std::vector<std::string>& output_files() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v{"summary.txt"};
    for (const auto& o : kOutputs) v.emplace_back(o.name);
    return v;
  }();
  return names;
}

Result<RenderResult> render_session(const std::string& dir, const RenderOptions& options) {
  auto raw = read_raw_records(dir + "/" + kRawRecordsFile);
  if (!raw) return raw.error();
  // A session without names (an older remora's): named now from this
  // machine's files, and recorded, so that later renders agree with this one.
  CollectOptions offline;
  offline.live = false;
  offline.debug_dirs = options.debug_dirs;
  if (auto c = collect_session(dir, offline); !c) return c.error();
  auto text = read_session_file(dir + "/" + kNamesFile, size_t{1} << 31);
  if (!text)
    return Error(Errc::kIo,
                 "cannot read " + dir + "/" + kNamesFile + ": run `remora report " + dir + "` again");
  auto table = names_from_json(*text);
  if (!table) return table.error();
  if (table->pid != 0) raw->pid = table->pid;
  if (raw->realtime_offset_ns == 0) raw->realtime_offset_ns = table->realtime_offset_ns;
  RenderResult result;
  result.dir = dir;
  SymbolSource host;
  host.ns_pid = raw->ns_pid;
  host.maps = raw->maps;
  host.modules = raw->modules;
  host.tool_path = raw->tool_path;
  host.debug_dirs = debug_dirs_with_env(options.debug_dirs);
  result.improved_objects = improve_names(&*table, std::move(host));

  std::vector<std::string> notes = table->notes;
  if (raw->ns_pid != 0 && raw->ns_pid != raw->pid) name_threads_by_host_ids(dir, &*raw, &notes);
  RecordedNames names(*table);
  Profile p = symbolize(std::move(*raw), names);
  for (auto& n : notes) p.warnings.push_back(std::move(n));
  result.warnings = p.warnings;

  std::string error;
  if (!write_atomically(
          dir + "/summary.txt", [&](FILE* f) { return write_summary(p, dir, f); }, &error))
    return Error(Errc::kIo, error + ": make the directory writable, then run `remora report " + dir + "`");
  result.files.push_back(dir + "/summary.txt");
  for (const auto& o : kOutputs) {
    const std::string path = dir + "/" + o.name;
    if (!write_atomically(
            path, [&](FILE* f) { return o.write(p, f); }, &error))
      return Error(Errc::kIo, error + ": make the directory writable, then run `remora report " + dir + "`");
    result.files.push_back(path);
  }
  return result;
}

}  // namespace remora::profile
