// Support for the container tests: a container root assembled on OverlayFS by
// the test itself, a target process started inside it (own mount and pid
// namespaces, chroot, unprivileged uid), and an unprivileged controller run in
// a forked child that reports back over a pipe.
//
// Everything that starts a process or mounts something is undone by a
// destructor, also when an assertion fails half-way; every wait has a
// deadline.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace remora::ctr_test {

// The unprivileged identity of both the target and the controller (nobody).
inline constexpr uid_t kUid = 65534;
inline constexpr gid_t kGid = 65534;

// Whether the kernel lists OverlayFS in /proc/filesystems.
bool overlay_available();

// Why this machine cannot run the container tests at all ("" when it can):
// not root, or the kernel refuses new mount and pid namespaces.
std::string missing_feature();

// Moves this test process into a private mount namespace (once), so that no
// mount made by a test outlives the process, whatever happens to it.
bool enter_private_mount_ns(std::string* err);

// Reads a whole file; false with *err on failure.
bool read_file(const std::string& path, std::string* out, std::string* err);

// A directory under /tmp (mkdtemp), backed by its own tmpfs, holding the
// layers of a container root:
//   base/lower   the image: loader, libc, the program, fixture libraries;
//                /proc, /lib, /run, and /tmp and /dev/shm (mode 1777)
//   base/upper, base/work   OverlayFS's writable layer and work directory
//   base/merged  the overlay mount (the container's root)
//   base/host    files that exist only on the controller's side
// The destructor unmounts and removes everything.
class ContainerRoot {
 public:
  static std::unique_ptr<ContainerRoot> create(std::string* err);
  ~ContainerRoot();
  ContainerRoot(const ContainerRoot&) = delete;
  ContainerRoot& operator=(const ContainerRoot&) = delete;

  const std::string& base() const { return base_; }
  std::string lower() const { return base_ + "/lower"; }
  std::string upper() const { return base_ + "/upper"; }
  std::string merged() const { return base_ + "/merged"; }
  std::string host() const { return base_ + "/host"; }
  bool overlay_mounted() const { return mounted_; }
  // The root directory a target is started in: merged/ once mounted, else
  // lower/ itself (a plain directory root).
  std::string root() const { return mounted_ ? merged() : lower(); }

  // Copies host file `src` (following symlinks) to `path` inside lower/
  // (absolute, as the container sees it), creating directories.
  bool add_file(const std::string& src, const std::string& path, std::string* err);
  // Adds a symlink `path` -> `points_to` inside lower/.
  bool add_symlink(const std::string& points_to, const std::string& path, std::string* err);
  // Copies `program` to `path` and every library `ldd program` names
  // (the dynamic loader included) to its own path inside lower/.
  bool add_program_with_libs(const std::string& program, const std::string& path, std::string* err);
  // Mounts lower/upper/work on merged/.
  bool mount_overlay(std::string* err);

 private:
  explicit ContainerRoot(std::string base) : base_(std::move(base)) {}
  std::string base_;
  bool tmpfs_ = false;
  bool mounted_ = false;
};

// Replaces the file at `path` (a path on the controller's side, e.g. inside
// merged/) after the fact:
//  * by_rename: writes `src`'s bytes to a new file next to it and renames it
//    over `path` (a new inode);
//  * in_place: opens `path` O_TRUNC and writes `src`'s bytes into it (on
//    OverlayFS, a copy-up: the upper layer gets the new bytes);
//  * by_symlink: renames a new symlink `path` -> `points_to` over it.
bool replace_by_rename(const std::string& path, const std::string& src, std::string* err);
bool replace_in_place(const std::string& path, const std::string& src, std::string* err);
bool replace_by_symlink(const std::string& path, const std::string& points_to, std::string* err);

// How a ContainerProcess enters its root.
enum class RootChange {
  // As container runtimes do: the root (bind-mounted onto itself) becomes the
  // root mount of the new mount namespace, the old root is detached. Paths in
  // /proc/PID/maps then read the same from outside as from inside.
  kPivotRoot,
  // chroot(2) only: the mount namespace keeps the host's tree above the root,
  // and /proc/PID/maps read from outside shows host-side paths
  // ("<root>/lib/libc.so.6").
  kChroot,
};

// How a ContainerProcess's root is shaped beyond the files in it.
struct ContainerOptions {
  RootChange how = RootChange::kPivotRoot;
  // procfs on /proc inside the root; without it the directory stays empty,
  // as in a runtime that mounts no /proc.
  bool mount_proc = true;
  // The root mount made read-only (kPivotRoot only), as `--read-only` does.
  bool read_only_root = false;
  // tmpfs mounts inside the root (kPivotRoot only), mode 1777; a path must
  // exist in the root (ContainerRoot::create makes /tmp, /dev/shm, /run).
  struct Tmpfs {
    std::string path;
    bool noexec = false;
  };
  std::vector<Tmpfs> tmpfs;
};

// A target process started in a container root: new mount and pid namespaces
// (a clone(2) child of this process, so pid 1 of its namespace), /proc mounted
// inside the root (unless options say not), the root made read-only and
// tmpfs mounted in it (if options say so), pivot_root(2) or chroot(2), then
// setgroups/setresgid/setresuid to kUid:kGid, then execve of `program` (a path inside the root).
// start() returns once the program printed "ready <pid>".
//
// The destructor closes its stdin (it exits), kills it and reaps it.
class ContainerProcess {
 public:
  static std::unique_ptr<ContainerProcess> start(const std::string& root, const std::string& program,
                                                 const std::vector<std::string>& args, std::string* err,
                                                 RootChange how = RootChange::kPivotRoot);
  static std::unique_ptr<ContainerProcess> start(const std::string& root, const std::string& program,
                                                 const std::vector<std::string>& args, std::string* err,
                                                 const ContainerOptions& options);
  ~ContainerProcess();
  ContainerProcess(const ContainerProcess&) = delete;
  ContainerProcess& operator=(const ContainerProcess&) = delete;

  pid_t pid() const { return pid_; }                  // as this process sees it
  pid_t printed_pid() const { return printed_pid_; }  // as the target sees itself

  // Sends one command line to the target (ctr_target.c: "ls DIR", "cat FILE") and
  // returns the lines it answers before "end", within 10 s.
  bool ask(const std::string& command, std::vector<std::string>* reply, std::string* err);

 private:
  ContainerProcess() = default;
  pid_t pid_ = -1;
  pid_t printed_pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
};

// What a controller reports: key -> value.
using Report = std::map<std::string, std::string>;
std::string to_string(const Report& r);

// Runs `body` in a forked child that first runs `as_root` (may be empty; runs
// with this process's privileges), then drops to kUid:kGid with no
// supplementary groups and no capabilities (so /proc/PID/map_files is refused
// to it), marks itself dumpable as an exec'd program would be, clears the
// process-wide ImageCache, and runs `body`. The child's report comes back
// over a pipe; report["failure"] is set when the child could not report
// (setup failed, crashed, missed the deadline).
// With `stay_root`, the child keeps this process's privileges (root with
// CAP_SYS_PTRACE: a privileged side-car) instead of dropping to kUid.
Report run_controller(const std::function<void(Report&)>& body,
                      const std::function<bool(std::string*)>& as_root = {},
                      std::chrono::milliseconds deadline = std::chrono::seconds(20), bool stay_root = false);

}  // namespace remora::ctr_test
