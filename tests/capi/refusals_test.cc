// The refusals about the process itself through the C API (remora.h): a
// process that is gone, a zombie, a kernel thread, traced by another, or
// statically linked is refused by remora_check_target, remora_attach and
// remora_attach_tree first — before the options are looked at — with the
// status and the message of the attach; remora_detach and remora_status
// refuse the ones that concern them. A zombie child in a tree is no failure
// of the others.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "capi_test_util.h"
#include "remora/remora.h"

namespace {

using capi_test::Clock;
using capi_test::proc_state;
using capi_test::read_file;
using capi_test::TargetTree;

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// A child of this test that exited and is not reaped until the end.
class Zombie {
 public:
  Zombie() {
    pid_ = ::fork();
    if (pid_ == 0) _exit(0);
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (pid_ > 0 && proc_state(pid_) != 'Z' && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~Zombie() {
    int st;
    if (pid_ > 0) ::waitpid(pid_, &st, 0);
  }
  bool ready() const { return pid_ > 0 && proc_state(pid_) == 'Z'; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// A child of this test that PTRACE_SEIZEs `target` (which runs on), says so
// over a pipe, and holds it until the destructor kills it.
class Tracer {
 public:
  explicit Tracer(pid_t target) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      char ok = ::ptrace(PTRACE_SEIZE, target, nullptr, nullptr) == 0 ? 'y' : 'n';
      (void)!::write(p[1], &ok, 1);
      for (;;) ::pause();
    }
    ::close(p[1]);
    pollfd pf{p[0], POLLIN, 0};
    char c = 0;
    if (::poll(&pf, 1, 10000) == 1 && ::read(p[0], &c, 1) == 1) seized_ = c == 'y';
    ::close(p[0]);
  }
  ~Tracer() {
    if (pid_ <= 0) return;
    int st;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
  }
  bool seized() const { return seized_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool seized_ = false;
};

// remora_cli_target_static 0 READY: its pid once it wrote its ready file.
class StaticTarget {
 public:
  explicit StaticTarget(const std::string& dir) {
    const std::string ready = dir + "/ready-static";
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const char* argv[] = {REMORA_STATIC_TARGET, "0", ready.c_str(), nullptr};
      ::execv(REMORA_STATIC_TARGET, const_cast<char**>(argv));
      _exit(127);
    }
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (pid_ > 0 && read_file(ready).empty() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ready_ = !read_file(ready).empty();
  }
  ~StaticTarget() {
    int st;
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
  }
  bool ready() const { return ready_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

pid_t gone_pid() {
  pid_t p = ::fork();
  if (p == 0) _exit(0);
  int st;
  ::waitpid(p, &st, 0);
  return p;
}

bool kthreadd_is_pid_2() { return read_file("/proc/2/status").find("kthreadd") != std::string::npos; }

class CapiRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("REMORA_AGENT_PATH", REMORA_AGENT_PATH_BUILT, 0);
    ASSERT_EQ(remora_options_init(&opts_), REMORA_STATUS_SUCCESS);
    opts_.tools = REMORA_HOOK_TOOL_A;
  }

  // Every attach entry point refuses `pid` with `status` and the first line
  // `message`; so does one given options it would refuse otherwise (no tool):
  // the process comes first. (Only options that cannot be read at all, NULL
  // or too small, are said before it: the caller's bug.)
  void expect_refused(pid_t pid, remora_status_t status, const std::string& message, bool prefix = false) {
    remora_options_t no_tool;
    ASSERT_EQ(remora_options_init(&no_tool), REMORA_STATUS_SUCCESS);
    struct Case {
      const char* what;
      remora_status_t got;
      std::string error;
    };
    auto run = [&](const char* what, remora_status_t s) { return Case{what, s, remora_last_error()}; };
    remora_options_t children = opts_;
    children.attach_children = true;
    Case cases[] = {
        run("check", remora_check_target(pid, 0)),
        run("check tree", remora_check_target(pid, REMORA_CHECK_TREE)),
        run("attach", remora_attach(pid, &opts_)),
        run("attach children", remora_attach(pid, &children)),
        run("attach tree", remora_attach_tree(pid, &opts_)),
        run("attach, no tool", remora_attach(pid, &no_tool)),
        run("attach tree, no tool", remora_attach_tree(pid, &no_tool)),
    };
    for (const auto& c : cases) {
      EXPECT_EQ(c.got, status) << c.what << ": " << remora_status_name(c.got) << ": " << c.error;
      const std::string line = first_line(c.error);
      if (prefix)
        EXPECT_EQ(line.rfind(message, 0), 0u) << c.what << ": " << line;
      else
        EXPECT_EQ(line, message) << c.what;
    }
  }

  remora_options_t opts_;
};

TEST_F(CapiRefusals, GoneProcess) {
  const pid_t pid = gone_pid();
  const std::string p = std::to_string(pid);
  expect_refused(
      pid, REMORA_STATUS_NO_SUCH_PROCESS,
      "attach to process " + p + ": no process " + p + " (it may have exited); check the pid with ps");
  EXPECT_EQ(remora_detach(pid), REMORA_STATUS_NO_SUCH_PROCESS) << remora_last_error();
  remora_agent_state_t st{};
  st.size = sizeof st;
  EXPECT_EQ(remora_status(pid, &st), REMORA_STATUS_NO_SUCH_PROCESS) << remora_last_error();
}

TEST_F(CapiRefusals, Zombie) {
  Zombie z;
  ASSERT_TRUE(z.ready());
  const std::string p = std::to_string(z.pid());
  const std::string refusal = "process " + p + " is a zombie: it has exited and waits for its parent (" +
                              std::to_string(::getpid()) + ") to reap it; there is nothing left to trace";
  expect_refused(z.pid(), REMORA_STATUS_ZOMBIE, "attach to process " + p + ": " + refusal);
  EXPECT_EQ(remora_detach(z.pid()), REMORA_STATUS_ZOMBIE) << remora_last_error();
  EXPECT_NE(std::string(remora_last_error()).find(refusal), std::string::npos) << remora_last_error();
  EXPECT_EQ(remora_detach_tree(z.pid()), REMORA_STATUS_ZOMBIE) << remora_last_error();
  remora_agent_state_t st{};
  st.size = sizeof st;
  EXPECT_EQ(remora_status(z.pid(), &st), REMORA_STATUS_ZOMBIE) << remora_last_error();
  EXPECT_NE(std::string(remora_last_error()).find(refusal), std::string::npos) << remora_last_error();
}

TEST_F(CapiRefusals, KernelThread) {
  if (!kthreadd_is_pid_2()) GTEST_SKIP() << "pid 2 is not kthreadd here (a pid namespace)";
  expect_refused(
      2, REMORA_STATUS_KERNEL_THREAD,
      "attach to process 2: process 2 (kthreadd) is a kernel thread: it has no user space to trace; "
      "pick a user-space process");
  EXPECT_EQ(remora_detach(2), REMORA_STATUS_KERNEL_THREAD) << remora_last_error();
  remora_agent_state_t st{};
  st.size = sizeof st;
  EXPECT_EQ(remora_status(2, &st), REMORA_STATUS_KERNEL_THREAD) << remora_last_error();
}

TEST_F(CapiRefusals, TracedByAnother) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  Tracer tracer(t.root());
  if (!tracer.seized()) GTEST_SKIP() << "a sibling may not PTRACE_SEIZE here (Yama ptrace_scope?)";
  const std::string p = std::to_string(t.root());
  expect_refused(t.root(), REMORA_STATUS_TRACED_BY_OTHER,
                 "attach to process " + p + ": process " + p + " is already traced by process " +
                     std::to_string(tracer.pid()) + " (",
                 /*prefix=*/true);
  EXPECT_EQ(remora_detach(t.root()), REMORA_STATUS_TRACED_BY_OTHER) << remora_last_error();
  // Reading the agent's state stops nothing: no refusal.
  remora_agent_state_t st{};
  st.size = sizeof st;
  EXPECT_EQ(remora_status(t.root(), &st), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_FALSE(st.agent_loaded);
}

TEST_F(CapiRefusals, StaticBinary) {
  capi_test::TempDir dir;
  StaticTarget s(dir.path());
  ASSERT_TRUE(s.ready());
  const std::string p = std::to_string(s.pid());
  expect_refused(
      s.pid(), REMORA_STATUS_STATIC_BINARY,
      "attach to process " + p + ": process " + p +
          " is statically linked (no dynamic loader, no libc.so): Remora loads its agent and tools "
          "through the target's shared libc and cannot attach tools to it");
  remora_agent_state_t st{};
  st.size = sizeof st;
  EXPECT_EQ(remora_status(s.pid(), &st), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_FALSE(st.agent_loaded);
}

TEST_F(CapiRefusals, OwnProcess) {
  const std::string p = std::to_string(::getpid());
  EXPECT_EQ(remora_check_target(::getpid(), 0), REMORA_STATUS_OWN_PROCESS);
  EXPECT_EQ(first_line(remora_last_error()),
            "attach to process " + p + ": pid " + p +
                " is this process itself; a process cannot trace itself: run remora from another process");
  EXPECT_EQ(remora_attach(::getpid(), &opts_), REMORA_STATUS_OWN_PROCESS) << remora_last_error();
  EXPECT_EQ(remora_check_target(::getpid(), 0x80), REMORA_STATUS_INVALID_ARGUMENT);
}

// A tree whose root forked a child that exited: the zombie is no failure,
// the root is attached and detached.
TEST_F(CapiRefusals, ZombieChildDoesNotFailTheTree) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  int hold[2];
  ASSERT_EQ(::pipe2(hold, O_CLOEXEC), 0);
  pid_t root = ::fork();
  if (root == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    pid_t z = ::fork();
    if (z == 0) _exit(0);
    (void)!::write(p[1], &z, sizeof z);
    char c;
    (void)!::read(hold[0], &c, 1);  // until the test closes it; z stays a zombie
    _exit(0);
  }
  ::close(p[1]);
  ::close(hold[0]);
  pid_t zombie = 0;
  pollfd pf{p[0], POLLIN, 0};
  ASSERT_EQ(::poll(&pf, 1, 10000), 1);
  ASSERT_EQ(::read(p[0], &zombie, sizeof zombie), static_cast<ssize_t>(sizeof zombie));
  ::close(p[0]);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (proc_state(zombie) != 'Z' && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_EQ(proc_state(zombie), 'Z');
  EXPECT_EQ(remora_attach_tree(root, &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();
  remora_agent_state_t st{};
  st.size = sizeof st;
  EXPECT_EQ(remora_status(root, &st), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_TRUE(st.attached);
  EXPECT_EQ(remora_detach(root), REMORA_STATUS_SUCCESS) << remora_last_error();
  ::close(hold[1]);
  int ws;
  ::kill(root, SIGKILL);
  ::waitpid(root, &ws, 0);
}

}  // namespace
