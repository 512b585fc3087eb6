// Table tests of the socket channel's wake rules (arch/wake_rules.h), for
// both architectures on any host: which interrupted context may start the
// channel thread, how an interrupted wait is re-issued, the /proc syscall
// line. The controller's side (endpoint, thread choice) is tested in
// src/attach/channel_test.cc.
#include "arch/wake_rules.h"

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace remora::arch::wake {
namespace {

namespace w = remora::arch::wake;

// ---- decode_nr_x86: the bytes glibc 2.36 puts before its `syscall` ----

struct DecodeCase {
  const char* what;
  std::vector<uint8_t> bytes;
  long want;
};

long decode(const std::vector<uint8_t>& b) { return w::decode_nr_x86(b.data(), static_cast<int>(b.size())); }

TEST(DecodeNrX86, GlibcWrappers) {
  const DecodeCase cases[] = {
      {"epoll_wait: mov $0xe8,%eax; syscall", {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05}, 232},
      {"epoll_wait, cancellable: mov 0x10(%rsp),%rsi; mov 0xc(%rsp),%edi; mov $0xe8,%eax; syscall",
       {0x48, 0x8b, 0x74, 0x24, 0x10, 0x8b, 0x7c, 0x24, 0x0c, 0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05},
       232},
      {"epoll_pwait: mov $0x8,%r9d; mov $0x119,%eax; syscall",
       {0x41, 0xb9, 0x08, 0x00, 0x00, 0x00, 0xb8, 0x19, 0x01, 0x00, 0x00, 0x0f, 0x05},
       281},
      {"epoll_pwait, cancellable: mov $0x119,%eax; mov 0x4(%rsp),%edi; syscall",
       {0xb8, 0x19, 0x01, 0x00, 0x00, 0x8b, 0x7c, 0x24, 0x04, 0x0f, 0x05},
       281},
      {"clock_nanosleep: mov $0xe6,%eax; syscall", {0xb8, 0xe6, 0x00, 0x00, 0x00, 0x0f, 0x05}, 230},
      {"clock_nanosleep: mov $0xe6,%eax; mov (%rsp),%edi; syscall",
       {0xb8, 0xe6, 0x00, 0x00, 0x00, 0x8b, 0x3c, 0x24, 0x0f, 0x05},
       230},
      {"clock_nanosleep, cancellable: mov 0xc(%rsp),%esi; mov (%rsp),%edi; mov $0xe6,%eax; syscall",
       {0x8b, 0x74, 0x24, 0x0c, 0x8b, 0x3c, 0x24, 0xb8, 0xe6, 0x00, 0x00, 0x00, 0x0f, 0x05},
       230},
      {"a REX move after the number: mov $0xe6,%eax; mov %r8d,%edx; syscall",
       {0xb8, 0xe6, 0x00, 0x00, 0x00, 0x44, 0x89, 0xc2, 0x0f, 0x05},
       230},
      {"a 5-byte REX move: mov $0xe8,%eax; mov 0x8(%rsp),%r10; syscall",
       {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x4c, 0x8b, 0x54, 0x24, 0x08, 0x0f, 0x05},
       232},
      {"poll: mov $0x7,%eax; syscall", {0xb8, 0x07, 0x00, 0x00, 0x00, 0x0f, 0x05}, 7},
      {"poll, cancellable: mov %eax,%r8d; mov 0x8(%rsp),%rdi; mov $0x7,%eax; syscall",
       {0x41, 0x89, 0xc0, 0x48, 0x8b, 0x7c, 0x24, 0x08, 0xb8, 0x07, 0x00, 0x00, 0x00, 0x0f, 0x05},
       7},
      {"ppoll: mov %r12,%rdx; mov $0x10f,%eax; syscall",
       {0x4c, 0x89, 0xe2, 0xb8, 0x0f, 0x01, 0x00, 0x00, 0x0f, 0x05},
       271},
      {"select (pselect6): mov %ebx,%edi; mov $0x10e,%eax; syscall",
       {0x89, 0xdf, 0xb8, 0x0e, 0x01, 0x00, 0x00, 0x0f, 0x05},
       270},
      {"pause: mov %eax,%edi; mov $0x22,%eax; syscall",
       {0x89, 0xc7, 0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05},
       34},
      {"the largest number taken", {0xb8, 0x00, 0x04, 0x00, 0x00, 0x0f, 0x05}, 1024},
  };
  for (const DecodeCase& c : cases) EXPECT_EQ(decode(c.bytes), c.want) << c.what;
}

TEST(DecodeNrX86, ReadClearsEax) {
  const DecodeCase cases[] = {
      {"read: xor %eax,%eax; syscall",
       {0x80, 0x3d, 0x31, 0x33, 0x0e, 0x00, 0x00, 0x74, 0x17, 0x31, 0xc0, 0x0f, 0x05},
       0},
      {"read, cancellable: mov %eax,%r8d; mov 0x8(%rsp),%edi; xor %eax,%eax; syscall",
       {0x00, 0x00, 0x00, 0x41, 0x89, 0xc0, 0x8b, 0x7c, 0x24, 0x08, 0x31, 0xc0, 0x0f, 0x05},
       0},
      {"xor %eax,%eax; mov 0x8(%rsp),%edi; syscall",
       {0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x31, 0xc0, 0x8b, 0x7c, 0x24, 0x08, 0x0f, 0x05},
       0},
      {"mov $0xe8,%eax; xor %eax,%eax; syscall (eax cleared after the load)",
       {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x31, 0xc0, 0x0f, 0x05},
       0},
  };
  for (const DecodeCase& c : cases) EXPECT_EQ(decode(c.bytes), c.want) << c.what;
}

TEST(DecodeNrX86, NoLoadOfEaxGivesMinusOne) {
  const DecodeCase cases[] = {
      {"xor %eax,%eax; syscall alone (too short to tell)", {0x31, 0xc0, 0x0f, 0x05}, -1},
      {"xor %ecx,%ecx: not eax", {0x90, 0x90, 0x90, 0x90, 0x90, 0x31, 0xc9, 0x0f, 0x05}, -1},
      {"xor %eax,%eax, then six bytes", {0x31, 0xc0, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x0f, 0x05}, -1},
      {"six bytes between the load and the syscall",
       {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x0f, 0x05},
       -1},
      {"a lone REX prefix in the gap", {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x48, 0x0f, 0x05}, -1},
      {"a move opcode with no operand byte", {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x89, 0x0f, 0x05}, -1},
      {"not a move in the gap: add %eax,%ecx", {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x01, 0xc1, 0x0f, 0x05}, -1},
      {"no syscall at the end", {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x04}, -1},
      {"syscall not last", {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x90}, -1},
      {"too short for a load", {0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05}, -1},
      {"an immediate above 1024", {0xb8, 0x01, 0x04, 0x00, 0x00, 0x0f, 0x05}, -1},
      {"an immediate of -1", {0xb8, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x05}, -1},
      {"garbage",
       {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x0f, 0x05},
       -1},
      {"all zero", std::vector<uint8_t>(16, 0), -1},
  };
  for (const DecodeCase& c : cases) EXPECT_EQ(decode(c.bytes), c.want) << c.what;
  EXPECT_EQ(w::decode_nr_x86(nullptr, 0), -1);
}

// ---- judge: the verdict on the interrupted context ----

constexpr int64_t kEintr = -4;
constexpr uint64_t kFutexPrivate = 128, kFutexClockRealtime = 256;

// The 16 bytes before pc: `bytes` right-aligned, nops before them.
void set_before(w::Context* c, std::initializer_list<uint8_t> bytes) {
  std::memset(c->before, 0x90, sizeof c->before);
  std::memcpy(c->before + sizeof c->before - bytes.size(), bytes.begin(), bytes.size());
}

void set_at(w::Context* c, std::initializer_list<uint8_t> bytes) {
  std::memset(c->at, 0x90, sizeof c->at);
  std::memcpy(c->at, bytes.begin(), bytes.size());
}

// An x86_64 thread in libc (not the program's code), with code readable.
w::Context x86(uint64_t rax, std::initializer_list<uint8_t> before, std::initializer_list<uint8_t> at) {
  w::Context c{};
  c.arch = w::Arch::kX86_64;
  c.pc = 0x7f0000001000;
  c.ret = static_cast<int64_t>(rax);
  c.nr_reg = rax;
  c.has_code = true;
  set_before(&c, before);
  set_at(&c, at);
  return c;
}

// At a `syscall` instruction (restarted by the kernel, or about to run).
w::Context x86_at_syscall(long nr, uint64_t arg1 = 0, uint64_t arg3 = 0) {
  w::Context c = x86(static_cast<uint64_t>(nr), {0x90}, {0x0f, 0x05, 0x48, 0x3d});
  c.args[1] = arg1;
  c.args[3] = arg3;
  return c;
}

// The same futex wait, on a word that holds glibc's "locked, with waiters".
w::Context futex_on_lock_word(w::Context c) {
  c.args[2] = w::kGlibcLockWaitValue;
  return c;
}

// Right after a `syscall` that returned EINTR; `before` ends in 0f 05.
w::Context x86_eintr(std::initializer_list<uint8_t> before) {
  return x86(static_cast<uint64_t>(kEintr), before, {0x48, 0x3d, 0x00, 0xf0});  // cmp $-0x1000,%rax
}

struct Judged {
  w::Verdict verdict;
  long nr;
};

Judged judge(const w::Context& c) {
  long nr = 12345;
  const w::Verdict v = w::judge(c, &nr);
  return {v, nr};
}

const char* name(w::Verdict v) {
  switch (v) {
    case w::Verdict::kStartHere: return "start here";
    case w::Verdict::kRepairAndStart: return "repair and start";
    case w::Verdict::kForward: return "forward";
  }
  return "?";
}

struct JudgeCase {
  const char* what;
  w::Context context;
  w::Verdict want;
  long want_nr;  // the repair's number (-1 unless a repair)
};

void expect_judged(const JudgeCase& c) {
  const Judged j = judge(c.context);
  EXPECT_EQ(j.verdict, c.want) << c.what << ": got " << name(j.verdict) << ", want " << name(c.want);
  EXPECT_EQ(j.nr, c.want_nr) << c.what;
}

TEST(JudgeX86, RestartedCallsAtTheSyscallInstruction) {
  const JudgeCase cases[] = {
      {"read", x86_at_syscall(0), w::Verdict::kStartHere, -1},
      {"readv", x86_at_syscall(19), w::Verdict::kStartHere, -1},
      {"recvmsg", x86_at_syscall(47), w::Verdict::kStartHere, -1},
      {"accept4", x86_at_syscall(288), w::Verdict::kStartHere, -1},
      {"wait4", x86_at_syscall(61), w::Verdict::kStartHere, -1},
      {"waitid", x86_at_syscall(247), w::Verdict::kStartHere, -1},
      {"futex wait, no timeout", x86_at_syscall(202, 0 | kFutexPrivate, 0), w::Verdict::kStartHere, -1},
      {"futex wait-bitset, realtime clock, no timeout",
       x86_at_syscall(202, 9 | kFutexPrivate | kFutexClockRealtime, 0), w::Verdict::kStartHere, -1},
      {"futex wait with a timeout", x86_at_syscall(202, 0 | kFutexPrivate, 0x7ffd0000), w::Verdict::kForward,
       -1},
      {"futex wait-bitset with a timeout", x86_at_syscall(202, 9, 0x7ffd0000), w::Verdict::kForward, -1},
      {"futex wake", x86_at_syscall(202, 1 | kFutexPrivate, 0), w::Verdict::kForward, -1},
      {"futex lock-pi", x86_at_syscall(202, 6, 0), w::Verdict::kForward, -1},
      {"futex wait on a glibc lock word (2: locked, waiters)",
       futex_on_lock_word(x86_at_syscall(202, 0 | kFutexPrivate, 0)), w::Verdict::kForward, -1},
      {"epoll_wait at its syscall instruction", x86_at_syscall(232), w::Verdict::kForward, -1},
      {"poll at its syscall instruction", x86_at_syscall(7), w::Verdict::kForward, -1},
      {"clock_nanosleep at its syscall instruction", x86_at_syscall(230), w::Verdict::kForward, -1},
      {"write", x86_at_syscall(1), w::Verdict::kForward, -1},
      {"aarch64's read number (63) on x86_64", x86_at_syscall(63), w::Verdict::kForward, -1},
  };
  for (const JudgeCase& c : cases) expect_judged(c);
}

TEST(JudgeX86, EintrAfterADecodableWaitIsRepaired) {
  const JudgeCase cases[] = {
      {"epoll_wait", x86_eintr({0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kRepairAndStart, 232},
      {"epoll_pwait, cancellable",
       x86_eintr({0xb8, 0x19, 0x01, 0x00, 0x00, 0x8b, 0x7c, 0x24, 0x04, 0x0f, 0x05}),
       w::Verdict::kRepairAndStart, 281},
      {"clock_nanosleep", x86_eintr({0xb8, 0xe6, 0x00, 0x00, 0x00, 0x8b, 0x3c, 0x24, 0x0f, 0x05}),
       w::Verdict::kRepairAndStart, 230},
      {"poll", x86_eintr({0xb8, 0x07, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kRepairAndStart, 7},
      {"nanosleep", x86_eintr({0xb8, 0x23, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kRepairAndStart, 35},
      {"ppoll", x86_eintr({0x4c, 0x89, 0xe2, 0xb8, 0x0f, 0x01, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kRepairAndStart, 271},
      {"pselect6", x86_eintr({0x89, 0xdf, 0xb8, 0x0e, 0x01, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kRepairAndStart, 270},
      {"pause", x86_eintr({0x89, 0xc7, 0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kRepairAndStart, 34},
      {"futex (a wait with a timeout)", x86_eintr({0xb8, 0xca, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kRepairAndStart, 202},
  };
  for (const JudgeCase& c : cases) expect_judged(c);
}

TEST(JudgeX86, EintrAfterAnUndecodableOrOtherCallIsForwarded) {
  const JudgeCase cases[] = {
      {"read: xor %eax,%eax", x86_eintr({0x8b, 0x7c, 0x24, 0x08, 0x31, 0xc0, 0x0f, 0x05}),
       w::Verdict::kForward, -1},
      {"write: not a wait", x86_eintr({0xb8, 0x01, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kForward, -1},
      {"garbage before the syscall", x86_eintr({0x12, 0x34, 0x56, 0x0f, 0x05}), w::Verdict::kForward, -1},
  };
  for (const JudgeCase& c : cases) expect_judged(c);
  // The same EINTR in the program's own code: still forwarded (the wait's
  // number is what decides, not where it is).
  w::Context in_program = x86_eintr({0x31, 0xc0, 0x0f, 0x05});
  in_program.pc_in_program = true;
  expect_judged({"read's EINTR in program code", in_program, w::Verdict::kForward, -1});
}

// Right after a `syscall` that completed: rax holds its result, the bytes
// before pc name it.
w::Context x86_returned(int64_t result, std::initializer_list<uint8_t> before) {
  w::Context c = x86(static_cast<uint64_t>(result), before, {0x48, 0x3d, 0x00, 0xf0});
  return c;
}

TEST(JudgeX86, JustBackFromACompletedCall) {
  const JudgeCase cases[] = {
      {"read returned 5", x86_returned(5, {0x8b, 0x7c, 0x24, 0x08, 0x31, 0xc0, 0x0f, 0x05}),
       w::Verdict::kStartHere, -1},
      {"write returned 5", x86_returned(5, {0xb8, 0x01, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kStartHere, -1},
      {"sendmsg returned 5", x86_returned(5, {0xb8, 0x2e, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kStartHere, -1},
      {"connect returned 0", x86_returned(0, {0xb8, 0x2a, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kStartHere, -1},
      {"epoll_wait returned 0", x86_returned(0, {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kStartHere, -1},
      {"read failed EAGAIN", x86_returned(-11, {0x31, 0xc0, 0x0f, 0x05}), w::Verdict::kStartHere, -1},
      {"mmap returned an address", x86_returned(0x7f0000000000, {0xb8, 0x09, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kForward, -1},
      {"munmap returned 0", x86_returned(0, {0xb8, 0x0b, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kForward,
       -1},
      {"mprotect returned 0", x86_returned(0, {0xb8, 0x0a, 0x00, 0x00, 0x00, 0x0f, 0x05}),
       w::Verdict::kForward, -1},
      {"brk", x86_returned(0x560000000000, {0xb8, 0x0c, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kForward,
       -1},
      {"an undecodable call", x86_returned(0, {0x48, 0x89, 0xf8, 0x0f, 0x05}), w::Verdict::kForward, -1},
      // Its arguments are gone, and fork's unlock of the malloc arenas wakes
      // waiters while it still holds some.
      {"futex returned 0", x86_returned(0, {0xb8, 0xca, 0x00, 0x00, 0x00, 0x0f, 0x05}), w::Verdict::kForward,
       -1},
  };
  for (const JudgeCase& c : cases) expect_judged(c);
  // The call decides, not where it was made.
  w::Context mmap_in_program = x86_returned(0x7f0000000000, {0xb8, 0x09, 0x00, 0x00, 0x00, 0x0f, 0x05});
  mmap_in_program.pc_in_program = true;
  expect_judged({"mmap made by the program", mmap_in_program, w::Verdict::kForward, -1});
}

TEST(JudgeX86, ProgramCodeOrNot) {
  w::Context program = x86(0x1234, {0x48, 0x01, 0xc8}, {0x48, 0x83, 0xc1, 0x01});
  program.pc_in_program = true;
  expect_judged({"compute loop in the program", program, w::Verdict::kStartHere, -1});
  w::Context lib = program;
  lib.pc_in_program = false;
  expect_judged({"the same code in libc", lib, w::Verdict::kForward, -1});
  // EINTR with no syscall instruction right before pc: only a value.
  w::Context eintr_value = x86(static_cast<uint64_t>(kEintr), {0x48, 0x89, 0xc7}, {0x90});
  expect_judged({"-4 in rax, no syscall before", eintr_value, w::Verdict::kForward, -1});
  eintr_value.pc_in_program = true;
  expect_judged({"-4 in rax in the program", eintr_value, w::Verdict::kStartHere, -1});
}

TEST(JudgeX86, NoCodeReadable) {
  w::Context c = x86_at_syscall(0);  // what the bytes would say is not looked at
  c.has_code = false;
  expect_judged({"outside every recorded object, not program", c, w::Verdict::kForward, -1});
  c.pc_in_program = true;
  expect_judged({"program, code unreadable", c, w::Verdict::kStartHere, -1});
  w::Context eintr = x86_eintr({0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05});
  eintr.has_code = false;
  expect_judged({"an EINTR nobody can decode", eintr, w::Verdict::kForward, -1});
}

TEST(JudgeX86, InAProgramHandlerAlwaysForwards) {
  w::Context cases[] = {x86_at_syscall(0), x86_eintr({0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05}),
                        x86(0x1234, {0x90}, {0x90})};
  cases[2].pc_in_program = true;
  for (w::Context& c : cases) {
    c.in_program_handler = true;
    expect_judged({"inside a handler of the program's", c, w::Verdict::kForward, -1});
    c.has_code = false;
    c.pc_in_program = true;
    expect_judged({"inside a handler, no code", c, w::Verdict::kForward, -1});
  }
}

// aarch64: `svc #0` is d4000001, little-endian in memory.
w::Context a64(uint64_t x8, std::initializer_list<uint8_t> before, std::initializer_list<uint8_t> at) {
  w::Context c{};
  c.arch = w::Arch::kAarch64;
  c.pc = 0xffff80001000;
  c.ret = 3;  // x0: the first argument until the call returns
  c.nr_reg = x8;
  c.args[0] = 3;
  c.has_code = true;
  set_before(&c, before);
  set_at(&c, at);
  return c;
}

w::Context a64_at_svc(long nr, uint64_t arg1 = 0, uint64_t arg3 = 0) {
  w::Context c = a64(static_cast<uint64_t>(nr), {0xe8, 0x07, 0x80, 0xd2}, {0x01, 0x00, 0x00, 0xd4});
  c.args[1] = arg1;
  c.args[3] = arg3;
  return c;
}

TEST(JudgeAarch64, RestartedCallsAtSvc) {
  const JudgeCase cases[] = {
      {"read", a64_at_svc(63), w::Verdict::kStartHere, -1},
      {"readv", a64_at_svc(65), w::Verdict::kStartHere, -1},
      {"recvfrom", a64_at_svc(207), w::Verdict::kStartHere, -1},
      {"accept", a64_at_svc(202), w::Verdict::kStartHere, -1},
      {"accept4", a64_at_svc(242), w::Verdict::kStartHere, -1},
      {"wait4", a64_at_svc(260), w::Verdict::kStartHere, -1},
      {"futex wait, no timeout", a64_at_svc(98, 0 | kFutexPrivate, 0), w::Verdict::kStartHere, -1},
      {"futex wait with a timeout", a64_at_svc(98, 0 | kFutexPrivate, 0xffffd000), w::Verdict::kForward, -1},
      {"futex wait on a glibc lock word", futex_on_lock_word(a64_at_svc(98, 0 | kFutexPrivate, 0)),
       w::Verdict::kForward, -1},
      {"ppoll", a64_at_svc(73), w::Verdict::kForward, -1},
      {"epoll_pwait", a64_at_svc(22), w::Verdict::kForward, -1},
      {"clock_nanosleep", a64_at_svc(115), w::Verdict::kForward, -1},
      {"x86_64's read number (0: io_setup here)", a64_at_svc(0), w::Verdict::kForward, -1},
      {"x86_64's futex number (202: accept here)", a64_at_svc(202), w::Verdict::kStartHere, -1},
  };
  for (const JudgeCase& c : cases) expect_judged(c);
}

TEST(JudgeAarch64, JustOutOfACallIsNeverRepaired) {
  for (long nr : {73L, 22L, 115L, 101L, 98L, 63L}) {
    w::Context c = a64(static_cast<uint64_t>(nr), {0x01, 0x00, 0x00, 0xd4}, {0x1f, 0x04, 0x40, 0xb1});
    c.ret = kEintr;
    expect_judged({"svc right before pc, EINTR", c, w::Verdict::kForward, -1});
    c.pc_in_program = true;  // a raw svc in the program: still not known safe
    expect_judged({"svc right before pc in the program", c, w::Verdict::kForward, -1});
  }
}

TEST(JudgeAarch64, JustBackFromACompletedCall) {
  struct Case {
    const char* what;
    long x8;
    w::Verdict want;
  };
  const Case cases[] = {
      {"read", 63, w::Verdict::kStartHere},     {"write", 64, w::Verdict::kStartHere},
      {"recvmsg", 212, w::Verdict::kStartHere}, {"sendto", 206, w::Verdict::kStartHere},
      {"ppoll", 73, w::Verdict::kStartHere},    {"mmap", 222, w::Verdict::kForward},
      {"munmap", 215, w::Verdict::kForward},    {"mprotect", 226, w::Verdict::kForward},
      {"brk", 214, w::Verdict::kForward},       {"x86_64's write number (1)", 1, w::Verdict::kForward},
      {"futex", 98, w::Verdict::kForward},
  };
  for (const Case& k : cases) {
    w::Context c = a64(static_cast<uint64_t>(k.x8), {0x01, 0x00, 0x00, 0xd4}, {0x1f, 0x04, 0x40, 0xb1});
    c.ret = 5;
    expect_judged({k.what, c, k.want, -1});
  }
}

TEST(JudgeAarch64, ProgramCodeOrNot) {
  w::Context c = a64(0, {0x00, 0x04, 0x00, 0x91}, {0x1f, 0x20, 0x03, 0xd5});  // add x0,x0,#1; nop
  c.pc_in_program = true;
  expect_judged({"program code", c, w::Verdict::kStartHere, -1});
  c.pc_in_program = false;
  expect_judged({"library code", c, w::Verdict::kForward, -1});
  c.has_code = false;
  expect_judged({"no code, not program", c, w::Verdict::kForward, -1});
  c.pc_in_program = true;
  expect_judged({"no code, program", c, w::Verdict::kStartHere, -1});
  // x86_64's syscall bytes mean nothing here.
  w::Context x86_bytes = a64(0, {0xb8, 0xe8, 0x00, 0x00, 0x00, 0x0f, 0x05}, {0x0f, 0x05, 0x90, 0x90});
  x86_bytes.ret = kEintr;
  expect_judged({"x86 bytes on aarch64", x86_bytes, w::Verdict::kForward, -1});
}

TEST(JudgeAarch64, InAProgramHandlerAlwaysForwards) {
  w::Context c = a64_at_svc(63);
  c.in_program_handler = true;
  c.pc_in_program = true;
  expect_judged({"restartable read inside a handler", c, w::Verdict::kForward, -1});
}

// ---- repair_x86 ----

constexpr uint64_t kPc = 0x7f0000001000;

w::Context repair_context(uint64_t a0, uint64_t a1, uint64_t a2, uint64_t a3) {
  w::Context c = x86_eintr({0x0f, 0x05});
  c.pc = kPc;
  c.args[0] = a0;
  c.args[1] = a1;
  c.args[2] = a2;
  c.args[3] = a3;
  return c;
}

TEST(RepairX86, RewindsOntoTheSyscallWithItsNumber) {
  const w::Repair r = w::repair_x86(repair_context(5, 0x7ffd1000, 16, 1000), 232);
  EXPECT_EQ(r.pc, kPc - 2);
  EXPECT_EQ(r.rax, 232u);
  EXPECT_EQ(r.arg_changed, -1) << "epoll_wait starts its timeout again";
  for (long nr : {7L, 271L, 270L, 34L, 202L, 281L}) {
    const w::Repair o = w::repair_x86(repair_context(1, 2, 3, 4), nr);
    EXPECT_EQ(o.pc, kPc - 2);
    EXPECT_EQ(o.rax, static_cast<uint64_t>(nr));
    EXPECT_EQ(o.arg_changed, -1) << nr;
  }
}

TEST(RepairX86, NanosleepSleepsWhatWasLeft) {
  const w::Repair r = w::repair_x86(repair_context(0x7ffd1000, 0x7ffd2000, 0, 0), 35);
  EXPECT_EQ(r.rax, 35u);
  EXPECT_EQ(r.arg_changed, 0) << "req = rem";
  EXPECT_EQ(r.arg_value, 0x7ffd2000u);
  // sleep(3) passes the same timespec as both.
  const w::Repair same = w::repair_x86(repair_context(0x7ffd1000, 0x7ffd1000, 0, 0), 35);
  EXPECT_EQ(same.arg_changed, 0);
  EXPECT_EQ(same.arg_value, 0x7ffd1000u);
  const w::Repair no_rem = w::repair_x86(repair_context(0x7ffd1000, 0, 0, 0), 35);
  EXPECT_EQ(no_rem.arg_changed, -1) << "no rem: the whole time again";
}

TEST(RepairX86, ClockNanosleepRelativeOrAbsolute) {
  // clock_nanosleep(clock, flags, req, rem)
  const w::Repair rel = w::repair_x86(repair_context(1, 0, 0x7ffd1000, 0x7ffd2000), 230);
  EXPECT_EQ(rel.rax, 230u);
  EXPECT_EQ(rel.arg_changed, 2) << "req = rem";
  EXPECT_EQ(rel.arg_value, 0x7ffd2000u);
  const w::Repair rel_no_rem = w::repair_x86(repair_context(1, 0, 0x7ffd1000, 0), 230);
  EXPECT_EQ(rel_no_rem.arg_changed, -1);
  const w::Repair abs = w::repair_x86(repair_context(0, 1, 0x7ffd1000, 0x7ffd2000), 230);
  EXPECT_EQ(abs.arg_changed, -1) << "TIMER_ABSTIME: the same deadline again";
  EXPECT_EQ(abs.pc, kPc - 2);
  // The rem of clock_nanosleep is not nanosleep's: arg 1 is flags there.
  const w::Repair flags_not_rem = w::repair_x86(repair_context(1, 0x7ffd3000, 0x7ffd1000, 0), 230);
  EXPECT_EQ(flags_not_rem.arg_changed, -1);
}

// ---- parse_syscall_line ----

w::SyscallLine parse(const std::string& s) {
  return w::parse_syscall_line(s.data(), static_cast<int>(s.size()));
}

TEST(ParseSyscallLine, WellFormed) {
  const w::SyscallLine running = parse("running\n");
  EXPECT_TRUE(running.ok);
  EXPECT_TRUE(running.running);
  const w::SyscallLine outside = parse("-1 0x7ffd 0x4011\n");
  EXPECT_TRUE(outside.ok);
  EXPECT_FALSE(outside.running);
  EXPECT_EQ(outside.nr, -1);
  const w::SyscallLine poll = parse("7 0x7f12 0x1 0x50 0x0 0x0 0x0 0x7ff 0x401\n");
  ASSERT_TRUE(poll.ok);
  EXPECT_FALSE(poll.running);
  EXPECT_EQ(poll.nr, 7);
  const uint64_t want[6] = {0x7f12, 0x1, 0x50, 0, 0, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(poll.args[i], want[i]) << i;
  const w::SyscallLine read = parse("0 0x3 0x7ffc8a00 0x1 0x0 0x0 0x0 0x7ffc89f0 0x7f3b2c1b4a7d");
  ASSERT_TRUE(read.ok) << "no newline at the end";
  EXPECT_EQ(read.nr, 0);
  EXPECT_EQ(read.args[0], 3u);
  EXPECT_EQ(read.args[1], 0x7ffc8a00u);
  const w::SyscallLine futex = parse("202 0x55d0c0a0 0x80 0x0 0x0 0x0 0xffffffff 0x7ffe 0x7f00\n");
  ASSERT_TRUE(futex.ok);
  EXPECT_EQ(futex.nr, 202);
  EXPECT_EQ(futex.args[1], 0x80u);
  EXPECT_EQ(futex.args[3], 0u);
  EXPECT_EQ(futex.args[5], 0xffffffffu);
  const w::SyscallLine big = parse("441 0xffffffffffffffff 0x0 0x0 0x0 0x0 0x0 0x0 0x0\n");
  ASSERT_TRUE(big.ok);
  EXPECT_EQ(big.args[0], ~uint64_t{0});
}

TEST(ParseSyscallLine, Malformed) {
  const char* const bad[] = {
      "",
      "\n",
      "run",  // too short for "running"
      "garbage",
      "-1 0x7ffd\n",                            // two fields
      "-1 0x7ffd 0x4011 0x1\n",                 // four for a thread outside a call
      "7 0x7f12 0x1\n",                         // three fields for a call
      "7 0x7f12 0x1 0x50 0x0 0x0 0x0 0x7ff\n",  // eight
      "7 0xzz 0x1 0x50 0x0 0x0 0x0 0x7ff 0x401\n",
      "7 0x 0x1 0x50 0x0 0x0 0x0 0x7ff 0x401\n",
      "- 0x1 0x2\n",
      "x7 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8\n",
  };
  for (const char* s : bad) EXPECT_FALSE(parse(s).ok) << "'" << s << "'";
  // Only `len` bytes are read.
  const std::string full = "7 0x7f12 0x1 0x50 0x0 0x0 0x0 0x7ff 0x401\n";
  EXPECT_FALSE(w::parse_syscall_line(full.data(), 12).ok);
  EXPECT_FALSE(w::parse_syscall_line("running", 3).ok);
}

}  // namespace
}  // namespace remora::arch::wake
