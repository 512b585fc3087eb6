// Thread-level stop handling of a control::Process, and the all-stop
// machinery: stopping every thread, resuming them, running to the next stop
// that needs a decision. One handler per kind of stop (as LLDB's
// MonitorSIGTRAP/MonitorSignal/MonitorClone).
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "control/process_impl.h"
#include "procfs/procfs.h"

namespace remora::control {

using Kind = ptrace::Stop::Kind;

std::vector<pid_t> Process::Impl::running_tids() const {
  std::vector<pid_t> v;
  for (auto& [tid, t] : threads)
    if (!t.stopped) v.push_back(tid);
  return v;
}

void Process::Impl::resume(pid_t tid, Thread& t, int sig, bool stopping_all) {
  if (stopping_all) {
    if (sig != 0) t.pending_sig = sig;
    t.stopped = true;
    return;
  }
  if (ptrace::cont(tid, sig)) t.stopped = false;  // else ESRCH: it is dying, its exit comes later
}

std::optional<Raw> Process::Impl::handle_stop(pid_t tid, const ptrace::Stop& st, bool stopping_all) {
  auto it = threads.find(tid);
  if (it == threads.end()) return std::nullopt;
  Thread& t = it->second;
  if (ended(st)) {
    threads.erase(it);
    if (tid != pid) return std::nullopt;
    alive = false;
    return Raw{Raw::Kind::kGone, tid, 0, 0, st.kind == Kind::kKilled ? st.sig : 0};
  }
  t.stopped = true;
  switch (st.kind) {
    case Kind::kGroupStop:
    case Kind::kInterrupt: return handle_ptrace_stop(tid, t, st, stopping_all);
    case Kind::kEvent: return handle_event(tid, t, st, stopping_all);
    case Kind::kSyscall:  // a syscall stop we never asked for
      resume(tid, t, 0, stopping_all);
      return std::nullopt;
    case Kind::kSignalDelivery: break;
    case Kind::kExited:
    case Kind::kKilled: return std::nullopt;  // handled above
  }
  if (st.sig == SIGTRAP) {
    if (auto at = hit_breakpoint(tid)) {
      if (stopping_all) return std::nullopt;  // hit again after the next resume
      return Raw{Raw::Kind::kTrap, tid, *at};
    }
  }
  // A signal for the process: deliver it (now, or when the thread next runs).
  resume(tid, t, st.sig, stopping_all);
  return std::nullopt;
}

// PTRACE_EVENT_STOP: the first stop of a seized or auto-attached thread, an
// interrupt of ours, or a group-stop.
std::optional<Raw> Process::Impl::handle_ptrace_stop(pid_t tid, Thread& t, const ptrace::Stop& st,
                                                     bool stopping_all) {
  if (t.awaiting_attach) {
    t.awaiting_attach = false;
    resume(tid, t, 0, stopping_all);
    return std::nullopt;
  }
  if (st.kind == Kind::kGroupStop && !stopping_all) {
    // Group-stop: leave it in the job-control stop, still traced.
    if (ptrace::listen(tid)) t.stopped = false;
    return std::nullopt;
  }
  resume(tid, t, 0, stopping_all);
  return std::nullopt;
}

std::optional<Raw> Process::Impl::handle_event(pid_t tid, Thread& t, const ptrace::Stop& st,
                                               bool stopping_all) {
  const auto msg = [tid] { return ptrace::get_event_msg(tid).value_or(0); };
  switch (st.event) {
    case PTRACE_EVENT_CLONE: {
      auto ntid = static_cast<pid_t>(msg());
      if (ntid > 0 && threads.count(ntid) == 0) threads[ntid] = Thread{false, true, 0};
      resume(tid, t, 0, stopping_all);
      return std::nullopt;
    }
    case PTRACE_EVENT_FORK:
    case PTRACE_EVENT_VFORK: {
      Raw r{st.event == PTRACE_EVENT_FORK ? Raw::Kind::kFork : Raw::Kind::kVfork, tid};
      r.other = static_cast<pid_t>(msg());
      return r;
    }
    case PTRACE_EVENT_VFORK_DONE: t.in_vfork = false; return Raw{Raw::Kind::kVforkDone, tid};
    case PTRACE_EVENT_EXEC: {
      Raw r{Raw::Kind::kExec, tid};
      r.other = static_cast<pid_t>(msg());
      return r;
    }
    case PTRACE_EVENT_EXIT: {
      int status = static_cast<int>(msg());
      if (tid == pid && WIFEXITED(status) && !another_thread_execs())
        return Raw{Raw::Kind::kExit, tid, 0, 0, status};
      resume(tid, t, 0, stopping_all);
      return std::nullopt;
    }
    default: resume(tid, t, 0, stopping_all); return std::nullopt;
  }
}

// An exec from a non-leader thread first kills the leader (de_thread), which
// then stops at PTRACE_EVENT_EXIT like a real exit (status 0); the execing
// thread is meanwhile inside execve. Tell the two apart by that. A thread
// still running on its way into de_thread's wait reads as "running" rather
// than in execve (seen under an emulator, where that window is long): ask
// again, briefly, until no thread is running.
bool Process::Impl::another_thread_execs() const {
  const Deadline dl = Deadline::after(std::chrono::milliseconds(200));
  for (;;) {
    bool running = false;
    for (auto& [tid, t] : threads) {
      if (tid == pid) continue;
      auto sc = procfs::read_syscall(pid, tid);
      if (sc && !sc->running && (sc->nr == SYS_execve || sc->nr == SYS_execveat)) return true;
      running |= sc && sc->running;
    }
    if (!running || dl.expired()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::optional<Raw> Process::Impl::forget(pid_t tid) {
  threads.erase(tid);
  if (tid != pid) return std::nullopt;
  alive = false;
  return Raw{Raw::Kind::kGone, tid};
}

Result<void> Process::Impl::stop_all() {
  for (auto& [tid, t] : threads)
    if (!t.stopped && !t.awaiting_attach && !t.in_vfork) (void)ptrace::interrupt(tid);
  Deadline dl = Deadline::after(kStopAllTimeout);
  for (;;) {
    std::vector<pid_t> tids;
    for (auto& [tid, t] : threads)
      if (!t.stopped && !t.in_vfork) tids.push_back(tid);
    if (tids.empty()) return ok();
    auto w = ptrace::wait_any(tids, dl);
    if (w.kind == ptrace::Waited::Kind::kTimeout) {
      std::string list;
      for (pid_t t : tids) list += " " + pid_str(t);
      return Error(Errc::kTimedOut, "threads of process " + pid_str(pid) + " did not stop:" + list);
    }
    if (w.kind == ptrace::Waited::Kind::kVanished) {
      if (auto gone = forget(w.tid)) queued.push_back(*gone);
      continue;
    }
    if (w.kind != ptrace::Waited::Kind::kStop) continue;
    if (auto r = handle_stop(w.tid, w.stop, true)) queued.push_back(*r);
  }
}

Result<void> Process::Impl::resume_all() {
  step_over_bps();
  REMORA_TRY(insert_bps());
  for (auto& [tid, t] : threads) {
    if (!t.stopped) continue;
    int sig = std::exchange(t.pending_sig, 0);
    if (ptrace::cont(tid, sig)) t.stopped = false;
  }
  return ok();
}

// Resumes every thread and waits for the first stop that needs a decision,
// queued first; then stops the others (not after an exec: they are gone).
Result<void> Process::Impl::wait_for_decision(const Deadline& deadline, bool watch_wake) {
  REMORA_TRY(resume_all());
  std::optional<Raw> got;
  const ptrace::WaitOptions wopts{watch_wake ? wake.get() : -1, false};
  while (!got) {
    auto tids = running_tids();
    if (tids.empty()) {
      // Nobody left to wait for: the leader vanished without a status.
      alive = false;
      got = Raw{Raw::Kind::kGone, pid};
      break;
    }
    auto w = ptrace::wait_any(tids, deadline, wopts);
    switch (w.kind) {
      case ptrace::Waited::Kind::kStop: got = handle_stop(w.tid, w.stop, false); break;
      case ptrace::Waited::Kind::kVanished: got = forget(w.tid); break;
      case ptrace::Waited::Kind::kWake: got = Raw{Raw::Kind::kWake}; break;
      case ptrace::Waited::Kind::kSignal: got = Raw{Raw::Kind::kSigIntr}; break;
      case ptrace::Waited::Kind::kError: break;  // as before: look again
      case ptrace::Waited::Kind::kTimeout: {
        auto s = stop_all();
        remove_bps(alive);
        if (!s) return std::move(s).error();
        return Error(Errc::kTimedOut, "process " + pid_str(pid) + ": no event before the deadline");
      }
    }
  }
  queued.push_front(*got);
  if (alive && got->kind != Raw::Kind::kExec) {
    auto s = stop_all();
    if (!s) {
      remove_bps(alive);
      return std::move(s).error();
    }
  }
  return ok();
}

Result<Raw> Process::Impl::run(const Deadline& deadline, bool watch_wake) {
  if (queued.empty()) REMORA_TRY(wait_for_decision(deadline, watch_wake));
  Raw r = queued.front();
  queued.pop_front();
  // After an exec the old memory (and our breakpoints in it) is gone, unless
  // it was shared with a vfork parent: then it is the parent's, restore there.
  if (r.kind == Raw::Kind::kExec)
    remove_bps(shares_parent_mm);
  else
    remove_bps(alive);
  if (r.kind == Raw::Kind::kWake) {
    uint64_t v;
    (void)!::read(wake.get(), &v, sizeof v);
  }
  return r;
}

}  // namespace remora::control
