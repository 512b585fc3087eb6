/* remora_cli_target: a small process tree for the `remora` end-to-end tests
 * (cli_test.py). Knows nothing about Remora.
 *
 *   remora_cli_target CHILDREN READY_FILE [EXIT_AFTER_MS EXIT_CODE]
 *
 * Forks CHILDREN children that wait in pause() until SIGTERM, then writes
 * "<pid> <child pid>...\n" to READY_FILE (atomically: a temporary file
 * renamed over it). The parent waits in sigtimedwait: on SIGTERM or SIGINT,
 * or after EXIT_AFTER_MS, it stops its children, reaps them and exits with
 * EXIT_CODE (0 by default). A child killed by anything but SIGTERM makes
 * the parent exit 99. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) {
    fprintf(stderr, "usage: %s CHILDREN READY_FILE [EXIT_AFTER_MS EXIT_CODE]\n", argv[0]);
    return 2;
  }
  int children = atoi(argv[1]);
  long exit_after_ms = argc == 5 ? atol(argv[3]) : -1;
  int exit_code = argc == 5 ? atoi(argv[4]) : 0;
  if (children < 0 || children > 64) return 2;

  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigset_t old;
  sigprocmask(SIG_BLOCK, &stop, &old);

  pid_t kids[64];
  for (int i = 0; i < children; ++i) {
    kids[i] = fork();
    if (kids[i] < 0) {
      perror("fork");
      return 2;
    }
    if (kids[i] == 0) {
      sigprocmask(SIG_SETMASK, &old, NULL);
      for (;;) pause();
    }
  }

  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]);
  FILE* f = fopen(tmp, "w");
  if (!f) {
    perror(tmp);
    return 2;
  }
  fprintf(f, "%d", (int)getpid());
  for (int i = 0; i < children; ++i) fprintf(f, " %d", (int)kids[i]);
  fprintf(f, "\n");
  if (fclose(f) != 0 || rename(tmp, argv[2]) != 0) {
    perror(argv[2]);
    return 2;
  }

  struct timespec ts = {exit_after_ms / 1000, (exit_after_ms % 1000) * 1000000L};
  for (;;) {
    int sig = sigtimedwait(&stop, NULL, exit_after_ms >= 0 ? &ts : NULL);
    if (sig > 0 || errno == EAGAIN) break;
  }
  int rc = exit_code;
  for (int i = 0; i < children; ++i) kill(kids[i], SIGTERM);
  for (int i = 0; i < children; ++i) {
    int status = 0;
    while (waitpid(kids[i], &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGTERM) rc = 99;
  }
  return rc;
}
