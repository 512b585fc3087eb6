// Support for the attach suite: the hook tool's log, attach options pointing
// at the build's agent and tools, forked controller processes, and remote
// getenv. Header-only; tests may throw HarnessError (see harness.h).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attach/attach.h"
#include "harness.h"
#include "remote_helpers.h"

#if !defined(REMORA_AGENT_PATH) || !defined(REMORA_HOOK_TOOL_A) || !defined(REMORA_HOOK_TOOL_B) || \
    !defined(REMORA_HOOK_TOOL_NOATTACH)
#error "the attach suite needs REMORA_AGENT_PATH and REMORA_HOOK_TOOL_{A,B,NOATTACH}"
#endif

namespace remora::test {

using namespace std::chrono_literals;
using attach::AttachOptions;
using attach::Controller;

inline const std::string kToolA = REMORA_HOOK_TOOL_A;
inline const std::string kToolB = REMORA_HOOK_TOOL_B;
inline const std::string kToolNoAttach = REMORA_HOOK_TOOL_NOATTACH;

// The path the agent knows a tool by (the controller passes realpath()).
// The words of [start, end) of process `pid` (its /proc/PID/mem), empty
// when they cannot be read.
inline std::vector<uint64_t> read_words(pid_t pid, unsigned long start, unsigned long end) {
  std::vector<uint64_t> words((end - start) / 8);
  std::ifstream mem("/proc/" + std::to_string(pid) + "/mem", std::ios::binary);
  mem.seekg(static_cast<std::streamoff>(start));
  if (!mem.read(reinterpret_cast<char*>(words.data()), static_cast<std::streamsize>(words.size() * 8)))
    words.clear();
  return words;
}

// libunwind's memory pool (its mempool.c): anonymous pages it maps for its
// own objects the first time it unwinds and never unmaps, not even when
// libunwind itself is unloaded. Known by their content, page by page:
// objects of one size, at least half of them free with their first word
// pointing at the object right below (the free list, built upwards).
inline bool is_libunwind_pool_range(pid_t pid, unsigned long start, unsigned long end) {
  constexpr unsigned long kPage = 4096;
  if (end <= start || (end - start) % kPage != 0 || end - start > (64ul << 10)) return false;
  const auto words = read_words(pid, start, end);
  if (words.empty()) return false;
  for (unsigned long page = start; page < end; page += kPage) {
    const uint64_t* w = words.data() + (page - start) / 8;
    bool pool = false;
    for (unsigned long stride = 16; stride <= 1024 && !pool; stride += 8) {
      size_t links = 0, objects = 0;
      for (unsigned long at = page + stride; at + 8 <= page + kPage; at += stride) {
        ++objects;
        links += w[(at - page) / 8] == at - stride;
      }
      pool = objects >= 3 && links * 2 >= objects;
    }
    if (!pool) return false;
  }
  return true;
}

inline std::string real(const std::string& p) {
  char buf[PATH_MAX];
  return ::realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// One line of the hook tool: "<tool>:<hook> pid=.. tid=.. t=.. session=..".
struct HookLine {
  std::string tool, hook, raw;
  pid_t pid = 0, tid = 0;
  long long t = 0;
  unsigned long long session = 0;
  std::string what() const { return tool + ":" + hook; }
};

// A fresh log file in a private temporary directory, removed at the end.
class HookLog {
 public:
  HookLog() {
    char dir[] = "/tmp/remora-attach-XXXXXX";
    if (!::mkdtemp(dir)) throw HarnessError("mkdtemp failed");
    dir_ = dir;
    path_ = dir_ + "/hooks.log";
  }
  ~HookLog() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  HookLog(const HookLog&) = delete;
  HookLog& operator=(const HookLog&) = delete;

  const std::string& path() const { return path_; }

  std::vector<HookLine> lines() const {
    std::vector<HookLine> out;
    std::ifstream in(path_);
    std::string l;
    while (std::getline(in, l)) {
      HookLine h;
      h.raw = l;
      std::istringstream ss(l);
      std::string head;
      ss >> head;
      auto colon = head.find(':');
      if (colon == std::string::npos) throw HarnessError("malformed hook line: " + l);
      h.tool = head.substr(0, colon);
      h.hook = head.substr(colon + 1);
      auto f = parse_fields(l);
      for (const char* k : {"pid", "tid", "t", "session"})
        if (!f.count(k)) throw HarnessError("hook line without " + std::string(k) + ": " + l);
      h.pid = static_cast<pid_t>(f["pid"]);
      h.tid = static_cast<pid_t>(f["tid"]);
      h.t = f["t"];
      h.session = static_cast<unsigned long long>(f["session"]);
      out.push_back(std::move(h));
    }
    return out;
  }

  // Lines whose tool:hook is `what` (and, if pid != 0, of that process).
  std::vector<HookLine> find(const std::string& what, pid_t pid = 0) const {
    std::vector<HookLine> out;
    for (auto& h : lines())
      if (h.what() == what && (pid == 0 || h.pid == pid)) out.push_back(h);
    return out;
  }

  // Polls (1 ms) until at least `n` lines match; the tool writes from the
  // target, asynchronously to us only for the lease and exit hooks.
  bool wait_count(const std::string& what, size_t n, pid_t pid, Deadline deadline) const {
    return wait_for([&] { return find(what, pid).size() >= n; }, deadline);
  }

  std::string dump() const {
    std::ifstream in(path_);
    std::ostringstream ss;
    ss << in.rdbuf();
    return "hook log:\n" + ss.str();
  }

 private:
  std::string dir_, path_;
};

// "a:configure a:configure_attach ..." of a slice of lines, for comparisons.
inline std::vector<std::string> whats(const std::vector<HookLine>& v, size_t from = 0,
                                      size_t to = static_cast<size_t>(-1)) {
  std::vector<std::string> out;
  for (size_t i = from; i < v.size() && i < to; ++i) out.push_back(v[i].what());
  return out;
}

inline AttachOptions options_for(const HookLog& log, std::vector<std::string> tools = {kToolA}) {
  AttachOptions o;
  o.tools = std::move(tools);
  o.env = {{"REMORA_HOOK_LOG", log.path()}};
  o.agent_path = REMORA_AGENT_PATH;
  return o;
}

inline std::string describe_outcome(const attach::ProcessOutcome& o) {
  return "pid " + std::to_string(o.pid) + (o.ok ? " ok" : " failed") + " code " +
         std::string(errc_name(o.code)) + (o.message.empty() ? "" : ": " + o.message);
}

inline attach::AgentState status_or_throw(pid_t pid) {
  auto st = Controller::status(pid);
  if (!st.ok())
    throw HarnessError("Controller::status(" + std::to_string(pid) + "): " + describe(st.error()));
  return *st;
}

inline bool agent_mapped(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string l;
  while (std::getline(in, l))
    if (l.find("libremora-agent") != std::string::npos) return true;
  return false;
}

// The process's open descriptors (/proc/PID/fd): number -> what it names
// ("pipe:[123]", "/memfd:remora:libx.so (deleted)", ...).
inline std::map<int, std::string> open_fds(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) throw HarnessError("opendir " + dir + ": " + std::strerror(errno));
  std::map<int, std::string> out;
  while (dirent* e = ::readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    char link[PATH_MAX] = "";
    ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), link, sizeof link - 1);
    out[std::atoi(e->d_name)] = n > 0 ? std::string(link, static_cast<size_t>(n)) : "?";
  }
  return out;
}

// The descriptors open in each of `reads` reads 20 ms apart: a target's
// transient connection (open for microseconds, every 100 ms in
// remora_target_syscalls) is in at most one of them.
inline std::map<int, std::string> steady_fds(pid_t pid, int reads = 5) {
  auto out = open_fds(pid);
  for (int i = 1; i < reads; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto now = open_fds(pid);
    for (auto it = out.begin(); it != out.end();)
      it = now.count(it->first) && now.at(it->first) == it->second ? std::next(it) : out.erase(it);
  }
  return out;
}

// Polls (1 ms) until the process's descriptors are exactly `want`: a leak
// stays, a target's own transient descriptor goes.
inline bool fds_back(pid_t pid, const std::map<int, std::string>& want, Deadline deadline) {
  return wait_for([&] { return open_fds(pid) == want; }, deadline);
}

inline std::string describe_fds(const std::map<int, std::string>& fds) {
  std::string s;
  for (const auto& [fd, what] : fds) s += " " + std::to_string(fd) + "=" + what;
  return s.empty() ? " (none)" : s;
}

// Sets an environment variable of this (the controller's) process for a
// scope. Only from the test's own thread, before and after the calls that
// read it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

// Mappings of the process that a fork does not copy (VmFlags "dc"). Remora's
// own scratch mapping is the only one the test targets have: a count back
// at its value before the attach says the scratch is gone.
inline int dontfork_mappings(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps");
  std::string l;
  int n = 0;
  while (std::getline(in, l))
    if (l.rfind("VmFlags:", 0) == 0 && (l + " ").find(" dc ") != std::string::npos) ++n;
  return n;
}

// getenv(name) run inside the target by a remote call; nullopt when unset.
inline std::optional<std::string> remote_getenv(pid_t pid, const std::string& name) {
  auto t = open_target(pid);
  std::vector<remote::CallArg> args{remote::CallArg::string(name)};
  auto r = t->call_symbol("libc.so.6", "getenv", args);
  if (!r.ok()) throw HarnessError("remote getenv(" + name + "): " + describe(r.error()));
  std::optional<std::string> out;
  if (r->value != 0) {
    std::string s;
    // Byte by byte up to the NUL: a longer read could cross into an unmapped page.
    for (uint64_t a = r->value;; ++a) {
      std::byte b[1];
      auto rd = t->read(RemoteAddr(a), b);
      if (!rd.ok()) throw HarnessError("read getenv result: " + describe(rd.error()));
      if (b[0] == std::byte{0}) break;
      s += static_cast<char>(b[0]);
      if (s.size() > 4096) throw HarnessError("getenv result is not terminated");
    }
    out = s;
  }
  auto c = t->close();
  if (!c.ok()) throw HarnessError("close: " + describe(c.error()));
  return out;
}

// A helper process forked from the test, running `body` (which returns the
// child's exit code) with a pipe to report lines back. Killed and reaped by
// the destructor. The body runs in a copy of this multithreaded process:
// it may use malloc and a new Controller, never GoogleTest assertions.
class ForkedHelper {
 public:
  explicit ForkedHelper(const std::function<int(int report_fd)>& body) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw HarnessError("pipe2 failed");
    pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw HarnessError("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      ::close(p[0]);
      int rc = body(p[1]);
      ::_exit(rc);
    }
    ::close(p[1]);
    fd_ = p[0];
  }
  ~ForkedHelper() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      wait_exit(after(10s));
    }
    if (fd_ >= 0) ::close(fd_);
  }
  ForkedHelper(const ForkedHelper&) = delete;
  ForkedHelper& operator=(const ForkedHelper&) = delete;

  pid_t pid() const { return pid_; }

  // Writes one line from the child (a helper for bodies).
  static void say(int fd, const std::string& line) {
    std::string s = line + "\n";
    ssize_t ignored = ::write(fd, s.data(), s.size());
    (void)ignored;
  }

  // One line from the child; throws on timeout/EOF.
  std::string wait_line(Deadline deadline) {
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) throw HarnessError("forked helper " + std::to_string(pid_) + ": no line in time");
      pollfd pf{fd_, POLLIN, 0};
      int rc = ::poll(&pf, 1, static_cast<int>(left));
      if (rc <= 0) continue;
      char chunk[1024];
      ssize_t n = ::read(fd_, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw HarnessError("forked helper " + std::to_string(pid_) + ": EOF (it exited)" +
                           (buf_.empty() ? "" : "; partial: " + buf_));
      buf_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Wait status, or nullopt at the deadline.
  std::optional<int> wait_exit(Deadline deadline) {
    for (;;) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        reaped_ = true;
        return r == pid_ ? std::optional<int>(st) : std::nullopt;
      }
      if (Clock::now() > deadline) return std::nullopt;
      ::usleep(1000);
    }
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
  bool reaped_ = false;
};

}  // namespace remora::test
