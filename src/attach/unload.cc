// Unloading the agent (DetachOptions::unload): remora_agent_unload on the
// listener, then the agent's dlclose on a fresh thread (loader.cc), once no
// thread of the target can be in its code; what is left of ours (our
// scratch) goes with it.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "base/log.h"
#include "procfs/procfs.h"
#include "remote/lookup.h"
#include "remote/target.h"

namespace remora::attach::detail {

namespace {

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

// Where the agent's image starts in the process (0: not mapped). An agent
// mapped elsewhere after an unload is another one: loaded afresh by another
// controller's attach meanwhile.
uint64_t agent_base(pid_t pid) {
  auto maps = procfs::read_maps(pid);
  if (!maps) return 0;
  auto lib = remote::find_library(pid, *maps, kAgentName);
  return lib && !lib->maps.empty() ? lib->maps.front().start : 0;
}

// Whether the agent that started at `base`, being unloaded, is gone from
// the process (its dlclose by another controller is over: nothing there, or
// another agent, which is not unloading, loaded afresh in its place),
// waiting for it until `deadline`.
bool agent_gone_by(remote::Target& t, pid_t pid, uint64_t base, uint64_t info_at, const Deadline& deadline) {
  for (long nap = 1'000'000;; nap = std::min<long>(nap * 2, 20'000'000)) {
    if (agent_base(pid) != base) return true;
    remora_agent_info head{};
    const auto bytes = std::as_writable_bytes(std::span(&head, 1)).first(offsetof(remora_agent_info, tools));
    if (!t.read(RemoteAddr(info_at), bytes) || head.magic != REMORA_AGENT_MAGIC) return true;
    remora_agent_info flag{};
    if (t.read(RemoteAddr(info_at + offsetof(remora_agent_info, unloading)),
               std::as_writable_bytes(std::span(&flag.unloading, 1))) &&
        flag.unloading == 0)
      return true;
    if (deadline.expired()) return false;
    pause_briefly(nap);
  }
}

// Records this controller as the one whose unload is under way (protocol
// 7: the info block's unloader): others leave the dlclose to it while it
// lives. Best effort: without it, they wait for the agent to go until
// their deadline before they finish the unload themselves.
void record_unloader(remote::Target& t, const AgentSymbols& agent, const remora_agent_info& info) {
  if (info.version < 7) return;
  auto me = procfs::read_stat(::getpid());
  if (!me) return;
  struct {
    int32_t pid, reserved;
    uint64_t start;
  } who{static_cast<int32_t>(::getpid()), 0, me->start_time};
  static_assert(offsetof(remora_agent_info, unloader_start) == offsetof(remora_agent_info, unloader_pid) + 8);
  (void)t.write(RemoteAddr(agent.info + offsetof(remora_agent_info, unloader_pid)),
                std::as_bytes(std::span(&who, 1)));
}

// The controller recorded as unloading (record_unloader) still lives.
bool unloader_alive(const remora_agent_info& info) {
  if (info.version < 7 || info.unloader_pid <= 0) return false;
  auto st = procfs::read_stat(info.unloader_pid);
  return st && st->start_time == info.unloader_start && st->state != 'Z';
}

}  // namespace

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

// The unload proper, on a process whose agent is resolved (DetachOptions::
// unload): remora_agent_unload on the listener (it detaches the tools if
// they are attached), then the agent's dlclose on a fresh thread. An
// unload interrupted after the first step (a deadline, a controller killed)
// is finished by the next one: the agent says it is `unloading`.
Result<UnloadReport> unload_agent(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                  remora_agent_info info, std::chrono::milliseconds timeout) {
  Deadline deadline = Deadline::after(timeout);
  const uint64_t base = agent_base(pid);
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
  // Exactly one controller goes on to the agent's dlclose: the one whose
  // remora_agent_unload took the tools out (the agent refuses a second one,
  // UNLOADING). Two dlcloses of one handle would free the agent's link_map
  // twice in the target's loader.
  bool ours = false;
  if (!info.unloading) {
    CallOptions on_listener{info.listener_tid, timeout};
    on_listener.wait_for_thread = timeout;
    auto rc = call_on_listener(t, agent.unload_fn, {}, on_listener);
    // A listener gone meanwhile left for another controller's unload.
    if (!rc && rc.error().code() != Errc::kNoSuchProcess)
      return std::move(rc).error().with_context("unload the tools");
    const int code = rc ? static_cast<int32_t>(rc->value) : REMORA_AGENT_ERR_UNLOADING;
    ours = code == REMORA_AGENT_OK;
    if (!ours && code != REMORA_AGENT_ERR_UNLOADING) {
      info = REMORA_TRY(read_info(t, agent.info));
      info.message[sizeof info.message - 1] = '\0';
      return Error(errc_for_agent(code), info.message).with_context("unload the tools");
    }
    if (ours) {
      record_unloader(t, agent, info);
      info = REMORA_TRY(read_info(t, agent.info));
    }
  }
  if (!ours) {
    // Another controller's unload: it dlcloses the agent. Only one still
    // unfinished at our deadline (its controller died or hangs between its
    // two steps) is finished here.
    (void)t.close();
    if (agent_gone_by(t, pid, base, agent.info, deadline))
      return Error(
          Errc::kNotAttached,
          "the agent in process " + std::to_string(pid) +
              " was unloaded by another controller meanwhile (remora detach --unload): nothing is left "
              "to detach or unload");
    info = REMORA_TRY(read_info(t, agent.info));
    // A fresh agent loaded since (at the same address) is not ours to take.
    if (info.magic != REMORA_AGENT_MAGIC || info.unloading == 0)
      return Error(
          Errc::kNotAttached,
          "the agent in process " + std::to_string(pid) +
              " was unloaded by another controller meanwhile (remora detach --unload), and loaded afresh "
              "since: nothing of the unload is left to do");
    if (unloader_alive(info))
      return Error(Errc::kAlreadyAttached, "the agent in process " + std::to_string(pid) +
                                               " is being unloaded by remora pid " +
                                               std::to_string(info.unloader_pid) +
                                               ", which is still at it: let it finish (remora status -p " +
                                               std::to_string(pid) + " shows when the agent is gone)");
    REMORA_LOG(kAttach, "pid %d: finishing an unload another controller left unfinished", pid);
    deadline = Deadline::after(timeout);  // the wait was not the finish's time
  }
  info.kept[sizeof info.kept - 1] = '\0';
  UnloadReport report;
  report.kept_tools = split_list(info.kept);
  REMORA_TRY_CTX(dlclose_agent(t, pid, info, deadline), "unload the agent");
  // Still there is still ours only while its block says it is unloading:
  // another controller's attach may have loaded a fresh agent since, even
  // at the same address.
  remora_agent_info after{};
  if (base != 0 && agent_base(pid) == base &&
      t.read(RemoteAddr(agent.info), std::as_writable_bytes(std::span(&after, 1))) &&
      after.magic == REMORA_AGENT_MAGIC && after.unloading != 0)
    return Error(Errc::kInternal, std::string("the agent's dlclose returned 0 but ") + kAgentName +
                                      " is still mapped (another library of the process holds it?)")
        .with_context("unload the agent");
  report.unloaded = true;
  return report;
}

}  // namespace remora::attach::detail
