// symbolize(): the raw stacks of a session into the named stacks of a
// Profile, through any FrameNamer (symbolize.h).
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/strings.h"
#include "profile/symbolize.h"

namespace remora::profile {

std::vector<std::string> debug_dirs_from_env(const char* value) {
  std::vector<std::string> out;
  if (value == nullptr) return out;
  for (std::string_view d : split_fields(value, ":")) out.emplace_back(d);
  return out;
}

namespace {

struct FrameHash {
  size_t operator()(const Frame& f) const {
    size_t h = std::hash<uint64_t>{}(f.address);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<std::string>{}(f.function));
    mix(std::hash<std::string>{}(f.file));
    mix(f.line);
    mix(static_cast<size_t>(f.inlined) | static_cast<size_t>(f.kind) << 1);
    return h;
  }
};

}  // namespace

Profile symbolize(RawProfile raw, FrameNamer& sym) {
  Profile p;
  static_cast<RawProfile&>(p) = std::move(raw);
  std::unordered_map<Frame, uint32_t, FrameHash> index;
  // Per (pc, is a return address): the frames' indices, innermost first; an
  // empty list for the tool's own frames.
  std::unordered_map<uint64_t, std::vector<uint32_t>> seen[2];
  auto intern = [&](const Frame& f) {
    auto [it, added] = index.emplace(f, static_cast<uint32_t>(p.frames.size()));
    if (added) p.frames.push_back(f);
    return it->second;
  };
  std::optional<uint32_t> truncated;
  p.stacks.reserve(p.raw_stacks.size());
  for (size_t s = 0; s < p.raw_stacks.size(); ++s) {
    const auto& pcs = p.raw_stacks[s];
    std::vector<uint32_t> leaf_first;
    for (size_t i = 0; i < pcs.size(); ++i) {
      bool ra = i > 0;  // [0] is the interrupted PC, the rest return addresses
      auto [it, added] = seen[ra].try_emplace(pcs[i]);
      if (added && !sym.is_tool_frame(pcs[i]))
        for (const Frame& f : sym.frames_at(pcs[i], ra)) it->second.push_back(intern(f));
      leaf_first.insert(leaf_first.end(), it->second.begin(), it->second.end());
    }
    std::vector<uint32_t> stack;
    stack.reserve(leaf_first.size() + 1);
    if (s < p.truncated.size() && p.truncated[s]) {
      if (!truncated) {
        Frame t;
        t.function = "[truncated]";
        t.kind = FrameKind::kTruncated;
        truncated = intern(t);
      }
      stack.push_back(*truncated);
    }
    stack.insert(stack.end(), leaf_first.rbegin(), leaf_first.rend());
    p.stacks.push_back(std::move(stack));
  }
  for (auto& w : sym.warnings()) p.warnings.push_back(std::move(w));
  return p;
}

void for_each_address(const RawProfile& raw, const std::function<void(uint64_t, bool)>& fn) {
  std::unordered_set<uint64_t> seen[2];
  for (const auto& pcs : raw.raw_stacks)
    for (size_t i = 0; i < pcs.size(); ++i) {
      bool ra = i > 0;  // as symbolize(): [0] is the interrupted PC
      if (seen[ra].insert(pcs[i]).second) fn(pcs[i], ra);
    }
}

}  // namespace remora::profile
