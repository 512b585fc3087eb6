/* GOT wrappers of the default tool: one per traceable function, written with
 * the function's exact prototype (functions.def).
 *
 * Why typed C wrappers rather than one generic assembly trampoline: the
 * compiler then forwards every integer and vector argument register and both
 * return registers exactly as the ABI says, and the wrapper is an ordinary
 * frame with .eh_frame unwind info. A generic trampoline would have to hook
 * the return by swapping the return address into a per-thread shadow stack;
 * that breaks when the call leaves by other means than a return: thread
 * cancellation (read, pthread_cond_wait, ... are cancellation points and
 * unwind through the wrapper with _Unwind_ForcedUnwind), longjmp out of a
 * signal handler, C++ exceptions thrown through. Typed wrappers cost one
 * entry per function (see functions.def) and support only known prototypes:
 * an unknown name in REMORA_TRACE_FUNCTIONS is reported, not traced. Compiled
 * as C with -fexceptions so that a forced unwind passes through cleanly.
 *
 * A wrapper never allocates, locks or touches errno as seen by its caller;
 * remora_record_call is async-signal-safe (wrapped calls may come from an
 * application's signal handler). A thread may still be inside a wrapper,
 * blocked in read(), when the session ends and the GOT is restored: every
 * wrapper counts itself in and out (remora_inside, wrappers.h), and the tool
 * is unloaded only once no thread is inside; else it pins itself in memory
 * at tool_fini (tool.cc). */
#define _GNU_SOURCE
#include "wrappers.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* glibc's fortified entry points, declared by its headers only under
 * _FORTIFY_SOURCE; these are their exact prototypes. */
extern ssize_t __read_chk(int fd, void* buf, size_t n, size_t len);
extern ssize_t __pread_chk(int fd, void* buf, size_t n, off_t off, size_t len);
extern ssize_t __recv_chk(int fd, void* buf, size_t n, size_t len, int flags);
extern ssize_t __recvfrom_chk(int fd, void* __restrict buf, size_t n, size_t len, int flags,
                              __SOCKADDR_ARG addr, socklen_t* __restrict alen);
extern int __poll_chk(struct pollfd* fds, nfds_t n, int timeout, __SIZE_TYPE__ len);
extern int __ppoll_chk(struct pollfd* fds, nfds_t n, const struct timespec* t, const __sigset_t* m,
                       __SIZE_TYPE__ len);
extern int __open_2(const char* path, int flags);
extern int __openat_2(int dir, const char* path, int flags);

enum {
#define FN(sym, as, def, ret, params, args) REMORA_FN_##sym,
#define FNV(sym, as, def, params, args) REMORA_FN_##sym,
#include "functions.def"
#undef FN
#undef FNV
  REMORA_FN_open,
  REMORA_FN_openat,
  REMORA_FN_COUNT_
};

void* remora_fn_real[REMORA_FN_COUNT_];
struct remora_inside_stripe remora_inside[REMORA_INSIDE_STRIPES];

long remora_inside_count(void) {
  long n = 0;
  for (unsigned i = 0; i < REMORA_INSIDE_STRIPES; ++i) n += __atomic_load_n(&remora_inside[i].n, __ATOMIC_SEQ_CST);
  return n;
}

static inline uint64_t clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The common body: time the real call, record it, keep errno as the real
 * call left it. The real pointer is read once (it never changes after the
 * first patch of a session, but a relaxed atomic load says so). */
#define FN(sym, as, def, ret, params, args)                                                    \
  static ret wrap_##sym params {                                                               \
    __typeof__(sym)* real =                                                                    \
        (__typeof__(sym)*)__atomic_load_n(&remora_fn_real[REMORA_FN_##sym], __ATOMIC_RELAXED); \
    struct remora_inside_stripe* in = remora_inside_mine();                                    \
    remora_inside_enter(in);                                                                   \
    uint64_t t0 = clock_ns();                                                                  \
    ret remora_result_ = real args;                                                            \
    int saved = errno;                                                                         \
    remora_record_call(REMORA_FN_##sym, t0, clock_ns());                                       \
    errno = saved;                                                                             \
    remora_inside_leave(in);                                                                   \
    return remora_result_;                                                                     \
  }                                                                                            \
  /* The compiler checks the prototype against the C library's declaration. */                 \
  static __typeof__(sym)* const check_##sym __attribute__((unused)) = wrap_##sym;
#define FNV(sym, as, def, params, args)                                                        \
  static void wrap_##sym params {                                                              \
    __typeof__(sym)* real =                                                                    \
        (__typeof__(sym)*)__atomic_load_n(&remora_fn_real[REMORA_FN_##sym], __ATOMIC_RELAXED); \
    struct remora_inside_stripe* in = remora_inside_mine();                                    \
    remora_inside_enter(in);                                                                   \
    uint64_t t0 = clock_ns();                                                                  \
    real args;                                                                                 \
    int saved = errno;                                                                         \
    remora_record_call(REMORA_FN_##sym, t0, clock_ns());                                       \
    errno = saved;                                                                             \
    remora_inside_leave(in);                                                                   \
  }                                                                                            \
  static __typeof__(sym)* const check_##sym __attribute__((unused)) = wrap_##sym;
/* A mutex that is free costs no wait, and tracing every uncontended
 * acquisition doubled the CPU of lock-heavy code (two clock reads and a
 * record per call, ~100 ns, on a ~40 ns lock). So the wrapper tries the lock
 * first and records only acquisitions that had to wait. trylock returns
 * exactly what lock would for an owner-dead (EOWNERDEAD, lock taken) or
 * unrecoverable robust mutex; only EBUSY goes on to the timed real call. */
#define FNL(sym, as, def, ret, params, args)                                                   \
  static ret wrap_##sym params {                                                               \
    struct remora_inside_stripe* in = remora_inside_mine();                                    \
    remora_inside_enter(in);                                                                   \
    int remora_try_ = pthread_mutex_trylock args;                                              \
    if (remora_try_ != EBUSY) {                                                                \
      remora_inside_leave(in);                                                                 \
      return remora_try_;                                                                      \
    }                                                                                          \
    __typeof__(sym)* real =                                                                    \
        (__typeof__(sym)*)__atomic_load_n(&remora_fn_real[REMORA_FN_##sym], __ATOMIC_RELAXED); \
    uint64_t t0 = clock_ns();                                                                  \
    ret remora_result_ = real args;                                                            \
    int saved = errno;                                                                         \
    remora_record_call(REMORA_FN_##sym, t0, clock_ns());                                       \
    errno = saved;                                                                             \
    remora_inside_leave(in);                                                                   \
    return remora_result_;                                                                     \
  }                                                                                            \
  static __typeof__(sym)* const check_##sym __attribute__((unused)) = wrap_##sym;
#include "functions.def"
#undef FN
#undef FNV
#undef FNL

/* open(path, flags, ...): the mode is read only when the flags say one was
 * passed, exactly as glibc's own open does. */
static int needs_mode(int flags) { return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE; }

static int wrap_open(const char* path, int flags, ...) {
  mode_t mode = 0;
  if (needs_mode(flags)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  __typeof__(open)* real =
      (__typeof__(open)*)__atomic_load_n(&remora_fn_real[REMORA_FN_open], __ATOMIC_RELAXED);
  struct remora_inside_stripe* in = remora_inside_mine();
  remora_inside_enter(in);
  uint64_t t0 = clock_ns();
  int r = real(path, flags, mode);
  int saved = errno;
  remora_record_call(REMORA_FN_open, t0, clock_ns());
  errno = saved;
  remora_inside_leave(in);
  return r;
}
static __typeof__(open)* const check_open __attribute__((unused)) = wrap_open;

static int wrap_openat(int dir, const char* path, int flags, ...) {
  mode_t mode = 0;
  if (needs_mode(flags)) {
    va_list ap;
    va_start(ap, flags);
    mode = va_arg(ap, mode_t);
    va_end(ap);
  }
  __typeof__(openat)* real =
      (__typeof__(openat)*)__atomic_load_n(&remora_fn_real[REMORA_FN_openat], __ATOMIC_RELAXED);
  struct remora_inside_stripe* in = remora_inside_mine();
  remora_inside_enter(in);
  uint64_t t0 = clock_ns();
  int r = real(dir, path, flags, mode);
  int saved = errno;
  remora_record_call(REMORA_FN_openat, t0, clock_ns());
  errno = saved;
  remora_inside_leave(in);
  return r;
}
static __typeof__(openat)* const check_openat __attribute__((unused)) = wrap_openat;

const struct remora_fn_entry remora_fn_table[] = {
#define FN(sym, as, def, ret, params, args) {#sym, #as, (void*)wrap_##sym, def},
#define FNV(sym, as, def, params, args) {#sym, #as, (void*)wrap_##sym, def},
#include "functions.def"
#undef FN
#undef FNV
    {"open", "open", (void*)wrap_open, 0},
    {"openat", "openat", (void*)wrap_openat, 0},
};

const unsigned remora_fn_count = REMORA_FN_COUNT_;
