// The ptrace layer: the one wrapper through which every ptrace request goes
// (logged on channel "ptrace"), register access for the host architecture, and
// the wait manager that turns waitid() results into typed stops.
//
// All functions must be called from the thread that seized `tid` (ptrace binds
// a tracee to one tracer *thread*), except seize() itself.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "arch/x86_64.h"
#include "base/deadline.h"
#include "base/result.h"
#include "procfs/procfs.h"

namespace remora::ptrace {

#if defined(__x86_64__)
using Regs = arch::x86_64::Regs;
#else
#error "Remora's ptrace layer supports x86_64 hosts only for now"
#endif

// PTRACE_SEIZE with `options` (PTRACE_O_*). Never PTRACE_O_EXITKILL: the
// target must survive the controller's death. Failures are diagnosed (see
// diagnose_attach_failure).
Result<void> seize(pid_t pid, pid_t tid, unsigned long options);
Result<void> interrupt(pid_t tid);
Result<void> detach(pid_t tid, int sig = 0);
Result<void> cont(pid_t tid, int sig = 0);
// Resume until the next system call entry or exit (PTRACE_SYSCALL).
Result<void> cont_syscall(pid_t tid, int sig = 0);

Result<Regs> get_regs(pid_t tid);
Result<void> set_regs(pid_t tid, const Regs& regs);
// The full xsave area (PTRACE_GETREGSET NT_X86_XSTATE), sized by the kernel.
Result<std::vector<std::byte>> get_xstate(pid_t tid);
Result<void> set_xstate(pid_t tid, std::span<const std::byte> xstate);
Result<uint64_t> get_sigmask(pid_t tid);
Result<void> set_sigmask(pid_t tid, uint64_t mask);
Result<siginfo_t> get_siginfo(pid_t tid);

struct SyscallInfo {
  enum class Op { kNone, kEntry, kExit, kSeccomp } op = Op::kNone;
  uint64_t ip = 0, sp = 0;
  long nr = -1;           // entry/seccomp
  uint64_t arg0 = 0;      // entry/seccomp: first argument
  int64_t ret = 0;        // exit
  bool is_error = false;  // exit
};
// PTRACE_GET_SYSCALL_INFO (Linux 5.3+): tells syscall entry from exit for sure.
Result<SyscallInfo> get_syscall_info(pid_t tid);

// One stop (or end) of a tracee, as reported by waitid().
struct Stop {
  enum class Kind {
    kSignalDelivery,  // a signal is about to be delivered: `sig`
    kGroupStop,       // job-control stop (PTRACE_EVENT_STOP with a stop signal)
    kInterrupt,       // PTRACE_INTERRUPT / seize trap (PTRACE_EVENT_STOP, SIGTRAP)
    kSyscall,         // syscall entry or exit (PTRACE_O_TRACESYSGOOD: SIGTRAP|0x80)
    kEvent,           // another PTRACE_EVENT_*: `event`
    kExited,          // the thread exited: `exit_status`
    kKilled,          // killed by signal `sig`
  } kind;
  int sig = 0;
  int event = 0;
  int exit_status = 0;
};
const char* stop_kind_name(Stop::Kind k);

// Waits for the next stop of `tid` until `deadline`. Returns Errc::kTimedOut
// when it passes (the tracee is left as it is).
//
// Why polling: a blocking waitid() cannot be given a deadline without a
// signal handler in the controller (intrusive for a library: the caller owns
// its signals), and pidfds report exits, not ptrace stops. The wait first
// spins briefly with sched_yield (a ptrace stop usually arrives within tens of
// microseconds), then backs off with short sleeps.
Result<Stop> wait_stop(pid_t tid, const Deadline& deadline);

// Explains why attaching to `pid` failed with `err` (EPERM/EACCES/ESRCH/...):
// which rule refused (another tracer, uid mismatch, missing CAP_SYS_PTRACE,
// Yama ptrace_scope, not dumpable) and what would fix it.
Error diagnose_attach_failure(pid_t pid, int err);

// How long a tracer that already holds a thread is waited out before the
// thread counts as taken. Another controller's remote call holds a thread for
// well under a millisecond; a debugger holds it until it detaches.
inline constexpr std::chrono::milliseconds kPassingTracerGrace{250};

// Waits until no tracer holds thread `tid` of `pid` (tid 0: the process's
// main thread), or `deadline` passes. True when the thread is free (or gone);
// false when a tracer still holds it, or when the tracer is the calling
// thread itself, which waiting cannot free.
bool wait_until_untraced(pid_t pid, pid_t tid, const Deadline& deadline);

// A best-effort description of the controller's ability to trace `pid`;
// returns an Error (kTracedByOther / kPtraceDenied) when attaching would fail
// for a reason that can be known without trying.
Result<void> precheck_attach(pid_t pid);
// The same, from a status of `pid` the caller has just read.
Result<void> precheck_attach(pid_t pid, const procfs::Status& status);

}  // namespace remora::ptrace
