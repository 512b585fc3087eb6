/*
 * librss-sampler.so — an example Remora tool (docs/writing-a-tool.md).
 *
 * While attached, a thread of the tool ("rss-sampler", every signal blocked)
 * wakes every RSS_SAMPLER_INTERVAL_MS milliseconds and reads, from /proc,
 * the process's resident set size and its list of threads. At detach it
 * writes a small report:
 *
 *   rss-sampler report
 *   pid 4242
 *   session 1
 *   duration_ms 5003
 *   interval_ms 100
 *   samples 50
 *   rss_kib_first 10240
 *   rss_kib_last 10496
 *   rss_kib_min 10240
 *   rss_kib_max 11008
 *   rss_kib_mean 10612
 *   threads_at_attach 8
 *   threads_max 9
 *   threads_created 3
 *
 * threads_created counts thread ids that were not there at attach and were
 * seen by a later sample (the tool's own thread excluded; Remora's lease
 * thread, started when the controller holds a lease, is counted): a thread
 * that starts and ends between two samples is missed (lower the interval to
 * see short-lived threads).
 *
 * Settings, read at each attach from the environment (pass them with
 * `remora attach -e NAME=VALUE`, or env= in Python):
 *
 *   RSS_SAMPLER_OUTPUT       the report's path; default
 *                            rss-sampler-<pid>-s<session>.txt in the target's
 *                            current directory. Written to PATH.tmp, then
 *                            renamed, so a reader never sees half a report.
 *   RSS_SAMPLER_INTERVAL_MS  1 to 60000, default 100.
 *
 * Return codes of tool_attach/tool_detach (the attach or detach command
 * prints them): 1 bad setting, 2 out of memory, 3 cannot start the thread,
 * 4 attach while attached or detach while detached, 5 cannot write the
 * report.
 *
 * Threads (include/remora/tool.h): remora_configure*, tool_init, tool_attach
 * and tool_detach run on the agent's listener thread, one at a time;
 * tool_detach may also run on the thread that calls exit() (the process
 * exits while attached) or on the agent's lease thread (the controller died
 * while attached). tool_fini runs on the exiting thread. Only the sampler
 * thread and those callbacks touch g_tool; the callbacks never overlap, and
 * the sampler's results are read only after it has been joined.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "remora/tool.h"

#define EXPORT __attribute__((visibility("default")))

enum { kErrSetting = 1, kErrNoMemory = 2, kErrThread = 3, kErrState = 4, kErrWrite = 5 };

/* Thread ids seen during a session: a growable, unsorted array (a few
 * hundred entries for most processes; lookups are linear and cheap next to
 * reading /proc). */
struct tid_set {
  pid_t* v;
  size_t n, cap;
};

struct session {
  /* Settings, copied at attach: getenv's pointers may be invalidated by a
   * later setenv of the application. */
  char output[4096];
  unsigned interval_ms;
  pid_t pid;
  uint64_t session;
  struct timespec start, end;
  /* Results, written by the sampler thread only, read after it is joined. */
  uint64_t samples;
  long rss_first, rss_last, rss_min, rss_max;
  double rss_sum;
  size_t threads_at_attach, threads_max, threads_created;
  struct tid_set seen;
  int error; /* errno of a failed /proc read, 0 if none */
};

struct tool {
  int attached;
  int wake_fd; /* eventfd: tool_detach writes it to stop the sampler */
  pthread_t sampler;
  pid_t sampler_pid; /* getpid() when the sampler started (see fork below) */
  struct session s;
};

static struct tool g_tool = {.wake_fd = -1};

/* --- /proc readers --------------------------------------------------------- */

/* Resident set size in KiB from /proc/self/statm (pages), or -1. Raw
 * open/read rather than stdio: no FILE lock shared with the application. */
static long read_rss_kib(void) {
  char buf[256];
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  unsigned long size = 0, resident = 0;
  if (sscanf(buf, "%lu %lu", &size, &resident) != 2) return -1;
  return (long)(resident * (unsigned long)sysconf(_SC_PAGESIZE) / 1024);
}

static int tid_set_has(const struct tid_set* set, pid_t tid) {
  for (size_t i = 0; i < set->n; ++i)
    if (set->v[i] == tid) return 1;
  return 0;
}

/* 0, or ENOMEM. */
static int tid_set_add(struct tid_set* set, pid_t tid) {
  if (set->n == set->cap) {
    size_t cap = set->cap ? set->cap * 2 : 64;
    pid_t* v = realloc(set->v, cap * sizeof *v);
    if (!v) return ENOMEM;
    set->v = v;
    set->cap = cap;
  }
  set->v[set->n++] = tid;
  return 0;
}

/* Lists /proc/self/task: adds the new tids to s->seen (counting them in
 * threads_created unless `initial`) and returns the number of threads, or
 * -errno. */
static long scan_threads(struct session* s, int initial) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return -errno;
  long count = 0;
  int rc = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    pid_t tid = (pid_t)atoi(e->d_name);
    ++count;
    if (tid_set_has(&s->seen, tid)) continue;
    if ((rc = tid_set_add(&s->seen, tid)) != 0) break;
    if (!initial) ++s->threads_created;
  }
  closedir(d);
  return rc ? -rc : count;
}

static void take_sample(struct session* s) {
  long rss = read_rss_kib();
  long threads = scan_threads(s, 0);
  if (rss < 0 || threads < 0) {
    if (!s->error) s->error = threads < 0 ? (int)-threads : EIO;
    return;
  }
  if (s->samples == 0) s->rss_first = s->rss_min = s->rss_max = rss;
  if (rss < s->rss_min) s->rss_min = rss;
  if (rss > s->rss_max) s->rss_max = rss;
  s->rss_last = rss;
  s->rss_sum += (double)rss;
  if ((size_t)threads > s->threads_max) s->threads_max = (size_t)threads;
  ++s->samples;
}

/* --- the sampler thread ---------------------------------------------------- */

static void* sampler_main(void* arg) {
  struct tool* t = arg;
  /* Named so that it is recognisable in top -H, /proc and the default tool's
   * reports. */
  pthread_setname_np(pthread_self(), "rss-sampler");
  /* Our own thread is not one the application created. The attach already
   * scanned the threads, before this one existed; only this thread touches
   * the set until it is joined. */
  if (tid_set_add(&t->s.seen, gettid()) != 0) t->s.error = ENOMEM;
  for (;;) {
    take_sample(&t->s);
    /* Sleep until the next sample or until tool_detach wakes us. poll()
     * cannot be interrupted by a signal here: the thread blocks them all. */
    struct pollfd p = {.fd = t->wake_fd, .events = POLLIN};
    int n = poll(&p, 1, (int)t->s.interval_ms);
    if (n > 0) break;
    if (n < 0 && errno != EINTR) break;
  }
  take_sample(&t->s); /* the state at detach */
  return NULL;
}

/* Starts the sampler with every signal blocked: it inherits the mask of the
 * creating thread, and a tool thread must never take a signal meant for the
 * application (a SIGTERM it waits for with sigwait, a SIGINT, a timer). */
static int start_sampler(struct tool* t) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&t->sampler, NULL, sampler_main, t);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) return rc;
  t->sampler_pid = getpid();
  return 0;
}

/* Stops and joins the sampler. After fork() the child has no sampler (fork
 * copies only the calling thread) but inherits our state, still "attached":
 * joining the parent's thread would be undefined, so the child skips it, and
 * its report holds the parent's samples up to the fork. */
static void stop_sampler(struct tool* t) {
  if (t->sampler_pid != getpid()) return;
  uint64_t one = 1;
  (void)!write(t->wake_fd, &one, sizeof one);
  pthread_join(t->sampler, NULL);
  uint64_t drain;
  (void)!read(t->wake_fd, &drain, sizeof drain); /* re-arm for the next session */
}

/* --- settings -------------------------------------------------------------- */

/* 0, or kErrSetting with a message on stderr naming the variable. */
static int read_settings(struct session* s) {
  const char* interval = getenv("RSS_SAMPLER_INTERVAL_MS");
  s->interval_ms = 100;
  if (interval && *interval) {
    char* end = NULL;
    errno = 0;
    long v = strtol(interval, &end, 10);
    if (errno || *end || v < 1 || v > 60000) {
      fprintf(stderr, "rss-sampler: RSS_SAMPLER_INTERVAL_MS=%s: want milliseconds, 1 to 60000\n", interval);
      return kErrSetting;
    }
    s->interval_ms = (unsigned)v;
  }
  const char* output = getenv("RSS_SAMPLER_OUTPUT");
  int n = output && *output ? snprintf(s->output, sizeof s->output, "%s", output)
                            : snprintf(s->output, sizeof s->output, "rss-sampler-%d-s%llu.txt", (int)s->pid,
                                       (unsigned long long)s->session);
  if (n < 0 || (size_t)n >= sizeof s->output) {
    fprintf(stderr, "rss-sampler: RSS_SAMPLER_OUTPUT is too long\n");
    return kErrSetting;
  }
  return 0;
}

/* --- the report ------------------------------------------------------------ */

static long elapsed_ms(const struct timespec* a, const struct timespec* b) {
  return (long)((b->tv_sec - a->tv_sec) * 1000 + (b->tv_nsec - a->tv_nsec) / 1000000);
}

/* Writes PATH.tmp then renames it over PATH: 0, or kErrWrite. */
static int write_report(const struct session* s) {
  char tmp[sizeof s->output + 8];
  snprintf(tmp, sizeof tmp, "%s.tmp", s->output);
  FILE* f = fopen(tmp, "we");
  if (!f) {
    fprintf(stderr, "rss-sampler: cannot write %s: %s\n", tmp, strerror(errno));
    return kErrWrite;
  }
  long mean = s->samples ? (long)(s->rss_sum / (double)s->samples + 0.5) : 0;
  fprintf(f,
          "rss-sampler report\n"
          "pid %d\nsession %llu\nduration_ms %ld\ninterval_ms %u\nsamples %llu\n"
          "rss_kib_first %ld\nrss_kib_last %ld\nrss_kib_min %ld\nrss_kib_max %ld\nrss_kib_mean %ld\n"
          "threads_at_attach %zu\nthreads_max %zu\nthreads_created %zu\n",
          (int)s->pid, (unsigned long long)s->session, elapsed_ms(&s->start, &s->end), s->interval_ms,
          (unsigned long long)s->samples, s->rss_first, s->rss_last, s->rss_min, s->rss_max, mean,
          s->threads_at_attach, s->threads_max, s->threads_created);
  if (s->error) fprintf(f, "error reading /proc: %s\n", strerror(s->error));
  int bad = ferror(f);
  if (fclose(f) != 0 || bad || rename(tmp, s->output) != 0) {
    fprintf(stderr, "rss-sampler: cannot write %s: %s\n", s->output, strerror(errno));
    unlink(tmp);
    return kErrWrite;
  }
  return 0;
}

/* --- the tool ABI ---------------------------------------------------------- */

/* Once, before the first tool_attach. Nothing to prepare but the eventfd
 * (kept for the life of the process: sessions reuse it). */
static int tool_init(void* data) {
  struct tool* t = data;
  t->wake_fd = eventfd(0, EFD_CLOEXEC);
  return t->wake_fd < 0 ? kErrThread : 0;
}

static int tool_attach(void* data, const remora_tool_info_t* info) {
  struct tool* t = data;
  if (t->attached) return kErrState;
  struct tid_set seen = t->s.seen; /* the buffer is reused across sessions */
  memset(&t->s, 0, sizeof t->s);
  t->s.seen = seen;
  t->s.seen.n = 0;
  t->s.pid = getpid();
  /* Size-prefixed struct: read a field only when the agent's struct has it
   * (an agent older than this header may pass a shorter one). */
  if (info->size >= offsetof(remora_tool_info_t, session) + sizeof info->session)
    t->s.session = info->session;
  int rc = read_settings(&t->s);
  if (rc) return rc;
  long threads = scan_threads(&t->s, 1);
  if (threads < 0) return threads == -ENOMEM ? kErrNoMemory : kErrThread;
  t->s.threads_at_attach = t->s.threads_max = (size_t)threads;
  clock_gettime(CLOCK_MONOTONIC, &t->s.start);
  if (start_sampler(t) != 0) return kErrThread;
  t->attached = 1;
  return 0;
}

static int tool_detach(void* data, const remora_tool_info_t* info) {
  (void)info;
  struct tool* t = data;
  if (!t->attached) return kErrState;
  stop_sampler(t);
  t->attached = 0;
  clock_gettime(CLOCK_MONOTONIC, &t->s.end);
  return write_report(&t->s);
}

/* At process exit (after tool_detach if the process exits while attached):
 * free what is ours. No thread is created or waited for here. */
static void tool_fini(void* data) {
  struct tool* t = data;
  free(t->s.seen.v);
  t->s.seen.v = NULL;
  t->s.seen.n = t->s.seen.cap = 0;
  if (t->wake_fd >= 0) close(t->wake_fd);
  t->wake_fd = -1;
}

/* Static: owned by the tool, valid until tool_fini returns (tool.h). */
static remora_tool_configure_result_t g_configure = {
    .size = sizeof(remora_tool_configure_result_t),
    .tool_init = tool_init,
    .tool_fini = tool_fini,
    .tool_data = &g_tool,
};
static remora_tool_configure_attach_result_t g_configure_attach = {
    .size = sizeof(remora_tool_configure_attach_result_t),
    .tool_attach = tool_attach,
    .tool_detach = tool_detach,
};

/* The two exported entry points; everything else is hidden
 * (-fvisibility=hidden), so the tool's names never clash with the
 * application's. An agent with an older ABI version would still call these
 * the same way: version 1 is the only one so far. */
EXPORT remora_tool_configure_result_t* remora_configure(uint32_t abi_version,
                                                        const remora_tool_info_t* info) {
  (void)info;
  if (abi_version < 1) return NULL;
  return &g_configure;
}

EXPORT remora_tool_configure_attach_result_t* remora_configure_attach(uint32_t abi_version,
                                                                      const remora_tool_info_t* info) {
  (void)abi_version;
  (void)info;
  return &g_configure_attach;
}
