// Procedure linkage table entries: the GOT slot an entry jumps through,
// decoded from its instructions, so that a profile names a sample in a PLT
// stub after the function it reaches ("malloc@plt", as perf and objdump do)
// instead of after whatever symbol precedes .plt. Pure: the caller reads the
// bytes (an ELF section's) and says where they are linked.
#ifndef REMORA_ARCH_PLT_H_
#define REMORA_ARCH_PLT_H_

#include <cstdint>
#include <optional>
#include <span>

namespace remora::arch {

// The address of the GOT slot from which the PLT entry at `addr` (its bytes:
// `code`, one entry) loads its target; nullopt when the bytes are no such
// entry (PLT0, padding) or `machine` (an ELF e_machine) is neither EM_X86_64
// nor EM_AARCH64. Recognised:
//   x86_64   jmp *disp32(%rip), alone or after endbr64 and/or a bnd prefix
//            (.plt, .plt.sec, .plt.got);
//   aarch64  adrp x16, PAGE; ldr x17, [x16, #OFF] (...; br x17), alone or
//            after bti c (.plt).
std::optional<uint64_t> plt_entry_slot(uint16_t machine, std::span<const uint8_t> code, uint64_t addr);

}  // namespace remora::arch

#endif  // REMORA_ARCH_PLT_H_
