// Target "errors": exports functions that misbehave when called remotely, for
// the error tests, plus a sleeping thread so that "report" can tell the
// process is still healthy afterwards.
//   long remora_block(void)  waits on a futex that nobody wakes: never returns
//   long remora_crash(void)  writes through a NULL pointer: SIGSEGV, address 0
//   long remora_exit(int)    _exit(code): the whole process exits
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "target_common.h"

using namespace remora_target;

namespace {

uint32_t g_block_word = 0;

void* sleeper(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    timespec req{0, 10'000'000};
    if (nanosleep(&req, nullptr) != 0) anomaly("nanosleep: %s", strerror(errno));
    w->progress++;
  }
}

}  // namespace

REMORA_EXPORT long remora_block(void) {
  for (;;) syscall(SYS_futex, &g_block_word, FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
}

REMORA_EXPORT long remora_crash(void) {
  // A volatile store through a volatile pointer: the compiler can neither
  // see that it is NULL (and emit a trap instead) nor drop the store.
  volatile int* volatile p = nullptr;
  *p = 42;
  return 0;
}

REMORA_EXPORT long remora_exit(int code) { _exit(code); }

int main() {
  start_thread(sleeper, register_worker("nanosleep"));
  return run_protocol();
}
