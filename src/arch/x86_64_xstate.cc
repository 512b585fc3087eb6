#include "arch/x86_64_xstate.h"

#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace remora::arch::x86_64 {

namespace {

uint64_t read_u64(std::span<const std::byte> s, size_t at) {
  uint64_t v = 0;
  if (s.size() >= at + 8) std::memcpy(&v, s.data() + at, 8);
  return v;
}

}  // namespace

uint64_t XstateLayout::dynamic(uint64_t features) const {
  uint64_t out = 0;
  for (int i = 2; i < 64; ++i)
    if ((features >> i & 1) != 0 && components[static_cast<size_t>(i)].xfd) out |= uint64_t{1} << i;
  return out;
}

uint32_t XstateLayout::size_for(uint64_t features) const {
  if (features == 0) return kXsaveMinSize;
  const int topmost = 63 - std::countl_zero(features);
  if (topmost <= kXfeatureSse) return kXsaveMinSize;
  const XComponent& c = components[static_cast<size_t>(topmost)];
  return std::max<uint32_t>(c.offset + c.size, kXsaveMinSize);
}

const XstateLayout& host_xstate_layout() {
  static const XstateLayout layout = [] {
    XstateLayout l;
#if defined(__x86_64__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) == 0) return l;
    const bool has_xsave = (c & bit_XSAVE) != 0, os_xsave = (c & bit_OSXSAVE) != 0;
    if (!has_xsave || !os_xsave || __get_cpuid_max(0, nullptr) < 0xd) return l;
    uint32_t lo = 0, hi = 0;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    l.xsave = true;
    l.xcr0 = (uint64_t{hi} << 32) | lo;
    for (unsigned i = 2; i < 64; ++i) {
      if ((l.xcr0 >> i & 1) == 0) continue;
      __cpuid_count(0xd, i, a, b, c, d);
      l.components[i] = XComponent{b, a, (c & 4u) != 0};
    }
#endif
    return l;
  }();
  return layout;
}

TaskXstate task_xstate(const XstateLayout& layout, std::span<const std::byte> saved) {
  // The word ptrace writes at sw_reserved is the kernel's user feature mask
  // (xfeatures_mask_uabi); XCR0 says the same where it is missing.
  uint64_t uabi = read_u64(saved, kFxSwBytesOffset);
  if (uabi == 0) uabi = layout.xcr0;
  const uint64_t dyn = layout.dynamic(uabi);
  const uint64_t in_use = read_u64(saved, kXstateBvOffset);
  TaskXstate t;
  t.features = (uabi & ~dyn) | (in_use & dyn);
  t.size = layout.size_for(t.features);
  return t;
}

SigFpstate build_sig_fpstate(const XstateLayout& layout, std::span<const std::byte> saved) {
  SigFpstate out;
  if (!layout.xsave) {
    // FXSAVE only: rt_sigreturn FXRSTORs the 512-byte area, which is all the
    // state there is. The sw_reserved bytes are the thread's own.
    const size_t n = std::min(saved.size(), kFxsaveSize);
    out.image.assign(saved.begin(), saved.begin() + static_cast<long>(n));
    out.image.resize(kFxsaveSize);
    out.task = TaskXstate{0x3, static_cast<uint32_t>(kFxsaveSize)};
    out.exact = saved.size() == kFxsaveSize;
    if (!out.exact)
      out.why_not =
          "the CPU reports no XSAVE but the saved state has " + std::to_string(saved.size()) + " bytes";
    return out;
  }
  out.xsave = true;
  if (saved.size() < kXsaveMinSize) {
    // Not an xsave area: the frame can only carry the legacy part.
    out.xsave = false;
    out.image.assign(saved.begin(), saved.end());
    out.image.resize(kFxsaveSize);
    out.task = TaskXstate{0x3, static_cast<uint32_t>(kFxsaveSize)};
    out.why_not = "the saved state has " + std::to_string(saved.size()) + " bytes, less than an xsave area";
    return out;
  }
  uint64_t uabi = read_u64(saved, kFxSwBytesOffset);
  if (uabi == 0) uabi = layout.xcr0;
  out.task = task_xstate(layout, saved);
  out.exact = true;
  if (const uint32_t want = layout.size_for(uabi); saved.size() != want) {
    out.exact = false;
    out.why_not = "the kernel's xsave area has " + std::to_string(saved.size()) +
                  " bytes where the CPU's layout gives " + std::to_string(want);
  } else if (read_u64(saved, kXcompBvOffset) != 0) {
    out.exact = false;
    out.why_not = "the saved xsave area is in the compacted format";
  }
  // Never declare more than the buffer holds.
  out.task.size = std::min<uint32_t>(out.task.size, static_cast<uint32_t>(saved.size()));
  out.image.assign(saved.begin(), saved.begin() + out.task.size);
  out.image.resize(out.task.size + 4);
  FxSwBytes sw;
  sw.magic1 = kFpXstateMagic1;
  sw.extended_size = out.task.size + 4;
  sw.xfeatures = out.task.features;
  sw.xstate_size = out.task.size;
  std::memcpy(out.image.data() + kFxSwBytesOffset, &sw, sizeof sw);
  // Components outside the declared features cannot be restored (XRSTOR
  // would fault on a bit the task may not use): the header names only those
  // the image carries. Those dropped are in their init state (see above).
  const uint64_t bv = read_u64(saved, kXstateBvOffset) & out.task.features;
  std::memcpy(out.image.data() + kXstateBvOffset, &bv, 8);
  const uint32_t magic2 = kFpXstateMagic2;
  std::memcpy(out.image.data() + out.task.size, &magic2, 4);
  return out;
}

}  // namespace remora::arch::x86_64
