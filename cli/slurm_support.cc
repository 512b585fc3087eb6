#include "cli/slurm_support.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace remora::cli::slurm {

uint64_t mono_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

Result<Child> spawn(const std::vector<std::string>& argv, const sigset_t* mask) {
  int in[2], out[2], err[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Error::from_errno("pipe");
  UniqueFd in_r(in[0]), in_w(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return Error::from_errno("pipe");
  UniqueFd out_r(out[0]), out_w(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return Error::from_errno("pipe");
  UniqueFd err_r(err[0]), err_w(err[1]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Error::from_errno("fork");
  if (pid == 0) {
    // Only async-signal-safe calls from here: the parent may have threads.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    // A group of its own: a terminal's Ctrl-C reaches remora alone, which
    // ends the session in order (srun would take a first SIGINT as a
    // question and a second as an order to kill the step).
    ::setpgid(0, 0);
    ::dup2(in_r.get(), 0);
    ::dup2(out_w.get(), 1);
    ::dup2(err_w.get(), 2);
    if (mask) ::sigprocmask(SIG_SETMASK, mask, nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  Child c;
  c.pid = pid;
  c.in = std::move(in_w);
  c.out = std::move(out_r);
  c.err = std::move(err_r);
  for (int fd : {c.in.get(), c.out.get(), c.err.get()})
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return c;
}

bool drain(int fd, std::string& buf) {
  char chunk[65536];
  for (;;) {
    ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN;
  }
}

bool write_all(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLOUT, 0};
        ::poll(&pfd, 1, 1000);
        continue;
      }
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

std::optional<int> try_reap(pid_t pid) {
  int status = 0;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) return status;
  return std::nullopt;
}

Result<Captured> run_capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  sigset_t none;
  sigemptyset(&none);
  auto child = spawn(argv, &none);
  if (!child) return std::move(child).error();
  child->in.reset();
  Captured c;
  const uint64_t end = mono_ns() + static_cast<uint64_t>(timeout.count()) * 1'000'000u;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    const uint64_t now = mono_ns();
    if (now >= end) {
      ::kill(child->pid, SIGKILL);
      ::waitpid(child->pid, nullptr, 0);
      return Error(Errc::kTimedOut, argv[0] + " did not answer within " + std::to_string(timeout.count()) +
                                        " ms (is its daemon up? " + argv[0] + " was killed)");
    }
    pollfd fds[2] = {{out_open ? child->out.get() : -1, POLLIN, 0},
                     {err_open ? child->err.get() : -1, POLLIN, 0}};
    int n = ::poll(fds, 2, static_cast<int>((end - now) / 1'000'000u + 1));
    if (n < 0 && errno != EINTR) return Error::from_errno("poll");
    if (out_open && fds[0].revents) out_open = drain(child->out.get(), c.out);
    if (err_open && fds[1].revents) err_open = drain(child->err.get(), c.err);
  }
  while (::waitpid(child->pid, &c.status, 0) < 0 && errno == EINTR) {
  }
  return c;
}

}  // namespace remora::cli::slurm
