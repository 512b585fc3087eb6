#include "profile/perf_map.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <string>

#include "procfs/procfs.h"
#include "profile/symbolize.h"

namespace remora::profile {
namespace {

// A name longer than this is cut: no runtime writes one, and a hostile map
// must not make every frame of a profile megabytes long.
constexpr size_t kMaxName = 1024;

bool is_blank(char c) { return c == ' ' || c == '\t'; }

size_t skip_blanks(std::string_view* s) {
  size_t n = 0;
  while (n < s->size() && is_blank((*s)[n])) ++n;
  s->remove_prefix(n);
  return n;
}

// A hex number of 1 to 16 digits, with or without 0x, at the start of `s`;
// consumes it.
std::optional<uint64_t> take_hex(std::string_view* s) {
  std::string_view t = *s;
  if (t.size() >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) t.remove_prefix(2);
  uint64_t v = 0;
  size_t n = 0;
  for (; n < t.size(); ++n) {
    char c = t[n];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) break;
    if (n == 16) return std::nullopt;  // more than 64 bits
    v = v << 4 | static_cast<uint64_t>(d);
  }
  if (n == 0) return std::nullopt;
  t.remove_prefix(n);
  *s = t;
  return v;
}

}  // namespace

std::optional<PerfMapLine> parse_perf_map_line(std::string_view s) {
  PerfMapLine l;
  skip_blanks(&s);
  auto start = take_hex(&s);
  if (!start || skip_blanks(&s) == 0) return std::nullopt;
  auto size = take_hex(&s);
  if (!size || skip_blanks(&s) == 0) return std::nullopt;
  while (!s.empty() && (is_blank(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  if (s.empty() || *size == 0 || *start + *size < *start) return std::nullopt;
  l.start = *start;
  l.size = *size;
  l.name = s.substr(0, kMaxName);
  return l;
}

void PerfMap::add(std::string_view text) {
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank: not counted
    ++lines_;
    auto l = parse_perf_map_line(line);
    if (!l) {
      ++malformed_;
      continue;
    }
    insert(l->start, l->start + l->size, l->name);
  }
}

// Keeps ranges_ free of overlaps: what the new range covers is cut out of
// the older ranges (split in two where it lies inside one), so a lookup
// needs only the one range starting at or below the address.
void PerfMap::insert(uint64_t start, uint64_t end, std::string_view name) {
  auto it = ranges_.upper_bound(start);
  if (it != ranges_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > start) {
      if (prev->second.end > end) ranges_[end] = Range{prev->second.end, prev->second.name};
      if (prev->first == start)
        ranges_.erase(prev);
      else
        prev->second.end = start;
    }
  }
  it = ranges_.lower_bound(start);
  while (it != ranges_.end() && it->first < end) {
    if (it->second.end > end) ranges_[end] = Range{it->second.end, it->second.name};
    it = ranges_.erase(it);
  }
  // The same name (a JIT re-announcing code) is stored once.
  if (names_.empty() || names_.back() != name) names_.emplace_back(name);
  ranges_[start] = Range{end, static_cast<uint32_t>(names_.size() - 1)};
}

const std::string* PerfMap::find(uint64_t pc) const {
  auto it = ranges_.upper_bound(pc);
  if (it == ranges_.begin()) return nullptr;
  --it;
  if (pc >= it->second.end) return nullptr;
  return &names_[it->second.name];
}

std::vector<std::string> perf_map_candidates(pid_t pid, int ns_pid) {
  int own = ns_pid > 0 ? ns_pid : pid;
  std::string root = "/proc/" + std::to_string(pid) + "/root/tmp/perf-";
  std::vector<std::string> out{root + std::to_string(own) + ".map"};
  // A runtime in a pid namespace names the file by the pid it sees; one
  // that was told the host's pid (perf's own convention) by the host's.
  if (own != pid) out.push_back(root + std::to_string(pid) + ".map");
  return out;
}

PerfMapFiles read_perf_maps(pid_t pid, int ns_pid, size_t max_bytes) {
  PerfMapFiles out;
  struct stat proc {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &proc) != 0) return out;  // gone: nothing to read
  int own = ns_pid > 0 ? ns_pid : pid;
  std::vector<std::string> names{"/tmp/perf-" + std::to_string(own) + ".map"};
  if (own != pid) names.push_back("/tmp/perf-" + std::to_string(pid) + ".map");
  for (const auto& name : names) {
    auto fd = procfs::open_in_root(pid, name);
    if (!fd) {
      if (fd.error().sys_errno() != ENOENT)
        out.warnings.push_back("JIT code: " + fd.error().to_string() + "; its names are not used");
      continue;
    }
    struct stat st {};
    if (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) {
      out.warnings.push_back("JIT code: " + name + " in the target's root is not a regular file: ignored");
      continue;
    }
    // /proc/PID belongs to the process's effective user.
    if (st.st_uid != proc.st_uid && st.st_uid != 0) {
      out.warnings.push_back(
          "JIT code: " + name + " in the target's root is owned by uid " + std::to_string(st.st_uid) +
          ", not by the process's uid " + std::to_string(proc.st_uid) +
          " or root: ignored, since another user could plant false names (remove the file, or "
          "let the runtime write it as the process's own user)");
      continue;
    }
    size_t size = static_cast<size_t>(st.st_size);
    off_t from = 0;
    if (size > max_bytes) {
      // From the byte before the last max_bytes: the first line read is
      // dropped up to its newline, and when that byte is itself a newline
      // no whole line is lost.
      from = static_cast<off_t>(size - max_bytes - 1);
      out.warnings.push_back("JIT code: " + name + " holds " + std::to_string(size >> 20) +
                             " MiB; only its last " + std::to_string(max_bytes >> 20) +
                             " MiB (the newest entries) were read: code named only by older entries reads "
                             "[unknown] (restart the runtime to start a new map)");
      size = max_bytes + 1;
    }
    std::string text(size, '\0');
    size_t got = 0;
    while (got < size) {
      ssize_t n = ::pread(fd->get(), text.data() + got, size - got, from + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
    if (from > 0) {
      size_t nl = text.find('\n');
      text.erase(0, nl == std::string::npos ? text.size() : nl + 1);
    }
    out.texts.push_back(std::move(text));
  }
  return out;
}

}  // namespace remora::profile
