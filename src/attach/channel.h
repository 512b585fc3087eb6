// The socket channel, the controller's side (agent/channel_wire.h has the
// protocol, docs/architecture.md "The socket channel" the design): attach,
// detach and status through an opted-in agent's unix socket, with no ptrace
// and no read of the target's memory. Internal to the attach layer.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agent/channel_wire.h"
#include "base/deadline.h"
#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::attach::channel {

// Where a process listens: "@remora-agent.<nspid>.<signo>" in its network
// namespace.
struct Endpoint {
  std::string name;  // without the '@': the abstract name's bytes after its NUL
  pid_t nspid = 0;   // the pid in it, the process's own view
  int signo = 0;     // the wake signal
};

// Parses one /proc/net/unix path column ("@remora-agent.123.60") for
// `nspid`; nullopt when it is not that process's endpoint.
std::optional<Endpoint> parse_endpoint(std::string_view path, pid_t nspid);

// Finds process `pid`'s endpoints (its NSpid's last entry names them,
// listed in /proc/PID/net/unix, or ours when that is unreadable): empty
// when the process did not opt in (or its agent could not bind). A name
// proves nothing (anyone may bind an abstract name): call() connects only
// to one whose listener is `pid` itself.
Result<std::vector<Endpoint>> find_endpoints(pid_t pid);
// The first of them; nullopt: none.
Result<std::optional<Endpoint>> find_endpoint(pid_t pid);

// One thread as the wake's choice sees it (from /proc/PID/task/TID: stat
// and status, which anyone may read, and syscall, which needs ptrace
// access and is often unreadable).
struct ThreadView {
  pid_t tid = 0;
  char state = '?';
  bool blocks_signal = false;  // SigBlk has the wake signal
  bool is_main = false;
  bool channel_thread = false;  // the agent's "remora-channel" runs
  bool syscall_known = false;
  bool running = false;  // syscall file says "running"
  long nr = -1;
  uint64_t args[6] = {};
};

// The thread to send the wake to (0: none can take it), best first: one
// blocked in a call the kernel restarts after a handler (no wait of the
// program's is cut short), one running, a sleeping thread other than the
// main one (a server's event loop is mostly its main thread, its workers
// wait on condition variables), the main thread last. Threads that block the
// signal, are stopped, uninterruptible or exiting are never chosen. `x86`:
// the numbers are x86_64's (else aarch64's).
pid_t choose_wake_thread(std::span<const ThreadView> threads, bool x86);

// The request a call sends.
struct Request {
  uint32_t op = REMORA_CHANNEL_OP_STATUS;
  std::vector<std::byte> env;  // the agent's environment buffer (empty: none)
  std::string tools;           // the tool list, entries NAME|#K
  int lease_fd = -1;           // the lease pipe's read end (sent, not closed)
  std::vector<int> tool_fds;   // descriptor K of the list (sent, not closed)
};

// Connects to the endpoint (from within the process's network namespace
// when it is not ours; another of the process's endpoints when another
// process listens on that name: kRefused when none is the process's own),
// sends the request, wakes the agent when its channel thread is not
// running, and returns the agent's reply.
Result<remora_channel_reply> call(pid_t pid, const Endpoint& ep, const Request& req, Deadline deadline);

// How a process opts in, said in a refusal.
std::string how_to_opt_in();
// A ptrace refusal of a process with no socket, the way in without ptrace
// added to its message (code, errno and context kept).
Error with_opt_in_hint(const Error& refused);

}  // namespace remora::attach::channel
