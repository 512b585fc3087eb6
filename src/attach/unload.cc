// Unloading the agent (DetachOptions::unload): remora_agent_unload on the
// listener, then the proof with every thread stopped (quiesce.h), then the
// agent's dlclose on a fresh thread (loader.cc); what is left of ours (our
// scratch) goes with it.
#include <unistd.h>

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

// How much longer remora_agent_unload_forks may run past its second: it
// takes two glibc locks and a few microseconds natively.
constexpr std::chrono::milliseconds kUnloadForksGrace{10000};

// One look waits a second at most for the threads to stop: a thread that
// does not (in uninterruptible sleep, a vfork's parent) is looked at again
// later, within the operation's deadline.
Deadline look_deadline(const Deadline& deadline) {
  return Deadline::after(std::min<std::chrono::nanoseconds>(deadline.remaining(), std::chrono::seconds(1)));
}

Error stays_loaded(pid_t pid, const std::string& why, int looks) {
  return Error(Errc::kTimedOut, "the agent and its tools stay loaded (detached, finalised): " + why +
                                    ", at the last of " + std::to_string(looks) +
                                    " looks with the threads stopped. Run remora detach --unload -p " +
                                    std::to_string(pid) + " again once that thread is out");
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

// Who unloads the agent (protocol 8: the info block's unloader_pid and
// unloader_start, in that layout).
struct Unloader {
  int32_t pid, reserved;
  uint64_t start;
};
static_assert(offsetof(remora_agent_info, unloader_start) == offsetof(remora_agent_info, unloader_pid) + 8);

// Records this controller as the one whose unload is under way: others leave
// the dlclose to it while it lives. Best effort: without it, they wait for
// the agent to go until their deadline before they finish the unload
// themselves (claim_unload decides between two that would).
void record_unloader(remote::Target& t, uint64_t info_at, uint32_t version) {
  if (version < 8) return;
  auto me = procfs::read_stat(::getpid());
  if (!me) return;
  const Unloader who{static_cast<int32_t>(::getpid()), 0, me->start_time};
  (void)t.write(RemoteAddr(info_at + offsetof(remora_agent_info, unloader_pid)),
                std::as_bytes(std::span(&who, 1)));
}

// The controller recorded as unloading (record_unloader) still lives.
bool unloader_alive(const Unloader& who) {
  if (who.pid <= 0) return false;
  auto st = procfs::read_stat(who.pid);
  return st && st->start_time == who.start && st->state != 'Z';
}
bool unloader_alive(const remora_agent_info& info) {
  return info.version >= 8 && unloader_alive(Unloader{info.unloader_pid, 0, info.unloader_start});
}

Error being_unloaded_by(pid_t pid, int32_t unloader) {
  return Error(Errc::kAlreadyAttached, "the agent in process " + std::to_string(pid) +
                                           " is being unloaded by remora pid " + std::to_string(unloader) +
                                           ", which is still at it: let it finish (remora status -p " +
                                           std::to_string(pid) + " shows when the agent is gone)");
}

// Under the second look's freeze, which holds every thread of the process
// (two controllers' freezes exclude each other: a thread has one tracer at
// most): the dlclose is ours unless another living controller is recorded
// as the unloader; then it is recorded as ours. Two dlcloses of one handle
// would free the agent's link_map twice in the target's loader.
Result<void> claim_unload(remote::Target& t, pid_t pid, uint64_t info_at, uint32_t version) {
  if (version < 8) return ok();  // no unloader recorded before protocol 8
  Unloader who{};
  REMORA_TRY_CTX(t.read(RemoteAddr(info_at + offsetof(remora_agent_info, unloader_pid)),
                        std::as_writable_bytes(std::span(&who, 1))),
                 "read who unloads the agent");
  if (who.pid != ::getpid() && unloader_alive(who)) return being_unloaded_by(pid, who.pid);
  record_unloader(t, info_at, REMORA_AGENT_PROTOCOL_VERSION);
  return ok();
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
// unmaps, none counted inside a tool or the agent; and the dlclose ours.
Result<void> prove_unload_safe(remote::Target& t, pid_t pid, uint64_t info_at, uint32_t version,
                               const UnloadPlan& plan, const Deadline& deadline) {
  Backoff backoff;
  for (int looks = 1;; ++looks) {
    std::string why;
    {
      auto frozen = REMORA_TRY(Freeze::stop(pid, 0, plan, look_deadline(deadline)));
      why = frozen->why_not_stopped();
      if (why.empty()) {
        auto verdict = judge(plan, frozen->threads(), REMORA_TRY(frozen->counts(plan)));
        if (verdict.proven) return claim_unload(t, pid, info_at, version);
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
  REMORA_TRY(prove_unload_safe(t, pid, agent.info, info.version, plan, deadline));
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
  const uint64_t base = agent_base(pid);
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
    if (!rc && rc.error().code() == Errc::kTimedOut)
      return Error(Errc::kTimedOut, rc.error().to_string() +
                                        ": the tools' detach and finalisation go on in the process; run remora "
                                        "detach --unload -p " +
                                        std::to_string(pid) + " again to finish the unload once they are done")
          .with_context("unload the tools");
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
      record_unloader(t, agent.info, info.version);
      info = REMORA_TRY(read_info(t, agent.info));
    }
  }
  if (!ours && unloader_alive(info)) {
    // Another controller's unload, under way: it dlcloses the agent. One
    // still unfinished at our deadline (its controller hangs between its
    // steps) is left to it all the same; one whose controller died is
    // finished here.
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
    if (unloader_alive(info)) return being_unloaded_by(pid, info.unloader_pid);
    deadline = Deadline::after(timeout);  // the wait was not the finish's time
  }
  if (!ours) REMORA_LOG(kAttach, "pid %d: finishing an unload another controller left unfinished", pid);
  info.kept[sizeof info.kept - 1] = '\0';
  UnloadReport report;
  report.kept_tools = split_list(info.kept);
  REMORA_TRY_CTX(dlclose_agent(t, pid, agent, info, deadline), "unload the agent");
  auto maps = REMORA_TRY(procfs::read_maps(pid));
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
