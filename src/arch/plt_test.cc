// plt_entry_slot (arch/plt.h): entries as GNU ld lays them out, each
// architecture's decoded on every host.
#include "arch/plt.h"

#include <elf.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace remora::arch {
namespace {

std::vector<uint8_t> words(std::initializer_list<uint32_t> ws) {
  std::vector<uint8_t> out;
  for (uint32_t w : ws)
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(w >> (8 * i)));
  return out;
}

TEST(PltEntrySlot, X86_64Entries) {
  struct Case {
    const char* what;
    std::vector<uint8_t> code;
    uint64_t addr;
    std::optional<uint64_t> slot;
  } cases[] = {
      {"lazy .plt entry: jmp *GOT(%rip); push; jmp PLT0",
       {0xff, 0x25, 0xe2, 0x2f, 0x00, 0x00, 0x68, 0x00, 0x00, 0x00, 0x00, 0xe9, 0xe0, 0xff, 0xff, 0xff},
       0x1030,
       0x1030 + 6 + 0x2fe2},
      {".plt.sec (IBT): endbr64; bnd jmp *GOT(%rip); nop",
       {0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xad, 0x2f, 0x00, 0x00, 0x0f, 0x1f, 0x44, 0x00, 0x00},
       0x1060,
       0x1060 + 11 + 0x2fad},
      {".plt.got: jmp *GOT(%rip); xchg %ax,%ax",
       {0xff, 0x25, 0x9a, 0x2f, 0x00, 0x00, 0x66, 0x90},
       0x1070,
       0x1070 + 6 + 0x2f9a},
      {"a GOT below the entry (negative displacement)",
       {0xff, 0x25, 0xf0, 0xff, 0xff, 0xff, 0x66, 0x90},
       0x5000,
       0x5000 + 6 - 0x10},
      {"PLT0: push GOT+8; jmp *GOT+16",
       {0xff, 0x35, 0xe2, 0x2f, 0x00, 0x00, 0xff, 0x25, 0xe4, 0x2f, 0x00, 0x00, 0x0f, 0x1f, 0x40, 0x00},
       0x1020,
       std::nullopt},
      {"an IBT .plt entry (endbr64; push; bnd jmp PLT0)",
       {0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0x00, 0x00, 0x00, 0x00, 0xf2, 0xe9, 0xe1, 0xff, 0xff, 0xff, 0x90},
       0x1030,
       std::nullopt},
      {"too short", {0xff, 0x25, 0x00}, 0x1000, std::nullopt},
      {"padding", {0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc}, 0x1000, std::nullopt},
  };
  for (const auto& c : cases) EXPECT_EQ(plt_entry_slot(EM_X86_64, c.code, c.addr), c.slot) << c.what;
}

TEST(PltEntrySlot, Aarch64Entries) {
  constexpr uint32_t kAdd = 0x91006210, kBr = 0xd61f0220, kBtiC = 0xd503245f, kNop = 0xd503201f;
  struct Case {
    const char* what;
    std::vector<uint8_t> code;
    uint64_t addr;
    std::optional<uint64_t> slot;
  } cases[] = {
      // adrp x16, one page up (immlo 1); ldr x17, [x16, #0x18] (imm12 3).
      {"adrp; ldr; add; br", words({0xb0000010, 0xf9400e11, kAdd, kBr}), 0x10400, 0x11018},
      {"bti c first", words({kBtiC, 0xb0000010, 0xf9400e11, kBr}), 0x10400, 0x11018},
      // 16 pages down: immhi 0x7fffc, immlo 0; ldr offset 0.
      {"a GOT below the entry", words({0x90ffff90, 0xf9400211, kAdd, kBr}), 0x20010, 0x10000},
      {"PLT0: stp x16, x30, [sp, #-16]!; adrp x16 ...", words({0xa9bf7bf0, 0xb0000010, 0xf9400e11, kAdd}),
       0x10400, std::nullopt},
      {"adrp into another register", words({0xb0000011, 0xf9400e11, kAdd, kBr}), 0x10400, std::nullopt},
      {"padding", words({kNop, kNop, kNop, kNop}), 0x10400, std::nullopt},
  };
  for (const auto& c : cases) EXPECT_EQ(plt_entry_slot(EM_AARCH64, c.code, c.addr), c.slot) << c.what;
}

TEST(PltEntrySlot, OtherMachinesAreNotDecoded) {
  const std::vector<uint8_t> jmp = {0xff, 0x25, 0x00, 0x00, 0x00, 0x00, 0x66, 0x90};
  EXPECT_EQ(plt_entry_slot(EM_386, jmp, 0x1000), std::nullopt);
  EXPECT_EQ(plt_entry_slot(EM_RISCV, jmp, 0x1000), std::nullopt);
}

}  // namespace
}  // namespace remora::arch
