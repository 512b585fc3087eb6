#include "remote/visible_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include <linux/openat2.h>

#include "arch/host.h"
#include "base/unique_fd.h"

namespace remora::remote {
namespace {

namespace a = arch::host;

// Same identity as seen through the target's root (resolved inside it)?
bool target_sees_same_file(pid_t pid, const std::string& path, const struct stat& host) {
  std::string root = "/proc/" + std::to_string(pid) + "/root";
  UniqueFd rfd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!rfd) return false;
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, rfd.get(), path.c_str(), &how, sizeof how);
  if (fd < 0) return false;
  UniqueFd f(static_cast<int>(fd));
  struct stat st {};
  return ::fstat(f.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == host.st_dev &&
         st.st_ino == host.st_ino;
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

}  // namespace

Result<VisibleFile> make_visible(Target& target, const std::string& host_path) {
  if (host_path.empty() || host_path[0] != '/')
    return Error(Errc::kInvalidArgument, "make_visible needs an absolute path, got '" + host_path + "'");
  UniqueFd src(::open(host_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!src) return Error::from_errno("open " + host_path);
  struct stat st {};
  if (::fstat(src.get(), &st) != 0) return Error::from_errno("fstat " + host_path);
  if (!S_ISREG(st.st_mode)) return Error(Errc::kInvalidArgument, host_path + " is not a regular file");
  if (target_sees_same_file(target.pid(), host_path, st)) return VisibleFile{host_path, -1};

  // A memfd in the target, named after the file for readers of /proc/PID/maps.
  // libc's memfd_create is a bare system call wrapper: safe on any thread.
  std::string base = host_path.substr(host_path.rfind('/') + 1);
  CallArg args[] = {CallArg::string("remora:" + base), CallArg::integer(MFD_CLOEXEC)};
  auto made = REMORA_TRY_CTX(target.call_symbol("libc.so.6", "memfd_create", args),
                             "create a memfd in process " + std::to_string(target.pid()));
  auto rfd = static_cast<int64_t>(made.value);
  if (rfd < 0 || rfd > INT32_MAX)
    return Error(Errc::kNotSupported, "memfd_create failed in process " + std::to_string(target.pid()) +
                                          " (a seccomp filter or a kernel without memfd); cannot pass " +
                                          host_path + " into it");
  VisibleFile vf{"/proc/self/fd/" + std::to_string(rfd), static_cast<int>(rfd)};
  auto fill = [&]() -> Result<void> {
    auto data = REMORA_TRY(read_whole(src.get(), host_path));
    // Reopening the target's memfd through /proc/PID/fd works across mount
    // namespaces (it is the very same file, not a path lookup).
    std::string link = "/proc/" + std::to_string(target.pid()) + "/fd/" + std::to_string(rfd);
    UniqueFd dst(::open(link.c_str(), O_WRONLY | O_CLOEXEC));
    if (dst) {
      size_t done = 0;
      while (done < data.size()) {
        ssize_t n = ::write(dst.get(), data.data() + done, data.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return Error::from_errno("write " + link);
        done += static_cast<size_t>(n);
      }
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
                     CallArg::buffer(std::as_bytes(std::span(data.data() + off, len))),
                     CallArg::integer(len)};
      auto r = REMORA_TRY(target.call(write_fn, w));
      auto n = static_cast<int64_t>(r.value);
      if (n <= 0) return Error(Errc::kIo, "write into the memfd failed in the target");
      off += static_cast<size_t>(n);
    }
    return ok();
  };
  if (auto r = fill(); !r) {
    (void)release(target, vf);
    return std::move(r).error().with_context("copy " + host_path + " into process " +
                                             std::to_string(target.pid()));
  }
  return vf;
}

Result<void> release(Target& target, VisibleFile& file) {
  if (!file.via_memfd()) return ok();
  uint64_t args[] = {static_cast<uint64_t>(file.remote_fd)};
  auto r = REMORA_TRY(target.syscall(a::nr::kClose, args));
  file.remote_fd = -1;
  if (static_cast<int64_t>(r.value) != 0)
    return Error(Errc::kIo, "close of the memfd in the target failed",
                 static_cast<int>(-static_cast<int64_t>(r.value)));
  return ok();
}

}  // namespace remora::remote
