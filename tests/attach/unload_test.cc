// Detach with unload (DetachOptions::unload): the tools and the agent leave
// the process, and its descriptors and mappings are those it had before the
// first attach. Counted from the target's own /proc/PID/fd and
// /proc/PID/maps, before the first attach and after the unload, with the hook
// tool and with the default tool (libremora-tool.so); then a re-attach loads
// a fresh agent and works.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "attach_helpers.h"

#ifndef REMORA_DEFAULT_TOOL
#error "the unload tests need REMORA_DEFAULT_TOOL (libremora-tool.so)"
#endif

namespace remora::test {
namespace {

using V = std::vector<std::string>;

class AttachUnload : public IntegrationTest {
 protected:
  void interrupted_unload_is_finished(bool after_forks);
  HookLog log_;
};

std::vector<std::string> maps_lines(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Lines that name anything of Remora's: the agent, a tool, a memfd or a
// scratch mapping of ours ("[anon:remora...]" where the kernel names them).
std::vector<std::string> remora_lines(const std::vector<std::string>& maps) {
  std::vector<std::string> out;
  for (const auto& l : maps)
    for (const char* mark : {"libremora-", "remora-hook-tool", "memfd:", "anon:remora"})
      if (l.find(mark) != std::string::npos) {
        out.push_back(l);
        break;
      }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += "\n  " + l;
  return s.empty() ? " (none)" : s;
}

// The lines of `after` that `before` lacks.
std::vector<std::string> added_lines(const std::vector<std::string>& before,
                                     const std::vector<std::string>& after) {
  std::multiset<std::string> b(before.begin(), before.end());
  std::vector<std::string> out;
  for (const auto& l : after)
    if (auto it = b.find(l); it != b.end())
      b.erase(it);
    else
      out.push_back(l);
  return out;
}

// The difference of two maps listings by content (address ranges
// included): what the unload left, and what the process itself dropped.
std::string maps_diff(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  std::string s;
  for (const auto& l : added_lines(before, after)) s += "\n  + " + l;
  for (const auto& l : added_lines(after, before)) s += "\n  - " + l;
  return s;
}

// glibc's malloc arena for threads (malloc/arena.c): one 64 MiB heap,
// 64 MiB aligned, its used part read-write and the rest PROT_NONE: two
// anonymous lines. The first thread of a process that mallocs while no
// arena is free makes one (here: the fresh thread that dlopens the agent),
// glibc never unmaps an arena, and the process's next thread reuses it. It
// is the one mapping an unload may leave, and only in a process that had no
// free arena before.
bool is_malloc_arena(const std::vector<std::string>& lines) {
  constexpr unsigned long kHeapMax = 64ul << 20;
  if (lines.size() != 2) return false;
  unsigned long s0 = 0, e0 = 0, s1 = 0, e1 = 0, off = 0, ino0 = 1, ino1 = 1;
  char p0[8] = "", p1[8] = "", dev[16] = "";
  if (std::sscanf(lines[0].c_str(), "%lx-%lx %7s %lx %15s %lu", &s0, &e0, p0, &off, dev, &ino0) != 6 ||
      std::sscanf(lines[1].c_str(), "%lx-%lx %7s %lx %15s %lu", &s1, &e1, p1, &off, dev, &ino1) != 6)
    return false;
  return s0 % kHeapMax == 0 && e0 == s1 && e1 == s0 + kHeapMax && std::string(p0) == "rw-p" &&
         std::string(p1) == "---p" && ino0 == 0 && ino1 == 0;
}

// An address range of a maps listing.
struct Range {
  unsigned long start = 0, end = 0;
  std::string perms;
  unsigned long inode = 1;
};

std::vector<Range> ranges_of(const std::vector<std::string>& lines) {
  std::vector<Range> out;
  for (const auto& l : lines) {
    Range r;
    unsigned long off = 0;
    char perms[8] = "", dev[16] = "";
    const int n =
        std::sscanf(l.c_str(), "%lx-%lx %7s %lx %15s %lu", &r.start, &r.end, perms, &off, dev, &r.inode);
    if (n == 6) {
      r.perms = perms;
      out.push_back(r);
    }
  }
  return out;
}

// The parts of `after`'s ranges that no range of `before` covers, page
// exact: a new mapping that the kernel merged into a line the process had
// already (an adjacent anonymous one) shows as the new part alone.
std::vector<Range> new_ranges(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  const auto b = ranges_of(before);
  std::vector<Range> out;
  for (Range r : ranges_of(after)) {
    for (const auto& o : b) {  // sorted by address, as /proc lists them
      if (o.end <= r.start || o.start >= r.end) continue;
      if (o.start > r.start) out.push_back(Range{r.start, o.start, r.perms, r.inode});
      r.start = std::min(r.end, o.end);
      if (r.start == r.end) break;
    }
    if (r.start < r.end) out.push_back(r);
  }
  return out;
}

// libunwind's memory pool (attach_helpers.h): made the first time the
// default tool unwinds a sample, so only in a session that sampled before
// its detach.
bool is_libunwind_pool(pid_t pid, const Range& r) {
  return r.perms == "rw-p" && r.inode == 0 && is_libunwind_pool_range(pid, r.start, r.end);
}

// The first non-zero words of a range, for a failure's message.
std::string first_words(pid_t pid, const Range& r) {
  const auto words = read_words(pid, r.start, r.end);
  std::string out;
  int shown = 0;
  for (size_t i = 0; i < words.size() && shown < 24; ++i)
    if (words[i] != 0) {
      char b[64];
      std::snprintf(b, sizeof b, "\n    +0x%zx: 0x%llx", i * 8, static_cast<unsigned long long>(words[i]));
      out += b;
      ++shown;
    }
  return out;
}

// What an unload may leave that is not Remora's (glibc's arena, libunwind's
// pool), each named; the rest returned.
std::vector<Range> unexplained(pid_t pid, std::vector<Range> added) {
  std::vector<Range> rest;
  for (size_t i = 0; i < added.size(); ++i) {
    auto line = [](const Range& r) {
      char b[128];
      std::snprintf(b, sizeof b, "%lx-%lx %s 00000000 00:00 %lu", r.start, r.end, r.perms.c_str(), r.inode);
      return std::string(b);
    };
    if (i + 1 < added.size() && is_malloc_arena({line(added[i]), line(added[i + 1])})) {
      std::printf(
          "[unload] left: glibc's malloc arena, made by the agent's loader thread (glibc never unmaps one; "
          "the process's next thread reuses it)\n");
      ++i;
    } else if (is_libunwind_pool(pid, added[i])) {
      std::printf(
          "[unload] left: libunwind's memory pool, %lu bytes (libunwind maps it when the default tool first "
          "unwinds and never unmaps it, not even when it is unloaded)\n",
          added[i].end - added[i].start);
    } else {
      rest.push_back(added[i]);
    }
  }
  return rest;
}

struct Counts {
  std::map<int, std::string> fds;
  std::vector<std::string> maps;
};

Counts count(pid_t pid) { return Counts{steady_fds(pid), maps_lines(pid)}; }

// Checks a process after an unload against its counts before the first
// attach, and prints what differs.
void expect_back(TargetProcess& target, const Counts& before, const attach::UnloadReport& u) {
  const pid_t pid = target.pid();
  EXPECT_TRUE(u.unloaded);
  EXPECT_FALSE(agent_mapped(pid));
  auto after = count(pid);
  // Honest count: say what differs (nothing, when the process is back).
  std::printf("[unload] pid %d: fds %zu -> %zu, maps lines %zu -> %zu%s\n", pid, before.fds.size(),
              after.fds.size(), before.maps.size(), after.maps.size(),
              maps_diff(before.maps, after.maps).c_str());
  for (const auto& k : u.kept_tools) std::printf("[unload] kept (cannot be unloaded): %s\n", k.c_str());
  auto rep = target.report();  // the target's own count since its snapshot
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  if (!u.kept_tools.empty()) {
    // What a kept tool holds is its own (its library, its dependencies, its
    // memory, threads and descriptors): only the agent's and ours must go.
    for (const auto& l : remora_lines(after.maps)) {
      bool its = false;
      for (const auto& k : u.kept_tools) its = its || l.find(k) != std::string::npos;
      EXPECT_TRUE(its) << "left, and not the kept tool's: " << l;
    }
    std::printf(
        "[unload] SKIPPED: the exact fd and mapping counts (a tool stayed loaded, with what it holds: "
        "fds_delta=%lld maps_delta=%lld)\n",
        rep.fds_delta(), rep.maps_delta());
    std::fflush(stdout);
    return;
  }
  EXPECT_EQ(after.fds, before.fds) << "before:" << describe_fds(before.fds)
                                   << "\nafter:" << describe_fds(after.fds);
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
  EXPECT_EQ(remora_lines(after.maps), V{}) << "Remora's mappings left:" << joined(remora_lines(after.maps));
  // Page exact: nothing the process had is gone, and what is new is only
  // what glibc and libunwind keep by design (named above).
  EXPECT_EQ(new_ranges(after.maps, before.maps).size(), 0u)
      << "the process lost mappings:" << maps_diff(before.maps, after.maps);
  const auto left = unexplained(pid, new_ranges(before.maps, after.maps));
  std::string left_lines;
  for (const auto& r : left)
    left_lines += "\n  " + std::to_string(r.end - r.start) + " bytes " + r.perms + first_words(pid, r);
  EXPECT_TRUE(left.empty()) << "left in the process:" << left_lines << "\nmaps lines before "
                            << before.maps.size() << ", after " << after.maps.size() << ":"
                            << maps_diff(before.maps, after.maps);
  // The target's own count of its lines agrees with ours.
  EXPECT_EQ(rep.maps_delta(),
            static_cast<long long>(after.maps.size()) - static_cast<long long>(before.maps.size()))
      << rep.raw;
  std::fflush(stdout);
}

attach::DetachOptions unload_options() {
  attach::DetachOptions d;
  d.unload = true;
  return d;
}

// Attach, detach with unload, compare; returns the report of the unload.
attach::UnloadReport cycle(TargetProcess& target, Controller& c, const AttachOptions& opts,
                           const Counts& before) {
  const pid_t pid = target.pid();
  auto r = c.attach(pid, opts);
  EXPECT_TRUE(r.ok()) << describe(r.error());
  if (!r.ok()) return {};
  EXPECT_TRUE(agent_mapped(pid));
  auto u = c.detach(pid, unload_options());
  EXPECT_TRUE(u.ok()) << describe(u.error());
  if (!u.ok()) return {};
  expect_back(target, before, *u);
  return *u;
}

// The hook tool: every hook runs, in order, and the process is back to its
// descriptors and mappings; twice, each time with a fresh agent.
TEST_F(AttachUnload, HookToolLeavesNothingAndReattachLoadsAFreshAgent) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  const Counts before = count(pid);
  Controller c;
  auto rep = cycle(target, c, options_for(log_), before);
  EXPECT_EQ(rep.kept_tools, V{});
  const Counts first = count(pid);  // as the first unload left it
  EXPECT_EQ(whats(log_.lines()), (V{"a:configure", "a:configure_attach", "a:tool_init", "a:tool_attach",
                                    "a:tool_detach", "a:tool_fini"}))
      << log_.dump();
  EXPECT_EQ(status_or_throw(pid).agent_loaded, false);

  // Re-attach: a fresh agent (its first session), the tool's hooks again.
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  EXPECT_TRUE(r->agent_loaded_now);
  auto st = status_or_throw(pid);
  EXPECT_TRUE(st.attached);
  EXPECT_EQ(st.sessions, 1u);
  auto u = c.detach(pid, unload_options());
  ASSERT_TRUE(u.ok()) << describe(u.error());
  expect_back(target, before, *u);
  // A second cycle adds nothing to what the first left: the arena, if the
  // first made one, was free and reused.
  EXPECT_EQ(count(pid).maps, first.maps) << maps_diff(first.maps, count(pid).maps);
  EXPECT_EQ(log_.find("a:tool_fini").size(), 2u) << log_.dump();
}

// Unload after a plain detach (the tools detached, agent and tools loaded):
// `remora detach` then `remora detach --unload`. And an unload with nothing
// loaded at all says so.
TEST_F(AttachUnload, AfterAPlainDetachAndWithNoAgent) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  const Counts before = count(pid);
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  ASSERT_TRUE(c.detach(pid).ok());
  EXPECT_TRUE(agent_mapped(pid));
  Controller other;  // whoever detached, any controller unloads
  auto u = other.detach(pid, unload_options());
  ASSERT_TRUE(u.ok()) << describe(u.error());
  expect_back(target, before, *u);
  EXPECT_EQ(log_.find("a:tool_detach").size(), 1u) << log_.dump();
  EXPECT_EQ(log_.find("a:tool_fini").size(), 1u) << log_.dump();

  auto again = other.detach(pid, unload_options());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), Errc::kNotAttached) << describe(again.error());
}

// A leased attach: the lease watcher is joined and its descriptors (the pipe's
// read end, the eventfd) closed by the unload.
TEST_F(AttachUnload, LeasedAttachWithTwoTools) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  const Counts before = count(pid);
  Controller c;
  auto opts = options_for(log_, {kToolA, kToolB});
  opts.lease = true;
  auto rep = cycle(target, c, opts, before);
  EXPECT_EQ(rep.kept_tools, V{});
  EXPECT_EQ(log_.find("a:tool_fini").size(), 1u) << log_.dump();
  EXPECT_EQ(log_.find("b:tool_fini").size(), 1u) << log_.dump();
}

// A stopped process (SIGSTOP) cannot run its listener to its end, nor the
// thread that dlcloses the agent: Remora drives each one alone, and the
// process stays stopped with the threads it had. After SIGCONT it reports
// nothing wrong.
TEST_F(AttachUnload, StoppedProcess) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  const Counts before = count(pid);
  auto all_stopped = [&] {
    auto st = task_states(pid);
    if (st.empty()) return false;
    for (const auto& [tid, s] : st)
      if (s != 'T') return false;
    return true;
  };
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(wait_for(all_stopped, after(5s))) << describe_tasks(pid);
  const auto threads_before = task_states(pid);
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  auto u = c.detach(pid, unload_options());
  EXPECT_TRUE(wait_for(all_stopped, after(2s))) << "no longer stopped after the unload:\n"
                                                << describe_tasks(pid);
  EXPECT_EQ(status_state(pid).substr(0, 1), "T") << status_state(pid);
  ::kill(pid, SIGCONT);  // whatever happened: the report below needs it running
  ASSERT_TRUE(u.ok()) << describe(u.error());
  EXPECT_TRUE(u->unloaded);
  EXPECT_FALSE(agent_mapped(pid));
  std::map<pid_t, char> threads_after = task_states(pid);
  EXPECT_EQ(threads_after.size(), threads_before.size()) << describe_tasks(pid);
  expect_back(target, before, *u);
  EXPECT_EQ(log_.find("a:tool_fini").size(), 1u) << log_.dump();
}

// An unload interrupted after its first step (the controller died once the
// listener had unloaded the tools and left): the agent says `unloading`; an
// attach is refused and says how to finish it, and the next unload does.
// A controller killed after the first step of the unload (remora_agent_unload:
// the tools finalised, the listener waiting for the second), or after the
// second (remora_agent_unload_forks: the fork handlers out, the listener
// gone): the next unload finishes it.
TEST_F(AttachUnload, InterruptedUnloadIsFinishedByTheNext) {
  for (const bool after_forks : {false, true}) {
    SCOPED_TRACE(after_forks ? "killed after remora_agent_unload_forks" : "killed after remora_agent_unload");
    interrupted_unload_is_finished(after_forks);
    if (HasFatalFailure()) return;
  }
}

void AttachUnload::interrupted_unload_is_finished(bool after_forks) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  const Counts before = count(pid);
  Controller c;
  auto r = c.attach(pid, options_for(log_));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  const pid_t listener = status_or_throw(pid).listener_tid;
  {
    // The steps alone, as a controller killed right after them leaves them.
    // (This target never forks: the second step needs no stopped threads.)
    auto t = open_target(pid);
    remote::CallOptions on_listener;
    on_listener.tid = listener;
    auto u = t->call_symbol("libremora-agent.so", "remora_agent_unload", {}, on_listener);
    ASSERT_TRUE(u.ok()) << describe(u.error());
    EXPECT_EQ(u->value, 0u);
    if (after_forks) {
      auto f = t->call_symbol("libremora-agent.so", "remora_agent_unload_forks", {}, on_listener);
      ASSERT_TRUE(f.ok()) << describe(f.error());
      EXPECT_EQ(f->value, 0u);
    }
    (void)t->close();
  }
  if (after_forks) {
    ASSERT_TRUE(wait_for([&] { return task_states(pid).count(listener) == 0; }, after(5s)))
        << describe_tasks(pid);
  } else {
    EXPECT_EQ(task_states(pid).count(listener), 1u) << "the listener waits for the second step";
  }
  const auto finis = log_.find("a:tool_fini");
  EXPECT_EQ(std::count_if(finis.begin(), finis.end(), [&](const HookLine& h) { return h.pid == pid; }), 1)
      << log_.dump();
  Controller other;
  auto again = other.attach(pid, options_for(log_));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), Errc::kAlreadyAttached) << describe(again.error());
  EXPECT_NE(again.error().to_string().find("remora detach --unload -p " + std::to_string(pid)),
            std::string::npos)
      << describe(again.error());
  auto u = other.detach(pid, unload_options());
  ASSERT_TRUE(u.ok()) << describe(u.error());
  expect_back(target, before, *u);
  auto fresh = other.attach(pid, options_for(log_));
  ASSERT_TRUE(fresh.ok()) << describe(fresh.error());
  EXPECT_TRUE(fresh->agent_loaded_now);
  ASSERT_TRUE(other.detach(pid, unload_options()).ok());
}

// Load-and-unload cycles (a fresh agent every time) against the hostile
// targets of tests/targets, a signal storm on one of them: dlopen and dlclose
// run on fresh threads while the target spins, mallocs from 8 threads, runs
// 64 threads, uses SIMD registers or takes signals. Each target reports no
// anomaly and its own descriptors, and after the first cycle its mappings do
// not change any more (whatever glibc's malloc kept, it reuses).
int unload_cycles() {
  if (const char* e = std::getenv("REMORA_UNLOAD_CYCLES")) return std::max(1, std::atoi(e));
  return 20;
}

void run_unload_cycles(TargetProcess& target, HookLog& log) {
  const pid_t pid = target.pid();
  const Counts before = count(pid);
  Controller c;
  std::vector<std::string> after_first;
  const auto t0 = Clock::now();
  Clock::duration slowest{};
  for (int i = 0; i < unload_cycles(); ++i) {
    const auto c0 = Clock::now();
    auto r = c.attach(pid, options_for(log));
    ASSERT_TRUE(r.ok()) << "cycle " << i << ": " << describe(r.error()) << "\n" << describe_tasks(pid);
    ASSERT_TRUE(r->agent_loaded_now) << "cycle " << i;
    auto u = c.detach(pid, unload_options());
    ASSERT_TRUE(u.ok()) << "cycle " << i << ": " << describe(u.error()) << "\n" << describe_tasks(pid);
    ASSERT_TRUE(u->unloaded) << "cycle " << i;
    if (i == 0) after_first = maps_lines(pid);
    // A cycle finished: the watchdog bounds each cycle, not the test, so a
    // slow machine (the aarch64 guest) is not taken for a hang.
    note_progress();
    slowest = std::max(slowest, Clock::now() - c0);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  std::printf("[unload] %s: %d load/attach/detach/unload cycles in %lld ms (%.2f ms per cycle, slowest %.2f ms)\n",
              target.process().name().c_str(), unload_cycles(), static_cast<long long>(ms),
              static_cast<double>(ms) / unload_cycles(),
              std::chrono::duration<double, std::milli>(slowest).count());
  auto now = maps_lines(pid);
  EXPECT_EQ(now.size(), after_first.size()) << maps_diff(after_first, now);
  EXPECT_EQ(remora_lines(now), V{}) << joined(remora_lines(now));
  EXPECT_TRUE(fds_back(pid, before.fds, after(2s)))
      << describe_fds(open_fds(pid)) << "\nbefore:" << describe_fds(before.fds);
  EXPECT_EQ(log.find("a:tool_fini").size(), static_cast<size_t>(unload_cycles())) << log.dump();
  auto rep = target.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
}

TEST_F(AttachUnload, HostileTargets) {
  for (const char* program : {"remora_target_syscalls", "remora_target_spin", "remora_target_threads64",
                              "remora_target_malloc", "remora_target_simd"}) {
    SCOPED_TRACE(program);
    HookLog log;
    TargetProcess target(program);
    target.snapshot();
    run_unload_cycles(target, log);
    if (HasFatalFailure()) return;
  }
}

TEST_F(AttachUnload, SignalStormTarget) {
  TargetProcess target("remora_target_signals");
  target.snapshot();
  long rt_sent = 0;
  {
    SignalStorm storm(target.pid());
    run_unload_cycles(target, log_);
    storm.stop();
    rt_sent = storm.rt_sent();
    EXPECT_EQ(storm.errors(), 0);
  }
  std::map<std::string, long long> got;
  EXPECT_TRUE(wait_for(
      [&] {
        got = parse_fields(target.command("signals"));
        return got["rt"] >= rt_sent;
      },
      after(10s)))
      << "real-time signals lost: sent " << rt_sent << ", received " << got["rt"];
  Report r = target.report();
  EXPECT_EQ(r.get("rt"), rt_sent) << r.raw;
  EXPECT_EQ(r.get("rt_bad"), 0) << r.raw;
}

// The default tool (libremora-tool.so): it writes its output at detach, and
// leaves; if it cannot be unloaded it is named (and the test says so).
TEST_F(AttachUnload, DefaultTool) {
  TargetProcess target("remora_attach_target");
  const pid_t pid = target.pid();
  target.snapshot();
  const Counts before = count(pid);
  char dir[] = "/tmp/remora-unload-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  Controller c;
  AttachOptions opts;
  opts.tools = {REMORA_DEFAULT_TOOL};
  opts.env = {{"REMORA_OUTPUT_PATH", std::string(dir)}};
  opts.agent_path = REMORA_AGENT_PATH;
  auto rep = cycle(target, c, opts, before);
  // Whether it can be unloaded is the tool's own business (a library with
  // STB_GNU_UNIQUE symbols, which C++ code gets from inline statics, is made
  // RTLD_NODELETE by glibc): if it stays, it is named, alone, and the agent
  // went all the same (expect_back checked).
  if (!rep.kept_tools.empty()) {
    EXPECT_EQ(rep.kept_tools, V{real(REMORA_DEFAULT_TOOL)});
    std::printf("[unload] the default tool cannot be unloaded as built (see readelf --dyn-syms: UNIQUE)\n");
  }
  std::string rm = std::string("rm -rf ") + dir;
  EXPECT_EQ(std::system(rm.c_str()), 0);
}

}  // namespace
}  // namespace remora::test
