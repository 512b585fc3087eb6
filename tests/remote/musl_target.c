/* remora_target_musl: a dynamically linked musl program (built with
 * musl-gcc when musl-tools is installed) for the musl refusal test. Says
 * "ready <pid>" and waits for EOF on stdin. Plain C: no C++ runtime for
 * musl here. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
  char buf[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  while (read(0, buf, sizeof buf) > 0) {
  }
  return 0;
}
