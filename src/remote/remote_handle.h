// remote::RemoteHandle — an owned resource inside a target: a file
// descriptor (a memfd, one end of a pipe) or a mapping (a retired scratch).
// Whatever path a caller leaves by, the resource is released in the target,
// the way a UniqueFd releases one of ours: an early return cannot leak it.
//
// Ownership: the handle owns the resource until reset() releases it or
// release() hands it to the target for good (an fd the agent keeps). It
// refers to its Target, which must outlive it; it is move-only.
//
// Threading: as the Target it refers to (its calls are serialised there).
// The release is one remote call of libc's close or munmap, on the thread
// named by the CallOptions given at creation (0: the target's choice).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "remote/target.h"

namespace remora::remote {

class RemoteHandle {
 public:
  RemoteHandle() = default;
  // Takes ownership of descriptor `fd` of the target (nothing when fd < 0).
  static RemoteHandle fd(Target& target, int fd, const CallOptions& opts = {});
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
  Target::Mapping map_;
  CallOptions opts_;
};

}  // namespace remora::remote
