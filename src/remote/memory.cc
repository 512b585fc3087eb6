#include "remote/memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "base/strings.h"
#include "ptrace/ptrace.h"

namespace remora::remote {

Result<Memory> Memory::open(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/mem";
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT || err == ESRCH)
      return Error(Errc::kNoSuchProcess, "no process " + std::to_string(pid), err);
    if (err == EACCES || err == EPERM) return ptrace::diagnose_attach_failure(pid, err);
    return Error::from_errno("open " + path, err);
  }
  return Memory(pid, UniqueFd(fd));
}

Result<void> Memory::read(uint64_t addr, std::span<std::byte> out) const {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd_.get(), out.data() + done, out.size() - done, static_cast<off_t>(addr + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      return Error(Errc::kIo,
                   "cannot read " + std::to_string(out.size()) + " bytes at " + hex_addr(addr) +
                       " in process " + std::to_string(pid_) + " (unmapped or unreadable)",
                   err);
    }
    done += static_cast<size_t>(n);
  }
  return ok();
}

Result<void> Memory::write(uint64_t addr, std::span<const std::byte> in) const {
  size_t done = 0;
  while (done < in.size()) {
    ssize_t n = ::pwrite(fd_.get(), in.data() + done, in.size() - done, static_cast<off_t>(addr + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      return Error(Errc::kIo,
                   "cannot write " + std::to_string(in.size()) + " bytes at " + hex_addr(addr) +
                       " in process " + std::to_string(pid_) + " (unmapped)",
                   err);
    }
    done += static_cast<size_t>(n);
  }
  return ok();
}

}  // namespace remora::remote
