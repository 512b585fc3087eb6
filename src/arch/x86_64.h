// x86_64 traits: register layout, system call numbers, the restart rules, the
// signal frame the kernel's rt_sigreturn reads, and the stub code Remora runs
// in a target. This header compiles on every host (it does not include the
// host's <sys/user.h>); src/ptrace maps the host register set onto it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "arch/loader_block.h"
#include "arch/syscall_restart.h"
#include "arch/x86_64_stub.h"

namespace remora::arch::x86_64 {

// Same layout as the kernel's struct user_regs_struct (asm/user_64.h).
struct Regs {
  uint64_t r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags,
      rsp, ss, fs_base, gs_base, ds, es, fs, gs;
};
static_assert(sizeof(Regs) == 27 * 8);

// System call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
namespace nr {
inline constexpr long kRead = 0, kWrite = 1, kClose = 3, kPoll = 7, kMmap = 9, kMprotect = 10, kMunmap = 11,
                      kRtSigaction = 13, kRtSigprocmask = 14, kRtSigreturn = 15, kSelect = 23, kMadvise = 28,
                      kPause = 34, kNanosleep = 35, kGetpid = 39, kAccept = 43, kRecvfrom = 45, kRecvmsg = 47,
                      kWait4 = 61, kSemop = 65, kMsgrcv = 70, kRtSigtimedwait = 128, kRtSigsuspend = 130,
                      kPrctl = 157, kGettid = 186, kFutex = 202, kIoGetevents = 208, kRestartSyscall = 219,
                      kSemtimedop = 220, kClockNanosleep = 230, kEpollWait = 232, kWaitid = 247,
                      kPselect6 = 270, kPpoll = 271, kEpollPwait = 281, kAccept4 = 288, kIoPgetevents = 333,
                      kMemfdCreate = 319, kEpollPwait2 = 441;
}  // namespace nr

inline constexpr uint64_t kRedZone = 128;       // System V ABI 3.2.2
inline constexpr uint64_t kStackAlign = 16;     // rsp % 16 == 0 before `call`
inline constexpr uint64_t kSyscallInsnLen = 2;  // 0f 05

// This architecture's system calls that the restart rules single out (the
// rules and what each list means: arch/syscall_restart.h). A static table.
const RestartTable& restart_table();
// Whether restart_table() lists `nr` as never restarted after a stop (such a
// call returns -EINTR even when no signal was delivered), or as swapping the
// signal mask for its duration.
bool never_restarted(long nr);
bool swaps_signal_mask(long nr);

// Classifies how the thread whose registers are `r` (at a ptrace stop) must be
// resumed: the interrupted call is orig_rax, its return value rax.
// `signal_pending` says whether an unblocked signal is pending for it (then an
// -EINTR is genuine and must be kept).
RestartKind classify_restart(const Regs& r, bool signal_pending);

// The registers the thread must resume with so that the interrupted call
// completes transparently, with orig_rax = -1 (no further restart logic).
// For kRestartBlock, `use_restart_syscall` chooses restart_syscall (exact
// remaining timeout; only valid while the kernel's restart_block is intact)
// or re-issuing the original call (used in the self-restoring frame, because
// rt_sigreturn resets restart_block).
Regs resume_registers(const Regs& r, RestartKind kind, bool use_restart_syscall);

// A thread released right after the kernel rewound it for restart_syscall
// stands on its `syscall` instruction with rax = restart_syscall, outside the
// kernel (orig_rax -1). Its interrupted call lives on only in the kernel's
// restart_block, which any rt_sigreturn resets: such a thread must be saved
// and restored like one stopped inside restart_syscall, never through a
// signal frame. True for those registers, given that the instruction at rip
// is `syscall` (the caller reads it).
bool awaits_restart_syscall(const Regs& r);
// The registers of that thread as if stopped inside restart_syscall
// (rip past the instruction, orig_rax restart_syscall, rax
// -ERESTART_RESTARTBLOCK): resume_registers(..., kRestartBlock, true) gives
// back exactly `r`, apart from orig_rax.
Regs as_stopped_in_restart_syscall(const Regs& r);

// ---- the kernel's signal frame (arch/x86/include/uapi/asm/sigcontext.h) ----
struct SigContext {
  uint64_t r8, r9, r10, r11, r12, r13, r14, r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, eflags;
  uint16_t cs, gs, fs, ss;
  uint64_t err, trapno, oldmask, cr2;
  uint64_t fpstate;  // address of the xsave area (64-byte aligned)
  uint64_t reserved1[8];
};
static_assert(sizeof(SigContext) == 256);

struct StackT {
  uint64_t ss_sp;
  int32_t ss_flags;
  int32_t pad;
  uint64_t ss_size;
};

struct UContext {
  uint64_t uc_flags;
  uint64_t uc_link;
  StackT uc_stack;
  SigContext uc_mcontext;
  uint64_t uc_sigmask;  // the kernel's sigset_t is 64 bits on x86_64
};
static_assert(sizeof(UContext) == 304);

inline constexpr uint64_t kUcFpXstate = 0x1, kUcSigcontextSs = 0x2, kUcStrictRestoreSs = 0x4;
inline constexpr int32_t kSsFlagsInvalid = 3;  // SS_ONSTACK|SS_DISABLE: rejected by sigaltstack

// Builds the sigcontext for `r` (already resume-adjusted).
SigContext sigcontext_from(const Regs& r, uint64_t fpstate_addr);

// The frame's fpstate (the xsave image and its sizes) is built by
// build_sig_fpstate (arch/x86_64_xstate.h).

// ---- stub code, written at the start of the scratch mapping ----
//
// Assembled from src/arch/x86_64_stub.S, the one source of these bytes (the
// agent links the same file and exports the block as remora_agent_stub);
// the offsets below come from x86_64_stub.h, which places the code there.
//
// At entry to either stub: rbx = address of the frame's ucontext (rt_sigreturn
// finds the frame at rsp - 8), rsp = a 16-byte aligned stack below the frame.
//
//  call stub   (r11 = function, rdi..r9 = arguments, rax = 0):
//    call *%r11; mov %rax,%rdi; mov $15,%eax; mov %rbx,%rsp; syscall; ud2
//  syscall stub (rax = number, rdi,rsi,rdx,r10,r8,r9 = arguments):
//    syscall;    mov %rax,%rdi; mov $15,%eax; mov %rbx,%rsp; syscall; ud2
//
// Both end in rt_sigreturn on the frame, so a thread whose controller died
// restores itself. A live controller stops the thread at the rt_sigreturn
// syscall-entry (PTRACE_SYSCALL) and reads the result from rdi; then it lets
// that rt_sigreturn run when the frame holds the exact resume state, and
// restores the thread through ptrace otherwise (see remote/target.cc).
//  thread trampoline (a pthread start routine; rdi = a LoaderBlock):
//    records its tid, detaches itself, dlopen(path, flags), records the
//    handle and dlerror(), then sets `done` as its last store and returns
//    into libc's thread exit. Used to load the agent on a fresh thread, so
//    that dlopen never runs on an interrupted application thread.
//  marked call stub (r11 = function, rdi..r9 = arguments, rbx = &frame.uc,
//  r12 = a 16-byte result slot, r13 = marker signal, r14 = cookie):
//    call *%r11; mov %rax,(%r12); mov %r14,8(%r12);
//    tgkill(getpid(), gettid(), r13); rt_sigreturn on the frame; ud2
//    The function runs under PTRACE_CONT, so its own system calls cost no
//    stops. Every signal is blocked while it runs, so the marker stays
//    pending until rt_sigreturn has restored the thread; then it is
//    dequeued, and a tracer sees a signal-delivery stop of exactly that
//    signal with the thread already restored. Untraced (the controller
//    died) the marker is a signal the process ignores, and is discarded.
//  scratch setup (a function: rdi = base, rsi = size, rdx = name, rcx =
//  next function or 0, r8 = its argument): makes the data pages writable
//  and says so in the setup status word (kSetupStatus), names the mapping,
//  keeps it from forks, then tail-calls next(arg) if there is one. Run once
//  as the call that completes a new scratch mapping (x86_64_stub.S tells
//  each step).
struct Stub {
  static constexpr uint64_t kThreadTrampoline = REMORA_X86_64_STUB_THREAD_TRAMPOLINE;
  static constexpr uint64_t kThreadHook = REMORA_X86_64_STUB_THREAD_HOOK;  // the trampoline's end
  static constexpr uint64_t kCallEntry = REMORA_X86_64_STUB_CALL_ENTRY;
  static constexpr uint64_t kCallReturnSyscallEnd = REMORA_X86_64_STUB_CALL_RETURN_SYSCALL_END;
  static constexpr uint64_t kSyscallEntry = REMORA_X86_64_STUB_SYSCALL_ENTRY;
  static constexpr uint64_t kSyscallEnd = REMORA_X86_64_STUB_SYSCALL_END;
  static constexpr uint64_t kSyscallReturnSyscallEnd = REMORA_X86_64_STUB_SYSCALL_RETURN_SYSCALL_END;
  static constexpr uint64_t kMarkedCallEntry = REMORA_X86_64_STUB_MARKED_CALL_ENTRY;
  static constexpr uint64_t kMarkedCallReturnSyscallEnd = REMORA_X86_64_STUB_MARKED_CALL_RETURN_SYSCALL_END;
  static constexpr uint64_t kScratchSetup = REMORA_X86_64_STUB_SCRATCH_SETUP;
  static constexpr uint64_t kSetupStatus = REMORA_X86_64_SETUP_STATUS;  // base-relative
  static constexpr uint64_t kLoaderStart = REMORA_X86_64_STUB_LOADER_START;
  static constexpr size_t kSize = REMORA_X86_64_STUB_SIZE;
};
// A copy of the assembled block. Defined on x86_64 hosts only, where the
// .S is assembled: the controller's engine runs nowhere else. Never fails.
std::array<std::byte, Stub::kSize> stub_code();

// The block the thread trampoline works on (arch/loader_block.h).
using LoaderBlock = arch::LoaderBlock;
using LoaderStart = arch::LoaderStart;

// glibc's __restore_rt (the sa_restorer it installs): mov $15,%rax; syscall.
inline constexpr std::array<uint8_t, 9> kRestoreRtPattern = {0x48, 0xc7, 0xc0, 0x0f, 0x00,
                                                             0x00, 0x00, 0x0f, 0x05};
// glibc's syscall(): the instruction after its `syscall` is cmp $-4095,%rax.
inline constexpr std::array<uint8_t, 8> kSyscallFnTail = {0x0f, 0x05, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff};

}  // namespace remora::arch::x86_64
