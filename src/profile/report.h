// Rendering a session: from the raw records a default-tool session left in
// its output directory (profile.remora) and the names collected at its
// detach (collect.h, names.h) to every output file, in the controller.
// `remora attach` collects and renders each session as it ends; `remora
// report DIR` renders one again later, on this machine or another, with the
// same outputs byte for byte (apart from summary.txt naming the directory)
// whatever became of the process and its files; better only where a debug
// file has become available for an object named without DWARF, and the
// summary then says so.
//
// Rendering reads the session directory and this machine's debug files,
// never a live process.
#ifndef REMORA_PROFILE_REPORT_H_
#define REMORA_PROFILE_REPORT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "base/result.h"

namespace remora::profile {

struct RenderOptions {
  // Directories searched for debug files by build ID before /usr/lib/debug;
  // REMORA_DEBUG_PATH (colon-separated) is appended.
  std::vector<std::string> debug_dirs;
};

struct RenderResult {
  std::string dir;
  std::vector<std::string> files;     // written, summary.txt first
  std::vector<std::string> warnings;  // also in summary.txt
  size_t improved_objects = 0;        // objects named anew from debug files found since the collection
};

// The output files, in the order they are listed to the user.
const std::vector<std::string>& output_files();

// Renders DIR/profile.remora into DIR's output files (each replaced
// atomically: a reader never sees half a file). A directory without
// names.json (an older remora's session) is first collected from this
// machine's files only.
Result<RenderResult> render_session(const std::string& dir, const RenderOptions& options = {});

}  // namespace remora::profile

#endif  // REMORA_PROFILE_REPORT_H_
