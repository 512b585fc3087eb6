// Kernel-internal "restart" return values and the system calls that need
// special care when a thread is interrupted inside them. The values and the
// rules are the same on every architecture: the values come from
// include/linux/errno.h (kernel-only, not in the UAPI headers); only the
// system-call numbers differ, so each architecture supplies a RestartTable
// (arch/x86_64.cc, arch/aarch64.cc) and a wrapper that reads its registers.
//
// Everything here is pure and may be called from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace remora::arch {

// A blocking system call interrupted by a ptrace stop returns one of these in
// the return register; the kernel rewinds the PC and restarts the call when it
// resumes the thread without delivering a handler.
inline constexpr int64_t kERestartSys = -512;
inline constexpr int64_t kERestartNoIntr = -513;
inline constexpr int64_t kERestartNoHand = -514;
inline constexpr int64_t kERestartRestartBlock = -516;  // restart via restart_syscall()

inline constexpr bool is_restart_code(int64_t ret) {
  return ret == kERestartSys || ret == kERestartNoIntr || ret == kERestartNoHand ||
         ret == kERestartRestartBlock;
}

// How a thread stopped inside a system call must be resumed so that the call
// completes as if nothing happened.
enum class RestartKind {
  kNone,            // not in a syscall, or the call already completed
  kRestart,         // rewind the PC over the syscall instruction, re-issue the same call
  kRestartBlock,    // rewind, issue restart_syscall (keeps the remaining timeout)
  kReissueOnEintr,  // a call the kernel never restarts returned -EINTR only because of
                    // our stop: rewind and re-issue it (its timeout starts again)
};

// One system call of an architecture: its name (as in the kernel's syscall
// table, without sys_) and its number there. The name lets tests compare the
// tables of two architectures call by call.
struct SyscallName {
  std::string_view name;
  long nr;
};

// The system calls of one architecture that the restart rules single out.
// The spans view static arrays owned by the architecture's .cc.
struct RestartTable {
  // Calls the kernel never restarts after a stop and that return -EINTR
  // even when no signal was delivered (measured: epoll_wait returns EINTR
  // after a bare seize+interrupt+detach). See signal(7), "Interruption of
  // system calls and library functions by stop signals".
  std::span<const SyscallName> never_restarted;
  // Calls that install a temporary signal mask for their duration and leave
  // the saved mask to be restored by the kernel on return
  // (TIF_RESTORE_SIGMASK). Setting the mask with PTRACE_SETSIGMASK while one
  // is in flight would lose the saved mask, so Remora blocks signals from
  // inside the stub instead.
  std::span<const SyscallName> swaps_signal_mask;
};

// Whether `nr` is in the table's never_restarted / swaps_signal_mask list.
// A negative `nr` (no system call) is in neither.
bool never_restarted(const RestartTable& table, long nr);
bool swaps_signal_mask(const RestartTable& table, long nr);

// Classifies how a thread stopped with `return_value` in its return register
// must be resumed, given the number of the system call the stop interrupted
// (`interrupted_nr`, negative when it stopped outside one) and whether an
// unblocked signal is pending for it (then an -EINTR is genuine and kept).
// Each architecture's classify_restart reads these from its registers.
RestartKind classify_restart(const RestartTable& table, long interrupted_nr, int64_t return_value,
                             bool signal_pending);

}  // namespace remora::arch
