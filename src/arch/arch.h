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

#include <signal.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "arch/aarch64.h"
#include "arch/x86_64.h"

#if defined(__x86_64__)
#include <elf.h>
#include <linux/audit.h>
#include <sys/user.h>
#elif defined(__aarch64__)
#include <asm/ptrace.h>
#include <elf.h>
#include <linux/audit.h>
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

// The software breakpoint instruction (int3): callers write and restore
// kBreakpointLen bytes, the same on every architecture.
inline constexpr size_t kBreakpointLen = 1;
inline constexpr std::array<std::byte, kBreakpointLen> kBreakpointBytes = {std::byte{0xCC}};
// The si_code of the SIGTRAP the breakpoint raises: int3 is a trap the
// kernel sends as SI_KERNEL; a single-step (TRAP_TRACE) or a SIGTRAP sent
// with kill has another.
inline constexpr int kBreakpointTrapCode = SI_KERNEL;
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
// x86_64 returns through the stack: the caller stores the return address
// at call_sp; there is no link register to set.
inline constexpr bool kReturnAddressInRegister = false;
inline void set_return_address(HostRegs&, uint64_t) {}
// The return address a leaf function keeps in a register (0: none here, a
// call pushes it on the stack).
inline uint64_t link_register(const HostRegs&) { return 0; }
// The register set that says which bits of a code address hold a
// pointer-authentication code (0: there is none on this architecture).
inline constexpr unsigned kCodeTagMaskRegset = 0;

#elif defined(__aarch64__)

// The register set ptrace reads and writes on this host: NT_PRSTATUS (struct
// user_pt_regs) and, in the same call of ptrace::get_regs/set_regs, the
// system call number (NT_ARM_SYSTEM_CALL): aarch64 keeps it outside the
// general registers, and setting it to -1 at a syscall-entry stop skips the
// call, as orig_rax = -1 does on x86_64.
using HostRegs = aarch64::Regs;
static_assert(sizeof(user_pt_regs) == aarch64::kUserPtRegsSize,
              "arch::aarch64::Regs must begin with user_pt_regs");

// The FP/SIMD state is several register sets on aarch64 (NT_PRFPREG, NT_ARM_SVE,
// NT_ARM_TLS and, with SME, NT_ARM_SSVE, NT_ARM_ZA, NT_ARM_ZT): ptrace's
// get_xstate packs those the thread has into one buffer whose layout
// aarch64_state.h defines, and set_xstate writes them back in the order that
// restores each exactly.
inline constexpr uint32_t kAuditArch = AUDIT_ARCH_AARCH64;

inline uint64_t pc(const HostRegs& r) { return r.pc; }
inline void set_pc(HostRegs& r, uint64_t v) { r.pc = v; }
inline uint64_t sp(const HostRegs& r) { return r.sp; }
inline void set_sp(HostRegs& r, uint64_t v) { r.sp = v; }
inline uint64_t return_value(const HostRegs& r) { return r.x[0]; }

inline long syscall_nr(const HostRegs& r) { return static_cast<long>(r.syscallno); }
inline void set_syscall_nr(HostRegs& r, long nr) { r.syscallno = nr; }

// The software breakpoint instruction, brk #0 (0xd4200000, little-endian
// bytes). aarch64 reports the trap with the pc *at* the instruction.
inline constexpr size_t kBreakpointLen = 4;
inline constexpr std::array<std::byte, kBreakpointLen> kBreakpointBytes = {std::byte{0x00}, std::byte{0x00},
                                                                           std::byte{0x20}, std::byte{0xd4}};
// The si_code of the SIGTRAP the breakpoint raises: a user brk is sent as
// TRAP_BRKPT (arch/arm64/kernel/debug-monitors.c); a single-step is
// TRAP_TRACE, a SIGTRAP sent with kill SI_USER.
inline constexpr int kBreakpointTrapCode = TRAP_BRKPT;
inline uint64_t breakpoint_address(uint64_t trap_pc) { return trap_pc; }

// ---- injected function calls (AAPCS64) ----
inline constexpr size_t kMaxCallArgs = 8;
// Sets up `r` to enter `fn` with `args` (at most kMaxCallArgs), no syscall
// restart pending. PSTATE.BTYPE is cleared: a thread stopped between a
// branch and its target would otherwise have `fn` checked as a landing pad.
// The return address goes into x30 (set_return_address), not the stack.
inline void set_call(HostRegs& r, uint64_t fn, std::span<const uint64_t> args) {
  for (size_t i = 0; i < args.size() && i < kMaxCallArgs; ++i) r.x[i] = args[i];
  r.pc = fn;
  r.pstate &= ~aarch64::kPstateBtypeMask;
  set_syscall_nr(r, -1);
}
inline void set_return_address(HostRegs& r, uint64_t return_to) { r.x[30] = return_to; }
// The return address a leaf function keeps in x30 and never stores: a thread
// stopped in glibc's _Fork (a leaf, called by fork()) has fork() only there.
inline uint64_t link_register(const HostRegs& r) { return r.x[30]; }
// NT_ARM_PAC_MASK (struct user_pac_mask: data_mask, insn_mask): the bits of
// an address that hold its pointer-authentication code; the kernel refuses
// the set where the CPU has no pointer authentication.
inline constexpr unsigned kCodeTagMaskRegset = 0x406;
// No red zone; sp 16-byte aligned at every call.
inline uint64_t call_sp(uint64_t sp) { return (sp - 256) & ~(aarch64::kStackAlign - 1); }
// Whether the return address is passed in a register (set_return_address)
// rather than stored at call_sp (x86_64).
inline constexpr bool kReturnAddressInRegister = true;

#else
#error "Remora's architecture interface supports x86_64 and aarch64 hosts only"
#endif

}  // namespace remora::arch
