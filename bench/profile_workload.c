// The workload of bench/profile_vs_perf.py: a program with known CPU shares,
// built -O2 -fomit-frame-pointer -g as programs are shipped, so that a
// profiler must unwind from unwind tables (or get the stacks wrong).
//
// Thread "driver": driver() calls three leaves in rounds of about 1 ms whose
// time splits 50/30/20 (leaf_hash/leaf_float/leaf_table). The calls per round
// are calibrated at start, and each round's length is scaled by a random
// factor (0.5-1.5) so that no sampling period can alias with the rounds.
// The truth is measured, not assumed: each leaf's batch is timed on the
// thread's CPU clock.
// Thread "libc-worker": memcpy and qsort (libc code, named only from libc's
// debug information), busy about 30 % of the time.
// The main thread reports every 100 ms on stdout, cumulative counters:
//   tick MONO_NS ROUNDS HASH_NS FLOAT_NS TABLE_NS DRIVER_CPU_NS LIBC_CPU_NS MAIN_CPU_NS LIBC_OPS
// (MONO_NS on CLOCK_MONOTONIC, *_CPU_NS from each thread's CPU clock; the
// rounds per second are the throughput). It exits when stdin closes.
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kInner = 256, kTableSize = 4096, kCopyBytes = 1 << 20, kSortInts = 20000 };

static _Atomic uint64_t g_rounds, g_hash_ns, g_float_ns, g_table_ns, g_libc_ops;
static volatile uint64_t g_sink;  // keeps the leaves' results alive
static uint8_t g_table[kTableSize];

static uint64_t now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// The leaves: noipa, so that -O2 neither inlines, clones nor merges them
// (the profile must show these names), and each of a different kind of work.
__attribute__((noipa)) uint64_t leaf_hash(uint64_t x) {
  for (int i = 0; i < kInner; i++) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
  }
  return x;
}

__attribute__((noipa)) double leaf_float(double x) {
  for (int i = 0; i < kInner / 4; i++) x = x * 0.999 + 1.0 / (x + 1.0);
  return x;
}

__attribute__((noipa)) uint32_t leaf_table(uint32_t h) {
  for (int i = 0; i < kInner; i++) h = h * 31u + g_table[(h >> 7) & (kTableSize - 1)];
  return h;
}

struct Plan {
  uint32_t hash_calls, float_calls, table_calls;  // per round of 1 ms at factor 1
};

// Nanoseconds per call of each leaf: the least of 7 timed batches.
static double per_call_ns(int which) {
  double best = 1e18;
  for (int rep = 0; rep < 7; rep++) {
    uint64_t t0 = now_ns(CLOCK_THREAD_CPUTIME_ID), acc = 0;
    for (int i = 0; i < 2000; i++) {
      if (which == 0) acc += leaf_hash(acc + (uint64_t)i);
      if (which == 1) acc += (uint64_t)leaf_float((double)(acc & 1023) + i);
      if (which == 2) acc += leaf_table((uint32_t)(acc + (uint64_t)i));
    }
    g_sink += acc;
    double ns = (double)(now_ns(CLOCK_THREAD_CPUTIME_ID) - t0) / 2000.0;
    if (ns < best) best = ns;
  }
  return best;
}

static struct Plan calibrate(void) {
  const double round_ns = 1e6, shares[3] = {0.5, 0.3, 0.2};
  uint32_t calls[3];
  for (int w = 0; w < 3; w++) {
    double c = shares[w] * round_ns / per_call_ns(w);
    calls[w] = c < 1 ? 1 : (uint32_t)c;
  }
  struct Plan plan = {calls[0], calls[1], calls[2]};
  return plan;
}

static uint64_t xorshift(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

// The profiled call tree: driver_thread -> driver -> the three leaves.
__attribute__((noipa)) void driver(const struct Plan* plan) {
  uint64_t seed = 0x9e3779b97f4a7c15ull, acc = 0;
  for (;;) {
    // A factor in [0.5, 1.5), the same for the three batches: the shares stay.
    double f = 0.5 + (double)(xorshift(&seed) % 1024) / 1024.0;
    uint32_t n_hash = (uint32_t)(plan->hash_calls * f), n_float = (uint32_t)(plan->float_calls * f),
             n_table = (uint32_t)(plan->table_calls * f);
    // The thread's CPU clock, not the wall clock: a preemption in the middle
    // of a batch must not count as that leaf's time (a system call, about
    // 0.1 % of a round).
    uint64_t t0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t i = 0; i < n_hash; i++) acc += leaf_hash(acc + i);
    uint64_t t1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t i = 0; i < n_float; i++) acc += (uint64_t)leaf_float((double)(acc & 1023) + i);
    uint64_t t2 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t i = 0; i < n_table; i++) acc += leaf_table((uint32_t)(acc + i));
    uint64_t t3 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    g_sink += acc;
    atomic_fetch_add_explicit(&g_hash_ns, t1 - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_float_ns, t2 - t1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_table_ns, t3 - t2, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_rounds, 1, memory_order_relaxed);
  }
}

static void* driver_thread(void* arg) {
  driver(arg);
  return NULL;
}

static int compare_ints(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return (x > y) - (x < y);
}

__attribute__((noipa)) void libc_work(char* dst, const char* src, int* ints, uint64_t* seed) {
  for (int i = 0; i < 4; i++) memcpy(dst, src, kCopyBytes);
  for (int i = 0; i < kSortInts; i++) ints[i] = (int)(xorshift(seed) & 0x7fffffff);
  qsort(ints, kSortInts, sizeof(int), compare_ints);
}

static void* libc_thread(void* arg) {
  (void)arg;
  char* src = malloc(kCopyBytes);
  char* dst = malloc(kCopyBytes);
  int* ints = malloc(kSortInts * sizeof(int));
  if (!src || !dst || !ints) {
    fprintf(stderr, "profile_workload: out of memory\n");
    exit(1);
  }
  memset(src, 0x5a, kCopyBytes);
  uint64_t seed = 12345;
  for (;;) {
    uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    libc_work(dst, src, ints, &seed);
    atomic_fetch_add_explicit(&g_libc_ops, 1, memory_order_relaxed);
    // Busy 30 %: sleep 7/3 of the time the work took.
    uint64_t busy = now_ns(CLOCK_MONOTONIC) - t0, nap = busy * 7 / 3;
    struct timespec ts = {(time_t)(nap / 1000000000u), (long)(nap % 1000000000u)};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static uint64_t thread_cpu_ns(pthread_t t) {
  clockid_t clock;
  if (pthread_getcpuclockid(t, &clock) != 0) return 0;
  return now_ns(clock);
}

int main(void) {
  for (int i = 0; i < kTableSize; i++) g_table[i] = (uint8_t)(i * 37 + 11);
  struct Plan plan = calibrate();
  fprintf(stderr, "profile_workload: calls per 1 ms round: hash %u, float %u, table %u\n", plan.hash_calls,
          plan.float_calls, plan.table_calls);
  pthread_t drv, lib;
  if (pthread_create(&drv, NULL, driver_thread, &plan) != 0 ||
      pthread_create(&lib, NULL, libc_thread, NULL) != 0) {
    fprintf(stderr, "profile_workload: pthread_create failed\n");
    return 1;
  }
  pthread_setname_np(drv, "driver");
  pthread_setname_np(lib, "libc-worker");
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready\n");
  // Report every 100 ms until stdin closes (the bench's end, or its death).
  struct pollfd in = {.fd = 0, .events = POLLIN};
  for (;;) {
    int r = poll(&in, 1, 100);
    if (r > 0) {
      char buf[256];
      if (read(0, buf, sizeof buf) <= 0) return 0;
    }
    printf("tick %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", (unsigned long long)now_ns(CLOCK_MONOTONIC),
           (unsigned long long)atomic_load(&g_rounds), (unsigned long long)atomic_load(&g_hash_ns),
           (unsigned long long)atomic_load(&g_float_ns), (unsigned long long)atomic_load(&g_table_ns),
           (unsigned long long)thread_cpu_ns(drv), (unsigned long long)thread_cpu_ns(lib),
           (unsigned long long)now_ns(CLOCK_THREAD_CPUTIME_ID), (unsigned long long)atomic_load(&g_libc_ops));
  }
}
