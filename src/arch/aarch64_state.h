// The FP/SIMD state of an aarch64 thread, as Remora saves, restores and
// puts into a restore frame. It is several ptrace register sets (the
// FPSIMD registers, SVE, streaming SVE and ZA with SME, the thread pointer),
// which ptrace::get_xstate packs into one buffer of sections and
// set_xstate writes back in the order that restores each exactly. Writing
// the FP register set alone would zero the upper bits of live SVE
// registers, and leave streaming mode and ZA as they are; so on a CPU with
// SVE the SVE set is what is written back (it carries the FPSIMD registers
// too), and on one with SME the streaming set when the thread was in
// streaming mode, then ZA.
//
// Pure and host-independent (numbers, not the host's headers): unit tested
// on every host (arch/aarch64_frame_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace remora::arch::aarch64 {

// Register-set notes (include/uapi/linux/elf.h).
inline constexpr uint32_t kNtPrfpreg = 2, kNtArmTls = 0x401, kNtArmSve = 0x405, kNtArmSsve = 0x40b,
                          kNtArmZa = 0x40c, kNtArmZt = 0x40d;
// What ptrace::get_xstate reads, in this order; a set the kernel or CPU
// lacks (EINVAL/ENODEV) is left out. ZT0 (SME2) is one 64-byte register,
// reachable only while ZA is on.
inline constexpr uint32_t kStateNotes[] = {kNtPrfpreg, kNtArmSve, kNtArmSsve, kNtArmZa, kNtArmZt, kNtArmTls};
inline constexpr size_t kZtSize = 64;
// Bytes ptrace::get_xstate offers a set on its first read; a larger SVE/ZA
// set (its header's size says so) is read again at its size.
inline constexpr size_t kFirstReadSize = 16 * 1024;

// user_fpsimd_state: vregs[32] (16 bytes each), fpsr, fpcr, 8 reserved.
inline constexpr size_t kFpsimdStateSize = 528;
// user_sve_header / user_za_header: size, max_size (u32); vl, max_vl, flags,
// reserved (u16).
inline constexpr size_t kVecHeaderSize = 16;
inline constexpr uint16_t kSvePtRegsSve = 1;  // SVE_PT_REGS_SVE: the payload holds live SVE registers

// One section of the packed buffer.
struct StateSection {
  uint32_t note = 0;
  std::span<const std::byte> data;
};
// The packed format: per section, u32 note, u32 size, the bytes, padding to
// 8. Malformed input yields the sections before the damage.
std::vector<StateSection> parse_state(std::span<const std::byte> packed);
void append_section(std::vector<std::byte>& packed, uint32_t note, std::span<const std::byte> data);
const StateSection* find_section(const std::vector<StateSection>& s, uint32_t note);

// The size a vector register set's header declares (its whole size), 0 when
// `data` is shorter than a header.
uint32_t vec_set_size(std::span<const std::byte> data);
uint16_t vec_flags(std::span<const std::byte> data);
uint16_t vec_vl(std::span<const std::byte> data);
// Whether the thread is in streaming mode (its SSVE set holds live
// registers) and whether its ZA storage is on (the ZA set has data).
bool streaming_mode(const std::vector<StateSection>& s);
bool za_on(const std::vector<StateSection>& s);

// The sections to write back, in order: the thread pointer; then the
// streaming set in streaming mode, else the SVE set, else the FP set; then
// ZA; then ZT0, only when ZA was on (writing ZT0 turns ZA on). Views into
// `packed`.
std::vector<StateSection> restore_order(std::span<const std::byte> packed);
// The sections to write before a call runs on the thread: out of streaming
// mode (the SVE set in FPSIMD form) and ZA off, so that libc's code, which
// is not streaming-compatible, runs as it expects. Empty when the thread is
// in neither. Owns its bytes.
std::vector<std::byte> call_entry_state(std::span<const std::byte> packed);

// The layout a frame is built for: nothing to detect on aarch64 (vector
// lengths come from the saved state itself).
struct StateLayout {};
const StateLayout& host_xstate_layout();

// The records of a restore frame (sigcontext __reserved): fpsimd_context,
// then an sve_context when the thread has live SVE or streaming registers,
// then a za_context when ZA is on, and a zt_context with ZT0 when the CPU
// has SME2. exact: rt_sigreturn on them restores
// `saved` exactly and the remote call may rely on it; false in streaming
// mode or with ZA on (the engine restores those through ptrace), or when
// the FP set is missing.
struct SigFpstate {
  std::vector<std::byte> image;
  bool xsave = false;  // unused on aarch64
  bool exact = false;
  std::string why_not;
};
SigFpstate build_sig_fpstate(const StateLayout& layout, std::span<const std::byte> saved);

inline constexpr uint32_t kFpsimdMagic = 0x46508001, kSveMagic = 0x53564501, kZaMagic = 0x54366345,
                          kZtMagic = 0x5a544e01;
inline constexpr uint16_t kSveSigFlagSm = 1;

}  // namespace remora::arch::aarch64
