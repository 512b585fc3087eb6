#include "arch/x86_64.h"

#include <cstring>

namespace remora::arch::x86_64 {

// The calls the restart rules single out (arch/syscall_restart.h), with
// the numbers of arch/x86/entry/syscalls/syscall_64.tbl. arch_test checks that
// aarch64's table names the same calls, less those aarch64 lacks.
constexpr SyscallName kNeverRestarted[] = {
    {"epoll_wait", nr::kEpollWait},
    {"epoll_pwait", nr::kEpollPwait},
    {"epoll_pwait2", nr::kEpollPwait2},
    {"rt_sigtimedwait", nr::kRtSigtimedwait},
    {"semop", nr::kSemop},
    {"semtimedop", nr::kSemtimedop},
    {"io_getevents", nr::kIoGetevents},
    {"io_pgetevents", nr::kIoPgetevents},
    {"msgrcv", nr::kMsgrcv},
};
constexpr SyscallName kSwapsSignalMask[] = {
    {"rt_sigsuspend", nr::kRtSigsuspend}, {"ppoll", nr::kPpoll},
    {"pselect6", nr::kPselect6},          {"epoll_pwait", nr::kEpollPwait},
    {"epoll_pwait2", nr::kEpollPwait2},   {"io_pgetevents", nr::kIoPgetevents},
};
constexpr RestartTable kRestartTable = {kNeverRestarted, kSwapsSignalMask};

const RestartTable& restart_table() { return kRestartTable; }

bool never_restarted(long n) { return arch::never_restarted(kRestartTable, n); }

bool swaps_signal_mask(long n) { return arch::swaps_signal_mask(kRestartTable, n); }

RestartKind classify_restart(const Regs& r, bool signal_pending) {
  return arch::classify_restart(kRestartTable, static_cast<long>(r.orig_rax), static_cast<int64_t>(r.rax),
                                signal_pending);
}

Regs resume_registers(const Regs& r, RestartKind kind, bool use_restart_syscall) {
  Regs out = r;
  out.orig_rax = ~uint64_t{0};  // -1: the kernel must not apply its own restart logic again
  switch (kind) {
    case RestartKind::kNone: break;
    case RestartKind::kRestart:
    case RestartKind::kReissueOnEintr:
      out.rax = r.orig_rax;
      out.rip = r.rip - kSyscallInsnLen;
      break;
    case RestartKind::kRestartBlock:
      out.rax = use_restart_syscall ? static_cast<uint64_t>(nr::kRestartSyscall) : r.orig_rax;
      out.rip = r.rip - kSyscallInsnLen;
      break;
  }
  return out;
}

bool awaits_restart_syscall(const Regs& r) {
  return static_cast<int64_t>(r.orig_rax) < 0 && r.rax == static_cast<uint64_t>(nr::kRestartSyscall);
}

Regs as_stopped_in_restart_syscall(const Regs& r) {
  Regs out = r;
  out.rip = r.rip + kSyscallInsnLen;
  out.orig_rax = static_cast<uint64_t>(nr::kRestartSyscall);
  out.rax = static_cast<uint64_t>(kERestartRestartBlock);
  return out;
}

SigContext sigcontext_from(const Regs& r, uint64_t fpstate_addr) {
  SigContext sc{};
  sc.r8 = r.r8;
  sc.r9 = r.r9;
  sc.r10 = r.r10;
  sc.r11 = r.r11;
  sc.r12 = r.r12;
  sc.r13 = r.r13;
  sc.r14 = r.r14;
  sc.r15 = r.r15;
  sc.rdi = r.rdi;
  sc.rsi = r.rsi;
  sc.rbp = r.rbp;
  sc.rbx = r.rbx;
  sc.rdx = r.rdx;
  sc.rax = r.rax;
  sc.rcx = r.rcx;
  sc.rsp = r.rsp;
  sc.rip = r.rip;
  sc.eflags = r.eflags;
  sc.cs = static_cast<uint16_t>(r.cs);
  sc.ss = static_cast<uint16_t>(r.ss);
  sc.fpstate = fpstate_addr;
  return sc;
}

// The numbers the stub's code is built from (x86_64_stub.h, read by the
// assembler) are this header's numbers: a change to one side that forgets the
// other stops the build here rather than running wrong code in a target.
static_assert(offsetof(LoaderBlock, dlopen_fn) == REMORA_X86_64_LOADER_DLOPEN_FN);
static_assert(offsetof(LoaderBlock, path) == REMORA_X86_64_LOADER_PATH);
static_assert(offsetof(LoaderBlock, flags) == REMORA_X86_64_LOADER_FLAGS);
static_assert(offsetof(LoaderBlock, pthread_self_fn) == REMORA_X86_64_LOADER_PTHREAD_SELF_FN);
static_assert(offsetof(LoaderBlock, pthread_detach_fn) == REMORA_X86_64_LOADER_PTHREAD_DETACH_FN);
static_assert(offsetof(LoaderBlock, done) == REMORA_X86_64_LOADER_DONE);
static_assert(offsetof(LoaderBlock, handle) == REMORA_X86_64_LOADER_HANDLE);
static_assert(offsetof(LoaderBlock, tid) == REMORA_X86_64_LOADER_TID);
static_assert(offsetof(LoaderBlock, dlerror_fn) == REMORA_X86_64_LOADER_DLERROR_FN);
static_assert(offsetof(LoaderBlock, error) == REMORA_X86_64_LOADER_ERROR);
static_assert(offsetof(LoaderBlock, dlsym_fn) == REMORA_X86_64_LOADER_DLSYM_FN);
static_assert(offsetof(LoaderBlock, hook_name) == REMORA_X86_64_LOADER_HOOK_NAME);
static_assert(offsetof(LoaderBlock, hook_arg) == REMORA_X86_64_LOADER_HOOK_ARG);
static_assert(offsetof(LoaderBlock, hook_rc) == REMORA_X86_64_LOADER_HOOK_RC);
static_assert(offsetof(LoaderStart, pthread_create_fn) == REMORA_X86_64_START_PTHREAD_CREATE_FN);
static_assert(offsetof(LoaderStart, attr_init_fn) == REMORA_X86_64_START_ATTR_INIT_FN);
static_assert(offsetof(LoaderStart, attr_setstack_fn) == REMORA_X86_64_START_ATTR_SETSTACK_FN);
static_assert(offsetof(LoaderStart, stack_hint) == REMORA_X86_64_START_STACK_HINT);
static_assert(offsetof(LoaderStart, stack_size) == REMORA_X86_64_START_STACK_SIZE);
static_assert(offsetof(LoaderStart, attr) == REMORA_X86_64_START_ATTR);
static_assert(offsetof(LoaderStart, thread_out) == REMORA_X86_64_START_THREAD_OUT);
static_assert(offsetof(LoaderStart, trampoline) == REMORA_X86_64_START_TRAMPOLINE);
static_assert(offsetof(LoaderStart, block) == REMORA_X86_64_START_BLOCK);
static_assert(offsetof(LoaderStart, stack) == REMORA_X86_64_START_STACK);
static_assert(offsetof(LoaderStart, attr_status) == REMORA_X86_64_START_ATTR_STATUS);
static_assert(offsetof(LoaderStart, created) == REMORA_X86_64_START_CREATED);
// (tgkill, 234, is not in nr:: yet; the stub's own table names it.)
static_assert(nr::kRtSigreturn == REMORA_X86_64_NR_RT_SIGRETURN && nr::kMadvise == REMORA_X86_64_NR_MADVISE &&
              nr::kGetpid == REMORA_X86_64_NR_GETPID && nr::kPrctl == REMORA_X86_64_NR_PRCTL &&
              nr::kGettid == REMORA_X86_64_NR_GETTID && nr::kMmap == REMORA_X86_64_NR_MMAP &&
              nr::kMprotect == REMORA_X86_64_NR_MPROTECT);

#if defined(__x86_64__)
// Only where x86_64_stub.S is assembled (src/arch/CMakeLists.txt): the arch
// layer compiles on every host, the block exists on x86_64 hosts alone.
std::array<std::byte, Stub::kSize> stub_code() {
  std::array<std::byte, Stub::kSize> code;
  std::memcpy(code.data(), remora_x86_64_stub, code.size());
  return code;
}
#endif

}  // namespace remora::arch::x86_64
