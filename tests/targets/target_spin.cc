// Target "spin": four threads spinning on arithmetic, never entering the
// kernel on their own. Each loop
//  * recomputes a checksum (an LCG over 20000 steps) and compares it with the
//    value computed at start-up: a corrupted register or flag shows up here;
//  * runs remora_gpr_hold, an assembly loop that keeps known values in eleven
//    general registers and in the 128-byte red zone below rsp and checks them
//    on every iteration: an engine that does not restore a register exactly,
//    or that writes into the red zone of the interrupted thread, is caught.
#include <cstdint>
#include <cstdio>

#include "target_common.h"

using namespace remora_target;

#if defined(__x86_64__)
// uint64_t remora_gpr_hold(uint64_t iterations): returns the number of
// iterations that found a general register or a red-zone slot changed.
// Leaf function in plain assembly: it owns its red zone (the compiler would
// not let inline asm use it).
extern "C" uint64_t remora_gpr_hold(uint64_t iterations);
asm(R"(
    .text
    .type remora_gpr_hold, @function
    .p2align 4
remora_gpr_hold:
    pushq %rbx
    pushq %rbp
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    xorl %esi, %esi
2:
    movabsq $0x5eed000000001234, %rbx
    movabsq $0x5eed000101011335, %rbp
    movabsq $0x5eed000202021436, %rcx
    movabsq $0x5eed000303031537, %rdx
    movabsq $0x5eed000404041638, %r8
    movabsq $0x5eed000505051739, %r9
    movabsq $0x5eed00060606183a, %r10
    movabsq $0x5eed00070707193b, %r12
    movabsq $0x5eed000808081a3c, %r13
    movabsq $0x5eed000909091b3d, %r14
    movabsq $0x5eed000a0a0a1c3e, %r15
    movabsq $0xa5a5000000000077, %rax
    movq %rax, -8(%rsp)
    movabsq $0xa5a5000011111188, %rax
    movq %rax, -16(%rsp)
    movabsq $0xa5a5000022222299, %rax
    movq %rax, -24(%rsp)
    movabsq $0xa5a50000333333aa, %rax
    movq %rax, -32(%rsp)
    movabsq $0xa5a50000444444bb, %rax
    movq %rax, -40(%rsp)
    movabsq $0xa5a50000555555cc, %rax
    movq %rax, -48(%rsp)
    movabsq $0xa5a50000666666dd, %rax
    movq %rax, -56(%rsp)
    movabsq $0xa5a50000777777ee, %rax
    movq %rax, -64(%rsp)
    movabsq $0xa5a50000888888ff, %rax
    movq %rax, -72(%rsp)
    movabsq $0xa5a5000099999a10, %rax
    movq %rax, -80(%rsp)
    movabsq $0xa5a50000aaaaab21, %rax
    movq %rax, -88(%rsp)
    movabsq $0xa5a50000bbbbbc32, %rax
    movq %rax, -96(%rsp)
    movabsq $0xa5a50000cccccd43, %rax
    movq %rax, -104(%rsp)
    movabsq $0xa5a50000ddddde54, %rax
    movq %rax, -112(%rsp)
    movabsq $0xa5a50000eeeeef65, %rax
    movq %rax, -120(%rsp)
    movabsq $0xa5a5000100000076, %rax
    movq %rax, -128(%rsp)
1:
    movabsq $0x5eed000000001234, %rax
    cmpq %rax, %rbx
    jne 3f
    movabsq $0x5eed000101011335, %rax
    cmpq %rax, %rbp
    jne 3f
    movabsq $0x5eed000202021436, %rax
    cmpq %rax, %rcx
    jne 3f
    movabsq $0x5eed000303031537, %rax
    cmpq %rax, %rdx
    jne 3f
    movabsq $0x5eed000404041638, %rax
    cmpq %rax, %r8
    jne 3f
    movabsq $0x5eed000505051739, %rax
    cmpq %rax, %r9
    jne 3f
    movabsq $0x5eed00060606183a, %rax
    cmpq %rax, %r10
    jne 3f
    movabsq $0x5eed00070707193b, %rax
    cmpq %rax, %r12
    jne 3f
    movabsq $0x5eed000808081a3c, %rax
    cmpq %rax, %r13
    jne 3f
    movabsq $0x5eed000909091b3d, %rax
    cmpq %rax, %r14
    jne 3f
    movabsq $0x5eed000a0a0a1c3e, %rax
    cmpq %rax, %r15
    jne 3f
    movabsq $0xa5a5000000000077, %rax
    cmpq %rax, -8(%rsp)
    jne 3f
    movabsq $0xa5a5000011111188, %rax
    cmpq %rax, -16(%rsp)
    jne 3f
    movabsq $0xa5a5000022222299, %rax
    cmpq %rax, -24(%rsp)
    jne 3f
    movabsq $0xa5a50000333333aa, %rax
    cmpq %rax, -32(%rsp)
    jne 3f
    movabsq $0xa5a50000444444bb, %rax
    cmpq %rax, -40(%rsp)
    jne 3f
    movabsq $0xa5a50000555555cc, %rax
    cmpq %rax, -48(%rsp)
    jne 3f
    movabsq $0xa5a50000666666dd, %rax
    cmpq %rax, -56(%rsp)
    jne 3f
    movabsq $0xa5a50000777777ee, %rax
    cmpq %rax, -64(%rsp)
    jne 3f
    movabsq $0xa5a50000888888ff, %rax
    cmpq %rax, -72(%rsp)
    jne 3f
    movabsq $0xa5a5000099999a10, %rax
    cmpq %rax, -80(%rsp)
    jne 3f
    movabsq $0xa5a50000aaaaab21, %rax
    cmpq %rax, -88(%rsp)
    jne 3f
    movabsq $0xa5a50000bbbbbc32, %rax
    cmpq %rax, -96(%rsp)
    jne 3f
    movabsq $0xa5a50000cccccd43, %rax
    cmpq %rax, -104(%rsp)
    jne 3f
    movabsq $0xa5a50000ddddde54, %rax
    cmpq %rax, -112(%rsp)
    jne 3f
    movabsq $0xa5a50000eeeeef65, %rax
    cmpq %rax, -120(%rsp)
    jne 3f
    movabsq $0xa5a5000100000076, %rax
    cmpq %rax, -128(%rsp)
    jne 3f
    decq %rdi
    jnz 1b
    jmp 4f
3:  incq %rsi
    decq %rdi
    jnz 2b
4:  movq %rsi, %rax
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbp
    popq %rbx
    ret
    .size remora_gpr_hold, .-remora_gpr_hold
)");
#else
extern "C" uint64_t remora_gpr_hold(uint64_t) { return 0; }
#endif

namespace {

volatile uint64_t g_seeds[4] = {1, 2, 3, 4};
uint64_t g_expected[4];

uint64_t checksum(uint64_t seed) {
  uint64_t x = seed;
  uint64_t sum = 0;
  for (int i = 0; i < 20000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sum ^= (x >> 17) + (sum << 3);
  }
  return sum;
}

struct Spinner {
  Worker* w;
  int index;
};
Spinner g_spinners[4];

void* spin(void* arg) {
  Spinner* s = static_cast<Spinner*>(arg);
  worker_started(s->w);
  spin_politely();
  for (;;) {
    uint64_t got = checksum(g_seeds[s->index]);
    if (got != g_expected[s->index])
      anomaly("spin %d: checksum 0x%llx, expected 0x%llx", s->index, (unsigned long long)got,
              (unsigned long long)g_expected[s->index]);
    uint64_t bad = remora_gpr_hold(20000);
    if (bad != 0)
      anomaly("spin %d: general register or red zone changed (%llu iterations)", s->index,
              (unsigned long long)bad);
    s->w->progress++;
  }
}

}  // namespace

int main() {
  for (int i = 0; i < 4; ++i) g_expected[i] = checksum(g_seeds[i]);
  for (int i = 0; i < 4; ++i) {
    char role[16];
    snprintf(role, sizeof(role), "spin%d", i);
    g_spinners[i] = {register_worker(role), i};
    start_thread(spin, &g_spinners[i]);
  }
  return run_protocol();
}
