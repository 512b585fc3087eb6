// The default tool driven in-process, without the attach engine: the test
// dlopens libremora-tool.so the way the agent does, calls its entry points
// and runs a workload in its own threads, then checks what the user would
// see (the output files) and that the process is left as it was (GOT slots,
// signal dispositions, timers) and still computes correctly.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
#include "render.h"
#include "workload.h"

namespace fs = std::filesystem;

extern "C" void __cxa_finalize(void* dso_handle);

namespace {

using DebugSlotsFn = int (*)(void (*)(void*, void**, void*, void*, const char*, const char*), void*);

struct ToolHandle {
  void* handle = nullptr;
  remora_tool_configure_result_t* conf = nullptr;
  remora_tool_configure_attach_result_t* conf_attach = nullptr;
  DebugSlotsFn debug_slots = nullptr;
  int (*debug_signal)() = nullptr;
  int (*debug_thread_blocks)() = nullptr;
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
    h.debug_thread_blocks =
        reinterpret_cast<int (*)()>(dlsym(h.handle, "remora_default_tool_debug_thread_blocks"));
    h.last_output = static_cast<const char*>(dlsym(h.handle, "remora_default_tool_last_output"));
    if (!h.conf || !h.conf_attach || !h.debug_slots || !h.debug_signal || !h.debug_thread_blocks ||
        !h.last_output)
      abort();
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

// Descriptors of this process open on its own memory file (the tool reads
// its stack copies through one while attached).
int count_mem_fds() {
  int n = 0;
  std::string mem = "/proc/" + std::to_string(getpid()) + "/mem";
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec) == mem) ++n;
  }
  return n;
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

  std::string d = rendered(tool().last_output);
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
  EXPECT_EQ(count_mem_fds(), 1) << "the sampler's stack copies read /proc/self/mem";
  sleep_ms(300);
  ASSERT_EQ(detach(), 0);
  EXPECT_EQ(count_mem_fds(), 0) << "detach closes the tool's descriptor";

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
  std::string d = rendered(tool().last_output);
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
  std::string stats = read_file(fs::path(rendered(tool().last_output)) / "stats.csv");
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
  std::vector<std::string> dirs, shown;  // every session; those rendered
  for (int cycle = 0; cycle < 100; ++cycle) {
    ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "199"}}), 0) << cycle;
    for (int i = 0; i < 3; ++i) {
      w.feed_pipe();
      sleep_ms(15);
    }
    ASSERT_EQ(detach(), 0) << cycle;
    // Every session leaves its raw records; every tenth and the last are
    // rendered too (a render takes most of a cycle's time, and rendering
    // is the same code each time: the raw records are what cycles vary).
    EXPECT_TRUE(fs::exists(fs::path(tool().last_output) / "profile.remora")) << cycle;
    dirs.push_back(tool().last_output);
    if (cycle % 10 == 9) shown.push_back(rendered(tool().last_output));  // the last cycle's among them
    EXPECT_EQ(count_timers(), timers) << cycle;
    w.feed_pipe();
    sleep_ms(5);
  }
  EXPECT_EQ(w.stop_and_check(), "");
  EXPECT_EQ(rt_dispositions(), dispositions);
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(std::unique(dirs.begin(), dirs.end()), dirs.end()) << "every session has its own directory";
  for (const auto& d : shown) EXPECT_TRUE(fs::exists(fs::path(d) / "trace.json")) << d;
  EXPECT_EQ(check_outputs(shown.back(), ""), "");
}

// Each session sees threads of its own (fresh tids: the agent's listener of
// each attach, a pool's new workers), which hash to other slots than the last
// session's: their blocks (397 KB each) are taken from the idle slots, not
// mapped anew, so a process attached again and again does not grow.
// The tool's fork handlers, as the agent's unload takes them out
// (__cxa_finalize of remora_tool_quiesce's fork_key) and a tool the unload
// had to keep (pinned) is configured again: registered again, and never
// twice. Each fork() counts the prepare handler's runs.
TEST_F(DefaultToolTest, ForkHandlersTakenOutAreRegisteredAgainOnce) {
  ToolHandle& t = tool();
  auto prepares = reinterpret_cast<long (*)()>(dlsym(t.handle, "remora_default_tool_debug_fork_prepares"));
  auto configure = reinterpret_cast<remora_configure_fn>(dlsym(t.handle, "remora_configure"));
  auto quiesce = static_cast<const remora_tool_quiesce_t*>(dlsym(t.handle, "remora_tool_quiesce"));
  ASSERT_TRUE(prepares && configure && quiesce && quiesce->fork_key);
  remora_tool_info_t info{};
  info.size = sizeof info;
  info.abi_version = REMORA_TOOL_ABI_VERSION;
  info.tool_path = REMORA_TOOL_PATH;
  info.pid = getpid();
  // How many times one fork() runs the prepare handler.
  auto runs_per_fork = [&] {
    long before = prepares();
    pid_t child = fork();
    if (child == 0) _exit(0);
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    return prepares() - before;
  };
  EXPECT_EQ(runs_per_fork(), 1) << "registered by the first remora_configure";
  ASSERT_EQ(configure(REMORA_TOOL_ABI_VERSION, &info), t.conf);
  EXPECT_EQ(runs_per_fork(), 1) << "a second remora_configure registers nothing more";
  __cxa_finalize(quiesce->fork_key);  // the agent's unload
  EXPECT_EQ(runs_per_fork(), 0) << "taken out";
  for (int again = 0; again < 3; ++again) {
    ASSERT_EQ(configure(REMORA_TOOL_ABI_VERSION, &info), t.conf);  // the kept tool attached again
    EXPECT_EQ(runs_per_fork(), 1) << "registered again, once (round " << again << ")";
  }
}

TEST_F(DefaultToolTest, SessionsOfFreshThreadsReuseTheirBlocks) {
  int after_first = -1;
  for (int cycle = 0; cycle < 30; ++cycle) {
    ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_}, {"REMORA_SAMPLE_HZ", "199"}}), 0) << cycle;
    // Four fresh threads, each claiming its slot with a traced call, alive
    // together so that the session needs four blocks at once.
    std::atomic<int> claimed{0};
    std::atomic<bool> done{false};
    std::vector<std::thread> fresh;
    for (int i = 0; i < 4; ++i)
      fresh.emplace_back([&] {
        int fds[2];
        if (pipe(fds) == 0) {  // a traced call (write) claims the thread's slot
          const char b = 1;
          if (write(fds[1], &b, 1) != 1) std::abort();
          close(fds[0]);
          close(fds[1]);
        }
        claimed.fetch_add(1);
        while (!done.load()) sleep_ms(1);
      });
    for (int waited = 0; claimed.load() < 4 && waited < 10000; ++waited) sleep_ms(1);
    done.store(true);
    for (auto& t : fresh) t.join();
    ASSERT_EQ(detach(), 0) << cycle;
    if (cycle == 0) after_first = tool().debug_thread_blocks();
  }
  const int now = tool().debug_thread_blocks();
  std::printf("[slots] thread blocks: %d after the first session, %d after 30\n", after_first, now);
  // Each session may need a few more than the first (the collector's
  // scan, a sampled thread the first one never saw), never one per thread
  // and session (120 fresh threads here).
  EXPECT_LE(now, after_first + 8);
}

// ---- hostile stacks: what a JIT, a sandbox or a runtime does to a thread ----

// Machine code without unwind information, as a JIT emits it: spins `n`
// times (rdi) with rbp holding garbage, and returns 0. Variant "constant":
// rbp = a non-canonical address; variant "chain": rbp points at two garbage
// words on the stack, a frame-pointer chain that leads nowhere.
std::vector<unsigned char> spin_code(bool chain) {
  std::vector<unsigned char> c = {0x55};  // push rbp
  if (!chain) {
    c.insert(c.end(), {0x48, 0xbd, 0xbe, 0xba, 0xfe, 0xca, 0xef, 0xbe, 0xad, 0xde});  // movabs rbp, imm64
  } else {
    c.insert(c.end(), {0x48, 0xb8, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41});  // movabs rax, imm64
    c.insert(c.end(), {0x50, 0x50, 0x48, 0x89, 0xe5});  // push rax; push rax; mov rbp, rsp
  }
  c.insert(c.end(), {0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb});  // mov rax, rdi; 1: dec rax; jnz 1b
  if (chain) c.insert(c.end(), {0x48, 0x83, 0xc4, 0x10});               // add rsp, 16
  c.insert(c.end(), {0x5d, 0xc3});                                      // pop rbp; ret
  return c;
}

using SpinFn = uint64_t (*)(uint64_t);

struct Hostile {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> wrong{0};  // a computation that went wrong
  std::atomic<uint64_t> rounds{0};
};

// Code mapped, run and unmapped again and again: anonymous (a JIT's code
// cache) or from a memfd (a file-backed mapping the unwinder may read).
void jit_thread(Hostile* h, bool chain, bool file_backed) {
  pthread_setname_np(pthread_self(), file_backed ? "h-memfd" : (chain ? "h-fpchain" : "h-nocfi"));
  std::vector<unsigned char> code = spin_code(chain);
  int fd = -1;
  if (file_backed) {
    fd = memfd_create("remora-test-code", MFD_CLOEXEC);
    if (fd < 0 || write(fd, code.data(), code.size()) != static_cast<ssize_t>(code.size())) {
      h->wrong.fetch_add(1);
      return;
    }
  }
  while (!h->stop.load()) {
    void* p = file_backed ? mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0)
                          : mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      h->wrong.fetch_add(1);
      break;
    }
    if (!file_backed) {
      memcpy(p, code.data(), code.size());
      mprotect(p, 4096, PROT_READ | PROT_EXEC);
    }
    if (reinterpret_cast<SpinFn>(p)(2000000) != 0) h->wrong.fetch_add(1);
    munmap(p, 4096);  // while samples of it may still wait in the ring
    h->rounds.fetch_add(1);
  }
  if (fd >= 0) close(fd);
}

thread_local Hostile* t_hostile = nullptr;

// A thread whose CPU time is spent in a signal handler on its sigaltstack.
void altstack_thread(Hostile* h) {
  pthread_setname_np(pthread_self(), "h-altstack");
  std::vector<char> alt(64 * 1024);
  stack_t ss = {};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  if (sigaltstack(&ss, nullptr) != 0) {
    h->wrong.fetch_add(1);
    return;
  }
  t_hostile = h;
  while (!h->stop.load()) pthread_kill(pthread_self(), SIGUSR2);
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
}

void altstack_handler(int) {
  int on_alt = 0;
  stack_t cur;
  if (sigaltstack(nullptr, &cur) == 0) on_alt = cur.ss_flags & SS_ONSTACK;
  if (!on_alt && t_hostile != nullptr) t_hostile->wrong.fetch_add(1);
  workload_spin_for_ms(3);
  if (t_hostile != nullptr) t_hostile->rounds.fetch_add(1);
}

uint64_t recurse(int depth) {
  volatile unsigned char pad[128];
  for (auto& b : pad) b = static_cast<unsigned char>(depth);
  return depth == 0 ? pad[0] : recurse(depth - 1) + pad[7];
}

void* tiny_stack_main(void* arg) {
  auto* h = static_cast<Hostile*>(arg);
  pthread_setname_np(pthread_self(), "h-tinystack");
  while (!h->stop.load()) {
    if (recurse(12) != 12u * 13 / 2) h->wrong.fetch_add(1);
    workload_spin_for_ms(2);
    h->rounds.fetch_add(1);
  }
  return nullptr;
}

void churn_thread(Hostile* h) {
  while (!h->stop.load()) {
    std::thread t([] {
      pthread_setname_np(pthread_self(), "h-churn");
      workload_spin_for_ms(40);  // long enough for some to be seen by a thread scan (100 ms)
    });
    t.join();
    h->rounds.fetch_add(1);
  }
}

// Samples per thread name in a folded file written with REMORA_FOLD_THREADS=1.
std::map<std::string, uint64_t> samples_by_thread(const std::string& folded) {
  std::map<std::string, uint64_t> out;
  std::istringstream lines(folded);
  for (std::string line; std::getline(lines, line);) {
    std::string thread = line.substr(0, line.find(';'));
    thread = thread.substr(0, thread.rfind('-'));
    out[thread] += std::stoull(line.substr(line.rfind(' ') + 1));
  }
  return out;
}

TEST_F(DefaultToolTest, HostileStacksNeverCrashTheProcess) {
  struct sigaction sa, old_usr2;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = altstack_handler;
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGUSR2, &sa, &old_usr2);

  Hostile nocfi, chain, memfd, alt, tiny, churn;
  ASSERT_EQ(attach({{"REMORA_OUTPUT_PATH", out_},
                    {"REMORA_SAMPLE_HZ", "997"},
                    {"REMORA_TRACING", "0"},
                    {"REMORA_FOLD_THREADS", "1"}}),
            0);
  std::vector<std::thread> threads;
  threads.emplace_back(jit_thread, &nocfi, false, false);
  threads.emplace_back(jit_thread, &chain, true, false);
  threads.emplace_back(jit_thread, &memfd, false, true);
  threads.emplace_back(altstack_thread, &alt);
  threads.emplace_back(churn_thread, &churn);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 16 * 1024), 0);
  pthread_t tiny_thread;
  ASSERT_EQ(pthread_create(&tiny_thread, &attr, tiny_stack_main, &tiny), 0);
  pthread_attr_destroy(&attr);
  sleep_ms(1500);
  for (Hostile* h : {&nocfi, &chain, &memfd, &alt, &tiny, &churn}) h->stop.store(true);
  for (auto& t : threads) t.join();
  pthread_join(tiny_thread, nullptr);
  ASSERT_EQ(detach(), 0);
  sigaction(SIGUSR2, &old_usr2, nullptr);

  const char* names[] = {"h-nocfi", "h-fpchain", "h-memfd", "h-altstack", "h-tinystack", "h-churn"};
  Hostile* all[] = {&nocfi, &chain, &memfd, &alt, &tiny, &churn};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(all[i]->wrong.load(), 0u) << names[i] << " computed wrongly";
    EXPECT_GT(all[i]->rounds.load(), 0u) << names[i] << " made no progress";
  }
  std::string d = rendered(tool().last_output);
  auto by_thread = samples_by_thread(read_file(fs::path(d) / "folded.txt"));
  for (const char* n : names) EXPECT_GT(by_thread[n], 0u) << "samples of " << n;
  // The altstack thread's samples inside its handler reach back through the
  // signal frame to the thread's own loop.
  std::string folded = read_file(fs::path(d) / "folded.txt");
  EXPECT_NE(folded.find("workload_spin_for_ms"), std::string::npos);
  EXPECT_EQ(check_outputs(d, ""), "");
}

}  // namespace
