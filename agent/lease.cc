// The lease (agent/protocol.h, remora_agent_attach_leased and
// remora_agent_set_lease): the agent holds the read end of a pipe whose only
// write end the controller holds, and a watcher thread ("remora-lease")
// polls it; EOF means the controller died, and the watcher detaches the
// tools so that they flush their data. Over ptrace and through the socket
// channel alike.
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "agent/internal.h"
#include "agent/protocol.h"

extern "C" {
extern struct remora_agent_info remora_agent_info;
}

namespace remora_agent {
namespace {

// Lease: a pipe whose only write end the controller holds. EOF (POLLHUP)
// means the controller is gone.
int g_lease_fd = -1;
int g_lease_wake = -1;  // eventfd to stop the watcher
pthread_t g_lease_thread;
bool g_lease_running = false;
bool g_lease_stopping = false;  // a disarm is joining the watcher
// An expired watcher does not detach itself: it is joined by the next arm or
// by an unload, so that no thread can still be on its way out of the
// agent's code when the agent's mapping goes.
bool g_lease_unjoined = false;

OwnStack g_lease_stack;

}  // namespace

void* lease_main(void*);

OwnStack& lease_stack() { return g_lease_stack; }

bool lease_running_locked() { return g_lease_running; }

void close_lease_locked() {
  g_lease_running = false;
  close(g_lease_wake);
  close(g_lease_fd);
  g_lease_wake = g_lease_fd = -1;
  remora_agent_info.lease_pid = 0;
}

// Joins an expired watcher (it has released g_lock and only returns).
void join_expired_watcher_locked() {
  if (!g_lease_unjoined) return;
  pthread_join(g_lease_thread, nullptr);
  free_stack(&g_lease_stack);
  g_lease_unjoined = false;
}

void stop_lease_locked() {
  join_expired_watcher_locked();
  if (!g_lease_running) return;
  g_lease_stopping = true;
  uint64_t one = 1;
  (void)!write(g_lease_wake, &one, sizeof one);
  pthread_mutex_unlock(&g_lock);
  pthread_join(g_lease_thread, nullptr);
  free_stack(&g_lease_stack);
  pthread_mutex_lock(&g_lock);
  g_lease_stopping = false;
  close_lease_locked();
}

void* lease_main(void*) {
  // Named apart from the thread that armed it (a new thread takes its
  // creator's name: the listener's, or the socket channel's, whose name
  // a controller looks for).
  pthread_setname_np(pthread_self(), "remora-lease");
  pollfd fds[2] = {{g_lease_fd, POLLIN, 0}, {g_lease_wake, POLLIN, 0}};
  for (;;) {
    int n = poll(fds, 2, -1);
    if (n < 0) continue;                 // EINTR cannot happen (signals blocked), but be safe
    if (fds[1].revents) return nullptr;  // disarmed
    if (fds[0].revents) break;           // EOF: the controller is gone
  }
  pthread_mutex_lock(&g_lock);
  if (g_lease_stopping) {
    // A detach is disarming the lease at this very moment: it joins this
    // thread and closes the lease.
    pthread_mutex_unlock(&g_lock);
    return nullptr;
  }
  const bool forced = remora_agent_info.attached;
  if (forced) detach_all_locked();
  // Expired: nobody will disarm this lease, so it closes itself and the
  // watcher goes (no fd and no thread of ours stays in the process); it is
  // joined later (join_expired_watcher_locked). Closed before it says it
  // expired: a controller reading the block without our lock (remora
  // status) that sees `lease_expired` sees no lease holder any more.
  close_lease_locked();
  if (forced) __atomic_store_n(&remora_agent_info.lease_expired, 1, __ATOMIC_RELEASE);
  g_lease_unjoined = true;
  pthread_mutex_unlock(&g_lock);
  return nullptr;
}

// Is the armed lease's controller still there? Its write end closed shows
// as POLLHUP at once, before the watcher (which needs g_lock) has acted.
bool lease_live_locked() {
  if (!g_lease_running) return false;
  pollfd p = {g_lease_fd, POLLIN, 0};
  return poll(&p, 1, 0) == 0;
}

// Arms a lease on `read_fd` (owned from here on: closed on failure).
int arm_lease_locked(int32_t read_fd, int32_t controller_pid) {
  join_expired_watcher_locked();
  g_lease_fd = read_fd;
  g_lease_wake = eventfd(0, EFD_CLOEXEC);
  if (g_lease_wake < 0 || !start_thread(&g_lease_thread, lease_main, &g_lease_stack)) {
    set_message("cannot start the lease watcher (out of threads or descriptors?)");
    if (g_lease_wake >= 0) close(g_lease_wake);
    close(g_lease_fd);
    g_lease_fd = g_lease_wake = -1;
    return REMORA_AGENT_ERR_LEASE;
  }
  g_lease_running = true;
  remora_agent_info.lease_pid = controller_pid;
  remora_agent_info.lease_expired = 0;
  return REMORA_AGENT_OK;
}

// The child keeps its parent's session (REMORA_AGENT_FEATURE_FORK_LEASE):
// its tools stay attached, and a lease it inherited is armed again here,
// on its own copy of the pipe's read end, with a watcher of its own (the
// parent's did not come along). Returns the controller of that lease, 0
// when there is none to inherit.
int32_t inherit_lease_in_child() {
  const bool inherit = remora_agent_info.attached && g_lease_running && !g_lease_stopping && g_lease_fd >= 0;
  const int32_t controller = inherit ? remora_agent_info.lease_pid : 0;
  // Our copies of the parent's descriptors: the watcher's eventfd always
  // goes, the read end unless the child keeps watching it.
  if (g_lease_wake >= 0) close(g_lease_wake);
  if (!inherit && g_lease_fd >= 0) close(g_lease_fd);
  const int read_fd = inherit ? g_lease_fd : -1;
  g_lease_fd = g_lease_wake = -1;
  g_lease_running = false;
  g_lease_stopping = false;
  g_lease_unjoined = false;  // the parent's watcher is no thread of the child
  remora_agent_info.lease_pid = 0;
  if (!inherit) return 0;
  if (arm_lease_locked(read_fd, controller) != REMORA_AGENT_OK) {
    // No watcher (out of threads): the tools stay attached until the
    // controller, which sees lease_pid 0, arms a lease of its own.
    return 0;
  }
  return controller;
}

}  // namespace remora_agent
