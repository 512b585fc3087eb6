// Target of the attach suite. Speaks the line protocol of
// tests/targets/target_common.h, with extra commands:
//
//   "fork"              forks a child that blocks in read() on a pipe whose
//                       write end only this process holds (so it exits when
//                       this process does); reply "forked <child pid>" once
//                       the child said it runs (over a private pipe)
//   "setenv NAME VALUE" setenv in this process; reply "ok"
//   "getenv NAME"       reply "env <value>" or "unset": what the process sees
//   "fill-fds"          uses up every file descriptor but one (under a
//                       lowered RLIMIT_NOFILE); reply "filled <count>"
//   "free-fds"          gives them back and restores the limit; reply "ok"
//   "pids"              (tree mode) reply "pids role:pid role:pid ..."
//
// Modes (argv[1]):
//   (none)         a quiet process: its main thread blocks in read(stdin)
//   tree           the root of a tree of 10 processes (see build_tree); it
//                  says "ready" only after every other process said it is
//   exiter         a quiet process that exits as soon as the agent's
//                  constructor runs (mid-attach; see exit_in_agent below)
//   node ROLE KID  internal: a process of the tree started by fork+exec;
//                  stdin is the tree's lifeline, stdout its ready pipe. KID
//                  "-" or the role of one plain-forked child.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "target_common.h"

using namespace remora_target;

// exiter mode and X of the tree: the process exits while the agent's
// constructor runs, that is after the controller loaded the agent and before
// it could call it. Deterministic, unlike watching /proc/self/maps: the
// agent's constructor gives its listener a stack of its own
// (pthread_attr_setstack), and this executable (linked with -rdynamic)
// interposes libc's pthread_attr_setstack for every object. Should the agent
// stop calling it, X no longer exits and the tests that use it fail loudly
// ("the attach succeeded although...").
static bool g_exit_in_agent = false;

extern "C" int pthread_attr_setstack(pthread_attr_t* attr, void* stack, size_t size) noexcept {
  using Fn = int (*)(pthread_attr_t*, void*, size_t);
  static Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_attr_setstack"));
  if (g_exit_in_agent) {
    Dl_info info{};
    if (dladdr(__builtin_return_address(0), &info) != 0 && info.dli_fname != nullptr &&
        strstr(info.dli_fname, "libremora-agent") != nullptr)
      _exit(0);
  }
  return real(attr, stack, size);
}

namespace {

// Writes "ready <pid> <role>" to fd (one write: atomic on a pipe).
void say_ready(int fd, const char* role) {
  char line[96];
  int n = snprintf(line, sizeof line, "ready %d %s\n", getpid(), role);
  if (!write_all(fd, line, static_cast<size_t>(n))) _exit(3);
}

// Blocks in read() until `fd` reports EOF (every write end closed), then exits.
[[noreturn]] void block_until_eof(int fd) {
  char c;
  for (;;) {
    ssize_t n = read(fd, &c, 1);
    if (n == 0) _exit(0);
    if (n < 0 && errno != EINTR) _exit(4);
  }
}

// In a freshly forked child: die with the parent (a test that crashes must
// not leave the tree behind; the harness also kills the process group).
void die_with_parent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(5);
}

std::string self_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string s(buf);
  return s.substr(0, s.rfind('/'));
}

// ---------------------------------------------------------------------------
// Plain mode: "fork", "setenv", "getenv".

std::vector<int> g_lifelines;  // write ends held for the forked children
std::vector<int> g_fillers;    // "fill-fds": descriptors held to use up the limit
rlimit g_nofile{};             // the limit before "fill-fds"

bool plain_command(const std::string& cmd, std::string* reply) {
  if (cmd == "fork") {
    int life[2], ready[2];
    if (pipe2(life, O_CLOEXEC) != 0 || pipe2(ready, O_CLOEXEC) != 0) {
      *reply = std::string("error pipe2: ") + strerror(errno);
      return true;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      *reply = std::string("error fork: ") + strerror(errno);
      return true;
    }
    if (pid == 0) {
      die_with_parent(parent);
      close(life[1]);
      for (int fd : g_lifelines) close(fd);
      close(ready[0]);
      char c = 'r';
      if (!write_all(ready[1], &c, 1)) _exit(3);
      close(ready[1]);
      block_until_eof(life[0]);
    }
    close(life[0]);
    close(ready[1]);
    g_lifelines.push_back(life[1]);
    char c;
    ssize_t n;
    do n = read(ready[0], &c, 1);
    while (n < 0 && errno == EINTR);
    close(ready[0]);
    *reply = n == 1 ? "forked " + std::to_string(pid) : "error the child did not start";
    return true;
  }
  if (cmd == "fill-fds") {
    // Uses up every file descriptor but one, under a lowered limit: a
    // pipe2() in this process then fails with EMFILE, a single open() works.
    getrlimit(RLIMIT_NOFILE, &g_nofile);
    rlimit low = g_nofile;
    low.rlim_cur = std::min<rlim_t>(g_nofile.rlim_cur, 256);
    setrlimit(RLIMIT_NOFILE, &low);
    for (;;) {
      int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) break;
      g_fillers.push_back(fd);
    }
    if (errno != EMFILE || g_fillers.empty()) {
      *reply = std::string("error fill-fds: ") + strerror(errno);
      return true;
    }
    close(g_fillers.back());
    g_fillers.pop_back();
    *reply = "filled " + std::to_string(g_fillers.size());
    return true;
  }
  if (cmd == "free-fds") {
    for (int fd : g_fillers) close(fd);
    g_fillers.clear();
    setrlimit(RLIMIT_NOFILE, &g_nofile);
    *reply = "ok";
    return true;
  }
  if (cmd.rfind("setenv ", 0) == 0) {
    std::string rest = cmd.substr(7);
    auto sp = rest.find(' ');
    if (sp == std::string::npos) {
      *reply = "error usage: setenv NAME VALUE";
      return true;
    }
    setenv(rest.substr(0, sp).c_str(), rest.substr(sp + 1).c_str(), 1);
    *reply = "ok";
    return true;
  }
  if (cmd.rfind("getenv ", 0) == 0) {
    const char* v = getenv(cmd.substr(7).c_str());
    *reply = v ? std::string("env ") + v : "unset";
    return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// Tree mode. Ten processes, the test's child first:
//
//   root (this)             protocol on stdin/stdout
//   +- A   fork             +- A1  fork
//   |                       +- A2  fork+exec of this binary ("node")
//   +- B   fork+exec remora_target_simd (hostile)
//   +- C   fork+exec of this binary ("node")  +- C1  fork
//   +- D   fork+exec remora_target_malloc (hostile)
//   +- E   fork, with three threads blocked in read/nanosleep
//   +- X   fork; exits as soon as the agent's constructor runs, i.e. in
//          the middle of its own attach
//
// (Not remora_target_syscalls: its waiter thread forks a short-lived child
// every 20 ms, which would join the tree with no predictable outcome.)
//
// Every process but the root writes "ready <pid> [role]" to the ready pipe
// (the exec'd hostile targets print their usual "ready <pid>" there: it is
// their stdout) and then blocks until the lifeline pipe, whose write end only
// the root holds, reports EOF (the hostile targets read it as their stdin
// and exit on EOF too).

constexpr int kTreeOthers = 9;
int g_life[2], g_ready[2];
std::map<std::string, pid_t> g_roles;

// A forked child of the root: keeps only the lifeline's read end and the
// ready pipe's write end.
void become_tree_child(pid_t parent) {
  die_with_parent(parent);
  close(g_life[1]);
  close(g_ready[0]);
}

[[noreturn]] void exec_node(const std::string& role, const char* kid) {
  dup2(g_life[0], 0);
  dup2(g_ready[1], 1);
  std::string self = self_dir() + "/remora_attach_target";
  execl(self.c_str(), self.c_str(), "node", role.c_str(), kid, static_cast<char*>(nullptr));
  _exit(127);
}

[[noreturn]] void exec_hostile(const char* program) {
  dup2(g_life[0], 0);
  dup2(g_ready[1], 1);
  std::string path = self_dir() + "/" + program;
  execl(path.c_str(), path.c_str(), static_cast<char*>(nullptr));
  _exit(127);
}

pid_t fork_or_die() {
  pid_t p = fork();
  if (p < 0) {
    perror("fork");
    exit(2);
  }
  return p;
}

void* blocked_reader(void* arg) { block_until_eof(*static_cast<int*>(arg)); }

void* blocked_sleeper(void*) {
  for (;;) {
    timespec ts{3600, 0};
    nanosleep(&ts, nullptr);
  }
}

void build_tree() {
  if (pipe2(g_life, O_CLOEXEC) != 0 || pipe2(g_ready, O_CLOEXEC) != 0) {
    perror("pipe2");
    exit(2);
  }
  const pid_t root = getpid();

  pid_t a = fork_or_die();
  if (a == 0) {
    become_tree_child(root);
    const pid_t self = getpid();
    if (fork_or_die() == 0) {
      die_with_parent(self);
      say_ready(g_ready[1], "A1");
      block_until_eof(g_life[0]);
    }
    if (fork_or_die() == 0) {
      die_with_parent(self);
      exec_node("A2", "-");
    }
    say_ready(g_ready[1], "A");
    block_until_eof(g_life[0]);
  }
  g_roles["A"] = a;

  pid_t b = fork_or_die();
  if (b == 0) {
    become_tree_child(root);
    exec_hostile("remora_target_simd");
  }
  g_roles["B"] = b;

  pid_t c = fork_or_die();
  if (c == 0) {
    become_tree_child(root);
    exec_node("C", "C1");
  }
  g_roles["C"] = c;

  pid_t d = fork_or_die();
  if (d == 0) {
    become_tree_child(root);
    exec_hostile("remora_target_malloc");
  }
  g_roles["D"] = d;

  pid_t e = fork_or_die();
  if (e == 0) {
    become_tree_child(root);
    start_thread(blocked_reader, &g_life[0]);
    start_thread(blocked_sleeper, nullptr);
    start_thread(blocked_sleeper, nullptr);
    say_ready(g_ready[1], "E");
    block_until_eof(g_life[0]);
  }
  g_roles["E"] = e;

  pid_t x = fork_or_die();
  if (x == 0) {
    become_tree_child(root);
    g_exit_in_agent = true;
    say_ready(g_ready[1], "X");
    block_until_eof(g_life[0]);
  }
  g_roles["X"] = x;

  close(g_life[0]);
  close(g_ready[1]);

  // Collect the nine "ready" lines (deadline 10 s).
  std::string buf;
  int seen = 0;
  int64_t deadline = now_ns() + 10'000'000'000;
  while (seen < kTreeOthers) {
    int left_ms = static_cast<int>((deadline - now_ns()) / 1'000'000);
    if (left_ms <= 0) {
      fprintf(stderr, "tree: only %d of %d processes said ready within 10 s\n", seen, kTreeOthers);
      exit(2);
    }
    pollfd p{g_ready[0], POLLIN, 0};
    int rc = poll(&p, 1, left_ms);
    if (rc <= 0) continue;
    char chunk[512];
    ssize_t n = read(g_ready[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fprintf(stderr, "tree: ready pipe closed after %d lines\n", seen);
      exit(2);
    }
    buf.append(chunk, static_cast<size_t>(n));
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      int pid = 0;
      char role[32] = "";
      int got = sscanf(line.c_str(), "ready %d %31s", &pid, role);
      if (got < 1) {
        fprintf(stderr, "tree: unexpected line \"%s\"\n", line.c_str());
        exit(2);
      }
      if (got == 2) g_roles[role] = pid;
      ++seen;
    }
  }
}

bool tree_command(const std::string& cmd, std::string* reply) {
  if (cmd == "pids") {
    *reply = "pids root:" + std::to_string(getpid());
    for (const auto& [role, pid] : g_roles) *reply += " " + role + ":" + std::to_string(pid);
    return true;
  }
  return plain_command(cmd, reply);
}

[[noreturn]] void run_node(const char* role, const char* kid) {
  // stdin: the lifeline; stdout: the ready pipe.
  if (strcmp(kid, "-") != 0) {
    const pid_t self = getpid();
    if (fork_or_die() == 0) {
      die_with_parent(self);
      say_ready(1, kid);
      block_until_eof(0);
    }
  }
  say_ready(1, role);
  block_until_eof(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "tree") == 0) {
    build_tree();
    return run_protocol(nullptr, tree_command);
  }
  if (argc >= 4 && strcmp(argv[1], "node") == 0) run_node(argv[2], argv[3]);
  if (argc >= 2 && strcmp(argv[1], "exiter") == 0) g_exit_in_agent = true;
  return run_protocol(nullptr, plain_command);
}
