// The default tool's output, where the user is. The tool writes where the
// target can: inside its own root. For a target in a container (a root of
// its own), remora's working directory is not there, so remora makes a
// private directory inside the target's root for the session, gives it to
// the target's user, brings the finished sessions' raw records out into
// ./remora-output on this side and renders them there, then removes the
// directory. Everything inside the target's root is opened through
// descriptors, never by a path a process of the target could redirect.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::cli {

class StagedOutput {
 public:
  // A private directory (0700, owned by the target's uid and gid) in the
  // first of the target's /tmp, /dev/shm, /run that is writable; an error
  // naming each place tried and the fix (-e REMORA_OUTPUT_PATH=... to write
  // inside the target, or a writable /tmp in it).
  static Result<std::unique_ptr<StagedOutput>> create(pid_t pid);
  ~StagedOutput();  // removes the directory and what is left in it, unless kept
  // Leaves the directory in place (the tools stay attached past remora: --keep).
  void keep() { keep_ = true; }

  // REMORA_OUTPUT_PATH for the target: the directory as the target names it.
  const std::string& target_path() const { return target_path_; }
  // Copies each finished session directory (one holding profile.remora,
  // and the perf map it may hold) into `dest`, under the same name. Returns
  // how many were brought out.
  Result<int> bring_out(const std::string& dest);

 private:
  StagedOutput() = default;
  UniqueFd parent_, dir_;
  std::string name_, target_path_;
  bool keep_ = false;
};

// True when process `pid` sees `path` (a directory of ours) as the very same
// directory: the same device and inode, resolved inside its root.
bool target_sees_same_dir(pid_t pid, const std::string& path);

}  // namespace remora::cli
