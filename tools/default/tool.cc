// libremora-tool.so — Remora's default tool: CPU sampling of every thread
// and tracing of blocking calls, handed to the controller as raw records
// (raw_records.h), from which remora renders a Perfetto trace, a pprof
// profile, a flame graph and more (src/profile). docs/tool.md is the user's
// guide.
//
// Threads (remora/tool.h): tool_attach and tool_detach run on the agent's
// listener thread (tool_detach may also run on the thread calling exit(), or
// on the agent's lease thread when a controller died); tool_fini on the
// exiting thread. While attached, one tool thread ("remora-tool", every
// signal blocked) wakes every 100 ms (more often at high sampling rates) to
// pick up new threads, drain the per-thread buffers and unwind the captured
// samples (sampler.cc says why they are unwound there, not in the
// handler). Why a /proc/self/task rescan rather than a hook on thread
// creation: a hook (patching pthread_create) misses threads created by
// clone() or by objects we do not patch, and a new thread only matters once
// it has used CPU time anyway; a rescan of a directory every 100 ms costs
// microseconds and sees every thread of the process.
#include "remora/tool.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "config.h"
#include "own_memory.h"
#include "profile.h"
#include "program_name.h"
#include "raw_records.h"
#include "sampler.h"
#include "slots.h"
#include "tracer.h"
#include "unwind.h"
#include "wrappers.h"

#define REMORA_TOOL_EXPORT extern "C" __attribute__((visibility("default")))

// The directory of the last session's output, readable by a controller in
// the target's memory (and by tests through remora_default_tool_last_output).
extern "C" {
__attribute__((visibility("default"))) char remora_default_tool_last_output[4096] = "";
}

// glibc's (GLIBC_2.3.2, GLIBC_2.2.5): see g_fork_key.
extern "C" int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void),
                                 void* dso_handle);
extern "C" void __cxa_finalize(void* dso_handle);
extern "C" int __cxa_atexit(void (*fn)(void*), void* arg, void* dso_handle);

namespace remora_tool {
namespace {

// Return values of tool_attach / tool_detach (docs/tool.md).
enum : int {
  kErrConfig = 10,      // an environment variable has an invalid value
  kErrOutputPath = 11,  // REMORA_OUTPUT_PATH cannot be created
  kErrSampling = 12,    // no signal for sampling
  kErrState = 13,       // attach while attached / detach while detached
  kErrWrite = 14,       // an output file could not be written
};

struct Tool {
  std::mutex mu;  // state below, between the collector and attach/detach/fork
  bool attached = false;
  bool collector_running = false;
  bool collector_detached = false;  // left running at process exit, never joined
  bool in_fork_child = false;
  pthread_t collector{};
  // The collector runs on a stack of our own, unmapped once it is joined:
  // glibc would keep a stack of its own making in its cache for good, one
  // mapping more in the process after an unload.
  void* collector_stack = nullptr;
  int32_t collector_tid = 0;
  int wake_fd = -1;
  std::atomic<bool> stop{false};
  Config cfg;
  Sampler sampler;
  Tracer tracer;
  Profile profile;
  // The session's directory (made at attach; "" in a forked child until its
  // detach) and its timeline events, spooled there by the collector.
  std::string session_dir;
  RawSpool spool;
  uint64_t events = 0;    // samples and calls spooled (REMORA_MAX_EVENTS caps them)
  uint64_t counters = 0;  // counter values spooled
  std::unordered_map<std::string, uint32_t> stack_ids;
  std::unordered_set<int32_t> live;  // threads seen alive at the last scan
  unsigned tick = 0;                 // thread scans this session
  uint64_t next_scan_ns = 0;
  MapsSnapshot maps;  // refreshed at each thread scan
  uint64_t maps_seen = 0;
  // Stacks learnt, by tid, kept across sessions: a running thread's stack
  // is otherwise only learnt from its first sample, which a short session
  // would lose. Checked against the maps before use; dead threads pruned.
  std::unordered_map<int32_t, std::pair<uint64_t, uint64_t>> known_stacks;
  Unwinder unwinder;
};

// Created in remora_configure; freed by tool_fini once no thread can be in
// the tool's code any more (release_for_unload).
Tool* g_tool = nullptr;
// Held by a fork from its prepare handler to its parent or child handler,
// and by release_for_unload while it takes g_tool away: a fork that read
// g_tool never locks or unlocks a Tool that was deleted meanwhile. Static:
// it lives as long as the handlers, which the dlclose removes.
pthread_mutex_t g_fork_mu = PTHREAD_MUTEX_INITIALIZER;
// 1 once release_for_unload kept the tool mapped (RTLD_NODELETE): threads
// were still inside. Read by the agent through remora_tool_quiesce.
int32_t g_pinned = 0;
// The key our fork handlers are registered under (remora_configure).
char g_fork_key;
// 1 while our fork handlers are in glibc's list. Whoever takes them out
// (__cxa_finalize(&g_fork_key): the agent's unload, our destructor, exit)
// also runs the exit function registered beside them under the same key,
// which clears it: a tool the unload had to keep (pinned) registers them
// again at its next remora_configure, once.
int g_fork_registered = 0;
// fork()s that ran our prepare handler (tests: remora_default_tool_debug_fork_prepares).
long g_fork_prepares = 0;

void forget_fork_handlers(void*) { __atomic_store_n(&g_fork_registered, 0, __ATOMIC_RELEASE); }

constexpr size_t kCollectorStack = 256 * 1024;

// Descriptors that libunwind opened for itself while the Tool was made (its
// memory-validation pipe, opened once per process by its first address
// space): closed at tool_fini, since libunwind leaves with us and has no
// destructor that would close them.
struct OwnedFd {
  int fd;
  dev_t dev;
  ino_t ino;
};
OwnedFd g_unwind_fds[4];
int g_unwind_fd_count = 0;

void log_error(const std::string& msg) {
  // The target's stderr is the only channel a failed attach has besides its
  // return value; say what to change.
  std::string line = "remora-tool: " + msg + "\n";
  (void)!write(2, line.data(), line.size());
}

struct IgnoreScope {
  // Nothing the tool itself does on this thread is recorded while in scope.
  IgnoreScope() { set_thread_ignored(true); }
  ~IgnoreScope() { set_thread_ignored(false); }
};

std::string read_small_file(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return "";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string thread_name(int32_t tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/comm", tid);
  return read_small_file(path);
}

std::vector<int32_t> list_threads() {
  std::vector<int32_t> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    out.push_back(static_cast<int32_t>(atoi(e->d_name)));
  }
  closedir(d);
  return out;
}

void set_stack(Slot& s, uint64_t lo, uint64_t hi) {
  // hi = 0 first: a handler in between sees "unknown" and copies nothing.
  s.stack_hi.store(0, std::memory_order_release);
  s.stack_lo.store(lo, std::memory_order_release);
  s.stack_hi.store(hi, std::memory_order_release);
}

// The sp of a thread blocked in the kernel, from /proc/self/task/TID/syscall
// ("nr args... sp pc", or "-1 sp pc"; "running" for a running thread, which
// then learns its stack from its first sample instead). pthread_getattr_np
// only knows the calling thread's and glibc's own threads' stacks.
bool blocked_sp(int32_t tid, uint64_t* sp) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
  std::string line = read_small_file(path);
  size_t last = line.rfind(' ');
  if (line.empty() || line[0] == 'r' || last == std::string::npos || last == 0) return false;
  size_t prev = line.rfind(' ', last - 1);
  std::string word = line.substr(prev == std::string::npos ? 0 : prev + 1, last - prev - 1);
  if (word.rfind("0x", 0) != 0) return false;
  *sp = strtoull(word.c_str() + 2, nullptr, 16);
  return *sp != 0;
}

// Under t.mu. Caches the bounds of the stack that `sp` is on in the slot
// (0: find it: the main thread's [stack], a blocked thread's sp, or the
// stack an earlier session learnt, if it is still mapped).
void learn_stack(Tool& t, Slot& s, int32_t tid, uint64_t sp) {
  if (sp == 0 && tid == t.profile.pid) {
    const Mapping* m = t.maps.main_stack();
    if (m != nullptr) sp = m->end - 1;
  }
  auto known = t.known_stacks.find(tid);
  if (sp == 0 && !blocked_sp(tid, &sp) && known != t.known_stacks.end()) sp = known->second.second - 1;
  if (sp == 0) return;
  uint64_t lo = 0, hi = 0;
  if (t.maps.stack_bounds(sp, &lo, &hi)) {
    set_stack(s, lo, hi);
    t.known_stacks[tid] = {lo, hi};
  } else {
    set_stack(s, 0, 0);
    if (known != t.known_stacks.end()) t.known_stacks.erase(known);
  }
}

// Under t.mu. Reads /proc/self/maps again for the unwinder.
void refresh_maps(Tool& t) {
  t.maps.refresh();
  if (t.maps.version() != t.maps_seen) {
    // An object may have been unloaded and another loaded at its address:
    // forget the unwind information and image pages read from the old one.
    t.unwinder.flush();
    t.maps_seen = t.maps.version();
  }
}

// The CPU-time clock of thread `tid` of this process (the kernel's
// encoding of a thread's CPUCLOCK_SCHED clock id, as pthread_getcpuclockid
// makes it for a pthread_t).
clockid_t thread_cpu_clock(int32_t tid) {
  return static_cast<clockid_t>((~static_cast<unsigned>(tid) << 3) | 6u);
}

// CLOCK_REALTIME - CLOCK_MONOTONIC now: turns the session's monotonic times
// into wall-clock ones (pprof's time_nanos), whenever it is rendered.
int64_t realtime_offset_ns() {
  timespec rt, mono;
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<int64_t>(rt.tv_sec) - mono.tv_sec) * 1000000000 + (rt.tv_nsec - mono.tv_nsec);
}

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Under t.mu. One sample of the counters: the process's RSS and each live
// thread's CPU time (a clock read per thread: microseconds per scan).
void sample_counters(Tool& t) {
  constexpr size_t kMaxCounters = 200000;
  if (t.counters + t.live.size() + 1 > kMaxCounters) return;
  const uint64_t now = now_ns();
  std::string statm = read_small_file("/proc/self/statm");
  size_t sp = statm.find(' ');
  if (sp != std::string::npos) {
    uint64_t pages = strtoull(statm.c_str() + sp + 1, nullptr, 10);
    t.spool.counter({kCounterRssBytes, 0, now, pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE))});
    ++t.counters;
  }
  for (int32_t tid : t.live) {
    timespec ts;
    if (clock_gettime(thread_cpu_clock(tid), &ts) != 0) continue;
    t.spool.counter({kCounterThreadCpuNs, tid, now,
                     static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec)});
    ++t.counters;
  }
}

// Under t.mu. Registers new threads (slot, timer, name, stack), forgets dead
// ones; refreshes the maps snapshot the unwinder reads through.
void scan_threads(Tool& t, bool refresh_names) {
  uint32_t gen = g_gen.load(std::memory_order_acquire);
  refresh_maps(t);
  own_memory_check();
  std::unordered_set<int32_t> now;
  for (int32_t tid : list_threads()) {
    if (tid == t.collector_tid) continue;
    now.insert(tid);
    bool is_new = t.live.count(tid) == 0;
    if (is_new || refresh_names) {
      std::string name = thread_name(tid);
      if (!name.empty()) t.profile.threads[tid] = name;
    }
    if (!is_new && (!t.cfg.sampling || t.sampler.has_thread(tid))) continue;
    int slot = claim_slot(tid, gen);
    if (slot >= 0 && t.cfg.sampling && t.sampler.running()) {
      Slot& s = g_slots[slot];
      if (s.stack_hi.load(std::memory_order_relaxed) == 0) learn_stack(t, s, tid, 0);
      t.sampler.add_thread(tid, static_cast<uint32_t>(slot), gen);
    }
  }
  for (int32_t tid : t.live)
    if (now.count(tid) == 0) t.sampler.remove_thread(tid);
  std::erase_if(t.known_stacks, [&](const auto& kv) { return now.count(kv.first) == 0; });
  t.live = std::move(now);
  sample_counters(t);
}

uint32_t intern_stack(Tool& t, const uint64_t* pcs, uint32_t n) {
  std::string key(reinterpret_cast<const char*>(pcs), n * sizeof(uint64_t));
  auto [it, inserted] =
      t.stack_ids.emplace(std::move(key), static_cast<uint32_t>(t.profile.raw_stacks.size()));
  if (inserted) t.profile.raw_stacks.emplace_back(pcs, pcs + n);
  return it->second;
}

void note_slow_call(Profile& p, const CallEvent& c) {
  auto& v = p.slowest_calls;
  if (v.size() == 10 && v.back().dur_ns >= c.dur_ns) return;
  auto pos = std::upper_bound(v.begin(), v.end(), c,
                              [](const CallEvent& a, const CallEvent& b) { return a.dur_ns > b.dur_ns; });
  v.insert(pos, c);
  if (v.size() > 10) v.pop_back();
}

// Under t.mu. A sample without a stack copy: its sp was outside the cached
// bounds (or none were known). Learn the stack it is on, so that the next
// samples there are copied; a thread that moves between stacks (a fiber, an
// alternate signal stack) loses the copy of one sample per move.
void relearn_stack(Tool& t, Slot& s, int32_t tid, const SampleRec& r) {
  uint64_t sp = r.regs[kRegSp];
  uint64_t lo = s.stack_lo.load(std::memory_order_relaxed), hi = s.stack_hi.load(std::memory_order_relaxed);
  if (r.stack_len == 0 && (hi == 0 || sp < lo || sp >= hi)) learn_stack(t, s, tid, sp);
}

// Under t.mu. Moves every committed record of every slot into the profile,
// unwinding the captured samples.
void drain(Tool& t) {
  Profile& p = t.profile;
  uint64_t pcs[kMaxFrames];
  for (Slot& s : g_slots) {
    int32_t tid = s.tid.load(std::memory_order_acquire);
    if (tid == 0 || !s.ready.load(std::memory_order_acquire)) continue;
    SlotMem* m = s.mem;
    uint64_t tail = m->sample_tail.load(std::memory_order_relaxed);
    uint64_t head = m->sample_head.load(std::memory_order_acquire);
    for (; tail < head; ++tail) {
      SampleRec& r = m->samples[tail % kSampleRingSize];
      if (r.seq.load(std::memory_order_acquire) != tail + 1) break;
      relearn_stack(t, s, tid, r);
      uint32_t n = t.unwinder.unwind(r, t.maps, pcs, kMaxFrames);
      uint32_t id = intern_stack(t, pcs, n);
      p.stack_weights[{tid, id}] += r.weight;
      p.samples_total += r.weight;
      if (t.events < t.cfg.max_events) {
        t.spool.sample({tid, r.weight, id, r.ts_ns});
        ++t.events;
      } else {
        ++p.events_capped;
      }
    }
    m->sample_tail.store(tail, std::memory_order_release);

    tail = m->call_tail.load(std::memory_order_relaxed);
    head = m->call_head.load(std::memory_order_acquire);
    for (; tail < head; ++tail) {
      CallRec& r = m->calls[tail % kCallRingSize];
      if (r.seq.load(std::memory_order_acquire) != tail + 1) break;
      CallEvent c{tid, r.fn, r.start_ns, r.dur_ns};
      note_slow_call(p, c);
      if (t.events < t.cfg.max_events) {
        t.spool.call(c);
        ++t.events;
      } else {
        ++p.events_capped;
      }
    }
    m->call_tail.store(tail, std::memory_order_release);
  }
}

void* collector_main(void* arg) {
  Tool& t = *static_cast<Tool*>(arg);
  set_thread_ignored(true);
  __atomic_store_n(&t.collector_tid, static_cast<int32_t>(syscall(SYS_gettid)), __ATOMIC_RELEASE);
  pthread_setname_np(pthread_self(), "remora-tool");
  // Drain before a ring can fill: a ring holds kSampleRingSize samples, so
  // at high rates wake more often than the 100 ms of a thread scan.
  int hz = t.cfg.hz > 0 ? t.cfg.hz : 1;
  int period_ms =
      std::clamp(static_cast<int>(kSampleRingSize * 1000 / (2 * static_cast<uint32_t>(hz))), 5, 100);
  for (;;) {
    pollfd pfd = {t.wake_fd, POLLIN, 0};
    poll(&pfd, 1, period_ms);
    if (t.stop.load(std::memory_order_acquire)) break;
    std::lock_guard<std::mutex> lock(t.mu);
    if (t.stop.load(std::memory_order_acquire) || !t.attached) break;
    uint64_t now = now_ns();
    if (now >= t.next_scan_ns) {
      t.next_scan_ns = now + 100000000ull;
      ++t.tick;
      scan_threads(t, t.tick % 10 == 0);
    }
    drain(t);
    t.spool.flush();  // this tick's events, off to the file: the detach writes only the rest
    // Objects loaded by dlopen while attached get their slots patched too.
    if (t.cfg.tracing && t.tracer.objects_changed())
      t.profile.patched_slots += static_cast<uint32_t>(t.tracer.patch(&t.profile.warnings));
    if (t.cfg.tracing) (void)t.tracer.heal(now_ns());
  }
  return nullptr;
}

bool start_collector(Tool& t) {
  t.stop.store(false);
  t.collector_tid = 0;
  if (t.wake_fd < 0) t.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  // Consume a wake-up left by the previous session's stop: a readable
  // eventfd would make the new collector's poll() return at once, forever.
  uint64_t stale = 0;
  (void)!read(t.wake_fd, &stale, sizeof stale);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the thread inherits "everything blocked"
  if (t.collector_stack == nullptr) {
    void* p = mmap(nullptr, kCollectorStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK,
                   -1, 0);
    t.collector_stack = p == MAP_FAILED ? nullptr : p;
  }
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (t.collector_stack != nullptr)
    pthread_attr_setstack(&attr, t.collector_stack, kCollectorStack);
  else
    pthread_attr_setstacksize(&attr, kCollectorStack);
  int rc = pthread_create(&t.collector, &attr, collector_main, &t);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  t.collector_running = rc == 0;
  return rc == 0;
}

void stop_collector(Tool& t, bool join) {
  if (!t.collector_running) return;
  t.stop.store(true, std::memory_order_release);
  uint64_t one = 1;
  (void)!write(t.wake_fd, &one, sizeof one);
  if (join) {
    pthread_join(t.collector, nullptr);
    // The thread is gone (pthread_join waits for the kernel's clear of its
    // tid): nobody runs on its stack any more.
    if (t.collector_stack != nullptr) munmap(t.collector_stack, kCollectorStack);
    t.collector_stack = nullptr;
  } else {
    pthread_detach(t.collector);
    t.collector_detached = true;  // may still run: nothing it uses can be freed (release_for_unload)
  }
  t.collector_running = false;
}

// Keeps the tool mapped for the rest of the process: only where a thread may
// still be in its code when the agent dlcloses it (release_for_unload).
void pin_self() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&pin_self), &info) != 0 && info.dli_fname != nullptr)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

bool make_dirs(const std::string& path, std::string* error) {
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    cur = path.substr(0, slash);
    pos = slash + 1;
    if (cur.empty() || cur == "." || cur == "..") continue;
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "cannot create " + cur + ": " + strerror(errno);
      return false;
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    *error = path + " is not a directory";
    return false;
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    *error = "cannot write into " + path + ": " + strerror(errno);
    return false;
  }
  return true;
}

std::string safe_comm(const std::string& comm) {
  std::string s = comm.empty() ? "process" : comm;
  for (char& c : s)
    if (c == '/' || c == ' ' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
      c = '_';
  return s;
}

// A new directory for this process and session; never an existing one.
// With an output descriptor only its name (nothing is made).
std::string make_session_dir(const Profile& p, const std::string& root, std::string* error,
                             bool name_only = false) {
  if (!name_only && !make_dirs(root, error)) return "";
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::string base = root + "/" + safe_comm(p.comm) + "-" + std::to_string(p.pid) + "-s" +
                     std::to_string(p.session) + "-" + stamp;
  if (name_only) return base;
  for (int i = 1; i < 1000; ++i) {
    std::string dir = i == 1 ? base : base + "-" + std::to_string(i);
    if (mkdir(dir.c_str(), 0755) == 0) return dir;
    if (errno != EEXIST) {
      *error = "cannot create " + dir + ": " + strerror(errno);
      return "";
    }
  }
  *error = "too many output directories named " + base;
  return "";
}

// Hands the finished session to the controller: its raw records, in the
// session's directory (the controller names the addresses and renders every
// output, src/profile). The timeline is on file already (the spool); the
// detach adds the stacks, statistics and code map.
int write_outputs(Tool& t, uint64_t detach_cpu_start) {
  Profile& p = t.profile;
  std::string error;
  std::string dir = t.session_dir;
  if (dir.empty() && t.cfg.output_fd >= 0)  // a forked child: the descriptor was the parent's
    error = "a process forked during a session written into memory has no output of its own";
  else if (dir.empty())
    dir = make_session_dir(p, t.cfg.output_path, &error);
  t.session_dir.clear();
  if (dir.empty()) {
    t.spool.discard();
    log_error("detach: " + error + " (REMORA_OUTPUT_PATH=" + t.cfg.output_path + ")");
    return kErrWrite;
  }
  bool ok = t.spool.finish(dir, encode_raw_records(p, capture_raw_context()), detach_cpu_start, &error);
  snprintf(remora_default_tool_last_output, sizeof remora_default_tool_last_output, "%s", dir.c_str());
  // <comm>-<pid>-latest -> the newest session directory of this process.
  std::string link = t.cfg.output_path + "/" + safe_comm(p.comm) + "-" + std::to_string(p.pid) + "-latest";
  std::string tmp = link + ".tmp";
  if (t.cfg.output_fd < 0) {  // in memory: no directory to link in
    unlink(tmp.c_str());
    if (symlink(dir.substr(dir.rfind('/') + 1).c_str(), tmp.c_str()) == 0) rename(tmp.c_str(), link.c_str());
  }
  if (!ok) {
    log_error("detach: " + error);
    return kErrWrite;
  }
  return 0;
}

int do_detach(Tool& t, bool join) {
  IgnoreScope ignore;
  const uint64_t cpu_start = thread_cpu_ns();
  std::unique_lock<std::mutex> lock(t.mu);
  if (!t.attached) return kErrState;
  // The collector takes t.mu: let it go first.
  lock.unlock();
  stop_collector(t, join);
  lock.lock();
  // Order matters: no new samples (timers gone, pending signals discarded,
  // disposition restored), no new calls (GOT restored), then wait for the
  // records in flight, then read everything.
  t.sampler.stop();
  if (t.cfg.tracing) t.tracer.restore(&t.profile.warnings);
  session_stop_and_quiesce();
  t.profile.end_ns = now_ns();
  refresh_maps(t);
  for (int32_t tid : list_threads()) {
    std::string name = thread_name(tid);
    if (!name.empty() && tid != t.collector_tid) t.profile.threads[tid] = name;
  }
  sample_counters(t);  // the session's last values
  drain(t);
  own_memory_close();  // the last reads of this session are done
  // Per-function totals: every call, including those the rings dropped.
  std::unordered_map<std::string, FuncStat> stats;
  for (Slot& s : g_slots) {
    if (s.tid.load() == 0 || !s.ready.load()) continue;
    t.profile.samples_dropped += s.mem->samples_dropped.load();
    t.profile.calls_dropped += s.mem->calls_dropped.load();
    for (uint32_t fn = 0; fn < remora_fn_count && fn < kMaxFuncs; ++fn) {
      const FuncCounters& c = s.mem->funcs[fn];
      uint64_t calls = c.calls.load(std::memory_order_relaxed);
      if (calls == 0) continue;
      FuncStat& f = stats[remora_fn_table[fn].reported_as];
      f.name = remora_fn_table[fn].reported_as;
      f.calls += calls;
      f.total_ns += c.total_ns.load(std::memory_order_relaxed);
      f.max_ns = std::max(f.max_ns, c.max_ns.load(std::memory_order_relaxed));
    }
  }
  for (auto& [_, f] : stats) t.profile.func_stats.push_back(f);
  // Threads that never recorded anything and are gone have no name: drop
  // nothing, the timeline only shows tracks with events.
  t.attached = false;
  int rc = write_outputs(t, cpu_start);
  // Free the session's bulk data; the profile shell stays for the next one.
  t.profile.samples.clear();
  t.profile.samples.shrink_to_fit();
  t.profile.calls.clear();
  t.profile.calls.shrink_to_fit();
  t.profile.raw_stacks.clear();
  t.profile.stack_weights.clear();
  t.profile.counters.clear();
  t.profile.counters.shrink_to_fit();
  t.stack_ids.clear();
  return rc;
}

int tool_init(void*) { return 0; }

// The fds libunwind opens for itself while the Tool (its Unwinder) is made:
// the descriptors that appear meanwhile and are pipes.
bool fd_identity(int fd, dev_t* dev, ino_t* ino, bool* fifo) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  *fifo = S_ISFIFO(st.st_mode);
  return true;
}

std::vector<int32_t> open_fds() {
  std::vector<int32_t> out;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return out;
  const int own = dirfd(d);  // the listing's own descriptor, gone after it
  while (dirent* e = readdir(d))
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && atoi(e->d_name) != own) out.push_back(atoi(e->d_name));
  closedir(d);
  return out;
}

void note_new_pipes(const std::vector<int32_t>& before) {
  for (int fd : open_fds()) {
    if (std::find(before.begin(), before.end(), fd) != before.end()) continue;
    OwnedFd o{fd, 0, 0};
    bool fifo = false;
    if (g_unwind_fd_count < 4 && fd_identity(fd, &o.dev, &o.ino, &fifo) && fifo)
      g_unwind_fds[g_unwind_fd_count++] = o;
  }
}

void close_unwind_fds() {
  for (int i = 0; i < g_unwind_fd_count; ++i) {
    dev_t dev;
    ino_t ino;
    bool fifo;
    // Only if the number is still libunwind's pipe.
    if (fd_identity(g_unwind_fds[i].fd, &dev, &ino, &fifo) && dev == g_unwind_fds[i].dev &&
        ino == g_unwind_fds[i].ino)
      close(g_unwind_fds[i].fd);
  }
  g_unwind_fd_count = 0;
}

// Gives back what the tool holds in the process (descriptors, the heap it
// uses; the slots' memory later, in remora_tool_release), so that the
// agent's dlclose leaves nothing behind; or, where a thread may still be in
// the tool's code, keeps the tool mapped instead (g_pinned). The wait here
// is only the fast way out: a count of zero read by this thread proves
// nothing about a thread preempted between its handler's entry and its
// increment, so the controller proves it again with every thread stopped
// (remora_tool_quiesce, docs/architecture.md "The unload"). Code of ours a thread can still be in after a
// detach: a wrapper (a thread blocked in read() returns into it), the sampling handler (a signal delivered
// just before the timers went); both count themselves (remora_inside). A short wait lets calls about to
// return return; a thread blocked for longer keeps the tool (the agent then names it as kept). At process
// exit it waits as long, and only where a thread is inside.
void release_for_unload(Tool& t) {
  if (t.collector_detached) return;  // process exit with the collector running: it uses everything
  // A second: a call in flight at the detach (a read fed every few
  // milliseconds, a short sleep) returns well within it, on a loaded
  // machine too; the agent's unload allows 10 s per step.
  const uint64_t deadline = now_ns() + 1000000000ull;
  struct timespec pause = {0, 1000000};
  while (remora_inside_count() != 0 && now_ns() < deadline) nanosleep(&pause, nullptr);
  if (long inside = remora_inside_count(); inside != 0) {
    pin_self();
    __atomic_store_n(&g_pinned, 1, __ATOMIC_RELEASE);
    log_error("the tool stays loaded: " + std::to_string(inside) +
              " thread(s) are still inside its call wrappers (blocked in a traced call made while attached)");
    return;
  }
  if (t.wake_fd >= 0) close(t.wake_fd);
  t.wake_fd = -1;
  // Not the slots' memory: a sampling handler or a wrapper in flight may
  // still write to it. remora_tool_release gives it back, once the unload
  // has proven that no thread is inside (never at process exit).
  close_unwind_fds();
  pthread_mutex_lock(&g_fork_mu);  // waits out a fork in progress, which holds t.mu
  g_tool = nullptr;                // the fork handlers do nothing from here until the dlclose removes them
  pthread_mutex_unlock(&g_fork_mu);
  delete &t;
}

void tool_fini(void* data) {
  auto* t = static_cast<Tool*>(data);
  // remora/tool.h: tool_fini must not wait for threads. The agent detaches
  // before calling us; this covers a host that did not.
  if (t->attached) do_detach(*t, /*join=*/false);
  release_for_unload(*t);
}

int tool_attach(void* data, const remora_tool_info_t* info) {
  Tool& t = *static_cast<Tool*>(data);
  IgnoreScope ignore;
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.attached) {
    log_error("attach: already attached");
    return kErrState;
  }
  Config cfg;
  std::string error;
  if (!parse_config([](const char* name) { return getenv(name); }, &cfg, &error)) {
    log_error("attach: " + error + " (see docs/tool.md)");
    return kErrConfig;
  }
  if (cfg.output_fd < 0 && !make_dirs(cfg.output_path, &error)) {
    log_error("attach: REMORA_OUTPUT_PATH: " + error);
    return kErrOutputPath;
  }
  t.cfg = cfg;
  Profile& p = t.profile;
  p = Profile();
  p.pid = getpid();
  // As the user started it, not the file's or comm's name (program_name.h).
  p.comm = program_name();
  p.session = info != nullptr && info->size >= offsetof(remora_tool_info_t, session) + sizeof info->session
                  ? info->session
                  : 0;
  p.hz = cfg.hz;
  p.sampling = cfg.sampling;
  p.tracing = cfg.tracing;
  p.fold_threads = cfg.fold_threads;
  p.fn_names.clear();
  for (unsigned i = 0; i < remora_fn_count; ++i) p.fn_names.push_back(remora_fn_table[i].reported_as);
  t.session_dir = make_session_dir(p, cfg.output_path, &error, cfg.output_fd >= 0);
  if (t.session_dir.empty() || !(cfg.output_fd >= 0 ? t.spool.open_fd(cfg.output_fd, t.session_dir, &error)
                                                    : t.spool.open(t.session_dir, &error))) {
    if (!t.session_dir.empty()) rmdir(t.session_dir.c_str());
    t.session_dir.clear();
    log_error("attach: REMORA_OUTPUT_PATH: " + error);
    return kErrOutputPath;
  }
  t.events = t.counters = 0;
  t.live.clear();
  t.tick = 0;
  t.next_scan_ns = 0;
  t.in_fork_child = false;
  t.stack_ids.clear();

  if (cfg.sampling) {
    const char* why = own_memory_open();
    if (*why != '\0') {
      log_error(std::string("attach: sampling: ") + why);
      p.warnings.push_back(why);
    }
  }
  session_begin();
  p.start_ns = now_ns();
  p.realtime_offset_ns = realtime_offset_ns();
  if (cfg.sampling && !t.sampler.start(cfg.hz, cfg.signal, &error)) {
    session_stop_and_quiesce();
    t.spool.discard();
    rmdir(t.session_dir.c_str());
    t.session_dir.clear();
    log_error("attach: sampling: " + error);
    return kErrSampling;
  }
  p.signal = t.sampler.signal_number();
  if (cfg.tracing) {
    std::vector<std::string> warnings;
    t.tracer.configure(cfg.functions, &warnings);
    for (const auto& w : warnings) log_error("attach: " + w);
    p.warnings.insert(p.warnings.end(), warnings.begin(), warnings.end());
    p.patched_slots = static_cast<uint32_t>(t.tracer.patch(&p.warnings));
  }
  t.attached = true;
  scan_threads(t, true);
  if (!start_collector(t)) {
    // Without the collector new threads are not sampled and rings are only
    // drained at detach: degraded, not fatal.
    p.warnings.push_back("could not start the collector thread: new threads are not sampled");
  } else {
    // Its tid, to leave it out of the scans (it blocks every signal anyway).
    for (int i = 0; i < 2000 && __atomic_load_n(&t.collector_tid, __ATOMIC_ACQUIRE) == 0; ++i) {
      struct timespec ts = {0, 500000};
      nanosleep(&ts, nullptr);
    }
    t.sampler.remove_thread(t.collector_tid);
    t.profile.threads.erase(t.collector_tid);
  }
  return 0;
}

int tool_detach(void* data, const remora_tool_info_t*) {
  Tool& t = *static_cast<Tool*>(data);
  return do_detach(t, /*join=*/true);
}

// fork(): hold the state still while the process is copied; in the child,
// the collector thread and the timers did not come along.
// Each counts itself in (wrappers.h): a thread blocked on a lock here
// returns into the tool.
void atfork_prepare() {
  remora_inside_stripe* in = remora_inside_mine();
  remora_inside_enter(in);
  pthread_mutex_lock(&g_fork_mu);
  if (g_tool) g_tool->mu.lock();
  __atomic_add_fetch(&g_fork_prepares, 1, __ATOMIC_RELAXED);
  remora_inside_leave(in);
}
void atfork_parent() {
  remora_inside_stripe* in = remora_inside_mine();
  remora_inside_enter(in);
  if (g_tool) g_tool->mu.unlock();
  pthread_mutex_unlock(&g_fork_mu);
  remora_inside_leave(in);
}
// The child of a fork made while attached keeps the session (the agent
// keeps it attached, agent/protocol.h REMORA_AGENT_FEATURE_FORK_LEASE): it
// records for itself from here on and writes its own outputs, under its own
// pid, when it is detached. Only the forking thread came along: no
// collector, no timers (POSIX timers are not inherited), and the slots hold
// the parent's threads and their unread records, which are the parent's.
// The GOT patches and the signal handler are inherited as they are.
// Runs with t.mu held since atfork_prepare, released last: a detach (the
// child's lease watcher, started by the agent's handler just before this
// one, may detach at once) finds the state complete.
void restart_in_child(Tool& t) {
  t.in_fork_child = true;
  t.collector_running = false;  // no thread to join here
  t.sampler.forget_timers();
  own_memory_reopen_after_fork();
  session_begin();  // a fresh slot table: nothing of the parent's rings is read here
  t.live.clear();
  t.known_stacks.clear();  // by tid: the parent's threads
  t.stack_ids.clear();
  t.tick = 0;
  t.next_scan_ns = 0;
  Profile& p = t.profile;
  p.pid = getpid();
  p.start_ns = now_ns();
  p.threads.clear();
  p.raw_stacks.clear();
  p.stack_weights.clear();
  p.samples.clear();
  p.calls.clear();
  p.func_stats.clear();
  p.slowest_calls.clear();
  p.counters.clear();
  p.samples_total = p.samples_dropped = p.calls_dropped = p.events_capped = 0;
  // The parent's session directory and spool file are the parent's: the
  // child's events stay in memory until its detach makes its own directory.
  t.spool.forget();
  t.session_dir.clear();
  t.events = t.counters = 0;
  // Re-arms the sampling timer of the one thread there is, then the
  // collector picks up the threads the child starts.
  scan_threads(t, true);
  if (!start_collector(t))
    p.warnings.push_back("could not restart the collector thread after fork: new threads are not sampled");
}

void atfork_child() {
  // The child's only thread is the one that locked it: a fresh lock.
  pthread_mutex_init(&g_fork_mu, nullptr);
  if (!g_tool) return;
  Tool& t = *g_tool;
  // The collector's eventfd is one object shared with the parent: a stop
  // written by either would wake the other's collector for good.
  if (t.wake_fd >= 0) close(t.wake_fd);
  t.wake_fd = -1;
  if (t.attached) restart_in_child(t);
  t.mu.unlock();
}

remora_tool_configure_result_t g_conf = {sizeof(remora_tool_configure_result_t), 0, tool_init, tool_fini,
                                         nullptr};
remora_tool_configure_attach_result_t g_conf_attach = {sizeof(remora_tool_configure_attach_result_t), 0,
                                                       tool_attach, tool_detach};

}  // namespace
}  // namespace remora_tool

using namespace remora_tool;

REMORA_TOOL_EXPORT remora_tool_configure_result_t* remora_configure(uint32_t, const remora_tool_info_t*) {
  if (g_tool == nullptr) {
    std::vector<int32_t> fds = open_fds();
    g_tool = new Tool();
    note_new_pipes(fds);
  }
  if (__atomic_load_n(&g_fork_registered, __ATOMIC_ACQUIRE) == 0) {
    // Registered under a key of ours rather than this object's
    // __dso_handle (pthread_atfork's), which the agent's unload takes out
    // of glibc's list (__cxa_finalize(key)) while no fork can be walking it
    // (remora/tool.h, remora_tool_quiesce); with them, the exit function
    // that says they are gone (g_fork_registered).
    __register_atfork(atfork_prepare, atfork_parent, atfork_child, &g_fork_key);
    __cxa_atexit(forget_fork_handlers, nullptr, &g_fork_key);
    __atomic_store_n(&g_fork_registered, 1, __ATOMIC_RELEASE);
  }
  g_conf.tool_data = g_tool;
  return &g_conf;
}

REMORA_TOOL_EXPORT remora_tool_configure_attach_result_t* remora_configure_attach(uint32_t,
                                                                                  const remora_tool_info_t*) {
  return &g_conf_attach;
}

// The unload's proof (remora/tool.h): the wrappers' and the sampling
// handler's counts (wrappers.h), and whether the tool pinned itself.
REMORA_TOOL_EXPORT const remora_tool_quiesce_t remora_tool_quiesce = {sizeof(remora_tool_quiesce_t),
                                                                      REMORA_INSIDE_STRIPES,
                                                                      sizeof(struct remora_inside_stripe),
                                                                      &remora_inside[0].n,
                                                                      &g_pinned,
                                                                      &g_fork_key};

// Our fork handlers, out of glibc's list by the time our code goes: the
// agent's unload took them out already (remora_tool_quiesce); a dlclose of
// another host takes them out here, as it would pthread_atfork's.
__attribute__((destructor)) static void unregister_fork_handlers_at_unload() { __cxa_finalize(&g_fork_key); }

// Once no thread can be inside (the controller proved it), before our
// dlclose: the slots' memory, which a handler or wrapper in flight writes.
REMORA_TOOL_EXPORT void remora_tool_release(void) {
  if (__atomic_load_n(&g_pinned, __ATOMIC_ACQUIRE) == 0) release_slot_memory();
}

// ---- test-only queries (tests/default_tool) ----

// Calls `cb` for every GOT slot of the current session (or, when detached,
// of the last one): the slot, the value it held before patching, the
// wrapper, the function and the object. Returns the number of slots.
REMORA_TOOL_EXPORT int remora_default_tool_debug_slots(void (*cb)(void* ctx, void** slot, void* original,
                                                                  void* wrapper, const char* function,
                                                                  const char* object),
                                                       void* ctx) {
  if (g_tool == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g_tool->mu);
  const auto& slots = g_tool->attached ? g_tool->tracer.slots() : g_tool->tracer.last_slots();
  for (const auto& s : slots)
    cb(ctx, s.slot, s.original, s.wrapper, remora_fn_table[s.fn].symbol, s.object.c_str());
  return static_cast<int>(slots.size());
}

// The per-thread blocks the tool has mapped (slots.h, mapped_slot_blocks).
REMORA_TOOL_EXPORT int remora_default_tool_debug_thread_blocks(void) { return mapped_slot_blocks(); }

// fork()s that ran the tool's prepare handler so far: each fork runs it
// once while the handlers are registered, never twice.
REMORA_TOOL_EXPORT long remora_default_tool_debug_fork_prepares(void) {
  return __atomic_load_n(&g_fork_prepares, __ATOMIC_RELAXED);
}

// The sampling signal of the current or last session (0: none yet).
REMORA_TOOL_EXPORT int remora_default_tool_debug_signal(void) {
  return g_tool ? g_tool->sampler.signal_number() : 0;
}
