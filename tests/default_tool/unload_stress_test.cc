// The unload under load: the conditions in which an unload used to kill its
// target (a thread preempted inside the tool's sampling handler or a call
// wrapper while the tool was unmapped). Three hostile targets at once, each
// cycled by a thread of its own through attach (the default tool, sampling
// at 4 kHz and tracing), a short session and a detach with unload, beside
// two processes that keep both CPUs busy:
//   - remora_target_signals, under a storm of SIGUSR1, SIGUSR2 and queued
//     SIGRTMIN from this test (handlers of its own, threads in read and
//     nanosleep, a spinner);
//   - remora_target_syscalls, whose waiter thread forks without a pause,
//     and whose other threads sit in every kind of blocking call;
//   - remora_target_malloc, threads hammering malloc and free.
// Every cycle's outcome is counted and printed. What must hold: no target
// dies or sees anything wrong (its own report: no anomaly, every real-time
// signal received exactly once), no cycle fails, and an unload that cannot
// be proven (a thread still inside) says so and is finished by a later one,
// never a gamble. The cycle count: REMORA_UNLOAD_STRESS_CYCLES (per target;
// default 70, 210 in all).
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "attach_helpers.h"

#ifndef REMORA_DEFAULT_TOOL
#error "the unload stress test needs REMORA_DEFAULT_TOOL (libremora-tool.so)"
#endif

namespace remora::test {
namespace {

using namespace std::chrono_literals;

int cycles_per_target() {
  const char* v = std::getenv("REMORA_UNLOAD_STRESS_CYCLES");
  const int n = v ? std::atoi(v) : 0;
  return n > 0 ? n : 70;
}

// A process that spins until killed (with this test, at the latest).
class CpuHog {
 public:
  CpuHog() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      volatile unsigned long n = 0;
      for (;;) n = n + 1;
    }
  }
  ~CpuHog() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  CpuHog(const CpuHog&) = delete;
  CpuHog& operator=(const CpuHog&) = delete;

 private:
  pid_t pid_ = -1;
};

// What the cycles of one target came to.
struct Tally {
  int unloaded = 0;                   // attached, detached, the agent and the tool gone
  int finished_later = 0;             // the unload was refused (named) and a later one finished it
  int kept = 0;                       // the tool pinned itself (a thread blocked inside a wrapper), named
  std::vector<std::string> refusals;  // the reasons named, as the user read them
  std::vector<std::string> failures;  // anything else: a defect
};

std::string text(const Error& e) { return std::string(errc_name(e.code())) + ": " + e.to_string(); }

// One target's cycles. Each: attach, a session of 0-20 ms, detach with
// unload; an unload refused is tried again (it finishes what the last one
// began) until it succeeds or 10 tries passed.
void run_cycles(pid_t pid, int cycles, const std::string& out_dir, unsigned seed, Tally* t) {
  std::mt19937 rng(seed);
  for (int i = 0; i < cycles; ++i) {
    Controller c;
    AttachOptions opts;
    opts.tools = {REMORA_DEFAULT_TOOL};
    opts.env = {{"REMORA_OUTPUT_PATH", out_dir}, {"REMORA_SAMPLE_HZ", "4000"}, {"REMORA_TRACING", "1"}};
    opts.agent_path = REMORA_AGENT_PATH;
    auto r = c.attach(pid, opts);
    if (!r) {
      t->failures.push_back("cycle " + std::to_string(i) + ": attach: " + text(r.error()));
      return;
    }
    // The session's length, varied so that the unload meets the handler and
    // the wrappers at every phase; nothing waits on it.
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 21));
    bool done = false;
    for (int attempt = 0; attempt < 10 && !done; ++attempt) {
      auto u = c.detach(pid, attach::DetachOptions{.unload = true});
      if (u && u->unloaded) {
        done = true;
        if (!u->kept_tools.empty()) ++t->kept;
        if (attempt == 0)
          ++t->unloaded;
        else
          ++t->finished_later;
      } else if (!u && u.error().code() == Errc::kTimedOut &&
                 u.error().to_string().find("stay loaded") != std::string::npos) {
        t->refusals.push_back(u.error().to_string());
      } else {
        t->failures.push_back("cycle " + std::to_string(i) +
                              ": detach --unload: " + (u ? std::string("not unloaded") : text(u.error())) +
                              "\nthe target's threads:\n" + describe_tasks(pid));
        if (std::getenv("REMORA_STRESS_GDB")) {
          std::string cmd = "gdb -p " + std::to_string(pid) +
                            " -batch -ex 'thread apply all bt' > /tmp/stress_gdb_" + std::to_string(pid) +
                            ".txt 2>&1";
          (void)std::system(cmd.c_str());
        }
        return;
      }
    }
    if (!done) {
      t->failures.push_back("cycle " + std::to_string(i) + ": still not unloaded after 10 tries");
      return;
    }
    if (agent_mapped(pid)) {
      t->failures.push_back("cycle " + std::to_string(i) + ": unloaded, but the agent is still mapped");
      return;
    }
    note_progress();
  }
}

class UnloadStress : public IntegrationTest {};

TEST_F(UnloadStress, HostileTargetsUnderLoadSurviveHundredsOfUnloads) {
  char dir[] = "/tmp/remora-unload-stress-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const int cycles = cycles_per_target();
  CpuHog hogs[2];
  const char* programs[] = {"remora_target_signals", "remora_target_syscalls", "remora_target_malloc"};
  std::vector<std::unique_ptr<TargetProcess>> targets;
  for (const char* p : programs) {
    targets.push_back(std::make_unique<TargetProcess>(p));
    targets.back()->snapshot();
  }
  Tally tallies[3];
  long rt_sent = 0;
  long long rt_sum = 0;
  {
    SignalStorm storm(targets[0]->pid(), 1000000);
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i)
      threads.emplace_back(run_cycles, targets[i]->pid(), cycles, std::string(dir), 1234u + i, &tallies[i]);
    for (auto& th : threads) th.join();
    storm.stop();
    rt_sent = storm.rt_sent();
    rt_sum = storm.rt_sum();
    EXPECT_EQ(storm.errors(), 0);
  }
  std::printf("[unload-stress] %d cycles per target, 3 targets, 2 CPU hogs\n", cycles);
  std::printf("[unload-stress] %-24s %9s %15s %5s %9s %9s\n", "target", "unloaded", "finished later", "kept",
              "refusals", "failures");
  for (int i = 0; i < 3; ++i) {
    const Tally& t = tallies[i];
    std::printf("[unload-stress] %-24s %9d %15d %5d %9zu %9zu\n", programs[i], t.unloaded, t.finished_later,
                t.kept, t.refusals.size(), t.failures.size());
    for (const auto& why : t.refusals) std::printf("[unload-stress]   refused, named: %s\n", why.c_str());
    for (const auto& f : t.failures) ADD_FAILURE() << programs[i] << ": " << f;
    EXPECT_EQ(t.unloaded + t.finished_later, cycles) << programs[i];
  }
  std::fflush(stdout);
  // What the targets saw: alive, every signal of the storm received once,
  // their own computation right.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(alive(targets[i]->pid())) << programs[i] << " died";
  }
  std::map<std::string, long long> got;
  EXPECT_TRUE(wait_for(
      [&] {
        got = parse_fields(targets[0]->command("signals"));
        return got["rt"] >= rt_sent;
      },
      after(10s)))
      << "real-time signals lost: sent " << rt_sent << ", received " << got["rt"];
  Report sig = targets[0]->report();
  EXPECT_EQ(sig.get("rt"), rt_sent) << sig.raw;
  EXPECT_EQ(sig.get("rt_sum"), rt_sum) << sig.raw;
  EXPECT_EQ(sig.get("rt_bad"), 0) << sig.raw;
  for (int i = 0; i < 3; ++i) {
    Report rep = i == 0 ? sig : targets[i]->report();
    EXPECT_EQ(rep.anomalies(), 0) << programs[i] << ": " << rep.raw;
  }
  std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(std::system(rm.c_str()), 0);
}

}  // namespace
}  // namespace remora::test
