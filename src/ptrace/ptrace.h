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

#include "arch/arch.h"
#include "base/deadline.h"
#include "base/result.h"
#include "procfs/procfs.h"

namespace remora::ptrace {

// The host's register set (arch/arch.h chooses it).
using Regs = arch::HostRegs;

// PTRACE_SEIZE with `options` (PTRACE_O_*). Never PTRACE_O_EXITKILL: the
// target must survive the controller's death. Failures are diagnosed (see
// diagnose_attach_failure).
Result<void> seize(pid_t pid, pid_t tid, unsigned long options);
Result<void> interrupt(pid_t tid);
Result<void> detach(pid_t tid, int sig = 0);
Result<void> cont(pid_t tid, int sig = 0);
// Resume until the next system call entry or exit (PTRACE_SYSCALL).
Result<void> cont_syscall(pid_t tid, int sig = 0);
// Execute one instruction, then stop with SIGTRAP (PTRACE_SINGLESTEP).
Result<void> single_step(pid_t tid, int sig = 0);
// Leave a thread in its group-stop while still traced (PTRACE_LISTEN; only
// valid at a PTRACE_EVENT_STOP of a job-control signal).
Result<void> listen(pid_t tid);
// The message of the last PTRACE_EVENT_* stop (PTRACE_GETEVENTMSG): the new
// tid for clone/fork/vfork, the former tid for exec, the wait status for exit.
Result<unsigned long> get_event_msg(pid_t tid);
// Replaces the PTRACE_O_* options of a seized thread (PTRACE_SETOPTIONS).
Result<void> set_options(pid_t tid, unsigned long options);

Result<Regs> get_regs(pid_t tid);
Result<void> set_regs(pid_t tid, const Regs& regs);
// The thread's whole FP/SIMD state: the extended-state register set
// (arch::kExtendedStateRegset; on x86_64 the xsave area, sized by the
// kernel), or, on a kernel without it (x86_64 without XSAVE: ENODEV), the
// legacy FP register set of arch::kLegacyFpSize bytes. set_xstate writes
// back either form, told apart by its size.
Result<std::vector<std::byte>> get_xstate(pid_t tid);
Result<void> set_xstate(pid_t tid, std::span<const std::byte> xstate);
// PTRACE_SECCOMP_GET_FILTER: the number of instructions of the thread's
// filter `index` (0 = the newest), copied to `out` (struct sock_filter[],
// nullptr to learn the count). Errors keep the kernel's errno: ENOENT past
// the last filter, EINVAL for a thread not in filter mode, EACCES without
// CAP_SYS_ADMIN. See ptrace/seccomp_filter.h.
Result<long> seccomp_get_filter(pid_t tid, unsigned long index, void* out);
// The bits of a code address that hold a pointer-authentication code
// (aarch64's NT_ARM_PAC_MASK, insn_mask): a return address saved by code
// built with branch protection carries them. 0 where there are none (x86_64,
// a CPU or kernel without pointer authentication).
uint64_t code_address_tag_mask(pid_t tid);
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

// ---- waiting: every wait for a tracee goes through wait_any ----
//
// Why polling: a blocking waitid() cannot be given a deadline without a
// signal handler in the controller (intrusive for a library: the caller owns
// its signals), and pidfds report exits, not ptrace stops. The wait first
// spins for 30 us with sched_yield (a ptrace stop of a thread with a CPU to
// itself arrives that soon), then sleeps, 5 us doubling to 20 us for the
// first millisecond, then to 1 ms: a spinning controller would keep a tracee
// that queued behind a busy thread of the target off its own CPU.
//
// Each tid is asked for by its own id (waitid(P_PID, tid, __WALL)), never
// with P_ALL: that would steal the stops of tracees that other handles in
// the same controller hold, and reap the caller's other children.

struct WaitOptions {
  // Readable (an eventfd or pipe): ends the wait with Waited::kWake. The fd is
  // only polled, never read. -1: none.
  int wake_fd = -1;
  // Leave the exit of a thread-group leader that is the caller's own child
  // unreaped, for the caller's waitpid() (the tracer is not the only one
  // waiting for it). Otherwise an exit is reaped when it is reported.
  bool leave_child_exit = false;
};

// What a wait observed.
struct Waited {
  enum class Kind {
    kStop,      // `tid` stopped or ended: `stop`
    kVanished,  // `tid` is not (or no longer) ours to wait for (ECHILD)
    kWake,      // WaitOptions::wake_fd became readable
    kSignal,    // a signal interrupted the caller's thread (EINTR)
    kTimeout,   // the deadline passed; every tracee is left as it is
    kError,     // waitid failed otherwise: `err`
  } kind = Kind::kTimeout;
  pid_t tid = 0;
  Stop stop{Stop::Kind::kExited};
  int err = 0;
};

// Waits until the first of `tids` stops or ends, or `deadline` passes. Each
// tid is checked once before the deadline is looked at, so an expired
// deadline makes a non-blocking check. When several tids have news, the
// first in `tids` order is reported; the others stay for the next call.
Waited wait_any(std::span<const pid_t> tids, const Deadline& deadline, const WaitOptions& opts = {});

// Waits for the next stop of `tid` until `deadline` (wait_any for one tid,
// leaving a child leader's exit for its parent to reap). Returns
// Errc::kTimedOut when it passes (the tracee is left as it is) and
// Errc::kTargetExited when the tid is no longer traced.
Result<Stop> wait_stop(pid_t tid, const Deadline& deadline);

// Whether a signal stop with this siginfo is a fault: SIGSEGV, SIGBUS, SIGILL,
// SIGFPE, SIGTRAP or SIGSYS raised by the kernel for the thread's own
// instruction (si_code > 0). The same signal sent by kill/tgkill/sigqueue
// (si_code <= 0) is an ordinary signal to deliver, never a fault.
bool is_fault(const siginfo_t& si);

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

// The one pre-check for "can this process be opened" (remote::Target::open
// and control::Process::open). Reads /proc/PID/status and refuses, each with
// its own code and a message that says what to do:
//   kInvalidArgument  pid <= 0, or a thread id that is not a process id
//   kOwnProcess       the calling process, or one of its threads
//   kNoSuchProcess    no such process
//   kZombie           the process has exited and awaits its parent's wait
//   kKernelThread     a kernel thread ("Kthread:" line, else PF_KTHREAD)
//   kTracedByOther    another tracer (a passing one is waited out for
//                     kPassingTracerGrace first), or another handle of this
//                     controller (errno EBUSY)
//   kPtraceDenied     precheck_attach's refusals
// Returns the status it read (read again after waiting out a tracer).
// Errors carry no "open process N" context: the caller adds its own.
Result<procfs::Status> precheck_open(pid_t pid);

// precheck_open's first half, the refusals of what `pid` names, which need
// no tracer and change nothing: kInvalidArgument, kOwnProcess,
// kNoSuchProcess, kZombie, kKernelThread, as above. For a caller that only
// reads the process (attach::check_target). Returns the status it read.
Result<procfs::Status> precheck_identity(pid_t pid);

// A best-effort description of the controller's ability to trace `pid`;
// returns an Error (kTracedByOther / kPtraceDenied) when attaching would fail
// for a reason that can be known without trying.
Result<void> precheck_attach(pid_t pid);
// The same, from a status of `pid` the caller has just read.
Result<void> precheck_attach(pid_t pid, const procfs::Status& status);

}  // namespace remora::ptrace
