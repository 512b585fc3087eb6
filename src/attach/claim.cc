// The attach and detach of an agent of protocol 8 (agent/protocol.h,
// REMORA_AGENT_FEATURE_CLAIM), for controllers that race for one process.
//
// Every result comes back in a remora_agent_call_out on the listener's own
// stack (CallArg::out), never from the info block's message, which another
// controller's call may have overwritten before it is read: a loser names
// the owner the agent refused it for. The lease pipe is the agent's own,
// made within the attach call; the agent keeps its write end until we have
// ours (opened through /proc/PID/fd, and checked to be that pipe by its
// device and inode, never taken by its number alone), and closes it when we
// claim it, or at a deadline if we died first: no instant of our death
// leaves a descriptor in the process, or a lease that cannot expire.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "base/log.h"
#include "remote/target.h"

namespace remora::attach::detail {

namespace {

// A random session token, never 0 (0 means "any session" to the agent).
uint64_t new_token() {
  uint64_t v = 0;
  while (v == 0)
    if (::getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v))
      v = static_cast<uint64_t>(::getpid()) << 32 ^ static_cast<uint64_t>(::time(nullptr));
  return v;
}

// The out record a call wrote on the listener's stack.
remora_agent_call_out out_of(const remote::CallReport& r) {
  remora_agent_call_out out{};
  out.lease_fd = -1;
  if (!r.out.empty() && r.out[0].size() == sizeof out) std::memcpy(&out, r.out[0].data(), sizeof out);
  out.message[sizeof out.message - 1] = '\0';
  return out;
}

Error refusal(const remora_agent_call_out& out, int rc) {
  if (rc == REMORA_AGENT_ERR_BUSY)
    return Error(
        Errc::kAlreadyAttached,
        "the agent's listener stayed busy with other controllers' calls past the deadline: try again");
  if (rc == REMORA_AGENT_ERR_ALREADY_ATTACHED && out.owner_pid != 0)
    return Error(Errc::kAlreadyAttached, std::string(out.message) + "; attach again once it has ended");
  return Error(errc_for_agent(rc), out.message);
}

// Opens our write end of the lease pipe the agent keeps at `fd` for us, and
// checks that it is that pipe (the device and inode the agent named), not
// whatever the number names by now.
Result<UniqueFd> open_write_end(pid_t pid, const remora_agent_call_out& out) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(out.lease_fd);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) return Error::from_errno("open " + path + " (the lease pipe's write end)", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Error::from_errno("stat " + path, errno);
  if (!S_ISFIFO(st.st_mode) || static_cast<uint64_t>(st.st_dev) != out.lease_dev ||
      static_cast<uint64_t>(st.st_ino) != out.lease_ino)
    return Error(Errc::kIo, path + " names another object than the lease pipe the agent made (closed and " +
                                "reused meanwhile)");
  // Blocking again: a write end that never writes needs no O_NONBLOCK, and
  // nothing else is asked of it.
  (void)::fcntl(fd.get(), F_SETFL, 0);
  return fd;
}

}  // namespace

Result<ClaimedAttach> attach_claimed(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                     const CallOptions& on_listener, AttachCall c, bool leased) {
  ClaimedAttach got;
  remora_agent_claim_request req{};
  req.magic = REMORA_AGENT_CLAIM_MAGIC;
  req.size = sizeof req;
  req.flags = leased ? REMORA_AGENT_CLAIM_LEASE : 0;
  // In our pid namespace, the agent watches us: killed before our claim,
  // our lease expires at once rather than at the claim's deadline.
  if (leased && !t.in_nested_pid_ns()) req.flags |= REMORA_AGENT_CLAIM_WATCH_PID;
  req.token = leased ? new_token() : 0;
  req.controller_pid = static_cast<int32_t>(::getpid());
  // Our open and claim follow the call at once; the deadline covers a
  // controller that is slow, and frees the write end of one that died.
  req.claim_ms = static_cast<uint32_t>(std::max<long long>(on_listener.timeout.count(), 1000));
  const auto m = c.retired.mapping();  // size 0 when there is none
  std::vector<CallArg> args = {CallArg::buffer(c.env),
                               CallArg::string(c.list),
                               CallArg::integer(m.start.addr()),
                               CallArg::integer(m.size),
                               CallArg::buffer(std::as_bytes(std::span(&req, 1))),
                               CallArg::out(sizeof(remora_agent_call_out))};
  auto r = call_on_listener(t, agent.attach_claim_fn, args, on_listener);
  // The agent removes our retired scratch within the call (BUSY: not even
  // that; it stays ours, and the handle removes it on return).
  // (A call that failed on our side may still run there: released too.)
  if (!r || static_cast<int32_t>(r->value) != REMORA_AGENT_ERR_BUSY) c.retired.release();
  c.memfds.clear();  // the tools are loaded, or will not be
  if (!r) return std::move(r).error();
  const auto out = out_of(*r);
  const int rc = static_cast<int32_t>(r->value);
  if (rc != REMORA_AGENT_OK) return refusal(out, rc);
  if (!leased) return got;
  got.token = req.token;
  auto fd = open_write_end(pid, out);
  // The claim, whatever the open gave: the agent closes the write end it
  // kept either way; with an inode that is not its pipe's (0: we have none),
  // the lease expires at once and the tools are detached again.
  const uint64_t ino = fd ? out.lease_ino : 0;
  CallArg cargs[] = {CallArg::integer(req.token), CallArg::integer(ino),
                     CallArg::out(sizeof(remora_agent_call_out))};
  auto claimed = call_on_listener(t, agent.claim_lease_fn, cargs, on_listener);
  if (!claimed)
    return std::move(claimed).error().with_context(
        "claim the lease (the agent detaches the tools again unless the claim arrived)");
  const int crc = static_cast<int32_t>(claimed->value);
  // Detached by another controller between our attach and our claim (its
  // write end went with it): an attach that won, whose session is over.
  if (crc == REMORA_AGENT_ERR_NOT_ATTACHED)
    return Error(Errc::kNotAttached,
                 std::string(out_of(*claimed).message) +
                     ": the session this attach made has ended (nothing is attached by it)")
        .with_context("claim the lease");
  if (!fd) return std::move(fd).error().with_context("take the lease (the agent detached the tools again)");
  if (crc != REMORA_AGENT_OK) return refusal(out_of(*claimed), crc).with_context("claim the lease");
  got.lease_fd = std::move(*fd);
  REMORA_LOG(kAttach, "pid %d: lease claimed", pid);
  return got;
}

Result<void> detach_owned(remote::Target& t, const AgentSymbols& agent, const CallOptions& on_listener,
                          uint64_t token) {
  CallArg args[] = {CallArg::integer(token), CallArg::out(sizeof(remora_agent_call_out))};
  auto r = REMORA_TRY(call_on_listener(t, agent.detach_as_fn, args, on_listener));
  const int rc = static_cast<int32_t>(r.value);
  if (rc == REMORA_AGENT_OK) return ok();
  return refusal(out_of(r), rc);
}

}  // namespace remora::attach::detail
