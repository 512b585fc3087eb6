// A target under seccomp, for tests/seccomp/seccomp_test.cc.
//
//   remora_seccomp_target MODE [NR]
//
// MODE (the filters come from libseccomp, default action ALLOW):
//   strict       one thread; prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT)
//   kill-mmap    mmap -> SECCOMP_RET_KILL_PROCESS
//   eperm-mmap   mmap -> SECCOMP_RET_ERRNO(EPERM)
//   kill-tgkill  tgkill -> SECCOMP_RET_KILL_PROCESS
//   allow-all    a filter that allows everything
//   deny-nr NR   system call NR -> SECCOMP_RET_ERRNO(EACCES)
//   strict-main  the main thread strict, a second thread ("worker") not
//
// Protocol, one line each way over stdin/stdout, with read and write only
// (all strict mode allows):
//   target -> test  "ready PID WORKER_TID"   once the mode is in force (WORKER_TID 0: none)
//   test -> target  "ping"   reply "pong N"  N: pings answered so far
//   test -> target  "quit"   (or EOF)        exit 0 (_exit through SYS_exit: strict mode
//                                            forbids exit_group)
// Exported for remote calls (-rdynamic): remora_seccomp_probe(a) = 3*a + 1,
// and remora_seccomp_calls(), the number of probe calls; neither makes a
// system call.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile long probe_calls;

__attribute__((visibility("default"), used, noinline)) long remora_seccomp_probe(long a) {
  probe_calls = probe_calls + 1;
  return 3 * a + 1;
}

__attribute__((visibility("default"), used, noinline)) long remora_seccomp_calls(void) { return probe_calls; }

static void die(const char* what) {
  fprintf(stderr, "seccomp_target: %s: %s\n", what, strerror(errno));
  exit(2);
}

static void put(const char* s) {
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(1, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) syscall(SYS_exit, 3);
    s += w;
    n -= (size_t)w;
  }
}

// Formats without stdio (no allocation, no locks): strict mode allows
// nothing but read and write.
static char* fmt_long(char* p, long v) {
  char tmp[24];
  int n = 0;
  if (v < 0) {
    *p++ = '-';
    v = -v;
  }
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (n > 0) *p++ = tmp[--n];
  *p = '\0';
  return p;
}

static void load(scmp_filter_ctx ctx) {
  if (ctx == NULL) die("seccomp_init");
  int rc = seccomp_load(ctx);
  if (rc != 0) {
    errno = -rc;
    die("seccomp_load");
  }
  seccomp_release(ctx);
}

static void filter_one(int nr, uint32_t action) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == NULL) die("seccomp_init");
  int rc = seccomp_rule_add(ctx, action, nr, 0);
  if (rc != 0) {
    errno = -rc;
    die("seccomp_rule_add");
  }
  load(ctx);
}

static int worker_ready[2];

static void* worker(void* arg) {
  (void)arg;
  long tid = syscall(SYS_gettid);
  if (write(worker_ready[1], &tid, sizeof tid) != sizeof tid) abort();
  for (;;) pause();  // a plainly restartable sleep: the thread a call prefers
  return NULL;
}

// The loop every mode ends in; uses read and write only.
static void serve(void) {
  char line[64];
  size_t len = 0;
  long pings = 0;
  for (;;) {
    char c;
    ssize_t r = read(0, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) syscall(SYS_exit, 0);
    if (c != '\n') {
      if (len < sizeof line - 1) line[len++] = c;
      continue;
    }
    line[len] = '\0';
    len = 0;
    if (strcmp(line, "ping") == 0) {
      char out[40] = "pong ";
      char* e = fmt_long(out + 5, ++pings);
      e[0] = '\n';
      e[1] = '\0';
      put(out);
    } else if (strcmp(line, "quit") == 0) {
      syscall(SYS_exit, 0);
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODE [NR]\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  long worker_tid = 0;
  if (strcmp(mode, "strict-main") == 0) {
    if (pipe(worker_ready) != 0) die("pipe");
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0) die("pthread_create");
    if (read(worker_ready[0], &worker_tid, sizeof worker_tid) != sizeof worker_tid) die("read worker tid");
  }
  char ready[80] = "ready ";
  char* p = fmt_long(ready + 6, (long)getpid());
  *p++ = ' ';
  p = fmt_long(p, worker_tid);
  p[0] = '\n';
  p[1] = '\0';

  if (strcmp(mode, "strict") == 0 || strcmp(mode, "strict-main") == 0) {
    // Seccomp strict mode is per thread: only this one.
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) die("PR_SET_SECCOMP strict");
  } else if (strcmp(mode, "kill-mmap") == 0) {
    filter_one(SCMP_SYS(mmap), SCMP_ACT_KILL_PROCESS);
  } else if (strcmp(mode, "eperm-mmap") == 0) {
    filter_one(SCMP_SYS(mmap), SCMP_ACT_ERRNO(EPERM));
  } else if (strcmp(mode, "kill-tgkill") == 0) {
    filter_one(SCMP_SYS(tgkill), SCMP_ACT_KILL_PROCESS);
  } else if (strcmp(mode, "allow-all") == 0) {
    load(seccomp_init(SCMP_ACT_ALLOW));
  } else if (strcmp(mode, "deny-nr") == 0 && argc > 2) {
    filter_one(atoi(argv[2]), SCMP_ACT_ERRNO(EACCES));
  } else {
    fprintf(stderr, "seccomp_target: unknown mode %s\n", mode);
    return 2;
  }
  put(ready);
  serve();
  return 0;
}
