#include "remote/stack_room.h"

#include <cstdio>

#include "base/strings.h"

namespace remora::remote {

namespace {

bool writable(const procfs::MapEntry& m) { return m.read && m.write; }

const procfs::MapEntry* holding(std::span<const procfs::MapEntry> maps, uint64_t addr) {
  for (const auto& m : maps)
    if (addr >= m.start && addr < m.end) return &m;
  return nullptr;
}

const procfs::MapEntry* ending_at(std::span<const procfs::MapEntry> maps, uint64_t addr) {
  for (const auto& m : maps)
    if (m.end == addr) return &m;
  return nullptr;
}

}  // namespace

StackVerdict judge_stack_range(std::span<const procfs::MapEntry> maps, uint64_t lo, uint64_t hi) {
  StackVerdict v;
  if (hi <= lo) {
    v.room = StackRoom::kUnmapped;  // an empty or wrapped range: no stack pointer makes one
    v.at = hi;
    return v;
  }
  // Downward from hi, as a stack grows: [at, hi) is writable so far, in
  // adjacent mappings.
  uint64_t at = hi;
  while (at > lo) {
    const auto* m = holding(maps, at - 1);
    if (m == nullptr || !writable(*m)) {
      v.room = m == nullptr ? StackRoom::kUnmapped : StackRoom::kNotWritable;
      v.at = at;
      return v;
    }
    at = m->start;
  }
  v.room = StackRoom::kSafe;
  v.at = lo;
  // The whole run, for the memory of safe ranges.
  v.run_lo = at;
  while (const auto* below = ending_at(maps, v.run_lo)) {
    if (!writable(*below)) break;
    v.run_lo = below->start;
  }
  v.run_hi = hi;
  while (const auto* m = holding(maps, v.run_hi)) {
    if (!writable(*m)) break;
    v.run_hi = m->end;
  }
  return v;
}

std::string describe_stack_verdict(const StackVerdict& v, uint64_t sp) {
  char buf[200];
  const double room_kib = sp > v.at ? static_cast<double>(sp - v.at) / 1024.0 : 0.0;
  switch (v.room) {
    case StackRoom::kSafe: return "the stack at sp " + hex_addr(sp) + " has room";
    case StackRoom::kUnmapped:
      std::snprintf(buf, sizeof buf, "sp %s has %.1f KiB of stack below it (nothing mapped below %s)",
                    hex_addr(sp).c_str(), room_kib, hex_addr(v.at).c_str());
      return buf;
    case StackRoom::kNotWritable:
      std::snprintf(buf, sizeof buf,
                    "sp %s has %.1f KiB of writable stack below it (a mapping without write permission, "
                    "such as a stack guard, below %s)",
                    hex_addr(sp).c_str(), room_kib, hex_addr(v.at).c_str());
      return buf;
  }
  return "?";
}

bool StackRanges::covers(uint64_t lo, uint64_t hi) const {
  for (const auto& [a, b] : runs_)
    if (lo >= a && hi <= b) return true;
  return false;
}

void StackRanges::add(uint64_t lo, uint64_t hi) {
  if (covers(lo, hi)) return;
  if (runs_.size() >= kMaxRuns) runs_.clear();
  runs_.emplace_back(lo, hi);
}

}  // namespace remora::remote
