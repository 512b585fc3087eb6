// The fuzzer's raw client and its target program (fuzz_client.h).
#include "fuzz_client.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

extern char** environ;

namespace remora::fuzz {

namespace {

int poll_ms(const Deadline& d, std::chrono::milliseconds most) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(d.remaining());
  return static_cast<int>(std::min(left, most).count());
}

// Our environment without the variables that would change the target's
// agent, then the preload and the opt-in.
std::vector<std::string> target_environment(const std::string& agent) {
  static const char* const kDropped[] = {"LD_PRELOAD=",         "REMORA_TOOL_ATTACH=", "ROCP_TOOL_ATTACH=",
                                         "REMORA_WAKE_SIGNAL=", "REMORA_ATTACH_UIDS=", "REMORA_HOOK_LOG="};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (std::none_of(std::begin(kDropped), std::end(kDropped),
                     [&](const char* p) { return v.starts_with(p); }))
      env.emplace_back(v);
  }
  env.push_back("LD_PRELOAD=" + agent);
  env.push_back("REMORA_TOOL_ATTACH=1");
  return env;
}

// Puts `fd` at `target` in a child about to exec, without close-on-exec.
void place(int fd, int target) {
  if (fd == target)
    ::fcntl(fd, F_SETFD, 0);
  else
    ::dup2(fd, target);
}

}  // namespace

// ---- the target ----

Target::Target(const std::string& program, const std::string& agent) {
  int ready[2], in[2], out[2];
  if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    error_ = std::string("pipe: ") + std::strerror(errno);
    return;
  }
  std::vector<std::string> env = target_environment(agent);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string prog = program, ready_arg = "3";
  char* argv[] = {prog.data(), ready_arg.data(), nullptr};
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(126);
    place(in[0], 0);
    place(out[1], 1);
    place(ready[1], 3);
    ::execve(prog.c_str(), argv, envp.data());
    _exit(127);
  }
  UniqueFd ready_read(ready[0]);
  ::close(ready[1]);
  ::close(in[0]);
  ::close(out[1]);
  stdin_.reset(in[1]);
  stdout_.reset(out[0]);
  if (pid_ < 0) {
    error_ = std::string("fork: ") + std::strerror(errno);
    return;
  }
  pidfd_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  // "ready <reader tid>\n", or EOF if it died first.
  std::string line;
  const Deadline d = Deadline::after(std::chrono::seconds(20));
  while (line.find('\n') == std::string::npos && !d.expired()) {
    pollfd p{ready_read.get(), POLLIN, 0};
    if (::poll(&p, 1, poll_ms(d, std::chrono::milliseconds(1000))) <= 0) continue;
    char buf[64];
    const ssize_t n = ::read(ready_read.get(), buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  if (line.rfind("ready ", 0) != 0 || line.find('\n') == std::string::npos) {
    error_ = "the target did not say ready (got '" + line + "', " + how_it_ended() + ")";
    return;
  }
  reader_tid_ = static_cast<pid_t>(std::atoi(line.c_str() + 6));
  if (reader_tid_ <= 0) error_ = "the target's ready line names no thread: " + line;
}

Target::~Target() {
  stdin_.reset();
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

bool Target::alive() {
  if (pid_ <= 0 || reaped_) return false;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    reaped_ = true;
    status_ = st;
    return false;
  }
  return true;
}

std::string Target::how_it_ended() const {
  if (!reaped_) return "running";
  if (WIFEXITED(status_)) return "exited " + std::to_string(WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status_));
  return "status " + std::to_string(status_);
}

bool Target::wait_exit(Deadline d) {
  while (alive()) {
    if (d.expired()) return false;
    pollfd p{pidfd_.get(), POLLIN, 0};
    ::poll(&p, 1, poll_ms(d, std::chrono::milliseconds(1000)));
  }
  return reaped_;
}

std::string Target::read_stdout(Deadline d) {
  std::string out;
  while (stdout_ && !d.expired()) {
    pollfd p{stdout_.get(), POLLIN, 0};
    if (::poll(&p, 1, poll_ms(d, std::chrono::milliseconds(1000))) <= 0) continue;
    char buf[512];
    const ssize_t n = ::read(stdout_.get(), buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// ---- the raw client ----

RawClient::RawClient(pid_t pid, pid_t reader_tid, attach::channel::Endpoint ep)
    : pid_(pid),
      reader_tid_(reader_tid),
      ep_(std::move(ep)),
      devnull_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

bool RawClient::channel_running() const {
  const std::string dir = "/proc/" + std::to_string(pid_) + "/task";
  UniqueDir d(::opendir(dir.c_str()));
  if (!d) return false;
  while (const dirent* e = ::readdir(d.get())) {
    if (e->d_name[0] == '.') continue;
    UniqueFd comm(::open((dir + "/" + e->d_name + "/comm").c_str(), O_RDONLY | O_CLOEXEC));
    char buf[32] = {};
    if (comm && ::read(comm.get(), buf, sizeof buf - 1) > 0 &&
        std::strncmp(buf, REMORA_CHANNEL_THREAD_NAME "\n", sizeof REMORA_CHANNEL_THREAD_NAME) == 0)
      return true;
  }
  return false;
}

bool RawClient::wait_channel_gone(Deadline d) const {
  // A thread's exit has no handshake to wait on: /proc is polled.
  while (channel_running()) {
    if (d.expired()) return false;
    ::poll(nullptr, 0, 20);
  }
  return true;
}

void RawClient::wake() {
  const pid_t tid = ++wakes_ % 5 == 0 ? reader_tid_ : pid_;
  ::syscall(SYS_tgkill, pid_, tid, ep_.signo);
}

// Sends all of `bytes`, the descriptors with the first byte; false once
// the agent stopped reading (it answered and closed).
bool RawClient::send_all(int sock, const std::string& bytes, const std::vector<int>& fds) {
  size_t at = 0;
  if (!fds.empty() && !bytes.empty()) {
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr) return false;
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    ssize_t n;
    do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    at = static_cast<size_t>(n);
  }
  while (at < bytes.size()) {
    const ssize_t n = ::send(sock, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

UniqueFd RawClient::open(const Wire& w) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock) return sock;
  timeval tv{10, 0};  // a full backlog blocks connect, a full buffer send
  ::setsockopt(sock.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, ep_.name.data(), std::min(ep_.name.size(), sizeof addr.sun_path - 2));
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + ep_.name.size());
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return UniqueFd();
  std::vector<UniqueFd> made;
  std::vector<int> fds;
  for (FdKind k : w.fds) {
    if (k == FdKind::kDevNull) {
      fds.push_back(devnull_.get());
      continue;
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return UniqueFd();
    made.emplace_back(p[0]);
    made.emplace_back(p[1]);
    fds.push_back(k == FdKind::kPipeRead ? p[0] : p[1]);
  }
  bool first = true;
  for (const std::string& piece : w.pieces) {
    if (piece.empty()) continue;
    if (!send_all(sock.get(), piece, first ? fds : std::vector<int>{})) break;
    first = false;
  }
  if (w.finish) ::shutdown(sock.get(), SHUT_WR);
  return sock;
}

Outcome RawClient::finish(int sock, Deadline d) {
  Outcome o;
  o.connected = true;
  auto* reply = reinterpret_cast<char*>(&o.reply);
  if (!channel_running()) wake();
  while (!d.expired()) {
    pollfd p{sock, POLLIN, 0};
    const int n = ::poll(&p, 1, poll_ms(d, std::chrono::milliseconds(100)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (n == 0) {
      // Nothing yet: a wake lost to a channel thread that was leaving.
      if (o.got == 0 && !channel_running()) wake();
      continue;
    }
    char scratch[256];
    const bool in_reply = o.got < sizeof o.reply;
    const ssize_t k = in_reply ? ::recv(sock, reply + o.got, sizeof o.reply - o.got, 0)
                               : ::recv(sock, scratch, sizeof scratch, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      o.closed = true;  // EOF, or ECONNRESET: it closed with bytes of ours unread
      break;
    }
    (in_reply ? o.got : o.extra) += static_cast<size_t>(k);
  }
  o.reply.tools[sizeof o.reply.tools - 1] = '\0';
  o.reply.message[sizeof o.reply.message - 1] = '\0';
  return o;
}

Outcome RawClient::exchange(const Wire& w, Deadline d) {
  UniqueFd sock = open(w);
  if (!sock) return Outcome{};
  if (w.abandon) {
    Outcome o;
    o.connected = true;
    return o;
  }
  return finish(sock.get(), d);
}

int count_fds(pid_t pid) {
  UniqueDir d(::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str()));
  if (!d) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d.get()))
    if (e->d_name[0] != '.') ++n;
  return n;
}

}  // namespace remora::fuzz
