// Seccomp, as the call engine must see it: which system calls a thread's
// filters would let through, decided before Remora makes the thread run any.
//
// Why: a thread under seccomp is killed (or sees EPERM, SIGSYS, ENOSYS) the
// moment it makes a system call its filters refuse, and the engine makes
// system calls of its own in the target (mmap of the scratch mapping,
// rt_sigreturn, ...). A refused call must be refused *by Remora*, with the
// thread untouched, never discovered by the target's death.
//
//  * Strict mode (SECCOMP_MODE_STRICT) allows read, write, exit and
//    sigreturn only: nothing the engine does fits, so such a thread is never
//    used (strict_mode_error).
//  * Filter mode: the classic-BPF programs (PTRACE_SECCOMP_GET_FILTER) are
//    run here, by a pure interpreter, over the seccomp_data of every system
//    call the operation plans (PlannedSyscall), and combined as the kernel
//    combines stacked filters (kernel/seccomp.c, seccomp_run_filters: the
//    lowest SECCOMP_RET_ACTION_FULL value, as s32, wins).
//
// Arguments the engine cannot know in advance (the base of a mapping not yet
// created) are unknown: the interpreter follows both sides of every jump that
// depends on one and collects every verdict the filter could give. A call is
// refused only when every possible verdict refuses it; when some would allow
// it, the engine goes on, and a denial that happens anyway is reported by
// denial_note. Everything above Guard is pure (no process is touched);
// Guard reads /proc and makes the ptrace request. All thread-compatible.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/deadline.h"
#include "base/result.h"

namespace remora::remote::seccomp {

// One classic-BPF program as the kernel keeps it (struct sock_filter).
using Program = std::vector<sock_filter>;

// The seccomp_data the kernel passes a filter (linux/seccomp.h), with
// knowledge of which fields are known. nr and arch are always known.
struct SyscallData {
  int32_t nr = -1;
  uint32_t arch = 0;  // AUDIT_ARCH_*; the engine's is AUDIT_ARCH_X86_64
  uint64_t instruction_pointer = 0;
  std::array<uint64_t, 6> args{};
  bool ip_known = false;
  uint8_t args_known = 0;  // bit i: args[i] is known
};

// What a filter (or the stack of them) does with one system call.
struct Verdict {
  uint32_t ret = 0;  // the full return value: action | data
  int32_t action_full() const { return static_cast<int32_t>(ret & 0xffff0000u); }
  uint16_t data() const { return static_cast<uint16_t>(ret & 0xffffu); }
  // ALLOW, LOG and USER_NOTIF (a supervisor decides; Remora cannot predict
  // it) let the engine go on; KILL_*, TRAP, ERRNO and TRACE (ENOSYS while
  // Remora is the tracer without PTRACE_O_TRACESECCOMP) refuse.
  bool refuses() const;
  // "SECCOMP_RET_ERRNO(EPERM)", "SECCOMP_RET_KILL_PROCESS", ...
  std::string name() const;
  // "kill the process (SECCOMP_RET_KILL_PROCESS)", "make it fail with EPERM
  // (SECCOMP_RET_ERRNO(EPERM))", ...
  std::string effect() const;
};

// Every verdict one program (or the stack) may give; several only when it
// depends on unknown fields. `malformed`: the program broke a rule the
// kernel enforces at load time (a jump or load out of range, an unknown
// instruction, division by a zero constant, no final return): such paths
// count as SECCOMP_RET_KILL_PROCESS. `truncated`: too many paths to follow;
// the verdicts found so far are kept and ALLOW is added (Remora goes on).
struct Outcome {
  std::vector<Verdict> verdicts;  // distinct, in the order found
  bool malformed = false;
  bool truncated = false;
};

// Runs one program over `data`.
Outcome evaluate(std::span<const sock_filter> program, const SyscallData& data);

// Runs the stack of programs (any order: the combination is a minimum) and
// combines their outcomes as the kernel does. No program: ALLOW.
Outcome evaluate_stack(std::span<const Program> programs, const SyscallData& data);

// One system call an operation of the engine will (or may) make in the
// target, and why: the message names it. Arguments the engine does not know
// beforehand are left out of `args_known`.
struct PlannedSyscall {
  long nr = -1;
  std::string_view purpose;  // "which Remora needs to create its scratch mapping"
  std::array<uint64_t, 6> args{};
  uint8_t args_known = 0;
  // The caller copes with a failure (glibc ignores a refused rseq or
  // set_robust_list): only a kill or SIGSYS (KILL_*, TRAP) refuses.
  bool failure_ok = false;
  // glibc retries with this call when `nr` fails with ENOSYS (clone3 ->
  // clone, as sandboxes that hide clone3 intend): then this is checked.
  long enosys_fallback = -1;
};

// "mmap", or "system call 1234" for a number without a name here.
std::string syscall_name(long nr);

// Ok when the stack would let every planned call through; otherwise
// Errc::kNotSupported naming the first refused call, the filter's verdict,
// and `what` (the operation: "call a function in thread 4250 of process 4242"),
// ending with "nothing was changed".
Result<void> check(std::span<const Program> programs, std::span<const PlannedSyscall> planned,
                   std::string_view what);

// The refusal of a strict-mode thread (Errc::kNotSupported).
Error strict_mode_error(pid_t tid);

// For an engine system call that failed with `ret` (a negative errno; or
// `nr` itself: a kill rolls the call back, leaving its number in rax), or
// a SIGSYS (ret 0, sigsys true): when the thread is in filter mode
// (`filter_mode`), the sentence to append saying that seccomp probably
// refused it and, when Remora could not read the filter (`unreadable_errno`
// non-zero), why and how to have Remora check it first. Empty when the
// failure does not look like a seccomp denial.
std::string denial_note(long nr, int64_t ret, bool sigsys, bool filter_mode, int unreadable_errno);

// ---- the engine's planned system calls (x86_64), named in one place ----
//
// Every operation: rt_sigreturn (the stubs end in it).
// A marked call (see choose_marker in remote/target.cc): getpid, gettid, tgkill.
// Creating the scratch (the first call of a session): mmap, mprotect, prctl
// (PR_SET_VMA), madvise (MADV_DONTFORK); `base` unknown when 0.
// A thread interrupted in ppoll/pselect6/rt_sigsuspend/epoll_pwait:
// rt_sigprocmask. Target::close: munmap. Target::syscall: that call.
struct EnginePlan {
  bool marked_call = false;
  bool creates_scratch = false;
  bool swaps_mask = false;
  bool is_syscall = false;
  long nr = -1;  // is_syscall: the call, with its arguments
  std::array<uint64_t, 6> args{};
  uint64_t scratch_hint = 0;  // creates_scratch: the address its mmap asks for
};
std::vector<PlannedSyscall> engine_syscalls(const EnginePlan& plan);

// What loading the agent on a fresh thread makes (remora attach:
// pthread_create of the loader thread, dlopen of the agent from a file or
// a memfd, the agent's constructor starting its listener), as seen with
// `strace -f` (the list in seccomp.cc); arguments unknown. Not the
// engine's own calls (each transaction checks those) nor the tools' own.
std::span<const PlannedSyscall> agent_load_syscalls();

// ---- the per-session state the engine keeps (remote::Target::Impl) ----
//
// What one session knows of its threads' seccomp modes. The mode comes from
// /proc/PID/task/TID/status, read at most every 250 ms per thread (as the
// engine reads the signal dispositions: a call in a tight loop costs no
// /proc read); the filters are read again in every transaction, from the
// stopped thread: filters can only be added, and a thread not in filter
// mode answers the one request with EINVAL (a few microseconds measured, see
// the tests). Used under Target's mutex.
class Guard {
 public:
  // Before `tid` is seized: refuses a strict-mode thread
  // (strict_mode_error). A thread whose status cannot be read is let
  // through: the seize then reports what is wrong with it.
  Result<void> before_seize(pid_t pid, pid_t tid);
  // Whether the last before_seize refused `tid` for strict mode (so that an
  // automatic choice can be made again).
  bool refused_strict(pid_t tid) const { return strict_refused_ == tid; }
  // Whether `tid` is in filter mode as far as this session knows.
  bool filtered(pid_t tid) const;
  // Whether `tid` is in strict mode: a fresh read of its status (false
  // when it cannot be read). For the choice of a thread.
  static bool is_strict(pid_t pid, pid_t tid);
  // A status of `tid` the caller has just read (its Seccomp line): the next
  // before_seize within 250 ms uses it instead of reading its own.
  void note_status(pid_t tid, int seccomp_mode);
  // Whether before_seize would use a status of `tid` it has already (one
  // read or noted within the last 250 ms) instead of reading its own.
  bool knows_status(pid_t tid) const;
  // `child` was created (through threads of ours) from `parent`, whose
  // status is known: it inherited parent's seccomp state, as the kernel
  // copies it on clone. No-op when parent's is not known.
  void inherit_status(pid_t child, pid_t parent);

  // In a transaction, `tid` stopped by us and nothing changed yet: reads
  // the filters and checks `plan` (check). Unreadable filters (not
  // privileged) let the call go on; denial_error then explains a denial.
  Result<void> check_stopped(pid_t tid, std::span<const PlannedSyscall> plan, std::string_view what);
  // The same for a thread outside a call: seizes, stops and releases it
  // untouched around the read (Target::check_syscalls).
  Result<void> check_running(pid_t pid, pid_t tid, std::span<const PlannedSyscall> plan,
                             std::string_view what, const Deadline& deadline);

  // An engine system call `nr` returned `ret`: `plain` as it is when this
  // does not look like a seccomp denial, otherwise Errc::kNotSupported with
  // the message extended by denial_note.
  Error denial_error(Error plain, pid_t tid, long nr, int64_t ret) const;
  // The note for a SIGSYS (or a kill by it) of `tid` in system call `nr`
  // (-1: unknown); empty when the thread is not known to be filtered.
  std::string sigsys_note(pid_t tid, long nr) const;

 private:
  struct Thread {
    int mode = 0;  // /proc Seccomp: 0 none, 1 strict, 2 filter
    std::chrono::steady_clock::time_point read{};
    int unreadable_errno = 0;  // the last PTRACE_SECCOMP_GET_FILTER's refusal
    bool has_filters = false;  // the last read found filters
  };
  std::map<pid_t, Thread> threads_;
  pid_t strict_refused_ = 0;
};

// Target::open's check: refuses a process whose every thread is in strict
// mode (`main` is the status of its main thread, already read).
Result<void> check_open(pid_t pid, int main_mode);

}  // namespace remora::remote::seccomp
