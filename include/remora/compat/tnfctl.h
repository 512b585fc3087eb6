/* tnfctl.h — a libtnfctl-shaped process-control C API (illumos libtnfctl's
 * process-control subset) implemented by libremora.so.
 *
 * Open a running process (tnfctl_pid_open) or start a program stopped after
 * the dynamic loader mapped and relocated every object, preloads included,
 * and before any constructor or main ran (tnfctl_exec_open); then follow it
 * event by event with tnfctl_continue (dlopen, dlclose, exec, fork, exit).
 *
 * Invariant: whenever a call returns, every thread of the target is stopped,
 * its link map is consistent, and no breakpoint of ours is in its memory.
 *
 * Threads: ptrace binds a traced process to the OS thread that attached it.
 * A handle, and every child handle tnfctl_continue returns for it, must be
 * used only from the thread that created the handle. tnfctl_interrupt is the
 * exception: any thread may call it, at any time (it is async-signal-safe).
 *
 * Ownership: handles are owned by the caller and freed by tnfctl_close.
 * Strings returned by tnfctl_strerror are static.
 *
 * Differences from illumos: Linux only (ptrace); TNFCTL_EVENT_FORK is also
 * reported for vfork; tnfctl_interrupt and tnfctl_pid/tnfctl_exit_status are
 * additions. This header includes only system headers. */
#ifndef REMORA_COMPAT_TNFCTL_H
#define REMORA_COMPAT_TNFCTL_H

#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TNFCTL_API __attribute__((visibility("default")))

typedef struct tnfctl_handle tnfctl_handle_t;

typedef enum {
  TNFCTL_ERR_NONE = 0,      /* success */
  TNFCTL_ERR_ACCES,         /* permission denied: ptrace refused (the reason is
                               in tnfctl_last_error), a set-uid/set-gid program */
  TNFCTL_ERR_NOTARGET,      /* the target is gone */
  TNFCTL_ERR_ALLOCFAIL,     /* out of memory */
  TNFCTL_ERR_INTERNAL,      /* internal error (a bug, or an unexpected kernel error) */
  TNFCTL_ERR_BADARG,        /* bad argument (including the caller's own pid) */
  TNFCTL_ERR_NOTDYNAMIC,    /* the target is statically linked */
  TNFCTL_ERR_NOLIBTNFPROBE, /* no libremora-agent.so in libtnfprobe_path */
  TNFCTL_ERR_NOPROCESS,     /* no such process (or a zombie) */
  TNFCTL_ERR_FILENOTFOUND,  /* the program was not found (PATH searched) */
  TNFCTL_ERR_BUSY,          /* another tracer or handle already controls it */
  TNFCTL_ERR_TIMEDOUT,      /* a Remora addition: a deadline passed */
} tnfctl_errcode_t;

typedef enum {
  TNFCTL_EVENT_EINTR = 0, /* tnfctl_interrupt was called or the caller's thread
                             got a signal; the target is stopped */
  TNFCTL_EVENT_TARGGONE,  /* the target is gone (killed by a signal, or it
                             finished exiting after TNFCTL_EVENT_EXIT) */
  TNFCTL_EVENT_DLOPEN,    /* objects were loaded */
  TNFCTL_EVENT_DLCLOSE,   /* objects were unloaded */
  TNFCTL_EVENT_EXEC,      /* the target exec'd; it is stopped before the new
                             image's constructors, and the handle follows it */
  TNFCTL_EVENT_FORK,      /* the target forked (or vforked) */
  TNFCTL_EVENT_EXIT,      /* the target is exiting (tnfctl_exit_status) */
} tnfctl_event_t;

typedef enum {
  TNFCTL_TARG_DEFAULT = 0, /* kill a target started by tnfctl_exec_open, resume
                              one opened by tnfctl_pid_open or a fork child */
  TNFCTL_TARG_KILL,        /* kill it (and reap it if it is our child) */
  TNFCTL_TARG_RESUME,      /* let it run on, untraced */
  TNFCTL_TARG_SUSPEND,     /* leave it stopped (job-control stop, as after
                              SIGSTOP); resume it with kill(pid, SIGCONT) */
} tnfctl_targ_op_t;

/* Stops every thread of `pid` and returns a handle on it in *ret_val. */
TNFCTL_API tnfctl_errcode_t tnfctl_pid_open(pid_t pid, tnfctl_handle_t** ret_val);

/* Starts `pgm_name` (PATH searched when it has no '/') with `argv` (NULL:
 * { pgm_name }) and `envp` (NULL: the caller's environment minus LD_PRELOAD;
 * a given envp is used as is). When `libtnfprobe_path` is not NULL it is the
 * folder holding libremora-agent.so, which is preloaded; `ld_preload` (may be
 * NULL) names more objects to preload. Both are put in front of any
 * LD_PRELOAD the environment has. Returns with the program stopped before any
 * constructor ran. */
TNFCTL_API tnfctl_errcode_t tnfctl_exec_open(const char* pgm_name, char* const* argv, char* const* envp,
                                             const char* libtnfprobe_path, const char* ld_preload,
                                             tnfctl_handle_t** ret_val);

/* Runs the target until its next event, stored in *evt. On
 * TNFCTL_EVENT_FORK, when `child_hndl` is not NULL, *child_hndl receives a
 * new handle on the child, stopped at the end of fork (close it with
 * tnfctl_close); when it is NULL the child runs free. *child_hndl is set to
 * NULL for every other event. */
TNFCTL_API tnfctl_errcode_t tnfctl_continue(tnfctl_handle_t* hndl, tnfctl_event_t* evt,
                                            tnfctl_handle_t** child_hndl);

/* Releases the target as `action` says and frees the handle (always, even
 * when an error is returned). */
TNFCTL_API tnfctl_errcode_t tnfctl_close(tnfctl_handle_t* hndl, tnfctl_targ_op_t action);

TNFCTL_API const char* tnfctl_strerror(tnfctl_errcode_t errcode);

/* ---- Remora additions ---- */

/* Makes a tnfctl_continue in progress (or the next one) return
 * TNFCTL_EVENT_EINTR. Any thread; async-signal-safe. */
TNFCTL_API void tnfctl_interrupt(tnfctl_handle_t* hndl);

/* The target's process id. */
TNFCTL_API pid_t tnfctl_pid(const tnfctl_handle_t* hndl);

/* After TNFCTL_EVENT_EXIT: the wait(2) status (WIFEXITED/WEXITSTATUS). */
TNFCTL_API tnfctl_errcode_t tnfctl_exit_status(const tnfctl_handle_t* hndl, int* status);

/* The full message of the last error on this OS thread ("" when none); valid
 * until the next call on this thread. */
TNFCTL_API const char* tnfctl_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* REMORA_COMPAT_TNFCTL_H */
