// Perf maps: the text a JIT writes to name the code it generates, one
// "START SIZE name" line per piece of code (START and SIZE hex, with or
// without 0x; the name runs to the end of the line and may hold spaces), as
// node --perf-basic-prof, a JVM with -XX:+DumpPerfMapAtExit or
// `jcmd PID Compiler.perfmap`, and perf itself read them.
//
// Parsing is pure (PerfMap); read_perf_maps reads a live target's files
// safely, for SymbolSource::perf_maps.
#ifndef REMORA_PROFILE_PERF_MAP_H_
#define REMORA_PROFILE_PERF_MAP_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remora::profile {

struct PerfMapLine {
  uint64_t start = 0;
  uint64_t size = 0;
  std::string_view name;  // points into the parsed text
};

// One line (without its newline). nullopt for a malformed line: no two hex
// numbers followed by blanks and a name, a size of 0, or a range past 2^64.
std::optional<PerfMapLine> parse_perf_map_line(std::string_view line);

// The names of a process's JIT code, from the text of one or more perf
// maps. A later line wins over earlier ones for the addresses they share:
// runtimes append when they move or replace code, so the last word on an
// address describes what is there now. Not thread-safe; lookups are
// O(log ranges).
class PerfMap {
 public:
  // Adds every line of `text`, in order; malformed lines are counted and
  // skipped. Texts added later win over those added before.
  void add(std::string_view text);
  // The name of the code at `pc`, or nullptr. Valid until the next add().
  const std::string* find(uint64_t pc) const;

  bool empty() const { return ranges_.empty(); }
  size_t lines() const { return lines_; }
  size_t malformed() const { return malformed_; }

 private:
  void insert(uint64_t start, uint64_t end, std::string_view name);

  struct Range {
    uint64_t end = 0;
    uint32_t name = 0;  // index into names_
  };
  std::map<uint64_t, Range> ranges_;  // by start; never overlapping
  std::vector<std::string> names_;
  size_t lines_ = 0, malformed_ = 0;
};

// The texts of a live target's perf maps (/tmp/perf-NSPID.map, and
// /tmp/perf-PID.map when the pids differ), each opened inside the target's
// root (procfs::open_in_root: a symlink planted in a container's /tmp cannot
// lead to a file of ours) without blocking (a FIFO there cannot hang us),
// and used only when it is a regular file owned by the target's user or
// root (another user could plant false names). A file over `max_bytes` is
// read from its end: the newest entries. A missing file is no problem;
// every other reason a file is left out or cut is one line in `warnings`.
struct PerfMapFiles {
  std::vector<std::string> texts;
  std::vector<std::string> warnings;
};
PerfMapFiles read_perf_maps(pid_t pid, int ns_pid, size_t max_bytes = size_t{64} << 20);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_PERF_MAP_H_
