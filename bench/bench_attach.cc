// remora-bench-attach: what attaching costs, measured in one run.
//   first attach   into a fresh process (the agent is not loaded yet)
//   re-attach      attach + detach cycles once the agent is in
//   tree of 32     attach_tree over a parent with 31 children, fresh processes
//   in-process     the floor of any injector: a fresh process that loads the
//                  agent and attaches the tool itself (dlopen, the agent's
//                  listener thread, the tool's dlopen and hooks), no ptrace;
//                  alone, and 32 of them, one per CPU at a time
// Every target and floor process is this program run again in a role
// ("--hold", "--load"): fresh processes, as services are, that share no
// copy-on-write memory with the bench.
// The payload is the smallest tool there is (the test hook tool with no log
// file), so the figures are Remora's own cost.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attach/attach.h"

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

struct Stats {
  double median, p99;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

// A process (and optionally a tree under it) blocked in read(2) on a pipe;
// dies with the pipe's write end, i.e. with the bench.
struct Tree {
  pid_t root = -1;
  int ready_fd = -1, hold_fd = -1;
  ~Tree() {
    if (root > 0) {
      kill(-root, SIGKILL);
      kill(root, SIGKILL);
      waitpid(root, nullptr, 0);
    }
    if (hold_fd >= 0) close(hold_fd);
    if (ready_fd >= 0) close(ready_fd);
  }
};

// Targets are fresh programs, as services are: each process of a tree is
// this executable run again in its "--hold" role (see hold_main), so no
// target shares copy-on-write memory with the bench.
[[noreturn]] void exec_role(std::vector<std::string> args) {
  std::vector<char*> argv;
  static char name[] = "remora-bench-attach";
  argv.push_back(name);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  _exit(127);
}

void spawn_tree(Tree& t, int children) {
  int ready[2], hold[2];
  if (pipe(ready) || pipe(hold)) die("pipe");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    setpgid(0, 0);
    close(ready[0]);
    close(hold[1]);
    const std::vector<std::string> role = {"--hold", std::to_string(ready[1]), std::to_string(hold[0])};
    for (int i = 0; i < children; ++i) {
      pid_t c = fork();
      if (c == 0) exec_role(role);
    }
    exec_role(role);  // the root too: it stays the children's parent
  }
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

// "--hold READY HOLD": a target. Says it is up, then blocks in read(2)
// until the bench goes away.
int hold_main(int ready_fd, int hold_fd) {
  char b = 'c';
  (void)!write(ready_fd, &b, 1);
  (void)!read(hold_fd, &b, 1);
  return 0;
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
  void* h = dlopen(agent, RTLD_NOW | RTLD_NODELETE);
  using AttachFn = int (*)(const void*, const char*);
  auto attach = h ? reinterpret_cast<AttachFn>(dlsym(h, "remora_agent_attach")) : nullptr;
  double us = attach && attach(nullptr, tool) == 0 ? us_since(t0) : -1;
  (void)!write(done_fd, &us, sizeof us);
  return 0;
}

// Runs `count` fresh "--load" processes, as many at a time as there are
// CPUs (a new one goes when one is done), once all are up. Returns each
// one's own time (us) and the wall time from the first "go" to the last
// report (us). No injector can attach processes faster than they can load
// the same libraries themselves.
std::pair<std::vector<double>, double> in_process(const std::string& agent, const std::string& tool,
                                                  int count) {
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
  const int width = std::max(1, std::min(count, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN))));
  auto t0 = Clock::now();
  std::string first(static_cast<size_t>(width), 'g');
  if (write(go[1], first.data(), first.size()) != width) die("write");
  std::vector<double> each;
  for (int got = 0; got < count; ++got) {
    double us = -1;
    if (read(done[0], &us, sizeof us) != sizeof us || us < 0) die("in-process load failed");
    each.push_back(us);
    if (got + width < count && write(go[1], "g", 1) != 1) die("write");
  }
  double wall = us_since(t0);
  close(ready[0]);
  close(go[1]);
  close(done[0]);
  for (pid_t k : kids) waitpid(k, nullptr, 0);
  return {each, wall};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--hold") == 0)
    return hold_main(std::atoi(argv[2]), std::atoi(argv[3]));
  if (argc == 7 && std::strcmp(argv[1], "--load") == 0)
    return load_main(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), argv[5], argv[6]);
  if (argc < 3) die("usage: remora-bench-attach AGENT TOOL [CYCLES]");
  int cycles = argc > 3 ? std::atoi(argv[3]) : 200;
  AttachOptions opts;
  opts.agent_path = argv[1];
  opts.tools = {argv[2]};

  std::vector<double> floor;
  for (int i = 0; i < 15; ++i) floor.push_back(in_process(opts.agent_path, opts.tools[0], 1).first.at(0));

  std::vector<double> first;
  for (int i = 0; i < 15; ++i) {
    Tree t;
    spawn_tree(t, 0);
    Controller c;
    auto t0 = Clock::now();
    auto r = c.attach(t.root, opts);
    double us = us_since(t0);
    if (!r) die(r.error().to_string());
    first.push_back(us);
    if (auto d = c.detach(t.root); !d) die(d.error().to_string());
  }

  Tree one;
  spawn_tree(one, 0);
  Controller c;
  if (auto r = c.attach(one.root, opts); !r) die(r.error().to_string());
  if (auto d = c.detach(one.root); !d) die(d.error().to_string());
  std::vector<double> reattach, detach;
  for (int i = 0; i < cycles; ++i) {
    auto t0 = Clock::now();
    if (auto r = c.attach(one.root, opts); !r) die(r.error().to_string());
    reattach.push_back(us_since(t0));
    t0 = Clock::now();
    if (auto d = c.detach(one.root); !d) die(d.error().to_string());
    detach.push_back(us_since(t0));
  }

  std::vector<double> tree_floor;
  for (int i = 0; i < 3; ++i)
    tree_floor.push_back(in_process(opts.agent_path, opts.tools[0], 32).second / 1000);

  std::vector<double> tree32;
  for (int i = 0; i < 3; ++i) {
    Tree t;
    spawn_tree(t, 31);
    Controller tc;
    auto t0 = Clock::now();
    auto r = tc.attach_tree(t.root, opts);
    double us = us_since(t0);
    if (!r) die(r.error().to_string());
    size_t okc = 0;
    for (const auto& o : *r) okc += o.ok;
    if (okc != 32) die("tree attach: only " + std::to_string(okc) + " of 32 attached");
    tree32.push_back(us);
    (void)tc.detach_tree(t.root);
  }

  auto tf = stats(tree_floor);
  auto fl = stats(floor), f = stats(first), ra = stats(reattach), de = stats(detach), tr = stats(tree32);
  std::printf("| measurement | median | p99 / max |\n|---|---|---|\n");
  std::printf("| in-process floor (the process loads agent and tool itself), n=%zu | %.0f us | %.0f us |\n",
              floor.size(), fl.median, fl.p99);
  std::printf("| first attach (agent injected), n=%zu | %.0f us | %.0f us |\n", first.size(), f.median,
              f.p99);
  std::printf("| re-attach (agent loaded), n=%d | %.0f us | %.0f us |\n", cycles, ra.median, ra.p99);
  std::printf("| detach, n=%d | %.0f us | %.0f us |\n", cycles, de.median, de.p99);
  std::printf("| attach_tree, 32 fresh processes, n=%zu | %.1f ms | %.1f ms |\n", tree32.size(),
              tr.median / 1000, tr.p99 / 1000);
  std::printf("| in-process floor, 32 fresh processes, one per CPU at a time, n=%zu | %.1f ms | %.1f ms |\n",
              tree_floor.size(), tf.median, tf.p99);
  std::printf("\nfirst attach / in-process floor: %.1fx\n", f.median / fl.median);
  std::printf("32 processes / their in-process floor: %.1fx\n", tr.median / 1000 / tf.median);
  return 0;
}
