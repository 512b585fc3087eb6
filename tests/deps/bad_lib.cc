// The self-test's counter-example (tests/deps/CMakeLists.txt): a library that
// breaks every rule check_deps.py enforces, the way a tool built the usual way
// does. It needs libstdc++.so.6; it exports the std:: template code it
// instantiates (libstdc++'s headers give it default visibility) and a name that is no
// entry point; it calls pthread_create, which the build machine's glibc
// (>= 2.34) gives a version above the stated minimum.
#include <pthread.h>

#include <string>
#include <vector>

namespace {
void* run(void*) { return nullptr; }
}  // namespace

extern "C" __attribute__((visibility("default"))) int deps_bad_not_an_entry_point(const char* s) {
  std::vector<std::string> v{s, s};
  pthread_t t;
  if (pthread_create(&t, nullptr, run, nullptr) == 0) pthread_join(t, nullptr);
  return static_cast<int>(v.size());
}
