// The scratch ownership marker and the reclaim decision, from tables: the
// header round trip, the maps layout that makes a candidate, the owner's
// state (pid reuse included) and the verdict for each combination of facts.
#include "remote/scratch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace remora::remote {
namespace {

std::vector<std::byte> bytes_of(const ScratchHeader& h) {
  std::vector<std::byte> b(sizeof h);
  std::memcpy(b.data(), &h, sizeof h);
  return b;
}

ScratchHeader header_at(uint64_t base) {
  ScratchHeader h;
  h.base = base;
  h.owner_pid = 4242;
  h.owner_start_time = 1000;
  h.owner_pidns_dev = 4;
  h.owner_pidns_ino = 0xeffffffc;
  return h;
}

TEST(ScratchHeader, RoundTripAndRejections) {
  const uint64_t base = 0x7f0000010000;
  auto h = header_at(base);
  auto parsed = parse_scratch_header(bytes_of(h), base);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->owner_pid, 4242);
  EXPECT_EQ(parsed->owner_start_time, 1000u);
  // A copy of a header elsewhere (the program copied our page) is no scratch.
  EXPECT_FALSE(parse_scratch_header(bytes_of(h), base + kPage).has_value());
  auto bad = h;
  bad.magic ^= 1;
  EXPECT_FALSE(parse_scratch_header(bytes_of(bad), base).has_value()) << "magic";
  bad = h;
  bad.version = kScratchVersion + 1;
  EXPECT_FALSE(parse_scratch_header(bytes_of(bad), base).has_value()) << "version";
  bad = h;
  bad.size = kScratchSize * 2;
  EXPECT_FALSE(parse_scratch_header(bytes_of(bad), base).has_value()) << "size";
  std::vector<std::byte> zeros(sizeof h);
  EXPECT_FALSE(parse_scratch_header(zeros, base).has_value()) << "a fresh zero page";
  const auto whole = bytes_of(h);
  EXPECT_FALSE(parse_scratch_header(std::span(whole).first(16), base).has_value()) << "short read";
}

TEST(ScratchHeader, BusyUntilTheStubEchoesTheCookie) {
  auto h = header_at(0x10000);
  EXPECT_FALSE(scratch_busy(h, 0)) << "no call made yet";
  h.call_cookie = 0x524d000000000007;
  EXPECT_TRUE(scratch_busy(h, 0)) << "call in flight";
  EXPECT_TRUE(scratch_busy(h, 0x524d000000000006)) << "the previous call's echo";
  EXPECT_FALSE(scratch_busy(h, h.call_cookie)) << "returned";
  // The layout the engine and the stub use: header, name, stubs in page 0.
  EXPECT_LE(sizeof(ScratchHeader), kScratchNameOffset);
  EXPECT_LT(kScratchNameOffset + sizeof("remora-scratch"), kScratchStub);
  EXPECT_EQ(kScratchStub % 64, 0u);
  EXPECT_EQ(kScratchEcho, kPage);
  EXPECT_GE(kScratchData, kScratchEcho + 16);
}

std::string maps_line(uint64_t start, uint64_t end, const char* perms, const char* path = "") {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%llx-%llx %s 00000000 00:00 0 %s\n", static_cast<unsigned long long>(start),
                static_cast<unsigned long long>(end), perms, path);
  return buf;
}

std::vector<procfs::MapEntry> maps_of(const std::string& text) {
  auto r = procfs::parse_maps(text);
  EXPECT_TRUE(r.ok());
  return r.ok() ? *r : std::vector<procfs::MapEntry>{};
}

// A scratch as the maps show it: code page R-X, the rest RW.
std::string scratch_lines(uint64_t b, const char* name = "") {
  return maps_line(b, b + kPage, "r-xp", name) + maps_line(b + kPage, b + kScratchSize, "rw-p", name);
}

TEST(ScratchCandidates, LayoutInTheMaps) {
  const uint64_t b1 = 0x7f0000100000, b2 = b1 - kScratchSize;
  // A complete one, and below it one whose controller died before its
  // mprotect: still R-X whole, merged by the kernel with b1's code page.
  std::string text = maps_line(0x400000, 0x401000, "r-xp") + maps_line(b2, b1 + kPage, "r-xp") +
                     maps_line(b1 + kPage, b1 + kScratchSize, "rw-p");
  auto c = scratch_candidates(maps_of(text));
  // Every page of the merged R-X mapping from which 64 KiB are anonymous:
  // b2 and b1 among them (the headers decide which are scratches).
  EXPECT_EQ(c.size(), 17u);
  EXPECT_NE(std::find(c.begin(), c.end(), b2), c.end());
  EXPECT_NE(std::find(c.begin(), c.end(), b1), c.end());
  EXPECT_EQ(scratch_candidates(maps_of(scratch_lines(b1, "[anon:remora-scratch]"))),
            std::vector<uint64_t>{b1});
  // Not candidates: file-backed data, a shared page, data too short,
  // another pseudo name.
  std::string file =
      maps_line(b1, b1 + kPage, "r-xp") + "7f0000101000-7f0000110000 rw-p 00000000 08:01 77 /usr/lib/x.so\n";
  EXPECT_TRUE(scratch_candidates(maps_of(file)).empty());
  std::string shared = maps_line(b1, b1 + kPage, "r-xs") + maps_line(b1 + kPage, b1 + kScratchSize, "rw-p");
  EXPECT_TRUE(scratch_candidates(maps_of(shared)).empty());
  std::string short_data = maps_line(b1, b1 + kPage, "r-xp") + maps_line(b1 + kPage, b1 + 8 * kPage, "rw-p");
  EXPECT_TRUE(scratch_candidates(maps_of(short_data)).empty());
  EXPECT_TRUE(scratch_candidates(maps_of(scratch_lines(b1, "[vdso]"))).empty());
  // A long R-X anonymous mapping (a JIT's code cache): its first page only.
  std::string jit = maps_line(b1, b1 + (kMaxScanPages + 1) * kPage, "r-xp");
  EXPECT_EQ(scratch_candidates(maps_of(jit)), std::vector<uint64_t>{b1});
}

TEST(ScratchOwner, StateFromPidAndStartTime) {
  const auto h = header_at(0x10000);
  const OwnerIdentity self{99, 5, 4, 0xeffffffc};
  OwnerIdentity other_ns = self;
  other_ns.pidns_ino = 0xefffff00;
  struct Case {
    const char* name;
    OwnerIdentity self;
    std::optional<uint64_t> live;
    bool failed;
    OwnerState want;
  } cases[] = {
      {"owner alive, same start time", self, 1000, false, OwnerState::kAlive},
      {"no such pid", self, std::nullopt, false, OwnerState::kGone},
      {"pid reused by a process started later", self, 1234, false, OwnerState::kReused},
      {"unreadable", self, std::nullopt, true, OwnerState::kUnknown},
      {"another pid namespace", other_ns, 1000, false, OwnerState::kUnknown},
  };
  for (const auto& c : cases) EXPECT_EQ(owner_state(h, c.self, c.live, c.failed), c.want) << c.name;
  auto no_pid = h;
  no_pid.owner_pid = 0;
  EXPECT_EQ(owner_state(no_pid, self, std::nullopt, false), OwnerState::kUnknown);
}

TEST(ScratchDecision, Table) {
  using O = OwnerState;
  using V = ScratchVerdict;
  struct Case {
    const char* name;
    ScratchFacts facts;
    V want;
  } cases[] = {
      {"owner alive, same start time: keep", {O::kAlive, false, true, false}, V::kKeepOwnerAlive},
      {"owner alive even with a thread inside", {O::kAlive, true, true, true}, V::kKeepOwnerAlive},
      {"owner dead: reclaim", {O::kGone, false, true, false}, V::kReclaim},
      {"owner pid reused (another start time): reclaim", {O::kReused, false, true, false}, V::kReclaim},
      {"owner unknown (other namespace): keep", {O::kUnknown, false, true, false}, V::kKeepOwnerUnknown},
      {"owner dead, busy: keep", {O::kGone, true, true, false}, V::kKeepBusy},
      {"pid reused, busy: keep", {O::kReused, true, true, false}, V::kKeepBusy},
      {"owner dead, thread pc inside: keep", {O::kGone, false, true, true}, V::kKeepThreadInside},
      {"owner dead, threads not examined: keep", {O::kGone, false, false, false}, V::kKeepThreadsUnknown},
  };
  for (const auto& c : cases) EXPECT_EQ(decide_scratch(c.facts), c.want) << c.name;
}

TEST(ScratchThreads, StackWordsIntoTheStubPage) {
  const uint64_t base = 0x7f0000100000;
  std::vector<uint64_t> words = {0, 0x401234, base - 8, base + kPage + 16, 7};
  auto bytes = [&] { return std::as_bytes(std::span(words)); };
  EXPECT_FALSE(words_point_into(bytes(), base, base + kPage));
  words.push_back(base + kScratchStub + 0x53);  // a return address into the call stub
  EXPECT_TRUE(words_point_into(bytes(), base, base + kPage));
}

// The busy word resolved with the survey: the call's thread gone, or
// unwound past the stub's stack pointer on the same stack, ends the call.
TEST(ScratchThreads, CallInFlight) {
  const uint64_t base = 0x7f0000100000;
  auto h = header_at(base);
  h.call_cookie = 0x524d000000000009;
  h.call_tid = 77;
  h.call_sp = 0x7ffd0000f000;
  auto thread = [&](pid_t tid, uint64_t pc, uint64_t sp) {
    ThreadSnapshot t;
    t.tid = tid;
    t.pc = pc;
    t.sp = sp;
    t.stack_lo = 0x7ffd00000000;
    t.stack_hi = 0x7ffd00021000;
    return t;
  };
  struct Case {
    const char* name;
    uint64_t echo;
    std::vector<ThreadSnapshot> threads;
    bool want;
  } cases[] = {
      {"echoed: over", h.call_cookie, {thread(77, 0x401000, 0x7ffd0000e000)}, false},
      {"thread gone: over", 0, {thread(78, 0x401000, 0x7ffd0000e000)}, false},
      {"still below the stub's frame: in flight", 0, {thread(77, 0x401000, 0x7ffd0000e000)}, true},
      {"unwound above it: over", 0, {thread(77, 0x401000, 0x7ffd00010000)}, false},
      {"pc in the stub: in flight", 0, {thread(77, base + kScratchStub + 16, 0x7ffd00010000)}, true},
  };
  for (const auto& c : cases) EXPECT_EQ(call_in_flight(h, c.echo, c.threads, base), c.want) << c.name;
  // On another stack (an alternate signal stack above): proves nothing.
  auto alt = thread(77, 0x401000, 0x7ffe00000100);
  alt.stack_lo = 0x7ffe00000000;
  alt.stack_hi = 0x7ffe00008000;
  EXPECT_TRUE(call_in_flight(h, 0, std::vector<ThreadSnapshot>{alt}, base));
  // thread_inside: a pc inside the mapping, or a return address into page 0.
  auto in_data = thread(5, base + kScratchData + 8, 0x7ffd0000e000);
  EXPECT_TRUE(thread_inside(std::vector<ThreadSnapshot>{in_data}, base));
  auto ret = thread(5, 0x401000, 0x7ffd0000e000);
  const uint64_t word = base + kScratchStub + 0x85;
  ret.stack.resize(64);
  std::memcpy(ret.stack.data() + 24, &word, 8);
  EXPECT_TRUE(thread_inside(std::vector<ThreadSnapshot>{ret}, base));
  EXPECT_FALSE(thread_inside(std::vector<ThreadSnapshot>{thread(5, 0x401000, 0x7ffd0000e000)}, base));
}

TEST(ScratchRanges, AdjacentOnesJoin) {
  const uint64_t b = 0x7f0000100000;
  auto r = coalesce_scratch({b + kScratchSize, b, b + 4 * kScratchSize, b});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].start, b);
  EXPECT_EQ(r[0].end, b + 2 * kScratchSize);
  EXPECT_EQ(r[1].start, b + 4 * kScratchSize);
  EXPECT_EQ(r[1].end, b + 5 * kScratchSize);
  EXPECT_TRUE(coalesce_scratch({}).empty());
}

// A fresh process as Debian's ld.so leaves it: the hole its unmapped
// ld.so.cache leaves among the libraries fits a scratch but not the loader
// stack below it; the hint goes under the lowest library instead.
TEST(ScratchHint, BelowTheLowestLibraryNotInASmallHole) {
  const std::string maps = maps_line(0x555555554000, 0x555555556000, "r-xp", "/usr/bin/app") +
                           maps_line(0x555555556000, 0x555555577000, "rw-p", "[heap]") +
                           maps_line(0x7ffff7d80000, 0x7ffff7da6000, "r--p", "/usr/lib/libm.so.6") +
                           maps_line(0x7ffff7dc0000, 0x7ffff7f9a000, "r-xp", "/usr/lib/libc.so.6") +
                           maps_line(0x7ffff7f9a000, 0x7ffff7fa0000, "rw-p") +
                           maps_line(0x7ffff7fc3000, 0x7ffff7ff0000, "r-xp", "/usr/lib/ld-linux.so.2") +
                           maps_line(0x7ffffffde000, 0x7ffffffff000, "rw-p", "[stack]") +
                           maps_line(0xffffffffff600000, 0xffffffffff601000, "--xp", "[vsyscall]");
  // The largest free range under [stack] is [heap]..libm; above it (the
  // stack's own range, and [vsyscall] beyond user space) never counts.
  EXPECT_EQ(scratch_address_hint(maps_of(maps)), 0x7ffff7d80000 - kScratchSize);
}

TEST(ScratchHint, NoneWithoutRoomOrWithoutAStack) {
  // No [stack] (a /proc view without it): no opinion.
  EXPECT_EQ(scratch_address_hint(maps_of(maps_line(0x10000, 0x20000, "r-xp", "/bin/x"))), 0u);
  // Every free range smaller than the scratch and its room.
  const uint64_t room = kScratchRoom + kScratchSize;
  const std::string tight = maps_line(0x100000, 0x200000, "r-xp", "/bin/x") +
                            maps_line(0x200000 + room - kPage, 0x300000 + room, "rw-p") +
                            maps_line(0x300000 + room, 0x301000 + room, "rw-p", "[stack]");
  EXPECT_EQ(scratch_address_hint(maps_of(tight)), 0u);
  // Just enough room: the hint is the scratch's size below the range's top.
  const std::string fits = maps_line(0x100000, 0x200000, "r-xp", "/bin/x") +
                           maps_line(0x200000 + room, 0x300000 + room, "rw-p") +
                           maps_line(0x300000 + room, 0x301000 + room, "rw-p", "[stack]");
  EXPECT_EQ(scratch_address_hint(maps_of(fits)), 0x200000 + room - kScratchSize);
  EXPECT_EQ(scratch_address_hint({}), 0u);
}

}  // namespace
}  // namespace remora::remote
