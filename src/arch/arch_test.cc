#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "arch/aarch64.h"
#include "arch/x86_64.h"

namespace remora::arch {
namespace {

namespace x = x86_64;

x::Regs in_syscall(long nr, int64_t ret, uint64_t rip = 0x1002) {
  x::Regs r{};
  r.orig_rax = static_cast<uint64_t>(nr);
  r.rax = static_cast<uint64_t>(ret);
  r.rip = rip;
  return r;
}

TEST(X86_64Restart, Classification) {
  struct Case {
    long nr;
    int64_t ret;
    bool pending;
    RestartKind want;
  } cases[] = {
      {x::nr::kRead, kERestartSys, false, RestartKind::kRestart},
      {x::nr::kRead, kERestartSys, true, RestartKind::kRestart},
      {x::nr::kFutex, kERestartRestartBlock, false, RestartKind::kRestartBlock},
      {x::nr::kNanosleep, kERestartRestartBlock, false, RestartKind::kRestartBlock},
      {x::nr::kPpoll, kERestartNoHand, false, RestartKind::kRestart},
      {x::nr::kAccept, kERestartNoIntr, false, RestartKind::kRestart},
      {x::nr::kEpollWait, -EINTR, false, RestartKind::kReissueOnEintr},
      {x::nr::kEpollPwait, -EINTR, false, RestartKind::kReissueOnEintr},
      {x::nr::kEpollWait, -EINTR, true, RestartKind::kNone},  // a real signal: keep EINTR
      {x::nr::kRead, -EINTR, false, RestartKind::kNone},      // read's EINTR is always genuine
      {x::nr::kRead, 5, false, RestartKind::kNone},           // completed
      {-1, kERestartSys, false, RestartKind::kNone},          // not in a syscall
  };
  for (const auto& c : cases)
    EXPECT_EQ(x::classify_restart(in_syscall(c.nr, c.ret), c.pending), c.want) << c.nr << " " << c.ret;
}

TEST(X86_64Restart, ResumeRegisters) {
  auto r = in_syscall(x::nr::kRead, kERestartSys, 0x5002);
  auto out = x::resume_registers(r, RestartKind::kRestart, true);
  EXPECT_EQ(out.rip, 0x5000u);
  EXPECT_EQ(out.rax, static_cast<uint64_t>(x::nr::kRead));
  EXPECT_EQ(static_cast<int64_t>(out.orig_rax), -1);

  auto nb = in_syscall(x::nr::kNanosleep, kERestartRestartBlock, 0x5002);
  EXPECT_EQ(x::resume_registers(nb, RestartKind::kRestartBlock, true).rax,
            static_cast<uint64_t>(x::nr::kRestartSyscall));
  EXPECT_EQ(x::resume_registers(nb, RestartKind::kRestartBlock, false).rax,
            static_cast<uint64_t>(x::nr::kNanosleep));

  auto done = in_syscall(x::nr::kRead, 7, 0x5002);
  auto same = x::resume_registers(done, RestartKind::kNone, true);
  EXPECT_EQ(same.rip, 0x5002u);
  EXPECT_EQ(same.rax, 7u);
}

// A thread released between the kernel's rewind for restart_syscall and its
// re-entry is saved as if stopped inside restart_syscall: classified
// kRestartBlock (no marked call, whose rt_sigreturn would reset the
// restart_block) and resumed on the same instruction with the same rax.
TEST(X86_64Restart, AwaitingRestartSyscall) {
  x::Regs pending{};
  pending.rip = 0x5000;
  pending.rax = static_cast<uint64_t>(x::nr::kRestartSyscall);
  pending.orig_rax = ~uint64_t{0};
  ASSERT_TRUE(x::awaits_restart_syscall(pending));
  auto as_stopped = x::as_stopped_in_restart_syscall(pending);
  EXPECT_EQ(x::classify_restart(as_stopped, false), RestartKind::kRestartBlock);
  auto back = x::resume_registers(as_stopped, RestartKind::kRestartBlock, true);
  EXPECT_EQ(back.rip, pending.rip);
  EXPECT_EQ(back.rax, pending.rax);
  EXPECT_EQ(static_cast<int64_t>(back.orig_rax), -1);

  x::Regs other = pending;
  other.rax = static_cast<uint64_t>(x::nr::kNanosleep);  // a plain rewind: nothing hidden
  EXPECT_FALSE(x::awaits_restart_syscall(other));
  x::Regs inside = pending;
  inside.orig_rax = static_cast<uint64_t>(x::nr::kRestartSyscall);  // already in the kernel
  EXPECT_FALSE(x::awaits_restart_syscall(inside));
}

TEST(X86_64Restart, MaskSwappingCalls) {
  EXPECT_TRUE(x::swaps_signal_mask(x::nr::kPpoll));
  EXPECT_TRUE(x::swaps_signal_mask(x::nr::kRtSigsuspend));
  EXPECT_FALSE(x::swaps_signal_mask(x::nr::kRead));
  EXPECT_FALSE(x::swaps_signal_mask(x::nr::kEpollWait));
}

#if defined(__x86_64__)  // stub_code() exists where x86_64_stub.S is assembled
TEST(X86_64Stub, LayoutMatchesOffsets) {
  auto code = x::stub_code();
  auto at = [&](uint64_t off) { return static_cast<uint8_t>(code[off]); };
  // call *%r11 at the call entry.
  EXPECT_EQ(at(x::Stub::kCallEntry), 0x41);
  EXPECT_EQ(at(x::Stub::kCallEntry + 2), 0xd3);
  // The final syscall of each stub ends where the engine expects it.
  EXPECT_EQ(at(x::Stub::kCallReturnSyscallEnd - 2), 0x0f);
  EXPECT_EQ(at(x::Stub::kCallReturnSyscallEnd - 1), 0x05);
  EXPECT_EQ(at(x::Stub::kSyscallEntry), 0x0f);
  EXPECT_EQ(at(x::Stub::kSyscallEnd - 1), 0x05);
  EXPECT_EQ(at(x::Stub::kSyscallReturnSyscallEnd - 2), 0x0f);
  EXPECT_EQ(at(x::Stub::kSyscallReturnSyscallEnd - 1), 0x05);
  // mov $15,%eax precedes each final syscall.
  EXPECT_EQ(at(x::Stub::kCallReturnSyscallEnd - 10), 0xb8);
  EXPECT_EQ(at(x::Stub::kCallReturnSyscallEnd - 9), 15);
  // The marked call: call *%r11 first; tgkill (234) then rt_sigreturn (15)
  // last, each loaded by mov $NR,%eax right before its syscall.
  EXPECT_EQ(at(x::Stub::kMarkedCallEntry), 0x41);
  EXPECT_EQ(at(x::Stub::kMarkedCallEntry + 2), 0xd3);
  const uint64_t end = x::Stub::kMarkedCallReturnSyscallEnd;
  EXPECT_EQ(at(end - 2), 0x0f);
  EXPECT_EQ(at(end - 1), 0x05);
  EXPECT_EQ(at(end - 10), 0xb8);
  EXPECT_EQ(at(end - 9), 15);
  EXPECT_EQ(at(end - 17), 0xb8);
  EXPECT_EQ(at(end - 16), 234);
  EXPECT_EQ(at(end - 12), 0x0f);
  EXPECT_EQ(at(end - 11), 0x05);
  // Nothing of the thread trampoline runs into the marked stub.
  EXPECT_EQ(at(x::Stub::kMarkedCallEntry - 1), 0xcc);
}
#endif

TEST(X86_64Frame, SigcontextCarriesRegisters) {
  x::Regs r{};
  r.rip = 0x1234;
  r.rsp = 0x7ff0;
  r.rbx = 42;
  r.cs = 0x33;
  r.ss = 0x2b;
  auto sc = x::sigcontext_from(r, 0x9000);
  EXPECT_EQ(sc.rip, 0x1234u);
  EXPECT_EQ(sc.rsp, 0x7ff0u);
  EXPECT_EQ(sc.rbx, 42u);
  EXPECT_EQ(sc.cs, 0x33);
  EXPECT_EQ(sc.ss, 0x2b);
  EXPECT_EQ(sc.fpstate, 0x9000u);
  EXPECT_EQ(offsetof(x::UContext, uc_mcontext), 40u);
  EXPECT_EQ(offsetof(x::UContext, uc_sigmask), 296u);
}

// The encoders against the Arm ARM's encodings (checked with
// aarch64-linux-gnu-as), and, where aarch64_stub.S is assembled, the stub's
// watched instructions at the offsets aarch64_stub.h names.
TEST(Aarch64, Encodings) {
  namespace a = aarch64;
  EXPECT_EQ(a::encode_blr(16), 0xd63f0200u);
  EXPECT_EQ(a::encode_svc0(), 0xd4000001u);
  EXPECT_EQ(a::encode_brk(0), 0xd4200000u);
  EXPECT_EQ(a::encode_brk(0x52), 0xd4200a40u);
  EXPECT_EQ(a::encode_movz(8, 139), 0xd2801168u);
  EXPECT_EQ(a::encode_movz(0, 98), 0xd2800c40u);
  EXPECT_EQ(a::encode_movz_w(8, 98), 0x52800c48u);
  EXPECT_EQ(a::encode_mov_to_sp(19), 0x9100027fu);
#if defined(__aarch64__)  // stub_code() exists where aarch64_stub.S is assembled
  const auto code = a::stub_code();
  auto word = [&](uint64_t off) {
    uint32_t w = 0;
    std::memcpy(&w, code.data() + off, 4);
    return w;
  };
  constexpr uint32_t kLdrX7 = 0xf9400000u | ((REMORA_AARCH64_FRAME_X7 / 8) << 10) | (19u << 5) | 7u;
  // Each stub's tail: ldr x7, [x19, #FRAME_X7]; mov x8, #139; mov sp, x19; svc #0.
  for (uint64_t end :
       {a::Stub::kCallReturnSyscallEnd, a::Stub::kSyscallEnd + 16, a::Stub::kMarkedCallReturnSyscallEnd}) {
    EXPECT_EQ(word(end - 16), kLdrX7) << end;
    EXPECT_EQ(word(end - 12), a::encode_movz(8, a::nr::kRtSigreturn)) << end;
    EXPECT_EQ(word(end - 8), a::encode_mov_to_sp(19)) << end;
    EXPECT_EQ(word(end - 4), a::encode_svc0()) << end;
  }
  EXPECT_EQ(word(a::Stub::kCallEntry), a::encode_blr(16));
  EXPECT_EQ(a::Stub::kCallTail, a::Stub::kCallEntry + 4);
  EXPECT_EQ(word(a::Stub::kSyscallEntry), a::encode_svc0());
  EXPECT_EQ(a::Stub::kSyscallEnd, a::Stub::kSyscallEntry + 4);
  EXPECT_EQ(word(a::Stub::kMarkedCallEntry), a::encode_blr(16));
  // The marker: tgkill right before the tail.
  EXPECT_EQ(word(a::Stub::kMarkedCallReturnSyscallEnd - 20), a::encode_svc0());
  EXPECT_EQ(word(a::Stub::kMarkedCallReturnSyscallEnd - 24), a::encode_movz(8, a::nr::kTgkill));
  EXPECT_EQ(word(a::Stub::kCallReturnSyscallEnd), a::encode_brk(0x52));
  // The loader start routine: its frame, then the stack's mmap (x8 = 222; svc).
  EXPECT_EQ(word(a::Stub::kLoaderStart), 0xa9be7bfdu);  // stp x29, x30, [sp, #-32]!
  EXPECT_EQ(word(a::Stub::kLoaderStart + 0x38), a::encode_movz(8, a::nr::kMmap));
  EXPECT_EQ(word(a::Stub::kLoaderStart + 0x3c), a::encode_svc0());
  EXPECT_EQ(word(a::Stub::kLoaderStart + 0xb0), 0xd65f03c0u);  // ret
  EXPECT_LE(a::Stub::kLoaderStart + 0xb4, a::Stub::kScratchSetup);
  // The scratch setup, after it: next (x3) and its argument (x4) into x16
  // and x12; mprotect of the data pages (x8 = 226; svc; cbnz x0 to the ret),
  // the base into the status word, prctl and madvise, then 0, and with a next
  // (cbz x16 to the ret) the argument into x0 and br x16.
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x00), 0xaa0303f0u);  // mov x16, x3
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x04), 0xaa0403ecu);  // mov x12, x4
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x20), a::encode_movz(8, a::nr::kMprotect));
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x24), a::encode_svc0());
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x28), 0xb5000000u | ((0x74 - 0x28) / 4) << 5);  // cbnz x0, ret
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x2c),
            0xf9000000u | (a::Stub::kSetupStatus / 8) << 10 | 9u << 5 | 9u);  // str x9, [x9, #status]
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x60), a::encode_svc0());             // madvise
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x64), a::encode_movz(0, 0));
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x68), 0xb4000000u | ((0x74 - 0x68) / 4) << 5 | 16u);  // cbz x16
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x6c), 0xaa0c03e0u);  // mov x0, x12
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x70), 0xd61f0200u);  // br x16
  EXPECT_EQ(word(a::Stub::kScratchSetup + 0x74), 0xd65f03c0u);  // ret
  EXPECT_LE(a::Stub::kScratchSetup + 0x78, a::Stub::kThreadHook);
  EXPECT_EQ(a::Stub::kSetupStatus, 0x1010u);
  // The thread trampoline ends in a branch to its end at the block's end:
  // hook_name (+0x58) first, ..., ret.
  const uint64_t branch_at = a::Stub::kThreadTrampoline + 0x4c;
  EXPECT_EQ(word(branch_at), 0x14000000u | static_cast<uint32_t>((a::Stub::kThreadHook - branch_at) / 4));
  // ldr x1, [x19, #0x58]
  EXPECT_EQ(word(a::Stub::kThreadHook), 0xf9400000u | (0x58u / 8) << 10 | 19u << 5 | 1u);
  EXPECT_EQ(word(a::Stub::kThreadHook + 0x48), 0xd65f03c0u);                            // ret
  EXPECT_LE(a::Stub::kThreadHook + 0x4c, a::Stub::kSize);
#else
  std::printf("  skipped the stub's bytes: aarch64_stub.S is assembled on aarch64 hosts only\n");
#endif
}

TEST(Aarch64, Restart) {
  namespace a = aarch64;
  struct Case {
    long nr;
    int64_t ret;
    bool pending;
    RestartKind want;
  } cases[] = {
      {a::nr::kRead, kERestartSys, false, RestartKind::kRestart},
      {a::nr::kFutex, kERestartRestartBlock, false, RestartKind::kRestartBlock},
      {a::nr::kClockNanosleep, kERestartRestartBlock, false, RestartKind::kRestartBlock},
      {a::nr::kPpoll, kERestartNoHand, false, RestartKind::kRestart},
      {a::nr::kEpollPwait, -EINTR, false, RestartKind::kReissueOnEintr},
      {a::nr::kEpollPwait2, -EINTR, false, RestartKind::kReissueOnEintr},
      {a::nr::kEpollPwait, -EINTR, true, RestartKind::kNone},  // a real signal: keep EINTR
      {a::nr::kRead, -EINTR, false, RestartKind::kNone},       // read's EINTR is always genuine
      {a::nr::kRead, 5, false, RestartKind::kNone},            // completed
      {-1, kERestartSys, false, RestartKind::kNone},           // not in a syscall
  };
  for (const auto& c : cases)
    EXPECT_EQ(a::classify_restart(c.nr, c.ret, c.pending), c.want) << c.nr << " " << c.ret;
  EXPECT_TRUE(a::swaps_signal_mask(a::nr::kPpoll));
  EXPECT_FALSE(a::swaps_signal_mask(a::nr::kRead));
  EXPECT_EQ(aarch64::kRedZone, 0u);
}

// Every call the restart rules are about, with its number in each kernel's
// table (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/
// unistd.h), spelled out here rather than taken from nr:: so that a wrong
// constant, or a table entry whose name and number disagree, shows up.
constexpr long kAbsent = -1;  // the architecture has no such call
struct RestartCall {
  std::string_view name;
  long x86_64_nr;
  long aarch64_nr;
  bool never_restarted;
  bool swaps_signal_mask;
};
constexpr RestartCall kRestartCalls[] = {
    {"epoll_wait", 232, kAbsent, true, false},  // aarch64 has epoll_pwait only
    {"epoll_pwait", 281, 22, true, true},
    {"epoll_pwait2", 441, 441, true, true},
    {"rt_sigtimedwait", 128, 137, true, false},
    {"semop", 65, 193, true, false},
    {"semtimedop", 220, 192, true, false},
    {"io_getevents", 208, 4, true, false},
    {"io_pgetevents", 333, 292, true, true},
    {"msgrcv", 70, 188, true, false},
    {"rt_sigsuspend", 130, 133, false, true},
    {"ppoll", 271, 73, false, true},
    {"pselect6", 270, 72, false, true},
    // In neither list: the kernel restarts them through -ERESTARTNOHAND (or
    // restart_syscall). None exists on aarch64, where libc issues pselect6
    // for select and ppoll for pause and poll.
    {"select", 23, kAbsent, false, false},
    {"pause", 34, kAbsent, false, false},
    {"poll", 7, kAbsent, false, false},
};

using NameToNr = std::map<std::string_view, long>;

// The list as a map, failing the test on a name listed twice.
NameToNr by_name(std::span<const SyscallName> list, std::string_view what) {
  NameToNr out;
  for (const auto& c : list)
    EXPECT_TRUE(out.emplace(c.name, c.nr).second) << what << " lists " << c.name << " twice";
  return out;
}

// What the table of the architecture whose number `nr_of` picks should list.
template <typename Pick, typename Member>
NameToNr expected(Pick nr_of, Member in_list) {
  NameToNr out;
  for (const auto& c : kRestartCalls)
    if (c.*in_list && nr_of(c) != kAbsent) out.emplace(c.name, nr_of(c));
  return out;
}

TEST(RestartTables, BothArchitecturesNameTheSameCalls) {
  const RestartTable& x86 = x::restart_table();
  const RestartTable& arm = aarch64::restart_table();
  auto x86_nr = [](const RestartCall& c) { return c.x86_64_nr; };
  auto arm_nr = [](const RestartCall& c) { return c.aarch64_nr; };
  // Each table, names and numbers, is the calls above.
  EXPECT_EQ(by_name(x86.never_restarted, "x86_64 never_restarted"),
            expected(x86_nr, &RestartCall::never_restarted));
  EXPECT_EQ(by_name(x86.swaps_signal_mask, "x86_64 swaps_signal_mask"),
            expected(x86_nr, &RestartCall::swaps_signal_mask));
  EXPECT_EQ(by_name(arm.never_restarted, "aarch64 never_restarted"),
            expected(arm_nr, &RestartCall::never_restarted));
  EXPECT_EQ(by_name(arm.swaps_signal_mask, "aarch64 swaps_signal_mask"),
            expected(arm_nr, &RestartCall::swaps_signal_mask));

  // And the two tables name the same calls, apart from those aarch64 lacks.
  std::set<std::string_view> absent_on_arm;
  for (const auto& c : kRestartCalls)
    if (c.aarch64_nr == kAbsent) absent_on_arm.insert(c.name);
  auto names = [](std::span<const SyscallName> list, const std::set<std::string_view>& drop) {
    std::set<std::string_view> out;
    for (const auto& c : list)
      if (!drop.contains(c.name)) out.insert(c.name);
    return out;
  };
  EXPECT_EQ(names(x86.never_restarted, absent_on_arm), names(arm.never_restarted, {}));
  EXPECT_EQ(names(x86.swaps_signal_mask, absent_on_arm), names(arm.swaps_signal_mask, {}));
  for (const auto& c : arm.never_restarted) EXPECT_FALSE(absent_on_arm.contains(c.name)) << c.name;
}

// The public per-number functions answer from those tables, and the calls
// in neither list are left to the kernel's own restart.
TEST(RestartTables, FunctionsFollowTheTables) {
  for (const auto& c : kRestartCalls) {
    EXPECT_EQ(x::never_restarted(c.x86_64_nr), c.never_restarted) << c.name;
    EXPECT_EQ(x::swaps_signal_mask(c.x86_64_nr), c.swaps_signal_mask) << c.name;
    auto eintr = c.never_restarted ? RestartKind::kReissueOnEintr : RestartKind::kNone;
    EXPECT_EQ(x::classify_restart(in_syscall(c.x86_64_nr, -EINTR), false), eintr) << c.name;
    EXPECT_EQ(x::classify_restart(in_syscall(c.x86_64_nr, kERestartNoHand), false), RestartKind::kRestart)
        << c.name;
    if (c.aarch64_nr == kAbsent) continue;
    EXPECT_EQ(aarch64::never_restarted(c.aarch64_nr), c.never_restarted) << c.name;
    EXPECT_EQ(aarch64::swaps_signal_mask(c.aarch64_nr), c.swaps_signal_mask) << c.name;
    EXPECT_EQ(aarch64::classify_restart(c.aarch64_nr, -EINTR, false), eintr) << c.name;
  }
  // No number means no system call: in no list, whatever a table holds.
  EXPECT_FALSE(x::never_restarted(-1));
  EXPECT_FALSE(aarch64::swaps_signal_mask(-1));
}

#if defined(__x86_64__)
// The bytes stub_code() produced when it was written as annotated hex
// (commit e5c35e1), dumped from that build: the assembled x86_64_stub.S must
// be exactly that code, entry for entry. Test data, the one place the
// encodings are spelled out; the .S says what each instruction does.
TEST(X86_64Stub, AssembledCodeIsTheFormerHexTables) {
  static constexpr uint8_t kFormer[256] = {
      0x41, 0xff, 0xd3, 0x48, 0x89, 0xc7, 0xb8, 0x0f, 0x00, 0x00, 0x00, 0x48, 0x89, 0xdc, 0x0f, 0x05,
      0x0f, 0x0b, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      0x0f, 0x05, 0x48, 0x89, 0xc7, 0xb8, 0x0f, 0x00, 0x00, 0x00, 0x48, 0x89, 0xdc, 0x0f, 0x05, 0x0f,
      0x0b, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      0x53, 0x48, 0x89, 0xfb, 0xb8, 0xba, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x89, 0x43, 0x38, 0xff,
      0x53, 0x18, 0x48, 0x89, 0xc7, 0xff, 0x53, 0x20, 0x48, 0x8b, 0x7b, 0x08, 0x48, 0x8b, 0x73, 0x10,
      // 0x6d: the trampoline's end moved to the block's end (ThreadHookEncoding):
      // jmp rel32 there, int3 after.
      0xff, 0x13, 0x48, 0x89, 0x43, 0x30, 0xff, 0x53, 0x40, 0x48, 0x89, 0x43, 0x48, 0xe9, 0x8e, 0x01,
      0x00, 0x00, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      0x41, 0xff, 0xd3, 0x49, 0x89, 0x04, 0x24, 0x4d, 0x89, 0x74, 0x24, 0x08, 0xb8, 0x27, 0x00, 0x00,
      0x00, 0x0f, 0x05, 0x49, 0x89, 0xc7, 0xb8, 0xba, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x4c, 0x89, 0xff,
      0x48, 0x89, 0xc6, 0x4c, 0x89, 0xea, 0xb8, 0xea, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xb8, 0x0f, 0x00,
      0x00, 0x00, 0x48, 0x89, 0xdc, 0x0f, 0x05, 0x0f, 0x0b, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      // 192: the scratch setup was here; it moved after the loader start
      // (ScratchSetupEncoding), and int3 fills its old room.
      0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
      0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc};
  auto code = x::stub_code();
  for (size_t i = 0; i < sizeof kFormer; ++i)
    EXPECT_EQ(static_cast<unsigned>(code[i]), unsigned{kFormer[i]}) << "byte " << i;
}

// The loader start routine (arch/loader_block.h), as reviewed in its
// disassembly: push rbx, r12; align; mmap(hint, size, RW, PRIVATE|ANONYMOUS|
// STACK, -1, 0) with its result at +0x48; on -errno straight out; else
// pthread_attr_init(attr) and pthread_attr_setstack(attr, stack, size) with
// their status at +0x50, r12 = attr only when both returned 0; then
// pthread_create(thread_out, r12, trampoline, block) with its result at +0x58.
// int3 from its end to the scratch setup.
TEST(X86_64Stub, LoaderStartEncoding) {
  static constexpr uint8_t kLoaderStart[] = {
      0x53, 0x41, 0x54, 0x48, 0x83, 0xec, 0x08, 0x48, 0x89, 0xfb, 0x45, 0x31, 0xe4, 0x48, 0x83, 0x7b, 0x08,
      0x00, 0x74, 0x62, 0x48, 0x8b, 0x7b, 0x18, 0x48, 0x8b, 0x73, 0x20, 0xba, 0x03, 0x00, 0x00, 0x00, 0x41,
      0xba, 0x22, 0x00, 0x02, 0x00, 0x49, 0xc7, 0xc0, 0xff, 0xff, 0xff, 0xff, 0x45, 0x31, 0xc9, 0xb8, 0x09,
      0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x89, 0x43, 0x48, 0x48, 0x3d, 0x01, 0xf0, 0xff, 0xff, 0x73, 0x4a,
      0x48, 0x8b, 0x7b, 0x28, 0xff, 0x53, 0x08, 0x48, 0x63, 0xc0, 0x48, 0x89, 0x43, 0x50, 0x48, 0x85, 0xc0,
      0x75, 0x1f, 0x48, 0x8b, 0x7b, 0x28, 0x48, 0x8b, 0x73, 0x48, 0x48, 0x8b, 0x53, 0x20, 0xff, 0x53, 0x10,
      0x48, 0x63, 0xc0, 0x48, 0x89, 0x43, 0x50, 0x48, 0x85, 0xc0, 0x75, 0x04, 0x4c, 0x8b, 0x63, 0x28, 0x48,
      0x8b, 0x7b, 0x30, 0x4c, 0x89, 0xe6, 0x48, 0x8b, 0x53, 0x38, 0x48, 0x8b, 0x4b, 0x40, 0xff, 0x13, 0x48,
      0x63, 0xc0, 0x48, 0x89, 0x43, 0x58, 0x48, 0x83, 0xc4, 0x08, 0x41, 0x5c, 0x5b, 0xc3};
  auto code = x::stub_code();
  ASSERT_LE(x::Stub::kLoaderStart + sizeof kLoaderStart, code.size());
  for (size_t i = 0; i < sizeof kLoaderStart; ++i)
    EXPECT_EQ(static_cast<unsigned>(code[x::Stub::kLoaderStart + i]), unsigned{kLoaderStart[i]})
        << "byte " << i;
  for (size_t i = x::Stub::kLoaderStart + sizeof kLoaderStart; i < x::Stub::kScratchSetup; ++i)
    EXPECT_EQ(static_cast<unsigned>(code[i]), 0xccu) << "byte " << i;
  EXPECT_EQ(x::Stub::kLoaderStart, 256u);  // right after the former block
}

// The scratch setup, as reviewed in its disassembly: next (rcx) and its
// argument (r8) pushed; base, size and name into r9, r10, r8;
// mprotect(base + 0x1000, size - 0x1000, RW) and, on a non-zero result,
// straight to the two pops and the ret with it; the base into the status
// word (base + 0x1010); prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, base, size,
// name); madvise(base, size, MADV_DONTFORK); 0; the argument into rdi and
// next into rcx, jrcxz to the ret, else jmp *%rcx (rsp as at entry). It
// fills its room to the trampoline's end.
TEST(X86_64Stub, ScratchSetupEncoding) {
  static constexpr uint8_t kSetup[] = {
      0x51, 0x41, 0x50, 0x49, 0x89, 0xf9, 0x49, 0x89, 0xf2, 0x49, 0x89, 0xd0, 0x49, 0x8d, 0xb9, 0x00,
      0x10, 0x00, 0x00, 0x49, 0x8d, 0xb2, 0x00, 0xf0, 0xff, 0xff, 0xba, 0x03, 0x00, 0x00, 0x00, 0xb8,
      0x0a, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x85, 0xc0, 0x75, 0x32, 0x4d, 0x89, 0x89, 0x10, 0x10,
      0x00, 0x00, 0x4c, 0x89, 0xca, 0x31, 0xf6, 0xbf, 0x41, 0x4d, 0x56, 0x53, 0xb8, 0x9d, 0x00, 0x00,
      0x00, 0x0f, 0x05, 0x4c, 0x89, 0xcf, 0x4c, 0x89, 0xd6, 0xba, 0x0a, 0x00, 0x00, 0x00, 0xb8, 0x1c,
      0x00, 0x00, 0x00, 0x0f, 0x05, 0x31, 0xc0, 0x5f, 0x59, 0xe3, 0x04, 0xff, 0xe1, 0x5f, 0x59, 0xc3};
  auto code = x::stub_code();
  ASSERT_LE(x::Stub::kScratchSetup + sizeof kSetup, code.size());
  for (size_t i = 0; i < sizeof kSetup; ++i)
    EXPECT_EQ(static_cast<unsigned>(code[x::Stub::kScratchSetup + i]), unsigned{kSetup[i]}) << "byte " << i;
  EXPECT_EQ(x::Stub::kScratchSetup + sizeof kSetup, x::Stub::kThreadHook);
  EXPECT_EQ(x::Stub::kScratchSetup, 416u);
  EXPECT_EQ(x::Stub::kSetupStatus, 0x1010u);
}

// The thread trampoline's end, as reviewed in its disassembly (rbx = the
// block): hook_name (+0x58) and the handle (+0x30) non-zero, else straight
// to `done`; dlsym (+0x50) of it, and when found, the hook with hook_arg
// (+0x60), its int result sign-extended into hook_rc (+0x68); then done
// (+0x28) = 1, a NULL result, pop rbx, ret. int3 to the end of the block.
TEST(X86_64Stub, ThreadHookEncoding) {
  static constexpr uint8_t kHook[] = {
      0x48, 0x8b, 0x73, 0x58, 0x48, 0x85, 0xf6, 0x74, 0x1e, 0x48, 0x8b, 0x7b, 0x30, 0x48, 0x85, 0xff,
      0x74, 0x15, 0xff, 0x53, 0x50, 0x48, 0x85, 0xc0, 0x74, 0x0d, 0x48, 0x8b, 0x7b, 0x60, 0xff, 0xd0,
      0x48, 0x63, 0xc0, 0x48, 0x89, 0x43, 0x68, 0x48, 0xc7, 0x43, 0x28, 0x01, 0x00, 0x00, 0x00, 0x31,
      0xc0, 0x5b, 0xc3};
  auto code = x::stub_code();
  ASSERT_LE(x::Stub::kThreadHook + sizeof kHook, code.size());
  for (size_t i = 0; i < sizeof kHook; ++i)
    EXPECT_EQ(static_cast<unsigned>(code[x::Stub::kThreadHook + i]), unsigned{kHook[i]}) << "byte " << i;
  for (size_t i = x::Stub::kThreadHook + sizeof kHook; i < code.size(); ++i)
    EXPECT_EQ(static_cast<unsigned>(code[i]), 0xccu) << "byte " << i;
}

// The block's two symbols bracket exactly Stub::kSize bytes, 64-byte aligned
// as the agent's copy is, and stub_code() copies them.
TEST(X86_64Stub, BlockSymbolsSpanTheStub) {
  const auto begin = reinterpret_cast<uintptr_t>(remora_x86_64_stub);
  const auto end = reinterpret_cast<uintptr_t>(remora_x86_64_stub_end);
  EXPECT_EQ(end - begin, x::Stub::kSize);
  EXPECT_EQ(begin % 64, 0u);
  auto code = x::stub_code();
  EXPECT_EQ(std::memcmp(code.data(), remora_x86_64_stub, code.size()), 0);
}
#else
TEST(X86_64Stub, AssembledCode) {
  GTEST_SKIP() << "x86_64_stub.S is assembled on x86_64 hosts only; this host has no stub_code()";
}
#endif

}  // namespace
}  // namespace remora::arch
