// Target "signals": signal handlers with and without SA_RESTART, threads
// blocked in read and nanosleep, and a spinning thread, while the test sends
// a storm of SIGUSR1, SIGUSR2 and queued SIGRTMIN. The target counts every
// signal it receives ("signals" command) so the test can compare with what it
// sent: queued real-time signals are never merged, so every one must arrive
// exactly once, also when a remote call held a thread meanwhile.
//
// SIGUSR2 has no SA_RESTART, so a read or nanosleep may fail with EINTR:
// that is legitimate and retried. Anomalies are data lost or garbled in the
// pipes, sleeps that end early once EINTR is accounted for, real-time
// signals with the wrong si_code or payload, and checksum errors.
#include <fcntl.h>
#include <signal.h>
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

std::atomic<long> g_usr1{0}, g_usr2{0}, g_rt{0}, g_rt_bad{0};
std::atomic<long long> g_rt_sum{0};

void on_usr1(int) { g_usr1.fetch_add(1); }
void on_usr2(int) { g_usr2.fetch_add(1); }
void on_rt(int, siginfo_t* si, void*) {
  g_rt.fetch_add(1);
  if (si->si_code != SI_QUEUE || si->si_value.sival_int < 0)
    g_rt_bad.fetch_add(1);
  else
    g_rt_sum.fetch_add(si->si_value.sival_int);
}

void install(int sig, void (*h)(int), void (*sa)(int, siginfo_t*, void*), int flags) {
  struct sigaction act {};
  if (sa)
    act.sa_sigaction = sa;
  else
    act.sa_handler = h;
  act.sa_flags = flags;
  sigemptyset(&act.sa_mask);
  if (sigaction(sig, &act, nullptr) != 0) {
    perror("sigaction");
    exit(2);
  }
}

struct Stream {
  const char* name;
  int rd = -1, wr = -1;
  uint8_t next_expected = 0;
  uint8_t next_to_send = 0;
  Worker* w = nullptr;
};
Stream g_streams[2] = {{"read_a"}, {"read_b"}};

void sleep_ns(int64_t ns) {
  timespec ts{0, static_cast<long>(ns)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void* feeder(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    sleep_ns(20 * kMs);
    for (Stream& s : g_streams) {
      uint8_t b = s.next_to_send++;
      if (!write_all(s.wr, &b, 1)) anomaly("feeder: write: %s", strerror(errno));
    }
    w->progress++;
  }
}

void* reader(void* arg) {
  Stream* s = static_cast<Stream*>(arg);
  worker_started(s->w);
  for (;;) {
    uint8_t buf[16];
    ssize_t n = read(s->rd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;  // SIGUSR2 has no SA_RESTART
    if (n <= 0) {
      anomaly("%s: read returned %zd (%s)", s->name, n, strerror(errno));
      continue;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != s->next_expected)
        anomaly("%s: byte %u arrived, expected %u (lost or garbled data)", s->name, buf[i], s->next_expected);
      s->next_expected = static_cast<uint8_t>(buf[i] + 1);
    }
    s->w->progress++;
  }
}

void* sleeper(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    timespec ts{0, 20 * kMs};
    int64_t t0 = now_ns();
    int rc;
    while ((rc = nanosleep(&ts, &ts)) != 0 && errno == EINTR) {
    }
    int64_t dt = now_ns() - t0;
    if (rc != 0)
      anomaly("nanosleep: %s", strerror(errno));
    else if (dt < 20 * kMs)
      anomaly("nanosleep: slept %lld ns of 20 ms", (long long)dt);
    w->progress++;
  }
}

volatile uint64_t g_seed = 42;
uint64_t g_expected;
uint64_t checksum(uint64_t x) {
  uint64_t sum = 0;
  for (int i = 0; i < 20000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sum ^= (x >> 17) + (sum << 3);
  }
  return sum;
}

void* spinner(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  spin_politely();
  for (;;) {
    if (checksum(g_seed) != g_expected) anomaly("spin: checksum changed");
    w->progress++;
  }
}

std::string counters() {
  return "usr1=" + std::to_string(g_usr1.load()) + " usr2=" + std::to_string(g_usr2.load()) +
         " rt=" + std::to_string(g_rt.load()) + " rt_sum=" + std::to_string(g_rt_sum.load()) +
         " rt_bad=" + std::to_string(g_rt_bad.load());
}

std::string extra_report() {
  if (g_rt_bad.load() != 0) anomaly("%ld real-time signals with a wrong si_code or payload", g_rt_bad.load());
  return counters();
}

bool extra_command(const std::string& cmd, std::string* reply) {
  if (cmd != "signals") return false;
  *reply = counters();
  return true;
}

}  // namespace

int main() {
  install(SIGUSR1, on_usr1, nullptr, SA_RESTART);
  install(SIGUSR2, on_usr2, nullptr, 0);
  install(SIGRTMIN, nullptr, on_rt, SA_SIGINFO | SA_RESTART);
  g_expected = checksum(g_seed);
  for (Stream& s : g_streams) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      perror("pipe2");
      return 2;
    }
    s.rd = fds[0];
    s.wr = fds[1];
    s.w = register_worker(s.name);
    start_thread(reader, &s);
  }
  start_thread(feeder, register_worker("feeder"));
  start_thread(sleeper, register_worker("nanosleep"));
  start_thread(spinner, register_worker("spin"));
  return run_protocol(extra_report, extra_command);
}
