// Removing the scratch mappings that controllers killed mid-call left in a
// target (the decision's rules and why: remote/scratch.h). Run by
// Target::open, before the session makes any call of its own, so that it
// never creates a scratch of its own for it: the removal is one system call
// per run of adjacent dead mappings, through libc's syscall() gadget.
//
// The facts, gathered without changing the process:
//  * the header, read through /proc/PID/mem;
//  * the owner: /proc/OWNER/stat's start time (field 22) against the one
//    recorded, in our own pid namespace only;
//  * every thread's pc and stack pointer: /proc/PID/task/TID/syscall for a
//    thread that is blocked (the kernel's snapshot of its user registers),
//    else a seize, interrupt and release that changes nothing (a thread in
//    a system call gets the restart a call's release gives it);
//  * every thread's live stack, from its stack pointer to the end of the
//    mapping that holds it (at most 8 MiB): a word pointing into a
//    candidate's code page is a return address into a stub (a thread still
//    in a function a dead controller called, or in the loader trampoline's
//    dlopen) or the loader thread's start routine not yet run.
//  * the busy word (the header's cookie against the stub's echo), resolved
//    with the survey: the call's thread gone, or unwound above the stub's
//    stack pointer on the same stack, has left the call (a thread a live
//    controller called while it still slept in a dead one's call nests
//    them: the dead call stays in flight until the thread unwinds to it).
// The thread list is read again after the survey: a thread that appeared
// meanwhile was not examined, and then nothing is removed.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "base/log.h"
#include "procfs/procfs.h"
#include "remote/scratch.h"
#include "remote/target_impl.h"
#include "remote/transaction.h"

namespace remora::remote {

namespace a = arch::host;

namespace {

constexpr uint64_t kStackScanMax = 8u << 20;

// This controller, as its headers name it; computed again after a fork.
OwnerIdentity controller_identity() {
  static std::mutex mu;
  static OwnerIdentity cached;
  std::lock_guard lock(mu);
  const pid_t self = ::getpid();
  if (cached.pid == self) return cached;
  OwnerIdentity id;
  id.pid = self;
  if (auto st = procfs::read_stat(self)) id.start_time = st->start_time;
  struct stat ns {};
  if (::stat("/proc/self/ns/pid", &ns) == 0) {
    id.pidns_dev = ns.st_dev;
    id.pidns_ino = ns.st_ino;
  }
  cached = id;
  return id;
}

}  // namespace

ScratchHeader own_header(uint64_t base) {
  const OwnerIdentity id = controller_identity();
  ScratchHeader h;
  h.base = base;
  h.owner_pid = id.pid;
  h.owner_start_time = id.start_time;
  h.owner_pidns_dev = id.pidns_dev;
  h.owner_pidns_ino = id.pidns_ino;
  return h;
}

Result<uint64_t> Target::Impl::gadget_syscall(long nr, std::array<uint64_t, 6> args,
                                              std::chrono::milliseconds timeout) {
  if (!gadgets) gadgets = REMORA_TRY(find_gadgets());
  const Deadline deadline = Deadline::after(timeout);
  const pid_t tid = REMORA_TRY(pick_thread());
  gadget_only = true;
  force_gadget = true;
  auto r = transact(tid, true, static_cast<uint64_t>(nr), args, deadline);
  gadget_only = false;
  force_gadget = false;
  if (!r) return std::move(r).error();
  return r->value;
}

// One thread's pc and stack pointer, without disturbing it if it sleeps.
Result<std::pair<uint64_t, uint64_t>> Target::Impl::thread_position(pid_t tid) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto sc = procfs::read_syscall(pid, tid);
    if (!sc) return std::move(sc).error();
    if (!sc->running) return std::make_pair(sc->pc, sc->sp);
  }
  Transaction tx(*this, tid, Deadline::after(std::chrono::seconds(2)));
  auto regs = REMORA_TRY(tx.observe());
  return std::make_pair(a::pc(regs), a::sp(regs));
}

// Every thread's view, or an error when one could not be examined.
Result<std::vector<ThreadSnapshot>> Target::Impl::survey_threads() {
  auto before = REMORA_TRY(procfs::list_tasks(pid));
  // Read after the thread list: every listed thread's stack is mapped.
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  std::vector<ThreadSnapshot> out;
  for (pid_t tid : before) {
    auto pos = thread_position(tid);
    if (!pos && pos.error().code() == Errc::kNoSuchProcess) continue;  // exited: runs nothing
    auto [pc, sp] = REMORA_TRY(std::move(pos));
    auto m = std::find_if(maps.begin(), maps.end(),
                          [&](const procfs::MapEntry& e) { return sp >= e.start && sp < e.end; });
    if (m == maps.end())
      return Error(Errc::kNotSupported,
                   "thread " + std::to_string(tid) + "'s stack pointer is in no mapping");
    const uint64_t from = sp & ~uint64_t{7};
    if (m->end - from > kStackScanMax)
      return Error(Errc::kNotSupported,
                   "thread " + std::to_string(tid) + "'s live stack exceeds the scan limit");
    ThreadSnapshot v;
    v.tid = tid;
    v.pc = pc;
    v.sp = sp;
    v.stack_lo = m->start;
    v.stack_hi = m->end;
    v.stack.resize(m->end - from);
    REMORA_TRY_CTX(mem.read(from, v.stack), "read the stack of thread " + std::to_string(tid));
    out.push_back(std::move(v));
  }
  auto after = REMORA_TRY(procfs::list_tasks(pid));
  for (pid_t tid : after)
    if (!std::binary_search(before.begin(), before.end(), tid))
      return Error(Errc::kNotSupported, "thread " + std::to_string(tid) + " appeared during the survey");
  return out;
}

Result<int> Target::Impl::reclaim_dead_scratch(const std::vector<procfs::MapEntry>& maps) {
  const auto bases = scratch_candidates(maps);
  if (bases.empty()) return 0;
  const OwnerIdentity self = controller_identity();
  auto log_kept = [&](uint64_t base, const ScratchHeader& h, ScratchVerdict v, const std::string& why) {
    REMORA_LOG(kRemote, "scratch %#llx of controller %d kept: %.*s%s", static_cast<unsigned long long>(base),
               h.owner_pid, static_cast<int>(verdict_name(v).size()), verdict_name(v).data(), why.c_str());
  };
  // First what the headers alone tell: ours or not, and whose.
  struct Dead {
    uint64_t base;
    ScratchHeader h;
    uint64_t echo;
  };
  std::vector<Dead> dead;
  int kept = 0;
  for (uint64_t base : bases) {
    std::array<std::byte, sizeof(ScratchHeader)> bytes{};
    if (!mem.read(base, bytes)) continue;
    auto h = parse_scratch_header(bytes, base);
    if (!h) continue;  // the program's own mapping that looks like one
    std::optional<uint64_t> live;
    bool failed = false;
    if (auto st = procfs::read_stat(h->owner_pid))
      live = st->start_time;
    else
      failed = st.error().code() != Errc::kNoSuchProcess;
    ScratchFacts f;
    f.owner = owner_state(*h, self, live, failed);
    if (f.owner == OwnerState::kGone || f.owner == OwnerState::kReused) {
      auto echo = mem.read_value<uint64_t>(base + kScratchEcho + 8);
      if (echo) {
        dead.push_back({base, *h, *echo});
        continue;
      }
      f.busy = true;  // unreadable: as if a call ran
    }
    ++kept;
    log_kept(base, *h, decide_scratch(f), "");
  }
  if (dead.empty()) return 0;
  // Then the threads, once for all candidates.
  auto threads = survey_threads();
  const std::string why = threads.ok() ? "" : ": " + threads.error().to_string();
  std::vector<uint64_t> gone;
  for (const Dead& d : dead) {
    ScratchFacts f;
    f.owner = OwnerState::kGone;
    f.threads_known = threads.ok();
    f.busy = threads.ok() ? call_in_flight(d.h, d.echo, *threads, d.base) : scratch_busy(d.h, d.echo);
    f.thread_inside = threads.ok() && thread_inside(*threads, d.base);
    const ScratchVerdict v = decide_scratch(f);
    if (v == ScratchVerdict::kReclaim) {
      gone.push_back(d.base);
      continue;
    }
    ++kept;
    std::string detail = why;
    if (v == ScratchVerdict::kKeepBusy) {
      char buf[160];
      std::snprintf(buf, sizeof buf, " (thread %d, the stub's sp %#llx, cookie %#llx, echo %#llx)",
                    d.h.call_tid, static_cast<unsigned long long>(d.h.call_sp),
                    static_cast<unsigned long long>(d.h.call_cookie),
                    static_cast<unsigned long long>(d.echo));
      detail += buf;
      if (threads.ok())
        for (const auto& t : *threads)
          if (t.tid == d.h.call_tid) {
            std::snprintf(buf, sizeof buf, "; it is at pc %#llx, sp %#llx (stack %#llx-%#llx)",
                          static_cast<unsigned long long>(t.pc), static_cast<unsigned long long>(t.sp),
                          static_cast<unsigned long long>(t.stack_lo),
                          static_cast<unsigned long long>(t.stack_hi));
            detail += buf;
          }
    }
    log_kept(d.base, d.h, v, detail);
  }
  int removed = 0;
  for (const Range& r : coalesce_scratch(gone)) {
    auto rc = REMORA_TRY_CTX(gadget_syscall(a::nr::kMunmap, {r.start, r.end - r.start, 0, 0, 0, 0},
                                            std::chrono::milliseconds(5000)),
                             "remove dead controllers' scratch mappings");
    if (static_cast<int64_t>(rc) != 0)
      return Error(Errc::kIo, "munmap of dead controllers' scratch failed in the target",
                   static_cast<int>(-static_cast<int64_t>(rc)));
    removed += static_cast<int>((r.end - r.start) / kScratchSize);
  }
  REMORA_LOG(kRemote,
             "process %d: reclaimed %d scratch mapping(s) (%d KiB) of controllers that are gone, kept %d",
             pid, removed, removed * static_cast<int>(kScratchSize / 1024), kept);
  return removed;
}

}  // namespace remora::remote
