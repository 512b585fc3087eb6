// CPU sampling: one POSIX timer per thread on that thread's CPU-time clock,
// delivering a real-time signal to that thread only (SIGEV_THREAD_ID). The
// handler captures registers and a bounded stack copy into the thread's
// sample ring (slots.h); the collector unwinds them later (unwind.h). The
// design and why it cannot crash the target: the top of sampler.cc.
//
// Threads: start/add_thread/remove_thread/stop are called by one thread at a
// time (the listener, then the collector thread while it runs); the signal
// handler runs on any application thread.
#ifndef REMORA_TOOLS_DEFAULT_SAMPLER_H_
#define REMORA_TOOLS_DEFAULT_SAMPLER_H_

#include <signal.h>
#include <stdint.h>
#include <sys/types.h>

#include <string>
#include <unordered_map>

namespace remora_tool {

class Sampler {
 public:
  // Picks a free real-time signal (one whose disposition is SIG_DFL), saves
  // its disposition and installs the handler. `forced` > 0 uses that signal
  // (it must still be SIG_DFL). False with `error` set on failure.
  bool start(int hz, int forced, std::string* error);
  // Starts sampling `tid` (slot index `slot`, session `gen`). Threads that
  // block the signal (the agent's listener, the tool's own threads, signal
  // -waiting threads) are left alone: the signal would stay pending there;
  // so are threads in seccomp strict mode, which the handler's stack copy
  // (a pread) would kill.
  void add_thread(int32_t tid, uint32_t slot, uint32_t gen);
  void remove_thread(int32_t tid);
  bool has_thread(int32_t tid) const { return timers_.count(tid) != 0; }
  // Deletes every timer, discards signals still pending and restores the
  // previous disposition exactly.
  void stop();
  // After fork() in the child: the timers were not inherited; forget them.
  void forget_timers() { timers_.clear(); }

  bool running() const { return signal_ != 0; }
  int signal_number() const { return signal_ != 0 ? signal_ : last_signal_; }

 private:
  int signal_ = 0;
  int last_signal_ = 0;
  int64_t period_ns_ = 0;
  // The disposition as the kernel stores it (struct kernel_sigaction), read
  // and restored with the raw system call: glibc's sigaction() would add
  // SA_RESTORER and its own restorer to what it puts back.
  struct KernelSigaction {
    void* handler;
    unsigned long flags;
    void* restorer;
    uint64_t mask;
  } old_{};
  std::unordered_map<int32_t, int> timers_;  // tid -> kernel timer id
};

// Number of lines "ID: " in /proc/self/timers (for tests and sanity checks).
int count_process_timers();

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_SAMPLER_H_
