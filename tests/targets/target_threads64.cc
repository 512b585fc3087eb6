// Target "threads64": 64 threads alternating short sleeps (1-4 ms, measured:
// a sleep that returns early or with EINTR is an anomaly) and a burst of
// arithmetic whose result is checked. Many threads, mostly in and out of
// the kernel: exercises the engine's thread choice and its seizing of one
// thread while 63 others keep running.
#include <time.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "target_common.h"

using namespace remora_target;

namespace {

constexpr int kThreads = 64;

struct Slot {
  Worker* w;
  int index;
};
Slot g_slots[kThreads];
volatile uint64_t g_seed = 0x9e3779b97f4a7c15ULL;

uint64_t work(uint64_t seed, int n) {
  uint64_t a = seed, b = ~seed;
  for (int i = 0; i < n; ++i) {
    a = (a ^ (a << 13)) + b;
    b = (b >> 7) ^ (a * 0x2545f4914f6cdd1dULL);
  }
  return a ^ b;
}

uint64_t g_expected[kThreads];

void* run(void* arg) {
  Slot* s = static_cast<Slot*>(arg);
  worker_started(s->w);
  for (uint64_t iter = 0;; ++iter) {
    int64_t want = (1 + static_cast<int64_t>((iter + static_cast<uint64_t>(s->index)) % 4)) * 1'000'000;
    timespec req{0, static_cast<long>(want)};
    int64_t t0 = now_ns();
    int rc = nanosleep(&req, nullptr);
    int64_t dt = now_ns() - t0;
    if (rc != 0)
      anomaly("thread %d: nanosleep: %s", s->index, strerror(errno));
    else if (dt < want)
      anomaly("thread %d: slept %lld ns of %lld", s->index, (long long)dt, (long long)want);
    uint64_t got = work(g_seed + static_cast<uint64_t>(s->index), 5000);
    if (got != g_expected[s->index]) anomaly("thread %d: work result changed", s->index);
    s->w->progress++;
  }
}

}  // namespace

int main() {
  for (int i = 0; i < kThreads; ++i) g_expected[i] = work(g_seed + static_cast<uint64_t>(i), 5000);
  for (int i = 0; i < kThreads; ++i) {
    char role[16];
    snprintf(role, sizeof(role), "t%d", i);
    g_slots[i] = {register_worker(role), i};
    start_thread(run, &g_slots[i], 128 * 1024);
  }
  return run_protocol();
}
