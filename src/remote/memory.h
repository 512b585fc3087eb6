// Reading and writing another process's memory through /proc/PID/mem.
//
// /proc/PID/mem goes through the kernel's FOLL_FORCE path, so (like a
// debugger) it can write to read-only mappings such as Remora's RX stub page.
// Access requires PTRACE_MODE_ATTACH, checked when the file is opened.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::remote {

class Memory {
 public:
  static Result<Memory> open(pid_t pid);

  Result<void> read(uint64_t addr, std::span<std::byte> out) const;
  Result<void> write(uint64_t addr, std::span<const std::byte> in) const;

  template <typename T>
  Result<T> read_value(uint64_t addr) const {
    T v{};
    REMORA_TRY(read(addr, std::as_writable_bytes(std::span(&v, 1))));
    return v;
  }

 private:
  Memory(pid_t pid, UniqueFd fd) : pid_(pid), fd_(std::move(fd)) {}
  pid_t pid_;
  UniqueFd fd_;
};

}  // namespace remora::remote
