// Unloading the agent (DetachOptions::unload): remora_agent_unload on the
// listener, then the agent's dlclose on a fresh thread (loader.cc), once no
// thread of the target can be in its code; what is left of ours (our
// scratch) goes with it.
#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol.h"
#include "attach/internal.h"
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

}  // namespace remora::attach::detail
