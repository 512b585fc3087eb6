// Target "simd": threads that keep known values in every vector register the
// CPU has, across long assembly loops, and check them on every iteration
// against a copy in memory (the registers are loaded once per loop and never
// reloaded). remora_probe clobbers these registers (see target_common.cc), so
// a remote call on one of these threads that does not give back its FP/SIMD
// state exactly is caught by the thread itself.
//
// Each register file is held in three ways, each its own thread: spinning
// ("spin"), blocked in select() between checks ("select": an interrupted
// select restarts as an ordinary call, so a remote call restores the thread
// through its signal frame), and blocked in nanosleep() ("sleep": it restarts
// through restart_syscall, so the thread is restored by ptrace). Threads:
//   sse0, sse1           xmm1-xmm15
//   ymm-spin/select/sleep  ymm0-ymm15 (full 256 bits), if the CPU has AVX
//   zmm-spin/select/sleep  zmm0-zmm31 (512 bits) and k0-k7, if it has AVX-512F
//   amx-spin, amx-sleep  tmm0-tmm7 and TILECFG, in threads that asked for AMX
//                        permission (ARCH_REQ_XCOMP_PERM), if the CPU and the
//                        kernel have AMX; the zmm threads next to them never
//                        use AMX, so their extended state stays small
//   x87                  two 80-bit values on the x87 stack, a non-default x87
//                        control word and a non-default MXCSR
// The check stores the registers to memory and compares with general
// registers, so that no vector register is needed as scratch. Instructions
// above SSE2 are enabled per function (target attribute) and only run after a
// runtime check, so the binary runs on any x86_64. The command "features"
// answers which register files run and why any is skipped.
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "target_common.h"

using namespace remora_target;

namespace {

constexpr uint64_t kSpinIterations = 20000;
constexpr uint64_t kBlockIterations = 20;  // 1 ms each

enum Hold : uint64_t { kSpin = 0, kSelect = 1, kSleep = 2 };

struct alignas(64) Patterns {
  uint8_t bytes[32][64];
};

struct alignas(64) Tiles {
  uint8_t cfg[64];
  uint8_t data[8][16][64];  // 8 tiles of 16 rows x 64 bytes
};

struct Holder {
  Worker* w;
  Hold hold;
  Patterns pat;
  Patterns dump;
  Tiles tiles;
  Tiles tiles_dump;
  struct {
    int64_t sec, nsec;
  } ts;
};

void fill(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    p[i] = static_cast<uint8_t>(x >> 56);
  }
}

std::string g_features;  // the "features" answer

#if defined(__x86_64__)

// Every asm block below addresses the Holder through one register (%[h])
// with constant offsets, so that few general registers are tied up.
#define HOLDER_OPERANDS                                                                \
  [h] "r"(h), [pat] "i"(offsetof(Holder, pat)), [dump] "i"(offsetof(Holder, dump)),    \
      [tiles] "i"(offsetof(Holder, tiles)), [tdump] "i"(offsetof(Holder, tiles_dump)), \
      [ts] "i"(offsetof(Holder, ts)), [hold] "i"(offsetof(Holder, hold))

// Between two checks, a blocking system call when the thread holds that way:
// select(0, 0, 0, 0, {0, 1 ms}) or nanosleep({0, 1 ms}). The syscall
// instruction keeps every vector register.
// clang-format off
#define BLOCK                                                          \
  "cmpq $1, %c[hold](%[h])\n\t"                                        \
  "jb 6f\n\t"                                                          \
  "movq $0, %c[ts](%[h])\n\t"                                          \
  "movq $1000, %c[ts]+8(%[h])\n\t"                                     \
  "je 5f\n\t"                                                          \
  "movq $1000000, %c[ts]+8(%[h])\n\t"                                  \
  "mov $35, %%eax\n\tlea %c[ts](%[h]), %%rdi\n\txor %%esi, %%esi\n\t"  \
  "syscall\n\tjmp 6f\n\t"                                              \
  "5: mov $23, %%eax\n\txor %%edi, %%edi\n\txor %%esi, %%esi\n\t"      \
  "xor %%edx, %%edx\n\txor %%r10d, %%r10d\n\tlea %c[ts](%[h]), %%r8\n\t" \
  "syscall\n\t"                                                        \
  "6:\n\t"
// Compares `nq` quadwords of the dump at offset `d` with the pattern at
// offset `p`; jumps to 2f on a difference.
#define COMPARE_AT(d, p, nq)                       \
  "xor %%ecx, %%ecx\n\t"                           \
  "4: mov %c[" d "](%[h],%%rcx,8), %%rax\n\t"      \
  "cmp %c[" p "](%[h],%%rcx,8), %%rax\n\t"         \
  "jne 2f\n\t"                                     \
  "inc %%ecx\n\t"                                  \
  "cmp $" #nq ", %%ecx\n\t"                        \
  "jb 4b\n\t"
#define COMPARE(nq) COMPARE_AT("dump", "pat", nq)
#define END_LOOP          \
  "decq %[n]\n\t"         \
  "jnz 1b\n\t"            \
  "jmp 3f\n\t"            \
  "2: movq $1, %[bad]\n\t"
#define BLOCK_CLOBBERS "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r10", "r11", "cc", "memory"

#define SSE_LOAD(n) "movdqu %c[pat]+" #n "*64(%[h]), %%xmm" #n "\n\t"
#define SSE_STORE(n) "movdqu %%xmm" #n ", %c[dump]+" #n "*64(%[h])\n\t"
#define YMM_LOAD(n) "vmovdqu %c[pat]+" #n "*64(%[h]), %%ymm" #n "\n\t"
#define YMM_STORE(n) "vmovdqu %%ymm" #n ", %c[dump]+" #n "*64(%[h])\n\t"
#define ZMM_LOAD(n) "vmovdqu64 %c[pat]+" #n "*64(%[h]), %%zmm" #n "\n\t"
#define ZMM_STORE(n) "vmovdqu64 %%zmm" #n ", %c[dump]+" #n "*64(%[h])\n\t"
#define K_LOAD(n) "movl $0x" #n "a5" #n ", %%eax\n\tkmovw %%eax, %%k" #n "\n\t"
#define K_CHECK(n)                    \
  "kmovw %%k" #n ", %%eax\n\t"        \
  "cmpl $0x" #n "a5" #n ", %%eax\n\t" \
  "jne 2f\n\t"
#define X8(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define X16(M) X8(M) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define X16_HI(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#define X15(M) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
// AMX: TILECFG (palette 1, eight tiles of 16 rows x 64 bytes) and the eight
// tiles; rows are 64 bytes apart (the stride in rdx).
#define TILE_LOAD(n) "tileloadd %c[tiles]+64+" #n "*1024(%[h],%%rdx,1), %%tmm" #n "\n\t"
#define TILE_STORE(n) "tilestored %%tmm" #n ", %c[tdump]+64+" #n "*1024(%[h],%%rdx,1)\n\t"
// clang-format on

// Each returns 1 when a register changed during the loop, else 0.
uint64_t sse_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0;
  asm volatile(X15(SSE_LOAD) "1:\n\t" X15(SSE_STORE) COMPARE(128) END_LOOP "3:\n\t"
               : [bad] "+r"(bad), [n] "+r"(n)
               : HOLDER_OPERANDS
               : "rax", "rcx", "cc", "memory", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                 "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  return bad;
}

__attribute__((target("avx"))) uint64_t ymm_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0;
  asm volatile(X16(YMM_LOAD) "1:\n\t" BLOCK X16(YMM_STORE) COMPARE(128) END_LOOP "3: vzeroupper\n\t"
               : [bad] "+r"(bad), [n] "+r"(n)
               : HOLDER_OPERANDS
               : BLOCK_CLOBBERS, "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                 "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  return bad;
}

__attribute__((target("avx512f"))) uint64_t zmm_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0;
  asm volatile(X16(ZMM_LOAD) X16_HI(ZMM_LOAD) X8(K_LOAD) "1:\n\t" BLOCK X16(ZMM_STORE) X16_HI(ZMM_STORE)
                   COMPARE(256) X8(K_CHECK) END_LOOP "3: vzeroupper\n\t"
               : [bad] "+r"(bad), [n] "+r"(n)
               : HOLDER_OPERANDS
               : BLOCK_CLOBBERS, "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                 "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18",
                 "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28",
                 "xmm29", "xmm30", "xmm31", "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7");
  return bad;
}

// TILECFG is compared first (8 quadwords), then the 8 KiB of tile data. The
// tiles stay loaded on return (no TILERELEASE).
uint64_t amx_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0;
  asm volatile("ldtilecfg %c[tiles](%[h])\n\t"
               "mov $64, %%edx\n\t" X8(TILE_LOAD) "1:\n\t" BLOCK "sttilecfg %c[tdump](%[h])\n\t"
               COMPARE_AT("tdump", "tiles", 8) "mov $64, %%edx\n\t" X8(TILE_STORE)
               "xor %%ecx, %%ecx\n\t"
               "7: mov %c[tdump]+64(%[h],%%rcx,8), %%rax\n\t"
               "cmp %c[tiles]+64(%[h],%%rcx,8), %%rax\n\t"
               "jne 2f\n\t"
               "inc %%ecx\n\t"
               "cmp $1024, %%ecx\n\t"
               "jb 7b\n\t" END_LOOP "3:\n\t"
               : [bad] "+r"(bad), [n] "+r"(n)
               : HOLDER_OPERANDS
               : BLOCK_CLOBBERS);
  return bad;
}

// Two 80-bit values held on the x87 stack; each iteration pushes the
// expected value from memory, compares it with the held one (fucomip pops
// it again) and checks the x87 control word and MXCSR.
long double g_x87_a = 1.0L / 3.0L;
long double g_x87_b = -7.0L / 11.0L;
constexpr uint16_t kX87Control = 0x027f;  // 53-bit precision (default 0x037f)
constexpr uint32_t kMxcsr = 0x7f80;       // round toward zero (default 0x1f80)

uint64_t x87_hold(uint64_t iterations) {
  uint64_t bad = 0;
  uint16_t cw = kX87Control;
  uint32_t mx = kMxcsr;
  uint16_t cw_now = 0;
  uint32_t mx_now = 0;
  asm volatile(
      "fldt %[a]\n\t"  // st1 = a
      "fldt %[b]\n\t"  // st0 = b
      "1:\n\t"
      "fldt %[b]\n\t"
      "fucomip %%st(1), %%st\n\t"  // expected b vs held b; pops the expected
      "jne 2f\n\t"
      "jp 2f\n\t"
      "fldt %[a]\n\t"
      "fucomip %%st(2), %%st\n\t"  // expected a vs held a
      "jne 2f\n\t"
      "jp 2f\n\t"
      "fnstcw %[cw_now]\n\t"
      "movzwl %[cw_now], %%eax\n\t"
      "cmpw %[cw], %%ax\n\t"
      "jne 2f\n\t"
      "stmxcsr %[mx_now]\n\t"
      "movl %[mx_now], %%eax\n\t"
      "cmpl %[mx], %%eax\n\t"
      "jne 2f\n\t"
      "decq %[n]\n\t"
      "jnz 1b\n\t"
      "jmp 3f\n\t"
      "2: movq $1, %[bad]\n\t"
      "3: fstp %%st(0)\n\t"
      "fstp %%st(0)\n\t"
      : [bad] "+r"(bad), [n] "+r"(iterations), [cw_now] "=m"(cw_now), [mx_now] "=m"(mx_now)
      : [a] "m"(g_x87_a), [b] "m"(g_x87_b), [cw] "r"(cw), [mx] "r"(mx)
      : "rax", "cc", "memory", "st", "st(1)", "st(2)");
  return bad;
}

uint64_t iterations(const Holder* h) { return h->hold == kSpin ? kSpinIterations : kBlockIterations; }

void begin(Holder* h) {
  worker_started(h->w);
  if (h->hold == kSpin) spin_politely();
}

void* sse_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  begin(h);
  for (;;) {
    if (sse_hold(h, kSpinIterations) != 0) anomaly("%s: an xmm register changed", h->w->role);
    h->w->progress++;
  }
}

void* ymm_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  begin(h);
  for (;;) {
    if (ymm_hold(h, iterations(h)) != 0) anomaly("%s: a ymm register changed", h->w->role);
    h->w->progress++;
  }
}

void* zmm_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  begin(h);
  for (;;) {
    if (zmm_hold(h, iterations(h)) != 0) anomaly("%s: a zmm or mask register changed", h->w->role);
    h->w->progress++;
  }
}

// The tiles stay loaded from before the thread counts as started: its
// extended state holds tile data whenever a test looks (remora_probe's
// tilezero needs the configuration loaded, too).
void* amx_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  if (amx_hold(h, 1) != 0) anomaly("%s: the tiles did not load", h->w->role);
  mark_amx_thread();  // remora_probe clobbers the tiles on this thread
  begin(h);
  for (;;) {
    if (amx_hold(h, iterations(h)) != 0) anomaly("%s: a tile register or TILECFG changed", h->w->role);
    h->w->progress++;
  }
}

void* x87_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  begin(h);
  uint16_t cw = kX87Control;
  uint32_t mx = kMxcsr;
  asm volatile("fldcw %0\n\tldmxcsr %1" ::"m"(cw), "m"(mx));
  for (;;) {
    if (x87_hold(kSpinIterations * 10) != 0)
      anomaly("x87: an x87 register, the control word or MXCSR changed");
    h->w->progress++;
  }
}

#endif  // __x86_64__

Holder g_holders[16];

bool features_command(const std::string& cmd, std::string* reply) {
  if (cmd != "features") return false;
  *reply = g_features;
  return true;
}

}  // namespace

int main() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  int n = 0;
  auto add = [&](const char* role, void* (*fn)(void*), Hold hold) {
    Holder* h = &g_holders[n];
    h->w = register_worker(role);
    h->hold = hold;
    fill(&h->pat.bytes[0][0], sizeof h->pat, 0x51dULL + static_cast<uint64_t>(n) * 977);
    h->dump = h->pat;  // the parts of each row a register does not cover compare equal
    fill(&h->tiles.data[0][0][0], sizeof h->tiles.data, 0xa11ULL + static_cast<uint64_t>(n) * 131);
    h->tiles.cfg[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      const uint16_t colsb = 64;
      std::memcpy(&h->tiles.cfg[16 + 2 * t], &colsb, 2);
      h->tiles.cfg[48 + t] = 16;
    }
    ++n;
    start_thread(fn, h);
  };
  add("sse0", sse_thread, kSpin);
  add("sse1", sse_thread, kSpin);
  g_features = "sse";
  if (__builtin_cpu_supports("avx")) {
    add("ymm-spin", ymm_thread, kSpin);
    add("ymm-select", ymm_thread, kSelect);
    add("ymm-sleep", ymm_thread, kSleep);
    g_features += " ymm";
  } else {
    g_features += " skipped:ymm(no AVX)";
  }
  if (__builtin_cpu_supports("avx512f")) {
    add("zmm-spin", zmm_thread, kSpin);
    add("zmm-select", zmm_thread, kSelect);
    add("zmm-sleep", zmm_thread, kSleep);
    g_features += " zmm";
  } else {
    g_features += " skipped:zmm(no AVX-512F)";
  }
  std::string why_no_amx;
  if (amx_usable(&why_no_amx)) {
    add("amx-spin", amx_thread, kSpin);
    add("amx-sleep", amx_thread, kSleep);
    g_features += " amx";
  } else {
    g_features += " skipped:amx(" + why_no_amx + ")";
  }
  add("x87", x87_thread, kSpin);
#endif
  return run_protocol(nullptr, features_command);
}
