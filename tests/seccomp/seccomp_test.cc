// Remora against targets under seccomp (seccomp_target.c): every refusal is
// Remora's own, made before the target is touched, and the target is alive
// and answering afterwards, in its own words over its pipe.
//
//   cmake --build build -j2 --target seccomp_engine_test remora remora_seccomp_target
//   ctest --test-dir build -L seccomp --output-on-failure
#include "remote/seccomp.h"

#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "harness.h"
#include "remote/target.h"

namespace remora::test {
namespace {

using namespace std::chrono_literals;

const char* const kTarget = REMORA_SECCOMP_TARGET;
const char* const kRemora = REMORA_CLI;

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// A seccomp target in `mode`, ready: "ready PID WORKER_TID".
class Seccomped {
 public:
  explicit Seccomped(std::vector<std::string> argv) {
    proc_ = Spawned::start(argv);
    std::string line = proc_->wait_line(after(10s), "ready");
    long pid = 0, worker = 0;
    if (std::sscanf(line.c_str(), "ready %ld %ld", &pid, &worker) != 2)
      throw HarnessError("seccomp target said '" + line + "', not 'ready PID TID'");
    worker_ = static_cast<pid_t>(worker);
  }
  static std::vector<std::string> args(const std::string& mode, const std::string& extra = "") {
    std::vector<std::string> v{kTarget, mode};
    if (!extra.empty()) v.push_back(extra);
    return v;
  }
  pid_t pid() const { return proc_->pid(); }
  pid_t worker() const { return worker_; }
  // The target's own answer: alive, its loop intact, its pipe working.
  std::string ping() {
    proc_->send("ping");
    return proc_->wait_line(after(5s), "pong");
  }

 private:
  std::unique_ptr<Spawned> proc_;
  pid_t worker_ = 0;
};

// Runs `command` through sh (stderr joined to stdout); its output and exit status.
struct Ran {
  std::string out;
  int status = -1;
};
Ran run_shell(const std::string& command) {
  auto p = Spawned::start({"/bin/sh", "-c", command + " 2>&1"});
  Ran r;
  std::string why;
  while (auto line = p->try_wait_line(after(20s), &why)) r.out += *line + "\n";
  auto st = p->wait_exit(after(10s));
  if (st) r.status = *st;
  return r;
}

class SeccompTest : public IntegrationTest {};

TEST_F(SeccompTest, StrictProcessIsRefusedAtOpen) {
  Seccomped t(Seccomped::args("strict"));
  auto target = remote::Target::open(t.pid());
  ASSERT_FALSE(target.ok());
  EXPECT_EQ(target.error().code(), Errc::kNotSupported);
  EXPECT_TRUE(contains(target.error().message(), "seccomp strict mode")) << target.error().to_string();
  EXPECT_TRUE(contains(target.error().message(), "read, write, exit and sigreturn"));
  EXPECT_EQ(t.ping(), "pong 1");
}

TEST_F(SeccompTest, StrictMainThreadCallGoesToTheOther) {
  Seccomped t(Seccomped::args("strict-main"));
  ASSERT_NE(t.worker(), 0);
  auto target = remote::Target::open(t.pid());
  ASSERT_TRUE(target.ok()) << target.error().to_string();
  remote::CallArg args[] = {remote::CallArg::integer(7)};
  auto r = (*target)->call_symbol("", "remora_seccomp_probe", args);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->value, 22u);
  EXPECT_EQ(r->tid, t.worker());
  // The strict one, asked for by tid: refused, untouched.
  remote::CallOptions on_main;
  on_main.tid = t.pid();
  auto refused = (*target)->call_symbol("", "remora_seccomp_probe", args, on_main);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), Errc::kNotSupported);
  EXPECT_TRUE(
      contains(refused.error().message(), "thread " + std::to_string(t.pid()) + " is in seccomp strict mode"))
      << refused.error().to_string();
  auto check = (*target)->check_syscalls(remote::seccomp::agent_load_syscalls(), "load the agent", on_main);
  EXPECT_FALSE(check.ok());
  EXPECT_EQ(t.ping(), "pong 1");
  auto calls = (*target)->call_symbol("", "remora_seccomp_calls", {});
  ASSERT_TRUE(calls.ok()) << calls.error().to_string();
  EXPECT_EQ(calls->value, 1u);  // the refused call never ran
  EXPECT_TRUE((*target)->close().ok());
  EXPECT_EQ(t.ping(), "pong 2");
}

// The first call of a session creates the scratch with mmap: refused for
// both filters, naming mmap and the verdict.
TEST_F(SeccompTest, FilterOnMmapIsRefusedBeforeAnything) {
  if (geteuid() != 0) GTEST_SKIP() << "reading a seccomp filter needs CAP_SYS_ADMIN: run as root";
  const struct {
    const char* mode;
    const char* verdict;
  } rows[] = {{"kill-mmap", "would kill the process (SECCOMP_RET_KILL_PROCESS) on mmap"},
              {"eperm-mmap", "would make it fail with EPERM (SECCOMP_RET_ERRNO(EPERM)) on mmap"}};
  for (const auto& row : rows) {
    SCOPED_TRACE(row.mode);
    Seccomped t(Seccomped::args(row.mode));
    auto target = remote::Target::open(t.pid());
    ASSERT_TRUE(target.ok()) << target.error().to_string();
    remote::CallArg args[] = {remote::CallArg::integer(5)};
    auto r = (*target)->call_symbol("", "remora_seccomp_probe", args);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), Errc::kNotSupported);
    EXPECT_TRUE(contains(r.error().message(), row.verdict)) << r.error().to_string();
    EXPECT_TRUE(contains(r.error().message(), "scratch mapping; nothing was changed"));
    EXPECT_FALSE((*target)->scratch_address().has_value());
    auto check = (*target)->check_syscalls(remote::seccomp::agent_load_syscalls(), "load the agent");
    ASSERT_FALSE(check.ok());
    EXPECT_TRUE(contains(check.error().to_string(), "load the agent: the target's seccomp filter would"));
    EXPECT_EQ(t.ping(), "pong 1");
  }
}

TEST_F(SeccompTest, FilterThatAllowsEverythingLetsCallsWork) {
  for (const char* mode : {"allow-all", "kill-tgkill"}) {
    SCOPED_TRACE(mode);
    Seccomped t(Seccomped::args(mode));
    auto target = remote::Target::open(t.pid());
    ASSERT_TRUE(target.ok()) << target.error().to_string();
    remote::CallArg args[] = {remote::CallArg::integer(5)};
    for (int i = 0; i < 3; ++i) {
      // kill-tgkill: a marked call would end with tgkill; under a filter
      // the engine ends calls at rt_sigreturn instead.
      auto r = (*target)->call_symbol("", "remora_seccomp_probe", args);
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      EXPECT_EQ(r->value, 16u);
    }
    auto calls = (*target)->call_symbol("", "remora_seccomp_calls", {});
    ASSERT_TRUE(calls.ok()) << calls.error().to_string();
    EXPECT_EQ(calls->value, 3u);
    auto pid = (*target)->syscall(SYS_getpid, {});
    ASSERT_TRUE(pid.ok()) << pid.error().to_string();
    EXPECT_EQ(static_cast<pid_t>(pid->value), (*target)->ns_pid());
    if (geteuid() == 0) {
      EXPECT_TRUE((*target)->check_syscalls(remote::seccomp::agent_load_syscalls(), "load the agent").ok());
    }
    EXPECT_TRUE((*target)->close().ok());
    EXPECT_EQ(t.ping(), "pong 1");
  }
}

TEST_F(SeccompTest, DeniedSyscallAskedForIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "reading a seccomp filter needs CAP_SYS_ADMIN: run as root";
  Seccomped t(Seccomped::args("deny-nr", std::to_string(SYS_getppid)));
  auto target = remote::Target::open(t.pid());
  ASSERT_TRUE(target.ok()) << target.error().to_string();
  auto r = (*target)->syscall(SYS_getppid, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kNotSupported);
  EXPECT_TRUE(
      contains(r.error().message(), "SECCOMP_RET_ERRNO(EACCES)) on getppid, the system call asked for"))
      << r.error().to_string();
  auto pid = (*target)->syscall(SYS_getpid, {});
  ASSERT_TRUE(pid.ok()) << pid.error().to_string();
  EXPECT_EQ(static_cast<pid_t>(pid->value), (*target)->ns_pid());
  EXPECT_EQ(t.ping(), "pong 1");
}

// The unprivileged user: the filter cannot be read, the engine's mmap gets
// EPERM, and the error says seccomp and how to have the filter checked.
TEST_F(SeccompTest, UnprivilegedCliNamesSeccomp) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create and become the unprivileged test user";
  const char* user = "remora-seccomp";
  if (getpwnam(user) == nullptr) {
    Ran add = run_shell(std::string("useradd --system --no-create-home --shell /usr/sbin/nologin ") + user);
    if (getpwnam(user) == nullptr) GTEST_SKIP() << "useradd " << user << " failed: " << add.out;
  }
  const passwd* pw = getpwnam(user);
  const std::string as = "/usr/bin/setpriv --reuid=" + std::to_string(pw->pw_uid) +
                         " --regid=" + std::to_string(pw->pw_gid) + " --clear-groups";
  if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/setpriv (util-linux)";
  auto as_user = [&](const char* mode) {
    return std::vector<std::string>{"/usr/bin/setpriv",
                                    "--reuid=" + std::to_string(pw->pw_uid),
                                    "--regid=" + std::to_string(pw->pw_gid),
                                    "--clear-groups",
                                    kTarget,
                                    mode};
  };
  Seccomped t(as_user("eperm-mmap"));
  Ran r = run_shell(as + " " + kRemora + " call -p " + std::to_string(t.pid()) + " remora_seccomp_probe 5");
  ASSERT_TRUE(WIFEXITED(r.status)) << r.out;
  EXPECT_NE(WEXITSTATUS(r.status), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "seccomp filter, which probably refused mmap (EPERM)")) << r.out;
  EXPECT_TRUE(contains(r.out, "could not read the filter")) << r.out;
  EXPECT_TRUE(contains(r.out, "CAP_SYS_ADMIN")) << r.out;
  EXPECT_EQ(t.ping(), "pong 1");

  // A filter that kills on mmap cannot be foreseen without reading it: the
  // target dies (the kernel's SIGSYS cannot be held back), and the error
  // says what happened and how to have it checked first.
  Seccomped k(as_user("kill-mmap"));
  Ran killed =
      run_shell(as + " " + kRemora + " call -p " + std::to_string(k.pid()) + " remora_seccomp_probe 5");
  ASSERT_TRUE(WIFEXITED(killed.status)) << killed.out;
  EXPECT_NE(WEXITSTATUS(killed.status), 0) << killed.out;
  EXPECT_TRUE(contains(killed.out, "killed the process on mmap")) << killed.out;
  EXPECT_TRUE(contains(killed.out, "run remora as root or with CAP_SYS_ADMIN")) << killed.out;
}

TEST_F(SeccompTest, CliAttachOnStrictExitsFive) {
  Seccomped t(Seccomped::args("strict"));
  Ran r = run_shell(std::string(kRemora) + " attach -p " + std::to_string(t.pid()) + " -d 100");
  ASSERT_TRUE(WIFEXITED(r.status)) << r.out;
  EXPECT_EQ(WEXITSTATUS(r.status), 5) << r.out;
  EXPECT_TRUE(contains(r.out, "seccomp strict mode")) << r.out;
  EXPECT_EQ(t.ping(), "pong 1");
}

// remora attach checks what the agent's load makes before it injects
// anything: refused, and the target never ran a line of ours.
TEST_F(SeccompTest, CliAttachUnderKillFilterExitsFive) {
  if (geteuid() != 0) GTEST_SKIP() << "reading a seccomp filter needs CAP_SYS_ADMIN: run as root";
  Seccomped t(Seccomped::args("kill-mmap"));
  Ran r = run_shell(std::string(kRemora) + " attach -p " + std::to_string(t.pid()) + " -d 100");
  ASSERT_TRUE(WIFEXITED(r.status)) << r.out;
  EXPECT_EQ(WEXITSTATUS(r.status), 5) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "load the agent: the target's seccomp filter would kill the process "
                       "(SECCOMP_RET_KILL_PROCESS) on mmap"))
      << r.out;
  EXPECT_EQ(t.ping(), "pong 1");
}

TEST_F(SeccompTest, CliCallOnStrictExitsFive) {
  Seccomped t(Seccomped::args("strict"));
  Ran r = run_shell(std::string(kRemora) + " call -p " + std::to_string(t.pid()) + " remora_seccomp_probe 5");
  ASSERT_TRUE(WIFEXITED(r.status)) << r.out;
  EXPECT_EQ(WEXITSTATUS(r.status), 5) << r.out;
  EXPECT_EQ(t.ping(), "pong 1");
}

}  // namespace
}  // namespace remora::test
