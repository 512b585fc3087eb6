#include "cli/container.h"

#include <gtest/gtest.h>

namespace remora::cli {
namespace {

TEST(ContainerInspect, PodmansAndDockersAnswers) {
  struct Case {
    const char* runtime;
    const char* out;
    pid_t pid;
    const char* name;
  } cases[] = {
      {"podman", "4242 running 0123456789abcdef0123 web\n", 4242, "web"},
      {"docker", "77 running fedcba9876543210 /db\n", 77, "db"},  // docker's names start with '/'
  };
  for (const auto& c : cases) {
    auto t = parse_inspect(c.runtime, "x", c.out);
    ASSERT_TRUE(t.ok()) << c.out << ": " << t.error().to_string();
    EXPECT_EQ(t->pid, c.pid);
    EXPECT_EQ(t->name, c.name);
    EXPECT_EQ(t->runtime, c.runtime);
  }
}

TEST(ContainerInspect, AStoppedContainerSaysHowToStartIt) {
  for (const char* out : {"0 exited 0123 web\n", "0 created 0123 web\n", "12 paused 0123 web\n"}) {
    auto t = parse_inspect("podman", "web", out);
    ASSERT_FALSE(t.ok()) << out;
    EXPECT_EQ(t.error().code(), Errc::kNoSuchProcess) << out;
    EXPECT_NE(t.error().message().find("podman start web"), std::string::npos) << t.error().message();
  }
}

TEST(ContainerInspect, AnswersThatAreNoInspectionAreRefused) {
  for (const char* out : {"", "hello\n", "-1 running a b\n", "4242 running\n", "99999999999 running a b\n"}) {
    auto t = parse_inspect("podman", "web", out);
    ASSERT_FALSE(t.ok()) << out;
    EXPECT_EQ(t.error().code(), Errc::kParse) << out;
  }
}

}  // namespace
}  // namespace remora::cli
