// Target "spin": four threads spinning on arithmetic, never entering the
// kernel on their own. Each loop
//  * recomputes a checksum (an LCG over 20000 steps) and compares it with the
//    value computed at start-up: a corrupted register or flag shows up here;
//  * runs remora_gpr_hold, an assembly loop that keeps known values in
//    general registers and checks them on every iteration, without a
//    function call: an engine that does not restore a register exactly is
//    caught. x86_64: eleven registers and the 128-byte red zone below rsp
//    (an engine that writes into the red zone is caught too). aarch64:
//    x0-x30 (x29 and x30 included: the loop saves them first), in two
//    loops that take turns (x2-x30, then x0-x28), and seven slots of its
//    own frame above sp (AAPCS64 has no red zone; the engine must build its
//    call below sp).
// On aarch64 two more threads hold x0-x30 across a blocking system call
// issued by the same loop (svc with the values live; the kernel keeps every
// register but x0): "hold-sleep" in nanosleep (1 ms; an interrupted one
// restarts through restart_syscall) and "hold-ppoll" in ppoll (1 ms; it
// restarts as an ordinary call, so a remote call restores the thread through
// its signal frame). x8 and the arguments are the call's, reloaded after it.
// And "pac", where the CPU has pointer authentication, checks that the
// thread's keys never change (a pointer signs the same way throughout).
#include <sys/auxv.h>

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
#elif defined(__aarch64__)
// uint64_t remora_gpr_hold(uint64_t iterations, uint64_t mode): mode 0
// spins, 1 calls nanosleep and 2 ppoll between two checks. Returns the
// number of iterations that found a register or a frame slot changed. It
// runs two loops in turn, because a check needs two scratch registers:
// remora_gpr_hold_a holds x2-x30 (x0 and x1 are its scratch),
// remora_gpr_hold_b x0-x28 (x29 and x30 are). Their frame:
//   [sp]      x29, x30      [sp+16..95]  x19-x28 (callee-saved)
//   [sp+96]   bad count     [sp+104]     mode      [sp+112] iterations left
//   [sp+120]  timespec      [sp+136..191] seven pattern slots
// After a system call the registers it takes (x0-x4, x8) are reloaded.
// clang-format off
#define GPR_V(n) "(0x5eed000000001234 + " #n " * 0x0000010101010101)"
#define GPR_LOAD(n) "    ldr x" #n ", =" GPR_V(n) "\n"
#define GPR_CHECK(n) "    ldr " SCR1 ", =" GPR_V(n) "\n    cmp x" #n ", " SCR1 "\n    b.ne 3f\n"
#define SLOT_V(k) "(0xa5a5000000000077 + " #k " * 0x0000001111111111)"
#define SLOT_STORE(k) "    ldr " SCR1 ", =" SLOT_V(k) "\n    str " SCR1 ", [sp, #(136 + 8 * " #k ")]\n"
#define SLOT_CHECK(k)                                                                            \
  "    ldr " SCR0 ", [sp, #(136 + 8 * " #k ")]\n    ldr " SCR1 ", =" SLOT_V(k) "\n    cmp " SCR0 \
  ", " SCR1 "\n    b.ne 3f\n"
#define GPRS_A(M) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) M(16) M(17) \
  M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) M(28) M(29) M(30)
#define GPRS_B(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) \
  M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) M(28)
#define SLOTS(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6)
// One loop: NAME holds the registers HELD lists, with SCR0/SCR1 (defined
// before each use) as scratch; RELOAD: held registers the system calls take
// beyond x2-x4 and x8.
#define GPR_HOLD_ASM(NAME, HELD, RELOAD)  \
  "    .text\n"                           \
  "    .type " NAME ", %function\n"       \
  "    .p2align 4\n"                      \
  NAME ":\n"                              \
  "    .cfi_startproc\n"                  \
  "    stp x29, x30, [sp, #-192]!\n"      \
  "    .cfi_def_cfa_offset 192\n"         \
  "    .cfi_offset x29, -192\n"           \
  "    .cfi_offset x30, -184\n"           \
  "    stp x19, x20, [sp, #16]\n"         \
  "    stp x21, x22, [sp, #32]\n"         \
  "    stp x23, x24, [sp, #48]\n"         \
  "    stp x25, x26, [sp, #64]\n"         \
  "    stp x27, x28, [sp, #80]\n"         \
  "    str xzr, [sp, #96]\n"              \
  "    str x1, [sp, #104]\n"              \
  "    str x0, [sp, #112]\n"              \
  "2:\n" HELD(GPR_LOAD) SLOTS(SLOT_STORE) \
  "1:\n" HELD(GPR_CHECK) SLOTS(SLOT_CHECK) \
  "    ldr " SCR0 ", [sp, #104]\n"        \
  "    cbz " SCR0 ", 5f\n"                \
  "    str xzr, [sp, #120]\n"             \
  "    ldr " SCR1 ", =1000000\n"          \
  "    str " SCR1 ", [sp, #128]\n"        \
  "    cmp " SCR0 ", #2\n"                \
  "    b.eq 6f\n"                         \
  /* nanosleep(&ts, NULL) */              \
  "    add x0, sp, #120\n"                \
  "    mov x1, #0\n"                      \
  "    mov x8, #101\n"                    \
  "    svc #0\n"                          \
  "    b 7f\n"                            \
  /* ppoll(NULL, 0, &ts, NULL, 8) */      \
  "6:  mov x0, #0\n"                      \
  "    mov x1, #0\n"                      \
  "    add x2, sp, #120\n"                \
  "    mov x3, #0\n"                      \
  "    mov x4, #8\n"                      \
  "    mov x8, #73\n"                     \
  "    svc #0\n"                          \
  GPR_LOAD(2) GPR_LOAD(3) GPR_LOAD(4)     \
  "7:\n" GPR_LOAD(8) RELOAD               \
  "5:  ldr " SCR0 ", [sp, #112]\n"        \
  "    subs " SCR0 ", " SCR0 ", #1\n"     \
  "    str " SCR0 ", [sp, #112]\n"        \
  "    b.ne 1b\n"                         \
  "    b 4f\n"                            \
  "3:  ldr " SCR0 ", [sp, #96]\n"         \
  "    add " SCR0 ", " SCR0 ", #1\n"      \
  "    str " SCR0 ", [sp, #96]\n"         \
  "    ldr " SCR0 ", [sp, #112]\n"        \
  "    subs " SCR0 ", " SCR0 ", #1\n"     \
  "    str " SCR0 ", [sp, #112]\n"        \
  "    b.ne 2b\n"                         \
  "4:  ldr x0, [sp, #96]\n"               \
  "    ldp x19, x20, [sp, #16]\n"         \
  "    ldp x21, x22, [sp, #32]\n"         \
  "    ldp x23, x24, [sp, #48]\n"         \
  "    ldp x25, x26, [sp, #64]\n"         \
  "    ldp x27, x28, [sp, #80]\n"         \
  "    ldp x29, x30, [sp], #192\n"        \
  "    .cfi_def_cfa_offset 0\n"           \
  "    ret\n"                             \
  "    .cfi_endproc\n"                    \
  "    .size " NAME ", .-" NAME "\n"      \
  "    .ltorg\n"
// clang-format on
extern "C" uint64_t remora_gpr_hold_a(uint64_t iterations, uint64_t mode);
extern "C" uint64_t remora_gpr_hold_b(uint64_t iterations, uint64_t mode);
#define SCR0 "x0"
#define SCR1 "x1"
asm(GPR_HOLD_ASM("remora_gpr_hold_a", GPRS_A, ""));
#undef SCR0
#undef SCR1
#define SCR0 "x29"
#define SCR1 "x30"
asm(GPR_HOLD_ASM("remora_gpr_hold_b", GPRS_B, GPR_LOAD(0) GPR_LOAD(1)));
#undef SCR0
#undef SCR1
extern "C" uint64_t remora_gpr_hold(uint64_t iterations, uint64_t mode) {
  return remora_gpr_hold_a(iterations, mode) + remora_gpr_hold_b(iterations, mode);
}
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
#if defined(__aarch64__)
    uint64_t bad = remora_gpr_hold(20000, 0);
#else
    uint64_t bad = remora_gpr_hold(20000);
#endif
    if (bad != 0)
      anomaly("spin %d: general register or red zone changed (%llu iterations)", s->index,
              (unsigned long long)bad);
    s->w->progress++;
  }
}

#if defined(__aarch64__)
struct Blocker {
  Worker* w;
  uint64_t mode;  // 1 nanosleep, 2 ppoll
};
Blocker g_blockers[2];

void* hold_blocking(void* arg) {
  Blocker* b = static_cast<Blocker*>(arg);
  worker_started(b->w);
  for (;;) {
    uint64_t bad = remora_gpr_hold(20, b->mode);  // 20 system calls of 1 ms
    if (bad != 0)
      anomaly("%s: general register or frame slot changed across the system call (%llu iterations)",
              b->w->role, (unsigned long long)bad);
    b->w->progress++;
  }
}

// Pointer authentication: Remora never writes a thread's keys, so a pointer
// signed with the same key and modifier keeps the same signature across
// every call. pacia1716 (hint #8: x17 signed with modifier x16 under key IA)
// is a no-op without PAuth; the thread runs only where the CPU has it.
uint64_t pac_sign(uint64_t ptr, uint64_t modifier) {
  register uint64_t x17 asm("x17") = ptr;
  register uint64_t x16 asm("x16") = modifier;
  asm volatile("hint #8" : "+r"(x17) : "r"(x16));
  return x17;
}

void* hold_pac_keys(void* arg) {
  Worker* w = static_cast<Worker*>(arg);
  worker_started(w);
  // A signature's PAC bits may all be zero for one modifier (one in 2^15
  // or so): the instruction is working when any of eight modifiers signs.
  const uint64_t ptr = 0x0000aaaa12345670ull;
  uint64_t modifier = 0x5eed, signed_once = pac_sign(ptr, modifier);
  while (signed_once == ptr && modifier < 0x5eed + 7) signed_once = pac_sign(ptr, ++modifier);
  if (signed_once == ptr)
    anomaly("pac: pacia1716 left the pointer unsigned under eight modifiers although the CPU has PAuth");
  for (;;) {
    for (int i = 0; i < 1000; ++i)
      if (pac_sign(ptr, modifier) != signed_once) anomaly("pac: the thread's IA key changed");
    w->progress++;
  }
}
#endif

}  // namespace

int main() {
  for (int i = 0; i < 4; ++i) g_expected[i] = checksum(g_seeds[i]);
  for (int i = 0; i < 4; ++i) {
    char role[16];
    snprintf(role, sizeof(role), "spin%d", i);
    g_spinners[i] = {register_worker(role), i};
    start_thread(spin, &g_spinners[i]);
  }
#if defined(__aarch64__)
  g_blockers[0] = {register_worker("hold-sleep"), 1};
  g_blockers[1] = {register_worker("hold-ppoll"), 2};
  for (Blocker& b : g_blockers) start_thread(hold_blocking, &b);
  if (getauxval(AT_HWCAP) & HWCAP_PACA)
    start_thread(hold_pac_keys, register_worker("pac"));
  else
    fprintf(stderr, "remora_target_spin: skipped: pac (no PAuth: AT_HWCAP lacks HWCAP_PACA)\n");
#endif
  return run_protocol();
}
