// The default tool's output, where the user is. The tool writes where the
// target can: inside its own root. For a target in a container (a root of
// its own), remora's working directory is not there, so remora makes a
// private directory inside the target's root for the session, gives it to
// the target's user, brings the finished sessions' raw records out into
// ./remora-output on this side and renders them there, then removes the
// directory. Everything inside the target's root is opened through
// descriptors, never by a path a process of the target could redirect.
//
// A root where none of those is writable (read-only, `FROM scratch`) gets
// the session in memory instead: a memfd that remora makes in the target
// (one remote memfd_create, checked against its seccomp filter first) and
// opens from its own side through /proc/PID/fd/N, so that it holds its own
// reference. The tool writes its raw records into it (REMORA_OUTPUT_FD,
// tools/default/raw_records.h for the format) and closes its descriptor at
// detach; remora reads its reference and lays the session out as the copy
// does. No /proc is needed inside the target's root for that.
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
  // first of the target's /tmp, /dev/shm, /run that is writable; else a
  // memfd in the target (in_memory()); else an error naming each place
  // tried, why the memfd could not be made (a seccomp filter refusing
  // memfd_create, say), and the fix (-e REMORA_OUTPUT_PATH=... to write
  // inside the target, or a writable /tmp in it).
  static Result<std::unique_ptr<StagedOutput>> create(pid_t pid);
  // Removes the directory and what is left in it, unless kept. In memory:
  // closes the target's memfd (a remote close) when no tool took it (an
  // attach that failed); a tool's own descriptor is the tool's to close.
  ~StagedOutput();
  // Leaves the directory in place (the tools stay attached past remora: --keep).
  void keep() { keep_ = true; }

  // REMORA_OUTPUT_PATH for the target: the directory as the target names it
  // ("" in memory).
  const std::string& target_path() const { return target_path_; }
  // The session goes into a memfd of the target, not a directory.
  bool in_memory() const { return mem_.valid(); }
  // REMORA_OUTPUT_FD for the target: "N:INODE:PID" in memory (PID as the
  // target sees itself), else "" (which
  // clears a value an earlier session left in its environment).
  const std::string& target_fd() const { return target_fd_; }
  // Copies each finished session directory (one holding profile.remora,
  // and the perf map it may hold) into `dest`, under the same name. Returns
  // how many were brought out. In memory: the session the memfd holds, as
  // dest/<its name>/profile.remora; one the process never finished (it
  // ended during the session) as profile.remora.part, with an error saying
  // so and how much was recorded.
  Result<int> bring_out(const std::string& dest);

 private:
  StagedOutput() = default;
  static Result<std::unique_ptr<StagedOutput>> create_in_memory(pid_t pid);
  Result<int> bring_out_of_memory(const std::string& dest);
  UniqueFd parent_, dir_;
  std::string name_, target_path_, target_fd_;
  bool keep_ = false;
  // In memory: our reference to the target's memfd, its number there and
  // its inode (to know it is still that file), the target.
  UniqueFd mem_;
  int remote_fd_ = -1;
  ino_t mem_ino_ = 0;
  pid_t pid_ = 0;
};

// True when process `pid` sees `path` (a directory of ours) as the very same
// directory: the same device and inode, resolved inside its root.
bool target_sees_same_dir(pid_t pid, const std::string& path);

// Whether process `pid`, with the ids it creates files with, may write into
// directory `path`, or make it in its nearest existing ancestor (the owner's,
// the group's or everyone's write bit; supplementary groups are not
// counted: a process that could after all is staged, which costs a copy).
bool target_may_write(pid_t pid, const std::string& path);

}  // namespace remora::cli
