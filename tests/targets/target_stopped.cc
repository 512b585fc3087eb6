// Target "stopped": a quiet process that the test stops with SIGSTOP before
// making remote calls into it. Remora must run the calls and leave every
// thread stopped (State T) afterwards; after SIGCONT the threads go on as if
// nothing happened. Only system calls that restart transparently after a
// stop/continue are used (read, nanosleep, futex: not epoll_wait, which
// returns EINTR after SIGCONT by design, see signal(7)).
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "target_common.h"

using namespace remora_target;

namespace {

constexpr int64_t kMs = 1'000'000;
int g_pipe[2];
uint32_t g_futex_word = 0;

void* feeder(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (uint8_t seq = 0;; ++seq) {
    timespec ts{0, 20 * kMs};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) anomaly("feeder: nanosleep EINTR");
    if (!write_all(g_pipe[1], &seq, 1)) anomaly("feeder: write: %s", strerror(errno));
    w->progress++;
  }
}

void* reader(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  uint8_t expected = 0;
  for (;;) {
    uint8_t buf[16];
    ssize_t n = read(g_pipe[0], buf, sizeof(buf));
    if (n <= 0) {
      anomaly("read returned %zd (%s)", n, strerror(errno));
      continue;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != expected) anomaly("read: byte %u, expected %u", buf[i], expected);
      expected = static_cast<uint8_t>(buf[i] + 1);
    }
    w->progress++;
  }
}

void* sleeper(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    timespec req{0, 20 * kMs};
    int64_t t0 = now_ns();
    int rc = nanosleep(&req, nullptr);
    int64_t dt = now_ns() - t0;
    if (rc != 0)
      anomaly("nanosleep: %s", strerror(errno));
    else if (dt < 20 * kMs)
      anomaly("nanosleep: slept %lld ns of 20 ms", (long long)dt);
    w->progress++;
  }
}

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
      anomaly("futex: woken although nobody wakes it");
    else if (err != ETIMEDOUT)
      anomaly("futex: %s", strerror(err));
    else if (dt < 30 * kMs)
      anomaly("futex: timed out after %lld ns of 30 ms", (long long)dt);
    w->progress++;
  }
}

}  // namespace

int main() {
  if (pipe2(g_pipe, O_CLOEXEC) != 0) {
    perror("pipe2");
    return 2;
  }
  start_thread(feeder, register_worker("feeder"));
  start_thread(reader, register_worker("read"));
  start_thread(sleeper, register_worker("nanosleep"));
  start_thread(futexer, register_worker("futex"));
  return run_protocol();
}
