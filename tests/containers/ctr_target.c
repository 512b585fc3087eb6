// remora_ctr_target: the process that runs inside the container test's root.
//
// Arguments are steps, done in order:
//   dlopen:PATH   dlopen(PATH, RTLD_NOW) and keep the library loaded;
//   mapdata:PATH  map the file PATH again, read-only, as data, twice: once
//                 where the kernel chooses (below the libraries) and once just
//                 above the highest existing mapping of PATH.
// Then it prints "ready <pid>" (its pid as it sees itself, in its own pid
// namespace) on stdout and answers commands read from stdin (see main); it
// exits 0 at end of file.
// A step that fails prints "error <what>" and exits 2.
#define _GNU_SOURCE
#include <dirent.h>
#include <stdatomic.h>
#include <stdint.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static void fail(const char* what, const char* arg, const char* why) {
  printf("error %s %s: %s\n", what, arg, why);
  fflush(stdout);
  exit(2);
}

// End of the highest mapping whose path is `path`, from /proc/self/maps.
static uintptr_t highest_end_of(const char* path) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (f == NULL) fail("open", "/proc/self/maps", strerror(errno));
  char line[4096];
  uintptr_t best = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    uintptr_t start = 0, end = 0;
    int name_at = 0;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &start, &end, &name_at) < 2 ||
        name_at == 0)
      continue;
    char* name = line + name_at;
    name[strcspn(name, "\n")] = '\0';
    if (strcmp(name, path) == 0 && end > best) best = end;
  }
  fclose(f);
  return best;
}

static void map_data(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("open", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) fail("fstat", path, strerror(errno));
  size_t len = (size_t)st.st_size;
  void* low = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
  if (low == MAP_FAILED) fail("mmap", path, strerror(errno));
  uintptr_t above = highest_end_of(path);
  if (above == 0) fail("find mapping of", path, "not in /proc/self/maps");
  long page = sysconf(_SC_PAGESIZE);
  void* high = mmap((void*)(above + 16 * (uintptr_t)page), len, PROT_READ, MAP_PRIVATE, fd, 0);
  if (high == MAP_FAILED) fail("mmap", path, strerror(errno));
  close(fd);
}

// The thread of the "thread" command: it writes its id to `tid_pipe`, then
// blocks reading `block_pipe` and returns at its end of file ("unthread").
static int g_tid_pipe[2] = {-1, -1}, g_block_pipe[2] = {-1, -1};
static pthread_t g_thread;
static void* blocked_thread(void* arg) {
  (void)arg;
  const pid_t tid = (pid_t)syscall(SYS_gettid);
  if (write(g_tid_pipe[1], &tid, sizeof tid) != (ssize_t)sizeof tid) return NULL;
  char c;
  while (read(g_block_pipe[0], &c, 1) < 0 && errno == EINTR) {
  }
  return NULL;
}

static void start_thread(void) {
  if (pipe(g_tid_pipe) != 0 || pipe(g_block_pipe) != 0) fail("pipe", "thread", strerror(errno));
  const int rc = pthread_create(&g_thread, NULL, blocked_thread, NULL);
  if (rc != 0) fail("pthread_create", "thread", strerror(rc));
  pid_t tid = 0;
  if (read(g_tid_pipe[0], &tid, sizeof tid) != (ssize_t)sizeof tid)
    fail("read", "thread's tid", strerror(errno));
  printf("tid %d\n", (int)tid);
}

// The "spin" command's thread: sums the squares of 1..kSpinN in ctr_hot (the
// function a profile of this process must show) over and over, until
// "unspin", counting the rounds and those whose sum is not the closed form's.
enum { kSpinN = 200000 };
static atomic_int g_spin_stop;
static pthread_t g_spinner;
static int g_spinning;
static long g_rounds, g_bad;

__attribute__((noinline)) uint64_t ctr_hot(uint64_t n) {
  uint64_t s = 0;
  for (uint64_t i = 1; i <= n; ++i) {
    s += i * i;
    __asm__ volatile("" : "+r"(s));  // no closed form by the compiler: the loop is the work
  }
  return s;
}

static void* spinner(void* arg) {
  (void)arg;
  const uint64_t n = kSpinN, want = n * (n + 1) * (2 * n + 1) / 6;
  while (!atomic_load(&g_spin_stop)) {
    if (ctr_hot(n) != want) ++g_bad;
    ++g_rounds;
  }
  return NULL;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (strncmp(a, "dlopen:", 7) == 0) {
      if (dlopen(a + 7, RTLD_NOW) == NULL) fail("dlopen", a + 7, dlerror());
    } else if (strncmp(a, "mapdata:", 8) == 0) {
      map_data(a + 8);
    } else {
      fail("unknown step", a, "see ctr_target.c");
    }
  }
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  // Commands, one a line, each answered by lines ending with "end":
  //   ls DIR    the names in DIR as this process sees it (not . and ..), or
  //             "error <why>";
  //   cat FILE  the lines of FILE as this process sees it, or "error <why>";
  //   thread    starts a thread that blocks in read(2) and answers "tid N",
  //             its id in this process's pid namespace (once);
  //   unthread  ends that thread and joins it: once "end" is printed, it is gone;
//   spin      starts a thread computing in ctr_hot (see spinner);
//   unspin    stops it and answers "rounds R bad B".
  char line[4096];
  while (fgets(line, sizeof line, stdin) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    if (strncmp(line, "ls ", 3) == 0) {
      DIR* d = opendir(line + 3);
      if (d == NULL) printf("error %s\n", strerror(errno));
      for (struct dirent* e; d != NULL && (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) printf("%s\n", e->d_name);
      if (d != NULL) closedir(d);
    } else if (strncmp(line, "cat ", 4) == 0) {
      FILE* f = fopen(line + 4, "re");
      if (f == NULL) printf("error %s\n", strerror(errno));
      for (char text[1024]; f != NULL && fgets(text, sizeof text, f) != NULL;) fputs(text, stdout);
      if (f != NULL) fclose(f);
    } else if (strcmp(line, "spin") == 0 && !g_spinning) {
      const int rc = pthread_create(&g_spinner, NULL, spinner, NULL);
      if (rc != 0) fail("pthread_create", "spin", strerror(rc));
      g_spinning = 1;
    } else if (strcmp(line, "unspin") == 0 && g_spinning) {
      atomic_store(&g_spin_stop, 1);
      pthread_join(g_spinner, NULL);
      g_spinning = 0;
      printf("rounds %ld bad %ld\n", g_rounds, g_bad);
    } else if (strcmp(line, "thread") == 0 && g_tid_pipe[0] < 0) {
      start_thread();
    } else if (strcmp(line, "unthread") == 0 && g_block_pipe[1] >= 0) {
      close(g_block_pipe[1]);
      g_block_pipe[1] = -1;
      pthread_join(g_thread, NULL);
    } else {
      printf("error unknown command %s\n", line);
    }
    printf("end\n");
    fflush(stdout);
  }
  return ferror(stdin) ? 3 : 0;
}
