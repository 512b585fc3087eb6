// control::Process — a handle on a whole process that Remora holds stopped:
// open a running process or launch one stopped before any of its code runs,
// then follow it event by event (dlopen, dlclose, exec, fork, exit).
//
// The model is "all-stop", as in libtnfctl: after every public call returns
// (successfully or not) every thread of the process is in a ptrace-stop, the
// loader's link map is consistent (r_state == RT_CONSISTENT), and no
// breakpoint or trap of ours is left in its memory. Breakpoints (the loader's
// r_brk rendezvous) are written on cont() and removed at every stop.
//
// Threading. ptrace binds a tracee to the OS thread that attached it, so a
// Process — and every child handle it hands out — must be used from the
// thread that created it (open(), launch() or the cont() that returned the
// child handle). The one exception is interrupt(), which any thread may call
// at any time: it writes an eventfd that cont() polls. Nothing here installs
// a signal handler; a signal that interrupts the caller's thread while cont()
// waits ends the wait with an Event::Kind::kIntr (EINTR), the process stopped.
//
// Signals meant for the process are delivered to it, never swallowed: a
// signal that arrives while Remora holds a thread stopped is kept and
// delivered when the thread next runs.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/remote_ptr.h"
#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::control {

// One object of the loader's link map.
struct LoadedObject {
  std::string name;      // l_name; for the main program, its /proc/PID/exe path
  uint64_t base = 0;     // address of its ELF header (where it is loaded)
  uint64_t bias = 0;     // l_addr: load bias (0 for a non-PIE executable)
  uint64_t dynamic = 0;  // l_ld
  uint64_t lm = 0;       // address of its struct link_map in the target
  std::string build_id;  // GNU Build ID in hex, empty when it has none
  bool operator==(const LoadedObject&) const = default;
};

class Process;

struct Event {
  enum class Kind {
    kIntr,     // interrupt() was called, or the caller's thread got a signal
    kGone,     // the process is gone (killed by a signal, or vanished): `signal`
    kDlopen,   // objects were added: `added`
    kDlclose,  // objects were removed: `removed`
    kExec,     // the process exec'd; the handle now follows the new image
    kFork,     // a thread forked (or vforked: `vfork`); child: `child_pid`, `child`
    kExit,     // the process is exiting with `exit_status` (wait status)
  };
  Kind kind = Kind::kIntr;
  pid_t tid = 0;  // the thread that caused the event (0 when none)
  std::vector<LoadedObject> added, removed;
  int exit_status = 0;  // kExit: a wait(2) status (use WIFEXITED/WEXITSTATUS)
  int signal = 0;       // kGone: the killing signal, 0 for a normal exit
  pid_t child_pid = 0;  // kFork
  bool vfork = false;   // kFork: it was a vfork
  // kFork with ContOptions::want_child: the child's own handle, stopped at the
  // end of fork (with the same link map as the parent and no breakpoint of
  // ours). Without it the child runs free.
  std::unique_ptr<Process> child;
};
const char* event_kind_name(Event::Kind k);

struct ContOptions {
  // On a fork, hand out a handle for the child (Event::child) instead of
  // letting it run free.
  bool want_child = false;
  // cont() gives up at this deadline with Errc::kTimedOut, the process stopped.
  // An exec seen before it is still reported whole: reading the new program's
  // libraries may take past it (up to 10 s). A thread blocked in vfork until
  // its child (held by another handle) execs or exits cannot stop: it is left
  // in that wait and reports the vfork's end on a later cont().
  Deadline deadline = Deadline::never();
};

struct LaunchOptions {
  // argv[0] is the program: searched in PATH when it has no '/'.
  std::vector<std::string> argv;
  // The environment; nullopt: the caller's own, minus LD_PRELOAD.
  std::optional<std::vector<std::string>> env;
  // Folder holding libremora-agent.so, preloaded when not empty (it must exist).
  std::string preload_dir;
  // More objects to preload (colon- or space-separated, as LD_PRELOAD).
  std::string ld_preload;
  // Deadline for reaching the launch stop.
  std::chrono::milliseconds timeout{10000};
};

enum class CloseMode {
  kDefault,  // kill a launched process, resume an opened one (and fork children)
  kKill,     // SIGKILL, and reap it when it is our child
  kResume,   // detach; every thread runs on with its pending signals
  // Detach leaving the whole process in a job-control stop (as after SIGSTOP):
  // resume it later with kill(pid, SIGCONT). Its parent sees the stop as usual.
  kSuspend,
};

class Process {
 public:
  // Stops every thread of `pid` (seizing each and rescanning /proc/PID/task
  // until no new thread appears) and returns with the link map consistent.
  // Errors (the checks before any thread is touched are
  // ptrace::precheck_open's, shared with remote::Target::open, so both give
  // the same refusal): kInvalidArgument (pid <= 0, or a thread id),
  // kOwnProcess (the caller or one of its threads), kNoSuchProcess, kZombie,
  // kKernelThread, kStaticBinary (no dynamic loader), kTracedByOther
  // (another tracer, or another handle: errno EBUSY), kPtraceDenied (the
  // message names the refusing rule).
  static Result<std::unique_ptr<Process>> open(pid_t pid);

  // Starts a program and returns it stopped after the dynamic loader mapped
  // and relocated every object (preloads included) and before any
  // constructor, .preinit_array/.init/.init_array or main ran.
  // Errors: kInvalidArgument (empty argv, missing agent), kIo with errno
  // ENOENT (program not found; Error::sys_errno() == ENOENT), kPtraceDenied
  // (a set-uid/set-gid program: under ptrace it would silently run without its
  // privileges; or not executable), kStaticBinary, kTargetExited (it died
  // before the stop, e.g. a missing library), kTimedOut.
  static Result<std::unique_ptr<Process>> launch(const LaunchOptions& opts);

  ~Process();  // close(kDefault), errors ignored
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const;
  bool launched() const;
  // Whether the process still exists (false after kGone).
  bool alive() const;

  // Runs the process to its next event and returns it with the process
  // stopped. After kGone further calls return Errc::kTargetExited.
  Result<Event> cont(const ContOptions& opts = {});

  // Thread-safe: makes a cont() in progress (or the next one) return kIntr.
  void interrupt();

  // Releases the process. Idempotent; the handle is unusable afterwards.
  Result<void> close(CloseMode mode = CloseMode::kDefault);

  // The link map as of the last stop, in link-map order (main program first).
  const std::vector<LoadedObject>& objects() const;
  // Thread ids, sorted.
  std::vector<pid_t> threads() const;

  // Reads/writes the process's memory (/proc/PID/mem: read-only mappings can
  // be written, as a debugger does).
  Result<void> read(RemoteAddr addr, std::span<std::byte> out) const;
  Result<void> write(RemoteAddr addr, std::span<const std::byte> in);

  // Address of `symbol` in the object named `library` (exact path, soname or
  // basename prefix; empty: main program then every library).
  Result<RemoteAddr> find_symbol(std::string_view library, std::string_view symbol);

  // Calls `fn(args...)` (up to arch::kMaxCallArgs integers: six on x86_64,
  // eight on aarch64) on thread `tid` (0: the first thread) while every other
  // thread stays stopped, and returns its integer return value. The thread's
  // registers, FP/SIMD state and signal mask are restored afterwards; signals
  // are blocked on it during the call (they stay pending), and a signal sent
  // to it meanwhile is delivered later, not taken for a fault (Errc::kFault
  // only for one the code raised). The return address is a temporary
  // breakpoint at the program's entry point (AT_ENTRY, which runs once at
  // start-up and never again), removed afterwards. Because the other threads
  // are stopped, `fn` must not wait for them (a lock one of them holds
  // deadlocks the call until `timeout`, after which the thread is restored
  // and Errc::kTimedOut returned; the function's side effects up to then
  // stay). At the launch stop every object is relocated but no constructor
  // has run: call only functions that need none.
  Result<uint64_t> call(RemoteAddr fn, std::span<const uint64_t> args, pid_t tid = 0,
                        std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

  struct Impl;

 private:
  explicit Process(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remora::control
