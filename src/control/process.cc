// control::Process, the public handle: see process.h for the model and
// process_impl.h for how the implementation is laid out across files. This
// file opens a running process, runs it event by event, and releases it.
#include "control/process.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "control/process_impl.h"
#include "procfs/procfs.h"
#include "remote/lookup.h"

namespace remora::control {

const char* event_kind_name(Event::Kind k) {
  switch (k) {
    case Event::Kind::kIntr: return "eintr";
    case Event::Kind::kGone: return "targgone";
    case Event::Kind::kDlopen: return "dlopen";
    case Event::Kind::kDlclose: return "dlclose";
    case Event::Kind::kExec: return "exec";
    case Event::Kind::kFork: return "fork";
    case Event::Kind::kExit: return "exit";
  }
  return "?";
}

Process::Process(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Process::~Process() { (void)close(CloseMode::kDefault); }

pid_t Process::pid() const { return impl_->pid; }
bool Process::launched() const { return impl_->launched; }
bool Process::alive() const { return impl_->alive && !impl_->closed; }
const std::vector<LoadedObject>& Process::objects() const { return impl_->objects; }
std::vector<pid_t> Process::threads() const {
  std::vector<pid_t> v;
  for (auto& [tid, t] : impl_->threads) v.push_back(tid);
  return v;
}

void Process::interrupt() {
  uint64_t one = 1;
  if (impl_->wake) (void)!::write(impl_->wake.get(), &one, sizeof one);
}

namespace {

// Seizes every thread of `impl.pid`, rescanning /proc/PID/task until no new
// one appears, then stops them all. Threads cloned by a thread already seized
// are attached automatically (PTRACE_O_TRACECLONE): seizing them again fails,
// and their first stop is awaited instead.
Result<void> seize_all(Process::Impl& impl) {
  const pid_t pid = impl.pid;
  for (int round = 0; round < 1000; ++round) {
    auto tasks = REMORA_TRY(procfs::list_tasks(pid));
    bool added = false;
    for (pid_t tid : tasks) {
      if (impl.threads.count(tid) != 0) continue;
      added = true;
      if (auto s = ptrace::seize(pid, tid, kOptions); !s) {
        auto ts = procfs::read_status(pid, tid);
        if (ts && ts->tracer_pid == ::gettid()) {
          impl.threads[tid] = Process::Impl::Thread{false, true, 0};
          continue;
        }
        if (s.error().code() == Errc::kNoSuchProcess && tid != pid) continue;  // it exited
        return std::move(s).error();
      }
      impl.threads[tid] = Process::Impl::Thread{};
      (void)ptrace::interrupt(tid);
    }
    if (!added) break;
  }
  return impl.stop_all();
}

// Caught in the middle of a dlopen/dlclose: runs on to the consistent state.
// An event met on the way is kept for the first cont().
Result<void> run_to_consistent(Process::Impl& impl) {
  for (int i = 0; i < 100 && impl.read_r_state().value_or(kRtConsistent) != kRtConsistent; ++i) {
    Raw r = REMORA_TRY(impl.run(Deadline::after(std::chrono::seconds(10)), false));
    if (r.kind == Raw::Kind::kGone || r.kind == Raw::Kind::kExit)
      return Error(Errc::kTargetExited, "process exited while being opened");
    if (r.kind != Raw::Kind::kTrap) impl.queued.push_back(r);
    if (!impl.queued.empty()) break;
  }
  return ok();
}

}  // namespace

Result<std::unique_ptr<Process>> Process::open(pid_t pid) {
  const std::string ctx = "open process " + pid_str(pid);
  REMORA_TRY_CTX(ptrace::precheck_open(pid), ctx);

  auto impl = std::make_unique<Impl>();
  impl->pid = pid;
  impl->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  auto fail = [&](Error e) -> Result<std::unique_ptr<Process>> {
    (void)impl->stop_all();
    impl->detach_all();
    return std::move(e).with_context(ctx);
  };
  if (auto s = seize_all(*impl); !s) return fail(std::move(s).error());
  if (!impl->alive) return Error(Errc::kNoSuchProcess, "process exited while being opened").with_context(ctx);
  impl->queued.clear();  // events raced with the attach: they are part of the past

  auto m = remote::Memory::open(pid);
  if (!m) return fail(std::move(m).error());
  impl->mem.emplace(std::move(*m));
  if (auto s = impl->read_auxv(); !s) return fail(std::move(s).error());
  if (!impl->dynamic)
    return fail(Error(Errc::kStaticBinary, "process " + pid_str(pid) +
                                               " is statically linked: it has no dynamic loader to follow"));
  impl->bp_addrs = {impl->r_brk};
  if (auto s = run_to_consistent(*impl); !s) {
    if (s.error().code() == Errc::kTargetExited) return std::move(s).error().with_context(ctx);
    return fail(std::move(s).error());
  }
  auto objs = impl->read_link_map();
  if (!objs) return fail(std::move(objs).error());
  impl->objects = std::move(*objs);
  return std::unique_ptr<Process>(new Process(std::move(impl)));
}

namespace {

// A stop at r_brk: the link map changed when the loader says it is
// consistent again. Returns the dlopen/dlclose event, if anything changed.
Result<std::optional<Event>> link_map_event(Process::Impl& p, const Raw& r) {
  if (r.addr != p.r_brk) return std::optional<Event>();
  auto state = p.read_r_state();
  if (!state || *state != kRtConsistent) return std::optional<Event>();
  auto now = REMORA_TRY(p.read_link_map());
  Event e;
  e.tid = r.tid;
  for (auto& o : now)
    if (std::find(p.objects.begin(), p.objects.end(), o) == p.objects.end()) e.added.push_back(o);
  for (auto& o : p.objects)
    if (std::find(now.begin(), now.end(), o) == now.end()) e.removed.push_back(o);
  p.objects = std::move(now);
  if (e.added.empty() && e.removed.empty()) return std::optional<Event>();
  e.kind = e.added.empty() ? Event::Kind::kDlclose : Event::Kind::kDlopen;
  return std::optional<Event>(std::move(e));
}

// The process exec'd: the execing thread now has the process id, the others
// are gone. The exec is reported once the new program's libraries are
// known, even past a short deadline (a deadline that cut the loading short
// would lose the event).
Result<Event> exec_event(Process::Impl& p, const Deadline& deadline) {
  for (auto& [tid, t] : p.threads)
    if (tid != p.pid) reap_if_ended(tid);
  p.threads.clear();
  p.threads[p.pid] = Process::Impl::Thread{true, false, 0};
  p.shares_parent_mm = false;
  p.vfork_child_running = false;
  p.queued.clear();
  const Deadline sync_deadline =
      deadline.remaining() > kStopAllTimeout ? deadline : Deadline::after(kStopAllTimeout);
  auto ev = REMORA_TRY(p.sync_new_image(sync_deadline));
  if (ev) {
    if (ev->kind == Event::Kind::kGone) p.threads.clear();
    return std::move(*ev);
  }
  Event e;
  e.kind = Event::Kind::kExec;
  e.tid = p.pid;
  e.added = p.objects;
  return e;
}

}  // namespace

Result<Event> Process::cont(const ContOptions& opts) {
  Impl& p = *impl_;
  const std::string ctx = "continue process " + pid_str(p.pid);
  if (p.closed) return Error(Errc::kInvalidArgument, "the handle is closed").with_context(ctx);
  if (!p.alive) return Error(Errc::kTargetExited, "the process is gone").with_context(ctx);
  for (;;) {
    Raw r = REMORA_TRY_CTX(p.run(opts.deadline, true), ctx);
    if (auto ev = p.terminal_event(r)) {
      if (ev->kind == Event::Kind::kGone) {
        p.threads.clear();
        p.mem.reset();
      }
      return std::move(*ev);
    }
    switch (r.kind) {
      case Raw::Kind::kWake:
      case Raw::Kind::kSigIntr: {
        Event e;
        e.kind = Event::Kind::kIntr;
        return e;
      }
      case Raw::Kind::kTrap: {
        auto ev = REMORA_TRY_CTX(link_map_event(p, r), ctx);
        if (ev) return std::move(*ev);
        continue;
      }
      case Raw::Kind::kFork:
      case Raw::Kind::kVfork: return REMORA_TRY_CTX(p.handle_fork(r, opts.want_child), ctx);
      case Raw::Kind::kVforkDone: p.vfork_child_running = false; continue;
      case Raw::Kind::kExec: return REMORA_TRY_CTX(exec_event(p, opts.deadline), ctx);
      default: continue;
    }
  }
}

Result<void> Process::close(CloseMode mode) {
  Impl& p = *impl_;
  if (p.closed) return ok();
  p.closed = true;
  if (!p.alive || p.threads.empty()) {
    // Reap what is left to reap (a launched child's zombie).
    for (auto& [tid, t] : p.threads) reap_if_ended(tid);
    p.threads.clear();
    return ok();
  }
  if (mode == CloseMode::kDefault) mode = p.launched ? CloseMode::kKill : CloseMode::kResume;
  p.remove_bps(true);
  switch (mode) {
    case CloseMode::kResume: p.detach_all(); return ok();
    case CloseMode::kSuspend: return p.suspend();
    case CloseMode::kKill:
    case CloseMode::kDefault: return p.kill_and_reap();
  }
  return ok();
}

Result<void> Process::read(RemoteAddr addr, std::span<std::byte> out) const {
  if (!impl_->mem || impl_->closed) return Error(Errc::kTargetExited, "the process is gone or closed");
  return impl_->mem->read(addr.addr(), out);
}

Result<void> Process::write(RemoteAddr addr, std::span<const std::byte> in) {
  if (!impl_->mem || impl_->closed) return Error(Errc::kTargetExited, "the process is gone or closed");
  return impl_->mem->write(addr.addr(), in);
}

Result<RemoteAddr> Process::find_symbol(std::string_view library, std::string_view symbol) {
  if (!impl_->mem || impl_->closed) return Error(Errc::kTargetExited, "the process is gone or closed");
  auto sym = REMORA_TRY(remote::resolve_symbol(impl_->pid, *impl_->mem, library, symbol, impl_->at_phdr, {}));
  return RemoteAddr(sym.address);
}

}  // namespace remora::control
