// `remora status`: the agent's view of a process (or of each process of its
// tree): loaded or not, attached or not, which tools, how many sessions, the
// listener thread and who holds the lease. Read from the agent's info block
// through /proc/PID/mem: no thread is stopped.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attach/attach.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/common_options.h"
#include "cli/container.h"
#include "cli/exit_codes.h"
#include "cli/session_args.h"
#include "cli/session_support.h"
#include "cli/slurm_front.h"
#include "procfs/procfs.h"

namespace remora::cli {
namespace {

struct StatusCommandOptions {
  pid_t pid = 0;
  bool tree = false;
  std::string channel = "auto";
  std::string slurm;      // --slurm JOBID[.STEP]
  std::string container;  // --container NAME|ID
};

// "4242 (remora)" while the holder lives; "expired" once it died and the
// agent detached the tools.
std::string describe_lease(const attach::AgentState& st) {
  if (st.lease_expired) return "expired";
  if (st.lease_pid == 0) return "-";
  std::string who = process_comm(st.lease_pid);
  return std::to_string(st.lease_pid) + (who == "?" ? "" : " (" + who + ")");
}

void print_row(pid_t pid, const std::string& comm, const attach::AgentState& st) {
  std::string sessions = std::to_string(st.sessions) + "/" + std::to_string(st.detaches);
  std::string listener = st.listener_tid ? std::to_string(st.listener_tid) : "-";
  std::printf("%-8d %-16s %-6s %-9s %-10s %-9s %-14s %s\n", static_cast<int>(pid), comm.c_str(),
              st.agent_loaded ? "yes" : "no", st.agent_loaded ? (st.attached ? "yes" : "no") : "-",
              st.agent_loaded ? sessions.c_str() : "-", st.agent_loaded ? listener.c_str() : "-",
              st.agent_loaded ? describe_lease(st).c_str() : "-", st.tools.empty() ? "-" : st.tools.c_str());
}

// The channel line: how the session came and how this state was read.
std::string describe_channel(const attach::AgentState& st) {
  if (!st.agent_loaded) return "";
  std::string out;
  if (st.attached)
    out = std::string("session through ") +
          (st.session_channel == attach::Channel::kSocket ? "its socket channel" : "ptrace");
  if (!st.socket.empty())
    out += std::string(out.empty() ? "" : "; ") + "socket channel " + st.socket +
           (st.channel == attach::Channel::kSocket ? " (state read through it)" : "");
  return out;
}

int run_status(const StatusCommandOptions& o) {
  // Before the header: a process that has no user space to read is refused
  // as `remora call` refuses it (status reads, so a tracer or a static
  // program is no refusal here).
  if (auto c = attach::check_target(o.pid, attach::TargetUse::kRead); !c)
    return fail(std::move(c).error().with_context("status of process " + std::to_string(o.pid)));
  auto channel = attach::parse_channel(o.channel);
  if (!channel) return fail(channel.error());
  std::vector<pid_t> pids{o.pid};
  if (o.tree) {
    auto t = attach::Controller::snapshot_tree(o.pid);
    if (!t) return fail(t.error());
    pids = std::move(*t);
  }
  std::printf("%-8s %-16s %-6s %-9s %-10s %-9s %-14s %s\n", "PID", "COMMAND", "AGENT", "ATTACHED", "SESSIONS",
              "LISTENER", "LEASE", "TOOLS");
  int exit_code = 0;
  std::vector<std::pair<pid_t, std::string>> notes, channels;
  std::vector<std::pair<pid_t, pid_t>> namespaced;
  for (pid_t p : pids) {
    std::string comm = process_comm(p);
    auto st = attach::Controller::status(p, *channel);
    if (!st) {
      // The root must be readable; a child that exited meanwhile is only noted.
      if (p == o.pid && !o.tree) return fail(st.error());
      std::printf("%-8d %-16s error: %s\n", static_cast<int>(p), comm.c_str(),
                  st.error().to_string().c_str());
      if (!is_gone(st.error().code()) && exit_code == 0) exit_code = to_int(exit_code_for(st.error().code()));
      continue;
    }
    print_row(p, comm, *st);
    if (!st->message.empty()) notes.emplace_back(p, st->message);
    if (std::string c = describe_channel(*st); !c.empty()) channels.emplace_back(p, c);
    // Pids and tids above are this machine's; a container's own differ.
    if (auto own = procfs::tid_in_target_ns(p, p); own && *own != p) namespaced.emplace_back(p, *own);
  }
  for (const auto& [p, own] : namespaced)
    std::printf("pid %d is pid %d in its own pid namespace (a container)\n", static_cast<int>(p),
                static_cast<int>(own));
  for (const auto& [p, c] : channels) std::printf("pid %d: %s\n", static_cast<int>(p), c.c_str());
  for (const auto& [p, msg] : notes)
    std::printf("pid %d: last agent error: %s\n", static_cast<int>(p), msg.c_str());
  std::fflush(stdout);
  return exit_code;
}

}  // namespace

void add_status_command(CLI::App& root, Dispatch& dispatch) {
  auto opts = std::make_shared<StatusCommandOptions>();
  CLI::App* sub =
      root.add_subcommand("status", "Show the agent's state in a process (or its tree); stops nothing");
  auto* pid = add_pid_option(sub, opts->pid, "Process to inspect");
  auto* slurm = add_slurm_option(
      sub, pid, opts->slurm,
      "The agent state of every rank of this Slurm job (JOBID or JOBID.STEP), on every node, instead of -p");
  auto* container = add_container_option(
      sub, pid, slurm, opts->container,
      "The agent state of this running container's processes (podman or docker: NAME or ID), instead of -p");
  sub->add_flag("--tree", opts->tree, "One line for each process of the tree under PID");
  add_channel_option(sub, opts->channel);
  sub->footer(
      "Columns: AGENT (libremora-agent.so loaded), ATTACHED (tools attached now),\n"
      "SESSIONS (attaches/detaches so far), LISTENER (the agent's thread id), LEASE (pid\n"
      "of the remora holding the lease, '-' none, 'expired' when its holder died and the\n"
      "agent detached the tools), TOOLS (the loaded tool list). A line per process then\n"
      "says how its session came (ptrace or its socket channel) and names the socket of a\n"
      "process that opted in (remora run --listen); the state of a process whose memory\n"
      "cannot be read (not dumpable) is read through that socket.\n"
      "\n" +
      exit_code_footer());
  sub->callback([opts, pid, slurm, container, &dispatch] {
    require_target(pid, slurm, container);
    if (container->count() > 0) {
      opts->tree = true;  // the container's processes, as attach --container attached them
      dispatch.run = [opts] {
        return run_in_container(opts->container, &opts->pid, [opts] { return run_status(*opts); });
      };
      return;
    }
    if (slurm->count() == 0) {
      dispatch.run = [opts] { return run_status(*opts); };
      return;
    }
    dispatch.run = [opts] {
      slurm::FrontOptions f;
      f.job = opts->slurm;
      f.node.op = "status";
      f.node.channel = opts->channel;
      return slurm::run_front(f);
    };
  });
}

}  // namespace remora::cli
