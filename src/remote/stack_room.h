// Whether a called thread's own stack can take a remote call's frame: a
// pure decision over /proc/PID/maps, tested from tables (stack_room_test.cc),
// and the per-Target memory of stack ranges already judged safe.
//
// Why: the restore frame and the called function's own stack go below the
// thread's stack pointer, and /proc/PID/mem writes the frame even into a
// PROT_NONE page (FOLL_FORCE writes any private mapping), so nothing fails
// until the thread's first push there faults. A thread can stand right above
// such a page: a small stack near its guard (glibc's guard page, a JVM's
// red/yellow/reserved zones, which HotSpot protects PROT_NONE at the low end
// of every Java thread's stack), or a stack pointer that is no stack at all
// (a code stub that uses it otherwise). Such a call then runs on a stack in
// the scratch mapping instead (Transaction::place_frame).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "procfs/procfs.h"

namespace remora::remote {

// Room the called function gets below the frame, in the range that must be
// writable: what a libc function or a short chain of them pushes. A call
// that needs more on a thread that has less faults cleanly (restored).
inline constexpr uint64_t kCallStackRoom = 8 * 1024;

enum class StackRoom {
  kSafe,         // [lo, hi) is writable memory, one run of mappings
  kUnmapped,     // a hole in the range (sp below its mapping's start, or none at all)
  kNotWritable,  // a mapping without write permission (a guard page: PROT_NONE)
};

struct StackVerdict {
  StackRoom room = StackRoom::kUnmapped;
  // Unless kSafe: [at, hi) is writable, the byte below `at` is not (so a
  // thread at sp has sp - at bytes of room).
  uint64_t at = 0;
  // The run of adjacent writable mappings that holds the range (kSafe), for
  // StackRanges.
  uint64_t run_lo = 0, run_hi = 0;
};
// `maps` as /proc lists them (any order is accepted).
StackVerdict judge_stack_range(std::span<const procfs::MapEntry> maps, uint64_t lo, uint64_t hi);
// "sp 0x7f... has 2.0 KiB of writable stack above a PROT_NONE mapping at 0x7f...": for errors and logs.
std::string describe_stack_verdict(const StackVerdict& v, uint64_t sp);

// Runs of writable memory judged safe for frames, as last seen, so that a
// call on a stack seen before reads no /proc/PID/maps (a JVM's thousands of
// mappings cost far more than the call). A mapping can change meanwhile
// (mprotect, munmap): the engine forgets them all when a call faults or its
// frame cannot be written, and reads the maps again for the next call.
class StackRanges {
 public:
  bool covers(uint64_t lo, uint64_t hi) const;
  void add(uint64_t lo, uint64_t hi);
  void clear() { runs_.clear(); }

 private:
  static constexpr size_t kMaxRuns = 64;  // one per thread stack seen; a sweep of every thread of a large process refills it
  std::vector<std::pair<uint64_t, uint64_t>> runs_;
};

}  // namespace remora::remote
