// The remote call engine's transaction. See target.h for the contract and
// transaction.h for the object; this file explains the mechanics, in the
// order a call performs them.
//
// A call is a transaction on one thread T:
//   seize + interrupt T            (nothing changed yet: if we die, the kernel
//                                   detaches and T restarts its syscall)
//   save regs, xstate, sigmask     (what "exactly as it was" means)
//   write a signal frame below T's red zone holding the *resume* state (the
//                                   registers T must continue with, syscall
//                                   restart already applied)
//   point T at a stub that ends in rt_sigreturn on that frame, block all
//   signals, run the request, take T back, restore, detach.
// If the controller dies at any instant after the frame is written, T runs
// on by itself into rt_sigreturn and restores its own state (CRIU's "cure");
// before that, nothing has been changed.
//
// Why no breakpoint ends a call: an int3 in the stub would kill the target
// with SIGTRAP if the controller died before it was reached. A function call
// ends either at a signal the process ignores, which the stub sends itself
// and which is dequeued only once T is restored (a "marked call": its own
// system calls cost no stops, see choose_marker in target.cc), or at the
// syscall-entry stop of the stub's rt_sigreturn under PTRACE_SYSCALL, which
// exists only while traced; untraced, the same instruction is the cure.
// Completion is recognised by its exact stop: the marker signal with the
// cookie the stub stored and an instruction pointer outside the stub, or a
// syscall-entry (PTRACE_GET_SYSCALL_INFO) of rt_sigreturn at the stub's own
// instruction address.
#include "remote/transaction.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "base/log.h"
#include "base/strings.h"
#include "procfs/procfs.h"
#include "remote/stack_room.h"

namespace remora::remote {

namespace a = arch::host;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSigprocmaskBlock = 0;  // SIG_BLOCK

bool is_job_control_stop(int sig) {
  return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

bool signal_pending_for(pid_t pid, pid_t tid) {
  auto st = procfs::read_status(pid, tid);
  if (!st) return true;  // be conservative: keep the EINTR
  return ((st->sig_pnd | st->shd_pnd) & ~st->sig_blk) != 0;
}

bool is_exit(const ptrace::Stop& s) {
  return s.kind == ptrace::Stop::Kind::kExited || s.kind == ptrace::Stop::Kind::kKilled;
}

}  // namespace

Transaction::Transaction(Target::Impl& im, pid_t tid, const Deadline& deadline)
    : im_(im),
      tid_(tid),
      deadline_(deadline),
      who_("thread " + std::to_string(tid) + " of " + process_str(im.pid, im.ns_pid)) {}

Transaction::~Transaction() { release(); }

// Mask first, registers last: until the registers change, the thread would
// still restore itself through the frame if we died now. Then the detach,
// then what was held back, in the order it arrived. Last, the scratch's busy
// word, once the thread stands restored outside our code.
void Transaction::release() {
  if (!attached_) {
    clear_busy();
    return;
  }
  if (modified_) {
    (void)ptrace::set_sigmask(tid_, saved_.sigmask);
    (void)ptrace::set_xstate(tid_, saved_.xstate);
    (void)ptrace::set_regs(tid_, saved_.resume);
  } else if (restore_mask_) {
    (void)ptrace::set_sigmask(tid_, saved_.sigmask);
  }
  (void)ptrace::detach(tid_, detach_signal_);
  attached_ = false;
  if (pending_stop_ != 0) {
    if (im_.pidfd.valid())
      ::syscall(SYS_pidfd_send_signal, im_.pidfd.get(), pending_stop_, nullptr, 0);
    else
      ::kill(im_.pid, pending_stop_);
  }
  for (int sig : held_signals_) ::syscall(SYS_tgkill, im_.pid, tid_, sig);
  clear_busy();
}

Result<CallReport> Transaction::run(bool is_syscall, uint64_t fn_or_nr, std::array<uint64_t, 6> args,
                                    std::span<const Target::Impl::StackArg> on_stack,
                                    const Target::Prepare* then) {
  const auto t0 = Clock::now();
  REMORA_TRY_CTX(im_.seccomp_guard.before_seize(im_.pid, tid_), process_str(im_.pid, im_.ns_pid));
  REMORA_TRY_CTX(ptrace::seize(im_.pid, tid_, PTRACE_O_TRACESYSGOOD), "seize " + who_);
  attached_ = true;
  auto steps = [&]() -> Result<uint64_t> {
    REMORA_TRY(stop());
    REMORA_TRY(save());
    const bool creates = !im_.scratch && !im_.gadget_only;
    REMORA_TRY(plan(is_syscall, args, on_stack, creates));
    // Still nothing changed: refuse here what the thread's seccomp filter
    // would refuse (or kill the process for).
    REMORA_TRY(im_.seccomp_guard.check_stopped(
        tid_,
        seccomp::engine_syscalls({marker_ != 0, creates, saved_.swap_mask, is_syscall,
                                  static_cast<long>(fn_or_nr), args, im_.scratch_hint}),
        ""));
    REMORA_TRY(write_frame(on_stack));
    // Out of modes libc's code cannot run in (SME's streaming mode and ZA
    // on aarch64; nothing on x86_64), before the thread runs any of it.
    if (auto entry_state = a::call_entry_state(saved_.xstate); !entry_state.empty()) {
      REMORA_TRY(ptrace::set_xstate(tid_, entry_state));
      modified_ = true;
    }
    // With the scratch ready and no mask dance to do, the call's own
    // registers are the self-restoring path: the stub ends in rt_sigreturn.
    const bool direct = im_.scratch.has_value() && !saved_.swap_mask && !is_syscall;
    REMORA_TRY(enter_restore_path(direct));
    if (creates) REMORA_TRY(create_scratch(is_syscall, fn_or_nr, args));
    // A system call is restored by ptrace: the thread stands at its exit with
    // the stub's tail still to run, and a later transaction may remove the
    // code it would run it from (Target::close).
    if (is_syscall) return syscall(static_cast<long>(fn_or_nr), args);
    if (then != nullptr && !setup_call_)
      return Result<uint64_t>(Error(Errc::kInternal, "a prepared call is made only with a new scratch"));
    if (then != nullptr) prepare_next(*then, args);
    auto first = REMORA_TRY(function_call(fn_or_nr, args, direct));
    if (!setup_call_) return first;
    setup_call_ = false;
    return setup_result(first);
  };
  auto value = steps();
  if (!value) {
    if (value.error().code() == Errc::kTargetExited) attached_ = false;
    release();
    return std::move(value).error().with_context(who_);
  }
  release();
  CallReport report;
  report.tid = tid_;
  report.value = *value;
  report.stops = stops_;
  report.stopped = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
  return report;
}

Result<ptrace::Stop> Transaction::wait(const Deadline& d) {
  auto s = ptrace::wait_stop(tid_, d);
  if (s) ++stops_;
  return s;
}

// The first stop: normally our interrupt, or a group stop when the process
// is stopped. A signal caught mid-delivery is let through first.
Result<void> Transaction::stop() {
  // Where a stop makes the kernel forget the call the thread was blocked in
  // (aarch64: arch/aarch64.h), read it first; save() uses it only if the
  // registers agree.
  if (a::kStopForgetsSyscall) {
    if (auto st = procfs::read_syscall(im_.pid, tid_); st && !st->running && st->nr >= 0) entry_ = *st;
  }
  REMORA_TRY(ptrace::interrupt(tid_));
  for (;;) {
    auto s = REMORA_TRY(wait(deadline_));
    if (s.kind == ptrace::Stop::Kind::kInterrupt || s.kind == ptrace::Stop::Kind::kGroupStop) return ok();
    if (is_exit(s)) return gone(s);
    int sig = s.kind == ptrace::Stop::Kind::kSignalDelivery ? s.sig : 0;
    REMORA_TRY(ptrace::cont(tid_, sig));
    REMORA_TRY(ptrace::interrupt(tid_));
  }
}

Result<void> Transaction::save() {
  auto regs = REMORA_TRY(ptrace::get_regs(tid_));
  saved_.regs = regs;
  // Released just before re-entering an interrupted restart_block call:
  // save it as the thread inside that call (see awaits_restart_syscall).
  if (a::awaits_restart_syscall(regs)) {
    std::array<uint8_t, a::kSyscallInsnLen> insn{};
    if (im_.mem.read(a::pc(regs), std::as_writable_bytes(std::span(insn))) && a::is_syscall_insn(insn))
      saved_.regs = a::as_stopped_in_restart_syscall(regs);
  }
  if (entry_) saved_.regs = a::with_entry_args(saved_.regs, entry_->nr, entry_->args, entry_->pc);
  saved_.xstate = REMORA_TRY(ptrace::get_xstate(tid_));
  saved_.sigmask = REMORA_TRY(ptrace::get_sigmask(tid_));
  const auto& r0 = saved_.regs;
  const int64_t nr = a::syscall_nr(r0);
  bool pending = false;
  if (nr >= 0 && a::return_value(r0) == -EINTR && a::never_restarted(nr))
    pending = signal_pending_for(im_.pid, tid_);
  kind_ = a::classify_restart(r0, pending);
  saved_.resume = a::resume_registers(r0, kind_, /*use_restart_syscall=*/true);
  saved_.swap_mask = nr >= 0 && a::swaps_signal_mask(nr);
  return ok();
}

// The registers the frame resumes with. A thread interrupted a second time
// in the same sleep is inside restart_syscall, which the frame's
// rt_sigreturn would reset: the frame re-issues the original call, whose
// number is recovered from the code around the `syscall` (see
// arch::x86_64::wrapper_syscall_nr). If that fails, the frame keeps
// restart_syscall, which then returns EINTR -- only if we die mid-call.
Transaction::Regs Transaction::frame_registers() const {
  const Regs& r0 = saved_.regs;
  Regs frame = r0;
  if (kind_ == arch::RestartKind::kRestartBlock && a::syscall_nr(r0) == a::nr::kRestartSyscall) {
    std::array<uint8_t, 9> before{};
    if (im_.mem.read(a::syscall_insn_address(r0) - before.size(),
                     std::as_writable_bytes(std::span(before)))) {
      auto nr = a::wrapper_syscall_nr(before);
      if (!nr && a::is_generic_syscall_fn(before)) {
        // The caller's return address: in the link register, or on the stack.
        uint64_t ret = a::link_register(r0);
        std::array<uint8_t, a::kCallerBytes> caller{};
        const bool have_ret = a::kReturnAddressInRegister ||
                              im_.mem.read(a::sp(r0), std::as_writable_bytes(std::span(&ret, 1)));
        if (have_ret && ret > caller.size() &&
            im_.mem.read(ret - caller.size(), std::as_writable_bytes(std::span(caller))))
          nr = a::caller_syscall_nr(caller);
      }
      if (nr) frame = a::with_syscall_nr(r0, *nr);
    }
  }
  // The self-restoring path re-issues an interrupted restart_block call
  // (rt_sigreturn resets restart_block), so its frame uses the original call.
  return a::resume_registers(frame, kind_, /*use_restart_syscall=*/false);
}

// Fixes what the frame holds and where: its extended state, sized and
// flagged for this thread (arch/x86_64_xstate.h: a frame sized from the
// ptrace buffer is refused by rt_sigreturn for a thread without AMX tiles,
// whose vector registers would then be reset), whether its rt_sigreturn is
// the exact restore, and whether a function call is a marked call.
Result<void> Transaction::plan(bool is_syscall, std::array<uint64_t, 6>& args,
                               std::span<const Target::Impl::StackArg> on_stack, bool creates) {
  fpstate_ = a::build_sig_fpstate(a::host_xstate_layout(), saved_.xstate);
  if (!fpstate_.exact) REMORA_LOG(kRemote, "restore frame is not exact: %s", fpstate_.why_not.c_str());
  // Exact unless the thread was interrupted in a restart_block call: there
  // the frame re-issues the original call while restart_syscall keeps the
  // remaining timeout, so ptrace restores those. Mask-swapping calls make
  // no marked call: their frame mask is only known once the stub has
  // recorded it.
  frame_is_exact_ = kind_ != arch::RestartKind::kRestartBlock && fpstate_.exact;
  // A filtered thread gets no marked call: its filter may refuse the
  // stub's tgkill (see remote/seccomp.h).
  marker_ = !is_syscall && frame_is_exact_ && !saved_.swap_mask && !im_.seccomp_guard.filtered(tid_)
                ? im_.choose_marker(saved_.sigmask)
                : 0;
  marker_bit_ = marker_ != 0 ? uint64_t{1} << (marker_ - 1) : 0;
  cookie_ = (uint64_t{0x524d} << 48) | (++im_.call_seq & 0xffffffffffff);
  std::vector<size_t> sizes;
  for (const auto& arg : on_stack) sizes.push_back(arg.bytes.size());
  REMORA_TRY(place_frame(sizes, creates));
  for (size_t i = 0; i < on_stack.size(); ++i) args[on_stack[i].reg] = frame_.args[i];
  REMORA_LOG(kRemote, "call on tid=%d: stopped at pc=%#llx nr=%lld ret=%lld, restart kind %d, marker %d",
             tid_, static_cast<unsigned long long>(a::pc(saved_.regs)),
             static_cast<long long>(a::syscall_nr(saved_.regs)),
             static_cast<long long>(a::return_value(saved_.regs)), static_cast<int>(kind_), marker_);
  return ok();
}

// The frame goes below the thread's stack pointer (and red zone) when the
// stack there is writable for the frame and kCallStackRoom below it
// (remote/stack_room.h), else on a stack of our own at the top of the
// scratch's argument area: the frame's registers keep the thread's stack
// pointer, so its rt_sigreturn puts the thread back on its own stack all
// the same. A stack seen safe before is taken without reading the maps;
// else the maps a lookup just read serve, or they are read once.
Result<void> Transaction::place_frame(const std::vector<size_t>& sizes, bool creates) {
  const uint64_t sp = a::sp(saved_.regs);
  frame_ = a::plan_frame(sp, fpstate_.image.size(), sizes);
  // A stack pointer near 0 wraps the plan: no stack at all.
  const bool wrapped = frame_.end > sp || frame_.call_sp < kCallStackRoom;
  const uint64_t lo = wrapped ? sp : frame_.call_sp - kCallStackRoom;
  if (!wrapped && im_.safe_stacks.covers(lo, sp)) return ok();
  StackVerdict v;
  v.at = sp;
  if (!wrapped) {
    std::vector<procfs::MapEntry> fresh;
    if (!im_.call_maps)
      fresh = REMORA_TRY_CTX(procfs::read_maps(im_.pid), "read the maps of " + process_str(im_.pid, im_.ns_pid));
    v = judge_stack_range(im_.call_maps ? *im_.call_maps : fresh, lo, sp);
    if (v.room == StackRoom::kSafe) {
      im_.safe_stacks.add(v.run_lo, v.run_hi);
      return ok();
    }
  }
  const std::string why = describe_stack_verdict(v, sp);
  // Our own scratch only: an adopted one's data is the agent's, shared by
  // every controller of the process; and never for the call that creates
  // the scratch, or the munmap that removes it.
  im_.stack_refused = true;
  if (!im_.scratch || !im_.scratch_owned || creates || im_.force_gadget || im_.gadget_only)
    return Error(Errc::kNotSupported, "the thread's stack cannot take the call's frame: " + why +
                                          ", and no stack of Remora's own is ready for this step; "
                                          "nothing was changed: call on another thread");
  const uint64_t top = (im_.data_base + im_.data_size - session_area(im_.data_size)) & ~uint64_t{63};
  frame_ = a::plan_frame(top + a::kRedZone, fpstate_.image.size(), sizes);
  const uint64_t floor = std::max(im_.data_base, im_.data_args_end);
  if (frame_.base < floor + kCallStackRoom || frame_.call_sp < floor + kCallStackRoom)
    return Error(Errc::kNotSupported, "the thread's stack cannot take the call's frame: " + why +
                                          ", and the frame (" + std::to_string(frame_.end - frame_.base) +
                                          " bytes) does not fit the scratch's own stack; nothing was "
                                          "changed: call on another thread");
  im_.stack_refused = false;
  REMORA_LOG(kRemote, "call on tid=%d: %s; the frame goes on the scratch's stack at %#llx", tid_, why.c_str(),
             static_cast<unsigned long long>(frame_.call_sp));
  return ok();
}

Result<void> Transaction::write_frame(std::span<const Target::Impl::StackArg> on_stack) {
  std::vector<std::span<const std::byte>> arg_bytes;
  for (const auto& arg : on_stack) arg_bytes.push_back(arg.bytes);
  a::FrameContents c;
  c.resume = frame_registers();
  // The thread's own mask, letting the marker through (see choose_marker).
  c.sigmask = saved_.sigmask & ~marker_bit_;
  c.fp_xstate = fpstate_.xsave;
  c.fpstate = fpstate_.image;
  // The return address of the bootstrap path (glibc's syscall() returns into
  // __restore_rt); unused once the scratch exists.
  c.restorer = im_.gadgets ? im_.gadgets->restore_rt : 0;
  c.args = arg_bytes;
  if (auto w = im_.mem.write(frame_.base, a::frame_bytes(frame_, c)); !w) {
    im_.safe_stacks.clear();  // the stack judged safe has changed: read the maps again next time
    return std::move(w).error().with_context("write the restore frame on the thread's stack");
  }
  return ok();
}

// Points the thread at the self-restoring path first, then blocks signals.
Result<void> Transaction::enter_restore_path(bool direct) {
  if (direct) return ok();  // the call's registers are that path (set with the mask in function_call)
  REMORA_TRY(
      ptrace::set_regs(tid_, a::parked_regs(saved_.regs, frame_, im_.stub_site(/*for_syscall=*/false))));
  modified_ = true;
  if (!saved_.swap_mask) return ptrace::set_sigmask(tid_, ~uint64_t{0});
  // The kernel restores the saved user mask on the first resume; the stub's
  // own rt_sigprocmask then records it into the frame.
  const uint64_t mask_at = frame_.uc + a::kUcSigmaskOffset;
  REMORA_TRY(syscall(a::nr::kRtSigprocmask, {kSigprocmaskBlock, frame_.all_mask, mask_at, 8, 0, 0}));
  saved_.sigmask = REMORA_TRY(im_.mem.read_value<uint64_t>(mask_at));
  return ok();
}

// The first call of a session maps the scratch: stubs (RX page) and data.
Result<void> Transaction::create_scratch(bool is_syscall, uint64_t& fn_or_nr, std::array<uint64_t, 6>& args) {
  // R-X first, written through /proc/PID/mem, then all but the code page
  // made RW (the order and why: remote/scratch.h).
  auto base = REMORA_TRY_CTX(syscall(a::nr::kMmap, {im_.scratch_hint, kScratchSize, PROT_READ | PROT_EXEC,
                                                    MAP_PRIVATE | MAP_ANONYMOUS, ~uint64_t{0}, 0}),
                             "create the scratch mapping");
  // An address not page-aligned is no mmap result: a seccomp kill rolled
  // the call back (rax = its number) and the process dies of SIGSYS.
  if ((static_cast<int64_t>(base) < 0 && static_cast<int64_t>(base) > -4096) || (base & (kPage - 1)) != 0)
    return im_.seccomp_guard.denial_error(
        Error(Errc::kIo, "mmap in the target failed", static_cast<int>(-static_cast<int64_t>(base))), tid_,
        a::nr::kMmap, static_cast<int64_t>(base));
  const uint64_t b = base;
  static const char kName[] = "remora-scratch";
  // The header first, in the same write as the name and the stubs: until
  // it is there, a controller that dies leaves a mapping nobody can tell
  // from the program's own (remote/scratch.h).
  std::vector<std::byte> head(kScratchStub + a::Stub::kSize);
  const ScratchHeader h = own_header(b);
  std::memcpy(head.data(), &h, sizeof h);
  std::memcpy(head.data() + kScratchNameOffset, kName, sizeof kName);
  const auto code = a::stub_code();
  std::memcpy(head.data() + kScratchStub, code.data(), code.size());
  if (auto r = im_.mem.write(b, head); !r) {
    (void)syscall(a::nr::kMunmap, {b, kScratchSize, 0, 0, 0, 0});
    return std::move(r).error().with_context("prepare the scratch mapping");
  }
  im_.adopt_own_scratch(b);
  if (!is_syscall && fn_or_nr == kSetupRequest) {
    // The request is the scratch's own setup (arch::x86_64::Stub): its data
    // pages made writable (until then only /proc/PID/mem writes them), named
    // so that a person reading /proc/PID/maps sees what it is (Linux 5.17+
    // with CONFIG_ANON_VMA_NAME; failure is harmless), and never inherited
    // by a fork of the target.
    fn_or_nr = *im_.scratch + a::Stub::kScratchSetup;
    args = {b, kScratchSize, b + kScratchNameOffset, 0, 0, 0};
    setup_call_ = true;
  }
  return ok();
}

// Removes a scratch whose setup failed, on the thread still held: through
// libc's system call gadget (the scratch is no longer ours to call into),
// with every signal blocked; the release restores registers and mask.
Result<void> Transaction::remove_failed_scratch(uint64_t base) {
  REMORA_TRY(ptrace::set_sigmask(tid_, ~uint64_t{0}));
  modified_ = true;
  const auto r = REMORA_TRY(syscall(a::nr::kMunmap, {base, kScratchSize, 0, 0, 0, 0}));
  if (r != 0)
    return Error(Errc::kIo, "munmap failed in the target", static_cast<int>(-static_cast<int64_t>(r)));
  return ok();
}

// The setup routine's result (create_scratch): 0, or the -errno of the
// mprotect that makes the scratch's data writable. Without it the scratch
// cannot take a marked call (its echo slot is in those pages): it goes
// again, through the system call stub, which needs no data page.
Result<void> Transaction::check_setup(uint64_t value) {
  if (value == 0) return ok();
  const uint64_t b = im_.scratch_base;
  Error e =
      im_.seccomp_guard.denial_error(Error(Errc::kIo, "mprotect of the scratch's data failed in the target",
                                           static_cast<int>(-static_cast<int64_t>(value))),
                                     tid_, a::nr::kMprotect, static_cast<int64_t>(value));
  im_.scratch.reset();
  im_.scratch_owned = false;
  if (auto gone = remove_failed_scratch(b); !gone)
    return std::move(e).with_context(
        "prepare the scratch mapping (it could not be removed again: " + gone.error().to_string() + ")");
  return std::move(e).with_context("prepare the scratch mapping");
}

// The call to make in the new scratch (Target::call_prepared), as the tail
// of its setup routine: one call, one stop at its end, where there were two
// calls (a marked call each, or in a thread whose frame is not exact, two
// transactions). `prepare` runs once the scratch exists: what it writes
// into the data pages goes through /proc/PID/mem, as the header did, before
// the routine makes them writable. The routine's status word says, after
// the call, whose result came back. A `prepare` that fails leaves the setup
// to run alone; its error is then the transaction's.
void Transaction::prepare_next(const Target::Prepare& prepare, std::array<uint64_t, 6>& args) {
  auto p = prepare();
  if (!p) {
    prepare_error_ = std::move(p).error();
    return;
  }
  args[3] = p->fn.addr();
  args[4] = p->arg;
  next_call_ = true;
}

// The setup routine's call is over with `value`: the prepared call's result
// when the routine went on to it (its status word holds the scratch's base,
// which only the routine writes there), else the routine's own
// (check_setup).
Result<uint64_t> Transaction::setup_result(uint64_t value) {
  if (next_call_) {
    auto status = REMORA_TRY_CTX(im_.mem.read_value<uint64_t>(im_.scratch_base + kScratchSetupStatus),
                                 "read the scratch's setup status");
    if (status == im_.scratch_base) return value;
  }
  REMORA_TRY(check_setup(value));
  if (prepare_error_) return std::move(*prepare_error_);
  return value;
}

// A function call ends after the stub's rt_sigreturn on the frame (a marked
// call), or at its entry: either way the thread runs no more of our code.
// Where the frame holds exactly the resume state, that rt_sigreturn is the
// restore: registers, xsave area and signal mask in one system call of the
// thread's own, instead of three ptrace requests (setting the xsave area
// alone costs a kernel vmalloc per request).
Result<uint64_t> Transaction::function_call(uint64_t fn, const std::array<uint64_t, 6>& args, bool direct) {
  const uint64_t stub = *im_.scratch;
  // In our own scratch the call is marked busy in its header, and a marked
  // call's stub echoes the cookie there when the function returns: a
  // controller that finds this scratch after we died knows whether the
  // call is over (remote/scratch.h). The agent's stubs have no header: the
  // result slot stays on the frame.
  a::FramePlan plan = frame_;
  if (im_.scratch_owned) {
    // Not the setup's: its slot stays on the frame, as the echo slot lies in
    // the pages it makes writable (a failed mprotect must not fault).
    if (!setup_call_) plan.result_slot = im_.scratch_base + kScratchEcho;
    const std::array<uint64_t, 3> busy = {cookie_, static_cast<uint64_t>(tid_), plan.call_sp};
    REMORA_TRY_CTX(im_.mem.write(im_.scratch_base + kScratchCookieOffset, std::as_bytes(std::span(busy))),
                   "mark the scratch busy");
    busy_marked_ = true;
  }
  result_slot_ = plan.result_slot;
  REMORA_TRY(ptrace::set_regs(tid_, a::call_regs(saved_.regs, fn, args, plan, stub, marker_, cookie_)));
  modified_ = true;
  if (direct) REMORA_TRY(ptrace::set_sigmask(tid_, ~uint64_t{0}));
  if (marker_ != 0) {
    auto value = REMORA_TRY(run_marked(a::call_return_end(stub, true)));
    if (modified_ && frame_is_exact_) modified_ = false;  // detached at rt_sigreturn's entry
    if (setup_call_)
      clear_busy();  // the stub echoed the cookie on the frame: the call is over all the same
    else
      busy_marked_ = false;  // the stub echoed the cookie
    return value;
  }
  auto value = REMORA_TRY(run_until(a::nr::kRtSigreturn, a::call_return_end(stub, false), true));
  if (frame_is_exact_) modified_ = false;  // detached at rt_sigreturn's entry, the thread restores itself
  return value;
}

// The call is over (or abandoned, its thread taken back): nothing runs in
// the scratch for it any more. Done by the stub itself for a marked call
// that returned.
void Transaction::clear_busy() {
  if (!busy_marked_) return;
  busy_marked_ = false;
  (void)im_.mem.write(im_.scratch_base + kScratchEcho + 8, std::as_bytes(std::span(&cookie_, 1)));
}

// Stops the thread and reads where it is, changing nothing: a thread
// interrupted in a system call gets the same restart a call's release
// gives it (save() fixed it), so it finishes that call as if nothing
// happened.
Result<Transaction::Regs> Transaction::observe() {
  REMORA_TRY_CTX(im_.seccomp_guard.before_seize(im_.pid, tid_), process_str(im_.pid, im_.ns_pid));
  REMORA_TRY_CTX(ptrace::seize(im_.pid, tid_, PTRACE_O_TRACESYSGOOD), "seize " + who_);
  attached_ = true;
  auto steps = [&]() -> Result<void> {
    REMORA_TRY(stop());
    REMORA_TRY(save());
    modified_ = true;  // release restores the resume state
    return ok();
  };
  if (auto r = steps(); !r) {
    if (r.error().code() == Errc::kTargetExited) attached_ = false;
    release();
    return std::move(r).error().with_context(who_);
  }
  Regs regs = saved_.regs;
  release();
  return regs;
}

// Runs one system call on the thread and returns its result.
Result<uint64_t> Transaction::syscall(long nr, const std::array<uint64_t, 6>& args) {
  auto step = a::syscall_regs(saved_.regs, nr, args, frame_, im_.stub_site(/*for_syscall=*/true));
  REMORA_TRY(ptrace::set_regs(tid_, step.regs));
  modified_ = true;
  REMORA_TRY(run_until(nr, step.insn_end, true));
  return run_until(nr, step.insn_end, false);
}

// Runs the thread until the stop that ends one step; handles every other
// stop on the way. `want_entry`: stop at the entry (true) or exit (false) of
// syscall `nr` at instruction address `ip_after`. At rt_sigreturn's entry
// the stub has put the result in the first argument; at an exit the kernel
// reports it.
Result<uint64_t> Transaction::run_until(long nr, uint64_t ip_after, bool want_entry) {
  for (;;) {
    REMORA_TRY(ptrace::cont_syscall(tid_, 0));
    auto s = wait(deadline_);
    if (!s && s.error().code() == Errc::kTimedOut) return take_back(false);
    auto stop = REMORA_TRY(std::move(s));
    if (is_exit(stop)) return gone(stop);
    if (stop.kind == ptrace::Stop::Kind::kSyscall) {
      auto info = REMORA_TRY(ptrace::get_syscall_info(tid_));
      const bool entry = info.op == ptrace::SyscallInfo::Op::kEntry;
      if (entry == want_entry && info.ip == ip_after && (!entry || info.nr == nr))
        return entry ? info.arg0 : static_cast<uint64_t>(info.ret);
      continue;  // a system call made by the called function
    }
    if (stop.kind == ptrace::Stop::Kind::kSignalDelivery) {
      auto si = REMORA_TRY(ptrace::get_siginfo(tid_));
      if (ptrace::is_fault(si)) return fault_error(si);
      hold(si.si_signo);
    }
    // Group stop, interrupt, event: resume; a group stop is reinstated at detach.
  }
}

// A signal that stopped the thread during a step and is not its end: a
// job-control stop is held back for the release, any other (only unblockable
// ones get here) is re-delivered after it.
void Transaction::hold(int sig) {
  if (is_job_control_stop(sig))
    pending_stop_ = sig;
  else
    held_signals_.push_back(sig);
}

// Runs a marked call to its end: under PTRACE_CONT until the thread, back
// through rt_sigreturn, stops for the marker (see choose_marker). Clears
// `modified_` when the thread stands fully restored.
Result<uint64_t> Transaction::run_marked(uint64_t stub_end) {
  const uint64_t stub_lo = *im_.scratch, stub_hi = *im_.scratch + a::Stub::kSize;
  Deadline until = deadline_;
  for (;;) {
    REMORA_TRY(ptrace::cont(tid_, 0));
    auto s = wait(until);
    if (!s && s.error().code() == Errc::kTimedOut) {
      if (!REMORA_TRY(runs_on_at_deadline())) return take_back(true);
      until = Deadline::after(im_.running_grace);
      continue;
    }
    auto stop = REMORA_TRY(std::move(s));
    if (is_exit(stop)) return gone(stop);
    if (stop.kind != ptrace::Stop::Kind::kSignalDelivery) continue;  // group stop, interrupt: go on
    auto si = REMORA_TRY(ptrace::get_siginfo(tid_));
    if (is_job_control_stop(si.si_signo)) {
      hold(si.si_signo);
      continue;
    }
    // The cookie says the function returned; an instruction pointer outside
    // the stub says rt_sigreturn has restored the frame.
    auto where = REMORA_TRY(ptrace::get_syscall_info(tid_));
    std::array<uint64_t, 2> slot{};
    REMORA_TRY(im_.mem.read(result_slot_, std::as_writable_bytes(std::span(slot))));
    const bool returned = slot[1] == cookie_;
    if (returned && (where.ip < stub_lo || where.ip >= stub_hi)) {
      modified_ = false;
      restore_mask_ = (saved_.sigmask & marker_bit_) != 0;
      // Another signal that waited for the call dequeued before the marker:
      // deliver it on detach (the marker, still pending, is one the process
      // ignores). A fault among them is the thread's own, not the call's:
      // its instruction faulted just before the interrupt, and the kernel
      // reports the interrupt stop before it dequeues the fault's signal
      // (get_signal runs the ptrace trap first), so it stayed pending,
      // blocked, through the call. A JVM's safepoint poll on its PROT_NONE
      // polling page is one; the JVM's handler must still get it.
      if (si.si_signo != marker_) detach_signal_ = si.si_signo;
      return slot[0];
    }
    if (ptrace::is_fault(si)) return fault_error(si);
    if (returned && si.si_signo == marker_) {
      // The function unblocked the marker itself, so it arrived inside the
      // stub: end at the stub's rt_sigreturn instead.
      REMORA_TRY(run_until(a::nr::kRtSigreturn, stub_end, true));
      restore_mask_ = (saved_.sigmask & marker_bit_) != 0;
      return slot[0];
    }
    hold(si.si_signo);  // only unblockable ones get here
  }
}

// The function did not return by the deadline: the thread is stopped where
// it is. True when it is to run on (CallOptions::running_grace, once):
// stopped by our interrupt alone, and not waiting in a system call (a
// function that runs may hold a lock it took; one that waits on a lock the
// caller knows of holds none).
Result<bool> Transaction::runs_on_at_deadline() {
  REMORA_TRY(ptrace::interrupt(tid_));
  auto s = wait(Deadline::after(std::chrono::seconds(2)));
  if (!s) return std::move(s).error();
  if (is_exit(*s)) return gone(*s);
  if (s->kind == ptrace::Stop::Kind::kSignalDelivery && is_job_control_stop(s->sig)) pending_stop_ = s->sig;
  if (graced_ || im_.running_grace.count() <= 0 || s->kind != ptrace::Stop::Kind::kInterrupt) return false;
  auto r = REMORA_TRY(ptrace::get_regs(tid_));
  if (a::syscall_nr(r) >= 0) return false;  // waiting in a system call
  graced_ = true;
  REMORA_LOG(kRemote, "%s: the call still runs at its deadline; it runs %lld ms longer", who_.c_str(),
             static_cast<long long>(im_.running_grace.count()));
  return true;
}

// The function did not return in time: take the thread back wherever it is
// (`stopped`: it is stopped already), and abandon the call.
Error Transaction::take_back(bool stopped) {
  if (!stopped) {
    if (auto r = ptrace::interrupt(tid_); !r) return std::move(r).error();
    auto s = wait(Deadline::after(std::chrono::seconds(2)));
    if (!s) return std::move(s).error();
    if (is_exit(*s)) return gone(*s);
    if (s->kind == ptrace::Stop::Kind::kSignalDelivery && is_job_control_stop(s->sig)) pending_stop_ = s->sig;
  }
  return Error(Errc::kTimedOut,
               "the remote call did not return within the deadline; the thread was taken back "
               "and restored (anything the function had done so far stays done)");
}

Error Transaction::gone(const ptrace::Stop& s) {
  attached_ = false;
  std::string how = s.kind == ptrace::Stop::Kind::kKilled
                        ? "was killed by signal " + std::to_string(s.sig)
                        : "exited with status " + std::to_string(s.exit_status);
  if (s.kind == ptrace::Stop::Kind::kKilled && s.sig == SIGSYS)
    how += im_.seccomp_guard.sigsys_note(tid_, -1);
  return Error(Errc::kTargetExited, who_ + " " + how + " during the remote call");
}

Error Transaction::fault_error(const siginfo_t& si) const {
  // A stack judged safe may have changed since (mprotect, munmap): the next
  // call reads the maps again.
  im_.safe_stacks.clear();
  constexpr const char* kRestored = "; the thread was restored to its state before the call";
  if (si.si_signo == SIGSYS)
    return Error(Errc::kFault, "the target's seccomp filter refused system call " +
                                   std::to_string(si.si_syscall) + " (SIGSYS)" +
                                   im_.seccomp_guard.sigsys_note(tid_, si.si_syscall) + kRestored);
  char buf[160];
  std::snprintf(buf, sizeof buf, "the called function faulted: SIG%s (signal %d, code %d) at address %s",
                sigabbrev_np(si.si_signo) ? sigabbrev_np(si.si_signo) : "?", si.si_signo, si.si_code,
                hex_addr(reinterpret_cast<uint64_t>(si.si_addr)).c_str());
  return Error(Errc::kFault, buf + std::string(kRestored));
}

}  // namespace remora::remote
