// What agent.cc and lease.cc share inside the agent (nothing here is
// exported: the agent's only exports are its remora_agent_* entry points).
#pragma once

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

namespace remora_agent {

// agent.cc
// The agent's lock: every entry point, the lease watcher and exit take it.
// Error-checking, so that a fork handler on a thread that holds it does not
// deadlock.
extern pthread_mutex_t g_lock;

// A thread of the agent runs on a stack the agent maps itself and unmaps
// once the thread is gone: glibc would keep a stack of its own allocation in
// its stack cache for good, one more mapping after an unload.
struct OwnStack {
  void* base = nullptr;
};
constexpr size_t kStackSize = 256 * 1024;
// Starts `fn` on a thread of its own stack with every signal blocked.
bool start_thread(pthread_t* thread, void* (*fn)(void*), OwnStack* stack);
void free_stack(OwnStack* stack);
// The info block's message (why the last call failed).
void set_message(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Detaches every attached tool (tool_detach), under g_lock.
int detach_all_locked();
// The attach proper, under g_lock: refusals, environment, tools.
int attach_locked(const void* env_buffer, const char* tool_list);
// Records an entry point's result in the info block (last_result; the
// message is cleared on success) and returns it.
int finish(int result);
// Registers the fork handler after tools were loaded (g_lock released).
void register_fork_lock();
uint64_t monotonic_ms();
// Every exported entry point begins with an EntryScope and returns BUSY at
// once when it is not ok: a remote call that interrupted the listener while
// it runs a handed-off attach or another entry point (agent.cc, enter_entry).
bool listener_busy();  // the listener runs a handed-off attach
bool enter_entry();
void leave_entry();
// The threads inside an entry point or a hook of the agent's (a controller's
// thread, or one of the process's that a call borrowed), for the unload's
// proof (unload.cc, plan_unload): one blocked in a C library call from here
// has its pc outside the agent's code.
extern long g_hooks_inside;
struct HookScope {
  HookScope() { __atomic_fetch_add(&g_hooks_inside, 1, __ATOMIC_SEQ_CST); }
  ~HookScope() { __atomic_fetch_sub(&g_hooks_inside, 1, __ATOMIC_RELEASE); }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};
struct EntryScope {
  const HookScope counted;
  const bool ok = enter_entry();
  EntryScope() = default;
  EntryScope(const EntryScope&) = delete;
  EntryScope& operator=(const EntryScope&) = delete;
  ~EntryScope() {
    if (ok) leave_entry();
  }
};

// lease.cc: the lease, a pipe whose only write end the controller holds;
// EOF (POLLHUP) means the controller is gone, and the watcher thread
// ("remora-lease") then detaches the tools. All under g_lock.
void close_lease_locked();
void join_expired_watcher_locked();
void stop_lease_locked();
bool lease_live_locked();     // armed, and its controller still there
bool lease_running_locked();  // armed (its controller may be gone already)
int arm_lease_locked(int32_t read_fd, int32_t controller_pid);
// Protocol 8 (claim.cc): a lease on a pipe of the agent's own making, whose
// write end it keeps (in *write_fd, named by *dev/*ino) until the controller
// of `token` claims it, or `claim_ms` pass (the watcher then closes it).
// With `watch_pid`, the controller's exit (a pidfd of controller_pid) closes
// it at once.
int arm_own_lease_locked(int32_t controller_pid, bool watch_pid, uint64_t token, uint32_t claim_ms,
                         int* write_fd, uint64_t* dev, uint64_t* ino);
// Closes the kept write end for `token`: OK when it is the pipe `ino`.
int claim_lease_locked(uint64_t token, uint64_t ino);
// The token of the armed lease (0: none, or a lease whose pipe the
// controller made: set_lease, attach_leased, the socket channel).
uint64_t lease_token_locked();
// In a fork's child: the parent's watcher did not come along; a session
// the child keeps is leased again on its copy of the read end. Returns the
// controller of that lease, 0 when there is none.
int32_t inherit_lease_in_child();
OwnStack& lease_stack();

// unload.cc: the unload's plan and the tools' dlclose (agent/protocol.h,
// remora_agent_unload). A tool after its tool_fini, still mapped.
struct UnloadTool {
  void* handle;
  const char* path;
  // The key its fork handlers were registered under (remora_tool_quiesce's
  // fork_key), found by plan_unload: the listener takes them out with every
  // other thread stopped, where a dlsym (the loader's lock) must not run.
  void* fork_key;
};
// Fills the info block's kept, unload_code and unload_counters for the
// controller's proof; false (with `why`) when it cannot say what the
// unload would unmap: the agent then stays.
// `hooks_inside`: the agent's own count of controllers' threads in its hooks.
bool plan_unload(UnloadTool* tools, int count, const void* self_link_map, const long* hooks_inside, char* why,
                 size_t why_size);
// The agent's fork handlers, registered under a key of their own so that
// an unload can take them out of glibc's list before its proof (glibc
// offers no other way than __cxa_finalize of the key they were registered
// with; nothing else is registered with it).
int register_fork_handlers(void (*prepare)(void), void (*parent)(void), void (*child)(void));
void unregister_fork_handlers();
// The tools' fork handlers (remora_tool_quiesce's fork_key), then ours.
void release_fork_handlers(const UnloadTool* tools, int count);
// The agent's destructor, once the controller has proven the unload safe
// (unload_go): each tool's remora_tool_release, then its dlclose.
void release_tools(const UnloadTool* tools, int count);

}  // namespace remora_agent
