// Protocol 8 entry points (agent/protocol.h, REMORA_AGENT_FEATURE_CLAIM):
// results that are the call's own, and a lease no controller's death can
// leave a descriptor of behind; and the guard every entry point begins with
// (EntryScope, agent/internal.h).
//
// Why: any number of controllers may race for one process. The info
// block's message is one for all of them: between a call's return and the
// controller's read of it, another controller's call may have written its
// own (a loser read "no tools are attached" as the reason of its refusal).
// Here every result is written into the caller's `out`, which the
// controller places on the called thread's own stack. And a lease pipe that
// the controller made in the target by remote calls (pipe2, then its write
// end closed, then handed to the agent) left both ends, or the read end,
// in the process when the controller was killed between those calls; here
// the agent makes the pipe within the attach call, keeps the write end
// until the controller has its own copy (the claim), and closes it at a
// deadline if no claim came.
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent/internal.h"
#include "agent/protocol.h"

#define REMORA_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" {
extern struct remora_agent_info remora_agent_info;
}

namespace remora_agent {

// True while the listener runs an entry point for a remote call. Only the
// listener sets and reads it.
bool g_listener_in_entry = false;

bool on_listener() {
  return static_cast<int32_t>(syscall(SYS_gettid)) ==
         __atomic_load_n(&remora_agent_info.listener_tid, __ATOMIC_ACQUIRE);
}

// The listener runs one entry point at a time. A remote call that seizes it
// while it still runs one (another controller's call that its controller
// let go past its deadline, or died in: the thread finishes it on its own)
// would run a second entry point inside the first, on the same thread,
// under the lock that thread holds: the error-checking g_lock answers
// EDEADLK there, and the second would go on unlocked. So such a call is
// refused at once (BUSY), before any lock, allocation or message, as one
// that meets a handed-off attach is; its controller waits and tries again.
bool enter_entry() {
  if (listener_busy()) return false;
  if (!on_listener()) return true;  // the channel thread: g_lock orders it with the listener
  if (g_listener_in_entry) return false;
  g_listener_in_entry = true;
  return true;
}

void leave_entry() {
  if (on_listener()) g_listener_in_entry = false;
}

namespace {

void clear_out(remora_agent_call_out* out) {
  if (out == nullptr) return;
  memset(out, 0, sizeof *out);
  out->lease_fd = -1;
}

// The call's result into `out`, under g_lock: the message is the one this
// call just wrote (or none).
int fill_out_locked(remora_agent_call_out* out, int rc) {
  rc = finish(rc);
  if (out == nullptr) return rc;
  out->result = rc;
  if (rc != REMORA_AGENT_OK) memcpy(out->message, remora_agent_info.message, sizeof out->message);
  out->message[sizeof out->message - 1] = '\0';
  return rc;
}

// Who holds the session a refusal is about: the live lease's controller.
int32_t holder_locked() { return lease_live_locked() ? remora_agent_info.lease_pid : 0; }

int fill_busy(remora_agent_call_out* out) {
  if (out != nullptr) out->result = REMORA_AGENT_ERR_BUSY;
  return REMORA_AGENT_ERR_BUSY;
}

bool valid_request(const remora_agent_claim_request* req) {
  return req != nullptr && req->magic == REMORA_AGENT_CLAIM_MAGIC && req->size >= sizeof *req &&
         ((req->flags & REMORA_AGENT_CLAIM_LEASE) == 0 || req->token != 0);
}

// The lease an attach asks for: none, a pipe of the agent's own making
// (`own`, with the claim's token and deadline), or the read end of the
// controller's pipe (`given_fd`, the socket channel's; owned from the call on).
struct LeaseAsk {
  bool own = false;
  bool watch_pid = false;  // controller_pid is in our pid namespace: watched
  int given_fd = -1;
  int32_t controller_pid = 0;
  uint64_t token = 0;
  uint32_t claim_ms = 0;
};

// The attach of remora_agent_attach_leased with the lease `ask` (or none),
// under g_lock.
int attach_claim_locked(const void* env_buffer, const char* tool_list, const LeaseAsk& ask,
                        remora_agent_call_out* out) {
  const bool leased = ask.own || ask.given_fd >= 0;
  if (remora_agent_info.unloading || (remora_agent_info.attached && lease_live_locked())) {
    if (ask.given_fd >= 0) close(ask.given_fd);
    // Compare-and-set: the live owner keeps its session and its lease;
    // attach_locked words the refusal.
    if (out != nullptr) out->owner_pid = holder_locked();
    return attach_locked(env_buffer, tool_list);
  }
  if (remora_agent_info.attached && lease_running_locked()) {
    // Its controller is gone and the watcher has not run yet: expire the
    // lease now, as the watcher would have.
    stop_lease_locked();
    detach_all_locked();
    remora_agent_info.lease_expired = 1;
  }
  if (remora_agent_info.attached || !leased) {
    if (ask.given_fd >= 0) close(ask.given_fd);  // attached with no lease: attach_locked says why it refuses
    return attach_locked(env_buffer, tool_list);
  }
  stop_lease_locked();  // none is armed while detached; be sure
  int write_fd = -1;
  uint64_t dev = 0, ino = 0;
  int rc = ask.own ? arm_own_lease_locked(ask.controller_pid, ask.watch_pid, ask.token, ask.claim_ms,
                                          &write_fd, &dev, &ino)
                   : arm_lease_locked(ask.given_fd, ask.controller_pid);
  if (rc != REMORA_AGENT_OK) return rc;
  rc = attach_locked(env_buffer, tool_list);
  if (rc != REMORA_AGENT_OK) {
    stop_lease_locked();  // nothing attached: nothing to lease (the kept write end goes too)
    return rc;
  }
  if (out != nullptr && ask.own) {
    out->lease_fd = write_fd;
    out->lease_dev = dev;
    out->lease_ino = ino;
  }
  return REMORA_AGENT_OK;
}

}  // namespace

int channel_attach(const void* env_buffer, const char* tool_list, int lease_fd, int32_t controller_pid,
                   remora_agent_call_out* out) {
  clear_out(out);
  if (listener_busy()) {
    if (lease_fd >= 0) close(lease_fd);
    return fill_busy(out);
  }
  pthread_mutex_lock(&g_lock);
  LeaseAsk ask;
  ask.given_fd = lease_fd;
  ask.controller_pid = controller_pid;
  int rc = fill_out_locked(out, attach_claim_locked(env_buffer, tool_list, ask, out));
  if (rc == REMORA_AGENT_OK) __atomic_store_n(&remora_agent_info.session_channel, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_lock);
  register_fork_lock();
  return rc;
}

}  // namespace remora_agent

using namespace remora_agent;

// See agent/protocol.h.
REMORA_EXPORT int remora_agent_attach_claim(const void* env_buffer, const char* tool_list, void* scratch,
                                            size_t size, const remora_agent_claim_request* req,
                                            remora_agent_call_out* out) {
  EntryScope entry;
  clear_out(out);
  if (!entry.ok) return fill_busy(out);
  if (scratch != nullptr && size != 0) munmap(scratch, size);
  pthread_mutex_lock(&g_lock);
  int rc;
  if (!valid_request(req)) {
    set_message("malformed attach request (its magic, size or token)");
    rc = REMORA_AGENT_ERR_BAD_ARGUMENT;
  } else {
    LeaseAsk ask;
    ask.own = (req->flags & REMORA_AGENT_CLAIM_LEASE) != 0;
    ask.watch_pid = (req->flags & REMORA_AGENT_CLAIM_WATCH_PID) != 0;
    ask.controller_pid = req->controller_pid;
    ask.token = req->token;
    ask.claim_ms = req->claim_ms;
    rc = attach_claim_locked(env_buffer, tool_list, ask, out);
  }
  rc = fill_out_locked(out, rc);
  pthread_mutex_unlock(&g_lock);
  register_fork_lock();
  return rc;
}

// See agent/protocol.h.
REMORA_EXPORT int remora_agent_claim_lease(uint64_t token, uint64_t ino, remora_agent_call_out* out) {
  EntryScope entry;
  clear_out(out);
  if (!entry.ok) return fill_busy(out);
  pthread_mutex_lock(&g_lock);
  const int rc = fill_out_locked(out, claim_lease_locked(token, ino));
  pthread_mutex_unlock(&g_lock);
  return rc;
}

namespace remora_agent {

int detach_as(uint64_t token, remora_agent_call_out* out) {
  pthread_mutex_lock(&g_lock);
  int rc;
  if (!remora_agent_info.attached) {
    set_message("no tools are attached");
    rc = REMORA_AGENT_ERR_NOT_ATTACHED;
  } else if (token != 0 && lease_token_locked() != token) {
    // This controller's session ended (its lease expired, or another
    // controller detached it) and the tools attached now are another's.
    if (out != nullptr) out->owner_pid = holder_locked();
    set_message(
        "this controller's session has ended already; the tools attached now belong to another "
        "session (remora pid %d)",
        holder_locked());
    rc = REMORA_AGENT_ERR_NOT_ATTACHED;
  } else {
    stop_lease_locked();
    rc = detach_all_locked();
  }
  rc = fill_out_locked(out, rc);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

}  // namespace remora_agent

// See agent/protocol.h.
REMORA_EXPORT int remora_agent_detach_as(uint64_t token, remora_agent_call_out* out) {
  EntryScope entry;
  clear_out(out);
  if (!entry.ok) return fill_busy(out);
  return detach_as(token, out);
}
