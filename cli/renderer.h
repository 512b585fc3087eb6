// The renderer plugin (src/profile/render_plugin.h), loaded on first use
// from next to the agent: `remora attach` with a tool of one's own never
// loads libdw and libprotobuf.
#pragma once

#include <string>

#include "base/result.h"

namespace remora::cli {

// Renders session directory `dir` (its profile.remora) into its output
// files. `pid`: the target as remora sees it (0: the pid in the records).
Result<void> render_session(const std::string& dir, pid_t pid);

// Merges the rendered sessions of a Slurm job's ranks (JOB_DIR/job.json,
// profile/job.h) into one profile in JOB_DIR: trace.perfetto,
// profile.pb.gz, flamegraph.svg, folded.txt, ranks.csv and summary.txt,
// which says what was merged and what was left out (profile/merge.h).
// Fails with kNotSupported when the renderer cannot be loaded or predates
// the merge, else as merge_job does.
Result<void> merge_job(const std::string& job_dir);

}  // namespace remora::cli
