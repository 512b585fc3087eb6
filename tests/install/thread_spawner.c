/* The install test's target: a plain program (nothing of Remora's) that
 * creates a short-lived thread every 100 ms, so the example tool has threads
 * to count. It writes "ready" to the file named by argv[1] once running, and
 * on SIGTERM stops, checks that every thread it created ran and was joined,
 * prints "spawned N" and exits 0 (1 if a check failed). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_stop;
static void on_term(int sig) {
  (void)sig;
  g_stop = 1;
}

static void* short_lived(void* arg) {
  struct timespec d = {0, 150 * 1000 * 1000};
  while (nanosleep(&d, &d) != 0 && errno == EINTR) {
  }
  ++*(int*)arg;
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s READY_FILE\n", argv[0]);
    return 2;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, NULL);

  int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, "ready\n", 6) != 6 || close(fd) != 0) {
    perror("thread_spawner: ready file");
    return 1;
  }
  int spawned = 0, ran = 0, errors = 0;
  while (!g_stop) {
    int done = 0;
    pthread_t t;
    if (pthread_create(&t, NULL, short_lived, &done) != 0) {
      ++errors;
    } else {
      ++spawned;
      if (pthread_join(t, NULL) != 0 || done != 1) ++errors;
      ran += done;
    }
    struct timespec d = {0, 100 * 1000 * 1000};
    nanosleep(&d, NULL); /* EINTR from SIGTERM ends the wait early: fine */
  }
  printf("spawned %d ran %d errors %d\n", spawned, ran, errors);
  return errors == 0 && ran == spawned && spawned > 0 ? 0 : 1;
}
