// The merge of a Slurm job's ranks (src/profile/merge.h) and its manifest
// (job.h), from hand-made profiles: three ranks on two nodes, two of them
// pid 4242 on different nodes, each with a hot function of its own, are
// rendered by the ordinary writers into a job directory laid out as the
// front lays it out; node n2's clock runs 5 s ahead of the front's and
// drifts. The merged files are decoded (libprotobuf, zlib, a CSV reader
// here, and check_merged.py with python3's protobuf) and compared with what
// each rank held. No process is started but python3; nothing is timed.
#include "profile/merge.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "profile/job.h"
#include "profile/proto/perfetto_trace.pb.h"
#include "profile/proto/pprof_profile.pb.h"
#include "profile/writers.h"

namespace remora::profile {
namespace {

namespace pt = remora::perfetto_trace;
namespace pp = remora::pprof_profile;

constexpr uint64_t kS = 1000000000;  // one second in ns

// ---- helpers ----

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/remora-merge-XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    if (!path.empty()) std::filesystem::remove_all(path);
  }
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string gunzip(const std::string& data) {
  z_stream zs{};
  EXPECT_EQ(inflateInit2(&zs, 15 + 32), Z_OK);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  std::string out;
  char buf[1 << 16];
  int rc;
  do {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buf, sizeof buf - zs.avail_out);
  } while (rc == Z_OK);
  inflateEnd(&zs);
  EXPECT_EQ(rc, Z_STREAM_END);
  return out;
}

// RFC 4180, as a reader independent of the merge's own would parse it.
std::vector<std::vector<std::string>> read_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row(1);
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"')
        row.back() += '"', ++i;
      else if (c == '"')
        quoted = false;
      else
        row.back() += c;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      row.emplace_back();
    } else if (c == '\n') {
      rows.push_back(row);
      row.assign(1, "");
    } else {
      row.back() += c;
    }
  }
  return rows;
}

Frame frame(const std::string& function, const std::string& file, uint32_t line, uint64_t address,
            bool inlined = false) {
  Frame f;
  f.function = function, f.module = "/usr/bin/mpi_ranks", f.address = address,
  f.module_offset = address - 0x400000;
  f.file = file, f.line = line, f.inlined = inlined;
  return f;
}

// One rank's session: `hot` takes most samples, the main thread (tid ==
// pid) and one worker sample, and one traced call of `slow_ns`.
struct RankSpec {
  std::string node;
  int rank, local_rank, pid;
  std::string hot;
  uint64_t start_ns;  // on its node's clock
  uint64_t hot_weight, other_weight;
  uint64_t slow_ns;
};

Profile make_profile(const RankSpec& r) {
  Profile p;
  p.pid = p.ns_pid = r.pid;
  p.comm = "mpi_ranks";
  p.session = 1;
  p.start_ns = r.start_ns, p.end_ns = r.start_ns + 5 * kS;
  p.realtime_offset_ns = 1700000000 * kS;  // fixed: pprof's time_nanos is then deterministic
  p.hz = 100, p.signal = 27;
  p.sampling = p.tracing = true;
  p.threads = {{r.pid, "main"}, {r.pid + 1, "worker"}};
  p.fn_names = {"MPI_Barrier", "MPI_Send"};
  p.frames = {frame("main", "app.c", 10, 0x401000), frame(r.hot, "hot.c", 20, 0x401100),
              frame("exchange", "net.c", 30, 0x401200), frame("pack<int>", "pack.h", 5, 0x401200, true)};
  p.stacks = {{0, 1}, {0, 2, 3}};
  p.stack_weights = {{{r.pid, 0}, r.hot_weight}, {{r.pid + 1, 1}, r.other_weight}};
  for (uint64_t i = 0; i < 4; ++i)
    p.samples.push_back(
        {i % 2 ? r.pid + 1 : r.pid, 1, static_cast<uint32_t>(i % 2), r.start_ns + (i + 1) * kS});
  p.calls = {{r.pid, 0, r.start_ns + kS / 2, r.slow_ns}, {r.pid + 1, 1, r.start_ns + kS, 1000}};
  p.func_stats = {{"MPI_Barrier", 1, r.slow_ns, r.slow_ns}, {"MPI_Send", 1, 1000, 1000}};
  p.slowest_calls = {p.calls[0], p.calls[1]};
  p.counters = {{CounterKind::kRssBytes, 0, r.start_ns + kS, 1 << 20}};
  p.samples_total = r.hot_weight + r.other_weight;
  return p;
}

bool write_file(const std::string& path, const std::function<bool(FILE*)>& fn) {
  FILE* f = fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  bool ok = fn(f);
  return fclose(f) == 0 && ok;
}

// The session directory of a rank, rendered as its node renders it.
void render_rank(const Profile& p, const std::string& dir) {
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_file(dir + "/trace.perfetto", [&](FILE* f) { return write_perfetto(p, f); }));
  ASSERT_TRUE(
      write_file(dir + "/profile.pb.gz", [&](FILE* f) { return write_pprof(p, f, p.realtime_offset_ns); }));
  ASSERT_TRUE(write_file(dir + "/folded.txt", [&](FILE* f) { return write_folded(p, f); }));
  ASSERT_TRUE(write_file(dir + "/flamegraph.svg", [&](FILE* f) { return write_flamegraph_svg(p, f); }));
  ASSERT_TRUE(write_file(dir + "/stats.csv", [&](FILE* f) { return write_stats_csv(p, f); }));
  ASSERT_TRUE(write_file(dir + "/trace.json", [&](FILE* f) { return write_trace_json(p, f); }));
  ASSERT_TRUE(write_file(dir + "/summary.txt", [&](FILE* f) { return write_summary(p, dir, f); }));
}

// The job of the tests: n1 ranks 0 and 1, n2 rank 2 (pid 4242 again), n2
// rank 3 whose directory never came back, n2 rank 4 whose attach failed.
const std::vector<RankSpec> kRanks = {
    {"n1", 0, 0, 4242, "solve_n1_r0", 100 * kS, 30, 10, 7000000},
    {"n1", 1, 1, 4243, "solve_n1_r1", 100 * kS + 7, 20, 5, 9000},
    {"n2", 2, 0, 4242, "solve_n2_r2", 1002 * kS, 40, 2, 0},
};

// n1: one sample, the front's clock minus 42 ns. n2: 5 s ahead at node
// time 1000 s, 10 us more at 1010 s (a drift of 1 us/s).
std::vector<ClockSample> n1_clock() { return {{50 * kS, -42, 800, "attach"}}; }
std::vector<ClockSample> n2_clock() {
  return {{1010 * kS, static_cast<int64_t>(5 * kS + 10000), 900, "detach"},
          {1000 * kS, static_cast<int64_t>(5 * kS), 700, "attach"}};
}

std::string rank_dir(const RankSpec& r) { return r.node + "/mpi_ranks-" + std::to_string(r.pid) + "-s1"; }

JobManifest make_manifest() {
  JobManifest m;
  m.job = "1234";
  m.front_host = "login1";
  m.window = JobWindow{95 * kS, 100 * kS};
  m.nodes = {{"n1", "stream", "", n1_clock()}, {"n2", "shared", "", n2_clock()}};
  for (const RankSpec& r : kRanks)
    m.ranks.push_back(
        {r.node, r.rank, r.local_rank, r.pid, "mpi_ranks", rank_dir(r), "attached", "", "detached"});
  m.ranks.push_back(
      {"n2", 3, 1, 4300, "mpi_ranks", "n2/mpi_ranks-4300-s1", "attached", "exited with status 0", ""});
  m.ranks.push_back({"n2", 4, 2, 4301, "mpi_ranks", "", "failed: ptrace: EPERM", "", ""});
  return m;
}

// A job directory with every rank rendered and job.json written.
struct JobFixture {
  TempDir tmp;
  JobManifest manifest = make_manifest();
  std::vector<Profile> profiles;
  JobFixture() {
    for (const RankSpec& r : kRanks) {
      profiles.push_back(make_profile(r));
      render_rank(profiles.back(), tmp.path + "/" + rank_dir(r));
    }
    EXPECT_TRUE(write_job_manifest(tmp.path + "/job.json", manifest));
  }
  std::string path(const std::string& file) const { return tmp.path + "/" + file; }
};

// ---- the merged trace, decoded ----

struct DecodedTrace {
  struct Process {
    uint64_t uuid;
    int32_t pid;
    std::string name;
    int32_t order;
    std::vector<std::string> labels;
  };
  std::vector<Process> processes;
  std::vector<pt::TracePacket> packets;
  std::vector<uint64_t> descriptor_uuids;
  std::map<int32_t, std::set<uint32_t>> sequences_of_pid;   // a process's pid -> the sequences of its packets
  std::map<int32_t, std::multiset<uint64_t>> sample_times;  // pid -> its PerfSamples' timestamps
  std::map<int32_t, std::set<std::string>> leaf_functions;  // pid -> its samples' leaf functions
  std::map<int32_t, std::vector<std::string>> thread_names;  // pid -> its threads
  bool callstacks_resolve = true;
};

DecodedTrace decode_trace(const std::string& bytes) {
  DecodedTrace t;
  pt::Trace trace;
  EXPECT_TRUE(trace.ParseFromString(bytes));
  // Interned data, per sequence: function names, frames, callstacks.
  std::map<uint32_t, std::map<uint64_t, std::string>> names;
  std::map<uint32_t, std::map<uint64_t, uint64_t>> frame_names;
  std::map<uint32_t, std::map<uint64_t, std::vector<uint64_t>>> callstacks;
  for (const pt::TracePacket& p : trace.packet()) {
    t.packets.push_back(p);
    const uint32_t seq = p.trusted_packet_sequence_id();
    if (p.has_interned_data()) {
      for (const auto& s : p.interned_data().function_names()) names[seq][s.iid()] = s.str();
      for (const auto& f : p.interned_data().frames()) frame_names[seq][f.iid()] = f.function_name_id();
      for (const auto& c : p.interned_data().callstacks())
        callstacks[seq][c.iid()] = {c.frame_ids().begin(), c.frame_ids().end()};
    }
    if (p.has_track_descriptor()) {
      const auto& d = p.track_descriptor();
      if (d.uuid() != 0) t.descriptor_uuids.push_back(d.uuid());
      if (d.has_process()) {
        t.processes.push_back({d.uuid(),
                               d.process().pid(),
                               d.process().process_name(),
                               d.sibling_order_rank(),
                               {d.process().process_labels().begin(), d.process().process_labels().end()}});
        t.sequences_of_pid[d.process().pid()].insert(seq);
      }
      if (d.has_thread()) {
        t.sequences_of_pid[d.thread().pid()].insert(seq);
        t.thread_names[d.thread().pid()].push_back(d.thread().thread_name());
      }
    }
    if (p.has_perf_sample()) {
      const auto pid = static_cast<int32_t>(p.perf_sample().pid());
      t.sequences_of_pid[pid].insert(seq);
      t.sample_times[pid].insert(p.timestamp());
      auto cs = callstacks[seq].find(p.perf_sample().callstack_iid());
      if (cs == callstacks[seq].end() || cs->second.empty()) {
        t.callstacks_resolve = false;
        continue;
      }
      auto fn = frame_names[seq].find(cs->second.back());  // root first: the leaf is last
      if (fn == frame_names[seq].end() || !names[seq].count(fn->second)) {
        t.callstacks_resolve = false;
        continue;
      }
      t.leaf_functions[pid].insert(names[seq][fn->second]);
    }
  }
  return t;
}

std::string python_with_protobuf() {
  for (const char* py : {REMORA_PROTO_PYTHON, "/usr/bin/python3", "python3"}) {
    std::string cmd = std::string(py) + " -c 'import google.protobuf' >/dev/null 2>&1";
    if (system(cmd.c_str()) == 0) return py;
  }
  return "";
}

// ---- tests ----

TEST(OffsetAt, FromTheSamples) {
  const std::vector<ClockSample> none, one = {{1000, -42, 1, ""}};
  const std::vector<ClockSample> two = {{3000, 300, 1, ""}, {1000, 100, 1, ""}};  // unsorted on purpose
  const std::vector<ClockSample> negative = {{0, -1000, 1, ""}, {1000, -2000, 1, ""}};
  const std::vector<ClockSample> three = {{1000, 0, 1, ""}, {2000, 1000, 1, ""}, {3000, 1000, 1, ""}};
  const struct {
    const std::vector<ClockSample>* samples;
    uint64_t node_ns;
    int64_t offset;
  } cases[] = {
      {&none, 0, 0},           {&none, 123456, 0},    {&one, 0, -42},           {&one, 1000, -42},
      {&one, 1 << 30, -42},    {&two, 0, 100},        {&two, 1000, 100},        {&two, 1500, 150},
      {&two, 2000, 200},       {&two, 2990, 299},     {&two, 3000, 300},        {&two, 99999, 300},
      {&negative, 500, -1500}, {&negative, 1, -1001}, {&negative, 5000, -2000}, {&three, 1500, 500},
      {&three, 2500, 1000},    {&three, 500, 0},
  };
  for (const auto& c : cases) EXPECT_EQ(offset_at(*c.samples, c.node_ns), c.offset) << "at " << c.node_ns;
  // Rounded to the nearest nanosecond, halves away from zero.
  const std::vector<ClockSample> odd = {{0, 0, 1, ""}, {3, 1, 1, ""}},
                                 odd_neg = {{0, 0, 1, ""}, {2, -1, 1, ""}};
  EXPECT_EQ(offset_at(odd, 1), 0);
  EXPECT_EQ(offset_at(odd, 2), 1);
  EXPECT_EQ(offset_at(odd_neg, 1), -1);
  // A drift over a long span does not overflow: 10^9 ns of offset over 10^10 s.
  const std::vector<ClockSample> wide = {{0, 0, 1, ""}, {10000000000 * kS, 1000000000, 1, ""}};
  EXPECT_EQ(offset_at(wide, 5000000000 * kS), 500000000);
  EXPECT_EQ(front_time(one, 10), 52u);
  EXPECT_EQ(front_time({{0, 100, 1, ""}}, 10), 0u);  // clamped, not wrapped
}

TEST(JobManifest, RoundTrip) {
  TempDir tmp;
  const JobManifest m = make_manifest();
  ASSERT_TRUE(write_job_manifest(tmp.path + "/job.json", m));
  EXPECT_FALSE(std::filesystem::exists(tmp.path + "/job.json.tmp"));
  auto back = read_job_manifest(tmp.path + "/job.json");
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(*back, m);
}

TEST(JobManifest, ToleratesMissingFieldsAndUnknownKeys) {
  auto m = parse_job_manifest(R"({"job": "77", "later": {"x": 1},
      "nodes": [{"name": "a"}], "ranks": [{"node": "a", "pid": 9, "extra": true}]})");
  ASSERT_TRUE(m) << m.error().to_string();
  EXPECT_EQ(m->format, 1);
  EXPECT_EQ(m->job, "77");
  EXPECT_FALSE(m->window);
  ASSERT_EQ(m->nodes.size(), 1u);
  EXPECT_TRUE(m->nodes[0].clock.empty());
  ASSERT_EQ(m->ranks.size(), 1u);
  EXPECT_EQ(m->ranks[0].rank, -1);
  EXPECT_EQ(m->ranks[0].pid, 9);
  EXPECT_EQ(m->ranks[0].dir, "");
}

TEST(JobManifest, RefusesWhatItCannotRead) {
  auto bad_type = parse_job_manifest(R"({"job": "1", "ranks": [{"node": "a"}, {"pid": "4242"}]})");
  ASSERT_FALSE(bad_type);
  EXPECT_EQ(bad_type.error().code(), Errc::kParse);
  EXPECT_NE(bad_type.error().message().find("ranks[1].pid is not a 32-bit integer"), std::string::npos)
      << bad_type.error().message();
  auto bad_clock = parse_job_manifest(R"({"nodes": [{"name": "a", "clock": [{"offset_ns": 1.5}]}]})");
  ASSERT_FALSE(bad_clock);
  EXPECT_NE(bad_clock.error().message().find("nodes[0].clock[0].offset_ns"), std::string::npos)
      << bad_clock.error().message();
  auto newer = parse_job_manifest(R"({"format": 2, "job": "1"})");
  ASSERT_FALSE(newer);
  EXPECT_EQ(newer.error().code(), Errc::kNotSupported);
  EXPECT_FALSE(parse_job_manifest("[1, 2]"));
  EXPECT_FALSE(parse_job_manifest("{\"job\": "));
  auto missing = read_job_manifest("/nonexistent/job.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code(), Errc::kIo);
}

TEST(JobManifest, DescribesTheAlignment) {
  JobManifest m = make_manifest();
  EXPECT_EQ(describe_alignment(m),
            "clocks aligned within ±900 ns (1-2 samples per node, drift up to 1.0 us/s)");
  m.nodes.push_back({"n3", "stream", "srun: node n3 is down", {}});
  m.nodes.push_back({"login1", "shared", "", {}});
  EXPECT_EQ(
      describe_alignment(m),
      "clocks aligned within ±900 ns (1-2 samples per node, drift up to 1.0 us/s); login1: the front's own "
      "clock; n3: not aligned (no clock sample; its times are its own clock's)");
  m.nodes = {{"n2", "stream", "", {{0, 0, 2000000, ""}, {kS, 3000, 900000, ""}}}};
  EXPECT_EQ(describe_alignment(m),
            "clocks aligned within ±2.0 ms (2 samples per node, drift up to 3.0 us/s)");
}

TEST(MergeJob, OneTraceWithAProcessPerRank) {
  JobFixture job;
  auto r = merge_job(job.tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  const DecodedTrace t = decode_trace(slurp(job.path("trace.perfetto")));

  // One process per merged rank, named for it, in node then rank order.
  ASSERT_EQ(t.processes.size(), 3u);
  const char* names[] = {"rank 0 on n1: mpi_ranks (pid 4242)", "rank 1 on n1: mpi_ranks (pid 4243)",
                         "rank 2 on n2: mpi_ranks (pid 4242)"};
  std::set<int32_t> pids;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(t.processes[i].name, names[i]);
    EXPECT_EQ(t.processes[i].order, static_cast<int32_t>(i));
    EXPECT_EQ(t.processes[i].labels,
              (std::vector<std::string>{"node " + kRanks[i].node, "rank " + std::to_string(kRanks[i].rank)}));
    pids.insert(t.processes[i].pid);
  }
  EXPECT_EQ(pids.size(), 3u) << "equal pids of two nodes must not collide";
  EXPECT_EQ(t.processes[0].pid, 1000);
  EXPECT_EQ(t.processes[1].pid, 2000);
  EXPECT_EQ(t.processes[2].pid, 3000);
  EXPECT_EQ(t.thread_names.at(1000), (std::vector<std::string>{"main (tid 4242)", "worker (tid 4243)"}));

  // No two tracks share a uuid; no two ranks share a sequence.
  std::set<uint64_t> uuids(t.descriptor_uuids.begin(), t.descriptor_uuids.end());
  EXPECT_EQ(uuids.size(), t.descriptor_uuids.size());
  std::map<uint32_t, int32_t> owner;
  for (const auto& [pid, seqs] : t.sequences_of_pid)
    for (uint32_t s : seqs) {
      EXPECT_NE(s, 1u) << "sequence 1 is the merge's own";
      auto [it, added] = owner.emplace(s, pid);
      EXPECT_TRUE(added || it->second == pid)
          << "sequence " << s << " is shared by pids " << it->second << " and " << pid;
    }

  // One clock snapshot, first, and the root descriptor asking for explicit order.
  ASSERT_GE(t.packets.size(), 2u);
  EXPECT_TRUE(t.packets[0].has_clock_snapshot());
  EXPECT_EQ(t.packets[0].clock_snapshot().primary_trace_clock(), pt::BUILTIN_CLOCK_MONOTONIC);
  int snapshots = 0;
  for (const auto& p : t.packets) snapshots += p.has_clock_snapshot();
  EXPECT_EQ(snapshots, 1);
  EXPECT_EQ(t.packets[1].track_descriptor().uuid(), 0u);
  EXPECT_EQ(t.packets[1].track_descriptor().process_ordering(),
            pt::TrackDescriptor::PROCESS_ORDERING_EXPLICIT);
  // Each sequence's first packet clears its incremental state.
  std::set<uint32_t> seen;
  for (const auto& p : t.packets)
    if (seen.insert(p.trusted_packet_sequence_id()).second) {
      EXPECT_TRUE(p.sequence_flags() & pt::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED);
      EXPECT_TRUE(p.first_packet_on_sequence());
    }

  // Every callstack resolves, each rank's to its own hot function.
  EXPECT_TRUE(t.callstacks_resolve);
  for (size_t i = 0; i < 3; ++i) {
    const std::set<std::string>& leaves = t.leaf_functions.at(t.processes[i].pid);
    EXPECT_TRUE(leaves.count(kRanks[i].hot)) << names[i];
    for (size_t j = 0; j < 3; ++j) {
      if (j == i) continue;
      EXPECT_FALSE(leaves.count(kRanks[j].hot)) << names[i] << " has " << kRanks[j].hot;
    }
  }

  // Timestamps on the front's clock: n1 + 42 ns; n2 - (5 s + 1 us/s since 1000 s).
  for (size_t i = 0; i < 3; ++i) {
    std::multiset<uint64_t> expected;
    const auto clock = kRanks[i].node == "n1" ? n1_clock() : n2_clock();
    for (const SampleEvent& s : job.profiles[i].samples) expected.insert(front_time(clock, s.ts_ns));
    EXPECT_EQ(t.sample_times.at(t.processes[i].pid), expected) << names[i];
  }
  EXPECT_EQ(*t.sample_times.at(1000).begin(), 101 * kS + 42);
  // n2's first sample at node time 1003 s: offset 5 s + 3 us.
  EXPECT_EQ(*t.sample_times.at(3000).begin(), 1003 * kS - 5 * kS - 3000);
  EXPECT_EQ(t.packets[0].clock_snapshot().clocks(0).timestamp(), 95 * kS);  // the window's start
}

TEST(MergeJob, OnePprofWithEveryRanksSamples) {
  JobFixture job;
  auto r = merge_job(job.tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  pp::Profile p;
  ASSERT_TRUE(p.ParseFromString(gunzip(slurp(job.path("profile.pb.gz")))));
  auto s = [&](int64_t i) { return p.string_table(static_cast<int>(i)); };
  ASSERT_EQ(p.sample_type_size(), 2);
  EXPECT_EQ(s(p.sample_type(0).type()), "samples");
  std::map<std::pair<std::string, int64_t>, int64_t> per_rank;
  std::map<std::string, std::set<int64_t>> labels;
  for (const auto& sample : p.sample()) {
    std::string node;
    int64_t rank = -99;
    std::set<std::string> keys;
    for (const auto& l : sample.label()) {
      keys.insert(s(l.key()));
      if (s(l.key()) == "node") node = s(l.str());
      if (s(l.key()) == "rank") rank = l.num();
      if (s(l.key()) == "pid") labels["pid"].insert(l.num());
    }
    EXPECT_EQ(keys, (std::set<std::string>{"thread", "tid", "node", "rank", "local_rank", "pid"}));
    per_rank[{node, rank}] += sample.value(0);
  }
  for (const RankSpec& rank : kRanks)
    EXPECT_EQ((per_rank[{rank.node, rank.rank}]), static_cast<int64_t>(rank.hot_weight + rank.other_weight))
        << rank.node << " rank " << rank.rank;
  EXPECT_EQ(labels["pid"], (std::set<int64_t>{4242, 4243}));
  std::set<std::string> functions;
  for (const auto& f : p.function()) functions.insert(s(f.name()));
  for (const Profile& prof : job.profiles)
    for (const Frame& f : prof.frames) EXPECT_TRUE(functions.count(f.function)) << f.function;
  EXPECT_EQ(functions.size(), 6u) << "main, exchange and pack<int> are shared by the ranks";
  EXPECT_EQ(p.time_nanos(), static_cast<int64_t>(1700000000 * kS + 100 * kS));
  EXPECT_EQ(p.duration_nanos(), static_cast<int64_t>(1007 * kS - 100 * kS));
}

TEST(MergeJob, FoldedAndFlameGraphStartWithNodeAndRank) {
  JobFixture job;
  auto r = merge_job(job.tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  std::map<std::string, uint64_t> per_prefix;
  std::istringstream folded(slurp(job.path("folded.txt")));
  for (std::string line; std::getline(folded, line);) {
    size_t sep = line.find(';', line.find(';') + 1);
    ASSERT_NE(sep, std::string::npos) << line;
    per_prefix[line.substr(0, sep + 1)] += std::stoull(line.substr(line.rfind(' ') + 1));
  }
  std::map<std::string, uint64_t> expected;
  for (const RankSpec& rank : kRanks)
    expected[rank.node + ";rank " + std::to_string(rank.rank) + " (pid " + std::to_string(rank.pid) + ");"] =
        rank.hot_weight + rank.other_weight;
  EXPECT_EQ(per_prefix, expected);
  const std::string svg = slurp(job.path("flamegraph.svg"));
  EXPECT_NE(svg.find("Flame graph: Slurm job 1234 (every step): 107 samples"), std::string::npos);
  EXPECT_NE(svg.find("data-s=\"hot.c:20\""), std::string::npos) << "tooltips keep file:line";
  EXPECT_NE(svg.find("<title>rank 2 (pid 4242) (42 samples"), std::string::npos);
}

TEST(MergeJob, RanksCsvAndSummary) {
  JobFixture job;
  auto r = merge_job(job.tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  auto rows = read_csv(slurp(job.path("ranks.csv")));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"node", "rank", "local_rank", "pid", "comm", "result",
                                               "samples", "hottest_function", "hottest_samples",
                                               "slowest_call", "slowest_call_us", "dir", "end", "problem"}));
  for (size_t i = 0; i < 3; ++i) {
    const auto& row = rows[i + 1];
    ASSERT_EQ(row.size(), 14u);
    EXPECT_EQ(row[0], kRanks[i].node);
    EXPECT_EQ(row[1], std::to_string(kRanks[i].rank));
    EXPECT_EQ(row[6], std::to_string(kRanks[i].hot_weight + kRanks[i].other_weight));
    EXPECT_EQ(row[7], kRanks[i].hot);
    EXPECT_EQ(row[8], std::to_string(kRanks[i].hot_weight));
    EXPECT_EQ(row[13], "");
  }
  EXPECT_EQ(rows[1][9], "MPI_Barrier");
  EXPECT_EQ(rows[1][10], "7000.000");
  EXPECT_EQ(rows[2][9], "MPI_Barrier");
  EXPECT_EQ(rows[2][10], "9.000");
  EXPECT_EQ(rows[3][9], "MPI_Send");  // rank 2's barrier took no time: its send was the slowest
  EXPECT_EQ(rows[3][10], "1.000");
  // The rank whose directory is missing and the one whose attach failed.
  EXPECT_EQ(rows[4][1], "3");
  EXPECT_NE(rows[4][13].find("is missing"), std::string::npos) << rows[4][13];
  EXPECT_EQ(rows[4][12], "exited with status 0");
  EXPECT_EQ(rows[5][5], "failed: ptrace: EPERM");
  EXPECT_EQ(rows[5][13], "no output came back");

  ASSERT_EQ(r->ranks.size(), 5u);
  EXPECT_TRUE(r->ranks[0].in_trace && r->ranks[0].in_profile);
  EXPECT_FALSE(r->ranks[3].in_trace || r->ranks[3].in_profile);
  EXPECT_EQ(r->files.front(), job.path("summary.txt"));
  EXPECT_EQ(r->files.size(), 6u);
  for (const auto& f : r->files) EXPECT_FALSE(std::filesystem::exists(f + ".tmp")) << f;

  const std::string summary = slurp(job.path("summary.txt"));
  EXPECT_EQ(summary.substr(0, summary.find('\n')),
            "Remora profile of Slurm job 1234 (every step): 5 ranks on 2 nodes, window 5.0 s");
  EXPECT_NE(summary.find("\n  clocks aligned within ±900 ns (1-2 samples per node, drift up to 1.0 us/s)\n"),
            std::string::npos);
  EXPECT_NE(summary.find("NODE  RANK  PID   COMMAND    SAMPLES  HOTTEST"), std::string::npos) << summary;
  EXPECT_NE(summary.find("n1    0     4242  mpi_ranks  40       solve_n1_r0 (30)  MPI_Barrier 7.000 ms"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("Failures:\n  n2 rank 4 (pid 4301): failed: ptrace: EPERM\n"), std::string::npos);
  EXPECT_NE(summary.find("Left out:\n  n2 rank 3 (pid 4300): its directory n2/mpi_ranks-4300-s1 is missing: "
                         "left out of every merged file\n  n2 rank 4 (pid 4301): no output came back\n"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("    ranks.csv "), std::string::npos);
  EXPECT_NE(summary.find("ui.perfetto.dev"), std::string::npos);
  for (const auto& w : r->warnings) EXPECT_NE(summary.find(w), std::string::npos) << w;
}

TEST(MergeJob, ACorruptTraceCostsOnlyItsRank) {
  JobFixture job;
  const std::string bad = rank_dir(kRanks[1]) + "/trace.perfetto";
  spit(job.path(bad), std::string("\x0a\x05\x08\x01garbage, cut off", 20));
  auto r = merge_job(job.tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  bool named = false;
  for (const auto& w : r->warnings) named = named || w.find(bad) != std::string::npos;
  EXPECT_TRUE(named) << "no warning names " << bad;
  EXPECT_FALSE(r->ranks[1].in_trace);
  EXPECT_TRUE(r->ranks[1].in_profile);
  const DecodedTrace t = decode_trace(slurp(job.path("trace.perfetto")));
  ASSERT_EQ(t.processes.size(), 2u);
  EXPECT_EQ(t.processes[1].name, "rank 2 on n2: mpi_ranks (pid 4242)");
  EXPECT_EQ(t.processes[1].pid, 2000);
  EXPECT_TRUE(t.callstacks_resolve);
  EXPECT_NE(slurp(job.path("summary.txt")).find(bad), std::string::npos);
}

TEST(MergeJob, AProfileOfOtherSampleTypesIsLeftOut) {
  JobFixture job;
  pp::Profile other;
  for (const char* s : {"", "alloc", "bytes"}) other.add_string_table(s);
  other.add_sample_type()->set_type(1);
  other.mutable_sample_type(0)->set_unit(2);
  std::string bytes;
  ASSERT_TRUE(other.SerializeToString(&bytes));
  spit(job.path(rank_dir(kRanks[2]) + "/profile.pb.gz"), bytes);  // plain, as pprof also accepts
  auto r = merge_job(job.tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  EXPECT_FALSE(r->ranks[2].in_profile);
  EXPECT_TRUE(r->ranks[2].in_trace);
  EXPECT_NE(r->ranks[2].problem.find("alloc/bytes"), std::string::npos) << r->ranks[2].problem;
  EXPECT_EQ(slurp(job.path("folded.txt")).find("n2;"), std::string::npos);
}

TEST(MergeJob, NoUsableRankIsAnErrorThatSaysWhy) {
  TempDir tmp;
  JobManifest m = make_manifest();
  for (auto& r : m.ranks) r.dir = r.rank == 0 ? "n1/gone" : "";
  ASSERT_TRUE(write_job_manifest(tmp.path + "/job.json", m));
  auto r = merge_job(tmp.path);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Errc::kParse);
  EXPECT_NE(r.error().message().find("no rank of Slurm job 1234"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("n1 rank 0 (pid 4242): its directory n1/gone is missing"),
            std::string::npos)
      << r.error().message();
  auto none = merge_job(tmp.path + "/nowhere");
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), Errc::kIo);
}

// A process that is no task of the job (rank -1: a rank's child) is named
// by its node and command; a node without a clock sample keeps its times.
TEST(MergeJob, AChildProcessIsNamedByItsNode) {
  TempDir tmp;
  Profile p = make_profile({"n1", -1, -1, 4250, "helper_hot", 100 * kS, 3, 1, 0});
  p.comm = "helper";
  render_rank(p, tmp.path + "/n1/helper-4250-s1");
  JobManifest m;
  m.job = "9", m.step = "0";
  m.nodes = {{"n1", "stream", "", {}}};
  m.ranks = {{"n1", -1, -1, 4250, "helper", "n1/helper-4250-s1", "attached", "", "detached"}};
  ASSERT_TRUE(write_job_manifest(tmp.path + "/job.json", m));
  auto r = merge_job(tmp.path);
  ASSERT_TRUE(r) << r.error().to_string();
  const DecodedTrace t = decode_trace(slurp(tmp.path + "/trace.perfetto"));
  ASSERT_EQ(t.processes.size(), 1u);
  EXPECT_EQ(t.processes[0].name, "n1: helper (pid 4250)");
  EXPECT_EQ(t.processes[0].labels, std::vector<std::string>{"node n1"});
  std::multiset<uint64_t> node_times;
  for (const SampleEvent& s : p.samples) node_times.insert(s.ts_ns);
  EXPECT_EQ(t.sample_times.at(t.processes[0].pid), node_times);
  EXPECT_EQ(slurp(tmp.path + "/folded.txt").rfind("n1;helper (pid 4250);main;", 0), 0u);
  const std::string summary = slurp(tmp.path + "/summary.txt");
  EXPECT_EQ(summary.substr(0, summary.find('\n')),
            "Remora profile of Slurm job 9 (step 0): 1 rank on 1 node, the sessions span 5.0 s");
  EXPECT_NE(summary.find("\n  n1: not aligned (no clock sample; its times are its own clock's)\n"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("\n  n1    -     4250  helper   4        helper_hot (3)"), std::string::npos)
      << summary;
}

TEST(MergeJob, IsDeterministic) {
  JobFixture job;
  ASSERT_TRUE(merge_job(job.tmp.path));
  std::map<std::string, std::string> first;
  for (const char* f :
       {"trace.perfetto", "profile.pb.gz", "folded.txt", "flamegraph.svg", "ranks.csv", "summary.txt"})
    first[f] = slurp(job.path(f));
  ASSERT_TRUE(merge_job(job.tmp.path));
  for (const auto& [f, bytes] : first) EXPECT_EQ(slurp(job.path(f)), bytes) << f;
}

// python3's protobuf, a reader independent of libprotobuf, reads the merged files.
TEST(MergeJob, PythonReadsTheMergedFiles) {
  const std::string py = python_with_protobuf();
  ASSERT_FALSE(py.empty()) << "no python3 here can import google.protobuf: install Debian's python3-protobuf";
  JobFixture job;
  ASSERT_TRUE(merge_job(job.tmp.path));
  const std::string cmd =
      "PYTHONPATH=" REMORA_PROTO_PYTHON_DIR " " + py + " " REMORA_CHECK_MERGED " " + job.tmp.path + " 3 2>&1";
  FILE* out = popen(cmd.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string report;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, out)) > 0;) report.append(buf, n);
  EXPECT_EQ(pclose(out), 0) << cmd << "\n" << report;
}

}  // namespace
}  // namespace remora::profile
