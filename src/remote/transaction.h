// remote::Transaction: one remote operation on one thread of a Target, as an
// object (rr's AutoRemoteSyscalls; CRIU's strict reverse-order undo). The
// engine in target.cc makes one per call; see transaction.cc for the
// mechanics, in the order a call performs them.
//
// Construction seizes nothing; run() seizes, stops and saves the thread,
// builds the restore frame, runs the request and takes the thread back. The
// destructor puts back everything that is still changed and releases the
// thread, whatever path left run(): signal mask, extended state and
// registers (unless the thread already restored itself through its frame),
// then the detach (with a signal that waited for the call's end), then a
// job-control stop held back meanwhile and the signals held back, in that
// order. Internal to the remote layer.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "arch/host.h"
#include "base/deadline.h"
#include "base/result.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/seccomp.h"
#include "remote/target_impl.h"

namespace remora::remote {

class Transaction {
 public:
  Transaction(Target::Impl& im, pid_t tid, const Deadline& deadline);
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  // A function call (`fn_or_nr` = the function, or kSetupRequest: the new
  // scratch's own setup routine) or a system call (`is_syscall`).
  // `then`, with kSetupRequest only: the call the setup routine goes on to
  // (prepare_next); the report's value is then that call's.
  Result<CallReport> run(bool is_syscall, uint64_t fn_or_nr, std::array<uint64_t, 6> args,
                         std::span<const Target::Impl::StackArg> on_stack,
                         const Target::Prepare* then = nullptr);
  // Seizes and stops the thread, returns its registers as saved (pc and
  // stack pointer for the scratch reclaim) and releases it unchanged.
  Result<arch::HostRegs> observe();

 private:
  using Regs = arch::HostRegs;

  // Everything the thread had, and how to put it back.
  struct Saved {
    Regs regs{};
    std::vector<std::byte> xstate;
    uint64_t sigmask = 0;
    Regs resume{};           // exact resume state (restart applied, restart_syscall allowed)
    bool swap_mask = false;  // interrupted inside ppoll/pselect/sigsuspend/epoll_pwait
  };

  Result<void> stop();
  Result<void> save();
  Result<void> plan(bool is_syscall, std::array<uint64_t, 6>& args,
                    std::span<const Target::Impl::StackArg> on_stack, bool creates);
  Result<void> place_frame(const std::vector<size_t>& sizes, bool creates);
  Regs frame_registers() const;
  Result<void> write_frame(std::span<const Target::Impl::StackArg> on_stack);
  Result<void> enter_restore_path(bool direct);
  Result<void> create_scratch(bool is_syscall, uint64_t& fn_or_nr, std::array<uint64_t, 6>& args);
  void prepare_next(const Target::Prepare& prepare, std::array<uint64_t, 6>& args);
  Result<uint64_t> setup_result(uint64_t value);
  Result<void> check_setup(uint64_t value);
  Result<void> remove_failed_scratch(uint64_t base);
  Result<uint64_t> function_call(uint64_t fn, const std::array<uint64_t, 6>& args, bool direct);

  // One kind of stop each (LLDB's MonitorSIGTRAP/MonitorSignal).
  Result<ptrace::Stop> wait(const Deadline& d);
  Result<uint64_t> syscall(long nr, const std::array<uint64_t, 6>& a);
  Result<uint64_t> run_until(long nr, uint64_t ip_after, bool want_entry);
  Result<uint64_t> run_marked(uint64_t stub_end);
  void hold(int sig);
  Result<bool> runs_on_at_deadline();
  Error take_back(bool stopped);
  Error gone(const ptrace::Stop& s);
  Error fault_error(const siginfo_t& si) const;

  void release();
  void clear_busy();

  Target::Impl& im_;
  const pid_t tid_;
  const Deadline deadline_;
  const std::string who_;
  bool attached_ = false;
  bool modified_ = false;      // registers/mask changed: restore before release
  bool restore_mask_ = false;  // restored by its frame, but with the marker unblocked
  int pending_stop_ = 0;       // a job-control stop held back
  std::vector<int> held_signals_;
  int detach_signal_ = 0;  // a signal that waited for the call's end, delivered on detach
  int stops_ = 0;
  bool graced_ = false;  // the call ran on past the deadline (CallOptions::running_grace)
  Saved saved_;
  // The system call /proc reported before the stop, where the stop forgets
  // it (arch::host::kStopForgetsSyscall).
  std::optional<procfs::SyscallState> entry_;

  // The plan, fixed once the thread is saved.
  arch::RestartKind kind_ = arch::RestartKind::kNone;
  arch::host::SigFpstate fpstate_;
  bool frame_is_exact_ = false;
  int marker_ = 0;
  uint64_t marker_bit_ = 0;
  uint64_t cookie_ = 0;
  uint64_t result_slot_ = 0;            // where the marked stub writes result and cookie
  bool busy_marked_ = false;            // our scratch's header says this call is in flight
  bool setup_call_ = false;             // the call in flight is a new scratch's setup routine
  bool next_call_ = false;              // ... which goes on to the prepared call (prepare_next)
  std::optional<Error> prepare_error_;  // the prepare that failed: the setup ran alone
  arch::host::FramePlan frame_;
};

}  // namespace remora::remote
