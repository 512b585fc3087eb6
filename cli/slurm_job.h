// A running Slurm job as `remora attach --slurm` sees it: the job named on
// the command line, what `scontrol` says about it, which of a node's
// processes are its ranks, who each rank is, the clock of each node, and
// the wire between the command (the "front") and the remora that runs on
// every node of the job (the "node side", started by srun). Pure parsing
// and formatting: no process is started or touched here (slurm_job_test.cc).
//
// The wire, node side to front, on srun's standard output: one JSON object
// per line ("event"), except that an event {"ev":"file","size":N,...} is
// followed by exactly N bytes of the file. Front to node side, on srun's
// standard input: plain lines ("ping SEQ", "alive", "detach"; a detach
// --slurm's node side waits for "detach" after its pings).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace remora::cli::slurm {

// "1234", "1234.0", "1234.batch", "1234_7" (an array task), "1234_7.2".
struct JobSpec {
  std::string job;   // as scontrol and srun take it
  std::string step;  // "" every step of the job; else a number, "batch" or "extern"
  std::string text() const { return step.empty() ? job : job + "." + step; }
};
Result<JobSpec> parse_job_spec(std::string_view text);

// `scontrol show job -o JOB`: the fields remora decides on.
struct JobInfo {
  std::string id;
  std::string name;
  std::string state;  // RUNNING, PENDING, COMPLETED, ...
  std::string user;   // "alice"
  uid_t uid = static_cast<uid_t>(-1);
  std::string node_list;  // compressed: "n[1-4],gpu7"
  int num_nodes = 0;
  int num_tasks = 0;
};
// Fails with kNoSuchProcess when scontrol found no such job (its message
// names the job), kParse when the text is not a job record.
Result<JobInfo> parse_show_job(std::string_view text, const std::string& job);

// One line of `scontrol listpids JOB NODE`: "PID JOBID STEPID LOCALID GLOBALID".
struct ListedPid {
  pid_t pid = 0;
  std::string job, step;
  int local_id = -1;   // '-': not a task of its step (a child, the step's own helpers)
  int global_id = -1;  // the task's rank in its step
};
std::vector<ListedPid> parse_listpids(std::string_view text);

// The processes to attach on one node, each with its whole tree: the tasks
// (local_id >= 0) of the steps asked. `step` "" means every numbered step
// but `own_step` (the step remora itself runs in) and, when none has a task
// here, the batch step (a job whose script runs its program without srun).
// Ordered by global id, then pid.
std::vector<ListedPid> select_ranks(const std::vector<ListedPid>& listed, std::string_view step,
                                    std::string_view own_step);

// Who a process is in its job, from its own environment (a NUL-separated
// /proc/PID/environ block): SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME,
// SLURM_JOB_ID, SLURM_STEP_ID. -1 / "" where a variable is missing.
struct RankIdentity {
  int rank = -1, local_rank = -1;
  std::string node, job, step;
};
RankIdentity rank_from_environ(std::string_view block);

// One exchange of "ping" and its answer: the node side's CLOCK_MONOTONIC
// read between the front's send and receive. offset = node - front, taken
// at the exchange's midpoint; the uncertainty is half the round trip.
struct ClockSample {
  uint64_t node_mono_ns = 0;
  int64_t offset_ns = 0;
  uint64_t uncertainty_ns = 0;
};
ClockSample clock_sample(uint64_t front_sent_ns, uint64_t node_ns, uint64_t front_received_ns);
// The sample with the smallest uncertainty (a round trip the scheduler did
// not stretch); nullopt when there is none.
std::optional<ClockSample> best_sample(const std::vector<ClockSample>& samples);

// Reassembles the node side's events from its output, in pieces of any size.
class EventReader {
 public:
  struct Event {
    std::string json;     // the event's line, without its newline
    std::string payload;  // a file event's bytes
  };
  // A line must parse as JSON before the reader hands it on; a file event's
  // size is read from the line by the caller (payload_size).
  void feed(std::string_view bytes);
  // The next complete event, if any. A line that is not a JSON object is
  // returned as an event with json == "" and the line in payload (srun's own
  // messages on the same stream, a crash's last words): shown, not parsed.
  std::optional<Event> next();
  // Bytes held that do not make a whole event yet (at the end of the
  // stream: a cut-off event).
  size_t pending() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
};

// The size a file event announces ({"ev":"file","size":N}): 0 for others.
// Up to 4 GiB; larger, or malformed: nullopt.
std::optional<uint64_t> payload_size(std::string_view json_line);

// A node-relative path the node side sends for a file of its outputs:
// relative, no "..", no empty or "." segment, no NUL (the front writes it
// under the job's directory).
bool safe_relative_path(std::string_view path);

// "n[1-3],gpu[07-08]" -> n1 n2 n3 gpu07 gpu08 (Slurm's hostlist syntax,
// for a node list scontrol did not expand; one level of brackets with
// comma-separated numbers and ranges, zero padding kept).
Result<std::vector<std::string>> expand_node_list(std::string_view list);

}  // namespace remora::cli::slurm
