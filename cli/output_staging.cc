#include "cli/output_staging.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "procfs/procfs.h"
#include "remote/lookup.h"

namespace remora::cli {
namespace {

constexpr const char* kPlaces[] = {"/tmp", "/dev/shm", "/run"};
constexpr off_t kMaxCopy = off_t{1} << 32;  // a raw-records file is far smaller

std::string random_suffix() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

// Copies regular file `name` of directory `from` into `to_dir` (a path of
// ours). A link or anything but a regular file is left out.
bool copy_file(int from, const char* name, const std::string& to_dir) {
  int in = ::openat(from, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (in < 0) return false;
  UniqueFd src(in);
  struct stat st {};
  if (::fstat(src.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxCopy) return false;
  const std::string path = to_dir + "/" + name;
  int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (out < 0) return false;
  UniqueFd dst(out);
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(src.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(dst.get(), buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += w;
    }
  }
}

// Calls fn(name) for each entry of directory fd `dir` but "." and "..".
template <typename Fn>
void each_entry(int dir, Fn fn) {
  int copy = ::dup(dir);
  if (copy < 0) return;
  DIR* d = ::fdopendir(copy);
  if (d == nullptr) {
    ::close(copy);
    return;
  }
  ::rewinddir(d);
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    fn(e->d_name);
  }
  ::closedir(d);
}

// Removes what the tool made in our directory: session directories of
// files, and its "-latest" links. Nothing is followed.
void remove_contents(int dir) {
  each_entry(dir, [&](const char* name) {
    int sub = ::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) {
      UniqueFd s(sub);
      each_entry(s.get(), [&](const char* inner) { (void)::unlinkat(s.get(), inner, 0); });
      (void)::unlinkat(dir, name, AT_REMOVEDIR);
    } else {
      (void)::unlinkat(dir, name, 0);
    }
  });
}

}  // namespace

bool target_sees_same_dir(pid_t pid, const std::string& path) {
  struct stat ours {
  }, theirs{};
  if (::stat(path.c_str(), &ours) != 0) return false;
  auto fd = remote::open_in_root(pid, path);
  return fd && ::fstat(fd->get(), &theirs) == 0 && ours.st_dev == theirs.st_dev &&
         ours.st_ino == theirs.st_ino;
}

Result<std::unique_ptr<StagedOutput>> StagedOutput::create(pid_t pid) {
  auto st = REMORA_TRY(procfs::read_status(pid));
  const uid_t uid = st.uid[3];  // the ids it creates files with
  const gid_t gid = st.gid[3];
  std::string tried;
  for (const char* place : kPlaces) {
    auto parent = remote::open_in_root(pid, place);
    std::string why;
    struct statvfs vfs {};
    if (!parent) {
      why = parent.error().message();
    } else if (::fstatvfs(parent->get(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY) != 0) {
      why = "read-only file system";
    } else {
      std::unique_ptr<StagedOutput> s(new StagedOutput);
      s->name_ = ".remora-output-" + std::to_string(::getpid()) + "-" + random_suffix();
      if (::mkdirat(parent->get(), s->name_.c_str(), 0700) != 0) {
        why = std::strerror(errno);
      } else {
        int dir = ::openat(parent->get(), s->name_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        s->parent_ = std::move(*parent);
        if (dir < 0 || ::fchown(dir, uid, gid) != 0) {
          why = std::strerror(errno);
          if (dir >= 0) ::close(dir);
          (void)::unlinkat(s->parent_.get(), s->name_.c_str(), AT_REMOVEDIR);
          s->name_.clear();
        } else {
          s->dir_ = UniqueFd(dir);
          s->target_path_ = std::string(place) + "/" + s->name_;
          return s;
        }
      }
    }
    tried += std::string(tried.empty() ? "" : "; ") + place + ": " + why;
  }
  return Error(Errc::kNotSupported,
               "process " + std::to_string(pid) +
                   " has a root of its own (a container) and no directory in it can hold the profile for the "
                   "session (" +
                   tried +
                   "): give it a writable /tmp, or pass -e REMORA_OUTPUT_PATH=DIR with a writable directory "
                   "inside it (remora then reads the profile from there)");
}

StagedOutput::~StagedOutput() {
  if (!dir_ || keep_) return;
  remove_contents(dir_.get());
  (void)::unlinkat(parent_.get(), name_.c_str(), AT_REMOVEDIR);
}

Result<int> StagedOutput::bring_out(const std::string& dest) {
  if (::mkdir(dest.c_str(), 0755) != 0 && errno != EEXIST) return Error::from_errno("create " + dest);
  int brought = 0;
  each_entry(dir_.get(), [&](const char* name) {
    int sub = ::openat(dir_.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) return;  // the "-latest" links
    UniqueFd s(sub);
    if (::faccessat(s.get(), "profile.remora", F_OK, AT_SYMLINK_NOFOLLOW) != 0) return;  // not finished
    const std::string to = dest + "/" + name;
    if (::mkdir(to.c_str(), 0755) != 0 && errno != EEXIST) return;
    bool ok = copy_file(s.get(), "profile.remora", to);
    each_entry(s.get(), [&](const char* inner) {
      if (std::strncmp(inner, "perf-", 5) == 0) (void)copy_file(s.get(), inner, to);
    });
    if (ok) ++brought;
  });
  return brought;
}

}  // namespace remora::cli
