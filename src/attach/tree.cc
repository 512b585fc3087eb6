// A process tree: attach_tree and detach_tree (a snapshot of the tree, the
// processes attached and detached in parallel), and the steps of following
// a tree (follow.cc) that need a session: adopting a forked child that kept
// its session, noticing an exec, forgetting a session.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/protocol.h"
#include "attach/attach.h"
#include "attach/internal.h"
#include "base/deadline.h"
#include "base/unique_fd.h"
#include "procfs/procfs.h"
#include "remote/target.h"

namespace remora::attach {

using namespace detail;  // this layer's steps (internal.h)

Result<std::vector<pid_t>> Controller::snapshot_tree(pid_t root) {
  std::vector<pid_t> order;
  std::set<pid_t> seen;
  std::deque<pid_t> queue{root};
  if (::kill(root, 0) != 0 && errno == ESRCH)
    return Error(Errc::kNoSuchProcess, "no process " + std::to_string(root));
  while (!queue.empty()) {
    pid_t p = queue.front();
    queue.pop_front();
    if (!seen.insert(p).second) continue;
    order.push_back(p);
    auto kids = procfs::list_children(p);
    if (!kids) continue;  // exited meanwhile: its children were reparented, not ours to chase
    for (pid_t k : *kids) queue.push_back(k);
  }
  return order;
}

// Runs work(i) for every i < n, on two threads per core but at most eight,
// this one included; returns when every call has returned. Two per core: an
// attach waits for its target about half of its time (its loader's dlopen,
// the listener's attach), and one per core left the CPUs idle then (a tree
// of 32 on 2 CPUs: 2.3x its in-process floor with 2 threads, 2.0x with 4,
// 2.3x with 8; docs/benchmarks.md).
void detail::for_each_parallel(size_t n, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < n;) work(i);
  };
  unsigned threads_wanted = std::min<unsigned>(2 * std::max(1u, std::thread::hardware_concurrency()), 8);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < threads_wanted && i < n; ++i) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
}

namespace {

void record_failure(ProcessOutcome& o, const Error& e) {
  o.code = e.code();
  o.message = e.to_string();
}

}  // namespace

Result<std::vector<ProcessOutcome>> Controller::attach_tree(pid_t root, const AttachOptions& opts) {
  detail::ScopedTimerSlack slack;
  // The root is refused at once when nothing below it can be attached
  // either: gone, a zombie, a kernel thread (whose "children" are other
  // kernel threads, not a tree to walk), or refused itself with no children.
  REMORA_TRY_CTX(check_target(root, TargetUse::kTree), "attach to process " + std::to_string(root));
  auto pids = REMORA_TRY(snapshot_tree(root));
  // Hold a pidfd for each process from the snapshot on: a pid recycled
  // meanwhile can never be attached by mistake.
  std::vector<UniqueFd> pidfds;
  for (pid_t p : pids) pidfds.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, p, 0)));
  std::vector<ProcessOutcome> outcomes(pids.size());
  for_each_parallel(pids.size(), [&](size_t i) {
    outcomes[i].pid = pids[i];
    if (!pidfds[i] || !pidfd_alive(pidfds[i].get())) {
      // A child its parent has not reaped yet is said to be a zombie, in
      // the words of a zombie root's refusal.
      auto z = check_target(pids[i], TargetUse::kRead);
      if (!z && z.error().code() == Errc::kZombie) {
        record_failure(outcomes[i],
                       std::move(z).error().with_context("attach to process " + std::to_string(pids[i])));
        return;
      }
      outcomes[i].code = Errc::kTargetExited;
      outcomes[i].message = "process " + std::to_string(pids[i]) + " exited before it could be attached";
      return;
    }
    auto r = attach_one(pids[i], pidfds[i].get(), opts);
    if (r)
      outcomes[i] = *r;
    else
      record_failure(outcomes[i], r.error());
  });
  std::lock_guard lock(mu_);
  auto& attached = trees_[root];
  for (const auto& o : outcomes)
    if (o.ok) attached.push_back(o.pid);
  return outcomes;
}

Result<std::vector<ProcessOutcome>> Controller::detach_tree(pid_t root, std::chrono::milliseconds timeout) {
  DetachOptions opts;
  opts.timeout = timeout;
  return detach_tree(root, opts);
}

Result<std::vector<ProcessOutcome>> Controller::detach_tree(pid_t root, const DetachOptions& opts) {
  detail::ScopedTimerSlack slack;
  std::vector<pid_t> pids;
  {
    std::lock_guard lock(mu_);
    auto it = trees_.find(root);
    if (it != trees_.end()) {
      pids = std::move(it->second);
      trees_.erase(it);
    }
  }
  if (pids.empty()) {
    // Attached by another controller: the tree as it is now, whose root
    // must be one (the tree this controller attached is detached whatever
    // became of its root).
    REMORA_TRY_CTX(check_target(root, TargetUse::kTree), "detach from process " + std::to_string(root));
    pids = REMORA_TRY(snapshot_tree(root));
  }
  return detach_each(pids, opts);
}

// ---- following a tree (follow.cc): the steps that need a session ----

UniqueFd Controller::lease_pipe_held_by(pid_t pid) {
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard lock(mu_);
    for (const auto& [p, s] : sessions_) all.push_back(s);
  }
  // Our write ends by the pipe they name; the read end the child holds is a
  // descriptor of the same pipe, inherited through the fork.
  std::map<std::pair<dev_t, ino_t>, std::shared_ptr<Session>> pipes;
  for (const auto& s : all) {
    std::lock_guard lock(s->mu);
    struct stat st {};
    if (s->lease_fd && ::fstat(s->lease_fd.get(), &st) == 0) pipes[{st.st_dev, st.st_ino}] = s;
  }
  if (pipes.empty()) return UniqueFd();
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return UniqueFd();
  while (dirent* e = ::readdir(d.get())) {
    struct stat st {};
    if (e->d_name[0] == '.' || ::stat((dir + "/" + e->d_name).c_str(), &st) != 0) continue;
    auto it = pipes.find({st.st_dev, st.st_ino});
    if (it == pipes.end()) continue;
    std::lock_guard lock(it->second->mu);
    if (it->second->lease_fd) return UniqueFd(::fcntl(it->second->lease_fd.get(), F_DUPFD_CLOEXEC, 0));
  }
  return UniqueFd();
}

// A forked child that kept a session: made a session of this controller
// without calling any tool (they are attached in it already). Its lease is
// the controller's: the write end the child's watcher watches (the parent's
// pipe, inherited) is shared with the parent's session, so that the pipe
// closes only once both are detached; a child whose agent armed none (an
// agent older than REMORA_AGENT_FEATURE_FORK_LEASE) gets a lease of its own.
// `parent_ours`: its parent is a session of this controller, which is what
// makes an unleased session (attach --keep, the C API) this one's.
Result<ProcessOutcome> Controller::adopt(pid_t pid, int pidfd, const AttachOptions& opts, bool parent_ours) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = "adopt process " + std::to_string(pid);
  UniqueFd ours = lease_pipe_held_by(pid);
  auto s = REMORA_TRY_CTX(session_for(pid, true), ctx);
  std::lock_guard lock(s->mu);
  if (pidfd >= 0 && !pidfd_alive(pidfd))
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " exited");
  remote::Target& t = *s->target;
  if (!REMORA_TRY_CTX(resolve_agent(t, &s->agent), ctx))
    return Error(Errc::kNotAttached, "process " + std::to_string(pid) + " has no Remora agent");
  // A child just forked may not have run the agent's fork handler yet: its
  // info block is its parent's copy (naming the parent's listener, no
  // thread of the child) until the handler has armed the child's lease and
  // the child's listener has published its tid.
  Deadline deadline = Deadline::after(opts.timeout);
  remora_agent_info info{};
  for (long nap = 1000;; nap = std::min<long>(nap * 2, 20'000)) {
    info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
    const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(info.listener_tid);
    if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid != 0 && ::access(task.c_str(), F_OK) == 0)
      break;
    if (deadline.expired())
      return Error(Errc::kTimedOut, "the agent's listener did not start in the forked process " +
                                        std::to_string(pid) + " (is it stopped? send it SIGCONT)")
          .with_context(ctx);
    pause_briefly(nap);
  }
  if (!info.attached)
    return Error(Errc::kNotAttached,
                 "the agent in process " + std::to_string(pid) + " has no tools attached");
  const bool leased = info.lease_pid != 0 && info.lease_expired == 0;
  if (leased && !ours) {
    info.tools[sizeof info.tools - 1] = '\0';
    return Error(Errc::kAlreadyAttached, already_attached_message(info)).with_context(ctx);
  }
  if (!leased && !parent_ours)
    return Error(Errc::kAlreadyAttached,
                 "process " + std::to_string(pid) +
                     " was forked from a process another session attached (no lease): "
                     "it is that session's; remora detach -p " +
                     std::to_string(pid) + " ends it")
        .with_context(ctx);
  s->listener = info.listener_tid;
  if (leased) {
    s->lease_fd = std::move(ours);
  } else if (opts.lease) {
    CallOptions on_listener{s->listener, opts.timeout};
    REMORA_TRY(arm_lease_or_detach(t, pid, s->agent, on_listener, &s->lease_fd, ctx));
  }
  s->attached = true;
  ProcessOutcome out;
  out.pid = pid;
  out.ok = true;
  out.elapsed = std::chrono::steady_clock::now() - t0;
  return out;
}

// Eight bytes read through /proc/PID/mem, no thread stopped: the agent's
// info block is where it was unless the process exec'ed (a new program,
// without the agent) or was unloaded.
bool Controller::agent_left(pid_t pid) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(pid);
    if (it == sessions_.end() || !it->second->attached) return false;
    s = it->second;
  }
  std::lock_guard lock(s->mu);
  if (s->agent.info == 0 || !pidfd_alive(s->pidfd.get())) return false;
  uint64_t magic = 0;
  auto r = s->target->read(RemoteAddr(s->agent.info), std::as_writable_bytes(std::span(&magic, 1)));
  return !r || magic != REMORA_AGENT_MAGIC;
}

void Controller::forget(pid_t pid) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(pid);
    if (it == sessions_.end()) return;
    s = std::move(it->second);
    sessions_.erase(it);
    for (auto& [root, pids] : trees_) std::erase(pids, pid);
  }
  std::lock_guard lock(s->mu);
  // The old program's memory is gone: nothing of ours is left to remove
  // there, and no call may be made on the new one's behalf.
  s->target->abandon_scratch();
}

// Detaches each of `pids` (for_each_parallel's threads at a time), one outcome each.
std::vector<ProcessOutcome> Controller::detach_each(const std::vector<pid_t>& pids,
                                                    const DetachOptions& opts) {
  std::vector<ProcessOutcome> outcomes(pids.size());
  for_each_parallel(pids.size(), [&](size_t i) {
    outcomes[i].pid = pids[i];
    auto r = detach_one(pids[i], opts);
    outcomes[i].ok = r.ok();
    if (r)
      outcomes[i].unload = std::move(*r);
    else
      record_failure(outcomes[i], r.error());
  });
  return outcomes;
}

std::vector<ProcessOutcome> Controller::detach_sessions(const DetachOptions& opts) {
  detail::ScopedTimerSlack slack;
  auto pids = sessions();
  return detach_each(pids, opts);
}

}  // namespace remora::attach
