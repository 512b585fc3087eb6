// The raw records' round trip: what the default tool writes inside a target
// (its own wire encoder) is what the controller reads, field by field, and
// what python3's protobuf reads too (an independent reader of the same
// .proto).
#include "profile/records.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "raw_records.h"

namespace {

using remora::profile::parse_raw_records;
using remora::profile::RawProfile;

remora_tool::Profile sample_profile() {
  remora_tool::Profile p;
  p.pid = 4242;
  p.comm = "redis-server";
  p.session = 3;
  p.start_ns = 1000;
  p.end_ns = 5'000'000'000ull;
  p.hz = 99;
  p.signal = 34;
  p.sampling = p.tracing = true;
  p.threads = {{4242, "main"}, {4243, std::string("w\xff\xfe", 3)}};
  p.fn_names = {"read", "write"};
  p.raw_stacks = {{0x401000, 0x7f0000001234}, std::vector<uint64_t>(remora_tool::kMaxFrames, 0x1)};
  p.stack_weights = {{{4242, 0}, 7}, {{4243, 1}, 2}};
  p.samples = {{4242, 1, 0, 2000}, {4243, 2, 1, 3000}};
  p.calls = {{4242, 1, 4000, 500}};
  p.slowest_calls = {{4242, 1, 4000, 500}};
  p.func_stats = {{"write", 10, 5000, 900}};
  p.counters = {{remora_tool::kCounterRssBytes, 0, 100, 1u << 20},
                {remora_tool::kCounterThreadCpuNs, 4243, 100, 77}};
  p.samples_total = 9;
  p.samples_dropped = 1;
  p.calls_dropped = 2;
  p.events_capped = 3;
  p.patched_slots = 4;
  p.warnings = {"a warning"};
  return p;
}

remora_tool::RawContext sample_context() {
  remora_tool::RawContext c;
  c.maps_text =
      "00400000-00401000 r--p 00000000 08:01 1234 /usr/bin/redis-server\n"
      "00401000-00402000 r-xp 00001000 08:01 1234 /usr/bin/redis-server\n"
      "01000000-02000000 rw-p 00000000 00:00 0 [heap]\n"
      "7f0000000000-7f0000010000 rwxp 00000000 00:00 0 \n"
      "garbage line\n"
      "7ffd0000-7ffd1000 r-xp 00000000 00:00 0 [vdso]";
  c.exe = "/usr/bin/redis-check-rdb";
  c.tool_path = "/opt/remora/lib/libremora-tool.so";
  return c;
}

TEST(RawRecords, RoundTripThroughTheControllersReader) {
  const auto p = sample_profile();
  const std::string bytes = remora_tool::encode_raw_records(p, sample_context());
  auto r = parse_raw_records(bytes);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const RawProfile& q = *r;
  EXPECT_EQ(q.ns_pid, 4242);
  EXPECT_EQ(q.pid, 4242);
  EXPECT_EQ(q.comm, "redis-server");
  EXPECT_EQ(q.exe, "/usr/bin/redis-check-rdb");
  EXPECT_EQ(q.session, 3u);
  EXPECT_EQ(q.end_ns, 5'000'000'000ull);
  EXPECT_EQ(q.hz, 99);
  EXPECT_EQ(q.signal, 34);
  EXPECT_TRUE(q.sampling && q.tracing);
  EXPECT_EQ(q.threads.at(4243), std::string("w\xff\xfe", 3));  // bytes kept as they were
  EXPECT_EQ(q.fn_names, (std::vector<std::string>{"read", "write"}));
  ASSERT_EQ(q.raw_stacks.size(), 2u);
  EXPECT_EQ(q.raw_stacks[0], (std::vector<uint64_t>{0x401000, 0x7f0000001234}));
  EXPECT_EQ(q.truncated, (std::vector<bool>{false, true}));
  EXPECT_EQ(q.stack_weights.at({4243, 1}), 2u);
  ASSERT_EQ(q.samples.size(), 2u);
  EXPECT_EQ(q.samples[1].weight, 2u);
  EXPECT_EQ(q.samples[1].ts_ns, 3000u);
  ASSERT_EQ(q.calls.size(), 1u);
  EXPECT_EQ(q.calls[0].dur_ns, 500u);
  ASSERT_EQ(q.func_stats.size(), 1u);
  EXPECT_EQ(q.func_stats[0].max_ns, 900u);
  ASSERT_EQ(q.counters.size(), 2u);
  EXPECT_EQ(q.counters[0].kind, remora::profile::CounterKind::kRssBytes);
  EXPECT_EQ(q.counters[1].value, 77u);
  EXPECT_EQ(q.samples_total, 9u);
  EXPECT_EQ(q.events_capped, 3u);
  EXPECT_EQ(q.patched_slots, 4u);
  EXPECT_EQ(q.warnings, (std::vector<std::string>{"a warning"}));
  EXPECT_EQ(q.tool_path, "/opt/remora/lib/libremora-tool.so");
  // Maps: files and executable mappings; heaps and garbage are left out.
  ASSERT_EQ(q.maps.size(), 4u);
  EXPECT_EQ(q.maps[1].perms, "r-xp");
  EXPECT_EQ(q.maps[1].offset, 0x1000u);
  EXPECT_EQ(q.maps[1].inode, 1234u);
  EXPECT_EQ(q.maps[1].path, "/usr/bin/redis-server");
  EXPECT_EQ(q.maps[2].path, "");
  EXPECT_EQ(q.maps[2].start, 0x7f0000000000u);
  EXPECT_EQ(q.maps[3].path, "[vdso]");
  // Modules: this test program's own, as its dynamic linker lists them.
  ASSERT_FALSE(q.modules.empty());
  EXPECT_EQ(q.modules[0].path, "/usr/bin/redis-check-rdb");  // the main program is named by exe
  bool libc = false;
  for (const auto& m : q.modules)
    if (m.path.find("libc.so.6") != std::string::npos) {
      libc = true;
      EXPECT_EQ(m.build_id.size(), 40u) << m.path;  // a SHA-1 build ID, as Debian builds libc
    }
  EXPECT_TRUE(libc);
}

TEST(RawRecords, RefusesDamagedAndNewer) {
  std::string bytes = remora_tool::encode_raw_records(sample_profile(), sample_context());
  // Cut inside the last field: a cut that happens to fall between two
  // top-level fields leaves a valid shorter message (protobuf has no end
  // marker), and where the half falls depends on this build's paths.
  auto cut = parse_raw_records(std::string_view(bytes).substr(0, bytes.size() - 1));
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.error().message().find("damaged or cut short"), std::string::npos) << cut.error().to_string();

  remora_tool::WireWriter w;
  w.varint_field(1, 99);
  auto newer = parse_raw_records(w.data());
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.error().message().find("version 99"), std::string::npos) << newer.error().to_string();

  remora_tool::WireWriter bad;
  bad.varint_field(1, 1);
  size_t at = bad.begin(17);  // a sample naming a stack that does not exist
  bad.varint_field(3, 5);
  bad.end(at);
  auto dangling = parse_raw_records(bad.data());
  ASSERT_FALSE(dangling.ok());
  EXPECT_NE(dangling.error().message().find("names stack 5"), std::string::npos)
      << dangling.error().to_string();
}

TEST(RawRecords, PythonsProtobufReadsTheSameFile) {
  if (std::system((std::string(REMORA_PROTO_PYTHON) + " -c 'import google.protobuf' 2>/dev/null").c_str()) !=
      0)
    FAIL() << "python3's protobuf is missing from " REMORA_PROTO_PYTHON
              ": apt-get install python3-protobuf (a declared dependency)";
  char path[] = "/tmp/remora-raw-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string bytes = remora_tool::encode_raw_records(sample_profile(), sample_context());
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
  const std::string cmd =
      std::string("PYTHONPATH=") + REMORA_PROTO_PYTHON_DIR +
      " " REMORA_PROTO_PYTHON
      " -c 'import sys, remora_raw_pb2 as r; s = r.Session(); "
      "s.ParseFromString(open(sys.argv[1], \"rb\").read()); "
      "assert s.pid == 4242 and s.comm == \"redis-server\", s; "
      "assert len(s.stacks) == 2 and list(s.stacks[0].pcs) == [0x401000, 0x7f0000001234]; "
      "assert s.stacks[1].truncated and len(s.maps) == 4 and s.counters[1].value == 77; "
      "print(\"python read\", len(s.modules), \"modules\")' " +
      path;
  int rc = std::system(cmd.c_str());
  unlink(path);
  EXPECT_EQ(rc, 0) << cmd;
}

}  // namespace
