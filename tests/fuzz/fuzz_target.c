/* The socket channel fuzzer's target (channel_fuzz_test.cc), started with
 * the agent preloaded and REMORA_TOOL_ATTACH=1: what the wake signal and
 * the channel thread must leave alone.
 *
 *   remora_fuzz_target READY_FD
 *
 * A reader thread blocks in read(2) on a pipe of its own (a wait the kernel
 * restarts after a handler: it must never see EINTR); the main thread
 * computes, and checks each round's result against the first one's. Says
 * "ready <reader tid>\n" on READY_FD once both run. When its stdin closes it
 * wakes the reader, prints one line of counters on stdout:
 *   rounds=<n> bad=<rounds whose result differed> eintr=<reader's EINTRs>
 *   reader=<ok|failed>
 * and exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int g_reader_pipe[2];
static volatile pid_t g_reader_tid;
static int g_reader_eintr;
static int g_reader_ok;
/* Read afresh each round: no round's result is the compiler's. */
static volatile uint64_t g_seed = 88172645463325252ull;

static void* reader_main(void* arg) {
  (void)arg;
  __atomic_store_n(&g_reader_tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
  char b = 0;
  ssize_t n;
  for (;;) {
    n = read(g_reader_pipe[0], &b, 1);
    if (n < 0 && errno == EINTR) {
      ++g_reader_eintr;
      continue;
    }
    break;
  }
  g_reader_ok = n == 1 && b == 'q';
  return NULL;
}

/* One round: a xorshift walk folded into a sum, all in registers. */
static uint64_t compute(uint64_t seed) {
  uint64_t x = seed, sum = 0;
  for (int i = 0; i < 200000; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    sum += x * (uint64_t)(i | 1);
  }
  return sum;
}

/* Has stdin closed? (No wait: the main thread stays in its computation.) */
static int stdin_closed(void) {
  struct pollfd p = {0, POLLIN, 0};
  int n;
  do n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return 0;
  char buf[64];
  ssize_t r;
  do r = read(0, buf, sizeof buf);
  while (r < 0 && errno == EINTR);
  return r <= 0;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s READY_FD\n", argv[0]);
    return 2;
  }
  const int ready_fd = atoi(argv[1]);
  if (pipe(g_reader_pipe) != 0) return 3;
  pthread_t reader;
  if (pthread_create(&reader, NULL, reader_main, NULL) != 0) return 3;
  while (__atomic_load_n(&g_reader_tid, __ATOMIC_ACQUIRE) == 0) sched_yield();
  const uint64_t want = compute(g_seed);
  char line[64];
  const int len = snprintf(line, sizeof line, "ready %d\n", (int)g_reader_tid);
  if (write(ready_fd, line, (size_t)len) != len) return 4;
  close(ready_fd);
  unsigned long long rounds = 0, bad = 0;
  do {  // one round at least, however soon stdin closes
    if (compute(g_seed) != want) ++bad;
    ++rounds;
  } while (!stdin_closed());
  if (write(g_reader_pipe[1], "q", 1) != 1) return 5;
  pthread_join(reader, NULL);
  printf("rounds=%llu bad=%llu eintr=%d reader=%s\n", rounds, bad, g_reader_eintr,
         g_reader_ok ? "ok" : "failed");
  fflush(stdout);
  return 0;
}
