/* remora_channel_target: a multi-threaded program whose threads sit in the
 * waits that a signal handler's return can cut short, for the socket
 * channel's end-to-end test (channel_test.py). The channel wakes an opted-in
 * agent with a signal; the program must not notice: every EINTR any of its
 * calls sees is counted, and printed at exit.
 *
 *   remora_channel_target [--nondumpable] [--eintr-waits-only]
 *
 * Threads (all of the program's own):
 *   epoll      epoll_wait(-1) on a set that holds only the stop eventfd
 *   nanosleep  nanosleep(200 ms) in a loop
 *   poll       poll(stop eventfd, 100 ms) in a loop
 *   read       read() on a pipe (the kernel restarts it after a handler)
 *   cond       pthread_cond_wait (a futex wait without a timeout)
 *   compute    channel_target_hot() in a loop, each result checked against
 *              the one computed before any thread started
 *   main       epoll_wait(-1) on stdin; EOF (or a hang-up) ends the program
 * --eintr-waits-only leaves out read, cond and compute: every thread then
 * waits in a call that a handler makes fail with EINTR (the agent must
 * re-issue it, or the counters show it).
 * --nondumpable: prctl(PR_SET_DUMPABLE, 0) first thing.
 *
 * Prints "ready <pid> threads=<n>" on stdout once every thread is in place
 * (the blocking ones seen asleep), and at exit one line
 * "eintr epoll=0 nanosleep=0 poll=0 read=0 cond=0 main=0 compute=ok";
 * exits 0 only when every computation gave the expected result (and 1 on
 * any unexpected error, which it prints on stderr). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { K_EPOLL, K_NANOSLEEP, K_POLL, K_READ, K_COND, K_MAIN, K_COUNT };
static const char* const kNames[K_COUNT] = {"epoll", "nanosleep", "poll", "read", "cond", "main"};

static unsigned long g_eintr[K_COUNT];
static unsigned long g_errors;
static int g_stop;
static int g_stop_efd = -1;
static int g_pipe[2] = {-1, -1};
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;

/* Thread start-up: each thread records its tid here before it waits. */
static pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_start_cond = PTHREAD_COND_INITIALIZER;
static pid_t g_tids[8];
static int g_blocking[8]; /* 1: a thread that sleeps until the end */
static int g_started;

static uint64_t g_expected;
static volatile uint64_t g_seed = 12345; /* read each time: no call is hoisted */
static unsigned long g_computed, g_wrong;

static void count_eintr(int kind) { __atomic_add_fetch(&g_eintr[kind], 1, __ATOMIC_RELAXED); }

static void fail_call(const char* what) {
  fprintf(stderr, "channel_target: %s: %s\n", what, strerror(errno));
  __atomic_add_fetch(&g_errors, 1, __ATOMIC_RELAXED);
}

static int stopping(void) { return __atomic_load_n(&g_stop, __ATOMIC_ACQUIRE); }

static void started(int blocking) {
  pthread_mutex_lock(&g_start_mu);
  g_tids[g_started] = (pid_t)syscall(SYS_gettid);
  g_blocking[g_started] = blocking;
  ++g_started;
  pthread_cond_broadcast(&g_start_cond);
  pthread_mutex_unlock(&g_start_mu);
}

/* The profile's hot spot: integer and floating-point state both, so that a
 * handler that returned with either changed shows as a wrong result. */
__attribute__((noinline)) uint64_t channel_target_hot(uint64_t seed) {
  uint64_t x = seed;
  double acc = 0.0;
  for (int i = 0; i < 200000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    acc += (double)(x >> 40) * 0.5;
  }
  return x ^ (uint64_t)acc;
}

static void* epoll_thread(void* arg) {
  (void)arg;
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = g_stop_efd}};
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, g_stop_efd, &ev) != 0) {
    fail_call("epoll set");
    started(0);
    return NULL;
  }
  started(1);
  for (;;) {
    struct epoll_event got;
    const int n = epoll_wait(ep, &got, 1, -1);
    if (n > 0) break;
    if (n < 0 && errno == EINTR) {
      count_eintr(K_EPOLL);
      continue;
    }
    if (n < 0) {
      fail_call("epoll_wait");
      break;
    }
  }
  close(ep);
  return NULL;
}

static void* nanosleep_thread(void* arg) {
  (void)arg;
  started(0);
  while (!stopping()) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0) {
      if (errno != EINTR) {
        fail_call("nanosleep");
        return NULL;
      }
      count_eintr(K_NANOSLEEP);
    }
  }
  return NULL;
}

static void* poll_thread(void* arg) {
  (void)arg;
  started(0);
  while (!stopping()) {
    struct pollfd p = {g_stop_efd, POLLIN, 0};
    const int n = poll(&p, 1, 100);
    if (n > 0) break;
    if (n < 0 && errno == EINTR) {
      count_eintr(K_POLL);
    } else if (n < 0) {
      fail_call("poll");
      break;
    }
  }
  return NULL;
}

static void* read_thread(void* arg) {
  (void)arg;
  started(1);
  for (;;) {
    char c;
    const ssize_t n = read(g_pipe[0], &c, 1);
    if (n >= 0) break; /* the byte (or EOF) that says stop */
    if (errno == EINTR) {
      count_eintr(K_READ);
      continue;
    }
    fail_call("read");
    break;
  }
  return NULL;
}

static void* cond_thread(void* arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  started(1);
  while (!stopping()) {
    const int r = pthread_cond_wait(&g_cond, &g_mu);
    if (r == EINTR)
      count_eintr(K_COND);
    else if (r != 0) {
      errno = r;
      fail_call("pthread_cond_wait");
      break;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

static void* compute_thread(void* arg) {
  (void)arg;
  started(0);
  unsigned long done = 0, wrong = 0;
  do {
    if (channel_target_hot(g_seed) != g_expected) ++wrong;
    ++done;
  } while (!stopping());
  __atomic_store_n(&g_computed, done, __ATOMIC_RELEASE);
  __atomic_store_n(&g_wrong, wrong, __ATOMIC_RELEASE);
  return NULL;
}

/* The thread's state letter from /proc/self/task/TID/stat ('?' unreadable). */
static char thread_state(pid_t tid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return '?';
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return '?';
  buf[n] = '\0';
  const char* paren = strrchr(buf, ')');
  return paren && paren[1] == ' ' ? paren[2] : '?';
}

int main(int argc, char** argv) {
  int nondumpable = 0, eintr_only = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--nondumpable") == 0) {
      nondumpable = 1;
    } else if (strcmp(argv[i], "--eintr-waits-only") == 0) {
      eintr_only = 1;
    } else {
      fprintf(stderr, "usage: %s [--nondumpable] [--eintr-waits-only]\n", argv[0]);
      return 2;
    }
  }
  if (nondumpable && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    perror("prctl(PR_SET_DUMPABLE)");
    return 1;
  }
  g_stop_efd = eventfd(0, EFD_CLOEXEC);
  if (g_stop_efd < 0 || pipe2(g_pipe, O_CLOEXEC) != 0) {
    perror("eventfd/pipe");
    return 1;
  }
  g_expected = channel_target_hot(g_seed);

  void* (*const all[])(void*) = {epoll_thread, nanosleep_thread, poll_thread,
                                 read_thread,  cond_thread,      compute_thread};
  const int count = eintr_only ? 3 : 6;
  pthread_t threads[6];
  for (int i = 0; i < count; ++i) {
    const int r = pthread_create(&threads[i], NULL, all[i], NULL);
    if (r != 0) {
      fprintf(stderr, "pthread_create: %s\n", strerror(r));
      return 1;
    }
  }

  /* Main's own wait, set up before "ready". */
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = 0}};
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev) != 0) {
    perror("epoll on stdin (a pipe or a terminal is needed)");
    return 1;
  }

  /* In place: every thread started, and those that wait until the end seen
   * asleep in their wait. */
  pthread_mutex_lock(&g_start_mu);
  while (g_started < count) pthread_cond_wait(&g_start_cond, &g_start_mu);
  pthread_mutex_unlock(&g_start_mu);
  for (int i = 0; i < count; ++i) {
    while (g_blocking[i] && thread_state(g_tids[i]) != 'S') {
      const struct timespec ms = {0, 1000 * 1000};
      nanosleep(&ms, NULL);
    }
  }
  printf("ready %d threads=%d\n", (int)getpid(), count + 1);
  fflush(stdout);

  for (;;) {
    struct epoll_event got;
    const int n = epoll_wait(ep, &got, 1, -1);
    if (n > 0) {
      char buf[256];
      const ssize_t r = read(0, buf, sizeof buf);
      if (r > 0) continue; /* input is not asked for: only its end counts */
      if (r < 0 && errno == EINTR) {
        count_eintr(K_MAIN);
        continue;
      }
      break;
    }
    if (n < 0 && errno == EINTR) {
      count_eintr(K_MAIN);
      continue;
    }
    if (n < 0) {
      fail_call("epoll_wait (main)");
      break;
    }
  }

  /* Stop: the flag, then each thread's own wake-up. */
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
  const uint64_t one = 1;
  if (write(g_stop_efd, &one, sizeof one) != (ssize_t)sizeof one) fail_call("write the stop eventfd");
  close(g_pipe[1]);
  pthread_mutex_lock(&g_mu);
  pthread_cond_broadcast(&g_cond);
  pthread_mutex_unlock(&g_mu);
  for (int i = 0; i < count; ++i) pthread_join(threads[i], NULL);

  const unsigned long computed = __atomic_load_n(&g_computed, __ATOMIC_ACQUIRE);
  const unsigned long wrong = __atomic_load_n(&g_wrong, __ATOMIC_ACQUIRE);
  const int compute_ok = eintr_only || (computed > 0 && wrong == 0);
  printf("eintr");
  for (int k = 0; k < K_COUNT; ++k)
    printf(" %s=%lu", kNames[k], __atomic_load_n(&g_eintr[k], __ATOMIC_RELAXED));
  if (eintr_only)
    printf(" compute=none\n");
  else if (compute_ok)
    printf(" compute=ok\n");
  else
    printf(" compute=wrong(%lu of %lu)\n", wrong, computed);
  fflush(stdout);
  return compute_ok && g_errors == 0 ? 0 : 1;
}
