// The socket channel's wake-up (agent/channel.cc): which interrupted
// context may start the channel thread, and how a wait that the wake signal
// made fail with EINTR is turned back into the same wait. Pure functions of
// register values and code bytes, shared by the agent (which reads them from
// its signal handler's ucontext) and by their table tests
// (src/arch/wake_rules_test.cc), which cover both architectures on
// any host. Header-only and self-contained (the agent includes it), no libc
// calls: the agent calls it in a signal handler. The host's part, last,
// reads and writes a signal handler's ucontext.
//
// Why it matters (docs/architecture.md, "The socket channel"): a signal
// handler that runs on a thread blocked in epoll_wait, poll, select,
// nanosleep, clock_nanosleep, pause or a futex wait with a timeout makes that
// call return EINTR even with SA_RESTART (signal(7)); only the calls that end
// in -ERESTARTSYS are restarted (read, accept, recv without a timeout, wait4,
// a futex wait without one). And pthread_create, which starts the channel
// thread, takes glibc's stack-cache and malloc locks: the interrupted code
// must hold neither, the rule the ptrace path's loader start keeps too
// (src/attach/attach.cc).
#ifndef REMORA_ARCH_WAKE_RULES_H_
#define REMORA_ARCH_WAKE_RULES_H_

#include <stdint.h>
#include <ucontext.h>

namespace remora::arch::wake {

enum class Arch { kX86_64, kAarch64 };

// What the handler does on the thread it interrupted.
enum class Verdict {
  kStartHere,       // safe: start the channel thread from this handler
  kRepairAndStart,  // a wait that would return EINTR: re-issue it (repair), then start here
  kForward,         // not safe here: hand the wake to another thread
};

// One architecture's system-call numbers that the rules name.
struct Numbers {
  long read, readv, recvfrom, recvmsg, accept, accept4, wait4, waitid, futex;
  long epoll_wait, epoll_pwait, epoll_pwait2, poll, ppoll, select, pselect6, nanosleep, clock_nanosleep,
      pause;
  long write, writev, pread64, pwrite64, sendto, sendmsg, connect;
};

inline constexpr Numbers kX86_64 = {0,   19, 45,  47, 43,  288, 61, 247, 202, 232, 281, 441, 7,
                                    271, 23, 270, 35, 230, 34,  1,  20,  17,  18,  44,  46,  42};
// aarch64 has no epoll_wait, poll, select, pause or accept-without-4 calls
// (-1: never matches).
inline constexpr Numbers kAarch64 = {63, 65, 207, 212, 202, 242, 260, 95, 98, -1, 22,  441, -1,
                                     73, -1, 72,  101, 115, -1,  64,  66, 67, 68, 206, 211, 203};

inline constexpr const Numbers& numbers(Arch a) { return a == Arch::kX86_64 ? kX86_64 : kAarch64; }

constexpr long kFutexWait = 0, kFutexWaitBitset = 9;
constexpr long kTimerAbstime = 1;

// glibc's lock word while a thread waits for the lock ("locked, with
// waiters"): the value of a futex wait inside lll_lock. A thread waiting for
// one glibc lock may hold another (fork locks every malloc arena in turn,
// waiting for each), so such a wait is never taken for safe.
constexpr uint64_t kGlibcLockWaitValue = 2;

// A blocking call that the kernel restarts after a handler (SA_RESTART), and
// that glibc never makes while it holds a lock pthread_create takes: the
// thread may take the handler and start a thread from it. `args`: the
// call's six arguments. A futex wait only without a timeout (with one it
// ends in -ERESTART_RESTARTBLOCK: EINTR) and not on a glibc lock word
// (kGlibcLockWaitValue): condition variables, joins, semaphores.
inline bool restartable_wait(Arch a, long nr, const uint64_t* args) {
  const Numbers& n = numbers(a);
  if (nr < 0) return false;
  if (nr == n.futex) {
    const long cmd = static_cast<long>(args[1] & 0x7f);
    return (cmd == kFutexWait || cmd == kFutexWaitBitset) && args[3] == 0 && args[2] != kGlibcLockWaitValue;
  }
  return nr == n.read || nr == n.readv || nr == n.recvfrom || nr == n.recvmsg || nr == n.accept ||
         nr == n.accept4 || nr == n.wait4 || nr == n.waitid;
}

// A wait the kernel does not restart after a handler (EINTR), that the
// repair re-issues: it blocks, has no side effect before it returns, and
// glibc holds none of pthread_create's locks around it.
inline bool repairable_wait(Arch a, long nr) {
  const Numbers& n = numbers(a);
  if (nr < 0) return false;
  return nr == n.epoll_wait || nr == n.epoll_pwait || nr == n.epoll_pwait2 || nr == n.poll || nr == n.ppoll ||
         nr == n.select || nr == n.pselect6 || nr == n.nanosleep || nr == n.clock_nanosleep ||
         nr == n.pause || nr == n.futex;
}

// A call the thread has just returned from (pc right after the
// instruction, the result in the return register): it blocks or moves
// data, and glibc makes none of them while it holds a lock pthread_create
// takes (malloc's arenas and the stack cache are held around mmap,
// munmap, mprotect, madvise and brk only). A thread busy in I/O is found
// there more often than anywhere else. Not a futex call: its arguments are
// gone with the result, and fork's malloc unlocking wakes waiters while it
// still holds arenas.
inline bool safe_after_return(Arch a, long nr) {
  const Numbers& n = numbers(a);
  if (nr < 0 || nr == n.futex) return false;
  const uint64_t no_args[6] = {};
  return restartable_wait(a, nr, no_args) || repairable_wait(a, nr) || nr == n.write || nr == n.writev ||
         nr == n.pread64 || nr == n.pwrite64 || nr == n.sendto || nr == n.sendmsg || nr == n.connect;
}

// x86_64: is `at` (2 bytes) a `syscall` instruction?
inline bool is_syscall_insn_x86(const uint8_t* at) { return at[0] == 0x0f && at[1] == 0x05; }
// aarch64: is the word `svc #0`?
inline bool is_svc_a64(uint32_t insn) { return insn == 0xd4000001u; }

// x86_64: is before[at, at + gap) one move of an argument register (an
// optional REX prefix, then 89 or 8b and at least a ModRM byte)?
inline bool is_register_move_x86(const uint8_t* m, int gap) {
  if (gap == 0) return true;
  int i = 0;
  if ((m[0] & 0xf0) == 0x40) ++i;  // REX
  return i < gap && (m[i] == 0x89 || m[i] == 0x8b) && gap - i >= 2;
}

// x86_64: the number a glibc wrapper loaded into eax before the `syscall`
// that ends at `before + len` (before[len-2], before[len-1] == 0f 05): a
// `mov $imm32, %eax` (b8 imm32), or `xor %eax, %eax` (31 c0: read), right
// before it or before one move of an argument register (2 to 5 bytes).
// Returns -1 when the bytes show no such load (then nothing is repaired).
inline long decode_nr_x86(const uint8_t* before, int len) {
  if (len < 7 || !is_syscall_insn_x86(before + len - 2)) return -1;
  const int end = len - 2;  // index of the syscall instruction
  for (int gap = 0; gap <= 5; ++gap) {
    const int xor_at = end - gap - 2;
    if (xor_at >= 0 && before[xor_at] == 0x31 && before[xor_at + 1] == 0xc0 &&
        is_register_move_x86(before + xor_at + 2, gap))
      return 0;
    const int mov = end - gap - 5;
    if (mov < 0) break;
    if (before[mov] != 0xb8 || !is_register_move_x86(before + mov + 5, gap)) continue;
    const uint32_t imm =
        static_cast<uint32_t>(before[mov + 1]) | static_cast<uint32_t>(before[mov + 2]) << 8 |
        static_cast<uint32_t>(before[mov + 3]) << 16 | static_cast<uint32_t>(before[mov + 4]) << 24;
    if (imm > 1024) continue;
    return static_cast<long>(imm);
  }
  return -1;
}

// The registers of the interrupted context that the rules read.
struct Context {
  Arch arch;
  uint64_t pc;
  int64_t ret;       // x86_64 rax; aarch64 x0
  uint64_t nr_reg;   // x86_64 rax (the same register); aarch64 x8
  uint64_t args[6];  // the system call's arguments as the registers hold them
  // Code around pc, when the handler could read it (pc within a mapping it
  // recorded): the 16 bytes before pc and the 4 at pc; has_code false: none.
  bool has_code;
  uint8_t before[16];
  uint8_t at[4];
  // pc lies in code whose interruption holds no lock pthread_create takes:
  // the program's own objects, not libc, the dynamic loader, an allocator
  // that replaces malloc, or the agent (see channel.cc, eligible ranges).
  bool pc_in_program;
  // The interrupted code's signal mask blocks a signal that has a handler:
  // it may be running a handler of the program's own, over code that holds
  // any lock at all.
  bool in_program_handler;
};

// What the handler does with the context it interrupted, and, for a
// repair, the number to re-issue (*repair_nr).
inline Verdict judge(const Context& c, long* repair_nr) {
  *repair_nr = -1;
  if (c.in_program_handler) return Verdict::kForward;
  constexpr int64_t kEintr = -4;
  if (c.arch == Arch::kX86_64) {
    if (!c.has_code) return c.pc_in_program ? Verdict::kStartHere : Verdict::kForward;
    // Restarted by the kernel (SA_RESTART): pc rewound onto the syscall
    // instruction, rax holding the number again. Also a thread preempted
    // right before it: the same state, as safe.
    if (is_syscall_insn_x86(c.at)) {
      const long nr = static_cast<long>(c.nr_reg);
      if (restartable_wait(c.arch, nr, c.args)) return Verdict::kStartHere;
      return Verdict::kForward;
    }
    if (is_syscall_insn_x86(c.before + 14)) {
      const long nr = decode_nr_x86(c.before, 16);
      if (c.ret == kEintr) {
        if (!repairable_wait(c.arch, nr)) return Verdict::kForward;
        *repair_nr = nr;
        return Verdict::kRepairAndStart;
      }
      // Just back from a call that completed (the signal came on its way
      // out): as safe as in it, for the calls that hold nothing.
      if (safe_after_return(c.arch, nr)) return Verdict::kStartHere;
      return Verdict::kForward;
    }
    return c.pc_in_program ? Verdict::kStartHere : Verdict::kForward;
  }
  // aarch64: x0 is both the first argument and the result, and the kernel
  // keeps the original x0 outside the signal frame: an EINTR cannot be
  // re-issued. Restarted calls and program code only.
  if (!c.has_code) return c.pc_in_program ? Verdict::kStartHere : Verdict::kForward;
  const uint32_t at = static_cast<uint32_t>(c.at[0]) | static_cast<uint32_t>(c.at[1]) << 8 |
                      static_cast<uint32_t>(c.at[2]) << 16 | static_cast<uint32_t>(c.at[3]) << 24;
  if (is_svc_a64(at)) {
    const long nr = static_cast<long>(c.nr_reg);
    if (restartable_wait(c.arch, nr, c.args)) return Verdict::kStartHere;
    return Verdict::kForward;
  }
  const uint32_t prev = static_cast<uint32_t>(c.before[12]) | static_cast<uint32_t>(c.before[13]) << 8 |
                        static_cast<uint32_t>(c.before[14]) << 16 | static_cast<uint32_t>(c.before[15]) << 24;
  if (is_svc_a64(prev)) {
    // Just out of a call: x8 still names it. One that completed is judged
    // as on x86_64; an EINTR is left (x0 is gone: nothing to re-issue).
    if (c.ret == kEintr) return Verdict::kForward;
    return safe_after_return(c.arch, static_cast<long>(c.nr_reg)) ? Verdict::kStartHere : Verdict::kForward;
  }
  return c.pc_in_program ? Verdict::kStartHere : Verdict::kForward;
}

// The registers a repair changes (x86_64): pc back onto the syscall
// instruction, rax the number again, and a relative sleep's remaining time
// (which the kernel wrote into its `rem` argument) made the new request, so
// that nanosleep and clock_nanosleep sleep what was left, not the whole
// time again. select and pselect6 leave the time left in their own argument
// (Linux); poll, epoll_wait and a futex wait start their timeout again.
struct Repair {
  uint64_t pc;
  uint64_t rax;
  int arg_changed;     // index of an argument register to change, -1 none
  uint64_t arg_value;  // its new value
};

inline Repair repair_x86(const Context& c, long nr) {
  Repair r{c.pc - 2, static_cast<uint64_t>(nr), -1, 0};
  const Numbers& n = kX86_64;
  if (nr == n.nanosleep && c.args[1] != 0) {
    r.arg_changed = 0;  // req = rem
    r.arg_value = c.args[1];
  } else if (nr == n.clock_nanosleep && (c.args[1] & kTimerAbstime) == 0 && c.args[3] != 0) {
    r.arg_changed = 2;  // req = rem
    r.arg_value = c.args[3];
  }
  return r;
}

// One line of /proc/self/task/TID/syscall: "NR a1 .. a6 sp pc" (blocked in a
// call), "-1 sp pc" (blocked outside one), "running". Parsed without libc.
struct SyscallLine {
  bool running = false;
  long nr = -1;
  uint64_t args[6] = {};
  bool ok = false;
};

inline SyscallLine parse_syscall_line(const char* s, int len) {
  SyscallLine out;
  if (len >= 7 && s[0] == 'r' && s[1] == 'u' && s[2] == 'n') {
    out.running = true;
    out.ok = true;
    return out;
  }
  uint64_t fields[9] = {};
  int count = 0, i = 0;
  bool negative = false;
  while (i < len && count < 9) {
    while (i < len && s[i] == ' ') ++i;
    if (i >= len || s[i] == '\n') break;
    negative = false;
    if (s[i] == '-') {
      negative = true;
      ++i;
    }
    uint64_t v = 0;
    bool hex = i + 1 < len && s[i] == '0' && s[i + 1] == 'x';
    if (hex) i += 2;
    int digits = 0;
    for (; i < len; ++i, ++digits) {
      const char ch = s[i];
      int d;
      if (ch >= '0' && ch <= '9')
        d = ch - '0';
      else if (hex && ch >= 'a' && ch <= 'f')
        d = ch - 'a' + 10;
      else
        break;
      v = v * (hex ? 16 : 10) + static_cast<uint64_t>(d);
    }
    if (digits == 0) return out;
    fields[count++] = negative ? static_cast<uint64_t>(-static_cast<int64_t>(v)) : v;
  }
  if (count == 0) return out;
  out.nr = static_cast<long>(static_cast<int64_t>(fields[0]));
  if (out.nr >= 0 && count == 9) {
    for (int k = 0; k < 6; ++k) out.args[k] = fields[1 + k];
    out.ok = true;
  } else if (out.nr < 0 && count == 3) {
    out.ok = true;
  }
  return out;
}

// ---- the host's ucontext ----------------------------------------------

#if defined(__x86_64__)
inline constexpr Arch kHostArch = Arch::kX86_64;
#elif defined(__aarch64__)
inline constexpr Arch kHostArch = Arch::kAarch64;
#endif

// The interrupted context's registers that judge() reads (the code bytes
// and the two flags are the caller's: it knows which memory it may read).
inline void read_registers(const ucontext_t* uc, Context* c) {
  c->arch = kHostArch;
#if defined(__x86_64__)
  const greg_t* g = uc->uc_mcontext.gregs;
  c->pc = static_cast<uint64_t>(g[REG_RIP]);
  c->ret = static_cast<int64_t>(g[REG_RAX]);
  c->nr_reg = static_cast<uint64_t>(g[REG_RAX]);
  const int args[6] = {REG_RDI, REG_RSI, REG_RDX, REG_R10, REG_R8, REG_R9};
  for (int i = 0; i < 6; ++i) c->args[i] = static_cast<uint64_t>(g[args[i]]);
#elif defined(__aarch64__)
  c->pc = uc->uc_mcontext.pc;
  c->ret = static_cast<int64_t>(uc->uc_mcontext.regs[0]);
  c->nr_reg = uc->uc_mcontext.regs[8];
  for (int i = 0; i < 6; ++i) c->args[i] = uc->uc_mcontext.regs[i];
#endif
}

// Re-issues the wait judge() found cut short (kRepairAndStart, x86_64 only:
// see judge), by changing the context the handler returns to.
inline void apply_repair(ucontext_t* uc, const Context& c, long nr) {
#if defined(__x86_64__)
  const Repair r = repair_x86(c, nr);
  greg_t* g = uc->uc_mcontext.gregs;
  g[REG_RIP] = static_cast<greg_t>(r.pc);
  g[REG_RAX] = static_cast<greg_t>(r.rax);
  const int args[6] = {REG_RDI, REG_RSI, REG_RDX, REG_R10, REG_R8, REG_R9};
  if (r.arg_changed >= 0) g[args[r.arg_changed]] = static_cast<greg_t>(r.arg_value);
#else
  (void)uc, (void)c, (void)nr;
#endif
}

}  // namespace remora::arch::wake

#endif  // REMORA_ARCH_WAKE_RULES_H_
