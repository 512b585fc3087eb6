// Breakpoints of a control::Process: written into the target only while its
// threads run (inserted just before resuming them, removed as soon as all of
// them are stopped again), so that no stop ever shows one in memory.
#include <algorithm>

#include "arch/arch.h"
#include "control/process_impl.h"

namespace remora::control {

Result<void> Process::Impl::insert_bps() {
  if (vfork_child_running || shares_parent_mm) return ok();
  for (uint64_t a : bp_addrs) {
    if (inserted.count(a) != 0) continue;
    InsnBytes orig{};
    REMORA_TRY_CTX(mem->read(a, orig), "insert breakpoint");
    REMORA_TRY_CTX(mem->write(a, arch::kBreakpointBytes), "insert breakpoint");
    inserted[a] = orig;
  }
  return ok();
}

void Process::Impl::remove_bps(bool write_memory) {
  last_removed = inserted;
  if (write_memory && mem)
    for (auto& [a, orig] : inserted) (void)mem->write(a, orig);
  inserted.clear();
}

std::optional<uint64_t> Process::Impl::hit_breakpoint(pid_t tid) {
  // Only a trap the kernel raised for a breakpoint instruction (SI_KERNEL
  // for int3, TRAP_BRKPT for brk): a SIGTRAP sent with kill, or a
  // single-step, is not ours.
  auto si = ptrace::get_siginfo(tid);
  if (!si || si->si_code != arch::kBreakpointTrapCode) return std::nullopt;
  auto regs = ptrace::get_regs(tid);
  if (!regs) return std::nullopt;
  const uint64_t at = arch::breakpoint_address(arch::pc(*regs));
  if (inserted.count(at) == 0) return std::nullopt;
  arch::set_pc(*regs, at);
  (void)ptrace::set_regs(tid, *regs);
  return at;
}

void Process::Impl::step_over_bps() {
  if (bp_addrs.empty()) return;
  for (auto& [tid, t] : threads) {
    if (!t.stopped) continue;
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto regs = ptrace::get_regs(tid);
      if (!regs || bp_addrs.count(arch::pc(*regs)) == 0) break;
      if (!ptrace::single_step(tid)) break;
      t.stopped = false;
      const pid_t one[] = {tid};
      auto w = ptrace::wait_any(one, Deadline::after(kStopAllTimeout));
      if (w.kind != ptrace::Waited::Kind::kStop) {
        if (w.kind == ptrace::Waited::Kind::kVanished) threads.erase(tid);
        return;  // iterator may be invalid: stop here, the rest will hit and be handled
      }
      if (w.stop.kind == ptrace::Stop::Kind::kSignalDelivery && w.stop.sig == SIGTRAP) {
        t.stopped = true;
        break;
      }
      if (auto r = handle_stop(tid, w.stop, true)) queued.push_back(*r);
      if (threads.count(tid) == 0) return;
    }
  }
}

}  // namespace remora::control
