// The aarch64 guest's /init (tests/aarch64/run_guest.py builds the initramfs
// and boots it). It mounts what the suites expect of a Linux system, runs
// each suite of the manifest with its own deadline, prints each one's output
// between markers the runner parses, and powers the guest off. It never
// hangs: every wait has a deadline, a suite past its deadline loses its whole
// process group, and an alarm powers the guest off at the global deadline
// whatever the init is doing.
//
// The manifest (/guest/manifest, written by run_guest.py), one line each,
// fields separated by tabs:
//   deadline <seconds>              the whole run, from the init's start
//   reference <ns>                  the calibration's time on the host
//   suite <name> <timeout> <cwd> [KEY=VALUE]... <argv0> [arg]...
// Markers, each on a line of its own on the console:
//   @@REMORA-GUEST-INIT uptime=<s> kernel=<release> sve=<0|1> sme=<0|1>
//     scale=<guest/host>@@
//
// The guest's speed. The tests' limits (their deadlines and watchdogs,
// tests/harness) are written for the host; TCG runs the same work 10 to 50
// times slower, and more on a slow or loaded host. So the init times a
// fixed mix of what the suites do (arithmetic, system calls, context
// switches through a pipe, forks: calibrate()) and divides by the same mix's
// time on the host, which run_guest.py measures with this very file built
// natively (`remora_guest_init --calibrate` prints it) just before the
// boot. Every suite gets the ratio as REMORA_TEST_TIME_SCALE, which
// stretches each of its deadlines; the suites' own guest deadlines
// (suites.cmake) assume kSuiteDeadlineScale and stretch by what the guest
// is slower than that.
//   @@REMORA-GUEST-BEGIN <name>@@
//   @@REMORA-GUEST-END <name> status=<exit|signal|timeout|notrun|error> code=<n> ms=<n>@@
//   @@REMORA-GUEST-DONE ms=<n>@@
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef HWCAP_SVE
#define HWCAP_SVE (1UL << 22)
#endif
#ifndef HWCAP2_SME
#define HWCAP2_SME (1UL << 23)
#endif

enum { kMaxFields = 128, kMaxManifest = 1 << 20 };

// How much slower than the host suites.cmake's guest deadlines assume the
// guest may be: they stretch only on a guest slower than that.
static const double kSuiteDeadlineScale = 50.0;

static const char* const kBaseEnv[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "TMPDIR=/tmp",
    "USER=root",
    "LOGNAME=root",
    "LANG=C",
    "TERM=dumb",
    "GTEST_COLOR=no",
};

static double g_start;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static long elapsed_ms(double since) { return (long)((now_s() - since) * 1000.0); }

// Unbuffered, to the console: the output of the suites goes there too, and
// the order of the two must be kept.
static void say(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof buf) n = sizeof buf - 1;
  for (int off = 0; off < n;) {
    ssize_t w = write(STDOUT_FILENO, buf + off, (size_t)(n - off));
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    off += (int)w;
  }
}

// --- calibration ---------------------------------------------------------------

// One run of the calibration mix; returns its wall time in ns, or -1 when a
// system call it needs failed. The same code runs natively on the host
// (--calibrate) and here: only their ratio means anything.
static long long calibrate(void) {
  enum { kMix = 2000000, kSyscalls = 20000, kRoundTrips = 2000, kForks = 50 };
  double t0 = now_s();
  volatile uint64_t sink = 0;
  uint64_t a = 0x9e3779b97f4a7c15ULL, b = ~a;
  for (int i = 0; i < kMix; ++i) {
    a = (a ^ (a << 13)) + b;
    b = (b >> 7) ^ (a * 0x2545f4914f6cdd1dULL);
  }
  sink = a ^ b;
  for (int i = 0; i < kSyscalls; ++i) sink += (uint64_t)syscall(SYS_getppid);
  (void)sink;
  // Context switches: a byte to a child and back, through two pipes.
  int down[2], up[2];
  if (pipe(down) != 0) return -1;
  if (pipe(up) != 0) {
    close(down[0]);
    close(down[1]);
    return -1;
  }
  pid_t child = fork();
  if (child == 0) {
    close(down[1]);
    close(up[0]);
    char c;
    while (read(down[0], &c, 1) == 1 && write(up[1], &c, 1) == 1) {
    }
    _exit(0);
  }
  close(down[0]);
  close(up[1]);
  int ok = child > 0;
  for (int i = 0; ok && i < kRoundTrips; ++i) {
    char c = (char)i;
    ok = write(down[1], &c, 1) == 1 && read(up[0], &c, 1) == 1;
  }
  close(down[1]);  // the child reads EOF and exits
  close(up[0]);
  if (child > 0) waitpid(child, NULL, 0);
  for (int i = 0; ok && i < kForks; ++i) {
    pid_t p = fork();
    if (p == 0) _exit(0);
    ok = p > 0 && waitpid(p, NULL, 0) == p;
  }
  return ok ? (long long)((now_s() - t0) * 1e9) : -1;
}

// The fastest of `runs` runs: what the machine can do, not what a neighbour
// took from it meanwhile.
static long long calibrate_best(int runs) {
  long long best = -1;
  for (int i = 0; i < runs; ++i) {
    long long ns = calibrate();
    if (ns > 0 && (best < 0 || ns < best)) best = ns;
  }
  return best;
}

static void power_off(void) {
  sync();
  reboot(RB_POWER_OFF);
  // reboot() failed: exiting PID 1 panics the kernel, and panic=-1 with
  // qemu's -no-reboot ends the guest all the same.
  _exit(1);
}

// The global deadline's backstop: whatever the init is blocked in.
static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "\n@@REMORA-GUEST-DONE status=deadline@@\n";
  if (write(STDOUT_FILENO, msg, sizeof msg - 1) < 0) {
  }
  power_off();
}

static void mount_one(const char* source, const char* target, const char* type, unsigned long flags,
                      const char* data) {
  mkdir(target, 0755);
  if (mount(source, target, type, flags, data) != 0)
    say("guest init: mount %s on %s: %s\n", type, target, strerror(errno));
}

// A build tree under /tmp (or /run) is in the initramfs at its own path: a
// tmpfs there would hide it, and the initramfs's root is writable anyway.
static void mount_scratch(const char* dir, const char* data) {
  DIR* d = opendir(dir);
  int empty = 1;
  if (d) {
    for (struct dirent* e; (e = readdir(d)) != NULL;)
      if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = 0;
    closedir(d);
  }
  if (empty)
    mount_one("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, data);
  else
    say("guest init: %s holds files of the initramfs: kept, no tmpfs over it\n", dir);
}

static void mount_all(void) {
  mount_one("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mount_one("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  mount_one("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  mount_one("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=620,ptmxmode=666");
  mount_one("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  mount_scratch("/tmp", "mode=1777");
  mount_scratch("/run", "mode=0755");
}

// The kernel gives /init the console as 0, 1 and 2 when the initramfs has
// /dev/console; if it did not, take it from devtmpfs.
static void ensure_console(void) {
  if (fcntl(STDOUT_FILENO, F_GETFD) != -1) return;
  int fd = open("/dev/console", O_RDWR | O_NOCTTY);
  if (fd < 0) return;
  for (int i = 0; i < 3; ++i) dup2(fd, i);
  if (fd > 2) close(fd);
}

// Some suites talk over 127.0.0.1; bringing lo up is one ioctl.
static void loopback_up(void) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) != 0) say("guest init: lo up: %s\n", strerror(errno));
  }
  close(fd);
}

static void print_init_marker(double scale) {
  char uptime[64] = "?";
  int fd = open("/proc/uptime", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, uptime, sizeof uptime - 1);
    uptime[n > 0 ? n : 0] = '\0';
    char* space = strchr(uptime, ' ');
    if (space) *space = '\0';
    close(fd);
  }
  struct utsname u;
  if (uname(&u) != 0) strcpy(u.release, "?");
  say("\n@@REMORA-GUEST-INIT uptime=%s kernel=%s sve=%d sme=%d scale=%.2f@@\n", uptime, u.release,
      (getauxval(AT_HWCAP) & HWCAP_SVE) != 0, (getauxval(AT_HWCAP2) & HWCAP2_SME) != 0, scale);
}

// Reaps every child (PID 1 inherits the suites' orphans) until `pid` exits
// or `deadline` (monotonic seconds) passes. SIGCHLD is blocked: it is waited
// for with sigtimedwait, never handled. Returns 1 and its status when `pid`
// exited, 0 at the deadline.
static int wait_until(pid_t pid, double deadline, int* status) {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  for (;;) {
    int st;
    pid_t got;
    while ((got = waitpid(-1, &st, WNOHANG)) > 0) {
      if (got == pid) {
        *status = st;
        return 1;
      }
    }
    if (got < 0 && errno == ECHILD) {
      *status = 0;
      return 1;  // Not our child any more: nothing to wait for.
    }
    double left = deadline - now_s();
    if (left <= 0) return 0;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    sigtimedwait(&chld, NULL, &ts);
  }
}

// Splits `line` in place at tabs; returns the number of fields.
static int split_fields(char* line, char** fields, int max) {
  int n = 0;
  for (char* p = line; n < max;) {
    fields[n++] = p;
    char* tab = strchr(p, '\t');
    if (!tab) break;
    *tab = '\0';
    p = tab + 1;
  }
  return n;
}

static int is_env_item(const char* s) {
  if (s[0] == '/' || !(s[0] == '_' || (s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= 'a' && s[0] <= 'z'))) return 0;
  return strchr(s, '=') != NULL;
}

// The child's side: its own session (so that one kill reaches everything it
// started), stdin from /dev/null, the base environment and its own items.
static void exec_suite(const char* cwd, char** env_items, int n_env, char** argv, const char* scale_item) {
  setsid();
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGALRM, SIG_DFL);
  int null_fd = open("/dev/null", O_RDONLY);
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    if (null_fd != STDIN_FILENO) close(null_fd);
  }
  if (chdir(cwd) != 0) {
    say("guest init: chdir %s: %s (is the directory in the initramfs?)\n", cwd, strerror(errno));
    _exit(127);
  }
  char* envp[kMaxFields + 16];
  int n = 0;
  // The suite's own items first: getenv finds the first of two, and a
  // suite's REMORA_TEST_TIME_SCALE overrides the measured one.
  for (int i = 0; i < n_env; ++i) envp[n++] = env_items[i];
  for (size_t i = 0; i < sizeof kBaseEnv / sizeof kBaseEnv[0]; ++i) envp[n++] = (char*)kBaseEnv[i];
  envp[n++] = (char*)scale_item;
  envp[n] = NULL;
  execve(argv[0], argv, envp);
  say("guest init: exec %s: %s (is it, and its loader, in the initramfs?)\n", argv[0], strerror(errno));
  _exit(127);
}

// Runs one manifest "suite" line (fields after "suite"), bounded by its own
// timeout and by the global deadline.
static void run_suite(char** f, int n, double global_deadline, double scale) {
  const char* name = f[0];
  if (n < 4) {
    say("\n@@REMORA-GUEST-BEGIN %s@@\nguest init: manifest line too short\n", name);
    say("\n@@REMORA-GUEST-END %s status=error code=0 ms=0@@\n", name);
    return;
  }
  double left = global_deadline - now_s();
  if (left <= 1) {
    say("\n@@REMORA-GUEST-END %s status=notrun code=0 ms=0@@\n", name);
    return;
  }
  double timeout = atof(f[1]);
  if (scale > kSuiteDeadlineScale) timeout *= scale / kSuiteDeadlineScale;
  if (timeout <= 0 || timeout > left) timeout = left;
  int n_env = 0;
  while (3 + n_env < n - 1 && is_env_item(f[3 + n_env])) ++n_env;
  char** argv = &f[3 + n_env];
  f[n] = NULL;  // split_fields leaves room: argv ends here.

  say("\n@@REMORA-GUEST-BEGIN %s@@\n", name);
  double start = now_s();
  pid_t pid = fork();
  if (pid < 0) {
    say("guest init: fork: %s\n", strerror(errno));
    say("\n@@REMORA-GUEST-END %s status=error code=%d ms=0@@\n", name, errno);
    return;
  }
  char scale_item[64];
  snprintf(scale_item, sizeof scale_item, "REMORA_TEST_TIME_SCALE=%.2f", scale);
  if (pid == 0) exec_suite(f[2], &f[3], n_env, argv, scale_item);

  int status = 0;
  int exited = wait_until(pid, start + timeout, &status);
  if (!exited) {
    say("\nguest init: %s passed its deadline of %.0f s: killing its process group\n", name, timeout);
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    wait_until(pid, now_s() + 10, &status);
  }
  // Whatever the suite left running in its session goes with it.
  kill(-pid, SIGKILL);
  long ms = elapsed_ms(start);
  if (!exited)
    say("\n@@REMORA-GUEST-END %s status=timeout code=0 ms=%ld@@\n", name, ms);
  else if (WIFSIGNALED(status))
    say("\n@@REMORA-GUEST-END %s status=signal code=%d ms=%ld@@\n", name, WTERMSIG(status), ms);
  else
    say("\n@@REMORA-GUEST-END %s status=exit code=%d ms=%ld@@\n", name, WEXITSTATUS(status), ms);
}

// busybox's applets (/bin/sh, env, unshare, rm...) as links, for the suites
// that start them; bounded like a suite.
static void install_busybox(double global_deadline) {
  if (access("/usr/bin/busybox", X_OK) != 0) return;
  pid_t pid = fork();
  if (pid == 0) {
    char* argv[] = {"/usr/bin/busybox", "--install", "-s", NULL};
    char* envp[] = {NULL};
    execve(argv[0], argv, envp);
    _exit(127);
  }
  int status = 0;
  if (pid > 0 && !wait_until(pid, global_deadline < now_s() + 30 ? global_deadline : now_s() + 30, &status)) {
    kill(pid, SIGKILL);
    say("guest init: busybox --install did not finish in time\n");
  }
}

static char* read_manifest(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    say("guest init: open %s: %s\n", path, strerror(errno));
    return NULL;
  }
  char* buf = malloc(kMaxManifest + 1);
  size_t len = 0;
  ssize_t r;
  while (buf && len < kMaxManifest && (r = read(fd, buf + len, kMaxManifest - len)) > 0) len += (size_t)r;
  close(fd);
  if (buf) buf[len] = '\0';
  return buf;
}

int main(int argc, char** argv) {
  g_start = now_s();
  // Built natively, on the host: its half of the speed ratio.
  if (argc == 2 && strcmp(argv[1], "--calibrate") == 0) {
    long long ns = calibrate_best(5);
    if (ns <= 0) return 1;
    printf("%lld\n", ns);
    return 0;
  }
  // SIGCHLD is waited for (sigtimedwait), never delivered.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  signal(SIGALRM, on_alarm);
  // Before the manifest says otherwise: the init on its own never outlives
  // ten minutes.
  alarm(600);

  mount_all();
  ensure_console();
  loopback_up();

  char* manifest = read_manifest("/guest/manifest");
  if (!manifest) {
    print_init_marker(1.0);
    power_off();
  }
  double deadline = g_start + 600;
  double reference_ns = 0;
  // First pass: the deadline, which bounds everything after it, and the
  // host's calibration.
  for (char* line = manifest; line && *line;) {
    if (strncmp(line, "deadline\t", 9) == 0) {
      deadline = g_start + atof(line + 9);
      alarm((unsigned)(deadline - g_start) + 15);
    } else if (strncmp(line, "reference\t", 10) == 0) {
      reference_ns = atof(line + 10);
    }
    char* nl = strchr(line, '\n');
    line = nl ? nl + 1 : NULL;
  }
  // Without the host's half the limits stay as written (scale 1) and the
  // init says so; a guest is never taken for faster than its host.
  double scale = 1.0;
  long long guest_ns = reference_ns > 0 ? calibrate_best(2) : -1;
  if (guest_ns > 0 && guest_ns > reference_ns) scale = (double)guest_ns / reference_ns;
  if (scale > 1000) scale = 1000;
  if (reference_ns <= 0)
    say("guest init: no host calibration in the manifest: the tests' limits are not scaled\n");
  else
    say("guest init: calibration %.1f ms here, %.1f ms on the host: limits x%.2f\n", (double)guest_ns / 1e6,
        reference_ns / 1e6, scale);
  print_init_marker(scale);
  install_busybox(deadline);

  for (char* line = manifest; line && *line;) {
    char* nl = strchr(line, '\n');
    if (nl) *nl = '\0';
    if (strncmp(line, "suite\t", 6) == 0) {
      char* fields[kMaxFields + 1];
      int n = split_fields(line + 6, fields, kMaxFields);
      run_suite(fields, n, deadline, scale);
    }
    line = nl ? nl + 1 : NULL;
  }
  say("\n@@REMORA-GUEST-DONE ms=%ld@@\n", elapsed_ms(g_start));
  power_off();
  return 0;
}
