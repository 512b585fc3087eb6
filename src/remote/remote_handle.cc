#include "remote/remote_handle.h"

#include <string>
#include <utility>

#include "base/log.h"

namespace remora::remote {

RemoteHandle RemoteHandle::fd(Target& target, int fd, const CallOptions& opts) {
  RemoteHandle h;
  if (fd < 0) return h;
  h.target_ = &target;
  h.kind_ = Kind::kFd;
  h.fd_ = fd;
  h.opts_ = opts;
  return h;
}

RemoteHandle RemoteHandle::mapping(Target& target, const Target::Mapping& m, const CallOptions& opts) {
  RemoteHandle h;
  if (m.size == 0) return h;
  h.target_ = &target;
  h.kind_ = Kind::kMapping;
  h.map_ = m;
  h.opts_ = opts;
  return h;
}

RemoteHandle::~RemoteHandle() { drop(); }

void RemoteHandle::drop() {
  if (!target_) return;
  const pid_t pid = target_->pid();
  if (auto r = reset(); !r) REMORA_LOG(kRemote, "pid %d: %s", pid, r.error().to_string().c_str());
}

RemoteHandle::RemoteHandle(RemoteHandle&& other) noexcept
    : target_(std::exchange(other.target_, nullptr)),
      kind_(other.kind_),
      fd_(other.fd_),
      map_(other.map_),
      opts_(other.opts_) {}

RemoteHandle& RemoteHandle::operator=(RemoteHandle&& other) noexcept {
  if (this != &other) {
    drop();
    target_ = std::exchange(other.target_, nullptr);
    kind_ = other.kind_;
    fd_ = other.fd_;
    map_ = other.map_;
    opts_ = other.opts_;
  }
  return *this;
}

// libc's close and munmap rather than raw system calls: no system call
// number of any architecture is needed here, and both are plain wrappers,
// safe on any thread.
Result<void> RemoteHandle::reset() {
  Target* t = std::exchange(target_, nullptr);
  if (!t) return ok();
  if (kind_ == Kind::kFd) {
    CallArg args[] = {CallArg::integer(static_cast<uint64_t>(fd_))};
    auto r = t->call_symbol("libc.so.6", "close", args, opts_);
    const std::string what =
        "close descriptor " + std::to_string(fd_) + " in process " + std::to_string(t->pid());
    if (!r) return std::move(r).error().with_context(what);
    if (static_cast<int32_t>(r->value) != 0) return Error(Errc::kIo, what + " failed");
    return ok();
  }
  CallArg args[] = {CallArg::integer(map_.start.addr()), CallArg::integer(map_.size)};
  auto r = t->call_symbol("libc.so.6", "munmap", args, opts_);
  const std::string what =
      "unmap " + std::to_string(map_.size) + " bytes in process " + std::to_string(t->pid());
  if (!r) return std::move(r).error().with_context(what);
  if (static_cast<int32_t>(r->value) != 0) return Error(Errc::kIo, what + " failed");
  return ok();
}

int RemoteHandle::release() {
  const bool held = std::exchange(target_, nullptr) != nullptr;
  return held && kind_ == Kind::kFd ? fd_ : -1;
}

}  // namespace remora::remote
