// attach_tree / detach_tree over a tree of ten processes (see
// attach_target.cc, tree mode): plain forks, fork+exec of this suite's target
// and of two hostile targets, a multithreaded process, and one process (X)
// that exits in the middle of its own attach, as soon as the agent is mapped.
#include <set>
#include <sstream>

#include "attach_helpers.h"

namespace remora::test {
namespace {

class Tree : public IntegrationTest {
 protected:
  HookLog log_;
};

std::map<std::string, pid_t> tree_pids(TargetProcess& root) {
  std::string reply = root.command("pids");
  std::istringstream in(reply);
  std::string tok;
  in >> tok;
  if (tok != "pids") throw HarnessError("pids: " + reply);
  std::map<std::string, pid_t> out;
  while (in >> tok) {
    auto c = tok.find(':');
    out[tok.substr(0, c)] = static_cast<pid_t>(std::stol(tok.substr(c + 1)));
  }
  return out;
}

TEST_F(Tree, AttachAndDetachTenProcesses) {
  TargetProcess root("remora_attach_target", {"tree"});
  root.snapshot();
  auto roles = tree_pids(root);
  ASSERT_EQ(roles.size(), 10u) << root.command("pids");
  const pid_t x = roles.at("X");
  std::set<pid_t> live;
  for (const auto& [role, pid] : roles)
    if (role != "X") live.insert(pid);

  // The engine's view of the tree before we start.
  auto snap = Controller::snapshot_tree(root.pid());
  ASSERT_TRUE(snap.ok()) << describe(snap.error());
  EXPECT_EQ(snap->size(), 10u);
  EXPECT_EQ(snap->front(), root.pid());

  Controller c;
  auto t0 = Clock::now();
  auto r = c.attach_tree(root.pid(), options_for(log_));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  printf("  attach_tree of 10 processes: %lld ms\n", static_cast<long long>(ms));
  ASSERT_TRUE(r.ok()) << describe(r.error());
  ASSERT_EQ(r->size(), 10u);
  std::set<pid_t> ok_pids;
  for (const auto& o : *r) {
    SCOPED_TRACE(describe_outcome(o));
    if (o.pid == x) {
      EXPECT_FALSE(o.ok) << "X exited during its attach, yet the attach succeeded";
      EXPECT_FALSE(o.message.empty());
      EXPECT_NE(o.code, Errc::kOk);
      // Which code it gets is AttachErrors.TargetExitingDuringAttach's business.
      printf("  X (%d): %s\n", x, describe_outcome(o).c_str());
    } else {
      EXPECT_TRUE(o.ok);
      EXPECT_TRUE(o.agent_loaded_now);
      EXPECT_TRUE(live.count(o.pid)) << "an outcome for a process not in the tree";
      if (o.ok) ok_pids.insert(o.pid);
    }
  }
  EXPECT_EQ(ok_pids, live);
  EXPECT_TRUE(wait_for([&] { return !alive(x); }, after(5s))) << "X did not exit";

  for (pid_t p : live) {
    auto att = log_.find("a:tool_attach", p);
    EXPECT_EQ(att.size(), 1u) << "process " << p << "\n" << log_.dump();
    auto st = status_or_throw(p);
    EXPECT_TRUE(st.attached) << "process " << p;
  }
  EXPECT_EQ(log_.find("a:tool_attach").size(), live.size()) << log_.dump();

  auto d = c.detach_tree(root.pid());
  ASSERT_TRUE(d.ok()) << describe(d.error());
  EXPECT_EQ(d->size(), live.size());
  for (const auto& o : *d) {
    EXPECT_TRUE(o.ok) << describe_outcome(o);
    EXPECT_TRUE(live.count(o.pid)) << describe_outcome(o);
  }
  for (pid_t p : live) {
    EXPECT_EQ(log_.find("a:tool_detach", p).size(), 1u) << "process " << p << "\n" << log_.dump();
    EXPECT_FALSE(status_or_throw(p).attached) << "process " << p;
    EXPECT_TRUE(alive(p)) << "process " << p << " died";
  }
  Report rep = root.report();
  EXPECT_EQ(rep.anomalies(), 0) << rep.raw;
  EXPECT_EQ(rep.fds_delta(), 0) << rep.raw;
}

}  // namespace
}  // namespace remora::test
