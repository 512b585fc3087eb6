// Process::launch: start a program traced from its first instruction and
// bring it to the launch stop (every object mapped and relocated, no
// constructor run). The program file is checked first (found, executable,
// not set-uid, dynamically linked), the environment built, then the child is
// forked, seized while it waits on a pipe, and released into execve.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "control/process_impl.h"
#include "elf/elf_image.h"

extern char** environ;

namespace remora::control {
namespace {

// Whether the program file asks for a dynamic loader (PT_INTERP), read with
// the project's ELF reader (headers only). Scripts ("#!") count as dynamic:
// their interpreter is what runs.
Result<bool> file_is_dynamic(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::from_errno("open " + path);
  char magic[2] = {};
  if (::pread(fd.get(), magic, sizeof magic, 0) == 2 && magic[0] == '#' && magic[1] == '!') return true;
  auto img = elf::ElfImage::headers_from_fd(fd.get());
  if (!img)
    return Error(Errc::kParse,
                 path + " is not a 64-bit ELF executable Remora can read: " + img.error().message());
  return (*img)->has_interp();
}

// PATH search as execvp does it (but in the parent, before fork).
Result<std::string> find_program(const std::string& name) {
  if (name.empty()) return Error(Errc::kInvalidArgument, "empty program name");
  auto check = [](const std::string& p) -> int {
    struct stat sb {};
    if (::stat(p.c_str(), &sb) != 0) return errno;
    if (!S_ISREG(sb.st_mode)) return EACCES;
    if (::access(p.c_str(), X_OK) != 0) return errno;
    return 0;
  };
  if (name.find('/') != std::string::npos) {
    int err = check(name);
    if (err == ENOENT || err == ENOTDIR) return Error(Errc::kIo, "program " + name + " not found", ENOENT);
    if (err != 0) return Error(Errc::kPtraceDenied, "cannot execute " + name + ": " + strerror(err), err);
    return name;
  }
  const char* path_env = ::getenv("PATH");
  std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  int last = ENOENT;
  size_t pos = 0;
  for (;;) {
    size_t colon = path.find(':', pos);
    std::string dir = path.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + name;
    int err = check(cand);
    if (err == 0) return cand;
    if (err != ENOENT && err != ENOTDIR) last = err;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  if (last != ENOENT)
    return Error(Errc::kPtraceDenied, "cannot execute " + name + " found in PATH: " + strerror(last), last);
  return Error(Errc::kIo, "program " + name + " not found in PATH (" + path + ")", ENOENT);
}

// The program to run: found, not set-uid/set-gid, dynamically linked.
Result<std::string> launchable_program(const std::string& name) {
  auto path = REMORA_TRY(find_program(name));
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return Error::from_errno("stat " + path);
  if (((sb.st_mode & S_ISUID) != 0 && sb.st_uid != ::geteuid()) ||
      ((sb.st_mode & S_ISGID) != 0 && (sb.st_mode & S_IXGRP) != 0 && sb.st_gid != ::getegid()))
    return Error(Errc::kPtraceDenied,
                 path +
                     " is set-uid/set-gid: under ptrace the kernel runs it without its privileges, so it "
                     "would not behave as it should; run it normally and open it once it is running",
                 EACCES);
  bool dyn = REMORA_TRY(file_is_dynamic(path));
  if (!dyn)
    return Error(Errc::kStaticBinary, path + " is statically linked: it has no dynamic loader to follow");
  return path;
}

// The child's environment with the preloads prepended to LD_PRELOAD. Built
// before fork: the child may only make async-signal-safe calls.
Result<std::vector<std::string>> launch_env(const LaunchOptions& opts) {
  std::vector<std::string> env;
  if (opts.env) {
    env = *opts.env;
  } else {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e)
      if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.emplace_back(*e);
  }
  std::string preload;
  if (!opts.preload_dir.empty()) {
    std::string agent = opts.preload_dir + "/libremora-agent.so";
    if (::access(agent.c_str(), R_OK) != 0)
      return Error(Errc::kInvalidArgument, "no readable libremora-agent.so in " + opts.preload_dir, errno);
    preload = agent;
  }
  if (!opts.ld_preload.empty()) preload += (preload.empty() ? "" : ":") + opts.ld_preload;
  if (preload.empty()) return env;
  auto it = std::find_if(env.begin(), env.end(), [](auto& s) { return s.rfind("LD_PRELOAD=", 0) == 0; });
  if (it != env.end()) {
    std::string old = it->substr(11);
    *it = "LD_PRELOAD=" + preload + (old.empty() ? "" : ":" + old);
  } else {
    env.push_back("LD_PRELOAD=" + preload);
  }
  return env;
}

// A forked child waiting to exec: writing `go` lets it run into execve; `err`
// reaches EOF when the exec succeeded (the pipe is close-on-exec) and
// otherwise carries its errno.
struct Forked {
  pid_t pid = 0;
  UniqueFd go, err;
};

Result<Forked> fork_waiting_child(const std::string& path, const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env) {
  std::vector<char*> argv_p, env_p;
  for (auto& a : argv) argv_p.push_back(const_cast<char*>(a.c_str()));
  argv_p.push_back(nullptr);
  for (auto& e : env) env_p.push_back(const_cast<char*>(e.c_str()));
  env_p.push_back(nullptr);

  int go[2], err[2];
  if (::pipe2(go, O_CLOEXEC) != 0) return Error::from_errno("pipe");
  UniqueFd go_r(go[0]), go_w(go[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return Error::from_errno("pipe");
  UniqueFd err_r(err[0]), err_w(err[1]);

  pid_t child = ::fork();
  if (child < 0) return Error::from_errno("fork");
  if (child == 0) {
    // Async-signal-safe only. Wait until the parent has seized us, so the
    // exec is the first thing it sees.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    char c;
    while (::read(go[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::execve(path.c_str(), argv_p.data(), env_p.data());
    int e = errno;
    (void)!::write(err[1], &e, sizeof e);
    ::_exit(127);
  }
  return Forked{child, std::move(go_w), std::move(err_r)};
}

// The errno of a failed exec, 0 when it succeeded; kTimedOut when the child
// neither exec'd nor failed by `dl`.
Result<int> exec_result(int err_fd, const Deadline& dl) {
  int exec_errno = 0;
  for (;;) {
    struct pollfd pfd {
      err_fd, POLLIN, 0
    };
    int n = ::poll(
        &pfd, 1,
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(dl.remaining()).count()));
    if (n == 0) return Error(Errc::kTimedOut, "the program did not exec in time");
    if (n < 0 && errno == EINTR) continue;
    ssize_t k = ::read(err_fd, &exec_errno, sizeof exec_errno);
    if (k < 0 && errno == EINTR) continue;
    return exec_errno;
  }
}

// Waits for the child's PTRACE_EVENT_EXEC stop, passing on any signal before it.
Result<void> await_exec_stop(pid_t child, const Deadline& dl) {
  const pid_t one[] = {child};
  for (;;) {
    auto w = ptrace::wait_any(one, dl);
    if (w.kind != ptrace::Waited::Kind::kStop) return Error(Errc::kTimedOut, "no exec stop");
    if (w.stop.kind == ptrace::Stop::Kind::kEvent && w.stop.event == PTRACE_EVENT_EXEC) return ok();
    if (ended(w.stop)) return Error(Errc::kTargetExited, "the program died before its exec");
    const bool signal = w.stop.kind == ptrace::Stop::Kind::kSignalDelivery && w.stop.sig != SIGTRAP;
    (void)ptrace::cont(child, signal ? w.stop.sig : 0);
  }
}

// From the exec stop to the launch stop; an error when the program ends
// first or turns out to have no dynamic loader.
Result<void> reach_launch_stop(Process::Impl& impl, const std::string& path, const Deadline& dl) {
  auto ev = REMORA_TRY(impl.sync_new_image(dl));
  if (ev) {
    std::string how = ev->kind == Event::Kind::kExit
                          ? "exited with status " + std::to_string(WEXITSTATUS(ev->exit_status))
                          : "was killed by signal " + std::to_string(ev->signal);
    return Error(Errc::kTargetExited,
                 "the program " + how + " before its first constructor (a missing library or symbol?)");
  }
  if (!impl.dynamic) return Error(Errc::kStaticBinary, path + " runs without a dynamic loader");
  return ok();
}

}  // namespace

Result<std::unique_ptr<Process>> Process::launch(const LaunchOptions& opts) {
  if (opts.argv.empty()) return Error(Errc::kInvalidArgument, "launch: empty argv");
  const std::string ctx = "launch " + opts.argv[0];
  auto path = REMORA_TRY_CTX(launchable_program(opts.argv[0]), ctx);
  auto env = REMORA_TRY_CTX(launch_env(opts), ctx);
  auto child = REMORA_TRY_CTX(fork_waiting_child(path, opts.argv, env), ctx);

  auto impl = std::make_unique<Impl>();
  impl->pid = child.pid;
  impl->launched = true;
  impl->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  impl->threads[child.pid] = Impl::Thread{};
  auto fail = [&](Error e) -> Result<std::unique_ptr<Process>> {
    impl->mem.reset();
    (void)impl->kill_and_reap();
    return std::move(e).with_context(ctx);
  };
  if (auto s = ptrace::seize(child.pid, child.pid, kOptions); !s) {
    // Not traced: the wait set still collects the exit of our own child.
    ::kill(child.pid, SIGKILL);
    const pid_t one[] = {child.pid};
    (void)ptrace::wait_any(one, Deadline::after(kStopAllTimeout));
    return std::move(s).error().with_context(ctx);
  }
  char c = 1;
  (void)!::write(child.go.get(), &c, 1);
  child.go.reset();

  Deadline dl = Deadline::after(opts.timeout);
  auto exec_errno = exec_result(child.err.get(), dl);
  if (!exec_errno) return fail(std::move(exec_errno).error());
  if (*exec_errno != 0) {
    std::string what = "exec " + path + ": " + strerror(*exec_errno);
    if (*exec_errno == ENOENT) return fail(Error(Errc::kIo, what, ENOENT));
    return fail(Error(Errc::kPtraceDenied, what, *exec_errno));
  }
  if (auto s = await_exec_stop(child.pid, dl); !s) {
    if (s.error().code() != Errc::kTargetExited) return fail(std::move(s).error());
    impl->threads.clear();
    return std::move(s).error().with_context(ctx);
  }
  impl->threads[child.pid].stopped = true;
  if (auto s = reach_launch_stop(*impl, path, dl); !s) return fail(std::move(s).error());
  return std::unique_ptr<Process>(new Process(std::move(impl)));
}

}  // namespace remora::control
