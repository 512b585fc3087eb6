// Following a tree as it grows (Controller::follow_start/follow_poll): the
// processes a session's processes make while attached, against
// follow_target.cc (a pre-fork server, a fork-per-connection server, a
// shell pipeline) and python3's multiprocessing (follow_mp.py). What each
// child observes is asserted: the hook tool's log written from the child
// (pid=CHILD), the child's agent state, and the answers its clients got.
#include <elf.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "attach_helpers.h"

#ifndef REMORA_FOLLOW_MP_SCRIPT
#error "the follow tests need REMORA_FOLLOW_MP_SCRIPT"
#endif

namespace remora::test {
namespace {

using attach::FollowEvent;

class Follow : public IntegrationTest {
 protected:
  AttachOptions leased_options() {
    auto o = options_for(log_);
    o.lease = true;
    return o;
  }

  // Polls the tree every 20 ms (the CLI's period) until `done` holds or the
  // deadline passes; every event lands in events_.
  bool follow_until(Controller& c, pid_t root, const AttachOptions& o, const std::function<bool()>& done,
                    Deadline deadline) {
    for (;;) {
      auto r = c.follow_poll(root, o);
      if (!r.ok()) throw HarnessError("follow_poll: " + describe(r.error()));
      for (auto& e : *r) events_.push_back(e);
      if (done()) return true;
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);  // the poll period: what is awaited is `done`
    }
  }

  bool has_event(pid_t pid, FollowEvent::Kind kind) const {
    for (const auto& e : events_)
      if (e.pid == pid && e.kind == kind) return true;
    return false;
  }

  std::string describe_events() const {
    std::string s = "follow events:";
    for (const auto& e : events_) {
      const char* k = e.kind == FollowEvent::Kind::kAdopted    ? "adopted"
                      : e.kind == FollowEvent::Kind::kAttached ? "attached"
                                                               : "failed";
      s += std::string("\n  ") + k + " pid " + std::to_string(e.pid) + " parent " + std::to_string(e.parent) +
           (e.execed ? " (exec'ed)" : "") + (e.outcome.message.empty() ? "" : ": " + e.outcome.message);
    }
    return s + "\n" + log_.dump();
  }

  // The attach of the root, following from before it (as remora attach does).
  void start(Controller& c, pid_t root, const AttachOptions& o) {
    auto f = c.follow_start(root);
    ASSERT_TRUE(f.ok()) << describe(f.error());
    auto r = c.attach_tree(root, o);
    ASSERT_TRUE(r.ok()) << describe(r.error());
    // attach_tree stays a snapshot: the tree had the root alone.
    ASSERT_EQ(r->size(), 1u);
    ASSERT_TRUE(r->front().ok) << describe_outcome(r->front());
  }

  // Detaches every session; the processes in `alive_pids` must all be
  // detached by it (the others may have exited meanwhile).
  void detach_all(Controller& c, const std::set<pid_t>& alive_pids) {
    auto out = c.detach_sessions(attach::DetachOptions{});
    std::set<pid_t> detached;
    for (const auto& o : out) {
      if (alive_pids.count(o.pid)) {
        EXPECT_TRUE(o.ok) << describe_outcome(o);
        detached.insert(o.pid);
      }
    }
    EXPECT_EQ(detached, alive_pids) << describe_events();
    EXPECT_TRUE(c.sessions().empty());
  }

  // After the session: detached by the controller (not by the lease), the
  // child's own tool_detach in the log, nothing left attached.
  void expect_detached(pid_t pid) {
    SCOPED_TRACE("process " + std::to_string(pid));
    EXPECT_TRUE(log_.wait_count("a:tool_detach", 1, pid, after(5s))) << log_.dump();
    EXPECT_EQ(log_.find("a:tool_detach", pid).size(), 1u) << log_.dump();
    auto st = status_or_throw(pid);
    EXPECT_FALSE(st.attached);
    EXPECT_FALSE(st.lease_expired) << "detached by the lease, not by the controller";
    EXPECT_EQ(st.lease_pid, 0);
  }

  // Attached during the session under this controller's lease.
  void expect_in_session(pid_t pid) {
    SCOPED_TRACE("process " + std::to_string(pid));
    auto st = status_or_throw(pid);
    EXPECT_TRUE(st.attached);
    EXPECT_EQ(st.lease_pid, ::getpid());
    EXPECT_FALSE(st.lease_expired);
  }

  HookLog log_;
  std::vector<FollowEvent> events_;
};

std::vector<pid_t> pids_after(const std::string& reply, const std::string& word) {
  std::istringstream in(reply);
  std::string w;
  in >> w;
  if (w != word) throw HarnessError("expected \"" + word + " ...\", got \"" + reply + "\"");
  std::vector<pid_t> out;
  long p;
  while (in >> p) out.push_back(static_cast<pid_t>(p));
  return out;
}

bool contains(const std::vector<pid_t>& v, pid_t p) { return std::find(v.begin(), v.end(), p) != v.end(); }

// A pre-fork server: the parent forks its workers after the attach; each
// keeps the session (its tools run in it), is adopted, keeps serving, and
// is detached with the session by the controller.
TEST_F(Follow, PreForkServer) {
  TargetProcess root("remora_follow_target");
  root.snapshot();
  const auto opts = leased_options();
  Controller c;
  start(c, root.pid(), opts);
  auto workers = pids_after(root.command("prefork 3"), "workers");
  ASSERT_EQ(workers.size(), 3u);
  auto t0 = Clock::now();
  ASSERT_TRUE(follow_until(
      c, root.pid(), opts,
      [&] {
        return std::all_of(workers.begin(), workers.end(),
                           [&](pid_t w) { return has_event(w, FollowEvent::Kind::kAdopted); });
      },
      after(10s)))
      << describe_events();
  printf("  3 workers adopted %lld ms after the fork\n",
         static_cast<long long>(
             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()));
  // What a walk costs when nothing is new (the CLI walks every 25 ms).
  const auto m0 = Clock::now();
  for (int i = 0; i < 100; ++i) {
    auto r = c.follow_poll(root.pid(), opts);
    ASSERT_TRUE(r.ok()) << describe(r.error());
    EXPECT_TRUE(r->empty()) << describe_events();
  }
  printf("  a walk of the tree of 4 processes: %lld us\n",
         static_cast<long long>(
             std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - m0).count() / 100));
  for (size_t i = 0; i < workers.size(); ++i) {
    const pid_t w = workers[i];
    expect_in_session(w);
    EXPECT_EQ(status_or_throw(w).forked_from, root.pid());
    EXPECT_TRUE(contains(c.sessions(), w));
    EXPECT_EQ(root.command("ask " + std::to_string(i)), "served " + std::to_string(w));
    // Its tools were attached in the parent: the child calls none again.
    EXPECT_EQ(log_.find("a:tool_attach", w).size(), 0u) << log_.dump();
  }
  detach_all(c, {root.pid(), workers[0], workers[1], workers[2]});
  expect_detached(root.pid());
  for (pid_t w : workers) expect_detached(w);
  for (size_t i = 0; i < workers.size(); ++i)
    EXPECT_EQ(root.command("ask " + std::to_string(i)), "served " + std::to_string(workers[i]));
  EXPECT_EQ(root.command("stop-workers"), "ok");
  Report rep = root.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
}

// A child per connection, exiting after it: each is adopted while it
// serves; one that exits attached is detached by its exit (the agent's
// exit hook); one still open at the end is detached with the session.
TEST_F(Follow, ForkPerConnectionServer) {
  TargetProcess root("remora_follow_target");
  const auto opts = leased_options();
  Controller c;
  start(c, root.pid(), opts);
  for (int i = 0; i < 4; ++i) {
    const pid_t child = pids_after(root.command("conn"), "conn").at(0);
    ASSERT_TRUE(follow_until(
        c, root.pid(), opts, [&] { return has_event(child, FollowEvent::Kind::kAdopted); }, after(10s)))
        << describe_events();
    expect_in_session(child);
    EXPECT_EQ(root.command("conn-ask " + std::to_string(child)), "served " + std::to_string(child));
    EXPECT_EQ(root.command("conn-close " + std::to_string(child)), "closed 0");
    EXPECT_TRUE(log_.wait_count("a:tool_detach", 1, child, after(5s)))
        << "the child exited attached and its tools were not detached at its exit\n"
        << log_.dump();
  }
  const pid_t open_child = pids_after(root.command("conn"), "conn").at(0);
  ASSERT_TRUE(follow_until(
      c, root.pid(), opts, [&] { return has_event(open_child, FollowEvent::Kind::kAdopted); }, after(10s)))
      << describe_events();
  detach_all(c, {root.pid(), open_child});
  expect_detached(root.pid());
  expect_detached(open_child);
  EXPECT_EQ(root.command("conn-ask " + std::to_string(open_child)), "served " + std::to_string(open_child));
  EXPECT_EQ(root.command("conn-close " + std::to_string(open_child)), "closed 0");
  for (const auto& e : events_) EXPECT_NE(e.kind, FollowEvent::Kind::kFailed) << describe_events();
}

// Whether the program at `path` is dynamically linked (has a PT_INTERP):
// Remora attaches to those only (a static one is refused, as documented).
bool dynamically_linked(const char* path) {
  std::ifstream f(path, std::ios::binary);
  Elf64_Ehdr eh{};
  if (!f.read(reinterpret_cast<char*>(&eh), sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    return false;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    f.seekg(static_cast<std::streamoff>(eh.e_phoff + i * sizeof ph));
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof ph)) return false;
    if (ph.p_type == PT_INTERP) return true;
  }
  return false;
}

// sh -c 'stage | stage': fork then exec of sh, which forks and execs both
// stages. The exec'ed programs have no agent: each is attached as new once
// its loader is done, and detached with the session.
TEST_F(Follow, ShellPipeline) {
  if (::access("/bin/sh", X_OK) != 0) GTEST_SKIP() << "skipped: /bin/sh is missing";
  // The aarch64 guest's shell is a static busybox.
  if (!dynamically_linked("/bin/sh"))
    GTEST_SKIP() << "skipped: /bin/sh is statically linked, and Remora attaches to dynamically linked "
                    "programs only";
  TargetProcess root("remora_follow_target");
  const auto opts = leased_options();
  Controller c;
  start(c, root.pid(), opts);
  auto pids = pids_after(root.command("pipeline"), "pipeline");
  ASSERT_EQ(pids.size(), 3u);
  const pid_t sh = pids[0], s1 = pids[1], s2 = pids[2];
  auto attached = [&](pid_t p) { return has_event(p, FollowEvent::Kind::kAttached); };
  ASSERT_TRUE(follow_until(
      c, root.pid(), opts, [&] { return attached(s1) && attached(s2) && attached(sh); }, after(15s)))
      << describe_events();
  printf("  %s\n", describe_events().substr(0, describe_events().find("\nhook log")).c_str());
  for (pid_t p : {sh, s1, s2}) {
    expect_in_session(p);
    EXPECT_EQ(log_.find("a:tool_attach", p).size(), 1u) << "process " << p << "\n" << log_.dump();
  }
  detach_all(c, {root.pid(), sh, s1, s2});
  for (pid_t p : {root.pid(), sh, s1, s2}) expect_detached(p);
  EXPECT_EQ(root.command("pipeline-end"), "ended 0");
  for (const auto& e : events_) EXPECT_TRUE(e.kind != FollowEvent::Kind::kFailed) << describe_events();
}

// A forked child that execs after it was adopted: its agent went with the
// old program; it is attached again, as the new program, once that one has
// started, and detached with the session.
TEST_F(Follow, AdoptedChildThatExecsIsAttachedAgain) {
  TargetProcess root("remora_follow_target");
  const auto opts = leased_options();
  Controller c;
  start(c, root.pid(), opts);
  const pid_t child = pids_after(root.command("idle"), "idle").at(0);
  ASSERT_TRUE(follow_until(
      c, root.pid(), opts, [&] { return has_event(child, FollowEvent::Kind::kAdopted); }, after(10s)))
      << describe_events();
  EXPECT_EQ(root.command("exec " + std::to_string(child)), "execed " + std::to_string(child));
  auto reattached = [&] {
    for (const auto& e : events_)
      if (e.pid == child && e.kind == FollowEvent::Kind::kAttached && e.execed) return true;
    return false;
  };
  ASSERT_TRUE(follow_until(c, root.pid(), opts, reattached, after(10s))) << describe_events();
  expect_in_session(child);
  EXPECT_EQ(status_or_throw(child).forked_from, 0) << "a fresh agent, in the new program";
  EXPECT_EQ(log_.find("a:tool_attach", child).size(), 1u) << log_.dump();
  detach_all(c, {root.pid(), child});
  expect_detached(child);
  EXPECT_EQ(root.command("exec-end " + std::to_string(child)), "ended 0");
}

// python3's multiprocessing with the fork start method: the workers are
// forks of an attached interpreter, adopted, and serve on.
TEST_F(Follow, PythonMultiprocessingFork) {
  const char* python = "/usr/bin/python3";
  if (::access(python, X_OK) != 0) GTEST_SKIP() << "skipped: " << python << " is not installed";
  auto py = Spawned::start({python, REMORA_FOLLOW_MP_SCRIPT});
  ASSERT_EQ(py->wait_line(after(20s), "ready"), "ready " + std::to_string(py->pid()));
  const auto opts = leased_options();
  Controller c;
  start(c, py->pid(), opts);
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    py->send("fork");
    workers.push_back(pids_after(py->wait_line(after(20s), "forked"), "forked").at(0));
  }
  ASSERT_TRUE(follow_until(
      c, py->pid(), opts,
      [&] {
        return has_event(workers[0], FollowEvent::Kind::kAdopted) &&
               has_event(workers[1], FollowEvent::Kind::kAdopted);
      },
      after(10s)))
      << describe_events();
  for (size_t i = 0; i < workers.size(); ++i) {
    expect_in_session(workers[i]);
    py->send("ask " + std::to_string(i));
    EXPECT_EQ(py->wait_line(after(20s)), "served " + std::to_string(workers[i]));
  }
  detach_all(c, {py->pid(), workers[0], workers[1]});
  for (pid_t p : {py->pid(), workers[0], workers[1]}) expect_detached(p);
  py->send("ask 1");
  EXPECT_EQ(py->wait_line(after(20s)), "served " + std::to_string(workers[1]));
  py->send("quit");
  EXPECT_EQ(py->wait_line(after(20s)), "bye");
}

// A controller SIGKILLed during the session: the lease detaches the whole
// tree within a second, the children included (adopted or not yet: each
// watches its inherited copy of the lease pipe).
TEST_F(Follow, ControllerKilledLeavesNoneAttached) {
  TargetProcess root("remora_follow_target");
  const pid_t rp = root.pid();
  const auto opts = leased_options();
  ForkedHelper helper([rp, &opts](int fd) {
    Controller c;
    if (!c.follow_start(rp).ok()) return 1;
    auto r = c.attach_tree(rp, opts);
    ForkedHelper::say(fd, r.ok() && r->front().ok ? "attached" : "error attach");
    for (;;) {  // until the test kills us
      auto ev = c.follow_poll(rp, opts);
      if (!ev.ok()) ForkedHelper::say(fd, "error " + describe(ev.error()));
      if (ev.ok())
        for (const auto& e : *ev)
          ForkedHelper::say(fd, (e.kind == FollowEvent::Kind::kAdopted ? "adopted " : "other ") +
                                    std::to_string(e.pid) + " " + e.outcome.message);
      ::usleep(20000);
    }
  });
  ASSERT_EQ(helper.wait_line(after(15s)), "attached");
  auto workers = pids_after(root.command("prefork 2"), "workers");
  ASSERT_EQ(workers.size(), 2u);
  std::set<pid_t> adopted;
  while (adopted.size() < 2) {
    std::string line;
    try {
      line = helper.wait_line(after(10s));
    } catch (const HarnessError&) {
      FAIL() << "the controller adopted " << adopted.size() << " of 2 workers in 10 s; its threads:\n"
             << describe_tasks(helper.pid()) << "the workers:\n"
             << describe_tasks(workers[0]) << describe_tasks(workers[1]);
    }
    if (line.rfind("adopted ", 0) != 0) FAIL() << "the controller said: " << line;
    adopted.insert(static_cast<pid_t>(std::stol(line.substr(8))));
  }
  EXPECT_EQ(adopted, std::set<pid_t>(workers.begin(), workers.end()));
  // One more, not awaited: it may or may not have been adopted yet.
  workers.push_back(pids_after(root.command("prefork 1"), "workers").at(0));
  std::vector<pid_t> all = workers;
  all.push_back(rp);
  for (pid_t p : all) {
    auto st = status_or_throw(p);
    EXPECT_TRUE(st.attached) << "process " << p;
    EXPECT_EQ(st.lease_pid, helper.pid()) << "process " << p;
  }
  ASSERT_EQ(::kill(helper.pid(), SIGKILL), 0);
  const auto killed = Clock::now();
  ASSERT_TRUE(helper.wait_exit(after(10s)).has_value());
  bool none = wait_for(
      [&] {
        return std::none_of(all.begin(), all.end(), [](pid_t p) { return status_or_throw(p).attached; });
      },
      killed + 1s);
  printf("  every process detached %lld ms after the controller's SIGKILL\n",
         static_cast<long long>(
             std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count()));
  EXPECT_TRUE(none) << "a process stayed attached 1 s after its controller died\n" << log_.dump();
  for (pid_t p : all) {
    SCOPED_TRACE("process " + std::to_string(p));
    EXPECT_TRUE(status_or_throw(p).lease_expired);
    EXPECT_TRUE(log_.wait_count("a:tool_detach", 1, p, after(5s))) << log_.dump();
  }
  for (size_t i = 0; i < workers.size(); ++i)
    EXPECT_EQ(root.command("ask " + std::to_string(i)), "served " + std::to_string(workers[i]));
  EXPECT_EQ(root.command("stop-workers"), "ok");
}

// A child forked from a process attached without a lease (its agent has no
// lease to inherit, as in a child of an agent older than protocol 4): the
// controller arms a lease of its own in it when it adopts it.
TEST_F(Follow, UnleasedChildGetsALeaseOfItsOwn) {
  TargetProcess root("remora_follow_target");
  auto unleased = options_for(log_);
  Controller c;
  start(c, root.pid(), unleased);
  EXPECT_EQ(status_or_throw(root.pid()).lease_pid, 0);
  const pid_t w = pids_after(root.command("prefork 1"), "workers").at(0);
  const auto leased = leased_options();
  ASSERT_TRUE(follow_until(
      c, root.pid(), leased, [&] { return has_event(w, FollowEvent::Kind::kAdopted); }, after(10s)))
      << describe_events();
  expect_in_session(w);  // under this controller's lease now
  EXPECT_EQ(status_or_throw(w).forked_from, root.pid());
  detach_all(c, {root.pid(), w});
  expect_detached(w);
  EXPECT_EQ(root.command("ask 0"), "served " + std::to_string(w));
  EXPECT_EQ(root.command("stop-workers"), "ok");
}

// The default tool in a forked child records for itself and writes its
// own output set, under the child's pid, when the session detaches it.
TEST_F(Follow, DefaultToolWritesTheChildsOwnOutput) {
  char dir[] = "/tmp/remora-follow-out-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  TargetProcess root("remora_follow_target");
  AttachOptions opts;
  opts.tools = {REMORA_DEFAULT_TOOL};
  opts.env = {{"REMORA_OUTPUT_PATH", dir}};
  opts.agent_path = REMORA_AGENT_PATH;
  opts.lease = true;
  Controller c;
  start(c, root.pid(), opts);
  const pid_t w = pids_after(root.command("prefork 1"), "workers").at(0);
  ASSERT_TRUE(follow_until(
      c, root.pid(), opts, [&] { return has_event(w, FollowEvent::Kind::kAdopted); }, after(10s)))
      << describe_events();
  EXPECT_EQ(root.command("ask 0 300"), "served " + std::to_string(w));  // 300 ms of CPU in the child
  auto out = c.detach_sessions(attach::DetachOptions{});
  for (const auto& o : out) EXPECT_TRUE(o.ok) << describe_outcome(o);
  auto dir_of = [&](pid_t p) -> std::string {
    const std::string tag = "-" + std::to_string(p) + "-s";
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().find(tag) != std::string::npos) return e.path();
    return "";
  };
  std::string child_dir, parent_dir;
  ASSERT_TRUE(wait_for([&] { return !(child_dir = dir_of(w)).empty(); }, after(5s)))
      << "no output directory of the child " << w << " under " << dir;
  parent_dir = dir_of(root.pid());
  EXPECT_FALSE(parent_dir.empty()) << "no output directory of the parent";
  EXPECT_NE(child_dir, parent_dir);
  if (std::filesystem::exists(child_dir + "/profile.remora")) {
    EXPECT_GT(std::filesystem::file_size(child_dir + "/profile.remora"), 0u);
  } else {
    printf("  (no profile.remora in %s yet: the tool writes other files; checked the directory only)\n",
           child_dir.c_str());
    EXPECT_FALSE(std::filesystem::is_empty(child_dir));
  }
  EXPECT_FALSE(status_or_throw(w).attached);
  EXPECT_EQ(root.command("stop-workers"), "ok");
}

}  // namespace
}  // namespace remora::test
