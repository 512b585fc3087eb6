#include "arch/aarch64.h"

#include <cerrno>

namespace remora::arch::aarch64 {

bool never_restarted(long n) {
  switch (n) {
    case nr::kEpollPwait:
    case nr::kEpollPwait2:
    case nr::kRtSigtimedwait:
    case nr::kSemop:
    case nr::kSemtimedop:
    case nr::kIoGetevents:
    case nr::kIoPgetevents:
    case nr::kMsgrcv: return true;
    default: return false;
  }
}

bool swaps_signal_mask(long n) {
  switch (n) {
    case nr::kRtSigsuspend:
    case nr::kPpoll:
    case nr::kPselect6:
    case nr::kEpollPwait:
    case nr::kEpollPwait2:
    case nr::kIoPgetevents: return true;
    default: return false;
  }
}

RestartKind classify_restart(long interrupted_nr, int64_t ret, bool signal_pending) {
  if (interrupted_nr < 0) return RestartKind::kNone;
  if (ret == kERestartRestartBlock) return RestartKind::kRestartBlock;
  if (is_restart_code(ret)) return RestartKind::kRestart;
  if (ret == -EINTR && never_restarted(interrupted_nr) && !signal_pending)
    return RestartKind::kReissueOnEintr;
  return RestartKind::kNone;
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
