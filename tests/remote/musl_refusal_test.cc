// A musl process is refused when the session opens, at once, with a message
// naming musl's loader and what to do, mapped to exit 5 by the CLI (both
// `remora call` and `remora attach`). Needs a dynamically linked musl
// program: built with musl-gcc (Debian package musl-tools) when CMake found
// it; skipped, saying so, otherwise.
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <string>

#include "harness.h"
#include "remote_helpers.h"

namespace remora::test {
namespace {

using namespace std::chrono_literals;

// musl's dynamic loader on this architecture: the name the refusal quotes.
#if defined(__aarch64__)
constexpr const char* kMuslLoader = "ld-musl-aarch64.so.1";
#else
constexpr const char* kMuslLoader = "ld-musl-x86_64.so.1";
#endif

class MuslRefusal : public IntegrationTest {
 protected:
  void SetUp() override {
    IntegrationTest::SetUp();
    struct stat st {};
    if (::stat(bin_path("remora_target_musl").c_str(), &st) != 0)
      GTEST_SKIP() << "no musl test program: musl-gcc was not found when the build was configured "
                      "(apt-get install musl-tools, then reconfigure)";
    target_ = Spawned::start({bin_path("remora_target_musl")});
    line_ = target_->wait_line(after(10s), "\"ready\" from remora_target_musl");
  }
  std::unique_ptr<Spawned> target_;
  std::string line_;
};

TEST_F(MuslRefusal, OpenRefusesAtOnce) {
  ASSERT_EQ(line_.rfind("ready ", 0), 0u) << line_;
  const pid_t pid = target_->pid();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = remote::Target::open(pid);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok()) << "a musl process was opened";
  EXPECT_EQ(r.error().code(), Errc::kNotSupported) << describe(r.error());
  const std::string msg = r.error().to_string();
  EXPECT_NE(msg.find(std::string("uses musl libc (") + kMuslLoader + ")"), std::string::npos) << msg;
  EXPECT_NE(msg.find("attach to a glibc process"), std::string::npos) << msg;
  EXPECT_LT(took, 1s) << "refused, but not at once";
  // Untouched: not traced, not stopped, still running.
  EXPECT_TRUE(alive(pid));
  for (const auto& [tid, s] : task_states(pid))
    EXPECT_TRUE(s == 'S' || s == 'R') << "thread " << tid << ": " << s;
}

// The CLI's exit code for it: 5, as for a static binary.
TEST_F(MuslRefusal, CliExitsFive) {
  ASSERT_EQ(line_.rfind("ready ", 0), 0u) << line_;
  const std::string pid = std::to_string(target_->pid());
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{bin_path("remora"), "call", "--pid", pid, "getpid"},
        std::vector<std::string>{bin_path("remora"), "attach", "--pid", pid}}) {
    auto cli = Spawned::start(argv);
    std::string err;
    while (auto l = cli->try_wait_line(after(10s))) err += *l + "\n";
    auto st = cli->wait_exit(after(10s));
    ASSERT_TRUE(st.has_value()) << argv[1] << " did not exit";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 5) << argv[1] << ": status 0x" << std::hex << *st;
  }
  EXPECT_TRUE(alive(target_->pid()));
}

}  // namespace
}  // namespace remora::test
