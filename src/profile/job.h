// A profiled Slurm job as one directory on the machine where the user typed
// the command (the "front"): JOBDIR/job.json, this manifest, says which
// ranks ran on which node, what became of each, and how each node's clock
// relates to the front's; each rank's rendered session directory lies
// under JOBDIR/<node>/. merge.h turns them into one profile.
//
//   JOBDIR/job.json
//   JOBDIR/<node>/<rank's session dir>/{summary.txt,trace.perfetto,profile.pb.gz,...}
//
// job.json (format 1) is JSON; readers ignore unknown keys and take a
// missing optional field as its default:
//
//   {"format": 1, "job": "1234", "step": "", "front_host": "login1",
//    "window": {"start_mono_ns": 123, "end_mono_ns": 456},
//    "nodes": [{"name": "n1", "transport": "stream", "error": "",
//               "clock": [{"node_mono_ns": 1000, "offset_ns": -42,
//                          "uncertainty_ns": 800, "when": "attach"}]}],
//    "ranks": [{"node": "n1", "rank": 0, "local_rank": 0, "pid": 4242,
//               "comm": "mpi_ranks", "dir": "n1/mpi_ranks-4242-s1-...",
//               "result": "attached", "end": "", "detach": "detached"}]}
//
// Plain data and pure functions, but for the two that read and write the
// file; any thread may call them. The one writer of job.json (the front,
// cli/slurm_front.cc) and its readers (the merge, tests) all go through
// here: a library of its own (remora_profile_job) that the remora command
// links without the rest of the profile layer.
#ifndef REMORA_PROFILE_JOB_H_
#define REMORA_PROFILE_JOB_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace remora::profile {

inline constexpr int kJobManifestFormat = 1;
inline constexpr char kJobManifestFile[] = "job.json";

// One measure of a node's clock against the front's: offset_ns = the node's
// CLOCK_MONOTONIC - the front's, at node time node_mono_ns, known within
// ±uncertainty_ns (half the round trip that measured it).
struct ClockSample {
  uint64_t node_mono_ns = 0;
  int64_t offset_ns = 0;
  uint64_t uncertainty_ns = 0;
  std::string when;  // "attach", "detach": for people, not read by the merge

  bool operator==(const ClockSample&) const = default;
};

struct JobNode {
  std::string name;       // as Slurm names it (SLURMD_NODENAME)
  std::string transport;  // how its outputs came back: "stream" or "shared"
  std::string error;      // what failed on this node; "" when nothing did
  std::vector<ClockSample> clock;

  bool operator==(const JobNode&) const = default;
};

struct JobRank {
  std::string node;
  int rank = -1;        // the task's rank in its step; -1: not a task (a child process)
  int local_rank = -1;  // its rank on its node; -1 when not a task
  int pid = 0;          // on its node: ranks of different nodes may share a pid
  std::string comm;
  std::string dir;     // its session directory, relative to JOBDIR; "" when none came back
  std::string result;  // "attached", or "failed: why"
  std::string end;     // how it ended while attached ("exited with status 0"); "" when it lived on
  std::string detach;  // what its detach did ("detached", "unloaded", "failed: why"); "" none yet

  bool operator==(const JobRank&) const = default;
};

// The front's CLOCK_MONOTONIC when the attach was done and when the detach
// began.
struct JobWindow {
  uint64_t start_mono_ns = 0, end_mono_ns = 0;

  bool operator==(const JobWindow&) const = default;
};

struct JobManifest {
  int format = kJobManifestFormat;
  std::string job;         // "1234", "1234_7" (an array task)
  std::string step;        // "" every step of the job; else "0", "batch", ...
  std::string front_host;  // the machine that holds JOBDIR
  std::optional<JobWindow> window;
  std::vector<JobNode> nodes;
  std::vector<JobRank> ranks;

  // The node named `name`, nullptr when the manifest does not list it.
  const JobNode* node(std::string_view name) const;
  bool operator==(const JobManifest&) const = default;
};

// Reads JOBDIR/job.json (the path of the file itself). Fails with kIo when
// it cannot be read, kParse when it is not JSON or a field has the wrong
// type (the message names the field), kNotSupported when a newer remora
// wrote it (a higher "format").
Result<JobManifest> read_job_manifest(const std::string& path);
// The manifest as JSON text, and the inverse (pure; `what` names the text
// in messages).
std::string job_manifest_json(const JobManifest& m);
Result<JobManifest> parse_job_manifest(std::string_view text, const std::string& what = "job.json");
// Writes `path` atomically (PATH.tmp, then renamed over it): a reader sees
// the old file or the new one, never half of one. Fails with kIo.
Result<void> write_job_manifest(const std::string& path, const JobManifest& m);

// The node's offset (node - front) at node time `node_ns`: 0 with no
// sample, the one offset with one, else linear between the two samples
// around `node_ns` (the drift of the node's clock) and the nearest
// sample's offset outside them. Rounded to the nearest nanosecond. The
// samples need not be sorted. Pure.
int64_t offset_at(const std::vector<ClockSample>& samples, uint64_t node_ns);
// Node time `node_ns` on the front's clock (node - offset_at), clamped to
// [0, 2^64).
uint64_t front_time(const std::vector<ClockSample>& samples, uint64_t node_ns);

// One line on how well the nodes' timelines line up, for the summary:
// "clocks aligned within ±0.9 ms (2 samples per node, drift up to 3.0
// us/s)", with "; n2: not aligned (no clock sample)" for each node without
// a sample. A node named like the front (front_host) without a sample
// needs none: it is the front's own clock.
std::string describe_alignment(const JobManifest& m);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_JOB_H_
