// Internal to src/control: the state behind a control::Process and the
// pieces that work on it, one concern per file:
//   process.cc      the public handle: open, cont, close, memory, symbols
//   stops.cc        thread-level stop handling, stopping and resuming all
//   breakpoints.cc  inserting, removing and stepping over breakpoints
//   link_map.cc     the loader: auxv, r_debug, the link map, init functions
//   fork.cc         fork/vfork children; releasing a process (detach,
//                   suspend, kill)
//   launch.cc       starting a program stopped before its constructors
//   call.cc         Process::call
//
// Model (see process.h for the contract):
// * One tracer thread: every ptrace request for a Process is made on the
//   thread that created it (ptrace binds a tracee to its tracer thread).
// * Waiting: every wait goes through the ptrace layer's wait set
//   (ptrace::wait_any): the first of the process's running threads to stop
//   is reported, each asked for by its tid, never P_ALL (that would steal
//   the stops of other handles' tracees and reap the caller's other
//   children). cont() also watches the wake-up eventfd that interrupt()
//   writes.
// * All-stop: when one thread reports something, every other thread is
//   interrupted and waited for; what they report meanwhile is kept (a signal
//   to deliver later, a fork/exit event queued for the next cont()). A second
//   thread that hit a breakpoint is rewound and "forgotten": it executes the
//   breakpoint again when the breakpoints are next inserted, so nothing is
//   lost.
// * Breakpoints are inserted just before the threads are resumed and removed
//   as soon as all of them are stopped again; a thread standing on a
//   breakpoint address is single-stepped over it first.
// * Registers are reached through arch/arch.h only.
#pragma once

#include <sys/ptrace.h>
#include <sys/types.h>

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "arch/arch.h"
#include "base/deadline.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "control/process.h"
#include "ptrace/ptrace.h"
#include "remote/memory.h"

namespace remora::control {

inline constexpr unsigned long kOptions = PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK |
                                          PTRACE_O_TRACEVFORKDONE | PTRACE_O_TRACEEXEC | PTRACE_O_TRACEEXIT |
                                          PTRACE_O_TRACESYSGOOD;
inline constexpr auto kStopAllTimeout = std::chrono::seconds(10);
inline constexpr int kRtConsistent = 0;  // enum r_state in <link.h>

inline std::string pid_str(pid_t p) { return std::to_string(p); }

// The bytes a breakpoint replaces: one instruction's worth on aarch64 (4),
// int3's one on x86_64.
using InsnBytes = std::array<std::byte, arch::kBreakpointLen>;

// The thread exited or was killed (as opposed to stopped).
inline bool ended(const ptrace::Stop& s) {
  return s.kind == ptrace::Stop::Kind::kExited || s.kind == ptrace::Stop::Kind::kKilled;
}

// Collects what is left of `tid` (an exited thread's status) without
// waiting: a wait set check with a deadline that has already passed.
inline void reap_if_ended(pid_t tid) {
  const pid_t one[] = {tid};
  (void)ptrace::wait_any(one, Deadline::after(std::chrono::nanoseconds(0)));
}

// A stop that needs a decision above the thread level.
struct Raw {
  enum class Kind { kTrap, kExec, kFork, kVfork, kVforkDone, kExit, kGone, kWake, kSigIntr } kind;
  pid_t tid = 0;
  uint64_t addr = 0;  // kTrap: the breakpoint address (pc already rewound)
  pid_t other = 0;    // kFork/kVfork: the child; kExec: the former tid
  int status = 0;     // kExit: wait status; kGone: killing signal
};

struct Process::Impl {
  struct Thread {
    bool stopped = false;
    bool awaiting_attach = false;  // auto-attached clone: its first stop is still to come
    int pending_sig = 0;
    // Blocked in vfork until its child execs or exits: no PTRACE_INTERRUPT
    // stops it before then (the wait is killable only), and it runs no code
    // of its own, so stopping every thread does not wait for it. Its
    // PTRACE_EVENT_VFORK_DONE stop ends this.
    bool in_vfork = false;
  };

  pid_t pid = 0;
  bool launched = false;
  bool alive = true;
  bool closed = false;
  std::map<pid_t, Thread> threads;
  std::optional<remote::Memory> mem;
  UniqueFd wake;
  std::deque<Raw> queued;

  // Loader state.
  bool dynamic = false;
  uint64_t r_debug = 0, r_brk = 0, at_entry = 0, at_phdr = 0;
  std::vector<LoadedObject> objects;

  // Breakpoints: where to put them on the next resume, and those in memory.
  std::set<uint64_t> bp_addrs;
  std::map<uint64_t, InsnBytes> inserted;
  std::map<uint64_t, InsnBytes> last_removed;  // for stripping a fork child
  // A vforked child shares our memory and runs free: no breakpoint until it
  // has exec'd or exited (PTRACE_EVENT_VFORK_DONE).
  bool vfork_child_running = false;
  // This handle is a vfork child that still shares its parent's memory: it
  // never inserts breakpoints (they would land in the parent) until it execs.
  bool shares_parent_mm = false;

  std::vector<pid_t> running_tids() const;

  // ---- breakpoints (breakpoints.cc) ----
  Result<void> insert_bps();
  // Restores every breakpoint's bytes; `write_memory` false after an exec (the
  // memory they were in is gone) or when the process is gone.
  void remove_bps(bool write_memory = true);
  // Single-steps every stopped thread that stands on a breakpoint address
  // (the breakpoints are not in memory at this point).
  void step_over_bps();
  // `tid` stopped with a SIGTRAP: if it hit one of our breakpoints, rewinds
  // its pc onto it and returns the breakpoint's address.
  std::optional<uint64_t> hit_breakpoint(pid_t tid);

  // ---- thread-level stops (stops.cc) ----
  // Handles one stop of `tid`. In running mode (`stopping_all` false) an
  // uninteresting stop is dealt with and the thread resumed; in stopping_all
  // mode the thread is left stopped and what it reported is kept. Returns a
  // Raw for anything that needs a decision.
  std::optional<Raw> handle_stop(pid_t tid, const ptrace::Stop& st, bool stopping_all);
  std::optional<Raw> handle_event(pid_t tid, Thread& t, const ptrace::Stop& st, bool stopping_all);
  std::optional<Raw> handle_ptrace_stop(pid_t tid, Thread& t, const ptrace::Stop& st, bool stopping_all);
  // Resumes `t` with `sig` (stopping_all: keeps the signal for later instead).
  void resume(pid_t tid, Thread& t, int sig, bool stopping_all);
  // A tid the wait set no longer knows (ECHILD): drops it; the process is gone
  // when it was the leader. Returns that Raw kGone, if so.
  std::optional<Raw> forget(pid_t tid);
  bool another_thread_execs() const;
  // Interrupts every running thread and waits until all are stopped.
  Result<void> stop_all();
  Result<void> resume_all();
  // Runs the process until something needs a decision; returns with every
  // thread stopped and no breakpoint in memory.
  Result<Raw> run(const Deadline& deadline, bool watch_wake);
  Result<void> wait_for_decision(const Deadline& deadline, bool watch_wake);

  // ---- the loader (link_map.cc) ----
  Result<void> read_auxv();
  Result<int> read_r_state();
  Result<std::vector<LoadedObject>> read_link_map();
  std::set<uint64_t> init_functions();
  // Brings a process that just exec'd (single thread, at the exec stop) to
  // the launch stop: relocated, no constructor run. Returns an Event when the
  // process exits (or is gone) on the way.
  Result<std::optional<Event>> sync_new_image(const Deadline& deadline);
  // Runs until a breakpoint in `addrs` is hit (and `accept` agrees), handling
  // forks on the way; an Event when the process ends first.
  template <typename Accept>
  Result<std::optional<Event>> run_to(const Deadline& deadline, Accept accept);
  static std::optional<Event> terminal_event(const Raw& r);

  // ---- fork children and release (fork.cc) ----
  // The child of a fork/vfork that `r` reports: wait for its first stop,
  // strip our breakpoints from its copy of memory (not for vfork: the memory
  // is the parent's, and the parent's breakpoints are already out), then
  // either make a handle of it or let it run free.
  Result<Event> handle_fork(const Raw& r, bool want_child);
  void detach_all();
  Result<void> suspend();
  Result<void> kill_and_reap();
};

}  // namespace remora::control
