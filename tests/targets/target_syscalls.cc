// Target "syscalls": one thread blocked in each of read, nanosleep,
// epoll_wait, futex, accept, waitpid and poll, each checking that its call
// returns exactly what it should. No signal is ever sent to this process, so
// any EINTR, short sleep, early wake or lost byte is an anomaly: a remote call
// on one of these threads must leave its system call undisturbed.
//
// --tolerate-epoll-eintr: count EINTR from epoll_wait ("epoll_eintr=" in the
// report) instead of reporting an anomaly. For the controller-death test
// only: epoll_wait returns EINTR after *any* ptrace stop (signal(7)), so a
// controller killed between interrupting the thread and re-arming the call
// leaves an EINTR behind that no tracer can prevent once it is dead.
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "target_common.h"

using namespace remora_target;

namespace {

constexpr int64_t kMs = 1'000'000;

// A pipe fed one sequence byte at a time by the feeder; the reader checks
// that every byte arrives, in order.
struct Stream {
  const char* name;
  int rd = -1, wr = -1;
  uint8_t next_expected = 0;
  uint8_t next_to_send = 0;

  void check(const uint8_t* buf, ssize_t n) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != next_expected)
        anomaly("%s: byte %u arrived, expected %u (lost or reordered data)", name, buf[i], next_expected);
      next_expected = static_cast<uint8_t>(buf[i] + 1);
    }
  }
};

Stream g_read_stream{"read"}, g_epoll_stream{"epoll"}, g_poll_stream{"poll"};

bool g_tolerate_epoll_eintr = false;
std::atomic<long> g_epoll_eintr{0};

void make_pipe(Stream* s) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    perror("pipe2");
    exit(2);
  }
  s->rd = fds[0];
  s->wr = fds[1];
}

void sleep_ns(int64_t ns, const char* who) {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (nanosleep(&ts, &ts) != 0) {
    if (errno != EINTR) return;
    anomaly("%s: nanosleep EINTR", who);
  }
}

void* feeder(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    sleep_ns(50 * kMs, "feeder");
    for (Stream* s : {&g_read_stream, &g_epoll_stream, &g_poll_stream}) {
      uint8_t b = s->next_to_send++;
      if (!write_all(s->wr, &b, 1)) anomaly("feeder: write to %s pipe: %s", s->name, strerror(errno));
    }
    w->progress++;
  }
}

void* reader(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    uint8_t buf[16];
    ssize_t n = read(g_read_stream.rd, buf, sizeof(buf));
    if (n < 0) {
      anomaly("read: %s", strerror(errno));
      continue;
    }
    if (n == 0) {
      anomaly("read: unexpected EOF");
      return nullptr;
    }
    g_read_stream.check(buf, n);
    w->progress++;
  }
}

void* sleeper(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    timespec req{0, 20 * kMs}, rem{};
    int64_t t0 = now_ns();
    int rc = nanosleep(&req, &rem);
    int64_t dt = now_ns() - t0;
    if (rc != 0)
      anomaly("nanosleep: %s", strerror(errno));
    else if (dt < 20 * kMs)
      anomaly("nanosleep: slept %lld ns of 20 ms", static_cast<long long>(dt));
    w->progress++;
  }
}

void* epoller(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = g_epoll_stream.rd;
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, g_epoll_stream.rd, &ev) != 0) {
    perror("epoll");
    exit(2);
  }
  for (;;) {
    epoll_event out{};
    int n = epoll_wait(ep, &out, 1, -1);
    if (n < 0 && errno == EINTR && g_tolerate_epoll_eintr) {
      g_epoll_eintr++;
      continue;
    }
    if (n < 0) {
      anomaly("epoll_wait: %s", strerror(errno));
      continue;
    }
    if (n == 0) {
      anomaly("epoll_wait(-1) returned 0");
      continue;
    }
    uint8_t buf[16];
    ssize_t r = read(g_epoll_stream.rd, buf, sizeof(buf));
    if (r <= 0)
      anomaly("epoll: read after readiness returned %zd (%s)", r, strerror(errno));
    else
      g_epoll_stream.check(buf, r);
    w->progress++;
  }
}

void* poller(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    pollfd p{g_poll_stream.rd, POLLIN, 0};
    int n = poll(&p, 1, -1);
    if (n < 0) {
      anomaly("poll: %s", strerror(errno));
      continue;
    }
    if (n == 0 || !(p.revents & POLLIN)) {
      anomaly("poll(-1) returned %d revents 0x%x", n, p.revents);
      continue;
    }
    uint8_t buf[16];
    ssize_t r = read(g_poll_stream.rd, buf, sizeof(buf));
    if (r <= 0)
      anomaly("poll: read after readiness returned %zd (%s)", r, strerror(errno));
    else
      g_poll_stream.check(buf, r);
    w->progress++;
  }
}

uint32_t g_futex_word = 0;  // never changed, never woken: every wait must time out

void* futexer(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    timespec ts{0, 30 * kMs};
    int64_t t0 = now_ns();
    long rc = syscall(SYS_futex, &g_futex_word, FUTEX_WAIT_PRIVATE, 0, &ts, nullptr, 0);
    int err = errno;
    int64_t dt = now_ns() - t0;
    if (rc == 0)
      anomaly("futex: woken after %lld ns although nobody wakes it", static_cast<long long>(dt));
    else if (err != ETIMEDOUT)
      anomaly("futex: %s", strerror(err));
    else if (dt < 30 * kMs)
      anomaly("futex: timed out after %lld ns of 30 ms", static_cast<long long>(dt));
    w->progress++;
  }
}

// accept/connect create fds transiently; the fd counter holds this lock so it
// only sees the steady state.
pthread_mutex_t g_fd_mu = PTHREAD_MUTEX_INITIALIZER;
void fd_lock() { pthread_mutex_lock(&g_fd_mu); }
void fd_unlock() { pthread_mutex_unlock(&g_fd_mu); }

sockaddr_un g_addr{};
socklen_t g_addr_len = 0;
int g_listen_fd = -1;

void* acceptor(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  uint64_t expected = 0;
  for (;;) {
    int fd = accept4(g_listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      anomaly("accept: %s", strerror(errno));
      continue;
    }
    uint64_t seq = 0;
    ssize_t n;
    do n = read(fd, &seq, sizeof(seq));
    while (n < 0 && errno == EINTR);
    if (n != sizeof(seq))
      anomaly("accept: read %zd bytes of the sequence number", n);
    else if (seq != expected)
      anomaly("accept: connection %llu, expected %llu", (unsigned long long)seq,
              (unsigned long long)expected);
    expected = seq + 1;
    uint8_t ack = 1;
    write_all(fd, &ack, 1);
    close(fd);
    w->progress++;
  }
}

// Reads one byte with a deadline; returns the read() result, or -2 on timeout.
ssize_t read_with_deadline(int fd, uint8_t* b, int ms) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do rc = poll(&p, 1, ms);
  while (rc < 0 && errno == EINTR);
  if (rc == 0) return -2;
  ssize_t n;
  do n = read(fd, b, 1);
  while (n < 0 && errno == EINTR);
  return n;
}

void* connector(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (uint64_t seq = 0;; ++seq) {
    sleep_ns(100 * kMs, "connector");
    fd_lock();
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&g_addr), g_addr_len) != 0) {
      anomaly("connector: connect: %s", strerror(errno));
    } else {
      write_all(s, &seq, sizeof(seq));
      uint8_t b;
      if (read_with_deadline(s, &b, 5000) != 1)
        anomaly("connector: no ack for connection %llu", (unsigned long long)seq);
      // EOF: the acceptor closed its end, so its fd is gone too.
      else if (read_with_deadline(s, &b, 5000) != 0)
        anomaly("connector: acceptor did not close");
    }
    if (s >= 0) close(s);
    fd_unlock();
    w->progress++;
  }
}

void* waiter(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (int seq = 0;; ++seq) {
    int code = seq & 0x7f;
    pid_t child = fork();
    if (child < 0) {
      anomaly("fork: %s", strerror(errno));
      sleep_ns(50 * kMs, "waitpid");
      continue;
    }
    if (child == 0) {
      timespec ts{0, 20 * kMs};
      syscall(SYS_nanosleep, &ts, nullptr);
      _exit(code);
    }
    int st = 0;
    pid_t r;
    while ((r = waitpid(child, &st, 0)) < 0 && errno == EINTR) anomaly("waitpid: EINTR");
    if (r != child)
      anomaly("waitpid returned %d: %s", r, strerror(errno));
    else if (!WIFEXITED(st) || WEXITSTATUS(st) != code)
      anomaly("waitpid: status 0x%x, expected exit %d", st, code);
    w->progress++;
  }
}

std::string extra_report() {
  return g_tolerate_epoll_eintr ? "epoll_eintr=" + std::to_string(g_epoll_eintr.load()) : std::string();
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--tolerate-epoll-eintr") == 0) {
      g_tolerate_epoll_eintr = true;
    } else {
      fprintf(stderr, "usage: %s [--tolerate-epoll-eintr]\n", argv[0]);
      return 2;
    }
  }
  make_pipe(&g_read_stream);
  make_pipe(&g_epoll_stream);
  make_pipe(&g_poll_stream);

  g_listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  g_addr.sun_family = AF_UNIX;
  // Abstract name: nothing to clean up in the file system.
  int len = snprintf(g_addr.sun_path + 1, sizeof(g_addr.sun_path) - 1, "remora-target-syscalls-%d", getpid());
  g_addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len);
  if (g_listen_fd < 0 || bind(g_listen_fd, reinterpret_cast<sockaddr*>(&g_addr), g_addr_len) != 0 ||
      listen(g_listen_fd, 4) != 0) {
    perror("listen");
    return 2;
  }
  set_count_lock(fd_lock, fd_unlock);

  start_thread(feeder, register_worker("feeder"));
  start_thread(reader, register_worker("read"));
  start_thread(sleeper, register_worker("nanosleep"));
  start_thread(epoller, register_worker("epoll"));
  start_thread(futexer, register_worker("futex"));
  start_thread(acceptor, register_worker("accept"));
  start_thread(connector, register_worker("connector"));
  start_thread(waiter, register_worker("waitpid"));
  start_thread(poller, register_worker("poll"));
  return run_protocol(extra_report);
}
