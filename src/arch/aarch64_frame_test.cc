// The aarch64 remote-call mechanics from tables, on any host: the restore
// frame (where it goes, its bytes), the FP/SIMD/SVE/SME state it carries,
// the registers of each step, the restart rules as aarch64's kernel reports
// them, and the decoders of glibc's wrapper code.
//
// As x86_64_xstate_test.cc does for x86_64, every frame that plan_frame,
// build_sig_fpstate and frame_bytes build is run through a MODEL of what
// arm64's rt_sigreturn does with it (Linux 6.1, arch/arm64/kernel/signal.c:
// sys_rt_sigreturn, restore_sigframe, parse_user_sigframe,
// restore_fpsimd_context, restore_sve_fpsimd_context, restore_za_context,
// and valid_user_regs in arch/arm64/kernel/ptrace.c), and the state it
// restores must be exactly the state the thread had.
#include "arch/aarch64_frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "arch/aarch64.h"
#include "arch/aarch64_state.h"

namespace a = remora::arch::aarch64;
using remora::arch::kERestartRestartBlock;
using remora::arch::kERestartSys;
using remora::arch::RestartKind;

namespace {

// ---------------------------------------------------------------------------
// Thread state as ptrace reports it
// ---------------------------------------------------------------------------

// The registers of one SVE register file in the order both the ptrace
// payload (SVE_PT_REGS_SVE) and the signal frame (sve_context) use: 32 Z of
// vl bytes, 16 P and FFR of vl/8 bytes each (SVE_SIG_REGS_SIZE).
size_t sve_regs_size(uint16_t vl) { return 32u * vl + 17u * (vl / 8u); }

std::vector<std::byte> pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (auto& b : v) {
    x = x * 1103515245u + 12345u;
    b = std::byte(static_cast<uint8_t>(x >> 16));
  }
  return v;
}

template <typename T>
void put(std::vector<std::byte>& v, size_t at, T x) {
  std::memcpy(v.data() + at, &x, sizeof x);
}
template <typename T>
T get(std::span<const std::byte> v, size_t at) {
  T x{};
  std::memcpy(&x, v.data() + at, sizeof x);
  return x;
}

enum class Mode {
  kFpsimd,     // no live SVE registers (a CPU without SVE, or SVE in FPSIMD form)
  kSve,        // live SVE registers (TIF_SVE)
  kStreaming,  // SME streaming mode: live streaming SVE registers
};

// One thread as a case describes it.
struct Thread {
  std::string name;
  bool has_sve = false, has_sme = false;
  uint16_t sve_vl = 0, sme_vl = 0;
  Mode mode = Mode::kFpsimd;
  bool za = false;
};

// Its registers, patterned, consistent as the kernel keeps them: the V
// registers are the low 128 bits of the live Z registers.
struct FpState {
  std::vector<std::byte> vregs;  // 32 x 16
  uint32_t fpsr = 0, fpcr = 0;
  std::vector<std::byte> live;  // Z, P, FFR of the live (streaming or not) SVE file, at its vl
  uint16_t live_vl = 0;
  std::vector<std::byte> za;  // vl x vl bytes when ZA is on
};

FpState make_state(const Thread& t, uint32_t seed) {
  FpState s;
  s.fpsr = 0x08000010u ^ seed;
  s.fpcr = 0x03c00000u;
  if (t.mode != Mode::kFpsimd) {
    s.live_vl = t.mode == Mode::kStreaming ? t.sme_vl : t.sve_vl;
    s.live = pattern(sve_regs_size(s.live_vl), seed + 1);
    s.vregs.resize(512);
    for (size_t i = 0; i < 32; ++i) std::memcpy(s.vregs.data() + 16 * i, s.live.data() + s.live_vl * i, 16);
  } else {
    s.vregs = pattern(512, seed + 2);
  }
  if (t.za) s.za = pattern(size_t{t.sme_vl} * t.sme_vl, seed + 3);
  return s;
}

// user_fpsimd_state (NT_PRFPREG): vregs, fpsr, fpcr, 8 reserved.
std::vector<std::byte> fp_set(const FpState& s) {
  std::vector<std::byte> v(a::kFpsimdStateSize);
  std::memcpy(v.data(), s.vregs.data(), 512);
  put<uint32_t>(v, 512, s.fpsr);
  put<uint32_t>(v, 516, s.fpcr);
  return v;
}

// NT_ARM_SVE / NT_ARM_SSVE: user_sve_header, then the registers when the
// set is the live one (SVE_PT_REGS_SVE: Z, P, FFR, fpsr and fpcr 16-aligned
// after them), else user_fpsimd_state (SVE_PT_REGS_FPSIMD).
std::vector<std::byte> vec_set(const FpState& s, uint16_t vl, bool live) {
  std::vector<std::byte> v;
  if (live) {
    const size_t status = (a::kVecHeaderSize + sve_regs_size(vl) + 15) & ~size_t{15};
    v.resize(status + 8);
    std::memcpy(v.data() + a::kVecHeaderSize, s.live.data(), s.live.size());
    put<uint32_t>(v, status, s.fpsr);
    put<uint32_t>(v, status + 4, s.fpcr);
  } else {
    v.resize(a::kVecHeaderSize + a::kFpsimdStateSize);
    auto fp = fp_set(s);
    std::memcpy(v.data() + a::kVecHeaderSize, fp.data(), fp.size());
  }
  put<uint32_t>(v, 0, static_cast<uint32_t>(v.size()));
  put<uint32_t>(v, 4, 0x10000);  // max_size
  put<uint16_t>(v, 8, vl);
  put<uint16_t>(v, 10, 256);  // max_vl
  put<uint16_t>(v, 12, live ? a::kSvePtRegsSve : uint16_t{0});
  return v;
}

// NT_ARM_ZA: user_za_header, then vl x vl bytes when ZA is on.
std::vector<std::byte> za_set(const FpState& s, uint16_t vl) {
  std::vector<std::byte> v(a::kVecHeaderSize + s.za.size());
  std::memcpy(v.data() + a::kVecHeaderSize, s.za.data(), s.za.size());
  put<uint32_t>(v, 0, static_cast<uint32_t>(v.size()));
  put<uint32_t>(v, 4, static_cast<uint32_t>(a::kVecHeaderSize + 256 * 256));
  put<uint16_t>(v, 8, vl);
  put<uint16_t>(v, 10, 256);
  return v;
}

// What ptrace::get_xstate packs for the thread: the sets its CPU has.
std::vector<std::byte> packed_state(const Thread& t, const FpState& s) {
  std::vector<std::byte> p;
  a::append_section(p, a::kNtPrfpreg, fp_set(s));
  if (t.has_sve) a::append_section(p, a::kNtArmSve, vec_set(s, t.sve_vl, t.mode == Mode::kSve));
  if (t.has_sme) {
    a::append_section(p, a::kNtArmSsve, vec_set(s, t.sme_vl, t.mode == Mode::kStreaming));
    a::append_section(p, a::kNtArmZa, za_set(s, t.sme_vl));
  }
  const auto tls = pattern(t.has_sme ? 16 : 8, 99);  // TPIDR_EL0 (and TPIDR2_EL0 with SME)
  a::append_section(p, a::kNtArmTls, tls);
  return p;
}

// ---------------------------------------------------------------------------
// A model of arm64's rt_sigreturn (Linux 6.1)
// ---------------------------------------------------------------------------

// The thread as the kernel knows it when it runs rt_sigreturn: its CPU's
// features, its vector lengths, and its mode (the call ran out of streaming
// mode with ZA off: call_entry_state). Where 6.1 and later kernels differ,
// the model takes the stricter: fpsimd_context exactly 528 bytes
// (read_fpsimd_context, later kernels), and the V registers merged into
// the Z registers in streaming mode too.
struct Task {
  bool has_sve = false, has_sme = false;
  uint16_t sve_vl = 0, sme_vl = 0;
};

// Target memory: the bytes frame_bytes wrote, at the frame's base. A read
// outside them is a fault (-EFAULT: a bad frame).
struct Memory {
  uint64_t base = 0;
  std::span<const std::byte> bytes;
  bool read(uint64_t addr, void* out, size_t n) const {
    if (addr < base || addr - base > bytes.size() || n > bytes.size() - (addr - base)) return false;
    std::memcpy(out, bytes.data() + (addr - base), n);
    return true;
  }
  template <typename T>
  bool read(uint64_t addr, T& v) const {
    return read(addr, &v, sizeof v);
  }
};

// The state the thread continues with.
struct Restored {
  a::Regs regs{};
  uint64_t blocked = 0;
  std::vector<std::byte> vregs = std::vector<std::byte>(512);
  uint32_t fpsr = 0, fpcr = 0;
  bool tif_sve = false, sm = false;  // live SVE registers / streaming mode
  std::vector<std::byte> sve;        // Z, P, FFR when tif_sve or sm
  bool za = false;
  std::vector<std::byte> za_bytes;
  bool used_extra_context = false;
  bool altstack_changed = false;
};

struct Sigreturn {
  std::optional<Restored> state;
  std::string bad_frame;  // why the kernel would send SIGSEGV instead
};

constexpr uint32_t kEsrMagic = 0x45535201;
constexpr uint64_t kSigframeMaxSz = 64 * 1024;  // SIGFRAME_MAXSZ in 6.1
// SPSR_EL1_AARCH64_RES0_BITS (arch/arm64/include/asm/ptrace.h, 6.1).
constexpr uint64_t kPstateRes0 =
    0xffffffff00000000ull | (3ull << 26) | (3ull << 22) | (0xffull << 13) | (1ull << 5);
constexpr uint64_t kPstateDaif = 0xfull << 6, kPstateModeMask = 0x1f;  // M[4:0]: EL0t, AArch64
constexpr uint64_t kSigKillStop = (1ull << 8) | (1ull << 18);          // sigdelsetmask in set_current_blocked

class KernelModel {
 public:
  KernelModel(const Memory& m, const Task& t) : mem_(m), task_(t) {}

  Sigreturn rt_sigreturn(uint64_t sp) {
    Sigreturn out;
    if (!run(sp)) {
      out.bad_frame = why_;
      return out;
    }
    out.state = r_;
    return out;
  }

 private:
  bool bad(std::string why) {
    why_ = std::move(why);
    return false;
  }

  bool run(uint64_t sp) {
    if (sp % 16 != 0) return bad("sp is not 16-aligned");
    std::byte probe[a::kFrameMinSize];
    if (!mem_.read(sp, probe, sizeof probe)) return bad("the rt_sigframe is not readable (access_ok)");
    // restore_sigframe
    uint64_t set = 0;
    mem_.read(sp + a::kUcSigmaskOffset, set);
    r_.blocked = set & ~kSigKillStop;
    const uint64_t mc = sp + a::kFrameMcontext;
    mem_.read(mc + a::kScRegsOffset, r_.regs.x, sizeof r_.regs.x);
    mem_.read(mc + a::kScSpOffset, r_.regs.sp);
    mem_.read(mc + a::kScPcOffset, r_.regs.pc);
    mem_.read(mc + a::kScPstateOffset, r_.regs.pstate);
    r_.regs.syscallno = -1;  // forget_syscall
    r_.regs.pstate &= ~kPstateRes0;
    if ((r_.regs.pstate & (kPstateModeMask | kPstateDaif)) != 0) return bad("pstate is not valid EL0t");
    if (!parse(sp)) return false;
    if (fpsimd_ == 0) return bad("no fpsimd_context");
    if (fpsimd_size_ != 528) return bad("fpsimd_context size is not 528");
    if (sve_ != 0 ? !restore_sve() : !restore_fpsimd()) return false;
    if (za_ != 0 && !restore_za()) return false;
    // restore_altstack: anything but -EFAULT is ignored; a valid ss_flags
    // would change the thread's alternate stack.
    int32_t ss_flags = 0;
    mem_.read(sp + a::kSiginfoSize + a::kUcStackOffset + 8, ss_flags);
    const int32_t mode = ss_flags & 0x7fffffff;  // without SS_AUTODISARM
    r_.altstack_changed = mode == 0 || mode == 1 || mode == 2;
    return true;
  }

  // parse_user_sigframe: the records of __reserved, and of extra_context.
  bool parse(uint64_t sp) {
    uint64_t base = sp + a::kFrameReserved;
    uint64_t offset = 0, limit = a::kScReservedSize;
    if (base % 16 != 0) return bad("__reserved is not 16-aligned");
    for (;;) {
      if (limit - offset < 8) return bad("no room for a record header");
      if (offset % 16 != 0) return bad("a record is not 16-aligned");
      const uint64_t head = base + offset;
      uint32_t magic = 0, size = 0;
      if (!mem_.read(head, magic) || !mem_.read(head + 4, size)) return bad("a record header faults");
      if (limit - offset < size) return bad("a record runs past its area");
      switch (magic) {
        case 0:
          if (size != 0) return bad("a terminator with a size");
          return true;
        case a::kFpsimdMagic:
          if (fpsimd_ != 0) return bad("two fpsimd_context records");
          if (size < 528) return bad("fpsimd_context too small");
          fpsimd_ = head, fpsimd_size_ = size;
          break;
        case kEsrMagic: break;
        case a::kSveMagic:
          if (!task_.has_sve && !task_.has_sme) return bad("an sve_context without SVE");
          if (sve_ != 0) return bad("two sve_context records");
          if (size < 16) return bad("sve_context too small");
          sve_ = head, sve_size_ = size;
          break;
        case a::kZaMagic:
          if (!task_.has_sme) return bad("a za_context without SME");
          if (za_ != 0) return bad("two za_context records");
          if (size < 16) return bad("za_context too small");
          za_ = head, za_size_ = size;
          break;
        case a::kExtraMagic: {
          if (r_.used_extra_context) return bad("two extra_context records");
          if (size < a::kExtraContextSize) return bad("extra_context too small");
          uint64_t datap = 0;
          uint32_t extra_size = 0, end_magic = 1, end_size = 1;
          mem_.read(head + 8, datap);
          mem_.read(head + 16, extra_size);
          if (limit - offset - size < a::kTerminatorSize) return bad("no terminator after extra_context");
          const uint64_t end = head + size;
          if (!mem_.read(end, end_magic) || !mem_.read(end + 4, end_size))
            return bad("the terminator faults");
          if (end_magic != 0 || end_size != 0) return bad("extra_context is not followed by a terminator");
          r_.used_extra_context = true;
          const uint64_t userp = end + a::kTerminatorSize;
          if (datap % 16 != 0) return bad("extra_context datap is not 16-aligned");
          if (extra_size % 16 != 0) return bad("extra_context size is not a multiple of 16");
          if (datap != userp) return bad("extra_context datap is not right after the terminator");
          if (extra_size > sp + kSigframeMaxSz - userp) return bad("extra_context runs past SIGFRAME_MAXSZ");
          base = datap, offset = 0, limit = extra_size;
          continue;
        }
        default: return bad("an unknown record magic " + std::to_string(magic));
      }
      if (size < 8) return bad("a record smaller than its header");
      offset += size;
    }
  }

  bool read_fpsimd() {
    mem_.read(fpsimd_ + 8, r_.fpsr);
    mem_.read(fpsimd_ + 12, r_.fpcr);
    if (!mem_.read(fpsimd_ + 16, r_.vregs.data(), 512)) return bad("fpsimd_context faults");
    return true;
  }

  bool restore_fpsimd() {
    r_.tif_sve = false;  // clear_thread_flag(TIF_SVE); the task is out of streaming mode already
    return read_fpsimd();
  }

  // restore_sve_fpsimd_context, then fpsimd_update_current_state, which
  // writes the V registers into the low 128 bits of the Z registers.
  bool restore_sve() {
    uint16_t vl = 0, flags = 0;
    mem_.read(sve_ + 8, vl);
    mem_.read(sve_ + 10, flags);
    const bool sm = (flags & a::kSveSigFlagSm) != 0;
    if (sm && !task_.has_sme) return bad("a streaming sve_context without SME");
    if (vl != (sm ? task_.sme_vl : task_.sve_vl)) return bad("sve_context vl is not the thread's");
    if (sve_size_ <= 16) return restore_fpsimd();
    if (sve_size_ < 16 + sve_regs_size(vl)) return bad("sve_context smaller than SVE_SIG_CONTEXT_SIZE(vq)");
    r_.sve.resize(sve_regs_size(vl));
    if (!mem_.read(sve_ + 16, r_.sve.data(), r_.sve.size())) return bad("sve_context faults");
    (sm ? r_.sm : r_.tif_sve) = true;
    if (!read_fpsimd()) return false;
    for (size_t i = 0; i < 32; ++i) std::memcpy(r_.sve.data() + size_t{vl} * i, r_.vregs.data() + 16 * i, 16);
    return true;
  }

  bool restore_za() {
    uint16_t vl = 0;
    mem_.read(za_ + 8, vl);
    if (vl != task_.sme_vl) return bad("za_context vl is not the thread's");
    if (za_size_ <= 16) {
      r_.za = false;
      return true;
    }
    if (za_size_ < 16 + size_t{vl} * vl) return bad("za_context smaller than ZA_SIG_CONTEXT_SIZE(vq)");
    r_.za_bytes.resize(size_t{vl} * vl);
    if (!mem_.read(za_ + 16, r_.za_bytes.data(), r_.za_bytes.size())) return bad("za_context faults");
    r_.za = true;
    return true;
  }

  Memory mem_;  // a copy: callers pass temporaries
  Task task_;
  Restored r_;
  std::string why_;
  uint64_t fpsimd_ = 0, sve_ = 0, za_ = 0;
  uint32_t fpsimd_size_ = 0, sve_size_ = 0, za_size_ = 0;
};

// ---------------------------------------------------------------------------
// Every built frame restores the thread exactly
// ---------------------------------------------------------------------------

a::Regs patterned_regs(uint64_t sp) {
  a::Regs r{};
  for (size_t i = 0; i < 31; ++i) r.x[i] = 0x1111000000000000ull + 0x10101 * (i + 1);
  r.sp = sp;
  r.pc = 0x0000aaaadead1234ull;
  // Z and C, SSBS, and BTYPE = 01 (none of them RES0: they come back).
  r.pstate = 0x60000000ull | (1ull << 12) | (1ull << 10);
  r.syscallno = -1;
  return r;
}

struct Built {
  a::SigFpstate fp;
  a::FramePlan plan;
  a::FrameContents contents;
  std::vector<std::byte> bytes;
};

Built build(const std::vector<std::byte>& saved, uint64_t sp, const a::Regs& resume, uint64_t sigmask) {
  Built b;
  b.fp = a::build_sig_fpstate(a::host_xstate_layout(), saved);
  b.plan = a::plan_frame(sp, b.fp.image.size(), {});
  b.contents.resume = resume;
  b.contents.sigmask = sigmask;
  b.contents.fpstate = b.fp.image;
  b.bytes = a::frame_bytes(b.plan, b.contents);
  return b;
}

Task task_of(const Thread& t) { return Task{t.has_sve, t.has_sme, t.sve_vl, t.sme_vl}; }

class SigFrame : public ::testing::TestWithParam<Thread> {};

TEST_P(SigFrame, RtSigreturnRestoresTheThreadExactly) {
  const Thread& t = GetParam();
  SCOPED_TRACE(t.name);
  const FpState s = make_state(t, 7);
  const auto saved = packed_state(t, s);
  const uint64_t sp = 0x0000fffff7ff1238ull;
  const a::Regs resume = patterned_regs(0x0000fffff7ff1240ull);
  const Built b = build(saved, sp, resume, 0x1234);

  // Exact (the remote call may rely on it) unless streaming mode or ZA,
  // which ptrace restores; the frame must be sound either way, for a thread
  // whose controller died.
  const bool exact = t.mode != Mode::kStreaming && !t.za;
  EXPECT_EQ(b.fp.exact, exact) << b.fp.why_not;
  EXPECT_EQ(b.fp.why_not.empty(), exact) << b.fp.why_not;
  ASSERT_LE(b.plan.end - b.plan.uc, a::kSigframeMaxSize) << "the frame exceeds SIGFRAME_MAXSZ";

  KernelModel kernel(Memory{b.plan.base, b.bytes}, task_of(t));
  const Sigreturn out = kernel.rt_sigreturn(b.plan.uc);
  ASSERT_TRUE(out.state.has_value()) << "rt_sigreturn would raise SIGSEGV: " << out.bad_frame;
  const Restored& r = *out.state;

  EXPECT_EQ(0, std::memcmp(r.regs.x, resume.x, sizeof resume.x));
  EXPECT_EQ(r.regs.sp, resume.sp);
  EXPECT_EQ(r.regs.pc, resume.pc);
  EXPECT_EQ(r.regs.pstate, resume.pstate);
  EXPECT_EQ(r.blocked, 0x1234u);
  EXPECT_FALSE(r.altstack_changed) << "rt_sigreturn would replace the thread's alternate signal stack";

  EXPECT_EQ(r.vregs, s.vregs) << "V registers";
  EXPECT_EQ(r.fpsr, s.fpsr);
  EXPECT_EQ(r.fpcr, s.fpcr);
  EXPECT_EQ(r.tif_sve, t.mode == Mode::kSve);
  EXPECT_EQ(r.sm, t.mode == Mode::kStreaming) << "the streaming-mode flag";
  if (t.mode != Mode::kFpsimd) {
    EXPECT_TRUE(r.sve == s.live) << "Z/P/FFR at vl " << s.live_vl;
  }
  EXPECT_EQ(r.za, t.za) << "ZA storage";
  if (t.za) {
    EXPECT_TRUE(r.za_bytes == s.za) << "ZA contents";
  }
  EXPECT_EQ(r.used_extra_context, b.fp.image.size() + a::kTerminatorSize > a::kScReservedSize);
}

std::vector<Thread> frame_cases() {
  std::vector<Thread> v = {
      {"FPSIMD only (a CPU without SVE)", false, false, 0, 0, Mode::kFpsimd, false},
  };
  for (uint16_t vl : {16, 32, 64, 256}) {
    v.push_back({"SVE in FPSIMD form, vl " + std::to_string(vl), true, false, vl, 0, Mode::kFpsimd, false});
    v.push_back({"SVE live, vl " + std::to_string(vl), true, false, vl, 0, Mode::kSve, false});
  }
  v.push_back({"SME, streaming, SVL 16", true, true, 32, 16, Mode::kStreaming, false});
  v.push_back({"SME, streaming, SVL 64", true, true, 16, 64, Mode::kStreaming, false});
  v.push_back({"SME, streaming, SVL 256", true, true, 64, 256, Mode::kStreaming, false});
  v.push_back({"SME, ZA on, not streaming, SVL 32", true, true, 32, 32, Mode::kSve, true});
  v.push_back({"SME, ZA on, FPSIMD form, SVL 64", true, true, 16, 64, Mode::kFpsimd, true});
  v.push_back({"SME, streaming and ZA, SVL 16", true, true, 16, 16, Mode::kStreaming, true});
  v.push_back({"SME, streaming and ZA, SVL 64", true, true, 32, 64, Mode::kStreaming, true});
  v.push_back({"SME, streaming and ZA, SVL 128", true, true, 32, 128, Mode::kStreaming, true});
  v.push_back({"SME without ZA or streaming", true, true, 32, 32, Mode::kSve, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Threads, SigFrame, ::testing::ValuesIn(frame_cases()),
                         [](const ::testing::TestParamInfo<Thread>& i) {
                           std::string n;
                           for (char ch : i.param.name)
                             n += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
                           return n;
                         });

// SME's largest streaming vector length (2048 bits) makes ZA 64 KiB: a
// frame carrying it passes SIGFRAME_MAXSZ (64 KiB in 6.1), which the kernel
// refuses, and a thread whose controller died would get SIGSEGV. Such a
// frame goes without ZA: within the limit,
// sound, every other register exact, ZA left off as the call left it.
TEST(SigFrameLimits, ZaAtTheLargestVectorLengthIsLeftOutOfTheFrame) {
  const Thread threads[] = {
      {"SME, streaming and ZA, SVL 256", true, true, 64, 256, Mode::kStreaming, true},
      {"SME, ZA on, SVE live, SVL 256", true, true, 64, 256, Mode::kSve, true},
  };
  for (const Thread& t : threads) {
    SCOPED_TRACE(t.name);
    const FpState s = make_state(t, 11);
    const a::Regs resume = patterned_regs(0x0000fffff7ff0000ull);
    const Built b = build(packed_state(t, s), 0x0000fffff7ff0000ull, resume, 0);
    EXPECT_FALSE(b.fp.exact);
    EXPECT_NE(b.fp.why_not.find("ZA"), std::string::npos) << b.fp.why_not;
    EXPECT_LE(b.plan.end - b.plan.uc, a::kSigframeMaxSize) << "records of " << b.fp.image.size() << " bytes";
    KernelModel kernel(Memory{b.plan.base, b.bytes}, task_of(t));
    const Sigreturn out = kernel.rt_sigreturn(b.plan.uc);
    ASSERT_TRUE(out.state.has_value()) << "rt_sigreturn would raise SIGSEGV: " << out.bad_frame;
    const Restored& r = *out.state;
    EXPECT_EQ(0, std::memcmp(r.regs.x, resume.x, sizeof resume.x));
    EXPECT_EQ(r.regs.pc, resume.pc);
    EXPECT_EQ(r.vregs, s.vregs);
    EXPECT_EQ(r.sm, t.mode == Mode::kStreaming);
    EXPECT_EQ(r.tif_sve, t.mode == Mode::kSve);
    EXPECT_TRUE(r.sve == s.live) << "Z/P/FFR at vl " << s.live_vl;
    EXPECT_FALSE(r.za) << "ZA is restored by ptrace only";
  }
}

// The model refuses what the kernel refuses: each damage to a good frame
// (SVE live at vl 256, so through extra_context) turns it into a bad frame,
// or the cases above prove nothing.
TEST(SigFrameModel, RefusesWhatTheKernelRefuses) {
  const Thread t{"SVE live, vl 256", true, false, 256, 0, Mode::kSve, false};
  const FpState s = make_state(t, 3);
  const uint64_t sp = 0x0000fffff7ff8000ull;
  const Built good = build(packed_state(t, s), sp, patterned_regs(sp), 0);
  const uint64_t uc = good.plan.uc, fp = good.plan.fpstate;
  const uint64_t extra = fp + 528, data = extra + a::kExtraContextSize + a::kTerminatorSize;
  ASSERT_TRUE(KernelModel(Memory{good.plan.base, good.bytes}, task_of(t)).rt_sigreturn(uc).state.has_value());

  struct Damage {
    const char* what;
    uint64_t addr;  // 0: none
    uint64_t value;
    size_t width;
    Task task;
    uint64_t sp;
    size_t unmapped = 0;   // bytes at the frame's top left out of the mapping
    uint64_t zero_at = 0;  // and 16 zero bytes (a terminator) here
  };
  const Task ok = task_of(t);
  Task other_vl = ok;
  other_vl.sve_vl = 128;
  Task no_sve = ok;
  no_sve.has_sve = false;
  const uint64_t mc = uc + a::kFrameMcontext;
  const Damage cases[] = {
      {"sp off by 8", 0, 0, 0, ok, uc + 8},
      {"the frame's last 16 bytes unmapped", 0, 0, 0, ok, uc, 16},
      {"fpsimd_context size 512", fp + 4, 512, 4, ok, uc},
      {"no fpsimd_context (an ESR record in its place)", fp, kEsrMagic, 4, ok, uc},
      {"an unknown magic", fp, 0x12345678, 4, ok, uc},
      {"pstate in EL1h", mc + a::kScPstateOffset, 0x5, 8, ok, uc},
      {"pstate with IRQs masked", mc + a::kScPstateOffset, 0x80, 8, ok, uc},
      {"extra_context datap one record late", extra + 8, data + 16, 8, ok, uc},
      {"extra_context datap misaligned", extra + 8, data + 8, 8, ok, uc},
      {"extra_context size not a multiple of 16", extra + 16, 8752 + 16 + 8, 4, ok, uc},
      {"extra_context larger than SIGFRAME_MAXSZ", extra + 16, 65536, 4, ok, uc},
      {"no terminator after extra_context", extra + 32, a::kFpsimdMagic, 4, ok, uc},
      {"the extra data without its terminator", extra + 16, 8752, 4, ok, uc},
      {"sve_context 16 bytes short of its vl, then a terminator", data + 4, 8752 - 16, 4, ok, uc, 0,
       data + 8752 - 16},
      {"sve_context vl not the thread's", 0, 0, 0, other_vl, uc},
      {"sve_context on a CPU without SVE", 0, 0, 0, no_sve, uc},
  };
  for (const auto& d : cases) {
    auto bytes = good.bytes;
    if (d.addr != 0) std::memcpy(bytes.data() + (d.addr - good.plan.base), &d.value, d.width);
    if (d.zero_at != 0) std::memset(bytes.data() + (d.zero_at - good.plan.base), 0, 16);
    const Memory mem{good.plan.base, std::span<const std::byte>(bytes).first(bytes.size() - d.unmapped)};
    const Sigreturn out = KernelModel(mem, d.task).rt_sigreturn(d.sp);
    EXPECT_FALSE(out.state.has_value()) << d.what << ": the model accepts it";
    if (!out.state) std::printf("  %-50s -> bad frame: %s\n", d.what, out.bad_frame.c_str());
  }
}

// ---------------------------------------------------------------------------
// plan_frame and frame_bytes
// ---------------------------------------------------------------------------

TEST(Aarch64FramePlan, BelowTheStackPointerAlignedAndWithinTheLimit) {
  struct Case {
    uint64_t sp;
    size_t records;
    std::vector<size_t> args;
  };
  const Case cases[] = {
      {0x0000fffff7ff1000, 528, {}},          {0x0000fffff7ff1008, 1104, {}},
      {0x0000fffff7ff0ff8, 9280, {}},         {0x0000fffff7ff1000, 4080, {1, 5001}},
      {0x0000fffff7ff1003, 4081, {16, 17}},   {0x0000fffff7ff1000, 21312, {300}},
      {0x0000fffff7ff100f, 2736, {0, 8, 33}}, {0x0000fffff7ff1000, 64880, {}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("sp " + std::to_string(c.sp) + " records " + std::to_string(c.records));
    const auto f = a::plan_frame(c.sp, c.records, c.args);
    EXPECT_LE(f.end, c.sp & ~uint64_t{15}) << "the frame reaches above the saved sp";
    EXPECT_EQ(f.uc % 16, 0u);
    EXPECT_EQ(f.fpstate, f.uc + a::kFrameReserved);
    EXPECT_EQ(f.fpstate % 16, 0u);
    EXPECT_GE(f.end - f.uc, a::kFrameMinSize);
    EXPECT_GE(f.end - f.fpstate, a::records_footprint(c.records));
    EXPECT_LE(f.end - f.uc, a::kSigframeMaxSize) << "frame and records exceed SIGFRAME_MAXSZ";
    EXPECT_EQ(f.all_mask, f.uc - 16);
    EXPECT_EQ(f.result_slot, f.uc - 32);
    EXPECT_EQ(f.call_sp % a::kStackAlign, 0u);
    ASSERT_EQ(f.args.size(), c.args.size());
    uint64_t above = f.uc - 256;  // 256 bytes of room below the result slot
    for (size_t i = 0; i < c.args.size(); ++i) {
      EXPECT_EQ(f.args[i] % 16, 0u) << "argument " << i;
      EXPECT_LE(f.args[i] + c.args[i], above) << "argument " << i << " overlaps what is above it";
      above = f.args[i];
    }
    EXPECT_LE(f.call_sp, above);
    EXPECT_EQ(f.base, c.args.empty() ? f.result_slot : f.args.back());
    EXPECT_LE(f.base, f.result_slot);
  }
  // The footprint: a terminator inline; a second one and an extra_context
  // once the records leave __reserved.
  EXPECT_EQ(a::records_footprint(528), 544u);
  EXPECT_EQ(a::records_footprint(4080), 4096u);
  EXPECT_EQ(a::records_footprint(4096), 4096u + 64);
}

TEST(Aarch64FrameBytes, HoldTheResumeStateMaskRecordsAndArguments) {
  const std::vector<size_t> sizes = {3, 20};
  const Thread t{"SVE live, vl 32", true, false, 32, 0, Mode::kSve, false};
  const FpState s = make_state(t, 5);
  const auto fp = a::build_sig_fpstate(a::host_xstate_layout(), packed_state(t, s));
  const auto f = a::plan_frame(0x0000fffff7ff2000, fp.image.size(), sizes);
  a::Regs resume = patterned_regs(0x0000fffff7ff2000);
  resume.x[7] = 0x7777777777777777ull;
  const std::byte a0[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  const std::vector<std::byte> a1(20, std::byte{9});
  const std::span<const std::byte> args[] = {a0, a1};
  a::FrameContents c;
  c.resume = resume;
  c.sigmask = 0xfedcba9876543210ull;
  c.fpstate = fp.image;
  c.args = args;
  const auto bytes = a::frame_bytes(f, c);
  ASSERT_EQ(bytes.size(), f.end - f.base);
  const std::span<const std::byte> b(bytes);
  auto at = [&](uint64_t addr) { return static_cast<size_t>(addr - f.base); };
  EXPECT_EQ(get<uint64_t>(b, at(f.all_mask)), ~uint64_t{0});
  EXPECT_EQ(get<uint64_t>(b, at(f.uc + a::kUcSigmaskOffset)), c.sigmask);
  EXPECT_EQ(get<uint64_t>(b, at(f.uc + a::kSiginfoSize)), 0u) << "uc_flags";
  EXPECT_EQ(get<uint64_t>(b, at(f.uc + a::kSiginfoSize + 8)), 0u) << "uc_link";
  EXPECT_EQ(get<int32_t>(b, at(f.uc + a::kSiginfoSize + a::kUcStackOffset + 8)), 3) << "ss_flags";
  const uint64_t mc = f.uc + a::kFrameMcontext;
  for (size_t i = 0; i < 31; ++i) EXPECT_EQ(get<uint64_t>(b, at(mc + a::kScRegsOffset + 8 * i)), resume.x[i]);
  EXPECT_EQ(get<uint64_t>(b, at(mc + a::kScSpOffset)), resume.sp);
  EXPECT_EQ(get<uint64_t>(b, at(mc + a::kScPcOffset)), resume.pc);
  EXPECT_EQ(get<uint64_t>(b, at(mc + a::kScPstateOffset)), resume.pstate);
  // The stubs reload x7 from REMORA_AARCH64_FRAME_X7 of the frame.
  EXPECT_EQ(get<uint64_t>(b, at(f.uc + REMORA_AARCH64_FRAME_X7)), 0x7777777777777777ull);
  EXPECT_EQ(size_t{REMORA_AARCH64_FRAME_X7}, a::kFrameMcontext + a::kScRegsOffset + 7 * 8);
  // The records, inline with their terminator.
  EXPECT_EQ(0, std::memcmp(bytes.data() + at(f.fpstate), fp.image.data(), fp.image.size()));
  EXPECT_EQ(get<uint64_t>(b, at(f.fpstate + fp.image.size())), 0u) << "terminator";
  EXPECT_EQ(get<uint64_t>(b, at(f.fpstate + fp.image.size() + 8)), 0u) << "terminator";
  EXPECT_EQ(0, std::memcmp(bytes.data() + at(f.args[0]), a0, 3));
  EXPECT_EQ(0, std::memcmp(bytes.data() + at(f.args[1]), a1.data(), 20));
}

// The records of each kind of thread, as build_sig_fpstate lays them out.
TEST(Aarch64SigFpstate, Records) {
  const Thread stream_za{"streaming + ZA", true, true, 32, 64, Mode::kStreaming, true};
  const FpState s = make_state(stream_za, 1);
  const auto fp = a::build_sig_fpstate(a::host_xstate_layout(), packed_state(stream_za, s));
  const std::span<const std::byte> img(fp.image);
  ASSERT_GE(img.size(), 528u + 16 + 16);
  EXPECT_EQ(get<uint32_t>(img, 0), a::kFpsimdMagic);
  EXPECT_EQ(get<uint32_t>(img, 4), 528u);
  EXPECT_EQ(get<uint32_t>(img, 528), a::kSveMagic);
  const uint32_t sve_size = get<uint32_t>(img, 532);
  EXPECT_EQ(sve_size, (16 + sve_regs_size(64) + 15) & ~size_t{15});
  EXPECT_EQ(get<uint16_t>(img, 528 + 8), 64u) << "the streaming vl";
  EXPECT_EQ(get<uint16_t>(img, 528 + 10), a::kSveSigFlagSm) << "SVE_SIG_FLAG_SM";
  const size_t za = 528 + sve_size;
  EXPECT_EQ(get<uint32_t>(img, za), a::kZaMagic);
  EXPECT_EQ(get<uint32_t>(img, za + 4), 16u + 64 * 64);
  EXPECT_EQ(get<uint16_t>(img, za + 8), 64u);
  EXPECT_EQ(img.size(), za + 16 + 64 * 64);
  EXPECT_FALSE(fp.exact);

  // No FP set: nothing to build from.
  std::vector<std::byte> none;
  a::append_section(none, a::kNtArmTls, pattern(8, 1));
  const auto missing = a::build_sig_fpstate(a::host_xstate_layout(), none);
  EXPECT_FALSE(missing.exact);
  EXPECT_FALSE(missing.why_not.empty());
  // An SVE set shorter than its vl says.
  const Thread sve{"SVE live, vl 64", true, false, 64, 0, Mode::kSve, false};
  const FpState s2 = make_state(sve, 2);
  std::vector<std::byte> short_set;
  a::append_section(short_set, a::kNtPrfpreg, fp_set(s2));
  auto set = vec_set(s2, 64, true);
  set.resize(200);
  a::append_section(short_set, a::kNtArmSve, set);
  const auto truncated = a::build_sig_fpstate(a::host_xstate_layout(), short_set);
  EXPECT_FALSE(truncated.exact);
  EXPECT_FALSE(truncated.why_not.empty());
}

// ---------------------------------------------------------------------------
// The packed state: restore order, call entry, parsing
// ---------------------------------------------------------------------------

std::vector<uint32_t> notes(const std::vector<a::StateSection>& s) {
  std::vector<uint32_t> out;
  for (const auto& x : s) out.push_back(x.note);
  return out;
}

TEST(Aarch64State, RestoreOrderAndCallEntryState) {
  struct Case {
    Thread t;
    std::vector<uint32_t> order;
    std::vector<uint32_t> entry;  // what call_entry_state writes
  };
  const uint32_t fp = a::kNtPrfpreg, sve = a::kNtArmSve, ssve = a::kNtArmSsve, za = a::kNtArmZa,
                 tls = a::kNtArmTls;
  const Case cases[] = {
      {{"FPSIMD only (no SVE set)", false, false, 0, 0, Mode::kFpsimd, false}, {tls, fp}, {}},
      {{"SVE in FPSIMD form", true, false, 32, 0, Mode::kFpsimd, false}, {tls, sve}, {}},
      {{"SVE live", true, false, 32, 0, Mode::kSve, false}, {tls, sve}, {}},
      {{"SME, neither streaming nor ZA", true, true, 32, 32, Mode::kSve, false}, {tls, sve, za}, {}},
      {{"streaming", true, true, 32, 64, Mode::kStreaming, false}, {tls, ssve, za}, {sve}},
      {{"ZA on", true, true, 32, 64, Mode::kSve, true}, {tls, sve, za}, {za}},
      {{"streaming + ZA", true, true, 16, 32, Mode::kStreaming, true}, {tls, ssve, za}, {sve, za}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.t.name);
    const FpState s = make_state(c.t, 9);
    const auto packed = packed_state(c.t, s);
    const auto order = a::restore_order(packed);
    EXPECT_EQ(notes(order), c.order);
    for (const auto& sec : order) {  // views into the packed buffer
      EXPECT_GE(sec.data.data(), packed.data());
      EXPECT_LE(sec.data.data() + sec.data.size(), packed.data() + packed.size());
    }
    const auto parsed = a::parse_state(packed);
    EXPECT_EQ(a::streaming_mode(parsed), c.t.mode == Mode::kStreaming);
    EXPECT_EQ(a::za_on(parsed), c.t.za);

    const auto entry_bytes = a::call_entry_state(packed);
    const auto entry = a::parse_state(entry_bytes);
    EXPECT_EQ(notes(entry), c.entry);
    if (const auto* e = a::find_section(entry, sve)) {
      // The SVE set in FPSIMD form at the thread's SVE vl: writing it
      // leaves streaming mode with the V registers, fpsr and fpcr intact.
      ASSERT_EQ(e->data.size(), a::kVecHeaderSize + a::kFpsimdStateSize);
      EXPECT_EQ(a::vec_set_size(e->data), e->data.size());
      EXPECT_EQ(a::vec_vl(e->data), c.t.sve_vl);
      EXPECT_EQ(a::vec_flags(e->data) & a::kSvePtRegsSve, 0);
      const auto want = fp_set(s);
      EXPECT_EQ(0, std::memcmp(e->data.data() + a::kVecHeaderSize, want.data(), want.size()));
    }
    if (const auto* e = a::find_section(entry, za)) {
      // A header alone, at the thread's SME vl: ZA off.
      ASSERT_EQ(e->data.size(), a::kVecHeaderSize);
      EXPECT_EQ(a::vec_set_size(e->data), a::kVecHeaderSize);
      EXPECT_EQ(a::vec_vl(e->data), c.t.sme_vl);
    }
  }
  // Without a thread pointer set there is none to write first.
  std::vector<std::byte> bare;
  a::append_section(bare, a::kNtPrfpreg, pattern(528, 1));
  EXPECT_EQ(notes(a::restore_order(bare)), std::vector<uint32_t>{fp});
}

// ZT0 (SME2): written back after ZA and only while ZA was on (writing it
// turns ZA on), and carried in the frame after the ZA record.
TEST(Aarch64State, Zt0FollowsZa) {
  const uint16_t vl = 32;
  auto za_set = [&](bool on) {
    std::vector<std::byte> set(on ? a::kVecHeaderSize + size_t{vl} * vl : a::kVecHeaderSize);
    const uint32_t size = static_cast<uint32_t>(set.size());
    std::memcpy(set.data(), &size, 4);
    std::memcpy(set.data() + 8, &vl, 2);
    for (size_t i = a::kVecHeaderSize; i < set.size(); ++i) set[i] = std::byte(i * 7);
    return set;
  };
  std::vector<std::byte> zt(a::kZtSize);
  for (size_t i = 0; i < zt.size(); ++i) zt[i] = std::byte(0xa0 + i);
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "ZA on" : "ZA off");
    std::vector<std::byte> packed;
    a::append_section(packed, a::kNtPrfpreg, pattern(528, 3));
    a::append_section(packed, a::kNtArmZa, za_set(on));
    a::append_section(packed, a::kNtArmZt, zt);
    const auto order = notes(a::restore_order(packed));
    if (on)
      EXPECT_EQ(order, (std::vector<uint32_t>{a::kNtPrfpreg, a::kNtArmZa, a::kNtArmZt}));
    else
      EXPECT_EQ(order, (std::vector<uint32_t>{a::kNtPrfpreg, a::kNtArmZa}));
    const auto f = a::build_sig_fpstate(a::host_xstate_layout(), packed);
    EXPECT_EQ(f.exact, !on);
    if (!on) {
      EXPECT_EQ(f.image.size(), 528u) << "no ZA, no ZT0 record";
      continue;
    }
    const size_t za_rec = (16 + size_t{vl} * vl + 15) & ~size_t{15};
    ASSERT_EQ(f.image.size(), 528 + za_rec + 16 + a::kZtSize);
    uint32_t head[2];
    std::memcpy(head, f.image.data() + 528 + za_rec, 8);
    EXPECT_EQ(head[0], a::kZtMagic);
    EXPECT_EQ(head[1], 16 + a::kZtSize);
    uint16_t nregs = 0;
    std::memcpy(&nregs, f.image.data() + 528 + za_rec + 8, 2);
    EXPECT_EQ(nregs, 1);
    EXPECT_EQ(0, std::memcmp(f.image.data() + 528 + za_rec + 16, zt.data(), zt.size()));
  }
}

TEST(Aarch64State, ParseAndAppendRoundTrip) {
  std::vector<std::byte> packed;
  const size_t sizes[] = {0, 1, 7, 8, 9, 528, 4113};
  for (size_t i = 0; i < std::size(sizes); ++i)
    a::append_section(packed, 0x100 + static_cast<uint32_t>(i), pattern(sizes[i], static_cast<uint32_t>(i)));
  EXPECT_EQ(packed.size() % 8, 0u);
  const auto s = a::parse_state(packed);
  ASSERT_EQ(s.size(), std::size(sizes));
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].note, 0x100 + i);
    ASSERT_EQ(s[i].data.size(), sizes[i]);
    const auto want = pattern(sizes[i], static_cast<uint32_t>(i));
    EXPECT_TRUE(std::equal(s[i].data.begin(), s[i].data.end(), want.begin())) << "section " << i;
  }
  EXPECT_EQ(a::find_section(s, 0x105)->data.size(), 528u);
  EXPECT_EQ(a::find_section(s, 0x999), nullptr);
}

TEST(Aarch64State, MalformedInputYieldsTheSectionsBeforeTheDamage) {
  std::vector<std::byte> packed;
  a::append_section(packed, 1, pattern(16, 1));
  a::append_section(packed, 2, pattern(24, 2));
  const size_t two = packed.size();
  a::append_section(packed, 3, pattern(40, 3));
  const std::span<const std::byte> all(packed);
  EXPECT_EQ(a::parse_state({}).size(), 0u);
  EXPECT_EQ(a::parse_state(all.first(4)).size(), 0u) << "half a header";
  EXPECT_EQ(a::parse_state(all.first(two + 4)).size(), 2u) << "a truncated header";
  EXPECT_EQ(a::parse_state(all.first(two + 8 + 39)).size(), 2u) << "a truncated section";
  EXPECT_EQ(a::parse_state(all.first(two + 8 + 40)).size(), 3u) << "the last section needs no padding";
  auto huge = packed;
  put<uint32_t>(huge, two + 4, 0xffffffffu);
  EXPECT_EQ(a::parse_state(huge).size(), 2u) << "a size past the end";
  // Vector set headers shorter than a header read as empty.
  EXPECT_EQ(a::vec_set_size(all.first(15)), 0u);
  EXPECT_EQ(a::vec_vl(all.first(4)), 0u);
  EXPECT_EQ(a::vec_flags(all.first(4)), 0u);
  // Sets of a header alone: neither streaming nor ZA.
  std::vector<std::byte> headers;
  std::vector<std::byte> h(a::kVecHeaderSize);
  put<uint32_t>(h, 0, 16);
  put<uint16_t>(h, 12, a::kSvePtRegsSve);
  a::append_section(headers, a::kNtArmSsve, h);
  a::append_section(headers, a::kNtArmZa, h);
  const auto hs = a::parse_state(headers);
  EXPECT_FALSE(a::streaming_mode(hs));
  EXPECT_FALSE(a::za_on(hs));
  EXPECT_TRUE(a::call_entry_state(headers).empty());
}

// ---------------------------------------------------------------------------
// The registers of each step
// ---------------------------------------------------------------------------

a::Regs saved_at_stop() {
  a::Regs r = patterned_regs(0x0000fffff7ff1008);
  r.pstate = 0x80000000ull | (3ull << 10);  // N, BTYPE = 11
  r.syscallno = 22;
  r.orig_x0 = 5;
  return r;
}

// Every register but those listed is as saved; BTYPE is cleared and the
// thread is in no system call.
void expect_rest_as_saved(const a::Regs& o, const a::Regs& r, std::initializer_list<unsigned> changed) {
  for (unsigned i = 0; i < 31; ++i)
    if (std::find(changed.begin(), changed.end(), i) == changed.end()) {
      EXPECT_EQ(o.x[i], r.x[i]) << "x" << i;
    }
  EXPECT_EQ(o.pstate, r.pstate & ~a::kPstateBtypeMask);
  EXPECT_EQ(o.syscallno, -1);
}

TEST(Aarch64Steps, CallRegs) {
  const a::Regs r = saved_at_stop();
  const auto f = a::plan_frame(r.sp, 528, std::vector<size_t>{40});
  const uint64_t stub = 0x7f0000000000ull, fn = 0x7f1234567890ull, cookie = 0x524d000000000042ull;
  const std::array<uint64_t, 6> args = {10, 11, 12, 13, 14, 15};
  for (int marker : {0, 34}) {
    SCOPED_TRACE(marker != 0 ? "marked" : "unmarked");
    const a::Regs o = a::call_regs(r, fn, args, f, stub, marker, cookie);
    EXPECT_EQ(o.pc, stub + (marker != 0 ? a::Stub::kMarkedCallEntry : a::Stub::kCallEntry));
    EXPECT_EQ(o.x[16], fn);
    for (size_t i = 0; i < 6; ++i) EXPECT_EQ(o.x[i], args[i]) << "x" << i;
    EXPECT_EQ(o.x[19], f.uc);
    EXPECT_EQ(o.x[20], static_cast<uint64_t>(marker));
    EXPECT_EQ(o.x[21], f.result_slot);
    EXPECT_EQ(o.x[22], cookie);
    EXPECT_EQ(o.sp, f.call_sp);
    expect_rest_as_saved(o, r, {0, 1, 2, 3, 4, 5, 16, 19, 20, 21, 22});
  }
  EXPECT_EQ(a::call_return_end(stub, false), stub + 20);
  EXPECT_EQ(a::call_return_end(stub, true), stub + 260);
}

TEST(Aarch64Steps, SyscallRegs) {
  const a::Regs r = saved_at_stop();
  const auto f = a::plan_frame(r.sp, 1104, {});
  const std::array<uint64_t, 6> args = {20, 21, 22, 23, 24, 25};
  a::StubSite with_stub{0x7f0000000000ull, 0, 0};
  const auto st = a::syscall_regs(r, a::nr::kMmap, args, f, with_stub);
  EXPECT_EQ(st.regs.pc, *with_stub.stub + a::Stub::kSyscallEntry);
  EXPECT_EQ(st.insn_end, *with_stub.stub + a::Stub::kSyscallEnd);
  EXPECT_EQ(st.regs.sp, f.call_sp);
  EXPECT_EQ(st.regs.x[19], f.uc);
  EXPECT_EQ(st.regs.x[8], static_cast<uint64_t>(a::nr::kMmap));
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(st.regs.x[i], args[i]);
  expect_rest_as_saved(st.regs, r, {0, 1, 2, 3, 4, 5, 8, 19});

  // Before the scratch exists: the `svc` of libc's syscall(), entered one
  // instruction early (never on the `svc` a thread may have stopped on),
  // whose `ret` goes (x30) to the vDSO's rt_sigreturn trampoline with sp at
  // the frame.
  a::StubSite libc{std::nullopt, 0xffffa0e3c24ull, 0xffffb7ff07a0ull};
  const auto g = a::syscall_regs(r, a::nr::kMmap, args, f, libc);
  EXPECT_EQ(g.regs.pc, libc.syscall_gadget - a::kSyscallGadgetLead);
  EXPECT_EQ(g.regs.x[6], args[5]) << "what an older glibc's mov x5, x6 moves";
  EXPECT_TRUE(a::syscall_gadget_lead_ok(0xaa0703e6u)) << "mov x6, x7 (glibc 2.36)";
  EXPECT_TRUE(a::syscall_gadget_lead_ok(0xaa0603e5u)) << "mov x5, x6";
  EXPECT_FALSE(a::syscall_gadget_lead_ok(0xd2801168u)) << "mov x8, #139";
  EXPECT_EQ(g.insn_end, libc.syscall_gadget + a::kSyscallInsnLen);
  EXPECT_EQ(g.regs.sp, f.uc);
  EXPECT_EQ(g.regs.x[30], libc.restore_rt_gadget);
  EXPECT_EQ(g.regs.x[8], static_cast<uint64_t>(a::nr::kMmap));
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(g.regs.x[i], args[i]);
  expect_rest_as_saved(g.regs, r, {0, 1, 2, 3, 4, 5, 6, 8, 30});
}

TEST(Aarch64Steps, ParkedRegs) {
  const a::Regs r = saved_at_stop();
  const auto f = a::plan_frame(r.sp, 528, {});
  // With the stub: its tail (ldr x7; mov x8, #139; mov sp, x19; svc).
  a::StubSite with_stub{0x7f0000000000ull, 0, 0};
  const a::Regs p = a::parked_regs(r, f, with_stub);
  EXPECT_EQ(p.pc, *with_stub.stub + a::Stub::kCallTail);
  EXPECT_EQ(p.x[19], f.uc);
  EXPECT_EQ(p.sp, r.sp);
  expect_rest_as_saved(p, r, {19});
  // Without: the vDSO's `mov x8, #139; svc #0` with sp at the frame.
  a::StubSite vdso{std::nullopt, 0xffffa0e3c24ull, 0xffffb7ff07a0ull};
  const a::Regs q = a::parked_regs(r, f, vdso);
  EXPECT_EQ(q.pc, vdso.restore_rt_gadget);
  EXPECT_EQ(q.sp, f.uc);
  expect_rest_as_saved(q, r, {});
}

// ---------------------------------------------------------------------------
// Restart, as aarch64's kernel reports a stop
// ---------------------------------------------------------------------------

// A thread stopped in a restartable call: the kernel has rewound it onto
// its `svc`, x0 the first argument again, and forgotten the call.
a::Regs rewound(long nr) {
  a::Regs r = patterned_regs(0x0000fffff7ff1000);
  r.pc = 0x0000ffffa0b3b20ull;
  r.x[8] = static_cast<uint64_t>(nr);
  r.x[0] = 0x0000fffff7ff2000ull;  // the first argument
  r.syscallno = -1;
  return r;
}

void expect_same_ptrace_regs(const a::Regs& got, const a::Regs& want) {
  EXPECT_EQ(0, std::memcmp(got.x, want.x, sizeof want.x));
  EXPECT_EQ(got.sp, want.sp);
  EXPECT_EQ(got.pc, want.pc);
  EXPECT_EQ(got.pstate, want.pstate);
  EXPECT_EQ(got.syscallno, want.syscallno);
}

// The rewind has put the first argument back into x0, so the restart code
// the kernel saw is not visible in the registers: without /proc's word
// (EntryArgsTellARestartBlockCall), every such call, futex and
// clock_nanosleep included, is re-issued as it stood.
TEST(Aarch64Restart, AStopAfterTheRewindResumesOnTheSameRegisters) {
  for (long nr : {a::nr::kRead, a::nr::kPpoll, a::nr::kFutex, a::nr::kClockNanosleep}) {
    SCOPED_TRACE(nr);
    const a::Regs r = rewound(nr);
    ASSERT_TRUE(a::awaits_restart_syscall(r));
    const a::Regs in = a::as_stopped_in_restart_syscall(r);
    EXPECT_EQ(in.pc, r.pc + 4);
    EXPECT_EQ(in.syscallno, nr);
    EXPECT_EQ(in.orig_x0, r.x[0]);
    EXPECT_EQ(static_cast<int64_t>(in.x[0]), kERestartSys);
    EXPECT_EQ(a::classify_restart(in, false), RestartKind::kRestart);
    EXPECT_EQ(a::classify_restart(in, true), RestartKind::kRestart);
    // ptrace writes x0-x30, sp, pc, pstate and the call number; those are
    // exactly the registers the thread stopped with.
    expect_same_ptrace_regs(a::resume_registers(in, RestartKind::kRestart, true), r);
    expect_same_ptrace_regs(a::resume_registers(in, RestartKind::kRestart, false), r);
  }
  a::Regs inside = rewound(a::nr::kRead);
  inside.syscallno = a::nr::kRead;
  EXPECT_FALSE(a::awaits_restart_syscall(inside)) << "a thread still inside its call";
}

TEST(Aarch64Restart, InsideRestartSyscall) {
  const a::Regs r = rewound(a::nr::kRestartSyscall);
  const a::Regs in = a::as_stopped_in_restart_syscall(r);
  EXPECT_EQ(static_cast<int64_t>(in.x[0]), kERestartRestartBlock);
  EXPECT_EQ(in.syscallno, a::nr::kRestartSyscall);
  EXPECT_EQ(a::classify_restart(in, false), RestartKind::kRestartBlock);
  // ptrace's restore keeps restart_syscall (the remaining timeout)...
  const a::Regs keep = a::resume_registers(in, RestartKind::kRestartBlock, true);
  expect_same_ptrace_regs(keep, r);
  // ...and so does the frame when the original call is not known.
  const a::Regs frame = a::resume_registers(in, RestartKind::kRestartBlock, false);
  EXPECT_EQ(frame.x[8], static_cast<uint64_t>(a::nr::kRestartSyscall));
  EXPECT_EQ(frame.pc, r.pc);
  EXPECT_EQ(frame.x[0], r.x[0]);
}

// Transaction::frame_registers: the frame of a thread inside restart_syscall
// re-issues the original call, found in the wrapper before the `svc`.
TEST(Aarch64Restart, TheFrameOfARestartSyscallThreadReissuesTheOriginalCall) {
  const a::Regs r = rewound(a::nr::kRestartSyscall);
  const a::Regs in = a::as_stopped_in_restart_syscall(r);
  EXPECT_EQ(a::syscall_insn_address(in), r.pc);
  // Debian 12's clock_nanosleep at 0xb3b14: mov x1, x20; mov x8, #0x73; svc.
  const uint8_t before[9] = {0xaa, 0xe1, 0x03, 0x14, 0xaa, 0x68, 0x0e, 0x80, 0xd2};
  const auto nr = a::wrapper_syscall_nr(std::span<const uint8_t, 9>(before));
  ASSERT_EQ(nr, std::optional<long>(a::nr::kClockNanosleep));
  const a::Regs frame = a::resume_registers(a::with_syscall_nr(in, *nr), RestartKind::kRestartBlock, false);
  EXPECT_EQ(frame.x[8], static_cast<uint64_t>(a::nr::kClockNanosleep));
  EXPECT_EQ(frame.pc, r.pc);
  EXPECT_EQ(frame.x[0], r.x[0]) << "the first argument";
  for (size_t i = 1; i < 31; ++i)
    if (i != 8) {
      EXPECT_EQ(frame.x[i], r.x[i]) << "x" << i;
    }
  EXPECT_EQ(frame.syscallno, -1);
}

TEST(Aarch64Restart, WithEntryArgs) {
  // epoll_pwait returned -EINTR past its `svc`; /proc read before the stop
  // said: nr 22, these arguments, this pc.
  const std::array<uint64_t, 6> args = {7, 0x0000fffff7ff3000, 16, 0xffffffffffffffff, 0x0000fffff7ff3100, 8};
  a::Regs r = patterned_regs(0x0000fffff7ff1000);
  r.pc = 0x0000ffffa0e7ff0ull;
  r.x[0] = static_cast<uint64_t>(-EINTR);
  r.x[8] = static_cast<uint64_t>(a::nr::kEpollPwait);
  for (size_t i = 1; i < 6; ++i) r.x[i] = args[i];
  r.syscallno = -1;

  const a::Regs in = a::with_entry_args(r, a::nr::kEpollPwait, args, r.pc);
  EXPECT_EQ(in.syscallno, a::nr::kEpollPwait);
  EXPECT_EQ(in.orig_x0, args[0]);
  EXPECT_EQ(0, std::memcmp(in.x, r.x, sizeof r.x));
  EXPECT_EQ(a::classify_restart(in, false), RestartKind::kReissueOnEintr);
  EXPECT_EQ(a::classify_restart(in, true), RestartKind::kNone) << "a real signal: keep EINTR";
  const a::Regs again = a::resume_registers(in, RestartKind::kReissueOnEintr, true);
  EXPECT_EQ(again.pc, r.pc - 4);
  EXPECT_EQ(again.x[0], args[0]);
  EXPECT_EQ(again.x[8], static_cast<uint64_t>(a::nr::kEpollPwait));
  EXPECT_EQ(again.syscallno, -1);
  const a::Regs kept = a::resume_registers(in, RestartKind::kNone, true);
  EXPECT_EQ(kept.pc, r.pc);
  EXPECT_EQ(static_cast<int64_t>(kept.x[0]), -EINTR);

  // Each disagreement leaves the registers as they are: no call to re-issue.
  auto unchanged = [](const a::Regs& regs, long nr, const std::array<uint64_t, 6>& ar, uint64_t pc,
                      const std::string& what) {
    const a::Regs o = a::with_entry_args(regs, nr, ar, pc);
    expect_same_ptrace_regs(o, regs);
    EXPECT_EQ(o.orig_x0, regs.orig_x0) << what;
    EXPECT_EQ(a::classify_restart(o, false), a::classify_restart(regs, false)) << what;
  };
  unchanged(r, a::nr::kEpollPwait, args, r.pc + 4, "another pc");
  unchanged(r, a::nr::kEpollPwait, args, r.pc - 4, "the pc of the svc");
  unchanged(r, a::nr::kPpoll, args, r.pc, "another number in x8");
  unchanged(r, -1, args, r.pc, "no call");
  for (size_t i = 1; i < 6; ++i) {
    auto other = args;
    other[i] ^= 0x40;
    unchanged(r, a::nr::kEpollPwait, other, r.pc, "x" + std::to_string(i) + " differs");
  }
  auto first = args;
  first[0] = 99;  // x0 holds the result: not compared
  EXPECT_EQ(a::with_entry_args(r, a::nr::kEpollPwait, first, r.pc).orig_x0, 99u);
  a::Regs inside = r;
  inside.syscallno = a::nr::kRead;
  inside.x[0] = 3;
  unchanged(inside, a::nr::kEpollPwait, args, r.pc, "already in a system call");
}

// A thread /proc saw blocked in a restart_block call and found rewound onto
// its `svc` resumes through restart_syscall (ptrace's restore) and re-issues
// the call (the frame); calls of other kinds keep the plain restart.
TEST(Aarch64Restart, EntryArgsTellARestartBlockCall) {
  struct Case {
    long nr;
    std::array<uint64_t, 6> args;
    bool restart_block;
    const char* what;
  } cases[] = {
      {a::nr::kNanosleep, {0x1000, 0x2000, 0, 0, 0, 0}, true, "nanosleep"},
      {a::nr::kClockNanosleep, {1, 0, 0x1000, 0x2000, 0, 0}, true, "clock_nanosleep, relative"},
      {a::nr::kClockNanosleep, {1, 1, 0x1000, 0x2000, 0, 0}, false, "clock_nanosleep, TIMER_ABSTIME"},
      {a::nr::kFutex, {0x3000, 0x80, 5, 0x1000, 0, 0}, true, "FUTEX_WAIT_PRIVATE with a timeout"},
      {a::nr::kFutex, {0x3000, 0x89, 5, 0x1000, 0, 0xffffffff}, true, "FUTEX_WAIT_BITSET with a timeout"},
      {a::nr::kFutex, {0x3000, 0x80, 5, 0, 0, 0}, false, "FUTEX_WAIT without a timeout"},
      {a::nr::kFutex, {0x3000, 0x81, 1, 0, 0, 0}, false, "FUTEX_WAKE"},
      {a::nr::kRead, {3, 0x1000, 16, 0, 0, 0}, false, "read"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    a::Regs r = patterned_regs(0x0000fffff7ff1000);
    r.pc = 0x0000ffffa0e7ff0ull;  // on the svc
    r.syscallno = -1;
    r.x[8] = static_cast<uint64_t>(c.nr);
    for (size_t i = 0; i < 6; ++i) r.x[i] = c.args[i];
    ASSERT_TRUE(a::awaits_restart_syscall(r));
    const a::Regs in = a::with_entry_args(a::as_stopped_in_restart_syscall(r), c.nr, c.args, r.pc + 4);
    EXPECT_EQ(a::uses_restart_block(c.nr, c.args), c.restart_block);
    const RestartKind kind = a::classify_restart(in, false);
    EXPECT_EQ(kind, c.restart_block ? RestartKind::kRestartBlock : RestartKind::kRestart);
    const a::Regs ptrace_restore = a::resume_registers(in, kind, true);
    EXPECT_EQ(ptrace_restore.pc, r.pc);
    EXPECT_EQ(ptrace_restore.x[0], r.x[0]);
    EXPECT_EQ(ptrace_restore.x[8], c.restart_block ? static_cast<uint64_t>(a::nr::kRestartSyscall) : r.x[8]);
    const a::Regs frame = a::resume_registers(in, kind, false);
    expect_same_ptrace_regs(frame, r);
  }
  // /proc saw another call (or another first argument): a plain restart.
  a::Regs r = patterned_regs(0x0000fffff7ff1000);
  r.pc = 0x0000ffffa0e7ff0ull;
  r.syscallno = -1;
  r.x[8] = static_cast<uint64_t>(a::nr::kNanosleep);
  const std::array<uint64_t, 6> args = {r.x[0] ^ 1, r.x[1], r.x[2], r.x[3], r.x[4], r.x[5]};
  const a::Regs in =
      a::with_entry_args(a::as_stopped_in_restart_syscall(r), a::nr::kNanosleep, args, r.pc + 4);
  EXPECT_EQ(a::classify_restart(in, false), RestartKind::kRestart);
}

// ---------------------------------------------------------------------------
// Decoders of glibc's code
// ---------------------------------------------------------------------------

std::array<uint8_t, 9> before_svc(uint32_t insn, uint32_t prev = 0xd503201f /* nop */) {
  std::array<uint8_t, 9> b{};
  b[0] = 0xaa;
  std::memcpy(b.data() + 1, &prev, 4);
  std::memcpy(b.data() + 5, &insn, 4);
  return b;
}

TEST(Aarch64Decoders, WrapperSyscallNr) {
  struct Case {
    const char* what;
    uint32_t insn;
    std::optional<long> want;
  };
  const Case cases[] = {
      {"movz x8, #101", a::encode_movz(8, 101), 101},
      {"movz w8, #115", a::encode_movz_w(8, 115), 115},
      {"movz x8, #441", a::encode_movz(8, 441), 441},
      // Debian 12's libc: mov x8, #0x62 (futex, 0x7b2c0) and #0x73 (clock_nanosleep, 0xb3b1c).
      {"Debian futex wrapper", 0xd2800c48, 98},
      {"Debian clock_nanosleep", 0xd2800e68, 115},
      {"movz x8, #98, lsl #16", 0xd2a00c48, std::nullopt},
      {"movk x8, #98", 0xf2800c48, std::nullopt},
      {"movz x9, #98", a::encode_movz(9, 98), std::nullopt},
      {"mov x8, x0", 0xaa0003e8, std::nullopt},
      {"movz x8, #2000 (no such call)", a::encode_movz(8, 2000), std::nullopt},
      {"svc #0", a::encode_svc0(), std::nullopt},
      // Debian's timed futex wait (0x7b508..0x7b524) loads x8 seven
      // instructions before its svc; the frame then keeps restart_syscall.
      {"sxtw x1, w1", 0x93407c21, std::nullopt},
  };
  for (const auto& c : cases) {
    const auto b = before_svc(c.insn);
    EXPECT_EQ(a::wrapper_syscall_nr(std::span<const uint8_t, 9>(b)), c.want) << c.what;
  }
}

// glibc's syscall() in Debian 12's arm64 libc 2.36
// (/usr/aarch64-linux-gnu/lib/libc.so.6, aarch64-linux-gnu-objdump -d):
//   e3c18: aa0503e4  mov x4, x5
//   e3c1c: aa0603e5  mov x5, x6
//   e3c20: aa0703e6  mov x6, x7
//   e3c24: d4000001  svc #0
//   e3c28: b13ffc1f  cmn x0, #0xfff
TEST(Aarch64Decoders, GenericSyscallFnOnDebianLibc) {
  const uint8_t debian[9] = {0xaa, 0xe5, 0x03, 0x06, 0xaa, 0xe6, 0x03, 0x07, 0xaa};
  EXPECT_TRUE(a::is_generic_syscall_fn(std::span<const uint8_t, 9>(debian)))
      << "Debian's syscall() is not recognised";
  const uint8_t tail[8] = {0x01, 0x00, 0x00, 0xd4, 0x1f, 0xfc, 0x3f, 0xb1};
  EXPECT_EQ(0, std::memcmp(tail, a::kSyscallFnTail.data(), 8)) << "svc #0; cmn x0, #0xfff";
  // A wrapper is not syscall().
  const uint8_t clock_nanosleep[9] = {0xaa, 0xe1, 0x03, 0x14, 0xaa, 0x68, 0x0e, 0x80, 0xd2};
  EXPECT_FALSE(a::is_generic_syscall_fn(std::span<const uint8_t, 9>(clock_nanosleep)));
}

std::vector<uint8_t> caller_bytes(std::initializer_list<uint32_t> insns) {
  std::vector<uint8_t> c(a::kCallerBytes);
  for (size_t i = 0; i < c.size(); i += 4) std::memcpy(c.data() + i, "\x1f\x20\x03\xd5", 4);  // nop
  size_t at = c.size() - 4 * insns.size();
  for (uint32_t w : insns) {
    std::memcpy(c.data() + at, &w, 4);
    at += 4;
  }
  return c;
}

TEST(Aarch64Decoders, CallerSyscallNr) {
  const uint32_t bl = 0x97fff000;  // bl syscall (some offset back)
  // gcc 12 -O2 for aarch64: syscall(SYS_futex, uaddr, FUTEX_WAIT, 0, ts) with
  // its result used: stp x29, x30, [sp, #-16]!; mov x4, x1; mov w3, #0;
  // mov x29, sp; mov x1, x0; mov w2, #0; mov x0, #0x62; bl syscall.
  const auto gcc =
      caller_bytes({0xa9bf7bfd, 0xaa0103e4, 0x52800003, 0x910003fd, 0xaa0003e1, 0x52800002, 0xd2800c40, bl});
  EXPECT_EQ(a::caller_syscall_nr(gcc), std::optional<long>(a::nr::kFutex));
  const auto w0 = caller_bytes({a::encode_movz_w(0, 101), 0xaa0003e1, bl});
  EXPECT_EQ(a::caller_syscall_nr(w0), std::optional<long>(a::nr::kNanosleep));
  const auto far =
      caller_bytes({a::encode_movz_w(0, 115), 0xaa0003e1, 0xaa0103e2, 0xaa0203e3, 0xaa0303e4, bl});
  EXPECT_EQ(a::caller_syscall_nr(far), std::optional<long>(a::nr::kClockNanosleep));
  // Only the calls that use restart_block.
  EXPECT_EQ(a::caller_syscall_nr(caller_bytes({a::encode_movz_w(0, 63), bl})), std::nullopt) << "read";
  EXPECT_EQ(a::caller_syscall_nr(caller_bytes({a::encode_movz_w(1, 98), bl})), std::nullopt) << "w1, not w0";
  EXPECT_EQ(a::caller_syscall_nr(caller_bytes({bl})), std::nullopt) << "no mov at all";
  EXPECT_EQ(a::caller_syscall_nr(std::span<const uint8_t>(gcc).first(4)), std::nullopt) << "too short";
}

TEST(Aarch64Decoders, SyscallInsn) {
  const std::array<uint8_t, 4> svc = {0x01, 0x00, 0x00, 0xd4}, hvc = {0x02, 0x00, 0x00, 0xd4};
  EXPECT_TRUE(a::is_syscall_insn(svc));
  EXPECT_FALSE(a::is_syscall_insn(hvc));
  // The vDSO's __kernel_rt_sigreturn: mov x8, #139; svc #0.
  uint32_t w[2] = {a::encode_movz(8, a::nr::kRtSigreturn), a::encode_svc0()};
  EXPECT_EQ(0, std::memcmp(w, a::kRestoreRtPattern.data(), 8));
}

}  // namespace
