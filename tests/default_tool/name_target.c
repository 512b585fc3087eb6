/* remora_default_tool_name_target: a program for names_test.py, which starts
 * copies of it through symlinks, $PATH and execveat to check the name the
 * default tool gives the process. Knows nothing about Remora.
 *
 *   name_target [--retitle]
 *
 * Prints "ready" on stdout, then spins on the CPU (so that a profile has
 * samples) until its stdin closes (the test's end, even when the test dies)
 * or 120 s pass. --retitle first rewrites its argument area to
 * "<argv[0]> *:6379", as setproctitle does (redis-server). */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void retitle(int argc, char** argv) {
  /* The argument strings lie back to back: the area runs from argv[0] to
   * the NUL of the last one. */
  char* start = argv[0];
  char* end = argv[argc - 1] + strlen(argv[argc - 1]);
  char title[4096];
  snprintf(title, sizeof title, "%s *:6379", argv[0]);
  size_t room = (size_t)(end - start);
  size_t n = strlen(title) < room ? strlen(title) : room;
  memcpy(start, title, n);
  memset(start + n, 0, (size_t)(end - start) + 1 - n);
}

static volatile unsigned long sink;

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "--retitle") == 0) retitle(argc, argv);
  printf("ready\n");
  fflush(stdout);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    unsigned long x = sink;
    for (int i = 0; i < 1000000; ++i) x = x * 6364136223846793005ul + 1442695040888963407ul;
    sink = x;
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) {
      char c;
      if (read(0, &c, 1) <= 0) return 0; /* EOF: the test is done */
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec > 120) return 1;
  }
}
