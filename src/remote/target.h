// remote::Target — a session with one running process, in which Remora makes
// one thread call a function (or a system call) and return, leaving the
// process exactly as it was.
//
// How a call works (see remote/transaction.cc for the details and why):
//  * Only the chosen thread T stops: it is seized, interrupted, used and
//    detached again within the one call. Every other thread keeps running.
//  * T's general registers, full xsave area, signal mask and syscall-restart
//    state are restored afterwards; a thread interrupted inside read,
//    nanosleep, epoll_wait, futex, accept or waitpid finishes that call as if
//    nothing had happened.
//  * The code run by T lives in a private scratch mapping of the target,
//    created on the first call and removed by close(). It starts with a
//    header naming its owner (remote/scratch.h). The call runs on T's own
//    stack below the red zone, 16-byte aligned.
//  * A frame built on T's stack lets T restore itself (rt_sigreturn) if the
//    controller dies at any instant: the target goes on running correctly.
//    In that case only the scratch mapping (64 KiB) remains, until the next
//    open() of the process removes it (once its owner is gone and no thread
//    can still run in it). The same rt_sigreturn is the normal restore
//    wherever the frame is exact.
//  * A function runs under PTRACE_CONT: its own system calls cost no ptrace
//    stops. The call ends at a signal the process ignores, which the stub
//    sends itself and which is dequeued only once T is restored (a "marked
//    call", see choose_marker in remote/target.cc). Where no such signal
//    exists, the call ends at the stub's rt_sigreturn under PTRACE_SYSCALL.
//  * Signals that arrive meanwhile stay pending and are delivered afterwards;
//    a job-control stop that arrives meanwhile leaves the process stopped.
//
// Threading: a Target may be used from any thread; calls on one Target are
// serialised by an internal mutex. Each call seizes and releases its thread
// on the calling OS thread, so no ptrace state outlives a call.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/remote_ptr.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "remote/seccomp.h"

namespace remora::remote {

// One argument of a remote call: an integer/pointer passed as is, or bytes
// copied into the target whose address is passed instead. Up to 16 KiB of
// bytes in all travel on the called thread's own stack, below the restore
// frame, written once the thread is seized (so that no other controller of
// the process can overwrite them); more go into the scratch mapping. Either
// way they are inputs: the copy is gone once the call returns.
struct CallArg {
  enum class Kind { kInteger, kBytes };
  Kind kind = Kind::kInteger;
  uint64_t value = 0;
  std::vector<std::byte> bytes;

  static CallArg integer(uint64_t v);
  // A NUL-terminated copy of `s`.
  static CallArg string(std::string_view s);
  static CallArg buffer(std::span<const std::byte> b);
};

struct CallOptions {
  // Thread to use; 0 lets Remora choose (it prefers a thread blocked in a
  // restartable system call, and avoids threads in uninterruptible sleep).
  pid_t tid = 0;
  // Deadline for the whole call, seize to release.
  std::chrono::milliseconds timeout{5000};
  // At the deadline a function call is taken back wherever it is: inside a
  // lock it took, that lock would stay taken for good. With a grace, a call
  // found running (not waiting in a system call) at the deadline runs up to
  // this much longer; one waiting (on a lock held by a stopped thread,
  // holding none itself, as the caller knows) is taken back at once.
  std::chrono::milliseconds running_grace{0};
};

// What a call observed, beyond its return value.
struct CallReport {
  uint64_t value = 0;                   // rax (x86_64) / x0 (aarch64)
  pid_t tid = 0;                        // the thread that ran the call
  std::chrono::nanoseconds stopped{0};  // how long T was held, seize to release
  // Ptrace stops the call took: 2 for a marked call (the interrupt, the
  // marker), however many system calls the function made.
  int stops = 0;
};

class Transaction;

class Target {
 public:
  // Opens a session with process `pid` (as the caller sees it). Checks, in
  // this order, each with its own error code and a message saying what to do:
  // no such process, the caller's own process, a zombie, a kernel thread,
  // another tracer holds it (names the tracer pid), ptrace refused (names the
  // refusing rule: uid, CAP_SYS_PTRACE, Yama ptrace_scope, not dumpable),
  // a process on musl libc (Errc::kNotSupported, naming its loader; see
  // remote/musl.h). Statically linked targets are refused when a call needs
  // libc. Then removes the scratch mappings that controllers killed mid-call
  // left in the process (remote/scratch.h; logged on channel "remote"; a
  // failure there is logged and does not fail the open).
  static Result<std::unique_ptr<Target>> open(pid_t pid);
  ~Target();  // close(), errors ignored
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  pid_t pid() const { return pid_; }
  // No program interpreter (AT_BASE is 0, as read at open): a statically
  // linked program, in which Remora cannot call libc.
  bool is_static() const;
  // The pid as the target sees itself (last NSpid entry); == pid() outside namespaces.
  pid_t ns_pid() const { return ns_pid_; }
  // `tid` is a thread the process made from the one our calls last ran on
  // (the agent's listener, which our loader thread started): it inherited
  // that thread's seccomp state, so its first seize needs no /proc read of
  // its own while that thread's is fresh. (Filters a later TSYNC install
  // gave it are still read once it is stopped, before anything changes.)
  void note_descendant_thread(pid_t tid);
  // The process lives in a pid namespace below ours (NSpid has more than one
  // entry): its own thread ids differ from the ones we use.
  bool in_nested_pid_ns() const { return nested_pid_ns_; }
  // The process was in a job-control stop when open read its status.
  bool stopped_at_open() const { return stopped_at_open_; }

  // Address of `symbol` in library `library` of the target. `library` is an
  // exact path, a soname ("libc.so.6") or a basename prefix ("libc"); empty
  // means: the main executable, then every loaded library in map order.
  Result<RemoteAddr> find_symbol(std::string_view library, std::string_view symbol);

  // Address of a variable (a data symbol) of `library`; no IFUNC handling.
  Result<RemoteAddr> find_variable(std::string_view library, std::string_view symbol);

  // Several symbols of one library with one read of the target's maps (each
  // lookup alone reads them): the addresses in the order asked, or the error
  // of the first that cannot be found.
  struct SymbolQuery {
    std::string_view name;
    bool function = true;  // false: a variable
    bool required = true;  // false: a null address when the library lacks it
  };
  Result<std::vector<RemoteAddr>> find_symbols(std::string_view library,
                                               std::span<const SymbolQuery> queries);

  // Makes one thread call `fn` with up to six integer arguments (bytes
  // arguments are copied into the target first) and returns its result.
  Result<CallReport> call(RemoteAddr fn, std::span<const CallArg> args, const CallOptions& opts = {});
  // A call of a function of one argument whose memory can only be written
  // once the scratch exists (it holds addresses in it): `prepare` writes
  // that memory, through scratch_alloc, write and the stub addresses
  // (loader_start, thread_trampoline), and names the function and its
  // argument; it must make no remote call of its own. Where there is no
  // scratch yet, `prepare` runs right after the scratch is mapped and the
  // function is the tail of the scratch's own setup routine: the creation,
  // the setup and this call are one call of one transaction on one thread
  // (one seize, stop and release fewer than ensure-then-call, and one stop
  // at the end fewer than two calls). Otherwise it is call().
  struct Prepared {
    RemoteAddr fn;
    uint64_t arg = 0;
  };
  using Prepare = std::function<Result<Prepared>()>;
  Result<CallReport> call_prepared(const Prepare& prepare, const CallOptions& opts = {});
  // find_symbol + call.
  Result<CallReport> call_symbol(std::string_view library, std::string_view symbol,
                                 std::span<const CallArg> args, const CallOptions& opts = {});
  // Makes one thread execute system call `nr`; returns the raw result
  // (negative errno on failure, as the kernel returns it).
  Result<CallReport> syscall(long nr, std::span<const uint64_t> args, const CallOptions& opts = {});

  // Checks, before an operation that makes the target run system calls of
  // its own choosing (loading the agent), that the thread opts.tid (0: the
  // one a call would choose) may make them: refuses (Errc::kNotSupported,
  // naming the call, the filter's verdict and `what`) a thread in seccomp
  // strict mode, or one whose filter would refuse one of `planned`. The
  // thread is seized, stopped and released untouched to read its filter;
  // a filter Remora may not read (not root) passes. See remote/seccomp.h.
  Result<void> check_syscalls(std::span<const seccomp::PlannedSyscall> planned, std::string_view what,
                              const CallOptions& opts = {});

  // Reads/writes target memory (through /proc/PID/mem, so read-only mappings
  // can be written, as a debugger does).
  Result<void> read(RemoteAddr addr, std::span<std::byte> out);
  Result<void> write(RemoteAddr addr, std::span<const std::byte> in);

  // Removes the scratch mapping (one more remote system call) and ends the
  // session. Idempotent.
  Result<void> close();

  // Whether a scratch mapping currently exists (for tests).
  std::optional<uint64_t> scratch_address() const;

  // Allocates `size` bytes (16-aligned) of session memory in the scratch
  // mapping, valid until close(); creates the scratch if needed. For data
  // that must outlive one call (a block a new target thread works on).
  Result<RemoteAddr> scratch_alloc(size_t size, const CallOptions& opts = {});
  // Address of the thread trampoline in the scratch code (see
  // arch::x86_64::Stub::kThreadTrampoline); creates the scratch if needed.
  Result<RemoteAddr> thread_trampoline(const CallOptions& opts = {});
  // Address of the loader start routine in the scratch code (a function of
  // one argument, an arch::LoaderStart: arch/loader_block.h); creates the
  // scratch if needed.
  Result<RemoteAddr> loader_start(const CallOptions& opts = {});

  // Uses code and data that already exist in the target (the agent's
  // exported remora_agent_stub and remora_agent_scratch) instead of a scratch
  // mapping of our own, which is then removed (by a call of munmap). `code` must
  // hold exactly arch::x86_64::stub_code(). close() then leaves them alone.
  // With `remove_own` false, our own mapping is retired instead of removed:
  // nothing runs in it any more, and take_retired_scratch() hands it to a
  // caller that has the target remove it within a call it makes anyway
  // (one remote call fewer). close() removes it if nobody took it.
  Result<void> adopt_scratch(RemoteAddr code, RemoteAddr data, size_t data_size, bool remove_own = true);
  struct Mapping {
    RemoteAddr start;
    size_t size = 0;
  };
  // The retired scratch mapping, once: its removal is the caller's from now on.
  std::optional<Mapping> take_retired_scratch();
  // Removes a retired scratch mapping by a call of munmap through the
  // adopted stubs.
  Result<void> remove_scratch(const Mapping& m);

  // Forgets the scratch mapping without removing it: for when a thread of
  // the target may still execute in it (a loader thread that never came
  // back). Leaking 64 KiB is better than unmapping code under a thread.
  void abandon_scratch();

  // Internal: skip /proc/PID/map_files when opening mapped files, so tests can
  // exercise the fallback through the target's root (/proc/PID/root). Also
  // forgets the symbols resolved so far in this session.
  void set_use_map_files(bool use);

 private:
  friend class Transaction;  // one call on one thread (remote/transaction.h)
  struct Impl;
  explicit Target(pid_t pid);
  pid_t pid_;
  pid_t ns_pid_;
  bool nested_pid_ns_ = false;
  bool stopped_at_open_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remora::remote
