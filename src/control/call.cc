// Process::call: run a function of the target on one stopped thread while
// every other thread stays stopped. The return address is a temporary
// breakpoint at the program's entry point (AT_ENTRY runs once at start-up and
// never again), passed as the architecture's calling convention wants it: on
// the stack (x86_64) or in the link register (aarch64's x30); the thread's
// registers, extended state and signal mask are saved first and restored on
// every way out.
#include <signal.h>

#include <cstring>

#include "arch/arch.h"
#include "control/process_impl.h"

namespace remora::control {
namespace {

using Kind = ptrace::Stop::Kind;

// What a call changes in the target, and puts back in its destructor (the
// thread only when it is stopped to be written to: see `thread_stopped`).
class SavedCallState {
 public:
  static Result<SavedCallState> save(remote::Memory& mem, pid_t tid, uint64_t ret_addr) {
    SavedCallState s(mem, tid, ret_addr);
    s.regs_ = REMORA_TRY(ptrace::get_regs(tid));
    s.xstate_ = REMORA_TRY(ptrace::get_xstate(tid));
    s.mask_ = REMORA_TRY(ptrace::get_sigmask(tid));
    REMORA_TRY(mem.read(ret_addr, s.orig_));
    REMORA_TRY(mem.write(ret_addr, arch::kBreakpointBytes));
    s.armed_ = true;
    return s;
  }
  SavedCallState(SavedCallState&& o) noexcept
      : thread_stopped(o.thread_stopped),
        mem_(o.mem_),
        tid_(o.tid_),
        ret_addr_(o.ret_addr_),
        regs_(o.regs_),
        xstate_(std::move(o.xstate_)),
        mask_(o.mask_),
        orig_(o.orig_),
        armed_(std::exchange(o.armed_, false)) {}
  SavedCallState& operator=(SavedCallState&&) = delete;
  ~SavedCallState() {
    if (!armed_) return;
    (void)mem_.write(ret_addr_, orig_);
    if (!thread_stopped) return;  // it cannot be written to; the caller says why
    (void)ptrace::set_xstate(tid_, xstate_);
    (void)ptrace::set_sigmask(tid_, mask_);
    (void)ptrace::set_regs(tid_, regs_);
  }
  const arch::HostRegs& regs() const { return regs_; }
  // False while the thread runs (or after it died): then only the memory is
  // put back.
  bool thread_stopped = true;

 private:
  SavedCallState(remote::Memory& mem, pid_t tid, uint64_t ret_addr)
      : mem_(mem), tid_(tid), ret_addr_(ret_addr) {}
  remote::Memory& mem_;
  pid_t tid_;
  uint64_t ret_addr_;
  arch::HostRegs regs_{};
  std::vector<std::byte> xstate_;
  uint64_t mask_ = 0;
  InsnBytes orig_{};
  bool armed_ = false;
};

}  // namespace

Result<uint64_t> Process::call(RemoteAddr fn, std::span<const uint64_t> args, pid_t tid,
                               std::chrono::milliseconds timeout) {
  Impl& p = *impl_;
  if (!p.mem || p.closed || !p.alive) return Error(Errc::kTargetExited, "the process is gone or closed");
  if (args.size() > arch::kMaxCallArgs)
    return Error(Errc::kInvalidArgument, "at most " + std::to_string(arch::kMaxCallArgs) + " arguments");
  if (tid == 0 && !p.threads.empty()) tid = p.threads.begin()->first;
  auto it = p.threads.find(tid);
  if (it == p.threads.end() || !it->second.stopped)
    return Error(Errc::kInvalidArgument,
                 "thread " + pid_str(tid) + " is not a stopped thread of the process");
  if (p.at_entry == 0) return Error(Errc::kNotSupported, "no entry point to return to");
  auto saved = REMORA_TRY(SavedCallState::save(*p.mem, tid, p.at_entry));

  auto regs = saved.regs();
  const uint64_t sp = arch::call_sp(arch::sp(regs));
  const uint64_t ret = p.at_entry;
  if (!arch::kReturnAddressInRegister) REMORA_TRY(p.mem->write(sp, std::as_bytes(std::span(&ret, 1))));
  arch::set_call(regs, fn.addr(), args);
  arch::set_return_address(regs, ret);
  arch::set_sp(regs, sp);
  (void)ptrace::set_sigmask(tid, ~uint64_t{0});
  (void)ptrace::set_regs(tid, regs);
  REMORA_TRY(ptrace::cont(tid, 0));
  it->second.stopped = false;
  saved.thread_stopped = false;

  Deadline dl = Deadline::after(timeout);
  const pid_t one[] = {tid};
  for (;;) {
    auto w = ptrace::wait_any(one, dl);
    if (w.kind == ptrace::Waited::Kind::kTimeout) {
      (void)ptrace::interrupt(tid);
      auto w2 = ptrace::wait_any(one, Deadline::after(kStopAllTimeout));
      if (w2.kind == ptrace::Waited::Kind::kStop && !ended(w2.stop)) {
        p.threads[tid].stopped = true;
        saved.thread_stopped = true;
      }
      return Error(Errc::kTimedOut, "the remote call did not return in time; the thread was restored");
    }
    if (w.kind != ptrace::Waited::Kind::kStop) continue;
    if (ended(w.stop)) {
      p.threads.erase(tid);
      if (tid == p.pid) p.alive = false;
      return Error(Errc::kTargetExited, "the process died during the remote call");
    }
    p.threads[tid].stopped = true;
    saved.thread_stopped = true;
    if (w.stop.kind == Kind::kSignalDelivery) {
      if (w.stop.sig == SIGTRAP) {
        auto r = ptrace::get_regs(tid);
        if (r && arch::breakpoint_address(arch::pc(*r)) == p.at_entry) return arch::return_value(*r);
      }
      // Only a fault of the called code ends the call; the same signal sent
      // with kill is the process's, kept for later like any other.
      auto si = ptrace::get_siginfo(tid);
      if (si && ptrace::is_fault(*si))
        return Error(Errc::kFault, "the called function faulted with signal " + std::to_string(w.stop.sig) +
                                       " (" + strsignal(w.stop.sig) + ")");
      p.threads[tid].pending_sig = w.stop.sig;
    }
    if (w.stop.kind == Kind::kEvent && w.stop.event == PTRACE_EVENT_CLONE) {
      auto ntid = static_cast<pid_t>(ptrace::get_event_msg(tid).value_or(0));
      if (ntid > 0) p.threads[ntid] = Impl::Thread{false, true, 0};
    }
    saved.thread_stopped = false;
    (void)ptrace::cont(tid, 0);
    p.threads[tid].stopped = false;
  }
}

}  // namespace remora::control
