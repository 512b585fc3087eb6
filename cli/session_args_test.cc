#include "cli/session_args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace remora::cli {
namespace {

using namespace std::chrono_literals;

TEST(ToolList, Splits) {
  auto one = split_tool_list("/a/libx.so");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (std::vector<std::string>{"/a/libx.so"}));
  auto two = split_tool_list("./a.so:/b/c.so");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<std::string>{"./a.so", "/b/c.so"}));
  for (const char* bad : {"", ":", "a.so:", ":a.so", "a.so::b.so"}) {
    auto r = split_tool_list(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), Errc::kInvalidArgument) << bad;
  }
}

TEST(EnvAssignment, Table) {
  auto a = parse_env_assignment("REMORA_SAMPLE_HZ=199");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "REMORA_SAMPLE_HZ");
  EXPECT_EQ(a->second, "199");
  auto empty = parse_env_assignment("_X=");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->second, "");
  auto eq = parse_env_assignment("A=b=c");
  ASSERT_TRUE(eq.ok());
  EXPECT_EQ(eq->second, "b=c");
  for (const char* bad : {"NOVALUE", "=x", "1A=x", "A-B=x", "A B=x"}) {
    auto r = parse_env_assignment(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), Errc::kInvalidArgument) << bad;
  }
}

TEST(EnvList, LastWins) {
  std::vector<std::pair<std::string, std::string>> env;
  set_env(env, "A", "1");
  set_env(env, "B", "2");
  set_env(env, "A", "3");
  ASSERT_EQ(env.size(), 2u);
  ASSERT_NE(find_env(env, "A"), nullptr);
  EXPECT_EQ(*find_env(env, "A"), "3");
  EXPECT_EQ(find_env(env, "C"), nullptr);
}

TEST(AbsolutePath, Table) {
  EXPECT_EQ(absolute_path("out", "/srv/app"), "/srv/app/out");
  EXPECT_EQ(absolute_path("./out/", "/srv/app"), "/srv/app/out");
  EXPECT_EQ(absolute_path("../out", "/srv/app"), "/srv/out");
  EXPECT_EQ(absolute_path("/abs//x/./y", "/ignored"), "/abs/x/y");
  EXPECT_EQ(absolute_path("..", "/"), "/");
  EXPECT_EQ(absolute_path(".", "/srv"), "/srv");
}

TEST(OutputDirPid, Table) {
  EXPECT_EQ(output_dir_pid("remora-sample-s-4242-s1-20240131-235959"), 4242);
  EXPECT_EQ(output_dir_pid("app-7-s12-20240131-235959-3"), 7);
  EXPECT_EQ(output_dir_pid("my-app-2-99-s1-20240131-235959"), 99);  // digits in comm
  EXPECT_EQ(output_dir_pid("app-4242-latest"), 0);
  EXPECT_EQ(output_dir_pid("4242-s1-20240131-235959"), 0);  // no comm
  EXPECT_EQ(output_dir_pid("app-x-s1-20240131-235959"), 0);
  EXPECT_EQ(output_dir_pid("app-42-s1-2024013-235959"), 0);
  EXPECT_EQ(output_dir_pid("app-42-s1-20240131-235959-x"), 0);
  EXPECT_EQ(output_dir_pid("."), 0);
  EXPECT_EQ(output_dir_pid(""), 0);
}

TEST(ForwardedEnvironment, RemoraAndRocpVariablesOnly) {
  const char* envp[] = {"PATH=/usr/bin",
                        "REMORA_OUTPUT_PATH=/srv/out",
                        "ROCPROFILER_OUTPUT=x=y",
                        "REMORA_EMPTY=",
                        "XREMORA_NOT=1",
                        "REMORA_NOEQUALS",
                        "remora_lower=1",
                        "REMORA_OUTPUT_PATH=/srv/again",
                        nullptr};
  auto env = forwarded_environment(envp);
  ASSERT_EQ(env.size(), 3u);
  EXPECT_EQ(*find_env(env, "REMORA_OUTPUT_PATH"), "/srv/again") << "the last one wins, as in a shell";
  EXPECT_EQ(*find_env(env, "ROCPROFILER_OUTPUT"), "x=y");
  EXPECT_EQ(*find_env(env, "REMORA_EMPTY"), "");
  EXPECT_EQ(find_env(env, "PATH"), nullptr);
  EXPECT_EQ(forwarded_environment(nullptr).size(), 0u);
  // -e on top wins.
  set_env(env, "REMORA_OUTPUT_PATH", "/from/-e");
  EXPECT_EQ(*find_env(env, "REMORA_OUTPUT_PATH"), "/from/-e");
}

TEST(FormatElapsed, Table) {
  EXPECT_EQ(format_elapsed(0ms), "0.0 s");
  EXPECT_EQ(format_elapsed(1250ms), "1.2 s");
  EXPECT_EQ(format_elapsed(12'900ms), "12 s");
  EXPECT_EQ(format_elapsed(185'000ms), "3 min 05 s");
  EXPECT_EQ(format_elapsed(7'380'000ms), "2 h 03 min");
}

TEST(ShellQuote, Table) {
  EXPECT_EQ(shell_quote("./server"), "./server");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(count_noun(1, "process", "processes"), "1 process");
  EXPECT_EQ(count_noun(3, "process", "processes"), "3 processes");
}

}  // namespace
}  // namespace remora::cli
