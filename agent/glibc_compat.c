// The glibc floor of libremora-agent.so and libremora-tool.so: both
// are loaded into processes of any glibc container, so they must not ask for a
// symbol version newer than the oldest glibc they promise to load into
// (REMORA_MIN_GLIBC in tests/deps/check_deps.py, stated in docs/tool.md).
//
// Linking against the build machine's glibc binds every call to that glibc's
// newest version (pthread_create@GLIBC_2.34, stat@GLIBC_2.33, ...), and the
// static libstdc++ and libgcc_eh add symbols that exist only there
// (__libc_single_threaded, _dl_find_object). This object defines those names
// itself, hidden, so that every reference in the link (ours and the static
// archives') binds here; each definition calls the oldest version glibc still
// exports (pinned with .symver), which older glibc exports too. Before glibc
// 2.34 pthread_* and dl* live in libpthread.so.0 and libdl.so.2: the two
// libraries do not list those as NEEDED (a root holding only libc.so.6 and
// the loader must load them), so there they resolve against the process's
// own copies, which any process Remora can start a thread in has loaded.
//
// The versions are each architecture's (its first glibc's: 2.2.5 on x86_64,
// 2.17 on aarch64), given by agent/CMakeLists.txt as REMORA_GLIBC_FIRST,
// REMORA_GLIBC_SETNAME and REMORA_GLIBC_DLADDR1 (the two names that came
// later on x86_64), with REMORA_STAT_VER for __xstat.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/stat.h>

#if !defined(REMORA_GLIBC_FIRST) || !defined(REMORA_GLIBC_SETNAME) || !defined(REMORA_GLIBC_DLADDR1) || \
    !defined(REMORA_STAT_VER)
#error "glibc_compat.c: agent/CMakeLists.txt defines REMORA_GLIBC_FIRST and the rest for this architecture"
#endif

#define REMORA_HIDDEN __attribute__((visibility("hidden")))

// REMORA_PIN(ret, name, "GLIBC_x", (params), (args)): `name`, hidden, calling
// name@GLIBC_x. The prototype is glibc's own (its header is included above),
// so a definition that differs from it does not compile.
#define REMORA_PIN(ret, name, version, params, args)             \
  extern ret remora_glibc_##name params;                         \
  __asm__(".symver remora_glibc_" #name ", " #name "@" version); \
  REMORA_HIDDEN ret name params { return remora_glibc_##name args; }

REMORA_PIN(int, pthread_create, REMORA_GLIBC_FIRST,
           (pthread_t * t, const pthread_attr_t* attr, void* (*fn)(void*), void* arg), (t, attr, fn, arg))
REMORA_PIN(int, pthread_detach, REMORA_GLIBC_FIRST, (pthread_t t), (t))
REMORA_PIN(int, pthread_join, REMORA_GLIBC_FIRST, (pthread_t t, void** ret), (t, ret))
REMORA_PIN(int, pthread_once, REMORA_GLIBC_FIRST, (pthread_once_t * once, void (*fn)(void)), (once, fn))
REMORA_PIN(int, pthread_key_create, REMORA_GLIBC_FIRST, (pthread_key_t * key, void (*dtor)(void*)),
           (key, dtor))
REMORA_PIN(int, pthread_mutex_trylock, REMORA_GLIBC_FIRST, (pthread_mutex_t * m), (m))
REMORA_PIN(int, pthread_setname_np, REMORA_GLIBC_SETNAME, (pthread_t t, const char* name), (t, name))
REMORA_PIN(int, pthread_attr_setstacksize, REMORA_GLIBC_FIRST, (pthread_attr_t * a, size_t size), (a, size))
REMORA_PIN(int, pthread_attr_setstack, REMORA_GLIBC_FIRST, (pthread_attr_t * a, void* stack, size_t size),
           (a, stack, size))
REMORA_PIN(int, pthread_mutexattr_init, REMORA_GLIBC_FIRST, (pthread_mutexattr_t * a), (a))
REMORA_PIN(int, pthread_mutexattr_destroy, REMORA_GLIBC_FIRST, (pthread_mutexattr_t * a), (a))
REMORA_PIN(int, pthread_mutexattr_settype, REMORA_GLIBC_FIRST, (pthread_mutexattr_t * a, int type), (a, type))
REMORA_PIN(int, pthread_sigmask, REMORA_GLIBC_FIRST, (int how, const sigset_t* set, sigset_t* old),
           (how, set, old))
// dlopen, dlsym and dlvsym look at their caller's address (RTLD_NEXT, the
// namespace to load into): the caller here is still inside the same library.
REMORA_PIN(void*, dlopen, REMORA_GLIBC_FIRST, (const char* file, int mode), (file, mode))
REMORA_PIN(void*, dlsym, REMORA_GLIBC_FIRST, (void* restrict h, const char* restrict name), (h, name))
REMORA_PIN(void*, dlvsym, REMORA_GLIBC_FIRST,
           (void* restrict h, const char* restrict name, const char* restrict v), (h, name, v))
REMORA_PIN(int, dladdr, REMORA_GLIBC_FIRST, (const void* addr, Dl_info* info), (addr, info))
REMORA_PIN(int, dladdr1, REMORA_GLIBC_DLADDR1, (const void* addr, Dl_info* info, void** extra, int flags),
           (addr, info, extra, flags))
REMORA_PIN(int, dlclose, REMORA_GLIBC_FIRST, (void* h), (h))
REMORA_PIN(char*, dlerror, REMORA_GLIBC_FIRST, (void), ())

// libstdc++'s thread detection takes the address of __pthread_key_create
// (a weak reference): non-null here, as it is in any process of glibc >= 2.34.
REMORA_HIDDEN int __pthread_key_create(pthread_key_t* key, void (*dtor)(void*)) {
  return remora_glibc_pthread_key_create(key, dtor);
}

// stat and fstat became functions in glibc 2.33; before, <sys/stat.h> inlined
// them as __xstat/__fxstat, which glibc still exports. REMORA_STAT_VER names
// the layout of struct stat on this architecture (_STAT_VER_LINUX, 1, on
// x86_64; _STAT_VER_KERNEL, 0, on aarch64, whose __xstat refuses any other).
extern int remora_glibc___xstat(int ver, const char* path, struct stat* buf);
extern int remora_glibc___fxstat(int ver, int fd, struct stat* buf);
__asm__(".symver remora_glibc___xstat, __xstat@" REMORA_GLIBC_FIRST);
__asm__(".symver remora_glibc___fxstat, __fxstat@" REMORA_GLIBC_FIRST);
REMORA_HIDDEN int stat(const char* restrict path, struct stat* restrict buf) {
  return remora_glibc___xstat(REMORA_STAT_VER, path, buf);
}
REMORA_HIDDEN int fstat(int fd, struct stat* buf) { return remora_glibc___fxstat(REMORA_STAT_VER, fd, buf); }

// glibc 2.32 sets __libc_single_threaded while a process has one thread, and
// libstdc++ then skips atomic reference counts. Ours stays 0: always atomic,
// which is right in every process (the agent's own threads make it
// multi-threaded anyway).
REMORA_HIDDEN char __libc_single_threaded = 0;

// libgcc_eh (linked in statically) finds unwind tables through glibc 2.35's
// _dl_find_object. Where glibc has it, this forwards to it; where it has not,
// -1 ("no object"): the static unwinder is reached only by a C++ throw, which
// code built with -fno-exceptions never catches (std::terminate either way).
// Thread cancellation unwinds through glibc's own libgcc_s, not this one.
struct dl_find_object;
REMORA_HIDDEN int _dl_find_object(void* pc, struct dl_find_object* out) {
  typedef int (*fn_t)(void*, struct dl_find_object*);
  static fn_t real;
  static int looked;
  if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
    // The same answer whichever thread stores it first.
    __atomic_store_n(&real, (fn_t)dlvsym(RTLD_DEFAULT, "_dl_find_object", "GLIBC_2.35"), __ATOMIC_RELAXED);
    __atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
  }
  fn_t f = __atomic_load_n(&real, __ATOMIC_RELAXED);
  return f != NULL ? f(pc, out) : -1;
}
