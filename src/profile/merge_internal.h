// What the parts of the job merge (merge.cc, merge_perfetto.cc,
// merge_pprof.cc) share. Private to src/profile; the tests use it only
// through merge.h.
#ifndef REMORA_PROFILE_MERGE_INTERNAL_H_
#define REMORA_PROFILE_MERGE_INTERNAL_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "profile/job.h"
#include "profile/model.h"
#include "profile/proto/perfetto_trace.pb.h"
#include "profile/proto/pprof_profile.pb.h"

namespace remora::profile::merge {

// The bytes of file `path`: kIo when it cannot be read, kParse when it
// holds more than `max` bytes.
Result<std::string> read_file(const std::string& path, size_t max);

// One rank of job.json, in the merged outputs' order.
struct RankInput {
  const JobRank* rank = nullptr;
  const std::vector<ClockSample>* clock = nullptr;  // its node's samples (empty when none)
  int slot = 0;                                     // its place: node, then rank order
};

// "n1 rank 0 (pid 4242)", "n1 pid 4250" (not a task): a rank in messages.
std::string rank_title(const JobRank& r);
// "rank 0 on n1: mpi_ranks (pid 4242)", "n1: helper (pid 4250)": the
// process's name in the merged trace.
std::string process_title(const JobRank& r);
// "rank 0 (pid 4242)", "helper (pid 4250)": the frame under the node's in
// the merged stacks.
std::string rank_frame(const JobRank& r);

// ---- trace.perfetto (merge_perfetto.cc) ----

// Re-emits the packets of each rank's trace.perfetto as one trace. Every
// track uuid, sequence id, pid and tid is replaced by a fresh one, so that
// ranks never share them (see merge_perfetto.cc); timestamps move to the
// front's clock. One rank at a time: a rank's packets are held only while
// it is added.
class TraceMerger {
 public:
  // The packets of one rank's trace.perfetto (`bytes`), remapped; an error
  // that says what is wrong when they do not parse, or hold no process
  // (nothing of the rank is then kept, and no id is used up). `warnings`
  // gets what was left out of a rank that merges.
  Result<std::string> add(const RankInput& r, std::string_view bytes, std::vector<std::string>* warnings);
  // The packets that go first: the clock snapshot (the merged trace's clock
  // is the front's CLOCK_MONOTONIC) and the root track descriptor that asks
  // for processes in node, then rank order. `first_ts`: a time of the trace.
  static std::string header(uint64_t first_ts);
  // The earliest timestamp of the ranks added, on the front's clock (0 when none).
  uint64_t first_ts() const { return first_ts_; }

 private:
  uint64_t next_uuid_ = 1;
  uint32_t next_sequence_ = 2;  // 1 is the header's
  int32_t next_pid_ = 0;        // the last pid handed out (the first rank's block starts at the next 1000)
  uint64_t first_ts_ = 0;
};

// ---- profile.pb.gz, folded.txt, flamegraph.svg (merge_pprof.cc) ----

namespace pprof = remora::pprof_profile;

// Reads a profile.pb.gz (gzip'ed, or plain, as pprof accepts) and checks
// every id and string index it holds: an error says what is wrong.
Result<pprof::Profile> read_pprof(const std::string& path);

// What one rank's profile says of it.
struct RankSamples {
  uint64_t total = 0;
  std::string hottest;  // the leaf function with the most samples ("" none)
  uint64_t hottest_samples = 0;
};
RankSamples rank_samples(const pprof::Profile& p);

// The pprof of every rank: string tables, functions, mappings and
// locations merged (equal ones shared), each sample labelled with its rank.
class PprofMerger {
 public:
  PprofMerger();
  // Adds `in`; an error when its sample types differ from the first
  // profile's (it is then left out).
  Result<void> add(const pprof::Profile& in, const JobRank& r);
  bool empty() const { return profiles_ == 0; }
  // The merged profile, with a comment naming the job.
  pprof::Profile take(const std::string& comment);

 private:
  int64_t str(const std::string& s);
  uint64_t function(const pprof::Profile& in, const pprof::Function& f);
  uint64_t mapping(const pprof::Profile& in, const pprof::Mapping& m);
  uint64_t location(const pprof::Location& l, const std::map<uint64_t, uint64_t>& mappings,
                    const std::map<uint64_t, uint64_t>& functions);
  void add_label(pprof::Sample* s, const std::string& key, const std::string* str_value, int64_t num);

  pprof::Profile out_;
  int profiles_ = 0;
  std::vector<std::pair<std::string, std::string>> sample_types_;
  int64_t first_ns_ = 0, last_ns_ = 0;
  std::map<std::string, int64_t> strings_;
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t>
      functions_;                              // name, system name, file
  std::map<std::string, uint64_t> mappings_;   // by the serialized (remapped) mapping
  std::map<std::string, uint64_t> locations_;  // likewise
};

// The samples of every rank as one Profile (model.h) for the folded and
// flame graph writers: each stack under the frames NODE and rank_frame().
class StackModel {
 public:
  void add(const pprof::Profile& in, const JobRank& r);
  const Profile& profile() const { return p_; }
  Profile& profile() { return p_; }

 private:
  uint32_t frame(const Frame& f);

  Profile p_;
  std::map<std::tuple<std::string, std::string, uint32_t, std::string, bool>, uint32_t> frames_;
  std::map<std::vector<uint32_t>, uint32_t> stacks_;
};

// Writes `p` gzip'ed (RFC 1952, as pprof's readers want); false on an I/O
// error (errno set).
bool write_pprof_gz(const pprof::Profile& p, FILE* out);

}  // namespace remora::profile::merge

#endif  // REMORA_PROFILE_MERGE_INTERNAL_H_
