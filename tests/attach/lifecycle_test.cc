// The tool lifecycle as a tool sees it (tests/tools/hook_tool.c logs every
// callback with its pid, tid and session): the order of the first attach, of
// re-attaches and of process exit; two tools in one list; the attach
// environment, applied and rolled back; and a forked child of an attached
// process, attached on its own.
#include <dlfcn.h>
#include <sys/wait.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "arch/host.h"
#include "attach_helpers.h"
#include "procfs/procfs.h"

namespace remora::test {
namespace {

using V = std::vector<std::string>;

class Lifecycle : public IntegrationTest {
 protected:
  HookLog log_;
};

std::string comm_of(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/comm");
  std::string s;
  std::getline(in, s);
  return s;
}

// Reaps a target that was told "quit" and checks it exited with 0.
void expect_clean_exit(TargetProcess& target) {
  auto st = target.process().wait_exit(after(10s));
  ASSERT_TRUE(st.has_value()) << "the target did not exit after \"quit\"\n" << describe_tasks(target.pid());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "wait status 0x" << std::hex << *st;
}

// First attach: configure, configure_attach, tool_init, tool_attach, in that
// order, all on the agent's listener thread (not the main thread).
TEST_F(Lifecycle, FirstAttachRunsEveryHookInOrderOnTheListener) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  const pid_t main_tid = target.tids().at("main");
  target.snapshot();
  EXPECT_FALSE(agent_mapped(pid));
  const int dontfork_before = dontfork_mappings(pid);

  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  EXPECT_TRUE(r->ok);
  EXPECT_TRUE(r->agent_loaded_now);
  EXPECT_EQ(r->pid, pid);
  // The scratch mapping that loaded the agent went within the attach call.
  EXPECT_EQ(dontfork_mappings(pid), dontfork_before);

  auto st = status_or_throw(pid);
  EXPECT_TRUE(st.agent_loaded);
  EXPECT_TRUE(st.attached);
  EXPECT_EQ(st.sessions, 1u);
  EXPECT_EQ(st.detaches, 0u);
  EXPECT_EQ(st.tools, real(kToolA));
  ASSERT_NE(st.listener_tid, 0);
  EXPECT_NE(st.listener_tid, main_tid);
  EXPECT_EQ(comm_of(pid, st.listener_tid), "remora-listen");

  auto lines = log_.lines();
  ASSERT_EQ(whats(lines), (V{"a:configure", "a:configure_attach", "a:tool_init", "a:tool_attach"}))
      << log_.dump();
  for (const auto& h : lines) {
    EXPECT_EQ(h.pid, pid) << h.raw;
    EXPECT_EQ(h.tid, st.listener_tid) << "not on the listener thread: " << h.raw;
  }
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_LE(lines[i - 1].t, lines[i].t) << log_.dump();
  EXPECT_EQ(lines[3].session, 1u);

  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  lines = log_.lines();
  ASSERT_EQ(lines.size(), 5u) << log_.dump();
  EXPECT_EQ(lines[4].what(), "a:tool_detach");
  EXPECT_EQ(lines[4].tid, st.listener_tid);
  EXPECT_EQ(lines[4].session, 1u);

  // The application never noticed: no anomaly, no fd left behind.
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
}

// 50 re-attach cycles after the first: exactly tool_attach/tool_detach,
// alternating, sessions 2..51, no second configure/init.
TEST_F(Lifecycle, FiftyReattachCyclesCallOnlyAttachAndDetach) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  Controller c;
  auto opts = options_for(log_);
  {
    auto r = c.attach(pid, opts);
    ASSERT_TRUE(r.ok()) << describe(r.error());
    auto d = c.detach(pid);
    ASSERT_TRUE(d.ok()) << describe(d.error());
  }
  const pid_t listener = status_or_throw(pid).listener_tid;
  const size_t before = log_.lines().size();
  ASSERT_EQ(before, 5u) << log_.dump();

  constexpr int kCycles = 50;
  auto t0 = Clock::now();
  for (int i = 0; i < kCycles; ++i) {
    auto r = c.attach(pid, opts);
    ASSERT_TRUE(r.ok()) << "cycle " << i << ": " << describe(r.error());
    EXPECT_FALSE(r->agent_loaded_now) << "cycle " << i;
    auto d = c.detach(pid);
    ASSERT_TRUE(d.ok()) << "cycle " << i << ": " << describe(d.error());
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  printf("  %d re-attach cycles in %lld ms\n", kCycles, static_cast<long long>(ms));

  auto lines = log_.lines();
  ASSERT_EQ(lines.size(), before + 2 * kCycles) << log_.dump();
  for (int i = 0; i < kCycles; ++i) {
    const HookLine& a = lines[before + 2 * i];
    const HookLine& d = lines[before + 2 * i + 1];
    const unsigned long long session = 2 + static_cast<unsigned long long>(i);
    EXPECT_EQ(a.what(), "a:tool_attach") << a.raw;
    EXPECT_EQ(d.what(), "a:tool_detach") << d.raw;
    EXPECT_EQ(a.session, session) << a.raw;
    EXPECT_EQ(d.session, session) << d.raw;
    EXPECT_EQ(a.tid, listener) << a.raw;
    EXPECT_EQ(d.tid, listener) << d.raw;
  }
  auto st = status_or_throw(pid);
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.sessions, 1u + kCycles);
  EXPECT_EQ(st.detaches, 1u + kCycles);
  EXPECT_EQ(st.listener_tid, listener) << "the agent started another listener";

  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
}

// "quit" while attached: the exiting (main) thread runs tool_detach, then
// tool_fini.
TEST_F(Lifecycle, ExitWhileAttachedRunsDetachThenFini) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  const pid_t main_tid = target.tids().at("main");
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  ASSERT_EQ(log_.lines().size(), 4u) << log_.dump();

  EXPECT_EQ(target.command("quit"), "bye");
  expect_clean_exit(target);

  auto lines = log_.lines();
  ASSERT_EQ(whats(lines, 4), (V{"a:tool_detach", "a:tool_fini"})) << log_.dump();
  for (size_t i = 4; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i].pid, pid) << lines[i].raw;
    EXPECT_EQ(lines[i].tid, main_tid) << "not on the exiting thread: " << lines[i].raw;
  }
  EXPECT_EQ(lines[4].session, 1u);
}

// "quit" after a detach: only tool_fini.
TEST_F(Lifecycle, ExitWhileDetachedRunsOnlyFini) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  const pid_t main_tid = target.tids().at("main");
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  ASSERT_EQ(log_.lines().size(), 5u) << log_.dump();

  EXPECT_EQ(target.command("quit"), "bye");
  expect_clean_exit(target);

  auto lines = log_.lines();
  ASSERT_EQ(whats(lines, 5), (V{"a:tool_fini"})) << log_.dump();
  EXPECT_EQ(lines[5].tid, main_tid) << lines[5].raw;
}

// Two tools: each goes through its hooks in list order. The agent loads
// and initialises every tool (configure, configure_attach, tool_init) before
// it attaches any, then attaches in list order; detach and exit run in
// reverse list order (agent.cc: detach_all_locked, at_exit).
TEST_F(Lifecycle, TwoToolsRunInListOrderAndDetachInReverse) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto opts = options_for(log_, {kToolA, kToolB});
  auto r = c.attach(pid, opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  EXPECT_EQ(status_or_throw(pid).tools, real(kToolA) + ":" + real(kToolB));
  EXPECT_EQ(whats(log_.lines()), (V{"a:configure", "a:configure_attach", "a:tool_init", "b:configure",
                                    "b:configure_attach", "b:tool_init", "a:tool_attach", "b:tool_attach"}))
      << log_.dump();

  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  EXPECT_EQ(whats(log_.lines(), 8), (V{"b:tool_detach", "a:tool_detach"})) << log_.dump();

  // A re-attach must name the same list; it attaches in list order again.
  r = c.attach(pid, opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  auto lines = log_.lines();
  ASSERT_EQ(whats(lines, 10), (V{"a:tool_attach", "b:tool_attach"})) << log_.dump();
  EXPECT_EQ(lines[10].session, 2u);
  EXPECT_EQ(lines[11].session, 2u);

  EXPECT_EQ(target.command("quit"), "bye");
  expect_clean_exit(target);
  EXPECT_EQ(whats(log_.lines(), 12), (V{"b:tool_detach", "a:tool_detach", "b:tool_fini", "a:tool_fini"}))
      << log_.dump();
}

// The attach's environment is set in the target before the tools load, and
// stays while they are attached.
TEST_F(Lifecycle, EnvironmentIsAppliedInTheTarget) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  EXPECT_EQ(target.command("getenv FOO"), "unset");
  Controller c;
  auto opts = options_for(log_);
  opts.env.emplace_back("FOO", "bar");
  auto r = c.attach(pid, opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  // The tool found REMORA_HOOK_LOG, which only the env buffer set.
  EXPECT_EQ(log_.find("a:tool_attach", pid).size(), 1u) << log_.dump();
  // What the application itself sees, and a remote getenv.
  EXPECT_EQ(target.command("getenv FOO"), "env bar");
  EXPECT_EQ(remote_getenv(pid, "FOO").value_or("<unset>"), "bar");
  EXPECT_EQ(remote_getenv(pid, "REMORA_HOOK_LOG").value_or("<unset>"), log_.path());
}

// A failing tool_attach (HOOK_TOOL_FAIL=tool_attach, set by the same env
// buffer) fails the attach with kToolFailed, unloads the tools of this first
// attach (tool_fini runs) and rolls the environment back: new variables are
// unset again, overwritten ones get their old value.
TEST_F(Lifecycle, EnvironmentIsRolledBackWhenToolAttachFails) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  EXPECT_EQ(target.command("setenv FOO3 orig"), "ok");
  Controller c;
  auto opts = options_for(log_);
  opts.env.emplace_back("FOO2", "baz");
  opts.env.emplace_back("FOO3", "new");
  opts.env.emplace_back("HOOK_TOOL_FAIL", "tool_attach");
  auto r = c.attach(pid, opts);
  ASSERT_FALSE(r.ok()) << "attach succeeded although tool_attach failed";
  EXPECT_EQ(r.error().code(), Errc::kToolFailed) << describe(r.error());
  EXPECT_TRUE(contains_icase(r.error().to_string(), "tool_attach")) << describe(r.error());

  EXPECT_EQ(whats(log_.lines()),
            (V{"a:configure", "a:configure_attach", "a:tool_init", "a:tool_attach", "a:tool_fini"}))
      << log_.dump();

  EXPECT_EQ(remote_getenv(pid, "FOO2"), std::nullopt) << "FOO2 was not rolled back";
  EXPECT_EQ(remote_getenv(pid, "HOOK_TOOL_FAIL"), std::nullopt);
  EXPECT_EQ(remote_getenv(pid, "REMORA_HOOK_LOG"), std::nullopt);
  EXPECT_EQ(remote_getenv(pid, "FOO3").value_or("<unset>"), "orig");
  EXPECT_EQ(target.command("getenv FOO2"), "unset");
  EXPECT_EQ(target.command("getenv FOO3"), "env orig");

  auto st = status_or_throw(pid);
  EXPECT_TRUE(st.agent_loaded);
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.sessions, 0u);
  EXPECT_EQ(st.tools, "");
  EXPECT_TRUE(contains_icase(st.message, "tool_attach")) << st.message;

  // The failed first attach left nothing loaded: a good attach starts afresh.
  auto good = c.attach(pid, options_for(log_));
  ASSERT_TRUE(good.ok()) << describe(good.error());
  EXPECT_EQ(whats(log_.lines(), 5), (V{"a:configure", "a:configure_attach", "a:tool_init", "a:tool_attach"}))
      << log_.dump();
  EXPECT_EQ(log_.lines().back().session, 1u);
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
}

// tool_init failing: the same kToolFailed, the tool is not attached.
TEST_F(Lifecycle, ToolInitFailureFailsTheAttach) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto opts = options_for(log_);
  opts.env.emplace_back("HOOK_TOOL_FAIL", "tool_init");
  auto r = c.attach(pid, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kToolFailed) << describe(r.error());
  EXPECT_TRUE(contains_icase(r.error().to_string(), "tool_init")) << describe(r.error());
  EXPECT_EQ(log_.find("a:tool_attach").size(), 0u) << log_.dump();
  EXPECT_FALSE(status_or_throw(pid).attached);
  EXPECT_EQ(remote_getenv(pid, "HOOK_TOOL_FAIL"), std::nullopt);
}

// detach(0) detaches every session of the controller, and only those: not
// a process whose attach failed because another controller had attached it.
TEST_F(Lifecycle, DetachZeroDetachesEverySessionOfTheController) {
  TargetProcess t1("remora_attach_target");
  TargetProcess t2("remora_attach_target");
  TargetProcess other("remora_attach_target");
  Controller c, c2;
  auto opts = options_for(log_);
  for (pid_t p : {t1.pid(), t2.pid()}) {
    auto r = c.attach(p, opts);
    ASSERT_TRUE(r.ok()) << describe(r.error());
  }
  auto r = c2.attach(other.pid(), opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  auto refused = c.attach(other.pid(), opts);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), Errc::kAlreadyAttached) << describe(refused.error());
  auto s = c.sessions();
  EXPECT_EQ(std::set<pid_t>(s.begin(), s.end()), (std::set<pid_t>{t1.pid(), t2.pid()}));

  auto d = c.detach(0);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  EXPECT_EQ(log_.find("a:tool_detach", t1.pid()).size(), 1u) << log_.dump();
  EXPECT_EQ(log_.find("a:tool_detach", t2.pid()).size(), 1u) << log_.dump();
  EXPECT_EQ(log_.find("a:tool_detach", other.pid()).size(), 0u) << log_.dump();
  EXPECT_TRUE(status_or_throw(other.pid()).attached);
  EXPECT_TRUE(c.sessions().empty());
}

// --- fork -------------------------------------------------------------------

// Waits until the forked child's agent started its own listener.
pid_t child_listener(pid_t child) {
  attach::AgentState st;
  bool ok = wait_for(
      [&] {
        st = status_or_throw(child);
        return st.agent_loaded && st.listener_tid != 0 && st.listener_tid != child;
      },
      after(5s));
  if (!ok) throw HarnessError("the forked child's agent has no listener\n" + describe_tasks(child));
  return st.listener_tid;
}

pid_t fork_child(TargetProcess& target) {
  std::string reply = target.command("fork");
  if (reply.rfind("forked ", 0) != 0) throw HarnessError("fork: " + reply);
  return static_cast<pid_t>(std::stol(reply.substr(7)));
}

// The target forks after the agent is in and the tools are detached: the
// child starts no thread of ours (its listener is started on request, as in
// a freshly loaded agent: agent/protocol.h, LISTENER_ON_REQUEST), and is
// attached on its own, on a listener of its own (the parent stays detached).
TEST_F(Lifecycle, ForkedChildIsAttachedOnItsOwn) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto opts = options_for(log_);
  auto r = c.attach(pid, opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());
  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  const pid_t parent_listener = status_or_throw(pid).listener_tid;

  const pid_t child = fork_child(target);
  auto cst = status_or_throw(child);
  EXPECT_TRUE(cst.agent_loaded);
  EXPECT_FALSE(cst.attached);
  EXPECT_EQ(cst.listener_tid, 0) << "the detached parent's child started a listener unasked";
  EXPECT_EQ(describe_tasks(child).find("remora-listen"), std::string::npos) << describe_tasks(child);
  EXPECT_EQ(cst.tools, real(kToolA)) << "the child keeps the loaded tools";

  auto cr = c.attach(child, opts);
  ASSERT_TRUE(cr.ok()) << describe(cr.error());
  EXPECT_FALSE(cr->agent_loaded_now) << "the child inherited the agent";
  const pid_t listener = status_or_throw(child).listener_tid;
  EXPECT_NE(listener, 0);
  EXPECT_NE(listener, parent_listener);
  EXPECT_EQ(comm_of(child, listener), "remora-listen");
  auto att = log_.find("a:tool_attach", child);
  ASSERT_EQ(att.size(), 1u) << log_.dump();
  EXPECT_EQ(att[0].tid, listener);
  EXPECT_EQ(att[0].session, 2u) << "the child continues the parent's session count";
  EXPECT_EQ(log_.find("a:configure", child).size(), 0u) << "the child re-configured a loaded tool";
  EXPECT_FALSE(status_or_throw(pid).attached) << "attaching the child attached the parent";
  EXPECT_TRUE(status_or_throw(child).attached);

  auto cd = c.detach(child);
  ASSERT_TRUE(cd.ok()) << describe(cd.error());
  EXPECT_EQ(log_.find("a:tool_detach", child).size(), 1u) << log_.dump();
  Report rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
}

// Forked while attached: the child inherits the attached state, and is
// detached and re-attached on its own while the parent stays attached.
TEST_F(Lifecycle, ForkedWhileAttachedChildIsDetachedOnItsOwn) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto opts = options_for(log_);
  auto r = c.attach(pid, opts);
  ASSERT_TRUE(r.ok()) << describe(r.error());

  const pid_t child = fork_child(target);
  const pid_t listener = child_listener(child);
  EXPECT_TRUE(status_or_throw(child).attached);

  auto cd = c.detach(child);
  ASSERT_TRUE(cd.ok()) << describe(cd.error());
  auto det = log_.find("a:tool_detach", child);
  ASSERT_EQ(det.size(), 1u) << log_.dump();
  EXPECT_EQ(det[0].tid, listener);
  EXPECT_TRUE(status_or_throw(pid).attached) << "detaching the child detached the parent";
  EXPECT_EQ(log_.find("a:tool_detach", pid).size(), 0u) << log_.dump();

  auto cr = c.attach(child, opts);
  ASSERT_TRUE(cr.ok()) << describe(cr.error());
  EXPECT_EQ(log_.find("a:tool_attach", child).size(), 1u) << log_.dump();

  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  EXPECT_EQ(log_.find("a:tool_detach", pid).size(), 1u) << log_.dump();
  EXPECT_TRUE(status_or_throw(child).attached);
}

}  // namespace
}  // namespace remora::test

namespace remora::test {
namespace {

// Remote calls on the listener are marked calls although it blocks every
// signal (the frame lets the marker through, ptrace restores the mask):
// two stops, however many system calls the function makes, and the
// listener's mask is exactly "all blocked" afterwards.
TEST_F(Lifecycle, CallsOnTheListenerAreMarkedAndKeepItsMask) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  const pid_t listener = status_or_throw(pid).listener_tid;
  auto mask_of = [&] {
    auto st = procfs::read_status(pid, listener);
    if (!st.ok()) throw HarnessError("status of the listener: " + describe(st.error()));
    return st->sig_blk;
  };
  const uint64_t before = mask_of();

  auto t = open_target(pid);
  auto usleep_fn = t->find_symbol("libc.so.6", "usleep");
  ASSERT_TRUE(usleep_fn.ok()) << describe(usleep_fn.error());
  for (int i = 0; i < 10; ++i) {
    std::vector<remote::CallArg> args{remote::CallArg::integer(1000)};
    auto u = t->call(*usleep_fn, args, remote::CallOptions{listener});
    ASSERT_TRUE(u.ok()) << describe(u.error());
    EXPECT_EQ(u->value, 0u);
    EXPECT_EQ(u->stops, 2) << "call " << i << " was not a marked call";
    EXPECT_EQ(mask_of(), before) << "call " << i;
  }
  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
}

// The agent carries Remora's call stubs so that calls on its listener need
// no scratch mapping (attach.cc adopts them only when they are byte for byte
// arch::host::stub_code()). Both are assembled from one source per
// architecture (src/arch/x86_64_stub.S, aarch64_stub.S), so they cannot drift apart; this checks the export
// itself: the agent exports the whole block under the name attach.cc looks
// up, in a mapping a thread can execute.
TEST(AgentStub, ExportsTheEnginesStubCode) {
  void* agent = dlopen(REMORA_AGENT_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(agent, nullptr) << dlerror();
  const void* stub = dlsym(agent, "remora_agent_stub");
  ASSERT_NE(stub, nullptr) << dlerror();
  auto want = arch::host::stub_code();
  EXPECT_EQ(std::memcmp(stub, want.data(), want.size()), 0);
  const uint64_t at = reinterpret_cast<uintptr_t>(stub);
  EXPECT_EQ(at % 64, 0u) << "the block is 64-byte aligned in the agent";
  auto maps = procfs::read_maps(getpid());
  ASSERT_TRUE(maps.ok()) << describe(maps.error());
  bool executable = false;
  for (const auto& m : *maps)
    if (m.start <= at && at + want.size() <= m.end) executable = m.exec && m.read && !m.write;
  EXPECT_TRUE(executable) << "remora_agent_stub lies in no single r-x mapping";
  // Not closed: the agent's constructor started its listener thread here.
}

}  // namespace
}  // namespace remora::test
