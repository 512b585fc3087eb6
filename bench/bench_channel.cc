// remora-bench-channel: the socket channel against ptrace (issue 27's
// benchmark), every row sampled once per round so that a change of machine
// load shifts them alike:
//   first attach   Controller::attach of the hook tool into a fresh process
//                  that opted in (the agent preloaded, REMORA_TOOL_ATTACH=1,
//                  so neither row loads the agent), through ptrace and
//                  through the socket; the target's main thread waits in
//                  read(2) ("read": the wake starts the thread on it) or in
//                  epoll_wait(2) ("epoll": the wake re-issues the wait);
//   re-attach      attach + detach cycles on one process: ptrace, the
//                  socket with its channel thread still up ("warm": the
//                  cycles follow each other), and the socket after the
//                  thread left ("cold": each attach needs a wake), against
//                  ptrace after the same pause (an idle machine wakes slower);
//   idle overhead  a fresh process running a CPU-bound loop and a
//                  syscall-heavy loop (getppid, and write+read on a pipe),
//                  without the agent and opted in with nobody attached: the
//                  loop's own time against a second sample without the
//                  agent (the noise); and a process that does nothing, from
//                  fork to reaped, without the agent, with it preloaded, and
//                  opted in (the opt-in's own cost: the constructor's
//                  socket, handler and range record).
// Every process is this program run again in a role ("--target",
// "--work"). The payload is the test hook tool with no log file.
//   remora-bench-channel AGENT TOOL [ROUNDS]
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attach/attach.h"

using Clock = std::chrono::steady_clock;
using remora::attach::AttachOptions;
using remora::attach::Channel;
using remora::attach::Controller;

namespace {

std::string g_self, g_agent;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "remora-bench-channel: %s\n", what.c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "--target READY HOLD read|epoll": says it is up, then waits on HOLD.
int target_main(int ready_fd, int hold_fd, const char* how) {
  char b = 'r';
  (void)!write(ready_fd, &b, 1);
  if (std::strcmp(how, "epoll") == 0) {
    const int ep = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_ADD, hold_fd, &ev);
    epoll_event out{};
    while (epoll_wait(ep, &out, 1, -1) == 0) {
    }
    return 0;
  }
  (void)!read(hold_fd, &b, 1);
  return 0;
}

// "--work cpu|sys|pipe N OUT": runs the loop, writes its own time (ns) to OUT.
int work_main(const char* kind, long n, int out_fd) {
  const auto t0 = Clock::now();
  volatile uint64_t acc = 1;
  if (std::strcmp(kind, "cpu") == 0) {
    for (long i = 0; i < n; ++i) acc = acc * 6364136223846793005ull + 1442695040888963407ull;
  } else if (std::strcmp(kind, "sys") == 0) {
    for (long i = 0; i < n; ++i) acc = acc + static_cast<uint64_t>(getppid());
  } else {
    int p[2];
    if (pipe(p) != 0) return 1;
    char b = 'x';
    for (long i = 0; i < n; ++i) {
      (void)!write(p[1], &b, 1);
      (void)!read(p[0], &b, 1);
    }
  }
  const long ns = static_cast<long>(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  (void)!write(out_fd, &ns, sizeof ns);
  return 0;
}

// How a process starts: without the agent, with it preloaded, or
// preloaded and opted in to the socket channel (REMORA_TOOL_ATTACH=1).
enum class Start { kPlain, kPreloaded, kOptedIn };

// Starts this program in a role. Returns its pid.
pid_t spawn(const std::vector<std::string>& args, Start how) {
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    unsetenv("LD_PRELOAD");
    unsetenv("REMORA_TOOL_ATTACH");
    if (how != Start::kPlain) setenv("LD_PRELOAD", g_agent.c_str(), 1);
    if (how == Start::kOptedIn) setenv("REMORA_TOOL_ATTACH", "1", 1);
    std::vector<char*> argv{g_self.data()};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(g_self.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

struct Target {
  pid_t pid = 0;
  int hold = -1;
  Target(const char* how) {
    int ready[2], hold_p[2];
    if (pipe(ready) != 0 || pipe(hold_p) != 0) die("pipe");
    fcntl(ready[0], F_SETFD, FD_CLOEXEC);  // the write ends go to the target
    fcntl(hold_p[1], F_SETFD, FD_CLOEXEC);
    pid = spawn({"--target", std::to_string(ready[1]), std::to_string(hold_p[0]), how}, Start::kOptedIn);
    close(ready[1]);
    close(hold_p[0]);
    hold = hold_p[1];
    char b;
    if (read(ready[0], &b, 1) != 1) die("the target did not start");
    close(ready[0]);
    // Up to its read or epoll_wait: its one thread asleep.
    for (int i = 0; i < 2000; ++i) {
      char st[512] = "";
      const std::string path = "/proc/" + std::to_string(pid) + "/stat";
      if (FILE* f = std::fopen(path.c_str(), "r")) {
        (void)!std::fgets(st, sizeof st, f);
        std::fclose(f);
      }
      const char* p = std::strrchr(st, ')');
      if (p && p[2] == 'S') break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~Target() {
    close(hold);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

double first_attach(const AttachOptions& base, Channel ch, const char* how) {
  Target t(how);
  AttachOptions o = base;
  o.channel = ch;
  Controller c;
  const auto t0 = Clock::now();
  if (auto r = c.attach(t.pid, o); !r) die(r.error().to_string());
  const double us = us_since(t0);
  remora::attach::DetachOptions d;
  d.channel = ch;
  if (auto r = c.detach(t.pid, d); !r) die(r.error().to_string());
  return us;
}

// Attach + detach cycles on one process; `pause_ms` between them.
void reattach(const AttachOptions& base, Channel ch, int cycles, int pause_ms, std::vector<double>* out) {
  Target t("read");
  AttachOptions o = base;
  o.channel = ch;
  remora::attach::DetachOptions d;
  d.channel = ch;
  Controller c;
  if (auto r = c.attach(t.pid, o); !r) die(r.error().to_string());
  if (auto r = c.detach(t.pid, d); !r) die(r.error().to_string());
  for (int i = 0; i < cycles; ++i) {
    if (pause_ms) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    const auto t0 = Clock::now();
    if (auto r = c.attach(t.pid, o); !r) die(r.error().to_string());
    if (auto r = c.detach(t.pid, d); !r) die(r.error().to_string());
    out->push_back(us_since(t0));
  }
}

// One workload process: {its loop's time, its whole life}, us.
std::pair<double, double> work(const char* kind, long n, Start how) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) die("pipe");
  const int child_out = dup(out[1]);  // inherited across exec
  const auto t0 = Clock::now();
  const pid_t pid = spawn({"--work", kind, std::to_string(n), std::to_string(child_out)}, how);
  close(child_out);
  close(out[1]);
  long ns = 0;
  if (read(out[0], &ns, sizeof ns) != sizeof ns) die("the workload said nothing");
  int st = 0;
  waitpid(pid, &st, 0);
  const double life = us_since(t0);
  close(out[0]);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the workload failed");
  return {static_cast<double>(ns) / 1e3, life};
}

struct Rows {
  std::vector<double> ptrace_read, socket_read, ptrace_epoll, socket_epoll;
  std::vector<double> re_ptrace, re_warm, re_cold, re_ptrace_paused;
  std::vector<double> loop[3][3];  // [cpu, sys, pipe][plain, opted in, plain again]
  std::vector<double> startup[3];  // a process that does nothing: [plain, preloaded, opted in]
};

void print_rows(const Rows& r, int rounds) {
  auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("  %-44s %10.0f us  (n=%zu)\n", name, median(v), v.size());
  };
  std::printf("remora-bench-channel: %d rounds, medians\n", rounds);
  std::printf("first attach into a fresh opted-in process (hook tool):\n");
  row("ptrace, main thread in read", r.ptrace_read);
  row("socket, main thread in read", r.socket_read);
  row("ptrace, main thread in epoll_wait", r.ptrace_epoll);
  row("socket, main thread in epoll_wait (re-issued)", r.socket_epoll);
  std::printf("  socket/ptrace: read %.2fx, epoll %.2fx\n", median(r.socket_read) / median(r.ptrace_read),
              median(r.socket_epoll) / median(r.ptrace_epoll));
  std::printf("re-attach (attach + detach) on one process:\n");
  row("ptrace", r.re_ptrace);
  row("socket, channel thread up (warm)", r.re_warm);
  row("socket, after it left (cold: a wake each)", r.re_cold);
  row("ptrace, after the same 0.6 s pause", r.re_ptrace_paused);
  std::printf("  socket/ptrace: warm %.2fx, cold %.2fx (against ptrace after the same pause)\n",
              median(r.re_warm) / median(r.re_ptrace), median(r.re_cold) / median(r.re_ptrace_paused));
  std::printf(
      "idle overhead, opted in and not attached, against no agent (and no agent against itself,\n"
      "a second sample each round: the noise):\n");
  const char* kinds[3] = {"CPU-bound (LCG, 2e8 steps)", "getppid x 2e6", "pipe write+read x 3e5"};
  for (int k = 0; k < 3; ++k) {
    const double plain = median(r.loop[k][0]), again = median(r.loop[k][2]);
    std::printf("  %-28s loop %9.0f vs %9.0f us: %.3fx (noise %.3fx)\n", kinds[k], median(r.loop[k][1]),
                plain, median(r.loop[k][1]) / plain, again / plain);
  }
  std::printf(
      "start-up (fork, exec, a main that returns, exit): no agent %.0f us, preloaded %.0f us (%+.0f), "
      "preloaded and opted in %.0f us (%+.0f more)\n",
      median(r.startup[0]), median(r.startup[1]), median(r.startup[1]) - median(r.startup[0]),
      median(r.startup[2]), median(r.startup[2]) - median(r.startup[1]));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--target") == 0)
    return target_main(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  if (argc == 5 && std::strcmp(argv[1], "--work") == 0)
    return work_main(argv[2], std::atol(argv[3]), std::atoi(argv[4]));
  if (argc < 3) die("usage: remora-bench-channel AGENT TOOL [ROUNDS]");
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) die("readlink /proc/self/exe");
  self[n] = '\0';
  g_self = self;
  g_agent = argv[1];
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 11;
  AttachOptions opts;
  opts.agent_path = argv[1];
  opts.tools = {argv[2]};
  opts.lease = true;
  const long counts[3] = {200000000, 2000000, 300000};
  const char* kinds[3] = {"cpu", "sys", "pipe"};
  Rows r;
  for (int i = 0; i < rounds; ++i) {
    r.ptrace_read.push_back(first_attach(opts, Channel::kPtrace, "read"));
    r.socket_read.push_back(first_attach(opts, Channel::kSocket, "read"));
    r.ptrace_epoll.push_back(first_attach(opts, Channel::kPtrace, "epoll"));
    r.socket_epoll.push_back(first_attach(opts, Channel::kSocket, "epoll"));
    reattach(opts, Channel::kPtrace, 5, 0, &r.re_ptrace);
    reattach(opts, Channel::kSocket, 5, 0, &r.re_warm);
    if (i < 5) {  // 0.6 s each: fewer samples
      reattach(opts, Channel::kSocket, 2, 600, &r.re_cold);
      reattach(opts, Channel::kPtrace, 2, 600, &r.re_ptrace_paused);
    }
    for (int k = 0; k < 3; ++k)
      for (int v = 0; v < 3; ++v)
        r.loop[k][v].push_back(work(kinds[k], counts[k], v == 1 ? Start::kOptedIn : Start::kPlain).first);
    for (int j = 0; j < 20; ++j)
      for (int v = 0; v < 3; ++v)
        r.startup[v].push_back(work("cpu", 0,
                                    v == 0   ? Start::kPlain
                                    : v == 1 ? Start::kPreloaded
                                             : Start::kOptedIn)
                                   .second);
  }
  print_rows(r, rounds);
  return 0;
}
