// What `remora attach`, `detach`, `status` and `run` share and what touches
// the system: finding the default tool, preparing its output directory,
// collecting and printing its outputs after a detach, printing per-process
// outcomes, and taking SIGINT/SIGTERM/SIGHUP synchronously.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "attach/attach.h"
#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::cli {

class StagedOutput;

using EnvList = std::vector<std::pair<std::string, std::string>>;

inline constexpr char kDefaultToolName[] = "libremora-tool.so";

// The tools of a command line: -t's list (each must be a readable file) or,
// without -t, the default tool (REMORA_TOOL_PATH, else libremora-tool.so in
// the agent's directory). Paths are made absolute.
struct ToolSelection {
  std::vector<std::string> paths;
  bool default_tool = false;  // libremora-tool.so is among them: it writes outputs
};
// `spec`: -t's value, or nullopt when -t was not given. Fails with
// kInvalidArgument for a missing -t file and kToolFailed when the default
// tool is not installed (the message says to pass -t).
Result<ToolSelection> select_tools(const std::optional<std::string>& spec);

// Parses every -e NAME=VALUE (the last NAME wins).
Result<EnvList> parse_env_list(const std::vector<std::string>& items);

// Where the default tool's sessions land, for the user and for the target.
struct OutputPlan {
  std::string root;  // where remora finds (and renders) the session directories
  // Set when the target has a root of its own (a container) and no
  // REMORA_OUTPUT_PATH was given: it writes into this private directory of
  // its root, and collect() brings the finished sessions out to `root`.
  std::shared_ptr<StagedOutput> staged;
  // After the detach: brings the sessions out ("" or what failed).
  std::string collect() const;
};

// For the default tool: makes REMORA_OUTPUT_PATH in `env` absolute, as the
// process `pid` would resolve it (a relative value against its working
// directory, /proc/PID/cwd). Unset: `output_dir` (-o, relative to remora's
// cwd; "": <remora's cwd>/remora-output), on this side: the target writes
// into it when it sees that very directory and may write there, else into
// a private directory inside its root, and the sessions are brought out
// (OutputPlan::staged). -o with REMORA_OUTPUT_PATH is kInvalidArgument.
// `socket`: the process is reached through its socket channel, where ptrace
// is refused: a root that cannot be looked into (/proc/PID/root needs ptrace
// access) is taken for ours (the same host), and nothing is staged in
// memory (that needs ptrace).
Result<OutputPlan> prepare_output_path(EnvList& env, pid_t pid, bool socket = false,
                                       const std::string& output_dir = "");

// /proc/PID/comm without its newline; "?" when the process is gone.
std::string process_comm(pid_t pid);

// A session directory the default tool wrote.
struct OutputDir {
  pid_t pid = 0;       // from its name (the pid as the process saw itself)
  std::string path;    // as this process can open it
  pid_t host_pid = 0;  // the process as this controller sees it (0: pid, the same namespace)
};
// The session directories under `root` now (their names): taken before an
// attach, so that find_outputs never shows an older session's directory as
// this one's (a target killed during the session writes none).
std::set<std::string> existing_outputs(const std::string& root);
// The newest session directory of each of `pids` under `root` written since
// `since` that holds a finished session (profile.remora), then those of
// other processes (children forked during the session that exited) written
// since `since`; none named in `before`.
std::vector<OutputDir> find_outputs(const std::string& root, const std::vector<pid_t>& pids,
                                    std::chrono::system_clock::time_point since,
                                    const std::set<std::string>& before = {});
// Renders each directory (profile::render_session: its raw records become
// every output file), prints its summary.txt (which names them); says where it
// looked when `dirs` is empty. Returns false when nothing was found.
bool print_outputs(FILE* out, const std::string& root, const std::vector<OutputDir>& dirs);
// One directory of print_outputs: renders it, prints its summary and files,
// or what kept it from rendering (also returned).
Result<void> render_and_print(FILE* out, const OutputDir& dir);

// One line per process: "  PID  COMMAND  RESULT".
void print_outcome_header(FILE* out);
void print_outcome(FILE* out, pid_t pid, const std::string& comm, const std::string& result);
// "attached (agent loaded now, 85 ms)" or "failed: <message>".
std::string describe_attach(const attach::ProcessOutcome& o);
// Did the process go away (rather than refuse)? Such outcomes in a tree are
// reported but are not failures: short-lived children come and go (a
// zombie, exited and not yet reaped by its parent, counts as gone).
bool is_gone(Errc code);

// "unloaded" for a detach with unload, with the tools that stayed loaded
// named ("unloaded; kept libx.so (cannot be unloaded)").
std::string describe_unload(const attach::UnloadReport& u);
// Prints, on stderr, one "warning:" line per tool that stayed loaded after
// an unload of process `pid`.
void warn_kept_tools(pid_t pid, const attach::UnloadReport& u);

// Blocks SIGINT, SIGTERM and SIGHUP for the whole process (before any
// thread starts) and reads them from a signalfd. They stay blocked until
// remora exits: a signal that killed remora in the middle of a remote call
// would leave a seized thread half-way (the lease only covers the time
// between calls), so they are only ever taken between operations.
class StopSignals {
 public:
  static Result<StopSignals> install();
  int fd() const { return fd_.get(); }
  // The next pending signal, if any (non-blocking).
  std::optional<int> take(int* si_code = nullptr);
  // The mask before install(): what a child should run with.
  const sigset_t& old_mask() const { return old_mask_; }

 private:
  StopSignals() = default;
  UniqueFd fd_;
  sigset_t old_mask_{};
};

// The process's pidfd (empty when pidfd_open fails: the process is gone).
UniqueFd open_pidfd(pid_t pid);
bool pidfd_exited(int pidfd);

// How a process that is not our child ended, once its pidfd reads as
// exited: its wait status, from the pidfd (PIDFD_GET_INFO, Linux 6.15+:
// also after its parent reaped it) or else /proc/PID/stat while it is a
// zombie; nullopt when neither tells (its parent reaped it first on an older
// kernel).
std::optional<int> exit_status(pid_t pid, int pidfd);
// "exited with status 3", "was killed by SIGSEGV (signal 11, core dumped)".
std::string describe_exit_status(int status);

std::chrono::milliseconds since(std::chrono::steady_clock::time_point t0);

}  // namespace remora::cli
