// Names for what a profile shows (docs/tool.md, "Symbols"), computed in the
// target after the session, on the thread that detaches:
// - PCs: the ELF symbol tables of each loaded object (.symtab when the file
//   has one, so static functions have names, else .dynsym), then dladdr,
//   demangled with abi::__cxa_demangle; a PC that no object covers (JIT
//   code) from the runtime's perf map, /tmp/perf-PID.map; a PC nothing
//   names becomes "library+0xoffset" or "[unknown]+0xaddress".
// - the program: the name the user started it by (program_name).
// The parsers are pure functions, tested from tables (tests/default_tool).
#ifndef REMORA_TOOLS_DEFAULT_SYMBOLIZE_H_
#define REMORA_TOOLS_DEFAULT_SYMBOLIZE_H_

#include <stddef.h>
#include <stdint.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace remora_tool {

// ---- JIT code: perf maps ----

// The most of a perf map that is read, from its end (the newest entries: a
// runtime appends as it compiles and moves code, and the last entry for an
// address is the one that holds). A long-running node or JVM can write
// hundreds of MB; reading this much cost ~25 ms of the target's CPU at
// detach (measured: DefaultToolPerfMap.HundredMegabyteMapIsBounded), and
// memory in proportion to the PCs named (plus a 1 MiB buffer), not to the map.
inline constexpr size_t kMaxPerfMapBytes = 32u << 20;

// One line of a perf map, "START SIZE name": START and SIZE hex, with or
// without 0x, separated by spaces or tabs; the name is the rest of the line
// (it may hold spaces; a trailing CR and trailing blanks are dropped).
struct PerfMapLine {
  uint64_t start = 0;
  uint64_t size = 0;
  std::string_view name;  // points into the parsed line
};

// False for a line that is not one (missing fields, not hex, more than 16
// digits, size 0, start + size past 2^64, no name). Pure.
bool parse_perf_map_line(std::string_view line, PerfMapLine* out);

// Names a fixed set of PCs from a perf map fed to it in pieces, as they are
// read: memory in proportion to the PCs, whatever the map's size. Not
// thread-safe; one reader at a time.
class PerfMapNames {
 public:
  // `pcs`: the addresses to name, in any order, duplicates allowed.
  explicit PerfMapNames(std::vector<uint64_t> pcs);
  // The next bytes of the map; a line may span calls. Lines longer than
  // kMaxLine are skipped (counted as malformed).
  void feed(std::string_view bytes);
  // Ends the map: parses a last line that has no newline.
  void finish();
  // The name of the last entry fed that covers `pc`, or null (`pc` not one
  // of the constructor's, or no entry covers it). Valid until the next feed.
  const std::string* find(uint64_t pc) const;
  size_t named() const;  // how many of the PCs have a name
  uint64_t lines() const { return lines_; }
  uint64_t malformed() const { return malformed_; }
  // True when a pathological map (huge entries covering every PC, over
  // and over) used up the work budget and the rest was ignored.
  bool work_capped() const { return work_capped_; }

  static constexpr size_t kMaxLine = 4096;
  static constexpr size_t kMaxName = 1024;  // longer names are cut

 private:
  void line(std::string_view text);

  std::vector<uint64_t> pcs_;       // sorted, unique
  std::vector<std::string> names_;  // parallel to pcs_; empty: unnamed
  std::string partial_;             // a line not yet ended
  bool skipping_ = false;           // inside a line longer than kMaxLine
  uint64_t lines_ = 0, malformed_ = 0, work_ = 0;
  bool work_capped_ = false;
};

// What read_perf_map found, for the summary's warnings.
struct PerfMapRead {
  bool found = false;      // the file exists and was read
  bool capped = false;     // larger than max_bytes: only its end was read
  uint64_t file_size = 0;  // bytes, as fstat saw it
  std::string problem;     // why it was not read (empty when found or absent)
};

// Feeds the perf map at `path` to `names`, at most its last `max_bytes`
// (starting at a line boundary). Refuses, with `problem` set, anything but a
// regular file owned by this process's user or root (as perf does: another
// user could plant names) and never blocks on a FIFO.
PerfMapRead read_perf_map(const std::string& path, size_t max_bytes, PerfMapNames* names);

// ---- PCs ----

class Symbolizer {
 public:
  Symbolizer();  // snapshots the loaded objects
  ~Symbolizer();
  // Reads the runtime's perf map (/tmp/perf-PID.map, PID = getpid(), in
  // this process's own root) for the PCs of `raw_stacks` (leaf first, as
  // write_outputs looks them up: the leaf as is, return addresses minus one)
  // that no loaded object covers, so that name() names JIT code. Reads
  // nothing when every PC is in an object. Appends to `warnings` what the
  // user should know: no map, a map ignored, a map read only in part.
  void name_jit_code(const std::vector<std::vector<uint64_t>>& raw_stacks,
                     std::vector<std::string>* warnings);
  // `pc` is an address inside the function (a return address minus one).
  std::string name(uint64_t pc);
  // True for a PC inside libremora-tool.so itself (left out of stacks).
  bool in_tool(uint64_t pc) const;

 private:
  struct Object;
  Object* object_at(uint64_t pc) const;

  std::vector<std::unique_ptr<Object>> objects_;
  std::unordered_map<uint64_t, std::string> cache_;
  std::unique_ptr<PerfMapNames> jit_;
  uintptr_t self_base_ = 0;
};

std::string demangle(const char* name);

// ---- the program ----

// The name of the program as the user started it, for the profile's title
// and directory. `cmdline` is /proc/self/cmdline (NUL-separated), `comm`
// /proc/self/comm, `exe` the target of /proc/self/exe, `path_env` $PATH;
// `is_exe(path)` says whether `path` is the very file running (same device
// and inode as /proc/self/exe). The rule, first that applies:
//  1. `comm` when it is neither the exe's name nor argv[0]'s (both cut to
//     the kernel's 15 bytes) and not all digits: someone chose it (the
//     kernel names a #! script's process after the script; a program can
//     rename itself with PR_SET_NAME). All digits is the fd name Linux
//     before 6.14 gave a process started by execveat(fd, "").
//  2. argv[0]'s base name, when argv[0] names the running file: as a path
//     if it holds a '/', else through $PATH as the shell found it. Then the
//     same for argv[0] up to its first space (setproctitle, as redis does,
//     rewrites argv[0] to "/usr/bin/redis-server *:6379").
//     A symlink or hard link keeps the name it was started by (redis-server
//     is a symlink to redis-check-rdb) and a name longer than comm's 15
//     bytes is whole.
//  3. `comm`; 4. the exe's base name; 5. "process".
// Pure: every file check goes through `is_exe`.
std::string choose_program_name(std::string_view cmdline, std::string_view comm, std::string_view exe,
                                std::string_view path_env,
                                const std::function<bool(const std::string& path)>& is_exe);

// choose_program_name for this process, from /proc/self (the first 4 KiB
// of the command line).
std::string program_name();

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_SYMBOLIZE_H_
