#include "arch/aarch64_frame.h"

#include <algorithm>
#include <cstring>

namespace remora::arch::aarch64 {

namespace {
constexpr uint64_t align_down(uint64_t v, uint64_t a) { return v & ~(a - 1); }
constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }
// fpsimd_context: head, fpsr, fpcr, vregs[32]. Always the first record.
constexpr size_t kFpsimdRecordSize = 528;
constexpr int32_t kSsFlagsInvalid = 3;  // SS_ONSTACK|SS_DISABLE: rejected by sigaltstack, error ignored

// x7's slot, which the stubs reload (aarch64_stub.h), is where this frame
// keeps it.
static_assert(kFrameMcontext + kScRegsOffset + 7 * 8 == REMORA_AARCH64_FRAME_X7);
static_assert(kFrameMinSize == 4688, "sizeof(struct rt_sigframe) on arm64");

Regs without_btype(Regs r) {
  r.pstate &= ~kPstateBtypeMask;
  r.syscallno = -1;
  return r;
}
}  // namespace

size_t records_footprint(size_t n) {
  if (n + kTerminatorSize <= kScReservedSize) return n + kTerminatorSize;
  return n + kExtraContextSize + 2 * kTerminatorSize;
}

FramePlan plan_frame(uint64_t sp, size_t records_size, std::span<const size_t> arg_sizes) {
  FramePlan f;
  const size_t size =
      align_up(kFrameReserved + std::max(kScReservedSize, records_footprint(records_size)), 16);
  const uint64_t top = align_down(sp, 16);
  f.uc = align_down(top - size, 16);
  f.fpstate = f.uc + kFrameReserved;
  f.all_mask = f.uc - 16;
  f.result_slot = f.uc - 32;
  uint64_t low = align_down(f.uc - 256, 16);
  for (size_t n : arg_sizes) {
    low -= (n + 15) & ~uint64_t{15};
    f.args.push_back(low);
  }
  f.call_sp = low;
  f.base = arg_sizes.empty() ? f.result_slot : low;
  f.end = f.uc + size;
  return f;
}

std::vector<std::byte> frame_bytes(const FramePlan& f, const FrameContents& c) {
  std::vector<std::byte> out(f.end - f.base);
  auto put = [&](uint64_t addr, const void* p, size_t n) { std::memcpy(out.data() + (addr - f.base), p, n); };
  auto put64 = [&](uint64_t addr, uint64_t v) { put(addr, &v, 8); };
  for (size_t i = 0; i < c.args.size() && i < f.args.size(); ++i)
    put(f.args[i], c.args[i].data(), c.args[i].size());
  put64(f.all_mask, ~uint64_t{0});
  // ucontext: no flags, no link; an invalid ss_flags makes rt_sigreturn's
  // sigaltstack restore fail harmlessly, leaving the thread's alternate
  // signal stack as it is (it cannot be read through ptrace).
  const uint64_t uc = f.uc + kSiginfoSize;
  const int32_t ss_flags = kSsFlagsInvalid;
  put(uc + kUcStackOffset + 8, &ss_flags, 4);
  put64(f.uc + kUcSigmaskOffset, c.sigmask);
  const uint64_t mc = f.uc + kFrameMcontext;
  put(mc + kScRegsOffset, c.resume.x, sizeof c.resume.x);
  put64(mc + kScSpOffset, c.resume.sp);
  put64(mc + kScPcOffset, c.resume.pc);
  put64(mc + kScPstateOffset, c.resume.pstate);
  // The records: inline with their terminator, or the fpsimd record, an
  // extra_context, a terminator and the rest right after it (the kernel
  // wants the extra data to start exactly there), then a terminator.
  const size_t n = c.fpstate.size();
  if (n + kTerminatorSize <= kScReservedSize || n <= kFpsimdRecordSize) {
    put(f.fpstate, c.fpstate.data(), std::min<size_t>(n, f.end - f.fpstate));
    return out;
  }
  put(f.fpstate, c.fpstate.data(), kFpsimdRecordSize);
  const uint64_t extra = f.fpstate + kFpsimdRecordSize;
  const uint64_t data = extra + kExtraContextSize + kTerminatorSize;
  const uint32_t head[2] = {kExtraMagic, static_cast<uint32_t>(kExtraContextSize)};
  put(extra, head, sizeof head);
  put64(extra + 8, data);
  const uint32_t extra_size = static_cast<uint32_t>(n - kFpsimdRecordSize + kTerminatorSize);
  put(extra + 16, &extra_size, 4);
  put(data, c.fpstate.data() + kFpsimdRecordSize, n - kFpsimdRecordSize);
  return out;
}

Regs parked_regs(const Regs& r, const FramePlan& f, const StubSite& s) {
  Regs out = without_btype(r);
  if (s.stub) {
    out.pc = *s.stub + Stub::kCallTail;  // ldr x7; mov x8,#139; mov sp,x19; svc #0
    out.x[19] = f.uc;
  } else {
    out.pc = s.restore_rt_gadget;  // the vDSO's mov x8,#139; svc #0
    out.sp = f.uc;
  }
  return out;
}

SyscallStep syscall_regs(const Regs& r, long nr, const std::array<uint64_t, 6>& a, const FramePlan& f,
                         const StubSite& s) {
  SyscallStep st;
  st.regs = without_btype(r);
  Regs& o = st.regs;
  o.x[8] = static_cast<uint64_t>(nr);
  for (size_t i = 0; i < 6; ++i) o.x[i] = a[i];
  if (s.stub) {
    o.pc = *s.stub + Stub::kSyscallEntry;
    o.sp = f.call_sp;
    o.x[19] = f.uc;
    st.insn_end = *s.stub + Stub::kSyscallEnd;
  } else {
    // The `svc` of glibc's syscall(), entered one instruction early (see
    // kSyscallGadgetLead), whose `ret` returns (x30) into the vDSO's
    // rt_sigreturn trampoline with sp at the frame.
    o.pc = s.syscall_gadget - kSyscallGadgetLead;
    o.x[6] = a[5];  // what an older glibc's `mov x5, x6` moves into x5
    o.sp = f.uc;
    o.x[30] = s.restore_rt_gadget;
    st.insn_end = s.syscall_gadget + kSyscallInsnLen;
  }
  return st;
}

Regs call_regs(const Regs& r, uint64_t fn, const std::array<uint64_t, 6>& a, const FramePlan& f,
               uint64_t stub, int marker, uint64_t cookie) {
  Regs o = without_btype(r);
  o.pc = stub + (marker != 0 ? Stub::kMarkedCallEntry : Stub::kCallEntry);
  o.x[16] = fn;
  for (size_t i = 0; i < 6; ++i) o.x[i] = a[i];
  o.x[19] = f.uc;
  o.x[20] = static_cast<uint64_t>(marker);
  o.x[21] = f.result_slot;
  o.x[22] = cookie;
  o.sp = f.call_sp;
  return o;
}

uint64_t call_return_end(uint64_t stub, bool marked) {
  return stub + (marked ? Stub::kMarkedCallReturnSyscallEnd : Stub::kCallReturnSyscallEnd);
}

}  // namespace remora::arch::aarch64
