// What one session of the default tool collected, as the controller holds it:
// the raw records the tool handed over (RawProfile, read from the session's
// profile.remora by records.h) and, once symbolised (symbolize.h), the
// Profile every writer renders (writers.h, perfetto.h, pprof.h).
//
// Plain data: the writers are pure functions of a Profile, unit-tested from
// hand-made ones. Times are CLOCK_MONOTONIC nanoseconds of the target's
// machine; start_ns/end_ns bound the session.
#ifndef REMORA_PROFILE_MODEL_H_
#define REMORA_PROFILE_MODEL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace remora::profile {

// One line of the target's /proc/self/maps at detach (file-backed mappings
// and anonymous executable ones, where JIT code lives).
struct Mapping {
  uint64_t start = 0, end = 0, offset = 0;
  std::string perms;  // "r-xp"
  uint64_t dev = 0, inode = 0;
  std::string path;  // as the target names it (its own mount namespace); "" anonymous
};

// A loaded ELF object, as the target's dynamic linker lists it: its load
// bias and the GNU build ID read from its own note (hex, "" when none). The
// symboliser opens only files whose build ID matches.
struct Module {
  std::string path;
  uint64_t bias = 0;
  std::string build_id;
};

struct FuncStat {
  std::string name;
  uint64_t calls = 0;
  uint64_t total_ns = 0;
  uint64_t max_ns = 0;
};

struct CallEvent {
  int32_t tid = 0;
  uint32_t fn = 0;  // index into fn_names
  uint64_t start_ns = 0;
  uint64_t dur_ns = 0;
};

struct SampleEvent {
  int32_t tid = 0;
  uint32_t weight = 1;
  uint32_t stack = 0;  // index into raw_stacks (and, symbolised, stacks)
  uint64_t ts_ns = 0;
};

// A counter track: the process's RSS (tid 0) or one thread's CPU time.
enum class CounterKind : uint32_t { kRssBytes = 1, kThreadCpuNs = 2 };
struct CounterSample {
  CounterKind kind = CounterKind::kRssBytes;
  int32_t tid = 0;  // 0: the process
  uint64_t ts_ns = 0;
  uint64_t value = 0;
};

// What the tool hands over. Thread ids are the target's own (its pid
// namespace); pid is the host's, ns_pid the target's own view of it.
struct RawProfile {
  int pid = 0, ns_pid = 0;
  std::string comm;  // the program's name as the user started it (argv[0]'s base name)
  std::string exe;   // /proc/self/exe as the target sees it
  uint64_t session = 0;
  uint64_t start_ns = 0, end_ns = 0;
  int64_t realtime_offset_ns = 0;  // CLOCK_REALTIME - CLOCK_MONOTONIC at the start (0: unknown)
  int hz = 0;
  int signal = 0;
  bool sampling = false, tracing = false;
  bool fold_threads = false;  // folded stacks start with the thread

  std::map<int32_t, std::string> threads;  // tid -> name
  std::vector<std::string> fn_names;       // traced function names, by id
  std::vector<std::vector<uint64_t>>
      raw_stacks;               // PCs, leaf first: [0] the interrupted PC, the rest return addresses
  std::vector<bool> truncated;  // per raw stack: deeper than the tool records
  std::map<std::pair<int32_t, uint32_t>, uint64_t> stack_weights;  // (tid, stack) -> samples
  std::vector<SampleEvent> samples;                                // for the timeline (capped)
  std::vector<CallEvent> calls;                                    // for the timeline (capped)
  std::vector<FuncStat> func_stats;                                // every call, not capped
  std::vector<CallEvent> slowest_calls;                            // the 10 longest calls, longest first
  std::vector<CounterSample> counters;
  std::vector<Mapping> maps;
  std::vector<Module> modules;
  std::string tool_path;         // the default tool's own file: its frames are left out
  uint64_t samples_total = 0;    // weights, every sample
  uint64_t samples_dropped = 0;  // rings full
  uint64_t calls_dropped = 0;    // rings full (still counted in func_stats)
  uint64_t events_capped = 0;    // left out of the timeline by REMORA_MAX_EVENTS
  uint32_t patched_slots = 0;
  uint64_t detach_cpu_ns = 0;  // what the detach cost the target's CPU (the tool's own measure)
  std::vector<std::string> warnings;
  // The thread ids are the controller's (the host's), translated from the
  // target's pid namespace at render time; else the target's own.
  bool host_tids = false;
};

// One symbolised frame. An address inside inlined code yields several:
// the inlined callee first, then each function it was inlined into.
enum class FrameKind : uint8_t { kNative, kJit, kUnknown, kTruncated };
struct Frame {
  std::string function;        // demangled; "[unknown]" or "libx.so+0x1f0" when unnamed
  std::string module;          // the object's path as the target names it; "[jit]", "" unknown
  uint64_t address = 0;        // the PC in the target (return addresses already minus 1)
  uint64_t module_offset = 0;  // address - the module's bias (an ELF virtual address)
  std::string file;            // source file, "" when no line info
  uint32_t line = 0;
  bool inlined = false;  // this frame was inlined into the next one (the caller)
  FrameKind kind = FrameKind::kNative;

  bool operator==(const Frame&) const = default;
};

// The profile every writer renders: the raw records plus their names.
struct Profile : RawProfile {
  std::vector<Frame> frames;                  // distinct frames
  std::vector<std::vector<uint32_t>> stacks;  // per raw stack: indices into frames, ROOT FIRST
};

}  // namespace remora::profile

#endif  // REMORA_PROFILE_MODEL_H_
