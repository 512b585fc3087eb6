// remora-bench-call: what a remote call costs, against what ptrace alone costs.
//
// Spawns remora-bench-target (bench_target.cc) and, in one run, measures on
// its main thread, which sits blocked in read(2) on a pipe:
//   (a) the floor: PTRACE_SEIZE + PTRACE_INTERRUPT + waitpid + GETREGS +
//       SETREGS + PTRACE_DETACH, the least any "stop one thread, touch its
//       registers, let it go" can cost;
//   (a2) the two-stop floor: the same, but the thread is let run once
//       (PTRACE_CONT) and stopped again (PTRACE_INTERRUPT) before the
//       detach: the least any design that runs code in the thread and then
//       takes it back can cost;
//   (b) the round trip of remote::Target::call of bench_probe(i), checked to
//       return i + 1;
//   (c) the stall: how long the called thread was held (CallReport.stopped),
//       and the largest gap the target's spinning thread saw during (b)
//       against a baseline window of the same length without calls.
// Prints a table, the ratio call/floor, and markdown rows for
// docs/benchmarks.md.
//
// Usage: remora-bench-call [-n N] [--warmup W] [--target PATH]
#include <elf.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "remote/target.h"

namespace remora::bench {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC
using std::chrono::nanoseconds;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "remora-bench-call: error: %s\n", msg.c_str());
  std::exit(1);
}

struct Stats {
  nanoseconds median{0}, p99{0}, max{0};
};

Stats stats_of(std::vector<nanoseconds> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, (v.size() * 99 + 99) / 100 - 1)];
  s.max = v.back();
  return s;
}

std::string us(nanoseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// The spawned target, with its command pipes. Killed and reaped however the
// bench ends (and it dies with the bench: PR_SET_PDEATHSIG).
class BenchTarget {
 public:
  static BenchTarget spawn(const std::string& path) {
    int cmd[2], rep[2];
    if (pipe2(cmd, O_CLOEXEC) != 0 || pipe2(rep, O_CLOEXEC) != 0)
      die("pipe2: " + std::string(strerror(errno)));
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) die("fork: " + std::string(strerror(errno)));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      // Move both ends above 4 first: a pipe end may itself be fd 3 or 4, and
      // dup2 onto itself would neither clear O_CLOEXEC nor survive the
      // second dup2. dup2 to 3 and 4 then clears O_CLOEXEC on those only.
      int cmd_in = fcntl(cmd[0], F_DUPFD_CLOEXEC, 10);
      int rep_out = fcntl(rep[1], F_DUPFD_CLOEXEC, 10);
      if (cmd_in < 0 || rep_out < 0 || dup2(cmd_in, 3) < 0 || dup2(rep_out, 4) < 0) _exit(127);
      execl(path.c_str(), path.c_str(), static_cast<char*>(nullptr));
      std::fprintf(stderr, "remora-bench-call: exec %s: %s\n", path.c_str(), strerror(errno));
      _exit(127);
    }
    close(cmd[0]);
    close(rep[1]);
    BenchTarget t;
    t.pid_ = pid;
    t.cmd_.reset(cmd[1]);
    t.rep_.reset(rep[0]);
    std::string ready = t.read_line(std::chrono::seconds(10));
    auto f = split_fields(ready);
    if (f.size() != 4 || f[0] != "ready") die("target did not say ready (got '" + ready + "')");
    t.reader_tid_ = static_cast<pid_t>(parse_u64(f[2]).value_or(0));
    t.spinner_tid_ = static_cast<pid_t>(parse_u64(f[3]).value_or(0));
    return t;
  }

  BenchTarget() = default;
  BenchTarget(BenchTarget&& o) noexcept
      : pid_(std::exchange(o.pid_, 0)),
        reader_tid_(o.reader_tid_),
        spinner_tid_(o.spinner_tid_),
        cmd_(std::move(o.cmd_)),
        rep_(std::move(o.rep_)) {}
  BenchTarget& operator=(BenchTarget&&) = delete;
  ~BenchTarget() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  pid_t pid() const { return pid_; }
  pid_t reader_tid() const { return reader_tid_; }
  pid_t spinner_tid() const { return spinner_tid_; }

  std::string command(char c) {
    if (write(cmd_.get(), &c, 1) != 1) die("write command: " + std::string(strerror(errno)));
    return read_line(std::chrono::seconds(10));
  }

  struct Gap {
    nanoseconds max{0};
    uint64_t over_10us = 0;
    uint64_t iterations = 0;
  };
  void reset_gap() {
    if (command('r') != "ok") die("target did not acknowledge the reset");
  }
  Gap query_gap() {
    std::string line = command('q');
    auto f = split_fields(line);
    if (f.size() != 3) die("bad gap report '" + line + "'");
    return Gap{nanoseconds(parse_u64(f[0]).value_or(0)), parse_u64(f[1]).value_or(0),
               parse_u64(f[2]).value_or(0)};
  }

  // Asks the target to exit and checks that it exits 0: its read(2) never
  // saw EINTR, however often it was interrupted.
  void finish() {
    char c = 'x';
    if (write(cmd_.get(), &c, 1) != 1) die("write exit command");
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) die("waitpid target");
    pid_ = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      die("target did not exit cleanly (status " + std::to_string(status) + ")");
  }

 private:
  std::string read_line(nanoseconds timeout) {
    std::string line;
    auto deadline = Clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) die("timed out waiting for the target");
      pollfd p{rep_.get(), POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char c = 0;
      ssize_t n = read(rep_.get(), &c, 1);
      if (n != 1) die("target closed its reply pipe (did it crash?)");
      if (c == '\n') return line;
      line += c;
    }
  }

  pid_t pid_ = 0;
  pid_t reader_tid_ = 0;
  pid_t spinner_tid_ = 0;
  UniqueFd cmd_, rep_;
};

// (a) One floor iteration. Raw ptrace on purpose: this is the kernel's price,
// without anything of Remora's (the ptrace wrapper included) in the way.
nanoseconds floor_once(pid_t tid) {
  auto t0 = Clock::now();
  if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) die("PTRACE_SEIZE: " + std::string(strerror(errno)));
  if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0)
    die("PTRACE_INTERRUPT: " + std::string(strerror(errno)));
  int status = 0;
  if (waitpid(tid, &status, __WALL) != tid) die("waitpid: " + std::string(strerror(errno)));
  if (!WIFSTOPPED(status) || (status >> 16) != PTRACE_EVENT_STOP) {
    die("unexpected stop status " + std::to_string(status));
  }
  user_regs_struct regs{};
#if defined(__x86_64__)
  if (ptrace(PTRACE_GETREGS, tid, nullptr, &regs) != 0)
    die("PTRACE_GETREGS: " + std::string(strerror(errno)));
  if (ptrace(PTRACE_SETREGS, tid, nullptr, &regs) != 0)
    die("PTRACE_SETREGS: " + std::string(strerror(errno)));
#else
  iovec iov{&regs, sizeof regs};
  if (ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, &iov) != 0)
    die("PTRACE_GETREGSET: " + std::string(strerror(errno)));
  if (ptrace(PTRACE_SETREGSET, tid, NT_PRSTATUS, &iov) != 0)
    die("PTRACE_SETREGSET: " + std::string(strerror(errno)));
#endif
  if (ptrace(PTRACE_DETACH, tid, nullptr, nullptr) != 0)
    die("PTRACE_DETACH: " + std::string(strerror(errno)));
  return Clock::now() - t0;
}

// (a2) One two-stop floor iteration: stopped, let run, stopped again.
nanoseconds two_stop_floor_once(pid_t tid) {
  auto t0 = Clock::now();
  if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) die("PTRACE_SEIZE: " + std::string(strerror(errno)));
  auto stop = [&] {
    if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0)
      die("PTRACE_INTERRUPT: " + std::string(strerror(errno)));
    int status = 0;
    if (waitpid(tid, &status, __WALL) != tid) die("waitpid: " + std::string(strerror(errno)));
    if (!WIFSTOPPED(status) || (status >> 16) != PTRACE_EVENT_STOP)
      die("unexpected stop status " + std::to_string(status));
  };
  stop();
  user_regs_struct regs{};
  iovec iov{&regs, sizeof regs};
  if (ptrace(PTRACE_GETREGSET, tid, NT_PRSTATUS, &iov) != 0)
    die("PTRACE_GETREGSET: " + std::string(strerror(errno)));
  if (ptrace(PTRACE_SETREGSET, tid, NT_PRSTATUS, &iov) != 0)
    die("PTRACE_SETREGSET: " + std::string(strerror(errno)));
  if (ptrace(PTRACE_CONT, tid, nullptr, nullptr) != 0) die("PTRACE_CONT: " + std::string(strerror(errno)));
  stop();
  if (ptrace(PTRACE_DETACH, tid, nullptr, nullptr) != 0)
    die("PTRACE_DETACH: " + std::string(strerror(errno)));
  return Clock::now() - t0;
}

std::string machine_description() {
  std::string model;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.starts_with("model name")) {
      auto colon = line.find(':');
      if (colon != std::string::npos) model = std::string(trim(std::string_view(line).substr(colon + 1)));
      break;
    }
  }
  utsname u{};
  uname(&u);
  if (model.empty()) model = u.machine;
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " CPUs, Linux " + u.release;
}

std::string today() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string default_target_path() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "remora-bench-target";
  std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1) + "remora-bench-target";
}

int run(int argc, char** argv) {
  size_t n = 2000, warmup = 50;
  std::string target_path = default_target_path();
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "-n") {
      n = parse_u64(value()).value_or(0);
    } else if (a == "--warmup") {
      warmup = parse_u64(value()).value_or(0);
    } else if (a == "--target") {
      target_path = value();
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: remora-bench-call [-n N (2000)] [--warmup W (50)] [--target PATH]\n");
      return 0;
    } else {
      die("unknown argument '" + std::string(a) + "' (see --help)");
    }
  }
  if (n == 0) die("-n must be a positive integer");

  // A watchdog: a wedged wait must not hang `make bench` forever. SIGALRM's
  // default action kills us; the target follows through PR_SET_PDEATHSIG.
  alarm(static_cast<unsigned>(120 + n / 10));

  BenchTarget target = BenchTarget::spawn(target_path);
  const pid_t tid = target.reader_tid();
  std::printf(
      "remora-bench-call: %zu iterations (+%zu warm-up) on thread %d of pid %d (blocked in read);\n"
      "spinning thread %d measures the stall seen by the rest of the process\n\n",
      n, warmup, tid, target.pid(), target.spinner_tid());
  std::fflush(stdout);

  // (a) the floor
  for (size_t i = 0; i < warmup; ++i) (void)floor_once(tid);
  std::vector<nanoseconds> floor_times;
  floor_times.reserve(n);
  target.reset_gap();
  auto floor_start = Clock::now();
  for (size_t i = 0; i < n; ++i) floor_times.push_back(floor_once(tid));
  auto floor_window = Clock::now() - floor_start;
  auto floor_gap = target.query_gap();

  // (a2) the two-stop floor
  for (size_t i = 0; i < warmup; ++i) (void)two_stop_floor_once(tid);
  std::vector<nanoseconds> floor2_times;
  floor2_times.reserve(n);
  for (size_t i = 0; i < n; ++i) floor2_times.push_back(two_stop_floor_once(tid));

  // (b) remote calls, (c) the stall
  auto opened = remote::Target::open(target.pid());
  if (!opened) die(opened.error().to_string());
  auto& remote_target = **opened;
  auto fn = remote_target.find_symbol("", "bench_probe");
  if (!fn) die(fn.error().to_string());
  remote::CallOptions opts;
  opts.tid = tid;
  auto call_once = [&](uint64_t i) -> std::pair<nanoseconds, nanoseconds> {
    const remote::CallArg args[] = {remote::CallArg::integer(i)};
    auto t0 = Clock::now();
    auto r = remote_target.call(*fn, args, opts);
    auto elapsed = Clock::now() - t0;
    if (!r) die("call " + std::to_string(i) + ": " + r.error().to_string());
    if (r->value != i + 1) die("bench_probe(" + std::to_string(i) + ") returned " + std::to_string(r->value));
    if (r->tid != tid)
      die("the call ran on thread " + std::to_string(r->tid) + ", not " + std::to_string(tid));
    return {elapsed, r->stopped};
  };
  for (size_t i = 0; i < warmup; ++i) (void)call_once(i);
  std::vector<nanoseconds> call_times, stopped_times;
  call_times.reserve(n);
  stopped_times.reserve(n);
  target.reset_gap();
  auto call_start = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    auto [elapsed, stopped] = call_once(1000 + i);
    call_times.push_back(elapsed);
    stopped_times.push_back(stopped);
  }
  auto call_window = Clock::now() - call_start;
  auto call_gap = target.query_gap();
  if (auto closed = remote_target.close(); !closed) die(closed.error().to_string());

  // Baseline: a window as long as the calls took, with nothing happening.
  target.reset_gap();
  std::this_thread::sleep_for(call_window);
  auto base_gap = target.query_gap();
  target.finish();

  const Stats fl = stats_of(floor_times), f2 = stats_of(floor2_times), ca = stats_of(call_times),
              st = stats_of(stopped_times);
  auto ratio = [](nanoseconds a, nanoseconds b) {
    return b.count() ? static_cast<double>(a.count()) / b.count() : 0;
  };
  auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };

  std::printf("%-46s %11s %11s %11s\n", "measurement (thread blocked in read)", "median", "p99", "max");
  std::printf("%-46s %11s %11s %11s\n", "(a) floor: seize+interrupt+wait+regs+detach", us(fl.median).c_str(),
              us(fl.p99).c_str(), us(fl.max).c_str());
  std::printf("%-46s %11s %11s %11s\n", "(a2) two-stop floor: ... cont, interrupt, wait",
              us(f2.median).c_str(), us(f2.p99).c_str(), us(f2.max).c_str());
  std::printf("%-46s %11s %11s %11s\n", "(b) remote call round trip: bench_probe(i)", us(ca.median).c_str(),
              us(ca.p99).c_str(), us(ca.max).c_str());
  std::printf("%-46s %11s %11s %11s\n", "(c) called thread stopped (CallReport)", us(st.median).c_str(),
              us(st.p99).c_str(), us(st.max).c_str());
  std::printf("\nratio call/floor: median %.2fx, p99 %.2fx\n", ratio(ca.median, fl.median),
              ratio(ca.p99, fl.p99));
  std::printf("ratio call/two-stop floor: median %.2fx, p99 %.2fx\n", ratio(ca.median, f2.median),
              ratio(ca.p99, f2.p99));
  std::printf("\nother threads: the spinning thread's largest gap between two loop iterations\n");
  auto gap_line = [&](const char* what, Clock::duration window, const BenchTarget::Gap& g) {
    std::printf("  %-28s %6.2f s   max gap %10s   gaps >= 10 us: %" PRIu64 " of %" PRIu64 " iterations\n",
                what, secs(window), us(g.max).c_str(), g.over_10us, g.iterations);
  };
  gap_line("baseline (no ptrace at all)", call_window, base_gap);
  gap_line("during (a) the floor loop", floor_window, floor_gap);
  gap_line("during (b) the remote calls", call_window, call_gap);

  const std::string machine = machine_description(), date = today();
  std::printf("\nmarkdown for docs/benchmarks.md (N=%zu):\n\n", n);
  std::printf("| machine | date | measurement | median | p99 |\n|---|---|---|---|---|\n");
  auto row = [&](const char* what, const std::string& median, const std::string& p99) {
    std::printf("| %s | %s | %s | %s | %s |\n", machine.c_str(), date.c_str(), what, median.c_str(),
                p99.c_str());
  };
  row("(a) floor: seize, interrupt, wait, get/set regs, detach", us(fl.median), us(fl.p99));
  row("(a2) two-stop floor: the same, plus cont, interrupt, wait", us(f2.median), us(f2.p99));
  row("(b) remote call round trip", us(ca.median), us(ca.p99));
  row("(c) called thread stopped", us(st.median), us(st.p99));
  char ratio_median[32], ratio_p99[32];
  std::snprintf(ratio_median, sizeof ratio_median, "%.2fx", ratio(ca.median, fl.median));
  std::snprintf(ratio_p99, sizeof ratio_p99, "%.2fx", ratio(ca.p99, fl.p99));
  row("ratio (b)/(a)", ratio_median, ratio_p99);
  std::snprintf(ratio_median, sizeof ratio_median, "%.2fx", ratio(ca.median, f2.median));
  std::snprintf(ratio_p99, sizeof ratio_p99, "%.2fx", ratio(ca.p99, f2.p99));
  row("ratio (b)/(a2)", ratio_median, ratio_p99);
  row("(c) other threads, max gap: baseline / during calls", us(base_gap.max) + " / " + us(call_gap.max),
      "n/a");
  return 0;
}

}  // namespace
}  // namespace remora::bench

int main(int argc, char** argv) { return remora::bench::run(argc, argv); }
