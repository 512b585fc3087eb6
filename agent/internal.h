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

// lease.cc: the lease, a pipe whose only write end the controller holds;
// EOF (POLLHUP) means the controller is gone, and the watcher thread
// ("remora-lease") then detaches the tools. All under g_lock.
void close_lease_locked();
void join_expired_watcher_locked();
void stop_lease_locked();
bool lease_live_locked();     // armed, and its controller still there
bool lease_running_locked();  // armed (its controller may be gone already)
int arm_lease_locked(int32_t read_fd, int32_t controller_pid);
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
