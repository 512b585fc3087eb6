// Attach/detach cycles against every hostile target of tests/targets: one
// Controller, the agent loaded by the first attach and reused after that.
// Afterwards the target reports no anomaly and no leaked fd, the tool saw
// exactly one tool_attach/tool_detach pair per cycle, and the agent's
// counters agree. The stopped target stays stopped throughout.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>

#include "attach_helpers.h"

namespace remora::test {
namespace {

// Cycles per target; REMORA_ATTACH_CYCLES overrides (the count the task
// asks for is 300 per target).
int cycles() {
  if (const char* e = getenv("REMORA_ATTACH_CYCLES")) return std::max(1, atoi(e));
  return 300;
}

class HostileCycles : public IntegrationTest {
 protected:
  long watchdog_seconds() const override { return 170; }

  // Runs n attach/detach cycles with one Controller (the first loads the
  // agent unless !loads_agent). Returns false, after failing the test, on
  // the first failed attach or detach.
  bool run_cycles(pid_t pid, int n, bool loads_agent = true) {
    Controller c;
    auto opts = options_for(log_);
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      auto r = c.attach(pid, opts);
      if (!r.ok()) {
        ADD_FAILURE() << "cycle " << i << ": attach: " << describe(r.error()) << "\n" << describe_tasks(pid);
        return false;
      }
      if (r->agent_loaded_now != (loads_agent && i == 0))
        ADD_FAILURE() << "cycle " << i << ": agent_loaded_now is wrong";
      auto d = c.detach(pid);
      if (!d.ok()) {
        ADD_FAILURE() << "cycle " << i << ": detach: " << describe(d.error()) << "\n" << describe_tasks(pid);
        return false;
      }
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    printf("  %d attach/detach cycles in %lld ms (%.2f ms per cycle)\n", n, static_cast<long long>(ms),
           static_cast<double>(ms) / n);
    return true;
  }

  void expect_hooks(pid_t pid, int n) {
    auto lines = log_.lines();
    ASSERT_EQ(lines.size(), 3u + 2u * static_cast<size_t>(n))
        << "configure, configure_attach, tool_init, then " << n << " attach/detach pairs";
    const pid_t listener = status_or_throw(pid).listener_tid;
    for (int i = 0; i < n; ++i) {
      const HookLine& a = lines[3 + 2 * static_cast<size_t>(i)];
      const HookLine& d = lines[4 + 2 * static_cast<size_t>(i)];
      const auto session = static_cast<unsigned long long>(i) + 1;
      if (a.what() != "a:tool_attach" || d.what() != "a:tool_detach" || a.session != session ||
          d.session != session || a.tid != listener || d.tid != listener) {
        ADD_FAILURE() << "cycle " << i << " logged \"" << a.raw << "\" / \"" << d.raw << "\"";
        return;
      }
    }
    auto st = status_or_throw(pid);
    EXPECT_FALSE(st.attached);
    EXPECT_EQ(st.sessions, static_cast<uint64_t>(n));
    EXPECT_EQ(st.detaches, static_cast<uint64_t>(n));
  }

  // The agent adds mappings (itself, the tool) and a thread, so maps_delta is
  // not checked; fds must come back to the snapshot's count.
  static void expect_clean(const Report& r) {
    EXPECT_EQ(r.anomalies(), 0) << r.raw;
    EXPECT_EQ(r.fds_delta(), 0) << r.raw;
  }

  void run_plain(const std::string& program) {
    const int own_fds = count_fds(getpid());
    {
      TargetProcess target(program);
      target.snapshot();
      ASSERT_TRUE(run_cycles(target.pid(), cycles()));
      ASSERT_TRUE(alive(target.pid()));
      expect_hooks(target.pid(), cycles());
      expect_clean(target.report());
    }
    EXPECT_EQ(count_fds(getpid()), own_fds) << "the test process (the controller) leaked fds";
  }

  HookLog log_;
};

TEST_F(HostileCycles, Syscalls) { run_plain("remora_target_syscalls"); }
TEST_F(HostileCycles, Spin) { run_plain("remora_target_spin"); }
TEST_F(HostileCycles, Threads64) { run_plain("remora_target_threads64"); }
TEST_F(HostileCycles, Malloc) { run_plain("remora_target_malloc"); }
TEST_F(HostileCycles, Simd) { run_plain("remora_target_simd"); }

// A storm of signals runs during the cycles: every queued real-time signal
// arrives exactly once.
TEST_F(HostileCycles, Signals) {
  TargetProcess target("remora_target_signals");
  target.snapshot();
  long rt_sent = 0;
  long long rt_sum = 0;
  {
    SignalStorm storm(target.pid());
    bool ok = run_cycles(target.pid(), cycles());
    storm.stop();
    ASSERT_TRUE(ok);
    rt_sent = storm.rt_sent();
    rt_sum = storm.rt_sum();
    EXPECT_EQ(storm.errors(), 0);
  }
  ASSERT_GT(rt_sent, 0);
  std::map<std::string, long long> got;
  EXPECT_TRUE(wait_for(
      [&] {
        got = parse_fields(target.command("signals"));
        return got["rt"] >= rt_sent;
      },
      after(10s)))
      << "real-time signals lost: sent " << rt_sent << ", received " << got["rt"];
  expect_hooks(target.pid(), cycles());
  Report r = target.report();
  EXPECT_EQ(r.get("rt"), rt_sent) << r.raw;
  EXPECT_EQ(r.get("rt_sum"), rt_sum) << r.raw;
  EXPECT_EQ(r.get("rt_bad"), 0) << r.raw;
  expect_clean(r);
}

// The agent is loaded while the target runs (one attach/detach), then the
// target is stopped with SIGSTOP for the cycles, which run on the agent's
// listener alone: every thread is in State T afterwards; after SIGCONT the
// target reports nothing wrong.
TEST_F(HostileCycles, StoppedAfterTheAgentIsLoaded) {
  TargetProcess target("remora_target_stopped");
  const pid_t pid = target.pid();
  target.snapshot();
  ASSERT_TRUE(run_cycles(pid, 1));
  auto all_stopped = [&] {
    auto st = task_states(pid);
    if (st.empty()) return false;
    for (const auto& [tid, s] : st)
      if (s != 'T') return false;
    return true;
  };
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(wait_for(all_stopped, after(5s))) << describe_tasks(pid);
  const size_t threads = task_states(pid).size();

  const int n = cycles() - 1;
  bool ok = run_cycles(pid, n, /*loads_agent=*/false);
  EXPECT_TRUE(wait_for(all_stopped, after(2s))) << "no longer stopped after the cycles:\n"
                                                << describe_tasks(pid);
  EXPECT_EQ(status_state(pid).substr(0, 1), "T") << status_state(pid);
  EXPECT_EQ(task_states(pid).size(), threads) << describe_tasks(pid);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  expect_clean(target.report());
  ASSERT_TRUE(ok);
  expect_hooks(pid, n + 1);
}

// Stopped with SIGSTOP before the first attach: every thread (the agent's
// included) is in State T after the cycles; after SIGCONT the target reports
// nothing wrong.
TEST_F(HostileCycles, Stopped) {
  TargetProcess target("remora_target_stopped");
  const pid_t pid = target.pid();
  target.snapshot();
  auto all_stopped = [&] {
    auto st = task_states(pid);
    if (st.empty()) return false;
    for (const auto& [tid, s] : st)
      if (s != 'T') return false;
    return true;
  };
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(wait_for(all_stopped, after(5s))) << describe_tasks(pid);
  const size_t threads_before = task_states(pid).size();

  bool ok = run_cycles(pid, cycles());
  EXPECT_TRUE(wait_for(all_stopped, after(2s))) << "no longer stopped after the cycles:\n"
                                                << describe_tasks(pid);
  EXPECT_EQ(status_state(pid).substr(0, 1), "T") << status_state(pid);
  EXPECT_EQ(task_states(pid).size(), threads_before + 1)
      << "expected one more thread (the agent's listener)\n"
      << describe_tasks(pid);
  ASSERT_EQ(kill(pid, SIGCONT), 0);
  // Even when the cycles failed: what did the attempt leave behind once the
  // process runs again?
  target.process().send("report");
  std::string why;
  auto line = target.process().try_wait_line(after(10s), &why);
  if (!line) {
    auto st = target.process().wait_exit(after(5s));
    FAIL() << "the target did not report after SIGCONT (" << why << "); wait status "
           << (st ? (WIFSIGNALED(*st) ? "killed by signal " + std::to_string(WTERMSIG(*st))
                                      : "exit " + std::to_string(WEXITSTATUS(*st)))
                  : std::string("none"));
  }
  expect_clean(parse_report(*line));
  ASSERT_TRUE(ok);
  expect_hooks(pid, cycles());
}

}  // namespace
}  // namespace remora::test
