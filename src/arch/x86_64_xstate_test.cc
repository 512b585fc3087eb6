// The signal-frame fpstate builder, table-tested on the layouts of CPUs the
// build machine may not have. Each case runs the built image through a model
// of what the kernel's rt_sigreturn does with it (check_xstate_in_sigframe,
// then XRSTOR of the declared features, init of the rest of the task's) and
// asserts that every component comes back exactly as saved.
#include "arch/x86_64_xstate.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>

namespace x = remora::arch::x86_64;

namespace {

constexpr uint64_t bit(int i) { return uint64_t{1} << i; }

struct Cpu {
  const char* name;
  x::XstateLayout layout;
};

x::XstateLayout make_layout(uint64_t xcr0,
                            std::initializer_list<std::tuple<int, uint32_t, uint32_t, bool>> comps) {
  x::XstateLayout l;
  l.xsave = true;
  l.xcr0 = xcr0;
  for (auto [i, off, size, xfd] : comps) l.components[static_cast<size_t>(i)] = {off, size, xfd};
  return l;
}

// CPUID leaf 0xD as these CPUs report it.
const Cpu kAvx2{"AVX2 only (Haswell)", make_layout(0x7, {{2, 576, 256, false}})};
const Cpu kZen4{
    "AMD Zen 4 (AVX-512, no AMX, no PKRU)",
    make_layout(0xe7,
                {{2, 576, 256, false}, {5, 832, 64, false}, {6, 896, 512, false}, {7, 1408, 1024, false}})};
const Cpu kSkylake{"Intel Skylake-SP (AVX-512, MPX, PKRU, no AMX)",
                   make_layout(0x2ff, {{2, 576, 256, false},
                                       {3, 960, 64, false},
                                       {4, 1024, 64, false},
                                       {5, 1088, 64, false},
                                       {6, 1152, 512, false},
                                       {7, 1664, 1024, false},
                                       {9, 2688, 8, false}})};
const Cpu kSapphire{"Intel Sapphire Rapids (AVX-512, PKRU, AMX)",
                    make_layout(0x602e7, {{2, 576, 256, false},
                                          {5, 1088, 64, false},
                                          {6, 1152, 512, false},
                                          {7, 1664, 1024, false},
                                          {9, 2688, 8, false},
                                          {17, 2752, 64, false},
                                          {18, 2816, 8192, true}})};

// A ptrace NT_X86_XSTATE buffer of a thread on `cpu`: the kernel's maximum
// size, the uabi mask at sw_reserved, `in_use` in the header, patterned data.
std::vector<std::byte> ptrace_buffer(const x::XstateLayout& l, uint64_t in_use) {
  std::vector<std::byte> b(l.size_for(l.xcr0));
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte(static_cast<uint8_t>(i * 131 + 7));
  std::memset(b.data() + x::kFxSwBytesOffset, 0, 48);
  std::memcpy(b.data() + x::kFxSwBytesOffset, &l.xcr0, 8);
  std::memset(b.data() + x::kXstateBvOffset, 0, x::kXsaveHeaderSize);
  std::memcpy(b.data() + x::kXstateBvOffset, &in_use, 8);
  return b;
}

uint64_t u64(std::span<const std::byte> s, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}

// What rt_sigreturn does with `image` for a task whose fpstate really is
// `real`; nullopt when the restore faults (the thread would get SIGSEGV).
struct Restore {
  bool fx_only = false;
  uint64_t restored = 0;  // components loaded from the image (those with their header bit)
};
std::optional<Restore> kernel_restore(const x::XstateLayout& l, x::TaskXstate real,
                                      std::span<const std::byte> image) {
  Restore r;
  if (!l.xsave) {
    r.fx_only = true;
    r.restored = 0x3;
    return r;
  }
  x::FxSwBytes sw;
  std::memcpy(&sw, image.data() + x::kFxSwBytesOffset, sizeof sw);
  bool ok = sw.magic1 == x::kFpXstateMagic1 && sw.xstate_size >= x::kXsaveMinSize &&
            sw.xstate_size <= real.size && sw.xstate_size <= sw.extended_size &&
            image.size() >= sw.xstate_size + 4;
  if (ok) {
    uint32_t magic2 = 0;
    std::memcpy(&magic2, image.data() + sw.xstate_size, 4);
    ok = magic2 == x::kFpXstateMagic2;
  }
  if (!ok) {
    r.fx_only = true;
    r.restored = 0x3;
    return r;
  }
  const uint64_t rfbm = sw.xfeatures & l.xcr0;
  const uint64_t bv = u64(image, x::kXstateBvOffset);
  if (u64(image, x::kXcompBvOffset) != 0) return std::nullopt;                // #GP: not the standard format
  if ((bv & ~l.xcr0) != 0) return std::nullopt;                               // #GP
  if ((rfbm & l.dynamic(l.xcr0) & ~real.features) != 0) return std::nullopt;  // #NM: XFD armed
  r.restored = rfbm & bv;
  return r;
}

// Every component of the task comes back as saved: those in use are loaded
// from the image with the saved bytes, those not in use end in init state.
void expect_exact(const x::XstateLayout& l, x::TaskXstate real, std::span<const std::byte> saved,
                  const x::SigFpstate& built) {
  auto r = kernel_restore(l, real, built.image);
  ASSERT_TRUE(r.has_value()) << "rt_sigreturn would fault";
  ASSERT_FALSE(r->fx_only && (u64(saved, x::kXstateBvOffset) & ~uint64_t{3}) != 0)
      << "rt_sigreturn would fall back to FXSAVE only and reset the vector registers";
  const uint64_t in_use = u64(saved, x::kXstateBvOffset) & real.features;
  for (int i = 0; i < 64; ++i) {
    if ((real.features & bit(i)) == 0) continue;
    if ((in_use & bit(i)) == 0) continue;  // init before, init after (restored with bv clear or reset)
    ASSERT_TRUE((r->restored & bit(i)) != 0) << "component " << i << " is reset, not restored";
    if (i < 2) continue;
    const auto& c = l.components[static_cast<size_t>(i)];
    ASSERT_LE(c.offset + c.size, built.image.size());
    EXPECT_EQ(0, std::memcmp(saved.data() + c.offset, built.image.data() + c.offset, c.size))
        << "component " << i << " bytes differ";
  }
  // The legacy area (x87, MXCSR, xmm) apart from sw_reserved.
  EXPECT_EQ(0, std::memcmp(saved.data(), built.image.data(), x::kFxSwBytesOffset));
}

struct Case {
  const Cpu* cpu;
  const char* thread;
  uint64_t in_use;         // xstate_bv the thread's saved state has
  uint64_t real_features;  // what the kernel's fpstate holds for it
  uint32_t frame_size;     // the size its frames must declare
};

class SigFpstate : public ::testing::TestWithParam<Case> {};

TEST_P(SigFpstate, RestoresEveryComponentExactly) {
  const Case& c = GetParam();
  const auto& l = c.cpu->layout;
  auto saved = ptrace_buffer(l, c.in_use);
  auto built = x::build_sig_fpstate(l, saved);
  SCOPED_TRACE(std::string(c.cpu->name) + ", " + c.thread);
  EXPECT_TRUE(built.exact) << built.why_not;
  EXPECT_TRUE(built.xsave);
  EXPECT_EQ(built.task.size, c.frame_size);
  EXPECT_EQ(built.task.features, c.real_features);
  ASSERT_EQ(built.image.size(), c.frame_size + 4u);
  x::FxSwBytes sw;
  std::memcpy(&sw, built.image.data() + x::kFxSwBytesOffset, sizeof sw);
  EXPECT_EQ(sw.magic1, x::kFpXstateMagic1);
  EXPECT_EQ(sw.xstate_size, c.frame_size);
  EXPECT_EQ(sw.extended_size, c.frame_size + 4);
  EXPECT_EQ(sw.xfeatures, c.real_features);
  const x::TaskXstate real{c.real_features, l.size_for(c.real_features)};
  expect_exact(l, real, saved, built);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, SigFpstate,
    ::testing::Values(Case{&kAvx2, "any thread", 0x7, 0x7, 832},
                      Case{&kAvx2, "a thread that never used AVX", 0x3, 0x7, 832},
                      Case{&kZen4, "a zmm thread", 0xe7, 0xe7, 2432},
                      Case{&kZen4, "an sse-only thread", 0x3, 0xe7, 2432},
                      Case{&kSkylake, "a zmm thread", 0x2e7, 0x2ff, 2696},
                      Case{&kSapphire, "a zmm thread without AMX permission", 0x2e7, 0x202e7, 2816},
                      Case{&kSapphire, "a thread with permission that has not used AMX", 0x202e7, 0x202e7,
                           2816},
                      Case{&kSapphire, "a thread with tiles loaded", 0x602e7, 0x602e7, 11008}));

// A thread that used AMX and released its tiles (TILERELEASE: tile data back
// in init state) keeps its large fpstate; a frame without tile data is still
// exact, because rt_sigreturn re-initialises the tiles.
TEST(SigFpstateAmx, ReleasedTilesNeedNoTileData) {
  const auto& l = kSapphire.layout;
  auto saved = ptrace_buffer(l, 0x202e7);
  auto built = x::build_sig_fpstate(l, saved);
  EXPECT_TRUE(built.exact);
  expect_exact(l, x::TaskXstate{0x602e7, 11008}, saved, built);
}

// The frame the engine used to write (sized and flagged from the ptrace
// buffer) is what broke ordinary threads on AMX machines: the model must
// catch it, or the cases above prove nothing.
TEST(SigFpstateAmx, TheModelRefusesAFrameSizedFromThePtraceBuffer) {
  const auto& l = kSapphire.layout;
  auto saved = ptrace_buffer(l, 0x2e7);
  std::vector<std::byte> old(saved.begin(), saved.end());
  old.resize(saved.size() + 4);
  x::FxSwBytes sw;
  sw.magic1 = x::kFpXstateMagic1;
  sw.extended_size = static_cast<uint32_t>(saved.size() + 4);
  sw.xfeatures = l.xcr0;
  sw.xstate_size = static_cast<uint32_t>(saved.size());
  std::memcpy(old.data() + x::kFxSwBytesOffset, &sw, sizeof sw);
  std::memcpy(old.data() + saved.size(), &x::kFpXstateMagic2, 4);
  auto r = kernel_restore(l, x::TaskXstate{0x202e7, 2816}, old);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->fx_only);
}

TEST(SigFpstateNoXsave, TheFxsaveAreaAlone) {
  x::XstateLayout l;  // xsave = false
  std::vector<std::byte> fx(512);
  for (size_t i = 0; i < fx.size(); ++i) fx[i] = std::byte(static_cast<uint8_t>(i));
  auto built = x::build_sig_fpstate(l, fx);
  EXPECT_TRUE(built.exact) << built.why_not;
  EXPECT_FALSE(built.xsave);
  ASSERT_EQ(built.image.size(), 512u);
  EXPECT_EQ(0, std::memcmp(built.image.data(), fx.data(), 512));
}

TEST(SigFpstateMismatch, AKernelAreaOfAnotherSizeIsNotExact) {
  const auto& l = kZen4.layout;
  auto saved = ptrace_buffer(l, 0xe7);
  saved.resize(saved.size() + 64);
  auto built = x::build_sig_fpstate(l, saved);
  EXPECT_FALSE(built.exact);
  EXPECT_NE(built.why_not.find("2496 bytes"), std::string::npos) << built.why_not;
  // Still a frame the kernel accepts: declares no more than the task has.
  auto r = kernel_restore(l, x::TaskXstate{0xe7, 2432}, built.image);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->fx_only);
}

TEST(SigFpstateMismatch, TheCompactedFormatIsNotExact) {
  const auto& l = kZen4.layout;
  auto saved = ptrace_buffer(l, 0xe7);
  uint64_t compacted = bit(63) | 0xe7;
  std::memcpy(saved.data() + x::kXcompBvOffset, &compacted, 8);
  EXPECT_FALSE(x::build_sig_fpstate(l, saved).exact);
}

TEST(XstateLayout, SizesAsTheKernelComputesThem) {
  EXPECT_EQ(kSapphire.layout.size_for(0x3), 576u);
  EXPECT_EQ(kSapphire.layout.size_for(0x602e7), 11008u);
  EXPECT_EQ(kSapphire.layout.size_for(0x202e7), 2816u);
  EXPECT_EQ(kSapphire.layout.dynamic(0x602e7), bit(18));
  EXPECT_EQ(kZen4.layout.size_for(0xe7), 2432u);
  EXPECT_EQ(kSkylake.layout.size_for(0x2ff), 2696u);
}

// The host's own layout is self-consistent (its sizes are checked against a
// real thread's ptrace buffer in the remote-call suites).
TEST(XstateLayout, HostLayoutIsConsistent) {
  const auto& l = x::host_xstate_layout();
  if (!l.xsave) {
    std::printf("  host: no XSAVE (FXSAVE frames only)\n");
    return;
  }
  std::printf("  host: XCR0 %#llx, standard-format size %u, dynamic %#llx\n",
              static_cast<unsigned long long>(l.xcr0), l.size_for(l.xcr0),
              static_cast<unsigned long long>(l.dynamic(l.xcr0)));
  EXPECT_EQ(l.xcr0 & 0x3, 0x3u);
  for (int i = 2; i < 64; ++i)
    if ((l.xcr0 & bit(i)) != 0) {
      EXPECT_GE(l.components[static_cast<size_t>(i)].offset, x::kXsaveMinSize) << "component " << i;
      EXPECT_GT(l.components[static_cast<size_t>(i)].size, 0u) << "component " << i;
    }
}

}  // namespace
