// Collecting a session: at the detach, while the process and its files are
// there, whatever naming its records needs goes into the session directory,
// so that every render after it (report.h) reads that directory alone:
//   names.json      every sampled address named, the objects with their
//                   build IDs, the naming's warnings (names.h)
//   perf-PID.map    the target's perf maps, read safely (a JVM is asked for
//                   one first: jcmd PID Compiler.perfmap, removed again from
//                   its /tmp once read)
//   host-tids       for a process in a pid namespace of its own: each live
//                   thread's id there and on the host ("NS HOST" lines)
// Only this step opens the live process (its root, its maps' files, its
// /proc entries); rendering never does.
#ifndef REMORA_PROFILE_COLLECT_H_
#define REMORA_PROFILE_COLLECT_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/result.h"

namespace remora::profile {

struct CollectOptions {
  // The target's pid as this process sees it (0: the pid the records
  // carry, right when the controller shares the target's pid namespace).
  pid_t pid = 0;
  // Whether the live process may be read. False: this machine's files only
  // (a render that finds no names.json: a session of an older remora).
  bool live = true;
  // Collect again even when DIR holds names.json (a session that just ended,
  // or `remora report -p PID`), if the process still lives. False: a
  // collected session is left as it is.
  bool again = false;
  // Directories searched for debug files by build ID before /usr/lib/debug;
  // REMORA_DEBUG_PATH (colon-separated) is appended.
  std::vector<std::string> debug_dirs;
  // Ask a live JVM for its perf map (jcmd Compiler.perfmap) before reading it.
  bool ask_jvm = true;
};

struct CollectResult {
  bool collected = false;     // names.json was written now
  bool target_alive = false;  // files were read through the live target's root
};

// Collects DIR (holding profile.remora). Errc::kIo when DIR cannot be
// written, with the fix.
Result<CollectResult> collect_session(const std::string& dir, const CollectOptions& options);

// The debug directories of `dirs` and REMORA_DEBUG_PATH, in that order.
std::vector<std::string> debug_dirs_with_env(std::vector<std::string> dirs);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_COLLECT_H_
