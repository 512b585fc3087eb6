// Unit tests of the default tool's pure parts: its settings and the
// program's name. (The outputs are rendered by the controller now: their
// tests are in tests/profile.)
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
#include "program_name.h"

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
