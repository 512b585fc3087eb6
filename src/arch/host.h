// The host's architecture, for the remote-call engine: `arch::host` is the
// traits namespace of the architecture Remora runs on (its registers, system
// call numbers, stubs, restore frame and extended state), chosen here at
// build time, so that no code outside src/arch names an architecture. Each
// architecture's traits compile on every host (arch/x86_64*.h,
// arch/aarch64.h) and are unit-tested there; this header only picks one.
#pragma once

#include "arch/arch.h"

#if defined(__x86_64__)
#include "arch/x86_64.h"
#include "arch/x86_64_frame.h"
#include "arch/x86_64_xstate.h"
namespace remora::arch {
namespace host = x86_64;
}  // namespace remora::arch
#else
#error "Remora's remote-call engine supports x86_64 hosts only for now"
#endif
