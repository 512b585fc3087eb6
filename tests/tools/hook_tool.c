/* A test tool: appends every lifecycle call to the file named by
 * REMORA_HOOK_LOG (read at each call, so an attach's env buffer can set it),
 * one line each: "<hook> pid=<pid> tid=<tid> t=<monotonic ns> session=<n>".
 * HOOK_TOOL_FAIL=<hook> makes that hook fail, for the error tests. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "remora/tool.h"

#ifndef HOOK_TOOL_NAME
#define HOOK_TOOL_NAME "hook"
#endif

static void record(const char* hook, uint64_t session) {
  const char* path = getenv("REMORA_HOOK_LOG");
  if (!path) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char line[256];
  int n = snprintf(line, sizeof line, "%s:%s pid=%d tid=%ld t=%lld session=%llu\n", HOOK_TOOL_NAME, hook,
                   getpid(), (long)syscall(SYS_gettid), (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec,
                   (unsigned long long)session);
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!write(fd, line, (size_t)n);
    close(fd);
  }
}

static int should_fail(const char* hook) {
  const char* f = getenv("HOOK_TOOL_FAIL");
  return f && strcmp(f, hook) == 0;
}

static int tool_init(void* data) {
  (void)data;
  record("tool_init", 0);
  return should_fail("tool_init") ? 3 : 0;
}
static void tool_fini(void* data) {
  (void)data;
  record("tool_fini", 0);
}
static int tool_attach(void* data, const remora_tool_info_t* info) {
  (void)data;
  record("tool_attach", info->session);
  return should_fail("tool_attach") ? 4 : 0;
}
static int tool_detach(void* data, const remora_tool_info_t* info) {
  (void)data;
  record("tool_detach", info->session);
  return 0;
}

static remora_tool_configure_result_t g_conf = {sizeof(remora_tool_configure_result_t), 0, tool_init,
                                                tool_fini, NULL};
static remora_tool_configure_attach_result_t g_attach = {sizeof(remora_tool_configure_attach_result_t), 0,
                                                         tool_attach, tool_detach};

__attribute__((visibility("default"))) remora_tool_configure_result_t* remora_configure(
    uint32_t v, const remora_tool_info_t* info) {
  (void)v;
  (void)info;
  record("configure", 0);
  return &g_conf;
}

#ifndef HOOK_TOOL_NO_ATTACH
__attribute__((visibility("default"))) remora_tool_configure_attach_result_t* remora_configure_attach(
    uint32_t v, const remora_tool_info_t* info) {
  (void)v;
  (void)info;
  record("configure_attach", 0);
  return &g_attach;
}
#endif
