#include "remote/visible_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include <linux/openat2.h>

#include "arch/host.h"
#include "base/unique_fd.h"
#include "procfs/procfs.h"

namespace remora::remote {
namespace {

namespace a = arch::host;

UniqueFd open_root(pid_t pid) {
  std::string root = "/proc/" + std::to_string(pid) + "/root";
  return UniqueFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
}

// `path` resolved inside the target's root as the target would resolve it
// (absolute and ".." symlinks stay inside), never through a magic link.
long open_in(int dirfd, const std::string& path, uint64_t flags, uint64_t resolve) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = resolve;
  return ::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how);
}
constexpr uint64_t kInRoot = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;

// Same identity as seen through the target's root (resolved inside it)?
bool target_sees_same_file(pid_t pid, const std::string& path, const struct stat& host) {
  UniqueFd rfd = open_root(pid);
  if (!rfd) return false;
  long fd = open_in(rfd.get(), path, O_PATH, kInRoot);
  if (fd < 0) return false;
  UniqueFd f(static_cast<int>(fd));
  struct stat st {};
  return ::fstat(f.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == host.st_dev &&
         st.st_ino == host.st_ino;
}

// Whether "/proc/self/fd/N" can mean anything to the target: a procfs
// mounted on /proc inside its root. An empty directory there, or none,
// leaves a memfd without a path the target's loader could open.
bool target_has_proc(pid_t pid) {
  UniqueFd rfd = open_root(pid);
  if (!rfd) return false;
  long fd = open_in(rfd.get(), "/proc", O_PATH | O_DIRECTORY, kInRoot);
  if (fd < 0) return false;
  UniqueFd f(static_cast<int>(fd));
  struct statfs sf {};
  return ::fstatfs(f.get(), &sf) == 0 && sf.f_type == PROC_SUPER_MAGIC;
}

Result<std::vector<char>> read_whole(int fd, const std::string& path) {
  std::vector<char> data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("read " + path);
    if (n == 0) break;
    data.insert(data.end(), buf, buf + n);
  }
  return data;
}

bool write_all(int fd, const std::vector<char>& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Fills the target's memfd `rfd` with `data`.
Result<void> fill_memfd(Target& target, int rfd, const std::vector<char>& data) {
  // Reopening the target's memfd through /proc/PID/fd works across mount
  // namespaces (it is the very same file, not a path lookup).
  std::string link = "/proc/" + std::to_string(target.pid()) + "/fd/" + std::to_string(rfd);
  UniqueFd dst(::open(link.c_str(), O_WRONLY | O_CLOEXEC));
  if (dst) {
    if (!write_all(dst.get(), data)) return Error::from_errno("write " + link);
    return ok();
  }
  // Not allowed to reopen it: have the target write it, chunk by chunk.
  auto write_fn = REMORA_TRY(target.find_symbol("libc.so.6", "write"));
  // A chunk travels on the called thread's stack (Target::call): larger
  // ones would need a scratch buffer, and the agent's holds less.
  constexpr size_t kChunk = 16 * 1024;
  for (size_t off = 0; off < data.size();) {
    size_t len = std::min(kChunk, data.size() - off);
    CallArg w[] = {CallArg::integer(static_cast<uint64_t>(rfd)),
                   CallArg::buffer(std::as_bytes(std::span(data.data() + off, len))), CallArg::integer(len)};
    auto r = REMORA_TRY(target.call(write_fn, w));
    auto n = static_cast<int64_t>(r.value);
    if (n <= 0) return Error(Errc::kIo, "write into the memfd failed in the target");
    off += static_cast<size_t>(n);
  }
  return ok();
}

// A memfd in the target, named after the file for readers of /proc/PID/maps,
// filled with `data`. An error with code kNotSupported when the target could
// not create one (the caller may place a copy instead).
Result<VisibleFile> via_memfd(Target& target, const std::string& host_path, const std::vector<char>& data) {
  // libc's memfd_create is a bare system call wrapper: safe on any thread.
  std::string base = host_path.substr(host_path.rfind('/') + 1);
  CallArg args[] = {CallArg::string("remora:" + base), CallArg::integer(MFD_CLOEXEC)};
  auto made = REMORA_TRY_CTX(target.call_symbol("libc.so.6", "memfd_create", args),
                             "create a memfd in process " + std::to_string(target.pid()));
  auto rfd = static_cast<int64_t>(made.value);
  if (rfd < 0 || rfd > INT32_MAX)
    return Error(Errc::kNotSupported, "memfd_create failed in process " + std::to_string(target.pid()) +
                                          " (a seccomp filter or a kernel without memfd)");
  VisibleFile vf;
  vf.path = "/proc/self/fd/" + std::to_string(rfd);
  vf.remote_fd = static_cast<int>(rfd);
  if (auto r = fill_memfd(target, vf.remote_fd, data); !r) {
    (void)release(target, vf);
    return std::move(r).error();
  }
  return vf;
}

// The ids the target opens files with (its filesystem uid and gid).
struct Owner {
  uid_t uid = 0;
  gid_t gid = 0;
};

// Unique among our own placements (the counter) and, very likely, among
// other controllers' (pid and a random part); mkdirat's EEXIST covers the rest.
std::string unique_dir_name() {
  static std::atomic<uint32_t> counter{0};
  uint32_t r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) r = 0;
  char buf[64];
  std::snprintf(buf, sizeof buf, ".remora-%d-%u-%08x", static_cast<int>(::getpid()), counter.fetch_add(1), r);
  return buf;
}

// Gives what we created to the target's ids: the directory 0700, the file
// 0500 (the loader only reads and maps it). A controller that may not chown
// (another uid, no CAP_CHOWN) leaves them ours and lets everyone read and
// search instead: the target still loads it, and nobody but us can write
// into the directory.
bool hand_over(int dirfd, int filefd, const Owner& owner) {
  if (::geteuid() == owner.uid) return ::fchmod(dirfd, 0700) == 0 && ::fchmod(filefd, 0500) == 0;
  if (::fchown(dirfd, owner.uid, owner.gid) == 0 && ::fchown(filefd, owner.uid, owner.gid) == 0)
    return ::fchmod(dirfd, 0700) == 0 && ::fchmod(filefd, 0500) == 0;
  return ::fchmod(dirfd, 0755) == 0 && ::fchmod(filefd, 0555) == 0;
}

// Places `data` as <place>/.remora-<pid>-<random>/<base> inside the root
// `rootfd`. On failure, *why says why that place is unusable.
std::optional<PlacedFile> place_at(int rootfd, const char* place, const std::string& base,
                                   const std::vector<char>& data, const Owner& owner, std::string* why) {
  long pfd = open_in(rootfd, place, O_PATH | O_DIRECTORY, kInRoot);
  if (pfd < 0) {
    *why = errno == ENOENT ? "missing" : errno == ENOTDIR ? "not a directory" : std::strerror(errno);
    return std::nullopt;
  }
  UniqueFd parent(static_cast<int>(pfd));
  struct statvfs sv {};
  if (::fstatvfs(parent.get(), &sv) == 0 && (sv.f_flag & (ST_RDONLY | ST_NOEXEC)) != 0) {
    *why = (sv.f_flag & ST_RDONLY) != 0 ? "read-only file system"
                                        : "mounted noexec (a library there cannot be mapped executable)";
    return std::nullopt;
  }
  std::string dir_name;
  for (int attempt = 0; attempt < 4 && dir_name.empty(); ++attempt) {
    std::string name = unique_dir_name();
    if (::mkdirat(parent.get(), name.c_str(), 0700) == 0)
      dir_name = name;
    else if (errno != EEXIST)
      break;
  }
  if (dir_name.empty()) {
    *why = std::string("cannot create a directory there: ") + std::strerror(errno);
    return std::nullopt;
  }
  long dfd = open_in(parent.get(), dir_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
                     RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
  if (dfd < 0) {
    *why = std::string("cannot open the directory created there: ") + std::strerror(errno);
    ::unlinkat(parent.get(), dir_name.c_str(), AT_REMOVEDIR);
    return std::nullopt;
  }
  // From here on the guard removes whatever exists of it, on every path.
  PlacedFile placed(std::move(parent), UniqueFd(static_cast<int>(dfd)), dir_name, base);
  UniqueFd file(
      ::openat(placed.dir_fd(), base.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0700));
  if (!file || !write_all(file.get(), data) || !hand_over(placed.dir_fd(), file.get(), owner)) {
    *why = std::string("cannot write the copy there: ") + std::strerror(errno);
    return std::nullopt;
  }
  return placed;
}

// The fallback: a copy placed in the first usable directory of kPlaceDirs.
// `why_not_memfd` says why no memfd route exists, for the message.
Result<VisibleFile> via_placed_copy(Target& target, const std::string& host_path,
                                    const std::vector<char>& data, const std::string& why_not_memfd) {
  const pid_t pid = target.pid();
  UniqueFd rfd = open_root(pid);
  if (!rfd) return Error::from_errno("open /proc/" + std::to_string(pid) + "/root");
  auto status = REMORA_TRY_CTX(procfs::read_status(pid), "read the ids of process " + std::to_string(pid));
  const Owner owner{status.uid[3], status.gid[3]};
  const std::string base = host_path.substr(host_path.rfind('/') + 1);
  std::string tried;
  for (const char* place : kPlaceDirs) {
    std::string why;
    auto placed = place_at(rfd.get(), place, base, data, owner, &why);
    if (placed) {
      VisibleFile vf;
      vf.path = std::string(place) + "/" + placed->dir_name() + "/" + base;
      vf.placed = std::move(*placed);
      return vf;
    }
    tried += std::string(tried.empty() ? "" : "; ") + place + ": " + why;
  }
  return Error(Errc::kNotSupported,
               "cannot make " + host_path + " loadable in process " + std::to_string(pid) + ": " +
                   why_not_memfd + ", and no directory inside its root can hold a copy (" + tried +
                   "). Mount /proc in the container, or give it a writable /tmp (a tmpfs without noexec)");
}

}  // namespace

Result<void> PlacedFile::remove() {
  if (!dir_) return ok();
  int err = 0;
  if (::unlinkat(dir_.get(), file_name_.c_str(), 0) != 0 && errno != ENOENT) err = errno;
  if (::unlinkat(parent_.get(), dir_name_.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT && err == 0)
    err = errno;
  dir_.reset();
  parent_.reset();
  if (err != 0)
    return Error(Errc::kIo,
                 "remove the copy " + dir_name_ + "/" + file_name_ + " placed in the target's root", err);
  return ok();
}

Result<VisibleFile> make_visible(Target& target, const std::string& host_path) {
  if (host_path.empty() || host_path[0] != '/')
    return Error(Errc::kInvalidArgument, "make_visible needs an absolute path, got '" + host_path + "'");
  UniqueFd src(::open(host_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!src) return Error::from_errno("open " + host_path);
  struct stat st {};
  if (::fstat(src.get(), &st) != 0) return Error::from_errno("fstat " + host_path);
  if (!S_ISREG(st.st_mode)) return Error(Errc::kInvalidArgument, host_path + " is not a regular file");
  if (target_sees_same_file(target.pid(), host_path, st)) {
    VisibleFile vf;
    vf.path = host_path;
    return vf;
  }
  auto data = REMORA_TRY(read_whole(src.get(), host_path));
  const std::string into = "copy " + host_path + " into process " + std::to_string(target.pid());
  std::string why_not_memfd = "its root has no /proc mounted (a memfd would have no path it can open)";
  if (target_has_proc(target.pid())) {
    auto vf = via_memfd(target, host_path, data);
    if (vf || vf.error().code() != Errc::kNotSupported) return REMORA_TRY_CTX(std::move(vf), into);
    why_not_memfd = vf.error().message();
  }
  // Its errors name the file, the process and each place tried already.
  return via_placed_copy(target, host_path, data, why_not_memfd);
}

bool visible_as_is(const Target& target, const std::string& host_path) {
  if (host_path.empty() || host_path[0] != '/') return false;
  struct stat st {};
  return ::stat(host_path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         target_sees_same_file(target.pid(), host_path, st);
}

Result<void> release(Target& target, VisibleFile& file) {
  Result<void> removed = file.placed.remove();
  if (!file.via_memfd()) return removed;
  uint64_t args[] = {static_cast<uint64_t>(file.remote_fd)};
  auto r = REMORA_TRY(target.syscall(a::nr::kClose, args));
  file.remote_fd = -1;
  if (static_cast<int64_t>(r.value) != 0)
    return Error(Errc::kIo, "close of the memfd in the target failed",
                 static_cast<int>(-static_cast<int64_t>(r.value)));
  return removed;
}

}  // namespace remora::remote
