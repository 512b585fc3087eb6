// The host's architecture, for the layers above: `arch::host` is the traits
// namespace of the architecture Remora runs on (its registers, system call
// numbers, stubs, restore frame and extended state), chosen here at build
// time, so that no code outside src/arch names an architecture. Each
// architecture's traits compile on every host (arch/x86_64*.h,
// arch/aarch64*.h) and are unit-tested there; this header only picks one.
//
// Two switches tell src/ptrace how the host's registers travel, where the
// traits differ in kind rather than in value:
//   REMORA_HOST_REGS_BY_REGSET  the general registers are a register set
//     (host::kNtPrstatus) plus the system call number in a set of its own
//     (host::kNtSystemCall), not PTRACE_GETREGS/SETREGS;
//   REMORA_HOST_PACKED_STATE  the FP/SIMD state is several register sets
//     (host::kStateNotes) packed into one buffer (host::parse_state,
//     append_section, restore_order), not one extended-state set.
#pragma once

#include "arch/arch.h"

#if defined(__x86_64__)
#include "arch/x86_64.h"
#include "arch/x86_64_frame.h"
#include "arch/x86_64_xstate.h"
namespace remora::arch {
namespace host = x86_64;
}  // namespace remora::arch
#define REMORA_HOST_REGS_BY_REGSET 0
#define REMORA_HOST_PACKED_STATE 0
#elif defined(__aarch64__)
#include "arch/aarch64.h"
#include "arch/aarch64_frame.h"
#include "arch/aarch64_state.h"
namespace remora::arch {
namespace host = aarch64;
}  // namespace remora::arch
#define REMORA_HOST_REGS_BY_REGSET 1
#define REMORA_HOST_PACKED_STATE 1
#else
#error "Remora's remote-call engine supports x86_64 and aarch64 hosts only"
#endif
