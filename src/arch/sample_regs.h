// The registers a sampling profiler keeps of an interrupted thread, taken
// from the ucontext the kernel hands a signal handler, and what an unwinder
// needs to know about them: each one's libunwind register number and the
// layout of a frame record. Callers name no register: they ask for "the pc",
// "the sp", "the frame pointer" and treat the rest as a numbered set.
//
// Header-only, with no libstdc++ and nothing that allocates or locks: the
// default tool (tools/default), which runs inside targets and links no
// Remora library, includes it, and calls sample_regs_from_ucontext from its
// signal handler (async-signal-safe: it reads the ucontext only).
#pragma once

#include <stdint.h>
#include <ucontext.h>

namespace remora::arch {

// Where the pc, the stack pointer and the frame pointer are in a sample's
// register array, on every architecture; the other entries are the
// callee-saved registers a CFI rule may restore a caller's value from.
inline constexpr uint32_t kSamplePc = 0;
inline constexpr uint32_t kSampleSp = 1;
inline constexpr uint32_t kSampleFp = 2;

// A frame record, as code built with frame pointers links them: at the
// frame pointer, the caller's frame pointer, then the return address. The
// caller's sp is at least fp + kFrameRecordSize: exactly that on x86_64
// (push rbp; mov rbp, rsp), a lower bound on aarch64, where the record
// (stp x29, x30) may sit at the bottom of a larger frame.
inline constexpr uint64_t kFrameRecordReturnOffset = 8;
inline constexpr uint64_t kFrameRecordSize = 16;

#if defined(__x86_64__)

// rip, rsp, rbp, then the other callee-saved registers (rbx, r12-r15): the
// return address of a frame is on the stack, found through the CFA.
inline constexpr uint32_t kNumSampleRegs = 8;
// libunwind's number of each (DWARF's numbering for x86_64; the pc, rip, is
// 16, the return-address column).
inline constexpr int kSampleUnwindRegs[kNumSampleRegs] = {16, 7, 6, 3, 12, 13, 14, 15};
// The register libunwind reports a caller's pc in after an ordinary step
// (UNW_REG_IP), and the one that holds the pc out of a signal frame.
inline constexpr int kUnwindRegReturnAddress = 16;
inline constexpr int kUnwindRegPc = 16;

inline void sample_regs_from_ucontext(const ucontext_t* uc, uint64_t* regs) {
  const greg_t* g = uc->uc_mcontext.gregs;
  regs[0] = static_cast<uint64_t>(g[REG_RIP]);
  regs[1] = static_cast<uint64_t>(g[REG_RSP]);
  regs[2] = static_cast<uint64_t>(g[REG_RBP]);
  regs[3] = static_cast<uint64_t>(g[REG_RBX]);
  regs[4] = static_cast<uint64_t>(g[REG_R12]);
  regs[5] = static_cast<uint64_t>(g[REG_R13]);
  regs[6] = static_cast<uint64_t>(g[REG_R14]);
  regs[7] = static_cast<uint64_t>(g[REG_R15]);
}

#elif defined(__aarch64__)

// pc, sp, x29 (the frame pointer), x30 (the link register: in a leaf frame,
// or at a function's first instruction, the return address is only there),
// then the callee-saved x19-x28.
inline constexpr uint32_t kNumSampleRegs = 14;
// libunwind's number of each: DWARF's for x0-x30 and sp (31), and 32 for
// the pc, which DWARF does not number.
inline constexpr int kSampleUnwindRegs[kNumSampleRegs] = {32, 31, 29, 30, 19, 20, 21,
                                                          22, 23, 24, 25, 26, 27, 28};
// libunwind's UNW_REG_IP on aarch64 is x30, the return-address column: it
// holds a caller's pc after an ordinary step, but in the first frame it is
// the link register and out of a signal frame the interrupted x30, where
// the pc is register 32.
inline constexpr int kUnwindRegReturnAddress = 30;
inline constexpr int kUnwindRegPc = 32;

inline void sample_regs_from_ucontext(const ucontext_t* uc, uint64_t* regs) {
  const mcontext_t& m = uc->uc_mcontext;
  regs[0] = m.pc;
  regs[1] = m.sp;
  regs[2] = m.regs[29];
  regs[3] = m.regs[30];
  for (uint32_t i = 0; i < 10; ++i) regs[4 + i] = m.regs[19 + i];
}

#else
#error "Remora's sample registers are defined for x86_64 and aarch64 hosts only"
#endif

}  // namespace remora::arch
