// Shared by the C API suites: a target process tree started from
// remora-capi-target, the hook tool's log, and a scratch directory.
// Every wait has a deadline; the destructor kills and reaps everything.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace capi_test {

using Clock = std::chrono::steady_clock;

// A scratch directory, removed with its files.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/remora-capi-XXXXXX";
    if (char* d = ::mkdtemp(tmpl)) path_ = d;
  }
  ~TempDir() {
    if (!path_.empty()) (void)!std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// /proc/PID/stat's state letter, or 0 when the process is gone.
inline char proc_state(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(f, s)) return 0;
  size_t paren = s.rfind(')');
  return paren != std::string::npos && paren + 2 < s.size() ? s[paren + 2] : 0;
}

// A pid that cannot exist: above the kernel's pid_max.
inline pid_t missing_pid() {
  std::ifstream f("/proc/sys/kernel/pid_max");
  long max = 4194304;
  f >> max;
  return static_cast<pid_t>(max + 1);
}

// remora-capi-target N [refuse-last], in its own process group.
class TargetTree {
 public:
  // extra_env: "NAME=VALUE" strings added to the target's environment.
  TargetTree(int children, std::vector<std::string> extra_env = {}, bool refuse_last = false)
      : expected_(children + 1) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    std::string n = std::to_string(children);
    pid_t test_pid = ::getpid();
    root_ = ::fork();
    if (root_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != test_pid) _exit(126);
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      for (auto& e : extra_env) ::putenv(e.data());
      const char* argv[] = {REMORA_CAPI_TARGET, n.c_str(), refuse_last ? "refuse-last" : nullptr, nullptr};
      ::execv(REMORA_CAPI_TARGET, const_cast<char**>(argv));
      _exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    if (root_ > 0) ::setpgid(root_, root_);  // also from here: no race with the kill below
  }

  ~TargetTree() {
    if (root_ > 0) {
      ::kill(-root_, SIGKILL);
      for (pid_t p : pids_) ::kill(p, SIGKILL);
      int st;
      ::waitpid(root_, &st, 0);
    }
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ >= 0) ::close(stdout_);
  }

  TargetTree(const TargetTree&) = delete;
  TargetTree& operator=(const TargetTree&) = delete;

  // Waits (deadline) for every process's "ready PID" line, then until each
  // is asleep (blocked in read). Returns false, with a failure, on timeout.
  bool wait_ready(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto deadline = Clock::now() + timeout;
    std::string buf;
    while (static_cast<int>(pids_.size()) < expected_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        ADD_FAILURE() << "target tree not ready: " << pids_.size() << " of " << expected_ << " processes";
        return false;
      }
      pollfd p{stdout_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[256];
      ssize_t n = ::read(stdout_, chunk, sizeof chunk);
      if (n <= 0) {
        ADD_FAILURE() << "target tree closed its output before it was ready";
        return false;
      }
      buf.append(chunk, static_cast<size_t>(n));
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::istringstream line(buf.substr(0, nl));
        buf.erase(0, nl + 1);
        std::string word;
        pid_t pid = 0;
        if (line >> word >> pid && word == "ready") pids_.push_back(pid);
      }
    }
    for (pid_t p : pids_) {
      while (proc_state(p) != 'S') {
        if (Clock::now() > deadline) {
          ADD_FAILURE() << "process " << p << " did not block in read (state " << proc_state(p) << ")";
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    return true;
  }

  // Closes the tree's stdin: every process exits. Returns the root's exit
  // status (0 when all processes exited 0), or -1 on timeout/signal.
  int finish(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    ::close(stdin_);
    stdin_ = -1;
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int st = 0;
      pid_t r = ::waitpid(root_, &st, WNOHANG);
      if (r == root_) {
        root_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

  pid_t root() const { return root_; }
  // Root first, then the children in the order they said ready.
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  int expected_;
  pid_t root_ = -1;
  int stdin_ = -1, stdout_ = -1;
  std::vector<pid_t> pids_;
};

// A whole file (a /proc file has no size to read up to).
inline std::string read_file(const std::string& path) {
  std::string out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// Lines of the hook tool's log.
inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

// How many lines "<tool>:<hook> pid=<pid> ..." the log holds.
inline int count_hook(const std::string& log, const std::string& hook, pid_t pid,
                      const std::string& tool = "a") {
  std::string prefix = tool + ":" + hook + " pid=" + std::to_string(pid) + " ";
  int n = 0;
  for (const auto& l : read_lines(log))
    if (l.rfind(prefix, 0) == 0) ++n;
  return n;
}

inline std::string dump(const std::string& log) {
  std::string out;
  for (const auto& l : read_lines(log)) out += "  " + l + "\n";
  return out.empty() ? "  (empty)\n" : out;
}

}  // namespace capi_test
