// The block the thread trampoline of each architecture's stub works on (in
// target memory; arch/x86_64_stub.S, arch/aarch64_stub.S): the same fields
// at the same offsets on every architecture, which each stub header spells
// out for its assembler and each architecture's .cc checks against this
// struct at compile time.
#pragma once

#include <cstdint>

namespace remora::arch {

struct LoaderBlock {
  uint64_t dlopen_fn;          // 0x00
  uint64_t path;               // 0x08
  uint64_t flags;              // 0x10
  uint64_t pthread_self_fn;    // 0x18
  uint64_t pthread_detach_fn;  // 0x20
  uint64_t done;               // 0x28: 1 once the trampoline is about to return
  uint64_t handle;             // 0x30: dlopen's result
  uint64_t tid;                // 0x38: the trampoline thread's id
  uint64_t dlerror_fn;         // 0x40
  uint64_t error;              // 0x48: dlerror()'s result
};
static_assert(sizeof(LoaderBlock) == 0x50);

}  // namespace remora::arch
