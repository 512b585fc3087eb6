// Kernel-internal "restart" return values and the system calls that need
// special care when a thread is interrupted inside them. Shared by every
// architecture: the values come from include/linux/errno.h (kernel-only, not
// in the UAPI headers), the call lists are per architecture (see the traits).
#pragma once

#include <cstdint>

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

}  // namespace remora::arch
