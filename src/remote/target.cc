// remote::Target: opening a session, symbol lookup with its cache, the
// scratch mapping (created, adopted, retired, removed), and the choice of the
// thread and of a marked call's marker. One call on one thread is a
// Transaction (remote/transaction.cc, which explains the mechanics); the
// session state both share is Target::Impl (remote/target_impl.h).
#include "remote/target.h"

#include <elf.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "arch/host.h"
#include "arch/wake_rules.h"
#include "base/deadline.h"
#include "base/log.h"
#include "base/strings.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/lookup.h"
#include "remote/memory.h"
#include "remote/musl.h"
#include "remote/seccomp.h"
#include "remote/target_impl.h"
#include "remote/transaction.h"

namespace remora::remote {

namespace a = arch::host;
using Clock = std::chrono::steady_clock;

CallArg CallArg::integer(uint64_t v) { return CallArg{Kind::kInteger, v, {}}; }

CallArg CallArg::string(std::string_view s) {
  CallArg a{Kind::kBytes, 0, {}};
  a.bytes.resize(s.size() + 1);
  std::memcpy(a.bytes.data(), s.data(), s.size());
  return a;
}

CallArg CallArg::buffer(std::span<const std::byte> b) {
  return CallArg{Kind::kBytes, 0, std::vector<std::byte>(b.begin(), b.end())};
}

// The session state (Target::Impl) is in remote/target_impl.h.

std::string process_str(pid_t pid, pid_t ns_pid) {
  std::string s = "process " + std::to_string(pid);
  if (ns_pid != pid && ns_pid != 0) s += " (pid " + std::to_string(ns_pid) + " in its own pid namespace)";
  return s;
}

namespace {

bool is_job_control_stop(int sig) {
  return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

}  // namespace

// ---------------------------------------------------------------------------
// Opening a session.

Result<std::unique_ptr<Target>> Target::open(pid_t pid) {
  const std::string p = std::to_string(pid);
  // Everything that can refuse before a byte is touched: pid, zombie, kernel
  // thread, another tracer (a passing one waited out), ptrace permission.
  auto st = REMORA_TRY_CTX(ptrace::precheck_open(pid), "open process " + p);
  REMORA_TRY_CTX(seccomp::check_open(pid, st.seccomp), "open process " + p);

  auto mem = REMORA_TRY_CTX(Memory::open(pid), "open process " + p);
  auto target = std::unique_ptr<Target>(new Target(pid));
  target->impl_ = std::make_unique<Impl>(std::move(mem));
  Impl& im = *target->impl_;
  im.pid = pid;
  int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pfd >= 0) im.pidfd.reset(pfd);
  if (!st.nspid.empty()) target->ns_pid_ = st.nspid.back();
  target->nested_pid_ns_ = st.nspid.size() > 1;
  target->stopped_at_open_ = st.state == 'T';
  im.ns_pid = target->ns_pid_;
  // The main thread's seccomp mode is the process's (the status just read):
  // the first seize's check needs no read of its own.
  im.seccomp_guard.note_status(pid, st.seccomp);
  // The process's signal dispositions, as choose_marker would read them
  // again for the first call: the same status, just read.
  im.sig_ign = st.sig_ign;
  im.sig_cgt = st.sig_cgt;
  im.seccomp = st.seccomp;
  im.dispositions_read = Impl::Clock::now();
  auto auxv = REMORA_TRY_CTX(procfs::read_auxv(pid), "open process " + p);
  im.at_phdr = procfs::auxv_get(auxv, AT_PHDR).value_or(0);
  // No program interpreter: a statically linked program (AT_BASE is the
  // interpreter's load address, 0 when there is none).
  im.is_static = procfs::auxv_get(auxv, AT_BASE).value_or(0) == 0;
  if (im.is_static) return target;
  auto maps = REMORA_TRY_CTX(procfs::read_maps(pid), "open process " + p);
  im.remember_maps(maps);  // the first lookups use them (a reclaim below forgets them)
  // musl: refused at once, before anything is looked up or changed.
  const std::string interp = maps_glibc(maps) ? std::string() : program_interpreter(pid).value_or("");
  if (auto loader = musl_loader(interp, maps))
    return std::move(musl_error(process_str(pid, im.ns_pid), *loader)).with_context("open process " + p);
  // What controllers killed mid-call left behind. A failure here changes
  // nothing the session needs: it is logged, and the mappings stay.
  if (auto n = im.reclaim_dead_scratch(maps); !n)
    REMORA_LOG(kRemote, "scratch reclaim in process %d: %s", pid, n.error().to_string().c_str());
  return target;
}

Target::Target(pid_t pid) : pid_(pid), ns_pid_(pid) {}

void Target::note_descendant_thread(pid_t tid) {
  std::lock_guard lock(impl_->mu);
  if (impl_->preferred_tid != 0) impl_->seccomp_guard.inherit_status(tid, impl_->preferred_tid);
}

bool Target::is_static() const { return impl_->is_static; }

Target::~Target() { (void)close(); }

Result<RemoteAddr> Target::scratch_alloc(size_t size, const CallOptions& opts) {
  std::lock_guard lock(impl_->mu);
  uint64_t rounded = (static_cast<uint64_t>(size) + 15) & ~uint64_t{15};
  REMORA_TRY(impl_->ensure_scratch(opts.tid, opts.timeout));
  const uint64_t area = session_area(impl_->data_size);
  if (rounded > area - impl_->session_used)
    return Error(Errc::kInvalidArgument,
                 "scratch session memory exhausted (" + std::to_string(size) + " bytes asked)");
  uint64_t at = impl_->data_base + impl_->data_size - area + impl_->session_used;
  impl_->session_used += rounded;
  return RemoteAddr(at);
}

Result<RemoteAddr> Target::thread_trampoline(const CallOptions& opts) {
  std::lock_guard lock(impl_->mu);
  REMORA_TRY(impl_->ensure_scratch(opts.tid, opts.timeout));
  return RemoteAddr(*impl_->scratch + a::Stub::kThreadTrampoline);
}

Result<RemoteAddr> Target::loader_start(const CallOptions& opts) {
  std::lock_guard lock(impl_->mu);
  REMORA_TRY(impl_->ensure_scratch(opts.tid, opts.timeout));
  return RemoteAddr(*impl_->scratch + a::Stub::kLoaderStart);
}

Result<void> Target::adopt_scratch(RemoteAddr code, RemoteAddr data, size_t data_size, bool remove_own) {
  std::optional<uint64_t> own;
  {
    std::lock_guard lock(impl_->mu);
    if (impl_->scratch && impl_->scratch_owned) own = impl_->scratch_base;
    impl_->scratch = code.addr();
    impl_->data_base = data.addr();
    impl_->data_size = data_size;
    impl_->scratch_owned = false;
    impl_->session_used = 0;
    if (own && !remove_own) {
      impl_->retired = own;
      return ok();
    }
  }
  if (!own) return ok();
  return remove_scratch(Mapping{RemoteAddr(*own), kScratchSize});
}

// Our own scratch goes, removed by a call of libc's munmap through the
// adopted stubs: one marked call, where a system call through libc's gadget
// costs two stops and a full restore.
Result<void> Target::remove_scratch(const Mapping& m) {
  CallArg args[] = {CallArg::integer(m.start.addr()), CallArg::integer(m.size)};
  auto r = call_symbol("libc.so.6", "munmap", args);
  if (!r) return std::move(r).error().with_context("remove the scratch mapping");
  if (r->value != 0) return Error(Errc::kIo, "munmap of the scratch mapping failed in the target");
  return ok();
}

std::optional<Target::Mapping> Target::take_retired_scratch() {
  std::lock_guard lock(impl_->mu);
  if (!impl_->retired) return std::nullopt;
  Mapping m{RemoteAddr(*impl_->retired), kScratchSize};
  impl_->retired.reset();
  return m;
}

void Target::abandon_scratch() {
  std::lock_guard lock(impl_->mu);
  impl_->scratch.reset();
  impl_->scratch_owned = false;
  impl_->session_used = 0;
}

void Target::set_use_map_files(bool use) {
  std::lock_guard lock(impl_->mu);
  impl_->lookup_options.use_map_files = use;
  impl_->symbols.clear();
  impl_->images.clear();
}

std::optional<uint64_t> Target::scratch_address() const {
  if (!impl_ || !impl_->scratch) return std::nullopt;
  return impl_->scratch_owned ? impl_->scratch_base : *impl_->scratch;
}

Result<void> Target::read(RemoteAddr addr, std::span<std::byte> out) {
  return impl_->mem.read(addr.addr(), out);
}

Result<void> Target::write(RemoteAddr addr, std::span<const std::byte> in) {
  return impl_->mem.write(addr.addr(), in);
}

// One lookup, with the maps the caller read (IFUNC resolution may re-read them).
Result<RemoteAddr> Target::Impl::lookup(std::string_view library, std::string_view symbol, bool function,
                                        std::vector<procfs::MapEntry>& maps, const MappedLibrary* lib) {
  // Built only on an error: a cache hit is the common case.
  auto ctx = [&] {
    return std::string("find ") + (function ? "" : "variable ") + std::string(symbol) + " in " +
           process_str(pid, ns_pid);
  };
  auto resolve = [&](bool want_code) {
    return lib ? resolve_in_library(pid, mem, *lib, symbol, lookup_options, want_code, &images)
               : resolve_symbol(pid, mem, library, symbol, at_phdr, lookup_options, want_code, &maps,
                                &images);
  };
  if (!function) {
    auto sym = REMORA_TRY_CTX(resolve(false), ctx());
    return RemoteAddr(sym.address);
  }
  auto key = std::make_pair(std::string(library), std::string(symbol));
  auto mapped_from = [&](uint64_t addr) -> const procfs::MapEntry* {
    for (const auto& m : maps)
      if (addr >= m.start && addr < m.end) return m.exec && m.file_backed() ? &m : nullptr;
    return nullptr;
  };
  if (auto it = symbols.find(key); it != symbols.end()) {
    const auto* m = mapped_from(it->second.address);
    if (m != nullptr && m->dev() == it->second.dev && m->inode == it->second.inode)
      return RemoteAddr(it->second.address);
    symbols.erase(it);
  }
  auto sym = REMORA_TRY_CTX(resolve(true), ctx());
  uint64_t address = sym.address;
  if (sym.ifunc) {
    // An IFUNC symbol (strlen, memcpy...) is a resolver that returns the
    // implementation chosen for this CPU: call it to get the function.
    auto chosen = REMORA_TRY_CTX(run(0, false, sym.address, {}, std::chrono::milliseconds(5000)),
                                 "resolve IFUNC " + std::string(symbol));
    address = chosen.value;
    maps = REMORA_TRY_CTX(procfs::read_maps(pid), ctx());
    remember_maps(maps);
  }
  if (const auto* m = mapped_from(address)) symbols[key] = {address, m->dev(), m->inode};
  return RemoteAddr(address);
}

// The target's maps, for a series of lookups; forgets memoized images whose
// header mapping has gone (a dlclose, or a dlopen at the same place).
Result<std::vector<procfs::MapEntry>> Target::Impl::maps_for_lookup() {
  if (maps_memo && Clock::now() - maps_memo_at < kMapsMemoAge) return *maps_memo;
  auto maps = REMORA_TRY_CTX(procfs::read_maps(pid), "read the maps of " + process_str(pid, ns_pid));
  remember_maps(maps);
  for (auto it = images.begin(); it != images.end();) {
    auto [dev, inode, start] = it->first;
    bool present = std::any_of(maps.begin(), maps.end(), [&](const procfs::MapEntry& m) {
      return m.start == start && m.dev() == dev && m.inode == inode && m.offset == 0;
    });
    it = present ? std::next(it) : images.erase(it);
  }
  return maps;
}

Result<RemoteAddr> Target::find_symbol(std::string_view library, std::string_view symbol) {
  std::lock_guard lock(impl_->mu);
  auto maps = REMORA_TRY(impl_->maps_for_lookup());
  return impl_->lookup(library, symbol, true, maps);
}

Result<RemoteAddr> Target::find_variable(std::string_view library, std::string_view symbol) {
  std::lock_guard lock(impl_->mu);
  auto maps = REMORA_TRY(impl_->maps_for_lookup());
  return impl_->lookup(library, symbol, false, maps);
}

Result<std::vector<RemoteAddr>> Target::find_symbols(std::string_view library,
                                                     std::span<const SymbolQuery> queries) {
  std::lock_guard lock(impl_->mu);
  auto maps = REMORA_TRY(impl_->maps_for_lookup());
  // The library once for the whole series, not once per symbol.
  std::optional<MappedLibrary> lib;
  if (!library.empty() && !queries.empty()) {
    auto found = find_library(pid_, maps, library);
    if (!found)
      return std::move(found).error().with_context("find " + std::string(queries[0].name) + " in " +
                                                   process_str(pid_, ns_pid_));
    lib = std::move(*found);
  }
  std::vector<RemoteAddr> out;
  out.reserve(queries.size());
  for (const auto& q : queries) {
    auto addr = impl_->lookup(library, q.name, q.function, maps, lib ? &*lib : nullptr);
    if (!addr && !q.required && addr.error().code() == Errc::kSymbolNotFound) {
      out.emplace_back();
      continue;
    }
    out.push_back(REMORA_TRY(std::move(addr)));
  }
  return out;
}

Result<CallReport> Target::call_symbol(std::string_view library, std::string_view symbol,
                                       std::span<const CallArg> args, const CallOptions& opts) {
  auto fn = REMORA_TRY(find_symbol(library, symbol));
  return call(fn, args, opts);
}

Result<CallReport> Target::call(RemoteAddr fn, std::span<const CallArg> args, const CallOptions& opts) {
  if (args.size() > 6)
    return Error(Errc::kInvalidArgument,
                 "a remote call takes at most 6 arguments, got " + std::to_string(args.size()));
  if (fn.null()) return Error(Errc::kInvalidArgument, "cannot call address 0");
  std::lock_guard lock(impl_->mu);
  std::array<uint64_t, 6> regs{};
  uint64_t total = 0;
  for (const auto& a : args)
    if (a.kind == CallArg::Kind::kBytes) total += (a.bytes.size() + 15) & ~uint64_t{15};
  // Byte arguments of a usual size go on the called thread's own stack,
  // below the restore frame and in the same write, once the thread is
  // seized: a shared buffer (the agent's, which every controller of the
  // process uses) could be overwritten by another controller between the
  // copy and the call.
  if (total <= kStackArgsMax) {
    std::vector<Impl::StackArg> on_stack;
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].kind == CallArg::Kind::kInteger)
        regs[i] = args[i].value;
      else
        on_stack.push_back({i, args[i].bytes});
    }
    impl_->running_grace = opts.running_grace;
    auto r = impl_->run(opts.tid, false, fn.addr(), regs, opts.timeout, on_stack);
    impl_->running_grace = {};
    return r;
  }
  // Larger ones go into the scratch data area; it must exist first.
  REMORA_TRY(impl_->ensure_scratch(opts.tid, opts.timeout));
  const uint64_t room = impl_->data_size - session_area(impl_->data_size);
  if (total > room)
    return Error(Errc::kInvalidArgument, "byte arguments total " + std::to_string(total) +
                                             " bytes; at most " + std::to_string(room) + " fit");
  uint64_t cursor = impl_->data_base;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kind == CallArg::Kind::kInteger) {
      regs[i] = args[i].value;
      continue;
    }
    REMORA_TRY_CTX(impl_->mem.write(cursor, args[i].bytes), "copy argument " + std::to_string(i + 1));
    regs[i] = cursor;
    cursor += (args[i].bytes.size() + 15) & ~uint64_t{15};
  }
  impl_->data_args_end = cursor;
  impl_->running_grace = opts.running_grace;
  auto r = impl_->run(opts.tid, false, fn.addr(), regs, opts.timeout);
  impl_->running_grace = {};
  impl_->data_args_end = 0;
  return r;
}

Result<CallReport> Target::call_prepared(const Prepare& prepare, const CallOptions& opts) {
  std::lock_guard lock(impl_->mu);
  Impl& im = *impl_;
  if (!im.scratch) {
    // The scratch's creation, then its setup routine going on to this
    // call, on one thread in one transaction (Transaction::prepare_next),
    // placed as ensure_scratch places it.
    if (auto maps = im.maps_for_lookup()) im.scratch_hint = scratch_address_hint(*maps);
    return im.run(opts.tid, false, kSetupRequest, {}, opts.timeout, {}, &prepare);
  }
  auto p = REMORA_TRY(prepare());
  return im.run(opts.tid, false, p.fn.addr(), {p.arg}, opts.timeout);
}

Result<CallReport> Target::syscall(long nr, std::span<const uint64_t> args, const CallOptions& opts) {
  if (args.size() > 6) return Error(Errc::kInvalidArgument, "a system call takes at most 6 arguments");
  std::array<uint64_t, 6> regs{};
  std::copy(args.begin(), args.end(), regs.begin());
  std::lock_guard lock(impl_->mu);
  return impl_->run(opts.tid, true, static_cast<uint64_t>(nr), regs, opts.timeout);
}

Result<void> Target::check_syscalls(std::span<const seccomp::PlannedSyscall> planned, std::string_view what,
                                    const CallOptions& opts) {
  std::lock_guard lock(impl_->mu);
  const pid_t tid = opts.tid != 0 ? opts.tid : REMORA_TRY(impl_->pick_thread());
  return impl_->seccomp_guard.check_running(pid_, tid, planned, what, Deadline::after(opts.timeout));
}

Result<void> Target::close() {
  if (!impl_) return ok();
  if (auto m = take_retired_scratch()) REMORA_TRY(remove_scratch(*m));
  std::lock_guard lock(impl_->mu);
  if (!impl_->scratch) return ok();
  if (!impl_->scratch_owned) {
    // Adopted (the agent's): not ours to remove.
    impl_->scratch.reset();
    impl_->session_used = 0;
    return ok();
  }
  uint64_t base = impl_->scratch_base;
  // munmap runs through libc's syscall() gadget, never from the scratch page
  // it removes: a thread whose controller died right after the munmap must
  // return into mapped code (and from there restore itself).
  impl_->force_gadget = true;
  auto r =
      impl_->run(0, true, a::nr::kMunmap, {base, kScratchSize, 0, 0, 0, 0}, std::chrono::milliseconds(5000));
  impl_->force_gadget = false;
  impl_->scratch.reset();
  impl_->session_used = 0;
  if (!r) return std::move(r).error().with_context("remove the scratch mapping");
  if (static_cast<int64_t>(r->value) != 0)
    return Error(Errc::kIo, "munmap of the scratch mapping failed in the target",
                 static_cast<int>(-static_cast<int64_t>(r->value)));
  return ok();
}

// ---------------------------------------------------------------------------
// Choosing the thread.

Result<pid_t> Target::Impl::pick_thread() {
  // Reuse the last good thread while it still sleeps in a syscall: reading
  // every thread's state costs two /proc reads per thread. Its status says
  // both its state and its seccomp mode (a strict-mode thread can run no
  // code of ours), and serves the seize's own check that follows.
  bool strict_seen = false;
  auto score = [&](pid_t tid) -> int {
    strict_seen = false;
    auto st = procfs::read_status(pid, tid);
    if (!st) return -1;
    seccomp_guard.note_status(tid, st->seccomp);
    strict_seen = st->seccomp == SECCOMP_MODE_STRICT;
    switch (st->state) {
      case 'S': {
        auto sc = procfs::read_syscall(pid, tid);
        if (!sc || sc->running || sc->nr < 0) return 2;
        if (a::swaps_signal_mask(sc->nr) || a::never_restarted(sc->nr)) return 2;
        // Waiting for a glibc lock (the futex word holds 2): it may hold
        // another one, which the loader start's pthread_create could need.
        if (sc->nr == arch::wake::numbers(arch::wake::kHostArch).futex &&
            sc->args[2] == arch::wake::kGlibcLockWaitValue)
          return 2;
        return 3;  // blocked in a plainly restartable call: the best victim
      }
      case 'R': return 1;
      case 't':
      case 'T': return 1;
      case 'D': return 0;  // uninterruptible: would not stop until the I/O ends
      default: return -1;  // Z, X: exiting
    }
  };
  // The last thread that served well is used again without reading /proc:
  // if it has exited meanwhile, the seize fails and the choice is made anew.
  if (preferred_tid != 0) return preferred_tid;
  auto tasks = REMORA_TRY(procfs::list_tasks(pid));
  // One thread is no choice: it is taken without reading its state, when
  // its seccomp mode is known already (the status Target::open read).
  // Exiting, it fails the seize; in strict mode, the seize's check refuses it.
  if (tasks.size() == 1 && seccomp_guard.knows_status(tasks[0])) return preferred_tid = tasks[0];
  pid_t best = 0, strict = 0;
  int best_score = -1;
  for (pid_t tid : tasks) {
    int s = score(tid);
    if (s > best_score && strict_seen) {
      strict = tid;
      continue;
    }
    if (s > best_score) {
      best = tid;
      best_score = s;
      if (s == 3) break;
    }
  }
  if (best == 0 && strict != 0) return seccomp::strict_mode_error(strict);
  if (best == 0)
    return Error(Errc::kTargetExited, "process " + std::to_string(pid) + " has no live thread left");
  preferred_tid = best;
  return best;
}

// Creates the scratch mapping if there is none: one transaction, whose
// request is the new scratch's setup routine (see transact).
Result<void> Target::Impl::ensure_scratch(pid_t tid, std::chrono::milliseconds timeout) {
  if (scratch) return ok();
  if (auto maps = maps_for_lookup()) scratch_hint = scratch_address_hint(*maps);
  REMORA_TRY(run(tid, false, kSetupRequest, {}, timeout));
  return ok();
}

// ---------------------------------------------------------------------------
// Choosing the marker of a marked call (arch::x86_64::Stub).
//
// A function call runs under PTRACE_CONT, and ends with a signal the thread
// sends itself after the function returned; it stays pending (every signal
// is blocked) until the stub's rt_sigreturn has restored the thread, and
// then stops it in a signal-delivery stop the controller recognises exactly
// (that signal, the cookie the stub stored, an instruction pointer outside
// the stub). So the function's own system calls cost no ptrace stops: under
// PTRACE_SYSCALL each costs two, and a dlopen makes dozens.
//
// The marker must be harmless if the controller dies and nobody intercepts
// it: a signal the process ignores (SIG_IGN, or a default action of
// "ignore": SIGURG, SIGWINCH), which the kernel then discards. It must get
// through the mask the frame restores: preferably a candidate the called
// thread does not block (`blocked`), so that the frame restores the
// thread's exact mask even if nobody is left to fix it. A thread that blocks
// every candidate (the agent's listener blocks all signals) gets a frame
// mask with the marker unblocked and its own mask back by ptrace after the
// call; only if the controller dies mid-call does it keep that one ignored
// signal unblocked. Returns 0 when there is no candidate (every one has a
// handler) or when a seccomp filter might refuse the stub's tgkill: the call
// then ends at the stub's rt_sigreturn under PTRACE_SYSCALL.
int Target::Impl::choose_marker(uint64_t blocked) {
  const auto now = Clock::now();
  if (now - dispositions_read > std::chrono::milliseconds(250)) {
    auto st = procfs::read_status(pid);
    if (!st) return 0;
    sig_ign = st->sig_ign;
    sig_cgt = st->sig_cgt;
    seccomp = st->seccomp;
    dispositions_read = now;
  }
  if (seccomp != 0) return 0;
  auto bit = [](int sig) { return uint64_t{1} << (sig - 1); };
  int first = 0;  // the first candidate, blocked or not
  auto consider = [&](int sig) {
    if (first == 0) first = sig;
    return (blocked & bit(sig)) == 0;
  };
  for (int sig : {SIGURG, SIGWINCH})
    if ((sig_cgt & bit(sig)) == 0 && consider(sig)) return sig;
  for (int sig = 1; sig < 32; ++sig)
    if ((sig_ign & bit(sig)) != 0 && sig != SIGCONT && sig != SIGCHLD && !is_job_control_stop(sig) &&
        consider(sig))
      return sig;
  return first;
}

// ---------------------------------------------------------------------------
// Finding the bootstrap gadgets in libc.

Result<Gadgets> Target::Impl::find_gadgets() {
  if (is_static)
    return Error(Errc::kStaticBinary,
                 "process " + std::to_string(pid) +
                     " is statically linked (no dynamic loader, no libc.so): Remora calls "
                     "through the target's shared libc and cannot call into it");
  auto maps = REMORA_TRY(maps_for_lookup());
  auto libc = find_library(pid, maps, "libc.so.6");
  if (!libc)
    return Error(Errc::kNotSupported, "process " + std::to_string(pid) +
                                          " has no glibc (libc.so.6) mapped; remote calls need it for now");
  // Usually known already: libc's functions were looked up first.
  auto loaded = REMORA_TRY(load_image(pid, *libc, mem, lookup_options, &images));
  // The gadgets' offsets in one libc build are the same in every process
  // that maps it: remember them per image, keyed like the image cache. Not
  // where the trampoline is the vDSO's, which each process maps elsewhere.
  static std::mutex cache_mu;
  static std::map<std::string, std::pair<uint64_t, uint64_t>> cache;  // build id -> offsets from bias
  const std::string build_id = a::kRestoreRtInVdso ? std::string() : loaded.image->build_id_hex();
  if (!build_id.empty()) {
    std::lock_guard g(cache_mu);
    if (auto it = cache.find(build_id); it != cache.end())
      return Gadgets{loaded.bias + it->second.first, loaded.bias + it->second.second};
  }
  auto sym = loaded.image->find_symbol("syscall");
  if (!sym)
    return Error(Errc::kNotSupported, "libc of process " + std::to_string(pid) + " exports no syscall()");
  Gadgets g;
  std::array<std::byte, 64> code{};
  REMORA_TRY(mem.read(loaded.bias + sym->value, code));
  auto tail =
      std::span(reinterpret_cast<const std::byte*>(a::kSyscallFnTail.data()), a::kSyscallFnTail.size());
  auto it = std::search(code.begin() + a::kSyscallGadgetLead, code.end(), tail.begin(), tail.end());
  uint32_t lead = 0;
  if (it != code.end() && a::kSyscallGadgetLead != 0) std::memcpy(&lead, &*(it - a::kSyscallGadgetLead), 4);
  if (it == code.end() || !a::syscall_gadget_lead_ok(lead))
    return Error(Errc::kNotSupported, "libc's syscall() in process " + std::to_string(pid) +
                                          " does not have the expected shape (its system call instruction "
                                          "followed by the error check)");
  g.syscall_insn = loaded.bias + sym->value + static_cast<uint64_t>(it - code.begin());
  // __restore_rt is local (not exported): find its exact bytes in libc's text.
  auto pattern =
      std::span(reinterpret_cast<const std::byte*>(a::kRestoreRtPattern.data()), a::kRestoreRtPattern.size());
  auto search = [&](uint64_t from, uint64_t to) -> Result<uint64_t> {  // 0: not there
    if (to <= from || to - from < pattern.size()) return uint64_t{0};
    std::vector<std::byte> chunk(std::min<uint64_t>(to - from, 64 * 1024 + pattern.size()));
    for (uint64_t at = from; at < to; at += chunk.size() - pattern.size()) {
      const uint64_t len = std::min<uint64_t>(chunk.size(), to - at);
      REMORA_TRY(mem.read(at, std::span(chunk.data(), len)));
      auto end = chunk.begin() + static_cast<long>(len);
      if (auto hit = std::search(chunk.begin(), end, pattern.begin(), pattern.end()); hit != end)
        return at + static_cast<uint64_t>(hit - chunk.begin());
      if (len < chunk.size()) break;
    }
    return uint64_t{0};
  };
  // glibc's own __restore_rt, or, where libc has none (aarch64), the
  // vDSO's rt_sigreturn trampoline.
  std::vector<procfs::MapEntry> where;
  for (const auto& m : a::kRestoreRtInVdso ? maps : libc->maps)
    if (m.exec && (!a::kRestoreRtInVdso || m.path == "[vdso]")) where.push_back(m);
  // glibc defines it in sigaction.c, beside __libc_sigaction: look there
  // first (a few hundred bytes, not the whole text).
  if (auto near = loaded.image->find_symbol("__libc_sigaction"); near && !a::kRestoreRtInVdso) {
    const uint64_t at = loaded.bias + near->value;
    for (const auto& m : where)
      if (at >= m.start && at < m.end && g.restore_rt == 0)
        g.restore_rt = REMORA_TRY(search(std::max(m.start, at - 512), std::min(m.end, at + 512)));
  }
  for (const auto& m : where)
    if (g.restore_rt == 0) g.restore_rt = REMORA_TRY(search(m.start, m.end));
  if (g.restore_rt == 0)
    return Error(Errc::kNotSupported,
                 "no rt_sigreturn trampoline found in libc (__restore_rt) or the vDSO of process " +
                     std::to_string(pid));
  REMORA_LOG(kRemote, "gadgets: syscall insn %#llx, restore_rt %#llx",
             static_cast<unsigned long long>(g.syscall_insn), static_cast<unsigned long long>(g.restore_rt));
  if (!build_id.empty()) {
    std::lock_guard g2(cache_mu);
    cache[build_id] = {g.syscall_insn - loaded.bias, g.restore_rt - loaded.bias};
  }
  return g;
}

// ---------------------------------------------------------------------------
// Running one request: choosing the thread, then one Transaction on it
// (remote/transaction.cc).

Result<CallReport> Target::Impl::run(pid_t tid, bool is_syscall, uint64_t fn_or_nr,
                                     std::array<uint64_t, 6> args, std::chrono::milliseconds timeout,
                                     std::span<const StackArg> on_stack, const Target::Prepare* then) {
  Deadline deadline = Deadline::after(timeout);
  // libc's gadgets are needed only to create or remove our own scratch.
  if (!gadgets && (!scratch || force_gadget)) gadgets = REMORA_TRY(find_gadgets());
  // Every request but the setup itself finds the scratch complete.
  const bool is_setup = !is_syscall && fn_or_nr == kSetupRequest;
  if (!scratch && !is_setup) {
    stack_refused = false;
    auto made = ensure_scratch(tid, timeout);
    // The thread asked for stands where no frame fits (its stack right
    // above a guard): the scratch is made on another thread, and the
    // call then runs on the scratch's own stack.
    if (!made && stack_refused && tid != 0) made = ensure_scratch(0, timeout);
    REMORA_TRY(std::move(made));
  }
  if (tid == 0) {
    tid = REMORA_TRY(pick_thread());
  } else {
    // /proc/PID/task/TID exists only for threads of PID: a tid of another
    // process must never be seized in its place.
    std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
    if (::access(task.c_str(), F_OK) != 0)
      return Error(Errc::kNoSuchProcess,
                   "no thread " + std::to_string(tid) + " in process " + std::to_string(pid));
    return transact(tid, is_syscall, fn_or_nr, args, deadline, on_stack, then);
  }
  auto r = transact(tid, is_syscall, fn_or_nr, args, deadline, on_stack, then);
  // (Both retries below come only from a seize that changed nothing: the
  // scratch is still to be made, and `then` still to run.)
  if (!r && seccomp_guard.refused_strict(tid)) {
    // The remembered thread entered strict mode: choose one that did not.
    preferred_tid = 0;
    tid = REMORA_TRY(pick_thread());
    return transact(tid, is_syscall, fn_or_nr, args, deadline, on_stack, then);
  }
  // Only a thread that was gone before the call began (the seize found no
  // such thread) is chosen again; an exit during the call is reported.
  if (!r && preferred_tid == tid && r.error().code() == Errc::kNoSuchProcess) {
    // The remembered thread is gone: choose again once.
    preferred_tid = 0;
    if (::kill(pid, 0) == 0 || errno == EPERM) {
      tid = REMORA_TRY(pick_thread());
      return transact(tid, is_syscall, fn_or_nr, args, deadline, on_stack, then);
    }
  }
  return r;
}

Result<CallReport> Target::Impl::transact(pid_t tid, bool is_syscall, uint64_t fn_or_nr,
                                          std::array<uint64_t, 6> args, const Deadline& deadline,
                                          std::span<const StackArg> on_stack, const Target::Prepare* then) {
  // What the call maps or unmaps makes the memo stale for later lookups;
  // the call's own frame check may still use it (a thread's stack mappings
  // do not move in the memo's few milliseconds).
  if (maps_memo && Clock::now() - maps_memo_at < kMapsMemoAge) call_maps = std::move(maps_memo);
  forget_maps();
  Transaction tx(*this, tid, deadline);
  auto r = tx.run(is_syscall, fn_or_nr, args, on_stack, then);
  call_maps.reset();
  return r;
}

}  // namespace remora::remote
