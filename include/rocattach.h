/*
 * rocattach.h — ROCm ROCprofiler-SDK's process attachment API
 * (librocprofiler-sdk-rocattach.so), implemented by Remora so that programs
 * written for ROCm run unchanged. Plain C; includes nothing else of Remora.
 * Names, values and signatures mirror ROCm's rocattach.h.
 *
 * What it does. rocattach_attach(pid) loads Remora's agent into `pid` and
 * attaches the tool libraries named, colon-separated, by the CALLER's
 * environment variable ROCPROF_ATTACH_TOOL_LIBRARY (or, if that is unset or
 * empty, REMORA_ATTACH_TOOL_LIBRARY). The target needs no preparation. Each
 * tool must implement Remora's tool ABI (remora/tool.h). Every variable of
 * the caller's environment whose name starts with "ROCP" (so also
 * "ROCPROF") or "REMORA_" is set in the target before its tools load.
 *
 * Tools stay attached until rocattach_detach / rocattach_detach_tree, also
 * when the calling process exits (there is no lease, as in ROCm).
 *
 * A target started with ROCP_TOOL_ATTACH=0 or REMORA_TOOL_ATTACH=0 in its
 * environment refuses tools: attaching it fails with ROCATTACH_STATUS_ERROR
 * (as ROCm's attach does for a target without attach support) and a message
 * on stderr.
 *
 * Threads. Every function may be called from any thread, concurrently;
 * operations on one process are serialised. Work is done on the calling
 * thread; nothing calls back into the caller.
 *
 * Errors. Functions return a rocattach_status_t; on failure they also print
 * one message, prefixed "[rocprofiler-sdk-rocattach]", to stderr, saying what
 * failed and how to fix it. Remora's own status codes map as follows:
 *   no such process, target exited, zombie   -> ..._PTRACE_PROCESS_NOT_FOUND
 *   ptrace denied, traced by another tracer,
 *     own process                            -> ..._PTRACE_OPERATION_NOT_PERMITTED
 *   other failures of the remote operations
 *     (timeout, fault, missing library or
 *     symbol, kernel thread, file identity)  -> ..._PTRACE_ERROR
 *   invalid argument, no tool library set,
 *     already attached, not attached         -> ..._INVALID_ARGUMENT
 *   not supported, static binary             -> ..._NOT_SUPPORTED
 *   refused, tool failed, not a tool, I/O,
 *     parse, internal                        -> ..._ERROR
 *
 * The library links libremora.so (found next to it), which holds one
 * process-wide controller: sessions made through this API and through
 * remora/remora.h are the same.
 */
#ifndef ROCATTACH_H_
#define ROCATTACH_H_

#include <stdint.h>
/* ROCm's header brings these, and programs written against it rely on them
 * (its attach example calls kill() with no include of its own): so does
 * this one. Both are POSIX system headers; nothing of Remora's is included. */
#include <signal.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ROCATTACH_API __attribute__((visibility("default")))
#else
#define ROCATTACH_API
#endif

/* The rocattach interface version this library implements. */
#define ROCATTACH_VERSION_MAJOR 1
#define ROCATTACH_VERSION_MINOR 0
#define ROCATTACH_VERSION_PATCH 0

/* Status codes (values and order as in ROCm). */
typedef enum rocattach_status_t {
  ROCATTACH_STATUS_SUCCESS = 0,                          /* no error occurred */
  ROCATTACH_STATUS_ERROR,                                /* generalized error */
  ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT,               /* invalid function argument */
  ROCATTACH_STATUS_ERROR_NOT_SUPPORTED,                  /* attachment not supported */
  ROCATTACH_STATUS_ERROR_PTRACE_ERROR,                   /* general ptrace error */
  ROCATTACH_STATUS_ERROR_PTRACE_OPERATION_NOT_PERMITTED, /* ptrace: EPERM */
  ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND,       /* ptrace: ESRCH */
  ROCATTACH_STATUS_LAST                                  /* one past the last; not a status */
} rocattach_status_t;

/* Version information. */
typedef struct rocattach_version_triplet_t {
  uint32_t major;
  uint32_t minor;
  uint32_t patch;
} rocattach_version_triplet_t;

/*
 * Stores ROCATTACH_VERSION_MAJOR/MINOR/PATCH in each non-NULL argument.
 * Always returns ROCATTACH_STATUS_SUCCESS. Any thread.
 */
ROCATTACH_API rocattach_status_t rocattach_get_version(uint32_t* major, uint32_t* minor, uint32_t* patch);

/*
 * Stores the version in *info. ROCATTACH_STATUS_SUCCESS, or
 * ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT when info is NULL. Any thread.
 */
ROCATTACH_API rocattach_status_t rocattach_get_version_triplet(rocattach_version_triplet_t* info);

/*
 * Attaches the tools of ROCPROF_ATTACH_TOOL_LIBRARY to process `pid` (see
 * above). Returns when the tools' attach callbacks have returned (10 s
 * deadline per remote operation). Fails with INVALID_ARGUMENT when no tool
 * library is set, `pid` is not positive, or `pid` is attached already;
 * PTRACE_PROCESS_NOT_FOUND, PTRACE_OPERATION_NOT_PERMITTED, ERROR (refused,
 * tool failed), ... Any thread.
 */
ROCATTACH_API rocattach_status_t rocattach_attach(int pid);

/*
 * Attaches `pid` and every process below it (breadth-first snapshot of the
 * tree through /proc; each process pinned with a pidfd; processes attached
 * in parallel). A failure on one process is printed and the others go on;
 * the result is SUCCESS when all attached, otherwise the status of the last
 * failure seen. The attached processes are recorded for
 * rocattach_detach_tree(pid). Any thread.
 */
ROCATTACH_API rocattach_status_t rocattach_attach_tree(int pid);

/*
 * Detaches the tools from `pid` (they stay loaded; the process can be
 * attached again). pid 0 detaches every process this library (or
 * libremora.so) attached; as in ROCm, that returns SUCCESS, and failures are
 * only printed. Fails with INVALID_ARGUMENT when nothing is attached in
 * `pid`, PTRACE_PROCESS_NOT_FOUND, ... Any thread.
 */
ROCATTACH_API rocattach_status_t rocattach_detach(int pid);

/*
 * Detaches exactly the processes that rocattach_attach_tree(pid) attached.
 * INVALID_ARGUMENT when no tree was attached from `pid` through this
 * library; otherwise SUCCESS or the last failure seen (each one printed).
 * Any thread.
 */
ROCATTACH_API rocattach_status_t rocattach_detach_tree(int pid);

/*
 * The enumerator's name ("ROCATTACH_STATUS_ERROR"), or NULL for a value
 * outside [SUCCESS, LAST) (as in ROCm). A static string. Any thread.
 */
ROCATTACH_API const char* rocattach_get_status_name(rocattach_status_t status);

/*
 * A short description of the status ("Invalid function argument"), or NULL
 * for a value outside [SUCCESS, LAST). A static string. Any thread.
 */
ROCATTACH_API const char* rocattach_get_status_string(rocattach_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* ROCATTACH_H_ */
