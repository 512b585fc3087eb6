// remora-bench-attach: what attaching costs, every row of issue 12 part 5
// measured in one interleaved run (a round takes one sample of each row, so
// that a change of machine load shifts every row alike):
//   in-process floor  a fresh process that loads the agent and attaches the
//                     tool itself (dlopen, the agent's listener thread, the
//                     tool's dlopen and hooks), no ptrace: no injector can do
//                     less
//   first attach      Controller::attach (what remora_attach wraps) into a
//                     fresh process, the agent not loaded yet:
//                       idle      its one thread blocked in read(2)
//                       spinning  plus one thread that spins (on 2 CPUs it
//                                 holds one of them)
//                       8 threads the spinner, six threads blocked, main;
//                     the spinner records the longest gap between two of its
//                     iterations during the attach: how long the attach kept
//                     it from running (its "stall"); the same window without
//                     an attach is the baseline
//   remora attach     the whole command, fork/exec to exit, on an idle fresh
//                     process: `-d 1` (attach, lease, the shortest session,
//                     detach) and `--keep --attach-children=false` (attach and
//                     exit: what an injector's CLI does); `remora --version`
//                     is the CLI's start-up alone, `/bin/true` what any
//                     command costs to fork, exec and reap here; the
//                     `--keep` one is split into its phases by its own
//                     REMORA_LOG=attach marks, in a run of its own
//   re-attach         attach + detach cycles once the agent is in
//   tree of 32        attach_tree over a parent with 31 children, fresh
//                     processes, against 32 in-process floors one per CPU
// Every target and floor process is this program run again in a role
// ("--target", "--load"): fresh processes, as services are, that share no
// copy-on-write memory with the bench.
// REMORA_BENCH_ROWS=tree takes the two tree rows alone, one sample each per
// round (for a profiler's run).
// REMORA_BENCH_PEER=LIBINJECTOR.so (kubo/injector's shared library, built
// apart: it is no part of Remora) adds the peer's rows to every round, on
// the same kind of fresh targets: its C API's attach, one dlopen of the
// same tool on the hijacked thread and detach, for the idle, spinning and
// 8-thread targets and for the 32 processes of a tree one after another
// (it has no tree call); REMORA_BENCH_PEER_CLI=INJECTOR adds its command,
// `injector -p PID TOOL`, fork/exec to exit.
// --pin CPU (or REMORA_BENCH_PIN=CPU) pins the bench to that one CPU before
// anything starts; every process it starts (targets, floors, `remora`, the
// peer) and every thread they start (the agent's loader and listener
// included) inherits the mask, so the controller and the target take turns
// on one CPU: a machine whose cores the target keeps busy. Each round checks
// that the 8-thread target's threads, listener included, are still on it.
// The floors then run one at a time (as many at a time as the bench has
// CPUs).
// The payload is the smallest tool there is (the test hook tool with no log
// file), so the figures are Remora's own cost.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "attach/attach.h"
#include "procfs/procfs.h"

using Clock = std::chrono::steady_clock;
using remora::attach::AttachOptions;
using remora::attach::Controller;

namespace {

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "remora-bench-attach: %s\n", what.c_str());
  std::exit(1);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double worst(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

// The CPU every process runs on (--pin), or -1: the machine's as it comes.
int g_pin_cpu = -1;

// How many CPUs the bench may run on: its affinity mask's (one when pinned).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  return std::max(1, CPU_COUNT(&set));
}

// Pins the calling (and still only) thread of the bench to `cpu`; what it
// starts from now on inherits the mask (fork, exec and clone keep it).
void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    die("--pin " + std::to_string(cpu) + ": sched_setaffinity: " + std::strerror(errno));
}

// Pinned runs only: every thread of `pid` may run on the pinned CPU alone
// (a thread that escaped the mask would make the rows those of two CPUs).
void check_pinned(pid_t pid) {
  if (g_pin_cpu < 0) return;
  auto tids = remora::procfs::list_tasks(pid);
  if (!tids) die("list the threads of " + std::to_string(pid) + ": " + tids.error().to_string());
  for (pid_t tid : *tids) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(tid, sizeof set, &set) != 0) continue;  // gone meanwhile
    if (CPU_COUNT(&set) != 1 || !CPU_ISSET(g_pin_cpu, &set))
      die("thread " + std::to_string(tid) + " of " + std::to_string(pid) + " is not pinned to CPU " +
          std::to_string(g_pin_cpu));
  }
}

// Shared (MAP_SHARED memfd) between the bench and a target's spinner: the
// bench asks for a new window by bumping `window`; the spinner starts it
// (its longest gap back to 0) and says so in `started`. To read the window's
// longest gap the bench bumps `probe` and waits for `probed`: the spinner
// answers after an iteration of its own, i.e. once it has run again and
// counted the gap that was still open (pinned, the attach's own gap ends
// only when the spinner next gets the CPU).
struct SpinShared {
  std::atomic<uint64_t> window{0}, started{0}, max_gap_ns{0}, probe{0}, probed{0};
  std::atomic<int> running{0};  // spinners that have started
};

// A fresh process (and optionally a tree under it) whose threads block in
// read(2) on a pipe, dying with the pipe's write end, i.e. with the bench.
struct Tree {
  pid_t root = -1;
  int ready_fd = -1, hold_fd = -1;
  SpinShared* spin = nullptr;
  ~Tree() {
    if (root > 0) {
      kill(-root, SIGKILL);
      kill(root, SIGKILL);
      waitpid(root, nullptr, 0);
    }
    if (hold_fd >= 0) close(hold_fd);
    if (ready_fd >= 0) close(ready_fd);
    if (spin) munmap(spin, sizeof *spin);
  }
  // Starts a new spinner window; true once the spinner started it (it runs
  // on a CPU of its own: a few microseconds, 2 s at most; pinned, it needs
  // ours, so the bench yields it).
  bool open_window() const {
    const uint64_t w = spin->window.fetch_add(1) + 1;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (spin->started.load() != w) {
      if (Clock::now() > deadline) return false;
      if (g_pin_cpu >= 0) sched_yield();
    }
    return true;
  }
  double stall_us() const {
    const uint64_t p = spin->probe.fetch_add(1) + 1;
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    while (spin->probed.load() != p) {
      if (Clock::now() > deadline) die("the target's spinner did not answer");
      if (g_pin_cpu >= 0) sched_yield();
    }
    return static_cast<double>(spin->max_gap_ns.load()) / 1000;
  }
};

// The agent the next spawn_tree preloads into its processes (LD_PRELOAD, as
// `remora run` does), or empty: none.
std::string g_preload;

// Targets are fresh programs: each process is this executable run again in
// a role, so no target shares copy-on-write memory with the bench.
[[noreturn]] void exec_role(std::vector<std::string> args) {
  std::vector<char*> argv;
  static char name[] = "remora-bench-attach";
  argv.push_back(name);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (!g_preload.empty()) setenv("LD_PRELOAD", g_preload.c_str(), 1);
  execv("/proc/self/exe", argv.data());
  _exit(127);
}

// `spinners` (0 or 1) spinning threads and `blocked` extra blocked threads
// in the root; `children` more processes (idle) under it.
void spawn_tree(Tree& t, int children, int spinners = 0, int blocked = 0) {
  int ready[2], hold[2];
  if (pipe(ready) || pipe(hold)) die("pipe");
  int shm = memfd_create("remora-bench-spin", 0);
  if (shm < 0 || ftruncate(shm, sizeof(SpinShared)) != 0) die("memfd");
  void* m = mmap(nullptr, sizeof(SpinShared), PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
  if (m == MAP_FAILED) die("mmap");
  t.spin = new (m) SpinShared;
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    setpgid(0, 0);
    close(ready[0]);
    close(hold[1]);
    auto role = [&](int s, int b) {
      return std::vector<std::string>{"--target",          std::to_string(ready[1]), std::to_string(hold[0]),
                                      std::to_string(shm), std::to_string(s),        std::to_string(b)};
    };
    for (int i = 0; i < children; ++i) {
      pid_t c = fork();
      if (c == 0) exec_role(role(0, 0));
    }
    exec_role(role(spinners, blocked));  // the root too: it stays the children's parent
  }
  close(shm);
  close(ready[1]);
  close(hold[0]);
  t.root = pid;
  t.ready_fd = ready[0];
  t.hold_fd = hold[1];
  for (int got = 0; got < children + 1;) {
    char b;
    if (read(t.ready_fd, &b, 1) != 1) die("target did not start");
    ++got;
  }
}

void spin(SpinShared* s) {
  uint64_t last = now_ns(), max_gap = 0, window = 0, probe = 0;
  s->running.fetch_add(1);
  for (;;) {
    const uint64_t t = now_ns();
    max_gap = std::max(max_gap, t - last);
    last = t;
    if (const uint64_t w = s->window.load(std::memory_order_relaxed); w != window) {
      window = w;
      max_gap = 0;
      s->max_gap_ns.store(0);
      s->started.store(w);
    }
    if (max_gap > s->max_gap_ns.load(std::memory_order_relaxed))
      s->max_gap_ns.store(max_gap, std::memory_order_relaxed);
    if (const uint64_t p = s->probe.load(std::memory_order_relaxed); p != probe) {
      probe = p;
      s->probed.store(p);  // after the gap's store: the bench reads it next
    }
  }
}

// "--target READY HOLD SHM SPINNERS BLOCKED": says it is up once its threads
// run, then blocks in read(2) until the bench goes away.
int target_main(int ready_fd, int hold_fd, int shm, int spinners, int blocked) {
  auto* s =
      static_cast<SpinShared*>(mmap(nullptr, sizeof(SpinShared), PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0));
  if (s == MAP_FAILED) return 1;
  std::atomic<int> up{0};
  for (int i = 0; i < blocked; ++i)
    std::thread([&up, hold_fd] {
      up.fetch_add(1);
      char b;
      (void)!read(hold_fd, &b, 1);
    }).detach();
  for (int i = 0; i < spinners; ++i) std::thread([s] { spin(s); }).detach();
  while (up.load() < blocked) std::this_thread::yield();  // pinned too: a yield lets them run
  while (s->running.load() < spinners) std::this_thread::yield();
  char b = 'c';
  (void)!write(ready_fd, &b, 1);
  (void)!read(hold_fd, &b, 1);
  return 0;
}

// CPU time (user + system) of all the calling process's threads, us.
double process_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// "--load READY GO DONE AGENT TOOL": the in-process floor. Says it is up,
// waits for "go", then loads the agent (its constructor starts the
// listener) and attaches the tool through the agent's own entry point, and
// reports the time that took.
int load_main(int ready_fd, int go_fd, int done_fd, const char* agent, const char* tool) {
  char b = 'r';
  (void)!write(ready_fd, &b, 1);
  if (read(go_fd, &b, 1) != 1) return 1;
  auto t0 = Clock::now();
  const double cpu0 = process_cpu_us();
  void* h = dlopen(agent, RTLD_NOW | RTLD_NODELETE);
  using AttachFn = int (*)(const void*, const char*);
  auto attach = h ? reinterpret_cast<AttachFn>(dlsym(h, "remora_agent_attach")) : nullptr;
  // Its own time, and the CPU time all its threads spent meanwhile.
  const double out[2] = {attach && attach(nullptr, tool) == 0 ? us_since(t0) : -1, process_cpu_us() - cpu0};
  (void)!write(done_fd, out, sizeof out);
  return 0;
}

// Runs `count` fresh "--load" processes, as many at a time as there are
// CPUs (a new one goes when one is done), once all are up. Returns each
// one's own time (us) and the wall time from the first "go" to the last
// report (us); `cpu` (if given) receives the median of the CPU time each
// process spent on its load (us).
std::pair<std::vector<double>, double> in_process(const std::string& agent, const std::string& tool,
                                                  int count, double* cpu = nullptr) {
  int ready[2], go[2], done[2];
  if (pipe(ready) || pipe(go) || pipe(done)) die("pipe");
  std::vector<pid_t> kids;
  for (int i = 0; i < count; ++i) {
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0)
      exec_role(
          {"--load", std::to_string(ready[1]), std::to_string(go[0]), std::to_string(done[1]), agent, tool});
    kids.push_back(pid);
  }
  close(ready[1]);
  close(go[0]);
  close(done[1]);
  for (int up = 0; up < count; ++up) {
    char b;
    if (read(ready[0], &b, 1) != 1) die("in-process loader did not start");
  }
  const int width = std::max(1, std::min(count, usable_cpus()));
  auto t0 = Clock::now();
  std::string first(static_cast<size_t>(width), 'g');
  if (write(go[1], first.data(), first.size()) != width) die("write");
  std::vector<double> each, each_cpu;
  for (int got = 0; got < count; ++got) {
    double us[2] = {-1, 0};
    if (read(done[0], us, sizeof us) != sizeof us || us[0] < 0) die("in-process load failed");
    each.push_back(us[0]);
    each_cpu.push_back(us[1]);
    if (got + width < count && write(go[1], "g", 1) != 1) die("write");
  }
  double wall = us_since(t0);
  close(ready[0]);
  close(go[1]);
  close(done[0]);
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  if (cpu) *cpu = median(each_cpu);
  return {each, wall};
}

// CPU time (user + system) of the calling thread, us.
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// One first attach into a fresh target; `stall` (if given) receives the
// spinner's longest gap during it, `cpu` (if given) the CPU time the
// controller's thread spent on it.
double first_attach(const AttachOptions& opts, int spinners, int blocked, double* stall = nullptr,
                    double* cpu = nullptr, bool preloaded = false) {
  Tree t;
  if (preloaded) g_preload = opts.agent_path;
  spawn_tree(t, 0, spinners, blocked);
  g_preload.clear();
  if (spinners > 0 && !t.open_window()) die("the target's spinner did not start its window");
  Controller c;
  const double cpu0 = thread_cpu_us();
  auto t0 = Clock::now();
  auto r = c.attach(t.root, opts);
  double us = us_since(t0);
  if (cpu) *cpu = thread_cpu_us() - cpu0;
  if (!r) die(r.error().to_string());
  if (stall) *stall = t.stall_us();
  if (blocked > 0) check_pinned(t.root);  // its threads and the agent's listener
  if (auto d = c.detach(t.root); !d) die(d.error().to_string());
  return us;
}

// The spinner's longest gap over a window as long as an attach, with no
// attach: what the machine costs it anyway.
double baseline_stall(double window_us) {
  Tree t;
  spawn_tree(t, 0, 1, 0);
  if (!t.open_window()) die("the target's spinner did not start its window");
  timespec ts{0, static_cast<long>(window_us * 1000)};
  nanosleep(&ts, nullptr);
  return t.stall_us();
}

// `PROGRAM ARGS` (remora, or /bin/true for the floor) as a whole, fork/exec
// to exit, its output to /dev/null.
double cli_run(const std::string& program, std::vector<std::string> args) {
  auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(program.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  double us = us_since(t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    die(program + " " + (args.empty() ? std::string() : args[0]) + " failed (status " +
        std::to_string(status) + ")");
  return us;
}

// Where the time of one `remora attach --keep` goes, from its own
// REMORA_LOG=attach marks (CLOCK_MONOTONIC, as Clock): fork to "the command
// starts" (exec, start-up, the line's parse), to "session ready" (tools
// chosen, target checked and opened), to "attached" (the attach), to the
// exit (report, teardown). A run of its own: writing the marks costs a few
// microseconds each.
struct Phases {
  double start = 0, open = 0, attach = 0, exit = 0;
};

std::optional<double> mark_at(const std::string& log, const char* what) {
  for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) {
    size_t line = log.rfind('\n', at);
    line = line == std::string::npos ? 0 : line + 1;
    double secs = 0;
    if (std::sscanf(log.c_str() + line, "[remora %lf", &secs) == 1) return secs * 1e6;
  }
  return std::nullopt;
}

Phases cli_phases(const std::string& remora, const std::string& tool) {
  Tree t;
  spawn_tree(t, 0);
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) die("pipe");
  std::vector<std::string> args = {remora, "attach", "-p",     std::to_string(t.root),
                                   "-t",   tool,     "--keep", "--attach-children=false"};
  std::vector<std::string> env = {"REMORA_LOG=attach"};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "REMORA_LOG=", 11) != 0) env.emplace_back(*e);
  // Built before the fork: the child only execs.
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  for (auto& e : env) envp.push_back(e.data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);
  const double t0 = std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(err[1], 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(err[1]);
  std::string log;
  char buf[4096];
  for (ssize_t n; (n = read(err[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    log.append(buf, static_cast<size_t>(n));
  }
  close(err[0]);
  int status = 0;
  waitpid(child, &status, 0);
  const double end = std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("remora attach (phases) failed:\n" + log);
  auto start = mark_at(log, "the command starts"), ready = mark_at(log, "session ready"),
       attached = mark_at(log, ": attached");
  if (!start || !ready || !attached) die("remora attach (phases): a mark is missing:\n" + log);
  return Phases{*start - t0, *ready - *start, *attached - *ready, end - *attached};
}

double cli_attach(const std::string& remora, const std::string& tool, const std::vector<std::string>& extra) {
  Tree t;
  spawn_tree(t, 0);
  std::vector<std::string> args = {"attach", "-p", std::to_string(t.root), "-t", tool};
  args.insert(args.end(), extra.begin(), extra.end());
  return cli_run(remora, args);
}

// `cpu` receives the controller's CPU time per process (all its threads:
// nothing else of the bench runs meanwhile).
double tree_attach(const AttachOptions& opts, double* cpu) {
  Tree t;
  spawn_tree(t, 31);
  Controller tc;
  auto t0 = Clock::now();
  const double cpu0 = process_cpu_us();
  auto r = tc.attach_tree(t.root, opts);
  double us = us_since(t0);
  *cpu = (process_cpu_us() - cpu0) / 32;
  if (!r) die(r.error().to_string());
  size_t okc = 0;
  for (const auto& o : *r) okc += o.ok;
  if (okc != 32) die("tree attach: only " + std::to_string(okc) + " of 32 attached");
  (void)tc.detach_tree(t.root);
  return us;
}

// kubo/injector, loaded at run time from the library REMORA_BENCH_PEER
// names (its documented C API, declared here by hand).
struct Peer {
  int (*attach)(void**, pid_t) = nullptr;
  int (*inject)(void*, const char*, void**) = nullptr;
  int (*detach)(void*) = nullptr;
  const char* (*error)() = nullptr;
  std::string cli;  // REMORA_BENCH_PEER_CLI, or empty

  static Peer load(const char* path) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) die(std::string("REMORA_BENCH_PEER: ") + dlerror());
    Peer p;
    p.attach = reinterpret_cast<decltype(p.attach)>(dlsym(h, "injector_attach"));
    p.inject = reinterpret_cast<decltype(p.inject)>(dlsym(h, "injector_inject"));
    p.detach = reinterpret_cast<decltype(p.detach)>(dlsym(h, "injector_detach"));
    p.error = reinterpret_cast<decltype(p.error)>(dlsym(h, "injector_error"));
    if (!p.attach || !p.inject || !p.detach || !p.error)
      die(std::string("REMORA_BENCH_PEER: ") + path +
          " does not export injector_attach/_inject/_detach/_error");
    return p;
  }
  // Attach, one dlopen of `lib`, detach: what its command does.
  void inject_one(pid_t pid, const std::string& lib) const {
    void* inj = nullptr;
    void* handle = nullptr;
    if (attach(&inj, pid) != 0) die(std::string("peer: injector_attach: ") + error());
    const int rc = inject(inj, lib.c_str(), &handle);
    if (rc != 0) die(std::string("peer: injector_inject: ") + error());
    if (detach(inj) != 0) die(std::string("peer: injector_detach: ") + error());
  }
};

// The peer's first attach into a fresh target, as `first_attach`.
double peer_first_attach(const Peer& p, const std::string& lib, int spinners, int blocked,
                         double* stall = nullptr) {
  Tree t;
  spawn_tree(t, 0, spinners, blocked);
  if (spinners > 0 && !t.open_window()) die("the target's spinner did not start its window");
  auto t0 = Clock::now();
  p.inject_one(t.root, lib);
  double us = us_since(t0);
  if (stall) *stall = t.stall_us();
  return us;
}

// The peer over a tree of 32 fresh processes, one after another.
double peer_tree(const Peer& p, const std::string& lib) {
  Tree t;
  spawn_tree(t, 31);
  std::vector<pid_t> pids{t.root};
  const std::string kids =
      "/proc/" + std::to_string(t.root) + "/task/" + std::to_string(t.root) + "/children";
  if (FILE* f = std::fopen(kids.c_str(), "r")) {
    for (int pid; std::fscanf(f, "%d", &pid) == 1;) pids.push_back(pid);
    std::fclose(f);
  }
  if (pids.size() != 32) die("peer tree: " + std::to_string(pids.size()) + " processes, not 32");
  auto t0 = Clock::now();
  for (pid_t pid : pids) p.inject_one(pid, lib);
  return us_since(t0);
}

double peer_cli(const Peer& p, const std::string& lib) {
  Tree t;
  spawn_tree(t, 0);
  return cli_run(p.cli, {"-p", std::to_string(t.root), lib});
}

struct PeerRows {
  std::vector<double> idle, spin, spin_stall, threads8, threads8_stall, cli, tree;
};

struct Rows {
  PeerRows peer;
  std::vector<double> floor, idle, idle_cpu, spin, spin_stall, threads8, threads8_stall, base_stall, cli_d1,
      cli_keep, version, spawn, reattach, detach, tree, tree_floor, tree_cpu, tree_floor_cpu, preloaded;
  std::vector<double> cli_start, cli_open, cli_attach, cli_exit;  // cli_phases
};

void reattach_cycles(const AttachOptions& opts, int cycles, Rows* rows) {
  Tree one;
  spawn_tree(one, 0);
  Controller c;
  if (auto r = c.attach(one.root, opts); !r) die(r.error().to_string());
  if (auto d = c.detach(one.root); !d) die(d.error().to_string());
  for (int i = 0; i < cycles; ++i) {
    auto t0 = Clock::now();
    if (auto r = c.attach(one.root, opts); !r) die(r.error().to_string());
    rows->reattach.push_back(us_since(t0));
    t0 = Clock::now();
    if (auto d = c.detach(one.root); !d) die(d.error().to_string());
    rows->detach.push_back(us_since(t0));
  }
}

// Remora's rows against the peer's, each ratio of medians from this run.
void print_peer_rows(const Rows& r) {
  const PeerRows& p = r.peer;
  if (p.idle.empty()) return;
  auto row = [](const char* name, const std::vector<double>& ours, const std::vector<double>& theirs) {
    if (ours.empty() || theirs.empty()) {
      std::printf("| %s | skipped | | |\n", name);
      return;
    }
    std::printf("| %s | %.0f us | %.0f us | %.2fx |\n", name, median(ours), median(theirs),
                median(ours) / median(theirs));
  };
  std::printf(
      "\nkubo/injector measured in the same rounds (REMORA_BENCH_PEER; it does less: one dlopen of the "
      "tool on the hijacked thread, no agent, no listener):\n\n");
  std::printf("| row | Remora | kubo/injector | Remora / kubo |\n|---|---|---|---|\n");
  row("first attach, idle target", r.idle, p.idle);
  row("first attach, one thread spinning", r.spin, p.spin);
  row("  the spinner's stall", r.spin_stall, p.spin_stall);
  row("first attach, 8 threads", r.threads8, p.threads8);
  row("  the other threads' stall", r.threads8_stall, p.threads8_stall);
  row("the command, idle target (`remora attach --keep`; `injector -p`)", r.cli_keep, p.cli);
  row("32 fresh processes (attach_tree; the peer one after another)", r.tree, p.tree);
}

void print_rows(const Rows& r, int rounds) {
  auto row = [](const char* name, const std::vector<double>& v, double goal_us = 0) {
    if (v.empty()) {  // the `remora` rows without a CLI (the guest build)
      std::printf("| %s | skipped | | |\n", name);
      return;
    }
    std::printf("| %s | %.0f us | %.0f us |", name, median(v), worst(v));
    if (goal_us > 0)
      std::printf(" %.0f us (%.2fx) |\n", goal_us, median(v) / goal_us);
    else
      std::printf(" |\n");
  };
  std::printf("rounds: %d (interleaved; one sample of each row per round)\n", rounds);
  if (g_pin_cpu >= 0)
    std::printf(
        "pinned: the bench, every process it starts and all their threads on CPU %d (--pin); the tree's floor "
        "one process at a time\n",
        g_pin_cpu);
  std::printf("\n");
  std::printf("| row | median | max | goal (issue 12 part 5) |\n|---|---|---|---|\n");
  row("in-process floor (the process loads agent and tool itself)", r.floor);
  row("first attach, idle target", r.idle, 1630);
  row("  the controller thread's CPU time during it", r.idle_cpu);
  row("first attach, idle target with the agent preloaded (its listener started on request)", r.preloaded);
  row("first attach, target whose one thread spins", r.spin, 1630);
  row("  the spinner's stall during it (longest gap)", r.spin_stall);
  row("first attach, 8 threads (1 spinning)", r.threads8, 1800);
  row("  the other threads' stall during it (the spinner's longest gap)", r.threads8_stall, 160);
  row("  the spinner's longest gap over as long a window without an attach", r.base_stall);
  row("`/bin/true`, fork/exec to exit (what any command costs here)", r.spawn);
  row("`remora --version` (CLI start-up)", r.version);
  row("`remora attach -d 1`, idle target, fork/exec to exit", r.cli_d1, 2650);
  row("`remora attach --keep --attach-children=false`, idle target", r.cli_keep, 2650);
  row("  its phases (a run with REMORA_LOG=attach): fork to the command's start", r.cli_start);
  row("    to the session ready (tools chosen, target checked and opened)", r.cli_open);
  row("    to attached (agent and tool loaded, the tool attached)", r.cli_attach);
  row("    to its exit (report, teardown)", r.cli_exit);
  row("re-attach (agent loaded)", r.reattach);
  row("detach (agent loaded)", r.detach);
  std::printf("| attach_tree, 32 fresh processes | %.1f ms | %.1f ms | %.1f ms (2x floor) |\n",
              median(r.tree) / 1000, worst(r.tree) / 1000, 2 * median(r.tree_floor) / 1000);
  std::printf("| in-process floor, 32 fresh processes, one per CPU at a time | %.1f ms | %.1f ms | |\n",
              median(r.tree_floor) / 1000, worst(r.tree_floor) / 1000);
  if (!r.idle.empty())
    std::printf("\nfirst attach (idle) / in-process floor: %.1fx\n", median(r.idle) / median(r.floor));
  if (!r.cli_keep.empty() && !r.idle.empty())
    std::printf(
        "`remora attach --keep` less /bin/true less the C API's first attach: %.0f us (the CLI's own "
        "start-up and cold work)\n",
        median(r.cli_keep) - median(r.spawn) - median(r.idle));
  std::printf("32 processes / their in-process floor: %.2fx (goal <= 2x)\n",
              median(r.tree) / median(r.tree_floor));
  std::printf(
      "  CPU per process: the controller's in the tree %.0f us; a floor process's own for its load %.0f us\n",
      median(r.tree_cpu), median(r.tree_floor_cpu));
  print_peer_rows(r);
}

// One sample of each tree row: the floor, then the tree.
void tree_rows(const AttachOptions& opts, Rows* r) {
  double cpu = 0;
  r->tree_floor.push_back(in_process(opts.agent_path, opts.tools[0], 32, &cpu).second);
  r->tree_floor_cpu.push_back(cpu);
  r->tree.push_back(tree_attach(opts, &cpu));
  r->tree_cpu.push_back(cpu);
}

// One sample of each of the peer's rows (the tree's in every third round,
// as ours).
void peer_rows(const Peer& p, const std::string& lib, bool tree, PeerRows* r) {
  double stall = 0;
  r->idle.push_back(peer_first_attach(p, lib, 0, 0));
  r->spin.push_back(peer_first_attach(p, lib, 1, 0, &stall));
  r->spin_stall.push_back(stall);
  r->threads8.push_back(peer_first_attach(p, lib, 1, 6, &stall));
  r->threads8_stall.push_back(stall);
  if (!p.cli.empty()) r->cli.push_back(peer_cli(p, lib));
  if (tree) r->tree.push_back(peer_tree(p, lib));
}

std::string remora_next_to_us() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return {};
  std::string p(self, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/') + 1) + "remora";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::strcmp(argv[1], "--target") == 0)
    return target_main(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                       std::atoi(argv[6]));
  if (argc == 7 && std::strcmp(argv[1], "--load") == 0)
    return load_main(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), argv[5], argv[6]);
  std::vector<char*> pos;  // the positional arguments, --pin taken out
  if (const char* e = std::getenv("REMORA_BENCH_PIN"); e && *e) g_pin_cpu = std::atoi(e);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--pin") == 0 && i + 1 < argc)
      g_pin_cpu = std::atoi(argv[++i]);
    else
      pos.push_back(argv[i]);
  }
  if (pos.size() < 2) die("usage: remora-bench-attach [--pin CPU] AGENT TOOL [ROUNDS [REMORA]]");
  if (g_pin_cpu >= 0) pin_to(g_pin_cpu);  // before any thread or process starts
  const int rounds = pos.size() > 2 ? std::max(1, std::atoi(pos[2])) : 15;
  const std::string remora = pos.size() > 3 ? pos[3] : remora_next_to_us();
  const bool cli = access(remora.c_str(), X_OK) == 0;
  if (!cli) std::printf("skipped: the `remora` rows (no executable at %s)\n", remora.c_str());
  AttachOptions opts;
  opts.agent_path = pos[0];
  opts.tools = {pos[1]};

  const char* rows_env = std::getenv("REMORA_BENCH_ROWS");
  std::optional<Peer> peer;
  if (const char* lib = std::getenv("REMORA_BENCH_PEER"); lib && *lib) {
    peer = Peer::load(lib);
    if (const char* c = std::getenv("REMORA_BENCH_PEER_CLI"); c && *c) peer->cli = c;
  }
  const bool tree_only = rows_env && std::strcmp(rows_env, "tree") == 0;
  Rows r;
  for (int i = 0; i < rounds; ++i) {
    if (tree_only) {  // REMORA_BENCH_ROWS=tree: the tree rows alone, every round (for profiling)
      tree_rows(opts, &r);
      continue;
    }
    r.floor.push_back(in_process(opts.agent_path, opts.tools[0], 1).first.at(0));
    double stall = 0, cpu = 0;
    r.idle.push_back(first_attach(opts, 0, 0, nullptr, &cpu));
    r.idle_cpu.push_back(cpu);
    r.preloaded.push_back(first_attach(opts, 0, 0, nullptr, nullptr, /*preloaded=*/true));
    r.spin.push_back(first_attach(opts, 1, 0, &stall));
    r.spin_stall.push_back(stall);
    r.threads8.push_back(first_attach(opts, 1, 6, &stall));
    r.threads8_stall.push_back(stall);
    r.base_stall.push_back(baseline_stall(r.threads8.back()));
    if (cli) {
      r.spawn.push_back(cli_run("/bin/true", {}));
      r.version.push_back(cli_run(remora, {"--version"}));
      r.cli_d1.push_back(cli_attach(remora, opts.tools[0], {"-d", "1"}));
      r.cli_keep.push_back(cli_attach(remora, opts.tools[0], {"--keep", "--attach-children=false"}));
      const Phases ph = cli_phases(remora, opts.tools[0]);
      r.cli_start.push_back(ph.start);
      r.cli_open.push_back(ph.open);
      r.cli_attach.push_back(ph.attach);
      r.cli_exit.push_back(ph.exit);
    }
    reattach_cycles(opts, 10, &r);
    if (peer) peer_rows(*peer, opts.tools[0], i % 3 == 0, &r.peer);
    if (i % 3 == 0) {  // the tree rows cost 20x a round's others: a third as many samples
      tree_rows(opts, &r);
    }
  }
  print_rows(r, rounds);
  return 0;
}
