// The agent once it is loaded: resolving its symbols, reading its info
// block, waiting for its listener thread, and the calls into it on that
// listener (the attach call and its result, the tool list it takes), or
// the end of the attach the loader thread handed it (docs/architecture.md,
// "Attach, step by step", step 3).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "elf/elf_image.h"
#include "procfs/procfs.h"
#include "remote/remote_handle.h"
#include "remote/seccomp.h"
#include "remote/target.h"

namespace remora::attach::detail {

namespace {

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

// True when the process is in a job-control stop (every thread 'T' and not
// because a tracer holds it).
bool process_is_stopped(pid_t pid) {
  auto st = procfs::read_status(pid);
  return st && st->state == 'T' && st->tracer_pid == 0;
}

}  // namespace

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
    case REMORA_AGENT_ERR_NOT_UNLOADABLE: return Errc::kNotSupported;
    default: return Errc::kInternal;
  }
}

// Resolves the agent's entry points if it is loaded; false when it is not.
// One read of the maps for everything, or none for the agent just loaded
// (`just`). `retire_own`: our own scratch, if the agent's stubs replace it,
// is left for the caller to have removed (see Target::take_retired_scratch)
// rather than removed by a call now.
Result<bool> resolve_agent(remote::Target& t, AgentSymbols* out, bool retire_own, const JustLoaded* just) {
  const remote::Target::SymbolQuery queries[] = {{"remora_agent_info", false},
                                                 {"remora_agent_attach"},
                                                 {"remora_agent_detach"},
                                                 {"remora_agent_set_lease"},
                                                 {"remora_agent_attach_unmap", true, false},
                                                 {"remora_agent_stub", true, false},
                                                 {"remora_agent_scratch", false, false},
                                                 {"remora_agent_attach_leased", true, false},
                                                 {"remora_agent_unload", true, false},
                                                 {"remora_agent_unload_forks", true, false}};
  std::optional<std::vector<RemoteAddr>> quick;
  if (just) quick = just_loaded_symbols(t, *just, queries);
  auto found =
      quick ? Result<std::vector<RemoteAddr>>(std::move(*quick)) : t.find_symbols(kAgentName, queries);
  if (!found && found.error().code() == Errc::kLibraryNotMapped) return false;
  if (!found) return std::move(found).error();
  const auto& f = *found;
  *out = AgentSymbols{f[0].addr(), f[1].addr(), f[2].addr(), f[3].addr(),
                      f[4].addr(), f[7].addr(), f[8].addr(), f[9].addr()};
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
void listener_as_we_name_it(pid_t pid, remora_agent_info* info, bool nested_pid_ns) {
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
  if (info.magic == REMORA_AGENT_MAGIC && info.listener_tid == 0 &&
      (info.features & REMORA_AGENT_FEATURE_LISTENER_ON_REQUEST) != 0)
    REMORA_TRY(t.read(
        RemoteAddr(addr + offsetof(remora_agent_info, listener_requested)),
        bytes.subspan(offsetof(remora_agent_info, listener_requested), sizeof info.listener_requested)));
  listener_as_we_name_it(t.pid(), &info, t.in_nested_pid_ns());
  return info;
}

bool needs_listener(const remora_agent_info& head) {
  return head.magic == REMORA_AGENT_MAGIC &&
         (head.features & REMORA_AGENT_FEATURE_LISTENER_ON_REQUEST) != 0 && head.listener_tid == 0 &&
         head.listener_requested == 0 && head.unloading == 0;
}

// The agent is in the process already (preloaded, or inherited through a
// fork): the trampoline's dlopen only finds it (RTLD_NOLOAD, by its soname,
// whatever path it was loaded by) and takes a reference, which the hook
// gives back (its argument 1). A fresh thread of ours, as for a load: the
// listener is started by pthread_create on a thread that holds no lock,
// never on an interrupted application thread.
Result<pid_t> request_listener(remote::Target& t, pid_t pid, const Deadline& deadline) {
  REMORA_TRY(t.check_syscalls(remote::seccomp::agent_load_syscalls(), "start the agent's listener"));
  const PlainHook start{REMORA_TRY(find_dlsym(t)), kStartListenerFn, 1};
  LoaderRun run;
  run.plain = &start;
  const RemoteAddr pthread_create_fn = REMORA_TRY(find_loader_functions(t, &run.block, &run.stack_fns));
  run.block.flags = RTLD_NOW | RTLD_NOLOAD;
  REMORA_TRY_CTX(run_trampoline_thread(t, pthread_create_fn, run, kAgentName, deadline),
                 "start the agent's listener");
  if (run.block.handle == 0)
    return Error(Errc::kInternal, std::string("the agent's ") + kAgentName +
                                      " was not found by its own name in process " + std::to_string(pid) +
                                      " (RTLD_NOLOAD)");
  if (run.block.hook_rc == kHookNotRun)
    return Error(Errc::kInternal, std::string("the agent in process ") + std::to_string(pid) + " has no " +
                                      kStartListenerFn + ", yet says it starts its listener on request");
  if (static_cast<int32_t>(run.block.hook_rc) == REMORA_AGENT_ERR_NO_LISTENER)
    return Error(Errc::kIo,
                 "the agent in process " + std::to_string(pid) +
                     " could not start its listener thread (out of threads or memory: pthread_create or mmap "
                     "failed there); free some and attach again");
  REMORA_LOG(kAttach, "pid %d: the agent's listener started on request", pid);
  pid_t listener = 0;
  if (run.driven && run.before) {  // a stopped process: the listener is the other new thread
    auto now = REMORA_TRY(procfs::list_tasks(pid));
    for (pid_t tid : now)
      if (tid != run.loader && std::find(run.before->begin(), run.before->end(), tid) == run.before->end())
        listener = tid;
  }
  return listener;
}

// Waits until the agent's listener thread is there, asking for it once when
// the agent has none and none was asked for (needs_listener: our loader
// thread's hook starts it for an agent we load; a preloaded or forked one
// waits to be asked); returns the head of the agent's info block
// (read_info_head). `started`: set when this wait asked.
Result<remora_agent_info> wait_for_listener(remote::Target& t, pid_t pid, uint64_t info_at,
                                            pid_t known_listener, const Deadline& deadline, bool* started) {
  bool asked = false;
  for (long nap = 20'000;; nap = std::min<long>(nap + 20'000, 200'000)) {
    auto info = REMORA_TRY(read_info_head(t, info_at));
    if (!asked && needs_listener(info)) {
      known_listener = REMORA_TRY(request_listener(t, pid, deadline));
      asked = true;
      if (started != nullptr) *started = true;
      continue;
    }
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

namespace {

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

}  // namespace

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

}  // namespace remora::attach::detail
