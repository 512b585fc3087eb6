// Unit tests of the default tool's pure parts: settings and output writers.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "config.h"
#include "profile.h"

// wrappers.c calls this; nothing is recorded in the unit tests.
extern "C" void remora_record_call(uint32_t, uint64_t, uint64_t) {}

namespace remora_tool {
namespace {

bool parse(const std::map<std::string, std::string>& env, Config* c, std::string* err) {
  return parse_config(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      c, err);
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(DefaultToolConfig, Defaults) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({}, &c, &err));
  EXPECT_EQ(c.output_path, "./remora-output");
  EXPECT_EQ(c.hz, 99);
  EXPECT_TRUE(c.sampling);
  EXPECT_TRUE(c.tracing);
  for (const char* f : {"read",
                        "write",
                        "recv",
                        "send",
                        "recvfrom",
                        "sendto",
                        "poll",
                        "epoll_wait",
                        "select",
                        "nanosleep",
                        "clock_nanosleep",
                        "usleep",
                        "sleep",
                        "fsync",
                        "fdatasync",
                        "accept",
                        "connect",
                        "pthread_mutex_lock",
                        "pthread_cond_wait",
                        "pthread_cond_timedwait",
                        "pthread_join",
                        "sem_wait",
                        "waitpid"})
    EXPECT_TRUE(has(c.functions, f)) << f;
  EXPECT_FALSE(has(c.functions, "open")) << "open is opt-in";
}

TEST(DefaultToolConfig, Values) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"REMORA_OUTPUT_PATH", "/tmp/x"},
                     {"REMORA_SAMPLE_HZ", " 1000 "},
                     {"REMORA_SAMPLING", "off"},
                     {"REMORA_TRACING", "yes"},
                     {"REMORA_TRACE_FUNCTIONS", "read, write,,open"}},
                    &c, &err))
      << err;
  EXPECT_EQ(c.output_path, "/tmp/x");
  EXPECT_EQ(c.hz, 1000);
  EXPECT_FALSE(c.sampling);
  EXPECT_EQ(c.functions, (std::vector<std::string>{"read", "write", "open"}));
}

TEST(DefaultToolConfig, EditingTheDefaults) {
  Config c;
  std::string err;
  ASSERT_TRUE(parse({{"REMORA_TRACE_FUNCTIONS", "+open,-read"}}, &c, &err));
  EXPECT_TRUE(has(c.functions, "open"));
  EXPECT_FALSE(has(c.functions, "read"));
  EXPECT_TRUE(has(c.functions, "write"));
  ASSERT_TRUE(parse({{"REMORA_TRACE_FUNCTIONS", "none"}}, &c, &err));
  EXPECT_TRUE(c.functions.empty());
  ASSERT_TRUE(parse({{"REMORA_TRACE_FUNCTIONS", ""}}, &c, &err));
  EXPECT_TRUE(c.functions.empty());
  ASSERT_TRUE(parse({{"REMORA_TRACE_FUNCTIONS", "all"}}, &c, &err));
  EXPECT_EQ(c.functions, supported_functions());
}

TEST(DefaultToolConfig, InvalidValuesNameTheVariable) {
  Config c;
  std::string err;
  for (auto [k, v] : std::map<std::string, std::string>{{"REMORA_SAMPLE_HZ", "0"},
                                                        {"REMORA_SAMPLE_HZ", "99x"},
                                                        {"REMORA_SAMPLING", "2"},
                                                        {"REMORA_TRACING", "maybe"},
                                                        {"REMORA_MAX_EVENTS", "-1"}}) {
    EXPECT_FALSE(parse({{k, v}}, &c, &err)) << k << "=" << v;
    EXPECT_NE(err.find(k), std::string::npos) << err;
  }
}

// U+FFFD, the replacement for each ill-formed sequence, written as "R".
#define R "\xef\xbf\xbd"

// One input, with what json_escape and xml_escape must make of it.
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

TEST(DefaultToolReport, Escaping) {
  for (const auto& c : kEscapeCases) {
    EXPECT_EQ(json_escape(c.in), c.json) << c.why;
    EXPECT_EQ(xml_escape(c.in), c.xml) << c.why;
  }
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("std::map<int, int>::find"), "\"std::map<int, int>::find\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
}

// The test's own strict UTF-8 check, written apart from report.cc's walk:
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

TEST(DefaultToolReport, EscapedRandomBytesAreValidUtf8) {
  for (const auto& s : random_names(5000)) {
    std::vector<char32_t> cps;
    std::string json = json_escape(s);
    ASSERT_TRUE(strict_utf8(json, &cps)) << "json_escape of " << testing::PrintToString(s);
    for (char32_t cp : cps)
      ASSERT_GE(cp, 0x20u) << "a raw control in JSON from " << testing::PrintToString(s);
    cps.clear();
    std::string xml = xml_escape(s);
    ASSERT_TRUE(strict_utf8(xml, &cps)) << "xml_escape of " << testing::PrintToString(s);
    for (char32_t cp : cps)  // XML 1.0's Char, and no literal tab/LF/CR (they are references)
      ASSERT_TRUE(cp >= 0x20 && cp != 0xfffe && cp != 0xffff) << "XML from " << testing::PrintToString(s);
    // Valid input is kept as it is, apart from what the escapes rewrite.
    std::vector<char32_t> in;
    if (strict_utf8(s, &in) && s.find_first_of("\"\\<>&'") == std::string::npos &&
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
// as this tool does), less in XML the characters XML 1.0 forbids.
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

TEST(DefaultToolReport, PythonReadsEscapedRandomBytes) {
  if (system("python3 -c pass") != 0) GTEST_SKIP() << "no python3 on this host: the cross-check needs it";
  char tmpl[] = "/tmp/remora-tool-unit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string d = tmpl;
  struct Cleanup {
    const std::string& dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{d};
  auto hex = [](const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
      char buf[3];
      snprintf(buf, sizeof buf, "%02x", c);
      out += buf;
    }
    return out;
  };
  FILE* data = fopen((d + "/cases.txt").c_str(), "w");
  FILE* script = fopen((d + "/check.py").c_str(), "w");
  ASSERT_NE(data, nullptr);
  ASSERT_NE(script, nullptr);
  for (const auto& s : random_names(3000))
    fprintf(data, "%s,%s,%s\n", hex(s).c_str(), hex(json_escape(s)).c_str(), hex(xml_escape(s)).c_str());
  fputs(kPythonCheck, script);
  fclose(data);
  fclose(script);
  std::string cmd = "python3 " + d + "/check.py " + d + "/cases.txt";
  EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
}

Profile sample_profile() {
  Profile p;
  p.pid = 42;
  p.comm = "demo<&>";
  p.session = 3;
  p.start_ns = 1000000;
  p.end_ns = 3000000;
  p.hz = 99;
  p.sampling = p.tracing = true;
  p.threads = {{42, "main"}, {43, "bad\xffname\"<"}};
  p.fn_names = {"read", "write"};
  p.stacks = {{"main", "run", "std::vector<int, std::allocator<int> >::push_back(int&&)"},
              {"main", "run", "hot<a&b>"},
              {"main", "a;b"}};
  p.stack_weights = {{{42, 0}, 5}, {{42, 1}, 10}, {{43, 1}, 3}, {{43, 2}, 1}};
  p.samples = {{42, 1, 1, 1500000}, {43, 1, 0, 1600000}};
  p.calls = {{42, 0, 1100000, 500000}, {43, 1, 1200000, 1000}};
  p.slowest_calls = p.calls;
  p.func_stats = {{"read", 10, 5000000, 500000}, {"write", 1, 1000, 1000}};
  p.warnings = {"a warning"};
  return p;
}

TEST(DefaultToolReport, FoldedMergesThreads) {
  Profile p = sample_profile();
  auto f = folded_stacks(p);
  EXPECT_EQ(f["main;run;hot<a&b>"], 13u);
  EXPECT_EQ(f["main;a:b"], 1u) << "';' inside a name would split the frame";
  p.fold_threads = true;
  f = folded_stacks(p);
  EXPECT_EQ(f["main-42;main;run;hot<a&b>"], 10u);
}

TEST(DefaultToolReport, FilesAreValid) {
  Profile p = sample_profile();
  char tmpl[] = "/tmp/remora-tool-unit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string d = tmpl;
  auto write = [&](const char* name, bool (*fn)(const Profile&, FILE*)) {
    FILE* f = fopen((d + "/" + name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    EXPECT_TRUE(fn(p, f));
    fclose(f);
  };
  write("trace.json", write_trace_json);
  write("folded.txt", write_folded);
  write("flamegraph.svg", write_flamegraph_svg);
  write("stats.csv", write_stats_csv);
  FILE* f = fopen((d + "/summary.txt").c_str(), "w");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(write_summary(p, d, f));
  fclose(f);
  std::string cmd =
      "python3 " REMORA_CHECK_SCRIPT " " + d + " --expect-calls read,write --expect-frame 'hot<a&b>'";
  EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
  std::filesystem::remove_all(d);
}

TEST(DefaultToolReport, EmptyProfileStillValid) {
  Profile p;
  p.comm = "idle";
  char tmpl[] = "/tmp/remora-tool-unit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string d = tmpl;
  for (auto [name, fn] :
       std::map<std::string, bool (*)(const Profile&, FILE*)>{{"trace.json", write_trace_json},
                                                              {"folded.txt", write_folded},
                                                              {"flamegraph.svg", write_flamegraph_svg},
                                                              {"stats.csv", write_stats_csv}}) {
    FILE* f = fopen((d + "/" + name).c_str(), "w");
    ASSERT_NE(f, nullptr);
    EXPECT_TRUE(fn(p, f));
    fclose(f);
  }
  FILE* f = fopen((d + "/summary.txt").c_str(), "w");
  EXPECT_TRUE(write_summary(p, d, f));
  fclose(f);
  std::string cmd = "python3 " REMORA_CHECK_SCRIPT " " + d;
  EXPECT_EQ(system(cmd.c_str()), 0);
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace remora_tool
