// Merging a profiled Slurm job: the rendered session of every rank, each
// rendered on its own node (where its symbols are), brought back under one
// job directory (job.h), become one profile of the whole job in that
// directory:
//
//   trace.perfetto   one timeline: a process per rank, on the front's clock,
//                    ordered by node, then rank
//   profile.pb.gz    one pprof: every rank's samples, labelled node, rank,
//                    local_rank and pid
//   flamegraph.svg   every rank's stacks under two root frames, NODE and
//   folded.txt       "rank R (pid P)"
//   ranks.csv        one row per rank: its samples, hottest function and
//                    slowest traced call
//   summary.txt      what the user reads first: the ranks, the clock
//                    alignment, what failed, and what opens each file
//
// A rank whose outputs are missing or do not parse is left out with its
// reason (in summary.txt and ranks.csv) and the rest merges. Every output
// is in node, then rank order, and the same inputs give the same bytes.
#ifndef REMORA_PROFILE_MERGE_H_
#define REMORA_PROFILE_MERGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace remora::profile {

inline constexpr char kRanksFile[] = "ranks.csv";

// One rank of the job as the merge saw it: job.json's word on it and what
// its outputs hold.
struct MergedRank {
  std::string node;
  int rank = -1, local_rank = -1;  // -1: not a task of the job (a child process)
  int pid = 0;                     // on its node
  std::string comm;
  std::string result;  // job.json's: "attached", "failed: ..."
  std::string end;     // job.json's: how it ended while attached, "" when it did not
  std::string dir;     // its session directory, relative to the job's; "" when none came back
  uint64_t samples = 0;
  std::string hottest;  // the function with the most self samples; "" when none
  uint64_t hottest_samples = 0;
  std::string slowest_call;  // the longest traced call's function; "" when no call was traced
  uint64_t slowest_call_ns = 0;
  bool in_trace = false;    // its timeline is in trace.perfetto
  bool in_profile = false;  // its samples are in profile.pb.gz, flamegraph.svg and folded.txt
  std::string problem;      // why it is (partly) left out; "" when it is not
};

struct MergeResult {
  std::string dir;
  std::vector<std::string> files;     // the paths written, summary.txt first
  std::vector<std::string> warnings;  // also in summary.txt
  std::vector<MergedRank> ranks;      // every rank of job.json, by node, then rank
};

// Reads JOBDIR/job.json and each rank's outputs, and writes the merged
// files into JOBDIR, each atomically (FILE.tmp renamed over FILE: a reader
// never sees half a file). Fails when job.json cannot be read (kIo, kParse,
// kNotSupported), when no rank left outputs that merge (kParse, the message
// says why for each rank), or when a file cannot be written (kIo). Any
// thread may call it; two merges of one directory at once are not
// supported (they write the same temporary files).
Result<MergeResult> merge_job(const std::string& job_dir);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_MERGE_H_
