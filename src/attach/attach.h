// The attach layer: load tool libraries into running processes (one, or a
// whole process tree), run their attach/detach lifecycle through Remora's
// in-target agent, and keep track of the sessions this controller made.
//
// Threading: a Controller is thread-safe and reentrant; operations on
// different processes run concurrently, operations on one process are
// serialised. Every remote call seizes and releases its thread within the
// call, on the calling OS thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::attach {

struct AttachOptions {
  // Tool libraries (paths as the controller sees them), in call order.
  std::vector<std::string> tools;
  // Extra environment applied in the target (setenv) before the tools load.
  std::vector<std::pair<std::string, std::string>> env;
  // Deadline for each remote operation (agent load, attach call).
  std::chrono::milliseconds timeout{10000};
  // Lease: when this controller dies before detaching, the agent detaches
  // the tools itself (they flush their data). Off keeps tools attached.
  bool lease = false;
  // The agent library; empty: REMORA_AGENT_PATH, then next to Remora's own
  // library or executable (../lib), then the install location.
  std::string agent_path;
};

struct DetachOptions {
  // Deadline for each remote operation.
  std::chrono::milliseconds timeout{10000};
  // After the detach, take the tools and the agent out of the process: the
  // listener dlcloses the tools (after tool_fini) and returns, the lease
  // watcher is joined, then a fresh thread dlcloses the agent. The target's
  // descriptors and mappings are then those it had before the agent came,
  // save what a tool that cannot be unloaded keeps (UnloadReport). A process
  // whose tools are detached already is unloaded all the same; one without
  // an agent fails with kNotAttached.
  bool unload = false;
};

// What an unload left behind in one process (DetachOptions::unload).
struct UnloadReport {
  bool unloaded = false;  // the agent is gone from the process's maps
  // Tools whose library stayed mapped after their dlclose: the dlclose
  // failed, the library is RTLD_NODELETE (or has unique symbols, which glibc
  // makes so), or another library holds a reference to it. The rest of the
  // process was unloaded all the same.
  std::vector<std::string> kept_tools;
};

// What one process reported after an attach or detach.
struct ProcessOutcome {
  pid_t pid = 0;
  bool ok = false;
  bool agent_loaded_now = false;  // the agent was injected by this attach
  std::string message;            // error text when !ok
  Errc code = Errc::kOk;
  std::chrono::nanoseconds elapsed{0};
  UnloadReport unload;  // a detach with DetachOptions::unload
};

// The agent's view of a process (the truth about its session).
struct AgentState {
  bool agent_loaded = false;
  bool attached = false;
  uint64_t sessions = 0, detaches = 0;
  std::string tools;  // ':'-separated, as loaded
  pid_t listener_tid = 0;
  pid_t lease_pid = 0;
  bool lease_expired = false;
  std::string message;  // why the last agent call failed
};

class Controller {
 public:
  Controller();
  ~Controller();  // closes its sessions without detaching (the lease, if armed, then fires)
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Attaches opts.tools to process `pid`, loading the agent first if needed.
  Result<ProcessOutcome> attach(pid_t pid, const AttachOptions& opts);
  // Detaches the tools from `pid` (whoever attached them); pid 0 detaches
  // every session this controller made (the last error is returned).
  Result<void> detach(pid_t pid, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  // The same, with options: opts.unload also takes the tools and the agent
  // out of the process (see DetachOptions). A tool that stays loaded is
  // named in the report and is no failure; an agent of an older Remora
  // (loaded RTLD_NODELETE) fails with kNotSupported after its detach. pid 0:
  // every session, the reports merged, the last error returned.
  Result<UnloadReport> detach(pid_t pid, const DetachOptions& opts);

  // Snapshots the tree under `root` breadth-first (through
  // /proc/PID/task/*/children), holds a pidfd for each process, and attaches
  // each one, on one thread per core (at most four). A failure on one
  // process is reported in its outcome (ok == false, code, message) and the
  // others continue; the Result fails only when the tree cannot be read at
  // all. (The C and rocattach APIs turn the outcomes into "the last error
  // seen".)
  Result<std::vector<ProcessOutcome>> attach_tree(pid_t root, const AttachOptions& opts);
  // Detaches what attach_tree(root) attached.
  Result<std::vector<ProcessOutcome>> detach_tree(
      pid_t root, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  Result<std::vector<ProcessOutcome>> detach_tree(pid_t root, const DetachOptions& opts);

  // Reads the agent's state in `pid` (no thread is stopped).
  static Result<AgentState> status(pid_t pid);
  // The process tree under `root`, breadth-first, root first.
  static Result<std::vector<pid_t>> snapshot_tree(pid_t root);

  // Pids this controller attached and has not detached (a failed attach
  // counts for nothing).
  std::vector<pid_t> sessions() const;

 private:
  struct Session;
  Result<std::shared_ptr<Session>> session_for(pid_t pid, bool create);
  Result<ProcessOutcome> attach_one(pid_t pid, int pidfd, const AttachOptions& opts);
  Result<ProcessOutcome> attach_steps(pid_t pid, int pidfd, const AttachOptions& opts);
  Result<UnloadReport> detach_one(pid_t pid, const DetachOptions& opts);

  mutable std::mutex mu_;
  std::map<pid_t, std::shared_ptr<Session>> sessions_;
  std::map<pid_t, std::vector<pid_t>> trees_;  // root -> pids attached by attach_tree
};

// Finds libremora-agent.so (see AttachOptions::agent_path).
Result<std::string> find_agent_library(const std::string& explicit_path = {});

// Builds the agent's environment buffer: [uint32 count] then NAME\0VALUE\0 pairs.
std::vector<std::byte> encode_env(const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace remora::attach
