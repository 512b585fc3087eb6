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
// On aarch64 (the same three ways; "select" is pselect6):
//   v-spin0, v-spin1, v-select, v-sleep   v0-v31 (128 bits), a non-default
//                        FPCR (round toward zero, default NaN) and FPSR flags
//   sve-spin/select/sleep  z0-z31, p0-p15 and FFR at the process's vector
//                        length (checked too), if AT_HWCAP has HWCAP_SVE. A
//                        system call keeps only bits 127:0 of the z registers
//                        (Linux zeroes the rest, the predicates and FFR:
//                        Documentation/arch/arm64/sve.rst; qemu-user keeps
//                        them), so the blocking threads reload before each
//                        call and check what the call left against what a
//                        system call does here, measured at start-up
//   sve-altvl-spin/sleep the same at a second vector length
//                        (PR_SVE_SET_VL in the thread), if the CPU has one
//   sme-spin             streaming mode with ZA on: every ZA row, z0-z31 and
//                        p0-p15 at the streaming vector length, SVCR, if
//                        AT_HWCAP2 has HWCAP2_SME (spinning only: a system
//                        call leaves streaming mode)
// The check stores the registers to memory and compares with general
// registers, so that no vector register is needed as scratch. Instructions
// beyond the base architecture (x86_64: above SSE2; aarch64: SVE) are
// enabled per function (target attribute) and only run after a runtime
// check, so the binary runs on any CPU of its architecture. The command
// "features" answers which register files run and why any is skipped
// ("skipped:<file>(<reason>)"), and on aarch64 the vector lengths
// ("sve-vl=<bytes> sve-altvl=<bytes>") and "sve-syscall=zeroes|keeps".
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
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

// aarch64 SVE registers as `str zN/pN, [base, #N, mul vl]` lays them out:
// z0-z31 at N * VL bytes, p0-p15 and then FFR at N * VL / 8 (VL: the
// thread's vector length in bytes, at most 256).
struct alignas(64) SveRegs {
  uint8_t z[32][256];
  uint8_t p[17][32];
};

struct Holder {
  Worker* w;
  Hold hold;
  int index;  // in g_holders
  Patterns pat;
  Patterns dump;
#if defined(__x86_64__)
  Tiles tiles;
  Tiles tiles_dump;
#elif defined(__aarch64__)
  unsigned want_vl;  // 0: the process's default; else set by prctl(PR_SVE_SET_VL)
  unsigned vl;       // the vector length the thread holds its registers at
  SveRegs sve_pat;   // loaded
  SveRegs sve_dump;  // stored by the checks
  SveRegs sve_post;  // expected right after a system call
#endif
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

#if defined(__aarch64__)

// Between two checks, a blocking system call when the thread holds that way:
// pselect6(0, 0, 0, 0, {0, 1 ms}, 0) or nanosleep({0, 1 ms}). svc keeps
// every FP/SIMD register (and SVE's bits above 128 are the kernel's to
// clear: see sve_block_hold).
// clang-format off
#define A64_BLOCK                                                      \
  "cmp %[mode], #1\n\t"                                                \
  "b.lo 6f\n\t"                                                        \
  "str xzr, [%[ts]]\n\t"                                               \
  "mov %[t0], #0x4240\n\t"                                             \
  "movk %[t0], #0xf, lsl #16\n\t"                                      \
  "str %[t0], [%[ts], #8]\n\t"                                         \
  "b.ne 5f\n\t"                                                        \
  "mov x0, #0\n\tmov x1, #0\n\tmov x2, #0\n\tmov x3, #0\n\t"             \
  "mov x4, %[ts]\n\tmov x5, #0\n\tmov x8, #72\n\tsvc #0\n\tb 6f\n\t"      \
  "5: mov x0, %[ts]\n\tmov x1, #0\n\tmov x8, #101\n\tsvc #0\n\t"           \
  "6:\n\t"
#define A64_BLOCK_CLOBBERS "x0", "x1", "x2", "x3", "x4", "x5", "x8", "cc", "memory"
// Compares `nq` (a register) quadwords at `d` with those at `e`; jumps to
// 2f on a difference.
#define A64_COMPARE(d, e, nq)                      \
  "mov %[i], #0\n\t"                               \
  "4: ldr %[t0], [%[" d "], %[i], lsl #3]\n\t"     \
  "ldr %[t1], [%[" e "], %[i], lsl #3]\n\t"        \
  "cmp %[t0], %[t1]\n\t"                           \
  "b.ne 2f\n\t"                                    \
  "add %[i], %[i], #1\n\t"                         \
  "cmp %[i], %[" nq "]\n\t"                        \
  "b.lo 4b\n\t"
#define A64_END_LOOP        \
  "subs %[n], %[n], #1\n\t" \
  "b.ne 1b\n\t"             \
  "b 3f\n\t"                \
  "2: mov %[bad], #1\n\t"
#define A64_X16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define A64_X32(M) A64_X16(M) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) \
  M(28) M(29) M(30) M(31)
#define V_LOAD(n) "ldr q" #n ", [%[vp], #(" #n " * 16)]\n\t"
#define V_STORE(n) "str q" #n ", [%[vd], #(" #n " * 16)]\n\t"
#define Z_LOAD(n) "ldr z" #n ", [%[zp], #" #n ", mul vl]\n\t"
#define Z_STORE(n) "str z" #n ", [%[zd], #" #n ", mul vl]\n\t"
#define P_LOAD(n) "ldr p" #n ", [%[pp], #" #n ", mul vl]\n\t"
#define P_STORE(n) "str p" #n ", [%[pd], #" #n ", mul vl]\n\t"
// FFR goes through p0: loaded first (wrffr), stored last (rdffr), p0 put
// back from where it was stored.
#define SVE_LOAD "ldr p0, [%[pp], #16, mul vl]\n\twrffr p0.b\n\t" A64_X32(Z_LOAD) A64_X16(P_LOAD)
#define SVE_STORE                                                                                  \
  A64_X32(Z_STORE) A64_X16(P_STORE) "rdffr p0.b\n\tstr p0, [%[pd], #16, mul vl]\n\t"               \
  "ldr p0, [%[pd], #0, mul vl]\n\t"
#define VL_CHECK "rdvl %[t0], #1\n\tcmp %[t0], %[vl]\n\tb.ne 2f\n\t"
#define V_CLOBBERS                                                                                        \
  "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15",   \
      "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", \
      "v30", "v31"
#define P_CLOBBERS \
  "p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11", "p12", "p13", "p14", "p15", "ffr"
// clang-format on

// FPCR: default NaN and round toward zero (the default is 0). FPSR: the
// invalid-operation, inexact, input-denormal and saturation flags (the
// default is 0; remora_probe leaves a different set). Both are read back
// after being written, in case the CPU keeps fewer bits; the loops compare
// with what was read back. The checks themselves run no floating point
// instruction, so no flag is raised meanwhile.
constexpr uint64_t kFpcr = 0x02c00000;
constexpr uint64_t kFpsr = 0x08000091;

// v0-v31 (128 bits each), FPCR and FPSR; restores the thread's own FPCR and
// FPSR on return. 1 if anything changed during the loop, else 0.
uint64_t v_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0, i = 0, t0 = 0, t1 = 0, cr = 0, sr = 0, cr_old = 0, sr_old = 0;
  asm volatile("mrs %[cr_old], fpcr\n\tmrs %[sr_old], fpsr\n\t"
               "msr fpcr, %[cr_want]\n\tmsr fpsr, %[sr_want]\n\t"
               "mrs %[cr], fpcr\n\tmrs %[sr], fpsr\n\t" A64_X32(V_LOAD) "1:\n\t" A64_BLOCK A64_X32(V_STORE)
                   A64_COMPARE("vd", "vp", "nq") "mrs %[t0], fpcr\n\tcmp %[t0], %[cr]\n\tb.ne 2f\n\t"
                   "mrs %[t0], fpsr\n\tcmp %[t0], %[sr]\n\tb.ne 2f\n\t" A64_END_LOOP
               "3: msr fpcr, %[cr_old]\n\tmsr fpsr, %[sr_old]\n\t"
               : [bad] "+r"(bad), [n] "+r"(n), [i] "=&r"(i), [t0] "=&r"(t0), [t1] "=&r"(t1), [cr] "=&r"(cr),
                 [sr] "=&r"(sr), [cr_old] "=&r"(cr_old), [sr_old] "=&r"(sr_old)
               : [vp] "r"(&h->pat.bytes[0][0]), [vd] "r"(&h->dump.bytes[0][0]), [ts] "r"(&h->ts),
                 [mode] "r"(static_cast<uint64_t>(h->hold)), [nq] "r"(uint64_t{32 * 16 / 8}),
                 [cr_want] "r"(kFpcr), [sr_want] "r"(kFpsr)
               : A64_BLOCK_CLOBBERS, V_CLOBBERS);
  return bad;
}

// Quadwords of the predicate area in use at vector length `vl` (17
// predicates of vl / 8 bytes, rounded up; the rest compares equal).
uint64_t p_quads(unsigned vl) { return (17 * vl / 8 + 7) / 8; }

// A spinning thread's z0-z31, p0-p15 and FFR at its vector length (checked
// too), loaded once and checked on every iteration.
__attribute__((target("+sve"))) uint64_t sve_spin_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0, i = 0, t0 = 0, t1 = 0;
  asm volatile(SVE_LOAD "1:\n\t" VL_CHECK SVE_STORE A64_COMPARE("zd", "zp", "nqz")
                   A64_COMPARE("pd", "pp", "nqp") A64_END_LOOP "3:\n\t"
               : [bad] "+r"(bad), [n] "+r"(n), [i] "=&r"(i), [t0] "=&r"(t0), [t1] "=&r"(t1)
               : [zp] "r"(&h->sve_pat.z[0][0]), [pp] "r"(&h->sve_pat.p[0][0]), [zd] "r"(&h->sve_dump.z[0][0]),
                 [pd] "r"(&h->sve_dump.p[0][0]), [vl] "r"(uint64_t{h->vl}),
                 [nqz] "r"(uint64_t{32} * h->vl / 8), [nqp] "r"(p_quads(h->vl))
               : "cc", "memory", V_CLOBBERS, P_CLOBBERS);
  return bad;
}

// A thread that blocks between checks: each iteration loads the pattern,
// checks it, makes the system call with it live and checks what the
// system call's ABI leaves (sve_post): bits 127:0 of every z register kept,
// and the rest as this platform's syscall leaves it (Linux zeroes the bits
// above 128, the predicates and FFR, sve.rst section 6; qemu-user keeps
// them), measured at start-up by sve_syscall_effect.
__attribute__((target("+sve"))) uint64_t sve_block_hold(Holder* h, uint64_t n) {
  uint64_t bad = 0, i = 0, t0 = 0, t1 = 0;
  asm volatile(
      "1:\n\t" SVE_LOAD VL_CHECK SVE_STORE A64_COMPARE("zd", "zp", "nqz") A64_COMPARE("pd", "pp", "nqp")
          A64_BLOCK VL_CHECK SVE_STORE A64_COMPARE("zd", "zq", "nqz") A64_COMPARE("pd", "pq", "nqp")
              A64_END_LOOP "3:\n\t"
      : [bad] "+r"(bad), [n] "+r"(n), [i] "=&r"(i), [t0] "=&r"(t0), [t1] "=&r"(t1)
      : [zp] "r"(&h->sve_pat.z[0][0]), [pp] "r"(&h->sve_pat.p[0][0]), [zd] "r"(&h->sve_dump.z[0][0]),
        [pd] "r"(&h->sve_dump.p[0][0]), [zq] "r"(&h->sve_post.z[0][0]), [pq] "r"(&h->sve_post.p[0][0]),
        [vl] "r"(uint64_t{h->vl}), [nqz] "r"(uint64_t{32} * h->vl / 8), [nqp] "r"(p_quads(h->vl)),
        [ts] "r"(&h->ts), [mode] "r"(static_cast<uint64_t>(h->hold))
      : A64_BLOCK_CLOBBERS, V_CLOBBERS, P_CLOBBERS);
  return bad;
}

// What a system call does to SVE state beyond the V registers here:
// z0 all ones and p0 all true across getpid, then inspected.
enum class SveSyscall { kZeroes, kKeeps, kOther };
SveSyscall g_sve_syscall = SveSyscall::kOther;

__attribute__((target("+sve"))) SveSyscall sve_syscall_effect() {
  alignas(16) uint8_t z[256] = {};
  alignas(16) uint8_t p[32] = {};
  asm volatile(
      "mov z0.b, #-1\n\tptrue p0.b\n\tmov x8, #172\n\tsvc #0\n\t"
      "str z0, [%[z]]\n\tstr p0, [%[p]]\n\t" ::[z] "r"(z),
      [p] "r"(p)
      : "x0", "x8", "v0", "p0", "memory");
  const unsigned vl = sve_vector_length();
  bool zero = true, ones = true;
  for (unsigned k = 0; k < 16; ++k)
    if (z[k] != 0xff) return SveSyscall::kOther;  // the V part must survive
  for (unsigned k = 16; k < vl; ++k) zero = zero && z[k] == 0, ones = ones && z[k] == 0xff;
  for (unsigned k = 0; k < vl / 8; ++k) zero = zero && p[k] == 0, ones = ones && p[k] == 0xff;
  return zero ? SveSyscall::kZeroes : ones ? SveSyscall::kKeeps : SveSyscall::kOther;
}

uint64_t iterations(const Holder* h) { return h->hold == kSpin ? kSpinIterations : kBlockIterations; }

void begin(Holder* h) {
  worker_started(h->w);
  if (h->hold == kSpin) spin_politely();
}

void* v_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  begin(h);
  for (;;) {
    if (v_hold(h, iterations(h)) != 0) anomaly("%s: a v register, FPCR or FPSR changed", h->w->role);
    h->w->progress++;
  }
}

// Sets the thread's vector length if asked, and the patterns for it: FFR
// a first-fault pattern (the first k predicate bits true: wrffr is only
// defined for such values), the post-syscall expectation from
// g_sve_syscall. Returns false (with an anomaly) if the length is not the
// one the main thread saw when it planned the threads.
bool sve_setup(Holder* h) {
  if (h->want_vl != 0) (void)prctl(PR_SVE_SET_VL, h->want_vl);
  const unsigned vl = sve_vector_length();
  if (vl != h->vl) {
    anomaly("%s: vector length %u bytes, expected %u", h->w->role, vl, h->vl);
    return false;
  }
  const unsigned pl = vl / 8;
  uint8_t* ffr = &h->sve_pat.p[0][0] + 16 * pl;
  const unsigned k = 1 + static_cast<unsigned>(h->index) * 5 % (vl - 1);
  for (unsigned b = 0; b < pl; ++b) ffr[b] = 0;
  for (unsigned bit = 0; bit < k; ++bit) ffr[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
  h->sve_dump = h->sve_pat;
  h->sve_post = h->sve_pat;
  if (g_sve_syscall == SveSyscall::kZeroes) {
    uint8_t* z = &h->sve_post.z[0][0];
    for (unsigned r = 0; r < 32; ++r) std::memset(z + r * vl + 16, 0, vl - 16);
    std::memset(&h->sve_post.p[0][0], 0, 17 * pl);
  }
  return true;
}

void* sve_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  const bool ok = sve_setup(h);
  begin(h);
  for (;;) {
    const uint64_t bad = !ok                ? 0
                         : h->hold == kSpin ? sve_spin_hold(h, kSpinIterations)
                                            : sve_block_hold(h, kBlockIterations);
    if (bad != 0) anomaly("%s: a z or p register, FFR or the vector length changed", h->w->role);
    if (!ok) {
      timespec ts{0, 1'000'000};
      nanosleep(&ts, nullptr);
    }
    h->w->progress++;
  }
}

// SME: one spinning thread in streaming mode with ZA on: every ZA row,
// and z0-z31 and p0-p15 at the streaming vector length (SVL; streaming
// mode has no FFR without FA64), checked on every iteration with PSTATE.SM
// and PSTATE.ZA (SVCR) and the SVL. It leaves streaming mode (smstop)
// between loops, to report through libc.
struct alignas(64) SmeState {
  uint8_t za[256 * 256];  // SVL rows of SVL bytes
  SveRegs regs;           // z and p at SVL; the FFR slot stays unused
};
SmeState g_sme_pat, g_sme_dump;
unsigned g_svl = 0;

// clang-format off
#define ZA_ROWS(op, base, label)                        \
  "mov w12, #0\n\tmov %[q], %[" base "]\n\t"              \
  label ": " op " za[w12, 0], [%[q]]\n\t"                \
  "add %[q], %[q], %[svl]\n\tadd w12, w12, #1\n\t"      \
  "cmp x12, %[svl]\n\tb.lo " label "b\n\t"
// clang-format on

uint64_t sme_hold(uint64_t n) {
  uint64_t bad = 0, i = 0, t0 = 0, t1 = 0, q = 0;
  const uint64_t svl = g_svl;
  asm volatile(".arch_extension sme\n\t"
               "smstart\n\t" ZA_ROWS("ldr", "ap", "8") A64_X32(Z_LOAD) A64_X16(P_LOAD) "1:\n\t"
               "mrs %[t0], svcr\n\tcmp %[t0], #3\n\tb.ne 2f\n\t"
               "rdsvl %[t0], #1\n\tcmp %[t0], %[svl]\n\tb.ne 2f\n\t" ZA_ROWS("str", "ad", "9")
                   A64_X32(Z_STORE) A64_X16(P_STORE) A64_COMPARE("ad", "ap", "nqa") A64_COMPARE("zd", "zp", "nqz")
                       A64_COMPARE("pd", "pp", "nqp") A64_END_LOOP "3: smstop\n\t"
               : [bad] "+r"(bad), [n] "+r"(n), [i] "=&r"(i), [t0] "=&r"(t0), [t1] "=&r"(t1), [q] "=&r"(q)
               : [ap] "r"(g_sme_pat.za), [ad] "r"(g_sme_dump.za), [zp] "r"(&g_sme_pat.regs.z[0][0]),
                 [pp] "r"(&g_sme_pat.regs.p[0][0]), [zd] "r"(&g_sme_dump.regs.z[0][0]),
                 [pd] "r"(&g_sme_dump.regs.p[0][0]), [svl] "r"(svl), [nqa] "r"(svl * svl / 8),
                 [nqz] "r"(uint64_t{32} * svl / 8), [nqp] "r"(p_quads(g_svl))
               : "x12", "cc", "memory", V_CLOBBERS, P_CLOBBERS);
  return bad;
}

// rdsvl is an SME instruction that runs outside streaming mode too.
unsigned read_svl() {
  uint64_t svl = 0;
  asm volatile(".arch_extension sme\n\trdsvl %0, #1" : "=r"(svl));
  return static_cast<unsigned>(svl);
}

void* sme_thread(void* arg) {
  Holder* h = static_cast<Holder*>(arg);
  mark_sme_thread();  // remora_probe zeroes ZA on this thread
  begin(h);
  for (;;) {
    if (sme_hold(kSpinIterations) != 0)
      anomaly("%s: a ZA row, a streaming z or p register, SVCR or the SVL changed", h->w->role);
    h->w->progress++;
  }
}

#endif  // __aarch64__

Holder g_holders[16];

bool features_command(const std::string& cmd, std::string* reply) {
  if (cmd != "features") return false;
  *reply = g_features;
  return true;
}

#if defined(__aarch64__)
// The aarch64 threads (see the file comment) and the "features" answer.
void plan_aarch64() {
  int n = 0;
  auto add = [&](const char* role, void* (*fn)(void*), Hold hold, unsigned want_vl, unsigned vl) {
    Holder* h = &g_holders[n];
    h->w = register_worker(role);
    h->hold = hold;
    h->index = n;
    h->want_vl = want_vl;
    h->vl = vl;
    fill(&h->pat.bytes[0][0], sizeof h->pat, 0x51dULL + static_cast<uint64_t>(n) * 977);
    h->dump = h->pat;
    fill(&h->sve_pat.z[0][0], sizeof h->sve_pat, 0x5feULL + static_cast<uint64_t>(n) * 613);
    ++n;
    start_thread(fn, h);
  };
  add("v-spin0", v_thread, kSpin, 0, 0);
  add("v-spin1", v_thread, kSpin, 0, 0);
  add("v-select", v_thread, kSelect, 0, 0);
  add("v-sleep", v_thread, kSleep, 0, 0);
  g_features = "fpsimd";
  std::string why;
  if (!sve_usable(&why)) {
    g_features += " skipped:sve(" + why + ")";
  } else {
    const unsigned vl = sve_vector_length();
    g_sve_syscall = sve_syscall_effect();
    g_features += " sve sve-vl=" + std::to_string(vl);
    add("sve-spin", sve_thread, kSpin, 0, vl);
    if (g_sve_syscall == SveSyscall::kOther) {
      g_features += " skipped:sve-syscall(a system call left z0/p0 neither zeroed nor kept)";
    } else {
      g_features += g_sve_syscall == SveSyscall::kZeroes ? " sve-syscall=zeroes" : " sve-syscall=keeps";
      add("sve-select", sve_thread, kSelect, 0, vl);
      add("sve-sleep", sve_thread, kSleep, 0, vl);
    }
    // A second vector length, in threads of their own (the length is per
    // thread): 16 bytes if the default is longer, else 32. The kernel
    // rounds an unsupported length down; asking from the main thread and
    // putting its own length back tells what a thread would get.
    const unsigned ask = vl > 16 ? 16 : 32;
    const int got = prctl(PR_SVE_SET_VL, ask);
    const unsigned alt = got < 0 ? 0 : static_cast<unsigned>(got) & PR_SVE_VL_LEN_MASK;
    (void)prctl(PR_SVE_SET_VL, vl);
    if (got < 0) {
      g_features += std::string(" skipped:sve-altvl(PR_SVE_SET_VL: ") + strerror(errno) + ")";
    } else if (alt == vl) {
      g_features += " skipped:sve-altvl(the CPU supports only one vector length)";
    } else {
      g_features += " sve-altvl=" + std::to_string(alt);
      add("sve-altvl-spin", sve_thread, kSpin, alt, alt);
      if (g_sve_syscall != SveSyscall::kOther) add("sve-altvl-sleep", sve_thread, kSleep, alt, alt);
    }
  }
  // SME (ZT0, SME2's, is not held: no CPU here has it to test with).
  if (!sme_usable(&why)) {
    g_features += " skipped:sme(" + why + ")";
  } else if (g_svl = read_svl(); g_svl < 16 || g_svl > 256) {
    g_features += " skipped:sme(streaming vector length " + std::to_string(g_svl) + " out of range)";
  } else {
    fill(g_sme_pat.za, sizeof g_sme_pat, 0x5eULL);
    g_sme_dump = g_sme_pat;
    g_features += " sme sme-svl=" + std::to_string(g_svl);
    add("sme-spin", sme_thread, kSpin, 0, 0);
  }
}
#endif

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
#elif defined(__aarch64__)
  plan_aarch64();
#endif
  return run_protocol(nullptr, features_command);
}
