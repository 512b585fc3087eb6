// Target of the follow tests (follow_test.cc): a server that makes
// processes while it is attached. Speaks the line protocol of
// tests/targets/target_common.h, with extra commands:
//
//   "prefork N"        forks N workers (a pre-fork server), each serving
//                      requests on a socket pair of its own until EOF; reply
//                      "workers PID..." once each said it runs
//   "ask I [MS]"       one request to worker I (index from 0, across every
//                      prefork), answered after MS ms of CPU work (0: at
//                      once); reply "served PID" or "error WHY"
//   "conn"             fork-per-connection: a child for one connection,
//                      which answers its first request (sent at once) and
//                      any later one until the connection closes, then
//                      exits; reply "conn PID" once it answered
//   "conn-ask PID"     another request on that connection; "served PID"
//   "conn-close PID"   closes the connection and reaps the child; reply
//                      "closed STATUS" (its wait status)
//   "pipeline"         runs sh -c 'SELF stage FD | SELF stage FD' (fork,
//                      then exec of sh, which forks and execs both stages);
//                      reply "pipeline SH STAGE STAGE" once both stages said
//                      they run
//   "pipeline-end"     closes the pipeline's input (the stages exit on EOF),
//                      reaps sh; reply "ended STATUS"
//   "idle"             forks a child that waits (no exec yet); reply
//                      "idle PID" once it runs
//   "exec PID"         makes that child exec SELF stage FD (its stdin a
//                      pipe of ours, stdout /dev/null); reply "execed PID"
//                      once the new program said it runs
//   "exec-end PID"     closes that program's stdin and reaps it; reply
//                      "ended STATUS"
//   "stop-workers"     closes every worker's socket and reaps them; "ok"
//
// Mode "stage FD" (internal): says "ready PID" on FD, then copies stdin to
// stdout until EOF.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "target_common.h"

using namespace remora_target;

namespace {

struct Peer {
  pid_t pid = 0;
  int fd = -1;  // our end of its socket pair
};
std::vector<Peer> g_workers;
std::map<pid_t, int> g_conns;  // fork-per-connection children -> our end
int g_pipeline_in = -1;        // write end of the pipeline's stdin
pid_t g_pipeline_sh = 0;

void die_with_parent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(5);
}

// Reads one line (up to '\n') from fd within `ms`; false on EOF or timeout.
bool read_line(int fd, std::string* out, int ms) {
  out->clear();
  const int64_t end = now_ns() + static_cast<int64_t>(ms) * 1000000;
  for (;;) {
    int left = static_cast<int>((end - now_ns()) / 1000000);
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    if (c == '\n') return true;
    *out += c;
  }
}

void spin_ms(long ms) {
  timespec t0, t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  volatile unsigned long x = 1;
  for (;;) {
    for (int i = 0; i < 100000; ++i) x = x * 6364136223846793005ul + 1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= ms) return;
  }
}

// A child's serving loop: "req MS" -> "pid PID" until EOF, then exit.
[[noreturn]] void serve(int fd) {
  std::string line;
  for (;;) {
    // exit(), not _exit(): a server child ends as a real one does, through its
    // atexit handlers (the agent's detaches its tools there).
    if (!read_line(fd, &line, 3600 * 1000)) exit(0);
    long ms = 0;
    if (line.rfind("req ", 0) == 0) ms = atol(line.c_str() + 4);
    if (ms > 0) spin_ms(ms);
    std::string reply = "pid " + std::to_string(getpid()) + "\n";
    if (!write_all(fd, reply.data(), reply.size())) _exit(3);
  }
}

// Forks a child serving one socket pair; returns it with our end.
Peer fork_server(std::string* error) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    *error = std::string("socketpair: ") + strerror(errno);
    return {};
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    *error = std::string("fork: ") + strerror(errno);
    return {};
  }
  if (pid == 0) {
    die_with_parent(parent);
    close(sv[0]);
    for (const auto& w : g_workers) close(w.fd);
    for (const auto& [p, fd] : g_conns) close(fd);
    if (g_pipeline_in >= 0) close(g_pipeline_in);  // the pipeline's stages must see EOF
    serve(sv[1]);
  }
  close(sv[1]);
  return Peer{pid, sv[0]};
}

// One request: "served PID" or "error ...".
std::string ask(const Peer& p, long ms) {
  std::string req = "req " + std::to_string(ms) + "\n";
  if (!write_all(p.fd, req.data(), req.size())) return std::string("error write: ") + strerror(errno);
  std::string line;
  if (!read_line(p.fd, &line, 20000)) return "error no answer from " + std::to_string(p.pid);
  if (line != "pid " + std::to_string(p.pid)) return "error unexpected answer: " + line;
  return "served " + std::to_string(p.pid);
}

std::string wait_child(pid_t pid) {
  // The children exit on EOF at once; 10 s is a generous deadline.
  for (int i = 0; i < 10000; ++i) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return std::to_string(st);
    if (r < 0 && errno != EINTR) return std::string("error waitpid: ") + strerror(errno);
    usleep(1000);
  }
  return "error child " + std::to_string(pid) + " did not exit";
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

std::string start_pipeline() {
  int ready[2], in[2];
  if (pipe(ready) != 0 || pipe2(in, O_CLOEXEC) != 0) return std::string("error pipe: ") + strerror(errno);
  const std::string cmd = "'" + self_exe() + "' stage " + std::to_string(ready[1]) + " | '" + self_exe() +
                          "' stage " + std::to_string(ready[1]) + " >/dev/null";
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return std::string("error fork: ") + strerror(errno);
  if (pid == 0) {
    die_with_parent(parent);
    dup2(in[0], 0);
    close(ready[0]);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(ready[1]);
  close(in[0]);
  g_pipeline_in = in[1];
  g_pipeline_sh = pid;
  std::string reply = "pipeline " + std::to_string(pid);
  for (int i = 0; i < 2; ++i) {
    std::string line;
    if (!read_line(ready[0], &line, 10000) || line.rfind("ready ", 0) != 0) {
      close(ready[0]);
      return "error a pipeline stage did not start";
    }
    reply += " " + line.substr(6);
  }
  close(ready[0]);
  return reply;
}

// "idle": a forked child, which execs on "exec".
struct Idle {
  int go = -1;     // write end: one byte says exec
  int ready = -1;  // read end: the exec'ed program's "ready PID"
  int input = -1;  // write end of its stdin
};
std::map<pid_t, Idle> g_idle;

std::string fork_idle() {
  int go[2], ready[2], input[2];
  if (pipe2(go, O_CLOEXEC) != 0 || pipe(ready) != 0 || pipe2(input, O_CLOEXEC) != 0)
    return std::string("error pipe: ") + strerror(errno);
  const std::string self = self_exe(), fd = std::to_string(ready[1]);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return std::string("error fork: ") + strerror(errno);
  if (pid == 0) {
    die_with_parent(parent);
    close(go[1]);
    close(ready[0]);
    close(input[1]);
    char c;
    if (read(go[0], &c, 1) != 1) _exit(0);
    dup2(input[0], 0);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    execl(self.c_str(), self.c_str(), "stage", fd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(go[0]);
  close(ready[1]);
  close(input[0]);
  g_idle[pid] = Idle{go[1], ready[0], input[1]};
  return "idle " + std::to_string(pid);
}

std::string exec_idle(pid_t pid, bool end) {
  auto it = g_idle.find(pid);
  if (it == g_idle.end()) return "error no idle child " + std::to_string(pid);
  Idle& c = it->second;
  if (end) {
    close(c.input);
    close(c.ready);
    g_idle.erase(it);
    return "ended " + wait_child(pid);
  }
  if (!write_all(c.go, "x", 1)) return std::string("error write: ") + strerror(errno);
  close(c.go);
  std::string line;
  if (!read_line(c.ready, &line, 10000) || line != "ready " + std::to_string(pid))
    return "error the exec'ed program did not start: " + line;
  return "execed " + std::to_string(pid);
}

bool command(const std::string& cmd, std::string* reply) {
  std::istringstream in(cmd);
  std::string word;
  in >> word;
  if (word == "prefork") {
    int n = 0;
    in >> n;
    *reply = "workers";
    for (int i = 0; i < n; ++i) {
      std::string error;
      Peer p = fork_server(&error);
      if (p.pid == 0) {
        *reply = "error " + error;
        return true;
      }
      g_workers.push_back(p);
      *reply += " " + std::to_string(p.pid);
    }
    // Each said it runs by answering a first request.
    for (size_t i = g_workers.size() - static_cast<size_t>(n); i < g_workers.size(); ++i) {
      std::string a = ask(g_workers[i], 0);
      if (a.rfind("served", 0) != 0) *reply = a;
    }
    return true;
  }
  if (word == "ask") {
    size_t i = 0;
    long ms = 0;
    in >> i >> ms;
    *reply = i < g_workers.size() ? ask(g_workers[i], ms) : "error no worker " + std::to_string(i);
    return true;
  }
  if (word == "conn") {
    std::string error;
    Peer p = fork_server(&error);
    if (p.pid == 0) {
      *reply = "error " + error;
      return true;
    }
    g_conns[p.pid] = p.fd;
    std::string a = ask(p, 0);
    *reply = a.rfind("served", 0) == 0 ? "conn " + std::to_string(p.pid) : a;
    return true;
  }
  if (word == "conn-ask" || word == "conn-close") {
    pid_t pid = 0;
    in >> pid;
    auto it = g_conns.find(pid);
    if (it == g_conns.end()) {
      *reply = "error no connection " + std::to_string(pid);
      return true;
    }
    if (word == "conn-ask") {
      *reply = ask(Peer{pid, it->second}, 0);
    } else {
      close(it->second);
      g_conns.erase(it);
      *reply = "closed " + wait_child(pid);
    }
    return true;
  }
  if (word == "pipeline") {
    *reply = start_pipeline();
    return true;
  }
  if (word == "pipeline-end") {
    close(g_pipeline_in);
    g_pipeline_in = -1;
    *reply = "ended " + wait_child(g_pipeline_sh);
    return true;
  }
  if (word == "idle") {
    *reply = fork_idle();
    return true;
  }
  if (word == "exec" || word == "exec-end") {
    pid_t pid = 0;
    in >> pid;
    *reply = exec_idle(pid, word == "exec-end");
    return true;
  }
  if (word == "stop-workers") {
    for (auto& w : g_workers) close(w.fd);
    for (auto& w : g_workers) wait_child(w.pid);
    g_workers.clear();
    *reply = "ok";
    return true;
  }
  return false;
}

[[noreturn]] void run_stage(int fd) {
  std::string line = "ready " + std::to_string(getpid()) + "\n";
  if (!write_all(fd, line.data(), line.size())) _exit(3);
  close(fd);
  char buf[4096];
  for (;;) {
    ssize_t n = read(0, buf, sizeof buf);
    if (n == 0) _exit(0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || !write_all(1, buf, static_cast<size_t>(n))) _exit(4);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "stage") == 0) run_stage(atoi(argv[2]));
  return run_protocol(nullptr, command);
}
