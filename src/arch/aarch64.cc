#include "arch/aarch64.h"

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

// The kernel has already rewound the PC and put orig_x0 back (aarch64.h), so
// the interrupted number comes from the caller, not from the registers.
RestartKind classify_restart(long interrupted_nr, int64_t ret, bool signal_pending) {
  return arch::classify_restart(kRestartTable, interrupted_nr, ret, signal_pending);
}

std::array<uint32_t, Stub::kSize / 4> stub_code() {
  std::array<uint32_t, Stub::kSize / 4> code;
  code.fill(encode_brk(0x52));
  const uint32_t tail[] = {encode_movz(8, nr::kRtSigreturn), encode_mov_to_sp(19), encode_svc0(),
                           encode_brk(0)};
  size_t i = Stub::kCallEntry / 4;
  code[i++] = encode_blr(16);
  for (uint32_t w : tail) code[i++] = w;
  i = Stub::kSyscallEntry / 4;
  code[i++] = encode_svc0();
  for (uint32_t w : tail) code[i++] = w;
  return code;
}

}  // namespace remora::arch::aarch64
