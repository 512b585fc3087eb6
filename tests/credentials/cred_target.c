/* A program that drops its credentials the ways real programs do, for the
 * tests of a preloaded agent (cred_test.py). glibc runs set*id on every
 * thread of the process (its SIGSETXID broadcast) and aborts the process when
 * one thread's call fails where the calling thread's succeeded: a thread the
 * agent started before main, which lacks the per-thread state the main
 * thread set up (PR_SET_KEEPCAPS, capabilities raised with capset), is such
 * a thread.
 *
 *   cred_target MODE UID GID [work]
 *     MODE setpriv: as util-linux setpriv --reuid --regid does it: keepcaps,
 *                   setresuid, capset (CAP_SETGID raised again), setresgid
 *     MODE capng:   as libcap-ng's capng_change_id and capng_apply do it:
 *                   keepcaps, setgroups, setresgid, setresuid, then capset
 *                   keeping only CAP_NET_BIND_SERVICE
 *     MODE plain:   setgroups, setgid, setuid (a daemon's drop)
 *     MODE none:    nothing (started by a launcher that dropped them)
 *   It prints "threads-before=N uid=U gid=G" (N: the threads it had right
 *   before the drop, /proc/self/task), then, with "work", "ready" and burns CPU
 *   in cred_hot() until its standard input closes, printing "sum=S" (checked
 *   against the closed form) before it exits 0. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int count_threads(void) {
  DIR* d = opendir("/proc/self/task");
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

/* capset on the calling thread only (the kernel's capabilities are per
 * thread; glibc does not broadcast capset). */
static int set_caps(uint32_t effective, uint32_t permitted) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[2];
  memset(d, 0, sizeof d);
  d[0].effective = effective;
  d[0].permitted = permitted;
  return (int)syscall(SYS_capset, &h, d);
}

static void die(const char* what) {
  fprintf(stderr, "cred_target: %s: %s\n", what, strerror(errno));
  exit(2);
}

static void drop(const char* mode, uid_t uid, gid_t gid) {
  const uint32_t setids = (1u << CAP_SETUID) | (1u << CAP_SETGID);
  if (strcmp(mode, "setpriv") == 0) {
    if (prctl(PR_SET_KEEPCAPS, 1) != 0) die("PR_SET_KEEPCAPS");
    if (setresuid(uid, uid, uid) != 0) die("setresuid");
    if (set_caps(setids, setids) != 0) die("capset");
    if (setresgid(gid, gid, gid) != 0) die("setresgid");
    if (set_caps(0, 0) != 0) die("capset (drop)");
  } else if (strcmp(mode, "capng") == 0) {
    if (prctl(PR_SET_KEEPCAPS, 1) != 0) die("PR_SET_KEEPCAPS");
    if (setgroups(0, NULL) != 0) die("setgroups");
    if (setresgid(gid, gid, gid) != 0) die("setresgid");
    if (setresuid(uid, uid, uid) != 0) die("setresuid");
    if (prctl(PR_SET_KEEPCAPS, 0) != 0) die("PR_SET_KEEPCAPS 0");
    const uint32_t keep = 1u << CAP_NET_BIND_SERVICE;
    if (set_caps(keep, keep) != 0) die("capset");
  } else if (strcmp(mode, "plain") == 0) {
    if (setgroups(0, NULL) != 0) die("setgroups");
    if (setgid(gid) != 0) die("setgid");
    if (setuid(uid) != 0) die("setuid");
  } else if (strcmp(mode, "none") != 0) {
    fprintf(stderr, "cred_target: unknown mode %s\n", mode);
    exit(2);
  }
}

/* The hot function a profile of this process must show. */
__attribute__((noinline)) uint64_t cred_hot(uint64_t n) {
  uint64_t s = 0;
  for (uint64_t i = 1; i <= n; ++i) s += i;
  __asm__ volatile("" : "+r"(s));
  return s;
}

static int stdin_closed(void) {
  struct pollfd p = {0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return 0;
  char c;
  return read(0, &c, 1) <= 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: cred_target setpriv|capng|plain|none UID GID [work]\n");
    return 2;
  }
  const int before = count_threads();
  drop(argv[1], (uid_t)strtoul(argv[2], NULL, 10), (gid_t)strtoul(argv[3], NULL, 10));
  printf("threads-before=%d uid=%u gid=%u\n", before, (unsigned)getuid(), (unsigned)getgid());
  fflush(stdout);
  if (argc < 5 || strcmp(argv[4], "work") != 0) return 0;
  printf("ready\n");
  fflush(stdout);
  const uint64_t n = 200000;
  for (;;) {
    const uint64_t s = cred_hot(n);
    if (s != n * (n + 1) / 2) {
      printf("sum=%llu wrong\n", (unsigned long long)s);
      return 3;
    }
    if (stdin_closed()) {
      printf("sum=%llu\n", (unsigned long long)s);
      return 0;
    }
  }
}
