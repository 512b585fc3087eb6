// Unit tests of the default tool's pure parts: settings, output writers and
// names (perf maps, the summary's short names, the program's name).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "config.h"
#include "profile.h"
#include "symbolize.h"

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

// ---- names ----

TEST(DefaultToolPerfMap, ParsesLines) {
  struct Case {
    const char* line;
    bool ok;
    uint64_t start, size;
    const char* name;
  };
  const Case cases[] = {
      {"7f00 10 foo", true, 0x7f00, 0x10, "foo"},
      {"0x7f00 0x10 foo", true, 0x7f00, 0x10, "foo"},
      {"0X7F00 0XaB Foo", true, 0x7f00, 0xab, "Foo"},
      {"1d33c670aba6 2a JS:~work /tmp/a b.js:1:29", true, 0x1d33c670aba6, 0x2a, "JS:~work /tmp/a b.js:1:29"},
      {"7f00\t10\tname\twith tab", true, 0x7f00, 0x10, "name\twith tab"},
      {"  7f00  10   foo  \r", true, 0x7f00, 0x10, "foo"},
      {"ffffffffffffff00 ff top", true, 0xffffffffffffff00, 0xff, "top"},
      {"ffffffffffffff00 100 past the end", false, 0, 0, nullptr},
      {"12345678901234567 1 seventeen digits", false, 0, 0, nullptr},
      {"7f00 0 empty", false, 0, 0, nullptr},
      {"7f00 10", false, 0, 0, nullptr},
      {"7f00 10 ", false, 0, 0, nullptr},
      {"7f00 10 \r", false, 0, 0, nullptr},
      {"7f00 foo", false, 0, 0, nullptr},
      {"7f00foo 10 x", false, 0, 0, nullptr},
      {"0x 10 foo", false, 0, 0, nullptr},
      {"zz 10 foo", false, 0, 0, nullptr},
      {"-10 10 foo", false, 0, 0, nullptr},
      {"", false, 0, 0, nullptr},
  };
  for (const Case& c : cases) {
    PerfMapLine l;
    ASSERT_EQ(parse_perf_map_line(c.line, &l), c.ok) << "'" << c.line << "'";
    if (!c.ok) continue;
    EXPECT_EQ(l.start, c.start) << c.line;
    EXPECT_EQ(l.size, c.size) << c.line;
    EXPECT_EQ(l.name, c.name) << c.line;
  }
}

// The last entry for an address wins, whatever the chunks the map arrives
// in: the map is fed split at every offset.
TEST(DefaultToolPerfMap, LastEntryWinsAcrossAnySplit) {
  const std::string map =
      "1000 100 first\n"
      "garbage line\n"
      "1080 10 moved here\r\n"
      "2000 10 other\n"
      "1000 40 replaced\n"
      "3000 1 last, without newline";
  const std::vector<uint64_t> pcs = {0x1000, 0x103f, 0x1040, 0x1085, 0x1090, 0x10ff,
                                     0x1100, 0x2005, 0x3000, 0x3001, 0xfff,  0x1085};
  for (size_t cut = 0; cut <= map.size(); ++cut) {
    PerfMapNames names(pcs);
    names.feed(std::string_view(map).substr(0, cut));
    names.feed(std::string_view(map).substr(cut));
    names.finish();
    auto name = [&](uint64_t pc) {
      const std::string* n = names.find(pc);
      return n ? *n : std::string("-");
    };
    SCOPED_TRACE("split at " + std::to_string(cut));
    EXPECT_EQ(name(0x1000), "replaced");
    EXPECT_EQ(name(0x103f), "replaced");
    EXPECT_EQ(name(0x1040), "first");
    EXPECT_EQ(name(0x1085), "moved here");
    EXPECT_EQ(name(0x1090), "first");
    EXPECT_EQ(name(0x10ff), "first");
    EXPECT_EQ(name(0x1100), "-") << "the end is exclusive";
    EXPECT_EQ(name(0x2005), "other");
    EXPECT_EQ(name(0x3000), "last, without newline");
    EXPECT_EQ(name(0x3001), "-");
    EXPECT_EQ(name(0xfff), "-");
    EXPECT_EQ(name(0x4242), "-") << "not one of the PCs asked for";
    EXPECT_EQ(names.lines(), 6u);
    EXPECT_EQ(names.malformed(), 1u);
    EXPECT_EQ(names.named(), 8u);
  }
}

TEST(DefaultToolPerfMap, OverlongLinesAreSkipped) {
  PerfMapNames names({0x10, 0x20});
  std::string huge = "10 1 " + std::string(PerfMapNames::kMaxLine, 'x') + "\n";
  for (size_t i = 0; i < huge.size(); i += 1000) names.feed(std::string_view(huge).substr(i, 1000));
  names.feed("20 1 ");
  names.feed(std::string(2000, 'y'));  // longer than kMaxName, within kMaxLine
  names.feed("\n");
  names.finish();
  EXPECT_EQ(names.find(0x10), nullptr);
  ASSERT_NE(names.find(0x20), nullptr);
  EXPECT_EQ(*names.find(0x20), std::string(PerfMapNames::kMaxName, 'y'));
  EXPECT_EQ(names.lines(), 2u);
  EXPECT_EQ(names.malformed(), 1u);
}

// A temporary directory, removed however the test ends.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/remora-tool-unit-XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// A map bigger than the cap: only its end is read (the newest entries),
// from a line boundary, and the reader says so.
TEST(DefaultToolPerfMap, ReadsOnlyTheEndOfAHugeMap) {
  TempDir tmp;
  const std::string& d = tmp.path;
  std::string path = d + "/perf-1.map";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  // 0x1000 is named "old" early, then renamed "new" by an entry at the end.
  fprintf(f, "1000 10 old\n");
  for (int i = 0; i < 10000; ++i) fprintf(f, "%x 1 filler %d\n", 0x100000 + i, i);
  fprintf(f, "2000 10 early\n");
  for (int i = 0; i < 10000; ++i) fprintf(f, "%x 1 filler %d\n", 0x200000 + i, i);
  fprintf(f, "1000 10 new\n3000 10 newest\n");
  ASSERT_EQ(fclose(f), 0);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);

  PerfMapNames names({0x1000, 0x2000, 0x3000, 0x100000, 0x200000 + 9999});
  const size_t cap = 64 * 1024;
  ASSERT_GT(static_cast<size_t>(st.st_size), cap);
  PerfMapRead r = read_perf_map(path, cap, &names);
  EXPECT_TRUE(r.found);
  EXPECT_TRUE(r.capped);
  EXPECT_EQ(r.file_size, static_cast<uint64_t>(st.st_size));
  EXPECT_TRUE(r.problem.empty()) << r.problem;
  ASSERT_NE(names.find(0x1000), nullptr);
  EXPECT_EQ(*names.find(0x1000), "new");
  ASSERT_NE(names.find(0x3000), nullptr);
  EXPECT_EQ(*names.find(0x3000), "newest");
  ASSERT_NE(names.find(0x200000 + 9999), nullptr);
  EXPECT_EQ(names.find(0x2000), nullptr) << "before the last 64 KiB";
  EXPECT_EQ(names.find(0x100000), nullptr) << "before the last 64 KiB";
  EXPECT_EQ(names.malformed(), 0u) << "reading starts at a line boundary";
  EXPECT_LE(names.lines(), cap / 10);

  // The whole file when it fits.
  PerfMapNames all({0x2000, 0x100000});
  r = read_perf_map(path, 1 << 20, &all);
  EXPECT_TRUE(r.found);
  EXPECT_FALSE(r.capped);
  ASSERT_NE(all.find(0x2000), nullptr);
  EXPECT_EQ(*all.find(0x2000), "early");
  EXPECT_EQ(all.malformed(), 0u);

  // A cut that falls right after a newline loses no line.
  std::string exact = d + "/perf-2.map";
  f = fopen(exact.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fprintf(f, "1000 10 dropped\n3000 10 kept\n");  // 16 + 13 bytes
  ASSERT_EQ(fclose(f), 0);
  PerfMapNames tail({0x1000, 0x3000});
  r = read_perf_map(exact, 13, &tail);
  EXPECT_TRUE(r.capped);
  EXPECT_EQ(tail.find(0x1000), nullptr);
  ASSERT_NE(tail.find(0x3000), nullptr);
  EXPECT_EQ(*tail.find(0x3000), "kept");
}

TEST(DefaultToolPerfMap, AbsentOrNotARegularFile) {
  TempDir tmp;
  const std::string& d = tmp.path;
  PerfMapNames names({0x1000});
  PerfMapRead r = read_perf_map(d + "/perf-none.map", kMaxPerfMapBytes, &names);
  EXPECT_FALSE(r.found);
  EXPECT_TRUE(r.problem.empty()) << "an absent map is not a problem: " << r.problem;
  // A FIFO nobody writes: refused at once, never a blocked detach (the
  // test's own deadline is ctest's TIMEOUT).
  std::string fifo = d + "/perf-fifo.map";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  r = read_perf_map(fifo, kMaxPerfMapBytes, &names);
  EXPECT_FALSE(r.found);
  EXPECT_NE(r.problem.find("not a regular file"), std::string::npos) << r.problem;
  r = read_perf_map(d, kMaxPerfMapBytes, &names);
  EXPECT_FALSE(r.found);
  EXPECT_NE(r.problem.find("not a regular file"), std::string::npos) << r.problem;
}

// A map of 100 MB with the real cap: what the detach costs the target.
TEST(DefaultToolPerfMap, HundredMegabyteMapIsBounded) {
  TempDir tmp;
  const std::string& d = tmp.path;
  std::string path = d + "/perf-big.map";
  FILE* f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::vector<uint64_t> pcs;
  char line[128];
  uint64_t bytes = 0;
  for (uint64_t i = 0; bytes < (100u << 20); ++i) {
    uint64_t start = 0x7f0000000000 + i * 0x40;
    int n = snprintf(line, sizeof line, "%" PRIx64 " 40 JS:*function_%" PRIu64 " /srv/app/file.js:1:1\n",
                     start, i);
    fwrite(line, 1, static_cast<size_t>(n), f);
    bytes += static_cast<uint64_t>(n);
    if (i % 1000 == 0) pcs.push_back(start + 8);
  }
  ASSERT_EQ(fclose(f), 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  PerfMapNames names(pcs);
  PerfMapRead r = read_perf_map(path, kMaxPerfMapBytes, &names);
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  double ms =
      static_cast<double>(t1.tv_sec - t0.tv_sec) * 1e3 + static_cast<double>(t1.tv_nsec - t0.tv_nsec) / 1e6;
  EXPECT_TRUE(r.capped);
  EXPECT_LE(names.lines() * 40, static_cast<uint64_t>(kMaxPerfMapBytes)) << "read no more than the cap";
  EXPECT_GT(names.named(), pcs.size() / 4);
  EXPECT_LT(names.named(), pcs.size() / 2) << "the first 68 MB were not read";
  printf("100 MiB perf map, %zu PCs: %.1f ms of CPU, %zu named, %" PRIu64 " lines read\n", pcs.size(), ms,
         names.named(), names.lines());
  EXPECT_LT(ms, 2000.0) << "generous: a shared, loaded machine";
}

TEST(DefaultToolSummary, CollapsesTemplateArguments) {
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

TEST(DefaultToolSummary, ShortNamesInTheSummaryFullNamesInTheFiles) {
  Profile p;
  p.comm = "prog";
  p.sampling = true;
  const std::string push =
      "std::vector<std::pair<int, std::string>>::push_back(std::pair<int, std::string> const&)";
  const std::string f_int = "void process<std::vector<int>>(int)";
  const std::string f_long = "void process<std::vector<long>>(int)";
  p.stacks = {{"main", push}, {"main", f_int}, {"main", f_long}};
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

TEST(DefaultToolProgramName, TheNameItWasStartedBy) {
  // The files of a fake system: each path -> whether it is the running file.
  const std::map<std::string, bool> files = {
      {"/usr/bin/redis-server", true},  // a symlink to redis-check-rdb
      {"/usr/bin/redis-check-rdb", true},
      {"/usr/local/bin/redis-server", false},  // another redis, earlier on $PATH
      {"/opt/app/bin/remora-started-through-a-link", true},
      {"/usr/bin/python3", true},
      {"./run", true},
      {"remora-started-through-a-link", true},  // relative: in the current directory
  };
  auto is_exe = [&](const std::string& path) {
    auto it = files.find(path);
    return it != files.end() && it->second;
  };
  struct Case {
    std::string cmdline, comm, exe, path_env, want, why;
  };
  const std::string nul(1, '\0');
  const Case cases[] = {
      {"/usr/bin/redis-server" + nul + "/etc/redis.conf" + nul, "redis-check-rdb", "/usr/bin/redis-check-rdb",
       "/bin", "redis-server", "a symlink, comm from the file (execveat, Linux >= 6.14)"},
      {"redis-server" + nul + "--port" + nul, "redis-server", "/usr/bin/redis-check-rdb",
       "/usr/local/bin:/usr/bin", "redis-server", "through $PATH, past an entry that is another file"},
      {"/usr/bin/redis-server 127.0.0.1:6379" + nul, "redis-check-rdb", "/usr/bin/redis-check-rdb", "",
       "redis-server", "argv[0] rewritten by setproctitle"},
      {"/opt/app/bin/remora-started-through-a-link" + nul, "remora-started-", "/opt/app/bin/real", "",
       "remora-started-through-a-link", "longer than comm's 15 bytes"},
      {"/opt/app/bin/remora-started-through-a-link" + nul, "3", "/opt/app/bin/real", "",
       "remora-started-through-a-link", "execveat before Linux 6.14 named it after the fd"},
      {"/usr/bin/python3" + nul + "./my-script.py" + nul, "my-script.py", "/usr/bin/python3.11", "",
       "my-script.py", "a #! script: the kernel names it after the script"},
      {"/usr/bin/python3" + nul + "-c" + nul, "python3", "/usr/bin/python3.11", "", "python3",
       "an interpreter started by its link"},
      {"/usr/bin/redis-server" + nul, "worker", "/usr/bin/redis-check-rdb", "", "worker",
       "renamed itself (PR_SET_NAME)"},
      {"bogus-name" + nul, "remora-started-", "/opt/app/bin/real", "/usr/bin", "remora-started-",
       "argv[0] names no file: comm"},
      {"/usr/local/bin/redis-server" + nul, "redis-check-rdb", "/usr/bin/redis-check-rdb", "",
       "redis-check-rdb", "argv[0] is another file: comm"},
      {"remora-started-through-a-link" + nul, "remora-started-", "/home/u/real", "/usr/bin::/bin",
       "remora-started-through-a-link", "an empty $PATH entry is the current directory"},
      {"./run" + nul, "run", "/home/u/run (deleted)", "", "run", "a binary deleted since it started"},
      {"", "", "/usr/bin/redis-check-rdb (deleted)", "", "redis-check-rdb", "no argv[0], no comm: the exe"},
      {"", "", "", "", "process", "nothing known"},
  };
  for (const Case& c : cases)
    EXPECT_EQ(choose_program_name(c.cmdline, c.comm, c.exe, c.path_env, is_exe), c.want) << c.why;
}

TEST(DefaultToolProgramName, ThisProcess) {
  // Started by ctest as .../default_tool_unit_test: the file's own name.
  EXPECT_EQ(program_name(), "default_tool_unit_test");
}

}  // namespace
}  // namespace remora_tool
