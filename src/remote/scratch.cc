#include "remote/scratch.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace remora::remote {

std::optional<ScratchHeader> parse_scratch_header(std::span<const std::byte> bytes, uint64_t base) {
  ScratchHeader h;
  if (bytes.size() < sizeof h) return std::nullopt;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kScratchMagic || h.version != kScratchVersion || h.header_size != sizeof h)
    return std::nullopt;
  if (h.base != base || h.size != kScratchSize) return std::nullopt;
  return h;
}

bool scratch_busy(const ScratchHeader& h, uint64_t echo_cookie) {
  return h.call_cookie != 0 && echo_cookie != h.call_cookie;
}

namespace {

bool private_anon(const procfs::MapEntry& m) {
  // Named anonymous mappings ("[anon:remora-scratch]") have inode 0 too;
  // other pseudo names ([heap], [stack], [vdso]) are never ours.
  return !m.shared && !m.file_backed() && (m.path.empty() || m.path.rfind("[anon:", 0) == 0);
}

// Whether [start, end) is all private anonymous memory.
bool covered(std::span<const procfs::MapEntry> maps, uint64_t start, uint64_t end) {
  uint64_t at = start;
  for (const auto& m : maps) {
    if (m.end <= at || m.start > at) continue;
    if (!private_anon(m)) return false;
    at = m.end;
    if (at >= end) return true;
  }
  return false;
}

}  // namespace

std::vector<uint64_t> scratch_candidates(std::span<const procfs::MapEntry> maps) {
  std::vector<uint64_t> out;
  for (const auto& m : maps) {
    if (!private_anon(m) || !m.read || m.write || !m.exec) continue;
    const uint64_t last = m.size() / kPage <= kMaxScanPages ? m.end : m.start + kPage;
    for (uint64_t base = m.start; base < last; base += kPage)
      if (covered(maps, base, base + kScratchSize)) out.push_back(base);
  }
  return out;
}

OwnerState owner_state(const ScratchHeader& h, const OwnerIdentity& self,
                       std::optional<uint64_t> live_start_time, bool lookup_failed) {
  // A pid of another namespace names nobody we can look up.
  if (h.owner_pidns_dev != self.pidns_dev || h.owner_pidns_ino != self.pidns_ino || h.owner_pid <= 0)
    return OwnerState::kUnknown;
  if (lookup_failed) return OwnerState::kUnknown;
  if (!live_start_time) return OwnerState::kGone;
  return *live_start_time == h.owner_start_time ? OwnerState::kAlive : OwnerState::kReused;
}

ScratchVerdict decide_scratch(const ScratchFacts& f) {
  switch (f.owner) {
    case OwnerState::kAlive: return ScratchVerdict::kKeepOwnerAlive;
    case OwnerState::kUnknown: return ScratchVerdict::kKeepOwnerUnknown;
    case OwnerState::kGone:
    case OwnerState::kReused: break;
  }
  if (f.busy) return ScratchVerdict::kKeepBusy;
  if (!f.threads_known) return ScratchVerdict::kKeepThreadsUnknown;
  if (f.thread_inside) return ScratchVerdict::kKeepThreadInside;
  return ScratchVerdict::kReclaim;
}

std::string_view verdict_name(ScratchVerdict v) {
  switch (v) {
    case ScratchVerdict::kReclaim: return "reclaim";
    case ScratchVerdict::kKeepOwnerAlive: return "owner alive";
    case ScratchVerdict::kKeepOwnerUnknown: return "owner unknown";
    case ScratchVerdict::kKeepBusy: return "a call in flight";
    case ScratchVerdict::kKeepThreadsUnknown: return "threads not all examined";
    case ScratchVerdict::kKeepThreadInside: return "a thread inside";
  }
  return "?";
}

bool words_point_into(std::span<const std::byte> stack, uint64_t lo, uint64_t hi) {
  for (size_t i = 0; i + 8 <= stack.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, stack.data() + i, 8);
    if (w >= lo && w < hi) return true;
  }
  return false;
}

bool thread_inside(std::span<const ThreadSnapshot> threads, uint64_t base) {
  for (const auto& t : threads)
    if ((t.pc >= base && t.pc < base + kScratchSize) || words_point_into(t.stack, base, base + kPage))
      return true;
  return false;
}

bool call_in_flight(const ScratchHeader& h, uint64_t echo_cookie, std::span<const ThreadSnapshot> threads,
                    uint64_t base) {
  if (!scratch_busy(h, echo_cookie)) return false;
  const ThreadSnapshot* t = nullptr;
  for (const auto& s : threads)
    if (s.tid == h.call_tid) t = &s;
  if (t == nullptr) return false;  // that thread has exited: nothing runs its call
  if (t->pc >= base && t->pc < base + kScratchSize) return true;
  // Unwound past the stub's frame, on the stack the call ran on. A stack
  // pointer elsewhere (an alternate signal stack, a coroutine's) proves
  // nothing.
  const bool same_stack = h.call_sp >= t->stack_lo && h.call_sp < t->stack_hi;
  return !(same_stack && t->sp > h.call_sp);
}

std::vector<Range> coalesce_scratch(std::vector<uint64_t> bases) {
  std::sort(bases.begin(), bases.end());
  bases.erase(std::unique(bases.begin(), bases.end()), bases.end());
  std::vector<Range> out;
  for (uint64_t b : bases) {
    if (!out.empty() && out.back().end == b)
      out.back().end = b + kScratchSize;
    else
      out.push_back({b, b + kScratchSize});
  }
  return out;
}

uint64_t scratch_address_hint(std::span<const procfs::MapEntry> maps) {
  const auto stack =
      std::find_if(maps.begin(), maps.end(), [](const procfs::MapEntry& m) { return m.path == "[stack]"; });
  if (stack == maps.end()) return 0;
  // The mappings below the stack, in address order (/proc lists them so;
  // sorted again rather than trusted).
  std::vector<std::pair<uint64_t, uint64_t>> below;
  for (const auto& m : maps)
    if (m.end <= stack->start) below.emplace_back(m.start, m.end);
  std::sort(below.begin(), below.end());
  uint64_t best_top = 0, best_size = 0;
  for (size_t i = 1; i < below.size(); ++i) {
    if (below[i].first <= below[i - 1].second) continue;
    const uint64_t gap = below[i].first - below[i - 1].second;
    if (gap > best_size) best_size = gap, best_top = below[i].first;
  }
  if (best_size < kScratchRoom + kScratchSize) return 0;
  return best_top - kScratchSize;
}

}  // namespace remora::remote
