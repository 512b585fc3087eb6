// What one session of the default tool collected: plain data, handed to the
// controller at detach as raw records (raw_records.h), which the controller
// names and renders (src/profile). Nothing here is symbolised.
#ifndef REMORA_TOOLS_DEFAULT_PROFILE_H_
#define REMORA_TOOLS_DEFAULT_PROFILE_H_

#include <stdint.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace remora_tool {

struct FuncStat {
  std::string name;
  uint64_t calls = 0;
  uint64_t total_ns = 0;
  uint64_t max_ns = 0;
};

struct CallEvent {
  int32_t tid;
  uint32_t fn;  // index into Profile::fn_names
  uint64_t start_ns;
  uint64_t dur_ns;
};

struct SampleEvent {
  int32_t tid;
  uint32_t weight;
  uint32_t stack;  // index into Profile::raw_stacks
  uint64_t ts_ns;
};

// A counter sample (remora_raw.proto Counter): the process's RSS (tid 0) or
// one thread's CPU time, taken by the collector at each thread scan.
enum CounterKind : uint32_t { kCounterRssBytes = 1, kCounterThreadCpuNs = 2 };
struct CounterEvent {
  uint32_t kind;
  int32_t tid;
  uint64_t ts_ns;
  uint64_t value;
};

struct Profile {
  int pid = 0;
  std::string comm;
  uint64_t session = 0;
  uint64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC
  int64_t realtime_offset_ns = 0;     // CLOCK_REALTIME - CLOCK_MONOTONIC at the start
  int hz = 0;
  int signal = 0;
  bool sampling = false, tracing = false;
  bool fold_threads = false;  // folded stacks start with the thread

  std::map<int32_t, std::string> threads;                          // tid -> name
  std::vector<std::string> fn_names;                               // traced function names, by id
  std::vector<std::vector<uint64_t>> raw_stacks;                   // PCs, leaf first
  std::map<std::pair<int32_t, uint32_t>, uint64_t> stack_weights;  // (tid, stack) -> samples
  std::vector<SampleEvent> samples;                                // for the timeline (capped)
  std::vector<CallEvent> calls;                                    // for the timeline (capped)
  std::vector<FuncStat> func_stats;                                // every call, not capped
  std::vector<CallEvent> slowest_calls;                            // the 10 longest calls, longest first
  std::vector<CounterEvent> counters;                              // RSS and thread CPU (capped)
  uint64_t samples_total = 0;                                      // weights, every sample
  uint64_t samples_dropped = 0;                                    // rings full
  uint64_t calls_dropped = 0;                                      // rings full (still counted in func_stats)
  uint64_t events_capped = 0;  // left out of trace.json by REMORA_MAX_EVENTS
  uint32_t patched_slots = 0;
  std::vector<std::string> warnings;
};

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_PROFILE_H_
