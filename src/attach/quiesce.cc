// The unload's proof: every thread stopped, then looked at (quiesce.h; the
// argument in docs/architecture.md, "The unload").
#include "attach/quiesce.h"

#include <errno.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "arch/arch.h"
#include "arch/host.h"
#include "arch/syscall_restart.h"
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

bool signal_pending_for(pid_t pid, pid_t tid) {
  auto st = procfs::read_status(pid, tid);
  if (!st) return true;  // be conservative: keep the EINTR
  return ((st->sig_pnd | st->shd_pnd) & ~st->sig_blk) != 0;
}

// The threads this check stopped, each let go again when the check is over,
// whatever happened, as if nothing had: with the signal it was about to
// take, and a call that our stop alone made fail with EINTR (epoll_wait and
// the others the kernel never restarts after a stop) re-issued
// (arch/syscall_restart.h, kReissueOnEintr), as a remote call's
// transaction does.
class StoppedThreads {
 public:
  explicit StoppedThreads(pid_t pid) : pid_(pid) {}
  StoppedThreads(const StoppedThreads&) = delete;
  StoppedThreads& operator=(const StoppedThreads&) = delete;
  ~StoppedThreads() {
    for (const auto& [tid, h] : held_) {
      if (h.reissue) (void)ptrace::set_regs(tid, h.resume);
      (void)ptrace::detach(tid, h.sig);
    }
  }
  bool holds(pid_t tid) const { return held_.count(tid) != 0; }
  void add(pid_t tid) { held_[tid] = Held{}; }
  void set_signal(pid_t tid, int sig) { held_[tid].sig = sig; }
  void forget(pid_t tid) { held_.erase(tid); }
  std::vector<pid_t> tids() const {
    std::vector<pid_t> out;
    for (const auto& [tid, h] : held_) out.push_back(tid);
    return out;
  }
  // The registers of a stopped thread, noting what its release must repair.
  Result<ptrace::Regs> regs(pid_t tid) {
    auto r = REMORA_TRY(ptrace::get_regs(tid));
    const int64_t nr = a::syscall_nr(r);
    if (nr >= 0 && a::return_value(r) == -EINTR && a::never_restarted(nr)) {
      const auto kind = a::classify_restart(r, signal_pending_for(pid_, tid));
      if (kind == arch::RestartKind::kReissueOnEintr) {
        held_[tid].reissue = true;
        held_[tid].resume = a::resume_registers(r, kind, /*use_restart_syscall=*/true);
      }
    }
    return r;
  }

 private:
  struct Held {
    int sig = 0;  // the signal to deliver at the detach
    bool reissue = false;
    ptrace::Regs resume{};
  };
  pid_t pid_;
  std::map<pid_t, Held> held_;
};

// Seizes and interrupts every thread of `pid` not held yet, until a listing
// finds no new one (a thread created meanwhile is stopped in the next
// round). An empty `why` on success.
Result<std::string> seize_all(pid_t pid, StoppedThreads& held) {
  for (int round = 0; round < 64; ++round) {
    auto tasks = REMORA_TRY(procfs::list_tasks(pid));
    bool fresh = false;
    for (pid_t tid : tasks) {
      if (held.holds(tid)) continue;
      fresh = true;
      auto s = ptrace::seize(pid, tid, 0);
      if (!s) {
        if (s.error().code() == Errc::kNoSuchProcess) continue;  // it exited meanwhile
        return "thread " + std::to_string(tid) + " cannot be stopped: " + s.error().to_string();
      }
      held.add(tid);
      if (auto i = ptrace::interrupt(tid); !i) return std::move(i).error();
    }
    if (!fresh) return std::string();
  }
  return std::string("the process kept creating threads while they were being stopped");
}

// Waits for each held thread's stop. Returns "" once all are stopped (the
// ones that exited are let go), or why not.
std::string wait_all_stopped(StoppedThreads& held, const Deadline& deadline) {
  for (pid_t tid : held.tids()) {
    auto st = ptrace::wait_stop(tid, deadline);
    if (!st) {
      if (st.error().code() == Errc::kTargetExited) {
        held.forget(tid);
        continue;
      }
      return "thread " + std::to_string(tid) + " did not stop: " + st.error().to_string();
    }
    switch (st->kind) {
      case ptrace::Stop::Kind::kExited:
      case ptrace::Stop::Kind::kKilled:
        held.forget(tid);
        break;
      case ptrace::Stop::Kind::kSignalDelivery:
        held.set_signal(tid, st->sig);  // delivered when it is let go
        break;
      default:
        break;
    }
  }
  return std::string();
}

Result<std::vector<long>> read_counters(pid_t pid, const UnloadPlan& plan) {
  std::vector<long> out;
  if (plan.counters.empty()) return out;
  auto mem = REMORA_TRY(remote::Memory::open(pid));
  for (const auto& c : plan.counters) {
    std::vector<std::byte> bytes(c.stripes * c.stride);
    REMORA_TRY_CTX(mem.read(c.address, bytes), "read a tool's counts of threads inside its code");
    for (uint64_t i = 0; i < c.stripes; ++i) {
      long v = 0;
      std::memcpy(&v, bytes.data() + i * c.stride, sizeof v);
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace

Result<UnloadPlan> unload_plan(const remora_agent_info& info) {
  if ((info.features & REMORA_AGENT_FEATURE_PROVEN_UNLOAD) == 0)
    return Error(Errc::kNotSupported,
                 "the agent (protocol " + std::to_string(info.version) +
                     ") was loaded by an older Remora, whose unload cannot be proven safe: it stays loaded, with "
                     "its tools detached. Only a restart of the process removes it");
  if (info.unload_code_count == 0 || info.unload_code_count > REMORA_AGENT_UNLOAD_RANGES ||
      info.unload_counter_count > REMORA_AGENT_UNLOAD_RANGES)
  {
    std::string said(info.message, strnlen(info.message, sizeof info.message));
    return Error(Errc::kNotSupported, "the agent could not say what its unload would unmap, so it stays loaded" +
                                          (said.empty() ? std::string() : " (" + said + ")"));
  }
  UnloadPlan plan;
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

QuiescenceCheck judge(const UnloadPlan& plan, std::span<const std::pair<pid_t, uint64_t>> pcs,
                      std::span<const long> inside) {
  QuiescenceCheck out;
  out.threads = pcs.size();
  for (const auto& [tid, pc] : pcs) {
    for (const auto& r : plan.code) {
      if (pc >= r.start && pc < r.end) {
        out.why = "thread " + std::to_string(tid) + " is running the code the unload would unmap (pc " + hex(pc) +
                  ")";
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

Result<QuiescenceCheck> check_quiescent(pid_t pid, const UnloadPlan& plan, const Deadline& deadline) {
  StoppedThreads held(pid);
  QuiescenceCheck out;
  out.why = REMORA_TRY(seize_all(pid, held));
  if (out.why.empty()) out.why = wait_all_stopped(held, deadline);
  if (!out.why.empty()) return out;
  std::vector<std::pair<pid_t, uint64_t>> pcs;
  for (pid_t tid : held.tids()) {
    auto regs = held.regs(tid);
    if (!regs) return std::move(regs).error().with_context("read the registers of thread " + std::to_string(tid));
    pcs.emplace_back(tid, arch::pc(*regs));
  }
  auto inside = REMORA_TRY(read_counters(pid, plan));
  return judge(plan, pcs, inside);
}

}  // namespace remora::attach::detail
