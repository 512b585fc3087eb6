/* A target for the C API tests: a process tree that waits.
 *
 *   remora-capi-target N [refuse-last]
 *
 * forks N children; every process (parent first, then each child) writes
 * "ready PID\n" to stdout, then blocks reading stdin. When stdin reaches EOF
 * (the test closes its end) every process exits 0; the parent exits 0 only
 * when all its children did, so the test can check the tree still works after
 * attach and detach. Every process dies with its parent (PR_SET_PDEATHSIG).
 * With "refuse-last", the last child re-executes this program with
 * REMORA_TOOL_ATTACH=0 in its environment (and no children): a process in
 * the tree that refuses tools. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

static void say_ready(void) {
  char line[64];
  int n = snprintf(line, sizeof line, "ready %d\n", (int)getpid());
  if (write(STDOUT_FILENO, line, (size_t)n) != n) _exit(3);
}

/* Blocks in read(2) until EOF. */
static void wait_for_eof(void) {
  char buf[64];
  for (;;) {
    ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
    if (n == 0) return;
    if (n < 0) _exit(4);
  }
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 0;
  int refuse_last = argc > 2 && strcmp(argv[2], "refuse-last") == 0;
  pid_t self = getpid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  say_ready();
  for (int i = 0; i < n; ++i) {
    pid_t c = fork();
    if (c < 0) return 5;
    if (c == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != self) _exit(6); /* the parent died before prctl */
      if (refuse_last && i == n - 1) {
        size_t count = 0;
        while (environ[count]) ++count;
        char** env = calloc(count + 2, sizeof *env);
        if (!env) _exit(7);
        memcpy(env, environ, count * sizeof *env);
        env[count] = "REMORA_TOOL_ATTACH=0";
        char* args[] = {argv[0], "0", NULL};
        execve("/proc/self/exe", args, env);
        _exit(8);
      }
      say_ready();
      wait_for_eof();
      _exit(0);
    }
  }
  wait_for_eof();
  int ok = 1;
  for (int i = 0; i < n; ++i) {
    int st = 0;
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0;
  }
  return ok ? 0 : 1;
}
