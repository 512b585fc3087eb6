// The program the control tests launch or open. Its behaviour is chosen by
// argv[1]; markers are files in $CTL_DIR, written by its constructor and main.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

static void marker(const char* name) {
  const char* dir = getenv("CTL_DIR");
  if (dir == nullptr) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, "x\n", 2);
    close(fd);
  }
}

__attribute__((constructor)) static void exe_ctor() { marker("exe_ctor"); }

static const char* g_plugin = nullptr;

static int dl_cycle(int n) {
  for (int i = 0; i < n; ++i) {
    void* h = dlopen(g_plugin, RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return 10;
    auto fn = reinterpret_cast<int (*)(int)>(dlsym(h, "ctl_plugin_twice"));
    if (fn == nullptr || fn(i) != 2 * i) return 11;
    dlclose(h);
  }
  return 0;
}

static std::atomic<long> g_sum{0};
static void* worker(void* arg) {
  long id = reinterpret_cast<long>(arg);
  long local = 0;
  for (long i = 0; i < 3000000; ++i) local += (i ^ id) & 7;
  g_sum += local;
  return nullptr;
}

// The tests' signal window (SignalSentByKillDuringCallIsNotAFault): called
// through Process::call, which blocks every signal; this unblocks them, says
// it runs (marker "in_call"), waits for the marker "go_on" (at most 10 s) and
// returns 42. A SIGSEGV that reaches the handler is recorded, and main's loop
// reports it with the marker "segv_handled".
static volatile sig_atomic_t g_segv_seen = 0;
static void on_segv(int) { g_segv_seen = 1; }
static bool has_marker(const char* name) {
  const char* dir = getenv("CTL_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir ? dir : ".", name);
  return access(path, F_OK) == 0;
}
// Process::call's argument passing, in order: a0 is the number of arguments
// the caller passed (at most 8); returns the sum of i * a_i over the others,
// so that any argument missing, swapped or shifted changes the result.
extern "C" __attribute__((used, noinline, visibility("default"))) long ctl_weighted_args(long n, long a1,
                                                                                         long a2, long a3,
                                                                                         long a4, long a5,
                                                                                         long a6, long a7) {
  const long a[] = {n, a1, a2, a3, a4, a5, a6, a7};
  long sum = 0;
  for (long i = 1; i < n && i < 8; ++i) sum += i * a[i];
  return sum;
}
extern "C" __attribute__((used, noinline, visibility("default"))) long ctl_signal_window(void) {
  struct sigaction sa {};
  sa.sa_handler = on_segv;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGSEGV, &sa, nullptr);
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  marker("in_call");
  for (int i = 0; i < 10000 && !has_marker("go_on"); ++i) usleep(1000);
  return 42;
}

static void* parked_thread(void*) {
  for (;;) pause();
  return nullptr;
}

static char* g_self;
static void* exec_thread(void*) {
  char* args[] = {g_self, const_cast<char*>("exit"), const_cast<char*>("5"), nullptr};
  execv(g_self, args);
  _exit(99);
}

int main(int argc, char** argv) {
  marker("main");
  g_self = argv[0];
  const char* mode = argc > 1 ? argv[1] : "exit";
  if (strcmp(mode, "exit") == 0) return argc > 2 ? atoi(argv[2]) : 0;
  if (strcmp(mode, "dl") == 0) {  // dl N plugin
    g_plugin = argv[3];
    return dl_cycle(atoi(argv[2]));
  }
  if (strcmp(mode, "fork") == 0) {  // fork plugin: child dlopens (breakpoints must be stripped)
    g_plugin = argv[2];
    pid_t c = fork();
    if (c == 0) {
      marker("child");
      _exit(dl_cycle(3) == 0 ? 3 : 4);
    }
    int st = 0;
    waitpid(c, &st, 0);
    if (dl_cycle(1) != 0) return 20;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
  }
  if (strcmp(mode, "vforkexec") == 0) {  // vforkexec plugin
    g_plugin = argv[2];
    pid_t c = vfork();
    if (c == 0) {
      char* args[] = {g_self, const_cast<char*>("exit"), const_cast<char*>("6"), nullptr};
      execv(g_self, args);
      _exit(99);
    }
    int st = 0;
    waitpid(c, &st, 0);
    if (dl_cycle(2) != 0) return 20;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
  }
  if (strcmp(mode, "exec") == 0) {
    char* args[] = {g_self, const_cast<char*>("exit"), const_cast<char*>("5"), nullptr};
    execv(g_self, args);
    return 99;
  }
  if (strcmp(mode, "threadexec") == 0) {
    pthread_t t;
    pthread_create(&t, nullptr, exec_thread, nullptr);
    pause();
    return 98;
  }
  if (strcmp(mode, "kill") == 0) raise(SIGKILL);
  if (strcmp(mode, "term") == 0) raise(SIGTERM);
  if (strcmp(mode, "threadloop") == 0) {  // as loop, with a second thread parked in pause()
    pthread_t t;
    pthread_create(&t, nullptr, parked_thread, nullptr);
    mode = "loop";
  }
  if (strcmp(mode, "loop") == 0) {  // loop [plugin]: ready marker, then dlopen when asked
    g_plugin = argc > 2 ? argv[2] : nullptr;
    marker("ready");
    for (;;) {
      usleep(2000);
      const char* dir = getenv("CTL_DIR");
      char path[4096];
      snprintf(path, sizeof path, "%s/go", dir ? dir : ".");
      if (g_plugin != nullptr && access(path, F_OK) == 0) {
        unlink(path);
        if (dl_cycle(1) != 0) return 30;
        marker("cycled");
      }
      if (g_segv_seen) {
        g_segv_seen = 0;
        marker("segv_handled");
      }
      snprintf(path, sizeof path, "%s/quit", dir ? dir : ".");
      if (access(path, F_OK) == 0) {
        marker("quit_seen");
        return 0;
      }
    }
  }
  if (strcmp(mode, "threads") == 0) {  // threads N plugin
    int n = atoi(argv[2]);
    g_plugin = argv[3];
    pthread_t t[64];
    long expect = 0;
    for (long id = 0; id < n; ++id) {
      long local = 0;
      for (long i = 0; i < 3000000; ++i) local += (i ^ id) & 7;
      expect += local;
      pthread_create(&t[id], nullptr, worker, reinterpret_cast<void*>(id));
    }
    if (dl_cycle(150) != 0) return 42;  // while the workers compute
    for (int i = 0; i < n; ++i) {
      void* r;
      pthread_join(t[i], &r);
      if (r != nullptr) return 40;
    }
    return g_sum.load() == expect ? 0 : 41;
  }
  return 2;
}
