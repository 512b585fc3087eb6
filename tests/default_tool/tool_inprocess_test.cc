// The default tool driven in-process, without the attach engine: the test
// dlopens libremora-tool.so the way the agent does, calls its entry points
// and runs a workload in its own threads, then checks what the user would
// see (the output files) and that the process is left as it was (GOT slots,
// signal dispositions, timers) and still computes correctly.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "remora/tool.h"
#include "workload.h"

namespace fs = std::filesystem;

namespace {

using DebugSlotsFn = int (*)(void (*)(void*, void**, void*, void*, const char*, const char*), void*);

struct ToolHandle {
  void* handle = nullptr;
  remora_tool_configure_result_t* conf = nullptr;
  remora_tool_configure_attach_result_t* conf_attach = nullptr;
  DebugSlotsFn debug_slots = nullptr;
  int (*debug_signal)() = nullptr;
  const char* last_output = nullptr;
  uint64_t session = 0;
};

ToolHandle& tool() {
  static ToolHandle t = [] {
    ToolHandle h;
    remora_tool_info_t info{};
    info.size = sizeof info;
    info.abi_version = REMORA_TOOL_ABI_VERSION;
    info.tool_path = REMORA_TOOL_PATH;
    info.pid = getpid();
    // As the agent loads tools; never dlclosed.
    h.handle = dlopen(REMORA_TOOL_PATH, RTLD_NOW | RTLD_LOCAL);
    if (h.handle == nullptr) {
      fprintf(stderr, "dlopen %s: %s\n", REMORA_TOOL_PATH, dlerror());
      abort();
    }
    auto configure = reinterpret_cast<remora_configure_fn>(dlsym(h.handle, "remora_configure"));
    auto configure_attach =
        reinterpret_cast<remora_configure_attach_fn>(dlsym(h.handle, "remora_configure_attach"));
    h.conf = configure(REMORA_TOOL_ABI_VERSION, &info);
    h.conf_attach = configure_attach(REMORA_TOOL_ABI_VERSION, &info);
    h.debug_slots = reinterpret_cast<DebugSlotsFn>(dlsym(h.handle, "remora_default_tool_debug_slots"));
    h.debug_signal = reinterpret_cast<int (*)()>(dlsym(h.handle, "remora_default_tool_debug_signal"));
    h.last_output = static_cast<const char*>(dlsym(h.handle, "remora_default_tool_last_output"));
    if (!h.conf || !h.conf_attach || !h.debug_slots || !h.debug_signal || !h.last_output) abort();
    if (h.conf->tool_init && h.conf->tool_init(h.conf->tool_data) != 0) abort();
    return h;
  }();
  return t;
}

const char* const kVars[] = {"REMORA_OUTPUT_PATH", "REMORA_SAMPLE_HZ",   "REMORA_TRACE_FUNCTIONS",
                             "REMORA_SAMPLING",    "REMORA_TRACING",     "REMORA_SAMPLE_SIGNAL",
                             "REMORA_MAX_EVENTS",  "REMORA_FOLD_THREADS"};

int attach(const std::map<std::string, std::string>& env) {
  for (const char* v : kVars) unsetenv(v);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  ToolHandle& t = tool();
  remora_tool_info_t info{};
  info.size = sizeof info;
  info.abi_version = REMORA_TOOL_ABI_VERSION;
  info.tool_path = REMORA_TOOL_PATH;
  info.pid = getpid();
  info.session = ++t.session;
  return t.conf_attach->tool_attach(t.conf->tool_data, &info);
}

int detach() {
  ToolHandle& t = tool();
  remora_tool_info_t info{};
  info.size = sizeof info;
  info.abi_version = REMORA_TOOL_ABI_VERSION;
  info.tool_path = REMORA_TOOL_PATH;
  info.pid = getpid();
  info.session = t.session;
  return t.conf_attach->tool_detach(t.conf->tool_data, &info);
}

int count_timers() {
  std::ifstream f("/proc/self/timers");
  std::string line;
  int n = 0;
  while (std::getline(f, line))
    if (line.rfind("ID: ", 0) == 0) ++n;
  return n;
}

// Real-time signal dispositions, as text ("34:handler/flags/mask ...") so a
// mismatch reads well.
std::string rt_dispositions() {
  std::string out;
  for (int s = SIGRTMIN; s <= SIGRTMAX; ++s) {
    struct sigaction sa;
    sigaction(s, nullptr, &sa);
    char buf[128];
    snprintf(buf, sizeof buf, "%d:%p/%#x/%lx ", s, reinterpret_cast<void*>(sa.sa_sigaction), sa.sa_flags,
             sa.sa_mask.__val[0]);
    out += buf;
  }
  return out;
}

struct SlotInfo {
  void** slot;
  void* original;
  void* wrapper;
  std::string function, object;
};

std::vector<SlotInfo> patched_slots() {
  std::vector<SlotInfo> out;
  tool().debug_slots(
      [](void* ctx, void** slot, void* original, void* wrapper, const char* fn, const char* obj) {
        static_cast<std::vector<SlotInfo>*>(ctx)->push_back({slot, original, wrapper, fn, obj});
      },
      &out);
  return out;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, nullptr);
}

class DefaultToolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/remora-tool-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    out_ = dir_ + "/out";
  }
  void TearDown() override {
    if (!HasFailure())
      fs::remove_all(dir_);
    else
      fprintf(stderr, "outputs kept in %s\n", dir_.c_str());
  }
  std::string check_outputs(const std::string& d, const std::string& extra) {
    std::string cmd = "python3 " REMORA_CHECK_SCRIPT " '" + d + "' " + extra + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return "popen failed";
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    int rc = pclose(p);
    return rc == 0 ? "" : (out.empty() ? "check_outputs.py failed" : out);
  }
  std::string dir_, out_;
};

TEST_F(DefaultToolTest, OneSessionWritesEveryOutput) {
  Workload w(dir_);
  w.start();
  ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "497"}}), 0);
  for (int i = 0; i < 75; ++i) {  // 1.5 s
    w.feed_pipe();
    sleep_ms(20);
  }
  ASSERT_EQ(detach(), 0);
  EXPECT_EQ(w.stop_and_check(), "");

  std::string d = tool().last_output;
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(fs::path(d).parent_path(), fs::path(out_));
  for (const char* f : {"trace.json", "folded.txt", "flamegraph.svg", "stats.csv", "summary.txt"})
    EXPECT_TRUE(fs::exists(fs::path(d) / f)) << f;
  EXPECT_EQ(
      check_outputs(d, "--expect-calls read,write,fsync,pthread_mutex_lock --expect-frame workload_hash"),
      "");

  std::string folded = read_file(fs::path(d) / "folded.txt");
  EXPECT_NE(folded.find("workload_hash"), std::string::npos);
  std::string summary = read_file(fs::path(d) / "summary.txt");
  EXPECT_NE(summary.find("workload_hash"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Slowest traced calls"), std::string::npos);
  std::string trace = read_file(fs::path(d) / "trace.json");
  EXPECT_NE(trace.find("\"wl-hash\""), std::string::npos) << "thread names in trace.json";
  bool latest = false;
  for (const auto& e : fs::directory_iterator(out_))
    if (e.is_symlink() && e.path().filename().string().ends_with("-latest"))
      latest = fs::equivalent(e.path(), d);
  EXPECT_TRUE(latest) << "<comm>-<pid>-latest points to the session directory";
}

TEST_F(DefaultToolTest, DetachRestoresGotSignalAndTimers) {
  auto dispositions = rt_dispositions();
  int timers = count_timers();
  Workload w(dir_);
  w.start();
  ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}}), 0);
  std::vector<SlotInfo> slots = patched_slots();
  ASSERT_FALSE(slots.empty());
  bool main_read = false;
  for (const auto& s : slots) {
    EXPECT_EQ(*s.slot, s.wrapper) << s.function << " in " << s.object;
    if (s.object == "[main]" && s.function == "read") main_read = true;
  }
  EXPECT_TRUE(main_read) << "the test's own call to read() is traced";
  int sig = tool().debug_signal();
  EXPECT_GE(sig, SIGRTMIN);
  EXPECT_LE(sig, SIGRTMAX);
  EXPECT_GT(count_timers(), timers) << "one timer per sampled thread";
  sleep_ms(300);
  ASSERT_EQ(detach(), 0);

  for (const auto& s : slots) {
    void* real = dlsym(RTLD_DEFAULT, s.function.c_str());
    if (s.original == real) {
      EXPECT_EQ(*s.slot, real) << s.function << " in " << s.object;
      continue;
    }
    // Lazy binding: the original was the object's own PLT stub. It is put
    // back, and the next call through it may already have resolved it to
    // the real function since; never to the wrapper.
    Dl_info a, b;
    ASSERT_NE(dladdr(s.original, &a), 0);
    ASSERT_NE(dladdr(reinterpret_cast<void*>(s.slot), &b), 0);
    EXPECT_EQ(a.dli_fbase, b.dli_fbase)
        << s.function << ": original neither the real function nor a local PLT stub";
    EXPECT_TRUE(*s.slot == s.original || *s.slot == real) << s.function << " in " << s.object;
  }
  EXPECT_EQ(rt_dispositions(), dispositions);
  EXPECT_EQ(count_timers(), timers);
  EXPECT_EQ(w.stop_and_check(), "");
}

std::atomic<int> g_app_signals{0};

TEST_F(DefaultToolTest, LeavesTheApplicationsSignalsAlone) {
  // The first signals the tool would pick: the application owns them.
  struct sigaction sa, old8, old9;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = [](int) { g_app_signals.fetch_add(1); };
  sigaction(SIGRTMIN + 8, &sa, &old8);
  sigaction(SIGRTMIN + 9, &sa, &old9);
  auto dispositions = rt_dispositions();

  ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}}), 0);
  int sig = tool().debug_signal();
  EXPECT_NE(sig, SIGRTMIN + 8);
  EXPECT_NE(sig, SIGRTMIN + 9);
  raise(SIGRTMIN + 8);
  EXPECT_EQ(g_app_signals.load(), 1);
  workload_spin_for_ms(100);
  ASSERT_EQ(detach(), 0);
  EXPECT_EQ(rt_dispositions(), dispositions);

  // A signal the application uses cannot be forced on the tool.
  EXPECT_NE(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_SIGNAL", std::to_string(SIGRTMIN + 8)}}),
            0);
  EXPECT_EQ(rt_dispositions(), dispositions);
  sigaction(SIGRTMIN + 8, &old8, nullptr);
  sigaction(SIGRTMIN + 9, &old9, nullptr);
}

TEST_F(DefaultToolTest, SamplesThreadsCreatedWhileAttached) {
  ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "997"}, {"REMORA_TRACING", "0"}}), 0);
  EXPECT_EQ(patched_slots().size(), 0u) << "REMORA_TRACING=0 patches nothing";
  std::thread late([] {
    pthread_setname_np(pthread_self(), "late-thread");
    workload_spin_for_ms(700);
  });
  late.join();
  ASSERT_EQ(detach(), 0);
  std::string d = tool().last_output;
  std::string folded = read_file(fs::path(d) / "folded.txt");
  EXPECT_NE(folded.find("workload_spin_for_ms"), std::string::npos) << folded.substr(0, 2000);
  // 700 ms of CPU time at 997 Hz: about 698 samples in workload_spin_for_ms
  // (timer overruns count: the kernel checks CPU timers once per tick).
  uint64_t spin = 0;
  std::istringstream lines(folded);
  for (std::string line; std::getline(lines, line);)
    if (line.find("workload_spin_for_ms") != std::string::npos)
      spin += std::stoull(line.substr(line.rfind(' ') + 1));
  EXPECT_GT(spin, 698u * 6 / 10) << "samples in the late thread";
  EXPECT_LT(spin, 698u * 14 / 10) << "samples in the late thread";
  std::string trace = read_file(fs::path(d) / "trace.json");
  EXPECT_NE(trace.find("late-thread"), std::string::npos);
}

TEST_F(DefaultToolTest, TracingOnlyCreatesNoTimer) {
  int timers = count_timers();
  auto dispositions = rt_dispositions();
  ASSERT_EQ(
      attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLING", "0"}, {"REMORA_TRACE_FUNCTIONS", "write"}}),
      0);
  EXPECT_EQ(count_timers(), timers);
  EXPECT_EQ(rt_dispositions(), dispositions);
  for (const auto& s : patched_slots()) EXPECT_EQ(s.function, "write");
  int fd = open((dir_ + "/x").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(write(fd, "abc", 3), 3);
  close(fd);
  ASSERT_EQ(detach(), 0);
  std::string stats = read_file(fs::path(tool().last_output) / "stats.csv");
  EXPECT_NE(stats.find("\ncall,write,"), std::string::npos) << stats;
  EXPECT_EQ(stats.find("\ncall,read,"), std::string::npos) << stats;
  EXPECT_EQ(stats.find("\nsample,"), std::string::npos) << stats;
}

TEST_F(DefaultToolTest, InvalidSettingsFailTheAttachCleanly) {
  int timers = count_timers();
  auto dispositions = rt_dispositions();
  EXPECT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "fast"}}), 10);
  EXPECT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLING", "maybe"}}), 10);
  EXPECT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "0"}}), 10);
  std::ofstream(dir_ + "/afile") << "x";
  EXPECT_EQ(attach({{"REMORA_OUTPUT_PATH", dir_ + "/afile/sub"}}), 11);
  EXPECT_EQ(count_timers(), timers);
  EXPECT_EQ(rt_dispositions(), dispositions);
  EXPECT_EQ(detach(), 13) << "nothing attached";
  // And the tool still attaches after the failures.
  ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}}), 0);
  ASSERT_EQ(detach(), 0);
}

TEST_F(DefaultToolTest, HundredCyclesKeepTheWorkloadCorrect) {
  int timers = count_timers();
  auto dispositions = rt_dispositions();
  Workload w(dir_);
  w.start();
  std::vector<std::string> dirs;
  for (int cycle = 0; cycle < 100; ++cycle) {
    ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "199"}}), 0) << cycle;
    for (int i = 0; i < 3; ++i) {
      w.feed_pipe();
      sleep_ms(15);
    }
    ASSERT_EQ(detach(), 0) << cycle;
    dirs.push_back(tool().last_output);
    EXPECT_EQ(count_timers(), timers) << cycle;
    w.feed_pipe();
    sleep_ms(5);
  }
  EXPECT_EQ(w.stop_and_check(), "");
  EXPECT_EQ(rt_dispositions(), dispositions);
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(std::unique(dirs.begin(), dirs.end()), dirs.end()) << "every session has its own directory";
  for (const auto& d : dirs) EXPECT_TRUE(fs::exists(fs::path(d) / "trace.json")) << d;
  EXPECT_EQ(check_outputs(dirs.back(), ""), "");
}

}  // namespace
