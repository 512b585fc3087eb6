/*
 * remora/remora.h — Remora's C API (libremora.so): attach tool libraries to
 * running processes, detach them, and read a process's attach state.
 * Plain C, stable; includes nothing else of Remora.
 *
 *   remora_options_t o;
 *   remora_options_init(&o);
 *   o.tools = "/opt/tools/libmytool.so";
 *   if (remora_attach(pid, &o) != REMORA_STATUS_SUCCESS)
 *     fprintf(stderr, "attach: %s\n", remora_last_error());
 *   ...
 *   remora_detach(pid);
 *
 * One controller per process. Every function works on a single process-wide
 * controller, created on first use and never destroyed (so no function races
 * with static destructors at exit). It remembers the processes it attached
 * (its sessions) for remora_detach(0) and remora_detach_tree(). When the
 * calling process exits, the sessions close without detaching: tools stay
 * attached, unless the attach armed a lease (remora_options_t.lease), in
 * which case the agent in each target detaches its tools itself.
 *
 * Threads. Every function may be called from any thread, concurrently:
 * operations on different processes run in parallel, operations on one
 * process are serialised. Each call does its work (ptrace included) on the
 * calling thread and returns when it is done or its deadline passed; no
 * callback is ever made into the caller.
 *
 * Errors. Functions that can fail return a remora_status_t; on failure they
 * also store a message on the calling thread that says what failed and how
 * to fix it, read with remora_last_error(). Nothing aborts or throws, and
 * nothing is printed unless REMORA_LOG asks for traces (e.g. REMORA_LOG=all,
 * to stderr).
 *
 * fork(). Do not call these functions in the child of a multi-threaded
 * caller that forked while another thread was inside one (a lock may be
 * held); exec first, as with any library that has threads.
 *
 * Ownership. The library never keeps a pointer the caller passed in: strings
 * and arrays in remora_options_t are read during the call only. Strings the
 * library returns are owned by the library (see each function).
 *
 * Structs are size-prefixed: the caller sets `size` (remora_options_init
 * does it for options) and the library reads or writes only the fields that
 * fit in it, so a program built against an older header keeps working with a
 * newer library. Fields are only ever added at the end.
 *
 * The targets need Remora's agent, libremora-agent.so: it is looked for in
 * remora_options_t.agent_path, then $REMORA_AGENT_PATH, then next to
 * libremora.so, then next to (and in ../lib of) the calling executable, then
 * in the install location.
 */
#ifndef REMORA_REMORA_H_
#define REMORA_REMORA_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define REMORA_API __attribute__((visibility("default")))
#else
#define REMORA_API
#endif

/* The version of this API; libremora.so's SONAME is libremora.so.<major>. */
#define REMORA_API_VERSION_MAJOR 0
#define REMORA_API_VERSION_MINOR 3 /* 2: remora_detach_with, REMORA_DETACH_UNLOAD; 3: remora_check_target */

/*
 * Status codes. One per error code of Remora's engine (same numbers, in the
 * same order), so nothing is lost on the way out. New codes are only ever
 * added before REMORA_STATUS_LAST; treat an unknown value as a failure.
 */
typedef enum remora_status {
  REMORA_STATUS_SUCCESS = 0,            /* the operation succeeded */
  REMORA_STATUS_INVALID_ARGUMENT = 1,   /* unusable argument: NULL, bad size, no tool, tool list differs... */
  REMORA_STATUS_NO_SUCH_PROCESS = 2,    /* no process (or thread) with that id */
  REMORA_STATUS_OWN_PROCESS = 3,        /* the calling process cannot be its own target */
  REMORA_STATUS_ZOMBIE = 4,             /* the process has exited and waits to be reaped */
  REMORA_STATUS_KERNEL_THREAD = 5,      /* kernel threads have no user space */
  REMORA_STATUS_STATIC_BINARY = 6,      /* no dynamic loader / libc in the target */
  REMORA_STATUS_TRACED_BY_OTHER = 7,    /* another tracer (a debugger) holds the process */
  REMORA_STATUS_PTRACE_DENIED = 8,      /* ptrace refused: uid, capability, Yama, dumpable */
  REMORA_STATUS_LIBRARY_NOT_MAPPED = 9, /* a library Remora needs is not loaded in the target */
  REMORA_STATUS_AMBIGUOUS_LIBRARY = 10, /* a library name matches several mapped libraries */
  REMORA_STATUS_SYMBOL_NOT_FOUND = 11,  /* a symbol Remora needs is missing in the target */
  REMORA_STATUS_TIMED_OUT = 12,         /* a deadline passed (remora_options_t.timeout_msec) */
  REMORA_STATUS_TARGET_EXITED = 13,     /* the target exited (or was killed) meanwhile */
  REMORA_STATUS_FAULT = 14,             /* a call made in the target faulted */
  REMORA_STATUS_PARSE = 15,             /* malformed input (a /proc file, an ELF image) */
  REMORA_STATUS_IO = 16,                /* a system call failed */
  REMORA_STATUS_NOT_SUPPORTED = 17,     /* the kernel, libc or architecture lacks a feature */
  REMORA_STATUS_IDENTITY_MISMATCH = 18, /* a file is not the one mapped in the target */
  REMORA_STATUS_INTERNAL = 19,          /* a bug in Remora: please report it */
  REMORA_STATUS_REFUSED = 20, /* the target refuses tools (REMORA_TOOL_ATTACH=0 / ROCP_TOOL_ATTACH=0) */
  REMORA_STATUS_NOT_ATTACHABLE = 21,   /* a library lacks remora_configure_attach (or is no tool) */
  REMORA_STATUS_TOOL_FAILED = 22,      /* a tool failed to load, or a callback returned an error */
  REMORA_STATUS_NOT_ATTACHED = 23,     /* detach, but no tools are attached */
  REMORA_STATUS_ALREADY_ATTACHED = 24, /* attach, but tools are attached already */
  REMORA_STATUS_LAST                   /* one past the last code; not a status */
} remora_status_t;

/* How the library reaches the agent in a process (remora_options_t.channel,
 * remora_detach_options_t.channel; since 0.4, in bytes that were reserved
 * and zero before, so an older caller gets AUTO).
 *   AUTO    ptrace where it is allowed; where it is refused (the process is
 *           not dumpable, Yama, no CAP_SYS_PTRACE, a seccomp profile of
 *           ours) the agent's socket, when the process opted in.
 *   PTRACE  ptrace only (the agent is injected when the process has none).
 *   SOCKET  the socket only: the process must have opted in at launch
 *           (libremora-agent.so preloaded with REMORA_TOOL_ATTACH=1 or
 *           ROCP_TOOL_ATTACH=1, or `remora run --listen`); nothing stops or
 *           reads the process, the tools go over the socket as descriptors.
 * A process attached through its socket is detached through it. Trees are
 * walked through ptrace only: with SOCKET, attach_children must be false. */
#define REMORA_CHANNEL_AUTO 0
#define REMORA_CHANNEL_PTRACE 1
#define REMORA_CHANNEL_SOCKET 2

/*
 * Options of an attach. Initialise with remora_options_init, then set what
 * you need. The library reads them during the call only.
 */
typedef struct remora_options {
  uint32_t size;         /* sizeof(remora_options_t) as the caller knows it */
  uint32_t timeout_msec; /* deadline per remote operation in each target; 0 = 10000 */
  /* Tool libraries, colon-separated paths as this process sees them, in
   * call order. Required. */
  const char* tools;
  /* Environment set in the target (setenv) before the tools load: `env_count`
   * strings "NAME=VALUE" (NAME non-empty, no '='). May be NULL when
   * env_count is 0. */
  const char* const* env;
  size_t env_count;
  /* true: remora_attach(pid) attaches the whole process tree under pid, as
   * remora_attach_tree does. */
  bool attach_children;
  /* true: should this process die before detaching, the agent in each target
   * detaches the tools itself (they flush their data). An attach whose lease
   * cannot be armed fails and detaches the tools again. false: tools stay
   * attached until someone detaches them. */
  bool lease;
  uint8_t channel; /* REMORA_CHANNEL_*; 0 = AUTO (since 0.4) */
  uint8_t reserved[5];
  /* Path of libremora-agent.so; NULL or "" = search (see the top). */
  const char* agent_path;
} remora_options_t;

/* What the agent in a process reports (remora_status). */
typedef struct remora_agent_state {
  uint32_t size;      /* set by the caller before the call; see remora_status */
  bool agent_loaded;  /* libremora-agent.so is loaded in the process */
  bool attached;      /* tools are attached now */
  bool lease_expired; /* the lease fired: the controller died and the agent detached */
  /* How the attached session came: REMORA_CHANNEL_PTRACE or
   * REMORA_CHANNEL_SOCKET (since 0.4; was reserved, 0). */
  uint8_t session_channel;
  uint64_t sessions;  /* attaches so far (1 after the first) */
  uint64_t detaches;  /* detaches so far */
  pid_t listener_tid; /* the agent's listener thread, 0 if none */
  pid_t lease_pid;    /* the controller holding the lease, 0 if none */
  char tools[4096];   /* the loaded tool list, ':'-separated ("" if none); truncated, NUL-terminated */
  char message[2048]; /* why the agent's last call failed ("" if it did not); NUL-terminated */
} remora_agent_state_t;

/*
 * Fills *opts with the defaults (no tools, no env, timeout 10 s, no
 * children, no lease, agent searched) and sets opts->size = `size`, the
 * caller's sizeof(remora_options_t). Writes at most `size` bytes.
 * Any thread. Fails with INVALID_ARGUMENT when opts is NULL or `size` is
 * smaller than the first published remora_options_t.
 * Prefer remora_options_init(), which passes the size for you.
 */
REMORA_API remora_status_t remora_options_init_sized(remora_options_t* opts, size_t size);

/* remora_options_init_sized(opts, sizeof *opts). */
static inline remora_status_t remora_options_init(remora_options_t* opts) {
  return remora_options_init_sized(opts, sizeof(*opts));
}

/*
 * Attaches opts->tools to process `pid`, loading the agent into it first if
 * needed, and calls the tools' attach lifecycle there (see remora/tool.h).
 * With opts->attach_children, attaches the tree under pid (remora_attach_tree).
 * Returns when every tool's tool_attach has returned, or on failure; a
 * failed attach leaves the target as it was, except that the agent stays
 * loaded. Any thread. Fails with INVALID_ARGUMENT (NULL opts, bad size, no
 * tools, malformed env), REFUSED, ALREADY_ATTACHED, PTRACE_DENIED, ... and
 * sets remora_last_error().
 */
REMORA_API remora_status_t remora_attach(pid_t pid, const remora_options_t* opts);

/*
 * Detaches the tools from `pid` (whoever attached them): the agent calls
 * each tool's tool_detach; the tools and the agent stay loaded, so a later
 * remora_attach re-attaches quickly (remora_detach_with and
 * REMORA_DETACH_UNLOAD unload them). pid 0 detaches every process this
 * library attached and not detached since (SUCCESS if there is none); the
 * result is then the last failure seen, and each failure is reported in
 * remora_last_error(). Uses a 10 s deadline per process. Any thread. Fails
 * with NOT_ATTACHED, NO_SUCH_PROCESS, TIMED_OUT, ...
 */
REMORA_API remora_status_t remora_detach(pid_t pid);

/*
 * Attaches opts->tools to `root` and every process below it. The tree is
 * snapshotted breadth-first (through /proc/PID/task/TID/children) and each
 * process is pinned with a pidfd, so a recycled pid is never attached by
 * mistake; processes are attached in parallel. A failure on one process does
 * not stop the others. A process below root that exited before it could be
 * attached (a zombie too) is no failure: short-lived children come and go.
 * Returns SUCCESS when every other process was attached;
 * otherwise the status of the last failure seen (breadth-first order), and
 * remora_last_error() lists every process that failed, one per line:
 * "attach tree PID: N of M processes failed" then "  pid P: message".
 * Processes that did attach stay attached (detach them with
 * remora_detach_tree). Any thread. Fails with NO_SUCH_PROCESS when root does
 * not exist, INVALID_ARGUMENT on bad options, or a per-process status.
 */
REMORA_API remora_status_t remora_attach_tree(pid_t root, const remora_options_t* opts);

/*
 * Detaches the processes that remora_attach_tree(root) attached (the list
 * it recorded); when this library did not attach that tree, the tree under
 * root as it is now. Results are reported as for remora_attach_tree. Any
 * thread.
 */
REMORA_API remora_status_t remora_detach_tree(pid_t root);

/* remora_detach_options_t.flags */
/* After the detach, unload the tools and the agent: each tool's tool_fini
 * runs and the tool is dlclosed on the agent's listener thread, the
 * listener and the lease watcher end, and a fresh thread dlcloses the agent.
 * The process then holds no descriptor and no mapping of Remora's; only
 * glibc's own malloc memory the agent's threads caused (a thread arena, which
 * glibc never unmaps) may stay. A process whose tools were detached already
 * is unloaded all the same. A tool that cannot be unloaded (its dlclose
 * fails, or leaves it mapped: RTLD_NODELETE, unique symbols, a reference from
 * another library) is named in `kept_tools` and the rest is unloaded; that
 * is no failure. A later attach loads the agent afresh. */
#define REMORA_DETACH_UNLOAD 0x1u

/* Options of remora_detach_with (since 0.2, symbol version REMORA_1).
 * Initialise with remora_detach_options_init. */
typedef struct remora_detach_options {
  uint32_t size;         /* sizeof(remora_detach_options_t) as the caller knows it */
  uint32_t timeout_msec; /* deadline per remote operation in each process; 0 = 10000 */
  uint32_t flags;        /* REMORA_DETACH_* */
  /* true: detach the tree as remora_detach_tree does (the root's recorded
   * tree, or the tree under it as it is now). */
  bool children;
  uint8_t channel; /* REMORA_CHANNEL_*; 0 = AUTO (since 0.4) */
  uint8_t reserved[2];
  /* Out, written by the call: the tools an unload left loaded, one line per
   * tool, "PID PATH\n" ("" when none); truncated at a line, NUL-terminated. */
  char kept_tools[4096];
} remora_detach_options_t;

/*
 * Fills *opts with the defaults (timeout 10 s, no flags, no children) and
 * sets opts->size = `size`. Any thread. Fails with INVALID_ARGUMENT when
 * opts is NULL or `size` is smaller than the first published layout.
 */
REMORA_API remora_status_t remora_detach_options_init_sized(remora_detach_options_t* opts, size_t size);

/* remora_detach_options_init_sized(opts, sizeof *opts). */
static inline remora_status_t remora_detach_options_init(remora_detach_options_t* opts) {
  return remora_detach_options_init_sized(opts, sizeof(*opts));
}

/*
 * remora_detach (or, with opts->children, remora_detach_tree) with options;
 * with REMORA_DETACH_UNLOAD the tools and the agent then leave the process
 * (see the flag). pid 0 (not with children): every process this library
 * attached. Writes opts->kept_tools. Any thread. Fails as remora_detach
 * does; an unload fails with NOT_SUPPORTED for an agent loaded by an older
 * Remora (RTLD_NODELETE: its tools are detached, only a restart removes it)
 * and with NOT_ATTACHED where no agent is loaded.
 */
REMORA_API remora_status_t remora_detach_with(pid_t pid, remora_detach_options_t* opts);

/*
 * Reads the agent's state in `pid` into *state without stopping any of its
 * threads. Set state->size = sizeof(remora_agent_state_t) first: the library
 * writes only the fields that fit in it (and sets size to what it wrote).
 * A process without the agent gives SUCCESS with agent_loaded false. A
 * process whose memory cannot be read (not dumpable, another uid) but that
 * opted in to the socket channel is asked through its socket. Any
 * thread. Fails with INVALID_ARGUMENT (NULL, size too small to hold
 * `agent_loaded`), NO_SUCH_PROCESS, PTRACE_DENIED (no right to read its
 * memory, and no socket), ...
 */
REMORA_API remora_status_t remora_status(pid_t pid, remora_agent_state_t* state);

/* remora_check_target flags */
#define REMORA_CHECK_TREE 0x1u /* for remora_attach_tree: see remora_check_target */

/*
 * The refusals about process `pid` itself, which remora_attach and
 * remora_attach_tree make first, before they look at the options (beyond
 * a NULL pointer or a size too small, the caller's bug): for a
 * caller that prepares an attach (finds its tools, makes an output
 * directory) and wants to know first. Reads /proc only and changes nothing.
 * Fails, with the message remora_attach would give ("attach to process N:
 * process N is a zombie: ..."), with NO_SUCH_PROCESS, OWN_PROCESS, ZOMBIE,
 * KERNEL_THREAD, TRACED_BY_OTHER (a tracer that stays past a moment),
 * PTRACE_DENIED, STATIC_BINARY, or INVALID_ARGUMENT (pid <= 0, a thread id,
 * unknown flags). With REMORA_CHECK_TREE, the refusals that concern the root
 * alone (own process, traced, ptrace denied, statically linked) are made
 * only when it has no children, whose tree attach could still succeed.
 * Since 0.3 (symbol version REMORA_2). Any thread.
 */
REMORA_API remora_status_t remora_check_target(pid_t pid, uint32_t flags);

/*
 * The message of the last failed remora_* call on the calling thread, or ""
 * when none failed yet. Successful calls leave it unchanged. Never NULL. The
 * string is owned by the library and stays valid until the next remora_*
 * call on the same thread; copy it to keep it. Any thread (the message is
 * per thread).
 */
REMORA_API const char* remora_last_error(void);

/*
 * The enumerator's name ("REMORA_STATUS_NO_SUCH_PROCESS"), or
 * "REMORA_STATUS_UNKNOWN" for a value outside the enum. Never NULL; a static
 * string. Any thread.
 */
REMORA_API const char* remora_status_name(remora_status_t status);

/*
 * One sentence describing the status ("no process with that id"), or
 * "unknown status" for a value outside the enum. Never NULL; a static
 * string. Any thread. remora_last_error() says more about an actual failure.
 */
REMORA_API const char* remora_status_string(remora_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* REMORA_REMORA_H_ */
