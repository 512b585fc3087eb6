// Container tests: an unprivileged controller resolves and calls functions in
// a target that runs in its own mount and pid namespaces, chrooted into an
// OverlayFS root built by the test. The controller has the target's uid and
// no capabilities, so /proc/PID/map_files is refused to it and every library
// is opened through the target's root (/proc/PID/root, openat2
// RESOLVE_IN_ROOT), accepted on a device/inode mismatch only when its GNU
// Build ID equals the one of the image mapped in the target (remote/lookup.h).
//
// Each case asserts the outcome of a real remote call. Needs root; skips only
// where the kernel lacks OverlayFS or new mount/pid namespaces.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "attach/attach.h"
#include "attach/internal.h"
#include "base/result.h"
#include "ctr_support.h"
#include "elf/elf_image.h"
#include "procfs/procfs.h"
#include "remote/target.h"
#include "remote/visible_file.h"

namespace remora::ctr_test {
namespace {

using remote::CallArg;
using remote::Target;

constexpr const char* kLib = "/lib/libctr.so";  // the fixture, as the container sees it
constexpr const char* kValueA = "4242";         // ctr_value() of builds A and nobid
constexpr const char* kDecoy = "666";           // ctr_decoy(): what a wrong file leads to

std::string get(const Report& r, const std::string& key) {
  auto it = r.find(key);
  return it == r.end() ? std::string() : it->second;
}

// --- on the parent's side ------------------------------------------------------

std::shared_ptr<const elf::ElfImage> image_of(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  auto img = elf::ElfImage::from_fd(fd);
  ::close(fd);
  return img ? *img : nullptr;
}

std::string build_id_of(const std::string& path) {
  auto img = image_of(path);
  return img ? img->build_id_hex() : "<unreadable " + path + ">";
}

uint64_t offset_of(const std::string& path, const char* symbol) {
  auto img = image_of(path);
  if (!img) return 0;
  auto sym = img->find_symbol(symbol);
  return sym ? sym->value : 0;
}

// --- inside the controller (unprivileged, forked) -------------------------------

// Premise: the controller is refused /proc/PID/map_files.
void note_map_files(Report& r, pid_t pid) {
  auto maps = procfs::read_maps(pid);
  if (!maps) {
    r["map_files"] = "maps unreadable: " + maps.error().to_string();
    return;
  }
  for (const auto& m : *maps) {
    if (!m.file_backed()) continue;
    char name[96];
    std::snprintf(name, sizeof name, "/proc/%d/map_files/%llx-%llx", pid,
                  static_cast<unsigned long long>(m.start), static_cast<unsigned long long>(m.end));
    int fd = ::open(name, O_RDONLY | O_CLOEXEC);
    r["map_files"] = fd >= 0 ? "opened" : std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return;
  }
}

std::string id_string(uint64_t dev, uint64_t ino) {
  return std::to_string(major(dev)) + ":" + std::to_string(minor(dev)) + " inode " + std::to_string(ino);
}

// Premise: the identity of `path` as mapped in the target and as found in
// its root (path without symlinks; stat through /proc/PID/root).
void note_identity(Report& r, pid_t pid, const std::string& path) {
  auto maps = procfs::read_maps(pid);
  if (!maps) return;
  int offset0 = 0;
  for (const auto& m : *maps) {
    if (m.path != path) continue;
    r["mapped_id"] = id_string(m.dev(), m.inode);
    if (m.deleted) r["mapped_deleted"] = "1";
    offset0 += m.offset == 0 ? 1 : 0;
  }
  r["mapped_offset0_count"] = std::to_string(offset0);
  struct stat st {};
  std::string in_root = "/proc/" + std::to_string(pid) + "/root" + path;
  r["file_id"] = ::stat(in_root.c_str(), &st) == 0 ? id_string(st.st_dev, st.st_ino) : std::strerror(errno);
}

std::unique_ptr<Target> open_target(Report& r, pid_t pid) {
  auto t = Target::open(pid);
  if (!t) {
    r["failure"] = "Target::open: " + t.error().to_string();
    return nullptr;
  }
  (*t)->set_use_map_files(false);
  r["ns_pid"] = std::to_string((*t)->ns_pid());
  return std::move(*t);
}

// A real remote call: r[prefix + "value"] on success (as a C int), else
// r[prefix + "code"] and r[prefix + "error"].
void call_and_note(Report& r, Target& t, const std::string& lib, const std::string& symbol,
                   const std::string& prefix = "") {
  auto c = t.call_symbol(lib, symbol, {});
  if (c) {
    r[prefix + "value"] = std::to_string(static_cast<int>(c->value));
  } else {
    r[prefix + "code"] = std::string(errc_name(c.error().code()));
    r[prefix + "error"] = c.error().to_string();
  }
}

// The usual body: premises, then ctr_value() in `lib`.
std::function<void(Report&)> call_value_body(pid_t pid, const std::string& lib = kLib) {
  return [pid, lib](Report& r) {
    note_map_files(r, pid);
    note_identity(r, pid, lib);
    auto t = open_target(r, pid);
    if (!t) return;
    call_and_note(r, *t, lib, "ctr_value");
    (void)t->close();
  };
}

// The number of descriptors the target holds (/proc/PID/fd, our side's /proc).
std::string count_fds(pid_t pid) {
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (d == nullptr) return std::string("unreadable: ") + std::strerror(errno);
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return std::to_string(n);
}

// --- the fixture ------------------------------------------------------------------

class ContainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static const std::string missing = missing_feature();
    if (!missing.empty()) GTEST_SKIP() << missing;
    std::string err;
    ASSERT_TRUE(enter_private_mount_ns(&err)) << err;
    root_ = ContainerRoot::create(&err);
    ASSERT_TRUE(root_) << err;
    ASSERT_TRUE(root_->add_program_with_libs(REMORA_CTR_TARGET, "/prog", &err)) << err;
  }

  // Skips the test where the kernel has no OverlayFS; fails on mount errors.
  bool overlay() {
    if (!overlay_available()) return false;
    std::string err;
    EXPECT_TRUE(root_->mount_overlay(&err)) << err;
    return root_->overlay_mounted();
  }

  void add(const std::string& src, const std::string& path) {
    std::string err;
    ASSERT_TRUE(root_->add_file(src, path, &err)) << err;
  }

  void start(const std::vector<std::string>& args) {
    std::string err;
    target_ = ContainerProcess::start(root_->root(), "/prog", args, &err);
    ASSERT_TRUE(target_) << err;
  }

  // The common premises of every controller report.
  static void expect_unprivileged_fallback(const Report& r) {
    EXPECT_EQ(get(r, "failure"), "") << to_string(r);
    EXPECT_EQ(get(r, "controller_uid"), std::to_string(kUid));
    std::string caps = get(r, "controller_cap_eff");
    caps.erase(0, caps.find_first_not_of(" \t"));
    EXPECT_EQ(caps, "0000000000000000") << "the controller must hold no capability";
    EXPECT_NE(get(r, "map_files"), "opened") << "the controller must be refused /proc/PID/map_files";
    EXPECT_NE(get(r, "map_files"), "") << to_string(r);
  }

  std::unique_ptr<ContainerRoot> root_;
  std::unique_ptr<ContainerProcess> target_;  // declared last: destroyed first
};

#define REQUIRE_OVERLAY()                                                                        \
  do {                                                                                           \
    if (!overlay_available()) GTEST_SKIP() << "the kernel has no OverlayFS (/proc/filesystems)"; \
    ASSERT_TRUE(overlay());                                                                      \
  } while (0)

// The fixture builds are what the cases rely on: A and the impostor share a
// Build ID; B and the impostor have the swapped layout, so their ctr_value is
// where A has ctr_decoy.
TEST(ContainerFixtures, BuildsHaveTheExpectedIdentitiesAndLayouts) {
  const std::string a = REMORA_CTR_LIB_A, b = REMORA_CTR_LIB_B, imp = REMORA_CTR_LIB_IMPOSTOR;
  EXPECT_EQ(build_id_of(a), "a11ce0000000000000000000000000000000c7a1");
  EXPECT_EQ(build_id_of(imp), build_id_of(a));
  EXPECT_NE(build_id_of(b), build_id_of(a));
  EXPECT_FALSE(build_id_of(b).empty());
  EXPECT_EQ(build_id_of(REMORA_CTR_LIB_NOBID), "");
  ASSERT_NE(offset_of(a, "ctr_value"), 0u);
  EXPECT_EQ(offset_of(b, "ctr_value"), offset_of(a, "ctr_decoy"));
  EXPECT_EQ(offset_of(imp, "ctr_value"), offset_of(a, "ctr_decoy"));
  EXPECT_NE(offset_of(imp, "ctr_value"), offset_of(a, "ctr_value"));
}

// The target runs in its own pid namespace: ns_pid() is the pid it printed,
// not the pid we know it by.
TEST_F(ContainerTest, NsPidIsThePidTheTargetSeesItselfAs) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  EXPECT_EQ(get(r, "ns_pid"), std::to_string(target_->printed_pid())) << to_string(r);
  EXPECT_NE(get(r, "ns_pid"), std::to_string(target_->pid())) << to_string(r);
  EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

// A thread id the target records in its own memory (the trampoline's
// gettid(), the agent's listener) is its pid namespace's; /proc here knows
// the thread by ours. The wait for the loader thread to be gone went by the
// target's id, found no such task here and returned at once: the agent then
// removed the scratch and the stack that thread was still returning through,
// and it crashed (on a busy machine, about one first attach in sixty from
// the host into a container). It must wait for the thread itself.
TEST_F(ContainerTest, ThreadIdsFromTheTargetAreTranslatedBeforeAnyWait) {
  ASSERT_NO_FATAL_FAILURE(start({}));
  std::vector<std::string> reply;
  std::string err;
  ASSERT_TRUE(target_->ask("thread", &reply, &err)) << err;
  ASSERT_EQ(reply.size(), 1u);
  ASSERT_EQ(reply[0].rfind("tid ", 0), 0u) << reply[0];
  const pid_t ns_tid = std::stoi(reply[0].substr(4));
  const pid_t pid = target_->pid();
  auto tasks = procfs::list_tasks(pid);
  ASSERT_TRUE(tasks.ok()) << tasks.error().message();
  ASSERT_EQ(tasks->size(), 2u);
  const pid_t host_tid = (*tasks)[0] == pid ? (*tasks)[1] : (*tasks)[0];
  ASSERT_NE(host_tid, ns_tid)
      << "the namespaces must name the thread differently for the case to mean anything";

  EXPECT_EQ(attach::detail::tid_as_we_name_it(pid, ns_tid, true), host_tid);
  EXPECT_EQ(attach::detail::tid_as_we_name_it(pid, ns_tid, false), ns_tid) << "outside: taken as it is";
  EXPECT_EQ(attach::detail::tid_as_we_name_it(pid, ns_tid + 1000, true), 0) << "no such thread: 0";

  auto waited = std::async(std::launch::async, [&] {
    return attach::detail::wait_target_thread_gone(pid, ns_tid, true,
                                                   Deadline::after(std::chrono::seconds(10)));
  });
  // A live thread keeps it waiting (a correct wait never returns here,
  // however long this takes; the broken one returned at once).
  EXPECT_EQ(waited.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the wait returned while the thread still ran";
  ASSERT_TRUE(target_->ask("unthread", &reply, &err)) << err;
  ASSERT_EQ(waited.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto gone = waited.get();
  EXPECT_TRUE(gone.ok()) << gone.error().message();
  EXPECT_EQ(::access(("/proc/" + std::to_string(pid) + "/task/" + std::to_string(host_tid)).c_str(), F_OK),
            -1);
}

// Case 1: the library as loaded, untouched, found through the root.
TEST_F(ContainerTest, OverlayLibraryResolvesThroughTheRoot) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

// Case 1: the same build under a new inode (an identical copy renamed over
// it): device/inode differ, the Build IDs match, so the file is accepted.
TEST_F(ContainerTest, SameBuildUnderANewInodeResolvesByBuildId) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  std::string err;
  ASSERT_TRUE(replace_by_rename(root_->merged() + kLib, REMORA_CTR_LIB_A, &err)) << err;
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  ASSERT_NE(get(r, "mapped_id"), get(r, "file_id")) << "premise: identities must differ\n" << to_string(r);
  EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

void expect_build_mismatch_refusal(const Report& r) {
  EXPECT_EQ(get(r, "value"), "") << "the call must be refused, not made\n" << to_string(r);
  EXPECT_EQ(get(r, "code"), "identity-mismatch") << to_string(r);
  const std::string msg = get(r, "error");
  EXPECT_NE(msg.find(kLib), std::string::npos) << msg;
  EXPECT_NE(msg.find(build_id_of(REMORA_CTR_LIB_A)), std::string::npos) << msg;
  EXPECT_NE(msg.find(build_id_of(REMORA_CTR_LIB_B)), std::string::npos) << msg;
  EXPECT_NE(msg.find("differ"), std::string::npos) << msg;
  // Both identities: the file's and the mapped image's.
  size_t first = msg.find("device ");
  EXPECT_TRUE(first != std::string::npos && msg.find("device ", first + 1) != std::string::npos) << msg;
}

// Case 2: another build of the library renamed over the loaded one.
TEST_F(ContainerTest, OtherBuildRenamedOverTheLoadedOneIsRefused) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  std::string err;
  ASSERT_TRUE(replace_by_rename(root_->merged() + kLib, REMORA_CTR_LIB_B, &err)) << err;
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  expect_build_mismatch_refusal(r);
}

// Case 2: build B written over the merged path in place. OverlayFS copies the
// file up: the upper layer holds B while the target still maps A (from the
// lower layer).
TEST_F(ContainerTest, OtherBuildWrittenOverTheLoadedOneIsRefused) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  std::string err;
  ASSERT_TRUE(replace_in_place(root_->merged() + kLib, REMORA_CTR_LIB_B, &err)) << err;
  ASSERT_EQ(build_id_of(root_->upper() + kLib), build_id_of(REMORA_CTR_LIB_B))
      << "premise: B in the upper layer";
  ASSERT_EQ(build_id_of(root_->lower() + kLib), build_id_of(REMORA_CTR_LIB_A))
      << "premise: A in the lower layer";
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  expect_build_mismatch_refusal(r);
}

// Case 3: no Build ID and a device/inode mismatch: nothing proves the file is
// the mapped image, so it is refused, even though its bytes are the same.
TEST_F(ContainerTest, NoBuildIdAndAnIdentityMismatchIsRefused) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_NOBID, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  std::string err;
  ASSERT_TRUE(replace_by_rename(root_->merged() + kLib, REMORA_CTR_LIB_NOBID, &err)) << err;
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  ASSERT_NE(get(r, "mapped_id"), get(r, "file_id")) << "premise: identities must differ\n" << to_string(r);
  EXPECT_EQ(get(r, "value"), "") << "the call must be refused, not made\n" << to_string(r);
  EXPECT_EQ(get(r, "code"), "identity-mismatch") << to_string(r);
  EXPECT_NE(get(r, "error").find(kLib), std::string::npos) << to_string(r);
  EXPECT_NE(get(r, "error").find("Build ID"), std::string::npos) << to_string(r);
}

// Case 4: a plain directory as the root (no OverlayFS): the file in the root
// is the mapped inode itself, so no Build ID is needed.
TEST_F(ContainerTest, ExactDeviceAndInodeMatchWithoutBuildIdResolves) {
  add(REMORA_CTR_LIB_NOBID, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  ASSERT_EQ(get(r, "mapped_id"), get(r, "file_id")) << "premise: same identity\n" << to_string(r);
  EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

// Case 5: the target maps the library file again as read-only data, below and
// above the library; those mappings must not be taken for the image.
TEST_F(ContainerTest, DataMappingsOfTheLibraryFileAreIgnored) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib, std::string("mapdata:") + kLib}));
  Report r = run_controller(call_value_body(target_->pid()));
  expect_unprivileged_fallback(r);
  ASSERT_EQ(get(r, "mapped_offset0_count"), "3") << "premise: the image and two data mappings\n"
                                                 << to_string(r);
  EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

// Case 6: after the target loaded /lib/libctr_link.so, that path becomes an
// absolute symlink to /opt/remora-ctr-test/libctr.so. Inside the container
// that is a copy of A; on the controller's side (its own mount namespace, a
// tmpfs on /opt) it is the impostor: A's Build ID, B's layout. Following the
// link on the controller's side would pass the Build ID check and call
// ctr_decoy (666); resolving it inside the root gives A's 4242.
TEST_F(ContainerTest, AbsoluteSymlinkIsResolvedInsideTheContainer) {
  REQUIRE_OVERLAY();
  const std::string link = "/lib/libctr_link.so", real = "/opt/remora-ctr-test/libctr.so";
  add(REMORA_CTR_LIB_A, link);
  add(REMORA_CTR_LIB_A, real);
  ASSERT_NO_FATAL_FAILURE(start({"dlopen:" + link}));
  std::string err;
  ASSERT_TRUE(replace_by_symlink(root_->merged() + link, real, &err)) << err;
  const std::string impostor = REMORA_CTR_LIB_IMPOSTOR;
  auto host_opt = [&](std::string* e) -> bool {
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      *e = std::string("private mount namespace: ") + std::strerror(errno);
      return false;
    }
    ::mkdir("/opt", 0755);
    if (::mount("remora-ctr-opt", "/opt", "tmpfs", 0, "mode=0755") != 0 ||
        ::mkdir("/opt/remora-ctr-test", 0755) != 0) {
      *e = std::string("tmpfs on /opt: ") + std::strerror(errno);
      return false;
    }
    std::error_code ec;
    std::filesystem::copy_file(impostor, real, ec);
    if (ec) *e = "copy the impostor to " + real + ": " + ec.message();
    return !ec && ::chmod(real.c_str(), 0755) == 0;
  };
  const pid_t pid = target_->pid();
  Report r = run_controller(
      [&](Report& rep) {
        rep["host_build_id"] = build_id_of(real);
        rep["host_value_offset"] = std::to_string(offset_of(real, "ctr_value"));
        call_value_body(pid, link)(rep);
      },
      host_opt);
  expect_unprivileged_fallback(r);
  ASSERT_NE(get(r, "mapped_id"), "") << "premise: " << link << " in the target's maps\n" << to_string(r);
  ASSERT_EQ(get(r, "host_build_id"), build_id_of(REMORA_CTR_LIB_A)) << "premise: the host's impostor\n"
                                                                    << to_string(r);
  ASSERT_EQ(get(r, "host_value_offset"), std::to_string(offset_of(REMORA_CTR_LIB_A, "ctr_decoy")))
      << to_string(r);
  EXPECT_NE(get(r, "value"), kDecoy) << "the controller followed the symlink out of the container\n"
                                     << to_string(r);
  if (get(r, "value").empty())
    EXPECT_NE(get(r, "code"), "") << "refused is acceptable, with a reason\n" << to_string(r);
  else
    EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

// Case 7: a library that exists only on the controller's side is made visible
// in the target through a memfd, loaded by a remote dlopen(), released; then
// its function is called. No fd stays behind in the target.
TEST_F(ContainerTest, HostOnlyLibraryLoadsThroughAMemfd) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  // The controller reads the library as kUid: a copy under base/host.
  const std::string host_lib = root_->host() + "/libctr_host.so";
  std::error_code ec;
  std::filesystem::copy_file(REMORA_CTR_LIB_HOST, host_lib, ec);
  ASSERT_FALSE(ec) << ec.message();
  ASSERT_EQ(::chmod(host_lib.c_str(), 0644), 0);
  ASSERT_NO_FATAL_FAILURE(start({std::string("dlopen:") + kLib}));
  const pid_t pid = target_->pid();
  auto count_fds = [pid]() { return ctr_test::count_fds(pid); };
  Report r = run_controller([&](Report& rep) {
    note_map_files(rep, pid);
    auto t = open_target(rep, pid);
    if (!t) return;
    rep["fds_before"] = count_fds();
    auto vf = remote::make_visible(*t, host_lib);
    if (!vf) {
      rep["visible_error"] = vf.error().to_string();
      return;
    }
    rep["visible_path"] = vf->path;
    rep["visible_via_memfd"] = vf->via_memfd() ? "1" : "0";
    CallArg args[] = {CallArg::string(vf->path), CallArg::integer(RTLD_NOW)};
    auto h = t->call_symbol("libc.so.6", "dlopen", args);
    uint64_t handle = h ? h->value : 0;
    rep["dlopen"] = h ? std::to_string(handle) : "error: " + h.error().to_string();
    auto rel = remote::release(*t, *vf);
    rep["release"] = rel ? "ok" : rel.error().to_string();
    rep["fds_after"] = count_fds();
    if (auto maps = procfs::read_maps(pid)) {
      for (const auto& m : *maps)
        if (m.path.rfind("/memfd:remora:", 0) == 0 && m.exec) rep["memfd_mapping"] = m.path;
    }
    if (handle == 0) return;
    // By name, as a user would after loading it: the path /proc/PID/maps shows.
    if (!get(rep, "memfd_mapping").empty())
      call_and_note(rep, *t, get(rep, "memfd_mapping"), "ctr_host_value");
    // By the library's own file name, which the memfd keeps ("remora:NAME").
    call_and_note(rep, *t, "libctr_host.so", "ctr_host_value", "by_name_");
    // And through the target's own dlsym on the handle.
    CallArg sym_args[] = {CallArg::integer(handle), CallArg::string("ctr_host_value")};
    auto addr = t->call_symbol("libc.so.6", "dlsym", sym_args);
    if (addr && addr->value != 0) {
      auto v = t->call(RemoteAddr(addr->value), {});
      rep["dlsym_value"] = v ? std::to_string(static_cast<int>(v->value)) : v.error().to_string();
    } else {
      rep["dlsym_value"] = addr ? "dlsym returned NULL" : addr.error().to_string();
    }
    (void)t->close();
  });
  expect_unprivileged_fallback(r);
  EXPECT_EQ(get(r, "visible_error"), "") << to_string(r);
  EXPECT_EQ(get(r, "visible_via_memfd"), "1") << to_string(r);
  EXPECT_EQ(get(r, "visible_path").rfind("/proc/self/fd/", 0), 0u) << to_string(r);
  EXPECT_NE(get(r, "dlopen"), "0") << "dlopen returned NULL\n" << to_string(r);
  EXPECT_EQ(get(r, "release"), "ok") << to_string(r);
  EXPECT_NE(get(r, "fds_before"), "") << to_string(r);
  EXPECT_EQ(get(r, "fds_after"), get(r, "fds_before")) << "an fd stayed behind in the target\n"
                                                       << to_string(r);
  EXPECT_EQ(get(r, "memfd_mapping"), "/memfd:remora:libctr_host.so") << to_string(r);
  EXPECT_EQ(get(r, "dlsym_value"), "31337") << to_string(r);
  EXPECT_EQ(get(r, "value"), "31337") << "call_symbol on the memfd-backed library\n" << to_string(r);
  EXPECT_EQ(get(r, "by_name_value"), "31337") << "call_symbol by the library's file name\n" << to_string(r);
}

// --- delivery without /proc in the target ---------------------------------------
//
// A root without /proc mounted (or one where memfd_create is refused) cannot
// open "/proc/self/fd/N": make_visible places a copy in the first of /tmp,
// /dev/shm, /run that is, inside the target's root, writable and not
// noexec, and release() removes it. The target itself says what its
// directories hold while the library is loaded and afterwards.

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += (s.empty() ? "" : ",") + l;
  return s;
}

// The controller's body: make `host_lib` visible, dlopen it in the target,
// release it, call its function through the target's dlsym.
std::function<void(Report&)> deliver_body(ContainerProcess* target, const std::string& host_lib) {
  return [target, host_lib](Report& rep) {
    const pid_t pid = target->pid();
    auto ls = [&](const char* dir, const char* key) {
      std::vector<std::string> lines;
      std::string err;
      rep[key] = target->ask(std::string("ls ") + dir, &lines, &err) ? joined(lines) : "ask failed: " + err;
    };
    note_map_files(rep, pid);
    auto t = open_target(rep, pid);
    if (!t) return;
    rep["fds_before"] = count_fds(pid);
    ls("/tmp", "tmp_before");
    auto vf = remote::make_visible(*t, host_lib);
    if (!vf) {
      rep["visible_code"] = std::string(errc_name(vf.error().code()));
      rep["visible_error"] = vf.error().to_string();
      rep["fds_after"] = count_fds(pid);
      ls("/tmp", "tmp_after");
      return;
    }
    rep["visible_path"] = vf->path;
    rep["visible_via"] = vf->via_memfd() ? "memfd" : vf->via_placed_file() ? "placed" : "path";
    struct stat st {};
    std::string in_root = "/proc/" + std::to_string(pid) + "/root" + vf->path;
    if (::stat(in_root.c_str(), &st) == 0) {
      char mode[16];
      std::snprintf(mode, sizeof mode, "%o", static_cast<unsigned>(st.st_mode & 07777));
      rep["placed_mode"] = mode;
      rep["placed_uid"] = std::to_string(st.st_uid);
    }
    // The place: the path less its last two parts (the private directory, the file).
    std::string dir = vf->path.substr(0, vf->path.rfind('/'));
    dir = dir.substr(0, dir.rfind('/'));
    ls(dir.c_str(), "dir_during");
    CallArg args[] = {CallArg::string(vf->path), CallArg::integer(RTLD_NOW)};
    auto h = t->call_symbol("libc.so.6", "dlopen", args);
    uint64_t handle = h ? h->value : 0;
    rep["dlopen"] = h ? std::to_string(handle) : "error: " + h.error().to_string();
    auto rel = remote::release(*t, *vf);
    rep["release"] = rel ? "ok" : rel.error().to_string();
    rep["fds_after"] = count_fds(pid);
    ls(dir.c_str(), "dir_after");
    ls("/tmp", "tmp_after");
    if (auto maps = procfs::read_maps(pid)) {
      for (const auto& m : *maps)
        if (m.exec && m.path.find("libctr_host.so") != std::string::npos)
          rep["mapped"] = m.path + (m.deleted ? " (deleted)" : "");
    }
    if (handle == 0) return;
    CallArg sym_args[] = {CallArg::integer(handle), CallArg::string("ctr_host_value")};
    auto addr = t->call_symbol("libc.so.6", "dlsym", sym_args);
    if (addr && addr->value != 0) {
      auto v = t->call(RemoteAddr(addr->value), {});
      rep["dlsym_value"] = v ? std::to_string(static_cast<int>(v->value)) : v.error().to_string();
    } else {
      rep["dlsym_value"] = addr ? "dlsym returned NULL" : addr.error().to_string();
    }
    call_and_note(rep, *t, "libctr_host.so", "ctr_host_value", "by_name_");
    (void)t->close();
  };
}

class NoProcTest : public ContainerTest {
 protected:
  // The controller reads the library as kUid: a copy under base/host.
  std::string host_library() {
    const std::string host_lib = root_->host() + "/libctr_host.so";
    std::error_code ec;
    std::filesystem::copy_file(REMORA_CTR_LIB_HOST, host_lib, ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(::chmod(host_lib.c_str(), 0644), 0);
    return host_lib;
  }

  void start_with(const ContainerOptions& options) {
    std::string err;
    target_ = ContainerProcess::start(root_->root(), "/prog", {}, &err, options);
    ASSERT_TRUE(target_) << err;
  }

  // A copy placed in `dir`, loaded from there, gone afterwards.
  void expect_loaded_from_placed_copy(const Report& r, const std::string& dir) {
    expect_unprivileged_fallback(r);
    expect_placed_copy_loaded_and_gone(r, dir);
  }
  void expect_placed_copy_loaded_and_gone(const Report& r, const std::string& dir) {
    EXPECT_EQ(get(r, "visible_error"), "") << to_string(r);
    EXPECT_EQ(get(r, "visible_via"), "placed") << to_string(r);
    const std::string path = get(r, "visible_path");
    EXPECT_EQ(path.rfind(dir + "/.remora-", 0), 0u) << to_string(r);
    EXPECT_NE(path.find("/libctr_host.so"), std::string::npos) << "the library keeps its file name\n"
                                                               << to_string(r);
    EXPECT_EQ(get(r, "placed_mode"), "500") << to_string(r);
    EXPECT_EQ(get(r, "placed_uid"), std::to_string(kUid)) << to_string(r);
    EXPECT_NE(get(r, "dir_during").find(".remora-"), std::string::npos)
        << "premise: the target sees the copy's directory in " << dir << "\n"
        << to_string(r);
    EXPECT_NE(get(r, "dlopen"), "0") << "dlopen returned NULL\n" << to_string(r);
    EXPECT_EQ(get(r, "dlopen").rfind("error", 0), std::string::npos) << to_string(r);
    EXPECT_EQ(get(r, "mapped").rfind(path, 0), 0u) << "the target maps the placed copy\n" << to_string(r);
    EXPECT_NE(get(r, "mapped").find("(deleted)"), std::string::npos) << to_string(r);
    EXPECT_EQ(get(r, "release"), "ok") << to_string(r);
    EXPECT_EQ(get(r, "dir_after").find(".remora-"), std::string::npos)
        << "the placed copy stayed behind in " << dir << "\n"
        << to_string(r);
    EXPECT_EQ(get(r, "tmp_after"), get(r, "tmp_before")) << to_string(r);
    EXPECT_EQ(get(r, "fds_after"), get(r, "fds_before")) << to_string(r);
    EXPECT_EQ(get(r, "dlsym_value"), "31337") << to_string(r);
  }
};

// The same root without /proc mounted (measured before: "the target could not
// load the agent:" with an empty reason): the copy goes to the root's /tmp.
TEST_F(NoProcTest, WithoutProcTheLibraryIsLoadedFromACopyInTmp) {
  REQUIRE_OVERLAY();
  const std::string host_lib = host_library();
  ContainerOptions o;
  o.mount_proc = false;
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  Report r = run_controller(deliver_body(target_.get(), host_lib));
  EXPECT_EQ(get(r, "tmp_before"), "") << "premise: an empty /tmp\n" << to_string(r);
  expect_loaded_from_placed_copy(r, "/tmp");
}

// A read-only root with a tmpfs on /tmp, as `--read-only --tmpfs /tmp` makes.
TEST_F(NoProcTest, ReadOnlyRootWithATmpfsTmpLoadsFromThere) {
  REQUIRE_OVERLAY();
  const std::string host_lib = host_library();
  ContainerOptions o;
  o.mount_proc = false;
  o.read_only_root = true;
  o.tmpfs = {{"/tmp", false}};
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  Report r = run_controller(deliver_body(target_.get(), host_lib));
  expect_loaded_from_placed_copy(r, "/tmp");
}

// /tmp mounted noexec (a library there cannot be mapped executable): the next
// place, a /dev/shm tmpfs, is taken.
TEST_F(NoProcTest, NoexecTmpIsPassedOverForDevShm) {
  REQUIRE_OVERLAY();
  const std::string host_lib = host_library();
  ContainerOptions o;
  o.mount_proc = false;
  o.read_only_root = true;
  o.tmpfs = {{"/tmp", true}, {"/dev/shm", false}};
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  Report r = run_controller(deliver_body(target_.get(), host_lib));
  expect_loaded_from_placed_copy(r, "/dev/shm");
}

// A controller running as root (sudo remora ...) creates the copy as root:
// it is handed to the target's uid, or the target (uid 65534) could not read
// a 0500 file.
TEST_F(NoProcTest, CopyPlacedByRootBelongsToTheTargetsUid) {
  REQUIRE_OVERLAY();
  const std::string host_lib = host_library();
  ContainerOptions o;
  o.mount_proc = false;
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  ASSERT_EQ(::geteuid(), 0u) << "premise: this test process is root (missing_feature)";
  Report r;
  deliver_body(target_.get(), host_lib)(r);  // in this (root) process
  expect_placed_copy_loaded_and_gone(r, "/tmp");
}

// A fully read-only root without /proc: no way exists. The error names the
// missing /proc, each place tried and why, and the fixes; nothing is left.
TEST_F(NoProcTest, FullyReadOnlyRootWithoutProcIsRefusedNamingThePlacesTried) {
  REQUIRE_OVERLAY();
  const std::string host_lib = host_library();
  ContainerOptions o;
  o.mount_proc = false;
  o.read_only_root = true;
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  Report r = run_controller(deliver_body(target_.get(), host_lib));
  expect_unprivileged_fallback(r);
  EXPECT_EQ(get(r, "visible_code"), "not-supported") << to_string(r);
  const std::string msg = get(r, "visible_error");
  for (const char* part :
       {"no /proc mounted", "/tmp: read-only file system", "/dev/shm: read-only file system",
        "/run: read-only file system", "Mount /proc in the container", "writable /tmp"})
    EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  EXPECT_EQ(get(r, "tmp_after"), get(r, "tmp_before")) << to_string(r);
  EXPECT_EQ(get(r, "fds_after"), get(r, "fds_before")) << to_string(r);
}

// The whole attach (agent, then a tool, then a detach) into a root without
// /proc, the controller unprivileged. It runs inside the target's pid
// namespace, with a /proc of that namespace in a mount namespace of its own
// (what `nsenter -p` and a private /proc give): a controller outside it is
// refused today because the agent's loader reports its tid as its namespace
// sees it (another change). The target itself shows the tool's log and its
// /tmp, where no copy may stay.
bool enter_pid_ns_of(pid_t pid, std::string* err) {
  int fd = ::open(("/proc/" + std::to_string(pid) + "/ns/pid").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWPID) != 0) {
    *err = std::string("enter the target's pid namespace: ") + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return false;
  }
  ::close(fd);
  pid_t child = ::fork();
  if (child < 0) {
    *err = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  if (child > 0) {
    // Only the child is in the namespace; it reports over the inherited pipe.
    // run_controller's deadline kills us, and with us (PDEATHSIG) the child.
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
      ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    *err = std::string("a /proc of the target's pid namespace: ") + std::strerror(errno);
    return false;
  }
  return true;
}

// A side-car: the controller in another container that shares the
// target's pid namespace (what `kubectl debug --target` gives), with a /proc
// of that namespace in a mount namespace of its own, as the container's
// user and as root with CAP_SYS_PTRACE. The target itself shows the tool's
// log and its /tmp, where no copy may stay.
Report sidecar_attach(ContainerProcess* target, bool as_root) {
  const pid_t host_pid = target->pid();
  return run_controller(
      [target](Report& rep) {
        auto ask = [&](const std::string& cmd) {
          std::vector<std::string> lines;
          std::string err;
          return target->ask(cmd, &lines, &err) ? joined(lines) : "ask failed: " + err;
        };
        const pid_t pid = target->printed_pid();  // our pid namespace is the target's
        attach::Controller c;
        attach::AttachOptions opts;
        opts.tools = {REMORA_CTR_HOOK_TOOL};
        opts.agent_path = REMORA_CTR_AGENT;
        opts.env = {{"REMORA_HOOK_LOG", "/tmp/hook.log"}};
        auto a = c.attach(pid, opts);
        rep["attach"] = !a ? a.error().to_string() : a->ok ? "ok" : a->message;
        rep["tmp_attached"] = ask("ls /tmp");
        rep["log_attached"] = ask("cat /tmp/hook.log");
        auto d = c.detach(pid);
        rep["detach"] = d ? "ok" : d.error().to_string();
        rep["log_detached"] = ask("cat /tmp/hook.log");
        rep["tmp_detached"] = ask("ls /tmp");
      },
      [host_pid](std::string* err) { return enter_pid_ns_of(host_pid, err); }, std::chrono::seconds(40),
      as_root);
}

void expect_sidecar_attached(const Report& r) {
  EXPECT_EQ(get(r, "failure"), "") << to_string(r);
  EXPECT_EQ(get(r, "attach"), "ok") << to_string(r);
  EXPECT_NE(get(r, "log_attached").find("a:tool_attach"), std::string::npos) << to_string(r);
  EXPECT_EQ(get(r, "tmp_attached"), "hook.log") << "a placed copy stayed behind in /tmp\n" << to_string(r);
  EXPECT_EQ(get(r, "detach"), "ok") << to_string(r);
  EXPECT_NE(get(r, "log_detached").find("a:tool_detach"), std::string::npos) << to_string(r);
  EXPECT_EQ(get(r, "tmp_detached"), "hook.log") << to_string(r);
}

TEST_F(NoProcTest, AttachAndDetachAToolWithoutProc) {
  REQUIRE_OVERLAY();
  ContainerOptions o;
  o.mount_proc = false;
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  Report r = sidecar_attach(target_.get(), /*as_root=*/false);
  EXPECT_EQ(get(r, "controller_uid"), std::to_string(kUid)) << to_string(r);
  expect_sidecar_attached(r);
}

TEST_F(NoProcTest, SidecarAsRootWithSysPtrace) {
  REQUIRE_OVERLAY();
  ContainerOptions o;
  o.mount_proc = false;
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  Report r = sidecar_attach(target_.get(), /*as_root=*/true);
  EXPECT_EQ(get(r, "controller_uid"), "0") << to_string(r);
  expect_sidecar_attached(r);
}

// A target that only chroot(2)s into its root (no pivot_root), as
// `unshare --root` or a build chroot does. Read from outside, its
// /proc/PID/maps shows host-side paths (<root>/lib/libctr.so), which do not
// exist inside /proc/PID/root. Whatever the engine makes of that, it must
// never call into another file: A's ctr_value (4242) or a refusal.
TEST_F(ContainerTest, ChrootOnlyTargetIsResolvedOrRefusedNeverWrong) {
  REQUIRE_OVERLAY();
  add(REMORA_CTR_LIB_A, kLib);
  std::string err;
  target_ = ContainerProcess::start(root_->root(), "/prog", {std::string("dlopen:") + kLib}, &err,
                                    RootChange::kChroot);
  ASSERT_TRUE(target_) << err;
  const pid_t pid = target_->pid();
  const std::string host_side = root_->merged() + kLib;
  Report r = run_controller([&](Report& rep) {
    note_map_files(rep, pid);
    note_identity(rep, pid, host_side);
    auto t = open_target(rep, pid);
    if (!t) return;
    call_and_note(rep, *t, "libctr.so", "ctr_value");
    (void)t->close();
  });
  expect_unprivileged_fallback(r);
  ASSERT_NE(get(r, "mapped_id"), "") << "premise: maps shows the host-side path " << host_side << "\n"
                                     << to_string(r);
  if (get(r, "value").empty())
    EXPECT_NE(get(r, "error"), "") << to_string(r);
  else
    EXPECT_EQ(get(r, "value"), kValueA) << to_string(r);
}

}  // namespace
}  // namespace remora::ctr_test

namespace remora::ctr_test {
namespace {

// Attach from the host into a container as runtimes make them: OverlayFS
// root with the program and libc only, its own pid and mount namespaces,
// pivot_root, uid 65534; /proc mounted in it or not. The agent names its
// listener by the container's tid; the controller, on the host, by its own.
// Once as the container's uid (no capabilities), once as root.
void attach_from_the_host(Report& rep, ContainerProcess* target, pid_t host_pid) {
  auto ask = [&](const std::string& cmd) {
    std::vector<std::string> lines;
    std::string err;
    return target->ask(cmd, &lines, &err) ? joined(lines) : "ask failed: " + err;
  };
  attach::Controller c;
  attach::AttachOptions opts;
  opts.tools = {REMORA_CTR_HOOK_TOOL};
  opts.agent_path = REMORA_CTR_AGENT;
  opts.env = {{"REMORA_HOOK_LOG", "/tmp/hook.log"}};
  auto a = c.attach(host_pid, opts);
  rep["attach"] = !a ? a.error().to_string() : a->ok ? "ok" : a->message;
  auto st = attach::Controller::status(host_pid);
  rep["listener_is_ours"] =
      st && st->listener_tid != 0 &&
              ::access(
                  ("/proc/" + std::to_string(host_pid) + "/task/" + std::to_string(st->listener_tid)).c_str(),
                  F_OK) == 0
          ? "yes"
          : "no";
  rep["log_attached"] = ask("cat /tmp/hook.log");
  auto d = c.detach(host_pid);
  rep["detach"] = d ? "ok" : d.error().to_string();
  rep["log_detached"] = ask("cat /tmp/hook.log");
  rep["tmp_detached"] = ask("ls /tmp");
}

void expect_attached_and_detached(const Report& r) {
  EXPECT_EQ(get(r, "failure"), "") << to_string(r);
  EXPECT_EQ(get(r, "attach"), "ok") << to_string(r);
  EXPECT_EQ(get(r, "listener_is_ours"), "yes") << "the listener is named by our tid\n" << to_string(r);
  EXPECT_NE(get(r, "log_attached").find("a:tool_attach"), std::string::npos) << to_string(r);
  EXPECT_EQ(get(r, "detach"), "ok") << to_string(r);
  EXPECT_NE(get(r, "log_detached").find("a:tool_detach"), std::string::npos) << to_string(r);
  EXPECT_EQ(get(r, "tmp_detached"), "hook.log") << "nothing of Remora's stays in /tmp\n" << to_string(r);
}

class HostAttachTest : public NoProcTest, public ::testing::WithParamInterface<bool> {};

TEST_P(HostAttachTest, AsTheContainersUser) {
  REQUIRE_OVERLAY();
  ContainerOptions o;
  o.mount_proc = GetParam();
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  ContainerProcess* target = target_.get();
  const pid_t host_pid = target->pid();
  ASSERT_NE(target->printed_pid(), host_pid) << "premise: the target has a pid namespace of its own";
  Report r = run_controller([&](Report& rep) { attach_from_the_host(rep, target, host_pid); }, {},
                            std::chrono::seconds(40));
  expect_attached_and_detached(r);
}

TEST_P(HostAttachTest, AsRoot) {
  REQUIRE_OVERLAY();
  ContainerOptions o;
  o.mount_proc = GetParam();
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  ContainerProcess* target = target_.get();
  Report r;
  attach_from_the_host(r, target, target->pid());
  expect_attached_and_detached(r);
}

INSTANTIATE_TEST_SUITE_P(ProcMountedOrNot, HostAttachTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "WithProc" : "WithoutProc";
                         });

}  // namespace
}  // namespace remora::ctr_test

namespace remora::ctr_test {
namespace {

// `remora attach` from the host, as root, with the default tool, into a
// container whose root holds the program and libc only: the tool's libraries
// beyond glibc (libunwind) are delivered with it, the profile lands in
// remora's working directory on the host, rendered, and nothing of it stays
// in the container. /proc mounted in the container or not.
class HostCliTest : public NoProcTest, public ::testing::WithParamInterface<bool> {
 protected:
  void attach_the_default_tool_from_the_host();
};

TEST_P(HostCliTest, DefaultToolProfileLandsOnTheHost) {
  REQUIRE_OVERLAY();
  ContainerOptions o;
  o.mount_proc = GetParam();
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  attach_the_default_tool_from_the_host();
}

// A read-only root (`--read-only`) with a tmpfs /tmp: the session's
// directory goes there, and nothing of it stays.
TEST_F(HostCliTest, ReadOnlyRootWithATmpfsTmp) {
  REQUIRE_OVERLAY();
  ContainerOptions o;
  o.read_only_root = true;
  o.tmpfs = {{"/tmp", false}};
  ASSERT_NO_FATAL_FAILURE(start_with(o));
  attach_the_default_tool_from_the_host();
}

void HostCliTest::attach_the_default_tool_from_the_host() {
  const pid_t pid = target_->pid();
  auto ask = [&](const std::string& cmd) {
    std::vector<std::string> lines;
    std::string err;
    return target_->ask(cmd, &lines, &err) ? joined(lines) : "ask failed: " + err;
  };
  const std::string before = ask("ls /tmp");
  char tmpl[] = "/tmp/remora-hostcli-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string cwd = tmpl;
  const std::string cmd = "cd " + cwd + " && timeout 60 " + REMORA_CTR_CLI + " attach -p " +
                          std::to_string(pid) + " -d 500 2>&1; echo \"exit=$?\"";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
  }
  EXPECT_NE(out.find("exit=0"), std::string::npos) << out;
  std::string session;
  for (const auto& e : std::filesystem::directory_iterator(cwd + "/remora-output"))
    if (e.is_directory()) session = e.path();
  ASSERT_FALSE(session.empty()) << "no session directory under " << cwd << "/remora-output\n" << out;
  for (const char* f : {"profile.remora", "summary.txt", "trace.perfetto", "profile.pb.gz", "folded.txt"})
    EXPECT_TRUE(std::filesystem::exists(session + "/" + f)) << session << "/" << f << "\n" << out;
  EXPECT_NE(out.find("==> pid " + std::to_string(pid) + ": " + session), std::string::npos) << out;
  // Its threads are named by host ids, like the pid: the main thread's tid
  // is the host pid, and the mapping is kept for `remora report`.
  EXPECT_TRUE(std::filesystem::exists(session + "/host-tids")) << out;
  std::string trace, err;
  EXPECT_TRUE(read_file(session + "/trace.json", &trace, &err)) << err;
  EXPECT_NE(trace.find("\"tid\":" + std::to_string(pid)), std::string::npos) << trace.substr(0, 2000);
  EXPECT_EQ(ask("ls /tmp"), before) << "nothing of Remora's stays in the container's /tmp\n" << out;
  EXPECT_EQ(ask("ls /").rfind("ask failed", 0), std::string::npos) << "the target answers after the session";
  std::filesystem::remove_all(cwd);
}

INSTANTIATE_TEST_SUITE_P(ProcMountedOrNot, HostCliTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "WithProc" : "WithoutProc";
                         });

}  // namespace
}  // namespace remora::ctr_test
