// What the writers (writers*.cc, perfetto.cc, pprof.cc) share: how threads,
// the process and frames are named, so that every output names them alike.
// Private to src/profile.
#ifndef REMORA_PROFILE_WRITERS_INTERNAL_H_
#define REMORA_PROFILE_WRITERS_INTERNAL_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "profile/model.h"

namespace remora::profile::internal {

// The process id the trace files use: the target's own (ns_pid), since its
// thread ids are its own too (the main thread's tid is this pid); the host's
// when the tool did not say.
int trace_pid(const Profile& p);
// "comm (pid 4242)", or "comm (pid 4242, 7 in its pid namespace)". Raw bytes:
// the caller makes them valid UTF-8.
std::string process_label(const Profile& p);
// "name-tid" ("thread-tid" when unnamed), as folded stacks and the summary
// show a thread.
std::string thread_label(const Profile& p, int32_t tid);
// The thread's name, "thread" when it has none.
std::string thread_name(const Profile& p, int32_t tid);
// Every thread the profile mentions (named, sampled, calling or counted),
// in tid order.
std::vector<int32_t> all_tids(const Profile& p);
// The frames of stack `i` (root first), empty when the index is out of
// range; frame `i`, an "[unknown]" one when out of range: the writers never
// trust an index of the raw records.
const std::vector<uint32_t>& stack_at(const Profile& p, uint32_t i);
const Frame& frame_at(const Profile& p, uint32_t i);
// A hex string ("a1b2...") as bytes; "" when it is not hex.
std::string hex_to_bytes(const std::string& hex);
// Writes all of `data`; false on an I/O error (errno set).
bool write_all(FILE* out, const void* data, size_t size);
// `data` gzip'ed (RFC 1952: zlib's windowBits 15 + 16, not a raw or zlib
// stream: pprof's readers look for the gzip magic) into `out`; false on an
// I/O error (errno set). The pprof writer and the job merge both use it.
bool write_gzip(const std::string& data, FILE* out);

// ---- frames, as the text writers label them (writers.cc) ----

// Each frame's label, once: profiles hold many samples of few frames.
template <typename Label>
std::vector<std::string> frame_labels(const Profile& p, Label label) {
  std::vector<std::string> out;
  out.reserve(p.frames.size());
  for (const Frame& f : p.frames) out.push_back(label(f));
  return out;
}
// labels[i], "[unknown]" when out of range.
const std::string& label_at(const std::vector<std::string>& labels, uint32_t i);
// A name fit for a folded line: ';' and newlines replaced.
std::string folded_name(const std::string& name);
// Microseconds since the profile's start (0 before it).
double rel_us(const Profile& p, uint64_t ns);
// "1.234 ms", "12 ns".
std::string fmt_duration(uint64_t ns);
struct SymbolCounts {
  std::string name;
  uint64_t self = 0;
  uint64_t inclusive = 0;
};
// Self and inclusive samples per label, hottest (self, then inclusive) first.
std::vector<SymbolCounts> symbol_counts(const Profile& p, const std::vector<std::string>& labels);
// Every sample's weight, summed.
uint64_t total_weight(const Profile& p);

}  // namespace remora::profile::internal

#endif  // REMORA_PROFILE_WRITERS_INTERNAL_H_
