// remora-bench-target: the process remora-bench-call measures against.
//
// fd 3 (commands in) and fd 4 (replies out) are pipes set up by the bench.
//   main thread   blocked in read(3): the thread the bench seizes and calls
//                 into; between measurements it also answers commands.
//   spinner       loops reading CLOCK_MONOTONIC and keeps the largest gap
//                 between two iterations: how long it was kept from running,
//                 by the scheduler or by what a remote call does to the
//                 process (mmap, mprotect, TLB shootdowns, the mm lock).
// Commands (one byte): 'r' resets the spinner's record and answers "ok";
// 'q' answers "<max_gap_ns> <gaps_over_10us> <iterations>"; 'x' exits.
// bench_probe is exported (-rdynamic) for remote calls.
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

extern "C" __attribute__((visibility("default"), noinline, used)) long bench_probe(long x) {
  asm volatile("" ::: "memory");  // keep a real call and body, whatever the optimiser thinks
  return x + 1;
}

namespace {

constexpr int kCmdFd = 3;
constexpr int kReplyFd = 4;

std::atomic<bool> g_reset_requested{false};
std::atomic<bool> g_stop{false};
std::atomic<pid_t> g_spinner_tid{0};
// Written only by the spinner, read by main.
std::atomic<uint64_t> g_max_gap_ns{0};
std::atomic<uint64_t> g_gaps_over_10us{0};
std::atomic<uint64_t> g_iterations{0};

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

void spin() {
  pthread_setname_np(pthread_self(), "spinner");
  g_spinner_tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
  uint64_t max_gap = 0, over = 0, iterations = 0;
  uint64_t last = now_ns();
  while (!g_stop.load(std::memory_order_relaxed)) {
    uint64_t t = now_ns();
    uint64_t gap = t - last;
    last = t;
    if (g_reset_requested.load(std::memory_order_acquire)) {
      max_gap = over = iterations = 0;
      g_max_gap_ns.store(0, std::memory_order_relaxed);
      g_gaps_over_10us.store(0, std::memory_order_relaxed);
      g_iterations.store(0, std::memory_order_relaxed);
      g_reset_requested.store(false, std::memory_order_release);
      continue;
    }
    ++iterations;
    if (gap >= 10000) g_gaps_over_10us.store(++over, std::memory_order_relaxed);
    if (gap > max_gap) g_max_gap_ns.store(max_gap = gap, std::memory_order_relaxed);
    if ((iterations & 1023) == 0) g_iterations.store(iterations, std::memory_order_relaxed);
  }
}

bool reply(const std::string& line) {
  std::string s = line + "\n";
  return write(kReplyFd, s.data(), s.size()) == static_cast<ssize_t>(s.size());
}

}  // namespace

int main() {
  std::thread spinner(spin);
  while (g_spinner_tid.load() == 0) std::this_thread::yield();
  if (!reply("ready " + std::to_string(getpid()) + " " + std::to_string(syscall(SYS_gettid)) + " " +
             std::to_string(g_spinner_tid.load()))) {
    return 1;
  }
  int rc = 0;
  for (;;) {
    char c = 0;
    ssize_t n = read(kCmdFd, &c, 1);  // where the main thread spends its life
    if (n != 1) {
      // No handler is installed, so an interrupted read must restart, never
      // return EINTR; EOF means the bench went away.
      if (n < 0) {
        std::fprintf(stderr, "bench-target: read: %s\n", std::strerror(errno));
        rc = 1;
      }
      break;
    }
    if (c == 'x') break;
    if (c == 'r') {
      g_reset_requested.store(true, std::memory_order_release);
      while (g_reset_requested.load(std::memory_order_acquire)) std::this_thread::yield();
      if (!reply("ok")) rc = 1;
    } else if (c == 'q') {
      if (!reply(std::to_string(g_max_gap_ns.load()) + " " + std::to_string(g_gaps_over_10us.load()) + " " +
                 std::to_string(g_iterations.load()))) {
        rc = 1;
      }
    } else {
      reply("error: unknown command");
      rc = 1;
    }
  }
  g_stop.store(true);
  spinner.join();
  return rc;
}
