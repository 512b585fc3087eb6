// Controller death: a controller (remora_caller, a separate process) is
// SIGKILLed at a random instant while it makes remote calls, 200 times in a
// row. Whatever phase the call was in, the target must go on running
// correctly (its thread restores itself through the frame Remora built on
// its stack): no anomaly, no leaked fd, still alive, and a fresh Target can
// still call into it. Scratch mappings of killed controllers may remain, so
// the mapping count is not checked here.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "remote_helpers.h"

namespace remora::test {
namespace {

using namespace std::chrono_literals;

// Killed controllers per target: 200, or REMORA_DEATH_ROUNDS (the aarch64
// guest runs fewer: tests/aarch64/suites.cmake).
int rounds() {
  const char* e = std::getenv("REMORA_DEATH_ROUNDS");
  return e != nullptr && std::atoi(e) > 0 ? std::atoi(e) : 200;
}
const int kRounds = rounds();
// On a loaded machine a controller's start-up can take ten times its idle
// ~70 ms (the vector target's threads spin on both cores): the rounds stop
// at this budget, after at least kMinRounds, so that the test's length never
// depends on the machine's speed. Each run says how many rounds it made.
constexpr auto kRoundsBudget = std::chrono::seconds(50);
const int kMinRounds = std::min(kRounds, 25);

class ControllerDeath : public IntegrationTest {
 protected:
  // The rounds' budget, the minimum rounds on a loaded machine, and the
  // checks after them.
  long watchdog_seconds() const override { return 110; }

  void run(const std::string& program, std::vector<std::string> target_args = {}) {
    TargetProcess target(program, std::move(target_args));
    target.snapshot();
    // The vector-state target says which register files its threads hold
    // (and which it skipped, and why): the cure path restores each.
    if (program == "remora_target_simd") printf("  register files: %s\n", target.command("features").c_str());
    pid_t pid = target.pid();
    std::mt19937 rng(static_cast<unsigned>(pid));
    std::uniform_int_distribution<int> delay_us(0, 3000);
    int killed_mid_run = 0;
    const auto budget_end = std::chrono::steady_clock::now() + kRoundsBudget;
    for (int round = 0; round < kRounds; ++round) {
      if (round >= kMinRounds && std::chrono::steady_clock::now() > budget_end) {
        printf("  stopped at %d of %d rounds: the %lld s budget is spent (a loaded machine)\n", round,
               kRounds, static_cast<long long>(kRoundsBudget.count()));
        break;
      }
      auto caller = Spawned::start({bin_path("remora_caller"), std::to_string(pid)});
      std::string line = caller->wait_line(after(10s), "\"calling\" from remora_caller");
      ASSERT_EQ(line, "calling") << "round " << round;
      // A random instant, deliberately: this is the point of the test.
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
      caller->kill(SIGKILL);
      auto st = caller->wait_exit(after(10s));
      ASSERT_TRUE(st.has_value()) << "round " << round << ": remora_caller did not die";
      ASSERT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == SIGKILL)
          << "round " << round << ": remora_caller failed before it was killed (status 0x" << std::hex << *st
          << "; its stderr is above)";
      ++killed_mid_run;
      ASSERT_TRUE(alive(pid)) << "round " << round << ": the target died\n" << describe_tasks(pid);
    }
    printf("  %d controllers killed\n", killed_mid_run);

    // No thread may stay traced or stopped.
    auto settled = [&] {
      for (const auto& [tid, s] : task_states(pid))
        if (s == 't' || s == 'T') return false;
      return true;
    };
    EXPECT_TRUE(wait_for(settled, after(5s))) << describe_tasks(pid);

    Report before = target.report();
    EXPECT_EQ(before.anomalies(), 0) << before.raw;
    EXPECT_EQ(before.fds_delta(), 0) << before.raw;
    printf("  maps_delta after %d killed controllers: %lld (not checked)\n", killed_mid_run,
           before.maps_delta());
    if (before.fields.count("epoll_eintr"))
      printf("  epoll_wait EINTRs (tolerated): %lld\n", before.fields.at("epoll_eintr"));
    EXPECT_GE(before.calls(), killed_mid_run) << "each controller made at least one call";

    // A fresh Target still works, and agrees with the target's own count.
    {
      auto t = open_target(pid);
      auto calls = t->call_symbol("", "remora_probe_calls", {});
      ASSERT_TRUE(calls.ok()) << describe(calls.error());
      EXPECT_GE(static_cast<long long>(calls->value), before.calls());
      auto args = probe_args(3, 4);
      auto p = t->call_symbol("", "remora_probe", args);
      ASSERT_TRUE(p.ok()) << describe(p.error());
      EXPECT_EQ(p->value, probe_expected(3, 4));
      auto c = t->close();
      EXPECT_TRUE(c.ok()) << describe(c.error());
    }
    Report after_report = target.report();
    EXPECT_EQ(after_report.anomalies(), 0) << after_report.raw;
    EXPECT_EQ(after_report.fds_delta(), 0) << after_report.raw;
    EXPECT_TRUE(alive(pid));
  }
};

// epoll_wait returns EINTR after any ptrace stop; a controller killed right
// after interrupting that thread cannot prevent it (see target_syscalls.cc).
// Every other system call must still be undisturbed.
TEST_F(ControllerDeath, Syscalls) { run("remora_target_syscalls", {"--tolerate-epoll-eintr"}); }
TEST_F(ControllerDeath, Simd) { run("remora_target_simd"); }

}  // namespace
}  // namespace remora::test
