// RemotePtr<T>: an address in another process. Never converts to a host
// pointer by accident; arithmetic is in units of T like a real pointer.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

namespace remora {

template <typename T>
class RemotePtr {
 public:
  constexpr RemotePtr() = default;
  constexpr explicit RemotePtr(uint64_t addr) : addr_(addr) {}

  constexpr uint64_t addr() const { return addr_; }
  constexpr bool null() const { return addr_ == 0; }
  constexpr explicit operator bool() const { return addr_ != 0; }

  template <typename U>
  constexpr RemotePtr<U> cast() const {
    return RemotePtr<U>(addr_);
  }

  constexpr RemotePtr operator+(int64_t n) const {
    return RemotePtr(addr_ + static_cast<uint64_t>(n) * elem());
  }
  constexpr RemotePtr operator-(int64_t n) const {
    return RemotePtr(addr_ - static_cast<uint64_t>(n) * elem());
  }
  constexpr auto operator<=>(const RemotePtr&) const = default;

 private:
  static constexpr uint64_t elem() {
    if constexpr (std::is_void_v<T>)
      return 1;
    else
      return sizeof(T);
  }
  uint64_t addr_ = 0;
};

using RemoteAddr = RemotePtr<void>;

}  // namespace remora
