// Attach errors: each with its code and a message that says what is wrong,
// and the target left as it was.
#include <sys/wait.h>

#include <map>

#include "attach_helpers.h"
#include "procfs/procfs.h"
#include "remote/target.h"
#include "remote/visible_file.h"

namespace remora::test {
namespace {

class AttachErrors : public IntegrationTest {
 protected:
  HookLog log_;
};

// A target started with REMORA_TOOL_ATTACH=0 in its environment (through
// env(1), which execs the target in place: same pid).
TEST_F(AttachErrors, RefusedByTheTargetsEnvironment) {
  auto proc = Spawned::start({"/usr/bin/env", "REMORA_TOOL_ATTACH=0", bin_path("remora_attach_target")});
  ASSERT_EQ(proc->wait_line(after(10s), "ready"), "ready " + std::to_string(proc->pid()));
  const pid_t pid = proc->pid();
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kRefused) << describe(r.error());
  EXPECT_TRUE(contains_icase(r.error().to_string(), "REMORA_TOOL_ATTACH=0")) << describe(r.error());
  EXPECT_FALSE(agent_mapped(pid)) << "the agent was loaded into a process that refuses tools";
  EXPECT_TRUE(log_.lines().empty()) << log_.dump();
  proc->send("quit");
}

// ROCP_TOOL_ATTACH=0 is honoured the same way.
TEST_F(AttachErrors, RefusedByRocpToolAttach) {
  auto proc = Spawned::start({"/usr/bin/env", "ROCP_TOOL_ATTACH=0", bin_path("remora_attach_target")});
  ASSERT_EQ(proc->wait_line(after(10s), "ready"), "ready " + std::to_string(proc->pid()));
  Controller c;
  auto r = c.attach(proc->pid(), options_for(log_));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kRefused) << describe(r.error());
  EXPECT_FALSE(agent_mapped(proc->pid()));
  proc->send("quit");
}

// Set with setenv() after start-up, the refusal is invisible in
// /proc/PID/environ: the agent (loaded for the purpose) refuses instead.
TEST_F(AttachErrors, RefusedByTheAgentAfterSetenv) {
  TargetProcess target("remora_attach_target");
  ASSERT_EQ(target.command("setenv REMORA_TOOL_ATTACH 0"), "ok");
  Controller c;
  auto r = c.attach(target.pid(), options_for(log_));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kRefused) << describe(r.error());
  EXPECT_TRUE(log_.lines().empty()) << log_.dump();
  EXPECT_FALSE(status_or_throw(target.pid()).attached);
}

// An attach whose lease cannot be armed (the target has no two free file
// descriptors for the lease's pipe) fails and leaves nothing attached. With
// the leased attach (protocol 2) the pipe is made before any tool runs, so
// no tool is attached at all; in the order of an agent of protocol 1
// (REMORA_INJECT_FAULT=old-agent), the tools are detached again, so they
// cannot outlive the controller.
void lease_that_cannot_be_armed(HookLog& log, bool old_order) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  AttachOptions opts = options_for(log);
  opts.lease = true;
  ScopedEnv fault("REMORA_INJECT_FAULT", old_order ? "old-agent" : "");
  Controller c;
  {
    auto r = c.attach(pid, opts);
    ASSERT_TRUE(r.ok()) << describe(r.error());
    auto d = c.detach(pid);
    ASSERT_TRUE(d.ok()) << describe(d.error());
  }
  const auto before = status_or_throw(pid);
  ASSERT_EQ(target.command("fill-fds").rfind("filled ", 0), 0u);
  const size_t from = log.lines().size();
  auto r = c.attach(pid, opts);
  ASSERT_FALSE(r.ok()) << "attached although the lease could not be armed";
  EXPECT_TRUE(contains_icase(r.error().to_string(), "lease")) << describe(r.error());
  const auto after_failure = status_or_throw(pid);
  EXPECT_FALSE(after_failure.attached);
  EXPECT_EQ(after_failure.lease_pid, 0);
  if (old_order) {
    EXPECT_TRUE(contains_icase(r.error().to_string(), "detached again")) << describe(r.error());
    EXPECT_EQ(after_failure.detaches, before.detaches + 1);
    EXPECT_EQ(whats(log.lines(), from), (std::vector<std::string>{"a:tool_attach", "a:tool_detach"}))
        << log.dump();
  } else {
    EXPECT_EQ(after_failure.detaches, before.detaches);
    EXPECT_EQ(after_failure.sessions, before.sessions);
    EXPECT_EQ(whats(log.lines(), from), std::vector<std::string>{}) << log.dump();
  }
  ASSERT_EQ(target.command("free-fds"), "ok");
  // Nothing is left over: the next attach arms its lease.
  auto again = c.attach(pid, opts);
  ASSERT_TRUE(again.ok()) << describe(again.error());
  EXPECT_EQ(status_or_throw(pid).lease_pid, getpid());
  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
}

TEST_F(AttachErrors, LeaseThatCannotBeArmedLeavesNothingAttached) { lease_that_cannot_be_armed(log_, false); }

TEST_F(AttachErrors, LeaseThatCannotBeArmedLeavesNothingAttachedOldOrder) {
  lease_that_cannot_be_armed(log_, true);
}

// A lease that cannot be armed (the target has no two free descriptors for
// the lease's pipe) leaves no descriptor of the attempt behind in the target:
// /proc/PID/fd names the same descriptors before and after the failed
// attach, which loaded the agent and the tool and detached the tool again.
TEST_F(AttachErrors, FailedLeaseLeavesNoDescriptorInTheTarget) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  ASSERT_EQ(target.command("fill-fds").rfind("filled ", 0), 0u);
  const auto before = open_fds(pid);
  AttachOptions opts = options_for(log_);
  opts.lease = true;
  Controller c;
  auto r = c.attach(pid, opts);
  ASSERT_FALSE(r.ok()) << "attached although the lease could not be armed";
  EXPECT_TRUE(contains_icase(r.error().to_string(), "pipe2")) << describe(r.error());
  EXPECT_TRUE(agent_mapped(pid));
  EXPECT_FALSE(status_or_throw(pid).attached);
  const auto after_failure = open_fds(pid);
  EXPECT_EQ(after_failure, before) << "before:" << describe_fds(before)
                                   << "\nafter:" << describe_fds(after_failure);
  ASSERT_EQ(target.command("free-fds"), "ok");
  auto again = c.attach(pid, opts);
  ASSERT_TRUE(again.ok()) << describe(again.error());
  EXPECT_EQ(status_or_throw(pid).lease_pid, getpid());
  ASSERT_TRUE(c.detach(pid).ok());
}

// The call that hands the lease pipe to the agent fails on the
// controller's side, the pipe made: the read end, which the agent never
// took, is closed again, and the tools are detached again. This is the order
// of an agent of protocol 1 (old-agent; the leased attach hands the pipe
// over in the attach call itself). Injected through the controller's
// REMORA_INJECT_FAULT=lease-call: only a seize that fails
// or a deadline that passes between two calls on the listener would do it
// otherwise, which no test can time.
TEST_F(AttachErrors, FailedLeaseCallLeavesNoPipeInTheTarget) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  const auto before = open_fds(pid);
  AttachOptions opts = options_for(log_);
  opts.lease = true;
  Controller c;
  {
    ScopedEnv fault("REMORA_INJECT_FAULT", "old-agent,lease-call");
    auto r = c.attach(pid, opts);
    ASSERT_FALSE(r.ok()) << "the injected fault did not fail the attach";
    EXPECT_TRUE(contains_icase(r.error().to_string(), "REMORA_INJECT_FAULT")) << describe(r.error());
    EXPECT_TRUE(contains_icase(r.error().to_string(), "detached again")) << describe(r.error());
  }
  const auto after_failure = open_fds(pid);
  EXPECT_EQ(after_failure, before) << "before:" << describe_fds(before)
                                   << "\nafter:" << describe_fds(after_failure);
  const auto st = status_or_throw(pid);
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.lease_pid, 0);
  EXPECT_EQ(whats(log_.lines()), (std::vector<std::string>{"a:configure", "a:configure_attach", "a:tool_init",
                                                           "a:tool_attach", "a:tool_detach"}))
      << log_.dump();
}

// The tools reach a target in a mount namespace of its own as memfds (the
// tool's path shows /dev/null there). When the attach then fails before its
// call (the removal of the scratch mapping that loaded the agent), the memfds
// are closed and the scratch removed all the same. The failure is injected
// through the controller's REMORA_INJECT_FAULT: only an agent without
// remora_agent_attach_unmap takes that route, and only a failing remote
// munmap fails it, which no live target does.
TEST_F(AttachErrors, FailedScratchRemovalLeavesNoMemfdInTheTarget) {
  if (::geteuid() != 0 || ::access("/usr/bin/unshare", X_OK) != 0) {
    printf("  skipped: needs root and /usr/bin/unshare (the target runs in a mount namespace of its own)\n");
    GTEST_SKIP() << "needs root and /usr/bin/unshare";
  }
  const std::string tool = real(kToolA);
  auto proc = Spawned::start({"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                              "mount --bind /dev/null \"$0\" && exec \"$1\"", tool,
                              bin_path("remora_attach_target")});
  ASSERT_EQ(proc->wait_line(after(10s), "ready"), "ready " + std::to_string(proc->pid()));
  const pid_t pid = proc->pid();
  {
    // The setup holds: the target cannot open the tool by its path.
    auto t = open_target(pid);
    auto vf = remote::make_visible(*t, tool);
    ASSERT_TRUE(vf.ok()) << describe(vf.error());
    EXPECT_TRUE(vf->via_memfd()) << "the target sees the tool's own file: the memfd route is not taken";
    ASSERT_TRUE(remote::release(*t, *vf).ok());
    ASSERT_TRUE(t->close().ok());
  }
  const auto before = open_fds(pid);
  const int dontfork_before = dontfork_mappings(pid);
  Controller c;
  {
    ScopedEnv fault("REMORA_INJECT_FAULT", "remove-scratch");
    auto r = c.attach(pid, options_for(log_));
    ASSERT_FALSE(r.ok()) << "the injected fault did not fail the attach";
    EXPECT_TRUE(contains_icase(r.error().to_string(), "REMORA_INJECT_FAULT")) << describe(r.error());
  }
  const auto after_failure = open_fds(pid);
  EXPECT_EQ(after_failure, before) << "before:" << describe_fds(before)
                                   << "\nafter:" << describe_fds(after_failure);
  EXPECT_EQ(dontfork_mappings(pid), dontfork_before) << "the scratch mapping was left in the target";
  EXPECT_TRUE(agent_mapped(pid));
  EXPECT_TRUE(log_.lines().empty()) << log_.dump();
  // Without the fault, the same target takes the tool through its memfd.
  auto good = c.attach(pid, options_for(log_));
  ASSERT_TRUE(good.ok()) << describe(good.error());
  EXPECT_EQ(log_.find("a:tool_attach", pid).size(), 1u) << log_.dump();
  ASSERT_TRUE(c.detach(pid).ok());
  EXPECT_EQ(open_fds(pid), before);
  proc->send("quit");
}

// Anonymous read-write mappings of 2 MiB or more: thread stacks libc made
// (our loader stack is 1 MiB).
int large_anonymous_rw(pid_t pid) {
  auto maps = procfs::read_maps(pid);
  int n = 0;
  if (maps)
    for (const auto& m : *maps)
      n += !m.file_backed() && m.path.empty() && m.read && m.write && m.size() >= (2u << 20);
  return n;
}

// The loader start routine's other branch, for a libc without
// pthread_attr_setstack (REMORA_INJECT_FAULT=libc-stack takes it here): the
// routine maps no stack, the loader thread runs on one libc makes (and keeps
// in its stack cache once the thread is gone), and the attach works as
// otherwise. A normal attach into a twin target leaves one such mapping
// fewer: there the loader ran on our own stack, removed with the scratch.
TEST_F(AttachErrors, LoaderRunsOnLibcsStackWithoutTheAttrFunctions) {
  TargetProcess normal("remora_attach_target"), fault_target("remora_attach_target");
  const int normal_before = large_anonymous_rw(normal.pid());
  const int fault_before = large_anonymous_rw(fault_target.pid());
  Controller c;
  auto r = c.attach(normal.pid(), options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  {
    ScopedEnv fault("REMORA_INJECT_FAULT", "libc-stack");
    auto f = c.attach(fault_target.pid(), options_for(log_));
    ASSERT_TRUE(f.ok()) << describe(f.error());
    EXPECT_TRUE(f->agent_loaded_now);
  }
  EXPECT_EQ(log_.find("a:tool_attach", fault_target.pid()).size(), 1u) << log_.dump();
  EXPECT_EQ(large_anonymous_rw(fault_target.pid()) - fault_before,
            large_anonymous_rw(normal.pid()) - normal_before + 1)
      << "the loader thread did not run on a stack of libc's";
  ASSERT_TRUE(c.detach(normal.pid()).ok());
  ASSERT_TRUE(c.detach(fault_target.pid()).ok());
}

// Bytes of the process's anonymous private mappings, whatever their
// protection, but the heap and the main stack: what a leaked scratch (64 KiB)
// or loader stack (1 MiB) would add. A count of mappings would not do: how
// the kernel merges neighbouring mappings depends on where each landed.
uint64_t anonymous_bytes(pid_t pid) {
  auto maps = procfs::read_maps(pid);
  uint64_t n = 0;
  if (maps)
    for (const auto& m : *maps)
      if (!m.file_backed() && (m.path.empty() || m.path.rfind("[anon:", 0) == 0)) n += m.size();
  return n;
}

// The first attach without a lease is handed to the agent by the loader
// thread that loaded it (remora_agent_loader_attach); where it cannot be
// (here REMORA_INJECT_FAULT=listener-attach: as with a lease, tools that need
// a memfd, an agent without the hook), the attach call on the listener makes
// it. Both ways the tool's hooks run on the listener, and the process is left
// with as much anonymous memory mapped: the scratch and the loader's stack
// are gone.
TEST_F(AttachErrors, FirstAttachThroughTheListenerCallLeavesWhatTheLoadersRequestLeaves) {
  TargetProcess hooked("remora_attach_target"), called("remora_attach_target");
  const uint64_t hooked_before = anonymous_bytes(hooked.pid()), called_before = anonymous_bytes(called.pid());
  const int dontfork_before = dontfork_mappings(hooked.pid());
  Controller c;
  auto r = c.attach(hooked.pid(), options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  {
    ScopedEnv fault("REMORA_INJECT_FAULT", "listener-attach");
    auto f = c.attach(called.pid(), options_for(log_));
    ASSERT_TRUE(f.ok()) << describe(f.error());
    EXPECT_TRUE(f->agent_loaded_now);
  }
  for (pid_t pid : {hooked.pid(), called.pid()}) {
    auto st = status_or_throw(pid);
    EXPECT_TRUE(st.attached);
    EXPECT_EQ(st.loader_attached, pid == hooked.pid()) << "the attach was not made the way asked for";
    const auto lines = log_.find("a:tool_attach", pid);
    ASSERT_EQ(lines.size(), 1u) << log_.dump();
    EXPECT_EQ(lines[0].tid, st.listener_tid) << "not on the listener thread: " << lines[0].raw;
  }
  EXPECT_EQ(dontfork_mappings(hooked.pid()), dontfork_before) << "our scratch is still mapped";
  EXPECT_EQ(anonymous_bytes(hooked.pid()) - hooked_before, anonymous_bytes(called.pid()) - called_before)
      << "the two ways of attaching left different anonymous memory mapped";
  EXPECT_EQ(dontfork_mappings(called.pid()), dontfork_mappings(hooked.pid()));
  ASSERT_TRUE(c.detach(hooked.pid()).ok());
  ASSERT_TRUE(c.detach(called.pid()).ok());
}

// A tool without remora_configure_attach: kNotAttachable, naming the
// missing export; nothing of the list is loaded or called.
TEST_F(AttachErrors, ToolWithoutConfigureAttachIsNotAttachable) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  const int dontfork_before = dontfork_mappings(pid);
  Controller c;
  auto r = c.attach(pid, options_for(log_, {kToolNoAttach}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kNotAttachable) << describe(r.error());
  // The agent removed the scratch that loaded it, although the attach failed.
  EXPECT_EQ(dontfork_mappings(pid), dontfork_before);
  EXPECT_TRUE(contains_icase(r.error().to_string(), "remora_configure_attach")) << describe(r.error());
  EXPECT_TRUE(log_.lines().empty()) << log_.dump();
  auto st = status_or_throw(pid);
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.tools, "");

  // In a list with an attachable tool first: the whole list is refused and
  // the first tool, already initialised, is finalised again.
  r = c.attach(pid, options_for(log_, {kToolA, kToolNoAttach}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kNotAttachable) << describe(r.error());
  EXPECT_EQ(log_.find("a:tool_attach").size(), 0u) << log_.dump();
  EXPECT_EQ(log_.find("a:tool_init").size(), log_.find("a:tool_fini").size()) << log_.dump();
  EXPECT_EQ(status_or_throw(pid).tools, "");

  // The process is still attachable with a proper tool.
  auto good = c.attach(pid, options_for(log_));
  ASSERT_TRUE(good.ok()) << describe(good.error());
}

// A re-attach naming another tool list is refused with the list that is
// loaded; an attach while attached is kAlreadyAttached.
TEST_F(AttachErrors, ReattachWithAnotherToolList) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());

  auto twice = c.attach(pid, options_for(log_));
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code(), Errc::kAlreadyAttached) << describe(twice.error());

  auto d = c.detach(pid);
  ASSERT_TRUE(d.ok()) << describe(d.error());
  for (const auto& tools : {std::vector<std::string>{kToolB}, std::vector<std::string>{kToolA, kToolB},
                            std::vector<std::string>{kToolB, kToolA}}) {
    auto other = c.attach(pid, options_for(log_, tools));
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.error().code(), Errc::kInvalidArgument) << describe(other.error());
    EXPECT_TRUE(contains_icase(other.error().to_string(), real(kToolA)))
        << "does not say what is loaded: " << describe(other.error());
  }
  EXPECT_EQ(log_.find("b:configure").size(), 0u) << log_.dump();
  auto st = status_or_throw(pid);
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.tools, real(kToolA));
  EXPECT_EQ(st.sessions, 1u);
  // The right list still works.
  auto ok = c.attach(pid, options_for(log_));
  ASSERT_TRUE(ok.ok()) << describe(ok.error());
}

// Detach without attach: with no agent in the process, and with the agent
// in but the tools detached.
TEST_F(AttachErrors, DetachWithoutAttach) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  Controller c;
  auto d = c.detach(pid);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), Errc::kNotAttached) << describe(d.error());
  EXPECT_FALSE(agent_mapped(pid)) << "a detach loaded the agent";

  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  ASSERT_TRUE(c.detach(pid).ok());
  d = c.detach(pid);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), Errc::kNotAttached) << describe(d.error());
  EXPECT_EQ(log_.find("a:tool_detach").size(), 1u) << log_.dump();
}

// A pid with no process (a child we reaped).
TEST_F(AttachErrors, MissingProcess) {
  pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  int st;
  ASSERT_EQ(waitpid(gone, &st, 0), gone);
  Controller c;
  auto r = c.attach(gone, options_for(log_));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kNoSuchProcess) << describe(r.error());
  auto d = c.detach(gone);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), Errc::kNoSuchProcess) << describe(d.error());
  auto s = Controller::status(gone);
  EXPECT_FALSE(s.ok());
  auto tree = c.attach_tree(gone, options_for(log_));
  ASSERT_FALSE(tree.ok());
  EXPECT_EQ(tree.error().code(), Errc::kNoSuchProcess) << describe(tree.error());
}

// Every Controller entry point refuses a zombie first, in the words of
// remote::Target::open (what `remora call` says), with its own context.
TEST_F(AttachErrors, ZombieIsRefusedAsSuchEverywhere) {
  pid_t z = fork();
  ASSERT_GE(z, 0);
  if (z == 0) _exit(0);
  struct Reap {
    pid_t pid;
    ~Reap() {
      int st;
      waitpid(pid, &st, 0);
    }
  } reap{z};
  ASSERT_TRUE(wait_for([&] { return process_state(z) == 'Z'; }, after(10s)));
  const std::string p = std::to_string(z);
  const std::string refusal = "process " + p + " is a zombie: it has exited and waits for its parent (" +
                              std::to_string(getpid()) + ") to reap it; there is nothing left to trace";
  auto opened = remote::Target::open(z);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.error().to_string(), "open process " + p + ": " + refusal);
  Controller c;
  auto a = c.attach(z, options_for(log_));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), Errc::kZombie);
  EXPECT_EQ(a.error().to_string(), "attach to process " + p + ": " + refusal);
  auto t = c.attach_tree(z, options_for(log_));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().to_string(), "attach to process " + p + ": " + refusal);
  auto d = c.detach(z);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().to_string(), "detach from process " + p + ": " + refusal);
  auto dt = c.detach_tree(z, attach::DetachOptions{});
  ASSERT_FALSE(dt.ok());
  EXPECT_EQ(dt.error().to_string(), "detach from process " + p + ": " + refusal);
  auto s = Controller::status(z);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().to_string(), refusal);
  EXPECT_TRUE(log_.lines().empty()) << log_.dump();
}

// A statically linked process: refused before any tool is looked for (a
// missing tool would say otherwise), for the tree too (it has no children).
TEST_F(AttachErrors, StaticBinaryIsRefusedFirst) {
  TargetProcess target("remora_target_static");
  const std::string p = std::to_string(target.pid());
  const std::string refusal =
      "process " + p +
      " is statically linked (no dynamic loader, no libc.so): Remora loads its agent and "
      "tools through the target's shared libc and cannot attach tools to it";
  Controller c;
  for (bool tree : {false, true}) {
    auto opts = options_for(log_, {"/nonexistent/libremora-no-such-tool.so"});
    std::optional<Error> e;
    if (tree) {
      if (auto r = c.attach_tree(target.pid(), opts); !r) e = r.error();
    } else {
      if (auto r = c.attach(target.pid(), opts); !r) e = r.error();
    }
    ASSERT_TRUE(e.has_value()) << tree;
    EXPECT_EQ(e->code(), Errc::kStaticBinary) << tree;
    EXPECT_EQ(e->to_string(), "attach to process " + p + ": " + refusal) << tree;
  }
  auto s = Controller::status(target.pid());
  ASSERT_TRUE(s.ok()) << describe(s.error());  // status reads: no refusal
  EXPECT_FALSE(s->agent_loaded);
}

// A kernel thread, and a process gone: the same words as the remote layer's.
TEST_F(AttachErrors, KernelThreadAndGoneAreRefusedAsByTheRemoteLayer) {
  Controller c;
  std::vector<pid_t> pids;
  if (auto kt = find_kernel_thread()) pids.push_back(*kt);
  pid_t gone = fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  int st;
  ASSERT_EQ(waitpid(gone, &st, 0), gone);
  pids.push_back(gone);
  for (pid_t pid : pids) {
    const std::string p = std::to_string(pid);
    auto opened = remote::Target::open(pid);
    ASSERT_FALSE(opened.ok());
    const std::string refusal = opened.error().to_string().substr(("open process " + p + ": ").size());
    auto a = c.attach(pid, options_for(log_));
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.error().code(), opened.error().code());
    EXPECT_EQ(a.error().to_string(), "attach to process " + p + ": " + refusal);
    auto t = c.attach_tree(pid, options_for(log_));
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().to_string(), "attach to process " + p + ": " + refusal);
    auto s = Controller::status(pid);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().to_string(), refusal);
  }
}

// The target exits in the middle of the attach (its thread polls its maps
// and exits as soon as the agent is mapped): the error says so. Repeated,
// because the attach can be at several steps when the process goes.
TEST_F(AttachErrors, TargetExitingDuringAttach) {
  std::map<std::string, int> seen;
  for (int round = 0; round < 5; ++round) {
    TargetProcess target("remora_attach_target", {"exiter"});
    const pid_t pid = target.pid();
    Controller c;
    auto r = c.attach(pid, options_for(log_));
    ASSERT_FALSE(r.ok()) << "round " << round << ": the attach succeeded although the target exited";
    seen[std::string(errc_name(r.error().code()))]++;
    EXPECT_TRUE(r.error().code() == Errc::kTargetExited || r.error().code() == Errc::kNoSuchProcess ||
                r.error().code() == Errc::kZombie)
        << "round " << round << ": a target that exited is reported as " << describe(r.error());
    ASSERT_TRUE(target.process().wait_exit(after(10s)).has_value()) << "round " << round;
  }
  for (const auto& [code, n] : seen) printf("  %s x%d\n", code.c_str(), n);
}

// Tool and agent paths that do not exist.
TEST_F(AttachErrors, MissingToolOrAgentLibrary) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  const int dontfork_before = dontfork_mappings(pid);
  Controller c;
  const std::string missing = "/nonexistent/libremora-no-such-tool.so";
  auto r = c.attach(pid, options_for(log_, {missing}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kInvalidArgument) << describe(r.error());
  EXPECT_TRUE(contains_icase(r.error().to_string(), missing)) << describe(r.error());
  EXPECT_FALSE(status_or_throw(pid).attached);
  // The agent got loaded before the tool was found missing: the scratch that
  // loaded it is removed all the same, without an attach call to carry it.
  EXPECT_TRUE(agent_mapped(pid));
  EXPECT_EQ(dontfork_mappings(pid), dontfork_before);

  // Also when it follows a good tool: nothing gets loaded.
  r = c.attach(pid, options_for(log_, {kToolA, missing}));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains_icase(r.error().to_string(), missing)) << describe(r.error());
  EXPECT_TRUE(log_.lines().empty()) << log_.dump();

  auto opts = options_for(log_);
  opts.tools.clear();
  r = c.attach(pid, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kInvalidArgument) << describe(r.error());

  TargetProcess fresh("remora_attach_target");
  opts = options_for(log_);
  opts.agent_path = "/nonexistent/libremora-agent.so";
  r = c.attach(fresh.pid(), opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kInvalidArgument) << describe(r.error());
  EXPECT_TRUE(contains_icase(r.error().to_string(), opts.agent_path)) << describe(r.error());
  EXPECT_FALSE(agent_mapped(fresh.pid()));
}

}  // namespace
}  // namespace remora::test
