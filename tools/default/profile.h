// What one session of the default tool collected, and the writers of its
// output files. Plain data; the writers are pure functions of a Profile (no
// process needed), so they are unit-tested from hand-made profiles.
#ifndef REMORA_TOOLS_DEFAULT_PROFILE_H_
#define REMORA_TOOLS_DEFAULT_PROFILE_H_

#include <stdint.h>
#include <stdio.h>

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
  uint32_t stack;  // index into Profile::stacks
  uint64_t ts_ns;
};

struct Profile {
  int pid = 0;
  std::string comm;
  uint64_t session = 0;
  uint64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC
  int hz = 0;
  int signal = 0;
  bool sampling = false, tracing = false;
  bool fold_threads = false;  // folded stacks start with the thread

  std::map<int32_t, std::string> threads;                          // tid -> name
  std::vector<std::string> fn_names;                               // traced function names, by id
  std::vector<std::vector<uint64_t>> raw_stacks;                   // PCs, leaf first
  std::vector<std::vector<std::string>> stacks;                    // symbolised, root first
  std::map<std::pair<int32_t, uint32_t>, uint64_t> stack_weights;  // (tid, stack) -> samples
  std::vector<SampleEvent> samples;                                // for the timeline (capped)
  std::vector<CallEvent> calls;                                    // for the timeline (capped)
  std::vector<FuncStat> func_stats;                                // every call, not capped
  std::vector<CallEvent> slowest_calls;                            // the 10 longest calls, longest first
  uint64_t samples_total = 0;                                      // weights, every sample
  uint64_t samples_dropped = 0;                                    // rings full
  uint64_t calls_dropped = 0;                                      // rings full (still counted in func_stats)
  uint64_t events_capped = 0;  // left out of trace.json by REMORA_MAX_EVENTS
  uint32_t patched_slots = 0;
  std::vector<std::string> warnings;
};

// Each writer returns false on an I/O error.
bool write_trace_json(const Profile& p, FILE* out);
bool write_folded(const Profile& p, FILE* out);
bool write_flamegraph_svg(const Profile& p, FILE* out);
bool write_stats_csv(const Profile& p, FILE* out);
bool write_summary(const Profile& p, const std::string& dir, FILE* out);

// Helpers, exposed for the tests.
// The escapes take arbitrary bytes and return valid UTF-8: each ill-formed
// sequence (by RFC 3629's strict rules) becomes one U+FFFD, per maximal
// subpart as Python's and browsers' decoders replace them. json_escape's
// result goes between the quotes of a JSON string. xml_escape's result is
// text or an attribute value (either quote) of an XML 1.0 document: markup
// and tab/LF/CR become references, and the characters XML 1.0 forbids
// (other C0 controls, U+FFFE, U+FFFF) become U+FFFD.
std::string json_escape(const std::string& s);
std::string xml_escape(const std::string& s);
std::string csv_field(const std::string& s);  // quoted when needed (RFC 4180)
// A C++ name shortened for the terminal summary (the files keep full names):
// each outermost template argument list becomes "<...>", unless it is flat
// (no list inside) and at most kShortTemplateArgs characters: short flat
// lists tell instantiations apart (f<int>, std::map<int, int>), long or
// nested ones are what makes names unreadable. So
// "std::vector<std::pair<int, std::string>>::push_back(std::pair<int,
// std::string> const&)" reads "std::vector<...>::push_back(std::pair<int,
// std::string> const&)". A '<' opens a list only right after a name
// ([A-Za-z0-9_], or the ']' of an ABI tag) or an operator's name
// ("operator< <int>"); operator names themselves (operator<, operator<<=,
// operator->, operator<=>), lambdas ({lambda(int)#1}) and other '<'
// ("JS:*<anonymous>", Java's "::<init>") are left alone, as is a list with
// no matching '>'. Pure.
inline constexpr size_t kShortTemplateArgs = 20;
std::string collapse_template_args(const std::string& name);
// "frame;frame;frame" -> count, merged over threads unless fold_threads.
std::map<std::string, uint64_t> folded_stacks(const Profile& p);

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_PROFILE_H_
