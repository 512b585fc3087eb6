// Target "faults": threads that stand where a remote call's frame or its
// end is easy to get wrong.
//  * "fault" faults on purpose in a tight loop, as a JVM's threads do at
//    every armed safepoint poll (a load from HotSpot's PROT_NONE polling
//    page): a read of a PROT_NONE page, its SIGSEGV handled (siglongjmp
//    back into the loop). An interrupt that lands between the fault and its
//    delivery leaves that SIGSEGV pending through the remote call: it is the
//    thread's own and must reach its handler, not be taken for the call's
//    fault. Counts the faults it handled and any that were not its own
//    (wrong address or code).
//  * "guard" sits blocked in read(2) on a stack of its own whose stack
//    pointer is 256 bytes above a PROT_NONE page (a thread at the end of its
//    stack, right above the guard): a frame below that sp cannot be written
//    where the thread could use it. All its signals are blocked (no signal
//    frame of the kernel's would fit either). "wake" sends it one byte; its
//    read must return 1 with its stack pointer unchanged.
// Extra commands:
//   "layout"  reply "layout guard=A guard_end=A sp=A" (addresses in decimal)
//   "wake"    reply "woke" once the guard thread read its byte (deadline 5 s)
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "target_common.h"

using namespace remora_target;

#if defined(__x86_64__)
// long remora_read_on_stack(uint64_t sp, int fd, void* buf): read(fd, buf, 1)
// with the stack pointer at `sp`; returns the read's result, or -9999 when
// the stack pointer was not `sp` any more after it.
extern "C" long remora_read_on_stack(uint64_t sp, int fd, void* buf);
asm(R"(
    .text
    .type remora_read_on_stack, @function
    .p2align 4
remora_read_on_stack:
    pushq %rbx
    pushq %r12
    movq %rsp, %rbx
    movq %rdi, %r12
    movq %rdi, %rsp
    movl %esi, %edi
    movq %rdx, %rsi
    movl $1, %edx
    xorl %eax, %eax
    syscall
    cmpq %rsp, %r12
    je 1f
    movq $-9999, %rax
1:
    movq %rbx, %rsp
    popq %r12
    popq %rbx
    ret
    .size remora_read_on_stack, .-remora_read_on_stack
)");
#elif defined(__aarch64__)
extern "C" long remora_read_on_stack(uint64_t sp, int fd, void* buf);
asm(R"(
    .text
    .type remora_read_on_stack, %function
    .p2align 4
remora_read_on_stack:
    stp x19, x20, [sp, #-16]!
    mov x19, sp
    mov x20, x0
    mov sp, x0
    mov x0, x1
    mov x1, x2
    mov x2, #1
    mov x8, #63
    svc #0
    mov x9, sp
    cmp x9, x20
    b.eq 1f
    mov x0, #-9999
1:
    mov sp, x19
    ldp x19, x20, [sp], #16
    ret
    .size remora_read_on_stack, .-remora_read_on_stack
)");
#endif

namespace {

constexpr size_t kPageSize = 4096;
constexpr uint64_t kAboveGuard = 256;

char* g_fault_page = nullptr;  // PROT_NONE, read by "fault"
sigjmp_buf g_fault_env;
std::atomic<long> g_faults{0}, g_foreign_faults{0};

char* g_guard = nullptr;  // PROT_NONE page, then the guard thread's stack page
uint64_t g_guard_sp = 0;
int g_wake[2] = {-1, -1};
Worker* g_guard_worker = nullptr;

void on_segv(int, siginfo_t* si, void*) {
  if (si->si_addr != g_fault_page || si->si_code != SEGV_ACCERR) {
    g_foreign_faults.fetch_add(1);
    // Not ours: let the default action show it.
    signal(SIGSEGV, SIG_DFL);
    return;
  }
  g_faults.fetch_add(1);
  siglongjmp(g_fault_env, 1);
}

void* fault_loop(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  worker_started(w);
  spin_politely();
  for (;;) {
    // savemask 0 and SA_NODEFER: no system call per fault, SIGSEGV never blocked.
    if (sigsetjmp(g_fault_env, 0) == 0) {
      (void)*static_cast<volatile char*>(g_fault_page);
      anomaly("a read of the PROT_NONE page did not fault");
    }
    w->progress.fetch_add(1);
  }
  return nullptr;
}

void* guard_loop(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  worker_started(w);
  static char byte;
  for (;;) {
    long n = remora_read_on_stack(g_guard_sp, g_wake[0], &byte);
    if (n == -9999) anomaly("guard: the stack pointer changed across read");
    else if (n != 1) anomaly("guard: read returned %ld", n);
    w->progress.fetch_add(1);
  }
  return nullptr;
}

std::string extra_report() {
  return "faults=" + std::to_string(g_faults.load()) + " foreign_faults=" + std::to_string(g_foreign_faults.load());
}

bool extra_command(const std::string& cmd, std::string* reply) {
  char buf[160];
  if (cmd == "layout") {
    std::snprintf(buf, sizeof buf, "layout guard=%" PRIu64 " guard_end=%" PRIu64 " sp=%" PRIu64,
                  reinterpret_cast<uint64_t>(g_guard), reinterpret_cast<uint64_t>(g_guard) + kPageSize,
                  g_guard_sp);
    *reply = buf;
    return true;
  }
  if (cmd == "wake") {
    const uint64_t before = g_guard_worker->progress.load();
    if (!write_all(g_wake[1], "w", 1)) {
      *reply = "stuck (write failed)";
      return true;
    }
    const int64_t deadline = now_ns() + 5'000'000'000;
    while (g_guard_worker->progress.load() == before && now_ns() < deadline) usleep(1000);
    *reply = g_guard_worker->progress.load() != before ? "woke" : "stuck";
    if (*reply == "stuck") anomaly("guard: not woken within 5 s");
    return true;
  }
  return false;
}

}  // namespace

int main() {
  warm_up_malloc();
  void* p = mmap(nullptr, kPageSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* g = mmap(nullptr, 2 * kPageSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || g == MAP_FAILED || pipe(g_wake) != 0) {
    perror("target_faults: setup");
    return 1;
  }
  g_fault_page = static_cast<char*>(p);
  g_guard = static_cast<char*>(g);
  if (mprotect(g_guard, kPageSize, PROT_NONE) != 0) {
    perror("target_faults: mprotect");
    return 1;
  }
  g_guard_sp = reinterpret_cast<uint64_t>(g_guard) + kPageSize + kAboveGuard;
  struct sigaction sa = {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, nullptr);
  start_thread(fault_loop, register_worker("fault"));
  g_guard_worker = register_worker("guard", /*expect_progress=*/false);
  start_thread(guard_loop, g_guard_worker);
  return run_protocol(extra_report, extra_command);
}
