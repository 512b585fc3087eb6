/* capi_attach PID TOOL MSEC [NAME=VALUE...]: attaches TOOL to process PID
 * (alone) with the C API of an installed libremora.so, checks the agent's
 * state, waits MSEC milliseconds and detaches. Exit 0 on success; on failure
 * prints remora_last_error() and exits 1. Built by the install test against
 * the installed tree, once with pkg-config and once with find_package. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "remora/remora.h"

static int fail(const char* what, remora_status_t st) {
  fprintf(stderr, "capi_attach: %s: %s: %s\n", what, remora_status_name(st), remora_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: capi_attach PID TOOL MSEC [NAME=VALUE...]\n");
    return 2;
  }
  pid_t pid = (pid_t)atoi(argv[1]);
  long msec = atol(argv[3]);
  remora_options_t o;
  remora_status_t st = remora_options_init(&o);
  if (st != REMORA_STATUS_SUCCESS) return fail("options", st);
  o.tools = argv[2];
  o.env = (const char* const*)(argv + 4);
  o.env_count = (size_t)(argc - 4);
  o.attach_children = false;
  o.lease = true; /* should this program die, the agent detaches (the tool writes its report) */
  if ((st = remora_attach(pid, &o)) != REMORA_STATUS_SUCCESS) return fail("attach", st);

  remora_agent_state_t s;
  s.size = sizeof s;
  if ((st = remora_status(pid, &s)) != REMORA_STATUS_SUCCESS) return fail("status", st);
  if (!s.agent_loaded || !s.attached) {
    fprintf(stderr, "capi_attach: status after attach: agent_loaded=%d attached=%d\n", s.agent_loaded,
            s.attached);
    return 1;
  }
  printf("attached to %d: sessions=%llu tools=%s\n", (int)pid, (unsigned long long)s.sessions, s.tools);

  struct timespec d = {msec / 1000, (msec % 1000) * 1000000L};
  nanosleep(&d, NULL);
  if ((st = remora_detach(pid)) != REMORA_STATUS_SUCCESS) return fail("detach", st);
  return 0;
}
