// The socket channel, the controller's side (channel.h).
#include "attach/channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "arch/wake_rules.h"
#include "base/log.h"
#include "procfs/procfs.h"

namespace remora::attach::channel {

namespace {

constexpr std::string_view kPrefix = REMORA_CHANNEL_NAME_PREFIX;

template <typename T>
bool parse_int(std::string_view s, T* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// The pid a process calls itself: the last entry of its NSpid line.
Result<pid_t> own_view_pid(pid_t pid) {
  auto st = REMORA_TRY(procfs::read_status(pid));
  return st.nspid.empty() ? pid : st.nspid.back();
}

// Are we in process `pid`'s network namespace? Unknown (its ns link
// unreadable: not dumpable, another uid) counts as yes: the abstract name
// is then looked up in ours, as the listing we could read was.
bool same_netns(pid_t pid) {
  struct stat a {
  }, b{};
  if (::stat(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), &a) != 0) return true;
  if (::stat("/proc/self/ns/net", &b) != 0) return true;
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

// A unix socket made in `pid`'s network namespace: abstract names are per
// namespace, and a socket resolves them in the one it was made in. A
// thread of ours enters it (setns changes the calling thread only).
Result<UniqueFd> socket_in_netns_of(pid_t pid) {
  if (same_netns(pid)) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Error::from_errno("socket", errno);
    return UniqueFd(fd);
  }
  int fd = -1, err = 0;
  std::thread([&] {
    UniqueFd ns(::open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns) {
      err = errno;
      return;
    }
    if (::setns(ns.get(), CLONE_NEWNET) != 0) {
      err = errno;
      return;
    }
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) err = errno;
  }).join();
  if (fd < 0)
    return Error(Errc::kRefused,
                 "cannot enter the network namespace of process " + std::to_string(pid) +
                     " to reach its socket channel (" + std::strerror(err) +
                     "): run remora as root, or from inside that namespace",
                 err);
  return UniqueFd(fd);
}

Result<void> send_request(int sock, const Request& req) {
  remora_channel_request head{};
  head.magic = REMORA_CHANNEL_MAGIC;
  head.version = REMORA_CHANNEL_VERSION;
  head.op = req.op;
  head.flags = req.lease_fd >= 0 ? REMORA_CHANNEL_FLAG_LEASE : 0;
  head.env_size = static_cast<uint32_t>(req.env.size());
  head.tools_size = req.tools.empty() ? 0 : static_cast<uint32_t>(req.tools.size() + 1);
  head.controller_pid = static_cast<int32_t>(::getpid());
  std::vector<int> fds;
  if (req.lease_fd >= 0) fds.push_back(req.lease_fd);
  fds.insert(fds.end(), req.tool_fds.begin(), req.tool_fds.end());
  if (fds.size() > REMORA_CHANNEL_FDS_MAX || req.env.size() > REMORA_CHANNEL_ENV_MAX ||
      req.tools.size() >= REMORA_CHANNEL_TOOLS_MAX)
    return Error(Errc::kInvalidArgument,
                 "too many tools or too long an environment for the socket channel (at "
                 "most 16 tools, a 4 KiB tool list and an 8 KiB environment)");
  head.fd_count = static_cast<uint32_t>(fds.size());
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  iovec iov{&head, sizeof head};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  if (::sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof head))
    return Error::from_errno("send the request to the socket channel", errno);
  auto send_all = [&](const void* p, size_t n) -> Result<void> {
    const char* b = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t k = ::send(sock, b, n, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return Error::from_errno("send the request to the socket channel", errno);
      b += k;
      n -= static_cast<size_t>(k);
    }
    return ok();
  };
  REMORA_TRY(send_all(req.env.data(), req.env.size()));
  if (!req.tools.empty()) REMORA_TRY(send_all(req.tools.c_str(), req.tools.size() + 1));
  return ok();
}

// The threads of `pid` as the wake's choice needs them, and whether the
// agent's channel thread runs already.
std::vector<ThreadView> read_threads(pid_t pid, int signo, bool* channel_running) {
  std::vector<ThreadView> out;
  *channel_running = false;
  auto tasks = procfs::list_tasks(pid);
  if (!tasks) return out;
  for (pid_t tid : *tasks) {
    auto st = procfs::read_status(pid, tid);
    if (!st) continue;
    ThreadView v;
    v.tid = tid;
    v.state = st->state;
    v.blocks_signal = ((st->sig_blk >> (signo - 1)) & 1) != 0;
    v.is_main = tid == pid;
    v.channel_thread = st->name == REMORA_CHANNEL_THREAD_NAME;
    if (v.channel_thread && v.state != 'Z' && v.state != 'X') *channel_running = true;
    if (auto sc = procfs::read_syscall(pid, tid)) {
      v.syscall_known = true;
      v.running = sc->running;
      v.nr = static_cast<long>(sc->nr);
      for (int i = 0; i < 6; ++i) v.args[i] = sc->args[static_cast<size_t>(i)];
    }
    out.push_back(v);
  }
  return out;
}

// Sends the wake signal to the thread choose_wake_thread picks.
Result<void> wake(pid_t pid, int signo, bool* sent) {
  *sent = false;
  bool running = false;
  auto threads = read_threads(pid, signo, &running);
  if (running) return ok();
  const pid_t tid = choose_wake_thread(threads, arch::wake::kHostArch == arch::wake::Arch::kX86_64);
  if (tid == 0)
    return Error(Errc::kNotSupported, "no thread of process " + std::to_string(pid) +
                                          " can take the wake signal " + std::to_string(signo) +
                                          " (every thread blocks it, or is stopped): start the program with "
                                          "REMORA_WAKE_SIGNAL=N, N a real-time signal it leaves unblocked");
  if (::syscall(SYS_tgkill, pid, tid, signo) != 0) {
    const int err = errno;
    if (err == ESRCH) return ok();  // that thread ended; the next round picks another
    return Error(
        Errc::kRefused,
        "uid " + std::to_string(::geteuid()) + " cannot send the wake signal to process " +
            std::to_string(pid) + " (" + std::strerror(err) +
            "): its socket channel is woken by a signal, which only its own uid, root or CAP_KILL may "
            "send; run remora as the process's uid or as root",
        err);
  }
  REMORA_LOG(kAttach, "pid %d: wake signal %d sent to thread %d", pid, signo, tid);
  *sent = true;
  return ok();
}

Result<remora_channel_reply> read_reply(int sock, pid_t pid, int signo, Deadline deadline) {
  remora_channel_reply reply{};
  auto* p = reinterpret_cast<char*>(&reply);
  size_t got = 0;
  // Woken again while no byte came and no channel thread runs (a wake whose
  // handler found no thread to start it on): after 100 ms, then twice as
  // long each time up to 1 s, so that a slow machine, where the thread is
  // only starting, gets few extra signals (each one interrupts a thread).
  auto wake_gap = std::chrono::milliseconds(100);
  auto next_wake = Deadline::after(wake_gap);
  while (got < sizeof reply) {
    if (deadline.expired())
      return Error(Errc::kTimedOut,
                   "process " + std::to_string(pid) +
                       " did not answer on its socket channel in time (its agent woke no thread: "
                       "every thread may be stopped, or it left the wake signal " +
                       std::to_string(signo) + " to a handler of its own)");
    const auto wait = std::min(deadline.remaining(), next_wake.remaining());
    pollfd pf{sock, POLLIN, 0};
    const int n =
        ::poll(&pf, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("wait for the socket channel", errno);
    if (n == 0) {
      if (got == 0 && next_wake.expired()) {
        bool sent = false;
        REMORA_TRY(wake(pid, signo, &sent));
        wake_gap = std::min(wake_gap * 2, std::chrono::milliseconds(1000));
        next_wake = Deadline::after(wake_gap);
      }
      continue;
    }
    const ssize_t k = ::recv(sock, p + got, sizeof reply - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return Error(Errc::kIo,
                   "process " + std::to_string(pid) + " closed its socket channel before it answered");
    got += static_cast<size_t>(k);
  }
  if (reply.magic != REMORA_CHANNEL_MAGIC || reply.version != REMORA_CHANNEL_VERSION)
    return Error(Errc::kNotSupported,
                 "process " + std::to_string(pid) + " answered its socket channel with version " +
                     std::to_string(reply.version) + "; this remora speaks version " +
                     std::to_string(REMORA_CHANNEL_VERSION) + ": use the remora that matches its agent");
  reply.tools[sizeof reply.tools - 1] = '\0';
  reply.message[sizeof reply.message - 1] = '\0';
  return reply;
}

}  // namespace

std::optional<Endpoint> parse_endpoint(std::string_view path, pid_t nspid) {
  if (path.empty() || path[0] != '@') return std::nullopt;
  path.remove_prefix(1);
  if (!path.starts_with(kPrefix)) return std::nullopt;
  std::string_view rest = path.substr(kPrefix.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  pid_t p = 0;
  int sig = 0;
  if (!parse_int(rest.substr(0, dot), &p) || !parse_int(rest.substr(dot + 1), &sig)) return std::nullopt;
  if (p != nspid || sig < 32 || sig > 64) return std::nullopt;
  return Endpoint{std::string(path), p, sig};
}

Result<std::vector<Endpoint>> find_endpoints(pid_t pid) {
  const pid_t nspid = REMORA_TRY(own_view_pid(pid));
  std::vector<Endpoint> out;
  auto table = procfs::read_text("/proc/" + std::to_string(pid) + "/net/unix");
  if (!table) table = procfs::read_text("/proc/self/net/unix");
  if (!table) return out;
  std::string_view all = *table;
  for (size_t at = 0; at < all.size();) {
    const size_t end = std::min(all.find('\n', at), all.size());
    std::string_view line = all.substr(at, end - at);
    at = end + 1;
    const size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos) continue;
    auto ep = parse_endpoint(line.substr(sp + 1), nspid);
    if (!ep) continue;
    bool seen = false;  // a listening socket and its connections share the name
    for (const Endpoint& e : out) seen = seen || e.name == ep->name;
    if (!seen) out.push_back(*ep);
  }
  return out;
}

Result<std::optional<Endpoint>> find_endpoint(pid_t pid) {
  auto all = REMORA_TRY(find_endpoints(pid));
  if (all.empty()) return std::optional<Endpoint>();
  return std::optional<Endpoint>(all.front());
}

pid_t choose_wake_thread(std::span<const ThreadView> threads, bool x86) {
  const auto arch = x86 ? arch::wake::Arch::kX86_64 : arch::wake::Arch::kAarch64;
  pid_t best = 0;
  int best_score = 0;
  for (const ThreadView& t : threads) {
    if (t.blocks_signal || t.channel_thread) continue;
    int score = 0;
    switch (t.state) {
      case 'R': score = 4; break;
      case 'S':
        if (t.syscall_known && !t.running && arch::wake::restartable_wait(arch, t.nr, t.args))
          score = 5;
        else if (t.syscall_known)
          score = 1;  // a wait that EINTR would cut short: the agent repairs it where it can
        else
          score = t.is_main ? 2 : 3;
        break;
      default: continue;  // D, T, t, Z, X: it would take the signal late, or never
    }
    if (score > best_score) {
      best = t.tid;
      best_score = score;
    }
  }
  return best;
}

namespace {

// A connection to `ep` in `pid`'s network namespace whose listener is
// process `pid` itself (SO_PEERCRED, which the kernel gives in our pid
// namespace): an abstract name can be bound by anyone, and a socket that
// only carries the name must get neither the request nor the wake (its
// signal number is the impostor's choice, and would be sent to `pid`).
Result<UniqueFd> connect_to(pid_t pid, const Endpoint& ep, Deadline deadline) {
  UniqueFd sock = REMORA_TRY(socket_in_netns_of(pid));
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline.remaining());
  timeval tv{static_cast<time_t>(left.count() / 1000000), static_cast<suseconds_t>(left.count() % 1000000)};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, ep.name.data(), std::min(ep.name.size(), sizeof addr.sun_path - 2));
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + ep.name.size());
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    return Error(err == ECONNREFUSED ? Errc::kNotAttached : Errc::kIo,
                 "cannot connect to the socket channel of process " + std::to_string(pid) + " (@" + ep.name +
                     ": " + std::strerror(err) + ")",
                 err);
  }
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0)
    return Error::from_errno("read the peer of @" + ep.name, errno);
  if (cred.pid != pid)
    return Error(Errc::kRefused, "the socket @" + ep.name + " is not process " + std::to_string(pid) +
                                     "'s: process " + std::to_string(cred.pid) +
                                     " listens on it (it took the name); nothing was sent to either");
  return sock;
}

}  // namespace

Result<remora_channel_reply> call(pid_t pid, const Endpoint& given, const Request& req, Deadline deadline) {
  // The endpoint found first, or, when another process holds that name,
  // another one the process listens on (its own, bound before or after).
  Endpoint ep = given;
  auto connected = connect_to(pid, ep, deadline);
  if (!connected && connected.error().code() == Errc::kRefused) {
    auto others = find_endpoints(pid);
    for (const Endpoint& other : others ? *others : std::vector<Endpoint>{}) {
      if (other.name == given.name) continue;
      if (auto c = connect_to(pid, other, deadline)) {
        ep = other;
        connected = std::move(c);
        break;
      }
    }
  }
  if (!connected) return std::move(connected).error();
  UniqueFd sock = std::move(*connected);
  if (auto s = send_request(sock.get(), req); !s) {
    // The agent may have answered before it read the request (a uid it
    // refuses) and closed: its reply is still there to read.
    const int err = s.error().sys_errno();
    if (err == EPIPE || err == ECONNRESET)
      if (auto early = read_reply(sock.get(), pid, ep.signo, Deadline::after(std::chrono::milliseconds(500))))
        return early;
    return std::move(s).error();
  }
  bool sent = false;
  REMORA_TRY(wake(pid, ep.signo, &sent));
  return read_reply(sock.get(), pid, ep.signo, deadline);
}

Error with_opt_in_hint(const Error& refused) {
  Error hinted(refused.code(), refused.message() + "; or, " + how_to_opt_in(), refused.sys_errno());
  for (const std::string& c : refused.context()) hinted.with_context(c);
  return hinted;
}

std::string how_to_opt_in() {
  return "to attach without ptrace, start the program with `remora run --listen -- PROG` (or with "
         "libremora-agent.so in LD_PRELOAD and REMORA_TOOL_ATTACH=1): remora then attaches through its "
         "socket "
         "channel";
}

}  // namespace remora::attach::channel
