// Target "twins": dlopens libremora_twin_a.so and libremora_twin_b.so (from
// REMORA_TWIN_DIR) before "ready", so that the library name "libremora_twin"
// matches two mapped libraries.
#include <dlfcn.h>
#include <time.h>

#include <cstdio>
#include <string>

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
  for (const char* name : {"libremora_twin_a.so", "libremora_twin_b.so"}) {
    std::string path = std::string(REMORA_TWIN_DIR) + "/" + name;
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      fprintf(stderr, "target_twins: dlopen %s: %s\n", path.c_str(), dlerror());
      return 2;
    }
  }
  start_thread(sleeper, register_worker("nanosleep"));
  return run_protocol();
}
