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
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::attach {

// How the controller reaches a process's agent.
enum class Channel {
  kAuto,    // ptrace where it is allowed; the socket where it is refused and the process opted in
  kPtrace,  // ptrace only (the agent is injected when missing)
  // The agent's unix socket only (agent/channel_wire.h): no ptrace, no read
  // of the process's memory; the process must have opted in at launch
  // (remora run --listen, or the agent preloaded with REMORA_TOOL_ATTACH=1).
  kSocket,
};
std::string_view channel_name(Channel c);  // "auto", "ptrace", "socket"
// "auto", "ptrace" or "socket"; anything else fails with kInvalidArgument.
Result<Channel> parse_channel(std::string_view s);

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
  // Through the socket the tools are sent as descriptors (SCM_RIGHTS): the
  // target needs no view of the controller's files.
  Channel channel = Channel::kAuto;
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
  // A process attached through its socket is detached through it whatever
  // this says; kAuto finds the socket where ptrace is refused.
  Channel channel = Channel::kAuto;
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
  Channel channel = Channel::kPtrace;  // the one used (never kAuto)
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
  pid_t forked_from = 0;  // forked while attached, from this parent (the process's view); protocol 4
  // An attach was handed to the agent by the loader thread that loaded it
  // (no attach call on the listener); protocol 5.
  bool loader_attached = false;
  std::string message;  // why the last agent call failed
  Channel channel = Channel::kPtrace;  // how this state was read (never kAuto)
  // How the attached session came (agent protocol 6 and later): through
  // the socket channel, or through ptrace.
  Channel session_channel = Channel::kPtrace;
  // The process opted in to the socket channel: its abstract socket
  // ("@remora-agent.PID.SIGNO"), empty when it has none.
  std::string socket;
};

// Following a tree while it grows (Controller::follow_start/follow_poll).
struct FollowOptions {
  // Also attach processes that appear under the tree without an inherited
  // session: a child that exec'ed (its agent went with the old program), a
  // child of a process that has no agent. false: forked children that kept
  // the session (REMORA_AGENT_FEATURE_FORK_LEASE) are adopted, nothing new
  // is attached (`remora attach --attach-children=false`).
  bool attach_new = true;
  // A process without the agent is attached once it has been seen in two
  // polls at least this far apart with its libc mapped and no thread in its
  // dynamic loader: an exec'ed program's loader must have finished (the
  // agent is loaded through its libc's dlopen and pthread_create).
  std::chrono::milliseconds settle{20};
};

// What one poll did about one process that appeared in a followed tree.
struct FollowEvent {
  enum class Kind {
    kAdopted,   // forked while attached: its session (and lease) is now this controller's
    kAttached,  // attached like a new process (it exec'ed, or its parent has no agent)
    kFailed,    // could not be adopted or attached: outcome says why; not tried again
  };
  Kind kind = Kind::kFailed;
  pid_t pid = 0;
  pid_t parent = 0;     // its parent when it was found (0: unknown)
  bool execed = false;  // kAttached: it had been adopted, then exec'ed (same pid, a new program)
  ProcessOutcome outcome;
};

// What an operation will do to a process, for check_target.
enum class TargetUse {
  kProcess,  // attach to it or detach from it: every refusal below
  kTree,     // the same for its tree: the refusals of the root alone (the
             // caller itself, traced by another, ptrace refused, statically
             // linked) only when it has no children, which may still attach
  kRead,     // read its agent's state (status): stops and calls nothing, so
             // only gone, a zombie, a kernel thread (and a bad pid)
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

  // Follows the tree under `root` while it grows: follow_start records the
  // processes there are now (they are attach_tree's business, attached or
  // not: follow_poll never looks at them again), then each follow_poll walks
  // the tree again (/proc/PID/task/*/children) and deals with what
  // appeared: a forked child whose agent kept this controller's session is
  // adopted (a session of this controller from then on: in sessions(),
  // detached with the rest, its lease this controller's, armed by the
  // controller when the child's agent has none); a process without the agent
  // is attached with `opts` once it has settled (FollowOptions::settle); an
  // adopted process that exec'ed is attached again the same way. A process
  // attached by another controller, or refused, is reported once (kFailed).
  // A child that lives shorter than the time between two polls is never
  // seen. Each poll costs a read of the children files of every thread of
  // every process of the tree, plus an attach per new process; polls of one
  // root must not run concurrently. rocattach_attach_tree and the C API do
  // not follow: attach_tree stays a snapshot.
  Result<void> follow_start(pid_t root, const FollowOptions& fo = {});
  Result<std::vector<FollowEvent>> follow_poll(pid_t root, const AttachOptions& opts);
  // Detaches every session of this controller (attach, attach_tree and
  // followed processes), four at a time; one outcome each.
  std::vector<ProcessOutcome> detach_sessions(const DetachOptions& opts);

  // Reads the agent's state in `pid` (no thread is stopped): from its
  // memory (kPtrace: /proc/PID/mem, which needs ptrace access), or over its
  // socket (kSocket); kAuto reads the memory where it may, else the socket.
  static Result<AgentState> status(pid_t pid, Channel channel = Channel::kAuto);
  // The process tree under `root`, breadth-first, root first.
  static Result<std::vector<pid_t>> snapshot_tree(pid_t root);

  // Pids this controller attached and has not detached (a failed attach
  // counts for nothing).
  std::vector<pid_t> sessions() const;

 private:
  struct Session;
  Result<std::shared_ptr<Session>> session_for(pid_t pid, bool create);
  bool vetted(pid_t pid);  // a live session exists: check_target was made when it opened
  Result<ProcessOutcome> attach_one(pid_t pid, int pidfd, const AttachOptions& opts);
  Result<ProcessOutcome> attach_steps(pid_t pid, int pidfd, const AttachOptions& opts);
  Result<UnloadReport> detach_one(pid_t pid, const DetachOptions& opts);
  std::vector<ProcessOutcome> detach_each(const std::vector<pid_t>& pids, const DetachOptions& opts);
  // follow.cc's steps that need a session's insides (attach.cc).
  Result<ProcessOutcome> adopt(pid_t pid, int pidfd, const AttachOptions& opts, bool parent_ours);
  bool agent_left(pid_t pid);              // an adopted or attached process exec'ed: its agent is gone
  void forget(pid_t pid);                  // drops the session of a process that exec'ed
  UniqueFd lease_pipe_held_by(pid_t pid);  // a dup of our lease write end whose read end `pid` holds
  struct Follow;
  // The socket channel (socket_session.cc).
  struct SocketSession;
  Result<Channel> route(pid_t pid, Channel asked, TargetUse use, const std::string& ctx);
  std::shared_ptr<SocketSession> socket_session(pid_t pid);
  Result<ProcessOutcome> attach_socket(pid_t pid, const AttachOptions& opts);
  Result<UnloadReport> detach_socket(pid_t pid, const DetachOptions& opts);

  mutable std::mutex mu_;
  std::map<pid_t, std::shared_ptr<Session>> sessions_;
  std::map<pid_t, std::vector<pid_t>> trees_;         // root -> pids attached by attach_tree
  std::map<pid_t, std::shared_ptr<Follow>> follows_;  // root -> what follow_poll knows
  std::map<pid_t, std::shared_ptr<SocketSession>> socket_sessions_;
};

// The refusals about process `pid` itself, in the words `remora call` uses:
// kInvalidArgument (pid <= 0, a thread id), kOwnProcess, kNoSuchProcess,
// kZombie, kKernelThread, kTracedByOther (a tracer that stays past
// ptrace::kPassingTracerGrace), kPtraceDenied, kStaticBinary. Reads /proc
// only, changes nothing. Every entry point (Controller's attach, detach and
// status, the CLI, the C API) calls it before anything else, so that the
// process is refused before tools are looked for or outputs planned. Errors
// carry no context: the caller says what it was doing ("attach to process
// N"). Any thread.
Result<void> check_target(pid_t pid, TargetUse use);

// Which channel reaches process `pid` for `use` (kProcess: attach or
// detach; kRead: status), with check_target's refusals: kPtrace and kSocket
// as asked (kSocket refused when the process has no socket: it did not opt
// in); kAuto is ptrace unless check_target refuses it with kPtraceDenied
// and the process opted in (then kSocket). A ptrace refusal with no socket
// says how to opt in. Reads /proc only. (Controller::attach and detach
// decide so too, and also go to the socket when a seize is refused later.)
Result<Channel> resolve_channel(pid_t pid, Channel asked, TargetUse use);

// Finds libremora-agent.so (see AttachOptions::agent_path).
Result<std::string> find_agent_library(const std::string& explicit_path = {});

// Builds the agent's environment buffer: [uint32 count] then NAME\0VALUE\0 pairs.
std::vector<std::byte> encode_env(const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace remora::attach
