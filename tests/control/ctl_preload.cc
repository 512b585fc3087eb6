#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void preload_ctor() {
  const char* dir = getenv("CTL_DIR");
  if (dir == nullptr) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/preload_ctor", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
}
