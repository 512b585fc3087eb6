// `remora detach`: detaches whatever tools are attached to a process (or to
// every process of its tree), whoever attached them: the truth is in the
// agent, so this works from any shell, e.g. after `remora attach --keep`.
// With --unload the agent and the tools then leave the process as well.
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

namespace remora::cli {
namespace {

struct DetachCommandOptions {
  pid_t pid = 0;
  bool tree = false;
  bool unload = false;
  long timeout_ms = 10000;
  std::string channel = "auto";
  std::string slurm;      // --slurm JOBID[.STEP]
  std::string container;  // --container NAME|ID
};

// What a process had attached, read before the detach (the agent forgets it).
std::string tools_of(pid_t pid, attach::Channel channel) {
  auto st = attach::Controller::status(pid, channel);
  return st && st->attached ? st->tools : std::string();
}

int run_detach(const DetachCommandOptions& o) {
  // The process itself first, as `remora call` and `remora attach` refuse it.
  auto channel = attach::parse_channel(o.channel);
  if (!channel) return fail(channel.error());
  auto via = attach::resolve_channel(o.pid, *channel,
                                     o.tree ? attach::TargetUse::kTree : attach::TargetUse::kProcess);
  if (!via) return fail(std::move(via).error().with_context("detach from process " + std::to_string(o.pid)));
  if (*via == attach::Channel::kSocket && o.tree)
    return fail(Error(Errc::kNotSupported,
                      "--tree reaches processes through ptrace, which process " + std::to_string(o.pid) +
                          " refuses: detach each process of the tree with remora detach -p"));
  // Signals wait until the detach is over (see StopSignals).
  auto signals = StopSignals::install();
  if (!signals) return fail(signals.error());
  attach::DetachOptions dopts;
  dopts.timeout = std::chrono::milliseconds(o.timeout_ms);
  dopts.unload = o.unload;
  dopts.channel = *via == attach::Channel::kSocket ? attach::Channel::kSocket : *channel;
  attach::Controller ctl;
  if (!o.tree) {
    std::string tools = tools_of(o.pid, dopts.channel);
    auto r = ctl.detach(o.pid, dopts);
    if (!r) {
      if (r.error().code() == Errc::kNotAttached)
        print_error(r.error().to_string() + " (remora status -p " + std::to_string(o.pid) +
                    " shows the agent's state; --tree detaches the children too)");
      else
        print_error(r.error().to_string());
      return to_int(exit_code_for(r.error().code()));
    }
    if (o.unload) {
      std::printf("%s process %d (%s): %s.\n",
                  tools.empty() ? "Unloaded Remora from" : ("Detached " + tools + " from").c_str(),
                  static_cast<int>(o.pid), process_comm(o.pid).c_str(), describe_unload(*r).c_str());
      warn_kept_tools(o.pid, *r);
      return 0;
    }
    std::printf("Detached %s from process %d (%s).\n", tools.empty() ? "the tools" : tools.c_str(),
                static_cast<int>(o.pid), process_comm(o.pid).c_str());
    return 0;
  }

  auto pids = attach::Controller::snapshot_tree(o.pid);
  if (!pids) return fail(pids.error());
  std::vector<std::string> comms;
  for (pid_t p : *pids) comms.push_back(process_comm(p));
  auto r = ctl.detach_tree(o.pid, dopts);
  if (!r) return fail(r.error());
  size_t detached = 0, not_attached = 0;
  int exit_code = 0;
  print_outcome_header(stdout);
  for (const auto& d : *r) {
    std::string comm = "?";
    for (size_t i = 0; i < pids->size(); ++i)
      if ((*pids)[i] == d.pid) comm = comms[i];
    std::string result;
    if (d.ok) {
      ++detached;
      result = o.unload ? "detached, " + describe_unload(d.unload) : "detached";
      if (o.unload) warn_kept_tools(d.pid, d.unload);
    } else if (d.code == Errc::kNotAttached) {
      ++not_attached;
      result = "not attached";
    } else if (is_gone(d.code)) {
      result = "exited";
    } else {
      result = "failed: " + d.message;
      if (exit_code == 0) exit_code = to_int(exit_code_for(d.code));
    }
    print_outcome(stdout, d.pid, comm, result);
  }
  std::printf("Detached from %s of %s.\n", count_noun(detached, "process", "processes").c_str(),
              count_noun(r->size(), "process", "processes").c_str());
  std::fflush(stdout);
  if (exit_code == 0 && detached == 0) {
    print_error("nothing is attached in the tree of process " + std::to_string(o.pid));
    exit_code = to_int(ExitCode::kSessionState);
  }
  return exit_code;
}

}  // namespace

void add_detach_command(CLI::App& root, Dispatch& dispatch) {
  auto opts = std::make_shared<DetachCommandOptions>();
  CLI::App* sub = root.add_subcommand("detach", "Detach the tools attached to a process (or its tree)");
  auto* pid = add_pid_option(sub, opts->pid, "Process to detach from");
  auto* slurm = add_slurm_option(sub, pid, opts->slurm,
                                 "Detach every rank of this Slurm job (JOBID or JOBID.STEP) on every node, "
                                 "instead of -p (after attach --slurm --keep)");
  auto* container = add_container_option(
      sub, pid, slurm, opts->container,
      "Detach from this running container's processes (podman or docker: NAME or ID), instead of -p");
  sub->add_flag("--tree", opts->tree, "Detach from every process of the tree under PID");
  sub->add_flag(
      "--unload", opts->unload,
      "Then unload the tools and the agent: the process keeps no descriptor or mapping of Remora's");
  add_timeout_option(sub, opts->timeout_ms, "Deadline for each detach, in milliseconds");
  add_channel_option(sub, opts->channel);
  sub->footer(
      "Works whoever attached the tools (remora attach --keep, another program): the\n"
      "agent in each process knows. With --tree, processes with nothing attached are\n"
      "listed as such; exit code 13 only when nothing at all was attached.\n"
      "--unload also takes the agent and the tools out (after a plain detach too); a tool\n"
      "that cannot be unloaded is named in a warning and the rest is unloaded.\n"
      "\n" +
      exit_code_footer());
  sub->callback([opts, pid, slurm, container, &dispatch] {
    require_target(pid, slurm, container);
    if (container->count() > 0) {
      opts->tree = true;  // the container's processes, as attach --container attached them
      dispatch.run = [opts] {
        return run_in_container(opts->container, &opts->pid, [opts] { return run_detach(*opts); });
      };
      return;
    }
    if (slurm->count() == 0) {
      dispatch.run = [opts] { return run_detach(*opts); };
      return;
    }
    dispatch.run = [opts] {
      slurm::FrontOptions f;
      f.job = opts->slurm;
      f.node.op = "detach";
      f.node.timeout_ms = opts->timeout_ms;
      f.node.channel = opts->channel;
      f.node.unload = opts->unload;
      return slurm::run_front(f);
    };
  });
}

}  // namespace remora::cli
