// `remora attach` from the host into a container whose root has no directory
// the profile could go into: the default tool writes its session into a memfd
// that remora made in the target and reads from its own side, and the
// profile lands in remora's working directory as usual. Roots as runtimes
// make them: OverlayFS, pivot_root, own pid and mount namespaces, uid 65534;
// read-only (readOnlyRootFilesystem), or without /tmp, /dev/shm and /run
// (FROM scratch); remora as root and as the container's own uid.
//
// What is asserted is what the user sees: remora exits 0, the session's
// directory holds the rendered profile with samples of the target's hot
// function, the target's computation stayed right, and the target holds no
// descriptor or mapping of ours afterwards.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string_view>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ctr_support.h"

namespace remora::ctr_test {
namespace {

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += (s.empty() ? "" : "\n") + l;
  return s;
}

// The target's descriptors as "N -> what", from our side's /proc.
std::set<std::string> fds_of(pid_t pid) {
  std::set<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char buf[4096];
      ssize_t n = ::readlink((dir + "/" + e->d_name).c_str(), buf, sizeof buf - 1);
      buf[n > 0 ? n : 0] = '\0';
      out.insert(std::string(e->d_name) + " -> " + buf);
    }
    ::closedir(d);
  }
  return out;
}

std::string text_of(const std::set<std::string>& s) {
  std::string t;
  for (const auto& x : s) t += x + "\n";
  return t;
}

std::string run_shell(const std::string& cmd) {
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

struct Shape {
  bool read_only = false;   // the root mount read-only
  bool no_places = false;   // no /tmp, /dev/shm, /run in the root at all
  bool mount_proc = true;   // /proc mounted inside
  bool as_target_uid = false;  // remora runs as the container's uid (setpriv), not root
};

class MemoryOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::string missing = missing_feature();
    if (!missing.empty()) GTEST_SKIP() << missing;
    if (!overlay_available()) GTEST_SKIP() << "the kernel has no OverlayFS (/proc/filesystems)";
    std::string err;
    ASSERT_TRUE(enter_private_mount_ns(&err)) << err;
    root_ = ContainerRoot::create(&err);
    ASSERT_TRUE(root_) << err;
    ASSERT_TRUE(root_->add_program_with_libs(REMORA_CTR_TARGET, "/prog", &err)) << err;
  }
  void TearDown() override {
    target_.reset();
    if (!cwd_.empty()) std::filesystem::remove_all(cwd_);
  }

  std::string ask(const std::string& cmd) {
    std::vector<std::string> lines;
    std::string err;
    return target_->ask(cmd, &lines, &err) ? joined(lines) : "ask failed: " + err;
  }

  void start(const Shape& shape) {
    std::string err;
    if (shape.no_places)
      for (const char* d : {"/tmp", "/dev/shm", "/run"}) std::filesystem::remove_all(root_->lower() + d);
    ASSERT_TRUE(root_->mount_overlay(&err)) << err;
    ContainerOptions o;
    o.mount_proc = shape.mount_proc;
    o.read_only_root = shape.read_only;
    target_ = ContainerProcess::start(root_->root(), "/prog", {}, &err, o);
    ASSERT_TRUE(target_) << err;
    char tmpl[] = "/tmp/remora-memout-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    cwd_ = tmpl;
    if (shape.as_target_uid) {
      ASSERT_EQ(::chown(cwd_.c_str(), kUid, kGid), 0) << std::strerror(errno);
    }
  }

  // `remora attach -d` from the host; its output and "exit=N".
  std::string attach_for_a_while(const Shape& shape, int ms = 1000) {
    const std::string as = shape.as_target_uid ? "setpriv --reuid=" + std::to_string(kUid) +
                                                     " --regid=" + std::to_string(kGid) +
                                                     " --clear-groups --inh-caps=-all "
                                               : "";
    return run_shell("cd " + cwd_ + " && " + as + "timeout 60 " + REMORA_CTR_CLI + " attach -p " +
                     std::to_string(target_->pid()) + " -d " + std::to_string(ms) + " 2>&1; echo \"exit=$?\"");
  }

  // The whole case: the profile lands, right, and nothing of ours stays.
  void expect_profile_from_memory(const Shape& shape) {
    ASSERT_NO_FATAL_FAILURE(start(shape));
    const pid_t pid = target_->pid();
    ASSERT_EQ(ask("spin"), "");
    const std::set<std::string> fds_before = fds_of(pid);
    const std::string out = attach_for_a_while(shape);
    EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
    EXPECT_NE(out.find("its profile is kept in memory"), std::string::npos) << out;
    EXPECT_EQ(out.find("could not be brought out"), std::string::npos) << out;
    std::string session;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(cwd_ + "/remora-output", ec))
      if (e.is_directory()) session = e.path();
    ASSERT_FALSE(session.empty()) << "no session directory under " << cwd_ << "/remora-output\n" << out;
    for (const char* f : {"profile.remora", "summary.txt", "folded.txt"})
      EXPECT_TRUE(std::filesystem::exists(session + "/" + f)) << session << "/" << f << "\n" << out;
    std::string folded, err;
    EXPECT_TRUE(read_file(session + "/folded.txt", &folded, &err)) << err;
    EXPECT_NE(folded.find("ctr_hot"), std::string::npos) << "samples of the hot function\n"
                                                         << folded.substr(0, 4000) << "\n"
                                                         << out;
    const std::string spun = ask("unspin");
    EXPECT_EQ(spun.rfind("rounds ", 0), 0u) << spun;
    EXPECT_NE(spun.find(" bad 0"), std::string::npos) << "the target's sums stay right: " << spun;
    EXPECT_NE(spun, "rounds 0 bad 0") << spun;
    // The memfd is closed again, and every descriptor of the program is as
    // it was. (The tool itself stays loaded after a detach, with the
    // descriptors it keeps for the next session: an eventfd and libunwind's
    // pipe; those are not the profile's.)
    const std::set<std::string> fds_after = fds_of(pid);
    for (const auto& fd : fds_before)
      EXPECT_EQ(fds_after.count(fd), 1u) << fd << " is gone\n" << text_of(fds_after);
    EXPECT_EQ(text_of(fds_after).find("memfd:"), std::string::npos) << text_of(fds_after) << out;
    std::string maps;
    EXPECT_TRUE(read_file("/proc/" + std::to_string(pid) + "/maps", &maps, &err)) << err;
    EXPECT_EQ(maps.find("remora-output"), std::string::npos) << maps;
    EXPECT_EQ(ask("ls /").rfind("ask failed", 0), std::string::npos) << "the target answers after the session";
  }

  std::unique_ptr<ContainerRoot> root_;
  std::string cwd_;
  std::unique_ptr<ContainerProcess> target_;
};

// FROM scratch: the program, libc and /proc, no /tmp, /dev/shm or /run.
TEST_F(MemoryOutputTest, RootWithOnlyTheProgramLibcAndProc) {
  Shape s;
  s.no_places = true;
  expect_profile_from_memory(s);
}

// readOnlyRootFilesystem: the OverlayFS root mounted read-only.
TEST_F(MemoryOutputTest, ReadOnlyOverlayRootAsRoot) {
  Shape s;
  s.read_only = true;
  expect_profile_from_memory(s);
}

// The same with remora as the container's uid: it opens /proc/PID/fd/N of a
// process of its own uid (no capability).
TEST_F(MemoryOutputTest, ReadOnlyOverlayRootAsTheContainersUser) {
  Shape s;
  s.read_only = true;
  s.as_target_uid = true;
  expect_profile_from_memory(s);
}

TEST_F(MemoryOutputTest, RootWithOnlyTheProgramAndLibcAsTheContainersUser) {
  Shape s;
  s.no_places = true;
  s.as_target_uid = true;
  expect_profile_from_memory(s);
}

// A second session of the same process: a memfd of its own, the first
// session's REMORA_OUTPUT_FD (still in its environment) harmless.
TEST_F(MemoryOutputTest, ReattachGetsAMemfdOfItsOwn) {
  Shape s;
  s.read_only = true;
  ASSERT_NO_FATAL_FAILURE(expect_profile_from_memory(s));
  ASSERT_EQ(ask("spin"), "");
  const std::string out = attach_for_a_while(s, 300);
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
  int sessions = 0;
  for (const auto& e : std::filesystem::directory_iterator(cwd_ + "/remora-output"))
    if (e.is_directory() && std::filesystem::exists(e.path() / "profile.remora")) ++sessions;
  EXPECT_EQ(sessions, 2) << out;
  EXPECT_NE(ask("unspin").find(" bad 0"), std::string::npos);
  EXPECT_EQ(text_of(fds_of(target_->pid())).find("memfd:"), std::string::npos) << out;
}

// The target killed during the session: remora's own reference still holds
// what the tool recorded; it lands as profile.remora.part and remora says so.
TEST_F(MemoryOutputTest, TargetKilledDuringTheSessionLeavesWhatWasRecorded) {
  Shape s;
  s.read_only = true;
  ASSERT_NO_FATAL_FAILURE(start(s));
  ASSERT_EQ(ask("spin"), "");
  const pid_t pid = target_->pid();
  const std::string cmd = "cd " + cwd_ + " && timeout 60 " + REMORA_CTR_CLI + " attach -p " + std::to_string(pid) +
                          " -d 20000 2>&1; echo \"exit=$?\"";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  // Handshake: the tool has written its header (the memfd holds data)
  // and the collector a first tick of events; then the target dies.
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  bool written = false;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !written && std::chrono::steady_clock::now() < until;) {
    if (DIR* d = ::opendir(fd_dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        char buf[256];
        ssize_t n = ::readlinkat(dirfd(d), e->d_name, buf, sizeof buf - 1);
        struct stat st {};
        if (n > 0 && std::string_view(buf, static_cast<size_t>(n)).find("memfd:remora-output") != std::string_view::npos &&
            ::stat((fd_dir + "/" + e->d_name).c_str(), &st) == 0 && st.st_size > 200)
          written = true;
      }
      ::closedir(d);
    }
    if (!written) ::usleep(20 * 1000);  // polling the target's state, with a deadline
  }
  EXPECT_TRUE(written) << "the tool never wrote into the memfd";
  ::kill(pid, SIGKILL);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  EXPECT_NE(out.find("did not finish its session"), std::string::npos) << out;
  bool part = false;
  for (const auto& e : std::filesystem::directory_iterator(cwd_ + "/remora-output"))
    if (std::filesystem::exists(e.path() / "profile.remora.part") &&
        std::filesystem::file_size(e.path() / "profile.remora.part") > 0)
      part = true;
  EXPECT_TRUE(part) << out;
}

// Without /proc as well: the memfd itself needs none, but the agent cannot be
// loaded (dlopen needs a path: /proc/self/fd/N, or a copy in a writable
// directory). remora says so, and the memfd it made is closed again.
TEST_F(MemoryOutputTest, ReadOnlyRootWithoutProcIsRefusedAndLeavesNothing) {
  Shape s;
  s.read_only = true;
  s.mount_proc = false;
  ASSERT_NO_FATAL_FAILURE(start(s));
  const std::set<std::string> fds_before = fds_of(target_->pid());
  const std::string out = attach_for_a_while(s);
  EXPECT_EQ(out.find("exit=0"), std::string::npos) << out;
  EXPECT_NE(out.find("/proc"), std::string::npos) << "the refusal names the missing /proc\n" << out;
  EXPECT_EQ(text_of(fds_of(target_->pid())), text_of(fds_before)) << out;
  EXPECT_EQ(ask("ls /").rfind("ask failed", 0), std::string::npos);
}

}  // namespace
}  // namespace remora::ctr_test
