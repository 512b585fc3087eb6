// libremora-agent.so — Remora's in-target runtime.
//
// Small on purpose: no exceptions, hidden visibility, and a constructor that
// starts nothing: no thread of the agent's exists until a controller asks for
// its listener (remora_agent_start_listener, on a fresh thread of the
// controller's; agent/protocol.h, LISTENER_ON_REQUEST). A preloaded agent so
// costs a program that changes its credentials nothing (glibc aborts a
// process whose set*id fails on one thread and not on another). Everything it
// does for the controller runs on its own listener thread ("remora-listen"),
// which the controller seizes and makes call the entry points below: after
// the listener is up, no application thread is ever hijacked again.
//
// The listener waits in a futex wait with every signal blocked and no lock
// held: it uses no CPU, it never receives the application's signals, and a
// remote call on it can never deadlock on a lock the thread itself holds.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "agent/channel.h"
#include "agent/internal.h"
#include "agent/protocol.h"
#include "remora/tool.h"

#define REMORA_EXPORT extern "C" __attribute__((visibility("default")))

extern "C" {
__attribute__((visibility("default"))) struct remora_agent_info remora_agent_info = {};
}

// Remora's remote-call stubs, `remora_agent_stub`, are not written here:
// this library links the host architecture's src/arch/<arch>_stub.S, the
// source the controller's stub_code() is assembled from
// (agent/CMakeLists.txt), and exports the block from there. With them here, calls on the listener thread
// need no scratch mapping at all: a re-attach maps nothing in the target.

// Byte arguments of remote calls on the listener thread go here.
extern "C" {
__attribute__((visibility("default"),
               aligned(64))) unsigned char remora_agent_scratch[REMORA_AGENT_SCRATCH_SIZE];
}

namespace remora_agent {

constexpr int kMaxTools = 16;
constexpr int kMaxEnv = 64;

struct Tool {
  char path[1024];
  void* handle;
  remora_tool_configure_result_t* conf;
  remora_tool_configure_attach_result_t* conf_attach;
  bool inited;
  bool attached;
};

struct SavedEnv {
  char name[256];
  char* old_value;  // strdup'ed, or nullptr when it was unset
};

// Error-checking: the fork handler's lock (lock_for_fork) must not deadlock
// when the forking thread holds it already (a tool callback that forks, run
// under it on the listener, the watcher or the exiting thread).
pthread_mutex_t g_lock = PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP;
bool g_fork_locked = false;  // lock_for_fork took g_lock for a fork in progress
// Tool loads (load_tools) so far, and the load lock_for_fork was last
// registered after: it is registered again after each load, to come before
// the handlers those tools registered (a second lock_for_fork of one fork
// finds g_lock taken by its thread, EDEADLK, and does nothing).
unsigned g_tool_loads = 0;
unsigned g_fork_handler_after = 0;
Tool g_tools[kMaxTools];
int g_tool_count = 0;
// The tools an unload finalised, still mapped until the agent's destructor
// (release_tools, unload.cc).
UnloadTool g_unload_tools[kMaxTools];
char g_unload_paths[kMaxTools][sizeof(Tool::path)];
int g_unload_count = 0;

bool g_loaded = false;
bool g_exit_registered = false;
// The listener's futex word: kUnloadBit once remora_agent_unload ran (the
// listener returns), kWorkBit while g_work waits for it.
uint32_t g_futex_word = 0;
constexpr uint32_t kUnloadBit = 1, kWorkBit = 2;
// What remora_agent_loader_attach hands the listener: the attach to run
// once its loader thread is gone (so that the listener's allocations reuse
// that thread's malloc arena, as a remote call after it would), then the
// ranges to retire. One at a time (g_work_lock): a second loading
// controller's hook is refused (busy) and that controller goes the remote
// call's way. The strings are copied here: the scratch they came in may go.
constexpr size_t kWorkBytes = 8192;
struct LoaderWork {
  bool queued;  // handed over, not finished yet
  pid_t tid;    // the loader thread
  uint64_t id, ack_timeout_ms, scratch_magic;
  uintptr_t start[2];
  size_t size[2];
  bool has_env;
  char env[kWorkBytes];
  char list[kWorkBytes];
};
LoaderWork g_work;
pthread_mutex_t g_work_lock = PTHREAD_MUTEX_INITIALIZER;
// True while the listener runs a handed-off attach: a remote call that
// interrupts it there (another controller's) must not run an entry point
// within that attach, on the same thread, under the lock it holds. Only the
// listener sets and reads it.
bool g_listener_busy = false;
// Orders register_fork_lock's callers: the listener, and the loader thread
// of a remora_agent_loader_attach.
pthread_mutex_t g_fork_register_lock = PTHREAD_MUTEX_INITIALIZER;

OwnStack g_listener_stack;

void free_stack(OwnStack* stack) {
  if (stack->base != nullptr) munmap(stack->base, kStackSize);
  stack->base = nullptr;
}

void set_message(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(remora_agent_info.message, sizeof remora_agent_info.message, fmt, ap);
  va_end(ap);
}

int finish(int result) {
  remora_agent_info.last_result = result;
  if (result == REMORA_AGENT_OK) remora_agent_info.message[0] = '\0';
  return result;
}

void update_tool_names() {
  char* out = remora_agent_info.tools;
  size_t left = sizeof remora_agent_info.tools;
  out[0] = '\0';
  for (int i = 0; i < g_tool_count && left > 1; ++i) {
    int n = snprintf(out, left, "%s%s", i ? ":" : "", g_tools[i].path);
    if (n < 0 || static_cast<size_t>(n) >= left) break;
    out += n;
    left -= static_cast<size_t>(n);
  }
}

remora_tool_info_t info_for(int i) {
  remora_tool_info_t info{};
  info.size = sizeof info;
  info.abi_version = REMORA_TOOL_ABI_VERSION;
  info.tool_path = g_tools[i].path;
  info.tool_index = static_cast<uint32_t>(i);
  info.pid = getpid();
  info.session = remora_agent_info.sessions;
  return info;
}

// ---- environment buffer: [uint32 count] then count pairs NAME\0VALUE\0 ----

int apply_env(const void* buffer, SavedEnv* saved, int* saved_count) {
  *saved_count = 0;
  if (buffer == nullptr) return REMORA_AGENT_OK;
  uint32_t count;
  memcpy(&count, buffer, sizeof count);
  if (count > kMaxEnv) {
    set_message("environment buffer holds %u variables; at most %d are accepted", count, kMaxEnv);
    return REMORA_AGENT_ERR_BAD_ARGUMENT;
  }
  const char* p = static_cast<const char*>(buffer) + sizeof count;
  for (uint32_t i = 0; i < count; ++i) {
    const char* name = p;
    const char* value = name + strlen(name) + 1;
    p = value + strlen(value) + 1;
    if (name[0] == '\0' || strchr(name, '=') != nullptr || strlen(name) >= sizeof saved[0].name) {
      set_message("invalid environment variable name '%.64s'", name);
      return REMORA_AGENT_ERR_BAD_ARGUMENT;
    }
    SavedEnv& s = saved[(*saved_count)++];
    snprintf(s.name, sizeof s.name, "%s", name);
    const char* old = getenv(name);
    s.old_value = old ? strdup(old) : nullptr;
    setenv(name, value, 1);
  }
  return REMORA_AGENT_OK;
}

void rollback_env(SavedEnv* saved, int count) {
  for (int i = count - 1; i >= 0; --i) {
    if (saved[i].old_value)
      setenv(saved[i].name, saved[i].old_value, 1);
    else
      unsetenv(saved[i].name);
  }
}

void free_saved(SavedEnv* saved, int count) {
  for (int i = 0; i < count; ++i) free(saved[i].old_value);
}

bool refused_by_environment() {
  const char* a = getenv("REMORA_TOOL_ATTACH");
  const char* b = getenv("ROCP_TOOL_ATTACH");
  return (a && strcmp(a, "0") == 0) || (b && strcmp(b, "0") == 0);
}

// ---- tools ----

void unload_all() {
  for (int i = g_tool_count - 1; i >= 0; --i) {
    Tool& t = g_tools[i];
    if (t.attached && t.conf_attach->tool_detach) {
      remora_tool_info_t info = info_for(i);
      t.conf_attach->tool_detach(t.conf->tool_data, &info);
    }
    if (t.inited && t.conf->tool_fini) t.conf->tool_fini(t.conf->tool_data);
    if (t.handle) dlclose(t.handle);
  }
  memset(g_tools, 0, sizeof g_tools);
  g_tool_count = 0;
  g_loaded = false;
  update_tool_names();
}

bool same_list(const char* list) {
  char buf[REMORA_AGENT_TOOLS_SIZE];
  snprintf(buf, sizeof buf, "%s", list);
  char* save = nullptr;
  int i = 0;
  for (char* tok = strtok_r(buf, ":", &save); tok; tok = strtok_r(nullptr, ":", &save), ++i) {
    char* bar = strchr(tok, '|');
    if (bar) *bar = '\0';  // compare the display names only
    if (i >= g_tool_count || strcmp(tok, g_tools[i].path) != 0) return false;
  }
  return i == g_tool_count;
}

int load_tools(const char* list) {
  char buf[REMORA_AGENT_TOOLS_SIZE];
  if (strlen(list) >= sizeof buf) {
    set_message("tool list is longer than %zu bytes", sizeof buf - 1);
    return REMORA_AGENT_ERR_BAD_ARGUMENT;
  }
  snprintf(buf, sizeof buf, "%s", list);
  char* save = nullptr;
  for (char* tok = strtok_r(buf, ":", &save); tok; tok = strtok_r(nullptr, ":", &save)) {
    if (g_tool_count == kMaxTools) {
      set_message("more than %d tools in the list", kMaxTools);
      return REMORA_AGENT_ERR_BAD_ARGUMENT;
    }
    Tool& t = g_tools[g_tool_count++];
    // An entry is "PATH" or "NAME|PATH": NAME is what the tool is known by
    // (the controller's path), PATH where this process can open it (its own
    // path, or /proc/self/fd/N for a memfd the controller filled).
    char* bar = strchr(tok, '|');
    const char* load = tok;
    if (bar) {
      *bar = '\0';
      load = bar + 1;
    }
    snprintf(t.path, sizeof t.path, "%s", tok);
    t.handle = dlopen(load, RTLD_NOW | RTLD_LOCAL);
    if (t.handle == nullptr) {
      set_message("cannot load tool %s: %s", tok, dlerror());
      return REMORA_AGENT_ERR_LOAD;
    }
    auto configure = reinterpret_cast<remora_configure_fn>(dlsym(t.handle, "remora_configure"));
    auto configure_attach =
        reinterpret_cast<remora_configure_attach_fn>(dlsym(t.handle, "remora_configure_attach"));
    if (configure_attach == nullptr) {
      set_message(
          "tool %s exports no remora_configure_attach: it cannot be attached to a running process "
          "(it may only support being loaded at start-up)",
          tok);
      return REMORA_AGENT_ERR_NOT_ATTACHABLE;
    }
    if (configure == nullptr) {
      set_message("tool %s exports no remora_configure: it is not a Remora tool", tok);
      return REMORA_AGENT_ERR_NOT_ATTACHABLE;
    }
    int i = g_tool_count - 1;
    remora_tool_info_t info = info_for(i);
    t.conf = configure(REMORA_TOOL_ABI_VERSION, &info);
    if (t.conf == nullptr || t.conf->size < sizeof(uint32_t)) {
      set_message("tool %s declined in remora_configure", tok);
      return REMORA_AGENT_ERR_TOOL_FAILED;
    }
    t.conf_attach = configure_attach(REMORA_TOOL_ABI_VERSION, &info);
    if (t.conf_attach == nullptr || t.conf_attach->size < sizeof(remora_tool_configure_attach_result_t) ||
        t.conf_attach->tool_attach == nullptr || t.conf_attach->tool_detach == nullptr) {
      set_message("tool %s returned no tool_attach/tool_detach from remora_configure_attach", tok);
      return REMORA_AGENT_ERR_NOT_ATTACHABLE;
    }
    if (t.conf->tool_init) {
      int rc = t.conf->tool_init(t.conf->tool_data);
      if (rc != 0) {
        set_message("tool_init of %s failed with %d", tok, rc);
        return REMORA_AGENT_ERR_TOOL_FAILED;
      }
    }
    t.inited = true;
  }
  if (g_tool_count == 0) {
    set_message("empty tool list");
    return REMORA_AGENT_ERR_BAD_ARGUMENT;
  }
  g_loaded = true;
  ++g_tool_loads;
  update_tool_names();
  return REMORA_AGENT_OK;
}

int attach_all() {
  for (int i = 0; i < g_tool_count; ++i) {
    Tool& t = g_tools[i];
    remora_tool_info_t info = info_for(i);
    int rc = t.conf_attach->tool_attach(t.conf->tool_data, &info);
    if (rc != 0) {
      set_message("tool_attach of %s failed with %d", t.path, rc);
      for (int j = i - 1; j >= 0; --j) {
        remora_tool_info_t dinfo = info_for(j);
        g_tools[j].conf_attach->tool_detach(g_tools[j].conf->tool_data, &dinfo);
        g_tools[j].attached = false;
      }
      return REMORA_AGENT_ERR_TOOL_FAILED;
    }
    t.attached = true;
  }
  return REMORA_AGENT_OK;
}

int detach_all_locked() {
  for (int i = g_tool_count - 1; i >= 0; --i) {
    Tool& t = g_tools[i];
    if (!t.attached) continue;
    remora_tool_info_t info = info_for(i);
    t.conf_attach->tool_detach(t.conf->tool_data, &info);
    t.attached = false;
  }
  remora_agent_info.attached = 0;
  remora_agent_info.detaches++;
  return REMORA_AGENT_OK;
}

// At exit: detach if still attached, then fini, on the exiting thread.
// Not after an unload began: the tools are finalised, and a fork that
// raced the unload may have left g_lock taken for good.
void at_exit() {
  if (__atomic_load_n(&remora_agent_info.unloading, __ATOMIC_ACQUIRE) != 0) return;
  pthread_mutex_lock(&g_lock);
  if (remora_agent_info.attached) detach_all_locked();
  for (int i = g_tool_count - 1; i >= 0; --i)
    if (g_tools[i].inited && g_tools[i].conf->tool_fini) {
      g_tools[i].conf->tool_fini(g_tools[i].conf->tool_data);
      g_tools[i].inited = false;
    }
  pthread_mutex_unlock(&g_lock);
}

// ---- listener ----

uint64_t monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

// The scratch's header still at `base` (read without faulting: a range
// another controller removed reads nothing).
bool still_scratch(uintptr_t base, uint64_t magic) {
  uint64_t head[3] = {};
  iovec local{head, sizeof head}, remote{reinterpret_cast<void*>(base), sizeof head};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof head) &&
         head[0] == magic && head[2] == base;
}

// Waits (20 us naps) until `done` says so or `until` (monotonic ms) passes.
// The naps are short only with a short timer slack: the kernel stretches
// each sleep of a thread by its slack, 50 us by default, and the loader
// thread these waits are mostly for is gone within microseconds. So the
// slack is 1 ns while it waits and put back before it returns: the tools'
// threads, which tool_attach may start from this one, inherit the slack
// the listener had.
template <typename Done>
bool wait_until(Done done, uint64_t until) {
  if (done()) return true;
  const int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  bool ok = true;
  while (!done()) {
    if (monotonic_ms() >= until) {
      ok = done();
      break;
    }
    timespec ts{0, 20000};
    nanosleep(&ts, nullptr);
  }
  if (slack > 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(slack), 0, 0, 0);
  return ok;
}

int attach_entry(const void* env_buffer, const char* tool_list);  // remora_agent_attach's body

// A remote call on the listener while it runs a handed-off attach (another
// controller's): refused at once, before any lock, allocation or message.
bool listener_busy() { return __atomic_load_n(&g_listener_busy, __ATOMIC_RELAXED); }

// The work a loader thread handed over (remora_agent_loader_attach): once
// that thread is gone, the attach, as the remote call would run it (its
// result in loader_rc, then loader_done = the request's id); then, once the
// controller says it is done with its scratch (retire_go) or the request's
// timeout passed (the controller died), the ranges: the scratch only while
// its header is still there (never what another controller's reclaim left
// in its place), the stack only if the loader ran on it. The loader thread
// runs on that stack and returns into that code until it is gone, which
// tgkill(0) tells once it has left for good (ESRCH); a thread still there
// after the timeout keeps them (a leak, never a fault). An agent being
// unloaded meanwhile attaches nothing more.
void run_loader_work() {
  LoaderWork& w = g_work;
  const pid_t self = getpid();
  const uint64_t until = monotonic_ms() + w.ack_timeout_ms;
  auto loader_gone = [&] { return syscall(SYS_tgkill, self, w.tid, 0) != 0; };
  const bool gone = wait_until(loader_gone, until);
  __atomic_store_n(&g_listener_busy, true, __ATOMIC_RELAXED);
  const int rc =
      remora_agent_info.unloading ? REMORA_AGENT_ERR_BUSY : attach_entry(w.has_env ? w.env : nullptr, w.list);
  __atomic_store_n(&g_listener_busy, false, __ATOMIC_RELAXED);
  remora_agent_info.loader_rc = rc;
  __atomic_store_n(&remora_agent_info.loader_done, w.id, __ATOMIC_RELEASE);
  wait_until([&] { return __atomic_load_n(&remora_agent_info.retire_go, __ATOMIC_ACQUIRE) == w.id; }, until);
  if (gone || loader_gone()) {
    if (w.start[0] != 0 && w.size[0] != 0 && still_scratch(w.start[0], w.scratch_magic))
      munmap(reinterpret_cast<void*>(w.start[0]), w.size[0]);
    if (w.start[1] != 0 && w.size[1] != 0) munmap(reinterpret_cast<void*>(w.start[1]), w.size[1]);
  }
  pthread_mutex_lock(&g_work_lock);
  w.queued = false;
  __atomic_store_n(&remora_agent_info.retire_pending, 0, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_work_lock);
}

void* listener_main(void*) {
  pthread_setname_np(pthread_self(), "remora-listen");
  __atomic_store_n(&remora_agent_info.listener_tid, static_cast<int32_t>(syscall(SYS_gettid)),
                   __ATOMIC_RELEASE);
  // Woken only by remora_agent_loader_attach, which hands us its work
  // (kWorkBit): the controller seizes this thread while it waits here
  // (FUTEX_WAIT restarts transparently after the remote call).
  // remora_agent_unload sets kUnloadBit within a remote call on this very
  // thread: the restarted wait then finds the word changed (EAGAIN) and the
  // listener returns, out of the agent's code for good (a retire first).
  for (;;) {
    const uint32_t w = __atomic_load_n(&g_futex_word, __ATOMIC_ACQUIRE);
    if ((w & kWorkBit) != 0) {
      __atomic_fetch_and(&g_futex_word, ~kWorkBit, __ATOMIC_ACQ_REL);
      run_loader_work();
      continue;
    }
    if ((w & kUnloadBit) != 0) break;
    syscall(SYS_futex, &g_futex_word, FUTEX_WAIT_PRIVATE, w, nullptr, nullptr, 0);
  }
  return nullptr;
}

bool start_thread(pthread_t* thread, void* (*fn)(void*), OwnStack* stack) {
  void* base =
      mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (base == MAP_FAILED) return false;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the new thread inherits "all blocked"
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstack(&attr, base, kStackSize);
  int rc = pthread_create(thread, &attr, fn, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    munmap(base, kStackSize);
    return false;
  }
  stack->base = base;
  return true;
}

// The listener is detached: nobody joins it. Its stack is unmapped by the
// agent's destructor, which runs in the dlclose of an unload, once the
// controller has seen the listener's thread gone.
bool start_listener() {
  remora_agent_info.listener_tid = 0;
  pthread_t t;
  if (!start_thread(&t, listener_main, &g_listener_stack)) return false;
  pthread_detach(t);
  return true;
}

// Threads of a controller's (its loader threads) inside the hooks below,
// counted for the unload's proof (unload.cc): a hook calls out of the
// agent (pthread_create, dlclose, futex) and returns into it.
long g_hooks_inside = 0;
struct HookScope {
  HookScope() { __atomic_fetch_add(&g_hooks_inside, 1, __ATOMIC_SEQ_CST); }
  ~HookScope() { __atomic_fetch_sub(&g_hooks_inside, 1, __ATOMIC_RELEASE); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

// Orders the listener's start between racing controllers' start hooks and a
// loader attach (each on a fresh thread of its controller's).
pthread_mutex_t g_listener_start_lock = PTHREAD_MUTEX_INITIALIZER;

// Starts the listener unless one was asked for already in this process
// image (a second controller's request finds it started and does nothing).
int request_listener() {
  pthread_mutex_lock(&g_listener_start_lock);
  int rc = REMORA_AGENT_OK;
  if (__atomic_load_n(&remora_agent_info.listener_requested, __ATOMIC_ACQUIRE) == 0) {
    if (start_listener())
      __atomic_store_n(&remora_agent_info.listener_requested, 1, __ATOMIC_RELEASE);
    else
      rc = REMORA_AGENT_ERR_NO_LISTENER;
  }
  pthread_mutex_unlock(&g_listener_start_lock);
  return rc;
}

// The reference a RTLD_NOLOAD dlopen of the agent took (the start hook's
// trampoline), given back: an unload's one dlclose must still unload an
// agent that was injected, and a preloaded one keeps its count as it was.
// dladdr names the agent as the loader knows it; our own lookup's reference
// goes too (two closes for two opens).
void drop_loader_reference() {
  Dl_info di{};
  if (dladdr(reinterpret_cast<void*>(&remora_agent_info), &di) == 0 || di.dli_fname == nullptr) return;
  void* self = dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (self == nullptr) return;
  dlclose(self);
  dlclose(self);
}

// fork(): an entry point in progress (attach, detach, a lease change, the
// watcher's detach) is let finish first, so that the child never copies a
// session half-made. Registered after the first tools are loaded: glibc runs
// prepare handlers last registered first, so this lock is taken before a
// tool's own (the default tool's state lock), the order of the listener,
// which holds g_lock while it calls into the tools.
void lock_for_fork() {
  HookScope in;
  if (pthread_mutex_lock(&g_lock) == 0) g_fork_locked = true;  // EDEADLK: the forking thread holds it
}
void unlock_after_fork() {
  HookScope in;
  if (!g_fork_locked) return;
  g_fork_locked = false;
  pthread_mutex_unlock(&g_lock);
}

// Called on the listener with g_lock released (a glibc before 2.34 runs
// the prepare handlers under the lock pthread_atfork takes: a fork waiting
// for g_lock there would wait for us for good). Only the listener runs it.
void register_fork_lock() {
  pthread_mutex_lock(&g_lock);
  const unsigned loads = g_tool_loads;
  pthread_mutex_unlock(&g_lock);
  pthread_mutex_lock(&g_fork_register_lock);
  if (g_fork_handler_after != loads && register_fork_handlers(lock_for_fork, unlock_after_fork, nullptr) == 0)
    g_fork_handler_after = loads;
  pthread_mutex_unlock(&g_fork_register_lock);
}

void after_fork_child() {
  // Only the forking thread survives a fork: the child needs its own
  // listener. Our lock was taken for the fork (or held by the forking
  // thread itself): the child starts with a fresh one.
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
  pthread_mutex_init(&g_lock, &attr);
  pthread_mutexattr_destroy(&attr);
  pthread_mutex_init(&g_fork_register_lock, nullptr);
  g_fork_locked = false;
  // Work handed to the parent's listener is the parent's: the loader thread
  // is not ours, and the scratch (MADV_DONTFORK) did not come along.
  __atomic_fetch_and(&g_futex_word, ~kWorkBit, __ATOMIC_ACQ_REL);
  pthread_mutex_init(&g_work_lock, nullptr);
  g_work.queued = false;
  remora_agent_info.retire_pending = 0;
  g_listener_busy = false;
  // Until the new listener publishes its tid (start_listener, last), the
  // info block is not this process's yet: a controller waits for a
  // listener that is a thread of the child (before this handler ran, the
  // block names the parent's).
  __atomic_store_n(&remora_agent_info.listener_tid, 0, __ATOMIC_RELEASE);
  if (remora_agent_info.unloading) return;  // forked mid-unload: the agent takes no calls any more
  remora_agent_info.forked_from = remora_agent_info.attached ? static_cast<int32_t>(getppid()) : 0;
  // Their stacks are copies no thread of the child uses, unless the forking
  // thread was the listener itself (a tool callback that forked).
  char here;
  auto on = [&](const OwnStack& st) {
    auto* b = static_cast<char*>(st.base);
    return b != nullptr && &here >= b && &here < b + kStackSize;
  };
  if (!on(lease_stack())) free_stack(&lease_stack());
  if (!on(g_listener_stack)) free_stack(&g_listener_stack);
  (void)inherit_lease_in_child();
  // A child that keeps an attached session gets its listener now (its
  // controller adopts it, or its lease detaches it); any other starts none
  // until a controller asks, as a freshly loaded agent.
  pthread_mutex_init(&g_listener_start_lock, nullptr);
  remora_agent::channel_after_fork();
  const bool keeps_session = remora_agent_info.attached != 0;
  __atomic_store_n(&remora_agent_info.listener_requested, keeps_session && start_listener() ? 1 : 0,
                   __ATOMIC_RELEASE);
}

__attribute__((constructor)) void agent_init() {
  remora_agent_info.size = sizeof remora_agent_info;
  remora_agent_info.version = REMORA_AGENT_PROTOCOL_VERSION;
  remora_agent_info.features = REMORA_AGENT_FEATURE_LEASE | REMORA_AGENT_FEATURE_FORK_LISTENER |
                               REMORA_AGENT_FEATURE_LEASED_ATTACH | REMORA_AGENT_FEATURE_UNLOAD |
                               REMORA_AGENT_FEATURE_FORK_LEASE | REMORA_AGENT_FEATURE_LOADER_ATTACH |
                               REMORA_AGENT_FEATURE_LISTENER_ON_REQUEST | REMORA_AGENT_FEATURE_PROVEN_UNLOAD;
  register_fork_handlers(nullptr, nullptr, after_fork_child);
  // No listener: a controller asks for it (remora_agent_start_listener),
  // or, opted in to the socket channel, through it (channel.cc; no thread).
  remora_agent::channel_init();
  __atomic_store_n(&remora_agent_info.magic, REMORA_AGENT_MAGIC, __ATOMIC_RELEASE);
}

// Runs in the dlclose of an unload (remora_agent_unload), on the
// controller's fresh thread: the listener and the watcher are gone, so
// their stacks are unused.
__attribute__((destructor)) void agent_fini() {
  if (!remora_agent_info.unloading) return;  // process exit: nothing to give back
  // The tools go first, within this dlclose, and only after the
  // controller's proof: exit() after a refused unload leaves them as they are.
  if (__atomic_load_n(&remora_agent_info.unload_go, __ATOMIC_ACQUIRE) != 0)
    release_tools(g_unload_tools, g_unload_count);
  unregister_fork_handlers();  // none are left after remora_agent_unload_forks
  remora_agent::channel_fini();
  free_stack(&g_listener_stack);
  free_stack(&lease_stack());
}

}  // namespace remora_agent

using namespace remora_agent;

namespace remora_agent {

// The attach proper, under g_lock: refusals, environment, tools.
int attach_locked(const void* env_buffer, const char* tool_list) {
  int rc = REMORA_AGENT_OK;
  SavedEnv saved[kMaxEnv];
  int saved_count = 0;
  if (refused_by_environment()) {
    set_message(
        "this process refuses tool attachment (its environment sets REMORA_TOOL_ATTACH=0 or "
        "ROCP_TOOL_ATTACH=0)");
    rc = REMORA_AGENT_ERR_REFUSED;
  } else if (remora_agent_info.attached && lease_live_locked()) {
    // Another controller's live session: named, and no detach suggested
    // (it would break that session).
    set_message("attached by remora pid %d, lease live (tools %s): another session holds this process",
                remora_agent_info.lease_pid, remora_agent_info.tools);
    rc = REMORA_AGENT_ERR_ALREADY_ATTACHED;
  } else if (remora_agent_info.attached) {
    // No lease: remora attach --keep or the C API attached them, and only a
    // detach ends that session.
    set_message(
        "tools are already attached (%s) with no lease (remora attach --keep or the C API): detach them "
        "first (remora detach)",
        remora_agent_info.tools);
    rc = REMORA_AGENT_ERR_ALREADY_ATTACHED;
  } else if (g_loaded && tool_list && tool_list[0] && !same_list(tool_list)) {
    set_message("a re-attach must name the loaded tools; loaded: %s; requested: %.1024s",
                remora_agent_info.tools, tool_list);
    rc = REMORA_AGENT_ERR_DIFFERENT_TOOLS;
  } else if (!g_loaded && (tool_list == nullptr || tool_list[0] == '\0')) {
    set_message("no tool given to attach");
    rc = REMORA_AGENT_ERR_BAD_ARGUMENT;
  }
  if (rc == REMORA_AGENT_OK) rc = apply_env(env_buffer, saved, &saved_count);
  if (rc == REMORA_AGENT_OK) {
    remora_agent_info.sessions++;
    bool first = !g_loaded;
    if (first) rc = load_tools(tool_list);
    if (rc == REMORA_AGENT_OK) rc = attach_all();
    if (rc != REMORA_AGENT_OK) {
      remora_agent_info.sessions--;
      if (first) unload_all();
    } else {
      remora_agent_info.attached = 1;
      remora_agent_info.session_channel = 0;  // the socket channel says otherwise (channel.cc)
      if (!g_exit_registered) g_exit_registered = atexit(at_exit) == 0;
    }
  }
  if (rc != REMORA_AGENT_OK) rollback_env(saved, saved_count);
  free_saved(saved, saved_count);
  return rc;
}

int attach_entry(const void* env_buffer, const char* tool_list) {
  pthread_mutex_lock(&g_lock);
  int rc = finish(attach_locked(env_buffer, tool_list));
  pthread_mutex_unlock(&g_lock);
  register_fork_lock();
  return rc;
}

}  // namespace remora_agent

REMORA_EXPORT int remora_agent_attach(const void* env_buffer, const char* tool_list) {
  if (listener_busy()) return REMORA_AGENT_ERR_BUSY;
  return attach_entry(env_buffer, tool_list);
}

// See agent/protocol.h: the first attach, on the controller's loader thread
// (the trampoline's hook), right after the dlopen that loaded the agent (the
// loader lock is free again). The listener removes the ranges once this
// thread is gone.
REMORA_EXPORT int remora_agent_loader_attach(const remora_agent_loader_request* r) {
  HookScope in;
  if (remora_agent_info.unloading) return REMORA_AGENT_ERR_BUSY;
  if (r == nullptr || r->magic != REMORA_AGENT_LOADER_MAGIC || r->tool_list == 0)
    return REMORA_AGENT_ERR_BAD_ARGUMENT;
  const char* list = reinterpret_cast<const char*>(r->tool_list);
  const size_t list_len = strnlen(list, kWorkBytes);
  if (list_len == kWorkBytes || r->env_size > kWorkBytes) return REMORA_AGENT_ERR_BAD_ARGUMENT;
  // The listener runs the attach this hands it: started first (an agent
  // just loaded has none yet).
  if (const int started = request_listener(); started != REMORA_AGENT_OK) return started;
  pthread_mutex_lock(&g_work_lock);
  if (g_work.queued) {  // another controller's, not finished yet
    pthread_mutex_unlock(&g_work_lock);
    return REMORA_AGENT_ERR_BUSY;
  }
  LoaderWork& w = g_work;
  w.queued = true;
  w.tid = static_cast<pid_t>(syscall(SYS_gettid));
  w.id = r->id;
  w.ack_timeout_ms = r->ack_timeout_ms;
  w.scratch_magic = r->scratch_magic;
  // The stack range only when this thread runs on it (else it is libc's,
  // or mapped and unused: its controller removes that one).
  const auto here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  const bool own_stack =
      r->retire[1][1] != 0 && here >= r->retire[1][0] && here < r->retire[1][0] + r->retire[1][1];
  for (int i = 0; i < 2; ++i) {
    const bool take = i == 0 || own_stack;
    w.start[i] = take ? static_cast<uintptr_t>(r->retire[i][0]) : 0;
    w.size[i] = take ? static_cast<size_t>(r->retire[i][1]) : 0;
  }
  memcpy(w.list, list, list_len + 1);
  w.has_env = r->env_buffer != 0;
  if (w.has_env) memcpy(w.env, reinterpret_cast<const void*>(r->env_buffer), r->env_size);
  __atomic_store_n(&remora_agent_info.retire_pending, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_work_lock);
  __atomic_fetch_or(&g_futex_word, kWorkBit, __ATOMIC_RELEASE);
  syscall(SYS_futex, &g_futex_word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  return REMORA_AGENT_OK;  // taken: the listener attaches once this thread is gone
}

// See agent/protocol.h: the controller's request for the listener, on a
// fresh thread of its (the trampoline's hook, after its dlopen of the agent:
// RTLD_NOLOAD when the agent was in the process already).
REMORA_EXPORT int remora_agent_start_listener(uint64_t drop_reference) {
  HookScope in;
  // Being unloaded: the reference stays (the agent then outlives the
  // unload's dlclose, which says so), and no listener starts.
  if (__atomic_load_n(&remora_agent_info.unloading, __ATOMIC_ACQUIRE) != 0)
    return REMORA_AGENT_ERR_NO_LISTENER;
  if (drop_reference != 0) drop_loader_reference();
  return request_listener();
}

// The first attach after the agent was loaded. [scratch, scratch + size) is
// the controller's own scratch mapping, through which it loaded the agent;
// no thread runs in it any more, and removing it here saves a remote call.
REMORA_EXPORT int remora_agent_attach_unmap(const void* env_buffer, const char* tool_list, void* scratch,
                                            size_t size) {
  if (listener_busy()) return REMORA_AGENT_ERR_BUSY;
  if (scratch != nullptr && size != 0) munmap(scratch, size);
  return remora_agent_attach(env_buffer, tool_list);
}

// The attach with its lease (protocol 2). The lease is armed before any
// tool runs: a controller killed at any instant from here on leaves a lease
// whose EOF detaches whatever this call attached (the watcher waits for
// g_lock, so it acts once this call is done). Entry points all run on the
// one listener thread, so two controllers' calls never overlap; the lock
// orders them against the watcher and exit.
REMORA_EXPORT int remora_agent_attach_leased(const void* env_buffer, const char* tool_list, void* scratch,
                                             size_t size, int32_t lease_fd, int32_t controller_pid) {
  if (listener_busy()) {
    close(lease_fd);  // ours from the call on, as always
    return REMORA_AGENT_ERR_BUSY;
  }
  if (scratch != nullptr && size != 0) munmap(scratch, size);
  pthread_mutex_lock(&g_lock);
  int rc = REMORA_AGENT_OK;
  if (remora_agent_info.attached && lease_live_locked()) {
    // Compare-and-set: the live owner keeps its session and its lease
    // (attach_locked refuses, naming it).
    close(lease_fd);
    rc = attach_locked(env_buffer, tool_list);
  } else {
    if (remora_agent_info.attached && lease_running_locked()) {
      // Its controller is gone and the watcher has not run yet: expire the
      // lease now, as the watcher would have.
      stop_lease_locked();
      detach_all_locked();
      remora_agent_info.lease_expired = 1;
    }
    if (remora_agent_info.attached) {
      close(lease_fd);  // attached with no lease: attach_locked says why it refuses
      rc = attach_locked(env_buffer, tool_list);
    } else {
      stop_lease_locked();  // none is armed while detached; be sure
      rc = arm_lease_locked(lease_fd, controller_pid);
      if (rc == REMORA_AGENT_OK) {
        rc = attach_locked(env_buffer, tool_list);
        if (rc != REMORA_AGENT_OK) stop_lease_locked();  // nothing attached: nothing to lease
      }
    }
  }
  rc = finish(rc);
  pthread_mutex_unlock(&g_lock);
  register_fork_lock();
  return rc;
}

namespace remora_agent {

// Runs every tool's tool_fini, last loaded first, and keeps their handles
// for the agent's destructor: nothing is unmapped before the controller's
// proof.
void fini_tools_locked() {
  g_unload_count = 0;
  for (int i = g_tool_count - 1; i >= 0; --i) {
    Tool& t = g_tools[i];
    if (t.inited && t.conf->tool_fini) t.conf->tool_fini(t.conf->tool_data);
    t.inited = false;
    if (t.handle == nullptr) continue;
    snprintf(g_unload_paths[g_unload_count], sizeof g_unload_paths[0], "%s", t.path);
    g_unload_tools[g_unload_count] = UnloadTool{t.handle, g_unload_paths[g_unload_count], nullptr};
    ++g_unload_count;
  }
  memset(g_tools, 0, sizeof g_tools);
  g_tool_count = 0;
  g_loaded = false;
  update_tool_names();
}

}  // namespace remora_agent

// See agent/protocol.h. Runs on the listener; the lock is taken for the
// last time here (the watcher is joined, so nobody else ever takes it).
REMORA_EXPORT int remora_agent_unload(void) {
  if (listener_busy()) return REMORA_AGENT_ERR_BUSY;
  pthread_mutex_lock(&g_lock);
  if (remora_agent_info.attached) {
    stop_lease_locked();
    detach_all_locked();
  }
  stop_lease_locked();
  if (remora_agent::channel_open()) {
    set_message(
        "the agent stays: this process opted in to the socket channel (REMORA_TOOL_ATTACH=1), which is how "
        "controllers reach it; its tools are detached");
    pthread_mutex_unlock(&g_lock);
    return finish(REMORA_AGENT_ERR_NOT_UNLOADABLE);
  }
  fini_tools_locked();
  // glibc's dlopen handle is the object's link_map: the one that holds this
  // function. (No dlopen(RTLD_NOLOAD) of our own name: a memfd-loaded agent's
  // name, /proc/self/fd/N, is closed by now.)
  Dl_info info{};
  link_map* self = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&remora_agent_unload), &info, reinterpret_cast<void**>(&self),
              RTLD_DL_LINKMAP) != 0)
    remora_agent_info.self_handle = reinterpret_cast<uint64_t>(self);
  // What the controller must prove before the dlclose (unload.cc). Without
  // a plan, unload_code_count stays 0 and no controller unloads the agent.
  // The listener stays for remora_agent_unload_forks; without a plan it
  // leaves at once: the tools are finalised, and nothing more can be done.
  char why[640];
  int rc = REMORA_AGENT_OK;
  remora_agent_info.unloading = 1;
  if (!plan_unload(g_unload_tools, g_unload_count, self, &g_hooks_inside, why, sizeof why)) {
    remora_agent_info.unload_code_count = 0;
    set_message("%s: the agent stays loaded (its tools are finalised)", why);
    rc = REMORA_AGENT_ERR_NOT_UNLOADABLE;
    __atomic_fetch_or(&g_futex_word, kUnloadBit, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&g_lock);
  return finish(rc);
}

// See agent/protocol.h. On the listener, every other thread stopped by the
// controller and none inside fork(): glibc's list of fork handlers can
// shrink without a fork walking it. Then the listener leaves.
REMORA_EXPORT int remora_agent_unload_forks(void) {
  if (listener_busy()) return REMORA_AGENT_ERR_BUSY;
  if (remora_agent_info.unloading == 0) {
    set_message("no unload is in progress");
    return finish(REMORA_AGENT_ERR_BAD_ARGUMENT);
  }
  release_fork_handlers(g_unload_tools, g_unload_count);
  remora_agent_info.unloading = 2;
  __atomic_fetch_or(&g_futex_word, kUnloadBit, __ATOMIC_RELEASE);
  return finish(REMORA_AGENT_OK);
}

REMORA_EXPORT int remora_agent_detach(void) {
  if (listener_busy()) return REMORA_AGENT_ERR_BUSY;
  pthread_mutex_lock(&g_lock);
  int rc;
  if (!remora_agent_info.attached) {
    set_message("no tools are attached");
    rc = REMORA_AGENT_ERR_NOT_ATTACHED;
  } else {
    stop_lease_locked();
    rc = detach_all_locked();
  }
  rc = finish(rc);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

// Arms the lease on `read_fd`, the read end of a pipe whose only write end
// the controller holds (it reopened it through /proc/PID/fd and had ours
// closed). EOF on it means the controller died: the tools are detached so
// they flush their data. Takes ownership of read_fd. -1 disarms.
REMORA_EXPORT int remora_agent_set_lease(int32_t read_fd, int32_t controller_pid) {
  if (listener_busy()) return REMORA_AGENT_ERR_BUSY;
  pthread_mutex_lock(&g_lock);
  int rc = REMORA_AGENT_OK;
  if (read_fd >= 0 && lease_live_locked() && remora_agent_info.lease_pid != controller_pid) {
    // Another live controller's lease is not ours to replace.
    set_message("attached by remora pid %d, lease live: its lease stays", remora_agent_info.lease_pid);
    close(read_fd);
    rc = REMORA_AGENT_ERR_LEASE;
  } else {
    stop_lease_locked();
    if (read_fd >= 0) rc = arm_lease_locked(read_fd, controller_pid);
  }
  rc = finish(rc);
  pthread_mutex_unlock(&g_lock);
  return rc;
}

void remora_agent::snapshot_info(struct remora_agent_info* out) {
  pthread_mutex_lock(&g_lock);
  memcpy(out, &remora_agent_info, sizeof *out);
  pthread_mutex_unlock(&g_lock);
}
