// The names of a session, recorded once: DIR/names.json holds, for every
// address of the raw records, the frames the controller named it with when
// the session was collected (collect.h: at the detach, while the process and
// its files were there), the objects those addresses lie in with their build
// IDs, and the warnings of that naming. A render reads them, never the
// process or its binaries, so `remora report DIR` gives the same outputs
// after the process has exited, its binaries are gone, or DIR was copied to
// another machine.
//
// The one way a later render names differently: an object named without
// DWARF (its symbol table only, or nothing) whose debug file, by its build
// ID, has since become available on this machine (REMORA_DEBUG_PATH,
// /usr/lib/debug/.build-id/xx/rest.debug). Its addresses are named again
// from it, and the summary says so, naming the object and its build ID.
#ifndef REMORA_PROFILE_NAMES_H_
#define REMORA_PROFILE_NAMES_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "profile/model.h"
#include "profile/symbolize.h"

namespace remora::profile {

inline constexpr const char* kNamesFile = "names.json";

struct NamedAddress {
  uint64_t pc = 0;
  bool return_address = false;
  bool tool = false;    // the default tool's own code: left out of stacks
  int32_t object = -1;  // index into NameTable::objects; -1: in no object
  std::vector<Frame> frames;
};

struct NameTable {
  std::vector<ObjectNaming> objects;
  std::vector<NamedAddress> addresses;
  // The naming's warnings (ObjectWarning::object names an object's path),
  // then the collection's own notes (perf maps, a JVM's map).
  std::vector<ObjectWarning> warnings;
  std::vector<std::string> notes;
  // CLOCK_REALTIME - CLOCK_MONOTONIC when collected, for records that lack
  // it (pprof's time_nanos); 0: the records carry their own.
  int64_t realtime_offset_ns = 0;
  // The target's pid as the collector saw it (the records may carry the
  // pid of its own namespace); 0: the records' pid.
  int32_t pid = 0;
};

// Names every address of `raw`'s stacks with `sym`, in symbolize()'s order
// (so that the warnings and their counts are the ones a direct render gives).
NameTable record_names(const RawProfile& raw, Symbolizer& sym);

std::string names_to_json(const NameTable& table);
// Errc::kInvalidArgument naming the field when the text is not a table.
Result<NameTable> names_from_json(std::string_view text);

// Where the debug file of a build ID would be in `dirs` (each laid out as
// /usr/lib/debug is), then in /usr/lib/debug: the first that exists, or "".
std::string find_debug_file(const std::string& build_id, const std::vector<std::string>& dirs);

// Names again, from this machine's files (`host`: pid 0), the addresses of
// each object the table named without DWARF whose debug file has become
// available (find_debug_file). Each object so improved gets a note in place
// of its warning. Returns how many objects improved.
size_t improve_names(NameTable* table, SymbolSource host);

// symbolize()'s namer over a recorded table.
class RecordedNames : public FrameNamer {
 public:
  explicit RecordedNames(const NameTable& table);
  std::vector<Frame> frames_at(uint64_t pc, bool return_address) override;
  bool is_tool_frame(uint64_t pc) const override;
  std::vector<std::string> warnings() const override;

 private:
  std::map<std::pair<uint64_t, bool>, const NamedAddress*> by_pc_;
  std::set<uint64_t> tool_pcs_;
  std::vector<std::string> warnings_;
};

}  // namespace remora::profile

#endif  // REMORA_PROFILE_NAMES_H_
