// Why the handler only captures, and why that is safe.
//
// A sample used to be unwound inside the signal handler, over the live stack
// of the interrupted thread. On code without unwind information (a JVM's or
// V8's JIT code) the unwinder followed garbage pointers and the target died
// of SIGSEGV. Now the work is split the way perf's dwarf mode splits it:
//
// 1. The handler (on the sampled thread) captures: the interrupted registers
//    an unwinder needs (the pc, the CFA bases sp and the frame pointer, the
//    callee-saved registers and, on aarch64, the link register; see
//    arch/sample_regs.h), taken from the ucontext the kernel wrote, and a
//    copy of at most kStackCopyBytes of stack from the interrupted sp
//    upwards, into the thread's sample ring. It dereferences nothing but the siginfo, the
//    ucontext and its own slot: the copy is made by a system call
//    (own_memory.h) that returns an error where memory is not mapped, so a
//    stale bound, a stack freed under us or an sp pointing anywhere cannot
//    fault. The copy stops at the end of the thread's stack as the collector
//    found it in /proc/self/maps (Slot::stack_lo/hi); where sp is outside
//    those bounds (a sigaltstack, a fiber, a JVM's own stacks) or they are
//    not known yet, it copies nothing and the sample keeps the registers,
//    so the collector can learn the stack that sp is on. No lock, no
//    allocation, no libunwind.
// 2. The collector thread (tool.cc drain, every signal blocked) unwinds each
//    record with libunwind's remote API over the copy (unwind.h): memory
//    inside the copy comes from the copy, anything else only from readable
//    file-backed mappings (and the vDSO), read with the same non-faulting
//    call; a frame without CFI gets a frame-pointer step inside the copy.
//
// Where the stack bounds come from (tool.cc learn_stack), all checked
// against one /proc/self/maps snapshot per thread scan: the main thread's
// [stack]; for another thread, the mapping holding its sp, read from
// /proc/self/task/TID/syscall while it is blocked in the kernel, else from
// the sp of its first sample (pthread_getattr_np cannot describe a thread
// other than the caller, nor one glibc did not create). Only a private,
// writable, anonymous mapping counts as a stack. Bounds are kept across
// sessions by tid while the thread lives. A wrong bound costs a stack copy,
// never safety: the copy cannot fault whatever the bounds say.
//
// This is also the first step to unwinding outside the process: a record is
// exactly what a controller would need (registers, stack bytes, the maps),
// for elfutils' unwinder over captured memory as perf's dwarf mode does.
#include "sampler.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "own_memory.h"
#include "slots.h"
#include "wrappers.h"

namespace remora_tool {

namespace {

// The kernel's encoding of a thread's CPU-time clock (MAKE_THREAD_CPUCLOCK
// in include/linux/posix-timers.h): ~tid << 3 | CPUCLOCK_PERTHREAD (4) |
// CPUCLOCK_SCHED (2). pthread_getcpuclockid() needs a pthread_t, which a
// thread found in /proc/self/task does not give us; the kernel accepts this
// clock for any thread of the calling process.
clockid_t thread_cpu_clock(int32_t tid) {
  return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6);
}

void capture(SampleRec& r, const Slot& s, const ucontext_t* uc) {
  remora::arch::sample_regs_from_ucontext(uc, r.regs);
  uint64_t sp = r.regs[kRegSp];
  uint64_t hi = s.stack_hi.load(std::memory_order_acquire);
  uint64_t lo = s.stack_lo.load(std::memory_order_acquire);
  uint32_t len = 0;
  if (hi != 0 && sp >= lo && sp < hi) {
    uint64_t want = hi - sp < kStackCopyBytes ? hi - sp : kStackCopyBytes;
    len = static_cast<uint32_t>(own_memory_read(r.stack, sp, want));
  }
  r.stack_len = len;
}

void handler(int, siginfo_t* si, void* ucv) {
  // Counted in: a handler still running after the detach keeps the tool
  // mapped (tool.cc, tool_fini).
  remora_inside_stripe* in = remora_inside_mine();
  remora_inside_enter(in);
  int saved_errno = errno;
  // Only our timers: a signal sent by kill() or sigqueue() is not a sample.
  if (si->si_code == SI_TIMER) {
    uint64_t v = reinterpret_cast<uint64_t>(si->si_value.sival_ptr);
    Slot* s = slot_enter_index(static_cast<uint32_t>(v & 0xffffffffu), static_cast<uint32_t>(v >> 32));
    if (s != nullptr) {
      SlotMem* m = s->mem;
      uint64_t head = m->sample_head.load(std::memory_order_relaxed);
      if (head - m->sample_tail.load(std::memory_order_acquire) >= kSampleRingSize) {
        m->samples_dropped.fetch_add(1, std::memory_order_relaxed);
      } else {
        SampleRec& r = m->samples[head % kSampleRingSize];
        r.ts_ns = now_ns();
        int overrun = si->si_overrun;
        r.weight = 1 + static_cast<uint32_t>(overrun > 0 ? (overrun > 1000 ? 1000 : overrun) : 0);
        // The interrupted context, not this handler's: the handler's own
        // frames and the signal trampoline never appear in a stack.
        capture(r, *s, static_cast<const ucontext_t*>(ucv));
        // The sample ring has a single producer (this handler; the signal is
        // blocked while it runs), so a plain store of the head suffices.
        r.seq.store(head + 1, std::memory_order_release);
        m->sample_head.store(head + 1, std::memory_order_release);
      }
      slot_leave(s);
    }
  }
  errno = saved_errno;
  remora_inside_leave(in);
}

bool thread_blocks(int32_t tid, int sig) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/status", tid);
  FILE* f = fopen(path, "re");
  if (f == nullptr) return true;  // gone
  char line[256];
  bool blocked = false;
  while (fgets(line, sizeof line, f)) {
    unsigned long long mask;
    int seccomp;
    if (sscanf(line, "SigBlk: %llx", &mask) == 1) blocked = blocked || ((mask >> (sig - 1)) & 1);
    // Seccomp strict mode allows read, write, exit and sigreturn only: the
    // handler's stack copy (pread) would kill the thread. Never sampled.
    if (sscanf(line, "Seccomp: %d", &seccomp) == 1) blocked = blocked || seccomp == 1;
  }
  fclose(f);
  return blocked;
}

}  // namespace

int count_process_timers() {
  FILE* f = fopen("/proc/self/timers", "re");
  if (f == nullptr) return -1;
  char line[256];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "ID: ", 4) == 0) ++n;
  fclose(f);
  return n;
}

bool Sampler::start(int hz, int forced, std::string* error) {
  period_ns_ = 1000000000LL / (hz > 0 ? hz : 1);
  // A signal the application does not use: its handler is SIG_DFL (the
  // default action of a real-time signal is to terminate, so a program that
  // expects one installs a handler). Low numbers are the ones applications
  // pick (SIGRTMIN, SIGRTMIN+1, ...): search from SIGRTMIN+8 upwards first.
  int lo = SIGRTMIN, hi = SIGRTMAX;
  int chosen = 0;
  struct sigaction cur;
  if (forced > 0) {
    if (forced < lo || forced > hi) {
      *error = "REMORA_SAMPLE_SIGNAL=" + std::to_string(forced) + " is not a real-time signal (" +
               std::to_string(lo) + ".." + std::to_string(hi) + ")";
      return false;
    }
    if (sigaction(forced, nullptr, &cur) != 0 || cur.sa_handler != SIG_DFL || (cur.sa_flags & SA_SIGINFO)) {
      *error = "REMORA_SAMPLE_SIGNAL=" + std::to_string(forced) + " is in use by the process";
      return false;
    }
    chosen = forced;
  }
  for (int k = 0; chosen == 0 && k <= hi - lo; ++k) {
    int sig = lo + (8 + k) % (hi - lo + 1);
    if (sigaction(sig, nullptr, &cur) == 0 && cur.sa_handler == SIG_DFL && !(cur.sa_flags & SA_SIGINFO))
      chosen = sig;
  }
  if (chosen == 0) {
    *error =
        "every real-time signal has a handler in this process: no signal left for sampling "
        "(set REMORA_SAMPLING=0)";
    return false;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  // SA_RESTART: an interrupted read() or the like restarts instead of
  // failing with EINTR. SA_ONSTACK: a thread running on a small stack with
  // an alternate signal stack does not overflow. Every signal is blocked
  // while the handler runs, so an application handler can never nest into
  // ours (and longjmp out of it, leaving the slot busy).
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigfillset(&sa.sa_mask);
  if (syscall(SYS_rt_sigaction, chosen, nullptr, &old_, sizeof old_.mask) != 0 ||
      sigaction(chosen, &sa, nullptr) != 0) {
    *error = std::string("sigaction: ") + strerror(errno);
    return false;
  }
  signal_ = chosen;
  last_signal_ = chosen;
  return true;
}

void Sampler::add_thread(int32_t tid, uint32_t slot, uint32_t gen) {
  if (signal_ == 0 || timers_.count(tid) != 0) return;
  if (thread_blocks(tid, signal_)) return;
  struct sigevent sev;
  memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_SIGNAL | SIGEV_THREAD_ID;
  sev.sigev_signo = signal_;
  sev.sigev_value.sival_ptr = reinterpret_cast<void*>((static_cast<uint64_t>(gen) << 32) | slot);
  sev._sigev_un._tid = tid;  // sigev_notify_thread_id, which glibc does not name
  // Raw system calls: glibc's timer_create wraps the kernel's id in its own
  // timer_t (and treats SIGEV_THREAD specially); the kernel id is all we need.
  int timer_id = -1;
  if (syscall(SYS_timer_create, thread_cpu_clock(tid), &sev, &timer_id) != 0) return;  // thread gone
  struct itimerspec its;
  its.it_interval.tv_sec = period_ns_ / 1000000000LL;
  its.it_interval.tv_nsec = period_ns_ % 1000000000LL;
  // Stagger the first expiry so that threads started together do not all
  // take their samples in lock step.
  int64_t first = period_ns_ / 2 + (static_cast<int64_t>(tid) * 7919) % (period_ns_ / 2 + 1);
  its.it_value.tv_sec = first / 1000000000LL;
  its.it_value.tv_nsec = first % 1000000000LL;
  if (syscall(SYS_timer_settime, timer_id, 0, &its, nullptr) != 0) {
    syscall(SYS_timer_delete, timer_id);
    return;
  }
  timers_[tid] = timer_id;
}

void Sampler::remove_thread(int32_t tid) {
  auto it = timers_.find(tid);
  if (it == timers_.end()) return;
  syscall(SYS_timer_delete, it->second);
  timers_.erase(it);
}

void Sampler::stop() {
  for (auto& [tid, id] : timers_) syscall(SYS_timer_delete, id);
  timers_.clear();
  if (signal_ == 0) return;
  // A timer that expired just before its deletion may have left our signal
  // pending on its thread; with the default disposition back in place it
  // would kill the process. Setting SIG_IGN discards a pending signal in
  // every thread (POSIX; the kernel's do_sigaction flushes the queues), and
  // no new one can be generated now that the timers are gone.
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(signal_, &ign, nullptr);
  syscall(SYS_rt_sigaction, signal_, &old_, nullptr, sizeof old_.mask);
  signal_ = 0;
}

}  // namespace remora_tool
