// What attach.cc and follow.cc share inside the attach layer (not part of
// its interface).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>

#include "base/deadline.h"
#include "base/result.h"

namespace remora::attach::detail {

// Runs work(i) for every i < n, on two threads per core but at most eight,
// the calling one included; returns when every call has returned.
void for_each_parallel(size_t n, const std::function<void(size_t)>& work);

// A thread id that the target's pid namespace gave (gettid() there: what the
// agent and the trampoline record in target memory) as this process names
// it: /proc here knows the thread only by ours. 0 when no thread of `pid`
// has that id (any more). Outside a nested pid namespace the ids are the
// same and nothing is read.
pid_t tid_as_we_name_it(pid_t pid, pid_t tid, bool nested_pid_ns);

// Waits until the thread the target's namespace calls `tid` is gone (a
// thread of a stopped process is driven to its end). The loader thread's
// wait: it still returns through our scratch code and runs on our stack
// after its last store to the block, so neither may go before the thread.
Result<void> wait_target_thread_gone(pid_t pid, pid_t tid, bool nested_pid_ns, const Deadline& deadline);

// The calling thread's timer slack, 1 ns while it lives, then put back.
// Why: an attach waits by short sleeps (this layer's polls of the loader
// block, the listener and threads going away; the ptrace layer's polls for a
// stop), 20-200 us each, a dozen or more per attach. The kernel stretches
// every sleep of a normal thread by its timer slack, 50 us by default:
// nanosleep(20 us) returned after 86 us on the benchmark machine, and with a
// slack of 1 ns after 34 us (docs/benchmarks.md, "Attach rows of issue 12
// part 5"). The slack is per thread (prctl PR_SET_TIMERSLACK): the caller's
// other threads and the target are untouched, and threads started while it
// is set (for_each_parallel's workers) inherit it and end with it. Held by
// every public Controller entry point that waits.
class ScopedTimerSlack {
 public:
  ScopedTimerSlack();
  ~ScopedTimerSlack();
  ScopedTimerSlack(const ScopedTimerSlack&) = delete;
  ScopedTimerSlack& operator=(const ScopedTimerSlack&) = delete;

 private:
  long saved_ = -1;  // the slack before, in ns; -1: unknown, nothing to put back
};

}  // namespace remora::attach::detail
