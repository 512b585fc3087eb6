// The PLT entries of an ELF object, each named after the function its GOT
// slot is relocated against ("malloc@plt"), as perf and objdump name them:
// a sample in a stub then reads as the call it is making, not as whatever
// symbol precedes .plt ("_init"). The entries' instructions are decoded by
// arch/plt.h; the slots' names come from .rela.plt and .rela.dyn.
#ifndef REMORA_PROFILE_PLT_H_
#define REMORA_PROFILE_PLT_H_

#include <libelf.h>

#include <cstdint>
#include <string>
#include <vector>

namespace remora::profile {

struct PltEntry {
  uint64_t start = 0, end = 0;  // ELF virtual addresses
  std::string name;             // "malloc@plt"
};

// Every named entry of .plt, .plt.sec and .plt.got, sorted by address.
// Empty for an ELF without them, or whose sections hold no bytes (a
// separate debug file).
std::vector<PltEntry> plt_entries(Elf* elf);

// The entry holding `vaddr`, nullptr when none does.
const PltEntry* plt_entry_at(const std::vector<PltEntry>& entries, uint64_t vaddr);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_PLT_H_
