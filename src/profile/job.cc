// job.json (job.h): read and written with nlohmann-json, without its
// exceptions (the library code throws none): the text is parsed with
// allow_exceptions = false and every field's type is checked before it is
// read, so that a wrong type is a message naming the field, not a throw.
#include "profile/job.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/unique_fd.h"
#include "profile/json_fields.h"

namespace remora::profile {
namespace {

using internal::Fields;
using internal::read_list;
using nlohmann::json;

constexpr size_t kMaxManifestBytes = 64u << 20;  // a job of a million ranks is some 300 MB: refuse madness

ClockSample read_sample(const json& j, const std::string& where, std::string* error) {
  ClockSample s;
  Fields f(j, where, error);
  f.u64("node_mono_ns", &s.node_mono_ns);
  f.i64("offset_ns", &s.offset_ns);
  f.u64("uncertainty_ns", &s.uncertainty_ns);
  f.str("when", &s.when);
  return s;
}

JobNode read_node(const json& j, const std::string& where, std::string* error) {
  JobNode n;
  Fields f(j, where, error);
  f.str("name", &n.name);
  f.str("transport", &n.transport);
  f.str("error", &n.error);
  if (const json* clock = f.array("clock"))
    for (size_t i = 0; i < clock->size(); ++i) {
      const std::string at = f.at("clock") + "[" + std::to_string(i) + "]";
      if (!(*clock)[i].is_object()) {
        if (error->empty()) *error = at + " is not an object";
        continue;
      }
      n.clock.push_back(read_sample((*clock)[i], at, error));
    }
  return n;
}

JobRank read_rank(const json& j, const std::string& where, std::string* error) {
  JobRank r;
  Fields f(j, where, error);
  f.str("node", &r.node);
  f.i32("rank", &r.rank);
  f.i32("local_rank", &r.local_rank);
  f.i32("pid", &r.pid);
  f.str("comm", &r.comm);
  f.str("dir", &r.dir);
  f.str("result", &r.result);
  f.str("end", &r.end);
  f.str("detach", &r.detach);
  return r;
}

json sample_json(const ClockSample& s) {
  json j = {
      {"node_mono_ns", s.node_mono_ns}, {"offset_ns", s.offset_ns}, {"uncertainty_ns", s.uncertainty_ns}};
  if (!s.when.empty()) j["when"] = s.when;
  return j;
}

// "0.9 ms", "800 ns": an uncertainty as people read it.
std::string fmt_ns(uint64_t ns) {
  char buf[64];
  if (ns < 1000)
    std::snprintf(buf, sizeof buf, "%" PRIu64 " ns", ns);
  else if (ns < 100000)
    std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000)
    std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  return buf;
}

std::vector<ClockSample> sorted(std::vector<ClockSample> samples) {
  std::stable_sort(samples.begin(), samples.end(), [](const ClockSample& a, const ClockSample& b) {
    return a.node_mono_ns < b.node_mono_ns;
  });
  return samples;
}

// How fast the node's clock runs against the front's, in ns per s (ppb):
// the slope between its first and last sample; 0 with fewer than two.
double drift_ns_per_s(const std::vector<ClockSample>& samples) {
  if (samples.size() < 2) return 0;
  const std::vector<ClockSample> s = sorted(samples);
  const ClockSample &a = s.front(), &b = s.back();
  if (b.node_mono_ns == a.node_mono_ns) return 0;
  return (static_cast<double>(b.offset_ns) - static_cast<double>(a.offset_ns)) * 1e9 /
         static_cast<double>(b.node_mono_ns - a.node_mono_ns);
}

}  // namespace

const JobNode* JobManifest::node(std::string_view name) const {
  for (const JobNode& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

Result<JobManifest> parse_job_manifest(std::string_view text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Error(Errc::kParse,
                 what + " is not a JSON object: it is damaged, or not a job manifest of remora");
  JobManifest m;
  std::string error;
  Fields f(j, "", &error);
  m.format = 0;
  f.i32("format", &m.format);
  if (m.format == 0) m.format = kJobManifestFormat;  // optional: format 1 did not need it
  if (m.format > kJobManifestFormat)
    return Error(Errc::kNotSupported, what + " is of format " + std::to_string(m.format) +
                                          ", newer than this remora reads (" +
                                          std::to_string(kJobManifestFormat) +
                                          "): merge it with the remora that wrote it, or a newer one");
  f.str("job", &m.job);
  f.str("step", &m.step);
  f.str("front_host", &m.front_host);
  if (const json* w = f.object("window")) {
    JobWindow window;
    Fields wf(*w, "window", &error);
    wf.u64("start_mono_ns", &window.start_mono_ns);
    wf.u64("end_mono_ns", &window.end_mono_ns);
    if (window.end_mono_ns > window.start_mono_ns) m.window = window;  // else unknown
  }
  m.nodes = read_list<JobNode>(f, "nodes", read_node, &error);
  m.ranks = read_list<JobRank>(f, "ranks", read_rank, &error);
  if (!error.empty())
    return Error(Errc::kParse,
                 what + ": " + error + ": the file is damaged, or not a job manifest of remora");
  return m;
}

std::string job_manifest_json(const JobManifest& m) {
  json j = {{"format", m.format}, {"job", m.job}, {"step", m.step}, {"front_host", m.front_host}};
  if (m.window)
    j["window"] = {{"start_mono_ns", m.window->start_mono_ns}, {"end_mono_ns", m.window->end_mono_ns}};
  json nodes = json::array(), ranks = json::array();
  for (const JobNode& n : m.nodes) {
    json clock = json::array();
    for (const ClockSample& s : n.clock) clock.push_back(sample_json(s));
    nodes.push_back({{"name", n.name}, {"transport", n.transport}, {"error", n.error}, {"clock", clock}});
  }
  for (const JobRank& r : m.ranks)
    ranks.push_back({{"node", r.node},
                     {"rank", r.rank},
                     {"local_rank", r.local_rank},
                     {"pid", r.pid},
                     {"comm", r.comm},
                     {"dir", r.dir},
                     {"result", r.result},
                     {"end", r.end},
                     {"detach", r.detach}});
  j["nodes"] = std::move(nodes);
  j["ranks"] = std::move(ranks);
  // Names are any bytes (a comm, an error message): invalid UTF-8 becomes
  // U+FFFD rather than an abort.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<JobManifest> read_job_manifest(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    return Error(Errc::kIo,
                 "cannot open " + path + ": " + std::strerror(err) +
                     (err == ENOENT ? ": name the job's directory, the one that holds job.json" : ""),
                 err);
  }
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("read " + path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxManifestBytes)
      return Error(Errc::kParse, path + " is larger than " + std::to_string(kMaxManifestBytes >> 20) +
                                     " MiB: it is not a job manifest of remora");
  }
  return parse_job_manifest(text, path);
}

Result<void> write_job_manifest(const std::string& path, const JobManifest& m) {
  const std::string text = job_manifest_json(m);
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return Error::from_errno("create " + tmp + " (make the job's directory writable)");
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Error e = Error::from_errno("write " + tmp);
      ::unlink(tmp.c_str());
      return e;
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd.release()) != 0) {
    Error e = Error::from_errno("write " + tmp);
    ::unlink(tmp.c_str());
    return e;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = Error::from_errno("rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return e;
  }
  return {};
}

int64_t offset_at(const std::vector<ClockSample>& samples, uint64_t node_ns) {
  if (samples.empty()) return 0;
  const std::vector<ClockSample> s = sorted(samples);
  if (node_ns <= s.front().node_mono_ns) return s.front().offset_ns;
  if (node_ns >= s.back().node_mono_ns) return s.back().offset_ns;
  // The two samples around node_ns: a before b, a.node_mono_ns < node_ns < b.node_mono_ns.
  size_t i = 1;
  while (s[i].node_mono_ns <= node_ns) ++i;
  const ClockSample &a = s[i - 1], &b = s[i];
  // 128 bits: offsets and spans of nanoseconds multiply past 2^63.
  const __int128 num =
      (static_cast<__int128>(b.offset_ns) - a.offset_ns) * static_cast<__int128>(node_ns - a.node_mono_ns);
  const __int128 den = static_cast<__int128>(b.node_mono_ns - a.node_mono_ns);
  const __int128 q = (num >= 0 ? num + den / 2 : num - den / 2) / den;  // to the nearest, halves away from 0
  return static_cast<int64_t>(a.offset_ns + q);
}

uint64_t front_time(const std::vector<ClockSample>& samples, uint64_t node_ns) {
  const __int128 t = static_cast<__int128>(node_ns) - offset_at(samples, node_ns);
  if (t < 0) return 0;
  if (t > static_cast<__int128>(std::numeric_limits<uint64_t>::max()))
    return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(t);
}

std::string describe_alignment(const JobManifest& m) {
  size_t aligned = 0, min_samples = SIZE_MAX, max_samples = 0;
  uint64_t uncertainty = 0;
  double drift = 0;
  bool drift_known = false;
  std::vector<std::string> front_nodes, unaligned;
  for (const JobNode& n : m.nodes) {
    if (n.clock.empty()) {
      (n.name == m.front_host ? front_nodes : unaligned).push_back(n.name);
      continue;
    }
    ++aligned;
    min_samples = std::min(min_samples, n.clock.size());
    max_samples = std::max(max_samples, n.clock.size());
    for (const ClockSample& s : n.clock) uncertainty = std::max(uncertainty, s.uncertainty_ns);
    if (n.clock.size() >= 2) {
      drift = std::max(drift, std::fabs(drift_ns_per_s(n.clock)));
      drift_known = true;
    }
  }
  std::string out;
  if (aligned > 0) {
    out = "clocks aligned within ±" + fmt_ns(uncertainty) + " (" + std::to_string(min_samples);
    if (max_samples != min_samples) out += "-" + std::to_string(max_samples);
    out += max_samples == 1 ? " sample per node" : " samples per node";
    if (drift_known) {
      char buf[64];
      std::snprintf(buf, sizeof buf, ", drift up to %.1f us/s", drift / 1e3);
      out += buf;
    }
    out += ")";
  }
  for (const std::string& n : front_nodes) out += (out.empty() ? "" : "; ") + n + ": the front's own clock";
  for (const std::string& n : unaligned)
    out += (out.empty() ? "" : "; ") + n + ": not aligned (no clock sample; its times are its own clock's)";
  return out.empty() ? "no node: nothing to align" : out;
}

}  // namespace remora::profile
