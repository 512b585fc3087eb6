// Rendering a session: from the raw records a default-tool session left in
// its output directory (profile.remora) to every output file, in the
// controller. `remora attach` renders each session as it ends; `remora
// report DIR` renders one again later (other debug info installed since, a
// newer remora).
//
// JIT names come from the target's perf maps, read while it lives (a JVM is
// asked for one first: jcmd PID Compiler.perfmap) and kept in DIR as
// perf-PID.map, so that a later render names the same frames.
#ifndef REMORA_PROFILE_REPORT_H_
#define REMORA_PROFILE_REPORT_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/result.h"

namespace remora::profile {

struct RenderOptions {
  // The target's pid as this process sees it (0: the pid the records
  // carry, right when the controller shares the target's pid namespace).
  pid_t pid = 0;
  // Directories searched for debug files by build ID before /usr/lib/debug;
  // REMORA_DEBUG_PATH (colon-separated) is appended.
  std::vector<std::string> debug_dirs;
  // Ask a live JVM for its perf map (jcmd Compiler.perfmap) before reading it.
  bool ask_jvm = true;
};

struct RenderResult {
  std::string dir;
  std::vector<std::string> files;     // written, summary.txt first
  std::vector<std::string> warnings;  // also in summary.txt
  bool target_alive = false;          // files were read through the live target's root
};

// The output files, in the order they are listed to the user.
const std::vector<std::string>& output_files();

// Renders DIR/profile.remora into DIR's output files (each replaced
// atomically: a reader never sees half a file).
Result<RenderResult> render_session(const std::string& dir, const RenderOptions& options = {});

}  // namespace remora::profile

#endif  // REMORA_PROFILE_REPORT_H_
