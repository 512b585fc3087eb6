// The C API of libremora.so (include/remora/remora.h), linked directly.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "capi_test_util.h"
#include "remora/remora.h"

namespace {

using capi_test::count_hook;
using capi_test::dump;
using capi_test::TargetTree;

class RemoraCapiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The built agent, unless the caller chose one (e.g. an uninstrumented
    // agent for a sanitizer build of these tests).
    ::setenv("REMORA_AGENT_PATH", REMORA_AGENT_PATH_BUILT, 0);
    ASSERT_FALSE(dir_.path().empty());
    log_ = dir_.path() + "/hook.log";
    env_var_ = "REMORA_HOOK_LOG=" + log_;
    env_[0] = env_var_.c_str();
    ASSERT_EQ(remora_options_init(&opts_), REMORA_STATUS_SUCCESS);
    opts_.tools = REMORA_HOOK_TOOL_A;
    opts_.env = env_;
    opts_.env_count = 1;
  }

  static remora_agent_state_t status_of(pid_t pid) {
    remora_agent_state_t st;
    std::memset(&st, 0, sizeof st);
    st.size = sizeof st;
    EXPECT_EQ(remora_status(pid, &st), REMORA_STATUS_SUCCESS) << remora_last_error();
    return st;
  }

  capi_test::TempDir dir_;
  std::string log_, env_var_;
  const char* env_[1] = {nullptr};
  remora_options_t opts_;
};

TEST_F(RemoraCapiTest, OptionsInitSetsDefaults) {
  remora_options_t o;
  std::memset(&o, 0xab, sizeof o);
  ASSERT_EQ(remora_options_init(&o), REMORA_STATUS_SUCCESS);
  EXPECT_EQ(o.size, sizeof o);
  EXPECT_EQ(o.timeout_msec, 10000u);
  EXPECT_EQ(o.tools, nullptr);
  EXPECT_EQ(o.env, nullptr);
  EXPECT_EQ(o.env_count, 0u);
  EXPECT_FALSE(o.attach_children);
  EXPECT_FALSE(o.lease);
  EXPECT_EQ(o.agent_path, nullptr);
  EXPECT_EQ(remora_options_init(nullptr), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(remora_options_init_sized(&o, 8), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remora_last_error()).find("size"), std::string::npos) << remora_last_error();
}

TEST_F(RemoraCapiTest, AttachStatusDetachOneProcess) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  pid_t pid = t.root();

  remora_agent_state_t before = status_of(pid);
  EXPECT_FALSE(before.agent_loaded);
  EXPECT_FALSE(before.attached);

  ASSERT_EQ(remora_attach(pid, &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();
  for (const char* hook : {"configure", "configure_attach", "tool_init", "tool_attach"})
    EXPECT_EQ(count_hook(log_, hook, pid), 1) << hook << "\n" << dump(log_);

  remora_agent_state_t st = status_of(pid);
  EXPECT_EQ(st.size, sizeof st);
  EXPECT_TRUE(st.agent_loaded);
  EXPECT_TRUE(st.attached);
  EXPECT_EQ(st.sessions, 1u);
  EXPECT_EQ(st.detaches, 0u);
  EXPECT_NE(st.listener_tid, 0);
  EXPECT_EQ(st.lease_pid, 0);  // no lease asked
  EXPECT_NE(std::string(st.tools).find("libremora-hook-tool-a.so"), std::string::npos) << st.tools;

  EXPECT_EQ(remora_attach(pid, &opts_), REMORA_STATUS_ALREADY_ATTACHED);

  ASSERT_EQ(remora_detach(pid), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_EQ(count_hook(log_, "tool_detach", pid), 1) << dump(log_);
  st = status_of(pid);
  EXPECT_TRUE(st.agent_loaded);  // the agent stays
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.detaches, 1u);

  // A failure: nothing is attached any more.
  EXPECT_EQ(remora_detach(pid), REMORA_STATUS_NOT_ATTACHED);
  std::string err = remora_last_error();
  EXPECT_NE(err.find(std::to_string(pid)), std::string::npos) << err;

  // A success leaves the message of the last failure alone.
  EXPECT_EQ(remora_status_name(REMORA_STATUS_SUCCESS), std::string("REMORA_STATUS_SUCCESS"));
  ASSERT_EQ(remora_attach(pid, &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_EQ(err, remora_last_error());
  EXPECT_EQ(remora_detach(0), REMORA_STATUS_SUCCESS) << remora_last_error();  // all
  EXPECT_EQ(count_hook(log_, "tool_detach", pid), 2) << dump(log_);
  EXPECT_EQ(t.finish(), 0);
}

TEST_F(RemoraCapiTest, LeaseIsArmedWhenAsked) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  opts_.lease = true;
  ASSERT_EQ(remora_attach(t.root(), &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_EQ(status_of(t.root()).lease_pid, ::getpid());
  EXPECT_EQ(remora_detach(t.root()), REMORA_STATUS_SUCCESS) << remora_last_error();
}

TEST_F(RemoraCapiTest, AttachChildrenAttachesTheTree) {
  TargetTree tree(2);
  ASSERT_TRUE(tree.wait_ready());
  opts_.attach_children = true;
  ASSERT_EQ(remora_attach(tree.root(), &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();
  for (pid_t p : tree.pids()) EXPECT_EQ(count_hook(log_, "tool_attach", p), 1) << p << "\n" << dump(log_);
  ASSERT_EQ(remora_detach_tree(tree.root()), REMORA_STATUS_SUCCESS) << remora_last_error();
  for (pid_t p : tree.pids()) EXPECT_EQ(count_hook(log_, "tool_detach", p), 1) << p << "\n" << dump(log_);
  EXPECT_EQ(tree.finish(), 0);
}

TEST_F(RemoraCapiTest, TreeReportsEachFailedProcessAndTheLastError) {
  TargetTree tree(2, {}, /*refuse_last=*/true);
  ASSERT_TRUE(tree.wait_ready());
  ASSERT_EQ(tree.pids().size(), 3u);
  pid_t refusing = 0;  // the child that re-executed itself with REMORA_TOOL_ATTACH=0
  for (pid_t p : tree.pids()) {
    std::string env = capi_test::read_file("/proc/" + std::to_string(p) + "/environ");
    if (env.find(std::string("\0REMORA_TOOL_ATTACH=0\0", 22)) != std::string::npos) refusing = p;
  }
  ASSERT_NE(refusing, 0);

  EXPECT_EQ(remora_attach_tree(tree.root(), &opts_), REMORA_STATUS_REFUSED);
  std::string err = remora_last_error();
  EXPECT_NE(err.find("1 of 3 processes failed"), std::string::npos) << err;
  EXPECT_NE(err.find("pid " + std::to_string(refusing) + ":"), std::string::npos) << err;
  EXPECT_NE(err.find("REMORA_TOOL_ATTACH=0"), std::string::npos) << err;
  for (pid_t p : tree.pids())
    EXPECT_EQ(count_hook(log_, "tool_attach", p), p == refusing ? 0 : 1) << p << "\n" << dump(log_);

  // The processes that attached are detached by detach_tree.
  EXPECT_EQ(remora_detach_tree(tree.root()), REMORA_STATUS_SUCCESS) << remora_last_error();
  for (pid_t p : tree.pids())
    EXPECT_EQ(count_hook(log_, "tool_detach", p), p == refusing ? 0 : 1) << p << "\n" << dump(log_);
  EXPECT_EQ(tree.finish(), 0);
}

TEST_F(RemoraCapiTest, FailuresSetTheLastErrorOfTheirThreadOnly) {
  pid_t missing = capi_test::missing_pid();
  EXPECT_EQ(remora_attach(missing, &opts_), REMORA_STATUS_NO_SUCH_PROCESS);
  std::string mine = remora_last_error();
  EXPECT_NE(mine.find(std::to_string(missing)), std::string::npos) << mine;

  std::string theirs;
  std::thread other([&] {
    EXPECT_STREQ(remora_last_error(), "");  // a fresh thread has no failure yet
    EXPECT_EQ(remora_attach(missing, nullptr), REMORA_STATUS_INVALID_ARGUMENT);
    theirs = remora_last_error();
  });
  other.join();
  EXPECT_NE(theirs.find("NULL"), std::string::npos) << theirs;
  EXPECT_EQ(mine, remora_last_error());

  EXPECT_EQ(remora_attach_tree(missing, &opts_), REMORA_STATUS_NO_SUCH_PROCESS);
  EXPECT_EQ(remora_detach_tree(missing), REMORA_STATUS_NO_SUCH_PROCESS);
  remora_agent_state_t st;
  st.size = sizeof st;
  EXPECT_EQ(remora_status(missing, &st), REMORA_STATUS_NO_SUCH_PROCESS) << remora_last_error();
}

TEST_F(RemoraCapiTest, BadOptionsAreInvalidArguments) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  pid_t pid = t.root();
  remora_options_t o = opts_;
  o.tools = nullptr;
  EXPECT_EQ(remora_attach(pid, &o), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remora_last_error()).find("tool"), std::string::npos) << remora_last_error();
  o.tools = "::";
  EXPECT_EQ(remora_attach(pid, &o), REMORA_STATUS_INVALID_ARGUMENT);
  o = opts_;
  const char* bad_env[] = {"NO_EQUALS_SIGN"};
  o.env = bad_env;
  EXPECT_EQ(remora_attach(pid, &o), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remora_last_error()).find("NO_EQUALS_SIGN"), std::string::npos)
      << remora_last_error();
  o = opts_;
  o.env = nullptr;
  EXPECT_EQ(remora_attach(pid, &o), REMORA_STATUS_INVALID_ARGUMENT);
  o = opts_;
  o.size = 4;
  EXPECT_EQ(remora_attach(pid, &o), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(remora_attach(0, &opts_), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(remora_attach(-1, &opts_), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(remora_detach(-1), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(remora_attach_tree(pid, nullptr), REMORA_STATUS_INVALID_ARGUMENT);
  o = opts_;
  o.tools = "/nonexistent/libtool.so";
  EXPECT_NE(remora_attach(pid, &o), REMORA_STATUS_SUCCESS);
  EXPECT_EQ(capi_test::read_lines(log_).size(), 0u) << dump(log_);
  // A failed attach leaves nothing attached.
  EXPECT_FALSE(status_of(pid).attached);
  EXPECT_EQ(t.finish(), 0);
}

TEST_F(RemoraCapiTest, DetachWithUnloadTakesTheAgentOut) {
  TargetTree t(1);
  ASSERT_TRUE(t.wait_ready());
  pid_t pid = t.root();
  auto fds = [](pid_t p) {
    size_t n = 0;
    std::string dir = "/proc/" + std::to_string(p) + "/fd";
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
      ::closedir(d);
    }
    return n;
  };
  const size_t fds_before = fds(pid);
  opts_.attach_children = true;
  opts_.lease = true;
  ASSERT_EQ(remora_attach(pid, &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();

  remora_detach_options_t d;
  std::memset(&d, 0xab, sizeof d);
  ASSERT_EQ(remora_detach_options_init(&d), REMORA_STATUS_SUCCESS);
  EXPECT_EQ(d.size, sizeof d);
  EXPECT_EQ(d.timeout_msec, 10000u);
  EXPECT_EQ(d.flags, 0u);
  EXPECT_FALSE(d.children);
  EXPECT_EQ(remora_detach_options_init_sized(&d, 4), REMORA_STATUS_INVALID_ARGUMENT);
  ASSERT_EQ(remora_detach_options_init(&d), REMORA_STATUS_SUCCESS);
  d.flags = 0x80;
  EXPECT_EQ(remora_detach_with(pid, &d), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(remora_last_error()).find("REMORA_DETACH_UNLOAD"), std::string::npos);

  d.flags = REMORA_DETACH_UNLOAD;
  d.children = true;
  ASSERT_EQ(remora_detach_with(pid, &d), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_STREQ(d.kept_tools, "");
  for (pid_t p : t.pids()) {
    EXPECT_EQ(count_hook(log_, "tool_fini", p), 1) << p << "\n" << dump(log_);
    EXPECT_FALSE(status_of(p).agent_loaded) << p;
  }
  EXPECT_EQ(fds(pid), fds_before);
  // Nothing left to unload; a re-attach loads the agent afresh.
  d.children = false;
  EXPECT_EQ(remora_detach_with(pid, &d), REMORA_STATUS_NOT_ATTACHED);
  opts_.attach_children = false;
  ASSERT_EQ(remora_attach(pid, &opts_), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_EQ(status_of(pid).sessions, 1u);
  ASSERT_EQ(remora_detach_with(0, &d), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_FALSE(status_of(pid).agent_loaded);
  EXPECT_EQ(count_hook(log_, "configure", pid), 2) << dump(log_);
}

TEST_F(RemoraCapiTest, StatusWritesOnlyWhatTheCallerSizeHolds) {
  remora_agent_state_t st;
  std::memset(&st, 0xab, sizeof st);
  st.size = offsetof(remora_agent_state_t, tools);  // an "older" caller
  ASSERT_EQ(remora_status(::getpid(), &st), REMORA_STATUS_SUCCESS) << remora_last_error();
  EXPECT_EQ(st.size, offsetof(remora_agent_state_t, tools));
  EXPECT_FALSE(st.agent_loaded);
  EXPECT_EQ(static_cast<unsigned char>(st.tools[0]), 0xab);  // untouched
  st.size = 3;
  EXPECT_EQ(remora_status(::getpid(), &st), REMORA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(remora_status(::getpid(), nullptr), REMORA_STATUS_INVALID_ARGUMENT);
}

TEST_F(RemoraCapiTest, EveryStatusHasANameAndAString) {
  std::set<std::string> names;
  for (int i = 0; i < REMORA_STATUS_LAST; ++i) {
    auto s = static_cast<remora_status_t>(i);
    std::string name = remora_status_name(s);
    EXPECT_EQ(name.rfind("REMORA_STATUS_", 0), 0u) << name;
    EXPECT_NE(name, "REMORA_STATUS_UNKNOWN");
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_GT(std::strlen(remora_status_string(s)), 0u);
  }
  EXPECT_STREQ(remora_status_name(REMORA_STATUS_NO_SUCH_PROCESS), "REMORA_STATUS_NO_SUCH_PROCESS");
  EXPECT_STREQ(remora_status_name(REMORA_STATUS_ALREADY_ATTACHED), "REMORA_STATUS_ALREADY_ATTACHED");
  EXPECT_STREQ(remora_status_name(REMORA_STATUS_LAST), "REMORA_STATUS_UNKNOWN");
  EXPECT_STREQ(remora_status_string(static_cast<remora_status_t>(-3)), "unknown status");
}

}  // namespace
