// Process control: launch stop, events, errors and close modes, against the
// real programs ctl_prog, libctl_preload.so and libctl_plugin.so.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "arch/arch.h"
#include "control/process.h"
#include "ptrace/ptrace.h"
#include "remote/target.h"

namespace fs = std::filesystem;
using namespace remora;
using namespace remora::control;
using namespace std::chrono_literals;

extern char** environ;

namespace {

class ControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/remora-ctl-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (pid_t p : spawned_) {
      ::kill(p, SIGKILL);
      int st;
      ::waitpid(p, &st, 0);
    }
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::vector<std::string> env() const {
    std::vector<std::string> e;
    for (char** p = environ; *p != nullptr; ++p)
      if (std::strncmp(*p, "LD_PRELOAD=", 11) != 0) e.emplace_back(*p);
    e.push_back("CTL_DIR=" + dir_);
    return e;
  }
  LaunchOptions opts(std::vector<std::string> args, bool preload = false) const {
    LaunchOptions o;
    o.argv = {CTL_PROG};
    for (auto& a : args) o.argv.push_back(a);
    o.env = env();
    if (preload) o.ld_preload = CTL_PRELOAD;
    return o;
  }
  bool has(const std::string& m) const { return fs::exists(dir_ + "/" + m); }
  static ContOptions copts(bool child = false) {
    ContOptions c;
    c.want_child = child;
    c.deadline = Deadline::after(30s);
    return c;
  }
  static bool lists(const std::vector<LoadedObject>& objs, const std::string& needle) {
    for (auto& o : objs)
      if (o.name.find(needle) != std::string::npos) return true;
    return false;
  }
  // Runs until EXIT, returning its status; counts the dlopen/dlclose events.
  static int run_to_exit(Process& p, int* opens = nullptr, int* closes = nullptr) {
    for (int i = 0; i < 100000; ++i) {
      auto ev = p.cont(copts());
      EXPECT_TRUE(ev.ok()) << (ev.ok() ? "" : ev.error().to_string());
      if (!ev.ok()) return -1;
      if (ev->kind == Event::Kind::kDlopen && opens) ++*opens;
      if (ev->kind == Event::Kind::kDlclose && closes) ++*closes;
      if (ev->kind == Event::Kind::kExit) return ev->exit_status;
      if (ev->kind == Event::Kind::kGone) return -2;
    }
    return -3;
  }
  // Starts ctl_prog untraced (for open) and waits for its "ready" marker.
  pid_t spawn(std::vector<std::string> args) {
    auto e = env();
    std::vector<std::string> a = {CTL_PROG};
    for (auto& s : args) a.push_back(s);
    pid_t c = fork();
    if (c == 0) {
      std::vector<char*> av, ev;
      for (auto& s : a) av.push_back(s.data());
      av.push_back(nullptr);
      for (auto& s : e) ev.push_back(s.data());
      ev.push_back(nullptr);
      execve(CTL_PROG, av.data(), ev.data());
      _exit(127);
    }
    spawned_.push_back(c);
    auto dl = Deadline::after(10s);
    while (!has("ready") && !dl.expired()) std::this_thread::sleep_for(1ms);
    EXPECT_TRUE(has("ready"));
    return c;
  }
  int reap(pid_t c) {
    int st = -1;
    auto dl = Deadline::after(10s);
    while (!dl.expired()) {
      if (::waitpid(c, &st, WNOHANG) == c) {
        spawned_.erase(std::remove(spawned_.begin(), spawned_.end(), c), spawned_.end());
        return st;
      }
      std::this_thread::sleep_for(1ms);
    }
    return -1;
  }
  void touch(const std::string& m) { std::ofstream(dir_ + "/" + m) << "1"; }
  bool wait_marker(const std::string& m) {
    auto dl = Deadline::after(10s);
    while (!has(m) && !dl.expired()) std::this_thread::sleep_for(1ms);
    return has(m);
  }

  std::string dir_;
  std::vector<pid_t> spawned_;
};

TEST_F(ControlTest, LaunchStopsBeforeConstructorsWithPreloadMapped) {
  auto p = Process::launch(opts({"exit", "7"}, true));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_FALSE(has("exe_ctor"));
  EXPECT_FALSE(has("preload_ctor"));
  EXPECT_FALSE(has("main"));
  EXPECT_TRUE(lists((*p)->objects(), "libctl_preload.so"));
  EXPECT_TRUE(lists((*p)->objects(), "libc.so"));
  EXPECT_EQ((*p)->objects().front().name, fs::canonical(CTL_PROG).string());
  for (auto& o : (*p)->objects())
    if (o.name.find("libc.so") != std::string::npos) {
      EXPECT_FALSE(o.build_id.empty());
    }
  EXPECT_EQ((*p)->threads(), std::vector<pid_t>{(*p)->pid()});
  int st = run_to_exit(**p);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 7);
  EXPECT_TRUE(has("exe_ctor"));
  EXPECT_TRUE(has("preload_ctor"));
  EXPECT_TRUE(has("main"));
  auto gone = (*p)->cont(copts());
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->kind, Event::Kind::kGone);
  EXPECT_FALSE((*p)->alive());
}

TEST_F(ControlTest, NoBreakpointLeftAtStops) {
  auto p = Process::launch(opts({"dl", "3", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto fn = (*p)->find_symbol("ld-linux", "_dl_debug_state");
  ASSERT_TRUE(fn.ok()) << fn.error().to_string();
  for (int i = 0; i < 4; ++i) {
    std::byte b{};
    ASSERT_TRUE((*p)->read(*fn, std::span(&b, 1)).ok());
    EXPECT_NE(b, std::byte{0xCC});
    auto ev = (*p)->cont(copts());
    ASSERT_TRUE(ev.ok());
  }
}

TEST_F(ControlTest, DlopenDlcloseEvents) {
  auto p = Process::launch(opts({"dl", "25", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  for (int i = 0; i < 25; ++i) {
    auto ev = (*p)->cont(copts());
    ASSERT_TRUE(ev.ok()) << ev.error().to_string();
    ASSERT_EQ(ev->kind, Event::Kind::kDlopen) << i;
    ASSERT_EQ(ev->added.size(), 1u);
    EXPECT_NE(ev->added[0].name.find("libctl_plugin.so"), std::string::npos);
    EXPECT_NE(ev->added[0].base, 0u);
    EXPECT_FALSE(ev->added[0].build_id.empty());
    EXPECT_TRUE(lists((*p)->objects(), "libctl_plugin.so"));
    ev = (*p)->cont(copts());
    ASSERT_TRUE(ev.ok());
    ASSERT_EQ(ev->kind, Event::Kind::kDlclose) << i;
    ASSERT_EQ(ev->removed.size(), 1u);
    EXPECT_FALSE(lists((*p)->objects(), "libctl_plugin.so"));
  }
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

TEST_F(ControlTest, ForkWithoutChildHandleChildRunsFreeWithoutBreakpoints) {
  auto p = Process::launch(opts({"fork", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto ev = (*p)->cont(copts());
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kFork);
  EXPECT_GT(ev->child_pid, 0);
  EXPECT_FALSE(ev->vfork);
  EXPECT_EQ(ev->child, nullptr);
  int opens = 0;
  int st = run_to_exit(**p, &opens);
  // 3: the child's dlopen loop ran without tripping over a breakpoint of ours.
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 3);
  EXPECT_EQ(opens, 1);  // the parent's own dlopen
  EXPECT_TRUE(has("child"));
}

TEST_F(ControlTest, ForkWithChildHandle) {
  auto p = Process::launch(opts({"fork", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto ev = (*p)->cont(copts(true));
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kFork);
  ASSERT_NE(ev->child, nullptr);
  Process& c = *ev->child;
  EXPECT_EQ(c.pid(), ev->child_pid);
  EXPECT_FALSE(has("child"));  // stopped at the end of fork
  EXPECT_TRUE(lists(c.objects(), "libc.so"));
  int opens = 0, closes = 0;
  int cst = run_to_exit(c, &opens, &closes);
  EXPECT_EQ(opens, 3);
  EXPECT_EQ(closes, 3);
  ASSERT_TRUE(WIFEXITED(cst));
  EXPECT_EQ(WEXITSTATUS(cst), 3);
  auto g = c.cont(copts());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->kind, Event::Kind::kGone);
  ASSERT_TRUE(c.close().ok());
  int st = run_to_exit(**p);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 3);
}

TEST_F(ControlTest, VforkThenExec) {
  auto p = Process::launch(opts({"vforkexec", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto ev = (*p)->cont(copts());
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kFork);
  EXPECT_TRUE(ev->vfork);
  int opens = 0;
  int st = run_to_exit(**p, &opens);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 6);
  EXPECT_EQ(opens, 2);
}

TEST_F(ControlTest, VforkChildHandleFollowsExec) {
  auto p = Process::launch(opts({"vforkexec", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto ev = (*p)->cont(copts(true));
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kFork);
  ASSERT_NE(ev->child, nullptr);
  auto cev = ev->child->cont(copts());
  ASSERT_TRUE(cev.ok()) << cev.error().to_string();
  EXPECT_EQ(cev->kind, Event::Kind::kExec);
  int cst = run_to_exit(*ev->child);
  EXPECT_TRUE(WIFEXITED(cst) && WEXITSTATUS(cst) == 6) << cst;
  // The parent waits for this child: release it (it is exiting) first.
  ASSERT_TRUE(ev->child->close().ok());
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 6);
}

// Following a vfork child in short slices, as `remora events --follow`
// does: while its child is held, the parent sits in vfork and cannot stop,
// so its slice ends on time instead of waiting for it; and the child's exec
// is reported even when its loading outlasts a slice.
TEST_F(ControlTest, VforkInShortSlices) {
  auto p = Process::launch(opts({"vforkexec", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto ev = (*p)->cont(copts(true));
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kFork);
  ASSERT_TRUE(ev->vfork);
  ASSERT_NE(ev->child, nullptr);
  auto slice = [](std::chrono::microseconds d) {
    ContOptions c;
    c.want_child = true;
    c.deadline = Deadline::after(d);
    return c;
  };
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto pev = (*p)->cont(slice(20ms));
    ASSERT_FALSE(pev.ok()) << "the parent moved while its vfork child is held: "
                           << event_kind_name(pev->kind);
    EXPECT_EQ(pev.error().code(), Errc::kTimedOut) << pev.error().to_string();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "the slice waited for a parent that cannot stop";
  }
  // 0.2 ms slices: the child's first event is its exec, whole.
  Result<Event> cev = Error(Errc::kTimedOut, "no slice ran");
  for (int i = 0; i < 10000; ++i) {
    cev = ev->child->cont(slice(200us));
    if (cev.ok() || cev.error().code() != Errc::kTimedOut) break;
  }
  ASSERT_TRUE(cev.ok()) << cev.error().to_string();
  EXPECT_EQ(cev->kind, Event::Kind::kExec) << event_kind_name(cev->kind);
  EXPECT_TRUE(lists(cev->added, "libc.so"));
  int cst = run_to_exit(*ev->child);
  EXPECT_TRUE(WIFEXITED(cst) && WEXITSTATUS(cst) == 6) << cst;
  ASSERT_TRUE(ev->child->close().ok());
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 6);
}

TEST_F(ControlTest, ExecResynchronises) {
  auto p = Process::launch(opts({"exec"}, true));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  ::unlink((dir_ + "/exe_ctor").c_str());
  auto ev = (*p)->cont(copts());
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kExec);
  // Stopped in the new image before its constructors, link map loaded.
  EXPECT_EQ(std::ifstream(dir_ + "/exe_ctor").rdbuf()->in_avail() >= 0, true);
  EXPECT_TRUE(lists((*p)->objects(), "libc.so"));
  int st = run_to_exit(**p);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 5);
}

TEST_F(ControlTest, ExecFromSecondThread) {
  auto p = Process::launch(opts({"threadexec"}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  pid_t pid = (*p)->pid();
  auto ev = (*p)->cont(copts());
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  ASSERT_EQ(ev->kind, Event::Kind::kExec);
  EXPECT_EQ((*p)->threads(), std::vector<pid_t>{pid});
  EXPECT_EQ((*p)->pid(), pid);
  int st = run_to_exit(**p);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 5);
}

TEST_F(ControlTest, DeathBySignalIsTargGone) {
  for (const char* mode : {"kill", "term"}) {
    auto p = Process::launch(opts({mode}));
    ASSERT_TRUE(p.ok()) << p.error().to_string();
    auto ev = (*p)->cont(copts());
    ASSERT_TRUE(ev.ok()) << ev.error().to_string();
    EXPECT_EQ(ev->kind, Event::Kind::kGone) << mode;
    EXPECT_EQ(ev->signal, std::string(mode) == "kill" ? SIGKILL : SIGTERM);
    EXPECT_FALSE((*p)->cont(copts()).ok());
  }
}

TEST_F(ControlTest, InterruptFromAnotherThread) {
  auto p = Process::launch(opts({"loop"}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  Process* raw = p->get();
  std::thread t([raw] {
    std::this_thread::sleep_for(100ms);
    raw->interrupt();
  });
  auto ev = (*p)->cont(copts());
  t.join();
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  EXPECT_EQ(ev->kind, Event::Kind::kIntr);
  EXPECT_TRUE(has("main"));
  // Still controllable afterwards.
  touch("quit");
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

TEST_F(ControlTest, ContDeadline) {
  auto p = Process::launch(opts({"loop"}));
  ASSERT_TRUE(p.ok());
  ContOptions c;
  c.deadline = Deadline::after(50ms);
  auto ev = (*p)->cont(c);
  ASSERT_FALSE(ev.ok());
  EXPECT_EQ(ev.error().code(), Errc::kTimedOut);
  EXPECT_TRUE((*p)->alive());
}

TEST_F(ControlTest, ManyThreadsThroughHundredsOfConts) {
  // 16 threads compute while the main thread dlopens/dlcloses 150 times: 300
  // events, each a stop of every thread. The program checks its own result.
  auto p = Process::launch(opts({"threads", "16", CTL_PLUGIN}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  int opens = 0, closes = 0;
  int st = run_to_exit(**p, &opens, &closes);
  ASSERT_TRUE(WIFEXITED(st)) << st;
  EXPECT_EQ(WEXITSTATUS(st), 0);
  EXPECT_EQ(opens, 150);
  EXPECT_EQ(closes, 150);
}

TEST_F(ControlTest, OpenRunningProcessFollowsAndResumes) {
  pid_t c = spawn({"loop", CTL_PLUGIN});
  auto p = Process::open(c);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_FALSE((*p)->launched());
  EXPECT_TRUE(lists((*p)->objects(), "libc.so"));
  touch("go");
  auto ev = (*p)->cont(copts());
  ASSERT_TRUE(ev.ok()) << ev.error().to_string();
  EXPECT_EQ(ev->kind, Event::Kind::kDlopen);
  ev = (*p)->cont(copts());
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->kind, Event::Kind::kDlclose);
  // Busy: a second handle.
  auto again = Process::open(c);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), Errc::kTracedByOther);
  ASSERT_TRUE((*p)->close(CloseMode::kDefault).ok());  // opened: resume
  touch("quit");
  int st = reap(c);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_TRUE(has("cycled"));
}

TEST_F(ControlTest, CloseSuspendLeavesItStopped) {
  pid_t c = spawn({"loop"});
  auto p = Process::open(c);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  ASSERT_TRUE((*p)->close(CloseMode::kSuspend).ok());
  int st = 0;
  auto dl = Deadline::after(5s);
  pid_t r = 0;
  while ((r = ::waitpid(c, &st, WUNTRACED | WNOHANG)) == 0 && !dl.expired()) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(r, c);
  EXPECT_TRUE(WIFSTOPPED(st));
  touch("quit");
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(has("quit_seen"));
  ::kill(c, SIGCONT);
  st = reap(c);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

TEST_F(ControlTest, CloseKillAndDefaultForLaunched) {
  for (auto mode : {CloseMode::kKill, CloseMode::kDefault}) {
    auto p = Process::launch(opts({"loop"}));
    ASSERT_TRUE(p.ok());
    pid_t pid = (*p)->pid();
    ASSERT_TRUE((*p)->close(mode).ok());
    EXPECT_NE(::kill(pid, 0), 0);  // gone and reaped
  }
}

TEST_F(ControlTest, CloseResumeForLaunched) {
  auto p = Process::launch(opts({"loop"}));
  ASSERT_TRUE(p.ok());
  pid_t pid = (*p)->pid();
  ASSERT_TRUE((*p)->close(CloseMode::kResume).ok());
  EXPECT_TRUE(wait_marker("main"));
  touch("quit");
  int st = reap(pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

TEST_F(ControlTest, RemoteCallAtTheLaunchStop) {
  auto p = Process::launch(opts({"exit", "0"}));
  ASSERT_TRUE(p.ok());
  auto fn = (*p)->find_symbol("libc", "getpid");
  ASSERT_TRUE(fn.ok()) << fn.error().to_string();
  auto r = (*p)->call(*fn, {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(static_cast<pid_t>(*r), (*p)->pid());
  EXPECT_FALSE(has("exe_ctor"));
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// Every argument register Process::call fills (six on x86_64, eight on
// aarch64), in order; one argument more is refused before anything runs.
TEST_F(ControlTest, RemoteCallPassesEveryArgumentRegister) {
  auto p = Process::launch(opts({"exit", "0"}));
  ASSERT_TRUE(p.ok());
  auto fn = (*p)->find_symbol("", "ctl_weighted_args");
  ASSERT_TRUE(fn.ok()) << fn.error().to_string();
  const size_t n = arch::kMaxCallArgs;
  std::vector<uint64_t> args = {n};
  long want = 0;
  for (size_t i = 1; i < n; ++i) {
    args.push_back(1000 * i + 7);
    want += static_cast<long>(i * (1000 * i + 7));
  }
  auto r = (*p)->call(*fn, args);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(static_cast<long>(*r), want) << n << " arguments";
  args.push_back(1);
  auto refused = (*p)->call(*fn, args);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), Errc::kInvalidArgument);
  // The thread is as it was: a second call returns the same, and the
  // program still runs to its exit.
  args.pop_back();
  r = (*p)->call(*fn, args);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(static_cast<long>(*r), want);
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

// ---- errors ----

TEST_F(ControlTest, ErrorOwnProcess) {
  auto p = Process::open(getpid());
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), Errc::kOwnProcess);
}

TEST_F(ControlTest, ErrorNoProcess) {
  pid_t c = fork();
  if (c == 0) _exit(0);
  int st;
  waitpid(c, &st, 0);
  auto p = Process::open(c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), Errc::kNoSuchProcess);
  EXPECT_FALSE(Process::open(-4).ok());
}

TEST_F(ControlTest, ErrorStatic) {
  auto o = opts({});
  o.argv = {CTL_STATIC};
  auto p = Process::launch(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), Errc::kStaticBinary);
}

TEST_F(ControlTest, ErrorFileNotFound) {
  auto o = opts({});
  o.argv = {"remora-no-such-program-xyz"};
  auto p = Process::launch(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), Errc::kIo);
  EXPECT_EQ(p.error().sys_errno(), ENOENT);
  o.argv = {"/nonexistent/prog"};
  p = Process::launch(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().sys_errno(), ENOENT);
}

// A bare name is looked up in $PATH. The program is ctl_prog, found through
// a PATH that starts with its directory: a system `true` may be a static
// binary (busybox in the aarch64 guest), which launch refuses.
TEST_F(ControlTest, PathSearch) {
  const fs::path prog(CTL_PROG);
  const char* old = ::getenv("PATH");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(::setenv("PATH", (prog.parent_path().string() + ":" + saved).c_str(), 1), 0);
  LaunchOptions o = opts({"exit", "3"});
  o.argv[0] = prog.filename().string();
  auto p = Process::launch(o);
  if (old != nullptr)
    ::setenv("PATH", saved.c_str(), 1);
  else
    ::unsetenv("PATH");
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3) << "status " << st << ": not ctl_prog's exit 3";
}

TEST_F(ControlTest, ErrorSetuidLaunchRefused) {
  std::string copy = dir_ + "/suid_prog";
  fs::copy_file(CTL_PROG, copy);
  ASSERT_EQ(::chown(copy.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(copy.c_str(), 04755), 0);
  auto o = opts({});
  o.argv = {copy};
  auto p = Process::launch(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), Errc::kPtraceDenied);
  EXPECT_NE(p.error().message().find("set-uid"), std::string::npos);
}

TEST_F(ControlTest, ErrorPtraceRefusedNamesTheRule) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop to another uid";
  pid_t target = spawn({"loop"});
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  pid_t c = fork();
  if (c == 0) {
    close(pfd[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    auto p = Process::open(target);
    std::string msg =
        p.ok() ? "ok" : std::to_string(static_cast<int>(p.error().code())) + " " + p.error().message();
    (void)!write(pfd[1], msg.data(), msg.size());
    _exit(0);
  }
  close(pfd[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = read(pfd[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  close(pfd[0]);
  int st;
  waitpid(c, &st, 0);
  EXPECT_EQ(msg.substr(0, msg.find(' ')), std::to_string(static_cast<int>(Errc::kPtraceDenied))) << msg;
  EXPECT_NE(msg.find("uid"), std::string::npos) << msg;
}

TEST_F(ControlTest, ErrorMissingLibraryBeforeStop) {
  auto o = opts({"exit", "0"});
  o.ld_preload = "/nonexistent/libnothing.so";  // ld.so only warns for a preload
  auto p = Process::launch(o);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st));
}

// ---- the fault rule ----

// A SIGSEGV sent with tgkill while the called function runs is the process's
// signal, not a fault of the call: the call returns its value, and the signal
// reaches the program's own handler afterwards.
TEST_F(ControlTest, SignalSentByKillDuringCallIsNotAFault) {
  pid_t pid = spawn({"loop"});
  auto p = Process::open(pid);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto fn = (*p)->find_symbol("", "ctl_signal_window");
  ASSERT_TRUE(fn.ok()) << fn.error().to_string();
  bool sent = false;
  std::thread sender([&] {
    if (wait_marker("in_call")) sent = ::syscall(SYS_tgkill, pid, pid, SIGSEGV) == 0;
    touch("go_on");
  });
  auto r = (*p)->call(*fn, {}, pid, 20s);
  sender.join();
  ASSERT_TRUE(sent) << "the call never reached its signal window";
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r, 42u);
  touch("quit");
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_TRUE(has("segv_handled")) << "the SIGSEGV sent during the call was swallowed";
}

// A real fault of the called code (a jump to address 0) is one, and the
// thread is restored: the program runs on to its normal exit.
TEST_F(ControlTest, FaultOfTheCalledFunctionIsAFault) {
  auto p = Process::launch(opts({"exit", "3"}));
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  auto r = (*p)->call(RemoteAddr(0), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kFault) << r.error().to_string();
  int st = run_to_exit(**p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3) << st;
}

// ---- the shared open pre-check ----

// /proc/PID/stat as one line (empty when the process is gone).
std::string proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(in, text);
  return text;
}

char proc_state(pid_t pid) {
  const std::string text = proc_stat(pid);
  size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '?' : text[paren + 2];
}

bool is_kernel_thread(pid_t pid) {
  const std::string text = proc_stat(pid);
  size_t paren = text.rfind(')');
  if (paren == std::string::npos) return false;
  std::istringstream rest(text.substr(paren + 2));
  std::string field;
  for (int i = 0; i < 7 && rest >> field; ++i) {  // state ppid pgrp session tty_nr tpgid flags
  }
  return !field.empty() && (std::stoul(field) & 0x00200000u) != 0;  // PF_KTHREAD
}

// remote::Target::open and control::Process::open refuse `pid` with the same
// code and message (context aside).
void expect_same_refusal(pid_t pid, Errc want) {
  auto t = remote::Target::open(pid);
  auto p = Process::open(pid);
  ASSERT_FALSE(t.ok()) << "Target::open(" << pid << ") succeeded";
  ASSERT_FALSE(p.ok()) << "Process::open(" << pid << ") succeeded";
  EXPECT_EQ(t.error().code(), want) << t.error().to_string();
  EXPECT_EQ(p.error().code(), want) << p.error().to_string();
  EXPECT_EQ(t.error().message(), p.error().message());
  EXPECT_NE(p.error().message().find(std::to_string(pid)), std::string::npos) << p.error().message();
}

TEST_F(ControlTest, PrecheckSameRefusalOwnProcessAndThread) {
  expect_same_refusal(getpid(), Errc::kOwnProcess);
  std::atomic<pid_t> tid{0};
  std::atomic<bool> done{false};
  std::thread th([&] {
    tid = static_cast<pid_t>(::gettid());
    while (!done) std::this_thread::yield();
  });
  auto dl = Deadline::after(10s);
  while (tid == 0 && !dl.expired()) std::this_thread::yield();
  pid_t mine = tid;
  if (mine != 0) expect_same_refusal(mine, Errc::kOwnProcess);
  done = true;
  th.join();
  ASSERT_NE(mine, 0) << "the helper thread never started";
  expect_same_refusal(-4, Errc::kInvalidArgument);
}

TEST_F(ControlTest, PrecheckSameRefusalZombie) {
  pid_t c = fork();
  ASSERT_GE(c, 0);
  if (c == 0) _exit(0);
  spawned_.push_back(c);  // reaped by TearDown, even when an assertion fails
  auto dl = Deadline::after(10s);
  while (proc_state(c) != 'Z' && !dl.expired()) std::this_thread::yield();
  ASSERT_EQ(proc_state(c), 'Z');
  expect_same_refusal(c, Errc::kZombie);
}

TEST_F(ControlTest, PrecheckSameRefusalKernelThread) {
  if (!is_kernel_thread(2))
    GTEST_SKIP() << "pid 2 is not a kernel thread here (kthreadd is not visible in this pid namespace)";
  expect_same_refusal(2, Errc::kKernelThread);
}

TEST_F(ControlTest, PrecheckSameRefusalThreadId) {
  pid_t pid = spawn({"threadloop"});
  pid_t other = 0;
  auto dl = Deadline::after(10s);
  while (other == 0 && !dl.expired()) {
    for (auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task")) {
      pid_t t = std::stoi(e.path().filename().string());
      if (t != pid) other = t;
    }
    if (other == 0) std::this_thread::yield();
  }
  ASSERT_NE(other, 0) << "ctl_prog threadloop has no second thread";
  expect_same_refusal(other, Errc::kInvalidArgument);
  touch("quit");
  int st = reap(pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

// Held by a handle of this very process: both refuse at once (no grace
// wait: the tracer is the calling thread), naming the other handle.
TEST_F(ControlTest, PrecheckSameRefusalHeldByAnotherHandle) {
  pid_t pid = spawn({"loop"});
  auto held = Process::open(pid);
  ASSERT_TRUE(held.ok()) << held.error().to_string();
  auto t0 = std::chrono::steady_clock::now();
  expect_same_refusal(pid, Errc::kTracedByOther);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, ptrace::kPassingTracerGrace);
  auto again = Process::open(pid);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().sys_errno(), EBUSY);
  EXPECT_NE(again.error().message().find("another handle"), std::string::npos) << again.error().message();
  ASSERT_TRUE((*held)->close(CloseMode::kResume).ok());
  touch("quit");
  int st = reap(pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

// ---- the wait set (ptrace::wait_any) ----

// Children that block on a pipe until the test closes it (or dies), seized by
// the test; killed and reaped when it ends, whatever happened.
struct SeizedChildren {
  std::vector<pid_t> pids;
  int hold[2] = {-1, -1};
  SeizedChildren() { EXPECT_EQ(pipe(hold), 0); }
  pid_t start(bool seize) {
    pid_t c = fork();
    if (c == 0) {
      close(hold[1]);
      char b;
      while (read(hold[0], &b, 1) < 0 && errno == EINTR) {
      }
      _exit(0);
    }
    pids.push_back(c);
    if (seize) {
      EXPECT_TRUE(ptrace::seize(c, c, 0).ok());
    }
    return c;
  }
  ~SeizedChildren() {
    for (pid_t c : pids) kill(c, SIGKILL);
    for (pid_t c : pids) waitpid(c, nullptr, __WALL);
    close(hold[0]);
    close(hold[1]);
  }
};

TEST(WaitSet, FirstToStopIsReportedAndADeadlinePassesWithNone) {
  SeizedChildren kids;
  const pid_t a = kids.start(true), b = kids.start(true);
  const pid_t bystander = kids.start(false);  // not in the set: its exit must stay ours to reap
  const pid_t both[] = {a, b};

  // Both run (blocked in read): nothing to report before the deadline.
  auto t0 = std::chrono::steady_clock::now();
  auto none = ptrace::wait_any(both, Deadline::after(30ms));
  EXPECT_EQ(none.kind, ptrace::Waited::Kind::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);

  // Only b is stopped: b is reported although a comes first in the set.
  kill(bystander, SIGKILL);
  ASSERT_TRUE(ptrace::interrupt(b).ok());
  auto w = ptrace::wait_any(both, Deadline::after(10s));
  ASSERT_EQ(w.kind, ptrace::Waited::Kind::kStop);
  EXPECT_EQ(w.tid, b);
  EXPECT_EQ(w.stop.kind, ptrace::Stop::Kind::kInterrupt);

  // Its stop was consumed: with b stopped and a running, nothing more.
  none = ptrace::wait_any(both, Deadline::after(10ms));
  EXPECT_EQ(none.kind, ptrace::Waited::Kind::kTimeout);

  // The bystander's exit was left alone (no P_ALL): still ours to reap.
  siginfo_t si{};
  auto dl = Deadline::after(10s);
  while (si.si_pid == 0 && !dl.expired()) {
    ASSERT_EQ(waitid(P_PID, static_cast<id_t>(bystander), &si, WEXITED | WNOHANG | WNOWAIT), 0);
    if (si.si_pid == 0) std::this_thread::yield();
  }
  EXPECT_EQ(si.si_pid, bystander);
  EXPECT_EQ(si.si_code, CLD_KILLED);
}

}  // namespace
