// How a tool gets attached (docs/architecture.md, "Attach, step by step"):
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
// What the attach creates in the target (memfds, the lease pipe, our scratch
// mapping) is held in remote::RemoteHandle until the target owns it for
// good, so that no failing step can leave one behind.
#include "attach/attach.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

#include "agent/protocol.h"
#include "arch/host.h"
#include "attach/internal.h"
#include "base/deadline.h"
#include "base/log.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "elf/elf_image.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/lookup.h"
#include "remote/memory.h"
#include "remote/remote_handle.h"
#include "remote/scratch.h"
#include "remote/target.h"
#include "remote/visible_file.h"

#ifndef REMORA_INSTALL_LIBDIR
#define REMORA_INSTALL_LIBDIR "/usr/local/lib"
#endif

namespace remora::attach {

namespace x = arch::host;  // the host's architecture (arch/host.h): never named here
using remote::CallArg;
using remote::CallOptions;

constexpr char kAgentName[] = "libremora-agent.so";

// The agent's exported entry points and info block in one process.
struct AgentSymbols {
  uint64_t info = 0, attach_fn = 0, detach_fn = 0, lease_fn = 0;
  uint64_t attach_unmap_fn = 0;   // 0 for an agent older than this entry point
  uint64_t attach_leased_fn = 0;  // 0 for an agent of protocol 1 (no FEATURE_LEASED_ATTACH)
  uint64_t unload_fn = 0;         // 0 for an agent of protocol 2 or older (no FEATURE_UNLOAD)
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
    case REMORA_AGENT_ERR_BUSY: return Errc::kAlreadyAttached;
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

// A zombie or a kernel thread has no user space to attach tools to: said
// as `remora call` says it (ptrace::precheck_open words the same). Any other
// trouble reading it is left to the attach, which reports it in context.
Result<void> refuse_no_user_space(pid_t pid) {
  auto st = procfs::read_status(pid);
  if (!st || st->tgid != pid) return ok();
  const std::string p = std::to_string(pid);
  if (st->state == 'Z' || st->state == 'X')
    return Error(Errc::kZombie, "process " + p + " is a zombie: it has exited and waits for its parent (" +
                                    std::to_string(st->ppid) +
                                    ") to reap it; there is nothing left to trace");
  bool kthread = st->kthread.value_or(false);
  if (!st->kthread) {
    auto stat = procfs::read_stat(pid);
    kthread = stat && (stat->flags & 0x00200000u) != 0;  // PF_KTHREAD
  }
  if (kthread)
    return Error(Errc::kKernelThread, "process " + p + " (" + st->name +
                                          ") is a kernel thread: it has no user space to trace; pick a "
                                          "user-space process");
  return ok();
}

// The agent is loaded through the target's dynamic loader (dlopen in its
// libc): a static program has none. Said as `remora call` says it, before
// any lookup fails on the symptom ("libc.so.6 is not mapped").
Result<void> check_dynamic(const remote::Target& t) {
  if (!t.is_static()) return ok();
  const pid_t pid = t.pid();
  return Error(Errc::kStaticBinary,
               "process " + std::to_string(pid) +
                   " is statically linked (no dynamic loader, no libc.so): Remora loads its agent and tools "
                   "through the target's shared libc and cannot attach tools to it");
}

// Test-only fault injection: REMORA_INJECT_FAULT=NAME in the controller's
// environment makes step NAME fail as if the target had refused it (or,
// for old-agent, take the route of an older agent). Only for
// failures no test can provoke in a live target:
//   remove-scratch  removing our retired scratch mapping before the attach
//                   call (only an agent without remora_agent_attach_unmap
//                   takes that route, and only a failing remote munmap
//                   fails it).
//   lease-call      the remote call that hands the lease pipe to the agent,
//                   failing on our side before the agent ran (a seize that
//                   fails, a deadline) with the pipe made.
//   old-agent       the agent is taken for one of protocol 1 (no leased
//                   attach): the lease is armed after the attach, as then.
//   libc-stack      libc is taken for one without pthread_attr_setstack:
//                   the loader start routine maps no stack and the loader
//                   thread runs on libc's own (the routine's other branch).
// Several names are separated by commas ("old-agent,lease-call").
bool fault_injected(std::string_view name) {
  const char* v = std::getenv("REMORA_INJECT_FAULT");
  if (v == nullptr) return false;
  std::string_view all(v);
  for (size_t at = 0; at <= all.size();) {
    size_t end = std::min(all.find(',', at), all.size());
    if (all.substr(at, end - at) == name) return true;
    at = end + 1;
  }
  return false;
}

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
                                     const CallOptions& close_on = {}) {
  auto vf = REMORA_TRY(remote::make_visible(t, host_path));
  return OwnedFile{vf.path, remote::RemoteHandle::fd(t, vf.remote_fd, close_on), std::move(vf.placed)};
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

// The agent our own loader thread has just loaded: the handle dlopen
// returned (its struct link_map) and our copy of the file it loaded.
struct JustLoaded {
  uint64_t handle = 0;
  std::string path;
};

// The agent's symbols without reading the target's maps again (40-80 us
// for a small process, far more for one with thousands of mappings): the
// link_map's l_addr is the load bias, and our copy of the file has the
// symbol table (parsed once per controller process: elf::ImageCache). Only
// when the image at that bias is that file, by its Build ID; otherwise (a
// file replaced meanwhile, no Build ID, an unreadable link_map) nullopt, and
// the caller looks in the maps as for any agent.
std::optional<std::vector<RemoteAddr>> just_loaded_symbols(
    remote::Target& t, const JustLoaded& j, std::span<const remote::Target::SymbolQuery> queries) {
  struct {
    uint64_t l_addr, l_name, l_ld, l_next, l_prev;  // <link.h>: the public head of struct link_map
  } lm{};
  if (j.handle == 0 || j.path.empty() ||
      !t.read(RemoteAddr(j.handle), std::as_writable_bytes(std::span(&lm, 1))))
    return std::nullopt;
  int fd = ::open(j.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  UniqueFd f(fd);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return std::nullopt;
  // Keyed by the file alone: the Build ID compared below catches a file
  // rewritten in place since it was cached.
  auto image = elf::ImageCache::global().get_or_load(elf::ImageCache::Key{st.st_dev, st.st_ino, ""},
                                                     [&] { return elf::ElfImage::from_fd(f.get()); });
  if (!image || (*image)->build_id().empty() || (*image)->load_segments().empty()) return std::nullopt;
  auto read = [&t](uint64_t addr, std::span<std::byte> out) { return t.read(RemoteAddr(addr), out); };
  if (!(*image)->build_id_mapped_at(lm.l_addr, read)) {  // a Build ID in a section only: the headers
    const uint64_t header = lm.l_addr + ((*image)->load_segments().front().vaddr & ~uint64_t{4095});
    auto in_memory = elf::ElfImage::headers_from_memory(header, read);
    if (!in_memory || (*in_memory)->build_id() != (*image)->build_id()) return std::nullopt;
  }
  std::vector<RemoteAddr> out;
  for (const auto& q : queries) {
    auto sym = (*image)->find_symbol(q.name);
    if (!sym && q.required) return std::nullopt;
    out.emplace_back(sym ? lm.l_addr + sym->value : 0);
  }
  return out;
}

// Resolves the agent's entry points if it is loaded; false when it is not.
// One read of the maps for everything, or none for the agent just loaded
// (`just`). `retire_own`: our own scratch, if the agent's stubs replace it,
// is left for the caller to have removed (see Target::take_retired_scratch)
// rather than removed by a call now.
Result<bool> resolve_agent(remote::Target& t, AgentSymbols* out, bool retire_own = false,
                           const JustLoaded* just = nullptr) {
  const remote::Target::SymbolQuery queries[] = {{"remora_agent_info", false},
                                                 {"remora_agent_attach"},
                                                 {"remora_agent_detach"},
                                                 {"remora_agent_set_lease"},
                                                 {"remora_agent_attach_unmap", true, false},
                                                 {"remora_agent_stub", true, false},
                                                 {"remora_agent_scratch", false, false},
                                                 {"remora_agent_attach_leased", true, false},
                                                 {"remora_agent_unload", true, false}};
  std::optional<std::vector<RemoteAddr>> quick;
  if (just) quick = just_loaded_symbols(t, *just, queries);
  auto found =
      quick ? Result<std::vector<RemoteAddr>>(std::move(*quick)) : t.find_symbols(kAgentName, queries);
  if (!found && found.error().code() == Errc::kLibraryNotMapped) return false;
  if (!found) return std::move(found).error();
  const auto& f = *found;
  *out =
      AgentSymbols{f[0].addr(), f[1].addr(), f[2].addr(), f[3].addr(), f[4].addr(), f[7].addr(), f[8].addr()};
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

// The agent names its listener as the target's pid namespace sees it
// (gettid() there); from here on it is named as this process sees it. A tid
// no thread of the process has (a forked child's copy of its parent's
// block, a listener not started yet) reads 0: no listener. Outside a nested
// pid namespace the ids are ours already.
void listener_as_we_name_it(pid_t pid, remora_agent_info* info, bool nested_pid_ns = true) {
  if (info->magic != REMORA_AGENT_MAGIC) return;
  info->listener_tid = detail::tid_as_we_name_it(pid, info->listener_tid, nested_pid_ns);
}

Result<remora_agent_info> read_info(remote::Target& t, uint64_t addr) {
  remora_agent_info info{};
  REMORA_TRY(t.read(RemoteAddr(addr), std::as_writable_bytes(std::span(&info, 1))));
  // In our own pid namespace its ids are ours: no /proc read.
  listener_as_we_name_it(t.pid(), &info, t.in_nested_pid_ns());
  return info;
}

// The words an attach or a detach checks before its calls: the block's
// head (magic through lease_expired), the first byte of the tool list
// (empty: no tools yet) and `unloading`; the rest stays zero. Two small
// reads instead of the whole block's 10 KiB over three pages (3% of the
// controller's CPU per process in a tree; docs/benchmarks.md).
Result<remora_agent_info> read_info_head(remote::Target& t, uint64_t addr) {
  remora_agent_info info{};
  auto bytes = std::as_writable_bytes(std::span(&info, 1));
  REMORA_TRY(t.read(RemoteAddr(addr), bytes.first(offsetof(remora_agent_info, tools) + 1)));
  if (info.magic == REMORA_AGENT_MAGIC && (info.features & REMORA_AGENT_FEATURE_UNLOAD) != 0)
    REMORA_TRY(t.read(RemoteAddr(addr + offsetof(remora_agent_info, unloading)),
                      bytes.subspan(offsetof(remora_agent_info, unloading), sizeof info.unloading)));
  listener_as_we_name_it(t.pid(), &info, t.in_nested_pid_ns());
  return info;
}

// True when the process is in a job-control stop (every thread 'T' and not
// because a tracer holds it).
bool process_is_stopped(pid_t pid) {
  auto st = procfs::read_status(pid);
  return st && st->state == 'T' && st->tracer_pid == 0;
}

Result<pid_t> drive_to_exit(pid_t pid, pid_t tid, const Deadline& deadline);

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
  return drive_to_exit(pid, tid, deadline);
}

// Seizes thread `tid` of a stopped process and lets it alone run (resuming
// it from every group stop) until it exits; returns its tid.
Result<pid_t> drive_to_exit(pid_t pid, pid_t tid, const Deadline& deadline) {
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

// Fills the loader block with libc's functions (before glibc 2.34, dlopen
// and dlerror live in libdl.so.2), with one read of the maps for libc's.
// Returns pthread_create, which the hijacked thread calls.
// `stack_fns` receives pthread_attr_init and pthread_attr_setstack (null
// before glibc 2.34, where they live in libpthread: the thread then gets a
// stack of libc's own).
Result<RemoteAddr> find_loader_functions(remote::Target& t, x::LoaderBlock* block,
                                         std::array<RemoteAddr, 2>* stack_fns) {
  const remote::Target::SymbolQuery libc_fns[] = {{"pthread_create", true, false},
                                                  {"pthread_self", true, false},
                                                  {"pthread_detach", true, false},
                                                  {"dlopen", true, false},
                                                  {"dlerror", true, false},
                                                  {"pthread_attr_init", true, false},
                                                  {"pthread_attr_setstack", true, false}};
  auto fns = REMORA_TRY(t.find_symbols("libc.so.6", libc_fns));
  *stack_fns = {fns[5], fns[6]};
  block->pthread_self_fn = fns[1].addr();
  block->pthread_detach_fn = fns[2].addr();
  block->dlopen_fn = fns[3].addr();
  block->dlerror_fn = fns[4].addr();
  if (fns[0].null() || fns[1].null() || fns[2].null()) {
    // Before glibc 2.34 the thread functions live in libpthread.so.0, which
    // a program that never started a thread may not have loaded.
    const remote::Target::SymbolQuery pthread_fns[] = {
        {"pthread_create"}, {"pthread_self"}, {"pthread_detach"}};
    auto pt = t.find_symbols("libpthread.so.0", pthread_fns);
    if (!pt)
      return Error(
          Errc::kNotSupported,
          "process " + std::to_string(t.pid()) +
              " has no pthread_create: its glibc is older than 2.34 and it has not loaded libpthread.so.0 "
              "(a program that never starts a thread); Remora needs to start a thread in it");
    fns[0] = (*pt)[0];
    block->pthread_self_fn = (*pt)[1].addr();
    block->pthread_detach_fn = (*pt)[2].addr();
  }
  if (fns[3].null() || fns[4].null()) {
    const remote::Target::SymbolQuery libdl_fns[] = {{"dlopen"}, {"dlerror"}};
    auto dl = t.find_symbols("libdl.so.2", libdl_fns);
    if (!dl)
      return Error(Errc::kNotSupported, "process " + std::to_string(t.pid()) +
                                            " has no dlopen (neither libc.so.6 nor libdl.so.2 provides it)");
    block->dlopen_fn = (*dl)[0].addr();
    block->dlerror_fn = (*dl)[1].addr();
  }
  // No RTLD_NODELETE: an unload (DetachOptions::unload) dlcloses the agent,
  // once no thread of the target can be in its code any more (unload_agent).
  // Nothing else ever closes this reference.
  block->flags = RTLD_NOW;
  return fns[0];
}

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
constexpr uint64_t kHookNotRun = 0x7fffffffffffffffull;  // hook_rc, as written: the hook did not run
constexpr char kLoaderAttachFn[] = "remora_agent_loader_attach";

// The loader thread at work: `block_at` is its block in the target.
struct LoaderRun {
  uint64_t block_at = 0;
  x::LoaderBlock block{};
  const LoaderAttach* hook = nullptr;  // the attach to make on it, if any
  bool hook_takes_stack = false;       // the agent removes the thread's stack (start_loader_thread)
  uint64_t start_at = 0;               // the loader start routine's block, once written (write_loader)
  x::LoaderStart start{};
  std::array<RemoteAddr, 2> stack_fns{};                    // pthread_attr_init, pthread_attr_setstack
  Result<std::vector<pid_t>> before{std::vector<pid_t>{}};  // the tasks before it was created
  pid_t loader = 0;                                         // its tid, when Remora drove it itself
  bool driven = false;  // the process is stopped: Remora ran the loader thread
};

// Waits for the trampoline to finish (its last store to the block). A
// stopped process (SIGSTOP) stops the new thread too: it would never run.
// Then Remora drives that one thread itself under ptrace, leaving every
// other thread stopped, and releases it only once it has exited.
Result<void> wait_loader_done(remote::Target& t, LoaderRun& run, const Deadline& deadline) {
  long nap = 20'000;
  // Looking for a stopped loader thread costs two /proc reads and more:
  // done every half millisecond, not at every look at the block; first at
  // once in a process that was stopped when it was opened (its loader cannot
  // run), else after a millisecond (a running process's loader is mostly
  // done by then; one stopped since waits that long to be driven).
  auto next_stop_check =
      std::chrono::steady_clock::now() +
      (t.stopped_at_open() ? std::chrono::microseconds(0) : std::chrono::microseconds(1000));
  for (;;) {
    // A nap first: the thread was started a moment ago, and no dlopen or
    // dlclose is over that soon (a read of the block saved).
    pause_briefly(nap);
    nap = std::min<long>(nap + 20'000, 200'000);
    REMORA_TRY_CTX(t.read(RemoteAddr(run.block_at), std::as_writable_bytes(std::span(&run.block, 1))),
                   "read the loader block");
    if (run.block.done == 1) return ok();
    // Whether the process is stopped is only known for sure by watching the
    // new thread: a thread we just released may still be on its way back
    // into the group stop when /proc is read.
    if (!run.driven && run.before && std::chrono::steady_clock::now() >= next_stop_check) {
      next_stop_check = std::chrono::steady_clock::now() + std::chrono::microseconds(500);
      auto now = procfs::list_tasks(t.pid());
      pid_t fresh = 0;
      if (now)
        for (pid_t tid : *now)
          if (std::find(run.before->begin(), run.before->end(), tid) == run.before->end()) fresh = tid;
      auto st =
          fresh ? procfs::read_stat(t.pid(), fresh) : Result<procfs::Stat>(Error(Errc::kNoSuchProcess, ""));
      if (st && st->state == 'T') {
        run.loader =
            REMORA_TRY_CTX(drive_new_thread(t.pid(), *run.before, deadline), "run the loader thread");
        run.driven = true;
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
    // spinning (the nap at the top).
  }
}

// The loader thread's own stack (start_loader_thread).
constexpr uint64_t kLoaderStackSize = 1024 * 1024;

// How many bytes hook_bytes makes: the request, the hook's name, the tool
// list and the environment, in that order.
size_t hook_size(const LoaderAttach& h) {
  return sizeof(remora_agent_loader_request) + sizeof kLoaderAttachFn + h.list.size() + 1 + h.env.size();
}

// The hook's request (agent/protocol.h), its strings and the tool list, as
// the bytes to place at `at` in the scratch; the block's hook fields name
// them. The ranges to retire: our scratch (`scratch`, its base), and the
// stack the loader start routine is asked to map at `stack_hint` (the agent
// takes it only if the thread runs on exactly it).
std::vector<std::byte> hook_bytes(LoaderRun& run, uint64_t at, uint64_t scratch, uint64_t stack_hint,
                                  bool own_stack) {
  const LoaderAttach& h = *run.hook;
  const size_t name_len = sizeof kLoaderAttachFn, list_len = h.list.size() + 1;
  remora_agent_loader_request req{};
  const uint64_t name_at = at + sizeof req, list_at = name_at + name_len, env_at = list_at + list_len;
  req.magic = REMORA_AGENT_LOADER_MAGIC;
  req.env_buffer = h.env.empty() ? 0 : env_at;
  req.env_size = h.env.size();
  req.tool_list = list_at;
  req.retire[0][0] = scratch;
  req.retire[0][1] = remote::kScratchSize;
  req.id = h.id;
  req.ack_timeout_ms = static_cast<uint64_t>(h.timeout.count());
  req.scratch_magic = remote::kScratchMagic;
  if (own_stack && stack_hint != 0) {
    req.retire[1][0] = stack_hint;
    req.retire[1][1] = kLoaderStackSize;
  }
  std::vector<std::byte> bytes(hook_size(h));
  std::memcpy(bytes.data(), &req, sizeof req);
  std::memcpy(bytes.data() + sizeof req, kLoaderAttachFn, name_len);
  std::memcpy(bytes.data() + sizeof req + name_len, h.list.c_str(), list_len);
  if (!h.env.empty())
    std::memcpy(bytes.data() + sizeof req + name_len + list_len, h.env.data(), h.env.size());
  run.block.dlsym_fn = h.dlsym_fn.addr();
  run.block.hook_name = name_at;
  run.block.hook_arg = at;
  run.block.hook_rc = kHookNotRun;
  return bytes;
}

// Writes what the loader thread works on into the scratch, in one
// allocation and one write: its block (and, when `path` is given, that path
// right after it, which block.path then names; dlclose_agent's block names
// a handle), the pthread_t pthread_create stores, the hook's request, then
// the loader start routine's block and room for its pthread_attr_t (56 bytes
// on x86_64 and aarch64); returns the routine's call. The `prepare` of
// Target::call_prepared: for a first attach it runs within the transaction
// that creates the scratch.
Result<remote::Target::Prepared> write_loader(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                              std::string_view path) {
  auto align = [](uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); };
  const size_t path_len = path.empty() ? 0 : path.size() + 1;
  const uint64_t thread_off = align(sizeof run.block + path_len, 8);
  const uint64_t hook_off = align(thread_off + 8, 16);
  const uint64_t below = t.scratch_address().value_or(0);
  const uint64_t stack_hint = below > kLoaderStackSize ? below - kLoaderStackSize : 0;
  const bool own_stack =
      !run.stack_fns[0].null() && !run.stack_fns[1].null() && !fault_injected("libc-stack");
  const auto fn = REMORA_TRY(t.loader_start());
  const auto tramp = REMORA_TRY(t.thread_trampoline());
  // The hook's bytes name their own addresses: sized first, placed once the
  // allocation is known.
  const size_t hook_len = run.hook ? hook_size(*run.hook) : 0;
  const uint64_t start_off = align(hook_off + hook_len, 16);
  const uint64_t total = start_off + sizeof(x::LoaderStart) + 64;
  const uint64_t at = REMORA_TRY(t.scratch_alloc(total)).addr();
  std::vector<std::byte> image(total);
  run.block_at = at;
  if (!path.empty()) {
    run.block.path = at + sizeof run.block;
    std::memcpy(image.data() + sizeof run.block, path.data(), path.size());  // NUL: the image is zeroed
  }
  if (run.hook) {
    const auto hook = hook_bytes(run, at + hook_off, below, stack_hint, own_stack);
    std::memcpy(image.data() + hook_off, hook.data(), hook.size());
  }
  std::memcpy(image.data(), &run.block, sizeof run.block);
  x::LoaderStart& ls = run.start;
  ls = x::LoaderStart{};
  ls.pthread_create_fn = pthread_create_fn.addr();
  if (own_stack) {
    ls.attr_init_fn = run.stack_fns[0].addr();
    ls.attr_setstack_fn = run.stack_fns[1].addr();
  }
  ls.stack_hint = stack_hint;
  ls.stack_size = kLoaderStackSize;
  ls.attr = at + start_off + sizeof ls;
  ls.thread_out = at + thread_off;
  ls.trampoline = tramp.addr();
  ls.block = run.block_at;
  ls.created = ~uint64_t{0};  // stays so unless pthread_create ran
  std::memcpy(image.data() + start_off, &ls, sizeof ls);
  REMORA_TRY(t.write(RemoteAddr(at), image));
  run.before = procfs::list_tasks(t.pid());
  REMORA_LOG(kAttach, "pid %d: loader block written", t.pid());
  run.start_at = at + start_off;
  return remote::Target::Prepared{fn, run.start_at};
}

// Starts the loader thread: one call of the stub's loader start routine
// (arch/loader_block.h), which maps the thread's own stack, names it in a
// pthread_attr_t and runs pthread_create of the trampoline on it. One marked
// call where the mmap, pthread_attr_init, pthread_attr_setstack and
// pthread_create were four remote calls (about 120 us of a 1.4 ms first
// attach; docs/benchmarks.md). In a process without our scratch yet, the
// scratch's creation and setup and this call are one transaction on one
// thread (Target::call_prepared): one seize, stop and release fewer.
//
// The stack (1 MiB, read-write) is ours, not glibc's: glibc keeps the stacks
// it allocates itself in its stack cache once their thread exits, a mapping
// that would outlive an unload. It is held by `stack` (removed by the handle
// once the thread is gone); without pthread_attr_setstack in this libc, or
// when the attr calls refuse, the thread runs on libc's own stack instead.
// The stack's address is asked for right below our scratch mapping: as a
// hint only, never MAP_FIXED, so it can never land on anything of the
// target's, and with the flags it always had (a seccomp filter that looks at
// mmap's flags, as Chromium's does, sees nothing new). When the kernel takes
// the hint, the stack and the scratch are one range: the agent's attach call
// removes the retired scratch anyway and takes the stack with it (see
// ensure_agent).
Result<void> start_loader_thread(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                 std::string_view path, remote::RemoteHandle* stack) {
  auto rc = t.call_prepared([&] { return write_loader(t, pthread_create_fn, run, path); });
  if (run.start_at == 0) {  // nothing was started: the scratch or the blocks could not be made
    if (!rc) return std::move(rc).error().with_context("start the loader thread");
    return Error(Errc::kInternal, "the loader start block was never written");
  }
  const x::LoaderStart& ls = run.start;
  x::LoaderStart out{};
  const bool have_out = t.read(RemoteAddr(run.start_at), std::as_writable_bytes(std::span(&out, 1))).ok();
  const auto stack_v = static_cast<int64_t>(out.stack);
  if (have_out && ls.attr_init_fn != 0 && out.stack != 0 && !(stack_v < 0 && stack_v > -4096)) {
    *stack =
        remote::RemoteHandle::mapping(t, remote::Target::Mapping{RemoteAddr(out.stack), kLoaderStackSize});
    // A thread may run on it (the call's end was lost after pthread_create):
    // leaking the stack is the lesser harm.
    if (!rc && out.created != ~uint64_t{0}) stack->release();
  }
  if (!rc) return std::move(rc).error().with_context("start the loader thread");
  if (!have_out) return Error(Errc::kIo, "the loader start block could not be read back from the target");
  // On exactly the stack the hook's request names: the agent removes it.
  run.hook_takes_stack = run.hook != nullptr && ls.attr_init_fn != 0 && out.attr_status == 0 &&
                         out.stack == ls.stack_hint && ls.stack_hint != 0;
  if (ls.attr_init_fn != 0 && stack_v < 0 && stack_v > -4096)
    return Error(Errc::kIo, "mmap of the loader thread's stack failed in the target",
                 static_cast<int>(-stack_v));
  if (out.created != 0)
    return Error(Errc::kIo, "pthread_create failed in the target", static_cast<int>(out.created));
  // (No pthread_attr_destroy: an attribute that names no CPU set holds nothing.)
  return ok();
}

// Runs Remora's thread trampoline on a fresh thread of the target, on
// `run.block` (its fields filled in by the caller; written into the scratch
// with `path`, see write_loader), and waits for the thread to have left our
// scratch code (and its stack) for good, unless the agent's listener took
// both (it waits for that itself). The thread's stack is then removed, or,
// with `stack_out`, handed to the caller (who removes it with the scratch:
// ensure_agent).
Result<void> run_trampoline_thread(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                   std::string_view path, const Deadline& deadline,
                                   remote::RemoteHandle* stack_out = nullptr) {
  remote::RemoteHandle stack;
  REMORA_TRY(start_loader_thread(t, pthread_create_fn, run, path, &stack));
  REMORA_LOG(kAttach, "pid %d: loader thread created", t.pid());
  auto keep_stack = [&](Error e) {
    stack.release();  // the thread may still run on it: leaking it is the lesser harm
    return e;
  };
  if (auto done = wait_loader_done(t, run, deadline); !done) return keep_stack(std::move(done).error());
  REMORA_LOG(kAttach, "pid %d: loader thread's call returned", t.pid());
  // The hook took the attach and the stack: the agent's listener waits for
  // the thread to be gone before it attaches, and removes the stack and our
  // scratch after (finish_loader_attach waits for that). Nothing of ours
  // needs the thread gone before.
  if (run.hook != nullptr && run.block.hook_rc == 0 && run.hook_takes_stack) {
    stack.release();
    return ok();
  }
  // Else for its thread to leave the scratch code and its stack for good
  // (after `done` it still returns through both). The block has the tid the
  // target's pid namespace gave it.
  if (auto gone = detail::wait_target_thread_gone(t.pid(), run.block.tid, t.in_nested_pid_ns(), deadline);
      !gone) {
    t.abandon_scratch();
    return keep_stack(std::move(gone).error().with_context("wait for the agent's loader thread to exit"));
  }
  if (stack_out) {
    *stack_out = std::move(stack);
    return ok();
  }
  return stack.reset();
}

// Loads the agent on a fresh thread (see the file comment).
// Returns, for a stopped process, the tid of the agent's listener (it was
// created stopped and could not publish its tid); 0 otherwise.
// Loads library `path` (`what`: "the agent", "libunwind-x86_64.so.8") on a
// fresh thread of the target; returns the thread that appeared besides the
// loader when Remora had to drive it (the agent's listener).
// `stack_out`: see run_trampoline_thread.
// `hook`: the attach the loader thread hands the agent (LoaderAttach);
// `hook_taken` is set when the agent took it.
Result<pid_t> load_library(remote::Target& t, const std::string& path, const std::string& what,
                           const Deadline& deadline, OwnedFile* kept,
                           remote::RemoteHandle* stack_out = nullptr, uint64_t* handle_out = nullptr,
                           const LoaderAttach* hook = nullptr, bool* hook_taken = nullptr) {
  // The library's memfd (if it needs one) is closed in the target when `vf`
  // goes, if the load fails; loaded, it goes to `kept`.
  auto vf = REMORA_TRY_CTX(make_visible_owned(t, path), "make " + what + " visible to the target");
  LoaderRun run;
  run.hook = hook;
  const RemoteAddr pthread_create_fn = REMORA_TRY(find_loader_functions(t, &run.block, &run.stack_fns));
  REMORA_TRY(run_trampoline_thread(t, pthread_create_fn, run, vf.path, deadline, stack_out));
  // 0: taken; BUSY (another controller's in progress), BAD_ARGUMENT, or
  // kHookNotRun (an agent without the hook): the attach call does it.
  if (hook != nullptr && hook_taken != nullptr) *hook_taken = run.block.hook_rc == 0;
  pid_t listener = 0;
  if (run.driven && run.before) {
    // The thread that appeared besides the loader is the agent's listener.
    auto now = REMORA_TRY(procfs::list_tasks(t.pid()));
    for (pid_t tid : now)
      if (tid != run.loader && std::find(run.before->begin(), run.before->end(), tid) == run.before->end())
        listener = tid;
  }
  if (run.block.handle == 0) {
    char msg[512] = "";
    if (run.block.error)
      (void)t.read(RemoteAddr(run.block.error), std::as_writable_bytes(std::span(msg, sizeof msg - 1)));
    msg[sizeof msg - 1] = '\0';
    return Error(Errc::kToolFailed, "the target could not load " + what + ": " + msg);
  }
  *kept = std::move(vf);
  if (handle_out) *handle_out = run.block.handle;
  return listener;
}

// Libraries glibc itself provides: every glibc process has them.
bool is_glibc_library(const std::string& soname) {
  for (const char* p : {"libc.so.", "libm.so.", "libdl.so.", "libpthread.so.", "librt.so.", "libresolv.so.",
                        "libutil.so.", "ld-linux"})
    if (soname.rfind(p, 0) == 0) return true;
  return false;
}

// The directories a dynamic loader searches by default, as Debian and
// most distributions lay them out.
const std::vector<std::string>& library_dirs() {
  static const std::vector<std::string> dirs = {std::string("/lib/") + REMORA_MULTIARCH,
                                                std::string("/usr/lib/") + REMORA_MULTIARCH,
                                                "/lib64",
                                                "/usr/lib64",
                                                "/lib",
                                                "/usr/lib",
                                                "/usr/local/lib"};
  return dirs;
}

// Whether the target's loader finds `soname`: an object of that name is
// mapped, or a file of that name is in its root's library directories.
bool target_finds(pid_t pid, const std::vector<procfs::MapEntry>& maps, const std::string& soname) {
  for (const auto& m : maps)
    if (m.path.size() >= soname.size() &&
        m.path.compare(m.path.size() - soname.size(), soname.size(), soname) == 0)
      return true;
  for (const auto& d : library_dirs())
    if (remote::open_in_root(pid, d + "/" + soname)) return true;
  return false;
}

// A tool's libraries beyond glibc that the target lacks (a slim container
// image: the default tool's libunwind), ours loaded into it first, each
// after its own such libraries, so that the tool's DT_NEEDED entries find
// them by their DT_SONAME. Their memfds join `kept`.
// The DT_NEEDED entries of `library` beyond glibc's, parsed once per file
// (path, device, inode, mtime) and process: a tree's processes, one after
// another, ask for the same tools.
Result<std::vector<std::string>> needed_beyond_glibc(const std::string& library) {
  static std::mutex mu;
  static std::map<std::string, std::pair<std::string, std::vector<std::string>>> cache;
  int fd = ::open(library.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno("open " + library);
  UniqueFd f(fd);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return Error::from_errno("stat " + library);
  const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                          std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  {
    std::lock_guard lock(mu);
    auto it = cache.find(library);
    if (it != cache.end() && it->second.first == key) return it->second.second;
  }
  auto img = REMORA_TRY_CTX(elf::ElfImage::from_fd(f.get()), library);
  std::vector<std::string> out;
  for (const auto& soname : img->needed())
    if (!is_glibc_library(soname)) out.push_back(soname);
  std::lock_guard lock(mu);
  cache[library] = {key, out};
  return out;
}

Result<void> deliver_dependencies(remote::Target& t, const std::string& library, const Deadline& deadline,
                                  std::set<std::string>* seen, std::vector<OwnedFile>* kept) {
  auto needed = REMORA_TRY(needed_beyond_glibc(library));
  if (needed.empty()) return ok();
  auto maps = REMORA_TRY(procfs::read_maps(t.pid()));
  for (const auto& soname : needed) {
    if (!seen->insert(soname).second || target_finds(t.pid(), maps, soname)) continue;
    std::string ours;
    for (const auto& d : library_dirs())
      if (is_file(d + "/" + soname)) {
        ours = d + "/" + soname;
        break;
      }
    if (ours.empty())
      return Error(Errc::kToolFailed,
                   library + " needs " + soname + ", which process " + std::to_string(t.pid()) +
                       " lacks, and this machine has no copy of it either: install it here "
                       "(or in the target's image)");
    REMORA_TRY(deliver_dependencies(t, ours, deadline, seen, kept));
    kept->emplace_back();
    REMORA_TRY(load_library(t, ours, soname, deadline, &kept->back()));
    REMORA_LOG(kAttach, "pid %d: delivered %s (from %s), which %s needs", t.pid(), soname.c_str(),
               ours.c_str(), library.c_str());
  }
  return ok();
}

// Waits until thread `tid` of `pid` is gone; in a stopped process it could
// never run to its end, so Remora drives it there itself.
Result<void> wait_thread_gone(pid_t pid, pid_t tid, const Deadline& deadline) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  for (long nap = 20'000; tid != 0 && ::access(task.c_str(), F_OK) == 0;
       nap = std::min<long>(nap + 20'000, 200'000)) {
    auto st = procfs::read_stat(pid, tid);
    if (st && st->state == 'T') {
      REMORA_TRY(drive_to_exit(pid, tid, deadline));
      continue;
    }
    if (deadline.expired())
      return Error(Errc::kTimedOut, "thread " + std::to_string(tid) + " did not exit in time");
    pause_briefly(nap);
  }
  return ok();
}

// The agent's own dlclose, after remora_agent_unload returned on the
// listener: the tools are gone, the watcher is joined, and the listener is
// returning. Once its thread is gone, no thread of the target can be in the
// agent's code (nothing else ever runs there), and a fresh thread (our
// trampoline, as for the load: never an interrupted thread, which may hold
// the loader lock) dlcloses it. The trampoline calls block.dlopen_fn(path,
// flags): here dlclose(self_handle), whose result lands in block.handle.
Result<void> dlclose_agent(remote::Target& t, pid_t pid, const remora_agent_info& info,
                           const Deadline& deadline) {
  if (info.self_handle == 0)
    return Error(Errc::kInternal,
                 "the agent did not find its own handle: it stays loaded (its tools are unloaded)");
  // Our calls ran through the agent's stubs, which go with it: forget them
  // (a retired scratch of our own is removed).
  REMORA_TRY(t.close());
  REMORA_TRY_CTX(wait_thread_gone(pid, info.listener_tid, deadline),
                 "wait for the agent's listener to return");
  LoaderRun run;
  const RemoteAddr pthread_create_fn = REMORA_TRY(find_loader_functions(t, &run.block, &run.stack_fns));
  const remote::Target::SymbolQuery q[] = {{"dlclose", true, false}};
  auto fns = REMORA_TRY(t.find_symbols("libc.so.6", q));
  RemoteAddr dlclose_fn = fns[0];
  if (dlclose_fn.null()) {
    const remote::Target::SymbolQuery dq[] = {{"dlclose"}};
    dlclose_fn = REMORA_TRY(t.find_symbols("libdl.so.2", dq))[0];
  }
  run.block.dlopen_fn = dlclose_fn.addr();
  run.block.path = info.self_handle;
  run.block.flags = 0;
  REMORA_TRY(run_trampoline_thread(t, pthread_create_fn, run, {}, deadline));
  if (run.block.handle != 0) {
    char msg[512] = "";
    if (run.block.error)
      (void)t.read(RemoteAddr(run.block.error), std::as_writable_bytes(std::span(msg, sizeof msg - 1)));
    msg[sizeof msg - 1] = '\0';
    (void)t.close();
    return Error(Errc::kToolFailed, std::string("the target's dlclose of the agent failed: ") + msg);
  }
  return t.close();  // our scratch, the last thing of ours
}

std::vector<std::string> split_list(const char* list) {
  std::vector<std::string> out;
  std::string_view all(list);
  for (size_t at = 0; at < all.size();) {
    size_t end = std::min(all.find(':', at), all.size());
    if (end > at) out.emplace_back(all.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

}  // namespace

namespace detail {

pid_t tid_as_we_name_it(pid_t pid, pid_t tid, bool nested_pid_ns) {
  if (tid == 0 || !nested_pid_ns) return tid;
  auto ours = procfs::tid_from_target_ns(pid, tid);
  return ours ? *ours : 0;
}

Result<void> wait_target_thread_gone(pid_t pid, pid_t tid, bool nested_pid_ns, const Deadline& deadline) {
  return wait_thread_gone(pid, tid_as_we_name_it(pid, tid, nested_pid_ns), deadline);
}

}  // namespace detail

Result<ProcessOutcome> Controller::attach(pid_t pid, const AttachOptions& opts) {
  detail::ScopedTimerSlack slack;
  // A zombie or kernel thread is refused as such (a zombie's pidfd already
  // reads as exited, which would otherwise make it "exited during the attach").
  REMORA_TRY_CTX(refuse_no_user_space(pid), "attach to process " + std::to_string(pid));
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

// After a lease call that failed on our side, is the read end still ours
// to close? Only when the target's descriptor still names our pipe (the
// inode of our write end) and the agent armed no lease for this process with
// it: closing a number the target has reused meanwhile would close one of
// its own descriptors, a worse harm than a leak.
bool read_end_unclaimed(remote::Target& t, pid_t pid, uint64_t info_at, int read_fd, const UniqueFd& ours) {
  struct stat mine {
  }, theirs{};
  std::string rpath = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(read_fd);
  if (!ours || ::fstat(ours.get(), &mine) != 0 || ::stat(rpath.c_str(), &theirs) != 0) return false;
  if (mine.st_dev != theirs.st_dev || mine.st_ino != theirs.st_ino) return false;
  auto info = read_info(t, info_at);
  return info && info->lease_pid != getpid();
}

// Makes a lease pipe in the target, whose write end we reopen (into
// `lease_fd`) through /proc/PID/fd and then close in the target, so that the
// agent sees EOF exactly when this controller is gone, whatever pid
// namespace separates us. Returns the read end, owned until the agent takes
// it: no failure leaves either end open in the target. (A controller killed
// between the pipe2 and the agent's taking the read end leaves that one
// descriptor; nothing is attached then.)
Result<remote::RemoteHandle> make_lease_pipe(remote::Target& t, pid_t pid, const CallOptions& on_listener,
                                             UniqueFd* lease_fd) {
  auto fds_at = REMORA_TRY(t.scratch_alloc(8));
  CallArg pargs[] = {CallArg::integer(fds_at.addr()), CallArg::integer(O_CLOEXEC)};
  auto p = REMORA_TRY(t.call_symbol("libc.so.6", "pipe2", pargs, on_listener));
  if (p.value != 0)
    return Error(Errc::kIo,
                 "pipe2 failed in the target: it may be out of file descriptors (see its RLIMIT_NOFILE); "
                 "attach without a lease (remora attach --keep) to go on without one");
  int32_t fds[2] = {-1, -1};
  // (Should this read fail, the numbers are unknown: nothing can close them.)
  REMORA_TRY_CTX(t.read(fds_at, std::as_writable_bytes(std::span(fds, 2))),
                 "read the lease pipe's descriptors");
  remote::RemoteHandle read_end = remote::RemoteHandle::fd(t, fds[0], on_listener);
  remote::RemoteHandle write_end = remote::RemoteHandle::fd(t, fds[1], on_listener);
  std::string wpath = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fds[1]);
  lease_fd->reset(::open(wpath.c_str(), O_WRONLY | O_CLOEXEC));
  const int open_errno = errno;
  // Ours must be the only write end: were the target's left open, the lease
  // could never expire.
  if (auto closed = write_end.reset(); !closed) {
    lease_fd->reset();
    return std::move(closed).error().with_context("close the target's write end of the lease pipe");
  }
  if (!*lease_fd) return Error::from_errno("open " + wpath, open_errno);
  return read_end;
}

// After a call that hands the read end to the agent: the agent owns it once
// its function ran, whatever it returned (it closes it when it refuses or
// cannot arm the lease). A call that failed on our side may or may not have
// run: the handle keeps the read end only while it is provably unclaimed.
void hand_over_read_end(remote::Target& t, pid_t pid, uint64_t info_at, bool call_ran,
                        remote::RemoteHandle& read_end, const UniqueFd& lease_fd) {
  if (call_ran || !read_end_unclaimed(t, pid, info_at, read_end.fd(), lease_fd)) read_end.release();
}

// Arms a lease through the agent's `lease_fn` after the attach: the order of
// an agent of protocol 1, which has no leased attach.
Result<void> arm_lease(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                       const CallOptions& on_listener, UniqueFd* lease_fd) {
  auto read_end = REMORA_TRY(make_lease_pipe(t, pid, on_listener, lease_fd));
  const int read_fd = read_end.fd();
  CallArg largs[] = {CallArg::integer(static_cast<uint64_t>(read_fd)),
                     CallArg::integer(static_cast<uint64_t>(getpid()))};
  auto l = fault_injected("lease-call")
               ? Result<remote::CallReport>(Error(Errc::kIo,
                                                  "call the agent's lease entry point: fault injected by "
                                                  "REMORA_INJECT_FAULT=lease-call"))
               : t.call(RemoteAddr(agent.lease_fn), largs, on_listener);
  hand_over_read_end(t, pid, agent.info, l.ok(), read_end, *lease_fd);
  if (!l || l->value != 0) {
    lease_fd->reset();  // a lease armed all the same expires at once: its tools detach
    if (!l) return std::move(l).error();
    return Error(Errc::kIo, "the agent could not arm the lease");
  }
  return ok();
}

// Arms the lease of an attach that succeeded. When it cannot be armed, the
// tools are detached again: attached without a lease they would outlive this
// controller for good, and a failed attach must leave nothing attached.
Result<void> arm_lease_or_detach(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                 const CallOptions& on_listener, UniqueFd* lease_fd, const std::string& ctx) {
  auto armed = arm_lease(t, pid, agent, on_listener, lease_fd);
  if (armed) return ok();
  Error e = std::move(armed).error().with_context("arm the lease");
  if (e.code() == Errc::kTargetExited || e.code() == Errc::kNoSuchProcess)
    return std::move(e).with_context(ctx);
  auto d = t.call(RemoteAddr(agent.detach_fn), {}, on_listener);
  if (!d || static_cast<int32_t>(d->value) != REMORA_AGENT_OK)
    return std::move(e).with_context(ctx + " (the tools could not be detached again: run remora detach -p " +
                                     std::to_string(pid) + ")");
  return std::move(e).with_context(ctx + " (the tools were detached again)");
}

// The attach the loader thread can make itself (LoaderAttach), or nullopt:
// with a lease (armed within a remote call: remora_agent_attach_leased), a
// stopped process (whose listener could not remove our scratch), a tool
// the target does not see as it is (its memfd or copy is made by calls on
// the listener) or with libraries of its own the target cannot find
// itself (deliver_dependencies loads those), no dlsym in the
// target, or REMORA_INJECT_FAULT=listener-attach. The attach call on the
// listener does the rest, as before.
std::optional<LoaderAttach> loader_attach_for(remote::Target& t, const AttachOptions& opts) {
  if (opts.lease || t.stopped_at_open() || fault_injected("listener-attach")) return std::nullopt;
  LoaderAttach h;
  std::optional<std::vector<procfs::MapEntry>> maps;  // read once, for the first tool that needs libraries
  for (const auto& tool : opts.tools) {
    char real[PATH_MAX];
    if (::realpath(tool.c_str(), real) == nullptr || !remote::visible_as_is(t, real)) return std::nullopt;
    auto needed = needed_beyond_glibc(real);
    if (!needed) return std::nullopt;
    for (const auto& soname : *needed) {  // the target finds them itself (deliver_dependencies would not act)
      if (!maps) {
        auto m = procfs::read_maps(t.pid());
        if (!m) return std::nullopt;
        maps = std::move(*m);
      }
      if (!target_finds(t.pid(), *maps, soname)) return std::nullopt;
    }
    h.list += (h.list.empty() ? "" : ":") + std::string(real) + "|" + real;
  }
  h.env = encode_env(opts.env);
  static std::atomic<uint64_t> seq{0};
  h.id = (static_cast<uint64_t>(getpid()) << 32) | (++seq & 0xffffffffu);
  h.timeout = opts.timeout;
  if (h.list.empty() || h.list.size() + h.env.size() > 8192) return std::nullopt;  // the scratch's room
  const remote::Target::SymbolQuery q[] = {{"dlsym", true, false}};
  auto fns = t.find_symbols("libc.so.6", q);
  h.dlsym_fn = fns ? (*fns)[0] : RemoteAddr();
  if (h.dlsym_fn.null()) {  // before glibc 2.34
    const remote::Target::SymbolQuery dq[] = {{"dlsym"}};
    auto dl = t.find_symbols("libdl.so.2", dq);
    if (!dl) return std::nullopt;
    h.dlsym_fn = (*dl)[0];
  }
  return h;
}

// Resolves the agent in the target, loading it first when it is not there.
// Returns the listener's tid when the load had to find it itself (a stopped
// process), else 0. `retired` receives our scratch mapping, which loaded the
// agent and in which nothing runs any more: it normally goes within the
// attach call; the handle removes it if a step fails before that call.
// `agent_file`: the agent's memfd, held open until the caller's tools are
// loaded. The dynamic loader knows a library by the path it was opened by,
// and "/proc/self/fd/N" of a closed memfd names the next memfd too: a tool
// given the agent's old number would be taken for the agent, loaded already.
// `loader_attach` receives the id of the attach the loader thread handed the
// agent (loader_attach_for), when the agent took it: then there is no
// retired scratch (the agent's listener removes it).
Result<pid_t> ensure_agent(remote::Target& t, pid_t pid, const AttachOptions& opts, const Deadline& deadline,
                           AgentSymbols* agent, remote::RemoteHandle* retired, bool* loaded_now,
                           OwnedFile* agent_file, std::optional<uint64_t>* loader_attach) {
  bool loaded = REMORA_TRY(resolve_agent(t, agent));
  REMORA_LOG(kAttach, "pid %d: agent %s", pid, loaded ? "present" : "absent");
  if (loaded) return 0;
  // Refused through the environment: nothing is touched. (A loaded agent
  // checks the same itself, in the target.)
  REMORA_TRY(check_environment(pid));
  REMORA_TRY(check_dynamic(t));
  auto path = REMORA_TRY(find_agent_library(opts.agent_path));
  // Before anything is injected: what the load makes, against the
  // target's seccomp filter (remote/seccomp.h).
  REMORA_TRY(t.check_syscalls(remote::seccomp::agent_load_syscalls(), "load the agent"));
  remote::RemoteHandle stack;  // the loader thread's, which is gone: removed on any failure
  JustLoaded just{0, path};
  const auto hook = loader_attach_for(t, opts);
  bool taken = false;
  pid_t known_listener = REMORA_TRY(load_library(t, path, "the agent", deadline, agent_file, &stack,
                                                 &just.handle, hook ? &*hook : nullptr, &taken));
  if (taken) *loader_attach = hook->id;
  REMORA_LOG(kAttach, "pid %d: agent loaded%s", pid, taken ? ", its attach handed to the listener" : "");
  loaded = REMORA_TRY(resolve_agent(t, agent, /*retire_own=*/true, &just));
  if (taken && loaded) {
    // Done with our scratch: the agent's listener may remove it.
    const uint64_t go = hook->id;
    REMORA_TRY_CTX(t.write(RemoteAddr(agent->info + offsetof(remora_agent_info, retire_go)),
                           std::as_bytes(std::span(&go, 1))),
                   "hand our scratch to the agent");
  }
  if (auto m = t.take_retired_scratch(); m && taken) {
    // The agent's listener removes it once the loader thread is gone.
  } else if (m) {
    // The loader's stack right below the scratch (start_loader_thread): one
    // range, removed within the attach call with the scratch.
    const auto st = stack.mapping();
    if (st.size != 0 && st.start.addr() + st.size == m->start.addr()) {
      stack.release();
      m = remote::Target::Mapping{st.start, st.size + m->size};
    }
    *retired = remote::RemoteHandle::mapping(t, *m);
  }
  REMORA_TRY_CTX(stack.reset(), "remove the loader thread's stack");  // elsewhere: by itself, as before
  if (!loaded) return Error(Errc::kInternal, "the agent was loaded but is not in the target's maps");
  *loaded_now = true;
  return known_listener;
}

// Waits until the agent's listener thread, started by its constructor, is
// there; returns the head of the agent's info block (read_info_head).
Result<remora_agent_info> wait_for_listener(remote::Target& t, pid_t pid, uint64_t info_at,
                                            pid_t known_listener, const Deadline& deadline) {
  for (long nap = 20'000;; nap = std::min<long>(nap + 20'000, 200'000)) {
    auto info = REMORA_TRY(read_info_head(t, info_at));
    if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid == 0 && known_listener != 0) {
      // Stopped process: the listener has not run yet to publish its tid.
      // Publish it for it, so that later sessions find it too.
      info.listener_tid = known_listener;
      // In the agent's block, as the agent names its own threads.
      auto in_ns = procfs::tid_in_target_ns(pid, known_listener);
      int32_t tid = in_ns ? *in_ns : known_listener;
      (void)t.write(RemoteAddr(info_at + offsetof(remora_agent_info, listener_tid)),
                    std::as_bytes(std::span(&tid, 1)));
    }
    if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid != 0) return info;
    if (deadline.expired()) {
      std::string why = process_is_stopped(pid) ? " (the process is stopped: send it SIGCONT and retry)" : "";
      return Error(Errc::kTimedOut, "the agent's listener thread did not start" + why);
    }
    pause_briefly(nap);
  }
}

// The tool list the agent takes: "display|loadpath" entries for a first
// attach, each tool made visible in the target (its memfd or placed copy, if
// it needs one, held in `memfds`, the memfd closed on the listener); the
// display names alone when
// tools are loaded already (a re-attach: the agent compares the list and
// refuses a different one).
Result<std::string> tool_list(remote::Target& t, const std::vector<std::string>& tools, bool reattach,
                              const CallOptions& on_listener, const Deadline& deadline,
                              std::vector<OwnedFile>* memfds) {
  std::string list, display_list;
  std::vector<std::optional<std::string>> real_tools;  // nullopt: no such file
  for (const auto& tool : tools) {
    char real[PATH_MAX];
    real_tools.push_back(::realpath(tool.c_str(), real) ? std::optional<std::string>(real) : std::nullopt);
    display_list += (display_list.empty() ? "" : ":") + real_tools.back().value_or(tool);
  }
  if (reattach) return display_list;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!real_tools[i]) return Error(Errc::kInvalidArgument, "tool library " + tools[i] + " not found");
    std::set<std::string> seen;
    REMORA_TRY(deliver_dependencies(t, *real_tools[i], deadline, &seen, memfds));
    auto vf = REMORA_TRY(make_visible_owned(t, *real_tools[i], on_listener));
    list += (list.empty() ? "" : ":") + *real_tools[i] + "|" + vf.path;
    memfds->push_back(std::move(vf));
  }
  return list;
}

// Why the agent refused an attach because tools are attached already, from
// its info block: a live lease names its owner (whose session a detach
// would break: none is suggested); without a lease, a detach ends it.
std::string already_attached_message(const remora_agent_info& info) {
  if (info.lease_pid != 0 && info.lease_expired == 0)
    return "attached by remora pid " + std::to_string(info.lease_pid) + ", lease live (tools " +
           std::string(info.tools) + "): another session holds this process; attach again once it has ended";
  return info.message;
}

// The attach call. Our retired scratch goes within it (the agent removes it
// first: nothing runs in it any more), or, for an agent older than that
// entry point, by a call of its own just before. The tools' memfds are
// closed once the call returned: the tools are loaded, or will not be.
// `lease_read`, when given, is the lease pipe's read end (protocol 2): the
// agent arms the lease within this call, before any tool runs, and owns the
// descriptor from the call on; `lease_fd` is our write end, closed when the
// attach fails.
// An entry point's result: ok, or the agent's refusal as the info block
// words it.
Result<void> agent_result(remote::Target& t, const AgentSymbols& agent, int code) {
  if (code == REMORA_AGENT_OK) return ok();
  if (code == REMORA_AGENT_ERR_BUSY)  // the agent wrote no message for it
    return Error(Errc::kAlreadyAttached,
                 "another controller's first attach to this process is in progress: attach again once it has "
                 "ended");
  auto info = REMORA_TRY(read_info(t, agent.info));
  info.message[sizeof info.message - 1] = '\0';
  info.tools[sizeof info.tools - 1] = '\0';
  if (code == REMORA_AGENT_ERR_ALREADY_ATTACHED)
    return Error(Errc::kAlreadyAttached, already_attached_message(info));
  return Error(errc_for_agent(code), info.message);
}

struct AttachCall {
  const std::vector<std::byte>& env;
  const std::string& list;
  remote::RemoteHandle& retired;
  std::vector<OwnedFile>& memfds;
  remote::RemoteHandle* lease_read = nullptr;
  UniqueFd* lease_fd = nullptr;
};

Result<void> call_agent_attach(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                               const CallOptions& on_listener, AttachCall c) {
  const bool leased = c.lease_read != nullptr;
  if (c.retired && ((!leased && agent.attach_unmap_fn == 0) || fault_injected("remove-scratch"))) {
    if (fault_injected("remove-scratch"))
      return Error(Errc::kIo,
                   "remove the scratch mapping: fault injected by REMORA_INJECT_FAULT=remove-scratch");
    REMORA_TRY(c.retired.reset());
  }
  std::vector<CallArg> args = {CallArg::buffer(c.env), CallArg::string(c.list)};
  uint64_t attach_fn = leased ? agent.attach_leased_fn : agent.attach_fn;
  if (c.retired || leased) {
    const auto m = c.retired.mapping();  // size 0 when there is none
    args.push_back(CallArg::integer(m.start.addr()));
    args.push_back(CallArg::integer(m.size));
    if (!leased) attach_fn = agent.attach_unmap_fn;
    c.retired.release();  // the agent's from this call on
  }
  if (leased) {
    args.push_back(CallArg::integer(static_cast<uint64_t>(c.lease_read->fd())));
    args.push_back(CallArg::integer(static_cast<uint64_t>(getpid())));
  }
  auto rc = t.call(RemoteAddr(attach_fn), args, on_listener);
  c.memfds.clear();
  if (leased) hand_over_read_end(t, pid, agent.info, rc.ok(), *c.lease_read, *c.lease_fd);
  int code = rc ? static_cast<int>(static_cast<int32_t>(rc->value)) : REMORA_AGENT_OK;
  if (leased && (!rc || code != REMORA_AGENT_OK)) c.lease_fd->reset();  // a lease armed all the same expires
  if (!rc) return std::move(rc).error();
  return agent_result(t, agent, code);
}

// The end of an attach the loader thread made (LoaderAttach): once the
// agent's listener has removed our scratch and the loader's stack, so that
// the attach leaves nothing of ours mapped, as the attach call does (a
// process stopped meanwhile keeps them until it runs again, when its
// listener removes them), the attach's result as call_agent_attach reads it.
Result<void> finish_loader_attach(remote::Target& t, pid_t pid, const AgentSymbols& agent, uint64_t id,
                                  const Deadline& deadline) {
  // Only the three words it watches (the whole block is 10 KiB).
  struct Watched {
    int32_t retire_pending, loader_rc;
    uint64_t loader_done;
  };
  static_assert(offsetof(remora_agent_info, loader_rc) == offsetof(remora_agent_info, retire_pending) + 4 &&
                offsetof(remora_agent_info, loader_done) == offsetof(remora_agent_info, retire_pending) + 8);
  const RemoteAddr at(agent.info + offsetof(remora_agent_info, retire_pending));
  std::optional<std::chrono::steady_clock::time_point> attached_at;
  for (long nap = 20'000;; nap = std::min<long>(nap + 20'000, 200'000)) {
    Watched info{};
    REMORA_TRY(t.read(at, std::as_writable_bytes(std::span(&info, 1))));
    if (info.loader_done == id && !attached_at) attached_at = std::chrono::steady_clock::now();
    if (attached_at && info.retire_pending == 0) return agent_result(t, agent, info.loader_rc);
    if (attached_at && (deadline.expired() ||
                        (std::chrono::steady_clock::now() - *attached_at > std::chrono::milliseconds(2) &&
                         process_is_stopped(pid)))) {
      REMORA_LOG(kAttach, "pid %d: the agent removes our scratch once its listener runs", pid);
      return agent_result(t, agent, info.loader_rc);
    }
    if (!attached_at && deadline.expired()) {
      std::string why = process_is_stopped(pid) ? " (the process is stopped: send it SIGCONT)" : "";
      return Error(Errc::kTimedOut,
                   "the agent's listener did not finish the attach in time (a tool's initialisation may be "
                   "blocked)" +
                       why);
    }
    pause_briefly(nap);
  }
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

  // What this attach creates in the target, owned until the target takes it
  // for good: whatever step fails, it is released in the target on return.
  remote::RemoteHandle retired;
  std::vector<OwnedFile> memfds;
  OwnedFile agent_file;  // the agent's memfd, if it needed one: held until the tools are loaded
  std::optional<uint64_t> loader_attach;  // the attach the loader thread handed the agent (LoaderAttach)
  pid_t known_listener = REMORA_TRY_CTX(ensure_agent(t, pid, opts, deadline, &s->agent, &retired,
                                                     &out.agent_loaded_now, &agent_file, &loader_attach),
                                        ctx);
  auto info = REMORA_TRY_CTX(wait_for_listener(t, pid, s->agent.info, known_listener, deadline), ctx);
  if ((info.features & REMORA_AGENT_FEATURE_UNLOAD) != 0 && info.unloading)
    return Error(
               Errc::kAlreadyAttached,
               "the agent in process " + std::to_string(pid) +
                   " is being unloaded (its listener is gone): if no remora detach --unload is running, one "
                   "was interrupted; finish it with remora detach --unload -p " +
                   std::to_string(pid) + ", then attach again")
        .with_context(ctx);
  s->listener = info.listener_tid;
  if (out.agent_loaded_now) t.note_descendant_thread(s->listener);  // started by our loader thread
  REMORA_LOG(kAttach, "pid %d: listener %d ready", pid, s->listener);
  if (loader_attach) {
    REMORA_TRY_CTX(finish_loader_attach(t, pid, s->agent, *loader_attach, deadline), ctx);
    REMORA_LOG(kAttach, "pid %d: attached (the loader's request)", pid);
    s->attached = true;
    out.ok = true;
    out.elapsed = std::chrono::steady_clock::now() - t0;
    return out;
  }
  CallOptions on_listener{s->listener, opts.timeout};

  auto list =
      REMORA_TRY_CTX(tool_list(t, opts.tools, info.tools[0] != '\0', on_listener, deadline, &memfds), ctx);
  REMORA_LOG(kAttach, "pid %d: tools visible", pid);
  // The lease belongs to the attach (protocol 2): the agent records this
  // controller before any tool runs, so no instant of a controller's death
  // leaves tools attached without a lease. An agent of protocol 1 is leased
  // after the attach, as it always was.
  const bool leased = opts.lease && (info.features & REMORA_AGENT_FEATURE_LEASED_ATTACH) != 0 &&
                      s->agent.attach_leased_fn != 0 && !fault_injected("old-agent");
  // The new write end stays apart from the session's until the agent took
  // the lease: a refused attach must not close a lease this controller
  // holds already (that would expire its own live session).
  remote::RemoteHandle lease_read;
  UniqueFd new_lease;
  if (leased)
    lease_read = REMORA_TRY_CTX(make_lease_pipe(t, pid, on_listener, &new_lease), ctx + ": make the lease");
  const auto env = encode_env(opts.env);
  AttachCall call{env, list, retired, memfds};
  if (leased) {
    call.lease_read = &lease_read;
    call.lease_fd = &new_lease;
  }
  REMORA_TRY_CTX(call_agent_attach(t, pid, s->agent, on_listener, call), ctx);
  if (leased) s->lease_fd = std::move(new_lease);
  REMORA_LOG(kAttach, "pid %d: attached%s", pid, leased ? " with its lease" : "");
  if (opts.lease && !leased)
    REMORA_TRY(arm_lease_or_detach(t, pid, s->agent, on_listener, &s->lease_fd, ctx));
  s->attached = true;
  out.ok = true;
  out.elapsed = std::chrono::steady_clock::now() - t0;
  return out;
}

Result<void> Controller::detach(pid_t pid, std::chrono::milliseconds timeout) {
  DetachOptions opts;
  opts.timeout = timeout;
  auto r = detach(pid, opts);
  if (!r) return std::move(r).error();
  return ok();
}

Result<UnloadReport> Controller::detach(pid_t pid, const DetachOptions& opts) {
  detail::ScopedTimerSlack slack;
  if (pid != 0) return detach_one(pid, opts);
  Result<UnloadReport> last = UnloadReport{};
  UnloadReport merged{true, {}};
  for (pid_t p : sessions()) {
    auto r = detach_one(p, opts);
    if (!r) {
      last = std::move(r);
      continue;
    }
    merged.unloaded = merged.unloaded && r->unloaded;
    merged.kept_tools.insert(merged.kept_tools.end(), r->kept_tools.begin(), r->kept_tools.end());
  }
  if (!last) return last;
  if (!opts.unload) merged.unloaded = false;
  return merged;
}

namespace {

// The unload proper, on a process whose agent is resolved (DetachOptions::
// unload): remora_agent_unload on the listener (it detaches the tools if
// they are attached), then the agent's dlclose on a fresh thread. An
// unload interrupted after the first step (a deadline, a controller killed)
// is finished by the next one: the agent says it is `unloading`.
Result<UnloadReport> unload_agent(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                  remora_agent_info info, std::chrono::milliseconds timeout) {
  Deadline deadline = Deadline::after(timeout);
  if ((info.features & REMORA_AGENT_FEATURE_UNLOAD) == 0 || agent.unload_fn == 0) {
    if (info.attached) {
      auto d = t.call(RemoteAddr(agent.detach_fn), {}, CallOptions{info.listener_tid, timeout});
      if (!d) return std::move(d).error();
    }
    return Error(Errc::kNotSupported,
                 "the agent in process " + std::to_string(pid) + " (protocol " +
                     std::to_string(info.version) +
                     ") was loaded by an older Remora, with RTLD_NODELETE, and cannot be unloaded; its tools "
                     "are detached. Only a restart of the process removes it");
  }
  if (!info.unloading) {
    auto rc = t.call(RemoteAddr(agent.unload_fn), {}, CallOptions{info.listener_tid, timeout});
    if (!rc) return std::move(rc).error().with_context("unload the tools");
    info = REMORA_TRY(read_info(t, agent.info));
    if (static_cast<int32_t>(rc->value) != REMORA_AGENT_OK) {
      info.message[sizeof info.message - 1] = '\0';
      return Error(errc_for_agent(static_cast<int32_t>(rc->value)), info.message)
          .with_context("unload the tools");
    }
  }
  info.kept[sizeof info.kept - 1] = '\0';
  UnloadReport report;
  report.kept_tools = split_list(info.kept);
  REMORA_TRY_CTX(dlclose_agent(t, pid, info, deadline), "unload the agent");
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  if (remote::find_library(pid, maps, kAgentName))
    return Error(Errc::kInternal, std::string("the agent's dlclose returned 0 but ") + kAgentName +
                                      " is still mapped (another library of the process holds it?)")
        .with_context("unload the agent");
  report.unloaded = true;
  return report;
}

}  // namespace

Result<UnloadReport> Controller::detach_one(pid_t pid, const DetachOptions& opts) {
  const std::string ctx =
      std::string(opts.unload ? "detach and unload from" : "detach from") + " process " + std::to_string(pid);
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
  // A detach needs the head alone; an unload may finish an earlier one from
  // the block's tail (`kept`, the agent's handle).
  auto info =
      REMORA_TRY_CTX(opts.unload ? read_info(t, s->agent.info) : read_info_head(t, s->agent.info), ctx);
  if (opts.unload) {
    auto r = unload_agent(t, pid, s->agent, info, opts.timeout);
    finish();
    if (r) {
      s->agent = AgentSymbols{};  // gone: a later attach loads it afresh
      s->listener = 0;
    }
    if (!r) return std::move(r).error().with_context(ctx);
    return r;
  }
  auto rc = t.call(RemoteAddr(s->agent.detach_fn), {}, CallOptions{info.listener_tid, opts.timeout});
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
  return UnloadReport{};
}

Result<AgentState> Controller::status(pid_t pid) {
  AgentState st;
  auto mem = REMORA_TRY(remote::Memory::open(pid));
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  if (!remote::find_library(pid, maps, kAgentName)) return st;
  auto sym =
      REMORA_TRY(remote::resolve_symbol(pid, mem, kAgentName, "remora_agent_info", 0, {}, false, &maps));
  remora_agent_info info{};
  REMORA_TRY(mem.read(sym.address, std::as_writable_bytes(std::span(&info, 1))));
  if (info.magic != REMORA_AGENT_MAGIC) return st;
  listener_as_we_name_it(pid, &info);
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
  if (info.version >= 4) st.forked_from = info.forked_from;
  if (info.version >= 5) st.loader_attached = info.loader_done != 0;
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

detail::ScopedTimerSlack::ScopedTimerSlack() {
  const int was = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  // 1 ns, not 0: 0 would mean "back to this thread's default slack".
  if (was > 1 && ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) == 0) saved_ = was;
}

detail::ScopedTimerSlack::~ScopedTimerSlack() {
  if (saved_ > 0) (void)::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_), 0, 0, 0);
}

// Runs work(i) for every i < n, on two threads per core but at most eight,
// this one included; returns when every call has returned. Two per core: an
// attach waits for its target about half of its time (its loader's dlopen,
// the listener's attach), and one per core left the CPUs idle then (a tree
// of 32 on 2 CPUs: 2.3x its in-process floor with 2 threads, 2.0x with 4,
// 2.3x with 8; docs/benchmarks.md).
void detail::for_each_parallel(size_t n, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    for (size_t i; (i = next.fetch_add(1)) < n;) work(i);
  };
  unsigned threads_wanted = std::min<unsigned>(2 * std::max(1u, std::thread::hardware_concurrency()), 8);
  std::vector<std::thread> threads;
  for (unsigned i = 1; i < threads_wanted && i < n; ++i) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
}

namespace {

using detail::for_each_parallel;

void record_failure(ProcessOutcome& o, const Error& e) {
  o.code = e.code();
  o.message = e.to_string();
}

}  // namespace

Result<std::vector<ProcessOutcome>> Controller::attach_tree(pid_t root, const AttachOptions& opts) {
  detail::ScopedTimerSlack slack;
  // The root is refused at once when nothing below it can be attached
  // either: a zombie, a kernel thread (whose "children" are other kernel
  // threads, not a tree to walk).
  REMORA_TRY_CTX(refuse_no_user_space(root), "attach to process " + std::to_string(root));
  auto pids = REMORA_TRY(snapshot_tree(root));
  // Hold a pidfd for each process from the snapshot on: a pid recycled
  // meanwhile can never be attached by mistake.
  std::vector<UniqueFd> pidfds;
  for (pid_t p : pids) pidfds.emplace_back(static_cast<int>(::syscall(SYS_pidfd_open, p, 0)));
  std::vector<ProcessOutcome> outcomes(pids.size());
  for_each_parallel(pids.size(), [&](size_t i) {
    outcomes[i].pid = pids[i];
    if (!pidfds[i] || !pidfd_alive(pidfds[i].get())) {
      outcomes[i].code = Errc::kTargetExited;
      outcomes[i].message = "process " + std::to_string(pids[i]) + " exited before it could be attached";
      return;
    }
    auto r = attach_one(pids[i], pidfds[i].get(), opts);
    if (r)
      outcomes[i] = *r;
    else
      record_failure(outcomes[i], r.error());
  });
  std::lock_guard lock(mu_);
  auto& attached = trees_[root];
  for (const auto& o : outcomes)
    if (o.ok) attached.push_back(o.pid);
  return outcomes;
}

Result<std::vector<ProcessOutcome>> Controller::detach_tree(pid_t root, std::chrono::milliseconds timeout) {
  DetachOptions opts;
  opts.timeout = timeout;
  return detach_tree(root, opts);
}

Result<std::vector<ProcessOutcome>> Controller::detach_tree(pid_t root, const DetachOptions& opts) {
  detail::ScopedTimerSlack slack;
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
  return detach_each(pids, opts);
}

// ---- following a tree (follow.cc): the steps that need a session ----

UniqueFd Controller::lease_pipe_held_by(pid_t pid) {
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard lock(mu_);
    for (const auto& [p, s] : sessions_) all.push_back(s);
  }
  // Our write ends by the pipe they name; the read end the child holds is a
  // descriptor of the same pipe, inherited through the fork.
  std::map<std::pair<dev_t, ino_t>, std::shared_ptr<Session>> pipes;
  for (const auto& s : all) {
    std::lock_guard lock(s->mu);
    struct stat st {};
    if (s->lease_fd && ::fstat(s->lease_fd.get(), &st) == 0) pipes[{st.st_dev, st.st_ino}] = s;
  }
  if (pipes.empty()) return UniqueFd();
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return UniqueFd();
  while (dirent* e = ::readdir(d.get())) {
    struct stat st {};
    if (e->d_name[0] == '.' || ::stat((dir + "/" + e->d_name).c_str(), &st) != 0) continue;
    auto it = pipes.find({st.st_dev, st.st_ino});
    if (it == pipes.end()) continue;
    std::lock_guard lock(it->second->mu);
    if (it->second->lease_fd) return UniqueFd(::fcntl(it->second->lease_fd.get(), F_DUPFD_CLOEXEC, 0));
  }
  return UniqueFd();
}

// A forked child that kept a session: made a session of this controller
// without calling any tool (they are attached in it already). Its lease is
// the controller's: the write end the child's watcher watches (the parent's
// pipe, inherited) is shared with the parent's session, so that the pipe
// closes only once both are detached; a child whose agent armed none (an
// agent older than REMORA_AGENT_FEATURE_FORK_LEASE) gets a lease of its own.
// `parent_ours`: its parent is a session of this controller, which is what
// makes an unleased session (attach --keep, the C API) this one's.
Result<ProcessOutcome> Controller::adopt(pid_t pid, int pidfd, const AttachOptions& opts, bool parent_ours) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string ctx = "adopt process " + std::to_string(pid);
  UniqueFd ours = lease_pipe_held_by(pid);
  auto s = REMORA_TRY_CTX(session_for(pid, true), ctx);
  std::lock_guard lock(s->mu);
  if (pidfd >= 0 && !pidfd_alive(pidfd))
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " exited");
  remote::Target& t = *s->target;
  if (!REMORA_TRY_CTX(resolve_agent(t, &s->agent), ctx))
    return Error(Errc::kNotAttached, "process " + std::to_string(pid) + " has no Remora agent");
  // A child just forked may not have run the agent's fork handler yet: its
  // info block is its parent's copy (naming the parent's listener, no
  // thread of the child) until the handler has armed the child's lease and
  // the child's listener has published its tid.
  Deadline deadline = Deadline::after(opts.timeout);
  remora_agent_info info{};
  for (long nap = 1000;; nap = std::min<long>(nap * 2, 20'000)) {
    info = REMORA_TRY_CTX(read_info(t, s->agent.info), ctx);
    const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(info.listener_tid);
    if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid != 0 && ::access(task.c_str(), F_OK) == 0)
      break;
    if (deadline.expired())
      return Error(Errc::kTimedOut, "the agent's listener did not start in the forked process " +
                                        std::to_string(pid) + " (is it stopped? send it SIGCONT)")
          .with_context(ctx);
    pause_briefly(nap);
  }
  if (!info.attached)
    return Error(Errc::kNotAttached,
                 "the agent in process " + std::to_string(pid) + " has no tools attached");
  const bool leased = info.lease_pid != 0 && info.lease_expired == 0;
  if (leased && !ours) {
    info.tools[sizeof info.tools - 1] = '\0';
    return Error(Errc::kAlreadyAttached, already_attached_message(info)).with_context(ctx);
  }
  if (!leased && !parent_ours)
    return Error(Errc::kAlreadyAttached,
                 "process " + std::to_string(pid) +
                     " was forked from a process another session attached (no lease): "
                     "it is that session's; remora detach -p " +
                     std::to_string(pid) + " ends it")
        .with_context(ctx);
  s->listener = info.listener_tid;
  if (leased) {
    s->lease_fd = std::move(ours);
  } else if (opts.lease) {
    CallOptions on_listener{s->listener, opts.timeout};
    REMORA_TRY(arm_lease_or_detach(t, pid, s->agent, on_listener, &s->lease_fd, ctx));
  }
  s->attached = true;
  ProcessOutcome out;
  out.pid = pid;
  out.ok = true;
  out.elapsed = std::chrono::steady_clock::now() - t0;
  return out;
}

// Eight bytes read through /proc/PID/mem, no thread stopped: the agent's
// info block is where it was unless the process exec'ed (a new program,
// without the agent) or was unloaded.
bool Controller::agent_left(pid_t pid) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(pid);
    if (it == sessions_.end() || !it->second->attached) return false;
    s = it->second;
  }
  std::lock_guard lock(s->mu);
  if (s->agent.info == 0 || !pidfd_alive(s->pidfd.get())) return false;
  uint64_t magic = 0;
  auto r = s->target->read(RemoteAddr(s->agent.info), std::as_writable_bytes(std::span(&magic, 1)));
  return !r || magic != REMORA_AGENT_MAGIC;
}

void Controller::forget(pid_t pid) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(pid);
    if (it == sessions_.end()) return;
    s = std::move(it->second);
    sessions_.erase(it);
    for (auto& [root, pids] : trees_) std::erase(pids, pid);
  }
  std::lock_guard lock(s->mu);
  // The old program's memory is gone: nothing of ours is left to remove
  // there, and no call may be made on the new one's behalf.
  s->target->abandon_scratch();
}

// Detaches each of `pids` (for_each_parallel's threads at a time), one outcome each.
std::vector<ProcessOutcome> Controller::detach_each(const std::vector<pid_t>& pids,
                                                    const DetachOptions& opts) {
  std::vector<ProcessOutcome> outcomes(pids.size());
  for_each_parallel(pids.size(), [&](size_t i) {
    outcomes[i].pid = pids[i];
    auto r = detach_one(pids[i], opts);
    outcomes[i].ok = r.ok();
    if (r)
      outcomes[i].unload = std::move(*r);
    else
      record_failure(outcomes[i], r.error());
  });
  return outcomes;
}

std::vector<ProcessOutcome> Controller::detach_sessions(const DetachOptions& opts) {
  detail::ScopedTimerSlack slack;
  auto pids = sessions();
  return detach_each(pids, opts);
}

}  // namespace remora::attach
