// How a tool gets attached (see ../../shared/design/architecture.md, "The
// attach sequence"):
//  1. Refuse a target whose environment says REMORA_TOOL_ATTACH=0 (or
//     ROCP_TOOL_ATTACH=0), before touching it at all.
//  2. If the agent is not loaded: make it visible inside the target (its path,
//     or a memfd), and have one application thread do nothing but
//     pthread_create() a fresh thread running Remora's trampoline, which
//     dlopen()s the agent. dlopen never runs on an interrupted application
//     thread: that thread may hold the malloc or loader lock, and dlopen
//     needs both (kubo/injector#5, pyrasite#75). The interrupted thread is
//     chosen blocked in a restartable system call, where glibc holds no
//     internal lock; pthread_create itself takes the stack-cache and malloc
//     locks only briefly. The fresh thread holds nothing.
//  3. Everything else (attach, detach, lease, pipe2) runs as remote calls on
//     the agent's idle listener thread.
#include "attach/attach.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "agent/protocol.h"
#include "arch/x86_64.h"
#include "base/deadline.h"
#include "base/log.h"
#include "base/strings.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/lookup.h"
#include "remote/memory.h"
#include "remote/target.h"
#include "remote/visible_file.h"

#ifndef REMORA_INSTALL_LIBDIR
#define REMORA_INSTALL_LIBDIR "/usr/local/lib"
#endif

namespace remora::attach {

namespace x = arch::x86_64;
using remote::CallArg;
using remote::CallOptions;

constexpr char kAgentName[] = "libremora-agent.so";

// The agent's exported entry points and info block in one process.
struct AgentSymbols {
  uint64_t info = 0, attach_fn = 0, detach_fn = 0, lease_fn = 0;
  uint64_t attach_unmap_fn = 0;  // 0 for an agent older than this entry point
};

struct Controller::Session {
  std::mutex mu;
  pid_t pid = 0;
  UniqueFd pidfd;
  std::unique_ptr<remote::Target> target;
  AgentSymbols agent;
  pid_t listener = 0;
  UniqueFd lease_fd;  // our end of the lease pipe
  // Attached by this controller and not detached since: what detach(0)
  // detaches. A failed attach (say, a process another controller attached)
  // leaves it false. The session itself stays after a detach, so that a
  // re-attach finds the process open and the agent's symbols resolved.
  bool attached = false;
};

namespace {

void pause_briefly(long ns) {
  timespec ts{0, ns};
  nanosleep(&ts, nullptr);
}

// A pidfd polls readable once the process has exited, zombie or not
// (pidfd_send_signal(0) still succeeds on a zombie).
bool pidfd_alive(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_file(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

Errc errc_for_agent(int rc) {
  switch (rc) {
    case REMORA_AGENT_ERR_REFUSED: return Errc::kRefused;
    case REMORA_AGENT_ERR_BAD_ARGUMENT: return Errc::kInvalidArgument;
    case REMORA_AGENT_ERR_LOAD: return Errc::kToolFailed;
    case REMORA_AGENT_ERR_NOT_ATTACHABLE: return Errc::kNotAttachable;
    case REMORA_AGENT_ERR_TOOL_FAILED: return Errc::kToolFailed;
    case REMORA_AGENT_ERR_DIFFERENT_TOOLS: return Errc::kInvalidArgument;
    case REMORA_AGENT_ERR_NOT_ATTACHED: return Errc::kNotAttached;
    case REMORA_AGENT_ERR_ALREADY_ATTACHED: return Errc::kAlreadyAttached;
    default: return Errc::kInternal;
  }
}

// Does the target refuse tools through its environment? (Read without
// stopping it.)
Result<void> check_environment(pid_t pid) {
  auto env = procfs::read_bytes("/proc/" + std::to_string(pid) + "/environ");
  if (!env) return ok();  // unreadable: the agent checks again in the target
  std::string_view all(reinterpret_cast<const char*>(env->data()), env->size());
  for (std::string_view var : {"REMORA_TOOL_ATTACH=0", "ROCP_TOOL_ATTACH=0"}) {
    size_t pos = 0;
    while ((pos = all.find(var, pos)) != std::string_view::npos) {
      bool starts = pos == 0 || all[pos - 1] == '\0';
      bool ends = pos + var.size() == all.size() || all[pos + var.size()] == '\0';
      if (starts && ends)
        return Error(Errc::kRefused, "process " + std::to_string(pid) +
                                         " refuses tool attachment: it was started with " + std::string(var) +
                                         " in its environment");
      pos += var.size();
    }
  }
  return ok();
}

}  // namespace

std::vector<std::byte> encode_env(const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::byte> out(4);
  uint32_t count = static_cast<uint32_t>(env.size());
  std::memcpy(out.data(), &count, 4);
  for (const auto& [name, value] : env) {
    for (const std::string* s : {&name, &value}) {
      auto bytes = std::as_bytes(std::span(s->data(), s->size()));
      out.insert(out.end(), bytes.begin(), bytes.end());
      out.push_back(std::byte{0});
    }
  }
  return out;
}

Result<std::string> find_agent_library(const std::string& explicit_path) {
  std::vector<std::string> tried;
  auto consider = [&](const std::string& p) -> bool {
    tried.push_back(p);
    return is_file(p);
  };
  auto absolute = [](const std::string& p) {
    char real[PATH_MAX];
    return std::string(::realpath(p.c_str(), real) ? real : p.c_str());
  };
  if (!explicit_path.empty()) {
    if (consider(explicit_path)) return absolute(explicit_path);
    return Error(Errc::kInvalidArgument, "agent library " + explicit_path + " not found or not readable");
  }
  if (const char* env = std::getenv("REMORA_AGENT_PATH"); env && *env) {
    if (consider(env)) return absolute(env);
  }
  std::vector<std::string> dirs;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_agent_library), &info) && info.dli_fname)
    dirs.push_back(dir_of(info.dli_fname));
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string d = dir_of(exe);
    dirs.push_back(d + "/../lib");
    dirs.push_back(d);
  }
  dirs.push_back(REMORA_INSTALL_LIBDIR);
  for (const auto& d : dirs) {
    std::string p = d + "/" + kAgentName;
    char real[PATH_MAX];
    if (consider(p)) return std::string(::realpath(p.c_str(), real) ? real : p.c_str());
  }
  std::string list;
  for (const auto& t : tried) list += "\n  " + t;
  return Error(Errc::kInvalidArgument, std::string("cannot find ") + kAgentName +
                                           "; set REMORA_AGENT_PATH to its path. Looked at:" + list);
}

Controller::Controller() = default;
Controller::~Controller() = default;

std::vector<pid_t> Controller::sessions() const {
  std::lock_guard lock(mu_);
  std::vector<pid_t> out;
  for (const auto& [pid, s] : sessions_)
    if (s->attached) out.push_back(pid);
  return out;
}

Result<std::shared_ptr<Controller::Session>> Controller::session_for(pid_t pid, bool create) {
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(pid);
    if (it != sessions_.end()) {
      if (pidfd_alive(it->second->pidfd.get())) return it->second;
      sessions_.erase(it);  // the process died: its pid may be someone else's now
    }
  }
  if (!create) return std::shared_ptr<Session>();
  auto s = std::make_shared<Session>();
  s->pid = pid;
  s->target = REMORA_TRY(remote::Target::open(pid));
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return Error(Errc::kNoSuchProcess, "process " + std::to_string(pid) + " exited", errno);
  s->pidfd.reset(fd);
  std::lock_guard lock(mu_);
  auto [it, inserted] = sessions_.emplace(pid, s);
  return it->second;
}

namespace {

// Resolves the agent's entry points if it is loaded; false when it is not.
// One read of the maps for everything. `retire_own`: our own scratch, if
// the agent's stubs replace it, is left for the caller to have removed
// (see Target::take_retired_scratch) rather than removed by a call now.
Result<bool> resolve_agent(remote::Target& t, AgentSymbols* out, bool retire_own = false) {
  const remote::Target::SymbolQuery queries[] = {{"remora_agent_info", false},
                                                 {"remora_agent_attach"},
                                                 {"remora_agent_detach"},
                                                 {"remora_agent_set_lease"},
                                                 {"remora_agent_attach_unmap", true, false},
                                                 {"remora_agent_stub", true, false},
                                                 {"remora_agent_scratch", false, false}};
  auto found = t.find_symbols(kAgentName, queries);
  if (!found && found.error().code() == Errc::kLibraryNotMapped) return false;
  if (!found) return std::move(found).error();
  const auto& f = *found;
  *out = AgentSymbols{f[0].addr(), f[1].addr(), f[2].addr(), f[3].addr(), f[4].addr()};
  // Calls from now on run through the agent's own stubs and buffer: no
  // scratch mapping of ours stays in the process. Adopted only if the bytes
  // are exactly ours (an agent of another build may differ).
  if (!f[5].null() && !f[6].null()) {
    auto want = x::stub_code();
    std::array<std::byte, x::Stub::kSize> have{};
    if (t.read(f[5], have) && have == want)
      REMORA_TRY(t.adopt_scratch(f[5], f[6], REMORA_AGENT_SCRATCH_SIZE, /*remove_own=*/!retire_own));
  }
  return true;
}

Result<remora_agent_info> read_info(remote::Target& t, uint64_t addr) {
  remora_agent_info info{};
  REMORA_TRY(t.read(RemoteAddr(addr), std::as_writable_bytes(std::span(&info, 1))));
  return info;
}

// True when the process is in a job-control stop (every thread 'T' and not
// because a tracer holds it).
bool process_is_stopped(pid_t pid) {
  auto st = procfs::read_status(pid);
  return st && st->state == 'T' && st->tracer_pid == 0;
}

// Finds the thread that appeared since `before`, seizes it and lets it run
// (resuming it from every group stop) until it exits. Used when the process
// is stopped, so that the loader thread alone runs.
Result<pid_t> drive_new_thread(pid_t pid, const std::vector<pid_t>& before, const Deadline& deadline) {
  pid_t tid = 0;
  while (tid == 0) {
    auto now = REMORA_TRY(procfs::list_tasks(pid));
    for (pid_t t : now)
      if (std::find(before.begin(), before.end(), t) == before.end()) tid = t;
    if (tid != 0) break;
    if (deadline.expired()) return Error(Errc::kTimedOut, "the loader thread did not appear");
    pause_briefly(20'000);
  }
  REMORA_TRY(ptrace::seize(pid, tid, 0));
  (void)ptrace::interrupt(tid);
  for (;;) {
    auto s = ptrace::wait_stop(tid, deadline);
    if (!s) {
      (void)ptrace::detach(tid, 0);
      return std::move(s).error();
    }
    if (s->kind == ptrace::Stop::Kind::kExited || s->kind == ptrace::Stop::Kind::kKilled) return tid;
    int sig = s->kind == ptrace::Stop::Kind::kSignalDelivery ? s->sig : 0;
    if (auto r = ptrace::cont(tid, sig); !r) {
      if (r.error().code() == Errc::kTargetExited) return tid;
      return std::move(r).error();
    }
  }
}

// Loads the agent on a fresh thread (see the file comment).
// Returns, for a stopped process, the tid of the agent's listener (it was
// created stopped and could not publish its tid); 0 otherwise.
Result<pid_t> load_agent(remote::Target& t, const std::string& agent_path, const Deadline& deadline) {
  auto vf = REMORA_TRY_CTX(remote::make_visible(t, agent_path), "make the agent visible to the target");
  auto cleanup = [&]() { (void)remote::release(t, vf); };
  pid_t listener = 0;
  auto run = [&]() -> Result<void> {
    x::LoaderBlock block{};
    // One read of the maps for all of libc's functions. Before glibc 2.34,
    // dlopen and dlerror live in libdl.so.2.
    const remote::Target::SymbolQuery libc_fns[] = {{"pthread_create"},
                                                    {"pthread_self"},
                                                    {"pthread_detach"},
                                                    {"dlopen", true, false},
                                                    {"dlerror", true, false}};
    auto fns = REMORA_TRY(t.find_symbols("libc.so.6", libc_fns));
    const RemoteAddr pthread_create_fn = fns[0];
    block.pthread_self_fn = fns[1].addr();
    block.pthread_detach_fn = fns[2].addr();
    block.dlopen_fn = fns[3].addr();
    block.dlerror_fn = fns[4].addr();
    if (fns[3].null() || fns[4].null()) {
      const remote::Target::SymbolQuery libdl_fns[] = {{"dlopen"}, {"dlerror"}};
      auto dl = t.find_symbols("libdl.so.2", libdl_fns);
      if (!dl)
        return Error(Errc::kNotSupported,
                     "process " + std::to_string(t.pid()) +
                         " has no dlopen (neither libc.so.6 nor libdl.so.2 provides it)");
      block.dlopen_fn = (*dl)[0].addr();
      block.dlerror_fn = (*dl)[1].addr();
    }
    block.flags = RTLD_NOW | RTLD_NODELETE;
    const size_t path_len = vf.path.size() + 1;
    auto mem = REMORA_TRY(t.scratch_alloc(sizeof block + path_len + 8));
    uint64_t block_at = mem.addr();
    uint64_t path_at = block_at + sizeof block;
    uint64_t thread_out = (path_at + path_len + 7) & ~uint64_t{7};
    block.path = path_at;
    REMORA_TRY(t.write(RemoteAddr(path_at), std::as_bytes(std::span(vf.path.c_str(), path_len))));
    REMORA_TRY(t.write(RemoteAddr(block_at), std::as_bytes(std::span(&block, 1))));
    auto tramp = REMORA_TRY(t.thread_trampoline());
    // A stopped process (SIGSTOP) stops the new thread too: it would never
    // run. Then Remora drives that one thread itself under ptrace, leaving
    // every other thread stopped, and releases it only once it has exited.
    auto before = procfs::list_tasks(t.pid());
    CallArg args[] = {CallArg::integer(thread_out), CallArg::integer(0), CallArg::integer(tramp.addr()),
                      CallArg::integer(block_at)};
    REMORA_LOG(kAttach, "pid %d: loader block written", t.pid());
    auto created = REMORA_TRY_CTX(t.call(pthread_create_fn, args), "start the loader thread");
    REMORA_LOG(kAttach, "pid %d: loader thread created", t.pid());
    if (created.value != 0)
      return Error(Errc::kIo, "pthread_create failed in the target", static_cast<int>(created.value));
    // Whether the process is stopped is only known for sure by watching the
    // new thread: a thread we just released may still be on its way back
    // into the group stop when /proc is read.
    pid_t loader = 0;
    bool driven = false;
    // Wait for the trampoline to finish (its last store), then for its thread
    // to leave the scratch code for good.
    long nap = 20'000;
    // Looking for a stopped loader thread costs two /proc reads and more:
    // done every half millisecond, not at every look at the block.
    auto next_stop_check = std::chrono::steady_clock::now();
    for (;;) {
      REMORA_TRY_CTX(t.read(RemoteAddr(block_at), std::as_writable_bytes(std::span(&block, 1))),
                     "read the loader block");
      if (block.done == 1) break;
      if (!driven && before && std::chrono::steady_clock::now() >= next_stop_check) {
        next_stop_check = std::chrono::steady_clock::now() + std::chrono::microseconds(500);
        auto now = procfs::list_tasks(t.pid());
        pid_t fresh = 0;
        if (now)
          for (pid_t tid : *now)
            if (std::find(before->begin(), before->end(), tid) == before->end()) fresh = tid;
        auto st =
            fresh ? procfs::read_stat(t.pid(), fresh) : Result<procfs::Stat>(Error(Errc::kNoSuchProcess, ""));
        if (st && st->state == 'T') {
          loader = REMORA_TRY_CTX(drive_new_thread(t.pid(), *before, deadline), "run the loader thread");
          driven = true;
          continue;
        }
      }
      if (deadline.expired()) {
        t.abandon_scratch();  // the loader thread may still run there
        return Error(Errc::kTimedOut,
                     "the agent did not finish loading in time (a constructor in the target may be "
                     "blocked); the loader thread was left running");
      }
      // The agent's dlopen takes about a millisecond: look often, without
      // spinning.
      pause_briefly(nap);
      nap = std::min<long>(nap + 20'000, 200'000);
    }
    REMORA_LOG(kAttach, "pid %d: agent dlopen returned", t.pid());
    std::string task = "/proc/" + std::to_string(t.pid()) + "/task/" + std::to_string(block.tid);
    while (block.tid != 0 && ::access(task.c_str(), F_OK) == 0) {
      if (deadline.expired()) {
        t.abandon_scratch();
        return Error(Errc::kTimedOut, "the agent's loader thread did not exit in time");
      }
      pause_briefly(20'000);
    }
    if (driven && before) {
      // The thread that appeared besides the loader is the agent's listener.
      auto now = REMORA_TRY(procfs::list_tasks(t.pid()));
      for (pid_t tid : now)
        if (tid != loader && std::find(before->begin(), before->end(), tid) == before->end()) listener = tid;
    }
    if (block.handle == 0) {
      char msg[512] = "";
      if (block.error)
        (void)t.read(RemoteAddr(block.error), std::as_writable_bytes(std::span(msg, sizeof msg - 1)));
      msg[sizeof msg - 1] = '\0';
      return Error(Errc::kToolFailed, std::string("the target could not load the agent: ") + msg);
    }
    return ok();
  };
  auto r = run();
  cleanup();
  if (!r) return std::move(r).error();
  return listener;
}

}  // namespace

Result<ProcessOutcome> Controller::attach(pid_t pid, const AttachOptions& opts) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  UniqueFd pidfd(fd);
  return attach_one(pid, fd, opts);
}

Result<ProcessOutcome> Controller::attach_one(pid_t pid, int pidfd, const AttachOptions& opts) {
  auto r = attach_steps(pid, pidfd, opts);
  // Whatever step failed, a process that is gone is reported as such: the
  // failing step (a read, a lookup) is only the symptom.
  // (A process in the middle of exiting fails reads before its pidfd turns
  // readable: give it a moment.)
  pollfd exited{pidfd, POLLIN, 0};
  if (!r && pidfd >= 0 && r.error().code() != Errc::kNoSuchProcess && ::poll(&exited, 1, 200) == 1)
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " exited during the attach (" +
                                          r.error().to_string() + ")");
  return r;
}

namespace {

// Arms a lease through the agent's `lease_fn`: a pipe made by the target,
// whose write end we reopen (into `lease_fd`) through /proc/PID/fd and then
// close in the target, so that the agent sees EOF exactly when this
// controller is gone, whatever pid namespace separates us.
Result<void> arm_lease(remote::Target& t, pid_t pid, uint64_t lease_fn, const CallOptions& on_listener,
                       UniqueFd* lease_fd) {
  auto fds_at = REMORA_TRY(t.scratch_alloc(8));
  CallArg pargs[] = {CallArg::integer(fds_at.addr()), CallArg::integer(O_CLOEXEC)};
  auto p = REMORA_TRY(t.call_symbol("libc.so.6", "pipe2", pargs, on_listener));
  int32_t fds[2] = {-1, -1};
  if (p.value != 0 || !t.read(fds_at, std::as_writable_bytes(std::span(fds, 2))))
    return Error(Errc::kIo,
                 "pipe2 failed in the target: it may be out of file descriptors (see its RLIMIT_NOFILE); "
                 "attach without a lease (remora attach --keep) to go on without one");
  std::string wpath = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fds[1]);
  lease_fd->reset(::open(wpath.c_str(), O_WRONLY | O_CLOEXEC));
  const int open_errno = errno;
  uint64_t close_w[] = {static_cast<uint64_t>(fds[1])};
  (void)t.syscall(x::nr::kClose, close_w, on_listener);
  if (!*lease_fd) {
    uint64_t close_r[] = {static_cast<uint64_t>(fds[0])};
    (void)t.syscall(x::nr::kClose, close_r, on_listener);
    return Error::from_errno("open " + wpath, open_errno);
  }
  CallArg largs[] = {CallArg::integer(static_cast<uint64_t>(fds[0])),
                     CallArg::integer(static_cast<uint64_t>(getpid()))};
  auto l = REMORA_TRY(t.call(RemoteAddr(lease_fn), largs, on_listener));
  if (l.value != 0) {
    lease_fd->reset();
    return Error(Errc::kIo, "the agent could not arm the lease");
  }
  return ok();
}

}  // namespace

Result<ProcessOutcome> Controller::attach_steps(pid_t pid, int pidfd, const AttachOptions& opts) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = "attach to process " + std::to_string(pid);
  if (opts.tools.empty()) return Error(Errc::kInvalidArgument, "no tool library given to attach");
  auto s = REMORA_TRY_CTX(session_for(pid, true), ctx);
  std::lock_guard lock(s->mu);
  if (pidfd >= 0 && !pidfd_alive(pidfd))
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " exited");
  remote::Target& t = *s->target;
  Deadline deadline = Deadline::after(opts.timeout);
  ProcessOutcome out;
  out.pid = pid;

  REMORA_LOG(kAttach, "pid %d: session ready", pid);
  bool loaded = REMORA_TRY_CTX(resolve_agent(t, &s->agent), ctx);
  REMORA_LOG(kAttach, "pid %d: agent %s", pid, loaded ? "present" : "absent");
  pid_t known_listener = 0;
  if (!loaded) {
    // Refused through the environment: nothing is touched. (A loaded agent
    // checks the same itself, in the target.)
    REMORA_TRY_CTX(check_environment(pid), ctx);
    auto agent = REMORA_TRY_CTX(find_agent_library(opts.agent_path), ctx);
    known_listener = REMORA_TRY_CTX(load_agent(t, agent, deadline), ctx);
    REMORA_LOG(kAttach, "pid %d: agent loaded", pid);
    loaded = REMORA_TRY_CTX(resolve_agent(t, &s->agent, /*retire_own=*/true), ctx);
    if (!loaded)
      return Error(Errc::kInternal, "the agent was loaded but is not in the target's maps").with_context(ctx);
    out.agent_loaded_now = true;
  }
  // Our retired scratch (above) normally goes within the attach call; if a
  // step fails before that call took it, it is removed by a call of its own.
  struct RemoveRetired {
    remote::Target& t;
    ~RemoveRetired() {
      if (auto m = t.take_retired_scratch()) (void)t.remove_scratch(*m);
    }
  } remove_retired{t};
  // The listener starts in the agent's constructor; wait until it is there.
  remora_agent_info info{};
  for (long nap = 20'000;; nap = std::min<long>(nap + 20'000, 200'000)) {
    info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
    if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid == 0 && known_listener != 0) {
      // Stopped process: the listener has not run yet to publish its tid.
      // Publish it for it, so that later sessions find it too.
      info.listener_tid = known_listener;
      int32_t tid = known_listener;
      (void)t.write(RemoteAddr(s->agent.info + offsetof(remora_agent_info, listener_tid)),
                    std::as_bytes(std::span(&tid, 1)));
    }
    if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid != 0) break;
    if (deadline.expired()) {
      std::string why = process_is_stopped(pid) ? " (the process is stopped: send it SIGCONT and retry)" : "";
      return Error(Errc::kTimedOut, "the agent's listener thread did not start" + why).with_context(ctx);
    }
    pause_briefly(nap);
  }
  s->listener = info.listener_tid;
  REMORA_LOG(kAttach, "pid %d: listener %d ready", pid, s->listener);
  CallOptions on_listener{s->listener, opts.timeout};

  // Tool list: "display|loadpath" entries for a first attach; the display
  // names alone when the same tools are loaded already (a re-attach).
  std::vector<remote::VisibleFile> visible;
  std::string list, display_list;
  std::vector<std::optional<std::string>> real_tools;  // nullopt: no such file
  for (const auto& tool : opts.tools) {
    char real[PATH_MAX];
    real_tools.push_back(::realpath(tool.c_str(), real) ? std::optional<std::string>(real) : std::nullopt);
    display_list += (display_list.empty() ? "" : ":") + real_tools.back().value_or(tool);
  }
  if (info.tools[0] != '\0') {
    list = display_list;  // the agent compares and refuses a different list
  } else {
    for (size_t i = 0; i < opts.tools.size(); ++i) {
      if (!real_tools[i])
        return Error(Errc::kInvalidArgument, "tool library " + opts.tools[i] + " not found")
            .with_context(ctx);
      const std::string& real = *real_tools[i];
      auto vf = remote::make_visible(t, real);
      if (!vf) {
        for (auto& v : visible) (void)remote::release(t, v);
        return std::move(vf).error().with_context(ctx);
      }
      list += (list.empty() ? "" : ":") + std::string(real) + "|" + vf->path;
      visible.push_back(std::move(*vf));
    }
  }
  REMORA_LOG(kAttach, "pid %d: tools visible", pid);
  auto env = encode_env(opts.env);
  // Our scratch mapping, which loaded the agent, goes within the attach
  // call itself: the agent removes it first (nothing runs in it any more).
  auto retired = t.take_retired_scratch();
  if (retired && s->agent.attach_unmap_fn == 0) {
    if (auto r = t.remove_scratch(*retired); !r) return std::move(r).error().with_context(ctx);
    retired.reset();
  }
  std::vector<CallArg> args = {CallArg::buffer(env), CallArg::string(list)};
  uint64_t attach_fn = s->agent.attach_fn;
  if (retired) {
    args.push_back(CallArg::integer(retired->start.addr()));
    args.push_back(CallArg::integer(retired->size));
    attach_fn = s->agent.attach_unmap_fn;
  }
  auto rc = t.call(RemoteAddr(attach_fn), args, on_listener);
  for (auto& v : visible) (void)remote::release(t, v);
  if (!rc) return std::move(rc).error().with_context(ctx);
  int code = static_cast<int>(static_cast<int32_t>(rc->value));
  if (code != REMORA_AGENT_OK) {
    info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
    info.message[sizeof info.message - 1] = '\0';
    return Error(errc_for_agent(code), info.message).with_context(ctx);
  }
  REMORA_LOG(kAttach, "pid %d: attached", pid);

  if (opts.lease) {
    if (auto armed = arm_lease(t, pid, s->agent.lease_fn, on_listener, &s->lease_fd); !armed) {
      // Attached without a lease, the tools would outlive this controller
      // for good: detach them again, so that a failed attach leaves
      // nothing attached.
      Error e = std::move(armed).error().with_context("arm the lease");
      if (e.code() == Errc::kTargetExited || e.code() == Errc::kNoSuchProcess)
        return std::move(e).with_context(ctx);
      auto d = t.call(RemoteAddr(s->agent.detach_fn), {}, on_listener);
      if (!d || static_cast<int32_t>(d->value) != REMORA_AGENT_OK)
        return std::move(e).with_context(ctx +
                                         " (the tools could not be detached again: run remora detach -p " +
                                         std::to_string(pid) + ")");
      return std::move(e).with_context(ctx + " (the tools were detached again)");
    }
  }
  s->attached = true;
  out.ok = true;
  out.elapsed = std::chrono::steady_clock::now() - t0;
  return out;
}

Result<void> Controller::detach(pid_t pid, std::chrono::milliseconds timeout) {
  if (pid != 0) return detach_one(pid, timeout);
  Result<void> last = ok();
  for (pid_t p : sessions()) {
    auto r = detach_one(p, timeout);
    if (!r) last = std::move(r);
  }
  return last;
}

Result<void> Controller::detach_one(pid_t pid, std::chrono::milliseconds timeout) {
  const std::string ctx = "detach from process " + std::to_string(pid);
  auto s = REMORA_TRY_CTX(session_for(pid, true), ctx);
  std::unique_lock lock(s->mu);
  remote::Target& t = *s->target;
  // The session stays open for a later attach; its scratch (if it has one
  // of its own rather than the agent's) is removed now.
  auto finish = [&]() {
    (void)t.close();
    s->lease_fd.reset();
    s->attached = false;
  };
  auto loaded = resolve_agent(t, &s->agent);
  if (!loaded || !*loaded) {
    finish();
    if (!loaded) return std::move(loaded).error().with_context(ctx);
    return Error(Errc::kNotAttached,
                 "no Remora agent in process " + std::to_string(pid) + ": nothing is attached")
        .with_context(ctx);
  }
  auto info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
  auto rc = t.call(RemoteAddr(s->agent.detach_fn), {}, CallOptions{info.listener_tid, timeout});
  if (!rc) {
    finish();
    return std::move(rc).error().with_context(ctx);
  }
  int code = static_cast<int>(static_cast<int32_t>(rc->value));
  if (code != REMORA_AGENT_OK) {
    info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
    info.message[sizeof info.message - 1] = '\0';
    finish();
    return Error(errc_for_agent(code), info.message).with_context(ctx);
  }
  finish();
  return ok();
}

Result<AgentState> Controller::status(pid_t pid) {
  AgentState st;
  auto mem = REMORA_TRY(remote::Memory::open(pid));
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  if (!remote::find_library(pid, maps, kAgentName)) return st;
  auto sym = REMORA_TRY(remote::resolve_symbol(pid, mem, kAgentName, "remora_agent_info", 0, {}, false));
  remora_agent_info info{};
  REMORA_TRY(mem.read(sym.address, std::as_writable_bytes(std::span(&info, 1))));
  if (info.magic != REMORA_AGENT_MAGIC) return st;
  info.tools[sizeof info.tools - 1] = '\0';
  info.message[sizeof info.message - 1] = '\0';
  st.agent_loaded = true;
  st.attached = info.attached != 0;
  st.sessions = info.sessions;
  st.detaches = info.detaches;
  st.tools = info.tools;
  st.listener_tid = info.listener_tid;
  st.lease_pid = info.lease_pid;
  st.lease_expired = info.lease_expired != 0;
  st.message = info.message;
  return st;
}

Result<std::vector<pid_t>> Controller::snapshot_tree(pid_t root) {
  std::vector<pid_t> order;
  std::set<pid_t> seen;
  std::deque<pid_t> queue{root};
  if (::kill(root, 0) != 0 && errno == ESRCH)
    return Error(Errc::kNoSuchProcess, "no process " + std::to_string(root));
  while (!queue.empty()) {
    pid_t p = queue.front();
    queue.pop_front();
    if (!seen.insert(p).second) continue;
    order.push_back(p);
    auto kids = procfs::list_children(p);
    if (!kids) continue;  // exited meanwhile: its children were reparented, not ours to chase
    for (pid_t k : *kids) queue.push_back(k);
  }
  return order;
}

Result<std::vector<ProcessOutcome>> Controller::attach_tree(pid_t root, const AttachOptions& opts) {
  auto pids = REMORA_TRY(snapshot_tree(root));
  // Hold a pidfd for each process from the snapshot on: a pid recycled
  // meanwhile can never be attached by mistake.
  std::vector<UniqueFd> pidfds;
  for (pid_t p : pids) pidfds.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, p, 0)));
  std::vector<ProcessOutcome> outcomes(pids.size());
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < pids.size();) {
      outcomes[i].pid = pids[i];
      if (!pidfds[i] || !pidfd_alive(pidfds[i].get())) {
        outcomes[i].code = Errc::kTargetExited;
        outcomes[i].message = "process " + std::to_string(pids[i]) + " exited before it could be attached";
        continue;
      }
      auto r = attach_one(pids[i], pidfds[i].get(), opts);
      if (r) {
        outcomes[i] = *r;
      } else {
        outcomes[i].code = r.error().code();
        outcomes[i].message = r.error().to_string();
      }
    }
  };
  unsigned n = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), 4);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < n && i < pids.size(); ++i) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
  std::lock_guard lock(mu_);
  auto& attached = trees_[root];
  for (const auto& o : outcomes)
    if (o.ok) attached.push_back(o.pid);
  return outcomes;
}

Result<std::vector<ProcessOutcome>> Controller::detach_tree(pid_t root, std::chrono::milliseconds timeout) {
  std::vector<pid_t> pids;
  {
    std::lock_guard lock(mu_);
    auto it = trees_.find(root);
    if (it != trees_.end()) {
      pids = std::move(it->second);
      trees_.erase(it);
    }
  }
  if (pids.empty()) pids = REMORA_TRY(snapshot_tree(root));  // attached by another controller
  std::vector<ProcessOutcome> outcomes(pids.size());
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < pids.size();) {
      outcomes[i].pid = pids[i];
      auto r = detach_one(pids[i], timeout);
      outcomes[i].ok = r.ok();
      if (!r) {
        outcomes[i].code = r.error().code();
        outcomes[i].message = r.error().to_string();
      }
    }
  };
  unsigned n = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), 4);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < n && i < pids.size(); ++i) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
  return outcomes;
}

}  // namespace remora::attach
