// `remora slurm-node`: the part of `remora attach|detach|status --slurm`
// that runs on each node of the job, started there by the front's srun as a
// step of the job (--overlap: it takes no resource of the job's). It finds
// the job's ranks on its node (scontrol listpids), attaches each with its
// tree through the same Controller as `remora attach -p`, holds their lease
// for the session, and at the end detaches, renders each rank's session
// here (where its binaries and debug info are) and sends the outputs back.
//
// It speaks only the wire of slurm_job.h on its standard output; everything
// meant for a person goes to standard error, which srun carries to the
// front as well. Its standard input carries the front's commands; their end
// (the front or its srun died) detaches, as does SIGTERM (srun's on Ctrl-C
// or scancel). If this process itself is killed, the lease detaches.
#include "cli/slurm_node.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attach/attach.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/renderer.h"
#include "cli/session_args.h"
#include "cli/session_support.h"
#include "cli/slurm_job.h"
#include "cli/slurm_support.h"

extern char** environ;

namespace remora::cli::slurm {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// The wire's writing end: the real standard output, kept aside so that a
// stray printf (ours or a library's) cannot corrupt it.
class Wire {
 public:
  Wire() {
    fd_ = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  void send(const json& event) {
    std::string line = event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    alive_ = alive_ && write_all(fd_, line.data(), line.size());
  }
  void send_file(const std::string& rel, const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream data;
    data << in.rdbuf();
    const std::string bytes = data.str();
    send({{"ev", "file"}, {"path", rel}, {"size", bytes.size()}});
    alive_ = alive_ && write_all(fd_, bytes.data(), bytes.size());
  }
  bool alive() const { return alive_; }

 private:
  int fd_ = -1;
  bool alive_ = true;
};

// The front's commands, a line at a time; "ping SEQ" is answered at once
// with this node's clock.
class Commands {
 public:
  explicit Commands(Wire& wire) : wire_(wire) {
    ::fcntl(STDIN_FILENO, F_SETFL, ::fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
  }
  // Reads what came; answers pings. Returns the other commands, in order.
  std::vector<std::string> read() {
    std::vector<std::string> got;
    if (!open_) return got;
    open_ = drain(STDIN_FILENO, buf_);
    size_t nl;
    while ((nl = buf_.find('\n')) != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      last_heard_ = std::chrono::steady_clock::now();
      if (line.rfind("ping ", 0) == 0) {
        wire_.send({{"ev", "pong"}, {"seq", line.substr(5)}, {"mono_ns", mono_ns()}});
      } else if (!line.empty()) {
        got.push_back(line);
      }
    }
    return got;
  }
  bool open() const { return open_; }
  // Since the front last said anything (it says "alive" every second).
  std::chrono::steady_clock::duration silence() const {
    return std::chrono::steady_clock::now() - last_heard_;
  }

 private:
  Wire& wire_;
  std::string buf_;
  bool open_ = true;
  std::chrono::steady_clock::time_point last_heard_ = std::chrono::steady_clock::now();
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string read_link(const std::string& path) {
  std::error_code ec;
  auto target = std::filesystem::read_symlink(path, ec);
  return ec ? "" : target.string();
}

std::string node_name() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n && *n) return n;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// The job's ranks on this node, as roots of the trees to attach: never a
// remora (another `--slurm` command's step on this node).
Result<std::vector<ListedPid>> find_ranks(const NodeOptions& o, const std::string& node) {
  auto r = run_capture({"scontrol", "listpids", o.job, node}, 30s);
  if (!r) return std::move(r).error();
  if (!WIFEXITED(r->status) || WEXITSTATUS(r->status) != 0)
    return Error(Errc::kNoSuchProcess, "scontrol listpids " + o.job + " " + node + " failed: " + r->err);
  const char* own = std::getenv("SLURM_STEP_ID");
  auto ranks = select_ranks(parse_listpids(r->out), o.step, own ? own : "");
  const std::string self = read_link("/proc/self/exe");
  std::erase_if(ranks, [&](const ListedPid& p) {
    return read_link("/proc/" + std::to_string(p.pid) + "/exe") == self;
  });
  return ranks;
}

json identity_of(pid_t pid) {
  auto id = rank_from_environ(read_file("/proc/" + std::to_string(pid) + "/environ"));
  return {{"rank", id.rank}, {"local_rank", id.local_rank}, {"step", id.step}};
}

// Where this node's ranks write their sessions: the front's job directory
// when this node sees it (the token the front left there proves it is the
// same directory, not a namesake), else a directory of this node's own,
// whose files then travel back through srun's output.
struct NodeOutput {
  std::string dir;      // REMORA_OUTPUT_PATH of the ranks
  bool shared = false;  // the front reads it directly
};
NodeOutput plan_output(const NodeOptions& o, const std::string& node) {
  NodeOutput out;
  if (o.transport != "stream" && !o.shared_dir.empty() &&
      read_file(o.shared_dir + "/.remora-token") == o.token && !o.token.empty()) {
    out.dir = o.shared_dir + "/" + node;
    ::mkdir(out.dir.c_str(), 0755);
    if (::access(out.dir.c_str(), W_OK) == 0) {
      out.shared = true;
      return out;
    }
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string top = tmp && *tmp ? tmp : "/tmp";
  std::string base = top + "/remora-slurm-" + o.job + "-u" + std::to_string(::getuid());
  ::mkdir(base.c_str(), 0700);
  // A shared /tmp: the name must be our own directory, not one (or a link)
  // another user made first; else a fresh one (a later detach --slurm of a
  // --keep session then does not find its outputs here, and says none came).
  struct stat st {};
  if (::lstat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() ||
      (st.st_mode & 077) != 0) {
    std::string pattern = top + "/remora-slurm-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) base = pattern;
  }
  out.dir = base + "/" + node;
  ::mkdir(out.dir.c_str(), 0700);
  return out;
}

// Renders each session found under the output directory and announces it;
// through the stream, sends its files and removes it.
void send_outputs(Wire& wire, const NodeOutput& out, const std::string& node, const std::vector<pid_t>& pids,
                  std::chrono::system_clock::time_point since, const std::set<std::string>& before) {
  // Only the processes of this session: the directory may hold what a
  // session whose front died left behind.
  std::vector<OutputDir> dirs;
  for (auto& d : find_outputs(out.dir, pids, since, before))
    if (std::find(pids.begin(), pids.end(), d.host_pid ? d.host_pid : d.pid) != pids.end()) dirs.push_back(d);
  // Rendering (naming every address with the node's DWARF) is most of the
  // time after the window: up to four ranks at a time.
  std::vector<std::string> errors(dirs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < dirs.size();) {
      auto r = render_session(dirs[i].path, dirs[i].host_pid ? dirs[i].host_pid : dirs[i].pid);
      if (!r) errors[i] = r.error().to_string();
    }
  };
  const size_t workers =
      std::min<size_t>(dirs.size(), std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < dirs.size(); ++i) {
    const OutputDir& d = dirs[i];
    const std::string base = d.path.substr(d.path.rfind('/') + 1);
    const std::string rel = node + "/" + base;
    json ev = {{"ev", "output"}, {"pid", d.host_pid ? d.host_pid : d.pid}, {"dir", rel}};
    if (!errors[i].empty()) ev["error"] = errors[i];
    if (!out.shared) {
      DIR* dir = ::opendir(d.path.c_str());
      std::vector<std::string> names;
      while (dir) {
        dirent* e = ::readdir(dir);
        if (!e) break;
        struct stat st {};
        std::string path = d.path + "/" + e->d_name;
        if (e->d_name[0] != '.' && ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
          names.push_back(e->d_name);
      }
      if (dir) ::closedir(dir);
      std::sort(names.begin(), names.end());
      for (const auto& n : names) wire.send_file(rel + "/" + n, d.path + "/" + n);
      std::filesystem::remove_all(d.path);
    }
    wire.send(ev);
  }
  if (!out.shared) {  // the "-latest" links of what was sent point nowhere now
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(out.dir, ec))
      if (e.is_symlink(ec) && !std::filesystem::exists(e.path(), ec)) std::filesystem::remove(e.path(), ec);
  }
}

// One process attached on this node while the session runs.
struct NodeProc {
  pid_t pid = 0, root = 0;
  UniqueFd pidfd;
  bool exited = false;
};

// The node side's first word: who and where it is, and (for an attach or
// a detach) which way its outputs will travel.
json hello_event(const std::string& node, const NodeOutput* out) {
  json ev = {{"ev", "hello"}, {"node", node}, {"pid", ::getpid()}, {"mono_ns", mono_ns()}};
  if (out) ev["transport"] = out->shared ? "shared" : "stream";
  return ev;
}

json done_event(int code) { return {{"ev", "done"}, {"code", code}}; }

int send_failure(Wire& wire, const Error& e) {
  const int code = to_int(exit_code_for(e.code()));
  wire.send({{"ev", "error"}, {"message", e.to_string()}, {"code", code}});
  wire.send(done_event(code));
  return code;
}

// A node of the job where none of its tasks runs (an allocation larger
// than its steps): said, not a failure.
int send_empty(Wire& wire, const NodeOptions& o, const std::string& node) {
  wire.send({{"ev", "empty"},
             {"message",
              "no task of job " + o.job + (o.step.empty() ? "" : " step " + o.step) + " runs on " + node}});
  wire.send(done_event(0));
  return 0;
}

// Until the front says `word` (answering its pings meanwhile): false when
// it went away, a stop signal came or `limit` passed.
bool wait_for(Commands& cmds, StopSignals& signals, const std::string& word,
              std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    for (const auto& c : cmds.read()) {
      if (c == word) return true;
      if (c == "detach") return false;  // stopped before it began
    }
    if (!cmds.open() || signals.take()) return false;
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    ::poll(fds, 2, 200);
  }
  return false;
}

json proc_event(const attach::ProcessOutcome& oc, pid_t root) {
  json ev = identity_of(oc.pid);
  ev.update({{"ev", "proc"},
             {"pid", oc.pid},
             {"root", root},
             {"comm", process_comm(oc.pid)},
             {"ok", oc.ok},
             {"gone", !oc.ok && is_gone(oc.code)},
             {"result", describe_attach(oc)},
             {"code", oc.ok ? 0 : to_int(exit_code_for(oc.code))}});
  return ev;
}

// The session on this node: until the front says detach, stops talking, or
// a stop signal comes (srun forwards Ctrl-C and scancel's SIGTERM), or
// every process is gone. New processes of the trees are followed.
void hold_session(Wire& wire, Commands& cmds, StopSignals& signals, attach::Controller& ctl,
                  const attach::AttachOptions& opts, const std::vector<pid_t>& roots, bool follow,
                  std::chrono::milliseconds front_timeout, std::vector<NodeProc>& procs) {
  auto next_follow = std::chrono::steady_clock::now();
  for (;;) {
    for (const auto& c : cmds.read())
      if (c == "detach") return;
    if (!cmds.open()) {
      std::fprintf(stderr, "remora: the front went away: detaching\n");
      return;
    }
    // A front killed with its srun leaves this step running with its input
    // open: silence past the limit is taken for the front's death.
    if (cmds.silence() > front_timeout) {
      std::fprintf(stderr, "remora: nothing from the front for %ld ms: detaching\n",
                   static_cast<long>(front_timeout.count()));
      return;
    }
    if (signals.take()) return;
    if (follow && std::chrono::steady_clock::now() >= next_follow) {
      for (pid_t root : roots) {
        auto events = ctl.follow_poll(root, opts);
        if (!events) continue;
        for (const auto& e : *events) {
          if (e.kind == attach::FollowEvent::Kind::kFailed) continue;
          if (std::any_of(procs.begin(), procs.end(), [&](const NodeProc& p) { return p.pid == e.pid; }))
            continue;
          attach::ProcessOutcome oc = e.outcome;
          oc.pid = e.pid;
          oc.ok = true;
          wire.send(proc_event(oc, root));
          procs.push_back({e.pid, root, open_pidfd(e.pid), false});
        }
      }
      next_follow = std::chrono::steady_clock::now() + 100ms;
    }
    std::vector<pollfd> fds = {{STDIN_FILENO, POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    std::vector<NodeProc*> watched;
    for (auto& p : procs)
      if (!p.exited && p.pidfd) {
        fds.push_back({p.pidfd.get(), POLLIN, 0});
        watched.push_back(&p);
      }
    if (watched.empty()) return;  // every process is gone
    ::poll(fds.data(), fds.size(), follow ? 100 : 1000);
    for (size_t i = 0; i < watched.size(); ++i) {
      if (!fds[i + 2].revents) continue;
      NodeProc& p = *watched[i];
      p.exited = true;
      auto status = exit_status(p.pid, p.pidfd.get());
      wire.send({{"ev", "exit"},
                 {"pid", p.pid},
                 {"signaled", status && WIFSIGNALED(*status)},
                 {"how", status ? describe_exit_status(*status) : "exited"}});
    }
  }
}

Result<attach::AttachOptions> attach_options(const NodeOptions& o, const NodeOutput& out,
                                             bool* default_tool) {
  auto given = parse_env_list(o.env);
  if (!given) return std::move(given).error();
  EnvList env = forwarded_environment(environ);
  for (auto& [name, value] : *given) set_env(env, name, value);
  auto tools = select_tools(o.tools_given ? std::optional<std::string>(o.tools) : std::nullopt);
  if (!tools) return std::move(tools).error();
  *default_tool = tools->default_tool;
  // The job's outputs are collected from one place per node: remora picks it.
  if (tools->default_tool) set_env(env, "REMORA_OUTPUT_PATH", out.dir);
  auto channel = attach::parse_channel(o.channel);
  if (!channel) return std::move(channel).error();
  attach::AttachOptions opts;
  opts.tools = tools->paths;
  opts.env = std::move(env);
  opts.timeout = std::chrono::milliseconds(o.timeout_ms);
  opts.lease = !o.keep;
  opts.channel = *channel;
  return opts;
}

// How one rank's attach went: its outcomes (the rank's tree), or why not.
struct RankAttach {
  std::vector<attach::ProcessOutcome> outcomes;
  bool followed = false;  // its tree is followed (ptrace); a socket's process is alone
};

RankAttach attach_rank(attach::Controller& ctl, const attach::AttachOptions& opts, const ListedPid& rank,
                       bool follow) {
  RankAttach out;
  auto failed = [&](const Error& e) {
    attach::ProcessOutcome oc;
    oc.pid = rank.pid;
    oc.code = e.code();
    oc.message = e.to_string();
    out.outcomes.push_back(oc);
    return out;
  };
  // Where ptrace is refused (a pod, a non-dumpable rank) a rank that opted
  // in is attached through its socket: the process alone, as remora
  // attach -p does it.
  auto via = attach::resolve_channel(rank.pid, opts.channel, attach::TargetUse::kTree);
  if (via && *via == attach::Channel::kSocket) {
    attach::AttachOptions socket_opts = opts;
    socket_opts.channel = attach::Channel::kSocket;
    auto oc = ctl.attach(rank.pid, socket_opts);
    if (!oc) return failed(oc.error());
    out.outcomes.push_back(*oc);
    return out;
  }
  if (follow) {
    if (auto f = ctl.follow_start(rank.pid); !f)
      std::fprintf(stderr, "remora: pid %d: not followed: %s\n", static_cast<int>(rank.pid),
                   f.error().to_string().c_str());
    else
      out.followed = true;
  }
  auto outcomes = ctl.attach_tree(rank.pid, opts);
  if (!outcomes) return failed(outcomes.error());
  out.outcomes = std::move(*outcomes);
  return out;
}

// Attaches every rank's tree, up to four ranks at a time (the Controller
// runs different processes' operations concurrently: a node's ranks wait
// on their own loaders in parallel); one "proc" event per process, in rank
// order.
std::vector<NodeProc> attach_ranks(Wire& wire, attach::Controller& ctl, const attach::AttachOptions& opts,
                                   const std::vector<ListedPid>& ranks, bool follow,
                                   std::vector<pid_t>* followed) {
  std::vector<RankAttach> done(ranks.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < ranks.size();) done[i] = attach_rank(ctl, opts, ranks[i], follow);
  };
  const size_t workers =
      std::min<size_t>(ranks.size(), std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  std::vector<NodeProc> procs;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (done[i].followed) followed->push_back(ranks[i].pid);
    for (const auto& oc : done[i].outcomes) {
      wire.send(proc_event(oc, ranks[i].pid));
      if (oc.ok) procs.push_back({oc.pid, ranks[i].pid, open_pidfd(oc.pid), false});
    }
  }
  return procs;
}

int node_attach(const NodeOptions& o, Wire& wire, Commands& cmds, StopSignals& signals) {
  const std::string node = node_name();
  const NodeOutput out = plan_output(o, node);
  wire.send(hello_event(node, &out));
  // At once: the front measures this node's clock once the ranks are
  // attached (its pings are answered in the session's loop).
  auto ranks = find_ranks(o, node);
  if (!ranks) return send_failure(wire, ranks.error());
  if (ranks->empty()) return send_empty(wire, o, node);
  bool default_tool = false;
  auto opts = attach_options(o, out, &default_tool);
  if (!opts) return send_failure(wire, opts.error());
  const auto before = default_tool ? existing_outputs(out.dir) : std::set<std::string>{};
  const auto wall_start = std::chrono::system_clock::now();
  attach::Controller ctl;
  const bool follow = o.follow && !o.keep;
  std::vector<pid_t> roots;  // the trees followed during the session
  std::vector<NodeProc> procs = attach_ranks(wire, ctl, *opts, *ranks, follow, &roots);
  wire.send({{"ev", "attached"}, {"count", procs.size()}});
  if (o.keep || procs.empty()) {
    wire.send(done_event(procs.empty() ? to_int(ExitCode::kNoTarget) : 0));
    return 0;
  }
  hold_session(wire, cmds, signals, ctl, *opts, roots, follow, std::chrono::milliseconds(o.front_timeout_ms),
               procs);

  attach::DetachOptions dopts;
  dopts.timeout = std::chrono::milliseconds(o.timeout_ms);
  dopts.unload = o.unload;
  for (const auto& d : ctl.detach_sessions(dopts))
    wire.send(
        {{"ev", "detached"},
         {"pid", d.pid},
         {"ok", d.ok},
         {"gone", !d.ok && is_gone(d.code)},
         {"result", d.ok ? (o.unload ? describe_unload(d.unload) : "detached") : "failed: " + d.message}});
  if (default_tool) {
    std::vector<pid_t> pids;
    for (const auto& p : procs) pids.push_back(p.pid);
    send_outputs(wire, out, node, pids, wall_start, before);
  }
  wire.send(done_event(0));
  return 0;
}

int node_status(const NodeOptions& o, Wire& wire) {
  const std::string node = node_name();
  wire.send(hello_event(node, nullptr));
  auto ranks = find_ranks(o, node);
  if (!ranks) return send_failure(wire, ranks.error());
  if (ranks->empty()) return send_empty(wire, o, node);
  auto channel = attach::parse_channel(o.channel);
  if (!channel) return send_failure(wire, channel.error());
  for (const auto& rank : *ranks) {
    auto tree = attach::Controller::snapshot_tree(rank.pid);
    for (pid_t p : tree ? *tree : std::vector<pid_t>{rank.pid}) {
      json ev = identity_of(p);
      ev.update({{"ev", "status"}, {"pid", p}, {"root", rank.pid}, {"comm", process_comm(p)}});
      auto st = attach::Controller::status(p, *channel);
      if (!st) {
        ev["error"] = st.error().to_string();
      } else {
        ev.update({{"agent", st->agent_loaded},
                   {"attached", st->attached},
                   {"sessions", st->sessions},
                   {"tools", st->tools},
                   {"lease_pid", st->lease_pid},
                   {"lease_expired", st->lease_expired},
                   {"channel", st->session_channel == attach::Channel::kSocket ? "socket" : "ptrace"}});
      }
      wire.send(ev);
    }
  }
  wire.send(done_event(0));
  return 0;
}

// Detaches sessions left attached by `remora attach --slurm --keep`; their
// outputs are where that command's node side pointed them (plan_output).
int node_detach(const NodeOptions& o, Wire& wire, Commands& cmds, StopSignals& signals) {
  const std::string node = node_name();
  const NodeOutput out = plan_output(o, node);
  wire.send(hello_event(node, &out));
  // The front measures this node's clock (pings), then says detach.
  if (!wait_for(cmds, signals, "detach", 120s)) {
    wire.send(done_event(0));
    return 0;
  }
  auto ranks = find_ranks(o, node);
  if (!ranks) return send_failure(wire, ranks.error());
  if (ranks->empty()) return send_empty(wire, o, node);
  // The sessions were begun by the attach (their directories are named
  // then) and are finished by this detach: the newest of each process.
  const std::set<std::string> before;
  const std::chrono::system_clock::time_point since{};
  attach::Controller ctl;
  attach::DetachOptions dopts;
  dopts.timeout = std::chrono::milliseconds(o.timeout_ms);
  dopts.unload = o.unload;
  std::vector<pid_t> pids;
  for (const auto& rank : *ranks) {
    auto r = ctl.detach_tree(rank.pid, dopts);
    if (!r) {
      wire.send({{"ev", "detached"},
                 {"pid", rank.pid},
                 {"ok", false},
                 {"result", "failed: " + r.error().to_string()}});
      continue;
    }
    for (const auto& d : *r) {
      pids.push_back(d.pid);
      json ev = identity_of(d.pid);
      ev.update({{"ev", "detached"},
                 {"pid", d.pid},
                 {"comm", process_comm(d.pid)},
                 {"ok", d.ok},
                 {"gone", !d.ok && is_gone(d.code)},
                 {"result", d.ok ? "detached" : "failed: " + d.message}});
      wire.send(ev);
    }
  }
  send_outputs(wire, out, node, pids, since, before);
  wire.send(done_event(0));
  return 0;
}

int run_node(const NodeOptions& o) {
  ::signal(SIGPIPE, SIG_IGN);  // a front gone mid-write: the write fails, we detach
  Wire wire;
  auto signals = StopSignals::install();
  if (!signals) return send_failure(wire, signals.error());
  Commands cmds(wire);
  if (o.op == "status") return node_status(o, wire);
  if (o.op == "detach") return node_detach(o, wire, cmds, *signals);
  return node_attach(o, wire, cmds, *signals);
}

}  // namespace

std::vector<std::string> node_argv(const std::string& remora, const NodeOptions& o) {
  std::vector<std::string> a = {remora, "slurm-node", "--op", o.op, "--job", o.job};
  if (!o.step.empty()) a.insert(a.end(), {"--step", o.step});
  if (o.tools_given) a.insert(a.end(), {"--tools", o.tools});
  for (const auto& e : o.env) a.insert(a.end(), {"--env", e});
  a.insert(a.end(),
           {"--timeout", std::to_string(o.timeout_ms), "--channel", o.channel, "--transport", o.transport});
  if (o.keep) a.push_back("--keep");
  if (o.unload) a.push_back("--unload");
  if (!o.follow) a.push_back("--no-follow");
  a.insert(a.end(), {"--front-timeout", std::to_string(o.front_timeout_ms)});
  if (!o.shared_dir.empty()) a.insert(a.end(), {"--shared-dir", o.shared_dir, "--token", o.token});
  return a;
}

}  // namespace remora::cli::slurm

namespace remora::cli {

void add_slurm_node_command(CLI::App& root, Dispatch& dispatch) {
  auto o = std::make_shared<slurm::NodeOptions>();
  CLI::App* sub = root.add_subcommand(
      "slurm-node", "Internal: the node side of remora attach|detach|status --slurm, started by srun");
  sub->group("");  // not listed in --help: people use --slurm
  sub->add_option("--op", o->op)->check(CLI::IsMember({"attach", "detach", "status"}));
  sub->add_option("--job", o->job)->required();
  sub->add_option("--step", o->step);
  auto* tools = sub->add_option("--tools", o->tools);
  sub->add_option("--env", o->env)->allow_extra_args(false);  // one NAME=VALUE each, as node_argv writes
  sub->add_option("--timeout", o->timeout_ms);
  sub->add_option("--front-timeout", o->front_timeout_ms);
  sub->add_option("--channel", o->channel);
  sub->add_option("--transport", o->transport)->check(CLI::IsMember({"auto", "stream", "shared"}));
  sub->add_flag("--keep", o->keep);
  sub->add_flag("--unload", o->unload);
  auto* no_follow = sub->add_flag("--no-follow");
  sub->add_option("--shared-dir", o->shared_dir);
  sub->add_option("--token", o->token);
  sub->callback([o, tools, no_follow, &dispatch] {
    o->tools_given = tools->count() > 0;
    o->follow = no_follow->count() == 0;
    dispatch.run = [o] { return slurm::run_node(*o); };
  });
}

}  // namespace remora::cli
