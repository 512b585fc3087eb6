#include "arch/x86_64.h"

#include <cerrno>
#include <cstring>

namespace remora::arch::x86_64 {

bool never_restarted(long n) {
  switch (n) {
    case nr::kEpollWait:
    case nr::kEpollPwait:
    case nr::kEpollPwait2:
    case nr::kRtSigtimedwait:
    case nr::kSemop:
    case nr::kSemtimedop:
    case nr::kIoGetevents:
    case nr::kIoPgetevents:
    case nr::kMsgrcv: return true;
    default: return false;
  }
}

bool swaps_signal_mask(long n) {
  switch (n) {
    case nr::kRtSigsuspend:
    case nr::kPpoll:
    case nr::kPselect6:
    case nr::kEpollPwait:
    case nr::kEpollPwait2:
    case nr::kIoPgetevents: return true;
    default: return false;
  }
}

RestartKind classify_restart(const Regs& r, bool signal_pending) {
  auto orig = static_cast<int64_t>(r.orig_rax);
  if (orig < 0) return RestartKind::kNone;  // stopped outside a system call
  auto ret = static_cast<int64_t>(r.rax);
  if (ret == kERestartRestartBlock) return RestartKind::kRestartBlock;
  if (is_restart_code(ret)) return RestartKind::kRestart;
  // epoll_wait and friends return -EINTR after any stop. If no signal is
  // pending, the stop that caused it was ours: re-issue the call.
  if (ret == -EINTR && never_restarted(orig) && !signal_pending) return RestartKind::kReissueOnEintr;
  return RestartKind::kNone;
}

Regs resume_registers(const Regs& r, RestartKind kind, bool use_restart_syscall) {
  Regs out = r;
  out.orig_rax = ~uint64_t{0};  // -1: the kernel must not apply its own restart logic again
  switch (kind) {
    case RestartKind::kNone: break;
    case RestartKind::kRestart:
    case RestartKind::kReissueOnEintr:
      out.rax = r.orig_rax;
      out.rip = r.rip - kSyscallInsnLen;
      break;
    case RestartKind::kRestartBlock:
      out.rax = use_restart_syscall ? static_cast<uint64_t>(nr::kRestartSyscall) : r.orig_rax;
      out.rip = r.rip - kSyscallInsnLen;
      break;
  }
  return out;
}

bool awaits_restart_syscall(const Regs& r) {
  return static_cast<int64_t>(r.orig_rax) < 0 && r.rax == static_cast<uint64_t>(nr::kRestartSyscall);
}

Regs as_stopped_in_restart_syscall(const Regs& r) {
  Regs out = r;
  out.rip = r.rip + kSyscallInsnLen;
  out.orig_rax = static_cast<uint64_t>(nr::kRestartSyscall);
  out.rax = static_cast<uint64_t>(kERestartRestartBlock);
  return out;
}

SigContext sigcontext_from(const Regs& r, uint64_t fpstate_addr) {
  SigContext sc{};
  sc.r8 = r.r8;
  sc.r9 = r.r9;
  sc.r10 = r.r10;
  sc.r11 = r.r11;
  sc.r12 = r.r12;
  sc.r13 = r.r13;
  sc.r14 = r.r14;
  sc.r15 = r.r15;
  sc.rdi = r.rdi;
  sc.rsi = r.rsi;
  sc.rbp = r.rbp;
  sc.rbx = r.rbx;
  sc.rdx = r.rdx;
  sc.rax = r.rax;
  sc.rcx = r.rcx;
  sc.rsp = r.rsp;
  sc.rip = r.rip;
  sc.eflags = r.eflags;
  sc.cs = static_cast<uint16_t>(r.cs);
  sc.ss = static_cast<uint16_t>(r.ss);
  sc.fpstate = fpstate_addr;
  return sc;
}

void prepare_fpstate(std::span<std::byte> out, std::span<const std::byte> xs) {
  // Callers size `out` as xs.size() + 4 (room for magic2).
  std::memcpy(out.data(), xs.data(), xs.size());
  uint64_t xcr0 = 0;
  if (xs.size() >= kFxSwBytesOffset + 8) std::memcpy(&xcr0, xs.data() + kFxSwBytesOffset, 8);
  if (xcr0 == 0 && xs.size() >= 520) std::memcpy(&xcr0, xs.data() + 512, 8);  // header xstate_bv
  struct {
    uint32_t magic1, extended_size;
    uint64_t xfeatures;
    uint32_t xstate_size, padding[7];
  } sw{};
  static_assert(sizeof(sw) == 48);
  sw.magic1 = kFpXstateMagic1;
  sw.extended_size = static_cast<uint32_t>(xs.size() + 4);
  sw.xfeatures = xcr0;
  sw.xstate_size = static_cast<uint32_t>(xs.size());
  if (xs.size() >= kFxSwBytesOffset + sizeof sw) std::memcpy(out.data() + kFxSwBytesOffset, &sw, sizeof sw);
  uint32_t magic2 = kFpXstateMagic2;
  std::memcpy(out.data() + xs.size(), &magic2, 4);
}

std::array<std::byte, Stub::kSize> stub_code() {
  // Encodings (Intel SDM vol. 2): call r/m64 = FF /2; mov r/m64,r64 = 89 /r.
  static constexpr uint8_t kTail[] = {
      0x48, 0x89, 0xc7,              // mov %rax,%rdi   (result survives the syscall entry)
      0xb8, 0x0f, 0x00, 0x00, 0x00,  // mov $15,%eax    (rt_sigreturn)
      0x48, 0x89, 0xdc,              // mov %rbx,%rsp   (rsp = &frame.uc)
      0x0f, 0x05,                    // syscall
      0x0f, 0x0b,                    // ud2             (never reached)
  };
  std::array<std::byte, Stub::kSize> code;
  code.fill(std::byte{0xcc});
  auto put = [&](size_t at, const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) code[at + i] = std::byte{p[i]};
  };
  static constexpr uint8_t kCallR11[] = {0x41, 0xff, 0xd3};  // call *%r11
  static constexpr uint8_t kSyscall[] = {0x0f, 0x05};
  put(Stub::kCallEntry, kCallR11, sizeof kCallR11);
  put(Stub::kCallEntry + 3, kTail, sizeof kTail);
  put(Stub::kSyscallEntry, kSyscall, sizeof kSyscall);
  put(Stub::kSyscallEntry + 2, kTail, sizeof kTail);
  static constexpr uint8_t kTrampoline[] = {
      0x53,                                   // push %rbx         (align the stack)
      0x48, 0x89, 0xfb,                       // mov %rdi,%rbx
      0xb8, 0xba, 0x00, 0x00, 0x00,           // mov $186,%eax     (gettid)
      0x0f, 0x05,                             // syscall
      0x48, 0x89, 0x43, 0x38,                 // mov %rax,0x38(%rbx)
      0xff, 0x53, 0x18,                       // call *0x18(%rbx)  (pthread_self)
      0x48, 0x89, 0xc7,                       // mov %rax,%rdi
      0xff, 0x53, 0x20,                       // call *0x20(%rbx)  (pthread_detach)
      0x48, 0x8b, 0x7b, 0x08,                 // mov 0x8(%rbx),%rdi
      0x48, 0x8b, 0x73, 0x10,                 // mov 0x10(%rbx),%rsi
      0xff, 0x13,                             // call *(%rbx)      (dlopen)
      0x48, 0x89, 0x43, 0x30,                 // mov %rax,0x30(%rbx)
      0xff, 0x53, 0x40,                       // call *0x40(%rbx)  (dlerror)
      0x48, 0x89, 0x43, 0x48,                 // mov %rax,0x48(%rbx)
      0x48, 0xc7, 0x43, 0x28, 0x01, 0, 0, 0,  // movq $1,0x28(%rbx) (done)
      0x31, 0xc0,                             // xor %eax,%eax
      0x5b,                                   // pop %rbx
      0xc3,                                   // ret
  };
  static_assert(sizeof kTrampoline <= Stub::kMarkedCallEntry - Stub::kThreadTrampoline);
  put(Stub::kThreadTrampoline, kTrampoline, sizeof kTrampoline);
  static constexpr uint8_t kMarkedCall[] = {
      0x41, 0xff, 0xd3,              // call *%r11
      0x49, 0x89, 0x04, 0x24,        // mov %rax,(%r12)    (result)
      0x4d, 0x89, 0x74, 0x24, 0x08,  // mov %r14,8(%r12)   (cookie: the function returned)
      0xb8, 0x27, 0x00, 0x00, 0x00,  // mov $39,%eax       (getpid)
      0x0f, 0x05,                    // syscall
      0x49, 0x89, 0xc7,              // mov %rax,%r15
      0xb8, 0xba, 0x00, 0x00, 0x00,  // mov $186,%eax      (gettid)
      0x0f, 0x05,                    // syscall
      0x4c, 0x89, 0xff,              // mov %r15,%rdi
      0x48, 0x89, 0xc6,              // mov %rax,%rsi
      0x4c, 0x89, 0xea,              // mov %r13,%rdx
      0xb8, 0xea, 0x00, 0x00, 0x00,  // mov $234,%eax      (tgkill: the marker, pending while blocked)
      0x0f, 0x05,                    // syscall
      0xb8, 0x0f, 0x00, 0x00, 0x00,  // mov $15,%eax       (rt_sigreturn)
      0x48, 0x89, 0xdc,              // mov %rbx,%rsp
      0x0f, 0x05,                    // syscall
      0x0f, 0x0b,                    // ud2                (never reached)
  };
  static_assert(sizeof kMarkedCall == Stub::kMarkedCallReturnSyscallEnd - Stub::kMarkedCallEntry + 2);
  static_assert(sizeof kMarkedCall <= Stub::kSize - Stub::kMarkedCallEntry);
  put(Stub::kMarkedCallEntry, kMarkedCall, sizeof kMarkedCall);
  static constexpr uint8_t kSetup[] = {
      0x49, 0x89, 0xd0,              // mov %rdx,%r8       (name)
      0x49, 0x89, 0xf2,              // mov %rsi,%r10      (size)
      0x48, 0x89, 0xfa,              // mov %rdi,%rdx      (base)
      0x49, 0x89, 0xf9,              // mov %rdi,%r9
      0x31, 0xf6,                    // xor %esi,%esi      (PR_SET_VMA_ANON_NAME)
      0xbf, 0x41, 0x4d, 0x56, 0x53,  // mov $0x53564d41,%edi (PR_SET_VMA)
      0xb8, 0x9d, 0x00, 0x00, 0x00,  // mov $157,%eax      (prctl)
      0x0f, 0x05,                    // syscall
      0x4c, 0x89, 0xcf,              // mov %r9,%rdi
      0x4c, 0x89, 0xd6,              // mov %r10,%rsi
      0xba, 0x0a, 0x00, 0x00, 0x00,  // mov $10,%edx       (MADV_DONTFORK)
      0xb8, 0x1c, 0x00, 0x00, 0x00,  // mov $28,%eax       (madvise)
      0x0f, 0x05,                    // syscall
      0xc3,                          // ret
  };
  static_assert(sizeof kSetup <= Stub::kSize - Stub::kScratchSetup);
  put(Stub::kScratchSetup, kSetup, sizeof kSetup);
  return code;
}

}  // namespace remora::arch::x86_64
