// The stack-room decision (remote/stack_room.h) from tables of maps, as
// /proc/PID/maps shows them: a pthread stack above its guard page, a JVM
// thread's stack above HotSpot's PROT_NONE zones, a stack pointer into a
// hole or into read-only memory, runs of adjacent mappings; and the memory
// of safe ranges.
#include "remote/stack_room.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "procfs/procfs.h"

namespace remora::remote {
namespace {

std::vector<procfs::MapEntry> maps_of(std::string_view text) {
  auto m = procfs::parse_maps(text);
  EXPECT_TRUE(m.ok());
  return m.ok() ? *m : std::vector<procfs::MapEntry>{};
}

// A pthread stack: glibc's guard page, then the stack.
constexpr std::string_view kPthread =
    "7f0000000000-7f0000001000 ---p 00000000 00:00 0 \n"
    "7f0000001000-7f0000801000 rw-p 00000000 00:00 0 \n"
    "7f0000801000-7f0000802000 r--p 00000000 fe:00 42    /usr/lib/x86_64-linux-gnu/libz.so.1\n";

TEST(StackRoom, RoomAboveTheGuardIsSafe) {
  auto maps = maps_of(kPthread);
  const uint64_t sp = 0x7f0000800000;
  auto v = judge_stack_range(maps, sp - 16 * 1024, sp);
  EXPECT_EQ(v.room, StackRoom::kSafe);
  EXPECT_EQ(v.run_lo, 0x7f0000001000u);
  EXPECT_EQ(v.run_hi, 0x7f0000801000u);
}

TEST(StackRoom, RangeReachingIntoTheGuardIsNot) {
  auto maps = maps_of(kPthread);
  // sp 2 KiB above the guard: a 16 KiB range reaches 14 KiB into it and below.
  const uint64_t sp = 0x7f0000001800;
  auto v = judge_stack_range(maps, sp - 16 * 1024, sp);
  EXPECT_EQ(v.room, StackRoom::kNotWritable);
  EXPECT_EQ(v.at, 0x7f0000001000u);  // 2 KiB of room
  EXPECT_NE(describe_stack_verdict(v, sp).find("2.0 KiB"), std::string::npos) << describe_stack_verdict(v, sp);
  // The range ending exactly at the guard's top is safe.
  EXPECT_EQ(judge_stack_range(maps, 0x7f0000001000, sp).room, StackRoom::kSafe);
  EXPECT_EQ(judge_stack_range(maps, 0x7f0000000fff, sp).room, StackRoom::kNotWritable);
}

TEST(StackRoom, StackPointerInsideAGuardOrAHole) {
  auto maps = maps_of(kPthread);
  EXPECT_EQ(judge_stack_range(maps, 0x7f0000000100, 0x7f0000000800).room, StackRoom::kNotWritable);
  // Below every mapping, and in the hole above the library.
  auto hole = judge_stack_range(maps, 0x7e0000000000, 0x7e0000004000);
  EXPECT_EQ(hole.room, StackRoom::kUnmapped);
  EXPECT_EQ(hole.at, 0x7e0000004000u);
  EXPECT_EQ(judge_stack_range(maps, 0x7f0000900000, 0x7f0000904000).room, StackRoom::kUnmapped);
  // Read-only memory (a stack pointer into a library's data).
  EXPECT_EQ(judge_stack_range(maps, 0x7f0000801100, 0x7f0000801800).room, StackRoom::kNotWritable);
  // An empty or wrapped range is no stack.
  EXPECT_EQ(judge_stack_range(maps, 0x7f0000400000, 0x7f0000400000).room, StackRoom::kUnmapped);
}

// A Java thread's stack as HotSpot 17 leaves it: its guard zones (reserved,
// yellow, red) PROT_NONE at the low end, split from the rest of the stack.
TEST(StackRoom, JavaThreadStackAboveItsGuardZones) {
  auto maps = maps_of(
      "7fb7e1870000-7fb7e1874000 ---p 00000000 00:00 0 \n"
      "7fb7e1874000-7fb7e1970000 rw-p 00000000 00:00 0 \n");
  EXPECT_EQ(judge_stack_range(maps, 0x7fb7e1960000, 0x7fb7e1968000).room, StackRoom::kSafe);
  auto v = judge_stack_range(maps, 0x7fb7e1872000, 0x7fb7e1875000);
  EXPECT_EQ(v.room, StackRoom::kNotWritable);
  EXPECT_EQ(v.at, 0x7fb7e1874000u);
}

// Adjacent writable mappings (a stack split by an earlier mprotect that was
// undone, an [anon:] name on part of it) make one run.
TEST(StackRoom, AdjacentWritableMappingsAreOneRun) {
  auto maps = maps_of(
      "7f0000100000-7f0000101000 ---p 00000000 00:00 0 \n"
      "7f0000101000-7f0000104000 rw-p 00000000 00:00 0 \n"
      "7f0000104000-7f0000108000 rw-p 00000000 00:00 0    [anon:stack]\n"
      "7f0000108000-7f0000110000 rw-p 00000000 00:00 0 \n");
  auto v = judge_stack_range(maps, 0x7f0000103000, 0x7f0000109000);
  EXPECT_EQ(v.room, StackRoom::kSafe);
  EXPECT_EQ(v.run_lo, 0x7f0000101000u);
  EXPECT_EQ(v.run_hi, 0x7f0000110000u);
  // A hole between two writable mappings breaks it.
  auto gap = maps_of(
      "7f0000101000-7f0000104000 rw-p 00000000 00:00 0 \n"
      "7f0000105000-7f0000108000 rw-p 00000000 00:00 0 \n");
  auto g = judge_stack_range(gap, 0x7f0000103000, 0x7f0000106000);
  EXPECT_EQ(g.room, StackRoom::kUnmapped);
  EXPECT_EQ(g.at, 0x7f0000105000u);
}

TEST(StackRanges, CoversOnlyWhatWasAdded) {
  StackRanges r;
  EXPECT_FALSE(r.covers(0x1000, 0x2000));
  r.add(0x1000, 0x9000);
  EXPECT_TRUE(r.covers(0x1000, 0x2000));
  EXPECT_TRUE(r.covers(0x8000, 0x9000));
  EXPECT_FALSE(r.covers(0x0800, 0x2000));
  EXPECT_FALSE(r.covers(0x8000, 0x9001));
  r.clear();
  EXPECT_FALSE(r.covers(0x1000, 0x2000));
}

}  // namespace
}  // namespace remora::remote
