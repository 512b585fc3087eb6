// What the files of the attach layer share inside it (not part of its
// interface). Each file is one step of an attach (docs/architecture.md,
// "Attach, step by step"):
//   attach.cc      Controller::attach, attach_steps, detach, status, the
//                  sessions; the test-only fault injection
//   precheck.cc    refusals about the process (environment, no user space,
//                  static)
//   loader.cc      the loader thread, its trampoline and the thread waits
//   agent_load.cc  finding and loading the agent, a tool's dependencies,
//                  ensure_agent
//   listener.cc    the agent's symbols and info block, its listener, the
//                  calls into it
//   lease.cc       the lease pipe
//   unload.cc      unloading the agent
//   tree.cc        attach_tree / detach_tree, and the steps of following a
//                  tree that need a session
//   follow.cc      following a tree while it grows
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol.h"
#include "arch/host.h"
#include "attach/attach.h"
#include "base/deadline.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "remote/remote_handle.h"
#include "remote/target.h"
#include "remote/visible_file.h"

namespace remora::attach::detail {

namespace x = arch::host;  // the host's architecture (arch/host.h): never named here
using remote::CallArg;
using remote::CallOptions;

inline constexpr char kAgentName[] = "libremora-agent.so";
inline constexpr char kStartListenerFn[] = "remora_agent_start_listener";

// The agent's exported entry points and info block in one process.
struct AgentSymbols {
  uint64_t info = 0, attach_fn = 0, detach_fn = 0, lease_fn = 0;
  uint64_t attach_unmap_fn = 0;   // 0 for an agent older than this entry point
  uint64_t attach_leased_fn = 0;  // 0 for an agent of protocol 1 (no FEATURE_LEASED_ATTACH)
  uint64_t unload_fn = 0;         // 0 for an agent of protocol 2 or older (no FEATURE_UNLOAD)
  uint64_t unload_forks_fn = 0;   // 0 for an agent of protocol 6 or older (no FEATURE_PROVEN_UNLOAD)
};

// Runs work(i) for every i < n, on two threads per core but at most eight,
// the calling one included; returns when every call has returned.
void for_each_parallel(size_t n, const std::function<void(size_t)>& work);

// A thread id that the target's pid namespace gave (gettid() there: what the
// agent and the trampoline record in target memory) as this process names
// it: /proc here knows the thread only by ours. 0 when no thread of `pid`
// has that id (any more). Outside a nested pid namespace the ids are the
// same and nothing is read.
pid_t tid_as_we_name_it(pid_t pid, pid_t tid, bool nested_pid_ns);

// Waits until the thread the target's namespace calls `tid` is gone (a
// thread of a stopped process is driven to its end). The loader thread's
// wait: it still returns through our scratch code and runs on our stack
// after its last store to the block, so neither may go before the thread.
Result<void> wait_target_thread_gone(pid_t pid, pid_t tid, bool nested_pid_ns, const Deadline& deadline);

// The calling thread's timer slack, 1 ns while it lives, then put back.
// Why: an attach waits by short sleeps (this layer's polls of the loader
// block, the listener and threads going away; the ptrace layer's polls for a
// stop), 20-200 us each, a dozen or more per attach. The kernel stretches
// every sleep of a normal thread by its timer slack, 50 us by default:
// nanosleep(20 us) returned after 86 us on the benchmark machine, and with a
// slack of 1 ns after 34 us (docs/benchmarks.md, "Attach rows of issue 12
// part 5"). The slack is per thread (prctl PR_SET_TIMERSLACK): the caller's
// other threads and the target are untouched, and threads started while it
// is set (for_each_parallel's workers) inherit it and end with it. Held by
// every public Controller entry point that waits.
class ScopedTimerSlack {
 public:
  ScopedTimerSlack();
  ~ScopedTimerSlack();
  ScopedTimerSlack(const ScopedTimerSlack&) = delete;
  ScopedTimerSlack& operator=(const ScopedTimerSlack&) = delete;

 private:
  long saved_ = -1;  // the slack before, in ns; -1: unknown, nothing to put back
};

// ---- attach.cc ----

void pause_briefly(long ns);
bool pidfd_alive(int pidfd);
bool fault_injected(std::string_view name);

// ---- precheck.cc ----

Result<void> check_environment(pid_t pid);
Result<void> check_dynamic(const remote::Target& t);

// ---- loader.cc ----

// A first attach the loader thread makes itself, right after its dlopen of
// the agent (the trampoline's hook: the agent's remora_agent_loader_attach),
// instead of a remote call on the listener: the attach call's whole
// transaction fewer. Only for an attach without a lease, whose tools the
// target sees as they are with nothing of theirs to deliver, into a process
// that is not stopped (loader_attach_for); the agent's listener then removes
// our scratch and the loader's stack once that thread is gone.
struct LoaderAttach {
  std::vector<std::byte> env;
  std::string list;
  RemoteAddr dlsym_fn;
  uint64_t id = 0;                      // the request's, for retire_go
  std::chrono::milliseconds timeout{};  // the request's ack_timeout_ms
};

// A hook of the trampoline's that takes one integer and no request: the
// agent's remora_agent_start_listener (request_listener, ensure_agent).
struct PlainHook {
  RemoteAddr dlsym_fn;
  const char* name = nullptr;
  uint64_t arg = 0;
};

// The loader thread at work: `block_at` is its block in the target.
struct LoaderRun {
  uint64_t block_at = 0;
  x::LoaderBlock block{};
  const LoaderAttach* hook = nullptr;  // the attach to make on it, if any
  const PlainHook* plain = nullptr;    // else a plain hook to call, if any
  bool hook_takes_stack = false;       // the agent removes the thread's stack (start_loader_thread)
  uint64_t start_at = 0;               // the loader start routine's block, once written (write_loader)
  x::LoaderStart start{};
  std::array<RemoteAddr, 2> stack_fns{};                    // pthread_attr_init, pthread_attr_setstack
  Result<std::vector<pid_t>> before{std::vector<pid_t>{}};  // the tasks before it was created
  pid_t loader = 0;                                         // its tid, when Remora drove it itself
  bool driven = false;  // the process is stopped: Remora ran the loader thread
};

// The hook's result, as the block has it once the trampoline is done:
// kHookNotRun when the hook did not run (no such symbol in the library).
inline constexpr uint64_t kHookNotRun = 0x7fffffffffffffffull;

Result<RemoteAddr> find_loader_functions(remote::Target& t, x::LoaderBlock* block,
                                         std::array<RemoteAddr, 2>* stack_fns);
// The target's dlsym (libc's, or libdl's before glibc 2.34).
Result<RemoteAddr> find_dlsym(remote::Target& t);
Result<void> run_trampoline_thread(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                   std::string_view path, const Deadline& deadline,
                                   remote::RemoteHandle* stack_out = nullptr);
Result<void> wait_thread_gone(pid_t pid, pid_t tid, const Deadline& deadline);

// ---- agent_load.cc ----

// A file made visible in the target; its memfd, when it needs one, is owned
// and closed in the target once the handle goes, and a copy placed in a root
// without /proc is removed then (a loaded library keeps its own mapping, so
// nothing needs the descriptor or the copy after the load).
struct OwnedFile {
  std::string path;
  remote::RemoteHandle memfd;
  remote::PlacedFile placed;
};

Result<OwnedFile> make_visible_owned(remote::Target& t, const std::string& host_path,
                                     const remote::CallOptions& close_on = {});
Result<void> deliver_dependencies(remote::Target& t, const std::string& library, const Deadline& deadline,
                                  std::set<std::string>* seen, std::vector<OwnedFile>* kept);
Result<pid_t> ensure_agent(remote::Target& t, pid_t pid, const AttachOptions& opts, const Deadline& deadline,
                           AgentSymbols* agent, remote::RemoteHandle* retired, bool* loaded_now,
                           OwnedFile* agent_file, std::optional<uint64_t>* loader_attach);

// ---- listener.cc ----

// The agent our own loader thread has just loaded: the handle dlopen
// returned (its struct link_map) and our copy of the file it loaded.
struct JustLoaded {
  uint64_t handle = 0;
  std::string path;
};

Errc errc_for_agent(int rc);
// Controller::status through /proc/PID/mem (the agent's info block).
Result<AgentState> status_through_memory(pid_t pid);
Result<bool> resolve_agent(remote::Target& t, AgentSymbols* out, bool retire_own = false,
                           const JustLoaded* just = nullptr);
void listener_as_we_name_it(pid_t pid, remora_agent_info* info, bool nested_pid_ns = true);
Result<remora_agent_info> read_info(remote::Target& t, uint64_t addr);
Result<remora_agent_info> read_info_head(remote::Target& t, uint64_t addr);
// Whether the agent has no listener and none was asked for (an agent of
// LISTENER_ON_REQUEST, preloaded or forked, that no controller called yet).
bool needs_listener(const remora_agent_info& head);
// Starts the listener of such an agent (needs_listener) on a fresh thread:
// the trampoline's dlopen(libremora-agent.so, RTLD_NOLOAD) and its hook
// remora_agent_start_listener(1). Returns the listener's tid when Remora had
// to drive the thread (a stopped process), else 0.
Result<pid_t> request_listener(remote::Target& t, pid_t pid, const Deadline& deadline);
Result<remora_agent_info> wait_for_listener(remote::Target& t, pid_t pid, uint64_t info_at,
                                            pid_t known_listener, const Deadline& deadline,
                                            bool* started = nullptr);
Result<std::string> tool_list(remote::Target& t, const std::vector<std::string>& tools, bool reattach,
                              const remote::CallOptions& on_listener, const Deadline& deadline,
                              std::vector<OwnedFile>* memfds);
std::string already_attached_message(const remora_agent_info& info);

// The attach call's arguments (call_agent_attach).
struct AttachCall {
  const std::vector<std::byte>& env;
  const std::string& list;
  remote::RemoteHandle& retired;
  std::vector<OwnedFile>& memfds;
  remote::RemoteHandle* lease_read = nullptr;
  UniqueFd* lease_fd = nullptr;
};

Result<void> call_agent_attach(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                               const remote::CallOptions& on_listener, AttachCall c);
Result<void> finish_loader_attach(remote::Target& t, pid_t pid, const AgentSymbols& agent, uint64_t id,
                                  const Deadline& deadline);

// ---- lease.cc ----

Result<remote::RemoteHandle> make_lease_pipe(remote::Target& t, pid_t pid,
                                             const remote::CallOptions& on_listener, UniqueFd* lease_fd);
void hand_over_read_end(remote::Target& t, pid_t pid, uint64_t info_at, bool call_ran,
                        remote::RemoteHandle& read_end, const UniqueFd& lease_fd);
Result<void> arm_lease_or_detach(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                 const remote::CallOptions& on_listener, UniqueFd* lease_fd,
                                 const std::string& ctx);

// ---- unload.cc ----

Result<UnloadReport> unload_agent(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                  remora_agent_info info, std::chrono::milliseconds timeout);

}  // namespace remora::attach::detail

namespace remora::attach {

struct Controller::Session {
  std::mutex mu;
  pid_t pid = 0;
  UniqueFd pidfd;
  std::unique_ptr<remote::Target> target;
  detail::AgentSymbols agent;
  pid_t listener = 0;
  UniqueFd lease_fd;  // our end of the lease pipe
  // Attached by this controller and not detached since: what detach(0)
  // detaches. A failed attach (say, a process another controller attached)
  // leaves it false. The session itself stays after a detach, so that a
  // re-attach finds the process open and the agent's symbols resolved.
  bool attached = false;
};

// A session through the socket channel (socket_session.cc): no Target, no
// agent symbols; the lease is a pipe whose read end went over the socket.
struct Controller::SocketSession {
  std::mutex mu;
  pid_t pid = 0;
  UniqueFd pidfd;
  UniqueFd lease;  // the lease pipe's write end while attached with a lease
  bool attached = false;
};

}  // namespace remora::attach
