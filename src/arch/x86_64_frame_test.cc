// The x86_64 restore frame and call registers, from tables: where each part
// of the frame goes, what its bytes say, the registers of each step, and the
// recovery of an interrupted call's number from the code around it.
#include "arch/x86_64_frame.h"

#include <gtest/gtest.h>

#include <cstring>

namespace x = remora::arch::x86_64;

namespace {

TEST(X86_64FramePlan, BelowTheRedZoneAndAligned) {
  struct Case {
    uint64_t rsp;
    size_t fpstate;
    std::vector<size_t> args;
  };
  const Case cases[] = {
      {0x7ffd1000, 2436, {}},        {0x7ffd1008, 836, {}},       {0x7ffd0ff8, 11012, {}},
      {0x7ffd1000, 2436, {1, 5001}}, {0x7ffd1003, 516, {16, 17}}, {0x7ffd1000, 2820, {300}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE("rsp " + std::to_string(c.rsp) + " fpstate " + std::to_string(c.fpstate));
    auto f = x::plan_frame(c.rsp, c.fpstate, c.args);
    EXPECT_LE(f.end, c.rsp - x::kRedZone) << "the frame reaches into the red zone";
    EXPECT_EQ(f.fpstate % 64, 0u);
    EXPECT_EQ(f.end, f.fpstate + c.fpstate);
    EXPECT_EQ(f.uc % 16, 0u);
    EXPECT_LE(f.uc + sizeof(x::UContext), f.fpstate);
    EXPECT_EQ(f.pretcode, f.uc - 8);
    EXPECT_EQ(f.all_mask, f.uc - 16);
    EXPECT_EQ(f.result_slot, f.uc - 32);
    EXPECT_EQ(f.call_sp % x::kStackAlign, 0u);
    ASSERT_EQ(f.args.size(), c.args.size());
    uint64_t above = f.uc - 256;
    for (size_t i = 0; i < c.args.size(); ++i) {
      EXPECT_EQ(f.args[i] % 16, 0u);
      EXPECT_LE(f.args[i] + c.args[i], above) << "argument " << i << " overlaps what is above it";
      above = f.args[i];
    }
    EXPECT_EQ(f.call_sp, c.args.empty() ? (f.uc - 256) & ~uint64_t{15} : f.args.back());
    EXPECT_EQ(f.base, c.args.empty() ? f.result_slot : f.call_sp);
  }
}

TEST(X86_64FrameBytes, HoldTheResumeStateMaskFpstateAndArguments) {
  const std::vector<size_t> sizes = {3, 20};
  auto f = x::plan_frame(0x7ffd2000, 836, sizes);
  x::Regs resume{};
  resume.rip = 0x401234;
  resume.rsp = 0x7ffd2000;
  resume.rax = 7;
  resume.cs = 0x33;
  resume.ss = 0x2b;
  std::vector<std::byte> fp(836, std::byte{0x5a});
  const std::byte a0[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  std::vector<std::byte> a1(20, std::byte{9});
  std::span<const std::byte> args[] = {a0, a1};
  x::FrameContents c;
  c.resume = resume;
  c.sigmask = 0x1234;
  c.fp_xstate = true;
  c.fpstate = fp;
  c.restorer = 0x7f0000001000;
  c.args = args;
  auto bytes = x::frame_bytes(f, c);
  ASSERT_EQ(bytes.size(), f.end - f.base);
  auto at = [&](uint64_t addr) { return bytes.data() + (addr - f.base); };
  x::UContext uc;
  std::memcpy(&uc, at(f.uc), sizeof uc);
  EXPECT_EQ(uc.uc_mcontext.rip, 0x401234u);
  EXPECT_EQ(uc.uc_mcontext.rax, 7u);
  EXPECT_EQ(uc.uc_mcontext.fpstate, f.fpstate);
  EXPECT_EQ(uc.uc_sigmask, 0x1234u);
  EXPECT_EQ(uc.uc_flags, x::kUcFpXstate | x::kUcSigcontextSs | x::kUcStrictRestoreSs);
  EXPECT_EQ(uc.uc_stack.ss_flags, x::kSsFlagsInvalid);
  uint64_t v = 0;
  std::memcpy(&v, at(f.pretcode), 8);
  EXPECT_EQ(v, 0x7f0000001000u);
  std::memcpy(&v, at(f.all_mask), 8);
  EXPECT_EQ(v, ~uint64_t{0});
  EXPECT_EQ(0, std::memcmp(at(f.fpstate), fp.data(), fp.size()));
  EXPECT_EQ(0, std::memcmp(at(f.args[0]), a0, 3));
  EXPECT_EQ(0, std::memcmp(at(f.args[1]), a1.data(), a1.size()));
  // Without XSAVE the frame must not claim an xsave image.
  c.fp_xstate = false;
  std::memcpy(&uc, x::frame_bytes(f, c).data() + (f.uc - f.base), sizeof uc);
  EXPECT_EQ(uc.uc_flags & x::kUcFpXstate, 0u);
}

TEST(X86_64CallRegs, EachStepStartsWhereItShould) {
  x::Regs r{};
  r.rip = 0x401000;
  r.rsp = 0x7ffd3000;
  r.orig_rax = 0;  // stopped in read
  r.rax = static_cast<uint64_t>(-512);
  auto f = x::plan_frame(r.rsp, 836, {});
  const uint64_t stub = 0x7f1200000000;
  const std::array<uint64_t, 6> args = {1, 2, 3, 4, 5, 6};

  auto call = x::call_regs(r, 0x402000, args, f, stub, /*marker=*/23, /*cookie=*/99);
  EXPECT_EQ(call.rip, stub + x::Stub::kMarkedCallEntry);
  EXPECT_EQ(call.r11, 0x402000u);
  EXPECT_EQ(call.rdi, 1u);
  EXPECT_EQ(call.rcx, 4u);  // the function-call ABI
  EXPECT_EQ(call.r9, 6u);
  EXPECT_EQ(call.r12, f.result_slot);
  EXPECT_EQ(call.r13, 23u);
  EXPECT_EQ(call.r14, 99u);
  EXPECT_EQ(call.rbx, f.uc);
  EXPECT_EQ(call.rsp, f.call_sp);
  EXPECT_EQ(call.orig_rax, ~uint64_t{0}) << "no syscall restart into the stub";
  EXPECT_EQ(x::call_regs(r, 0x402000, args, f, stub, 0, 99).rip, stub + x::Stub::kCallEntry);
  EXPECT_EQ(x::call_return_end(stub, true), stub + x::Stub::kMarkedCallReturnSyscallEnd);
  EXPECT_EQ(x::call_return_end(stub, false), stub + x::Stub::kCallReturnSyscallEnd);

  auto sys = x::syscall_regs(r, x::nr::kMmap, args, f, x::StubSite{stub, 0, 0});
  EXPECT_EQ(sys.regs.rip, stub + x::Stub::kSyscallEntry);
  EXPECT_EQ(sys.insn_end, stub + x::Stub::kSyscallEnd);
  EXPECT_EQ(sys.regs.rax, static_cast<uint64_t>(x::nr::kMmap));
  EXPECT_EQ(sys.regs.r10, 4u);  // the system-call ABI
  EXPECT_EQ(sys.regs.rsp, f.call_sp);
  auto boot = x::syscall_regs(r, x::nr::kMmap, args, f, x::StubSite{std::nullopt, 0x7f00aa, 0x7f00bb});
  EXPECT_EQ(boot.regs.rip, 0x7f00aau);
  EXPECT_EQ(boot.insn_end, 0x7f00aau + x::kSyscallInsnLen);
  EXPECT_EQ(boot.regs.rsp, f.pretcode) << "glibc's syscall() returns into __restore_rt";

  auto park = x::parked_regs(r, f, x::StubSite{stub, 0, 0});
  EXPECT_EQ(park.rip, stub + x::Stub::kCallEntry + 6);
  EXPECT_EQ(park.rbx, f.uc);
  auto park0 = x::parked_regs(r, f, x::StubSite{std::nullopt, 0x7f00aa, 0x7f00bb});
  EXPECT_EQ(park0.rip, 0x7f00bbu);
  EXPECT_EQ(park0.rsp, f.uc);
}

// glibc's wrappers as they are assembled, with the 9 bytes before `syscall`.
TEST(X86_64RestartNr, FromTheWrapperAroundTheSyscall) {
  struct Case {
    const char* what;
    std::array<uint8_t, 9> before;
    std::optional<long> nr;
  };
  const Case cases[] = {
      {"mov $0xe6,%eax (clock_nanosleep)", {0x90, 0x90, 0x90, 0x90, 0xb8, 0xe6, 0, 0, 0}, 230},
      {"mov $0xca,%rax (futex)", {0x90, 0x90, 0x48, 0xc7, 0xc0, 0xca, 0, 0, 0}, 202},
      {"an implausible immediate", {0x90, 0x90, 0x90, 0x90, 0xb8, 0xff, 0xff, 0, 0}, std::nullopt},
      {"no immediate load", {0x90, 0x90, 0x90, 0x90, 0x4c, 0x8b, 0x4c, 0x24, 0x08}, std::nullopt},
  };
  for (const auto& c : cases) EXPECT_EQ(x::wrapper_syscall_nr(c.before), c.nr) << c.what;
  const std::array<uint8_t, 9> generic = {0x48, 0x89, 0xf8, 0x90, 0x4c, 0x8b, 0x4c, 0x24, 0x08};
  EXPECT_TRUE(x::is_generic_syscall_fn(generic));
  EXPECT_FALSE(x::is_generic_syscall_fn(cases[0].before));
}

TEST(X86_64RestartNr, FromTheCallerOfGenericSyscall) {
  // ... mov $0xca,%edi; mov ...; call syscall  (the return address follows)
  std::vector<uint8_t> code(x::kCallerBytes, 0x90);
  const uint8_t load[] = {0xbf, 0xca, 0, 0, 0};
  std::memcpy(&code[30], load, sizeof load);
  EXPECT_EQ(x::caller_syscall_nr(code), 202);
  // A number that is not a restart_block user is refused.
  std::vector<uint8_t> other(x::kCallerBytes, 0x90);
  const uint8_t load_read[] = {0xbf, 0x00, 0, 0, 0};
  std::memcpy(&other[30], load_read, sizeof load_read);
  EXPECT_EQ(x::caller_syscall_nr(other), std::nullopt);
  EXPECT_EQ(x::caller_syscall_nr(std::vector<uint8_t>(x::kCallerBytes, 0x90)), std::nullopt);
}

}  // namespace
