// Remote calls on threads that stand where a call is easy to get wrong
// (tests/targets/target_faults.cc):
//  * a thread that faults on purpose in a tight loop, as a JVM thread does
//    at each armed safepoint poll: every call must return its value (a
//    SIGSEGV of the thread's own, left pending by the interrupt, is not the
//    call's fault), and every one of the thread's faults must still reach
//    its handler (none foreign);
//  * a thread whose stack pointer sits 256 bytes above a PROT_NONE page:
//    the call, a call with byte arguments and a system call all succeed
//    (on a stack of the scratch's), the guard page is still PROT_NONE, and
//    the thread, woken afterwards, finds its read's result and stack
//    pointer as they were.
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "harness.h"
#include "remote_helpers.h"

namespace remora::test {
namespace {

using remote::CallArg;
using remote::CallOptions;

class Faults : public IntegrationTest {
 protected:
  long watchdog_seconds() const override { return 120; }
};

// The permissions of the mapping that starts at `start` ("---p"), or "" if none does.
std::string perms_at(pid_t pid, uint64_t start) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "%llx-", static_cast<unsigned long long>(start));
  std::string line;
  while (std::getline(maps, line))
    if (line.rfind(prefix, 0) == 0) {
      std::istringstream in(line);
      std::string range, perms;
      in >> range >> perms;
      return perms;
    }
  return "";
}

TEST_F(Faults, AThreadsOwnPendingFaultIsNotTheCallsFault) {
  TargetProcess target("remora_target_faults");
  const pid_t tid = target.tids().at("fault");
  const long long faults_before = target.report().get("faults");
  long probes = 0;
  {
    auto t = open_target(target.pid());
    auto fn = t->find_symbol("", "remora_probe");
    ASSERT_TRUE(fn.ok()) << describe(fn.error());
    CallOptions opts;
    opts.tid = tid;
    int failures = 0;
    // Each call interrupts the loop somewhere; a few in every hundred land
    // between a fault and its delivery.
    for (int i = 0; i < 600 && failures < 5; ++i) {
      auto r = t->call(*fn, probe_args(i, 7), opts);
      if (!r.ok()) {
        ADD_FAILURE() << "call " << i << ": " << describe(r.error());
        ++failures;
        continue;
      }
      ++probes;
      EXPECT_EQ(r->value, probe_expected(i, 7)) << "call " << i;
    }
  }
  ASSERT_TRUE(alive(target.pid()));
  auto report = target.report();
  EXPECT_EQ(report.anomalies(), 0) << report.raw;
  EXPECT_EQ(report.calls(), probes) << report.raw;
  EXPECT_EQ(report.get("foreign_faults"), 0) << report.raw;
  EXPECT_GT(report.get("faults"), faults_before) << "the thread stopped faulting: " << report.raw;
}

TEST_F(Faults, ACallOnAThreadRightAboveAGuardPageRunsOnTheScratchsStack) {
  TargetProcess target("remora_target_faults");
  const pid_t tid = target.tids().at("guard");
  auto layout = parse_fields(target.command("layout"));
  const auto guard = static_cast<uint64_t>(layout.at("guard"));
  ASSERT_EQ(perms_at(target.pid(), guard), "---p");
  target.snapshot();
  long probes = 0, strings = 0;
  {
    auto t = open_target(target.pid());
    CallOptions opts;
    opts.tid = tid;
    // The first call: the scratch is made on another thread, the call then
    // runs on this one.
    auto fn = t->find_symbol("", "remora_probe");
    ASSERT_TRUE(fn.ok()) << describe(fn.error());
    for (int i = 0; i < 50; ++i) {
      auto r = t->call(*fn, probe_args(i, 11), opts);
      ASSERT_TRUE(r.ok()) << "call " << i << ": " << describe(r.error());
      EXPECT_EQ(r->value, probe_expected(i, 11));
      EXPECT_EQ(r->tid, tid);
      ++probes;
    }
    // Byte arguments travel with the frame.
    for (size_t n : {size_t{26}, size_t{5000}}) {
      const std::string s = check_string(n);
      CallArg args[] = {CallArg::string(s)};
      auto r = t->call_symbol("", "remora_probe_string", args, opts);
      ASSERT_TRUE(r.ok()) << describe(r.error());
      EXPECT_EQ(r->value, s.size());
      ++strings;
    }
    // A system call too.
    auto r = t->syscall(SYS_getpid, {}, opts);
    ASSERT_TRUE(r.ok()) << describe(r.error());
    EXPECT_EQ(static_cast<pid_t>(r->value), target.pid());
  }
  EXPECT_EQ(perms_at(target.pid(), guard), "---p") << "the guard page lost its protection";
  EXPECT_EQ(target.command("wake"), "woke");
  ASSERT_TRUE(alive(target.pid()));
  auto report = target.report();
  EXPECT_EQ(report.anomalies(), 0) << report.raw;
  EXPECT_EQ(report.maps_delta(), 0) << report.raw;
  EXPECT_EQ(report.fds_delta(), 0) << report.raw;
  EXPECT_EQ(report.calls(), probes) << report.raw;
  EXPECT_EQ(report.strings(), strings) << report.raw;
}

}  // namespace
}  // namespace remora::test
