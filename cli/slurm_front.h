// `remora attach|detach|status --slurm JOBID[.STEP]`: the front, where the
// user typed the command (slurm_front.cc). It starts the node side
// (slurm_node.h) on every node of the job with srun, talks to each over
// srun's standard streams, and brings their outputs into one job directory
// that it renders as one profile.
#pragma once

#include <string>

#include "cli/slurm_node.h"

namespace remora::cli::slurm {

struct FrontOptions {
  std::string job;   // JOBID[.STEP] as typed
  NodeOptions node;  // op, tools, env, timeouts, channel, keep, unload, follow
  long duration_ms = 0;
  bool duration_given = false;
  // A node that sends nothing for this long (while an answer is due) is
  // given up: its srun is stopped and the node reported as failed.
  long node_timeout_ms = 30000;
  // -o DIR: where the job directory is made ("": REMORA_OUTPUT_PATH, else
  // ./remora-output).
  std::string output;
};

int run_front(const FrontOptions& o);

}  // namespace remora::cli::slurm
