// UniqueHandle: one move-only RAII owner for kernel handles (fds, pidfds,
// DIR*), so that no handle leaks on an error path. Every fd Remora opens is
// opened O_CLOEXEC so that a target launched by us never inherits one.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <utility>

namespace remora {

template <typename T, T kInvalid, typename Closer>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(T h) : h_(h) {}
  ~UniqueHandle() { reset(); }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, kInvalid)) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, kInvalid));
    return *this;
  }

  T get() const { return h_; }
  bool valid() const { return h_ != kInvalid; }
  explicit operator bool() const { return valid(); }
  T release() { return std::exchange(h_, kInvalid); }
  void reset(T h = kInvalid) {
    if (h_ != kInvalid) Closer{}(h_);
    h_ = h;
  }

 private:
  T h_ = kInvalid;
};

struct FdCloser {
  void operator()(int fd) const { ::close(fd); }
};
struct DirCloser {
  void operator()(DIR* d) const { ::closedir(d); }
};

using UniqueFd = UniqueHandle<int, -1, FdCloser>;
using UniqueDir = UniqueHandle<DIR*, nullptr, DirCloser>;

}  // namespace remora
