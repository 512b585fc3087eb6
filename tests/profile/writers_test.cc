// The writers of src/profile (writers.h) from hand-made profiles: odd thread
// names (invalid UTF-8, markup, newlines), inlined, JIT, unknown and
// truncated frames, nested and overlapping calls, counters, empty profiles.
// Every output is written into a temporary directory and read back by
// check_formats.py with python3's strict readers and protoc's modules, which
// compare the content with the profile (described to it as JSON, names as
// hex). The escape, collapse and folded tests come from the default tool's
// former in-process writers (tools/default/report.cc).
#include "profile/writers.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace remora::profile {
namespace {

// ---- helpers ----

std::string hex(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    char buf[3];
    snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

// A temporary directory, removed even when the test fails.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/remora-writers-XXXXXX";
    if (mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    if (!path.empty()) std::filesystem::remove_all(path);
  }
};

// The python3 that has Debian's protobuf module: python3 on PATH, else
// Debian's own (a pyenv or venv python3 first on PATH lacks dist-packages).
// "" when none: the caller fails with the fix.
std::string python_with_protobuf() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    std::string cmd = std::string(py) + " -c 'import google.protobuf' >/dev/null 2>&1";
    if (system(cmd.c_str()) == 0) return py;
  }
  return "";
}

constexpr const char* kNoProtobuf =
    "no python3 here can import google.protobuf, which the format checks need: install Debian's "
    "python3-protobuf (apt-get install python3-protobuf; a declared dependency, see the Makefile's deps)";

// The profile as check_formats.py reads it: every name as hex bytes, so
// that the reference holds exactly the bytes the writers were given.
std::string describe(const Profile& p) {
  using nlohmann::json;
  json d = {
      {"pid", p.pid},       {"ns_pid", p.ns_pid}, {"comm", hex(p.comm)},           {"start_ns", p.start_ns},
      {"end_ns", p.end_ns}, {"hz", p.hz},         {"fold_threads", p.fold_threads}};
  json threads = json::array(), fns = json::array(), frames = json::array(), stacks = json::array(),
       weights = json::array(), samples = json::array(), calls = json::array(), stats = json::array(),
       counters = json::array(), modules = json::array(), maps = json::array();
  for (const auto& [tid, name] : p.threads) threads.push_back({tid, hex(name)});
  for (const auto& n : p.fn_names) fns.push_back(hex(n));
  for (const Frame& f : p.frames)
    frames.push_back({{"function", hex(f.function)},
                      {"module", hex(f.module)},
                      {"file", hex(f.file)},
                      {"line", f.line},
                      {"inlined", f.inlined},
                      {"address", f.address},
                      {"module_offset", f.module_offset},
                      {"kind", static_cast<int>(f.kind)}});
  for (const auto& s : p.stacks) stacks.push_back(s);
  for (const auto& [key, w] : p.stack_weights) weights.push_back({key.first, key.second, w});
  for (const SampleEvent& s : p.samples) samples.push_back({s.tid, s.weight, s.stack, s.ts_ns});
  for (const CallEvent& c : p.calls) calls.push_back({c.tid, c.fn, c.start_ns, c.dur_ns});
  for (const FuncStat& f : p.func_stats) stats.push_back({hex(f.name), f.calls, f.total_ns, f.max_ns});
  for (const CounterSample& c : p.counters)
    counters.push_back({static_cast<int>(c.kind), c.tid, c.ts_ns, c.value});
  for (const Module& m : p.modules) modules.push_back({hex(m.path), m.bias, m.build_id});
  for (const Mapping& m : p.maps) maps.push_back({m.start, m.end, m.offset, hex(m.path)});
  d["threads"] = threads, d["fn_names"] = fns, d["frames"] = frames, d["stacks"] = stacks;
  d["stack_weights"] = weights, d["samples"] = samples, d["calls"] = calls, d["func_stats"] = stats;
  d["counters"] = counters, d["modules"] = modules, d["maps"] = maps;
  return d.dump();
}

using Writer = bool (*)(const Profile&, FILE*);
bool pprof_now(const Profile& p, FILE* out) { return write_pprof(p, out); }
const std::pair<const char*, Writer> kWriters[] = {
    {"trace.json", write_trace_json},
    {"trace.perfetto", write_perfetto},
    {"profile.pb.gz", pprof_now},
    {"folded.txt", write_folded},
    {"flamegraph.svg", write_flamegraph_svg},
    {"stats.csv", write_stats_csv},
};

// Writes every output of `p` into `dir`; false (with the reason in *why)
// when a writer fails.
bool write_outputs(const Profile& p, const std::string& dir, std::string* why) {
  for (const auto& [name, fn] : kWriters) {
    FILE* f = fopen((dir + "/" + name).c_str(), "w");
    if (f == nullptr) return *why = std::string("cannot create ") + name, false;
    bool ok = fn(p, f);
    ok = fclose(f) == 0 && ok;
    if (!ok) return *why = std::string("writing ") + name + ": " + strerror(errno), false;
  }
  FILE* f = fopen((dir + "/summary.txt").c_str(), "w");
  if (f == nullptr) return *why = "cannot create summary.txt", false;
  bool ok = write_summary(p, dir, f);
  ok = fclose(f) == 0 && ok;
  if (!ok) *why = "writing summary.txt";
  return ok;
}

// Writes the outputs and has check_formats.py compare them with the profile.
void expect_outputs_match(const Profile& p) {
  const std::string py = python_with_protobuf();
  ASSERT_FALSE(py.empty()) << kNoProtobuf;
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::string why;
  ASSERT_TRUE(write_outputs(p, dir.path, &why)) << why;
  FILE* f = fopen((dir.path + "/profile.json").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs(describe(p).c_str(), f);
  fclose(f);
  std::string cmd = "PYTHONPATH=" REMORA_PROTO_PYTHON_DIR " " + py + " " REMORA_CHECK_FORMATS " " + dir.path +
                    " --profile " + dir.path + "/profile.json 2>&1";
  FILE* out = popen(cmd.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string report;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, out)) > 0;) report.append(buf, n);
  int status = pclose(out);
  EXPECT_EQ(status, 0) << cmd << "\n" << report;
}

Frame frame(const std::string& function, const std::string& module, uint64_t address, uint64_t offset,
            const std::string& file = "", uint32_t line = 0, bool inlined = false,
            FrameKind kind = FrameKind::kNative) {
  Frame f;
  f.function = function, f.module = module, f.address = address, f.module_offset = offset;
  f.file = file, f.line = line, f.inlined = inlined, f.kind = kind;
  return f;
}

Mapping mapping(uint64_t start, uint64_t end, uint64_t offset, const char* perms, const std::string& path) {
  Mapping m;
  m.start = start, m.end = end, m.offset = offset, m.perms = perms, m.path = path;
  return m;
}

constexpr uint64_t kS = 1000000000;  // one second in ns

// A profile with a little of everything a session can hold.
Profile rich_profile() {
  Profile p;
  p.pid = 4242, p.ns_pid = 7;
  p.comm = "demo<&>\xff";
  p.session = 3;
  p.start_ns = 1 * kS, p.end_ns = 3 * kS;
  p.hz = 99, p.signal = 27;
  p.sampling = p.tracing = true;
  p.threads = {{7, "main"}, {8, "bad\xffname\"<"}, {9, "\xed\xa0\x80 surrogate;semi\nnl"}, {10, ""}};
  p.fn_names = {"read", "write\xc3", "fopen"};
  const std::string demo = "/usr/bin/demo", hot = "/usr/lib/libhot.so", libx = "/usr/lib/libx.so";
  p.frames = {
      frame("main", demo, 0x401000, 0x1000, "demo.cc", 10),                                      // 0
      frame("run", demo, 0x401100, 0x1100, "demo.cc", 20),                                       // 1
      frame("process(int)", demo, 0x401200, 0x1200, "demo.cc", 30),                              // 2
      frame("helper<int>", demo, 0x401200, 0x1200, "util.h", 5, true),                           // 3
      frame("std::vector<int, std::allocator<int> >::push_back(int&&)", demo, 0x401200, 0x1200,  // 4
            "/usr/include/c++/12/bits/stl_vector.h", 1200, true),
      frame("hot<a&b>", hot, 0x7f0000001010, 0x1010, "hot.cc", 7),                                 // 5
      frame("JS:*compute /srv/app.js:1:1", "[jit]", 0x7e0000000100, 0x7e0000000100, "", 0, false,  // 6
            FrameKind::kJit),
      frame("libx.so+0x1f0", libx, 0x7f10000001f0, 0x1f0),                        // 7
      frame("[unknown]", "", 0xdead, 0xdead, "", 0, false, FrameKind::kUnknown),  // 8
      frame("[truncated]", "", 0, 0, "", 0, false, FrameKind::kTruncated),        // 9
      frame("bad\xf0\x9f\x98name;x", demo, 0x401300, 0x1300,
            "bad\xff"
            "dir/x.cc",
            3),                                             // 10
      frame("run", demo, 0x401108, 0x1108, "demo.cc", 21),  // 11
  };
  p.stacks = {{0, 1, 2, 3, 4}, {0, 1, 5}, {0, 11, 5}, {9, 6, 7}, {0, 8}, {0, 10}, {}, {0, 1, 1, 5}};
  p.truncated = {false, false, false, true, false, false, false, false};
  p.stack_weights = {{{7, 0}, 5},  {{7, 1}, 10}, {{8, 1}, 3}, {{8, 2}, 2}, {{9, 3}, 4},
                     {{10, 4}, 1}, {{7, 5}, 2},  {{8, 6}, 1}, {{7, 7}, 3}, {{7, 99}, 1}};
  p.samples = {{7, 1, 0, 1100000000}, {8, 2, 1, 1200000000}, {9, 1, 3, 1300000000},  {10, 1, 4, 1400000000},
               {8, 1, 6, 1500000000}, {7, 1, 5, 1600000000}, {7, 1, 99, 1700000000}, {7, 1, 7, 1800000000}};
  p.calls = {
      {7, 0, 1000100000, 500000},  // read, around...
      {7, 2, 1000200000, 100000},  // ...fopen
      {7, 1, 1000700000, 0},       // a zero-length write, then a read starting as it ends
      {7, 0, 1000700000, 1000},   {8, 1, 1200000000, 1000},
      {9, 0, 2000000000, 1000},  // two calls that overlap without nesting: records that disagree
      {9, 1, 2000000500, 1000},   {10, 42, 2100000000, 10},  // a function id out of range
  };
  p.slowest_calls = p.calls;
  std::sort(p.slowest_calls.begin(), p.slowest_calls.end(),
            [](const CallEvent& a, const CallEvent& b) { return a.dur_ns > b.dur_ns; });
  p.func_stats = {
      {"read", 10, 5000000, 500000}, {"write\xc3", 1, 1000, 1000}, {"fopen", 0, 0, 0}, {"a,b\"c", 2, 20, 10}};
  p.counters = {{CounterKind::kRssBytes, 0, 1100000000, 1 << 20},
                {CounterKind::kRssBytes, 0, 1200000000, 2 << 20},
                {CounterKind::kThreadCpuNs, 7, 1100000000, 5000000},
                {CounterKind::kThreadCpuNs, 7, 1200000000, 9000000},
                {CounterKind::kThreadCpuNs, 8, 1150000000, 100}};
  p.modules = {{demo, 0x400000, "0123456789abcdef0123456789abcdef01234567"},
               {hot, 0x7f0000000000, "deadbeef"},
               {libx, 0x7f1000000000, ""}};
  p.maps = {mapping(0x400000, 0x401000, 0, "r--p", demo),
            mapping(0x401000, 0x402000, 0x1000, "r-xp", demo),
            mapping(0x7f0000000000, 0x7f0000001000, 0, "r--p", hot),
            mapping(0x7f0000001000, 0x7f0000002000, 0x1000, "r-xp", hot),
            mapping(0x7f1000000000, 0x7f1000001000, 0, "r-xp", libx),
            mapping(0x7e0000000000, 0x7e0000010000, 0, "rwxp", "")};
  p.samples_total = 32;
  p.samples_dropped = 1, p.events_capped = 2;
  p.patched_slots = 3;
  p.warnings = {"a warning", "a warning"};
  return p;
}

// ---- escapes (ported from the default tool's writer tests) ----

// What trace.json holds for a name: valid_utf8, then nlohmann's escapes.
std::string json_of(const std::string& s) {
  std::string q = nlohmann::json(valid_utf8(s)).dump();
  return q.substr(1, q.size() - 2);
}

// U+FFFD, the replacement for each ill-formed sequence, written as "R".
#define R "\xef\xbf\xbd"

// One input, with what JSON (valid_utf8, then nlohmann) and xml_escape must make of it.
struct EscapeCase {
  std::string in, json, xml;
  const char* why;
};

const EscapeCase kEscapeCases[] = {
    {"a\"b\\c\n\x01", "a\\\"b\\\\c\\n\\u0001", "a&quot;b\\c&#10;" R, "markup and controls"},
    {"a<b>&\"'", "a<b>&\\\"'", "a&lt;b&gt;&amp;&quot;&apos;", "XML markup"},
    {"\t\n\r", "\\t\\n\\r", "&#9;&#10;&#13;", "XML keeps tab/LF/CR as references"},
    {std::string("\0\x1f\x7f", 3), "\\u0000\\u001f\x7f", R R "\x7f", "C0 controls; DEL is allowed"},
    // Well-formed: kept byte for byte, at each boundary of table 3-7.
    {"caf\xc3\xa9", "caf\xc3\xa9", "caf\xc3\xa9", "U+00E9"},
    {"\xc2\x80\xdf\xbf", "\xc2\x80\xdf\xbf", "\xc2\x80\xdf\xbf", "U+0080, U+07FF"},
    {"\xe0\xa0\x80\xed\x9f\xbf", "\xe0\xa0\x80\xed\x9f\xbf", "\xe0\xa0\x80\xed\x9f\xbf", "U+0800, U+D7FF"},
    {"\xee\x80\x80\xef\xbf\xbd", "\xee\x80\x80\xef\xbf\xbd", "\xee\x80\x80\xef\xbf\xbd", "U+E000, U+FFFD"},
    {"\xf0\x90\x80\x80\xf4\x8f\xbf\xbf", "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf",
     "\xf0\x90\x80\x80\xf4\x8f\xbf\xbf", "U+10000, U+10FFFF"},
    {"\xef\xbf\xbe\xef\xbf\xbf", "\xef\xbf\xbe\xef\xbf\xbf", R R, "U+FFFE, U+FFFF: JSON yes, XML 1.0 no"},
    // Overlong: C0 and C1 never lead; E0 80-9F and F0 80-8F are not a
    // prefix of anything well-formed, so each byte is its own subpart.
    {"\xc0\xaf", R R, R R, "overlong '/' (C0)"},
    {"\xc1\xbf", R R, R R, "overlong (C1)"},
    {"\xe0\x80\xaf", R R R, R R R, "overlong (E0 80)"},
    {"\xe0\x9f\xbf", R R R, R R R, "overlong (E0 9F)"},
    {"\xf0\x80\x80\xaf", R R R R, R R R R, "overlong (F0 80)"},
    {"\xf0\x8f\xbf\xbf", R R R R, R R R R, "overlong (F0 8F)"},
    // UTF-16 surrogates (ED A0-BF).
    {"\xed\xa0\x80", R R R, R R R, "U+D800"},
    {"\xed\xbf\xbf", R R R, R R R, "U+DFFF"},
    {"\xed\xa0\xbd\xed\xb8\x80", R R R R R R, R R R R R R, "a surrogate pair, CESU-8 style"},
    // Above U+10FFFF (F4 90+, F5-FF).
    {"\xf4\x90\x80\x80", R R R R, R R R R, "U+110000"},
    {"\xf5\x80\x80\x80", R R R R, R R R R, "F5 lead"},
    {"\xf8\x88\x80\x80\x80", R R R R R, R R R R R, "5-byte form"},
    {"\xff\xfe", R R, R R, "FF, FE"},
    // Truncated: the well-formed prefix is one subpart.
    {"\xc3", R, R, "2-byte lead at the end"},
    {"\xe2\x82", R, R, "3-byte sequence cut after 2"},
    {"\xf0\x9f\x98", R, R, "4-byte sequence cut after 3"},
    {"a\xe2\x82z", "a" R "z", "a" R "z", "cut by an ASCII byte"},
    {"\xe2\x82\xe2\x82\xac", R "\xe2\x82\xac", R "\xe2\x82\xac", "cut by a new lead"},
    {"\xf4\x8f\xbf<", R "<", R "&lt;", "cut by markup"},
    // Stray continuation bytes.
    {"\x80", R, R, "80 alone"},
    {"\x80\xbf", R R, R R, "two continuation bytes"},
    {"\xc3\xa9\xa9", "\xc3\xa9" R, "\xc3\xa9" R, "one too many"},
    // Unicode 15, table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
    {"a\xf1\x80\x80\xe1\x80\xc2"
     "b\x80"
     "c\x80\xbf"
     "d",
     "a" R R R "b" R "c" R R "d", "a" R R R "b" R "c" R R "d", "Unicode's own example"},
};
#undef R

TEST(WritersEscapes, Escaping) {
  for (const auto& c : kEscapeCases) {
    EXPECT_EQ(json_of(c.in), c.json) << c.why;
    EXPECT_EQ(xml_escape(c.in), c.xml) << c.why;
  }
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("std::map<int, int>::find"), "\"std::map<int, int>::find\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
}

// The test's own strict UTF-8 check, written apart from writers.cc's walk:
// decode by the bit patterns, then reject what RFC 3629 rules out by value
// (overlong forms, surrogates, beyond U+10FFFF). Appends the code points.
bool strict_utf8(const std::string& s, std::vector<char32_t>* cps) {
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    size_t n = b < 0x80 ? 1 : (b & 0xe0) == 0xc0 ? 2 : (b & 0xf0) == 0xe0 ? 3 : (b & 0xf8) == 0xf0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    char32_t cp = n == 1 ? b : b & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
      auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return false;
    cps->push_back(cp);
    i += n;
  }
  return true;
}

// Random names, biased towards the bytes where UTF-8 decoders differ, with
// whole well-formed sequences at the edges of the ranges mixed in (random
// bytes alone would almost never spell U+FFFE).
std::vector<std::string> random_names(size_t count) {
  static constexpr unsigned char kEdges[] = {
      0x00, 0x09, 0x0a, 0x0d, 0x1f, '"',  '\\', '<',  '&',  '\'', 'a',  0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0,
      0xbe, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0, 0xe1, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff};
  static const char* const kSequences[] = {
      "\xc2\x80",     "\xdf\xbf",     "\xe0\xa0\x80",     "\xed\x9f\xbf",     "\xee\x80\x80", "\xef\xbf\xbd",
      "\xef\xbf\xbe", "\xef\xbf\xbf", "\xf0\x90\x80\x80", "\xf4\x8f\xbf\xbf", "\xe2\x80\xa8"};
  std::mt19937 rng(20261201);  // fixed: a failure reproduces
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    for (size_t n = rng() % 12; n > 0; --n) {
      switch (rng() % 4) {
        case 0: s += static_cast<char>(rng()); break;
        case 1: s += kSequences[rng() % std::size(kSequences)]; break;
        default: s += static_cast<char>(kEdges[rng() % sizeof kEdges]);
      }
    }
    out.push_back(s);
  }
  return out;
}

TEST(WritersEscapes, EscapedRandomBytesAreValidUtf8) {
  for (const auto& s : random_names(5000)) {
    std::vector<char32_t> cps;
    std::string json = json_of(s);
    ASSERT_TRUE(strict_utf8(json, &cps)) << "JSON of " << testing::PrintToString(s);
    for (char32_t cp : cps)
      ASSERT_GE(cp, 0x20u) << "a raw control in JSON from " << testing::PrintToString(s);
    cps.clear();
    ASSERT_TRUE(strict_utf8(valid_utf8(s), &cps)) << "valid_utf8 of " << testing::PrintToString(s);
    cps.clear();
    std::string xml = xml_escape(s);
    ASSERT_TRUE(strict_utf8(xml, &cps)) << "xml_escape of " << testing::PrintToString(s);
    for (char32_t cp : cps)  // XML 1.0's Char, and no literal tab/LF/CR (they are references)
      ASSERT_TRUE(cp >= 0x20 && cp != 0xfffe && cp != 0xffff) << "XML from " << testing::PrintToString(s);
    // Valid input is kept as it is, apart from what the escapes rewrite.
    std::vector<char32_t> in;
    const bool valid = strict_utf8(s, &in);
    if (valid) {
      EXPECT_EQ(valid_utf8(s), s);
    }
    if (valid && s.find_first_of("\"\\<>&'") == std::string::npos &&
        std::all_of(in.begin(), in.end(),
                    [](char32_t c) { return c >= 0x20 && c != 0xfffe && c != 0xffff; })) {
      EXPECT_EQ(json, s);
      EXPECT_EQ(xml, s);
    }
  }
}

// Python's decoders as the reference: json.loads and ElementTree (expat)
// must accept every output, and read back exactly what Python's own UTF-8
// decoder makes of the input bytes with errors="replace" (maximal subparts,
// as the writers do), less in XML the characters XML 1.0 forbids.
constexpr const char* kPythonCheck = R"(import json, sys, xml.etree.ElementTree as ET
bad = total = 0
for line in open(sys.argv[1]):
    total += 1
    raw, js, xm = (bytes.fromhex(f) for f in line.rstrip("\n").split(","))
    want = raw.decode("utf-8", "replace")
    xml_want = "".join("\ufffd" if (c < " " and c not in "\t\n\r") or c in "\ufffe\uffff" else c for c in want)
    try:
        got = json.loads(b'"' + js + b'"')  # strict: bytes must be UTF-8, no raw controls
        root = ET.fromstring(b'<a b="' + xm + b'">' + xm + b'</a>')
        ok = got == want and (root.text or "") == xml_want and root.get("b") == xml_want
    except (ValueError, SyntaxError) as e:  # json, UTF-8 and ElementTree errors
        ok, got = False, e
    if not ok:
        bad += 1
        if bad <= 5: print("mismatch for", raw, "want", ascii(want), "got", ascii(got), xm)
print(total - bad, "of", total, "escaped names read back as Python decodes them")
sys.exit(1 if bad or total == 0 else 0)
)";

TEST(WritersEscapes, PythonReadsEscapedRandomBytes) {
  if (system("python3 -c pass") != 0) GTEST_SKIP() << "no python3 on this host: the cross-check needs it";
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  FILE* data = fopen((d.path + "/cases.txt").c_str(), "w");
  FILE* script = fopen((d.path + "/check.py").c_str(), "w");
  ASSERT_NE(data, nullptr);
  ASSERT_NE(script, nullptr);
  for (const auto& s : random_names(3000))
    fprintf(data, "%s,%s,%s\n", hex(s).c_str(), hex(json_of(s)).c_str(), hex(xml_escape(s)).c_str());
  fputs(kPythonCheck, script);
  fclose(data);
  fclose(script);
  std::string cmd = "python3 " + d.path + "/check.py " + d.path + "/cases.txt";
  EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
}

// ---- names ----

TEST(WritersSummary, CollapsesTemplateArguments) {
  const std::pair<const char*, const char*> cases[] = {
      {"std::vector<std::pair<int, std::string>>::push_back(std::pair<int, std::string> const&)",
       "std::vector<...>::push_back(std::pair<int, std::string> const&)"},
      {"std::vector<std::pair<int, std::string>>::push_back(std::pair<int, std::__cxx11::string> const&)",
       "std::vector<...>::push_back(std::pair<...> const&)"},
      {"std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_append(char "
       "const*, unsigned long)",
       "std::__cxx11::basic_string<...>::_M_append(char const*, unsigned long)"},
      {"std::map<int, int>::find(int const&)", "std::map<int, int>::find(int const&)"},
      {"void f<int>(int)", "void f<int>(int)"},
      {"f<aaaaaaaaaaaaaaaaaaaa>()", "f<aaaaaaaaaaaaaaaaaaaa>()"},  // 20 characters: kept
      {"f<aaaaaaaaaaaaaaaaaaaaa>()", "f<...>()"},                  // 21
      {"A<B<int>>::g()", "A<...>::g()"},                           // nested, however short
      {"bool operator<(A const&, A const&)", "bool operator<(A const&, A const&)"},
      {"std::ostream& operator<<(std::ostream&, Foo const&)",
       "std::ostream& operator<<(std::ostream&, Foo const&)"},
      {"X::operator<<=(int)", "X::operator<<=(int)"},
      {"X::operator>>(int)", "X::operator>>(int)"},
      {"X::operator<=>(X const&) const", "X::operator<=>(X const&) const"},
      {"X::operator->() const", "X::operator->() const"},
      {"bool operator< <int>(V<int> const&, V<int> const&)",
       "bool operator< <int>(V<int> const&, V<int> const&)"},
      {"bool operator< <std::vector<int>>(V const&)", "bool operator< <...>(V const&)"},
      {"bool operator><std::vector<int>>(V const&)", "bool operator><...>(V const&)"},
      {"std::less<void>::operator()<std::pair<int, int> const&>(A, B) const",
       "std::less<void>::operator()<...>(A, B) const"},
      {"Foo::operator std::vector<int, std::allocator<int> >() const",
       "Foo::operator std::vector<...>() const"},
      {"operators<std::map<int, int>>()", "operators<...>()"},
      {"main::{lambda(int)#1}::operator()(int) const", "main::{lambda(int)#1}::operator()(int) const"},
      {"void std::sort<main::{lambda(int, int)#2}>(main::{lambda(int, int)#2})",
       "void std::sort<...>(main::{lambda(int, int)#2})"},
      {"std::function<void (std::vector<int>)>::operator()(std::vector<int>) const",
       "std::function<...>::operator()(std::vector<int>) const"},
      {"C<(1>2)>::f()", "C<(1>2)>::f()"},
      {"std::__cxx11::basic_string[abi:cxx11]<char, std::char_traits<char> >",
       "std::__cxx11::basic_string[abi:cxx11]<...>"},
      {"JS:*<anonymous> /srv/app.js:1:1", "JS:*<anonymous> /srv/app.js:1:1"},
      {"java.lang.Object::<init>", "java.lang.Object::<init>"},
      {"unbalanced<std::vector<int>", "unbalanced<std::vector<int>"},
      {"a > b < c", "a > b < c"},
      {"[unknown]+0x7f00", "[unknown]+0x7f00"},
      {"", ""},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(collapse_template_args(in), want) << in;
}

// A profile of one frame per function, stacks given by name.
Profile named_profile(const std::vector<std::vector<std::string>>& stacks) {
  Profile p;
  std::map<std::string, uint32_t> ids;
  for (const auto& names : stacks) {
    std::vector<uint32_t>& s = p.stacks.emplace_back();
    for (const auto& n : names) {
      auto [it, added] = ids.try_emplace(n, static_cast<uint32_t>(p.frames.size()));
      if (added) p.frames.push_back(frame(n, "/bin/prog", 0x1000 + it->second, it->second));
      s.push_back(it->second);
    }
  }
  return p;
}

std::string summary_of(const Profile& p) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  EXPECT_NE(f, nullptr);
  EXPECT_TRUE(write_summary(p, "/out", f));
  fclose(f);
  std::string s(buf, len);
  free(buf);
  return s;
}

TEST(WritersSummary, ShortNamesInTheSummaryFullNamesInTheFiles) {
  const std::string push =
      "std::vector<std::pair<int, std::string>>::push_back(std::pair<int, std::string> const&)";
  const std::string f_int = "void process<std::vector<int>>(int)";
  const std::string f_long = "void process<std::vector<long>>(int)";
  Profile p = named_profile({{"main", push}, {"main", f_int}, {"main", f_long}});
  p.comm = "prog";
  p.sampling = true;
  p.stack_weights = {{{1, 0}, 5}, {{1, 1}, 3}, {{1, 2}, 2}};
  p.threads = {{1, "main"}};
  std::string s = summary_of(p);
  EXPECT_NE(s.find("  std::vector<...>::push_back(std::pair<int, std::string> const&)\n"), std::string::npos)
      << s;
  EXPECT_EQ(s.find(push), std::string::npos) << s;
  // Collapsed, the two instantiations would read the same: both stay whole.
  EXPECT_NE(s.find("  " + f_int + "\n"), std::string::npos) << s;
  EXPECT_NE(s.find("  " + f_long + "\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("process<...>"), std::string::npos) << s;
  // The files keep every name whole.
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(write_stats_csv(p, f));
  EXPECT_TRUE(write_folded(p, f));
  fclose(f);
  std::string files(buf, len);
  free(buf);
  EXPECT_NE(files.find(push), std::string::npos) << files;
  EXPECT_EQ(files.find("<...>"), std::string::npos) << files;
}

TEST(WritersSummary, ListsEveryOutputAndTheHottestFunction) {
  Profile p = rich_profile();
  std::string s = summary_of(p);
  for (const char* file :
       {"trace.perfetto", "trace.json", "profile.pb.gz", "flamegraph.svg", "folded.txt", "stats.csv"})
    EXPECT_NE(s.find(std::string("    ") + file), std::string::npos) << file << "\n" << s;
  EXPECT_NE(s.find("Remora profile of demo<&>\xef\xbf\xbd (pid 4242, 7 in its pid namespace), session 3"),
            std::string::npos)
      << s;
  // hot<a&b> is the leaf of 10 + 3 + 2 + 3 samples of 32.
  EXPECT_NE(s.find(" 1.  56.25%        18  [ 56.25%]  hot<a&b>\n"), std::string::npos) << s;
  EXPECT_EQ(s.find("a warning\n  a warning"), std::string::npos) << "warnings are listed once:\n" << s;
  EXPECT_NE(s.find("events left out of the timeline"), std::string::npos) << s;
}

TEST(WritersNames, FrameLabels) {
  Frame f = frame("f(int)", "/bin/x", 1, 1, "src/f.cc", 12);
  EXPECT_EQ(frame_label(f), "f(int)");
  EXPECT_EQ(frame_source(f), "src/f.cc:12");
  EXPECT_EQ(frame_label_with_line(f), "f(int) (src/f.cc:12)");
  f.line = 0;
  EXPECT_EQ(frame_label_with_line(f), "f(int) (src/f.cc)") << "a file without a line still says the file";
  f.file.clear();
  EXPECT_EQ(frame_label_with_line(f), "f(int)");
  f.function.clear();
  EXPECT_EQ(frame_label(f), "[unknown]");
}

TEST(WritersFolded, FoldedMergesThreads) {
  Profile p = named_profile({{"main", "run", "std::vector<int, std::allocator<int> >::push_back(int&&)"},
                             {"main", "run", "hot<a&b>"},
                             {"main", "a;b"}});
  p.threads = {{42, "main"}, {43, "bad\xffname\"<"}};
  p.stack_weights = {{{42, 0}, 5}, {{42, 1}, 10}, {{43, 1}, 3}, {{43, 2}, 1}};
  auto f = folded_stacks(p);
  EXPECT_EQ(f["main;run;hot<a&b>"], 13u);
  EXPECT_EQ(f["main;a:b"], 1u) << "';' inside a name would split the frame";
  p.fold_threads = true;
  f = folded_stacks(p);
  EXPECT_EQ(f["main-42;main;run;hot<a&b>"], 10u);
  EXPECT_EQ(f["bad\xffname\"<-43;main;run;hot<a&b>"], 3u)
      << "raw here; write_folded makes the line valid UTF-8";
}

TEST(WritersFolded, InlinedFramesAreFramesOfTheirOwn) {
  Profile p = rich_profile();
  auto f = folded_stacks(p);
  EXPECT_EQ(f["main;run;process(int);helper<int>;std::vector<int, std::allocator<int> >::push_back(int&&)"],
            5u);
  EXPECT_EQ(f["[truncated];JS:*compute /srv/app.js:1:1;libx.so+0x1f0"], 4u);
}

// ---- every output, read back by independent readers ----

TEST(WritersFormats, EveryOutputMatchesTheProfile) { expect_outputs_match(rich_profile()); }

TEST(WritersFormats, ThreadsAtTheRootOfFoldedStacks) {
  Profile p = rich_profile();
  p.fold_threads = true;
  expect_outputs_match(p);
}

TEST(WritersFormats, EmptyProfile) {
  Profile p;
  p.comm = "idle";
  expect_outputs_match(p);
}

TEST(WritersFormats, SamplingAndTracingOffNoCounters) {
  Profile p = rich_profile();
  p.sampling = p.tracing = false;
  p.samples.clear();
  p.stack_weights.clear();
  p.calls.clear();
  p.counters.clear();
  p.func_stats.clear();
  p.slowest_calls.clear();
  expect_outputs_match(p);
}

TEST(WritersFormats, ASampleOfManyTicks) {
  Profile p = rich_profile();
  p.samples = {{7, 3, 0, 1100000000}, {8, 5000, 1, 1200000000}};  // the second is cut at 1000 packets
  expect_outputs_match(p);
}

// Runs `cmd`, its output in *out; its exit status.
int run(const std::string& cmd, std::string* out) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out->append(buf, n);
  return pclose(f);
}

// pprof's own reader, where Go is installed (Debian's golang-go has `go tool
// pprof`): the profile it reads is the one the Python check read.
TEST(WritersFormats, GoToolPprofReadsTheProfile) {
  std::string version;
  if (run("go version", &version) != 0)
    GTEST_SKIP() << "go is not installed (apt-get install golang-go): pprof's own reader not run; "
                    "check_formats.py still reads profile.pb.gz";
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  FILE* f = fopen((d.path + "/profile.pb.gz").c_str(), "w");
  ASSERT_NE(f, nullptr);
  ASSERT_TRUE(write_pprof(rich_profile(), f));
  fclose(f);
  std::string out;
  const std::string env = "HOME=" + d.path + " PPROF_TMPDIR=" + d.path + " ";
  ASSERT_EQ(run(env + "go tool pprof -top -sample_index=samples " + d.path + "/profile.pb.gz", &out), 0)
      << out;
  EXPECT_NE(out.find("Total samples = 32"), std::string::npos) << out;
  EXPECT_NE(out.find("Build ID: 0123456789abcdef0123456789abcdef01234567"), std::string::npos) << out;
  EXPECT_NE(out.find("56.25%  hot"), std::string::npos) << out;
  EXPECT_NE(out.find("helper (inline)"), std::string::npos) << out;
  out.clear();
  ASSERT_EQ(run(env + "go tool pprof -traces " + d.path + "/profile.pb.gz", &out), 0) << out;
  EXPECT_NE(out.find("thread:  main\n       tid:  7\n"), std::string::npos) << out;
}

// The flamegraph's script, run by node against a small stand-in for the
// DOM (where node is installed): it parses, labels boxes with the function
// alone (the source is in the tooltip), and its search matches names and
// source files, counting nested matches once.
constexpr const char* kFlameDriver = R"JS(
const fs = require('fs');
const text = fs.readFileSync(process.argv[2], 'utf8');
const unescape = s => s.replace(/&#(\d+);/g, (m, d) => String.fromCharCode(+d)).replace(/&lt;/g, '<')
    .replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&apos;/g, "'").replace(/&amp;/g, '&');
class El {
  constructor(attrs) { this.attrs = attrs || {}; this.style = {}; this.textContent = ''; this.on = {}; this.kids = {}; }
  getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  removeAttribute(k) { delete this.attrs[k]; }
  addEventListener(t, f) { this.on[t] = f; }
  getElementsByTagName(t) { return this.kids[t] || []; }
}
const gs = [];
const re = /<g class="f" data-o="(\d+)" data-v="(\d+)" data-d="(\d+)"(?: data-s="([^"]*)")?><title>([^<]*)<\/title>/g;
for (let m; (m = re.exec(text));) {
  const g = new El({'data-o': m[1], 'data-v': m[2], 'data-d': m[3]});
  if (m[4] !== undefined) g.attrs['data-s'] = unescape(m[4]);
  const title = new El();
  title.textContent = unescape(m[5]);
  g.kids = {title: [title], rect: [new El()], text: [new El()]};
  gs.push(g);
}
const ids = {search: new El(), reset: new El(), matched: new El()};
const svgRoot = new El({width: '1200'});
svgRoot.getElementsByClassName = () => gs;
global.document = {documentElement: svgRoot, getElementById: id => ids[id], addEventListener: () => {}};
let onload;
global.window = {addEventListener: (t, f) => { onload = f; }};
let term;
global.prompt = () => term;
global.alert = m => { throw new Error(m); };
eval(text.split('<![CDATA[')[1].split(']]>')[0]);
onload();
const out = {labels: gs.map(g => g.kids.text[0].textContent), matched: {}};
for (term of process.argv.slice(3)) { ids.search.on.click(); out.matched[term] = ids.matched.textContent; }
console.log(JSON.stringify(out));
)JS";

TEST(WritersFormats, FlamegraphScriptLabelsAndSearches) {
  std::string version;
  if (run("node --version", &version) != 0)
    GTEST_SKIP() << "node is not installed: the flamegraph's script was not run (check_formats.py still "
                    "reads the SVG and finds the script)";
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  FILE* f = fopen((d.path + "/flamegraph.svg").c_str(), "w");
  FILE* js = fopen((d.path + "/driver.js").c_str(), "w");
  ASSERT_NE(f, nullptr);
  ASSERT_NE(js, nullptr);
  ASSERT_TRUE(write_flamegraph_svg(rich_profile(), f));
  fputs(kFlameDriver, js);
  fclose(f);
  fclose(js);
  std::string out;
  ASSERT_EQ(
      run("node " + d.path + "/driver.js " + d.path + "/flamegraph.svg hot 'hot\\.cc' '^run$' nothing", &out),
      0)
      << out;
  nlohmann::json r = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << out;
  std::vector<std::string> labels = r["labels"];
  EXPECT_NE(std::find(labels.begin(), labels.end(), "hot<a&b>"), labels.end()) << out;
  EXPECT_NE(std::find(labels.begin(), labels.end(), "main"), labels.end()) << out;
  for (const auto& l : labels)
    EXPECT_EQ(l.find(".cc:"), std::string::npos) << "a label with its source: " << l;
  // Shares of the 30 samples drawn (2 of the 32 have no frame): hot<a&b>
  // has 18; run calls run (stack 7), a nested match counted once: 23.
  std::map<std::string, std::string> matched = r["matched"];
  EXPECT_EQ(matched["hot"], "Matched \"hot\": 60.00% of samples") << out;
  EXPECT_EQ(matched["hot\\.cc"], "Matched \"hot\\.cc\": 60.00% of samples") << "by source file: " << out;
  EXPECT_EQ(matched["^run$"], "Matched \"^run$\": 76.67% of samples") << out;
  EXPECT_EQ(matched["nothing"], "Matched \"nothing\": 0.00% of samples") << out;
}

// ---- failures and size ----

TEST(WritersErrors, AWriteErrorIsReported) {
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  const std::string path = d.path + "/read-only";
  FILE* make = fopen(path.c_str(), "w");
  ASSERT_NE(make, nullptr);
  fclose(make);
  const Profile p = rich_profile();
  for (const auto& [name, fn] : kWriters) {
    FILE* f = fopen(path.c_str(), "r");  // every write fails (EBADF)
    ASSERT_NE(f, nullptr);
    EXPECT_FALSE(fn(p, f) && fflush(f) == 0) << name << " did not report the failed write";
    fclose(f);
  }
  FILE* f = fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  EXPECT_FALSE(write_summary(p, d.path, f) && fflush(f) == 0);
  fclose(f);
}

// A long session's timeline: the cost of the two trace formats, printed.
TEST(WritersSize, LargeTimeline) {
  Profile p = rich_profile();
  p.calls.clear();
  p.samples.clear();
  std::mt19937 rng(7);
  constexpr size_t kCalls = 200000, kSamples = 100000;
  for (size_t i = 0; i < kCalls; ++i)
    p.calls.push_back(
        {7 + static_cast<int32_t>(i % 3), static_cast<uint32_t>(i % 3), kS + i * 1000, rng() % 900});
  for (size_t i = 0; i < kSamples; ++i)
    p.samples.push_back({7 + static_cast<int32_t>(i % 4), 1, static_cast<uint32_t>(i % 8), kS + i * 10000});
  TempDir d;
  ASSERT_FALSE(d.path.empty());
  for (const auto& [name, fn] : {std::pair<const char*, Writer>{"trace.json", write_trace_json},
                                 std::pair<const char*, Writer>{"trace.perfetto", write_perfetto}}) {
    const std::string path = d.path + "/" + name;
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(fn(p, f));
    EXPECT_EQ(fclose(f), 0);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    printf("%s: %zu calls and %zu samples in %.0f ms, %.1f MB\n", name, kCalls, kSamples, ms,
           static_cast<double>(std::filesystem::file_size(path)) / 1e6);
    EXPECT_LT(ms, 20000.0) << "generous: a shared, loaded machine";
  }
}

}  // namespace
}  // namespace remora::profile
