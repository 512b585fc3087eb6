#include "arch/aarch64_state.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "arch/aarch64_frame.h"

namespace remora::arch::aarch64 {

namespace {
constexpr size_t align_up(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

template <typename T>
T load(std::span<const std::byte> d, size_t at) {
  T v{};
  if (at + sizeof(T) <= d.size()) std::memcpy(&v, d.data() + at, sizeof(T));
  return v;
}
template <typename T>
void store(std::vector<std::byte>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// The registers of an SVE payload in signal-frame order (Z, P, FFR): the
// bytes after the header up to FFR's end, vq = vl / 16.
size_t sve_regs_size(uint16_t vl) {
  const size_t vq = vl / 16;
  return 32 * vq * 16 + 16 * vq * 2 + vq * 2;
}

void append_record(std::vector<std::byte>& out, uint32_t magic, std::span<const std::byte> head_tail,
                   std::span<const std::byte> body, size_t size) {
  const size_t at = out.size();
  out.resize(at + size);
  store<uint32_t>(out, at, magic);
  store<uint32_t>(out, at + 4, static_cast<uint32_t>(size));
  std::memcpy(out.data() + at + 8, head_tail.data(), head_tail.size());
  std::memcpy(out.data() + at + 8 + head_tail.size(), body.data(),
              std::min(body.size(), size - 8 - head_tail.size()));
}
}  // namespace

std::vector<StateSection> parse_state(std::span<const std::byte> p) {
  std::vector<StateSection> out;
  size_t at = 0;
  while (at + 8 <= p.size()) {
    const uint32_t note = load<uint32_t>(p, at), size = load<uint32_t>(p, at + 4);
    if (at + 8 + size > p.size()) break;
    out.push_back({note, p.subspan(at + 8, size)});
    at = align_up(at + 8 + size, 8);
  }
  return out;
}

void append_section(std::vector<std::byte>& p, uint32_t note, std::span<const std::byte> data) {
  const size_t at = p.size();
  p.resize(align_up(at + 8 + data.size(), 8));
  store<uint32_t>(p, at, note);
  store<uint32_t>(p, at + 4, static_cast<uint32_t>(data.size()));
  std::memcpy(p.data() + at + 8, data.data(), data.size());
}

const StateSection* find_section(const std::vector<StateSection>& s, uint32_t note) {
  for (const auto& x : s)
    if (x.note == note) return &x;
  return nullptr;
}

uint32_t vec_set_size(std::span<const std::byte> d) {
  return d.size() < kVecHeaderSize ? 0 : load<uint32_t>(d, 0);
}
uint16_t vec_vl(std::span<const std::byte> d) { return load<uint16_t>(d, 8); }
uint16_t vec_flags(std::span<const std::byte> d) { return load<uint16_t>(d, 12); }

bool streaming_mode(const std::vector<StateSection>& s) {
  const auto* ssve = find_section(s, kNtArmSsve);
  return ssve && ssve->data.size() > kVecHeaderSize && (vec_flags(ssve->data) & kSvePtRegsSve) != 0;
}

bool za_on(const std::vector<StateSection>& s) {
  const auto* za = find_section(s, kNtArmZa);
  return za && za->data.size() > kVecHeaderSize && vec_set_size(za->data) > kVecHeaderSize;
}

std::vector<StateSection> restore_order(std::span<const std::byte> packed) {
  const auto s = parse_state(packed);
  std::vector<StateSection> out;
  if (const auto* tls = find_section(s, kNtArmTls)) out.push_back(*tls);
  const auto* sve = find_section(s, kNtArmSve);
  if (streaming_mode(s))
    out.push_back(*find_section(s, kNtArmSsve));
  else if (sve)
    out.push_back(*sve);
  else if (const auto* fp = find_section(s, kNtPrfpreg))
    out.push_back(*fp);
  if (const auto* za = find_section(s, kNtArmZa)) out.push_back(*za);
  if (const auto* zt = find_section(s, kNtArmZt); zt && za_on(s)) out.push_back(*zt);
  return out;
}

std::vector<std::byte> call_entry_state(std::span<const std::byte> packed) {
  const auto s = parse_state(packed);
  std::vector<std::byte> out;
  if (!streaming_mode(s) && !za_on(s)) return out;
  const auto* sve = find_section(s, kNtArmSve);
  const auto* fp = find_section(s, kNtPrfpreg);
  if (streaming_mode(s) && sve && fp && fp->data.size() >= kFpsimdStateSize) {
    // The SVE set in FPSIMD form: writing it leaves streaming mode.
    std::vector<std::byte> set(kVecHeaderSize + kFpsimdStateSize);
    store<uint32_t>(set, 0, static_cast<uint32_t>(set.size()));
    store<uint32_t>(set, 4, load<uint32_t>(sve->data, 4));
    store<uint16_t>(set, 8, vec_vl(sve->data));
    store<uint16_t>(set, 10, load<uint16_t>(sve->data, 10));
    store<uint16_t>(set, 12, static_cast<uint16_t>(vec_flags(sve->data) & ~kSvePtRegsSve));
    std::memcpy(set.data() + kVecHeaderSize, fp->data.data(), kFpsimdStateSize);
    append_section(out, kNtArmSve, set);
  }
  if (const auto* za = find_section(s, kNtArmZa); za && za_on(s)) {
    // A header alone turns ZA off.
    std::vector<std::byte> set(za->data.begin(), za->data.begin() + kVecHeaderSize);
    store<uint32_t>(set, 0, static_cast<uint32_t>(kVecHeaderSize));
    append_section(out, kNtArmZa, set);
  }
  return out;
}

const StateLayout& host_xstate_layout() {
  static const StateLayout layout;
  return layout;
}

SigFpstate build_sig_fpstate(const StateLayout&, std::span<const std::byte> saved) {
  SigFpstate out;
  const auto s = parse_state(saved);
  const auto* fp = find_section(s, kNtPrfpreg);
  if (!fp || fp->data.size() < kFpsimdStateSize) {
    out.why_not = "the thread's FP/SIMD registers could not be read";
    return out;
  }
  // fpsimd_context: head, fpsr, fpcr, then the 32 V registers.
  const std::array<uint32_t, 2> status = {load<uint32_t>(fp->data, 512), load<uint32_t>(fp->data, 516)};
  append_record(out.image, kFpsimdMagic, std::as_bytes(std::span(status)), fp->data.first(512), 528);
  const bool sm = streaming_mode(s);
  const auto* vec = find_section(s, sm ? kNtArmSsve : kNtArmSve);
  if (vec && (vec_flags(vec->data) & kSvePtRegsSve) != 0) {
    // sve_context: head, vl, flags, 2 reserved; the registers in the same
    // order as the ptrace payload (which then adds fpsr/fpcr, kept in the
    // fpsimd record).
    const uint16_t vl = vec_vl(vec->data);
    const size_t regs = sve_regs_size(vl);
    const std::array<uint16_t, 4> tail = {vl, sm ? kSveSigFlagSm : uint16_t{0}, 0, 0};
    if (vec->data.size() < kVecHeaderSize + regs) {
      out.why_not = "the thread's SVE register set is shorter than its vector length says";
      return out;
    }
    append_record(out.image, kSveMagic, std::as_bytes(std::span(tail)),
                  vec->data.subspan(kVecHeaderSize, regs), align_up(16 + regs, 16));
  }
  out.why_not = "the thread is in SME streaming mode or has ZA on: restored through ptrace";
  if (za_on(s)) {
    const auto* za = find_section(s, kNtArmZa);
    const uint16_t vl = vec_vl(za->data);
    const size_t size = align_up(16 + size_t{vl} * vl, 16);
    // The kernel refuses a frame past SIGFRAME_MAXSZ (a SIGSEGV for a
    // thread whose controller died): at the largest streaming vector
    // lengths ZA alone is 64 KiB, and the frame then goes without it (ZA
    // stays off after a controller's death; a live controller restores it).
    const auto* zt = find_section(s, kNtArmZt);
    const size_t zt_size = zt && zt->data.size() >= kZtSize ? 16 + kZtSize : 0;
    if (kFrameReserved + records_footprint(out.image.size() + size + zt_size) <= kSigframeMaxSize) {
      const std::array<uint16_t, 4> tail = {vl, 0, 0, 0};
      append_record(out.image, kZaMagic, std::as_bytes(std::span(tail)), za->data.subspan(kVecHeaderSize),
                    size);
      // zt_context: head, nregs (1), 3 reserved; after ZA, which it needs.
      const std::array<uint16_t, 4> zt_tail = {1, 0, 0, 0};
      if (zt_size != 0)
        append_record(out.image, kZtMagic, std::as_bytes(std::span(zt_tail)), zt->data.first(kZtSize),
                      zt_size);
    } else {
      out.why_not += "; ZA is too large for a signal frame and is left out of it";
    }
  }
  if (sm || za_on(s)) return out;
  out.why_not.clear();
  out.exact = true;
  return out;
}

}  // namespace remora::arch::aarch64
