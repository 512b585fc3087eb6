// remora-bench-tool-overhead: what the default tool (libremora-tool.so, at
// its default settings: CPU sampling at 99 Hz per thread and tracing of the
// default set of blocking calls) costs a running service, measured in one run.
//
// It starts the bundled sample service (examples/sample-service), whose
// worker threads each do a checked unit of work in a loop (hash 1 MiB, sort
// 100k integers, write+read 256 KiB, 1000 mutex rounds, 2000 malloc/free)
// and whose main thread prints the counters once a second. Then it alternates
// windows of W seconds detached and attached: D A D A ... A D (R attached
// windows, R + 1 detached), attaching with attach::Controller. Each window
// starts one heartbeat after the attach or detach returned (so their own
// cost stays out) and spans W heartbeats. Per window and per worker it
// computes:
//
//   work/s          the worker's counter over the window's heartbeats;
//   CPU us / unit   the worker thread's CPU time over the window (from
//                   /proc/PID/task/TID/schedstat, nanoseconds; ticks from
//                   /proc/.../stat where schedstat is missing) divided by
//                   its units of work: the overhead the tool adds to each
//                   unit (samples, wrapped calls), independent of how the
//                   workers' naps are scheduled;
//
// and for the whole process its CPU per second (every thread, the tool's own
// included). The table gives the median of the detached and of the attached
// windows, and the median over rounds of the paired ratio A_i / mean(D_i,
// D_i+1), which cancels slow drift of the machine (other load, frequency).
// The workers nap between units, so the work rate moves little even when a
// unit costs more: CPU per unit is the figure that shows the overhead.
//
//   remora-bench-tool-overhead [--rounds N] [--window SEC] [--service PATH]
//                              [--tool PATH] [--agent PATH] [--env NAME=VALUE]...
//                              [--keep-output]
//
// Defaults: 5 rounds of 5 s; the service next to this program, the tool in
// ../lib, the agent found as the CLI finds it. --env sets a variable in the
// service at each attach (docs/tool.md lists the tool's settings), to measure
// other settings than the defaults. The tool writes its results
// under a temporary directory (the service's working directory), removed at
// the end unless --keep-output. Prints the load average at start and end:
// the figures mean little on a loaded machine.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attach/attach.h"

using Clock = std::chrono::steady_clock;
using remora::attach::AttachOptions;
using remora::attach::Controller;

namespace {

pid_t g_service = -1;  // killed by die()

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "remora-bench-tool-overhead: %s\n", what.c_str());
  if (g_service > 0) {
    kill(g_service, SIGKILL);
    waitpid(g_service, nullptr, 0);
  }
  std::exit(1);
}

std::string read_file(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

std::string dir_of(const std::string& p) {
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::string self_dir() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) die("readlink /proc/self/exe failed");
  exe[n] = '\0';
  return dir_of(exe);
}

std::string load_average() {
  std::string l = read_file("/proc/loadavg");
  std::array<double, 3> a{};
  if (std::sscanf(l.c_str(), "%lf %lf %lf", &a[0], &a[1], &a[2]) != 3) return "?";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f / %.2f / %.2f", a[0], a[1], a[2]);
  return buf;
}

// --- the service's heartbeat ---------------------------------------------------

// One line of the sample service:
// "heartbeat: pid P t=Ns hashes=.. sorts=.. file_rounds=.. lock_rounds=..
//  alloc_rounds=.. pipe_reads=.. errors=.. rss=..MiB"
struct Heartbeat {
  long t = 0;
  uint64_t hashes = 0, sorts = 0, file_rounds = 0, lock_rounds = 0, alloc_rounds = 0, pipe_reads = 0,
           errors = 0;
};

std::optional<Heartbeat> parse_heartbeat(const std::string& line) {
  Heartbeat h;
  int pid = 0;
  double rss = 0;
  int n = std::sscanf(line.c_str(),
                      "heartbeat: pid %d t=%lds hashes=%" SCNu64 " sorts=%" SCNu64 " file_rounds=%" SCNu64
                      " lock_rounds=%" SCNu64 " alloc_rounds=%" SCNu64 " pipe_reads=%" SCNu64
                      " errors=%" SCNu64 " rss=%lf",
                      &pid, &h.t, &h.hashes, &h.sorts, &h.file_rounds, &h.lock_rounds, &h.alloc_rounds,
                      &h.pipe_reads, &h.errors, &rss);
  if (n != 10) return std::nullopt;
  return h;
}

// Reads the service's stdout line by line, with deadlines.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // The next line, or nullopt at EOF or when `timeout` passed.
  std::optional<std::string> next(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return std::nullopt;
      char tmp[4096];
      ssize_t n = read(fd_, tmp, sizeof tmp);
      if (n <= 0) return std::nullopt;
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
  std::string buf_;
};

// --- CPU time per thread ---------------------------------------------------------

// CPU nanoseconds of every live thread of `pid`, summed by thread name
// (comm), plus "*" for the whole (live threads only: none of the service's
// exits while it runs, the tool's thread lives through each attached window).
std::map<std::string, double> cpu_by_thread(pid_t pid) {
  std::map<std::string, double> out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(task.c_str());
  if (!d) die("cannot read " + task + ": " + std::strerror(errno));
  static const double ns_per_tick = 1e9 / static_cast<double>(sysconf(_SC_CLK_TCK));
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string dir = task + "/" + e->d_name;
    std::string comm = read_file(dir + "/comm");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    double ns = -1;
    // schedstat: "<ns on cpu> <ns waiting> <timeslices>" (CONFIG_SCHED_INFO).
    if (std::string s = read_file(dir + "/schedstat"); !s.empty()) {
      unsigned long long run = 0;
      if (std::sscanf(s.c_str(), "%llu", &run) == 1) ns = static_cast<double>(run);
    }
    if (ns < 0) {  // stat: utime and stime, fields 14 and 15, after the ")" of comm
      std::string s = read_file(dir + "/stat");
      auto rp = s.rfind(')');
      if (rp == std::string::npos) continue;  // the thread just exited
      unsigned long long ut = 0, st = 0;
      if (std::sscanf(s.c_str() + rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                      &st) != 2)
        continue;
      ns = static_cast<double>(ut + st) * ns_per_tick;
    }
    out[comm] += ns;
    out["*"] += ns;
  }
  closedir(d);
  return out;
}

// --- windows -----------------------------------------------------------------------

struct Workload {
  const char* name;
  uint64_t Heartbeat::*counter;
  std::vector<std::string> threads;  // comm names of its threads
};

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> w = {
      {"hash (FNV-1a of 1 MiB)", &Heartbeat::hashes, {"hash"}},
      {"sort (100k integers)", &Heartbeat::sorts, {"sort"}},
      {"file-io (256 KiB pwrite+pread)", &Heartbeat::file_rounds, {"file-io"}},
      {"lock (2 threads, 1000 lock rounds)", &Heartbeat::lock_rounds, {"lock-a", "lock-b"}},
      {"churn (2000 malloc+free)", &Heartbeat::alloc_rounds, {"churn"}},
  };
  return w;
}

struct Window {
  bool attached = false;
  double seconds = 0;
  std::vector<double> rate;          // per workload: units per second
  std::vector<double> cpu_per_unit;  // per workload: CPU microseconds per unit
  double process_cpu_ms_per_s = 0;
  double tool_cpu_ms_per_s = 0;  // the tool's thread ("remora-tool")
};

class Bench {
 public:
  Bench(pid_t pid, LineReader& reader) : pid_(pid), reader_(reader) {}

  Heartbeat next_heartbeat() {
    for (;;) {
      auto line = reader_.next(std::chrono::seconds(10));
      if (!line) die("the service stopped printing heartbeats");
      if (auto h = parse_heartbeat(*line)) {
        if (h->errors != 0) die("the service reports errors=" + std::to_string(h->errors) + ": " + *line);
        last_ = *h;
        return *h;
      }
    }
  }

  // Skips one heartbeat (settling), then measures `beats` heartbeats.
  Window measure(bool attached, int beats) {
    next_heartbeat();
    Heartbeat h0 = next_heartbeat();
    auto c0 = cpu_by_thread(pid_);
    Heartbeat h1;
    for (int i = 0; i < beats; ++i) h1 = next_heartbeat();
    auto c1 = cpu_by_thread(pid_);
    Window w;
    w.attached = attached;
    w.seconds = static_cast<double>(h1.t - h0.t);
    if (w.seconds <= 0) die("heartbeat clock did not advance");
    auto cpu = [&](const std::string& comm) {
      auto a = c0.find(comm), b = c1.find(comm);
      double end = b == c1.end() ? 0 : b->second, start = a == c0.end() ? 0 : a->second;
      return end - start;
    };
    for (const auto& wl : workloads()) {
      double units = static_cast<double>(h1.*(wl.counter) - h0.*(wl.counter));
      double ns = 0;
      for (const auto& t : wl.threads) ns += cpu(t);
      w.rate.push_back(units / w.seconds);
      w.cpu_per_unit.push_back(units > 0 ? ns / 1000.0 / units : 0);
    }
    w.process_cpu_ms_per_s = cpu("*") / 1e6 / w.seconds;
    w.tool_cpu_ms_per_s = cpu("remora-tool") / 1e6 / w.seconds;
    return w;
  }

  const Heartbeat& last() const { return last_; }

 private:
  pid_t pid_;
  LineReader& reader_;
  Heartbeat last_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Median over rounds of attached_i / mean(detached_i, detached_i+1).
double paired_ratio(const std::vector<double>& detached, const std::vector<double>& attached) {
  std::vector<double> r;
  for (size_t i = 0; i < attached.size() && i + 1 < detached.size(); ++i) {
    double base = (detached[i] + detached[i + 1]) / 2;
    if (base > 0) r.push_back(attached[i] / base);
  }
  return median(r);
}

struct Args {
  int rounds = 5;
  int window = 5;
  std::string service, tool, agent;
  std::vector<std::pair<std::string, std::string>> env;  // --env NAME=VALUE, for the tool
  bool keep_output = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  const std::string dir = self_dir();
  a.service = dir + "/remora-sample-service";
  a.tool = dir + "/../lib/libremora-tool.so";
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("option " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--rounds")
      a.rounds = std::atoi(value().c_str());
    else if (k == "--window")
      a.window = std::atoi(value().c_str());
    else if (k == "--service")
      a.service = value();
    else if (k == "--tool")
      a.tool = value();
    else if (k == "--agent")
      a.agent = value();
    else if (k == "--env") {
      std::string kv = value();
      auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) die("--env wants NAME=VALUE, not " + kv);
      a.env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    } else if (k == "--keep-output")
      a.keep_output = true;
    else
      die("usage: remora-bench-tool-overhead [--rounds N] [--window SEC] [--service PATH] [--tool PATH] "
          "[--agent PATH] [--env NAME=VALUE]... [--keep-output]");
  }
  if (a.rounds < 1 || a.window < 1) die("--rounds and --window must be at least 1");
  for (auto* p : {&a.service, &a.tool}) {
    char real[4096];
    if (!realpath(p->c_str(), real)) die(*p + " not found (build it: cmake --build build)");
    *p = real;
  }
  return a;
}

// Starts the service in `workdir` with its stdout on a pipe; it dies with us.
pid_t start_service(const std::string& path, const std::string& workdir, int* out_fd) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) die("pipe2 failed");
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (dup2(fds[1], STDOUT_FILENO) < 0 || chdir(workdir.c_str()) != 0) _exit(127);
    execl(path.c_str(), path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);

  char tmpl[] = "/tmp/remora-bench-tool-overhead.XXXXXX";
  if (!mkdtemp(tmpl)) die("mkdtemp failed");
  const std::string workdir = tmpl;

  const std::string load_start = load_average();
  int out_fd = -1;
  g_service = start_service(args.service, workdir, &out_fd);
  LineReader reader(out_fd);
  for (;;) {  // "sample-service pid N ready: ..."
    auto line = reader.next(std::chrono::seconds(10));
    if (!line) die("the sample service did not start (" + args.service + ")");
    if (line->find(" ready:") != std::string::npos) break;
  }
  Bench bench(g_service, reader);

  AttachOptions opts;
  opts.tools = {args.tool};
  opts.agent_path = args.agent;  // empty: found as the CLI finds it
  opts.env = args.env;
  Controller controller;

  std::vector<Window> detached, attached;
  std::vector<double> attach_ms, detach_ms;
  detached.push_back(bench.measure(false, args.window));
  for (int round = 0; round < args.rounds; ++round) {
    auto t0 = Clock::now();
    auto r = controller.attach(g_service, opts);
    if (!r) die("attach: " + r.error().to_string());
    if (!r->ok) die("attach: " + r->message);
    attach_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    attached.push_back(bench.measure(true, args.window));
    t0 = Clock::now();
    if (auto d = controller.detach(g_service); !d) die("detach: " + d.error().to_string());
    detach_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    detached.push_back(bench.measure(false, args.window));
    std::fprintf(stderr,
                 "round %d/%d: process CPU %.0f ms/s detached, %.0f ms/s attached (tool thread %.0f ms/s)\n",
                 round + 1, args.rounds, detached[detached.size() - 2].process_cpu_ms_per_s,
                 attached.back().process_cpu_ms_per_s, attached.back().tool_cpu_ms_per_s);
  }
  const Heartbeat last = bench.last();

  // Stop the service; it checks its own work and exits 0 when all was right.
  kill(g_service, SIGTERM);
  int status = 0;
  waitpid(g_service, &status, 0);
  g_service = -1;
  const bool service_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  const std::string load_end = load_average();

  // One directory per detach under the default REMORA_OUTPUT_PATH
  // (./remora-output of the service), next to "<comm>-<pid>-latest" links.
  size_t outputs = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(workdir + "/remora-output", ec))
    if (!e.is_symlink(ec) && e.is_directory(ec)) ++outputs;
  if (!args.keep_output) std::filesystem::remove_all(workdir, ec);

  auto column = [](const std::vector<Window>& ws, auto get) {
    std::vector<double> v;
    for (const auto& w : ws) v.push_back(get(w));
    return v;
  };

  std::printf("## Default tool overhead on remora-sample-service\n\n");
  std::string settings = args.env.empty() ? "its default settings" : "";
  for (const auto& [k, v] : args.env) settings += (settings.empty() ? "" : " ") + k + "=" + v;
  std::printf("Tool: %s at %s; %u CPUs; load average (1/5/15 min) %s at start, %s at end.\n",
              args.tool.c_str(), settings.c_str(), std::thread::hardware_concurrency(), load_start.c_str(),
              load_end.c_str());
  std::printf(
      "%d rounds: %zu detached and %zu attached windows of %d s, alternating (D A D ... A D), each "
      "starting 1 s after the attach or detach.\n\n",
      args.rounds, detached.size(), attached.size(), args.window);
  std::printf("| workload | metric | detached (median) | attached (median) | attached / detached |\n");
  std::printf("|---|---|---|---|---|\n");
  for (size_t i = 0; i < workloads().size(); ++i) {
    auto rate = [i](const Window& w) { return w.rate[i]; };
    auto cpu = [i](const Window& w) { return w.cpu_per_unit[i]; };
    auto dr = column(detached, rate), ar = column(attached, rate);
    auto dc = column(detached, cpu), ac = column(attached, cpu);
    std::printf("| %s | CPU us / unit | %.1f | %.1f | %.3f |\n", workloads()[i].name, median(dc), median(ac),
                paired_ratio(dc, ac));
    std::printf("| %s | units / s | %.1f | %.1f | %.3f |\n", workloads()[i].name, median(dr), median(ar),
                paired_ratio(dr, ar));
  }
  auto pc = [](const Window& w) { return w.process_cpu_ms_per_s; };
  auto dp = column(detached, pc), ap = column(attached, pc);
  std::printf("| whole process | CPU ms / s | %.1f | %.1f | %.3f |\n", median(dp), median(ap),
              paired_ratio(dp, ap));
  auto tc = column(attached, [](const Window& w) { return w.tool_cpu_ms_per_s; });
  std::printf("| tool thread (remora-tool) | CPU ms / s | - | %.2f | - |\n", median(tc));
  std::printf(
      "\nAttach (agent already loaded after the first): median %.1f ms, max %.1f ms. "
      "Detach (the tool writes its results): median %.1f ms, max %.1f ms. %zu result directories written.\n",
      median(attach_ms), *std::max_element(attach_ms.begin(), attach_ms.end()), median(detach_ms),
      *std::max_element(detach_ms.begin(), detach_ms.end()), outputs);
  std::printf("Service: errors=%" PRIu64 " at the last heartbeat (t=%lds); %s.\n", last.errors, last.t,
              service_ok ? "exited 0 (its own checks passed)" : "did NOT exit cleanly");
  std::printf(
      "Ratios are medians over rounds of attached / mean(detached before, detached after): "
      "> 1 for CPU means the tool costs that share per unit of work.\n");
  return service_ok ? 0 : 1;
}
