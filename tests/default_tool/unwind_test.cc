// Unit tests of the collector's unwinder (tools/default/unwind.h) and the
// non-faulting reads under it, over captures built by hand: the maps
// parser from tables, the frame-pointer fallback over a synthetic JIT
// stack, a real capture of this thread's stack, and garbage captures.
#include "unwind.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <memory>
#include <random>

#include "own_memory.h"

namespace remora_tool {
namespace {

TEST(DefaultToolMaps, ParsesTheKernelsLines) {
  auto maps = parse_maps(
      "55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 1311 /usr/bin/cat\n"
      "55d0c0a02000-55d0c0a07000 r-xp 00002000 08:01 1311 /usr/bin/cat\n"
      "7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n"
      "7f1000000000-7f1000001000 r-xs 00000000 00:01 4242 /memfd:jit (deleted)\n"
      "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]\n"
      "7ffc00100000-7ffc00102000 r-xp 00000000 00:00 0                          [vdso]\n"
      "garbage line\n"
      "10-5 r--p 0 0:0 0\n");
  ASSERT_EQ(maps.size(), 6u);
  EXPECT_EQ(maps[0].start, 0x55d0c0a00000u);
  EXPECT_EQ(maps[0].end, 0x55d0c0a02000u);
  EXPECT_TRUE(maps[0].read && !maps[0].exec && maps[0].file);
  EXPECT_TRUE(maps[1].exec && maps[1].file);
  EXPECT_FALSE(maps[2].file);
  EXPECT_TRUE(maps[3].shared && maps[3].file && maps[3].exec);
  EXPECT_TRUE(maps[4].stack && !maps[4].file);
  EXPECT_TRUE(maps[5].vdso);

  MapsSnapshot snap;
  snap.assign(maps);
  EXPECT_TRUE(snap.readable_image(0x55d0c0a00000u, 8));
  EXPECT_FALSE(snap.readable_image(0x55d0c0a01ffcu, 8)) << "a read may not run past the mapping";
  EXPECT_FALSE(snap.readable_image(0x7f0000000100u, 8)) << "anonymous memory is never read";
  EXPECT_TRUE(snap.readable_image(0x7ffc00100010u, 8)) << "the vDSO has unwind tables";
  EXPECT_TRUE(snap.executable(0x55d0c0a02010u));
  EXPECT_FALSE(snap.executable(0x55d0c0a00010u));
  EXPECT_FALSE(snap.executable(0x1000u));
  uint64_t lo = 0, hi = 0;
  EXPECT_TRUE(snap.stack_bounds(0x7f0000000100u, &lo, &hi));
  EXPECT_EQ(lo, 0x7f0000000000u);
  EXPECT_EQ(hi, 0x7f0000021000u);
  EXPECT_FALSE(snap.stack_bounds(0x55d0c0a00010u, &lo, &hi)) << "a file mapping is no stack";
  EXPECT_FALSE(snap.stack_bounds(0x7f1000000010u, &lo, &hi)) << "a shared mapping is no stack";
  EXPECT_TRUE(snap.stack_bounds(0x7ffc00020000u, &lo, &hi));
  EXPECT_EQ(hi, 0x7ffc00021000u);
  ASSERT_NE(snap.main_stack(), nullptr);
}

// A JIT-like stack without CFI: code in an executable anonymous mapping,
// frames linked by the frame pointer inside the copy.
TEST(DefaultToolUnwind, FramePointerStepsStayInsideTheCopy) {
  MapsSnapshot snap;
  Mapping jit;
  jit.start = 0x10000;
  jit.end = 0x20000;
  jit.read = jit.exec = true;
  snap.assign({jit});
  auto rec = std::make_unique<SampleRec>();
  const uint64_t sp = 0x7000000;
  rec->regs[kRegPc] = 0x10010;
  rec->regs[kRegSp] = sp;
  rec->regs[kRegFp] = sp + 64;
  rec->stack_len = 256;
  auto put = [&](uint64_t off, uint64_t v) { memcpy(rec->stack + off, &v, 8); };
  put(64, sp + 128);   // saved frame pointer
  put(72, 0x10020);    // return address
  put(128, sp + 512);  // saved frame pointer: outside the copy
  put(136, 0x10030);
  Unwinder u;
  uint64_t pcs[kMaxFrames];
  uint32_t n = u.unwind(*rec, snap, pcs, kMaxFrames);
  ASSERT_EQ(n, 3u);
  EXPECT_EQ(pcs[0], 0x10010u);
  EXPECT_EQ(pcs[1], 0x10020u);
  EXPECT_EQ(pcs[2], 0x10030u);
  EXPECT_EQ(u.fp_steps(), 2u);

  // A chain that points at itself stops (sp must increase); one that leads
  // outside executable memory stops before recording the garbage.
  put(64, sp + 64);
  n = u.unwind(*rec, snap, pcs, kMaxFrames);
  EXPECT_EQ(n, 2u);
  put(72, 0x4141414141414141ull);
  n = u.unwind(*rec, snap, pcs, kMaxFrames);
  EXPECT_EQ(n, 1u);
  // A frame pointer below sp, or beyond the copy: no step.
  rec->regs[kRegFp] = sp - 16;
  EXPECT_EQ(u.unwind(*rec, snap, pcs, kMaxFrames), 1u);
  rec->regs[kRegFp] = sp + 250;
  EXPECT_EQ(u.unwind(*rec, snap, pcs, kMaxFrames), 1u);
}

// Captures this thread's own registers and stack the way the handler does
// and unwinds them with CFI: the caller's return address must be found.
__attribute__((noinline)) uint32_t capture_and_unwind(Unwinder& u, const MapsSnapshot& snap, uint64_t* pcs,
                                                      void** caller) {
  *caller = __builtin_return_address(0);
  auto rec = std::make_unique<SampleRec>();
  ucontext_t uc;
  if (getcontext(&uc) != 0) return 0;
  // getcontext's registers are those at its return (the pc its return
  // address), as consistent a set as a signal's ucontext.
  remora::arch::sample_regs_from_ucontext(&uc, rec->regs);
  uint64_t lo = 0, hi = 0;
  if (!snap.stack_bounds(rec->regs[kRegSp], &lo, &hi)) return 0;
  uint64_t want = std::min<uint64_t>(hi - rec->regs[kRegSp], kStackCopyBytes);
  rec->stack_len = static_cast<uint32_t>(own_memory_read(rec->stack, rec->regs[kRegSp], want));
  return u.unwind(*rec, snap, pcs, kMaxFrames);
}

TEST(DefaultToolUnwind, UnwindsARealCaptureWithCfi) {
  ASSERT_STREQ(own_memory_open(), "");
  MapsSnapshot snap;
  ASSERT_TRUE(snap.refresh());
  Unwinder u;
  uint64_t pcs[kMaxFrames];
  void* caller = nullptr;
  uint32_t n = capture_and_unwind(u, snap, pcs, &caller);
  ASSERT_GE(n, 2u);
  bool found = false;
  for (uint32_t i = 1; i < n; ++i) found = found || pcs[i] == reinterpret_cast<uint64_t>(caller);
  EXPECT_TRUE(found) << n << " frames; the caller's return address is among them";
  EXPECT_GE(u.cfi_steps(), 2u);
  // What one unwind costs the collector (printed, not asserted: the
  // machine may be loaded).
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  const int kRounds = 200;
  for (int i = 0; i < kRounds; ++i) capture_and_unwind(u, snap, pcs, &caller);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double us = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / 1e3 / kRounds;
  printf("      capture + unwind of %u frames: %.1f us each\n", n, us);
}

TEST(DefaultToolUnwind, GarbageCapturesNeverFault) {
  ASSERT_STREQ(own_memory_open(), "");
  MapsSnapshot snap;
  ASSERT_TRUE(snap.refresh());
  Unwinder u;
  std::mt19937_64 rng(42);
  auto rec = std::make_unique<SampleRec>();
  uint64_t pcs[kMaxFrames];
  // Addresses of every kind: our code, our stack, the heap, unmapped, NULL.
  std::vector<uint64_t> seeds = {reinterpret_cast<uint64_t>(&capture_and_unwind),
                                 reinterpret_cast<uint64_t>(&rng),
                                 reinterpret_cast<uint64_t>(rec.get()),
                                 0,
                                 0xdeadbeefcafebabeull,
                                 8};
  for (int round = 0; round < 2000; ++round) {
    for (auto& r : rec->regs) r = seeds[rng() % seeds.size()] + (rng() % 4096) - 2048;
    rec->stack_len = static_cast<uint32_t>(rng() % (kStackCopyBytes + 1)) & ~7u;
    for (uint32_t i = 0; i + 8 <= rec->stack_len; i += 8) {
      uint64_t v = rng() % 3 == 0 ? rng() : seeds[rng() % seeds.size()] + (rng() % 256);
      memcpy(rec->stack + i, &v, 8);
    }
    uint32_t n = u.unwind(*rec, snap, pcs, kMaxFrames);
    ASSERT_GE(n, 1u);
    ASSERT_LE(n, kMaxFrames);
  }
  // A read of unmapped memory is an error, not a fault.
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  munmap(p, 4096);
  uint64_t v = 0;
  EXPECT_EQ(own_memory_read(&v, reinterpret_cast<uint64_t>(p), sizeof v), 0u);
  EXPECT_EQ(own_memory_read(&v, 0, sizeof v), 0u);
}

}  // namespace
}  // namespace remora_tool
