// Fork and vfork children of a control::Process, and releasing a process:
// detach, suspend (detach into a job-control stop), kill.
#include <signal.h>
#include <sys/eventfd.h>

#include <set>

#include "control/process_impl.h"

namespace remora::control {

using Kind = ptrace::Stop::Kind;

Result<Event> Process::Impl::handle_fork(const Raw& r, bool want_child) {
  Event e;
  e.kind = Event::Kind::kFork;
  e.tid = r.tid;
  e.child_pid = r.other;
  e.vfork = r.kind == Raw::Kind::kVfork;
  if (auto it = threads.find(r.tid); e.vfork && it != threads.end()) it->second.in_vfork = true;
  pid_t c = r.other;
  if (c <= 0) return e;
  const pid_t one[] = {c};
  auto w = ptrace::wait_any(one, Deadline::after(kStopAllTimeout));
  if (w.kind != ptrace::Waited::Kind::kStop || ended(w.stop)) {
    return e;  // it died already (or never showed up): nothing to hold
  }
  // The child's first stop is its seize trap; anything else is a signal to
  // hand on to it.
  int first_sig = 0;
  if (w.stop.kind != Kind::kGroupStop && w.stop.kind != Kind::kInterrupt && w.stop.sig != SIGTRAP)
    first_sig = w.stop.sig;
  if (!e.vfork && !last_removed.empty()) {
    if (auto cm = remote::Memory::open(c)) {
      for (auto& [a, orig] : last_removed) (void)cm->write(a, orig);
    }
  }
  if (!want_child) {
    (void)ptrace::detach(c, first_sig);
    if (e.vfork) vfork_child_running = true;
    return e;
  }
  auto ci = std::make_unique<Impl>();
  ci->pid = c;
  ci->launched = false;
  ci->threads[c] = Thread{true, false, first_sig};
  auto cm = remote::Memory::open(c);
  if (!cm) return std::move(cm).error().with_context("open fork child " + pid_str(c));
  ci->mem.emplace(std::move(*cm));
  ci->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  ci->dynamic = dynamic;
  ci->r_debug = r_debug;
  ci->r_brk = r_brk;
  ci->at_entry = at_entry;
  ci->at_phdr = at_phdr;
  ci->objects = objects;
  if (dynamic) ci->bp_addrs = {r_brk};
  ci->shares_parent_mm = e.vfork;
  e.child.reset(new Process(std::move(ci)));
  return e;
}

void Process::Impl::detach_all() {
  for (auto& [tid, t] : threads) (void)ptrace::detach(tid, t.pending_sig);
  threads.clear();
}

Result<void> Process::Impl::suspend() {
  // Put the whole process in a job-control stop while still traced, then
  // detach: a thread detached during a group-stop stays stopped.
  if (::kill(pid, SIGSTOP) != 0) return Error::from_errno("kill SIGSTOP " + pid_str(pid));
  for (auto& [tid, t] : threads) {
    int sig = std::exchange(t.pending_sig, 0);
    if (sig == SIGCONT) sig = 0;  // it would end the stop we are asking for
    if (ptrace::cont(tid, sig)) t.stopped = false;
  }
  std::set<pid_t> group_stopped;
  Deadline dl = Deadline::after(kStopAllTimeout);
  while (group_stopped.size() < threads.size()) {
    std::vector<pid_t> tids;
    for (auto& [tid, t] : threads)
      if (group_stopped.count(tid) == 0) tids.push_back(tid);
    auto w = ptrace::wait_any(tids, dl);
    if (w.kind == ptrace::Waited::Kind::kTimeout) break;
    if (w.kind == ptrace::Waited::Kind::kVanished) {
      threads.erase(w.tid);
      continue;
    }
    if (w.kind != ptrace::Waited::Kind::kStop) continue;
    if (ended(w.stop)) {
      threads.erase(w.tid);
      continue;
    }
    if (w.stop.kind == Kind::kGroupStop) {
      group_stopped.insert(w.tid);
      continue;
    }
    if (w.stop.kind == Kind::kEvent && w.stop.event == PTRACE_EVENT_CLONE) {
      auto ntid = static_cast<pid_t>(ptrace::get_event_msg(w.tid).value_or(0));
      if (ntid > 0) threads[ntid] = Thread{false, true, 0};
    }
    // Signals go through (SIGSTOP among them: that starts the group-stop).
    const bool signal = w.stop.kind == Kind::kSignalDelivery && w.stop.sig != SIGTRAP;
    (void)ptrace::cont(w.tid, signal ? w.stop.sig : 0);
  }
  detach_all();
  return ok();
}

Result<void> Process::Impl::kill_and_reap() {
  (void)::kill(pid, SIGKILL);
  // A process already exiting (stopped at PTRACE_EVENT_EXIT) ignores the
  // SIGKILL: let its stopped threads run on to their end.
  for (auto& [tid, t] : threads)
    if (t.stopped) (void)ptrace::cont(tid, 0);
  Deadline dl = Deadline::after(kStopAllTimeout);
  while (!threads.empty()) {
    std::vector<pid_t> tids;
    for (auto& [tid, t] : threads) tids.push_back(tid);
    auto w = ptrace::wait_any(tids, dl);
    if (w.kind == ptrace::Waited::Kind::kTimeout)
      return Error(Errc::kTimedOut, "process " + pid_str(pid) + " did not die after SIGKILL");
    if (w.kind == ptrace::Waited::Kind::kVanished) {
      threads.erase(w.tid);
      continue;
    }
    if (w.kind != ptrace::Waited::Kind::kStop) continue;
    if (ended(w.stop)) {
      threads.erase(w.tid);
    } else {
      (void)ptrace::cont(w.tid, 0);
    }
  }
  alive = false;
  return ok();
}

}  // namespace remora::control
