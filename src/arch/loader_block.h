// The blocks the thread trampoline and the loader start of each
// architecture's stub work on (in target memory; arch/x86_64_stub.S,
// arch/aarch64_stub.S): the same fields at the same offsets on every
// architecture, which each stub header spells out for its assembler and each
// architecture's .cc checks against these structs at compile time.
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
  // The hook: when hook_name is set and the library loaded, the trampoline
  // looks that function up in it (dlsym(handle, hook_name)) and, when
  // found, calls it with hook_arg before it sets `done`; its int result goes
  // into hook_rc (sign-extended), which otherwise keeps what the controller
  // wrote. (The agent's remora_agent_loader_attach.)
  uint64_t dlsym_fn;   // 0x50
  uint64_t hook_name;  // 0x58
  uint64_t hook_arg;   // 0x60
  uint64_t hook_rc;    // 0x68
};
static_assert(sizeof(LoaderBlock) == 0x70);

// What the loader start routine does, in one call on the interrupted thread
// (instead of one remote call each): maps the loader thread's own stack,
// names it in a pthread_attr_t, and starts the thread trampoline on it with
// pthread_create. With attr_init_fn 0 it maps nothing and the thread gets
// libc's own stack. The routine returns pthread_create's result, or mmap's
// -errno when the stack could not be mapped (then no thread was started:
// `created` keeps the value the controller wrote).
struct LoaderStart {
  uint64_t pthread_create_fn;  // 0x00
  uint64_t attr_init_fn;       // 0x08: pthread_attr_init, or 0: libc's stack
  uint64_t attr_setstack_fn;   // 0x10: pthread_attr_setstack
  uint64_t stack_hint;         // 0x18: mmap's address hint (never MAP_FIXED)
  uint64_t stack_size;         // 0x20
  uint64_t attr;               // 0x28: room for a pthread_attr_t (64 bytes)
  uint64_t thread_out;         // 0x30: where pthread_create stores the pthread_t
  uint64_t trampoline;         // 0x38: the thread's start routine
  uint64_t block;              // 0x40: its LoaderBlock
  uint64_t stack;              // 0x48: out: mmap's result (an address or -errno)
  uint64_t attr_status;        // 0x50: out: the first non-zero result of the two attr calls, or 0
  uint64_t created;            // 0x58: out: pthread_create's result (sign-extended)
};
static_assert(sizeof(LoaderStart) == 0x60);

}  // namespace remora::arch
