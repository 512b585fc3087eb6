/* Compiled as C (C11, -Wpedantic -Werror): proves remora/remora.h and
 * rocattach.h are C headers, and calls every function once. Needs no target:
 * each call either succeeds without one or fails in the documented way.
 * Prints "ok" and exits 0, or names the first check that failed. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remora/remora.h"
#include "rocattach.h"

static int failures = 0;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                        \
    }                                                                    \
  } while (0)

static pid_t missing_pid(void) {
  long max = 4194304;
  FILE* f = fopen("/proc/sys/kernel/pid_max", "r");
  if (f) {
    if (fscanf(f, "%ld", &max) != 1) max = 4194304;
    fclose(f);
  }
  return (pid_t)(max + 1);
}

static void remora_api(void) {
  remora_options_t opts;
  remora_agent_state_t st;
  const char* env[] = {"REMORA_C_TEST=1"};
  pid_t missing = missing_pid();
  int i;

  CHECK(strcmp(remora_last_error(), "") == 0);
  CHECK(remora_options_init(&opts) == REMORA_STATUS_SUCCESS);
  CHECK(remora_options_init_sized(&opts, sizeof opts) == REMORA_STATUS_SUCCESS);
  CHECK(opts.size == sizeof opts && opts.timeout_msec == 10000 && !opts.lease && !opts.attach_children);
  opts.tools = "/nonexistent/libtool.so";
  opts.env = env;
  opts.env_count = 1;

  CHECK(remora_attach(missing, &opts) == REMORA_STATUS_NO_SUCH_PROCESS);
  CHECK(strlen(remora_last_error()) > 0);
  CHECK(remora_attach_tree(missing, &opts) == REMORA_STATUS_NO_SUCH_PROCESS);
  CHECK(remora_detach(missing) != REMORA_STATUS_SUCCESS);
  CHECK(remora_detach_tree(missing) == REMORA_STATUS_NO_SUCH_PROCESS);
  CHECK(remora_detach(0) == REMORA_STATUS_SUCCESS); /* nothing attached */

  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK(remora_status(getpid(), &st) == REMORA_STATUS_SUCCESS);
  CHECK(!st.agent_loaded && !st.attached && st.tools[0] == '\0');

  for (i = 0; i <= REMORA_STATUS_LAST; ++i) {
    CHECK(remora_status_name((remora_status_t)i) != NULL);
    CHECK(remora_status_string((remora_status_t)i) != NULL);
  }
  CHECK(strcmp(remora_status_name(REMORA_STATUS_REFUSED), "REMORA_STATUS_REFUSED") == 0);
}

static void rocattach_api(void) {
  uint32_t major = 0, minor = 0, patch = 0;
  rocattach_version_triplet_t v;
  int i;
  pid_t child;

  CHECK(rocattach_get_version(&major, &minor, &patch) == ROCATTACH_STATUS_SUCCESS);
  CHECK(major == ROCATTACH_VERSION_MAJOR && minor == ROCATTACH_VERSION_MINOR &&
        patch == ROCATTACH_VERSION_PATCH);
  CHECK(rocattach_get_version_triplet(&v) == ROCATTACH_STATUS_SUCCESS);
  CHECK(v.major == major && v.minor == minor && v.patch == patch);
  for (i = 0; i < ROCATTACH_STATUS_LAST; ++i) {
    CHECK(rocattach_get_status_name((rocattach_status_t)i) != NULL);
    CHECK(rocattach_get_status_string((rocattach_status_t)i) != NULL);
  }
  CHECK(rocattach_get_status_name(ROCATTACH_STATUS_LAST) == NULL);
  CHECK(rocattach_get_status_string(ROCATTACH_STATUS_LAST) == NULL);

  unsetenv("ROCPROF_ATTACH_TOOL_LIBRARY");
  unsetenv("REMORA_ATTACH_TOOL_LIBRARY");
  /* The process is refused first (it is gone), then the tools (none set):
   * a live child, which nothing touches, gets the second. */
  CHECK(rocattach_attach(missing_pid()) == ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND);
  CHECK(rocattach_attach_tree(missing_pid()) == ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND);
  child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  CHECK(child > 0);
  if (child > 0) {
    CHECK(rocattach_attach(child) == ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT); /* no tool set */
    CHECK(rocattach_attach_tree(child) == ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  }
  setenv("ROCPROF_ATTACH_TOOL_LIBRARY", "/nonexistent/libtool.so", 1);
  CHECK(rocattach_attach(missing_pid()) == ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND);
  CHECK(rocattach_detach_tree(missing_pid()) == ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
  CHECK(rocattach_detach(0) == ROCATTACH_STATUS_SUCCESS);
}

int main(void) {
  remora_api();
  rocattach_api();
  if (failures) return 1;
  puts("ok");
  return 0;
}
