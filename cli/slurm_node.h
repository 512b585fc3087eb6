// The node side of `remora attach|detach|status --slurm` (slurm_node.cc),
// as the front starts it: `remora slurm-node ...` under srun.
#pragma once

#include <string>
#include <vector>

namespace remora::cli::slurm {

struct NodeOptions {
  std::string op = "attach";  // attach, detach (sessions kept with --keep), status
  std::string job, step;      // step "": every step (slurm_job.h, select_ranks)
  std::string tools;          // -t's value, when given
  bool tools_given = false;
  std::vector<std::string> env;  // -e NAME=VALUE
  long timeout_ms = 10000;       // each attach or detach
  std::string channel = "auto";
  bool keep = false, unload = false, follow = true;
  // The front's job directory and the token it left there: a node that
  // reads the same token there writes its outputs into it directly.
  std::string shared_dir, token;
  std::string transport = "auto";  // auto, stream (never the shared directory), shared
  // The front says "alive" every second during the session; this long
  // without a word, the node side takes it for dead and detaches (a front
  // killed together with its srun leaves the step running).
  long front_timeout_ms = 10000;
};

// The command line that starts the node side (after srun's own options).
std::vector<std::string> node_argv(const std::string& remora, const NodeOptions& o);

}  // namespace remora::cli::slurm
