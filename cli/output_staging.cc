#include "cli/output_staging.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "procfs/procfs.h"
#include "remote/lookup.h"
#include "remote/target.h"

namespace remora::cli {
namespace {

constexpr const char* kPlaces[] = {"/tmp", "/dev/shm", "/run"};
constexpr off_t kMaxCopy = off_t{1} << 32;  // a raw-records file is far smaller

// The header the default tool writes first into a memfd (kMemfdMagic in
// tools/default/raw_records.h): "REMORA-OUTPUT 1 PART|DONE <name>\n".
constexpr std::string_view kMemfdMagic = "REMORA-OUTPUT 1 ";
constexpr size_t kMaxHeader = 512;

// Writes `data` to new file `path` (a path of ours).
bool write_new_file(const std::string& path, std::string_view data) {
  int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (out < 0) return false;
  UniqueFd dst(out);
  for (size_t done = 0; done < data.size();) {
    ssize_t w = ::write(dst.get(), data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<size_t>(w);
  }
  return true;
}

// The whole of the memfd behind our reference `fd`, from offset 0.
Result<std::string> read_memfd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error::from_errno("stat the profile's memfd");
  if (st.st_size > kMaxCopy) return Error(Errc::kIo, "the profile's memfd holds more than 4 GiB");
  std::string data(static_cast<size_t>(st.st_size), '\0');
  for (size_t done = 0; done < data.size();) {
    ssize_t n = ::pread(fd, data.data() + done, data.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("read the profile's memfd");
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return data;
}

// A session directory name as the tool makes them, written by the target:
// one path component, printable, nothing that could climb out of `dest`.
bool safe_session_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name)
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      return false;
  return true;
}

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

bool target_may_write(pid_t pid, const std::string& path) {
  auto st = procfs::read_status(pid);
  if (!st) return false;
  const uid_t uid = st->uid[3];  // the ids it creates files with
  const gid_t gid = st->gid[3];
  if (uid == 0) return true;
  // The directory, or where the tool would make it: its nearest ancestor.
  std::string dir = path;
  struct stat sb {};
  while (::stat(dir.c_str(), &sb) != 0) {
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || dir == "/") return false;
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  if (!S_ISDIR(sb.st_mode)) return false;
  if (sb.st_uid == uid) return (sb.st_mode & S_IWUSR) != 0;
  if (sb.st_gid == gid) return (sb.st_mode & S_IWGRP) != 0;
  return (sb.st_mode & S_IWOTH) != 0;
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
  // Nothing writable: the session goes into memory that remora reads.
  auto mem = create_in_memory(pid);
  if (mem) return mem;
  return Error(mem.error().code(),
               "process " + std::to_string(pid) +
                   " has a root of its own (a container), no directory in it can hold the profile for the "
                   "session (" +
                   tried + "), and the profile cannot be kept in memory either (" + mem.error().to_string() +
                   "): give it a writable /tmp, or pass -e REMORA_OUTPUT_PATH=DIR with a writable directory "
                   "inside it (remora then reads the profile from there)");
}

Result<std::unique_ptr<StagedOutput>> StagedOutput::create_in_memory(pid_t pid) {
  auto target = REMORA_TRY(remote::Target::open(pid));
  // memfd_create needs no /proc (nor any directory) inside the target's
  // root. Target::syscall checks it against the thread's seccomp filter
  // before making it: a filter that refuses it is named, nothing changed.
  static constexpr char kName[] = "remora-output";
  auto name = REMORA_TRY(target->scratch_alloc(sizeof kName));
  REMORA_TRY(target->write(name, std::as_bytes(std::span(kName))));
  const uint64_t args[] = {name.addr(), MFD_CLOEXEC};
  auto made = REMORA_TRY_CTX(target->syscall(SYS_memfd_create, args),
                             "create a memfd for the profile in process " + std::to_string(pid));
  const auto rfd = static_cast<int64_t>(made.value);
  if (rfd < 0)
    return Error(Errc::kNotSupported,
                 "memfd_create failed in process " + std::to_string(pid) + ": " +
                     std::strerror(static_cast<int>(-rfd)) + " (a seccomp filter, or a kernel without memfd)",
                 static_cast<int>(-rfd));
  std::unique_ptr<StagedOutput> s(new StagedOutput);
  s->pid_ = pid;
  s->remote_fd_ = static_cast<int>(rfd);
  // Our own reference: the data outlives the target's descriptor (closed at
  // detach) and the target itself. Opening /proc/PID/fd/N needs what ptrace
  // needed (same uid and dumpable, or CAP_SYS_PTRACE); it is no path lookup
  // inside the target's root.
  const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(rfd);
  s->mem_ = UniqueFd(::open(link.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!s->mem_ || ::fstat(s->mem_.get(), &st) != 0) {
    Error e = Error::from_errno("open " + link + " (the memfd made for the profile)");
    const uint64_t close_args[] = {static_cast<uint64_t>(rfd)};
    (void)target->syscall(SYS_close, close_args);
    return e;
  }
  s->mem_ino_ = st.st_ino;
  s->target_fd_ =
      std::to_string(rfd) + ":" + std::to_string(st.st_ino) + ":" + std::to_string(target->ns_pid());
  REMORA_TRY(target->close());  // its scratch mapping goes: nothing of ours stays but the memfd
  return s;
}

StagedOutput::~StagedOutput() {
  if (mem_ && !keep_) {
    // No tool wrote its header: nobody else will close the target's
    // descriptor. Only while it is still our memfd (the number could have
    // been closed and taken by the program since).
    struct stat ours {
    }, theirs{};
    const std::string link = "/proc/" + std::to_string(pid_) + "/fd/" + std::to_string(remote_fd_);
    if (::fstat(mem_.get(), &ours) == 0 && ours.st_size == 0 && ::stat(link.c_str(), &theirs) == 0 &&
        theirs.st_ino == mem_ino_ && theirs.st_dev == ours.st_dev) {
      if (auto target = remote::Target::open(pid_)) {
        const uint64_t close_args[] = {static_cast<uint64_t>(remote_fd_)};
        (void)(*target)->syscall(SYS_close, close_args);
      }
    }
  }
  if (!dir_ || keep_) return;
  remove_contents(dir_.get());
  (void)::unlinkat(parent_.get(), name_.c_str(), AT_REMOVEDIR);
}

Result<int> StagedOutput::bring_out_of_memory(const std::string& dest) {
  const std::string data = REMORA_TRY(read_memfd(mem_.get()));
  if (data.empty()) return 0;  // no tool took it (the attach failed)
  const size_t nl = data.find('\n');
  const std::string_view head = std::string_view(data).substr(0, nl);
  const size_t state_at = kMemfdMagic.size();
  if (nl == std::string::npos || nl > kMaxHeader || head.substr(0, state_at) != kMemfdMagic ||
      head.size() < state_at + 6 || head[state_at + 4] != ' ')
    return Error(Errc::kParse, "the profile's memfd in process " + std::to_string(pid_) +
                                   " does not start with the default tool's header");
  const std::string_view state = head.substr(state_at, 4);
  const std::string_view name = head.substr(state_at + 5);
  if ((state != "DONE" && state != "PART") || !safe_session_name(name))
    return Error(Errc::kParse, "the profile's memfd in process " + std::to_string(pid_) +
                                   " has a malformed header: " + std::string(head));
  const std::string to = dest + "/" + std::string(name);
  if (::mkdir(to.c_str(), 0755) != 0 && errno != EEXIST) return Error::from_errno("create " + to);
  const std::string_view records = std::string_view(data).substr(nl + 1);
  const std::string file = to + (state == "DONE" ? "/profile.remora" : "/profile.remora.part");
  if (!write_new_file(file, records)) return Error::from_errno("write " + file);
  if (state == "PART")
    return Error(Errc::kTargetExited, "process " + std::to_string(pid_) +
                                          " did not finish its session (it ended, or its detach " +
                                          "failed): the " + std::to_string(records.size()) +
                                          " bytes of timeline events it recorded until then are in " + file +
                                          " (no stacks or code map: those are written at detach)");
  return 1;
}

Result<int> StagedOutput::bring_out(const std::string& dest) {
  if (::mkdir(dest.c_str(), 0755) != 0 && errno != EEXIST) return Error::from_errno("create " + dest);
  if (mem_) return bring_out_of_memory(dest);
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
