// Following a process tree while it grows (Controller::follow_start and
// follow_poll, attach.h).
//
// Why polling: a pidfd reports an exit, never a fork or an exec; ptrace's
// fork events need a tracer attached for the whole session (every thread
// of every process seized: no), and the netlink proc connector needs
// CAP_NET_ADMIN and sees every process of the host. A poll reads the
// children files of each thread of the tree (/proc/PID/task/TID/children),
// the same walk as attach_tree's snapshot. What a poll finds:
//
//  * a forked child, which kept its parent's session in its agent
//    (REMORA_AGENT_FEATURE_FORK_LEASE): adopted, no tool called;
//  * a process without the agent (it exec'ed, or its parent never had one):
//    attached like a new one once it has settled: seen again at least
//    FollowOptions::settle later, its libc mapped and no thread in the
//    dynamic loader, whose work (mapping and relocating the program's
//    libraries, then their initialisers) must be over before the agent can
//    be loaded through its libc; a static program is attached at once and
//    refused by the attach with its usual message;
//  * a session of this controller whose agent went (it exec'ed): forgotten,
//    then attached again once it has settled, as a new process.
#include <poll.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <deque>
#include <set>

#include "attach/attach.h"
#include "attach/internal.h"
#include "procfs/procfs.h"

namespace remora::attach {

namespace {

using Clock = std::chrono::steady_clock;

UniqueFd open_pidfd(pid_t pid) { return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))); }

bool exited(const UniqueFd& pidfd) {
  if (!pidfd) return true;
  pollfd p{pidfd.get(), POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

// The tree under `root`, breadth-first, each process with its parent.
std::vector<std::pair<pid_t, pid_t>> walk(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> out;
  std::set<pid_t> seen;
  std::deque<std::pair<pid_t, pid_t>> queue{{root, 0}};
  while (!queue.empty()) {
    auto [p, parent] = queue.front();
    queue.pop_front();
    if (!seen.insert(p).second) continue;
    out.emplace_back(p, parent);
    auto kids = procfs::list_children(p);
    if (!kids) continue;  // exited meanwhile
    for (pid_t k : *kids) queue.emplace_back(k, p);
  }
  return out;
}

bool is_libc(const std::string& path) {
  std::string_view base(path);
  base = base.substr(base.rfind('/') + 1);
  return base.starts_with("libc.so") || base.starts_with("libc-2.");
}

// Has a process without the agent finished starting its program, so that
// the agent can be loaded through its libc? True too when the answer will
// not come from waiting (a static program, unreadable files): the attach
// then says why it refuses.
bool settled(pid_t pid) {
  auto auxv = procfs::read_auxv(pid);
  if (!auxv) return true;
  const uint64_t base = procfs::auxv_get(*auxv, AT_BASE).value_or(0);
  if (base == 0) return true;  // no dynamic loader: a static program
  auto maps = procfs::read_maps(pid);
  if (!maps) return true;
  std::string loader;
  bool libc = false;
  for (const auto& m : *maps) {
    if (m.start == base) loader = m.path;
    libc = libc || is_libc(m.path);
  }
  if (!libc) return false;
  auto tasks = procfs::list_tasks(pid);
  if (!tasks) return true;
  for (pid_t tid : *tasks) {
    auto sc = procfs::read_syscall(pid, tid);
    if (!sc || sc->running) continue;  // running: two polls with libc mapped are the proof we have
    for (const auto& m : *maps)
      if (sc->pc >= m.start && sc->pc < m.end && !loader.empty() && m.path == loader) return false;
  }
  return true;
}

}  // namespace

struct Controller::Follow {
  FollowOptions fo;
  // Processes dealt with: there at follow_start, adopted, attached, failed,
  // or ignored. A pidfd each: a pid that is reused after an exit is new.
  std::map<pid_t, UniqueFd> known;
  // Without the agent, waiting to settle.
  struct Pending {
    UniqueFd pidfd;
    pid_t parent = 0;
    Clock::time_point first_seen;
    bool execed = false;  // it was a session of ours
  };
  std::map<pid_t, Pending> pending;
};

Result<void> Controller::follow_start(pid_t root, const FollowOptions& fo) {
  if (::kill(root, 0) != 0 && errno == ESRCH)
    return Error(Errc::kNoSuchProcess, "no process " + std::to_string(root));
  auto f = std::make_shared<Follow>();
  f->fo = fo;
  for (const auto& [pid, parent] : walk(root)) f->known.emplace(pid, open_pidfd(pid));
  std::lock_guard lock(mu_);
  follows_[root] = std::move(f);
  return ok();
}

Result<std::vector<FollowEvent>> Controller::follow_poll(pid_t root, const AttachOptions& opts) {
  detail::ScopedTimerSlack slack;  // a poll may attach (attach_one): its waits sleep short
  std::shared_ptr<Follow> f;
  {
    std::lock_guard lock(mu_);
    auto it = follows_.find(root);
    if (it != follows_.end()) f = it->second;
  }
  if (!f)
    return Error(Errc::kInvalidArgument, "follow_poll(" + std::to_string(root) + ") before follow_start");
  std::erase_if(f->known, [](const auto& kv) { return exited(kv.second); });
  std::erase_if(f->pending, [](const auto& kv) { return exited(kv.second.pidfd); });
  const auto now = Clock::now();
  std::vector<FollowEvent> events;
  auto record = [&](FollowEvent e) {
    std::lock_guard lock(mu_);
    if (e.kind != FollowEvent::Kind::kFailed) trees_[root].push_back(e.pid);
    events.push_back(std::move(e));
  };

  // Sessions that exec'ed: their agent went with the old program.
  const auto ours = sessions();
  for (pid_t p : ours) {
    if (!agent_left(p)) continue;
    forget(p);
    auto st = procfs::read_status(p);
    f->known.erase(p);
    if (f->fo.attach_new)
      f->pending[p] = Follow::Pending{open_pidfd(p), st ? st->ppid : 0, now, true};
    else
      f->known.emplace(p, open_pidfd(p));
  }
  const auto now_ours = sessions();
  std::set<pid_t> ours_set(now_ours.begin(), now_ours.end());

  // New processes: adopted when they kept a session, else pending.
  for (const auto& [pid, parent] : walk(root)) {
    if (f->known.count(pid) || f->pending.count(pid)) continue;
    UniqueFd pidfd = open_pidfd(pid);
    if (!pidfd) continue;       // gone already
    if (ours_set.count(pid)) {  // attach_tree attached it after follow_start's walk
      f->known.emplace(pid, std::move(pidfd));
      continue;
    }
    auto r = adopt(pid, pidfd.get(), opts, ours_set.count(parent) != 0);
    if (r) {
      record(FollowEvent{FollowEvent::Kind::kAdopted, pid, parent, false, *r});
      ours_set.insert(pid);  // its own children, later in this walk, are forks of a session of ours
      f->known.emplace(pid, std::move(pidfd));
    } else if (r.error().code() == Errc::kNotAttached && f->fo.attach_new) {
      f->pending[pid] = Follow::Pending{std::move(pidfd), parent, now, false};
    } else {
      // Reported unless the process is gone (an error code alone does not
      // say: a thread that is gone reads as "no such process" too).
      if (!exited(pidfd) && r.error().code() != Errc::kNotAttached) {
        ProcessOutcome o;
        o.pid = pid;
        o.code = r.error().code();
        o.message = r.error().to_string();
        record(FollowEvent{FollowEvent::Kind::kFailed, pid, parent, false, o});
      }
      f->known.emplace(pid, std::move(pidfd));
    }
  }

  // Pending processes that settled: attached, four at a time.
  std::vector<pid_t> due;
  for (const auto& [pid, p] : f->pending)
    if (now - p.first_seen >= f->fo.settle && (settled(pid) || now - p.first_seen > std::chrono::seconds(2)))
      due.push_back(pid);
  std::vector<Follow::Pending> picked;
  for (pid_t pid : due) picked.push_back(std::move(f->pending.extract(pid).mapped()));
  std::vector<Result<ProcessOutcome>> results(due.size(), Result<ProcessOutcome>(ProcessOutcome{}));
  detail::for_each_parallel(due.size(),
                            [&](size_t i) { results[i] = attach_one(due[i], picked[i].pidfd.get(), opts); });
  for (size_t i = 0; i < due.size(); ++i) {
    Follow::Pending& p = picked[i];
    FollowEvent e{FollowEvent::Kind::kAttached, due[i], p.parent, p.execed, {}};
    if (results[i]) {
      e.outcome = *results[i];
    } else {
      e.kind = FollowEvent::Kind::kFailed;
      e.outcome.pid = due[i];
      e.outcome.code = results[i].error().code();
      e.outcome.message = results[i].error().to_string();
    }
    if (e.kind != FollowEvent::Kind::kFailed || !exited(p.pidfd)) record(std::move(e));
    f->known.emplace(due[i], std::move(p.pidfd));
  }
  return events;
}

}  // namespace remora::attach
