// Unit tests of the default tool's pure parts: settings and output writers.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

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

TEST(DefaultToolReport, Escaping) {
  EXPECT_EQ(json_escape("a\"b\\c\n\x01"), "a\\\"b\\\\c\\n\\u0001");
  EXPECT_EQ(json_escape("\xff"), "\xef\xbf\xbd") << "invalid UTF-8 is replaced";
  EXPECT_EQ(json_escape("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(xml_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field("std::map<int, int>::find"), "\"std::map<int, int>::find\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
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
