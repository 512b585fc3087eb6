// Unloading the agent (DetachOptions::unload): remora_agent_unload on the
// listener, then the proof with every thread stopped (quiesce.h), then the
// agent's dlclose on a fresh thread (loader.cc); what is left of ours (our
// scratch) goes with it.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "attach/quiesce.h"
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

// Between two looks at stopped threads, a thread seen inside is given time
// to come out: 1 ms, doubling to 50 ms.
class Backoff {
 public:
  void wait(const Deadline& deadline) {
    std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(pause_, deadline.remaining()));
    pause_ = std::min(pause_ * 2, std::chrono::milliseconds(50));
  }

 private:
  std::chrono::milliseconds pause_{1};
};

// One look waits a second at most for the threads to stop: a thread that
// does not (in uninterruptible sleep, a vfork's parent) is looked at again
// later, within the operation's deadline.
// How much longer remora_agent_unload_forks may run past its second: it
// takes two glibc locks and a few microseconds natively.
constexpr std::chrono::milliseconds kUnloadForksGrace{10000};

Deadline look_deadline(const Deadline& deadline) {
  return Deadline::after(std::min<std::chrono::nanoseconds>(deadline.remaining(), std::chrono::seconds(1)));
}

Error stays_loaded(pid_t pid, const std::string& why, int looks) {
  return Error(Errc::kTimedOut, "the agent and its tools stay loaded (detached, finalised): " + why +
                                    ", at the last of " + std::to_string(looks) +
                                    " looks with the threads stopped. Run remora detach --unload -p " +
                                    std::to_string(pid) + " again once that thread is out");
}

}  // namespace

// The first look (quiesce.h): every thread but the listener stopped, none
// inside fork(); then, while they stay stopped, the listener takes our fork
// handlers out of glibc's list (remora_agent_unload_forks) and leaves.
Result<void> unload_fork_handlers(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                                  const remora_agent_info& info, const UnloadPlan& plan,
                                  const Deadline& deadline) {
  if (agent.unload_forks_fn == 0)
    return Error(Errc::kInternal, "the agent of protocol 7 lacks remora_agent_unload_forks");
  Backoff backoff;
  for (int looks = 1;; ++looks) {
    std::string why;
    {
      auto frozen = REMORA_TRY(Freeze::stop(pid, info.listener_tid, plan, look_deadline(deadline)));
      why = frozen->why_not_stopped();
      if (why.empty()) {
        auto verdict = judge_forks(frozen->threads());
        why = verdict.why;
        if (verdict.proven) {
          // A stopped thread may hold the exit functions' lock, which
          // __cxa_finalize takes first: the call then waits, holding
          // nothing, is taken back and tried again. (The fork handlers'
          // lock, which it takes second with the first held, no stopped
          // thread holds: none is inside fork() or __register_atfork.) A
          // call still running at its second is never taken back, since it
          // may hold either: it runs on (a slow machine, an emulated one).
          const auto budget =
              std::min<std::chrono::nanoseconds>(deadline.remaining(), std::chrono::seconds(1));
          CallOptions opts{info.listener_tid, std::chrono::duration_cast<std::chrono::milliseconds>(budget)};
          opts.running_grace = kUnloadForksGrace;
          auto rc = t.call(RemoteAddr(agent.unload_forks_fn), {}, opts);
          if (rc && static_cast<int32_t>(rc->value) == REMORA_AGENT_OK) return ok();
          if (rc)
            return Error(errc_for_agent(static_cast<int32_t>(rc->value)),
                         "the agent refused to take its fork "
                         "handlers out");
          if (rc.error().code() != Errc::kTimedOut) return std::move(rc).error();
          why = "the listener waited on a lock another thread holds";
        }
      }
    }
    if (deadline.expired()) return stays_loaded(pid, why, looks);
    backoff.wait(deadline);
  }
}

// The second look: every thread stopped, none in the code the dlclose
// unmaps, none counted inside a tool or the agent.
Result<void> prove_unload_safe(pid_t pid, const UnloadPlan& plan, const Deadline& deadline) {
  Backoff backoff;
  for (int looks = 1;; ++looks) {
    std::string why;
    {
      auto frozen = REMORA_TRY(Freeze::stop(pid, 0, plan, look_deadline(deadline)));
      why = frozen->why_not_stopped();
      if (why.empty()) {
        auto verdict = judge(plan, frozen->threads(), REMORA_TRY(frozen->counts(plan)));
        if (verdict.proven) return ok();
        why = verdict.why;
      }
    }
    if (deadline.expired()) return stays_loaded(pid, why, looks);
    backoff.wait(deadline);
  }
}

// The agent's own dlclose, after remora_agent_unload returned on the
// listener: the tools are finalised, the watcher is joined, and the
// listener is returning. Once its thread is gone and the proof holds (no
// thread in the code the dlclose unmaps, none counted inside a tool), a
// fresh thread (our trampoline, as for the load: never an interrupted
// thread, which may hold the loader lock) dlcloses it, and the agent's
// destructor the tools. The trampoline calls block.dlopen_fn(path, flags):
// here dlclose(self_handle), whose result lands in block.handle.
Result<void> dlclose_agent(remote::Target& t, pid_t pid, const AgentSymbols& agent,
                           const remora_agent_info& info, const Deadline& deadline) {
  if (info.self_handle == 0)
    return Error(Errc::kInternal,
                 "the agent did not find its own handle: it stays loaded (its tools are finalised)");
  const UnloadPlan plan = REMORA_TRY(unload_plan(info));
  if (info.unloading == 1)
    REMORA_TRY_CTX(unload_fork_handlers(t, pid, agent, info, plan, deadline), "unload the fork handlers");
  // Our calls ran through the agent's stubs, which go with it: forget them
  // (a retired scratch of our own is removed).
  REMORA_TRY(t.close());
  REMORA_TRY_CTX(wait_thread_gone(pid, info.listener_tid, deadline),
                 "wait for the agent's listener to return");
  REMORA_TRY(prove_unload_safe(pid, plan, deadline));
  const uint32_t go = 1, no = 0;
  const RemoteAddr go_at(agent.info + offsetof(remora_agent_info, unload_go));
  REMORA_TRY_CTX(t.write(go_at, std::as_bytes(std::span(&go, 1))), "tell the agent the unload is proven");
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
  if (auto ran = run_trampoline_thread(t, pthread_create_fn, run, {}, deadline); !ran) {
    // Not unloaded: a later exit() must not take the tools down in the
    // agent's destructor.
    (void)t.write(go_at, std::as_bytes(std::span(&no, 1)));
    return std::move(ran).error();
  }
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
  // Before protocol 7 the agent's unload dlclosed its tools while the other
  // threads ran: never called. Its tools are detached, and it stays.
  if ((info.features & REMORA_AGENT_FEATURE_UNLOAD) == 0 || agent.unload_fn == 0 ||
      (info.features & REMORA_AGENT_FEATURE_PROVEN_UNLOAD) == 0) {
    if (info.attached) {
      auto d = t.call(RemoteAddr(agent.detach_fn), {}, CallOptions{info.listener_tid, timeout});
      if (!d) return std::move(d).error();
    }
    return Error(Errc::kNotSupported,
                 "the agent in process " + std::to_string(pid) + " (protocol " +
                     std::to_string(info.version) +
                     ") was loaded by an older Remora, whose unload cannot be proven safe, and stays loaded; "
                     "its tools are detached. Only a restart of the process removes it");
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
  REMORA_TRY_CTX(dlclose_agent(t, pid, agent, info, deadline), "unload the agent");
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  if (remote::find_library(pid, maps, kAgentName))
    return Error(Errc::kInternal, std::string("the agent's dlclose returned 0 but ") + kAgentName +
                                      " is still mapped (another library of the process holds it?)")
        .with_context("unload the agent");
  // A tool the loader kept all the same (RTLD_NODELETE, a unique symbol,
  // another library's reference): its segments are still mapped, by the
  // same file. Named, as one that pinned itself is.
  if (auto plan = unload_plan(info)) {
    for (const auto& r : plan->code) {
      for (const auto& m : maps) {
        if (!m.exec || !m.file_backed() || m.start >= r.end || m.end <= r.start) continue;
        if (std::find(report.kept_tools.begin(), report.kept_tools.end(), m.path) == report.kept_tools.end())
          report.kept_tools.push_back(m.path);
      }
    }
  }
  report.unloaded = true;
  return report;
}

}  // namespace remora::attach::detail
