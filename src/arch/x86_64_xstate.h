// x86_64 extended state (XSAVE) in signal frames: the layout of the xsave
// area, as the CPU describes it, and the fpstate a restore frame must hold so
// that the kernel's rt_sigreturn gives a thread back exactly the vector state
// it had.
//
// Why this needs care (arch/x86/kernel/fpu/signal.c, check_xstate_in_sigframe
// and __fpu_restore_sig, Linux 5.16+): rt_sigreturn accepts a frame's xsave
// image only if the fx_sw_bytes in its sw_reserved area carry magic1, an
// xstate_size no larger than the thread's own fpstate user_size and no larger
// than extended_size, and magic2 right at fpstate + xstate_size. Otherwise it
// restores the legacy FXSAVE part alone and resets every other component (the
// upper halves of ymm, zmm, the k registers) to its init state: the thread's
// vector registers are silently corrupted. It then XRSTORs the components in
// fx_sw_bytes.xfeatures and puts the rest of the thread's user features into
// their init state.
//
// PTRACE_GETREGSET(NT_X86_XSTATE) always returns the kernel's maximum size
// (fpu_user_cfg.max_size), which includes dynamic components such as AMX tile
// data (XFD-controlled, 8 KiB). A thread that never used them has a smaller
// fpstate (user_size without them): on an AMX machine a frame sized from the
// ptrace buffer is refused for every ordinary thread. The frame must
// therefore be sized and flagged for *that* thread: the static components the
// kernel enables, plus the dynamic ones the thread has in use (their bit in
// the ptrace header's xstate_bv). A dynamic component the thread has enabled
// but holds in its init state is left out, and rt_sigreturn re-initialises
// it: the same state.
//
// Everything here but host_xstate_layout() is pure and compiles on every host,
// so layouts of CPUs the build machine does not have are table-tested.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace remora::arch::x86_64 {

// One state component in the standard (non-compacted) XSAVE format:
// CPUID.(EAX=0DH, ECX=i): EAX = size, EBX = offset, ECX bit 2 = XFD-capable.
struct XComponent {
  uint32_t offset = 0;
  uint32_t size = 0;
  bool xfd = false;  // dynamic: the kernel enables it per task on first use
};

inline constexpr int kXfeatureX87 = 0, kXfeatureSse = 1;
inline constexpr size_t kFxsaveSize = 512;
inline constexpr size_t kXsaveHeaderSize = 64;
inline constexpr size_t kXsaveMinSize = kFxsaveSize + kXsaveHeaderSize;  // x87 + SSE + header

struct XstateLayout {
  bool xsave = false;                       // the CPU has XSAVE and the kernel enabled it (CR4.OSXSAVE)
  uint64_t xcr0 = 0;                        // the user state components the kernel enabled (XGETBV 0)
  std::array<XComponent, 64> components{};  // indices 0 and 1 (x87, SSE) live in the FXSAVE part

  // Components of `features` that are dynamic (XFD-capable).
  uint64_t dynamic(uint64_t features) const;
  // Size of a standard-format area holding `features`, as the kernel computes
  // it (xstate_calculate_size): the end of the topmost component, and at least
  // the legacy area plus the header.
  uint32_t size_for(uint64_t features) const;
};

// The layout of the host CPU, read once (CPUID leaf 0xD, XGETBV). On a host
// without XSAVE, or not x86_64, `xsave` is false.
const XstateLayout& host_xstate_layout();

// What the kernel keeps for one task (struct fpstate's user_xfeatures and
// user_size): the size and features its signal frames have, and the most a
// frame may declare.
struct TaskXstate {
  uint64_t features = 0;
  uint32_t size = 0;
};

// The signal-frame fpstate for a thread whose saved extended state is `saved`
// (a PTRACE_GETREGSET(NT_X86_XSTATE) buffer, or the 512-byte FXSAVE area of
// PTRACE_GETFPREGS on a kernel without XSAVE).
struct SigFpstate {
  // Bytes to write at the frame's fpstate (64-byte aligned): the xsave image
  // with fx_sw_bytes set, followed by magic2; or the FXSAVE area alone.
  std::vector<std::byte> image;
  bool xsave = false;  // the frame's uc_flags must carry UC_FP_XSTATE
  TaskXstate task;     // what the image declares
  // True when rt_sigreturn on this image restores exactly `saved`. False when
  // `saved` does not match the layout (then the image is the best available,
  // and a live controller must restore the state through ptrace instead).
  bool exact = false;
  std::string why_not;  // set when !exact
};
SigFpstate build_sig_fpstate(const XstateLayout& layout, std::span<const std::byte> saved);

// The task's user features and size, deduced from its saved state: the
// kernel's user features (from the sw_reserved word ptrace writes, else XCR0)
// without the dynamic ones, plus each dynamic one the state has in use.
TaskXstate task_xstate(const XstateLayout& layout, std::span<const std::byte> saved);

// The offsets inside an xsave area that both builders and tests read.
inline constexpr size_t kFxSwBytesOffset = 464;  // sw_reserved in the FXSAVE part
inline constexpr size_t kXstateBvOffset = 512;   // the header's xstate_bv
inline constexpr size_t kXcompBvOffset = 520;    // the header's xcomp_bv (0: standard format)
inline constexpr uint32_t kFpXstateMagic1 = 0x46505853, kFpXstateMagic2 = 0x46505845;

// struct _fpx_sw_bytes (arch/x86/include/uapi/asm/sigcontext.h).
struct FxSwBytes {
  uint32_t magic1 = 0;
  uint32_t extended_size = 0;  // xstate_size + 4 (magic2)
  uint64_t xfeatures = 0;
  uint32_t xstate_size = 0;
  uint32_t padding[7] = {};
};
static_assert(sizeof(FxSwBytes) == 48);

}  // namespace remora::arch::x86_64
