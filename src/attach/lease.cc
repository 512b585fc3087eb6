// The lease (docs/architecture.md, "Leases"): a pipe made in the target
// whose only write end this controller holds, so that the agent sees EOF,
// and detaches the tools, exactly when the controller is gone. Made for the
// attach call (protocol 2) or armed after it (protocol 1).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "base/unique_fd.h"
#include "remote/remote_handle.h"
#include "remote/target.h"

namespace remora::attach::detail {

namespace {

// After a lease call that failed on our side, is the read end still ours
// to close? Only when the target's descriptor still names our pipe (the
// inode of our write end) and the agent armed no lease for this process with
// it: closing a number the target has reused meanwhile would close one of
// its own descriptors, a worse harm than a leak.
bool read_end_unclaimed(remote::Target& t, pid_t pid, uint64_t info_at, int read_fd, const UniqueFd& ours) {
  struct stat mine {
  }, theirs{};
  std::string rpath = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(read_fd);
  if (!ours || ::fstat(ours.get(), &mine) != 0 || ::stat(rpath.c_str(), &theirs) != 0) return false;
  if (mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino) return false;
  auto info = read_info(t, info_at);
  return info && info->lease_pid != getpid();
}

}  // namespace

// Makes a lease pipe in the target, whose write end we reopen (into
// `lease_fd`) through /proc/PID/fd and then close in the target, so that the
// agent sees EOF exactly when this controller is gone, whatever pid
// namespace separates us. Returns the read end, owned until the agent takes
// it: no failure leaves either end open in the target. (A controller killed
// between the pipe2 and the agent's taking the read end leaves that one
// descriptor; nothing is attached then.)
Result<remote::RemoteHandle> make_lease_pipe(remote::Target& t, pid_t pid, const CallOptions& on_listener,
                                             UniqueFd* lease_fd) {
  auto fds_at = REMORA_TRY(t.scratch_alloc(8));
  CallArg pargs[] = {CallArg::integer(fds_at.addr()), CallArg::integer(O_CLOEXEC)};
  auto p = REMORA_TRY(t.call_symbol("libc.so.6", "pipe2", pargs, on_listener));
  if (p.value != 0)
    return Error(Errc::kIo,
                 "pipe2 failed in the target: it may be out of file descriptors (see its RLIMIT_NOFILE); "
                 "attach without a lease (remora attach --keep) to go on without one");
  int32_t fds[2] = {-1, -1};
  // (Should this read fail, the numbers are unknown: nothing can close them.)
  REMORA_TRY_CTX(t.read(fds_at, std::as_writable_bytes(std::span(fds, 2))),
                 "read the lease pipe's descriptors");
  remote::RemoteHandle read_end = remote::RemoteHandle::fd(t, fds[0], on_listener);
  remote::RemoteHandle write_end = remote::RemoteHandle::fd(t, fds[1], on_listener);
  std::string wpath = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fds[1]);
  lease_fd->reset(::open(wpath.c_str(), O_WRONLY | O_CLOEXEC));
  const int open_errno = errno;
  // Ours must be the only write end: were the target's left open, the lease
  // could never expire.
  if (auto closed = write_end.reset(); !closed) {
    lease_fd->reset();
    return std::move(closed).error().with_context("close the target's write end of the lease pipe");
  }
  if (!*lease_fd) return Error::from_errno("open " + wpath, open_errno);
  return read_end;
}

// After a call that hands the read end to the agent: the agent owns it once
// its function ran, whatever it returned (it closes it when it refuses or
// cannot arm the lease). A call that failed on our side may or may not have
// run: the handle keeps the read end only while it is provably unclaimed.
void hand_over_read_end(remote::Target& t, pid_t pid, uint64_t info_at, bool call_ran,
                        remote::RemoteHandle& read_end, const UniqueFd& lease_fd) {
  if (call_ran || !read_end_unclaimed(t, pid, info_at, read_end.fd(), lease_fd)) read_end.release();
}

namespace {

// Arms a lease through the agent's `lease_fn` after the attach: the order of
// an agent of protocol 1, which has no leased attach.
Result<void> arm_lease(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                       const CallOptions& on_listener, UniqueFd* lease_fd) {
  auto read_end = REMORA_TRY(make_lease_pipe(t, pid, on_listener, lease_fd));
  const int read_fd = read_end.fd();
  CallArg largs[] = {CallArg::integer(static_cast<uint64_t>(read_fd)),
                     CallArg::integer(static_cast<uint64_t>(getpid()))};
  auto l = fault_injected("lease-call")
               ? Result<remote::CallReport>(Error(Errc::kIo,
                                                  "call the agent's lease entry point: fault injected by "
                                                  "REMORA_INJECT_FAULT=lease-call"))
               : t.call(RemoteAddr(agent.lease_fn), largs, on_listener);
  hand_over_read_end(t, pid, agent.info, l.ok(), read_end, *lease_fd);
  if (!l || l->value != 0) {
    lease_fd->reset();  // a lease armed all the same expires at once: its tools detach
    if (!l) return std::move(l).error();
    return Error(Errc::kIo, "the agent could not arm the lease");
  }
  return ok();
}

}  // namespace

// Arms the lease of an attach that succeeded. When it cannot be armed, the
// tools are detached again: attached without a lease they would outlive this
// controller for good, and a failed attach must leave nothing attached.
Result<void> arm_lease_or_detach(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                 const CallOptions& on_listener, UniqueFd* lease_fd, const std::string& ctx) {
  auto armed = arm_lease(t, pid, agent, on_listener, lease_fd);
  if (armed) return ok();
  Error e = std::move(armed).error().with_context("arm the lease");
  if (e.code() == Errc::kTargetExited || e.code() == Errc::kNoSuchProcess)
    return std::move(e).with_context(ctx);
  auto d = t.call(RemoteAddr(agent.detach_fn), {}, on_listener);
  if (!d || static_cast<int32_t>(d->value) != REMORA_AGENT_OK)
    return std::move(e).with_context(ctx + " (the tools could not be detached again: run remora detach -p " +
                                     std::to_string(pid) + ")");
  return std::move(e).with_context(ctx + " (the tools were detached again)");
}

}  // namespace remora::attach::detail
