// The lease (docs/architecture.md, "Leases"): a pipe made in the target
// whose only write end this controller holds, so that the agent sees EOF,
// and detaches the tools, exactly when the controller is gone. Made for the
// attach call (protocol 2) or armed after it (protocol 1).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
// handle's device and inode, which our write end shares) and the agent
// armed no lease for this process with it: closing a number the target has
// reused meanwhile would close one of its own descriptors, a worse harm
// than a leak.
bool read_end_unclaimed(remote::Target& t, uint64_t info_at, const remote::RemoteHandle& read_end,
                        const UniqueFd& ours) {
  struct stat mine {};
  const auto theirs = read_end.identity();
  if (!ours || !theirs || ::fstat(ours.get(), &mine) != 0 || !read_end.still_ours()) return false;
  if (static_cast<uint64_t>(mine.st_dev) != theirs->dev || static_cast<uint64_t>(mine.st_ino) != theirs->ino)
    return false;
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
  // The two numbers come back on the listener's own stack (CallArg::out):
  // in the agent's shared buffer, another controller's pipe2 could
  // overwrite them before they are read, and this controller would then
  // take, and close, that controller's descriptors.
  CallArg pargs[] = {CallArg::out(8), CallArg::integer(O_CLOEXEC)};
  auto p = REMORA_TRY(t.call_symbol("libc.so.6", "pipe2", pargs, on_listener));
  if (p.value != 0)
    return Error(Errc::kIo,
                 "pipe2 failed in the target: it may be out of file descriptors (see its RLIMIT_NOFILE); "
                 "attach without a lease (remora attach --keep) to go on without one");
  int32_t fds[2] = {-1, -1};
  if (p.out.size() == 1 && p.out[0].size() == sizeof fds) std::memcpy(fds, p.out[0].data(), sizeof fds);
  // Each end is known by what it is (the handle's identity), and both name
  // one pipe: the numbers alone could name anything by now.
  remote::RemoteHandle read_end = remote::RemoteHandle::fd(t, fds[0], on_listener);
  remote::RemoteHandle write_end = remote::RemoteHandle::fd(t, fds[1], on_listener);
  const auto r_id = read_end.identity(), w_id = write_end.identity();
  if (!r_id || !w_id || !(*r_id == *w_id)) {
    read_end.release();  // not provably ours: neither is closed
    write_end.release();
    return Error(Errc::kIo, "the lease pipe's descriptors " + std::to_string(fds[0]) + " and " +
                                std::to_string(fds[1]) + " of process " + std::to_string(pid) +
                                " no longer name one pipe (closed by the process meanwhile?)");
  }
  std::string wpath = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fds[1]);
  lease_fd->reset(::open(wpath.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK));
  int open_errno = errno;
  struct stat opened {};
  if (*lease_fd &&
      (::fstat(lease_fd->get(), &opened) != 0 || static_cast<uint64_t>(opened.st_ino) != w_id->ino ||
       static_cast<uint64_t>(opened.st_dev) != w_id->dev)) {
    lease_fd->reset();  // the number was reused between the check and the open
    open_errno = ESTALE;
  }
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
void hand_over_read_end(remote::Target& t, pid_t, uint64_t info_at, bool call_ran,
                        remote::RemoteHandle& read_end, const UniqueFd& lease_fd) {
  if (call_ran || !read_end_unclaimed(t, info_at, read_end, lease_fd)) read_end.release();
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
