// Sessions through the socket channel (channel.h): the Controller's attach,
// detach and status of a process that opted in, where ptrace is refused or
// not wanted. The same lifecycle as over ptrace (the agent's own entry
// points run on its channel thread), the same lease (a pipe whose read end
// the agent holds: this controller's death detaches), the same refusals.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/protocol.h"
#include "attach/attach.h"
#include "attach/channel.h"
#include "attach/internal.h"
#include "base/log.h"

namespace remora::attach {

namespace {

std::string pid_str(pid_t pid) { return std::to_string(pid); }

Result<channel::Endpoint> require_endpoint(pid_t pid) {
  auto ep = REMORA_TRY(channel::find_endpoint(pid));
  if (!ep)
    return Error(Errc::kNotSupported,
                 "process " + pid_str(pid) + " has no socket channel (no @" REMORA_CHANNEL_NAME_PREFIX +
                     pid_str(pid) + ".* socket in its network namespace); " + channel::how_to_opt_in());
  return *ep;
}

// The tools as descriptors (opened here, sent with the request, so that a
// target in another mount namespace needs no path of ours) and their list.
struct ToolFiles {
  std::vector<UniqueFd> fds;
  std::string list;
};

Result<ToolFiles> open_tools(const std::vector<std::string>& tools) {
  ToolFiles out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string& path = tools[i];
    if (path.find_first_of(":|") != std::string::npos)
      return Error(Errc::kInvalidArgument,
                   "tool path '" + path + "' holds ':' or '|', which the tool list uses");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Error::from_errno("open tool " + path, errno);
    out.fds.emplace_back(fd);
    out.list += (i ? ":" : "") + path + "|#" + std::to_string(i);
  }
  return out;
}

AgentState state_from(const remora_channel_reply& r, const channel::Endpoint& ep) {
  AgentState st;
  st.agent_loaded = true;
  st.attached = r.attached != 0;
  st.sessions = r.sessions;
  st.detaches = r.detaches;
  st.tools = r.tools;
  st.listener_tid = r.listener_tid;
  st.lease_pid = r.lease_pid;
  st.lease_expired = r.lease_expired != 0;
  st.forked_from = r.forked_from;
  st.message = r.message;
  st.channel = Channel::kSocket;
  st.session_channel = r.session_channel != 0 ? Channel::kSocket : Channel::kPtrace;
  st.socket = "@" + ep.name;
  return st;
}

// Does the kernel's ptrace access rule let us attach `pid`? (uid,
// dumpable, capabilities, Yama, LSMs: what opening its memory asks.)
bool ptrace_access_allowed(pid_t pid) {
  const int fd = ::open(("/proc/" + pid_str(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  return errno != EACCES && errno != EPERM;
}

}  // namespace

std::string_view channel_name(Channel c) {
  switch (c) {
    case Channel::kAuto: return "auto";
    case Channel::kPtrace: return "ptrace";
    case Channel::kSocket: return "socket";
  }
  return "?";
}

Result<Channel> parse_channel(std::string_view s) {
  if (s == "auto") return Channel::kAuto;
  if (s == "ptrace") return Channel::kPtrace;
  if (s == "socket") return Channel::kSocket;
  return Error(Errc::kInvalidArgument,
               "unknown channel '" + std::string(s) + "': use auto, ptrace or socket");
}

std::shared_ptr<Controller::SocketSession> Controller::socket_session(pid_t pid) {
  std::lock_guard lock(mu_);
  auto it = socket_sessions_.find(pid);
  if (it == socket_sessions_.end()) return nullptr;
  if (!detail::pidfd_alive(it->second->pidfd.get())) {
    socket_sessions_.erase(it);  // the process died: its pid may be someone else's now
    return nullptr;
  }
  return it->second;
}

Result<Channel> resolve_channel(pid_t pid, Channel asked, TargetUse use) {
  if (asked == Channel::kSocket) {
    REMORA_TRY(check_target(pid, TargetUse::kRead));
    REMORA_TRY(require_endpoint(pid));
    return Channel::kSocket;
  }
  auto checked = check_target(pid, use);
  if (checked) {
    // The pre-check reads /proc only and lets some refusals through (a
    // process that is not dumpable, an LSM): the kernel's own ptrace access
    // rule is asked (opening /proc/PID/mem takes the ptrace attach check;
    // one open(), before the socket table of a busy host is read), and
    // where it refuses, a process that opted in is served by its socket. A
    // seize refused later still finds the socket (Controller::attach_one).
    if (asked == Channel::kAuto && use != TargetUse::kRead && !ptrace_access_allowed(pid)) {
      auto ep = channel::find_endpoint(pid);
      if (ep && *ep) {
        REMORA_LOG(kAttach, "pid %d: ptrace access refused, the socket channel serves it", pid);
        return Channel::kSocket;
      }
    }
    return Channel::kPtrace;
  }
  if (asked == Channel::kAuto && checked.error().code() == Errc::kPtraceDenied) {
    auto ep = channel::find_endpoint(pid);
    if (ep && *ep) {
      REMORA_LOG(kAttach, "pid %d: ptrace refused, the socket channel serves it", pid);
      return Channel::kSocket;
    }
    return channel::with_opt_in_hint(checked.error());
  }
  return std::move(checked).error();
}

// Which channel serves `pid`: a process attached through its socket stays
// on it; otherwise resolve_channel's choice (a process with a session of
// ours was checked when it opened).
Result<Channel> Controller::route(pid_t pid, Channel asked, TargetUse use, const std::string& ctx) {
  if (socket_session(pid) != nullptr) return Channel::kSocket;
  if (asked != Channel::kSocket && vetted(pid)) return Channel::kPtrace;
  return REMORA_TRY_CTX(resolve_channel(pid, asked, use), ctx);
}

Result<ProcessOutcome> Controller::attach_socket(pid_t pid, const AttachOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = "attach to process " + pid_str(pid) + " through its socket channel";
  if (opts.tools.empty()) return Error(Errc::kInvalidArgument, "no tool library given to attach");
  const auto ep = REMORA_TRY_CTX(require_endpoint(pid), ctx);
  auto s = socket_session(pid);
  if (s == nullptr) {
    s = std::make_shared<SocketSession>();
    s->pid = pid;
    s->pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!s->pidfd)
      return Error(Errc::kNoSuchProcess, "process " + pid_str(pid) + " exited", errno).with_context(ctx);
  }
  std::lock_guard lock(s->mu);
  auto files = REMORA_TRY_CTX(open_tools(opts.tools), ctx);
  channel::Request req;
  req.op = REMORA_CHANNEL_OP_ATTACH;
  req.env = encode_env(opts.env);
  if (opts.env.empty()) req.env.clear();
  req.tools = files.list;
  for (const UniqueFd& fd : files.fds) req.tool_fds.push_back(fd.get());
  UniqueFd lease_read, lease_write;
  if (opts.lease) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Error::from_errno("make the lease pipe", errno).with_context(ctx);
    lease_read.reset(p[0]);
    lease_write.reset(p[1]);
    req.lease_fd = lease_read.get();
  }
  auto reply = REMORA_TRY_CTX(channel::call(pid, ep, req, Deadline::after(opts.timeout)), ctx);
  if (reply.result != REMORA_AGENT_OK)
    return Error(detail::errc_for_agent(reply.result), reply.message).with_context(ctx);
  if (opts.lease) s->lease = std::move(lease_write);
  s->attached = true;
  {
    std::lock_guard clock(mu_);
    socket_sessions_[pid] = s;
  }
  REMORA_LOG(kAttach, "pid %d: attached through the socket channel%s", pid,
             opts.lease ? " with its lease" : "");
  ProcessOutcome out;
  out.pid = pid;
  out.ok = true;
  out.channel = Channel::kSocket;
  out.elapsed = std::chrono::steady_clock::now() - t0;
  return out;
}

Result<UnloadReport> Controller::detach_socket(pid_t pid, const DetachOptions& opts) {
  const std::string ctx = "detach from process " + pid_str(pid) + " through its socket channel";
  const auto ep = REMORA_TRY_CTX(require_endpoint(pid), ctx);
  auto s = socket_session(pid);
  std::unique_lock<std::mutex> lock;
  if (s != nullptr) lock = std::unique_lock(s->mu);
  channel::Request req;
  req.op = REMORA_CHANNEL_OP_DETACH;
  auto reply = channel::call(pid, ep, req, Deadline::after(opts.timeout));
  if (s != nullptr) {
    s->lease.reset();  // the detach disarmed it (or the session is over either way)
    s->attached = false;
    lock.unlock();
    std::lock_guard clock(mu_);
    socket_sessions_.erase(pid);
  }
  if (!reply) return std::move(reply).error().with_context(ctx);
  if (reply->result != REMORA_AGENT_OK)
    return Error(detail::errc_for_agent(reply->result), reply->message).with_context(ctx);
  if (opts.unload)
    return Error(Errc::kNotSupported,
                 "the tools were detached, but an agent that was preloaded at launch (the socket channel's "
                 "opt-in) "
                 "stays in the process: detach without --unload")
        .with_context(ctx);
  return UnloadReport{};
}

Result<AgentState> Controller::status(pid_t pid, Channel channel) {
  if (channel != Channel::kSocket) {
    auto st = detail::status_through_memory(pid);
    if (st || channel == Channel::kPtrace) {
      if (st) {
        if (auto ep = channel::find_endpoint(pid); ep && *ep) st->socket = "@" + (*ep)->name;
      }
      return st;
    }
    // Unreadable memory (not dumpable, another uid): the socket, if any.
    auto ep = channel::find_endpoint(pid);
    if (!ep || !*ep) return st;
  }
  REMORA_TRY_CTX(check_target(pid, TargetUse::kRead), "read the state of process " + pid_str(pid));
  const auto ep = REMORA_TRY(require_endpoint(pid));
  channel::Request req;
  auto reply = REMORA_TRY_CTX(channel::call(pid, ep, req, Deadline::after(std::chrono::seconds(10))),
                              "read the state of process " + pid_str(pid) + " through its socket channel");
  return state_from(reply, ep);
}

}  // namespace remora::attach
