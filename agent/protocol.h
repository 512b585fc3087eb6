// The protocol between Remora's controller and its in-target agent
// (libremora-agent.so). Shared by both sides; plain C layout, versioned.
//
// Over ptrace, the controller reads the agent's exported `remora_agent_info`
// block through /proc/PID/mem and makes the agent's listener thread call the
// exported entry points below (remote calls). So the "protocol" is: symbol
// names, their signatures, and the layout of the info block. A process that
// opted in at launch is also reached over a socket (agent/channel_wire.h),
// whose requests run the same entry points.
#ifndef REMORA_AGENT_PROTOCOL_H_
#define REMORA_AGENT_PROTOCOL_H_

#include <stdint.h>

#define REMORA_AGENT_MAGIC 0x52454d4f52414147ull /* "REMORAAG" */
/* 2: remora_agent_attach_leased (REMORA_AGENT_FEATURE_LEASED_ATTACH). The
 * info block's layout is unchanged: a controller of version 1 reads it as
 * before and keeps its old order (attach, then set_lease). */
/* 3: remora_agent_unload (REMORA_AGENT_FEATURE_UNLOAD) and the two fields at
 * the end of the info block (self_handle, kept); a controller of version 2
 * reads the block's first part as before. */
/* 4: REMORA_AGENT_FEATURE_FORK_LEASE; the reserved field of protocol 3 is
 * forked_from (it read 0 before, and still does in a process that was not
 * forked while attached). */
/* 5: REMORA_AGENT_FEATURE_LOADER_ATTACH (remora_agent_loader_attach) and
 * the field at the end of the info block, retire_pending. */
/* 6: REMORA_AGENT_FEATURE_LISTENER_ON_REQUEST (remora_agent_start_listener)
 * and the field at the end of the info block, listener_requested. */
/* 7: REMORA_AGENT_FEATURE_PROVEN_UNLOAD: remora_agent_unload no longer
 * dlcloses the tools; it publishes what the agent's dlclose will unmap and
 * the tools' counts (the fields at the end of the info block), for the
 * controller's proof, and the agent's destructor dlcloses the tools. */
#define REMORA_AGENT_PROTOCOL_VERSION 7u
#define REMORA_AGENT_MESSAGE_SIZE 2048
#define REMORA_AGENT_TOOLS_SIZE 4096
/* Size of the exported `remora_agent_scratch` buffer (byte arguments). */
#define REMORA_AGENT_SCRATCH_SIZE 16384
/* The agent also exports `remora_agent_stub`: Remora's call/syscall stubs
 * (arch::x86_64::stub_code()), so remote calls on the listener need no
 * scratch mapping. */

/* Feature bits in remora_agent_info.features. */
#define REMORA_AGENT_FEATURE_LEASE 0x1u
#define REMORA_AGENT_FEATURE_FORK_LISTENER 0x2u
/* remora_agent_attach_leased: the lease is armed by the attach call itself,
 * before any tool runs. A controller that finds the bit clear falls back to
 * remora_agent_attach_unmap (or _attach) followed by remora_agent_set_lease. */
#define REMORA_AGENT_FEATURE_LEASED_ATTACH 0x4u
/* remora_agent_unload: the agent can be taken out of the process again (it
 * was loaded without RTLD_NODELETE; see the entry point below). */
#define REMORA_AGENT_FEATURE_UNLOAD 0x8u
/* A process forked while attached keeps its parent's session: its tools stay
 * attached (a tool restarts what fork did not copy, its threads and
 * timers, from a pthread_atfork handler of its own, as the default tool does),
 * forked_from names the parent, and when the parent was under a lease the
 * child arms its own watcher on its inherited copy of the lease pipe's read
 * end (lease_pid stays the parent's controller): the controller's death, or
 * its closing the lease, detaches the child's tools too. The fork waits for
 * an entry point in progress (attach, detach, lease), so that a child never
 * copies a session half-made. A controller that finds the bit clear arms a
 * lease of its own in such a child (remora_agent_set_lease). */
#define REMORA_AGENT_FEATURE_FORK_LEASE 0x10u
/* remora_agent_loader_attach: a first attach without a lease runs on the
 * controller's loader thread, right after the dlopen that loaded the agent
 * (the thread trampoline's hook, arch/loader_block.h), instead of in a
 * remote call on the listener; the listener then removes the controller's
 * scratch and the loader's stack once that thread is gone. */
#define REMORA_AGENT_FEATURE_LOADER_ATTACH 0x20u

/* The agent starts no thread of its own when it is loaded: not the listener,
 * not anything else, until an attach is asked for. Every thread of a process
 * takes part in glibc's set*id broadcast, and a program that changes its
 * credentials with per-thread state (setpriv and capsh raise capabilities or
 * PR_SET_KEEPCAPS on the main thread only) is aborted by glibc when one
 * thread's setresuid/setresgid fails where the main thread's succeeded. A
 * preloaded agent therefore costs such a program nothing until a controller
 * asks. The controller starts the listener: it runs the thread trampoline
 * (arch/loader_block.h) with dlopen(soname, RTLD_NOW | RTLD_NOLOAD) and the
 * hook remora_agent_start_listener (an injected agent: the hook of the load
 * itself, or remora_agent_loader_attach, which starts it too), then waits for
 * listener_tid as before. A forked child starts a listener only when it keeps
 * an attached session; otherwise it is on request again. */
#define REMORA_AGENT_FEATURE_LISTENER_ON_REQUEST 0x40u
/* remora_agent_unload leaves every tool mapped and publishes, in
 * unload_code and unload_counters, what the controller must check with every
 * thread of the process stopped before it has the agent dlclosed
 * (docs/architecture.md, "The unload"). A controller never unloads an agent
 * without this bit: its unload could unmap code a thread is still in. */
#define REMORA_AGENT_FEATURE_PROVEN_UNLOAD 0x80u
/* Entries of unload_code and unload_counters. */
#define REMORA_AGENT_UNLOAD_RANGES 16

/* Result codes of the entry points (also left in info.last_result). */
enum remora_agent_result {
  REMORA_AGENT_OK = 0,
  REMORA_AGENT_ERR_REFUSED = 1,         /* REMORA_TOOL_ATTACH=0 / ROCP_TOOL_ATTACH=0 */
  REMORA_AGENT_ERR_BAD_ARGUMENT = 2,    /* malformed env buffer or tool list */
  REMORA_AGENT_ERR_LOAD = 3,            /* a tool failed to dlopen */
  REMORA_AGENT_ERR_NOT_ATTACHABLE = 4,  /* a tool lacks remora_configure_attach / remora_configure */
  REMORA_AGENT_ERR_TOOL_FAILED = 5,     /* a tool callback returned non-zero */
  REMORA_AGENT_ERR_DIFFERENT_TOOLS = 6, /* re-attach with another tool list */
  REMORA_AGENT_ERR_NOT_ATTACHED = 7,    /* detach without attach */
  REMORA_AGENT_ERR_ALREADY_ATTACHED = 8,
  REMORA_AGENT_ERR_LEASE = 9, /* the lease could not be armed */
  /* Protocol 5: the listener was running an attach a loader thread handed
   * it (remora_agent_loader_attach) when this call interrupted it: nothing
   * done, info untouched; try again once that attach is over. */
  REMORA_AGENT_ERR_BUSY = 10,
  /* Protocol 6: the listener thread could not be started (out of threads or
   * memory: pthread_create or mmap failed). */
  REMORA_AGENT_ERR_NO_LISTENER = 11,
  /* Protocol 7: remora_agent_unload refused; the message says why (an
   * agent whose socket channel is open stays: it is how controllers reach
   * the process). The tools were detached, as by remora_agent_detach. */
  REMORA_AGENT_ERR_NOT_UNLOADABLE = 12,
};

/* Exported by the agent as `remora_agent_info`. Written only by the agent
 * (under its lock); the controller reads it. */
struct remora_agent_info {
  uint64_t magic;                          /* REMORA_AGENT_MAGIC once initialised */
  uint32_t size;                           /* sizeof(struct remora_agent_info) */
  uint32_t version;                        /* REMORA_AGENT_PROTOCOL_VERSION */
  uint32_t features;                       /* REMORA_AGENT_FEATURE_* */
  int32_t listener_tid;                    /* tid of "remora-listen" (0 while starting) */
  int32_t attached;                        /* 1 while tools are attached */
  int32_t last_result;                     /* enum remora_agent_result of the last call */
  uint64_t sessions;                       /* attaches so far */
  uint64_t detaches;                       /* detaches so far (including lease-forced) */
  int32_t lease_pid;                       /* controller holding the lease (target's view), 0 none */
  int32_t lease_expired;                   /* 1 once the lease forced a detach */
  char tools[REMORA_AGENT_TOOLS_SIZE];     /* loaded tool list, ':'-separated */
  char message[REMORA_AGENT_MESSAGE_SIZE]; /* why the last call failed ("" on success) */
  /* Protocol 3 (REMORA_AGENT_FEATURE_UNLOAD): */
  uint64_t self_handle; /* the agent's own dlopen handle, set by remora_agent_unload */
  int32_t unloading;    /* 1 once remora_agent_unload ran; protocol 7: 2 once
                           remora_agent_unload_forks ran (the listener is leaving) */
  int32_t forked_from;  /* protocol 4: the parent (this process's view) when it was forked attached, else 0 */
  char kept[REMORA_AGENT_TOOLS_SIZE]; /* tools remora_agent_unload could not unload, ':'-separated */
  /* Protocol 5: 1 from a remora_agent_loader_attach until the listener has
   * removed what it was given to retire (or found nothing to remove). */
  int32_t retire_pending;
  int32_t loader_rc;    /* the result of that attach, once loader_done names it */
  uint64_t loader_done; /* the id of the last loader attach the listener ran */
  /* The one word the controller writes: the id of a loader attach whose
   * controller has read all it needs from its scratch (the listener
   * retires it only then, or once the request's ack_timeout_ms passed). */
  uint64_t retire_go;
  /* Protocol 6 (REMORA_AGENT_FEATURE_LISTENER_ON_REQUEST): 1 once a listener
   * was asked for in this process (listener_tid is then published soon, or
   * is already), 0 while none was: the controller must start one. */
  int32_t listener_requested;
  /* 1 while the attached session came through the socket channel
   * (agent/channel_wire.h), 0 through ptrace (read 0 before: reserved). */
  int32_t session_channel;
  /* Protocol 7 (REMORA_AGENT_FEATURE_PROVEN_UNLOAD), set by
   * remora_agent_unload: {start, end} of each executable segment the
   * agent's dlclose will unmap (the agent's own, and each tool's that is not
   * kept), and {address, stripes, stride} of each tool's counts of threads
   * inside its code (remora/tool.h, remora_tool_quiesce). */
  uint32_t unload_code_count;
  uint32_t unload_counter_count;
  uint64_t unload_code[REMORA_AGENT_UNLOAD_RANGES][2];
  uint64_t unload_counters[REMORA_AGENT_UNLOAD_RANGES][3];
  /* The second word the controller writes: 1 once it has proven the unload
   * safe, right before it has the agent dlclosed. Only then does the
   * agent's destructor release and dlclose the tools: a destructor run by
   * exit() after an unload that was refused leaves them as they are. */
  uint32_t unload_go;
  uint32_t reserved7;
  /* [start, end) of the C library's fork(), set with unload_code: a thread
   * whose stack holds a return address into it is inside a fork, where it
   * may be about to call a fork handler of ours that it read before the
   * unload unregistered them (glibc 2.36 calls each handler without its
   * lock held). The controller waits for such a thread to leave. */
  uint64_t unload_fork[2];
  /* [start, end) of the C library's __register_atfork (pthread_atfork): a
   * thread inside it holds the lock that the agent's unregistration takes
   * while it holds another (__cxa_finalize's); the controller waits for it
   * too, so that a call it takes back never leaves a lock of glibc's taken. */
  uint64_t unload_atfork[2];
};

/* The argument of remora_agent_loader_attach, in the controller's scratch
 * (read before the hook returns, never after). */
#define REMORA_AGENT_LOADER_MAGIC 0x52454d4f524c4452ull /* "REMORLDR" */
struct remora_agent_loader_request {
  uint64_t magic;      /* REMORA_AGENT_LOADER_MAGIC */
  uint64_t env_buffer; /* as remora_agent_attach's (0: none) */
  uint64_t env_size;   /* its bytes (at most 8192, as the tool list) */
  uint64_t tool_list;  /* as remora_agent_attach's */
  /* {start, size}: the controller's scratch, and the loader thread's stack
   * (taken only when the thread runs on exactly it), unmapped once that
   * thread is gone; {0, 0}: none. */
  uint64_t retire[2][2];
  uint64_t id;             /* what retire_go says once the controller is done with its scratch */
  uint64_t ack_timeout_ms; /* without that word: retired after this long (the controller died) */
  /* retire[0] is unmapped only while its first 8 bytes are still this and
   * its word at offset 16 is its own address (the scratch's header: not
   * removed and replaced meanwhile by another controller's reclaim). */
  uint64_t scratch_magic;
};

/* Entry points, all run on the listener thread by a remote call:
 *
 * int remora_agent_attach(const void* env_buffer, const char* tool_list);
 *     env_buffer: [uint32 count] then count pairs "NAME\0VALUE\0" (may be NULL).
 *     tool_list: colon-separated entries "PATH" or "NAME|PATH" (NAME: how
 *     the tool is known and compared on re-attach; PATH: what to dlopen).
 * int remora_agent_attach_unmap(const void* env_buffer, const char* tool_list,
 *                               void* scratch, size_t size);
 *     The same, after removing [scratch, scratch + size): the controller's
 *     own mapping that loaded the agent, which no thread runs in any more.
 *     Used for the first attach; an agent without it gets a munmap call.
 * int remora_agent_attach_leased(const void* env_buffer, const char* tool_list,
 *                                void* scratch, size_t size,
 *                                int32_t lease_fd, int32_t controller_pid);
 *     The same as _attach_unmap (scratch may be NULL), with the lease armed
 *     first, under the agent's lock: the controller is recorded before any
 *     tool runs, so a controller killed at any instant of the call leaves a
 *     lease whose EOF detaches whatever the call attached. Compare-and-set:
 *     while another controller's lease is live and its tools attached, the
 *     call refuses (ALREADY_ATTACHED) and that lease stays as it was; a
 *     lease found dead (EOF already) is expired on the spot and the attach
 *     goes on. The agent owns lease_fd from the call on, whatever it
 *     returns (it closes it when the attach fails or is refused).
 * int remora_agent_detach(void);
 * int remora_agent_unload(void);
 *     Protocol 3. Takes the tools out of the process, on the listener: detaches
 *     them if attached, stops the lease watcher (joined), runs each tool's
 *     tool_fini; a tool that pinned itself (remora_tool_quiesce) is named in
 *     `kept`. Protocol 7: the tools stay mapped; unload_code and
 *     unload_counters say what the agent's dlclose will unmap and what the
 *     controller must find at zero, with every thread stopped, before it
 *     (the agent's destructor calls each tool's remora_tool_release and
 *     dlcloses it). Refused (NOT_UNLOADABLE) while the socket channel is
 *     open. Protocol 7: `unloading` is 1 and the listener stays for
 *     remora_agent_unload_forks. Records the agent's own handle in self_handle and tells
 *     the listener to return as soon as the call is over: the controller waits
 *     for its thread to be gone, then has a fresh thread dlclose(self_handle)
 *     (never the listener, whose code that is; never an interrupted thread,
 *     which may hold the loader lock). After this call the agent takes no
 *     more calls: a later attach loads it afresh.
 * int remora_agent_unload_forks(void);
 *     Protocol 7, after remora_agent_unload, while the controller holds
 *     every other thread stopped and none inside fork(): takes the tools'
 *     fork handlers (remora_tool_quiesce's fork_key) and the agent's out of
 *     glibc's list (__cxa_finalize of their keys; glibc 2.36 indexes past
 *     the end of that list when it shrinks under a fork), sets `unloading`
 *     to 2 and has the listener return.
 * int remora_agent_loader_attach(const struct remora_agent_loader_request* r);
 *     Protocol 5. Not a remote call: the controller's loader thread calls it
 *     (the trampoline's hook) once its dlopen of the agent returned. It
 *     copies the request and hands it to the listener (retire_pending = 1)
 *     and returns 0 (BUSY while another one is in progress, BAD_ARGUMENT:
 *     not taken). Once the loader thread is gone, the listener runs the
 *     attach of remora_agent_attach as that call would (every tool callback
 *     still runs on the listener) and publishes its result (loader_rc, then
 *     loader_done = r->id); then, once the controller wrote r->id into
 *     retire_go (it read all it needs from its scratch) or r->ack_timeout_ms
 *     passed, it unmaps r->retire (the scratch while its header is still
 *     there, the stack only if the loader thread ran on it) and clears
 *     retire_pending. Only for an attach without a lease: a leased attach is
 *     a remote call. Protocol 6: starts the listener first when none was
 *     (NO_LISTENER when it cannot: not taken).
 * int remora_agent_start_listener(uint64_t drop_reference);
 *     Protocol 6. Not a remote call either: the trampoline's hook, on the
 *     controller's fresh thread, after its dlopen returned. Starts the
 *     listener once per process (a second call, from a racing controller,
 *     finds it started and does nothing) and returns 0, or NO_LISTENER. With
 *     drop_reference non-zero the dlopen was a RTLD_NOLOAD of an agent that
 *     was loaded already (preloaded, or forked): the reference it took is
 *     given back here, so that an unload's one dlclose still unloads.
 * int remora_agent_set_lease(int32_t read_fd, int32_t controller_pid);
 *     read_fd: read end of a pipe whose only write end the controller holds
 *     (-1 disarms); controller_pid is informational. Refuses (ERR_LEASE,
 *     closing read_fd) while another live lease is armed.
 */

#endif /* REMORA_AGENT_PROTOCOL_H_ */
