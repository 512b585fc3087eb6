// The target programs on their own, without the engine: left alone (or
// stopped and continued, or under a signal storm) each must report no
// anomaly and unchanged fd and mapping counts. A false positive in a target
// would make every engine suite fail for the wrong reason; this suite tells
// the two apart. It also exercises the harness itself.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "harness.h"

namespace remora::test {
namespace {

using namespace std::chrono_literals;

class Targets : public IntegrationTest {};

void expect_idle_clean(TargetProcess& target) {
  Report r = target.report();
  EXPECT_EQ(r.anomalies(), 0) << r.raw;
  EXPECT_EQ(r.fds_delta(), 0) << r.raw;
  EXPECT_EQ(r.maps_delta(), 0) << r.raw;
  EXPECT_EQ(r.calls(), 0) << r.raw;
  EXPECT_EQ(r.strings(), 0) << r.raw;
  // The harness sees the same process from outside.
  EXPECT_GT(count_fds(target.pid()), 2);
  EXPECT_GT(count_maps(target.pid()), 5);
}

TEST_F(Targets, IdleSyscalls) {
  TargetProcess t("remora_target_syscalls");
  auto tids = t.tids();
  for (const char* role : {"main", "read", "nanosleep", "epoll", "futex", "accept", "waitpid", "poll"})
    EXPECT_TRUE(tids.count(role)) << role;
  t.snapshot();
  // Several rounds of every worker (the report waits for progress): the
  // accept/connect and fork/waitpid churn must not show in the counts.
  for (int i = 0; i < 3; ++i) expect_idle_clean(t);
}
TEST_F(Targets, IdleSpin) {
  TargetProcess t("remora_target_spin");
#if defined(__aarch64__)
  // The threads that hold x0-x30 across nanosleep and ppoll.
  auto tids = t.tids();
  EXPECT_TRUE(tids.count("hold-sleep") && tids.count("hold-ppoll"));
#endif
  t.snapshot();
  expect_idle_clean(t);
}
TEST_F(Targets, IdleThreads64) {
  TargetProcess t("remora_target_threads64");
  EXPECT_EQ(t.tids().size(), 65u);
  t.snapshot();
  expect_idle_clean(t);
}
TEST_F(Targets, IdleMalloc) {
  TargetProcess t("remora_target_malloc");
  t.snapshot();
  for (int i = 0; i < 3; ++i) expect_idle_clean(t);
}
TEST_F(Targets, IdleSimd) {
  TargetProcess t("remora_target_simd");
  // What it holds and what it skipped (and why), for the log.
  const std::string features = t.command("features");
  printf("  register files: %s\n", features.c_str());
  EXPECT_EQ(features.rfind("error", 0), std::string::npos) << features;
#if defined(__aarch64__)
  EXPECT_NE(features.find("fpsimd"), std::string::npos) << features;
  // With SVE, the blocking SVE threads run: the start-up measurement found
  // this platform's system calls either zeroing or keeping the SVE bits.
  if (features.find(" sve ") != std::string::npos) {
    EXPECT_EQ(features.find("skipped:sve-syscall"), std::string::npos) << features;
  }
#endif
  t.snapshot();
  expect_idle_clean(t);
}
TEST_F(Targets, IdleErrorsStaticTwins) {
  for (const char* p : {"remora_target_errors", "remora_target_static", "remora_target_twins"}) {
    SCOPED_TRACE(p);
    TargetProcess t(p);
    t.snapshot();
    expect_idle_clean(t);
  }
}

// Stop and continue: no anomaly from the stop itself (the stopped suite
// relies on this), and the harness sees State T meanwhile.
TEST_F(Targets, StopContinue) {
  TargetProcess t("remora_target_stopped");
  size_t threads = t.tids().size();
  t.snapshot();
  ASSERT_EQ(kill(t.pid(), SIGSTOP), 0);
  auto all_stopped = [&] {
    auto st = task_states(t.pid());
    if (st.size() != threads) return false;
    for (const auto& [tid, s] : st)
      if (s != 'T') return false;
    return true;
  };
  ASSERT_TRUE(wait_for(all_stopped, after(5s))) << describe_tasks(t.pid());
  EXPECT_EQ(status_state(t.pid()).substr(0, 1), "T");
  ASSERT_EQ(kill(t.pid(), SIGCONT), 0);
  expect_idle_clean(t);
}

// The storm alone: every queued real-time signal arrives exactly once.
TEST_F(Targets, SignalStorm) {
  TargetProcess t("remora_target_signals");
  t.snapshot();
  long rt_sent = 0;
  long long rt_sum = 0;
  {
    SignalStorm storm(t.pid(), 5000);
    ASSERT_TRUE(wait_for([&] { return storm.rt_sent() >= 5000; }, after(30s)));
    storm.stop();
    rt_sent = storm.rt_sent();
    rt_sum = storm.rt_sum();
    EXPECT_EQ(storm.errors(), 0);
  }
  std::map<std::string, long long> got;
  EXPECT_TRUE(wait_for(
      [&] {
        got = parse_fields(t.command("signals"));
        return got["rt"] >= rt_sent;
      },
      after(10s)));
  Report r = t.report();
  EXPECT_EQ(r.get("rt"), rt_sent) << r.raw;
  EXPECT_EQ(r.get("rt_sum"), rt_sum) << r.raw;
  EXPECT_GE(r.get("usr1"), 1) << r.raw;
  EXPECT_GE(r.get("usr2"), 1) << r.raw;
  expect_idle_clean(t);
}

// Harness basics: a child that dies is reaped, a missing line times out
// with a clear error, and the destructor kills the whole process group.
TEST_F(Targets, HarnessCleansUp) {
  pid_t pid;
  {
    TargetProcess t("remora_target_syscalls");
    pid = t.pid();
    auto tids = t.tids();
    EXPECT_EQ(tids.at("main"), pid);
    EXPECT_THROW(t.process().wait_line(after(50ms)), HarnessError);
    t.process().kill_group(SIGSTOP);  // even a stopped group is cleaned up
  }
  EXPECT_FALSE(alive(pid));
  EXPECT_THROW(Spawned::start({bin_path("no_such_program")}), HarnessError);
}

}  // namespace
}  // namespace remora::test
