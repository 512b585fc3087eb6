// x86_64 remote-call mechanics as pure functions: where the restore frame
// goes on the called thread's stack, the bytes it holds, the registers of
// each step of a call, and the recovery of an interrupted call's number.
// The remote layer reaches these through arch/host.h and never names a
// register; everything here compiles on every host and is unit-tested from
// tables (arch/x86_64_frame_test.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "arch/x86_64.h"

namespace remora::arch::x86_64 {

// The restore frame below the thread's red zone, highest address first:
//   fpstate (64-aligned, `fpstate_size` bytes) | ucontext | pretcode |
//   an all-ones sigset | a 16-byte result slot | 256 bytes of room |
//   byte arguments (16-aligned each) | the stub's stack (call_sp, 16-aligned)
// rt_sigreturn finds the frame at rsp - 8 when rsp = uc (the stubs' tail:
// mov %rbx,%rsp; syscall with rbx = uc).
struct FramePlan {
  uint64_t fpstate = 0;
  uint64_t uc = 0;
  uint64_t pretcode = 0;
  uint64_t all_mask = 0;       // for rt_sigprocmask(SIG_BLOCK, all_mask, &uc.uc_sigmask)
  uint64_t result_slot = 0;    // a marked call's result and cookie
  uint64_t call_sp = 0;        // the stub's stack pointer
  std::vector<uint64_t> args;  // address of each byte argument, in the order given
  uint64_t base = 0;           // lowest byte the frame writes
  uint64_t end = 0;            // one past the highest (fpstate + fpstate_size)
};
FramePlan plan_frame(uint64_t rsp, size_t fpstate_size, std::span<const size_t> arg_sizes);

// Everything the frame holds, and its bytes (to be written at plan.base in
// one write).
struct FrameContents {
  Regs resume;  // the registers the thread continues with (restart applied)
  uint64_t sigmask = 0;
  bool fp_xstate = false;                            // the fpstate is an xsave image (UC_FP_XSTATE)
  std::span<const std::byte> fpstate;                // its bytes (plan's fpstate_size)
  uint64_t restorer = 0;                             // pretcode: where glibc's syscall() returns
  std::span<const std::span<const std::byte>> args;  // byte arguments, as planned
};
std::vector<std::byte> frame_bytes(const FramePlan& plan, const FrameContents& c);
// Offset of the sigmask inside the frame's ucontext (where the stub's own
// rt_sigprocmask records the mask of a thread interrupted in ppoll & co).
inline constexpr size_t kUcSigmaskOffset = offsetof(UContext, uc_sigmask);

// ---- the registers of each step (from the registers `r` saved at the stop) ----

// Where the stubs live: the scratch code's address, or none yet (then libc's
// two gadgets serve: the `syscall` of its syscall() and its __restore_rt).
struct StubSite {
  std::optional<uint64_t> stub;  // start of the Stub block
  uint64_t syscall_gadget = 0;
  uint64_t restore_rt_gadget = 0;
};

// The thread parked on the self-restoring path: whatever happens next, its
// next instructions are the frame's rt_sigreturn.
Regs parked_regs(const Regs& r, const FramePlan& f, const StubSite& s);

// System call `nr` on the thread; returns the registers and the instruction
// address right after the `syscall` (where its entry and exit stops report).
struct SyscallStep {
  Regs regs;
  uint64_t insn_end = 0;
};
SyscallStep syscall_regs(const Regs& r, long nr, const std::array<uint64_t, 6>& a, const FramePlan& f,
                         const StubSite& s);

// A call of `fn` through the stub (marked when `marker` != 0: see Stub),
// ending in rt_sigreturn on the frame.
Regs call_regs(const Regs& r, uint64_t fn, const std::array<uint64_t, 6>& a, const FramePlan& f,
               uint64_t stub, int marker, uint64_t cookie);
// The instruction address right after the call stub's final rt_sigreturn.
uint64_t call_return_end(uint64_t stub, bool marked);

// ---- reading registers without naming them ----
inline uint64_t pc(const Regs& r) { return r.rip; }
inline uint64_t sp(const Regs& r) { return r.rsp; }
// The system call the thread was stopped in (-1: none).
inline int64_t syscall_nr(const Regs& r) { return static_cast<int64_t>(r.orig_rax); }
// The return register (a system call's result or -ERESTART*).
inline int64_t return_value(const Regs& r) { return static_cast<int64_t>(r.rax); }
// `r` as if stopped in system call `nr` (the frame of a restart_syscall
// thread re-issues the original call).
inline Regs with_syscall_nr(Regs r, long nr) {
  r.orig_rax = static_cast<uint64_t>(nr);
  return r;
}

// ---- a thread interrupted a second time in the same sleep ----
//
// It is inside restart_syscall (orig_rax 219), and only the kernel's
// restart_block knows the original call; rt_sigreturn resets that block, so
// the frame must re-issue the original call itself. glibc's wrappers load
// the number right before `syscall` with `mov $NR,%eax` or `mov $NR,%rax`.
// `before` holds the 9 bytes before the `syscall` instruction.
std::optional<long> wrapper_syscall_nr(std::span<const uint8_t, 9> before);
// Inside glibc's generic syscall(NR, ...) (its `mov 0x8(%rsp),%r9` precedes
// the `syscall`), the number came from the caller's `mov $NR,%edi` before
// `call syscall`.
bool is_generic_syscall_fn(std::span<const uint8_t, 9> before);
// Finds that `mov $NR,%edi` in the bytes just before the return address;
// only calls that use restart_block are accepted (futex, nanosleep,
// clock_nanosleep, poll): their arguments are still in the kernel's
// registers, only the number in rax was lost.
std::optional<long> caller_syscall_nr(std::span<const uint8_t> before_return);
inline constexpr size_t kCallerBytes = 48;

// The address of the `syscall` a thread stopped in a system call entered
// through.
inline uint64_t syscall_insn_address(const Regs& r) { return r.rip - kSyscallInsnLen; }
// x86_64 keeps a function's return address on the stack, at rsp inside a
// system call wrapper: no link register.
inline constexpr bool kReturnAddressInRegister = false;
inline uint64_t link_register(const Regs&) { return 0; }
// x86_64 keeps an interrupted call's number and arguments in orig_rax and
// the argument registers: nothing to read before the stop.
inline constexpr bool kStopForgetsSyscall = false;
inline Regs with_entry_args(const Regs& r, long, const std::array<uint64_t, 6>&, uint64_t) { return r; }
// A system call through libc's gadget starts on its `syscall` (x86_64's
// restart logic reads orig_rax, which the engine sets to -1).
inline constexpr uint64_t kSyscallGadgetLead = 0;
inline bool syscall_gadget_lead_ok(uint32_t) { return true; }
// The bootstrap's rt_sigreturn trampoline is glibc's own __restore_rt.
inline constexpr bool kRestoreRtInVdso = false;
// Nothing to switch off before a call: the xsave state has no mode that
// libc's code cannot run in.
inline std::vector<std::byte> call_entry_state(std::span<const std::byte>) { return {}; }

// Whether `insn` (2 bytes at the thread's pc) is the `syscall` instruction.
inline bool is_syscall_insn(std::span<const uint8_t, kSyscallInsnLen> insn) {
  return insn[0] == 0x0f && insn[1] == 0x05;
}

}  // namespace remora::arch::x86_64
