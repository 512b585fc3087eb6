// remote::RemoteHandle — an owned resource inside a target: a file
// descriptor (a memfd, one end of a pipe) or a mapping (a retired scratch).
// Whatever path a caller leaves by, the resource is released in the target,
// the way a UniqueFd releases one of ours: an early return cannot leak it.
//
// Ownership: the handle owns the resource until reset() releases it or
// release() hands it to the target for good (an fd the agent keeps). It
// refers to its Target, which must outlive it; it is move-only.
//
// A descriptor is known by what it is, not by its number alone: the handle
// records the device and inode the number named when the handle was made
// (read through /proc/PID/fd/N), and reset() closes the number only while
// it still names that object. A number the target (or anyone) closed and
// reused meanwhile is left alone: closing it would close one of the
// target's own descriptors, a worse harm than a leak.
//
// Threading: as the Target it refers to (its calls are serialised there).
// The release is one remote call of libc's close or munmap, on the thread
// named by the CallOptions given at creation (0: the target's choice).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/result.h"
#include "remote/target.h"

namespace remora::remote {

class RemoteHandle {
 public:
  RemoteHandle() = default;
  // What a descriptor names: device and inode (as /proc/PID/fd/N shows).
  struct Identity {
    uint64_t dev = 0, ino = 0;
    bool operator==(const Identity&) const = default;
  };
  // The identity of descriptor `fd` of process `pid` now; nullopt when the
  // number names nothing (or /proc cannot be read).
  static std::optional<Identity> identify(pid_t pid, int fd);

  // Takes ownership of descriptor `fd` of the target (nothing when fd < 0),
  // as the object it names now (or `as`, when the caller knows it).
  static RemoteHandle fd(Target& target, int fd, const CallOptions& opts = {},
                         std::optional<Identity> as = std::nullopt);
  // Takes ownership of the mapping `m` of the target (nothing when its size is 0).
  static RemoteHandle mapping(Target& target, const Target::Mapping& m, const CallOptions& opts = {});

  // Releases the resource; an error is logged on the "remote" channel
  // (REMORA_LOG=remote), since a destructor cannot report it.
  ~RemoteHandle();
  RemoteHandle(RemoteHandle&& other) noexcept;
  RemoteHandle& operator=(RemoteHandle&& other) noexcept;
  RemoteHandle(const RemoteHandle&) = delete;
  RemoteHandle& operator=(const RemoteHandle&) = delete;

  explicit operator bool() const { return target_ != nullptr; }
  // The target's descriptor number, or -1 (a mapping, or nothing held).
  int fd() const { return kind_ == Kind::kFd && target_ ? fd_ : -1; }
  // The object the descriptor held names (nullopt: unknown, or none held).
  std::optional<Identity> identity() const { return fd() >= 0 ? ident_ : std::nullopt; }
  // Whether the number still names that object in the target.
  bool still_ours() const;
  // The mapping held (size 0 when it holds none).
  Target::Mapping mapping() const { return kind_ == Kind::kMapping && target_ ? map_ : Target::Mapping{}; }

  // Releases the resource now and says whether the target did; the handle
  // is empty afterwards either way (a failed close is not retried: the
  // number may belong to someone else by then).
  Result<void> reset();
  // Ownership passes to the target for good: nothing is released. Returns
  // the descriptor number (-1 for a mapping).
  int release();

 private:
  enum class Kind { kFd, kMapping };
  void drop();  // reset(), its error logged
  Target* target_ = nullptr;
  Kind kind_ = Kind::kFd;
  int fd_ = -1;
  std::optional<Identity> ident_;
  Target::Mapping map_;
  CallOptions opts_;
};

}  // namespace remora::remote
