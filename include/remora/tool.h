/*
 * remora/tool.h — the tool ABI: what a library must export to be attachable
 * by Remora. Plain C, stable, versioned; includes nothing else of Remora.
 *
 * A tool is a shared library that exports two functions:
 *
 *   remora_configure()         -> its tool_init, tool_fini and tool_data
 *   remora_configure_attach()  -> its tool_attach and tool_detach
 *
 * Remora's in-target agent (libremora-agent.so) loads every tool of the
 * colon-separated tool list with dlopen(RTLD_NOW | RTLD_LOCAL) and calls, for
 * each tool in list order:
 *
 *   first attach:  remora_configure -> remora_configure_attach
 *                  -> tool_init -> tool_attach
 *   detach:        tool_detach
 *   re-attach:     tool_attach            (same tool list only)
 *   process exit:  tool_detach (if still attached) -> tool_fini
 *
 * A tool without remora_configure_attach cannot be attached: the agent
 * refuses it with a message saying so, and loads none of the list.
 *
 * Threads. Every callback except tool_fini runs on the agent's listener
 * thread "remora-listen", one callback at a time (the agent serialises
 * attach and detach); in a process attached through its socket channel
 * (a process that opted in at launch, where ptrace is refused) on the
 * agent's "remora-channel" thread instead, which may be another thread for
 * each call (it leaves when idle), and a lease-forced detach on the lease
 * watcher "remora-lease" (over ptrace as well). Each blocks every signal and holds no lock of
 * the application or of libc when it calls the tool, so a callback may
 * allocate, take locks, create threads, install signal handlers, open files
 * and dlopen. It must return: the controller waits for it (with a deadline,
 * default 10 s per operation). tool_fini runs on the thread that calls
 * exit() (from an atexit handler or the agent's destructor), after the
 * application's own atexit handlers registered later than the agent; it may
 * allocate and write files but must not create threads or wait for them.
 * After a fork(), the child keeps the loaded tools in their current state;
 * it gets its own listener, so the child can be attached/detached on its own.
 *
 * Return values: 0 means success; any other value makes the agent undo the
 * attach it was doing (tools already attached in this round are detached,
 * the environment is rolled back) and report the failing tool and value.
 *
 * Structs are size-prefixed: the agent fills `size` with the size it knows,
 * a tool sets `size` in what it returns; both sides read only the fields that
 * fit in the smaller size, so either side may be newer.
 */
#ifndef REMORA_TOOL_H_
#define REMORA_TOOL_H_

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a callback's meaning changes; fields are only ever added. */
#define REMORA_TOOL_ABI_VERSION 1u

/* What the agent tells a tool about itself (read-only for the tool; valid
 * only during the call it is passed to). */
typedef struct remora_tool_info {
  uint32_t size;         /* sizeof(remora_tool_info_t) as the agent knows it */
  uint32_t abi_version;  /* REMORA_TOOL_ABI_VERSION of the agent */
  const char* tool_path; /* the path the tool was loaded from */
  uint32_t tool_index;   /* position in the tool list, from 0 */
  uint32_t reserved;
  pid_t pid;        /* the process as it sees itself (getpid()) */
  uint64_t session; /* 1 for the first attach, +1 for each re-attach */
} remora_tool_info_t;

typedef int (*remora_tool_init_fn)(void* tool_data);
typedef void (*remora_tool_fini_fn)(void* tool_data);
typedef int (*remora_tool_attach_fn)(void* tool_data, const remora_tool_info_t* info);
typedef int (*remora_tool_detach_fn)(void* tool_data, const remora_tool_info_t* info);

/* Returned by remora_configure. Owned by the tool (typically a static
 * object); must stay valid until tool_fini returns. */
typedef struct remora_tool_configure_result {
  uint32_t size; /* sizeof(remora_tool_configure_result_t) */
  uint32_t reserved;
  remora_tool_init_fn tool_init; /* may be NULL */
  remora_tool_fini_fn tool_fini; /* may be NULL */
  void* tool_data;               /* passed to every callback */
} remora_tool_configure_result_t;

/* Returned by remora_configure_attach. Owned by the tool. */
typedef struct remora_tool_configure_attach_result {
  uint32_t size; /* sizeof(remora_tool_configure_attach_result_t) */
  uint32_t reserved;
  remora_tool_attach_fn tool_attach; /* required */
  remora_tool_detach_fn tool_detach; /* required */
} remora_tool_configure_attach_result_t;

/* Exported by a tool. Called once, on the listener thread, on the first
 * attach. Return NULL to decline (the attach then fails, naming the tool). */
remora_tool_configure_result_t* remora_configure(uint32_t abi_version, const remora_tool_info_t* info);
/* Exported by an attachable tool. Called once, right after remora_configure. */
remora_tool_configure_attach_result_t* remora_configure_attach(uint32_t abi_version,
                                                               const remora_tool_info_t* info);

/* Optional: the unload (remora detach --unload). The agent's dlclose unmaps a
 * tool only once the controller has proven, with every thread of the process
 * stopped, that no thread is in the tool's code or can return into it
 * (docs/architecture.md, "The unload"). A thread's program counter tells
 * where it is; what it will return into is told by the tool itself: a tool
 * whose code application threads run (a signal handler, a call wrapper that
 * calls the real function and returns into the wrapper) counts those threads
 * in before they call out of the tool and out after they are back, and
 * exports where the counts are:
 *
 *   const remora_tool_quiesce_t remora_tool_quiesce;
 *
 * The sum of the `stripes` longs at counters, counters + stride, ... is the
 * number of threads inside; read while every thread is stopped, it is exact.
 * A tool that cannot be unloaded (a thread blocked for good inside one of its
 * wrappers) sets *pinned to 1 in tool_fini and keeps itself mapped
 * (dlopen RTLD_NODELETE): it is then left out of the proof and named as kept.
 * A tool that exports nothing has no code that outlives tool_fini, and no
 * fork handlers (pthread_atfork) either.
 *
 *   void remora_tool_release(void);
 *
 * Optional too: called on the unloading thread right before the tool's
 * dlclose, once the proof holds, never at process exit. The place to give
 * back memory that a handler or wrapper in flight could still touch at
 * tool_fini (sample buffers, rings). */
typedef struct remora_tool_quiesce {
  uint32_t size; /* sizeof(remora_tool_quiesce_t) */
  uint32_t stripes;
  uint64_t stride;
  const long* counters;
  const int32_t* pinned; /* may be NULL: never pinned */
  /* The key the tool registered its fork handlers under
   * (__register_atfork(prepare, parent, child, fork_key)), NULL: none. The
   * agent unregisters them (__cxa_finalize(fork_key)) while the controller
   * holds every other thread stopped and none inside fork(): glibc 2.36
   * indexes past the end of its list of handlers when it shrinks under a
   * fork, as a dlclose's unregistration of pthread_atfork handlers would.
   * It does so for a tool it then keeps (pinned) as well: such a tool must
   * register them again at its next remora_configure. The default tool
   * knows they are gone by an exit function registered under the same key
   * (__cxa_atexit(fn, arg, fork_key)), which that __cxa_finalize runs. */
  void* fork_key;
} remora_tool_quiesce_t;
typedef void (*remora_tool_release_fn)(void);

typedef remora_tool_configure_result_t* (*remora_configure_fn)(uint32_t, const remora_tool_info_t*);
typedef remora_tool_configure_attach_result_t* (*remora_configure_attach_fn)(uint32_t,
                                                                             const remora_tool_info_t*);

#ifdef __cplusplus
}
#endif

#endif /* REMORA_TOOL_H_ */
