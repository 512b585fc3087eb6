/* The libtnfctl-shaped C API, from plain C: the two scenarios of the
 * libtnfctl man pages and the error codes. Exit status 0 when all pass. */
#define _GNU_SOURCE
#include "remora/compat/tnfctl.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(c)                                                                                      \
  do {                                                                                                \
    if (!(c)) {                                                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, #c, tnfctl_last_error()); \
      ++failures;                                                                                     \
    }                                                                                                 \
  } while (0)

static char dir[64];
static int has(const char* m) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", dir, m);
  return access(p, F_OK) == 0;
}

/* Man page scenario 1: start a program that execs, and when it execs let it
 * run on without control. */
static void scenario_resume_on_exec(void) {
  char* argv[] = {CTL_PROG, "exec", NULL};
  tnfctl_handle_t* h = NULL;
  CHECK(tnfctl_exec_open(CTL_PROG, argv, NULL, NULL, CTL_PRELOAD, &h) == TNFCTL_ERR_NONE);
  if (h == NULL) return;
  CHECK(!has("exe_ctor") && !has("preload_ctor"));
  pid_t pid = tnfctl_pid(h);
  tnfctl_event_t ev;
  for (int i = 0; i < 100; ++i) {
    CHECK(tnfctl_continue(h, &ev, NULL) == TNFCTL_ERR_NONE);
    if (ev == TNFCTL_EVENT_EXEC || ev == TNFCTL_EVENT_TARGGONE) break;
  }
  CHECK(ev == TNFCTL_EVENT_EXEC);
  CHECK(tnfctl_close(h, TNFCTL_TARG_RESUME) == TNFCTL_ERR_NONE);
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 5);
}

/* Man page scenario 2: control the child of a fork through its own handle. */
static void scenario_fork_child(void) {
  char* argv[] = {CTL_PROG, "fork", CTL_PLUGIN, NULL};
  tnfctl_handle_t *h = NULL, *child = NULL;
  CHECK(tnfctl_exec_open(CTL_PROG, argv, NULL, NULL, NULL, &h) == TNFCTL_ERR_NONE);
  if (h == NULL) return;
  tnfctl_event_t ev;
  CHECK(tnfctl_continue(h, &ev, &child) == TNFCTL_ERR_NONE);
  CHECK(ev == TNFCTL_EVENT_FORK);
  CHECK(child != NULL);
  if (child != NULL) {
    int opens = 0;
    for (int i = 0; i < 100; ++i) {
      CHECK(tnfctl_continue(child, &ev, NULL) == TNFCTL_ERR_NONE);
      if (ev == TNFCTL_EVENT_DLOPEN) ++opens;
      if (ev == TNFCTL_EVENT_EXIT || ev == TNFCTL_EVENT_TARGGONE) break;
    }
    CHECK(ev == TNFCTL_EVENT_EXIT);
    CHECK(opens == 3);
    int st = -1;
    CHECK(tnfctl_exit_status(child, &st) == TNFCTL_ERR_NONE && WIFEXITED(st) && WEXITSTATUS(st) == 3);
    CHECK(tnfctl_close(child, TNFCTL_TARG_DEFAULT) == TNFCTL_ERR_NONE);
  }
  for (int i = 0; i < 100; ++i) {
    CHECK(tnfctl_continue(h, &ev, NULL) == TNFCTL_ERR_NONE);
    if (ev == TNFCTL_EVENT_EXIT || ev == TNFCTL_EVENT_TARGGONE) break;
  }
  CHECK(ev == TNFCTL_EVENT_EXIT);
  int st = -1;
  CHECK(tnfctl_exit_status(h, &st) == TNFCTL_ERR_NONE && WIFEXITED(st) && WEXITSTATUS(st) == 3);
  CHECK(tnfctl_continue(h, &ev, NULL) == TNFCTL_ERR_NONE && ev == TNFCTL_EVENT_TARGGONE);
  CHECK(tnfctl_close(h, TNFCTL_TARG_DEFAULT) == TNFCTL_ERR_NONE);
}

static void errors(void) {
  tnfctl_handle_t* h = NULL;
  CHECK(tnfctl_pid_open(getpid(), &h) == TNFCTL_ERR_BADARG && h == NULL);
  pid_t c = fork();
  if (c == 0) _exit(0);
  waitpid(c, NULL, 0);
  CHECK(tnfctl_pid_open(c, &h) == TNFCTL_ERR_NOPROCESS);
  CHECK(tnfctl_exec_open("remora-no-such-program-xyz", NULL, NULL, NULL, NULL, &h) ==
        TNFCTL_ERR_FILENOTFOUND);
  CHECK(tnfctl_exec_open(CTL_STATIC, NULL, NULL, NULL, NULL, &h) == TNFCTL_ERR_NOTDYNAMIC);
  CHECK(tnfctl_exec_open(CTL_PROG, NULL, NULL, "/nonexistent", NULL, &h) == TNFCTL_ERR_NOLIBTNFPROBE);
  /* BUSY: a second handle on a process already held. */
  char* argv[] = {CTL_PROG, "loop", NULL};
  CHECK(tnfctl_exec_open(CTL_PROG, argv, NULL, NULL, NULL, &h) == TNFCTL_ERR_NONE);
  if (h != NULL) {
    tnfctl_handle_t* h2 = NULL;
    CHECK(tnfctl_pid_open(tnfctl_pid(h), &h2) == TNFCTL_ERR_BUSY);
    pid_t pid = tnfctl_pid(h);
    CHECK(tnfctl_close(h, TNFCTL_TARG_DEFAULT) == TNFCTL_ERR_NONE); /* launched: killed */
    CHECK(kill(pid, 0) != 0);
  }
  CHECK(strcmp(tnfctl_strerror(TNFCTL_ERR_BUSY), "") != 0);
}

int main(void) {
  strcpy(dir, "/tmp/remora-tnfctl-XXXXXX");
  if (mkdtemp(dir) == NULL) return 2;
  setenv("CTL_DIR", dir, 1);
  alarm(50); /* watchdog */
  scenario_resume_on_exec();
  scenario_fork_child();
  errors();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
  if (failures == 0) printf("tnfctl: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
