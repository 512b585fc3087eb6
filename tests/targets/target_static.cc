// Target "static": the common protocol in a statically linked executable
// (no dynamic loader, no libc.so to call through). Remora may open it, but a
// call that needs libc must fail with Errc::kStaticBinary.
#include <time.h>

#include "target_common.h"

using namespace remora_target;

namespace {

void* sleeper(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  for (;;) {
    timespec req{0, 10'000'000};
    nanosleep(&req, nullptr);
    w->progress++;
  }
}

}  // namespace

int main() {
  start_thread(sleeper, register_worker("nanosleep"));
  return run_protocol();
}
