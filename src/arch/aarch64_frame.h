// aarch64 remote-call mechanics as pure functions: the restore frame (the
// kernel's rt_sigframe, which rt_sigreturn reads at sp), where it goes on
// the called thread's stack, its bytes, and the registers of each step of a
// call. The remote layer reaches these through arch/host.h; everything here
// compiles on every host and is unit-tested from tables
// (arch/aarch64_frame_test.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "arch/aarch64.h"

namespace remora::arch::aarch64 {

// ---- the kernel's signal frame (arch/arm64/include/uapi/asm/sigcontext.h,
// asm/ucontext.h, kernel/signal.c) ----
inline constexpr size_t kSiginfoSize = 128;
inline constexpr size_t kUcStackOffset = 16;          // stack_t uc_stack
inline constexpr size_t kUcSigmaskOffset = 128 + 40;  // from the frame's start
inline constexpr size_t kUcMcontextOffset = 176;  // in the ucontext (16-aligned after the 1024-bit sigset)
inline constexpr size_t kScRegsOffset = 8;        // after fault_address
inline constexpr size_t kScSpOffset = kScRegsOffset + 31 * 8;
inline constexpr size_t kScPcOffset = kScSpOffset + 8;
inline constexpr size_t kScPstateOffset = kScPcOffset + 8;
inline constexpr size_t kScReservedOffset = 288;  // __reserved[4096], 16-aligned
inline constexpr size_t kScReservedSize = 4096;
// From the frame's start.
inline constexpr size_t kFrameMcontext = kSiginfoSize + kUcMcontextOffset;
inline constexpr size_t kFrameReserved = kFrameMcontext + kScReservedOffset;
inline constexpr size_t kFrameMinSize = kFrameReserved + kScReservedSize;  // sizeof(struct rt_sigframe)
// The record headers of __reserved (struct _aarch64_ctx) and extra_context.
inline constexpr uint32_t kExtraMagic = 0x45585401;
inline constexpr size_t kExtraContextSize = 32;  // head, datap, size, reserved
inline constexpr size_t kTerminatorSize = 16;    // a zero head, rounded up to 16
// The kernel refuses frames larger than this (SIGFRAME_MAXSZ).
inline constexpr size_t kSigframeMaxSize = 64 * 1024;

// The restore frame below the thread's stack pointer (no red zone), highest
// address first:
//   rt_sigframe (siginfo | ucontext with the records of the FP/SIMD state:
//     in __reserved, spilling past it through an extra_context when they do
//     not fit) | an all-ones sigset | a 16-byte result slot | 256 bytes of
//     room | byte arguments (16-aligned each) | the stub's stack (call_sp)
// `uc` is the frame's start: the stubs set sp to it for rt_sigreturn.
struct FramePlan {
  uint64_t fpstate = 0;        // the records' start (the frame's __reserved)
  uint64_t uc = 0;             // the rt_sigframe (16-aligned)
  uint64_t all_mask = 0;       // for rt_sigprocmask(SIG_BLOCK, all_mask, &uc_sigmask)
  uint64_t result_slot = 0;    // a marked call's result and cookie
  uint64_t call_sp = 0;        // the stub's stack pointer
  std::vector<uint64_t> args;  // address of each byte argument, in the order given
  uint64_t base = 0;           // lowest byte the frame writes
  uint64_t end = 0;            // one past the highest
};
// `records_size`: the bytes of the state's records (aarch64_state.h's
// SigFpstate::image), without terminators.
FramePlan plan_frame(uint64_t sp, size_t records_size, std::span<const size_t> arg_sizes);
// The length the records take in the frame: with their terminator, and with
// an extra_context and a second terminator when they spill out of __reserved.
size_t records_footprint(size_t records_size);

struct FrameContents {
  Regs resume;  // the registers the thread continues with (restart applied)
  uint64_t sigmask = 0;
  bool fp_xstate = false;                            // unused on aarch64 (x86_64: UC_FP_XSTATE)
  std::span<const std::byte> fpstate;                // the records: fpsimd_context first
  uint64_t restorer = 0;                             // unused on aarch64 (the stubs end in rt_sigreturn)
  std::span<const std::span<const std::byte>> args;  // byte arguments, as planned
};
std::vector<std::byte> frame_bytes(const FramePlan& plan, const FrameContents& c);

// ---- the registers of each step (from the registers `r` saved at the stop) ----

// Where the stubs live: the scratch code's address, or none yet (then the
// `svc` of libc's syscall() and the vDSO's rt_sigreturn trampoline serve).
struct StubSite {
  std::optional<uint64_t> stub;
  uint64_t syscall_gadget = 0;
  uint64_t restore_rt_gadget = 0;
};

// The thread parked on the self-restoring path: whatever happens next, its
// next instructions are the frame's rt_sigreturn.
Regs parked_regs(const Regs& r, const FramePlan& f, const StubSite& s);

struct SyscallStep {
  Regs regs;
  uint64_t insn_end = 0;  // the pc right after the `svc` (where its entry and exit stops report)
};
SyscallStep syscall_regs(const Regs& r, long nr, const std::array<uint64_t, 6>& a, const FramePlan& f,
                         const StubSite& s);

// A call of `fn` through the stub (marked when `marker` != 0), ending in
// rt_sigreturn on the frame.
Regs call_regs(const Regs& r, uint64_t fn, const std::array<uint64_t, 6>& a, const FramePlan& f,
               uint64_t stub, int marker, uint64_t cookie);
uint64_t call_return_end(uint64_t stub, bool marked);

}  // namespace remora::arch::aarch64
