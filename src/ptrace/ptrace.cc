#include "ptrace/ptrace.h"

#include <elf.h>
#include <poll.h>
#include <sched.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "arch/host.h"
#include "base/log.h"
#include "base/strings.h"
#include "procfs/procfs.h"

namespace remora::ptrace {
namespace {

const char* request_name(int req) {
  switch (req) {
    case PTRACE_SEIZE: return "SEIZE";
    case PTRACE_INTERRUPT: return "INTERRUPT";
    case PTRACE_DETACH: return "DETACH";
    case PTRACE_CONT: return "CONT";
    case PTRACE_SYSCALL: return "SYSCALL";
    case PTRACE_SINGLESTEP: return "SINGLESTEP";
    case PTRACE_LISTEN: return "LISTEN";
    case PTRACE_GETEVENTMSG: return "GETEVENTMSG";
    case PTRACE_SETOPTIONS: return "SETOPTIONS";
#if !REMORA_HOST_REGS_BY_REGSET
    case PTRACE_GETREGS: return "GETREGS";
    case PTRACE_SETREGS: return "SETREGS";
#endif
    case PTRACE_SECCOMP_GET_FILTER: return "SECCOMP_GET_FILTER";
    case PTRACE_GETREGSET: return "GETREGSET";
    case PTRACE_SETREGSET: return "SETREGSET";
    case PTRACE_GETSIGMASK: return "GETSIGMASK";
    case PTRACE_SETSIGMASK: return "SETSIGMASK";
    case PTRACE_GETSIGINFO: return "GETSIGINFO";
    case PTRACE_GET_SYSCALL_INFO: return "GET_SYSCALL_INFO";
    default: return "?";
  }
}

// The one place that calls ptrace(2).
Result<long> request(int req, pid_t tid, void* addr, void* data) {
  errno = 0;
  long rc = ::ptrace(static_cast<__ptrace_request>(req), tid, addr, data);
  int err = errno;
  REMORA_LOG(kPtrace, "PTRACE_%s tid=%d addr=%p data=%p -> %ld%s%s", request_name(req), tid, addr, data, rc,
             rc == -1 ? " errno=" : "", rc == -1 ? std::strerror(err) : "");
  if (rc == -1 && err != 0) {
    std::string what = std::string("ptrace(PTRACE_") + request_name(req) + ", " + std::to_string(tid) + ")";
    Error e = Error::from_errno(what, err);
    if (err == ESRCH) return Error(Errc::kTargetExited, what + ": thread is gone or not stopped", err);
    return e;
  }
  return rc;
}

Result<void> simple(int req, pid_t tid, void* addr, void* data) {
  REMORA_TRY(request(req, tid, addr, data));
  return ok();
}

void* sig_arg(int sig) { return reinterpret_cast<void*>(static_cast<uintptr_t>(sig)); }

bool has_cap_sys_ptrace() {
  auto text = procfs::read_text("/proc/self/status");
  if (!text) return false;
  size_t pos = text->find("CapEff:");
  if (pos == std::string::npos) return false;
  auto line = text->substr(pos + 7, text->find('\n', pos) - pos - 7);
  auto caps = parse_u64(trim(line), 16);
  return caps && (*caps & (1ull << 19)) != 0;  // CAP_SYS_PTRACE = 19
}

// Whether the ptrace system call itself is refused in this process, before
// any rule about a target: PTRACE_PEEKDATA of ourselves, whom we do not
// trace, fails ESRCH in the kernel (ptrace_check_attach comes before every
// security hook), and anything else means a filter answered first (a
// seccomp profile of a container runtime, SCMP_ACT_ERRNO). Returns that
// errno, 0 when the call reaches the kernel.
int ptrace_syscall_filtered() {
  errno = 0;
  const long rc = ::ptrace(PTRACE_PEEKDATA, ::getpid(), nullptr, nullptr);
  const int err = errno;
  return rc == -1 && err != ESRCH && err != 0 ? err : 0;
}

// "process 123 (gdb)"; the tracer's name when it can be read.
std::string describe_task(pid_t tid) {
  std::string who = "process " + std::to_string(tid);
  if (auto st = procfs::read_status(tid)) who += " (" + st->name + ")";
  return who;
}

}  // namespace

Result<void> seize(pid_t pid, pid_t tid, unsigned long options) {
  const auto grace = Deadline::after(kPassingTracerGrace);
  int untraced_refusals = 0;
  for (;;) {
    auto r = request(PTRACE_SEIZE, tid, nullptr, reinterpret_cast<void*>(options));
    if (r) return ok();
    int err = r.error().sys_errno();
    if (err == ESRCH)
      return Error(
          Errc::kNoSuchProcess,
          "thread " + std::to_string(tid) + " of process " + std::to_string(pid) + " no longer exists", err);
    if (err != EPERM) return diagnose_attach_failure(pid, err);
    auto st = procfs::read_status(pid, tid);
    if (!st) return diagnose_attach_failure(pid, err);
    // Untraced by now: either a passing tracer (another controller's call)
    // left between the seize and the read, and the next seize succeeds, or
    // a rule refuses us, and it refuses again at once.
    if (st->tracer_pid == 0) {
      if (++untraced_refusals < 3) continue;
      return diagnose_attach_failure(pid, err);
    }
    // Another tracer holds this thread: wait out one that is only passing
    // (another controller's call), then try again.
    if (!grace.expired() && wait_until_untraced(pid, tid, grace)) continue;
    if (tid == pid) return diagnose_attach_failure(pid, err);
    return Error(Errc::kTracedByOther,
                 "thread " + std::to_string(tid) + " of process " + std::to_string(pid) + " is traced by " +
                     describe_task(st->tracer_pid) +
                     "; a thread can have only one tracer: detach that debugger or tracer (or wait for it to "
                     "finish) and retry",
                 err);
  }
}

bool wait_until_untraced(pid_t pid, pid_t tid, const Deadline& deadline) {
  for (;;) {
    auto st = procfs::read_status(pid, tid);
    if (!st || st->tracer_pid == 0) return true;
    if (st->tracer_pid == static_cast<pid_t>(::gettid())) return false;
    if (deadline.expired()) return false;
    timespec ts{0, 200'000};
    nanosleep(&ts, nullptr);
  }
}

Result<void> interrupt(pid_t tid) { return simple(PTRACE_INTERRUPT, tid, nullptr, nullptr); }
Result<void> detach(pid_t tid, int sig) { return simple(PTRACE_DETACH, tid, nullptr, sig_arg(sig)); }
Result<void> cont(pid_t tid, int sig) { return simple(PTRACE_CONT, tid, nullptr, sig_arg(sig)); }
Result<void> cont_syscall(pid_t tid, int sig) { return simple(PTRACE_SYSCALL, tid, nullptr, sig_arg(sig)); }
Result<void> single_step(pid_t tid, int sig) { return simple(PTRACE_SINGLESTEP, tid, nullptr, sig_arg(sig)); }
Result<void> listen(pid_t tid) { return simple(PTRACE_LISTEN, tid, nullptr, nullptr); }

Result<unsigned long> get_event_msg(pid_t tid) {
  unsigned long msg = 0;
  REMORA_TRY(request(PTRACE_GETEVENTMSG, tid, nullptr, &msg));
  return msg;
}

Result<void> set_options(pid_t tid, unsigned long options) {
  return simple(PTRACE_SETOPTIONS, tid, nullptr, reinterpret_cast<void*>(options));
}

#if REMORA_HOST_REGS_BY_REGSET
// The general registers and, in a register set of its own, the system call
// number (arch/host.h).
Result<Regs> get_regs(pid_t tid) {
  Regs r{};
  iovec iov{&r, arch::host::kUserPtRegsSize};
  REMORA_TRY(
      request(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(uintptr_t{arch::host::kNtPrstatus}), &iov));
  int32_t nr = -1;
  iovec nr_iov{&nr, sizeof nr};
  REMORA_TRY(
      request(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(uintptr_t{arch::host::kNtSystemCall}), &nr_iov));
  r.syscallno = nr;
  return r;
}

Result<void> set_regs(pid_t tid, const Regs& regs) {
  iovec iov{const_cast<Regs*>(&regs), arch::host::kUserPtRegsSize};
  REMORA_TRY(
      simple(PTRACE_SETREGSET, tid, reinterpret_cast<void*>(uintptr_t{arch::host::kNtPrstatus}), &iov));
  int32_t nr = static_cast<int32_t>(regs.syscallno);
  iovec nr_iov{&nr, sizeof nr};
  return simple(PTRACE_SETREGSET, tid, reinterpret_cast<void*>(uintptr_t{arch::host::kNtSystemCall}),
                &nr_iov);
}
#else
Result<Regs> get_regs(pid_t tid) {
  Regs r{};
  REMORA_TRY(request(PTRACE_GETREGS, tid, nullptr, &r));
  return r;
}

Result<void> set_regs(pid_t tid, const Regs& regs) {
  return simple(PTRACE_SETREGS, tid, nullptr, const_cast<Regs*>(&regs));
}
#endif

#if REMORA_HOST_PACKED_STATE
// Each FP/SIMD register set the thread has, packed (arch/host.h). A set the
// CPU or kernel lacks answers EINVAL or ENODEV and is left out; a vector set
// larger than the first read is read again at the size its header names.
Result<std::vector<std::byte>> get_xstate(pid_t tid) {
  namespace h = arch::host;
  std::vector<std::byte> packed, buf;
  for (uint32_t note : h::kStateNotes) {
    buf.assign(h::kFirstReadSize, std::byte{0});
    iovec iov{buf.data(), buf.size()};
    auto r = request(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(uintptr_t{note}), &iov);
    if (!r && (r.error().sys_errno() == EINVAL || r.error().sys_errno() == ENODEV)) continue;
    REMORA_TRY(std::move(r));
    if (const uint32_t want = h::vec_set_size(std::span(buf.data(), iov.iov_len));
        (note == h::kNtArmSve || note == h::kNtArmSsve || note == h::kNtArmZa) && want > buf.size()) {
      buf.assign(want, std::byte{0});
      iov = iovec{buf.data(), buf.size()};
      REMORA_TRY(request(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(uintptr_t{note}), &iov));
    }
    h::append_section(packed, note, std::span(buf.data(), iov.iov_len));
  }
  return packed;
}

Result<void> set_xstate(pid_t tid, std::span<const std::byte> packed) {
  for (const auto& s : arch::host::restore_order(packed)) {
    iovec iov{const_cast<std::byte*>(s.data.data()), s.data.size()};
    REMORA_TRY(simple(PTRACE_SETREGSET, tid, reinterpret_cast<void*>(uintptr_t{s.note}), &iov));
  }
  return ok();
}
#else
Result<std::vector<std::byte>> get_xstate(pid_t tid) {
  // The kernel's extended-state size is fixed for the machine: learn it
  // once, then allocate exactly that (a 16 KiB zeroed buffer per call showed
  // up in the call latency). 16 KiB covers every layout shipped so far, AMX
  // tile data included.
  static std::atomic<size_t> known_size{16384};
  std::vector<std::byte> buf(known_size.load(std::memory_order_relaxed));
  iovec iov{buf.data(), buf.size()};
  auto r = request(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(arch::kExtendedStateRegset), &iov);
  if (!r && r.error().sys_errno() == ENODEV) {
    // No XSAVE: the legacy FP registers are all the state there is.
    buf.assign(arch::kLegacyFpSize, std::byte{0});
    iov = iovec{buf.data(), buf.size()};
    REMORA_TRY(request(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(arch::kLegacyFpRegset), &iov));
    buf.resize(iov.iov_len);
    return buf;
  }
  REMORA_TRY(std::move(r));
  buf.resize(iov.iov_len);
  known_size.store(iov.iov_len, std::memory_order_relaxed);
  return buf;
}

Result<void> set_xstate(pid_t tid, std::span<const std::byte> xstate) {
  iovec iov{const_cast<std::byte*>(xstate.data()), xstate.size()};
  const auto regset =
      xstate.size() == arch::kLegacyFpSize ? arch::kLegacyFpRegset : arch::kExtendedStateRegset;
  return simple(PTRACE_SETREGSET, tid, reinterpret_cast<void*>(regset), &iov);
}
#endif

Result<long> seccomp_get_filter(pid_t tid, unsigned long index, void* out) {
  return request(PTRACE_SECCOMP_GET_FILTER, tid, reinterpret_cast<void*>(index), out);
}

uint64_t code_address_tag_mask(pid_t tid) {
  if constexpr (arch::kCodeTagMaskRegset == 0) {
    (void)tid;
    return 0;
  } else {
    struct {
      uint64_t data_mask, insn_mask;
    } masks{};
    iovec iov{&masks, sizeof masks};
    if (::ptrace(PTRACE_GETREGSET, tid, reinterpret_cast<void*>(uintptr_t{arch::kCodeTagMaskRegset}), &iov) !=
        0)
      return 0;  // no pointer authentication
    return masks.insn_mask;
  }
}

Result<uint64_t> get_sigmask(pid_t tid) {
  uint64_t mask = 0;
  REMORA_TRY(request(PTRACE_GETSIGMASK, tid, reinterpret_cast<void*>(sizeof mask), &mask));
  return mask;
}

Result<void> set_sigmask(pid_t tid, uint64_t mask) {
  return simple(PTRACE_SETSIGMASK, tid, reinterpret_cast<void*>(sizeof mask), &mask);
}

Result<siginfo_t> get_siginfo(pid_t tid) {
  siginfo_t si{};
  REMORA_TRY(request(PTRACE_GETSIGINFO, tid, nullptr, &si));
  return si;
}

Result<SyscallInfo> get_syscall_info(pid_t tid) {
  __ptrace_syscall_info raw{};
  REMORA_TRY(request(PTRACE_GET_SYSCALL_INFO, tid, reinterpret_cast<void*>(sizeof raw), &raw));
  SyscallInfo info;
  info.ip = raw.instruction_pointer;
  info.sp = raw.stack_pointer;
  switch (raw.op) {
    case PTRACE_SYSCALL_INFO_ENTRY:
      info.op = SyscallInfo::Op::kEntry;
      info.nr = static_cast<long>(raw.entry.nr);
      info.arg0 = raw.entry.args[0];
      break;
    case PTRACE_SYSCALL_INFO_EXIT:
      info.op = SyscallInfo::Op::kExit;
      info.ret = raw.exit.rval;
      info.is_error = raw.exit.is_error != 0;
      break;
    case PTRACE_SYSCALL_INFO_SECCOMP:
      info.op = SyscallInfo::Op::kSeccomp;
      info.nr = static_cast<long>(raw.seccomp.nr);
      break;
    default: break;
  }
  return info;
}

const char* stop_kind_name(Stop::Kind k) {
  switch (k) {
    case Stop::Kind::kSignalDelivery: return "signal-delivery";
    case Stop::Kind::kGroupStop: return "group-stop";
    case Stop::Kind::kInterrupt: return "interrupt";
    case Stop::Kind::kSyscall: return "syscall";
    case Stop::Kind::kEvent: return "event";
    case Stop::Kind::kExited: return "exited";
    case Stop::Kind::kKilled: return "killed";
  }
  return "?";
}

namespace {

Stop decode(int status) {
  Stop s{Stop::Kind::kExited};
  if (WIFEXITED(status)) {
    s.kind = Stop::Kind::kExited;
    s.exit_status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    s.kind = Stop::Kind::kKilled;
    s.sig = WTERMSIG(status);
  } else {
    int sig = WSTOPSIG(status);
    int event = (status >> 16) & 0xff;
    s.sig = sig;
    s.event = event;
    if (event == PTRACE_EVENT_STOP) {
      bool job = sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
      s.kind = job ? Stop::Kind::kGroupStop : Stop::Kind::kInterrupt;
    } else if (event != 0) {
      s.kind = Stop::Kind::kEvent;
    } else if (sig == (SIGTRAP | 0x80)) {
      s.kind = Stop::Kind::kSyscall;
      s.sig = SIGTRAP;
    } else {
      s.kind = Stop::Kind::kSignalDelivery;
    }
  }
  return s;
}

}  // namespace

namespace {

enum class Probe { kNothing, kGot, kVanished, kError };

// Checks `tid` once, without blocking. Peeks first (WNOWAIT), then consumes a
// stop with a call that cannot reap, so that an exit is reaped only when the
// caller wants it reaped (see WaitOptions::leave_child_exit).
Probe probe(pid_t tid, bool leave_child_exit, Stop* out, int* err) {
  for (;;) {
    siginfo_t si{};
    int rc = ::waitid(P_PID, static_cast<id_t>(tid), &si, WEXITED | WSTOPPED | __WALL | WNOHANG | WNOWAIT);
    if (rc == -1) {
      if (errno == EINTR) continue;
      *err = errno;
      return errno == ECHILD ? Probe::kVanished : Probe::kError;
    }
    if (si.si_pid != tid) return Probe::kNothing;
    if (si.si_code == CLD_TRAPPED || si.si_code == CLD_STOPPED) {
      siginfo_t got{};
      if (::waitid(P_PID, static_cast<id_t>(tid), &got, WSTOPPED | __WALL | WNOHANG) == 0 &&
          got.si_pid == tid) {
        // For a ptrace stop, si_status is the whole stop code: signal,
        // 0x80 for a syscall stop, and the event in bits 8-15.
        *out = decode((got.si_status << 8) | 0x7f);
        REMORA_LOG(kPtrace, "wait tid=%d -> %s sig=%d event=%d", tid, stop_kind_name(out->kind), out->sig,
                   out->event);
        return Probe::kGot;
      }
      continue;  // changed meanwhile (killed): look again
    }
    Stop st{si.si_code == CLD_EXITED ? Stop::Kind::kExited : Stop::Kind::kKilled};
    if (si.si_code == CLD_EXITED)
      st.exit_status = si.si_status;
    else
      st.sig = si.si_status;
    bool leave = false;
    if (leave_child_exit) {
      auto status = procfs::read_status(tid);
      leave = status && status->tgid == tid && status->ppid == getpid();
    }
    if (!leave) {
      siginfo_t reaped{};
      (void)::waitid(P_PID, static_cast<id_t>(tid), &reaped, WEXITED | __WALL | WNOHANG);
    }
    REMORA_LOG(kPtrace, "wait tid=%d -> %s%s", tid, stop_kind_name(st.kind),
               leave ? " (left for its parent to reap)" : "");
    *out = st;
    return Probe::kGot;
  }
}

// True when the waiter has one CPU only and one of `tids` may run there: the
// tracee then needs the very CPU that a spinning waiter holds (`taskset -c
// N`, a one-CPU cpuset, a target whose threads keep every other core busy
// behind its own mask). sched_yield is no help there: the scheduler (EEVDF)
// runs whatever else is runnable on that CPU, the target's busy threads
// included, and moves the yielder's deadline a slice later, so once the
// tracee has stopped the waiter, runnable and not woken, waits behind them
// for up to a scheduler tick (4 ms at HZ=250). A sleeping waiter is woken
// by its timer and preempts them. Two cheap system calls per wait.
bool shares_the_waiters_only_cpu(std::span<const pid_t> tids) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (::sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) != 1) return false;
  for (pid_t tid : tids) {
    cpu_set_t theirs;
    CPU_ZERO(&theirs);
    if (::sched_getaffinity(tid, sizeof theirs, &theirs) != 0) continue;  // gone: the probe will say
    CPU_AND(&theirs, &theirs, &mine);
    if (CPU_COUNT(&theirs) != 0) return true;
  }
  return false;
}

}  // namespace

Waited wait_any(std::span<const pid_t> tids, const Deadline& deadline, const WaitOptions& opts) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  long sleep_ns = 5'000;
  const bool watch = opts.wake_fd >= 0;
  // Checked at the first miss only: most waits find their stop at once.
  std::optional<bool> shared_cpu;
  for (;;) {
    for (pid_t tid : tids) {
      Waited w;
      w.tid = tid;
      switch (probe(tid, opts.leave_child_exit, &w.stop, &w.err)) {
        case Probe::kNothing: continue;
        case Probe::kGot: w.kind = Waited::Kind::kStop; return w;
        case Probe::kVanished:
          REMORA_LOG(kPtrace, "wait tid=%d -> vanished (ECHILD)", tid);
          w.kind = Waited::Kind::kVanished;
          return w;
        case Probe::kError: w.kind = Waited::Kind::kError; return w;
      }
    }
    if (deadline.expired()) return Waited{Waited::Kind::kTimeout};
    pollfd pfd{opts.wake_fd, POLLIN, 0};
    // A short spin catches the stop of a thread that had a CPU to itself;
    // then sleep. A CPU that spins (sched_yield included) is never idle, so
    // a tracee queued behind a busy thread of the target is neither placed
    // on it nor pulled over, and waits for that thread's time slice. 5 us
    // doubling to 20 us for the first millisecond, then to 1 ms for a call
    // that runs long (short sleeps need the 1 ns timer slack Controller
    // calls set: the default slack stretches each by 50 us).
    const auto waited = Clock::now() - start;
    if (!shared_cpu) shared_cpu = shares_the_waiters_only_cpu(tids);
    if (!*shared_cpu && waited < std::chrono::microseconds(30)) {
      if (watch && ::poll(&pfd, 1, 0) > 0) return Waited{Waited::Kind::kWake};
      sched_yield();
      continue;
    }
    timespec ts{0, std::min<long>(sleep_ns, deadline.remaining().count() + 1)};
    int n = ::ppoll(watch ? &pfd : nullptr, watch ? 1 : 0, &ts, nullptr);
    if (n > 0) return Waited{Waited::Kind::kWake};
    if (n < 0 && errno == EINTR) return Waited{Waited::Kind::kSignal};
    // On a shared CPU a nap's overshoot is the tracee's own time lost (it
    // stopped, nothing else of ours runs): at most 200 us there.
    const long cap = waited < std::chrono::milliseconds(1) ? 20'000 : *shared_cpu ? 200'000 : 1'000'000;
    sleep_ns = std::min<long>(sleep_ns * 2, cap);
  }
}

Result<Stop> wait_stop(pid_t tid, const Deadline& deadline) {
  const pid_t one[] = {tid};
  for (;;) {
    Waited w = wait_any(one, deadline, WaitOptions{-1, true});
    switch (w.kind) {
      case Waited::Kind::kStop: return w.stop;
      case Waited::Kind::kSignal:
      case Waited::Kind::kWake: continue;  // the caller's signal is not ours to act on
      case Waited::Kind::kVanished:
        return Error(Errc::kTargetExited, "thread " + std::to_string(tid) + " is gone (no longer traced)",
                     ECHILD);
      case Waited::Kind::kError: return Error::from_errno("waitid(" + std::to_string(tid) + ")", w.err);
      case Waited::Kind::kTimeout:
        return Error(Errc::kTimedOut, "thread " + std::to_string(tid) + " did not stop in time");
    }
  }
}

bool is_fault(const siginfo_t& si) {
  switch (si.si_signo) {
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
    case SIGTRAP:
    case SIGSYS: return si.si_code > 0;  // generated by the kernel for this thread's own instruction
    default: return false;
  }
}

Result<void> precheck_attach(pid_t pid) {
  auto st = procfs::read_status(pid);
  if (!st) return std::move(st).error();
  return precheck_attach(pid, *st);
}

Result<void> precheck_attach(pid_t pid, const procfs::Status& st) {
  if (st.tracer_pid != 0) {
    return Error(Errc::kTracedByOther,
                 "process " + std::to_string(pid) + " is already traced by " + describe_task(st.tracer_pid) +
                     "; a process can have only one tracer: detach that debugger or tracer (or wait for it "
                     "to finish) and retry",
                 EPERM);
  }
  return ok();
}

namespace {

// Kernels before 6.10 have no "Kthread:" line: PF_KTHREAD in stat says it.
bool is_kernel_thread(pid_t pid, const procfs::Status& st) {
  if (st.kthread) return *st.kthread;
  auto stat = procfs::read_stat(pid);
  return stat && (stat->flags & 0x00200000u) != 0;  // PF_KTHREAD
}

}  // namespace

Result<procfs::Status> precheck_identity(pid_t pid) {
  const std::string p = std::to_string(pid);
  if (pid <= 0)
    return Error(Errc::kInvalidArgument, "invalid process id " + p + "; give a pid greater than 0");
  if (pid == ::getpid())
    return Error(Errc::kOwnProcess, "pid " + p +
                                        " is this process itself; a process cannot trace itself: run "
                                        "remora from another process");
  auto st = procfs::read_status(pid);
  if (!st) {
    if (st.error().code() == Errc::kNoSuchProcess)
      return Error(Errc::kNoSuchProcess, "no process " + p + " (it may have exited); check the pid with ps",
                   ESRCH);
    return std::move(st).error();
  }
  if (st->tgid == ::getpid())
    return Error(Errc::kOwnProcess, p + " is a thread of this process; a process cannot trace itself: run "
                                        "remora from another process");
  if (st->tgid != pid)
    return Error(Errc::kInvalidArgument, p + " is a thread of process " + std::to_string(st->tgid) +
                                             "; give the process id " + std::to_string(st->tgid) +
                                             " instead (use -T to pick a thread)");
  if (st->state == 'Z' || st->state == 'X')
    return Error(Errc::kZombie, "process " + p + " is a zombie: it has exited and waits for its parent (" +
                                    std::to_string(st->ppid) +
                                    ") to reap it; there is nothing left to trace");
  if (is_kernel_thread(pid, *st))
    return Error(Errc::kKernelThread, "process " + p + " (" + st->name +
                                          ") is a kernel thread: it has no user space to trace; pick a "
                                          "user-space process");
  return st;
}

Result<procfs::Status> precheck_open(pid_t pid) {
  auto st = REMORA_TRY(precheck_identity(pid));
  if (st.tracer_pid == 0) {
    REMORA_TRY(precheck_attach(pid, st));
    return st;
  }
  // Another controller's call holds a thread only for a moment: wait it out
  // before refusing, so that two controllers can open a process at once.
  if (ptrace::wait_until_untraced(pid, 0, Deadline::after(kPassingTracerGrace))) {
    // Seen untraced within the grace: the tracer was passing. Read again
    // (the process may have changed or ended meanwhile), but do not refuse
    // for a tracer seen now: another controller's next call may already hold
    // a thread again, for a moment; a tracer that stays is reported by the
    // seize, which waits out a passing one as well.
    return precheck_identity(pid);
  }
  // A tracer thread of this very process: another handle holds it.
  if (st.tracer_pid != 0 && procfs::read_status(::getpid(), st.tracer_pid))
    return Error(Errc::kTracedByOther,
                 "process " + std::to_string(pid) +
                     " is already held by another handle (or tracer) of this process; close that handle "
                     "first",
                 EBUSY);
  REMORA_TRY(precheck_attach(pid, st));
  return st;
}

Error diagnose_attach_failure(pid_t pid, int err) {
  const std::string p = std::to_string(pid);
  if (err == ESRCH) return Error(Errc::kNoSuchProcess, "no process " + p, err);
  if (err != EPERM && err != EACCES) return Error::from_errno("ptrace attach to process " + p, err);

  auto traced = precheck_attach(pid);
  if (!traced) return std::move(traced).error();

  if (const int filtered = ptrace_syscall_filtered(); filtered != 0) {
    auto self = procfs::read_status(::getpid());
    const bool seccomp = self && self->seccomp == 2;
    return Error(Errc::kPtraceDenied,
                 std::string("ptrace refused before any rule about process ") + p +
                     ": the ptrace system call itself fails here (" + std::strerror(filtered) +
                     ", for any pid)" +
                     (seccomp ? ", refused by a seccomp filter of remora's own process (Seccomp: 2 in "
                                "/proc/self/status: a container runtime's profile, or a parent's filter)"
                              : ", refused by a filter in front of the kernel") +
                     "; run remora where ptrace is allowed (a profile that permits ptrace, e.g. "
                     "--security-opt seccomp=unconfined, or from the host)",
                 err);
  }

  auto st = procfs::read_status(pid);
  const uid_t me = geteuid();
  const bool cap = has_cap_sys_ptrace();
  if (st && !cap) {
    bool same_uid = true;
    for (int i = 0; i < 3; ++i) same_uid &= st->uid[static_cast<size_t>(i)] == me;
    if (!same_uid)
      return Error(Errc::kPtraceDenied,
                   "ptrace refused by the uid rule: process " + p + " runs as uid " +
                       std::to_string(st->uid[1]) + " (real " + std::to_string(st->uid[0]) + ", saved " +
                       std::to_string(st->uid[2]) + ") and you are uid " + std::to_string(me) +
                       " without CAP_SYS_PTRACE; run remora as uid " + std::to_string(st->uid[1]) +
                       " or as root, or grant it CAP_SYS_PTRACE",
                   err);
    // The files under /proc/PID (not the directory itself) belong to root
    // when the process is not dumpable.
    struct stat sb {};
    if (::stat(("/proc/" + p + "/status").c_str(), &sb) == 0 && sb.st_uid == 0 && st->uid[1] != 0)
      return Error(Errc::kPtraceDenied,
                   "ptrace refused: process " + p +
                       " is not dumpable (it called prctl(PR_SET_DUMPABLE, 0) or gained privileges at exec); "
                       "only a tracer with CAP_SYS_PTRACE may attach: run remora as root",
                   err);
  }
  if (auto scope = procfs::read_text("/proc/sys/kernel/yama/ptrace_scope")) {
    auto v = parse_u64(trim(*scope));
    if (v && *v == 1 && !cap)
      return Error(Errc::kPtraceDenied,
                   "ptrace refused by Yama (kernel.yama.ptrace_scope = 1: only a parent may trace its "
                   "descendants); run remora as root or with CAP_SYS_PTRACE, have the target call "
                   "prctl(PR_SET_PTRACER, ...), or set the sysctl to 0",
                   err);
    if (v && *v == 2 && !cap)
      return Error(Errc::kPtraceDenied,
                   "ptrace refused by Yama (kernel.yama.ptrace_scope = 2: only CAP_SYS_PTRACE may trace); "
                   "run remora as root or grant it CAP_SYS_PTRACE",
                   err);
    if (v && *v == 3)
      return Error(Errc::kPtraceDenied,
                   "ptrace refused by Yama (kernel.yama.ptrace_scope = 3: ptrace is disabled until reboot)",
                   err);
  }
  return Error(
      Errc::kPtraceDenied,
      "ptrace refused for process " + p +
          " by a security module (SELinux, AppArmor) or a user-namespace boundary; run remora in the "
          "target's user namespace or as a user allowed to trace it",
      err);
}

}  // namespace remora::ptrace
