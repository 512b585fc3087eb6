// Names for the addresses of a profile, in the controller, with elfutils
// (libdwfl): symbol tables, DWARF (source file and line, inline frames),
// separate debug info found by build ID (/usr/lib/debug/.build-id/xx/....debug)
// and by .gnu_debuglink, and perf maps (/tmp/perf-PID.map) for JIT code.
//
// Files are opened as the target sees them: through the target's root
// (procfs::open_in_root, a container's /usr/lib is the container's) while it
// lives, else at the same path on this machine; in both cases only when the
// file's build ID is the one the target had loaded (Module::build_id). A
// file that is missing or differs gives "libx.so+0x1f0" names and one
// warning naming the file and the fix.
#ifndef REMORA_PROFILE_SYMBOLIZE_H_
#define REMORA_PROFILE_SYMBOLIZE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "profile/model.h"

namespace remora::profile {

struct SymbolSource {
  pid_t pid = 0;   // the host's pid of the target; 0 or a dead process: files on this machine
  int ns_pid = 0;  // the target's own pid (names its perf map); 0: pid
  // The executable mappings say which object holds a PC; each is matched to
  // its Module by path, else by bias (the dynamic linker may name a file by
  // a symlink, /lib/..., where the maps show /usr/lib/...). A mapping no
  // module claims is still used, its bias taken from the mapping (and no
  // build ID to check it by).
  std::vector<Mapping> maps;
  std::vector<Module> modules;
  std::string tool_path;  // frames in this file are the tool's own (is_tool_frame)
  // Perf map texts ("START SIZE name" lines, hex), already read: the
  // caller finds them (perf_map_candidates) while the target lives;
  // read_perf_maps (perf_map.h) reads them safely.
  std::vector<std::string> perf_maps;
  // Extra directories searched for debug files by build ID, before
  // /usr/lib/debug (tests; REMORA_DEBUG_PATH).
  //
  // REMORA_DEBUG_PATH: colon-separated directories of this machine, each
  // laid out as /usr/lib/debug is (DIR/.build-id/xx/rest.debug, and for
  // .gnu_debuglink names DIR/NAME or DIR/<the file's directory>/NAME). The
  // caller appends them here (debug_dirs_from_env). They are searched first,
  // then the target's own /usr/lib/debug (through its root, for a container),
  // then this machine's; every debug file is used only when its build ID is
  // the object's (or, for an object without one, its CRC the debuglink's).
  std::vector<std::string> debug_dirs;
};

// What names the addresses of a profile for symbolize(): a Symbolizer, which
// reads the files, or the names a session recorded at its detach (names.h).
class FrameNamer {
 public:
  virtual ~FrameNamer() = default;
  virtual std::vector<Frame> frames_at(uint64_t pc, bool return_address) = 0;
  virtual bool is_tool_frame(uint64_t pc) const = 0;
  virtual std::vector<std::string> warnings() const = 0;
};

// How well an object's addresses could be named.
enum class DebugLevel : uint8_t {
  kNone,    // no usable file: "libx.so+0x1f0"
  kSymtab,  // its symbol table only: functions, no source lines or inline frames
  kDwarf,   // DWARF: source lines and inline frames
};
struct ObjectNaming {
  std::string path;      // as the target's maps name it
  std::string build_id;  // the loaded build's; "" unknown
  DebugLevel level = DebugLevel::kNone;
};
// One of warnings()'s lines, with the object it is about ("" for none).
struct ObjectWarning {
  std::string object;
  std::string text;
};

// Not thread-safe: one thread uses a Symbolizer at a time. Files are opened
// on first need (the first PC in an object), and every answer is cached
// per address. Nothing here fails as a whole: what cannot be named reads
// "libx.so+0x1f0" or "[unknown]", and warnings() says why and what to do.
class Symbolizer : public FrameNamer {
 public:
  explicit Symbolizer(SymbolSource source);
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // The frames at `pc`, innermost first: an inlined callee, then the
  // functions it was inlined into, the outermost (the real, called function)
  // last; always at least one. `return_address`: pc is where a call returns
  // to, so pc - 1 is looked up (the call itself) and reported.
  // Names come from DWARF (file:line of each frame; the outer ones at the
  // call site, as addr2line -i prints), else the symbol table, else
  // "libx.so+0xOFF" (kUnknown). A PC in no object: the perf maps' name
  // (kJit, module "[jit]"), else "[unknown]" (kUnknown). The vDSO is named
  // from this process's own when the build IDs agree (the same kernel).
  //
  // An object whose file is gone, or replaced by another build, is named
  // from its debug file when one with the loaded build ID is found (the
  // debug directories, then /usr/lib/debug): it keeps the program headers,
  // the symbol table and the DWARF.
  std::vector<Frame> frames_at(uint64_t pc, bool return_address) override;
  // True when pc is in the default tool's own code (tool_path).
  bool is_tool_frame(uint64_t pc) const override;
  // One line per problem (a file missing or with another build ID, no
  // debug info found for a module that has frames): what it means and the fix.
  std::vector<std::string> warnings() const override;
  // The same lines, each with the object it is about.
  std::vector<ObjectWarning> object_warnings() const;
  // The object that holds pc, once frames_at has named it: its build and
  // how well it was named. nullopt: pc lies in no object (JIT, unknown).
  std::optional<ObjectNaming> object_naming(uint64_t pc, bool return_address) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The directories of REMORA_DEBUG_PATH (colon-separated; empty entries
// skipped), for SymbolSource::debug_dirs. `value` null: none.
std::vector<std::string> debug_dirs_from_env(const char* value);

// Where the target's perf maps may be, as this process can open them:
// /proc/PID/root/tmp/perf-NSPID.map (and perf-PID.map when they differ).
// Opening these paths directly follows a symlink planted in a container's
// /tmp out to our own files: read_perf_maps (perf_map.h) opens them inside
// the target's root instead.
std::vector<std::string> perf_map_candidates(pid_t pid, int ns_pid);

// Symbolises every raw stack of `raw` into a Profile: frames deduplicated,
// stacks root first, the tool's own frames left out, "[truncated]" at the
// root of stacks the tool cut; the namer's warnings appended.
Profile symbolize(RawProfile raw, FrameNamer& sym);

// Calls fn(pc, is a return address) once for every distinct address of the
// raw stacks, in the order symbolize() first meets them.
void for_each_address(const RawProfile& raw, const std::function<void(uint64_t, bool)>& fn);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_SYMBOLIZE_H_
