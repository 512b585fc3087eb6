// Making a file of the controller visible inside a target, so that the target
// can dlopen() it even when it lives in another mount namespace (a container)
// where the controller's path does not exist or names another file.
#pragma once

#include <string>

#include "base/result.h"
#include "base/unique_fd.h"
#include "remote/target.h"

namespace remora::remote {

// A copy of a file placed inside the target's root, in a private directory
// of its own (<dir>/.remora-<pid>-<random>/<file name>), for a target that
// can only load by a real path. Removed, file and directory, by remove() or
// when this goes, whatever path the caller leaves by: a placed file is never
// left behind. The removal goes through descriptors of the controller (no
// remote call), so it works whatever state the target is in, even gone.
class PlacedFile {
 public:
  PlacedFile() = default;
  PlacedFile(UniqueFd parent, UniqueFd dir, std::string dir_name, std::string file_name)
      : parent_(std::move(parent)),
        dir_(std::move(dir)),
        dir_name_(std::move(dir_name)),
        file_name_(std::move(file_name)) {}
  ~PlacedFile() { (void)remove(); }
  PlacedFile(PlacedFile&&) noexcept = default;
  PlacedFile& operator=(PlacedFile&& o) noexcept {
    if (this != &o) {
      (void)remove();
      parent_ = std::move(o.parent_);
      dir_ = std::move(o.dir_);
      dir_name_ = std::move(o.dir_name_);
      file_name_ = std::move(o.file_name_);
    }
    return *this;
  }

  bool placed() const { return dir_.valid(); }
  const std::string& dir_name() const { return dir_name_; }
  int dir_fd() const { return dir_.get(); }
  // Unlinks the file and removes its directory; a no-op once done.
  Result<void> remove();

 private:
  UniqueFd parent_;  // the directory holding ours (the target's /tmp, say)
  UniqueFd dir_;     // our private directory in it
  std::string dir_name_, file_name_;
};

struct VisibleFile {
  std::string path;    // what the target should open (its own view)
  int remote_fd = -1;  // a memfd in the target, or -1
  PlacedFile placed;   // a copy inside the target's root, or nothing
  bool via_memfd() const { return remote_fd >= 0; }
  bool via_placed_file() const { return placed.placed(); }
};

// The directories, as the target sees them, where a copy may be placed,
// tried in this order.
inline constexpr const char* kPlaceDirs[] = {"/tmp", "/dev/shm", "/run"};

// Returns a path the target can open for `host_path`:
//  * the same path, when the target's root shows the very same file (same
//    device and inode, resolved inside the target's root);
//  * else, when the target's root has /proc mounted, "/proc/self/fd/N" for a
//    memfd created in the target (a remote memfd_create, MFD_CLOEXEC) and
//    filled from the controller;
//  * else (no /proc in the target's root, or memfd_create refused), a copy
//    placed in the first of kPlaceDirs that is, inside the target's root, a
//    directory on a writable file system mounted without noexec: a private
//    directory (0700) holding the file (0500), both owned by the target's
//    uid, named so that the library keeps its own file name;
//  * else an error (kNotSupported) naming each place tried and why it was
//    unusable, and the fixes: mount /proc in the container, or give it a
//    writable /tmp.
// The caller must release() the result (or let it go) once the target has
// opened/loaded it: a loaded library keeps its own mapping, so neither the
// memfd nor the placed copy needs to stay behind.
Result<VisibleFile> make_visible(Target& target, const std::string& host_path);
// Whether make_visible would hand back `host_path` itself, with no remote
// call: the target sees that very file at that path.
bool visible_as_is(const Target& target, const std::string& host_path);

// Closes the memfd in the target (a remote close) and removes a placed copy;
// a no-op for a plain path.
Result<void> release(Target& target, VisibleFile& file);

}  // namespace remora::remote
