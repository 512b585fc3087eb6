// `remora attach`: attaches tools to a process (and, by default, its whole
// tree) through the in-target agent, keeps them attached for -d MSEC or until
// Enter / SIGINT / SIGTERM, detaches them, and for the default tool prints
// what it found. attach::Controller does the work; this file is the
// conversation with the user.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "attach/attach.h"
#include "base/log.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/common_options.h"
#include "cli/container.h"
#include "cli/exit_codes.h"
#include "cli/output_staging.h"
#include "cli/session_args.h"
#include "cli/session_support.h"
#include "cli/slurm_front.h"
#include "procfs/procfs.h"

extern char** environ;

namespace remora::cli {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct AttachCommandOptions {
  pid_t pid = 0;
  std::string tools;
  bool tools_given = false;
  long duration_ms = 0;
  bool duration_given = false;
  bool children = true;
  bool follow = true;  // adopt and attach what the tree makes during the session
  bool no_follow = false;
  std::vector<std::string> env;
  bool keep = false;
  bool unload = false;  // after the detach, unload the tools and the agent
  long timeout_ms = 10000;
  std::string channel = "auto";
  std::string slurm;  // --slurm JOBID[.STEP]
  long node_timeout_ms = 30000;
  std::string container;  // --container NAME|ID
  std::string output;     // -o DIR
};

std::string tool_names(const std::vector<std::string>& paths) {
  std::string out;
  for (const auto& p : paths) {
    if (!out.empty()) out += ", ";
    out += p.substr(p.rfind('/') + 1);
  }
  return out;
}

// One attached process while the tools run: its pidfd says when it exits.
struct Attached {
  pid_t pid = 0;
  std::string comm;
  UniqueFd pidfd;
  bool exited = false;
  // Ended during the session for its own reasons: how (a wait status), if
  // the kernel still says.
  bool ended_in_session = false;
  std::optional<int> status;
};

// "killed by SIGSEGV (signal 11, core dumped): its tools could not write
// their data", or "exited with status 0; its tools were finalised at exit".
std::string describe_end(const Attached& p) {
  if (!p.status) return "exited (how, the kernel no longer says: its parent reaped it first)";
  std::string how = describe_exit_status(*p.status);
  if (WIFSIGNALED(*p.status)) return how + ": its tools could not finalise or write their data";
  return how + "; its tools were finalised at exit";
}

enum class StopReason { kDuration, kSignal, kEnter, kAllExited };

// How often the session's tree is walked for new processes
// (Controller::follow_poll), at the least. A child that lives shorter is not
// seen (a forked one had the session all the same); each walk reads the
// children files of every thread of the tree, about 25 us of CPU per
// process (follow_test.cc measures it). 25 ms catches a pre-fork worker or
// a backend per connection within its first request; a large tree is
// walked less often (Waiter::wait).
constexpr auto kFollowPeriod = std::chrono::milliseconds(25);

// The live part: waits for the end of the session while showing progress.
// On a terminal one line is redrawn in place; otherwise plain lines, every
// second for the first ten, then every ten seconds, then every minute.
class Waiter {
 public:
  // `follow`, when set, is called every kFollowPeriod; it adds what it
  // followed to `procs` and returns the lines to print.
  Waiter(StopSignals& signals, std::vector<Attached>& procs,
         std::optional<std::chrono::milliseconds> duration,
         std::function<std::vector<std::string>()> follow = nullptr)
      : signals_(signals),
        procs_(procs),
        duration_(duration),
        follow_(std::move(follow)),
        tty_(::isatty(STDOUT_FILENO) == 1),
        watch_stdin_(stdin_is_our_terminal()) {}

  // Enter is read only from a terminal whose foreground we are: a
  // background remora (`remora attach ... &`) reading it would be stopped
  // by SIGTTIN with the tools attached.
  static bool stdin_is_our_terminal() {
    return ::isatty(STDIN_FILENO) == 1 && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp();
  }

  StopReason wait(int* signo) {
    const auto t0 = Clock::now();
    auto next_tick = t0;
    auto next_follow = t0;
    for (;;) {
      auto now = Clock::now();
      if (follow_ && now >= next_follow) {
        print_lines(follow_());
        const auto walked = Clock::now() - now;
        now = Clock::now();
        // A large tree walks longer: the period grows with it, so that
        // following stays under 2% of a core (a walk costs about 25 us per
        // process: 100 processes would take 10% of a core every 25 ms).
        next_follow = now + std::max<Clock::duration>(kFollowPeriod, walked * 50);
      }
      const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(now - t0);
      if (duration_ && elapsed >= *duration_) return finish(StopReason::kDuration);
      if (alive() == 0) return finish(StopReason::kAllExited);
      if (now >= next_tick) {
        show(elapsed);
        next_tick = now + tick_interval(elapsed);
      }
      auto until = next_tick;
      if (duration_) until = std::min(until, t0 + *duration_);
      if (follow_) until = std::min(until, next_follow);
      int timeout = static_cast<int>(std::max<long>(
          1, std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count()));

      std::vector<pollfd> fds;
      fds.push_back({signals_.fd(), POLLIN, 0});
      if (watch_stdin_) fds.push_back({STDIN_FILENO, POLLIN, 0});
      std::vector<size_t> which;
      for (size_t i = 0; i < procs_.size(); ++i) {
        if (procs_[i].exited || !procs_[i].pidfd) continue;
        fds.push_back({procs_[i].pidfd.get(), POLLIN, 0});
        which.push_back(i);
      }
      int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0 && errno != EINTR) return finish(StopReason::kSignal);  // cannot wait: end the session
      if (n <= 0) continue;
      if (fds[0].revents) {
        if (auto s = signals_.take()) {
          *signo = *s;
          return finish(StopReason::kSignal);
        }
      }
      size_t at = 1;
      if (watch_stdin_) {
        if (fds[1].revents) {
          char buf[256];
          ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
          if (r <= 0) {
            // Ctrl-D on the terminal (EOF) says "done" too; an error: stop listening.
            if (r == 0) return finish(StopReason::kEnter);
            watch_stdin_ = false;
          } else if (std::string_view(buf, static_cast<size_t>(r)).find('\n') != std::string_view::npos) {
            return finish(StopReason::kEnter);
          }
        }
        at = 2;
      }
      for (size_t k = 0; k < which.size(); ++k) {
        if (!fds[at + k].revents) continue;
        Attached& p = procs_[which[k]];
        p.exited = true;
        p.ended_in_session = true;
        p.status = exit_status(p.pid, p.pidfd.get());
        clear_line();
        std::printf("  process %d (%s) %s\n", static_cast<int>(p.pid), p.comm.c_str(),
                    describe_end(p).c_str());
        std::fflush(stdout);
        shown_ = false;
      }
    }
  }

 private:
  size_t alive() const {
    size_t n = 0;
    for (const auto& p : procs_) n += p.exited ? 0 : 1;
    return n;
  }

  static std::chrono::milliseconds tick_interval_plain(std::chrono::milliseconds elapsed) {
    if (elapsed < 10s) return 1s;
    if (elapsed < 10min) return 10s;
    return 60s;
  }
  std::chrono::milliseconds tick_interval(std::chrono::milliseconds elapsed) const {
    return tty_ ? std::chrono::milliseconds(100) : tick_interval_plain(elapsed);
  }

  void show(std::chrono::milliseconds elapsed) {
    if (!tty_ && elapsed < 500ms) return;  // the "Attached ..." line just said it
    std::string line = "attached to " + count_noun(alive(), "process", "processes") + ", " +
                       format_elapsed(elapsed) + " elapsed";
    if (duration_) line += " of " + format_elapsed(*duration_);
    if (tty_) {
      line += watch_stdin_ ? "  (Enter or Ctrl-C detaches)" : "  (Ctrl-C detaches)";
      std::printf("\r\033[K  %s", line.c_str());
      shown_ = true;
    } else {
      std::printf("  %s\n", line.c_str());
    }
    std::fflush(stdout);
  }

  void clear_line() {
    if (tty_ && shown_) std::printf("\r\033[K");
  }

  void print_lines(const std::vector<std::string>& lines) {
    if (lines.empty()) return;
    clear_line();
    for (const auto& l : lines) std::printf("  %s\n", l.c_str());
    std::fflush(stdout);
    shown_ = false;
  }

  StopReason finish(StopReason r) {
    clear_line();
    shown_ = false;
    std::fflush(stdout);
    return r;
  }

  StopSignals& signals_;
  std::vector<Attached>& procs_;
  std::optional<std::chrono::milliseconds> duration_;
  std::function<std::vector<std::string>()> follow_;
  bool tty_;
  bool watch_stdin_;
  bool shown_ = false;
};

// Attaches the tools (to the tree, or to the process alone) and prints one
// line per process. Fills `procs` with the processes attached and
// `exit_code` with that of the first failure that is not a process gone;
// returns the exit code to leave with when nothing was attached.
std::optional<int> attach_all(attach::Controller& ctl, const AttachCommandOptions& o,
                              const attach::AttachOptions& opts, const std::string& root_comm,
                              std::vector<Attached>* procs, int* exit_code) {
  std::vector<attach::ProcessOutcome> outcomes;
  if (o.children) {
    auto r = ctl.attach_tree(o.pid, opts);
    if (!r) return fail(r.error());
    outcomes = std::move(*r);
  } else {
    auto r = ctl.attach(o.pid, opts);
    if (!r) return fail(r.error());
    outcomes.push_back(*r);
  }
  const attach::ProcessOutcome* first_failure = nullptr;
  print_outcome_header(stdout);
  for (const auto& oc : outcomes) {
    Attached a;
    a.pid = oc.pid;
    a.comm = oc.pid == o.pid ? root_comm : process_comm(oc.pid);
    print_outcome(stdout, oc.pid, a.comm, describe_attach(oc));
    if (oc.ok) {
      a.pidfd = open_pidfd(oc.pid);
      procs->push_back(std::move(a));
    } else if (!is_gone(oc.code) && !first_failure) {
      first_failure = &oc;
    }
  }
  std::fflush(stdout);
  if (procs->empty()) {
    const auto& why = first_failure ? *first_failure : outcomes.front();
    print_error("nothing was attached: " + why.message);
    return to_int(exit_code_for(why.code == Errc::kOk ? Errc::kInternal : why.code));
  }
  *exit_code = first_failure ? to_int(exit_code_for(first_failure->code)) : 0;
  return std::nullopt;
}

// One walk of the tree (Controller::follow_poll): what it adopted or
// attached joins `procs`, and each gets a line. A process that exec'ed after
// it was followed is the same entry, under its new name.
std::vector<std::string> follow_tree(attach::Controller& ctl, pid_t root, const attach::AttachOptions& opts,
                                     std::vector<Attached>* procs) {
  std::vector<std::string> lines;
  auto r = ctl.follow_poll(root, opts);
  if (!r) return {"follow: " + r.error().to_string()};
  for (const auto& e : *r) {
    const std::string comm = process_comm(e.pid);
    const std::string who = "pid " + std::to_string(e.pid) + " (" + comm + ")";
    const std::string parent = e.parent ? std::to_string(e.parent) : std::string("?");
    switch (e.kind) {
      case attach::FollowEvent::Kind::kAdopted:
        lines.push_back("followed: " + who + ", forked from " + parent);
        break;
      case attach::FollowEvent::Kind::kAttached:
        lines.push_back(
            "attached: " + who + (e.execed ? ", exec'ed a new program" : ", exec'ed, child of " + parent) +
            " (" + (e.outcome.agent_loaded_now ? "agent loaded, " : "") +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(e.outcome.elapsed).count()) +
            " ms)");
        break;
      case attach::FollowEvent::Kind::kFailed:
        lines.push_back("not followed: " + who + ", child of " + parent + ": " + e.outcome.message);
        continue;
    }
    auto known =
        std::find_if(procs->begin(), procs->end(), [&](const Attached& a) { return a.pid == e.pid; });
    if (known != procs->end()) {
      known->comm = comm;
      continue;
    }
    Attached a;
    a.pid = e.pid;
    a.comm = comm;
    a.pidfd = open_pidfd(e.pid);
    procs->push_back(std::move(a));
  }
  return lines;
}

// Waits for the end of the session (duration, signal, Enter, or every
// process gone) and says why it ended.
void wait_session(StopSignals& signals, std::vector<Attached>& procs,
                  std::optional<std::chrono::milliseconds> duration,
                  std::function<std::vector<std::string>()> follow) {
  std::printf("Attached to %s; %s.\n", count_noun(procs.size(), "process", "processes").c_str(),
              duration ? ("detaching after " + format_elapsed(*duration)).c_str()
                       : (Waiter::stdin_is_our_terminal() ? "press Enter or Ctrl-C to detach"
                                                          : "send SIGINT or SIGTERM to detach"));
  std::fflush(stdout);
  int signo = 0;
  Waiter waiter(signals, procs, duration, std::move(follow));
  switch (waiter.wait(&signo)) {
    case StopReason::kDuration:
      std::printf("Detaching after %s.\n", format_elapsed(*duration).c_str());
      break;
    case StopReason::kSignal:
      std::printf("Got SIG%s: detaching.\n", signo ? sigabbrev_np(signo) : "?");
      break;
    case StopReason::kEnter: std::printf("Detaching.\n"); break;
    case StopReason::kAllExited: std::printf("Every attached process exited.\n"); break;
  }
  std::fflush(stdout);
}

// Detaches the processes still running and reports those that failed;
// returns the exit code of the last failure, or `exit_code` unchanged.
int detach_all(attach::Controller& ctl, const AttachCommandOptions& o, std::vector<Attached>& procs,
               int exit_code) {
  size_t still = 0;
  for (auto& p : procs) {
    if (!p.exited && p.pidfd && pidfd_exited(p.pidfd.get())) p.exited = true;
    still += p.exited ? 0 : 1;
  }
  if (still == 0) return exit_code;
  const auto t0 = Clock::now();
  std::vector<attach::ProcessOutcome> detached;
  attach::DetachOptions dopts;
  dopts.timeout = std::chrono::milliseconds(o.timeout_ms);
  dopts.unload = o.unload;
  if (o.follow) {
    // Every session: the tree, and what was followed into it.
    detached = ctl.detach_sessions(dopts);
  } else if (o.children) {
    auto r = ctl.detach_tree(o.pid, dopts);
    if (r) {
      detached = std::move(*r);
    } else {
      print_error(r.error().to_string());
      exit_code = to_int(exit_code_for(r.error().code()));
    }
  } else {
    attach::ProcessOutcome d;
    d.pid = o.pid;
    auto r = ctl.detach(o.pid, dopts);
    d.ok = r.ok();
    if (r) d.unload = *r;
    if (!r) {
      d.code = r.error().code();
      d.message = r.error().to_string();
    }
    detached.push_back(d);
  }
  size_t ok = 0;
  bool header = false;
  for (const auto& d : detached) {
    const Attached* p = nullptr;
    for (const auto& a : procs)
      if (a.pid == d.pid) p = &a;
    if (d.ok) {
      ++ok;
      if (o.unload) warn_kept_tools(d.pid, d.unload);
      continue;
    }
    bool gone = is_gone(d.code) || (p && p->pidfd && pidfd_exited(p->pidfd.get()));
    if (gone) continue;  // exited during the session: said so already
    if (!header) {
      std::printf("Detach failed for:\n");
      header = true;
    }
    print_outcome(stdout, d.pid, p ? p->comm : process_comm(d.pid), "failed: " + d.message);
    exit_code = to_int(exit_code_for(d.code));
  }
  std::printf("Detached from %s%s in %ld ms.\n", count_noun(ok, "process", "processes").c_str(),
              o.unload ? " and unloaded Remora" : "", static_cast<long>(since(t0).count()));
  std::fflush(stdout);
  return exit_code;
}

// A session whose target ended under it did not do what was asked: exit 7
// when the process named by -p ended, or any attached one was killed by a
// signal (children of a tree that exit normally come and go: no failure).
int ended_session_exit_code(const AttachCommandOptions& o, const std::vector<Attached>& procs,
                            int exit_code) {
  const Attached* ended = nullptr;
  for (const auto& p : procs) {
    if (!p.ended_in_session) continue;
    bool signalled = p.status && WIFSIGNALED(*p.status);
    if (p.pid == o.pid || signalled) {
      ended = &p;
      if (signalled) break;  // the most telling one
    }
  }
  if (!ended) return exit_code;
  print_error("during the session, process " + std::to_string(ended->pid) + " (" + ended->comm + ") " +
              describe_end(*ended));
  return to_int(ExitCode::kTargetExited);
}

// The default tool's output plan; an in-memory profile (no writable
// directory in the target's root) serves one process only: nobody reads the
// memory after remora exits (--keep), and each process would need a memfd
// of its own.
Result<OutputPlan> plan_default_output(const AttachCommandOptions& o, EnvList& env, bool socket) {
  auto plan = REMORA_TRY(prepare_output_path(env, o.pid, socket, o.output));
  const bool has_children = o.children && [&] {
    auto kids = procfs::list_children(o.pid);
    return kids && !kids->empty();
  }();
  if (plan.staged && plan.staged->in_memory() && (o.keep || has_children))
    return Error(Errc::kNotSupported,
                 "process " + std::to_string(o.pid) +
                     " has no writable directory in its root, so remora keeps its profile in memory "
                     "that only this remora reads: " +
                     (o.keep ? "--keep (remora gone before the detach) is"
                             : "its children (one memfd per process) are") +
                     " not supported that way; " + (o.keep ? "" : "pass --attach-children=false, ") +
                     "give the container a writable /tmp, or pass -e REMORA_OUTPUT_PATH=DIR with a "
                     "writable directory inside it");
  if (plan.staged && plan.staged->in_memory())
    std::printf(
        "No directory of process %d's root is writable: its profile is kept in memory that remora "
        "reads at the detach.\n",
        static_cast<int>(o.pid));
  return plan;
}

// What --keep leaves, and how to end it later.
void print_kept(const AttachCommandOptions& o, size_t attached, bool default_tool, OutputPlan& plan) {
  std::printf(
      "\nThe tools stay attached to %s after remora exits (--keep: no lease).\n"
      "Detach later with:\n  remora detach -p %d%s\n",
      count_noun(attached, "process", "processes").c_str(), static_cast<int>(o.pid),
      o.children ? " --tree" : "");
  if (default_tool && plan.staged)
    std::printf(
        "The default tool writes its output inside the target, under /proc/%d/root%s, when it "
        "detaches (render it with remora report DIR).\n",
        static_cast<int>(o.pid), plan.staged->target_path().c_str());
  else if (default_tool)
    std::printf("The default tool writes its output under %s when it detaches.\n", plan.root.c_str());
  if (plan.staged) plan.staged->keep();
  std::fflush(stdout);
}

int run_attach(const AttachCommandOptions& asked) {
  AttachCommandOptions o = asked;
  // The first mark of the command's own timeline (REMORA_LOG=attach): all
  // before it is start-up, the line's parse included (remora-bench-attach
  // splits the command at it).
  REMORA_LOG(kAttach, "pid %d: the command starts", static_cast<int>(o.pid));
  auto given = parse_env_list(o.env);
  if (!given) return fail(given.error());
  // The process itself first, as `remora call` refuses it: no tool is
  // looked for, no output directory planned and nothing printed for a
  // process that cannot be attached (gone, a zombie, a kernel thread,
  // traced by another, statically linked, remora itself).
  const std::string about = "attach to process " + std::to_string(o.pid);
  auto channel = attach::parse_channel(o.channel);
  if (!channel) return fail(channel.error());
  auto via = attach::resolve_channel(o.pid, *channel,
                                     o.children ? attach::TargetUse::kTree : attach::TargetUse::kProcess);
  if (!via) return fail(std::move(via).error().with_context(about));
  // Through the socket: the process alone (its children have sockets of
  // their own, each attached with remora attach -p), nothing followed.
  const bool socket = *via == attach::Channel::kSocket;
  if (socket) {
    o.children = false;
    o.follow = false;
  }
  // The caller's REMORA_* and ROCP* variables reach the targets, as the C
  // API's rocattach layer and the Python package forward them; -e wins.
  std::optional<EnvList> env = forwarded_environment(environ);
  for (auto& [name, value] : *given) set_env(*env, name, value);
  auto tools = select_tools(o.tools_given ? std::optional<std::string>(o.tools) : std::nullopt);
  if (!tools) return fail(tools.error());
  // Before anything is attached: a Ctrl-C from now on ends the session
  // cleanly instead of killing remora half-way.
  auto signals = StopSignals::install();
  if (!signals) return fail(signals.error());
  OutputPlan plan;
  if (!o.output.empty() && !tools->default_tool)
    return fail(Error(Errc::kInvalidArgument, output_needs_default_tool(o.output)));
  if (tools->default_tool) {
    auto p = plan_default_output(o, *env, socket);
    if (!p) return fail(p.error());
    plan = std::move(*p);
  }
  const std::string& out_root = plan.root;
  attach::AttachOptions opts;
  opts.tools = tools->paths;
  opts.env = *env;
  opts.timeout = std::chrono::milliseconds(o.timeout_ms);
  opts.lease = !o.keep;
  // kAuto stays kAuto on ptrace's way: a seize refused later (a filter of
  // ours) still finds the socket.
  opts.channel = socket ? attach::Channel::kSocket : *channel;

  const std::string root_comm = process_comm(o.pid);
  std::printf("Attaching %s to process %d (%s)%s%s%s...\n", tool_names(tools->paths).c_str(),
              static_cast<int>(o.pid), root_comm.c_str(), socket ? " through its socket channel" : "",
              o.children ? " and its children" : "",
              !o.follow || o.keep ? ""
              : o.children        ? ", following new ones"
                                  : ", following its forks");
  std::fflush(stdout);
  const auto wall_start = std::chrono::system_clock::now();
  const std::set<std::string> outputs_before =
      tools->default_tool ? existing_outputs(out_root) : std::set<std::string>{};
  attach::Controller ctl;
  std::vector<Attached> procs;
  int exit_code = 0;
  const bool follow = o.follow && !o.keep;
  if (follow) {
    // Before the attach: whatever appears from now on is followed.
    attach::FollowOptions fo;
    fo.attach_new = o.children;
    if (auto f = ctl.follow_start(o.pid, fo); !f) return fail(f.error());
  }
  if (auto nothing = attach_all(ctl, o, opts, root_comm, &procs, &exit_code)) return *nothing;

  if (o.keep) {
    print_kept(o, procs.size(), tools->default_tool, plan);
    return exit_code;
  }

  std::optional<std::chrono::milliseconds> duration;
  if (o.duration_given) duration = std::chrono::milliseconds(o.duration_ms);
  AttachCommandOptions effective = o;
  effective.follow = follow;
  wait_session(*signals, procs, duration,
               follow ? std::function<std::vector<std::string>()>(
                            [&] { return follow_tree(ctl, o.pid, opts, &procs); })
                      : nullptr);
  exit_code = detach_all(ctl, effective, procs, exit_code);
  if (tools->default_tool) {
    std::vector<pid_t> pids;
    for (const auto& p : procs) pids.push_back(p.pid);
    if (std::string why = plan.collect(); !why.empty())
      std::printf("The profile could not be brought out of the target: %s\n", why.c_str());
    print_outputs(stdout, out_root, find_outputs(out_root, pids, wall_start, outputs_before));
  }
  return ended_session_exit_code(o, procs, exit_code);
}

slurm::FrontOptions slurm_options(const AttachCommandOptions& o) {
  slurm::FrontOptions f;
  f.job = o.slurm;
  f.node.op = "attach";
  f.node.tools = o.tools;
  f.node.tools_given = o.tools_given;
  f.node.env = o.env;
  f.node.timeout_ms = o.timeout_ms;
  f.node.channel = o.channel;
  f.node.keep = o.keep;
  f.node.unload = o.unload;
  f.node.follow = o.follow;
  f.duration_ms = o.duration_ms;
  f.duration_given = o.duration_given;
  f.node_timeout_ms = o.node_timeout_ms;
  f.output = o.output;
  return f;
}

}  // namespace

void add_attach_command(CLI::App& root, Dispatch& dispatch) {
  auto opts = std::make_shared<AttachCommandOptions>();
  CLI::App* sub =
      root.add_subcommand("attach", "Attach tools to a running process and its children for a while");
  auto* pid = add_pid_option(sub, opts->pid,
                             "Process to attach to (with its whole tree unless --attach-children=false)");
  auto* slurm = add_slurm_option(sub, pid, opts->slurm,
                                 "Every rank of this running Slurm job (JOBID or JOBID.STEP), on every node, "
                                 "instead of -p: one merged profile");
  auto* container = add_container_option(
      sub, pid, slurm, opts->container,
      "The main process of this running container (podman or docker: NAME or ID) and its tree, "
      "instead of -p; the results land on this side (./remora-output, or -o DIR)");
  sub->add_option("--node-timeout", opts->node_timeout_ms,
                  "--slurm: give up a node that answers nothing for MSEC milliseconds")
      ->capture_default_str()
      ->check(CLI::Range(1000L, 3600L * 1000L));
  auto* tools =
      sub->add_option("-t,--tools", opts->tools,
                      "Tool libraries LIB[:LIB...] (default: libremora-tool.so next to the agent, or "
                      "$REMORA_TOOL_PATH)");
  auto* dur = sub->add_option("-d,--duration", opts->duration_ms,
                              "Detach after MSEC milliseconds (default: on Enter, SIGINT or SIGTERM)")
                  ->check(CLI::Range(1L, 7L * 24 * 3600 * 1000));
  sub->add_option("--attach-children", opts->children,
                  "Attach the whole tree under PID (true) or PID alone (false)")
      ->capture_default_str();
  sub->add_flag("--no-follow", opts->no_follow,
                "Attach the tree as it is at the start only: processes it makes "
                "during the session are not followed (see docs/cli.md)");
  add_output_option(sub, opts->output);
  sub->add_option("-e,--env", opts->env, "Set NAME=VALUE in each target before the tools load (repeatable)")
      ->allow_extra_args(false);
  auto* keep = sub->add_flag("--keep", opts->keep,
                             "Attach, then exit leaving the tools attached (no lease, no detach; use remora "
                             "detach later)")
                   ->excludes(dur);
  // --keep leaves the tools attached: there is nothing to unload at the end.
  sub->add_flag("--unload", opts->unload,
                "At the end of the session, after the detach, unload the tools and the agent (the process "
                "keeps nothing of Remora's)")
      ->excludes(keep);
  add_timeout_option(sub, opts->timeout_ms, "Deadline for each attach or detach, in milliseconds");
  add_channel_option(sub, opts->channel);
  sub->footer(
      "While attached, remora holds a lease: if it dies, the agent detaches the tools itself.\n"
      "Where ptrace is refused (not dumpable, Yama, no CAP_SYS_PTRACE, a seccomp profile), a\n"
      "process started with remora run --listen is attached through its socket (the process\n"
      "alone, not its tree).\n"
      "The default tool's results land in -o DIR on this side (default ./remora-output), whatever\n"
      "the target's working directory, user or root; -e REMORA_OUTPUT_PATH=... instead names a\n"
      "directory as the target sees it (relative: from its working directory). remora prints\n"
      "the summary.\n"
      "\n"
      "Examples:\n"
      "  remora attach -p 4242 -d 5000\n"
      "  remora attach -p 4242 -d 5000 -o /tmp/profiles\n"
      "  remora attach -p 4242 -t ./libmytool.so -e MYTOOL_LEVEL=2 --attach-children=false\n"
      "  remora attach -p 4242 --keep          # later: remora detach -p 4242 --tree\n"
      "  remora attach -p 4242 -d 5000 --unload  # leave nothing behind\n"
      "  remora attach --slurm 1234 -d 10000    # every rank of Slurm job 1234, one merged profile\n"
      "  remora attach --container web -d 5000  # a podman or docker container's processes\n"
      "\n" +
      exit_code_footer());
  sub->callback([opts, tools, dur, pid, slurm, container, &dispatch] {
    require_target(pid, slurm, container);
    opts->follow = !opts->no_follow;
    opts->tools_given = tools->count() > 0;
    opts->duration_given = dur->count() > 0;
    if (slurm->count() > 0) {
      dispatch.run = [opts] { return slurm::run_front(slurm_options(*opts)); };
      return;
    }
    if (container->count() > 0) {
      dispatch.run = [opts] {
        return run_in_container(opts->container, &opts->pid, [opts] { return run_attach(*opts); });
      };
      return;
    }
    dispatch.run = [opts] { return run_attach(*opts); };
  });
}

}  // namespace remora::cli
