#include "arch/aarch64.h"

#include <cstring>

namespace remora::arch::aarch64 {

// The calls the restart rules single out (arch/syscall_restart.h), with
// the numbers of include/uapi/asm-generic/unistd.h.
constexpr SyscallName kNeverRestarted[] = {
    {"epoll_pwait", nr::kEpollPwait},         {"epoll_pwait2", nr::kEpollPwait2},
    {"rt_sigtimedwait", nr::kRtSigtimedwait}, {"semop", nr::kSemop},
    {"semtimedop", nr::kSemtimedop},          {"io_getevents", nr::kIoGetevents},
    {"io_pgetevents", nr::kIoPgetevents},     {"msgrcv", nr::kMsgrcv},
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

RestartKind classify_restart(long interrupted_nr, int64_t ret, bool signal_pending) {
  return arch::classify_restart(kRestartTable, interrupted_nr, ret, signal_pending);
}

RestartKind classify_restart(const Regs& r, bool signal_pending) {
  return classify_restart(static_cast<long>(r.syscallno), static_cast<int64_t>(r.x[0]), signal_pending);
}

Regs resume_registers(const Regs& r, RestartKind kind, bool use_restart_syscall) {
  Regs out = r;
  out.syscallno = -1;  // the kernel must not apply its own restart logic again
  switch (kind) {
    case RestartKind::kNone: break;
    case RestartKind::kRestart:
    case RestartKind::kReissueOnEintr:
      out.x[0] = r.orig_x0;
      out.x[8] = static_cast<uint64_t>(r.syscallno);
      out.pc = r.pc - kSyscallInsnLen;
      break;
    case RestartKind::kRestartBlock:
      out.x[0] = r.orig_x0;
      out.x[8] = use_restart_syscall ? static_cast<uint64_t>(nr::kRestartSyscall)
                                     : static_cast<uint64_t>(r.syscallno);
      out.pc = r.pc - kSyscallInsnLen;
      break;
  }
  return out;
}

bool awaits_restart_syscall(const Regs& r) { return r.syscallno < 0; }

Regs as_stopped_in_restart_syscall(const Regs& r) {
  Regs out = r;
  out.pc = r.pc + kSyscallInsnLen;
  out.syscallno = static_cast<int64_t>(r.x[8]);
  out.orig_x0 = r.x[0];
  out.x[0] = static_cast<uint64_t>(
      r.x[8] == static_cast<uint64_t>(nr::kRestartSyscall) ? kERestartRestartBlock : kERestartSys);
  return out;
}

bool uses_restart_block(long n, const std::array<uint64_t, 6>& a) {
  constexpr uint64_t kTimerAbstime = 1, kFutexCmdMask = 127, kFutexWait = 0, kFutexWaitBitset = 9;
  if (n == nr::kNanosleep) return true;
  if (n == nr::kClockNanosleep) return (a[1] & kTimerAbstime) == 0;
  if (n == nr::kFutex) {
    const uint64_t op = a[1] & kFutexCmdMask;
    return (op == kFutexWait || op == kFutexWaitBitset) && a[3] != 0;  // a wait with a timeout
  }
  return false;
}

Regs with_entry_args(const Regs& r, long n, const std::array<uint64_t, 6>& args, uint64_t entry_pc) {
  if (n < 0 || entry_pc != r.pc || r.x[8] != static_cast<uint64_t>(n)) return r;
  for (size_t i = 1; i < 6; ++i)
    if (r.x[i] != args[i]) return r;
  Regs out = r;
  if (r.syscallno < 0) {
    // Past its `svc`: a call the kernel does not restart returned (-EINTR).
    out.syscallno = n;
    out.orig_x0 = args[0];
    return out;
  }
  // Rewound onto its `svc` (as_stopped_in_restart_syscall has made it "in"
  // call n) after /proc saw it blocked in a call that, interrupted, returns
  // -ERESTART_RESTARTBLOCK and has just set the kernel's restart_block: it
  // resumes through restart_syscall, keeping what is left of its timeout.
  if (r.syscallno == n && r.orig_x0 == args[0] && uses_restart_block(n, args))
    out.x[0] = static_cast<uint64_t>(kERestartRestartBlock);
  return out;
}

namespace {
uint32_t word_at(std::span<const uint8_t> b, size_t at) {
  uint32_t w = 0;
  std::memcpy(&w, b.data() + at, 4);
  return w;
}
// movz x<rd>/w<rd>, #imm16 (no shift): its immediate, or -1.
long movz_imm(uint32_t insn, unsigned rd) {
  const uint32_t opc = insn & 0xffe0001fu;
  if (opc != (0xd2800000u | rd) && opc != (0x52800000u | rd)) return -1;
  return static_cast<long>((insn >> 5) & 0xffff);
}
}  // namespace

std::optional<long> wrapper_syscall_nr(std::span<const uint8_t, 9> b) {
  const long n = movz_imm(word_at(b, 5), 8);
  if (n < 0 || n > 1024) return std::nullopt;
  return n;
}

// glibc's syscall() shifts its arguments down one register before its
// `svc`: glibc 2.36 ends with `mov x5, x6; mov x6, x7`, older ones with
// `mov x5, x6`.
bool is_generic_syscall_fn(std::span<const uint8_t, 9> b) {
  const uint32_t last = word_at(b, 5);
  return (last == 0xaa0703e6u && word_at(b, 1) == 0xaa0603e5u) || last == 0xaa0603e5u;
}

std::optional<long> caller_syscall_nr(std::span<const uint8_t> c) {
  if (c.size() < 8) return std::nullopt;
  // The return address follows the `bl`; scan the instructions before it,
  // nearest first.
  for (size_t at = (c.size() - 4) & ~size_t{3}; at >= 4; at -= 4) {
    const long n = movz_imm(word_at(c, at - 4), 0);
    if (n == nr::kFutex || n == nr::kNanosleep || n == nr::kClockNanosleep) return n;
  }
  return std::nullopt;
}

// The numbers the stub's code is built from (aarch64_stub.h) are this
// header's numbers.
static_assert(offsetof(LoaderBlock, dlopen_fn) == REMORA_AARCH64_LOADER_DLOPEN_FN);
static_assert(offsetof(LoaderBlock, path) == REMORA_AARCH64_LOADER_PATH);
static_assert(offsetof(LoaderBlock, flags) == REMORA_AARCH64_LOADER_FLAGS);
static_assert(offsetof(LoaderBlock, pthread_self_fn) == REMORA_AARCH64_LOADER_PTHREAD_SELF_FN);
static_assert(offsetof(LoaderBlock, pthread_detach_fn) == REMORA_AARCH64_LOADER_PTHREAD_DETACH_FN);
static_assert(offsetof(LoaderBlock, done) == REMORA_AARCH64_LOADER_DONE);
static_assert(offsetof(LoaderBlock, handle) == REMORA_AARCH64_LOADER_HANDLE);
static_assert(offsetof(LoaderBlock, tid) == REMORA_AARCH64_LOADER_TID);
static_assert(offsetof(LoaderBlock, dlerror_fn) == REMORA_AARCH64_LOADER_DLERROR_FN);
static_assert(offsetof(LoaderBlock, error) == REMORA_AARCH64_LOADER_ERROR);
static_assert(offsetof(LoaderBlock, dlsym_fn) == REMORA_AARCH64_LOADER_DLSYM_FN);
static_assert(offsetof(LoaderBlock, hook_name) == REMORA_AARCH64_LOADER_HOOK_NAME);
static_assert(offsetof(LoaderBlock, hook_arg) == REMORA_AARCH64_LOADER_HOOK_ARG);
static_assert(offsetof(LoaderBlock, hook_rc) == REMORA_AARCH64_LOADER_HOOK_RC);
static_assert(offsetof(LoaderStart, pthread_create_fn) == REMORA_AARCH64_START_PTHREAD_CREATE_FN);
static_assert(offsetof(LoaderStart, attr_init_fn) == REMORA_AARCH64_START_ATTR_INIT_FN);
static_assert(offsetof(LoaderStart, attr_setstack_fn) == REMORA_AARCH64_START_ATTR_SETSTACK_FN);
static_assert(offsetof(LoaderStart, stack_hint) == REMORA_AARCH64_START_STACK_HINT);
static_assert(offsetof(LoaderStart, stack_size) == REMORA_AARCH64_START_STACK_SIZE);
static_assert(offsetof(LoaderStart, attr) == REMORA_AARCH64_START_ATTR);
static_assert(offsetof(LoaderStart, thread_out) == REMORA_AARCH64_START_THREAD_OUT);
static_assert(offsetof(LoaderStart, trampoline) == REMORA_AARCH64_START_TRAMPOLINE);
static_assert(offsetof(LoaderStart, block) == REMORA_AARCH64_START_BLOCK);
static_assert(offsetof(LoaderStart, stack) == REMORA_AARCH64_START_STACK);
static_assert(offsetof(LoaderStart, attr_status) == REMORA_AARCH64_START_ATTR_STATUS);
static_assert(offsetof(LoaderStart, created) == REMORA_AARCH64_START_CREATED);
static_assert(nr::kRtSigreturn == REMORA_AARCH64_NR_RT_SIGRETURN && nr::kTgkill == REMORA_AARCH64_NR_TGKILL &&
              nr::kGetpid == REMORA_AARCH64_NR_GETPID && nr::kGettid == REMORA_AARCH64_NR_GETTID &&
              nr::kPrctl == REMORA_AARCH64_NR_PRCTL && nr::kMadvise == REMORA_AARCH64_NR_MADVISE &&
              nr::kMmap == REMORA_AARCH64_NR_MMAP && nr::kMprotect == REMORA_AARCH64_NR_MPROTECT);

#if defined(__aarch64__)
std::array<std::byte, Stub::kSize> stub_code() {
  std::array<std::byte, Stub::kSize> code;
  std::memcpy(code.data(), remora_aarch64_stub, code.size());
  return code;
}
#endif

}  // namespace remora::arch::aarch64
