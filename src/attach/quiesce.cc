// The unload's proof: every thread stopped, then looked at (quiesce.h; the
// argument in docs/architecture.md, "The unload").
#include "attach/quiesce.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "arch/arch.h"
#include "arch/host.h"
#include "arch/syscall_restart.h"
#include "base/log.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/memory.h"

namespace remora::attach::detail {

namespace {

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace a = arch::host;

// Whether a signal that runs a handler is pending for `tid` (or is the one
// it stopped to take, `delivering`): its EINTR is then the handler's, and
// kept. A signal without a handler does not count: while we trace a thread
// the kernel queues even the ones it would discard (SIGCHLD of a forking
// program), and they interrupt nothing once it runs again.
bool handled_signal_for(pid_t pid, pid_t tid, int delivering) {
  auto st = procfs::read_status(pid, tid);
  if (!st) return true;  // be conservative: keep the EINTR
  uint64_t due = (st->sig_pnd | st->shd_pnd) & ~st->sig_blk;
  if (delivering > 0) due |= uint64_t{1} << (delivering - 1);
  return (due & st->sig_cgt) != 0;
}

// The words from a stopped thread's stack pointer up, kForkScanBytes at
// most, fewer where its stack ends (the next page unmapped).
std::vector<uint64_t> stack_words(const remote::Memory& mem, uint64_t sp) {
  constexpr uint64_t kPage = 4096;
  std::vector<uint64_t> words;
  uint64_t at = sp & ~uint64_t{7};
  const uint64_t end = at + kForkScanBytes;
  while (at < end) {
    const uint64_t chunk_end = std::min(end, (at / kPage + 1) * kPage);
    std::vector<uint64_t> part((chunk_end - at) / 8);
    if (part.empty() || !mem.read(at, std::as_writable_bytes(std::span(part)))) break;
    words.insert(words.end(), part.begin(), part.end());
    at = chunk_end;
  }
  return words;
}

}  // namespace

Freeze::~Freeze() {
  for (auto& [tid, h] : held_) {
    if (h.reissue) (void)ptrace::set_regs(tid, h.resume);
    if (ptrace::detach(tid, h.sig)) continue;
    // Not in a stop (seized, but a failure cut the freeze short before its
    // stop was seen): only a stopped tracee can be let go, and one left
    // traced would stop later for good. Its stop is waited for, a while.
    auto gone = [&] {
      return ::access(("/proc/" + std::to_string(pid_) + "/task/" + std::to_string(tid)).c_str(), F_OK) != 0;
    };
    const Deadline until = Deadline::after(std::chrono::seconds(10));
    bool let_go = false;
    while (!let_go && !gone() && !until.expired()) {
      (void)ptrace::interrupt(tid);
      auto st = ptrace::wait_stop(tid, Deadline::after(std::chrono::milliseconds(200)));
      if (st && st->kind == ptrace::Stop::Kind::kSignalDelivery) h.sig = st->sig;
      let_go = ptrace::detach(tid, h.sig).ok();
    }
    if (!let_go && !gone())
      REMORA_LOG(kAttach, "freeze of %d: thread %d not let go", static_cast<int>(pid_),
                 static_cast<int>(tid));
  }
}

// Seizes and interrupts every thread not held yet, but `spared`, until a
// listing finds no new one (a thread created meanwhile is stopped in the
// next round). "" on success, else why not.
Result<std::string> Freeze::seize_all(pid_t spared) {
  for (int round = 0; round < 64; ++round) {
    auto tasks = REMORA_TRY(procfs::list_tasks(pid_));
    bool fresh = false;
    for (pid_t tid : tasks) {
      if (tid == spared || held_.count(tid) != 0) continue;
      fresh = true;
      auto s = ptrace::seize(pid_, tid, 0);
      if (!s) {
        if (s.error().code() == Errc::kNoSuchProcess) continue;  // it exited meanwhile
        // Traced by this very thread already: a freeze of ours that could
        // not let it go. Taken over, and let go with the others.
        auto st = procfs::read_status(pid_, tid);
        if (!st || st->tracer_pid != static_cast<pid_t>(::gettid()))
          return "thread " + std::to_string(tid) + " cannot be stopped: " + s.error().to_string();
        REMORA_LOG(kAttach, "freeze of %d: thread %d was still ours", static_cast<int>(pid_),
                   static_cast<int>(tid));
      }
      Held& h = held_[tid] = Held{};
      if (a::kStopForgetsSyscall) {
        if (auto st = procfs::read_syscall(pid_, tid); st && !st->running && st->nr >= 0) h.entry = *st;
      }
      if (auto i = ptrace::interrupt(tid); !i) return std::move(i).error();
    }
    if (!fresh) return std::string();
  }
  return std::string("the process kept creating threads while they were being stopped");
}

// Waits for each held thread's stop, every one of them: a thread is let go
// only from a stop (PTRACE_DETACH of a running tracee fails, and it would
// stop later for good). "" once all are stopped (the ones that exited are
// let go), or why not; a thread that would not stop in time is waited for
// a while longer before it is given up.
std::string Freeze::wait_all_stopped(const Deadline& deadline) {
  std::vector<pid_t> tids;
  for (const auto& [tid, h] : held_) tids.push_back(tid);
  std::string why;
  for (pid_t tid : tids) {
    const Deadline until = why.empty() ? deadline : Deadline::after(std::chrono::milliseconds(100));
    auto st = ptrace::wait_stop(tid, until);
    if (!st && st.error().code() == Errc::kTimedOut && why.empty()) {
      why = "thread " + std::to_string(tid) + " did not stop: " + st.error().to_string();
      st = ptrace::wait_stop(tid, Deadline::after(std::chrono::seconds(1)));
    }
    if (!st) {
      REMORA_LOG(kAttach, "freeze of %d: thread %d: %s", static_cast<int>(pid_), static_cast<int>(tid),
                 st.error().to_string().c_str());
      if (st.error().code() == Errc::kTargetExited) held_.erase(tid);
      continue;
    }
    if (st->kind == ptrace::Stop::Kind::kExited || st->kind == ptrace::Stop::Kind::kKilled) {
      held_.erase(tid);
      continue;
    }
    if (st->kind == ptrace::Stop::Kind::kSignalDelivery) held_[tid].sig = st->sig;  // delivered when let go
    held_[tid].stopped = true;
  }
  return why;
}

// For each stopped thread: a call that our stop alone made fail with EINTR
// is re-issued at its release.
void Freeze::plan_repairs() {
  for (auto& [tid, h] : held_) {
    if (!h.stopped) continue;
    auto r = ptrace::get_regs(tid);
    if (!r) continue;
    if (h.entry) *r = a::with_entry_args(*r, h.entry->nr, h.entry->args, h.entry->pc);
    const int64_t nr = a::syscall_nr(*r);
    if (nr < 0 || a::return_value(*r) != -EINTR || !a::never_restarted(nr)) continue;
    const auto kind = a::classify_restart(*r, handled_signal_for(pid_, tid, h.sig));
    if (kind != arch::RestartKind::kReissueOnEintr) continue;
    h.reissue = true;
    h.resume = a::resume_registers(*r, kind, /*use_restart_syscall=*/true);
  }
}

Result<UnloadPlan> unload_plan(const remora_agent_info& info) {
  if ((info.features & REMORA_AGENT_FEATURE_PROVEN_UNLOAD) == 0)
    return Error(
        Errc::kNotSupported,
        "the agent (protocol " + std::to_string(info.version) +
            ") was loaded by an older Remora, whose unload cannot be proven safe: it stays loaded, with "
            "its tools detached. Only a restart of the process removes it");
  if (info.unload_code_count == 0 || info.unload_code_count > REMORA_AGENT_UNLOAD_RANGES ||
      info.unload_counter_count > REMORA_AGENT_UNLOAD_RANGES) {
    std::string said(info.message, strnlen(info.message, sizeof info.message));
    return Error(Errc::kNotSupported,
                 "the agent could not say what its unload would unmap, so it stays loaded" +
                     (said.empty() ? std::string() : " (" + said + ")"));
  }
  UnloadPlan plan;
  plan.fork = {info.unload_fork[0], info.unload_fork[1]};
  plan.atfork = {info.unload_atfork[0], info.unload_atfork[1]};
  if (plan.fork.end <= plan.fork.start || plan.atfork.end <= plan.atfork.start)
    return Error(Errc::kParse, "the agent's unload plan has no fork() or __register_atfork range");
  for (uint32_t i = 0; i < info.unload_code_count; ++i) {
    const uint64_t start = info.unload_code[i][0], end = info.unload_code[i][1];
    if (end <= start) return Error(Errc::kParse, "the agent's unload plan has an empty code range");
    plan.code.push_back({start, end});
  }
  for (uint32_t i = 0; i < info.unload_counter_count; ++i) {
    const uint64_t* c = info.unload_counters[i];
    // A long per stripe, at most 4096 stripes 4 KiB apart: anything else is
    // not a tool's table of counts.
    if (c[1] == 0 || c[1] > 4096 || c[2] < sizeof(long) || c[2] > 4096)
      return Error(Errc::kParse, "a tool's counts of threads inside its code have an impossible layout");
    plan.counters.push_back({c[0], c[1], c[2]});
  }
  return plan;
}

bool holds_return_into(std::span<const uint64_t> words, const UnloadPlan::Range& fork, uint64_t tag_mask) {
  // A return address follows its call: it is never the function's entry.
  return std::any_of(words.begin(), words.end(), [&](uint64_t w) {
    w &= ~tag_mask;
    return w > fork.start && w <= fork.end;
  });
}

QuiescenceCheck judge(const UnloadPlan& plan, std::span<const ThreadLook> threads,
                      std::span<const long> inside) {
  QuiescenceCheck out;
  out.threads = threads.size();
  for (const auto& t : threads) {
    for (const auto& r : plan.code) {
      if (t.pc >= r.start && t.pc < r.end) {
        out.why = "thread " + std::to_string(t.tid) + " is running the code the unload would unmap (pc " +
                  hex(t.pc) + ")";
        return out;
      }
    }
  }
  long sum = 0;
  for (long v : inside) sum += v;
  if (sum != 0) {
    out.why = std::to_string(sum) +
              " thread(s) are inside a tool's code (a traced call that has not returned, or a sampling "
              "handler in progress)";
    return out;
  }
  out.proven = true;
  return out;
}

QuiescenceCheck judge_forks(std::span<const ThreadLook> threads) {
  QuiescenceCheck out;
  out.threads = threads.size();
  for (const auto& t : threads) {
    if (t.in_fork) {
      out.why = "thread " + std::to_string(t.tid) +
                " is inside fork() (where it may call a fork handler of ours) or pthread_atfork()";
      return out;
    }
  }
  out.proven = true;
  return out;
}

// Reads each held thread's program counter and stack top.
Result<void> Freeze::look(const UnloadPlan& plan) {
  auto mem = REMORA_TRY(remote::Memory::open(pid_));
  for (auto& [tid, h] : held_) {
    auto r = ptrace::get_regs(tid);
    if (!r) return std::move(r).error().with_context("read the registers of thread " + std::to_string(tid));
    const uint64_t pc = arch::pc(*r);
    // The link register first: a leaf (glibc's _Fork, the clone call of
    // fork()) keeps its return address there only.
    std::vector<uint64_t> words{arch::link_register(*r)};
    const auto stack = stack_words(mem, arch::sp(*r));
    words.insert(words.end(), stack.begin(), stack.end());
    const uint64_t tag_mask = ptrace::code_address_tag_mask(tid);
    bool in_fork = false;
    for (const auto* range : {&plan.fork, &plan.atfork})
      in_fork =
          in_fork || (pc >= range->start && pc < range->end) || holds_return_into(words, *range, tag_mask);
    looks_.push_back({tid, pc, in_fork});
  }
  return ok();
}

Result<std::unique_ptr<Freeze>> Freeze::stop(pid_t pid, pid_t spared, const UnloadPlan& plan,
                                             const Deadline& deadline) {
  std::unique_ptr<Freeze> f(new Freeze(pid));
  f->why_ = REMORA_TRY(f->seize_all(spared));
  // Every thread seized is waited for, whatever stopped the seizing.
  const std::string waited = f->wait_all_stopped(deadline);
  if (f->why_.empty()) f->why_ = waited;
  f->plan_repairs();
  if (f->why_.empty()) REMORA_TRY(f->look(plan));
  return f;
}

Result<std::vector<long>> Freeze::counts(const UnloadPlan& plan) const {
  auto mem = REMORA_TRY(remote::Memory::open(pid_));
  std::vector<long> out;
  for (const auto& c : plan.counters) {
    std::vector<std::byte> bytes(c.stripes * c.stride);
    REMORA_TRY_CTX(mem.read(c.address, bytes), "read the counts of threads inside our code");
    for (uint64_t i = 0; i < c.stripes; ++i) {
      long v = 0;
      std::memcpy(&v, bytes.data() + i * c.stride, sizeof v);
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace remora::attach::detail
