// The dynamic relocations that fill a GOT slot with the address of a
// function: what a tool that redirects calls by rewriting GOT slots (the
// default tool's tracer) looks for. Header-only and free of libstdc++, for
// code loaded into targets.
//
// Both architectures call an imported function the same way: a PLT entry
// (or, with -fno-plt, the call site itself) jumps through a GOT slot that
// the loader fills, lazily (JUMP_SLOT, first pointing back into the
// object's own PLT) or at load time (GLOB_DAT, also used for a function's
// address taken). The other relocations in .rela.plt (IRELATIVE,
// TLSDESC) are not calls through a slot another definition can replace.
#pragma once

#include <elf.h>
#include <stdint.h>

namespace remora::arch {

inline constexpr bool x86_64_is_got_slot(uint32_t type) {
  return type == R_X86_64_JUMP_SLOT || type == R_X86_64_GLOB_DAT;
}
inline constexpr bool aarch64_is_got_slot(uint32_t type) {
  return type == R_AARCH64_JUMP_SLOT || type == R_AARCH64_GLOB_DAT;
}

// Whether a relocation of `type` (ELF64_R_TYPE) in one of this host's
// objects fills a GOT slot that calls of the function go through.
inline constexpr bool is_got_slot_reloc(uint32_t type) {
#if defined(__x86_64__)
  return x86_64_is_got_slot(type);
#elif defined(__aarch64__)
  return aarch64_is_got_slot(type);
#else
#error "Remora's GOT relocations are defined for x86_64 and aarch64 hosts only"
#endif
}

}  // namespace remora::arch
