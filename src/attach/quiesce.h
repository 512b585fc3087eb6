// The unload's proof (docs/architecture.md, "The unload"). Two looks at the
// process with its threads stopped:
//  - before the agent takes its fork handlers out of glibc's list (a
//    remote call on the listener, the one thread left running): no thread
//    is inside fork(), where glibc 2.36 would index past the end of its
//    shrunk list, or call a handler of ours it read before;
//  - before the agent's dlclose: no thread is in the code it unmaps, and
//    none is counted inside a tool or the agent (a thread counted in has
//    called out of that code and will return into it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agent/protocol.h"
#include "arch/host.h"
#include "base/deadline.h"
#include "base/result.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"

namespace remora::attach::detail {

// What an unload will unmap and where its tools count their threads, as the
// agent published it (remora_agent_info, protocol 7).
struct UnloadPlan {
  struct Range {
    uint64_t start = 0, end = 0;
  };
  struct Counter {
    uint64_t address = 0, stripes = 0, stride = 0;
  };
  std::vector<Range> code;
  std::vector<Counter> counters;
  Range fork;    // the C library's fork(): a return address into it means "inside a fork"
  Range atfork;  // its __register_atfork: inside it, a thread holds the fork handlers' lock
};

// The plan in an info block read whole; an Error when the agent published
// none (it could not say what it would unmap) or an impossible one.
Result<UnloadPlan> unload_plan(const remora_agent_info& info);

// What was read of one stopped thread.
struct ThreadLook {
  pid_t tid = 0;
  uint64_t pc = 0;
  // Its pc in fork() or __register_atfork(), or a return address into one
  // within kForkScanBytes above its stack pointer. (A stale word there only
  // delays the unload.)
  bool in_fork = false;
};
// Deeper than every frame a thread in fork() has between its stack pointer
// and fork()'s own: glibc's handler runner, a handler of ours or one of the
// application's blocked on a lock (a few hundred bytes each).
inline constexpr size_t kForkScanBytes = 4096;

// Whether `words` (read from a stopped thread's stack pointer up, and its
// link register where the architecture has one) hold a return address into
// `fork`: a word in (start, end] once the bits of `tag_mask` are cleared (a
// return address signed by pointer authentication carries its code there).
bool holds_return_into(std::span<const uint64_t> words, const UnloadPlan::Range& fork, uint64_t tag_mask = 0);

// The verdict of one look.
struct QuiescenceCheck {
  bool proven = false;
  std::string why;     // why not, for the user: the thread and what it was doing
  size_t threads = 0;  // threads stopped and looked at
};

// The pure halves: no thread inside fork() (the first look); no thread in
// the plan's code and none counted inside (the second; by then no fork
// handler of ours is registered, and a thread inside fork() is no matter).
QuiescenceCheck judge_forks(std::span<const ThreadLook> threads);
QuiescenceCheck judge(const UnloadPlan& plan, std::span<const ThreadLook> threads,
                      std::span<const long> inside);

// Every thread of a process but one stopped by the calling thread
// (PTRACE_SEIZE and PTRACE_INTERRUPT; threads that appear meanwhile too)
// and looked at; each let go again when this is destroyed, as if nothing
// had happened: with the signal it was about to take, and a call that the
// stop alone made fail with EINTR (epoll_wait and the others the kernel
// never restarts after a stop) re-issued (arch/syscall_restart.h), as a
// remote call's transaction does.
class Freeze {
 public:
  // `spared`: a thread left running (0: none). Not stopped: `why` says so
  // (another tracer holds a thread, one did not stop before `deadline`).
  static Result<std::unique_ptr<Freeze>> stop(pid_t pid, pid_t spared, const UnloadPlan& plan,
                                              const Deadline& deadline);
  ~Freeze();
  Freeze(const Freeze&) = delete;
  Freeze& operator=(const Freeze&) = delete;

  const std::string& why_not_stopped() const { return why_; }
  const std::vector<ThreadLook>& threads() const { return looks_; }
  // The plan's counts, read now (every thread but the spared one stopped).
  Result<std::vector<long>> counts(const UnloadPlan& plan) const;

 private:
  struct Held {
    bool stopped = false;
    int sig = 0;  // the signal to deliver at the release
    bool reissue = false;
    ptrace::Regs resume{};
    // The system call /proc reported before the stop, where the stop
    // forgets it (arch::host::kStopForgetsSyscall: aarch64's first argument).
    std::optional<procfs::SyscallState> entry;
  };
  explicit Freeze(pid_t pid) : pid_(pid) {}
  Result<std::string> seize_all(pid_t spared);
  std::string wait_all_stopped(const Deadline& deadline);
  void plan_repairs();
  Result<void> look(const UnloadPlan& plan);

  pid_t pid_;
  std::map<pid_t, Held> held_;
  std::string why_;
  std::vector<ThreadLook> looks_;
};

}  // namespace remora::attach::detail
