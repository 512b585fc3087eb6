// remora_test_harness; see harness.h.
#include "harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#ifndef REMORA_TEST_BIN_DIR
#error "REMORA_TEST_BIN_DIR must name the directory of the target programs"
#endif

namespace remora::test {

namespace {

// Live Spawned children, for the watchdog.
std::mutex g_live_mu;
std::set<pid_t> g_live;

void register_live(pid_t pid) {
  std::lock_guard lock(g_live_mu);
  g_live.insert(pid);
}
void unregister_live(pid_t pid) {
  std::lock_guard lock(g_live_mu);
  g_live.erase(pid);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string errno_str(int e) { return std::string(strerror(e)); }

int ms_until(Deadline d) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1000 * 1000));
}

// Fields after the comm of a stat line ("S 1 2 ..."); empty if unreadable.
std::string stat_tail(const std::string& path) {
  std::string s = read_file(path);
  auto p = s.rfind(')');
  if (p == std::string::npos || p + 2 > s.size()) return {};
  return s.substr(p + 2);
}

}  // namespace

double time_scale() {
  static const double scale = [] {
    const char* e = getenv("REMORA_TEST_TIME_SCALE");
    if (!e) return 1.0;
    char* end = nullptr;
    double v = strtod(e, &end);
    // Not a number, or absurd: the limits as written (said once). A faster
    // machine keeps them too: a limit is never shortened.
    if (end == e || *end != '\0' || !(v > 0.0) || v > 1000.0) {
      fprintf(stderr, "harness: REMORA_TEST_TIME_SCALE=%s ignored (a factor from 1 to 1000)\n", e);
      return 1.0;
    }
    return std::max(1.0, v);
  }();
  return scale;
}

std::chrono::milliseconds scaled(std::chrono::milliseconds d) {
  const double scale = time_scale();
  if (scale == 1.0) return d;
  return std::chrono::milliseconds(static_cast<long long>(static_cast<double>(d.count()) * scale + 0.5));
}

std::string bin_path(std::string_view name) {
  return std::string(REMORA_TEST_BIN_DIR) + "/" + std::string(name);
}

// ---------------------------------------------------------------------------
// Spawned

std::unique_ptr<Spawned> Spawned::start(const std::vector<std::string>& argv) {
  if (argv.empty()) throw HarnessError("Spawned::start: empty argv");
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    throw HarnessError("pipe2: " + errno_str(errno));
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t parent = getpid();

  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) ::close(fd);
    throw HarnessError("fork: " + errno_str(e));
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec (the test is multithreaded).
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    signal(SIGPIPE, SIG_DFL);
    dup2(in[0], 0);
    dup2(out[1], 1);
    execv(cargv[0], cargv.data());
    int e = errno;
    ssize_t ignored = write(err[1], &e, sizeof(e));
    (void)ignored;
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that it holds before we return (no race)
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  int e = 0;
  ssize_t n;
  do n = ::read(err[0], &e, sizeof(e));
  while (n < 0 && errno == EINTR);
  ::close(err[0]);

  std::unique_ptr<Spawned> s(new Spawned());
  s->pid_ = pid;
  s->name_ = argv[0].substr(argv[0].rfind('/') + 1);
  s->in_fd_ = in[1];
  s->out_fd_ = out[0];
  register_live(pid);
  if (n == sizeof(e)) {
    // exec failed; the destructor reaps the child.
    throw HarnessError("exec " + argv[0] + ": " + errno_str(e));
  }
  return s;
}

Spawned::~Spawned() {
  if (!reaped_) {
    kill_group(SIGKILL);
    kill(SIGKILL);
    // Bounded: a process stuck in uninterruptible sleep would hang a blocking waitpid.
    auto deadline = after(std::chrono::seconds(10));
    for (;;) {
      int st;
      pid_t r = waitpid(pid_, &st, WNOHANG | __WALL);
      if (r == pid_ || (r < 0 && errno == ECHILD)) break;
      if (r < 0 && errno != EINTR) break;
      if (Clock::now() > deadline) {
        fprintf(stderr, "harness: %s (pid %d) did not die within 10 s of SIGKILL\n%s", name_.c_str(), pid_,
                describe_tasks(pid_).c_str());
        break;
      }
      usleep(1000);
    }
    reaped_ = true;
  }
  unregister_live(pid_);
  if (in_fd_ >= 0) ::close(in_fd_);
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::optional<std::string> Spawned::try_wait_line(Deadline deadline, std::string* why) {
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return line;
    }
    if (out_fd_ < 0) {
      if (why) *why = "its stdout is closed";
      return std::nullopt;
    }
    pollfd p{out_fd_, POLLIN, 0};
    int rc = poll(&p, 1, ms_until(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) {
      if (why) *why = "poll: " + errno_str(errno);
      return std::nullopt;
    }
    if (rc == 0) {
      if (Clock::now() < deadline) continue;
      if (why) *why = "timed out";
      return std::nullopt;
    }
    char chunk[4096];
    ssize_t n = ::read(out_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (why) *why = n == 0 ? "EOF (did it exit?)" : "read: " + errno_str(errno);
      ::close(out_fd_);
      out_fd_ = -1;
      return std::nullopt;
    }
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

std::string Spawned::wait_line(Deadline deadline, std::string_view waiting_for) {
  std::string why;
  auto line = try_wait_line(deadline, &why);
  if (!line) {
    throw HarnessError(name_ + " (pid " + std::to_string(pid_) + "): no " + std::string(waiting_for) + ": " +
                       why + "; state " + status_state(pid_) +
                       (buf_.empty() ? "" : "; partial output: " + buf_));
  }
  return *line;
}

void Spawned::send(std::string_view line) {
  if (in_fd_ < 0) throw HarnessError(name_ + ": stdin already closed");
  std::string s(line);
  s += '\n';
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(in_fd_, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw HarnessError(name_ + " (pid " + std::to_string(pid_) + "): write to stdin: " + errno_str(errno));
    off += static_cast<size_t>(n);
  }
}

void Spawned::close_stdin() {
  if (in_fd_ >= 0) ::close(in_fd_);
  in_fd_ = -1;
}

void Spawned::kill(int sig) {
  if (!reaped_) ::kill(pid_, sig);
}

void Spawned::kill_group(int sig) {
  if (!reaped_) ::killpg(pid_, sig);
}

std::optional<int> Spawned::wait_exit(Deadline deadline, bool echild_ok, bool* was_echild) {
  if (was_echild) *was_echild = false;
  if (reaped_) throw HarnessError(name_ + ": already reaped");
  for (;;) {
    int st = 0;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      return st;
    }
    if (r < 0 && errno == ECHILD) {
      reaped_ = true;
      if (!echild_ok)
        throw HarnessError(name_ + " (pid " + std::to_string(pid_) + ") was reaped by someone else");
      if (was_echild) *was_echild = true;
      return std::nullopt;
    }
    if (r < 0 && errno != EINTR) throw HarnessError("waitpid: " + errno_str(errno));
    if (Clock::now() > deadline) return std::nullopt;
    usleep(1000);
  }
}

// ---------------------------------------------------------------------------
// Reports and TargetProcess

std::map<std::string, long long> parse_fields(std::string_view line) {
  std::map<std::string, long long> out;
  std::istringstream in{std::string(line)};
  std::string tok;
  while (in >> tok) {
    if (tok == "detail:") break;
    auto eq = tok.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    char* end = nullptr;
    std::string v = tok.substr(eq + 1);
    long long n = strtoll(v.c_str(), &end, 10);
    if (end != v.c_str() && *end == '\0') out[tok.substr(0, eq)] = n;
  }
  return out;
}

Report parse_report(std::string_view line) {
  Report r;
  r.raw = std::string(line);
  r.fields = parse_fields(line);
  auto d = line.find("detail:");
  if (d != std::string_view::npos) {
    r.detail = std::string(line.substr(d + 7));
    while (!r.detail.empty() && r.detail.front() == ' ') r.detail.erase(0, 1);
  }
  for (const char* k : {"anomalies", "fds_delta", "maps_delta", "calls", "strings"})
    if (!r.fields.count(k)) throw HarnessError("malformed report (no " + std::string(k) + "): " + r.raw);
  return r;
}

long long Report::get(const std::string& key) const {
  auto it = fields.find(key);
  if (it == fields.end()) throw HarnessError("report has no field " + key + ": " + raw);
  return it->second;
}

TargetProcess::TargetProcess(const std::string& program, std::vector<std::string> args) {
  std::vector<std::string> argv{bin_path(program)};
  argv.insert(argv.end(), args.begin(), args.end());
  proc_ = Spawned::start(argv);
  std::string line = proc_->wait_line(after(std::chrono::seconds(10)), "\"ready <pid>\"");
  if (line != "ready " + std::to_string(proc_->pid()))
    throw HarnessError(program + ": expected \"ready " + std::to_string(proc_->pid()) + "\", got \"" + line +
                       "\"");
}

TargetProcess::~TargetProcess() {
  // Polite first, so a target can exit by itself; the Spawned destructor
  // kills the group anyway.
  if (proc_ && !proc_->reaped() && alive(proc_->pid()) && process_state(proc_->pid()) != 'T') {
    try {
      proc_->send("quit");
      proc_->try_wait_line(after(std::chrono::milliseconds(500)));
    } catch (const HarnessError&) {
    }
  }
}

std::string TargetProcess::command(std::string_view cmd) {
  proc_->send(cmd);
  // 30 s: "report" may wait up to 10 s for stalled workers before replying.
  return proc_->wait_line(after(std::chrono::seconds(30)), "reply to \"" + std::string(cmd) + "\"");
}

void TargetProcess::snapshot() {
  std::string r = command("snapshot");
  if (r != "ok") throw HarnessError("snapshot: unexpected reply: " + r);
}

Report TargetProcess::report() { return parse_report(command("report")); }

std::map<std::string, pid_t> TargetProcess::tids() {
  std::string r = command("tids");
  std::istringstream in(r);
  std::string tok;
  in >> tok;
  if (tok != "tids") throw HarnessError("tids: unexpected reply: " + r);
  std::map<std::string, pid_t> out;
  while (in >> tok) {
    auto c = tok.rfind(':');
    if (c == std::string::npos) throw HarnessError("tids: malformed entry " + tok);
    out[tok.substr(0, c)] = static_cast<pid_t>(std::stol(tok.substr(c + 1)));
  }
  return out;
}

// ---------------------------------------------------------------------------
// /proc

int count_fds(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(path.c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) ++n;
  closedir(d);
  if (pid == getpid()) --n;  // our own opendir fd
  return n;
}

int count_maps(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/maps");
  if (s.empty()) return -1;
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

char process_state(pid_t pid) {
  std::string t = stat_tail("/proc/" + std::to_string(pid) + "/stat");
  return t.empty() ? 0 : t[0];
}

std::map<pid_t, char> task_states(pid_t pid) {
  std::map<pid_t, char> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string t = stat_tail(dir + "/" + e->d_name + "/stat");
    if (!t.empty()) out[static_cast<pid_t>(atoi(e->d_name))] = t[0];
  }
  closedir(d);
  return out;
}

bool alive(pid_t pid) {
  char s = process_state(pid);
  return s != 0 && s != 'Z' && s != 'X' && s != 'x';
}

std::string status_state(pid_t pid) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("State:", 0) == 0) {
      auto p = line.find_first_not_of(" \t", 6);
      return p == std::string::npos ? std::string() : line.substr(p);
    }
  return {};
}

std::optional<pid_t> find_kernel_thread() {
  constexpr unsigned long kPfKthread = 0x00200000;
  auto is_kthread = [&](pid_t pid) {
    std::istringstream in(stat_tail("/proc/" + std::to_string(pid) + "/stat"));
    // After the comm: state(3) ppid(4) pgrp(5) session(6) tty_nr(7) tpgid(8) flags(9).
    std::string f;
    for (int i = 3; i <= 9 && (in >> f); ++i)
      if (i == 9) return (std::stoul(f) & kPfKthread) != 0;
    return false;
  };
  if (is_kthread(2)) return 2;
  DIR* d = opendir("/proc");
  if (!d) return std::nullopt;
  std::optional<pid_t> found;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    pid_t pid = static_cast<pid_t>(atoi(e->d_name));
    if (is_kthread(pid)) {
      found = pid;
      break;
    }
  }
  closedir(d);
  return found;
}

std::string describe_tasks(pid_t pid) {
  std::ostringstream out;
  std::string base = "/proc/" + std::to_string(pid);
  std::string comm = read_file(base + "/comm");
  if (!comm.empty() && comm.back() == '\n') comm.pop_back();
  out << "pid " << pid << " (" << comm << ") " << status_state(pid) << "\n";
  for (const auto& [tid, state] : task_states(pid)) {
    std::string t = base + "/task/" + std::to_string(tid);
    std::string tcomm = read_file(t + "/comm");
    if (!tcomm.empty() && tcomm.back() == '\n') tcomm.pop_back();
    std::string sc = read_file(t + "/syscall");
    if (!sc.empty() && sc.back() == '\n') sc.pop_back();
    out << "  tid " << tid << " (" << tcomm << ") state " << state << " wchan " << read_file(t + "/wchan")
        << " syscall " << sc << "\n";
    std::string stack = read_file(t + "/stack");
    std::istringstream ss(stack);
    std::string l;
    while (std::getline(ss, l)) out << "      " << l << "\n";
  }
  return out.str();
}

bool wait_for(const std::function<bool()>& pred, Deadline deadline) {
  for (;;) {
    if (pred()) return true;
    if (Clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// ---------------------------------------------------------------------------
// SignalStorm

SignalStorm::SignalStorm(pid_t pid, long max_rt) : thread_([this, pid, max_rt] { run(pid, max_rt); }) {}

SignalStorm::~SignalStorm() { stop(); }

void SignalStorm::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void SignalStorm::run(pid_t pid, long max_rt) {
  for (long i = 0; !stop_.load() && rt_.load() < max_rt; ++i) {
    if (::kill(pid, SIGUSR1) == 0)
      usr1_++;
    else
      errors_++;
    if (::kill(pid, SIGUSR2) == 0)
      usr2_++;
    else
      errors_++;
    sigval v{};
    v.sival_int = static_cast<int>(i);
    if (sigqueue(pid, SIGRTMIN, v) == 0) {
      rt_++;
      rt_sum_ += i;
    } else if (errno != EAGAIN) {  // EAGAIN: queue limit reached, not sent
      errors_++;
    }
    // Pacing, not synchronisation: a storm, but one the target survives.
    if (i % 32 == 31) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// ---------------------------------------------------------------------------
// Watchdog

namespace {
// When the running test last made progress (note_progress), in
// steady_clock ticks; read by every Watchdog.
std::atomic<Clock::rep> g_progress{0};
}  // namespace

void note_progress() { g_progress.store(Clock::now().time_since_epoch().count()); }

struct Watchdog::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
};

Watchdog::Watchdog(std::chrono::seconds limit, std::string what) : state_(std::make_shared<State>()) {
  const auto budget = scaled(std::chrono::duration_cast<std::chrono::milliseconds>(limit));
  const auto start = Clock::now();
  thread_ = std::thread([st = state_, limit, budget, start, what = std::move(what)] {
    std::unique_lock lock(st->mu);
    // The limit runs from the later of the start and the last progress.
    auto last = [&] { return std::max(start, Clock::time_point(Clock::duration(g_progress.load()))); };
    for (;;) {
      if (st->cv.wait_until(lock, last() + budget, [&] { return st->done; })) return;
      if (Clock::now() >= last() + budget) break;
    }
    const bool progressed = last() > start;
    fprintf(stderr, "\n=== WATCHDOG: %s made no progress for %lld ms (%lld s, x%.2f for this machine%s); "
            "thread states follow ===\n",
            what.c_str(), static_cast<long long>(budget.count()), static_cast<long long>(limit.count()),
            time_scale(), progressed ? ", counted from its last finished step" : "");
    std::vector<pid_t> live;
    {
      std::lock_guard l(g_live_mu);
      live.assign(g_live.begin(), g_live.end());
    }
    for (pid_t p : live) fprintf(stderr, "%s", describe_tasks(p).c_str());
    fprintf(stderr, "test process:\n%s", describe_tasks(getpid()).c_str());
    for (pid_t p : live) {
      ::killpg(p, SIGKILL);
      ::kill(p, SIGKILL);
    }
    fflush(stderr);
    abort();
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(state_->mu);
    state_->done = true;
  }
  state_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

void IntegrationTest::SetUp() {
  signal(SIGPIPE, SIG_IGN);
  long secs = watchdog_seconds();
  if (const char* e = getenv("REMORA_TEST_WATCHDOG_S")) secs = std::max(1L, atol(e));
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "test";
  watchdog_ = std::make_unique<Watchdog>(std::chrono::seconds(secs), name);
}

void IntegrationTest::TearDown() { watchdog_.reset(); }

}  // namespace remora::test
