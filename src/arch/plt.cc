#include "arch/plt.h"

#include <elf.h>

#include <cstring>

namespace remora::arch {
namespace {

uint32_t le32(std::span<const uint8_t> b, size_t at) {
  return static_cast<uint32_t>(b[at]) | static_cast<uint32_t>(b[at + 1]) << 8 |
         static_cast<uint32_t>(b[at + 2]) << 16 | static_cast<uint32_t>(b[at + 3]) << 24;
}

// jmp *disp32(%rip) (ff 25), at the start of the entry or after the
// prefixes an entry may carry: endbr64 (f3 0f 1e fa), bnd (f2). Only those
// places: the bytes ff 25 elsewhere may be an immediate of another
// instruction.
std::optional<uint64_t> x86_64_slot(std::span<const uint8_t> code, uint64_t addr) {
  static constexpr uint8_t kEndbr64[] = {0xf3, 0x0f, 0x1e, 0xfa};
  size_t at = 0;
  if (code.size() >= 4 && std::memcmp(code.data(), kEndbr64, 4) == 0) at = 4;
  if (code.size() > at && code[at] == 0xf2) ++at;
  if (code.size() < at + 6 || code[at] != 0xff || code[at + 1] != 0x25) return std::nullopt;
  const auto disp = static_cast<int32_t>(le32(code, at + 2));
  return addr + at + 6 + static_cast<int64_t>(disp);  // RIP-relative: from the next instruction
}

// adrp x16, PAGE then ldr x17, [x16, #OFF], at the start or after bti c.
std::optional<uint64_t> aarch64_slot(std::span<const uint8_t> code, uint64_t addr) {
  constexpr uint32_t kBtiC = 0xd503245f;
  size_t at = 0;
  if (code.size() >= 4 && le32(code, 0) == kBtiC) at = 4;
  if (code.size() < at + 8) return std::nullopt;
  const uint32_t adrp = le32(code, at), ldr = le32(code, at + 4);
  // ADRP: 1 immlo(2) 10000 immhi(19) Rd(5); Rd = x16.
  if ((adrp & 0x9f00001f) != 0x90000010) return std::nullopt;
  // LDR (immediate, unsigned offset, 64-bit): 1111100101 imm12 Rn Rt; Rn = x16, Rt = x17.
  if ((ldr & 0xffc003ff) != 0xf9400211) return std::nullopt;
  const uint64_t immlo = (adrp >> 29) & 3, immhi = (adrp >> 5) & 0x7ffff;
  int64_t pages = static_cast<int64_t>(immhi << 2 | immlo);
  if (pages & (int64_t{1} << 20)) pages -= int64_t{1} << 21;  // 21-bit signed
  const uint64_t page = ((addr + at) & ~uint64_t{0xfff}) + static_cast<uint64_t>(pages * 4096);
  return page + ((ldr >> 10) & 0xfff) * 8;
}

}  // namespace

std::optional<uint64_t> plt_entry_slot(uint16_t machine, std::span<const uint8_t> code, uint64_t addr) {
  if (machine == EM_X86_64) return x86_64_slot(code, addr);
  if (machine == EM_AARCH64) return aarch64_slot(code, addr);
  return std::nullopt;
}

}  // namespace remora::arch
