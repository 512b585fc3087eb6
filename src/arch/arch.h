// The architecture interface: the one header through which code outside
// src/arch reads and changes a stopped thread's registers, plants breakpoints
// and sets up an injected function call. Callers name no register: they ask
// for "the pc", "the return value". The host's architecture is chosen here,
// at build time; each architecture's traits live in their own file
// (arch/x86_64.h), which compiles on every host.
//
// All functions are pure (they change only the Regs passed in) and may be
// called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "arch/x86_64.h"

#if defined(__x86_64__)
#include <elf.h>
#include <linux/audit.h>
#include <sys/user.h>
#endif

namespace remora::arch {

#if defined(__x86_64__)

// The register set ptrace reads and writes on this host (PTRACE_GETREGS).
using HostRegs = x86_64::Regs;
static_assert(sizeof(HostRegs) == sizeof(user_regs_struct),
              "arch::x86_64::Regs must mirror user_regs_struct");

// The FP/SIMD register sets of PTRACE_GETREGSET: the extended state
// (NT_X86_XSTATE, the xsave area) and, on a kernel without XSAVE, the
// legacy FXSAVE area (NT_PRFPREG), which is exactly this size.
inline constexpr unsigned kExtendedStateRegset = NT_X86_XSTATE;
inline constexpr unsigned kLegacyFpRegset = NT_PRFPREG;
inline constexpr size_t kLegacyFpSize = 512;
// The AUDIT_ARCH_* value a seccomp filter sees in seccomp_data.arch for
// this host's native system calls.
inline constexpr uint32_t kAuditArch = AUDIT_ARCH_X86_64;

inline uint64_t pc(const HostRegs& r) { return r.rip; }
inline void set_pc(HostRegs& r, uint64_t v) { r.rip = v; }
inline uint64_t sp(const HostRegs& r) { return r.rsp; }
inline void set_sp(HostRegs& r, uint64_t v) { r.rsp = v; }
// The integer return value of a function that just returned.
inline uint64_t return_value(const HostRegs& r) { return r.rax; }

// The system call the thread is stopped in (-1: none). Setting -1 keeps the
// kernel from restarting an interrupted call into code we redirect the
// thread to.
inline long syscall_nr(const HostRegs& r) { return static_cast<long>(r.orig_rax); }
inline void set_syscall_nr(HostRegs& r, long nr) { r.orig_rax = static_cast<uint64_t>(nr); }

// The software breakpoint instruction (int3).
inline constexpr std::byte kBreakpoint{0xCC};
inline constexpr size_t kBreakpointLen = 1;
// x86_64 reports a breakpoint trap with the pc *after* the instruction: the
// address of the breakpoint that a thread stopping at `pc` hit.
inline uint64_t breakpoint_address(uint64_t trap_pc) { return trap_pc - kBreakpointLen; }

// ---- injected function calls (System V AMD64 ABI) ----

// Integer arguments passed in registers.
inline constexpr size_t kMaxCallArgs = 6;
// Sets up `r` to enter `fn` with `args` (at most kMaxCallArgs; the rest are
// ignored), the return value cleared and no syscall restart pending. The
// stack is set apart: `call_sp(sp(r))` is where the return address goes.
inline void set_call(HostRegs& r, uint64_t fn, std::span<const uint64_t> args) {
  uint64_t* slots[kMaxCallArgs] = {&r.rdi, &r.rsi, &r.rdx, &r.rcx, &r.r8, &r.r9};
  for (size_t i = 0; i < args.size() && i < kMaxCallArgs; ++i) *slots[i] = args[i];
  r.rip = fn;
  r.rax = 0;
  set_syscall_nr(r, -1);
}
// The stack pointer at the called function's entry for a thread stopped with
// stack pointer `sp`: well below the red zone, aligned as right after a
// `call`. The caller stores the return address at the returned address
// (x86_64 returns through the stack).
inline uint64_t call_sp(uint64_t sp) {
  return ((sp - 2 * x86_64::kRedZone) & ~(x86_64::kStackAlign - 1)) - 8;
}

#else
#error "Remora's architecture interface supports x86_64 hosts only for now"
#endif

}  // namespace remora::arch
