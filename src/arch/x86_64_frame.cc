#include "arch/x86_64_frame.h"

#include <algorithm>
#include <cstring>

namespace remora::arch::x86_64 {

namespace {
constexpr uint64_t align_down(uint64_t v, uint64_t a) { return v & ~(a - 1); }
constexpr uint64_t kNoSyscall = ~uint64_t{0};  // orig_rax -1: no restart logic on resume
}  // namespace

FramePlan plan_frame(uint64_t rsp, size_t fpstate_size, std::span<const size_t> arg_sizes) {
  FramePlan f;
  const uint64_t top = align_down(rsp - kRedZone, 64);
  f.fpstate = align_down(top - fpstate_size, 64);
  f.uc = align_down(f.fpstate - sizeof(UContext), 16);
  f.pretcode = f.uc - 8;
  f.all_mask = f.uc - 16;
  f.result_slot = f.uc - 32;
  uint64_t low = align_down(f.uc - 256, 16);
  for (size_t n : arg_sizes) {
    low -= (n + 15) & ~uint64_t{15};
    f.args.push_back(low);
  }
  f.call_sp = low;
  f.base = arg_sizes.empty() ? f.result_slot : low;
  f.end = f.fpstate + fpstate_size;
  return f;
}

std::vector<std::byte> frame_bytes(const FramePlan& f, const FrameContents& c) {
  std::vector<std::byte> out(f.end - f.base);
  auto put = [&](uint64_t addr, const void* p, size_t n) { std::memcpy(out.data() + (addr - f.base), p, n); };
  for (size_t i = 0; i < c.args.size() && i < f.args.size(); ++i)
    put(f.args[i], c.args[i].data(), c.args[i].size());
  const uint64_t all = ~uint64_t{0};
  put(f.all_mask, &all, 8);
  put(f.pretcode, &c.restorer, 8);
  UContext uc{};
  uc.uc_flags = (c.fp_xstate ? kUcFpXstate : 0) | kUcSigcontextSs | kUcStrictRestoreSs;
  // An invalid ss_flags makes rt_sigreturn's sigaltstack restore fail
  // harmlessly (its error is ignored), leaving the thread's alternate signal
  // stack as it is: it cannot be read through ptrace.
  uc.uc_stack.ss_flags = kSsFlagsInvalid;
  uc.uc_mcontext = sigcontext_from(c.resume, f.fpstate);
  uc.uc_sigmask = c.sigmask;
  put(f.uc, &uc, sizeof uc);
  put(f.fpstate, c.fpstate.data(), std::min<size_t>(c.fpstate.size(), f.end - f.fpstate));
  return out;
}

Regs parked_regs(const Regs& r, const FramePlan& f, const StubSite& s) {
  Regs out = r;
  out.orig_rax = kNoSyscall;
  if (s.stub) {
    // The call stub's own tail: mov $15,%eax; mov %rbx,%rsp; syscall.
    out.rip = *s.stub + Stub::kCallEntry + 6;
    out.rbx = f.uc;
  } else {
    out.rip = s.restore_rt_gadget;
    out.rsp = f.uc;
  }
  return out;
}

SyscallStep syscall_regs(const Regs& r, long nr, const std::array<uint64_t, 6>& a, const FramePlan& f,
                         const StubSite& s) {
  SyscallStep st;
  st.regs = r;
  Regs& o = st.regs;
  o.orig_rax = kNoSyscall;
  o.rax = static_cast<uint64_t>(nr);
  o.rdi = a[0], o.rsi = a[1], o.rdx = a[2], o.r10 = a[3], o.r8 = a[4], o.r9 = a[5];
  if (s.stub) {
    o.rip = *s.stub + Stub::kSyscallEntry;
    o.rsp = f.call_sp;
    o.rbx = f.uc;
    st.insn_end = *s.stub + Stub::kSyscallEnd;
  } else {
    // glibc's syscall() instruction, returning (through its `ret`) into
    // __restore_rt, which rt_sigreturns the frame.
    o.rip = s.syscall_gadget;
    o.rsp = f.pretcode;
    st.insn_end = s.syscall_gadget + kSyscallInsnLen;
  }
  return st;
}

Regs call_regs(const Regs& r, uint64_t fn, const std::array<uint64_t, 6>& a, const FramePlan& f,
               uint64_t stub, int marker, uint64_t cookie) {
  Regs o = r;
  o.orig_rax = kNoSyscall;
  o.rip = stub + (marker != 0 ? Stub::kMarkedCallEntry : Stub::kCallEntry);
  o.r12 = f.result_slot;
  o.r13 = static_cast<uint64_t>(marker);
  o.r14 = cookie;
  o.r11 = fn;
  o.rdi = a[0], o.rsi = a[1], o.rdx = a[2], o.rcx = a[3], o.r8 = a[4], o.r9 = a[5];
  o.rax = 0;  // no vector registers used by a variadic callee
  o.rsp = f.call_sp;
  o.rbx = f.uc;
  return o;
}

uint64_t call_return_end(uint64_t stub, bool marked) {
  return stub + (marked ? Stub::kMarkedCallReturnSyscallEnd : Stub::kCallReturnSyscallEnd);
}

std::optional<long> wrapper_syscall_nr(std::span<const uint8_t, 9> b) {
  uint32_t imm = 0;
  if (b[4] == 0xb8)
    std::memcpy(&imm, &b[5], 4);  // b8 imm32: mov $imm,%eax
  else if (b[2] == 0x48 && b[3] == 0xc7 && b[4] == 0xc0)
    std::memcpy(&imm, &b[5], 4);  // 48 c7 c0 imm32: mov $imm,%rax
  else
    return std::nullopt;
  if (imm > 1024) return std::nullopt;  // not a plausible number
  return static_cast<long>(imm);
}

bool is_generic_syscall_fn(std::span<const uint8_t, 9> b) {
  static constexpr uint8_t kLoadArg6[] = {0x4c, 0x8b, 0x4c, 0x24, 0x08};  // mov 0x8(%rsp),%r9
  return std::memcmp(&b[4], kLoadArg6, sizeof kLoadArg6) == 0;
}

std::optional<long> caller_syscall_nr(std::span<const uint8_t> c) {
  if (c.size() < 6) return std::nullopt;
  for (size_t i = c.size() - 5; i-- > 0;) {
    if (c[i] != 0xbf) continue;  // mov $imm32,%edi
    uint32_t nr = 0;
    std::memcpy(&nr, &c[i + 1], 4);
    if (nr == nr::kFutex || nr == nr::kNanosleep || nr == nr::kClockNanosleep || nr == nr::kPoll)
      return static_cast<long>(nr);
  }
  return std::nullopt;
}

}  // namespace remora::arch::x86_64
