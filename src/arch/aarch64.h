// aarch64 traits. They compile on every host so that their logic is unit
// tested on x86_64; the working aarch64 port (register access through
// NT_PRSTATUS, the kernel's pre-stop PC rewind) is a later step.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "arch/syscall_restart.h"

namespace remora::arch::aarch64 {

// Same layout as struct user_pt_regs (asm/ptrace.h).
struct Regs {
  uint64_t x[31];
  uint64_t sp, pc, pstate;
};
static_assert(sizeof(Regs) == 34 * 8);

// The generic system call table (include/uapi/asm-generic/unistd.h).
namespace nr {
inline constexpr long kEpollPwait = 22, kPselect6 = 72, kPpoll = 73, kNanosleep = 101, kClockNanosleep = 115,
                      kRestartSyscall = 128, kRtSigsuspend = 133, kRtSigprocmask = 135, kRtSigtimedwait = 137,
                      kRtSigreturn = 139, kSemtimedop = 192, kSemop = 193, kMunmap = 215, kMmap = 222,
                      kMprotect = 226, kMadvise = 233, kMemfdCreate = 279, kIoPgetevents = 292,
                      kEpollPwait2 = 441, kIoGetevents = 4, kMsgrcv = 188, kGetpid = 172, kGettid = 178,
                      kFutex = 98, kRead = 63, kWrite = 64;
}  // namespace nr

inline constexpr uint64_t kRedZone = 0;  // AAPCS64 has no red zone
inline constexpr uint64_t kStackAlign = 16;
inline constexpr uint64_t kSyscallInsnLen = 4;  // svc #0

// This architecture's system calls that the restart rules single out (the
// rules: arch/syscall_restart.h), with the generic table's numbers. The same
// calls as x86_64's, less those the generic table lacks (epoll_wait: libc
// issues epoll_pwait). A static table.
const RestartTable& restart_table();
bool never_restarted(long nr);
bool swaps_signal_mask(long nr);

// On aarch64 the kernel rewinds the PC and puts orig_x0 back into x0 *before*
// reporting the stop (arch/arm64/kernel/signal.c), and orig_x0 cannot be
// written through ptrace. So the classification needs the syscall number the
// stop interrupted (PTRACE_GET_SYSCALL_INFO or /proc/PID/syscall), and a
// restart means: leave pc and x0 as the kernel left them, x8 = the number.
RestartKind classify_restart(long interrupted_nr, int64_t return_value, bool signal_pending);

// Stubs, same contract as x86_64 (see x86_64.h): x19 = &frame.uc (callee saved).
//  call:    blr x16; mov x0 -> kept; mov x8,#139; mov sp,x19; svc #0; brk #0
//  syscall: svc #0;  mov x8,#139; mov sp,x19; svc #0; brk #0
struct Stub {
  static constexpr uint64_t kCallEntry = 0;
  static constexpr uint64_t kSyscallEntry = 32;
  static constexpr size_t kSize = 64;
};
std::array<uint32_t, Stub::kSize / 4> stub_code();

// Instruction encodings (Arm ARM, C6).
constexpr uint32_t encode_blr(unsigned reg) { return 0xd63f0000u | (reg << 5); }
constexpr uint32_t encode_svc0() { return 0xd4000001u; }
constexpr uint32_t encode_brk(unsigned imm) { return 0xd4200000u | ((imm & 0xffff) << 5); }
// movz xd, #imm16
constexpr uint32_t encode_movz(unsigned rd, unsigned imm16) {
  return 0xd2800000u | ((imm16 & 0xffff) << 5) | rd;
}
// mov sp, xn  (add sp, xn, #0)
constexpr uint32_t encode_mov_to_sp(unsigned rn) { return 0x9100001fu | (rn << 5); }

}  // namespace remora::arch::aarch64
