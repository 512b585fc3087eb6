// aarch64 traits: register layout, system call numbers, the restart rules,
// the stub block Remora runs in a target and the patterns it finds in libc
// and the vDSO. This header compiles on every host (it does not include the
// host's <asm/ptrace.h>) so that its logic is unit tested on x86_64 too;
// src/ptrace maps the host register sets onto it on an aarch64 host. The
// signal frame lives in aarch64_frame.h, the FP/SIMD/SVE/SME state in
// aarch64_state.h.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "arch/aarch64_stub.h"
#include "arch/loader_block.h"
#include "arch/syscall_restart.h"

namespace remora::arch::aarch64 {

// struct user_pt_regs (asm/ptrace.h, the NT_PRSTATUS register set) followed
// by the system call number (NT_ARM_SYSTEM_CALL): ptrace::get_regs and
// set_regs move both. syscallno is -1 when the thread is in no system call.
// orig_x0 is never read or written by ptrace (the kernel keeps it out of
// reach): the engine fills it in when it knows the first argument of a call
// the thread must re-issue (see as_stopped_in_restart_syscall and
// with_entry_args).
struct Regs {
  uint64_t x[31];
  uint64_t sp, pc, pstate;
  int64_t syscallno = -1;
  uint64_t orig_x0 = 0;
};
inline constexpr size_t kUserPtRegsSize = 34 * 8;
static_assert(offsetof(Regs, syscallno) == kUserPtRegsSize);
// The register sets ptrace moves Regs with (include/uapi/linux/elf.h).
inline constexpr unsigned kNtPrstatus = 1, kNtSystemCall = 0x404;
// PSTATE.BTYPE (bits 11:10): the branch type a BTI landing pad checks.
inline constexpr uint64_t kPstateBtypeMask = uint64_t{3} << 10;

// The generic system call table (include/uapi/asm-generic/unistd.h).
namespace nr {
inline constexpr long kIoGetevents = 4, kEpollPwait = 22, kClose = 57, kRead = 63, kWrite = 64,
                      kPselect6 = 72, kPpoll = 73, kFutex = 98, kNanosleep = 101, kClockNanosleep = 115,
                      kRestartSyscall = 128, kTgkill = 131, kRtSigsuspend = 133, kRtSigprocmask = 135,
                      kRtSigtimedwait = 137, kRtSigreturn = 139, kPrctl = 167, kGetpid = 172, kGettid = 178,
                      kMsgrcv = 188, kSemtimedop = 192, kSemop = 193, kMunmap = 215, kMmap = 222,
                      kMprotect = 226, kMadvise = 233, kMemfdCreate = 279, kIoPgetevents = 292,
                      kEpollPwait2 = 441;
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

// ---- how a stop looks on aarch64, and how the engine reads it ----
//
// The kernel handles an interrupted call's restart *before* it reports a
// stop (arch/arm64/kernel/signal.c, do_signal): for -ERESTART* it rewinds
// the pc onto the `svc #0` and puts orig_x0 back into x0, and it forgets
// the call (syscallno -1). So a thread stopped in a restartable call looks
// exactly like one about to issue it: pc on an `svc`, x8 its number, x0-x5
// its arguments. Both resume correctly by running on from there. The calls
// that need more are restart_block's (relative sleeps, futex waits with a
// timeout): the kernel would set x8 to restart_syscall only on the way out
// of the same do_signal, which a ptrace stop never returns to with that pc,
// and the registers no longer show their -ERESTART_RESTARTBLOCK. The engine
// knows them by the /proc line it read before the stop (with_entry_args):
// the same call, pc and arguments, of a kind that returns that code. It
// then resumes them with x8 = 128, keeping the remaining timeout while the
// kernel's restart_block is intact. (Residual: a thread whose sleep ended
// between that read and the stop, and which stands on the next identical
// `svc` without having entered it, would run restart_syscall on its
// previous restart_block.)
//
// A call the kernel never restarts (epoll_pwait & co) instead returns
// -EINTR with the pc past its `svc`, and its first argument is lost (x0
// holds the result, orig_x0 is not readable through ptrace): the engine
// reads /proc/PID/task/TID/syscall *before* it interrupts the thread and
// takes the number and arguments from there (with_entry_args).

// Classifies from the interrupted call's number and the return register.
RestartKind classify_restart(long interrupted_nr, int64_t return_value, bool signal_pending);
// The same from the registers as saved (after as_stopped_in_restart_syscall
// or with_entry_args filled syscallno in).
RestartKind classify_restart(const Regs& r, bool signal_pending);

// The registers the thread must resume with so that the interrupted call
// completes transparently, with syscallno -1. For kRestartBlock,
// `use_restart_syscall` chooses restart_syscall (x8 = 128: exact remaining
// time; only while the kernel's restart_block is intact) or re-issuing the
// original call (the self-restoring frame's choice: rt_sigreturn resets
// restart_block).
Regs resume_registers(const Regs& r, RestartKind kind, bool use_restart_syscall);

// A thread stopped outside any system call (syscallno -1) may stand on an
// `svc #0` that the kernel rewound it onto (or that it was about to run:
// the same thing). True for such registers; the caller checks that the
// instruction at the pc is `svc #0` (is_syscall_insn) before using
// as_stopped_in_restart_syscall.
bool awaits_restart_syscall(const Regs& r);
// Those registers as if stopped inside the call x8 names, before the
// kernel's rewind: pc past the `svc`, syscallno = x8, x0 = the restart code
// the kernel saw (-ERESTARTSYS, or -ERESTART_RESTARTBLOCK for x8 = 128),
// orig_x0 = the first argument. resume_registers(..., kRestart) gives back
// `r` (its registers; orig_x0, which ptrace never writes, keeps the
// argument).
Regs as_stopped_in_restart_syscall(const Regs& r);
// Fills in, from the state /proc reported before the stop (nr, arguments,
// pc), what the stop hid: for a thread *past* its `svc`, the call it
// returned from (-EINTR of a call never restarted) and its first argument;
// for one rewound onto its `svc` (after as_stopped_in_restart_syscall), that
// the call returned -ERESTART_RESTARTBLOCK. Only when /proc and the
// registers agree (the same pc and x1-x5, x8 the number), so a thread that
// left the call and entered another is never confused with it.
Regs with_entry_args(const Regs& r, long nr, const std::array<uint64_t, 6>& args, uint64_t pc);
// Whether call `nr` with arguments `a`, interrupted, returns
// -ERESTART_RESTARTBLOCK: nanosleep, clock_nanosleep without TIMER_ABSTIME,
// futex waits with a timeout.
bool uses_restart_block(long nr, const std::array<uint64_t, 6>& a);
// Whether the engine must read the call's arguments before it stops the
// thread (the rewind and the loss of orig_x0 above): true on aarch64.
inline constexpr bool kStopForgetsSyscall = true;

// ---- reading registers without naming them ----
inline uint64_t pc(const Regs& r) { return r.pc; }
inline uint64_t sp(const Regs& r) { return r.sp; }
inline int64_t syscall_nr(const Regs& r) { return r.syscallno; }
inline int64_t return_value(const Regs& r) { return static_cast<int64_t>(r.x[0]); }
// `r` as if stopped in system call `nr` (the frame of a restart_syscall
// thread re-issues the original call).
inline Regs with_syscall_nr(Regs r, long nr) {
  r.syscallno = nr;
  return r;
}
// The address of the `svc` a thread stopped in a system call (as saved)
// entered through.
inline uint64_t syscall_insn_address(const Regs& r) { return r.pc - kSyscallInsnLen; }
// The return address of the function the thread is in, when the ABI keeps
// it in a register at a system call (aarch64: x30, the link register, in a
// leaf wrapper). x86_64 keeps it on the stack.
inline constexpr bool kReturnAddressInRegister = true;
inline uint64_t link_register(const Regs& r) { return r.x[30]; }

// Whether `insn` (4 bytes at the thread's pc) is `svc #0`.
inline bool is_syscall_insn(std::span<const uint8_t, kSyscallInsnLen> insn) {
  return insn[0] == 0x01 && insn[1] == 0x00 && insn[2] == 0x00 && insn[3] == 0xd4;
}

// ---- a thread interrupted a second time in the same sleep ----
//
// It is inside restart_syscall (x8 = 128), and only the kernel's
// restart_block knows the original call; the frame must re-issue that call
// itself. glibc's wrappers load the number right before `svc #0` with
// `mov x8, #NR` (movz x8 or movz w8). `before` holds the 9 bytes before the
// `svc`; its last four are that instruction.
std::optional<long> wrapper_syscall_nr(std::span<const uint8_t, 9> before);
// Inside glibc's generic syscall(NR, ...) (its argument shift, `mov x5, x6`
// and `mov x6, x7`, precedes the `svc`), the number came from the caller's `mov w0, #NR` before `bl syscall`.
bool is_generic_syscall_fn(std::span<const uint8_t, 9> before);
// Finds that `mov w0, #NR` in the bytes just before the return address; only
// calls that use restart_block are accepted (futex, nanosleep,
// clock_nanosleep).
std::optional<long> caller_syscall_nr(std::span<const uint8_t> before_return);
inline constexpr size_t kCallerBytes = 48;

// ---- stub code, written at the start of the scratch mapping ----
//
// Assembled from src/arch/aarch64_stub.S (the agent links the same file and
// exports the block as remora_agent_stub); the offsets come from
// aarch64_stub.h. What each entry does is told there.
struct Stub {
  static constexpr uint64_t kCallEntry = REMORA_AARCH64_STUB_CALL_ENTRY;
  static constexpr uint64_t kCallTail = REMORA_AARCH64_STUB_CALL_TAIL;
  static constexpr uint64_t kCallReturnSyscallEnd = REMORA_AARCH64_STUB_CALL_RETURN_SYSCALL_END;
  static constexpr uint64_t kSyscallEntry = REMORA_AARCH64_STUB_SYSCALL_ENTRY;
  static constexpr uint64_t kSyscallEnd = REMORA_AARCH64_STUB_SYSCALL_END;
  static constexpr uint64_t kThreadTrampoline = REMORA_AARCH64_STUB_THREAD_TRAMPOLINE;
  static constexpr uint64_t kThreadHook = REMORA_AARCH64_STUB_THREAD_HOOK;  // the trampoline's end
  static constexpr uint64_t kMarkedCallEntry = REMORA_AARCH64_STUB_MARKED_CALL_ENTRY;
  static constexpr uint64_t kMarkedCallReturnSyscallEnd = REMORA_AARCH64_STUB_MARKED_CALL_RETURN_SYSCALL_END;
  static constexpr uint64_t kScratchSetup = REMORA_AARCH64_STUB_SCRATCH_SETUP;
  static constexpr uint64_t kSetupStatus = REMORA_AARCH64_SETUP_STATUS;  // base-relative
  static constexpr uint64_t kLoaderStart = REMORA_AARCH64_STUB_LOADER_START;
  static constexpr size_t kSize = REMORA_AARCH64_STUB_SIZE;
};
// A copy of the assembled block. Defined on aarch64 hosts only, where the
// .S is assembled.
std::array<std::byte, Stub::kSize> stub_code();

// The block the thread trampoline works on (arch/loader_block.h).
using LoaderBlock = arch::LoaderBlock;
using LoaderStart = arch::LoaderStart;

// The kernel's rt_sigreturn trampoline: `mov x8, #139; svc #0`. glibc for
// aarch64 has none of its own (the kernel returns from handlers through the
// vDSO's __kernel_rt_sigreturn), so the bootstrap path finds it in the vDSO.
inline constexpr std::array<uint8_t, 8> kRestoreRtPattern = {0x68, 0x11, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4};
inline constexpr bool kRestoreRtInVdso = true;
// glibc's syscall(): `svc #0; cmn x0, #0xfff`.
inline constexpr std::array<uint8_t, 8> kSyscallFnTail = {0x01, 0x00, 0x00, 0xd4, 0x1f, 0xfc, 0x3f, 0xb1};
// A system call through that gadget starts one instruction before its
// `svc`, on the last move of syscall()'s argument shift (`mov x6, x7`, or
// `mov x5, x6` in older glibc, with x6 = the sixth argument: harmless
// either way). Never on the `svc` itself: a thread stopped after its own
// call through syscall() was interrupted stands on that very `svc`, and
// arm64's do_signal, still running for that stop, turns x8 into
// restart_syscall when the thread resumes with its pc there (its
// -ERESTART_RESTARTBLOCK case), whatever the tracer set x8 to.
inline constexpr uint64_t kSyscallGadgetLead = 4;
// Whether `word`, the instruction before the gadget's `svc`, is such a move.
inline bool syscall_gadget_lead_ok(uint32_t word) { return word == 0xaa0703e6u || word == 0xaa0603e5u; }

// Instruction encodings (Arm ARM, C6), for the decoders above and the tests.
constexpr uint32_t encode_blr(unsigned reg) { return 0xd63f0000u | (reg << 5); }
constexpr uint32_t encode_svc0() { return 0xd4000001u; }
constexpr uint32_t encode_brk(unsigned imm) { return 0xd4200000u | ((imm & 0xffff) << 5); }
// movz xd, #imm16 (and movz wd: 0x52800000)
constexpr uint32_t encode_movz(unsigned rd, unsigned imm16) {
  return 0xd2800000u | ((imm16 & 0xffff) << 5) | rd;
}
constexpr uint32_t encode_movz_w(unsigned rd, unsigned imm16) {
  return 0x52800000u | ((imm16 & 0xffff) << 5) | rd;
}
// mov sp, xn  (add sp, xn, #0)
constexpr uint32_t encode_mov_to_sp(unsigned rn) { return 0x9100001fu | (rn << 5); }

}  // namespace remora::arch::aarch64
