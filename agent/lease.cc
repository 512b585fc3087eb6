// The lease (agent/protocol.h, remora_agent_attach_leased and
// remora_agent_set_lease): the agent holds the read end of a pipe whose only
// write end the controller holds, and a watcher thread ("remora-lease")
// polls it; EOF means the controller died, and the watcher detaches the
// tools so that they flush their data. Over ptrace and through the socket
// channel alike.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
// Signalled when that disarm is over (g_lease_stopping false again).
pthread_cond_t g_lease_stopped = PTHREAD_COND_INITIALIZER;
// An expired watcher does not detach itself: it is joined by the next arm or
// by an unload, so that no thread can still be on its way out of the
// agent's code when the agent's mapping goes.
bool g_lease_unjoined = false;
// Protocol 8 (remora_agent_attach_claim): the lease pipe's write end the
// agent made and keeps until the controller of g_claim_token claims it (it
// opened its own through /proc/PID/fd), or g_claim_until (monotonic ms)
// passes: the watcher then closes it, and a controller that died before
// its claim sees its lease expire. g_claim_until is read by the watcher
// without g_lock (to time its poll); written under it.
int g_claim_fd = -1;
// A pidfd of the claiming controller, when it is in our pid namespace: its
// exit closes the kept write end at once. Open until the lease is closed.
int g_claim_pidfd = -1;
uint64_t g_claim_token = 0;
uint64_t g_claim_until = 0;
// The armed lease's token (0: none, or a pipe the controller made).
uint64_t g_lease_token = 0;

OwnStack g_lease_stack;

void drop_claim_locked() {
  if (g_claim_fd >= 0) close(g_claim_fd);
  g_claim_fd = -1;
  g_claim_token = 0;
  __atomic_store_n(&g_claim_until, 0, __ATOMIC_RELEASE);
}

// The watcher's poll timeout: until the pending claim's deadline, else none.
int claim_timeout_ms() {
  const uint64_t until = __atomic_load_n(&g_claim_until, __ATOMIC_ACQUIRE);
  if (until == 0) return -1;
  const uint64_t now = monotonic_ms();
  return now >= until ? 0 : static_cast<int>(until - now > INT_MAX ? INT_MAX : until - now);
}

// The claim's deadline passed (the watcher's poll timed out): the kept write
// end goes, unless it was claimed meanwhile. The read end then reads EOF,
// and the lease expires as for a controller that died.
void expire_claim(bool controller_gone) {
  pthread_mutex_lock(&g_lock);
  const uint64_t until = __atomic_load_n(&g_claim_until, __ATOMIC_ACQUIRE);
  if (g_claim_fd >= 0 && until != 0 && (controller_gone || monotonic_ms() >= until)) drop_claim_locked();
  pthread_mutex_unlock(&g_lock);
}

}  // namespace

void* lease_main(void*);

OwnStack& lease_stack() { return g_lease_stack; }

bool lease_running_locked() { return g_lease_running; }

void close_lease_locked() {
  g_lease_running = false;
  close(g_lease_wake);
  close(g_lease_fd);
  g_lease_wake = g_lease_fd = -1;
  drop_claim_locked();
  if (g_claim_pidfd >= 0) close(g_claim_pidfd);
  g_claim_pidfd = -1;
  g_lease_token = 0;
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
  // Another thread (the listener, or the socket channel's) is disarming
  // this very lease, with g_lock released while it joins the watcher. A
  // second join of one thread is undefined: glibc's joiner sleeps on the
  // thread's tid word, inside the stack the first joiner unmaps once its
  // join returns, and never wakes (a ptrace controller's detach and a
  // socket controller's met here, and the channel thread hung for good).
  // Its disarm is waited for instead.
  while (g_lease_stopping) pthread_cond_wait(&g_lease_stopped, &g_lock);
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
  pthread_cond_broadcast(&g_lease_stopped);
}

void* lease_main(void*) {
  // Named apart from the thread that armed it (a new thread takes its
  // creator's name: the listener's, or the socket channel's, whose name
  // a controller looks for).
  pthread_setname_np(pthread_self(), "remora-lease");
  pollfd fds[3] = {{g_lease_fd, POLLIN, 0}, {g_lease_wake, POLLIN, 0}, {g_claim_pidfd, POLLIN, 0}};
  for (;;) {
    int n = poll(fds, 3, claim_timeout_ms());
    if (n == 0) {
      expire_claim(false);
      continue;
    }
    if (n > 0 && fds[2].revents != 0) {
      expire_claim(true);  // the claiming controller exited
      fds[2].fd = -1;      // (the pidfd stays open until the lease is closed: no number reuse)
      if (fds[0].revents == 0 && fds[1].revents == 0) continue;
    }
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
  g_lease_token = 0;
  remora_agent_info.lease_pid = controller_pid;
  remora_agent_info.lease_expired = 0;
  return REMORA_AGENT_OK;
}

int arm_own_lease_locked(int32_t controller_pid, bool watch_pid, uint64_t token, uint32_t claim_ms,
                         int* write_fd, uint64_t* dev, uint64_t* ino) {
  int p[2];
  struct stat st {};
  if (pipe2(p, O_CLOEXEC) != 0) {
    set_message(
        "pipe2 failed in the target (%s): it may be out of file descriptors (see its RLIMIT_NOFILE); "
        "attach without a lease (remora attach --keep) to go on without one",
        strerror(errno));
    return REMORA_AGENT_ERR_LEASE;
  }
  if (fstat(p[1], &st) != 0) {
    set_message("cannot read the lease pipe (%s)", strerror(errno));
    close(p[0]);
    close(p[1]);
    return REMORA_AGENT_ERR_LEASE;
  }
  // The claim is pending before the watcher starts: its first poll is timed.
  // (No pidfd, an old kernel: the deadline alone.)
  g_claim_pidfd =
      watch_pid && controller_pid > 0 ? static_cast<int>(syscall(SYS_pidfd_open, controller_pid, 0)) : -1;
  g_claim_fd = p[1];
  g_claim_token = token;
  __atomic_store_n(&g_claim_until, monotonic_ms() + (claim_ms == 0 ? 1 : claim_ms), __ATOMIC_RELEASE);
  const int rc = arm_lease_locked(p[0], controller_pid);  // closes p[0] when it fails
  if (rc != REMORA_AGENT_OK) {
    drop_claim_locked();
    if (g_claim_pidfd >= 0) close(g_claim_pidfd);
    g_claim_pidfd = -1;
    return rc;
  }
  g_lease_token = token;
  *write_fd = p[1];
  *dev = static_cast<uint64_t>(st.st_dev);
  *ino = static_cast<uint64_t>(st.st_ino);
  return REMORA_AGENT_OK;
}

int claim_lease_locked(uint64_t token, uint64_t ino) {
  if (g_claim_fd < 0 || token == 0 || g_claim_token != token) {
    set_message(
        "no lease waits for this controller's claim: it was not claimed in time, or another controller "
        "detached the session meanwhile");
    return REMORA_AGENT_ERR_NOT_ATTACHED;
  }
  struct stat st {};
  const bool same = fstat(g_claim_fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == ino;
  drop_claim_locked();  // ours or not, the kept write end goes: only the controller's may stay
  if (!same) {
    set_message("the descriptor the controller opened is not the lease pipe: the lease expires");
    return REMORA_AGENT_ERR_LEASE;
  }
  return REMORA_AGENT_OK;
}

uint64_t lease_token_locked() { return g_lease_running ? g_lease_token : 0; }

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
  // Our copy of a write end still waiting for its claim would keep the
  // parent's lease alive as long as this child lives: it goes (the
  // parent's agent closes its own at the claim or its deadline).
  if (g_claim_fd >= 0) close(g_claim_fd);
  if (g_claim_pidfd >= 0) close(g_claim_pidfd);
  g_claim_fd = g_claim_pidfd = -1;
  g_claim_token = 0;
  g_claim_until = 0;
  const int read_fd = inherit ? g_lease_fd : -1;
  g_lease_fd = g_lease_wake = -1;
  g_lease_running = false;
  g_lease_stopping = false;
  pthread_cond_init(&g_lease_stopped, nullptr);  // no thread of the child waits on it
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
