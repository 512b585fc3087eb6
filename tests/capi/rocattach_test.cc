// The rocattach ABI exactly as a ROCm program uses it: dlopen the library by
// path, dlsym the functions, configure through the environment. This binary
// does not link libremora.so or include anything of Remora but rocattach.h
// (for the types; the functions come from dlsym).
#include "rocattach.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <iterator>
#include <string>

#include "capi_test_util.h"

namespace {

using capi_test::count_hook;
using capi_test::dump;
using capi_test::TargetTree;

template <typename F>
F sym(void* lib, const char* name) {
  void* p = ::dlsym(lib, name);
  EXPECT_NE(p, nullptr) << name << ": " << ::dlerror();
  return reinterpret_cast<F>(p);
}

class RocattachTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The built agent, unless the caller chose one (e.g. an uninstrumented
    // agent for a sanitizer build of these tests).
    ::setenv("REMORA_AGENT_PATH", REMORA_AGENT_PATH_BUILT, 0);
    ::unsetenv("ROCPROF_ATTACH_TOOL_LIBRARY");
    ::unsetenv("REMORA_ATTACH_TOOL_LIBRARY");
    ASSERT_FALSE(dir_.path().empty());
    log_ = dir_.path() + "/hook.log";
    ::setenv("REMORA_HOOK_LOG", log_.c_str(), 1);  // forwarded: it starts with REMORA_

    lib_ = ::dlopen(ROCATTACH_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << ::dlerror();
    attach = sym<decltype(&rocattach_attach)>(lib_, "rocattach_attach");
    attach_tree = sym<decltype(&rocattach_attach_tree)>(lib_, "rocattach_attach_tree");
    detach = sym<decltype(&rocattach_detach)>(lib_, "rocattach_detach");
    detach_tree = sym<decltype(&rocattach_detach_tree)>(lib_, "rocattach_detach_tree");
    get_version = sym<decltype(&rocattach_get_version)>(lib_, "rocattach_get_version");
    get_version_triplet =
        sym<decltype(&rocattach_get_version_triplet)>(lib_, "rocattach_get_version_triplet");
    status_name = sym<decltype(&rocattach_get_status_name)>(lib_, "rocattach_get_status_name");
    status_string = sym<decltype(&rocattach_get_status_string)>(lib_, "rocattach_get_status_string");
  }
  void TearDown() override {
    ::unsetenv("ROCPROF_ATTACH_TOOL_LIBRARY");
    ::unsetenv("REMORA_HOOK_LOG");
    // Not dlclose'd: a ROCm program keeps the library, and libremora.so's
    // controller is process-wide.
  }

  void use_hook_tool() { ::setenv("ROCPROF_ATTACH_TOOL_LIBRARY", REMORA_HOOK_TOOL_A, 1); }

  capi_test::TempDir dir_;
  std::string log_;
  void* lib_ = nullptr;
  decltype(&rocattach_attach) attach = nullptr;
  decltype(&rocattach_attach_tree) attach_tree = nullptr;
  decltype(&rocattach_detach) detach = nullptr;
  decltype(&rocattach_detach_tree) detach_tree = nullptr;
  decltype(&rocattach_get_version) get_version = nullptr;
  decltype(&rocattach_get_version_triplet) get_version_triplet = nullptr;
  decltype(&rocattach_get_status_name) status_name = nullptr;
  decltype(&rocattach_get_status_string) status_string = nullptr;
};

TEST_F(RocattachTest, AttachTreeAndDetachTreeRunEveryHookInEveryProcess) {
  TargetTree tree(2);
  ASSERT_TRUE(tree.wait_ready());
  ASSERT_EQ(tree.pids().size(), 3u);
  use_hook_tool();

  ASSERT_EQ(attach_tree(tree.root()), ROCATTACH_STATUS_SUCCESS);
  for (pid_t p : tree.pids())
    for (const char* hook : {"configure", "configure_attach", "tool_init", "tool_attach"})
      EXPECT_EQ(count_hook(log_, hook, p), 1) << hook << " in pid " << p << "; log:\n" << dump(log_);
  for (pid_t p : tree.pids()) EXPECT_EQ(count_hook(log_, "tool_detach", p), 0) << dump(log_);

  ASSERT_EQ(detach_tree(tree.root()), ROCATTACH_STATUS_SUCCESS);
  for (pid_t p : tree.pids())
    EXPECT_EQ(count_hook(log_, "tool_detach", p), 1) << "pid " << p << ":\n" << dump(log_);
  // The tree was consumed: a second detach_tree has nothing to detach.
  EXPECT_EQ(detach_tree(tree.root()), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
  // The targets still work: every process exits 0 when told to.
  EXPECT_EQ(tree.finish(), 0);
}

TEST_F(RocattachTest, AttachDetachReattachOneProcess) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  pid_t pid = t.root();
  use_hook_tool();

  ASSERT_EQ(attach(pid), ROCATTACH_STATUS_SUCCESS);
  EXPECT_EQ(count_hook(log_, "tool_attach", pid), 1) << dump(log_);
  EXPECT_EQ(attach(pid), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);  // already attached, as in ROCm
  ASSERT_EQ(detach(pid), ROCATTACH_STATUS_SUCCESS);
  EXPECT_EQ(count_hook(log_, "tool_detach", pid), 1) << dump(log_);
  EXPECT_EQ(detach(pid), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);  // nothing attached
  ASSERT_EQ(attach(pid), ROCATTACH_STATUS_SUCCESS);                 // re-attach
  EXPECT_EQ(count_hook(log_, "tool_attach", pid), 2) << dump(log_);
  EXPECT_EQ(count_hook(log_, "tool_init", pid), 1) << dump(log_);
  EXPECT_EQ(detach(0), ROCATTACH_STATUS_SUCCESS);  // all
  EXPECT_EQ(count_hook(log_, "tool_detach", pid), 2) << dump(log_);
  EXPECT_EQ(t.finish(), 0);
}

TEST_F(RocattachTest, NoToolLibraryIsAnInvalidArgument) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  testing::internal::CaptureStderr();
  EXPECT_EQ(attach(t.root()), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(attach_tree(t.root()), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("ROCPROF_ATTACH_TOOL_LIBRARY"), std::string::npos) << err;
  EXPECT_EQ(capi_test::read_lines(log_).size(), 0u) << dump(log_);
}

TEST_F(RocattachTest, RemoraToolLibraryVariableWorksToo) {
  TargetTree t(0);
  ASSERT_TRUE(t.wait_ready());
  ::setenv("REMORA_ATTACH_TOOL_LIBRARY", REMORA_HOOK_TOOL_A, 1);
  EXPECT_EQ(attach(t.root()), ROCATTACH_STATUS_SUCCESS);
  ::unsetenv("REMORA_ATTACH_TOOL_LIBRARY");
  EXPECT_EQ(count_hook(log_, "tool_attach", t.root()), 1) << dump(log_);
  EXPECT_EQ(detach(t.root()), ROCATTACH_STATUS_SUCCESS);
}

TEST_F(RocattachTest, TargetWithRocpToolAttachZeroIsRefused) {
  TargetTree t(0, {"ROCP_TOOL_ATTACH=0"});
  ASSERT_TRUE(t.wait_ready());
  use_hook_tool();
  testing::internal::CaptureStderr();
  EXPECT_EQ(attach(t.root()), ROCATTACH_STATUS_ERROR);
  EXPECT_EQ(attach_tree(t.root()), ROCATTACH_STATUS_ERROR);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("ROCP_TOOL_ATTACH=0"), std::string::npos) << err;
  EXPECT_EQ(capi_test::read_lines(log_).size(), 0u) << dump(log_);
  EXPECT_EQ(t.finish(), 0);
}

TEST_F(RocattachTest, MissingProcessIsProcessNotFound) {
  use_hook_tool();
  pid_t pid = capi_test::missing_pid();
  testing::internal::CaptureStderr();
  EXPECT_EQ(attach(pid), ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND);
  EXPECT_EQ(attach_tree(pid), ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND);
  EXPECT_EQ(detach_tree(pid), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);  // never attached
  EXPECT_EQ(attach(-5), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(detach(-5), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(std::to_string(pid)), std::string::npos) << err;
}

TEST_F(RocattachTest, StatusNamesAndStrings) {
  const char* names[] = {
      "ROCATTACH_STATUS_SUCCESS",
      "ROCATTACH_STATUS_ERROR",
      "ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT",
      "ROCATTACH_STATUS_ERROR_NOT_SUPPORTED",
      "ROCATTACH_STATUS_ERROR_PTRACE_ERROR",
      "ROCATTACH_STATUS_ERROR_PTRACE_OPERATION_NOT_PERMITTED",
      "ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND",
  };
  static_assert(std::size(names) == ROCATTACH_STATUS_LAST);
  for (int i = 0; i < ROCATTACH_STATUS_LAST; ++i) {
    auto s = static_cast<rocattach_status_t>(i);
    ASSERT_NE(status_name(s), nullptr) << i;
    EXPECT_STREQ(status_name(s), names[i]);
    ASSERT_NE(status_string(s), nullptr) << i;
    EXPECT_GT(std::string(status_string(s)).size(), 0u);
  }
  EXPECT_STREQ(status_string(ROCATTACH_STATUS_SUCCESS), "Success");
  EXPECT_EQ(status_name(ROCATTACH_STATUS_LAST), nullptr);
  EXPECT_EQ(status_string(ROCATTACH_STATUS_LAST), nullptr);
  EXPECT_EQ(status_name(static_cast<rocattach_status_t>(-1)), nullptr);
}

TEST_F(RocattachTest, Version) {
  uint32_t major = 99, minor = 99, patch = 99;
  EXPECT_EQ(get_version(&major, &minor, &patch), ROCATTACH_STATUS_SUCCESS);
  EXPECT_EQ(major, uint32_t{ROCATTACH_VERSION_MAJOR});
  EXPECT_EQ(minor, uint32_t{ROCATTACH_VERSION_MINOR});
  EXPECT_EQ(patch, uint32_t{ROCATTACH_VERSION_PATCH});
  EXPECT_EQ(get_version(nullptr, &minor, nullptr), ROCATTACH_STATUS_SUCCESS);
  rocattach_version_triplet_t v{0, 0, 0};
  EXPECT_EQ(get_version_triplet(&v), ROCATTACH_STATUS_SUCCESS);
  EXPECT_EQ(v.major, major);
  EXPECT_EQ(v.minor, minor);
  EXPECT_EQ(v.patch, patch);
  EXPECT_EQ(get_version_triplet(nullptr), ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT);
}

}  // namespace
