// More than one controller process: a detach made by another process than
// the one that attached, the lease (a controller that dies attached makes
// the agent detach the tools), and two controllers calling at once through
// the agent's shared stubs and buffer.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "agent/protocol.h"
#include "attach_helpers.h"
#include "procfs/procfs.h"

namespace remora::test {
namespace {

class Controllers : public IntegrationTest {
 protected:
  HookLog log_;
};

// Attached here, detached from a forked process with its own Controller.
TEST_F(Controllers, DetachFromAnotherProcess) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto opts = options_for(log_);
  auto r = c.attach(pid, opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());

  ForkedHelper helper([pid](int fd) {
    Controller other;
    auto d = other.detach(pid);
    ForkedHelper::say(fd, d.ok() ? "detached" : "error " + describe(d.error()));
    return d.ok() ? 0 : 1;
  });
  EXPECT_EQ(helper.wait_line(after(15s)), "detached");
  auto st = helper.wait_exit(after(10s));
  ASSERT_TRUE(st.has_value()) << "the helper did not exit";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "wait status 0x" << std::hex << *st;

  auto det = log_.find("a:tool_detach", pid);
  ASSERT_EQ(det.size(), 1u) << log_.dump();
  EXPECT_EQ(det[0].session, 1u);
  auto ast = status_or_throw(pid);
  EXPECT_FALSE(ast.attached);
  EXPECT_EQ(ast.detaches, 1u);

  // Our controller learns the truth from the agent: nothing left to detach,
  // and a re-attach works.
  auto again = c.detach(pid);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), Errc::kNotAttached) << describe(again.error());
  auto re = c.attach(pid, opts);
  ASSERT_TRUE(re.ok()) << describe(re.error());
  EXPECT_EQ(log_.find("a:tool_attach", pid).size(), 2u) << log_.dump();
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
}

// A forked controller attaches with a lease, says so, and is SIGKILLed: the
// agent notices (EOF on the lease pipe) and detaches the tool by itself.
TEST_F(Controllers, LeaseDetachesWhenTheControllerDies) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  auto opts = options_for(log_);
  opts.lease = true;
  target.snapshot();

  ForkedHelper helper([pid, &opts](int fd) {
    Controller leased;
    auto r = leased.attach(pid, opts);
    ForkedHelper::say(fd, r.ok() ? "attached" : "error " + describe(r.error()));
    if (!r.ok()) return 1;
    for (;;) ::pause();  // until the test kills us
  });
  ASSERT_EQ(helper.wait_line(after(15s)), "attached");

  auto st = status_or_throw(pid);
  EXPECT_TRUE(st.attached);
  EXPECT_EQ(st.lease_pid, helper.pid());
  EXPECT_FALSE(st.lease_expired);
  EXPECT_EQ(log_.find("a:tool_detach").size(), 0u) << log_.dump();

  ASSERT_EQ(::kill(helper.pid(), SIGKILL), 0);
  auto ws = helper.wait_exit(after(10s));
  ASSERT_TRUE(ws.has_value());
  EXPECT_TRUE(WIFSIGNALED(*ws) && WTERMSIG(*ws) == SIGKILL) << "wait status 0x" << std::hex << *ws;

  ASSERT_TRUE(log_.wait_count("a:tool_detach", 1, pid, after(10s)))
      << "the lease did not detach the tool within 10 s\n"
      << log_.dump();
  auto det = log_.find("a:tool_detach", pid);
  EXPECT_EQ(det.size(), 1u) << log_.dump();
  EXPECT_EQ(det[0].session, 1u);
  EXPECT_TRUE(wait_for([&] { return status_or_throw(pid).lease_expired; }, after(5s)));
  st = status_or_throw(pid);
  EXPECT_TRUE(st.lease_expired);
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.detaches, 1u);
  // The expired lease closed itself: no controller holds it any more, and
  // its pipe and the watcher's eventfd are gone from the process.
  EXPECT_EQ(st.lease_pid, 0);
  Report expired = target.report();
  EXPECT_EQ(expired.fds_delta(), 0) << expired.raw;

  // The process is fine and can be attached again by a new controller.
  Controller c;
  opts.lease = false;
  auto re = c.attach(pid, opts);
  ASSERT_TRUE(re.ok()) << describe(re.error());
  EXPECT_EQ(log_.find("a:tool_attach", pid).size(), 2u) << log_.dump();
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
}

// A leased controller that detaches normally disarms the lease: its later
// death detaches nothing (the tool is attached again by then, by another
// controller without a lease).
TEST_F(Controllers, LeaseIsDisarmedByANormalDetach) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  auto opts = options_for(log_);
  opts.lease = true;
  ForkedHelper helper([pid, &opts](int fd) {
    Controller leased;
    auto r = leased.attach(pid, opts);
    if (!r.ok()) {
      ForkedHelper::say(fd, "error " + describe(r.error()));
      return 1;
    }
    auto d = leased.detach(pid);
    ForkedHelper::say(fd, d.ok() ? "detached" : "error " + describe(d.error()));
    for (;;) ::pause();
  });
  ASSERT_EQ(helper.wait_line(after(15s)), "detached");
  Controller c;
  opts.lease = false;
  auto re = c.attach(pid, opts);
  ASSERT_TRUE(re.ok()) << describe(re.error());

  ASSERT_EQ(::kill(helper.pid(), SIGKILL), 0);
  ASSERT_TRUE(helper.wait_exit(after(10s)).has_value());
  // Give a wrongly armed lease the chance to fire: the agent's watcher polls
  // the pipe, so it would react within milliseconds. Then check. A wait for
  // what must not happen lasts its whole length: scaled for a slow machine,
  // but never past 10 s (a guest whose boot-time calibration met a busy host
  // measured itself 290x slower, and this wait alone took 146 s).
  const auto quiet = std::min<std::chrono::milliseconds>(scaled(500ms), 10s);
  bool fired = log_.wait_count("a:tool_detach", 2, pid, Clock::now() + quiet);
  EXPECT_FALSE(fired) << log_.dump();
  auto st = status_or_throw(pid);
  EXPECT_TRUE(st.attached);
  EXPECT_FALSE(st.lease_expired);
}

// Two sessions call into one process at the same time, both through the
// agent's stubs and buffer (as two controller processes would), one on the
// listener and one on the main thread. Each call must see its own string
// argument: arguments travel on the called thread's stack, written only
// once that thread is seized, never in the shared buffer.
TEST_F(Controllers, TwoSessionsCallingAtOnceKeepTheirOwnArguments) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  {
    Controller c;
    auto r = c.attach(pid, options_for(log_));
    ASSERT_TRUE(r.ok()) << describe(r.error());
    auto d = c.detach(pid);
    ASSERT_TRUE(d.ok()) << describe(d.error());
  }
  const pid_t listener = status_or_throw(pid).listener_tid;
  const pid_t main_tid = target.tids().at("main");

  std::atomic<int> wrong{0};
  std::mutex mu;
  std::vector<std::string> errors;
  auto session = [&](pid_t tid, long base) {
    auto fail = [&](const std::string& what) {
      std::lock_guard lock(mu);
      errors.push_back(what);
    };
    auto t = open_target(pid);
    const remote::Target::SymbolQuery shared[] = {{"remora_agent_stub"}, {"remora_agent_scratch", false}};
    auto found = t->find_symbols("libremora-agent.so", shared);
    if (!found.ok()) return fail(describe(found.error()));
    if (auto a = t->adopt_scratch((*found)[0], (*found)[1], REMORA_AGENT_SCRATCH_SIZE); !a.ok())
      return fail(describe(a.error()));
    auto atol_fn = t->find_symbol("libc.so.6", "atol");
    if (!atol_fn.ok()) return fail(describe(atol_fn.error()));
    for (long i = 0; i < 150; ++i) {
      const long want = base + i;
      std::vector<remote::CallArg> args{remote::CallArg::string(std::to_string(want))};
      auto r = t->call(*atol_fn, args, remote::CallOptions{tid});
      if (!r.ok()) return fail("call " + std::to_string(i) + ": " + describe(r.error()));
      if (static_cast<long>(r->value) != want) ++wrong;
    }
  };
  std::thread on_listener(session, listener, 1'000'000L);
  std::thread on_main(session, main_tid, 2'000'000L);
  on_listener.join();
  on_main.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(wrong.load(), 0) << "calls that saw the other session's argument";
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
}

// A thread that blocks SIGURG (the usual marker of a marked call) gets its
// exact signal mask back even when its controller is SIGKILLed while the
// called function runs: the thread then restores itself through the frame
// alone, so the frame's mask must be the thread's own. (The marker is then
// another ignored signal the thread does not block.)
TEST_F(Controllers, DeathMidCallRestoresTheMaskOfAThreadThatBlocksSigurg) {
  auto bit = [](int sig) { return uint64_t{1} << (sig - 1); };
  ForkedHelper target([](int fd) {
    sigset_t urg;
    sigemptyset(&urg);
    sigaddset(&urg, SIGURG);
    sigprocmask(SIG_BLOCK, &urg, nullptr);
    int p[2];
    if (::pipe(p) != 0) return 1;
    ForkedHelper::say(fd, "ready");
    char b;
    for (;;) (void)!::read(p[0], &b, 1);
  });
  ASSERT_EQ(target.wait_line(after(10s)), "ready");
  const pid_t pid = target.pid();
  auto status = [&] {
    auto st = procfs::read_status(pid);
    if (!st.ok()) throw HarnessError("status of " + std::to_string(pid) + ": " + describe(st.error()));
    return *st;
  };
  const uint64_t own_mask = status().sig_blk;
  ASSERT_EQ(own_mask, bit(SIGURG));

  // Calls that end normally leave the mask exactly as it was.
  {
    auto t = open_target(pid);
    auto getpid_fn = t->find_symbol("libc.so.6", "getpid");
    ASSERT_TRUE(getpid_fn.ok()) << describe(getpid_fn.error());
    for (int i = 0; i < 20; ++i) {
      auto r = t->call(*getpid_fn, {}, remote::CallOptions{pid});
      ASSERT_TRUE(r.ok()) << describe(r.error());
      EXPECT_EQ(static_cast<pid_t>(r->value), pid);
      EXPECT_EQ(r->stops, 2) << "not a marked call (interrupt, marker)";
      ASSERT_EQ(status().sig_blk, own_mask) << "after call " << i;
    }
  }

  // A controller dies while usleep runs in the thread.
  ForkedHelper controller([pid](int fd) {
    auto opened = remote::Target::open(pid);
    if (!opened.ok()) return 1;
    auto t = std::move(opened).value();
    auto usleep_fn = t->find_symbol("libc.so.6", "usleep");
    if (!usleep_fn.ok()) return 1;
    ForkedHelper::say(fd, "calling");
    // A second: ample time to see the call running and kill the controller.
    std::vector<remote::CallArg> args{remote::CallArg::integer(1'000'000)};
    (void)t->call(*usleep_fn, args, remote::CallOptions{pid, std::chrono::seconds(10)});
    return 0;
  });
  ASSERT_EQ(controller.wait_line(after(10s)), "calling");
  // The call runs once the thread is traced by the controller, sleeping,
  // with every signal blocked (the transaction's mask while it runs).
  ASSERT_TRUE(wait_for(
      [&] {
        auto st = status();
        return st.tracer_pid == controller.pid() && st.state == 'S' && (st.sig_blk & bit(SIGUSR1)) != 0;
      },
      after(10s)))
      << "the call never started\n"
      << describe_tasks(pid);
  ::kill(controller.pid(), SIGKILL);
  auto ws = controller.wait_exit(after(10s));
  ASSERT_TRUE(ws.has_value());
  ASSERT_TRUE(WIFSIGNALED(*ws)) << "the controller finished the call before it was killed";

  // usleep returns, and the thread restores itself through the frame.
  EXPECT_TRUE(wait_for(
      [&] {
        auto st = status();
        return st.tracer_pid == 0 && st.sig_blk == own_mask;
      },
      after(10s)))
      << "mask after the controller died: " << std::hex << status().sig_blk << ", before: " << own_mask;
  EXPECT_TRUE(alive(pid));
}

}  // namespace
}  // namespace remora::test
