// Every error a user can meet, one test each: the Errc is the documented one
// and the message (with its contexts, as the user sees it) says what went
// wrong and names what the user needs (the pid, the tracer, the rule, the
// library). After errors raised inside a call (timeout, fault), the target
// must still be alive, undisturbed, and answer calls.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "remote_helpers.h"

namespace remora::test {
namespace {

using namespace std::chrono_literals;
using remote::CallArg;
using remote::CallOptions;
using remote::Target;

template <typename T>
::testing::AssertionResult fails_with(const Result<T>& r, Errc want) {
  if (r.ok()) return ::testing::AssertionFailure() << "succeeded; expected " << errc_name(want);
  if (r.error().code() != want)
    return ::testing::AssertionFailure() << "expected " << errc_name(want) << ", got " << describe(r.error());
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult mentions(const Error& e, const std::string& what) {
  if (contains_icase(e.to_string(), what)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message does not mention \"" << what << "\": " << e.to_string();
}

// A forked child of the test process, SIGKILLed and reaped on scope exit.
struct ChildGuard {
  pid_t pid = -1;
  bool reaped = false;
  ~ChildGuard() {
    if (pid > 0 && !reaped) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  void reap() {
    waitpid(pid, nullptr, 0);
    reaped = true;
  }
};

// Reads from `fd` until EOF, `max` bytes or the deadline.
std::string read_all(int fd, Deadline deadline, size_t max = 1 << 20) {
  std::string out;
  while (out.size() < max) {
    pollfd p{fd, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    int rc = poll(&p, 1, static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) break;
    char buf[1024];
    ssize_t n = read(fd, buf, std::min(sizeof(buf), max - out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Calls remora_probe through a fresh Target and closes it.
void expect_probe_works(pid_t pid, long* probes) {
  auto t = open_target(pid);
  auto args = probe_args(6, 9);
  auto r = t->call_symbol("", "remora_probe", args);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  EXPECT_EQ(r->value, probe_expected(6, 9));
  ++*probes;
  auto c = t->close();
  EXPECT_TRUE(c.ok()) << describe(c.error());
}

// Forks a helper that PTRACE_SEIZEs `target` and returns the helper's errno
// for it. The helper then holds the target until `release_fd` becomes
// readable (or for good, with -1) and exits, which lets the target go.
int start_helper_tracer(pid_t target, ChildGuard* tracer, int release_fd) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) throw HarnessError("pipe2: " + std::string(strerror(errno)));
  tracer->pid = fork();
  if (tracer->pid < 0) throw HarnessError("fork: " + std::string(strerror(errno)));
  if (tracer->pid == 0) {
    int rc = ptrace(PTRACE_SEIZE, target, nullptr, nullptr) == 0 ? 0 : errno;
    (void)!write(report[1], &rc, sizeof(rc));
    if (release_fd < 0)
      for (;;) pause();
    pollfd p{release_fd, POLLIN, 0};
    (void)poll(&p, 1, 10'000);
    _exit(0);
  }
  close(report[1]);
  std::string got = read_all(report[0], after(10s), sizeof(int));
  close(report[0]);
  if (got.size() != sizeof(int)) throw HarnessError("the tracer helper did not report");
  int err = -1;
  memcpy(&err, got.data(), sizeof(int));
  return err;
}

class Errors : public IntegrationTest {};

TEST_F(Errors, NoSuchProcess) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the pid is free
  auto r = Target::open(child);
  ASSERT_TRUE(fails_with(r, Errc::kNoSuchProcess));
  EXPECT_TRUE(mentions(r.error(), std::to_string(child)));
}

TEST_F(Errors, OwnProcess) {
  auto r = Target::open(getpid());
  ASSERT_TRUE(fails_with(r, Errc::kOwnProcess));
  EXPECT_TRUE(mentions(r.error(), std::to_string(getpid())));
}

TEST_F(Errors, Zombie) {
  ChildGuard child;
  child.pid = fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) _exit(0);
  ASSERT_TRUE(wait_for([&] { return process_state(child.pid) == 'Z'; }, after(5s)));
  auto r = Target::open(child.pid);
  ASSERT_TRUE(fails_with(r, Errc::kZombie));
  EXPECT_TRUE(mentions(r.error(), std::to_string(child.pid)));
  EXPECT_TRUE(mentions(r.error(), "zombie"));
}

TEST_F(Errors, KernelThread) {
  auto kt = find_kernel_thread();
  if (!kt) GTEST_SKIP() << "no kernel thread visible (pid namespace)";
  auto r = Target::open(*kt);
  ASSERT_TRUE(fails_with(r, Errc::kKernelThread));
  EXPECT_TRUE(mentions(r.error(), std::to_string(*kt)));
  EXPECT_TRUE(mentions(r.error(), "kernel"));
}

// open may succeed on a static executable; a call must not.
TEST_F(Errors, StaticBinary) {
  TargetProcess target("remora_target_static");
  target.snapshot();
  auto t = Target::open(target.pid());
  if (!t.ok()) {
    ASSERT_TRUE(fails_with(t, Errc::kStaticBinary));
    EXPECT_TRUE(mentions(t.error(), "static"));
  } else {
    auto args = probe_args(1, 2);
    auto r = (*t)->call_symbol("", "remora_probe", args);
    ASSERT_TRUE(fails_with(r, Errc::kStaticBinary));
    EXPECT_TRUE(mentions(r.error(), "static"));
    auto c = (*t)->close();
    EXPECT_TRUE(c.ok()) << describe(c.error());
    t.value().reset();
  }
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
  EXPECT_EQ(rep.maps_delta(), 0) << rep.raw;
}

// Another process holds the target with PTRACE_SEIZE: the message names it.
TEST_F(Errors, TracedByOther) {
  TargetProcess target("remora_target_errors");
  ChildGuard tracer;
  const int seize_errno = start_helper_tracer(target.pid(), &tracer, -1);
  ASSERT_EQ(seize_errno, 0) << "helper PTRACE_SEIZE: " << strerror(seize_errno);

  auto r = Target::open(target.pid());
  ASSERT_TRUE(fails_with(r, Errc::kTracedByOther));
  EXPECT_TRUE(mentions(r.error(), std::to_string(tracer.pid))) << "the tracer's pid";

  // Once the other tracer is gone, the target is ours again.
  kill(tracer.pid, SIGKILL);
  tracer.reap();
  long probes = 0;
  expect_probe_works(target.pid(), &probes);
}

// A tracer that holds the target only for a moment (another controller's
// call) is waited out, not reported: the open and the call succeed once it
// lets go. Only a tracer that stays past the grace is kTracedByOther.
TEST_F(Errors, APassingTracerIsWaitedOut) {
  TargetProcess target("remora_target_errors");
  int release[2];
  ASSERT_EQ(pipe2(release, O_CLOEXEC), 0);
  ChildGuard tracer;
  const int seize_errno = start_helper_tracer(target.pid(), &tracer, release[0]);
  close(release[0]);
  ASSERT_EQ(seize_errno, 0) << "helper PTRACE_SEIZE: " << strerror(seize_errno);

  std::atomic<pid_t> opener_tid{0};
  Result<std::unique_ptr<Target>> opened = Error(Errc::kInternal, "not run");
  std::thread opener([&] {
    opener_tid = static_cast<pid_t>(gettid());
    opened = Target::open(target.pid());
  });
  // Let go only once the open is waiting for the tracer (its thread asleep).
  const bool waiting = wait_for(
      [&] {
        const pid_t tid = opener_tid.load();
        if (tid == 0) return false;
        auto states = task_states(getpid());
        auto it = states.find(tid);
        return it != states.end() && it->second == 'S';
      },
      after(5s));
  (void)!write(release[1], "x", 1);
  close(release[1]);
  tracer.reap();
  opener.join();
  EXPECT_TRUE(waiting) << "the open never waited for the tracer to let go";
  ASSERT_TRUE(opened.ok()) << describe(opened.error());
  auto args = probe_args(6, 9);
  auto r = (*opened)->call_symbol("", "remora_probe", args);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  EXPECT_EQ(r->value, probe_expected(6, 9));
  EXPECT_TRUE((*opened)->close().ok());
}

// An unprivileged user may not trace a root process: the uid rule refuses.
TEST_F(Errors, PtraceDenied) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to drop to uid 65534)";
  TargetProcess target("remora_target_errors");
  int pipefd[2];
  ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
  ChildGuard child;
  child.pid = fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) {
    // The only thread of the child: safe to use the engine after fork.
    std::string out;
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0) {
      out = "setup " + std::string(strerror(errno));
    } else {
      auto r = Target::open(target.pid());
      if (r.ok())
        out = "ok";
      else
        out = std::to_string(static_cast<int>(r.error().code())) + " " + r.error().to_string();
    }
    ssize_t ignored = write(pipefd[1], out.data(), out.size());
    (void)ignored;
    _exit(0);
  }
  close(pipefd[1]);
  std::string got = read_all(pipefd[0], after(20s));
  close(pipefd[0]);
  child.reap();
  ASSERT_FALSE(got.empty()) << "the unprivileged child did not report";
  ASSERT_NE(got.rfind("setup", 0), 0u) << got;
  ASSERT_NE(got, "ok") << "uid 65534 could open a root process";
  auto sp = got.find(' ');
  int code = std::stoi(got.substr(0, sp));
  std::string message = got.substr(sp + 1);
  EXPECT_EQ(code, static_cast<int>(Errc::kPtraceDenied)) << message;
  EXPECT_TRUE(contains_icase(message, "uid")) << "message does not mention the uid rule: " << message;
  EXPECT_TRUE(contains_icase(message, std::to_string(target.pid()))) << message;
}

TEST_F(Errors, LibraryNotMapped) {
  TargetProcess target("remora_target_errors");
  auto t = open_target(target.pid());
  auto r = t->find_symbol("libnotthere.so", "remora_probe");
  ASSERT_TRUE(fails_with(r, Errc::kLibraryNotMapped));
  EXPECT_TRUE(mentions(r.error(), "libnotthere.so"));
  auto c = t->call_symbol("libnotthere.so", "remora_probe", {});
  EXPECT_TRUE(fails_with(c, Errc::kLibraryNotMapped));
}

TEST_F(Errors, AmbiguousLibrary) {
  TargetProcess target("remora_target_twins");
  auto t = open_target(target.pid());
  auto r = t->find_symbol("libremora_twin", "remora_twin_value");
  ASSERT_TRUE(fails_with(r, Errc::kAmbiguousLibrary));
  EXPECT_TRUE(mentions(r.error(), "libremora_twin_a")) << "the candidates are named";
  EXPECT_TRUE(mentions(r.error(), "libremora_twin_b")) << "the candidates are named";
  // The exact names resolve, to different functions.
  for (char which : {'a', 'b'}) {
    std::string lib = std::string("libremora_twin_") + which + ".so";
    auto v = t->call_symbol(lib, "remora_twin_value", {});
    ASSERT_TRUE(v.ok()) << lib << ": " << describe(v.error());
    EXPECT_EQ(v->value, static_cast<uint64_t>(which)) << lib;
  }
  auto c = t->close();
  EXPECT_TRUE(c.ok()) << describe(c.error());
}

TEST_F(Errors, SymbolNotFound) {
  TargetProcess target("remora_target_errors");
  auto t = open_target(target.pid());
  auto r = t->find_symbol("", "remora_no_such_symbol");
  ASSERT_TRUE(fails_with(r, Errc::kSymbolNotFound));
  EXPECT_TRUE(mentions(r.error(), "remora_no_such_symbol"));
  auto r2 = t->find_symbol("libc.so.6", "remora_no_such_symbol");
  ASSERT_TRUE(fails_with(r2, Errc::kSymbolNotFound));
  EXPECT_TRUE(mentions(r2.error(), "libc"));
}

// A named thread that is not one of the target's must be refused, never used.
TEST_F(Errors, ForeignTid) {
  TargetProcess target("remora_target_errors");
  auto t = open_target(target.pid());
  CallOptions opts;
  opts.tid = getpid();  // a thread of another process (ours)
  auto args = probe_args(1, 2);
  auto r = t->call_symbol("", "remora_probe", args, opts);
  ASSERT_TRUE(fails_with(r, Errc::kNoSuchProcess));
  EXPECT_TRUE(mentions(r.error(), std::to_string(getpid())));
}

TEST_F(Errors, TimedOut) {
  TargetProcess target("remora_target_errors");
  target.snapshot();
  long probes = 0;
  {
    auto t = open_target(target.pid());
    CallOptions opts;
    opts.timeout = 300ms;
    auto t0 = Clock::now();
    auto r = t->call_symbol("", "remora_block", {}, opts);
    auto dt = Clock::now() - t0;
    ASSERT_TRUE(fails_with(r, Errc::kTimedOut));
    EXPECT_TRUE(contains_icase(r.error().to_string(), "time") ||
                contains_icase(r.error().to_string(), "deadline"))
        << r.error().to_string();
    EXPECT_GE(dt, 300ms) << "gave up before the deadline";
    EXPECT_LT(dt, 5s) << "the deadline was not honoured";
    // The same session still works.
    auto args = probe_args(2, 3);
    auto p = t->call_symbol("", "remora_probe", args);
    ASSERT_TRUE(p.ok()) << describe(p.error());
    EXPECT_EQ(p->value, probe_expected(2, 3));
    ++probes;
    auto c = t->close();
    EXPECT_TRUE(c.ok()) << describe(c.error());
  }
  expect_probe_works(target.pid(), &probes);
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
  EXPECT_EQ(rep.maps_delta(), 0) << rep.raw;
  EXPECT_EQ(rep.calls(), probes) << rep.raw;
}

TEST_F(Errors, Fault) {
  TargetProcess target("remora_target_errors");
  target.snapshot();
  long probes = 0;
  {
    auto t = open_target(target.pid());
    auto r = t->call_symbol("", "remora_crash", {});
    ASSERT_TRUE(fails_with(r, Errc::kFault));
    std::string msg = r.error().to_string();
    EXPECT_NE(msg.find("SIGSEGV"), std::string::npos) << msg;
    static const std::regex kAddrZero(R"((^|[^0-9a-fA-Fx])0x0+([^0-9a-fA-F]|$)|address (0|\(nil\)|NULL)\b)");
    EXPECT_TRUE(std::regex_search(msg, kAddrZero)) << "fault address 0 not in: " << msg;
    EXPECT_TRUE(alive(target.pid()));
    auto args = probe_args(4, 5);
    auto p = t->call_symbol("", "remora_probe", args);
    ASSERT_TRUE(p.ok()) << describe(p.error());
    EXPECT_EQ(p->value, probe_expected(4, 5));
    ++probes;
    auto c = t->close();
    EXPECT_TRUE(c.ok()) << describe(c.error());
  }
  expect_probe_works(target.pid(), &probes);
  ASSERT_TRUE(alive(target.pid()));
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
  EXPECT_EQ(rep.maps_delta(), 0) << rep.raw;
  EXPECT_EQ(rep.calls(), probes) << rep.raw;
}

TEST_F(Errors, TargetExited) {
  TargetProcess target("remora_target_errors");
  auto t = open_target(target.pid());
  std::vector<CallArg> args{CallArg::integer(7)};
  auto r = t->call_symbol("", "remora_exit", args);
  ASSERT_TRUE(fails_with(r, Errc::kTargetExited));
  std::string msg = r.error().to_string();
  EXPECT_TRUE(contains_icase(msg, "exit")) << msg;
  EXPECT_TRUE(std::regex_search(msg, std::regex(R"(\b7\b)"))) << "exit status 7 not in: " << msg;
  t.reset();
  // We are the target's parent; the engine (its tracer, in this process)
  // may have reaped it already. If not, the status must be exit(7).
  bool echild = false;
  auto st = target.process().wait_exit(after(5s), /*echild_ok=*/true, &echild);
  if (!echild) {
    ASSERT_TRUE(st.has_value()) << "the target did not exit: " << describe_tasks(target.pid());
    EXPECT_TRUE(WIFEXITED(*st)) << "status 0x" << std::hex << *st;
    EXPECT_EQ(WEXITSTATUS(*st), 7);
  }
  EXPECT_FALSE(alive(target.pid()));
}

}  // namespace
}  // namespace remora::test
