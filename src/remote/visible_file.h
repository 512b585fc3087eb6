// Making a file of the controller visible inside a target, so that the target
// can dlopen() it even when it lives in another mount namespace (a container)
// where the controller's path does not exist or names another file.
#pragma once

#include <string>

#include "base/result.h"
#include "remote/target.h"

namespace remora::remote {

struct VisibleFile {
  std::string path;    // what the target should open (its own view)
  int remote_fd = -1;  // a memfd in the target, or -1 when `path` is the file itself
  bool via_memfd() const { return remote_fd >= 0; }
};

// Returns a path the target can open for `host_path`:
//  * the same path, when the target's root shows the very same file (same
//    device and inode, resolved inside the target's root);
//  * otherwise "/proc/self/fd/N" for a memfd created in the target (by a
//    remote memfd_create, MFD_CLOEXEC) and filled from the controller.
// The caller must release() the result once the target has opened/loaded it:
// a loaded library keeps its own mapping, so no fd needs to stay behind.
Result<VisibleFile> make_visible(Target& target, const std::string& host_path);

// Closes the memfd in the target (a remote close); a no-op for a plain path.
Result<void> release(Target& target, VisibleFile& file);

}  // namespace remora::remote
