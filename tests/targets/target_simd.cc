// Target "simd": threads that keep known values in vector and x87 registers
// across long assembly loops and check them on every iteration, against a
// copy in memory (the registers are loaded once per loop and never reloaded).
// remora_probe clobbers all these registers (see target_common.cc), so a
// remote call on one of these threads that does not restore its FP/SIMD
// state exactly is caught. Threads:
//   sse0, sse1   xmm1-xmm15
//   avx0         ymm1-ymm15 (full 256 bits), if the CPU has AVX
//   avx512       zmm16-zmm31 and mask registers k1-k7, if it has AVX-512F
//   x87          two 80-bit values on the x87 stack, a non-default x87
//                control word and a non-default MXCSR
// Instructions above SSE2 are enabled per function (target attribute) and
// only run after a runtime check, so the binary runs on any x86_64.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "target_common.h"

using namespace remora_target;

namespace {

constexpr uint64_t kIterations = 200000;

struct alignas(64) Patterns {
  uint8_t bytes[32][64];
};

struct Holder {
  Worker* w;
  Patterns pat;
};

void fill_patterns(Patterns* p, uint64_t seed) {
  uint64_t x = seed;
  for (auto& row : p->bytes)
    for (auto& b : row) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      b = static_cast<uint8_t>(x >> 56);
    }
}

#if defined(__x86_64__)

// clang-format off
#define SSE_LOAD(n) "movdqu " #n "*64(%[p]), %%xmm" #n "\n\t"
#define SSE_CHECK(n)                   \
  "movdqu " #n "*64(%[p]), %%xmm0\n\t" \
  "pcmpeqb %%xmm" #n ", %%xmm0\n\t"    \
  "pmovmskb %%xmm0, %%eax\n\t"         \
  "cmpl $0xffff, %%eax\n\t"            \
  "jne 2f\n\t"
// clang-format on

// Returns 1 when a register changed during the loop, else 0.
uint64_t sse_hold(const Patterns* pat, uint64_t iterations) {
  uint64_t bad = 0;
  asm volatile(
      SSE_LOAD(1) SSE_LOAD(2) SSE_LOAD(3) SSE_LOAD(4) SSE_LOAD(5) SSE_LOAD(6) SSE_LOAD(7) SSE_LOAD(8)
      SSE_LOAD(9) SSE_LOAD(10) SSE_LOAD(11) SSE_LOAD(12) SSE_LOAD(13) SSE_LOAD(14) SSE_LOAD(15)
      "1:\n\t"
      SSE_CHECK(1) SSE_CHECK(2) SSE_CHECK(3) SSE_CHECK(4) SSE_CHECK(5) SSE_CHECK(6) SSE_CHECK(7)
      SSE_CHECK(8) SSE_CHECK(9) SSE_CHECK(10) SSE_CHECK(11) SSE_CHECK(12) SSE_CHECK(13) SSE_CHECK(14)
      SSE_CHECK(15)
      "decq %[n]\n\t"
      "jnz 1b\n\t"
      "jmp 3f\n\t"
      "2: movq $1, %[bad]\n\t"
      "3:\n\t"
      : [bad] "+r"(bad), [n] "+r"(iterations)
      : [p] "r"(pat->bytes)
      : "rax", "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  return bad;
}

// clang-format off
#define AVX_LOAD(n) "vmovdqu " #n "*64(%[p]), %%ymm" #n "\n\t"
#define AVX_CHECK(n)                                \
  "vxorps " #n "*64(%[p]), %%ymm" #n ", %%ymm0\n\t" \
  "vptest %%ymm0, %%ymm0\n\t"                     \
  "jnz 2f\n\t"
// clang-format on

__attribute__((target("avx"))) uint64_t avx_hold(const Patterns* pat, uint64_t iterations) {
  uint64_t bad = 0;
  asm volatile(
      AVX_LOAD(1) AVX_LOAD(2) AVX_LOAD(3) AVX_LOAD(4) AVX_LOAD(5) AVX_LOAD(6) AVX_LOAD(7) AVX_LOAD(8)
      AVX_LOAD(9) AVX_LOAD(10) AVX_LOAD(11) AVX_LOAD(12) AVX_LOAD(13) AVX_LOAD(14) AVX_LOAD(15)
      "1:\n\t"
      AVX_CHECK(1) AVX_CHECK(2) AVX_CHECK(3) AVX_CHECK(4) AVX_CHECK(5) AVX_CHECK(6) AVX_CHECK(7)
      AVX_CHECK(8) AVX_CHECK(9) AVX_CHECK(10) AVX_CHECK(11) AVX_CHECK(12) AVX_CHECK(13) AVX_CHECK(14)
      AVX_CHECK(15)
      "decq %[n]\n\t"
      "jnz 1b\n\t"
      "jmp 3f\n\t"
      "2: movq $1, %[bad]\n\t"
      "3: vzeroupper\n\t"
      : [bad] "+r"(bad), [n] "+r"(iterations)
      : [p] "r"(pat->bytes)
      : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  return bad;
}

// clang-format off
#define Z_LOAD(n) "vmovdqu64 " #n "*64(%[p]), %%zmm" #n "\n\t"
#define Z_CHECK(n)                                  \
  "vpxorq " #n "*64(%[p]), %%zmm" #n ", %%zmm0\n\t" \
  "vptestmq %%zmm0, %%zmm0, %%k0\n\t"               \
  "kortestw %%k0, %%k0\n\t"                         \
  "jnz 2f\n\t"
#define K_LOAD(n) "movl $0x" #n "a5" #n ", %%eax\n\tkmovw %%eax, %%k" #n "\n\t"
#define K_CHECK(n)                    \
  "kmovw %%k" #n ", %%eax\n\t"        \
  "cmpl $0x" #n "a5" #n ", %%eax\n\t" \
  "jne 2f\n\t"
// clang-format on

__attribute__((target("avx512f"))) uint64_t avx512_hold(const Patterns* pat, uint64_t iterations) {
  uint64_t bad = 0;
  asm volatile(
      Z_LOAD(16) Z_LOAD(17) Z_LOAD(18) Z_LOAD(19) Z_LOAD(20) Z_LOAD(21) Z_LOAD(22) Z_LOAD(23)
      Z_LOAD(24) Z_LOAD(25) Z_LOAD(26) Z_LOAD(27) Z_LOAD(28) Z_LOAD(29) Z_LOAD(30) Z_LOAD(31)
      K_LOAD(1) K_LOAD(2) K_LOAD(3) K_LOAD(4) K_LOAD(5) K_LOAD(6) K_LOAD(7)
      "1:\n\t"
      Z_CHECK(16) Z_CHECK(17) Z_CHECK(18) Z_CHECK(19) Z_CHECK(20) Z_CHECK(21) Z_CHECK(22) Z_CHECK(23)
      Z_CHECK(24) Z_CHECK(25) Z_CHECK(26) Z_CHECK(27) Z_CHECK(28) Z_CHECK(29) Z_CHECK(30) Z_CHECK(31)
      K_CHECK(1) K_CHECK(2) K_CHECK(3) K_CHECK(4) K_CHECK(5) K_CHECK(6) K_CHECK(7)
      "decq %[n]\n\t"
      "jnz 1b\n\t"
      "jmp 3f\n\t"
      "2: movq $1, %[bad]\n\t"
      "3: vzeroupper\n\t"
      : [bad] "+r"(bad), [n] "+r"(iterations)
      : [p] "r"(pat->bytes)
      : "rax", "cc", "memory", "xmm0", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
        "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k0", "k1", "k2",
        "k3", "k4", "k5", "k6", "k7");
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

void* sse_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  worker_started(h->w);
  spin_politely();
  for (;;) {
    if (sse_hold(&h->pat, kIterations) != 0) anomaly("%s: an xmm register changed", h->w->role);
    h->w->progress++;
  }
}

void* avx_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  worker_started(h->w);
  spin_politely();
  for (;;) {
    if (avx_hold(&h->pat, kIterations) != 0) anomaly("%s: a ymm register changed", h->w->role);
    h->w->progress++;
  }
}

void* avx512_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  worker_started(h->w);
  spin_politely();
  for (;;) {
    if (avx512_hold(&h->pat, kIterations / 2) != 0) anomaly("%s: a zmm or mask register changed", h->w->role);
    h->w->progress++;
  }
}

void* x87_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  worker_started(h->w);
  spin_politely();
  uint16_t cw = kX87Control;
  uint32_t mx = kMxcsr;
  asm volatile("fldcw %0\n\tldmxcsr %1" ::"m"(cw), "m"(mx));
  for (;;) {
    if (x87_hold(kIterations) != 0) anomaly("x87: an x87 register, the control word or MXCSR changed");
    h->w->progress++;
  }
}

#endif  // __x86_64__

Holder g_holders[5];

}  // namespace

int main() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  int n = 0;
  auto add = [&](const char* role, void* (*fn)(void*)) {
    Holder* h = &g_holders[n];
    h->w = register_worker(role);
    fill_patterns(&h->pat, 0x51dULL + static_cast<uint64_t>(n) * 977);
    ++n;
    start_thread(fn, h);
  };
  add("sse0", sse_thread);
  add("sse1", sse_thread);
  if (__builtin_cpu_supports("avx")) add("avx0", avx_thread);
  if (__builtin_cpu_supports("avx512f")) add("avx512", avx512_thread);
  add("x87", x87_thread);
#endif
  return run_protocol();
}
