#include "arch/syscall_restart.h"

#include <algorithm>
#include <cerrno>

namespace remora::arch {
namespace {

bool lists(std::span<const SyscallName> calls, long nr) {
  return nr >= 0 &&
         std::any_of(calls.begin(), calls.end(), [nr](const SyscallName& c) { return c.nr == nr; });
}

}  // namespace

bool never_restarted(const RestartTable& table, long nr) { return lists(table.never_restarted, nr); }

bool swaps_signal_mask(const RestartTable& table, long nr) { return lists(table.swaps_signal_mask, nr); }

RestartKind classify_restart(const RestartTable& table, long interrupted_nr, int64_t ret,
                             bool signal_pending) {
  if (interrupted_nr < 0) return RestartKind::kNone;  // stopped outside a system call
  if (ret == kERestartRestartBlock) return RestartKind::kRestartBlock;
  if (is_restart_code(ret)) return RestartKind::kRestart;
  // epoll_wait and friends return -EINTR after any stop. If no signal is
  // pending, the stop that caused it was ours: re-issue the call.
  if (ret == -EINTR && never_restarted(table, interrupted_nr) && !signal_pending)
    return RestartKind::kReissueOnEintr;
  return RestartKind::kNone;
}

}  // namespace remora::arch
