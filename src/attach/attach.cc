// How a tool gets attached (docs/architecture.md, "Attach, step by step"):
//  1. Refuse a target whose environment says REMORA_TOOL_ATTACH=0 (or
//     ROCP_TOOL_ATTACH=0), before touching it at all.
//  2. If the agent is not loaded: make it visible inside the target (its path,
//     or a memfd), and have one application thread do nothing but
//     pthread_create() a fresh thread running Remora's trampoline, which
//     dlopen()s the agent. dlopen never runs on an interrupted application
//     thread: that thread may hold the malloc or loader lock, and dlopen
//     needs both (kubo/injector#5, pyrasite#75). The interrupted thread is
//     chosen blocked in a restartable system call, where glibc holds no
//     internal lock; pthread_create itself takes the stack-cache and malloc
//     locks only briefly. The fresh thread holds nothing.
//  3. Everything else (attach, detach, lease, pipe2) runs as remote calls on
//     the agent's idle listener thread.
// What the attach creates in the target (memfds, the lease pipe, our scratch
// mapping) is held in remote::RemoteHandle until the target owns it for
// good, so that no failing step can leave one behind.
#include "attach/attach.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol.h"
#include "attach/channel.h"
#include "attach/internal.h"
#include "base/deadline.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "procfs/procfs.h"
#include "remote/lookup.h"
#include "remote/memory.h"
#include "remote/remote_handle.h"
#include "remote/target.h"

namespace remora::attach {

using namespace detail;  // this layer's steps (internal.h)

namespace detail {

void pause_briefly(long ns) {
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
}

// A pidfd polls readable once the process has exited, zombie or not
// (pidfd_send_signal(0) still succeeds on a zombie).
bool pidfd_alive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

// Test-only fault injection: REMORA_INJECT_FAULT=NAME in the controller's
// environment makes step NAME fail as if the target had refused it (or,
// for old-agent, take the route of an older agent). Only for
// failures no test can provoke in a live target:
//   remove-scratch  removing our retired scratch mapping before the attach
//                   call (only an agent without remora_agent_attach_unmap
//                   takes that route, and only a failing remote munmap
//                   fails it).
//   lease-call      the remote call that hands the lease pipe to the agent,
//                   failing on our side before the agent ran (a seize that
//                   fails, a deadline) with the pipe made.
//   old-agent       the agent is taken for one of protocol 1 (no leased
//                   attach): the lease is armed after the attach, as then.
//   libc-stack      libc is taken for one without pthread_attr_setstack:
//                   the loader start routine maps no stack and the loader
//                   thread runs on libc's own (the routine's other branch).
// Several names are separated by commas ("old-agent,lease-call").
bool fault_injected(std::string_view name) {
  const char* v = std::getenv("REMORA_INJECT_FAULT");
  if (v == nullptr) return false;
  std::string_view all(v);
  for (size_t at = 0; at <= all.size();) {
    size_t end = std::min(all.find(',', at), all.size());
    if (all.substr(at, end - at) == name) return true;
    at = end + 1;
  }
  return false;
}

}  // namespace detail

Controller::Controller() = default;
Controller::~Controller() = default;

std::vector<pid_t> Controller::sessions() const {
  std::lock_guard lock(mu_);
  std::vector<pid_t> out;
  for (const auto& [pid, s] : sessions_)
    if (s->attached) out.push_back(pid);
  for (const auto& [pid, s] : socket_sessions_)
    if (s->attached) out.push_back(pid);
  return out;
}

Result<std::shared_ptr<Controller::Session>> Controller::session_for(pid_t pid, bool create) {
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(pid);
    if (it != sessions_.end()) {
      if (pidfd_alive(it->second->pidfd.get())) return it->second;
      sessions_.erase(it);  // the process died: its pid may be someone else's now
    }
  }
  if (!create) return std::shared_ptr<Session>();
  auto s = std::make_shared<Session>();
  s->pid = pid;
  s->target = REMORA_TRY(remote::Target::open(pid));
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return Error(Errc::kNoSuchProcess, "process " + std::to_string(pid) + " exited", errno);
  s->pidfd.reset(fd);
  std::lock_guard lock(mu_);
  auto [it, inserted] = sessions_.emplace(pid, s);
  return it->second;
}

// A process this controller has a session with was checked when the session
// opened, and its pidfd says it lives: checked again, it could seem traced
// by another (our own call on another thread, holding one of its threads
// for longer than the grace), which the session's lock waits out instead.
bool Controller::vetted(pid_t pid) {
  auto known = session_for(pid, false);
  return known && *known;
}

Result<ProcessOutcome> Controller::attach(pid_t pid, const AttachOptions& opts) {
  detail::ScopedTimerSlack slack;
  // What the process is, first (a zombie's pidfd already reads as exited,
  // which would otherwise make it "exited during the attach").
  const auto via =
      REMORA_TRY(route(pid, opts.channel, TargetUse::kProcess, "attach to process " + std::to_string(pid)));
  if (via == Channel::kSocket) return attach_socket(pid, opts);
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  UniqueFd pidfd(fd);
  return attach_one(pid, fd, opts);
}

Result<ProcessOutcome> Controller::attach_one(pid_t pid, int pidfd, const AttachOptions& opts) {
  if (opts.channel == Channel::kSocket || socket_session(pid) != nullptr) return attach_socket(pid, opts);
  auto r = attach_steps(pid, pidfd, opts);
  // Refused at the seize (a seccomp filter of ours, a rule the pre-check
  // cannot see), before anything changed in the process: its socket, if it
  // opted in.
  if (!r && opts.channel == Channel::kAuto && r.error().code() == Errc::kPtraceDenied) {
    if (auto ep = channel::find_endpoint(pid); ep && *ep) return attach_socket(pid, opts);
    return channel::with_opt_in_hint(r.error());
  }
  // Whatever step failed, a process that is gone is reported as such: the
  // failing step (a read, a lookup) is only the symptom.
  // (A process in the middle of exiting fails reads before its pidfd turns
  // readable: give it a moment.)
  pollfd exited{pidfd, POLLIN, 0};
  if (!r && pidfd >= 0 && r.error().code() != Errc::kNoSuchProcess && ::poll(&exited, 1, 200) == 1)
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " exited during the attach (" +
                                          r.error().to_string() + ")");
  return r;
}

Result<ProcessOutcome> Controller::attach_steps(pid_t pid, int pidfd, const AttachOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = "attach to process " + std::to_string(pid);
  if (opts.tools.empty()) return Error(Errc::kInvalidArgument, "no tool library given to attach");
  auto s = REMORA_TRY_CTX(session_for(pid, true), ctx);
  std::lock_guard lock(s->mu);
  if (pidfd >= 0 && !pidfd_alive(pidfd))
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " exited");
  remote::Target& t = *s->target;
  Deadline deadline = Deadline::after(opts.timeout);
  ProcessOutcome out;
  out.pid = pid;
  REMORA_LOG(kAttach, "pid %d: session ready", pid);

  // What this attach creates in the target, owned until the target takes it
  // for good: whatever step fails, it is released in the target on return.
  remote::RemoteHandle retired;
  std::vector<OwnedFile> memfds;
  OwnedFile agent_file;  // the agent's memfd, if it needed one: held until the tools are loaded
  std::optional<uint64_t> loader_attach;  // the attach the loader thread handed the agent (LoaderAttach)
  pid_t known_listener = REMORA_TRY_CTX(ensure_agent(t, pid, opts, deadline, &s->agent, &retired,
                                                     &out.agent_loaded_now, &agent_file, &loader_attach),
                                        ctx);
  // An agent that was in the process already (preloaded, forked) has no
  // listener until one is asked for: the wait asks.
  bool started_listener = false;
  auto info = REMORA_TRY_CTX(
      wait_for_listener(t, pid, s->agent.info, known_listener, deadline, &started_listener), ctx);
  if ((info.features & REMORA_AGENT_FEATURE_UNLOAD) != 0 && info.unloading)
    return Error(
               Errc::kAlreadyAttached,
               "the agent in process " + std::to_string(pid) +
                   " is being unloaded (its listener is gone): if no remora detach --unload is running, one "
                   "was interrupted; finish it with remora detach --unload -p " +
                   std::to_string(pid) + ", then attach again")
        .with_context(ctx);
  s->listener = info.listener_tid;
  if (out.agent_loaded_now || started_listener)
    t.note_descendant_thread(s->listener);  // by our loader thread
  REMORA_LOG(kAttach, "pid %d: listener %d ready", pid, s->listener);
  if (loader_attach) {
    REMORA_TRY_CTX(finish_loader_attach(t, pid, s->agent, *loader_attach, deadline), ctx);
    REMORA_LOG(kAttach, "pid %d: attached (the loader's request)", pid);
    s->attached = true;
    out.ok = true;
    out.elapsed = std::chrono::steady_clock::now() - t0;
    return out;
  }
  CallOptions on_listener{s->listener, opts.timeout};

  auto list =
      REMORA_TRY_CTX(tool_list(t, opts.tools, info.tools[0] != '\0', on_listener, deadline, &memfds), ctx);
  REMORA_LOG(kAttach, "pid %d: tools visible", pid);
  // The lease belongs to the attach (protocol 2): the agent records this
  // controller before any tool runs, so no instant of a controller's death
  // leaves tools attached without a lease. An agent of protocol 1 is leased
  // after the attach, as it always was.
  const bool leased = opts.lease && (info.features & REMORA_AGENT_FEATURE_LEASED_ATTACH) != 0 &&
                      s->agent.attach_leased_fn != 0 && !fault_injected("old-agent");
  // The new write end stays apart from the session's until the agent took
  // the lease: a refused attach must not close a lease this controller
  // holds already (that would expire its own live session).
  remote::RemoteHandle lease_read;
  UniqueFd new_lease;
  if (leased)
    lease_read = REMORA_TRY_CTX(make_lease_pipe(t, pid, on_listener, &new_lease), ctx + ": make the lease");
  const auto env = encode_env(opts.env);
  AttachCall call{env, list, retired, memfds};
  if (leased) {
    call.lease_read = &lease_read;
    call.lease_fd = &new_lease;
  }
  REMORA_TRY_CTX(call_agent_attach(t, pid, s->agent, on_listener, call), ctx);
  if (leased) s->lease_fd = std::move(new_lease);
  REMORA_LOG(kAttach, "pid %d: attached%s", pid, leased ? " with its lease" : "");
  if (opts.lease && !leased)
    REMORA_TRY(arm_lease_or_detach(t, pid, s->agent, on_listener, &s->lease_fd, ctx));
  s->attached = true;
  out.ok = true;
  out.elapsed = std::chrono::steady_clock::now() - t0;
  return out;
}

Result<void> Controller::detach(pid_t pid, std::chrono::milliseconds timeout) {
  DetachOptions opts;
  opts.timeout = timeout;
  auto r = detach(pid, opts);
  if (!r) return std::move(r).error();
  return ok();
}

Result<UnloadReport> Controller::detach(pid_t pid, const DetachOptions& opts) {
  detail::ScopedTimerSlack slack;
  if (pid != 0) return detach_one(pid, opts);
  Result<UnloadReport> last = UnloadReport{};
  UnloadReport merged{true, {}};
  for (pid_t p : sessions()) {
    auto r = detach_one(p, opts);
    if (!r) {
      last = std::move(r);
      continue;
    }
    merged.unloaded = merged.unloaded && r->unloaded;
    merged.kept_tools.insert(merged.kept_tools.end(), r->kept_tools.begin(), r->kept_tools.end());
  }
  if (!last) return last;
  if (!opts.unload) merged.unloaded = false;
  return merged;
}

Result<UnloadReport> Controller::detach_one(pid_t pid, const DetachOptions& opts) {
  const std::string ctx =
      std::string(opts.unload ? "detach and unload from" : "detach from") + " process " + std::to_string(pid);
  if (REMORA_TRY(route(pid, opts.channel, TargetUse::kProcess, ctx)) == Channel::kSocket)
    return detach_socket(pid, opts);
  auto s = REMORA_TRY_CTX(session_for(pid, true), ctx);
  std::unique_lock lock(s->mu);
  remote::Target& t = *s->target;
  // The session stays open for a later attach; its scratch (if it has one
  // of its own rather than the agent's) is removed now.
  auto finish = [&]() {
    (void)t.close();
    s->lease_fd.reset();
    s->attached = false;
  };
  auto loaded = resolve_agent(t, &s->agent);
  if (!loaded || !*loaded) {
    finish();
    if (!loaded) return std::move(loaded).error().with_context(ctx);
    return Error(Errc::kNotAttached,
                 "no Remora agent in process " + std::to_string(pid) + ": nothing is attached")
        .with_context(ctx);
  }
  // A detach needs the head alone; an unload may finish an earlier one from
  // the block's tail (`kept`, the agent's handle).
  auto info =
      REMORA_TRY_CTX(opts.unload ? read_info(t, s->agent.info) : read_info_head(t, s->agent.info), ctx);
  if (needs_listener(info)) {
    // An agent no controller called yet in this process image: nothing is
    // attached, and a detach starts no thread to say so.
    if (!info.attached && !opts.unload) {
      finish();
      return Error(Errc::kNotAttached, "no tools are attached to process " + std::to_string(pid) +
                                           " (its agent is loaded and idle: no controller has attached yet)")
          .with_context(ctx);
    }
    info.listener_tid =
        REMORA_TRY_CTX(wait_for_listener(t, pid, s->agent.info, 0, Deadline::after(opts.timeout)), ctx)
            .listener_tid;
  }
  if (opts.unload) {
    auto r = unload_agent(t, pid, s->agent, info, opts.timeout);
    finish();
    if (r) {
      s->agent = AgentSymbols{};  // gone: a later attach loads it afresh
      s->listener = 0;
    }
    if (!r) return std::move(r).error().with_context(ctx);
    return r;
  }
  auto rc = t.call(RemoteAddr(s->agent.detach_fn), {}, CallOptions{info.listener_tid, opts.timeout});
  if (!rc) {
    finish();
    return std::move(rc).error().with_context(ctx);
  }
  int code = static_cast<int>(static_cast<int32_t>(rc->value));
  if (code != REMORA_AGENT_OK) {
    info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
    info.message[sizeof info.message - 1] = '\0';
    finish();
    return Error(errc_for_agent(code), info.message).with_context(ctx);
  }
  finish();
  return UnloadReport{};
}

Result<AgentState> detail::status_through_memory(pid_t pid) {
  REMORA_TRY(check_target(pid, TargetUse::kRead));
  AgentState st;
  auto mem = REMORA_TRY(remote::Memory::open(pid));
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  if (!remote::find_library(pid, maps, kAgentName)) return st;
  auto sym =
      REMORA_TRY(remote::resolve_symbol(pid, mem, kAgentName, "remora_agent_info", 0, {}, false, &maps));
  remora_agent_info info{};
  REMORA_TRY(mem.read(sym.address, std::as_writable_bytes(std::span(&info, 1))));
  if (info.magic != REMORA_AGENT_MAGIC) return st;
  listener_as_we_name_it(pid, &info);
  info.tools[sizeof info.tools - 1] = '\0';
  info.message[sizeof info.message - 1] = '\0';
  st.agent_loaded = true;
  st.attached = info.attached != 0;
  st.sessions = info.sessions;
  st.detaches = info.detaches;
  st.tools = info.tools;
  st.listener_tid = info.listener_tid;
  st.lease_pid = info.lease_pid;
  st.lease_expired = info.lease_expired != 0;
  if (info.version >= 4) st.forked_from = info.forked_from;
  if (info.version >= 5) st.loader_attached = info.loader_done != 0;
  if (info.version >= 6 && info.session_channel != 0) st.session_channel = Channel::kSocket;
  st.message = info.message;
  return st;
}

detail::ScopedTimerSlack::ScopedTimerSlack() {
  const int was = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  // 1 ns, not 0: 0 would mean "back to this thread's default slack".
  if (was > 1 && ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) == 0) saved_ = was;
}

detail::ScopedTimerSlack::~ScopedTimerSlack() {
  if (saved_ > 0) (void)::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_), 0, 0, 0);
}

}  // namespace remora::attach
