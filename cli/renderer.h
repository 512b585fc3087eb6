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

}  // namespace remora::cli
