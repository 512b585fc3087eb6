// The seccomp checks of remote/seccomp.h: a classic-BPF interpreter with
// unknown values, the kernel's combination of stacked filters, and the
// engine's planned system calls.
//
// The interpreter accepts what the kernel's seccomp_check_filter accepts
// (kernel/seccomp.c, net/core/filter.c bpf_check_classic): loads of 32-bit
// words of seccomp_data (ABS), immediates, scratch memory and the data
// length; stores; 32-bit ALU; forward jumps; RET K/A; TAX/TXA. Anything else
// is malformed: the kernel would have refused to install it.
#include "remote/seccomp.h"

#include <linux/prctl.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "arch/arch.h"
#include "procfs/procfs.h"
#include "ptrace/seccomp_filter.h"

namespace remora::remote::seccomp {

namespace {

constexpr size_t kDataWords = sizeof(seccomp_data) / 4;  // 16
constexpr size_t kMaxPaths = 4096;                       // forks followed per program
constexpr uint32_t kKillProcess = SECCOMP_RET_KILL_PROCESS;

// A 32-bit value the filter computes, or an unknown one; `field` is the word
// of seccomp_data an unknown value was loaded from (-1: none), so that a
// taken JEQ can teach the path that word's value.
struct Value {
  bool known = true;
  uint32_t v = 0;
  int field = -1;
};

struct PathState {
  size_t pc = 0;
  Value a, x;
  std::array<Value, BPF_MEMWORDS> mem{};
  std::array<Value, kDataWords> data{};
  bool div_zero = false;  // this path divided by a zero X: it returns 0
};

std::array<Value, kDataWords> data_words(const SyscallData& d) {
  std::array<Value, kDataWords> w{};
  auto put64 = [&](size_t word, uint64_t v, bool known) {
    // Little-endian (x86_64): the low half comes first.
    w[word] = {known, static_cast<uint32_t>(v), known ? -1 : static_cast<int>(word)};
    w[word + 1] = {known, static_cast<uint32_t>(v >> 32), known ? -1 : static_cast<int>(word + 1)};
  };
  w[0] = {true, static_cast<uint32_t>(d.nr), -1};
  w[1] = {true, d.arch, -1};
  put64(2, d.instruction_pointer, d.ip_known);
  for (size_t i = 0; i < 6; ++i) put64(4 + 2 * i, d.args[i], (d.args_known >> i) & 1);
  return w;
}

enum class Step { kNext, kReturn, kFork, kMalformed };

// ALU on known operands. false: division by zero (runtime, from X).
bool alu(uint16_t op, uint32_t& a, uint32_t b) {
  switch (op) {
    case BPF_ADD: a += b; return true;
    case BPF_SUB: a -= b; return true;
    case BPF_MUL: a *= b; return true;
    case BPF_DIV:
      if (b == 0) return false;
      a /= b;
      return true;
    case BPF_MOD:
      if (b == 0) return false;
      a %= b;
      return true;
    case BPF_OR: a |= b; return true;
    case BPF_AND: a &= b; return true;
    case BPF_XOR: a ^= b; return true;
    // Constant shifts >= 32 are refused at load time; a shift by X is
    // masked as the x86_64 JIT's shl/shr do.
    case BPF_LSH: a <<= (b & 31); return true;
    case BPF_RSH: a >>= (b & 31); return true;
    default: return false;
  }
}

bool valid_alu_op(uint16_t op) {
  switch (op) {
    case BPF_ADD:
    case BPF_SUB:
    case BPF_MUL:
    case BPF_DIV:
    case BPF_MOD:
    case BPF_OR:
    case BPF_AND:
    case BPF_XOR:
    case BPF_LSH:
    case BPF_RSH:
    case BPF_NEG: return true;
    default: return false;
  }
}

// BPF_ALU: A op= K or X.
Step alu_step(const sock_filter& in, PathState& s, PathState& other, uint32_t& ret) {
  const uint16_t op = BPF_OP(in.code);
  const uint32_t k = in.k;
  if (!valid_alu_op(op)) return Step::kMalformed;
  ++s.pc;
  if (op == BPF_NEG) {
    s.a = s.a.known ? Value{true, 0u - s.a.v, -1} : Value{false, 0, -1};
    return Step::kNext;
  }
  const bool use_x = BPF_SRC(in.code) == BPF_X;
  const bool divides = op == BPF_DIV || op == BPF_MOD;
  if (!use_x && divides && k == 0) return Step::kMalformed;
  if (!use_x && (op == BPF_LSH || op == BPF_RSH) && k >= 32) return Step::kMalformed;
  const Value b = use_x ? s.x : Value{true, k, -1};
  if (divides && b.known && b.v == 0) {
    // The kernel's translation returns 0 (SECCOMP_RET_KILL_THREAD) for a
    // division by a zero X (net/core/filter.c, bpf_convert_filter).
    ret = 0;
    return Step::kReturn;
  }
  if (divides && !b.known) {
    // An unknown divisor: a quotient, or the kernel's return 0.
    other = s;
    other.div_zero = true;
    s.a = {false, 0, -1};
    return Step::kFork;
  }
  if (!s.a.known || !b.known) {
    s.a = {false, 0, -1};
    return Step::kNext;
  }
  uint32_t a = s.a.v;
  alu(op, a, b.v);
  s.a = {true, a, -1};
  return Step::kNext;
}

// BPF_JMP: JA, and JEQ/JGT/JGE/JSET against K or X; forward only, in range.
Step jump_step(std::span<const sock_filter> prog, const sock_filter& in, PathState& s, PathState& other) {
  const uint16_t op = BPF_OP(in.code);
  const size_t left = prog.size() - s.pc - 1;
  if (op == BPF_JA) {
    if (BPF_SRC(in.code) != BPF_K || in.k >= left) return Step::kMalformed;
    s.pc += 1 + in.k;
    return Step::kNext;
  }
  if (op != BPF_JEQ && op != BPF_JGT && op != BPF_JGE && op != BPF_JSET) return Step::kMalformed;
  if (in.jt >= left || in.jf >= left) return Step::kMalformed;
  const Value b = BPF_SRC(in.code) == BPF_X ? s.x : Value{true, in.k, -1};
  const size_t taken = s.pc + 1 + in.jt, not_taken = s.pc + 1 + in.jf;
  if (s.a.known && b.known) {
    bool c = op == BPF_JEQ   ? s.a.v == b.v
             : op == BPF_JGT ? s.a.v > b.v
             : op == BPF_JGE ? s.a.v >= b.v
                             : (s.a.v & b.v) != 0;
    s.pc = c ? taken : not_taken;
    return Step::kNext;
  }
  other = s;
  other.pc = taken;
  s.pc = not_taken;
  // A taken JEQ against a known value teaches that path the value
  // (libseccomp compares a 64-bit argument half by half).
  if (op == BPF_JEQ && b.known) {
    other.a = {true, b.v, -1};
    if (s.a.field >= 0) other.data[static_cast<size_t>(s.a.field)] = other.a;
  }
  return Step::kFork;
}

// Executes one instruction of a path. On kReturn, `ret` holds the verdict;
// on kFork, `other` is the path that takes the jump (and `s` the one that
// does not); `ret_unknown` marks a RET A with an unknown A.
Step step(std::span<const sock_filter> prog, PathState& s, PathState& other, uint32_t& ret,
          bool& ret_unknown) {
  if (s.pc >= prog.size()) return Step::kMalformed;  // fell off the end
  const sock_filter& in = prog[s.pc];
  const uint16_t cls = BPF_CLASS(in.code);
  const uint32_t k = in.k;
  auto next = [&] {
    ++s.pc;
    return Step::kNext;
  };
  switch (cls) {
    case BPF_LD:
    case BPF_LDX: {
      Value& dst = cls == BPF_LD ? s.a : s.x;
      if (BPF_SIZE(in.code) != BPF_W) return Step::kMalformed;
      switch (BPF_MODE(in.code)) {
        case BPF_ABS:
          if (cls != BPF_LD || (k & 3) != 0 || k >= sizeof(seccomp_data)) return Step::kMalformed;
          dst = s.data[k / 4];
          return next();
        case BPF_IMM: dst = {true, k, -1}; return next();
        case BPF_MEM:
          if (k >= BPF_MEMWORDS) return Step::kMalformed;
          dst = s.mem[k];
          return next();
        case BPF_LEN: dst = {true, sizeof(seccomp_data), -1}; return next();
        default: return Step::kMalformed;
      }
    }
    case BPF_ST:
    case BPF_STX:
      if (in.code != cls || k >= BPF_MEMWORDS) return Step::kMalformed;
      s.mem[k] = cls == BPF_ST ? s.a : s.x;
      return next();
    case BPF_ALU: return alu_step(in, s, other, ret);
    case BPF_JMP: return jump_step(prog, in, s, other);
    case BPF_RET:
      switch (BPF_RVAL(in.code)) {
        case BPF_K: ret = k; return Step::kReturn;
        case BPF_A:
          ret = s.a.v;
          ret_unknown = !s.a.known;
          return Step::kReturn;
        default: return Step::kMalformed;
      }
    case BPF_MISC:
      if (BPF_MISCOP(in.code) == BPF_TAX)
        s.x = s.a;
      else if (BPF_MISCOP(in.code) == BPF_TXA)
        s.a = s.x;
      else
        return Step::kMalformed;
      return next();
    default: return Step::kMalformed;
  }
}

void add_verdict(Outcome& out, uint32_t ret) {
  for (const auto& v : out.verdicts)
    if (v.ret == ret) return;
  out.verdicts.push_back(Verdict{ret});
}

std::string errno_name(int e) {
  const char* n = strerrorname_np(e);
  return n != nullptr ? n : std::to_string(e);
}

}  // namespace

bool Verdict::refuses() const {
  switch (static_cast<uint32_t>(action_full())) {
    case SECCOMP_RET_ALLOW:
    case SECCOMP_RET_LOG:
    case SECCOMP_RET_USER_NOTIF: return false;
    default: return true;  // KILL_*, TRAP, ERRNO, TRACE and unknown actions (the kernel kills)
  }
}

std::string Verdict::name() const {
  switch (static_cast<uint32_t>(action_full())) {
    case SECCOMP_RET_KILL_PROCESS: return "SECCOMP_RET_KILL_PROCESS";
    case SECCOMP_RET_KILL_THREAD: return "SECCOMP_RET_KILL_THREAD";
    case SECCOMP_RET_TRAP: return "SECCOMP_RET_TRAP";
    case SECCOMP_RET_ERRNO: return "SECCOMP_RET_ERRNO(" + errno_name(data()) + ")";
    case SECCOMP_RET_USER_NOTIF: return "SECCOMP_RET_USER_NOTIF";
    case SECCOMP_RET_TRACE: return "SECCOMP_RET_TRACE";
    case SECCOMP_RET_LOG: return "SECCOMP_RET_LOG";
    case SECCOMP_RET_ALLOW: return "SECCOMP_RET_ALLOW";
    default: {
      char buf[64];
      std::snprintf(buf, sizeof buf, "unknown action %#x", ret);
      return buf;
    }
  }
}

std::string Verdict::effect() const {
  switch (static_cast<uint32_t>(action_full())) {
    case SECCOMP_RET_KILL_PROCESS: return "kill the process (SECCOMP_RET_KILL_PROCESS)";
    case SECCOMP_RET_KILL_THREAD: return "kill the thread (SECCOMP_RET_KILL_THREAD)";
    case SECCOMP_RET_TRAP: return "send the thread SIGSYS (SECCOMP_RET_TRAP)";
    case SECCOMP_RET_ERRNO: return "make it fail with " + errno_name(data()) + " (" + name() + ")";
    case SECCOMP_RET_TRACE:
      return "hand it to a seccomp tracer (SECCOMP_RET_TRACE), which under Remora's ptrace makes it fail "
             "with ENOSYS";
    case SECCOMP_RET_ALLOW:
    case SECCOMP_RET_LOG:
    case SECCOMP_RET_USER_NOTIF: return "allow it (" + name() + ")";
    default: return "kill the process (" + name() + ", which the kernel treats as SECCOMP_RET_KILL_PROCESS)";
  }
}

Outcome evaluate(std::span<const sock_filter> program, const SyscallData& data) {
  Outcome out;
  std::vector<PathState> work(1);
  work[0].data = data_words(data);
  size_t paths = 1;
  while (!work.empty()) {
    PathState s = std::move(work.back());
    work.pop_back();
    if (s.div_zero) {
      add_verdict(out, 0);  // SECCOMP_RET_KILL_THREAD, see step()
      continue;
    }
    // Jumps only go forward, so a path ends within program.size() steps.
    for (size_t steps = 0; steps <= program.size(); ++steps) {
      PathState other;
      uint32_t ret = 0;
      bool ret_unknown = false;
      Step st = step(program, s, other, ret, ret_unknown);
      if (st == Step::kNext) continue;
      if (st == Step::kFork) {
        if (++paths > kMaxPaths) {
          out.truncated = true;
          add_verdict(out, SECCOMP_RET_ALLOW);
          return out;
        }
        work.push_back(std::move(other));
        continue;
      }
      if (st == Step::kMalformed) {
        out.malformed = true;
        add_verdict(out, kKillProcess);
      } else if (ret_unknown) {
        // RET A with A computed from unknown fields: any value.
        out.truncated = true;
        add_verdict(out, SECCOMP_RET_ALLOW);
      } else {
        add_verdict(out, ret);
      }
      break;
    }
  }
  return out;
}

Outcome evaluate_stack(std::span<const Program> programs, const SyscallData& data) {
  Outcome combined;
  combined.verdicts.push_back(Verdict{SECCOMP_RET_ALLOW});
  // seccomp_run_filters walks from the newest filter (the last index) to the
  // oldest and keeps a new value only when its action is strictly lower, so
  // on a tie the newer filter's data wins.
  for (auto it = programs.rbegin(); it != programs.rend(); ++it) {
    Outcome one = evaluate(*it, data);
    combined.malformed |= one.malformed;
    combined.truncated |= one.truncated;
    Outcome next;
    for (const auto& c : combined.verdicts)
      for (const auto& v : one.verdicts) add_verdict(next, v.action_full() < c.action_full() ? v.ret : c.ret);
    combined.verdicts = std::move(next.verdicts);
  }
  return combined;
}

std::string syscall_name(long nr) {
  struct Named {
    long nr;
    const char* name;
  };
  static constexpr Named kNames[] = {
      {SYS_read, "read"},
      {SYS_write, "write"},
      {SYS_close, "close"},
      {SYS_fstat, "fstat"},
      {SYS_mmap, "mmap"},
      {SYS_mprotect, "mprotect"},
      {SYS_munmap, "munmap"},
      {SYS_brk, "brk"},
      {SYS_rt_sigaction, "rt_sigaction"},
      {SYS_rt_sigprocmask, "rt_sigprocmask"},
      {SYS_rt_sigreturn, "rt_sigreturn"},
      {SYS_ioctl, "ioctl"},
      {SYS_pread64, "pread64"},
      {SYS_sched_yield, "sched_yield"},
      {SYS_madvise, "madvise"},
      {SYS_getpid, "getpid"},
      {SYS_clone, "clone"},
      {SYS_exit, "exit"},
      {SYS_kill, "kill"},
      {SYS_fcntl, "fcntl"},
      {SYS_getuid, "getuid"},
      {SYS_getppid, "getppid"},
      {SYS_sigaltstack, "sigaltstack"},
      {SYS_prctl, "prctl"},
      {SYS_gettid, "gettid"},
      {SYS_futex, "futex"},
      {SYS_set_robust_list, "set_robust_list"},
      {SYS_exit_group, "exit_group"},
      {SYS_tgkill, "tgkill"},
      {SYS_openat, "openat"},
      {SYS_newfstatat, "newfstatat"},
      {SYS_pipe2, "pipe2"},
      {SYS_memfd_create, "memfd_create"},
      {SYS_rseq, "rseq"},
      {SYS_clone3, "clone3"},
      {SYS_getrandom, "getrandom"},
      {SYS_statx, "statx"},
  };
  for (const auto& n : kNames)
    if (n.nr == nr) return n.name;
  return "system call " + std::to_string(nr);
}

namespace {

// Whether every verdict of `o` refuses a call whose caller copes with a
// failure (`failure_ok`) or not.
bool all_refuse(const Outcome& o, bool failure_ok) {
  return std::all_of(o.verdicts.begin(), o.verdicts.end(), [&](const Verdict& v) {
    if (!v.refuses()) return false;
    if (!failure_ok) return true;
    const auto a = static_cast<uint32_t>(v.action_full());
    return a != SECCOMP_RET_ERRNO && a != SECCOMP_RET_TRACE;  // an error return is coped with
  });
}

bool only_enosys(const Outcome& o) {
  return std::all_of(o.verdicts.begin(), o.verdicts.end(), [](const Verdict& v) {
    const auto a = static_cast<uint32_t>(v.action_full());
    return (a == SECCOMP_RET_ERRNO && v.data() == ENOSYS) || a == SECCOMP_RET_TRACE;
  });
}

Outcome evaluate_planned(std::span<const Program> programs, const PlannedSyscall& p, long nr) {
  SyscallData d;
  d.nr = static_cast<int32_t>(nr);
  d.arch = arch::kAuditArch;
  d.args = p.args;
  d.args_known = nr == p.nr ? p.args_known : 0;
  return evaluate_stack(programs, d);
}

}  // namespace

Result<void> check(std::span<const Program> programs, std::span<const PlannedSyscall> planned,
                   std::string_view what) {
  if (programs.empty()) return ok();
  for (const auto& p : planned) {
    long nr = p.nr;
    Outcome o = evaluate_planned(programs, p, nr);
    if (p.enosys_fallback >= 0 && only_enosys(o)) {
      nr = p.enosys_fallback;
      o = evaluate_planned(programs, p, nr);
    }
    if (!all_refuse(o, p.failure_ok)) continue;
    std::string how = "the target's seccomp filter would " + o.verdicts[0].effect();
    for (size_t i = 1; i < o.verdicts.size(); ++i) how += " or " + o.verdicts[i].effect();
    if (o.verdicts.size() > 1) how += ", depending on arguments Remora cannot know in advance,";
    std::string msg = how + " on " + syscall_name(nr) + ", " + std::string(p.purpose) +
                      "; nothing was changed (use another thread with -T if one is not filtered this way)";
    if (o.malformed) msg += " [the filter holds instructions the kernel would not accept]";
    Error e(Errc::kNotSupported, std::move(msg));
    if (!what.empty()) e.with_context(std::string(what));
    return e;
  }
  return ok();
}

Error strict_mode_error(pid_t tid) {
  return Error(Errc::kNotSupported, "thread " + std::to_string(tid) +
                                        " is in seccomp strict mode: it may only read, write, exit and "
                                        "sigreturn; Remora cannot run code in it (choose another thread with "
                                        "-T, if the process has one that is not)");
}

std::string denial_note(long nr, int64_t ret, bool sigsys, bool filter_mode, int unreadable_errno) {
  if (!filter_mode) return {};
  // A kill rolls the call back: the thread leaves it with its own number
  // in rax, and a SIGSYS the tracer cannot stop (kernel/seccomp.c).
  const bool killed = ret == nr;
  if (!sigsys && !killed && ret != -EPERM && ret != -ENOSYS && ret != -EACCES) return {};
  std::string s = "; the thread runs under a seccomp filter, which ";
  if (killed)
    s += "killed the process on " + syscall_name(nr) + " (SECCOMP_RET_KILL_*: the call rolled back, SIGSYS)";
  else
    s += "probably refused " + syscall_name(nr) +
         (sigsys ? " (SIGSYS)" : " (" + errno_name(static_cast<int>(-ret)) + ")");
  if (unreadable_errno != 0)
    s += "; Remora could not read the filter to check it first (PTRACE_SECCOMP_GET_FILTER: " +
         errno_name(unreadable_errno) +
         ", it needs CAP_SYS_ADMIN and a controller not itself under seccomp): run remora as root or with "
         "CAP_SYS_ADMIN to have the filter checked before anything is changed";
  return s;
}

std::vector<PlannedSyscall> engine_syscalls(const EnginePlan& plan) {
  constexpr uint8_t kAll = 0x3f;
  std::vector<PlannedSyscall> out;
  if (plan.creates_scratch) {
    // The scratch: 16 pages; its base is known only once mmap returned.
    // Naming it and keeping it out of forks are niceties: the setup
    // routine's result is ignored, so only a kill or SIGSYS refuses those.
    constexpr uint64_t kSize = 64 * 1024;
    out.push_back(
        {SYS_mmap,
         "which Remora needs to create its scratch mapping",
         {plan.scratch_hint, kSize, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, ~uint64_t{0}, 0},
         kAll});
    out.push_back({SYS_mprotect,
                   "which Remora needs to make its scratch data writable",
                   {0, kSize - 4096, PROT_READ | PROT_WRITE, 0, 0, 0},
                   0b110});
    out.push_back({SYS_prctl,
                   "which Remora uses to name its scratch mapping",
                   {PR_SET_VMA, PR_SET_VMA_ANON_NAME, 0, kSize, 0, 0},
                   0b1011,
                   /*failure_ok=*/true});
    out.push_back({SYS_madvise,
                   "which Remora uses to keep its scratch mapping out of forks",
                   {0, kSize, MADV_DONTFORK, 0, 0, 0},
                   0b110,
                   /*failure_ok=*/true});
  }
  if (plan.swaps_mask)
    out.push_back({SYS_rt_sigprocmask,
                   "which Remora needs to record the signal mask of a thread interrupted in ppoll, pselect6, "
                   "rt_sigsuspend or epoll_pwait",
                   {SIG_BLOCK, 0, 0, 8, 0, 0},
                   0b1001});
  if (plan.is_syscall) out.push_back({plan.nr, "the system call asked for", plan.args, kAll});
  if (plan.marked_call) {
    out.push_back({SYS_getpid, "which a marked call makes to signal its end", {}, kAll});
    out.push_back({SYS_gettid, "which a marked call makes to signal its end", {}, kAll});
    out.push_back({SYS_tgkill, "which a marked call makes to signal its end", {}, 0});
  }
  out.push_back({SYS_rt_sigreturn, "which Remora needs to restore the thread", {}, kAll});
  return out;
}

std::span<const PlannedSyscall> agent_load_syscalls() {
  // From `strace -f` of pthread_create + dlopen(libremora-agent.so,
  // RTLD_NOW) on a fresh thread, as remora attach does it
  // (Debian 12, glibc 2.36), in the order made:
  //   pthread_create   rt_sigaction + rt_sigprocmask (the first thread of a
  //                    process: SIGCANCEL), mmap + mprotect (the stack),
  //                    getrandom + brk (malloc), rt_sigprocmask, clone3
  //   the new thread   rseq, set_robust_list, rt_sigprocmask (glibc goes on
  //                    when rseq or set_robust_list fail)
  //   dlopen           mmap + munmap (the thread's malloc arena), mprotect,
  //                    openat, read, newfstatat, mmap (the segments), close,
  //                    mprotect (RELRO)
  //   the agent's      mmap + mprotect + clone3 + ... (its listener thread),
  //   constructor      prctl(PR_SET_NAME), gettid, futex
  //   thread exit      madvise(MADV_DONTNEED) of its stack, exit
  // A memfd for the agent (make_visible) is made by Target::syscall, which
  // checks its own calls.
  static const std::vector<PlannedSyscall> kLoad = [] {
    constexpr const char* kWhy = "which loading the agent on a fresh thread makes";
    struct Entry {
      long nr;
      bool failure_ok;
      long enosys_fallback;
    };
    const Entry entries[] = {
        {SYS_rt_sigaction, false, -1},   {SYS_rt_sigprocmask, false, -1},
        {SYS_mmap, false, -1},           {SYS_mprotect, false, -1},
        {SYS_getrandom, true, -1},       {SYS_brk, true, -1},
        {SYS_clone3, false, SYS_clone},  {SYS_rseq, true, -1},
        {SYS_set_robust_list, true, -1}, {SYS_munmap, false, -1},
        {SYS_openat, false, -1},         {SYS_read, false, -1},
        {SYS_newfstatat, false, -1},     {SYS_close, false, -1},
        {SYS_prctl, true, -1},           {SYS_gettid, false, -1},
        {SYS_futex, false, -1},          {SYS_madvise, true, -1},
        {SYS_exit, false, -1},
    };
    std::vector<PlannedSyscall> v;
    for (const auto& e : entries) {
      PlannedSyscall p{e.nr, kWhy, {}, 0};
      p.failure_ok = e.failure_ok;
      p.enosys_fallback = e.enosys_fallback;
      v.push_back(p);
    }
    return v;
  }();
  return kLoad;
}

// ---------------------------------------------------------------------------
// Guard.

namespace {
constexpr std::chrono::milliseconds kStatusFresh{250};  // how long a thread's seccomp mode is trusted
}  // namespace

bool Guard::knows_status(pid_t tid) const {
  auto it = threads_.find(tid);
  return it != threads_.end() && it->second.read != std::chrono::steady_clock::time_point{} &&
         std::chrono::steady_clock::now() - it->second.read <= kStatusFresh;
}

void Guard::inherit_status(pid_t child, pid_t parent) {
  if (child == parent || !knows_status(parent)) return;
  const Thread p = threads_[parent];
  Thread& c = threads_[child];
  c.mode = p.mode;
  c.read = p.read;
  c.has_filters = p.has_filters;
}

Result<void> Guard::before_seize(pid_t pid, pid_t tid) {
  const auto now = std::chrono::steady_clock::now();
  Thread& t = threads_[tid];
  if (now - t.read > kStatusFresh) {
    auto st = procfs::read_status(pid, tid);
    if (!st) return ok();
    t.mode = st->seccomp;
    t.read = now;
  }
  if (t.mode != SECCOMP_MODE_STRICT) {
    strict_refused_ = 0;
    return ok();
  }
  strict_refused_ = tid;
  return strict_mode_error(tid);
}

void Guard::note_status(pid_t tid, int seccomp_mode) {
  Thread& t = threads_[tid];
  t.mode = seccomp_mode;
  t.read = std::chrono::steady_clock::now();
}

bool Guard::filtered(pid_t tid) const {
  auto it = threads_.find(tid);
  return it != threads_.end() && (it->second.mode == SECCOMP_MODE_FILTER || it->second.has_filters);
}

bool Guard::is_strict(pid_t pid, pid_t tid) {
  auto st = procfs::read_status(pid, tid);
  return st && st->seccomp == SECCOMP_MODE_STRICT;
}

Result<void> Guard::check_stopped(pid_t tid, std::span<const PlannedSyscall> plan, std::string_view what) {
  Thread& t = threads_[tid];
  auto f = ptrace::read_seccomp_filters(tid);
  if (!f) {
    // Neither readable nor refused (a filter without a classic program,
    // say): go on, as when unprivileged; a denial is then explained.
    t.unreadable_errno = f.error().sys_errno() != 0 ? f.error().sys_errno() : EIO;
    return ok();
  }
  t.unreadable_errno = f->state == ptrace::SeccompFilters::State::kUnreadable ? f->err : 0;
  t.has_filters = !f->programs.empty();
  if (t.has_filters) t.mode = SECCOMP_MODE_FILTER;
  return check(f->programs, plan, what);
}

Error Guard::denial_error(Error plain, pid_t tid, long nr, int64_t ret) const {
  auto it = threads_.find(tid);
  if (it == threads_.end()) return plain;
  std::string note = denial_note(nr, ret, false, filtered(tid), it->second.unreadable_errno);
  if (note.empty()) return plain;
  return Error(Errc::kNotSupported, plain.message() + note, plain.sys_errno());
}

std::string Guard::sigsys_note(pid_t tid, long nr) const {
  auto it = threads_.find(tid);
  if (it == threads_.end() || !filtered(tid)) return {};
  std::string s = "; SIGSYS is how a seccomp filter refuses a system call (SECCOMP_RET_TRAP or _KILL)";
  if (nr >= 0) s += ", here " + syscall_name(nr);
  if (it->second.unreadable_errno != 0)
    s += "; Remora could not read the filter to check it first (PTRACE_SECCOMP_GET_FILTER: " +
         errno_name(it->second.unreadable_errno) +
         "): run remora as root or with CAP_SYS_ADMIN to have the filter checked before anything is changed";
  return s;
}

Result<void> Guard::check_running(pid_t pid, pid_t tid, std::span<const PlannedSyscall> plan,
                                  std::string_view what, const Deadline& deadline) {
  REMORA_TRY(before_seize(pid, tid));
  // A thread whose status (read within the last 250 ms) says no seccomp has
  // no filter to read: no seize, no stop (one round trip fewer per attach).
  if (threads_[tid].mode == 0 && threads_[tid].read != std::chrono::steady_clock::time_point{}) return ok();
  auto f = REMORA_TRY(ptrace::read_seccomp_filters_of_running(pid, tid, deadline));
  Thread& t = threads_[tid];
  t.unreadable_errno = f.state == ptrace::SeccompFilters::State::kUnreadable ? f.err : 0;
  t.has_filters = !f.programs.empty();
  return check(f.programs, plan, what);
}

Result<void> check_open(pid_t pid, int main_mode) {
  if (main_mode != SECCOMP_MODE_STRICT) return ok();
  // Strict mode is per thread: the process is usable if one thread is not.
  auto tasks = procfs::list_tasks(pid);
  if (!tasks) return ok();  // the first call finds out
  for (pid_t tid : *tasks)
    if (!Guard::is_strict(pid, tid)) return ok();
  return Error(
      Errc::kNotSupported,
      "every thread of process " + std::to_string(pid) +
          " is in seccomp strict mode: it may only read, write, exit and sigreturn; Remora cannot run "
          "code in it");
}

}  // namespace remora::remote::seccomp
