// An attach program in the shape of the C++ example of ROCm's rocattach
// documentation (written for Remora, not copied): it includes <rocprofiler-sdk-rocattach/rocattach.h> and the
// C++ library, and calls kill() with no <signal.h> of its own (ROCm's
// header brings it). It must build and run against Remora's header as it
// stands; tests/cli/cli_test.py (test_rocattach_doc_example) runs it.
//
//   attach_example PID [MSEC]    (tools: ROCPROF_ATTACH_TOOL_LIBRARY)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <rocprofiler-sdk-rocattach/rocattach.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PID [MSEC]\n", argv[0]);
    return 2;
  }
  const int pid = std::atoi(argv[1]);
  const long msec = argc > 2 ? std::atol(argv[2]) : 1000;
  if (kill(pid, 0) != 0) {
    std::fprintf(stderr, "no process %d\n", pid);
    return 1;
  }
  rocattach_status_t status = rocattach_attach(pid);
  if (status != ROCATTACH_STATUS_SUCCESS) {
    std::fprintf(stderr, "rocattach_attach(%d): %s\n", pid, rocattach_get_status_string(status));
    return 1;
  }
  std::printf("attached to %d for %ld ms\n", pid, msec);
  std::this_thread::sleep_for(std::chrono::milliseconds(msec));
  status = rocattach_detach(pid);
  if (status != ROCATTACH_STATUS_SUCCESS) {
    std::fprintf(stderr, "rocattach_detach(%d): %s\n", pid, rocattach_get_status_string(status));
    return 1;
  }
  // The target must have come through the session alive.
  if (kill(pid, 0) != 0) {
    std::fprintf(stderr, "process %d is gone after the detach\n", pid);
    return 1;
  }
  std::printf("detached from %d; it is still running\n", pid);
  return 0;
}
