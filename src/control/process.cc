// control::Process: see process.h for the model. Implementation notes:
//
// * One tracer thread: every ptrace request for a Process is made on the
//   thread that created it (ptrace binds a tracee to its tracer thread).
// * Waiting: the ptrace layer's wait_stop() waits for one tid; a Process waits
//   for whichever of its threads stops first, so it polls each tid with
//   waitpid(tid, WNOHANG|__WALL) (never P_ALL: that would steal the stops of
//   other handles' tracees and reap the caller's other children), spinning
//   briefly and then sleeping in ppoll() on the wake-up eventfd.
// * All-stop: when one thread reports something, every other thread is
//   interrupted and waited for; what they report meanwhile is kept (a signal
//   to deliver later, a fork/exit event queued for the next cont()). A second
//   thread that hit a breakpoint is rewound and "forgotten": it executes the
//   int3 again when the breakpoints are next inserted, so nothing is lost.
// * Breakpoints are inserted just before the threads are resumed and removed
//   as soon as all of them are stopped again; a thread standing on a
//   breakpoint address is single-stepped over it first.
#include "control/process.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <set>

#include "base/log.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/lookup.h"
#include "remote/memory.h"

extern char** environ;

namespace remora::control {
namespace {

constexpr unsigned long kOptions = PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK |
                                   PTRACE_O_TRACEVFORKDONE | PTRACE_O_TRACEEXEC | PTRACE_O_TRACEEXIT |
                                   PTRACE_O_TRACESYSGOOD;
constexpr auto kStopAllTimeout = std::chrono::seconds(10);
constexpr int kRtConsistent = 0;  // enum r_state in <link.h>

std::string pid_str(pid_t p) { return std::to_string(p); }

unsigned long event_msg(pid_t tid) {
  unsigned long msg = 0;
  if (::ptrace(PTRACE_GETEVENTMSG, tid, nullptr, &msg) != 0) return 0;
  return msg;
}

bool is_stop_signal(int sig) { return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU; }

// What the wait loop observed.
struct WaitResult {
  enum class Kind { kStatus, kVanished, kWake, kSigIntr, kTimeout } kind;
  pid_t tid = 0;
  int status = 0;
};

// A stop that needs a decision above the thread level.
struct Raw {
  enum class Kind { kTrap, kExec, kFork, kVfork, kVforkDone, kExit, kGone, kWake, kSigIntr } kind;
  pid_t tid = 0;
  uint64_t addr = 0;  // kTrap: the breakpoint address (rip already rewound)
  pid_t other = 0;    // kFork/kVfork: the child; kExec: the former tid
  int status = 0;     // kExit: wait status; kGone: killing signal
};

// Waits for the first of `tids` to change state. Polling: see the file comment.
WaitResult wait_any(const std::vector<pid_t>& tids, const Deadline& deadline, int wake_fd) {
  int spins = 0;
  for (;;) {
    for (pid_t tid : tids) {
      int st = 0;
      pid_t r = ::waitpid(tid, &st, __WALL | WNOHANG);
      if (r == tid) {
        REMORA_LOG(kPtrace, "waitpid(%d) -> status %#x", tid, st);
        return {WaitResult::Kind::kStatus, tid, st};
      }
      if (r < 0) REMORA_LOG(kPtrace, "waitpid(%d) -> %s", tid, strerror(errno));
      if (r < 0 && errno == ECHILD) return {WaitResult::Kind::kVanished, tid, 0};
    }
    if (deadline.expired()) return {WaitResult::Kind::kTimeout};
    struct pollfd pfd {
      wake_fd, POLLIN, 0
    };
    if (spins < 64) {
      ++spins;
      if (wake_fd >= 0 && ::poll(&pfd, 1, 0) > 0) return {WaitResult::Kind::kWake};
      ::sched_yield();
      continue;
    }
    auto rem = std::chrono::duration_cast<std::chrono::microseconds>(deadline.remaining());
    long us = std::min<long>(spins < 200 ? 200 : 1000, static_cast<long>(rem.count()));
    ++spins;
    struct timespec ts {
      0, us * 1000
    };
    int n = ::ppoll(wake_fd >= 0 ? &pfd : nullptr, wake_fd >= 0 ? 1 : 0, &ts, nullptr);
    if (n > 0) return {WaitResult::Kind::kWake};
    if (n < 0 && errno == EINTR) return {WaitResult::Kind::kSigIntr};
  }
}

// Reads a NUL-terminated string from the target (at most `max` bytes).
std::string read_cstring(const remote::Memory& mem, uint64_t addr, size_t max = 4096) {
  std::string out;
  if (addr == 0) return out;
  while (out.size() < max) {
    std::array<char, 256> buf{};
    // Do not cross a page boundary in one read: the next page may be unmapped.
    size_t n = std::min<size_t>(buf.size(), 4096 - ((addr + out.size()) & 4095));
    if (!mem.read(addr + out.size(), std::as_writable_bytes(std::span(buf.data(), n)))) break;
    size_t len = strnlen(buf.data(), n);
    out.append(buf.data(), len);
    if (len < n) break;
  }
  return out;
}

// Reads the program headers of an ELF file and says whether it asks for a
// dynamic loader (PT_INTERP). Scripts ("#!") count as dynamic: their
// interpreter is what runs.
Result<bool> file_is_dynamic(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return Error::from_errno("open " + path);
  Elf64_Ehdr eh{};
  ssize_t n = ::pread(fd.get(), &eh, sizeof eh, 0);
  if (n >= 2 && reinterpret_cast<const char*>(&eh)[0] == '#' && reinterpret_cast<const char*>(&eh)[1] == '!')
    return true;
  if (n != static_cast<ssize_t>(sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64)
    return Error(Errc::kParse, path + " is not a 64-bit ELF executable");
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 512)
    return Error(Errc::kParse, path + ": bad program header table");
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (::pread(fd.get(), &ph, sizeof ph, static_cast<off_t>(eh.e_phoff + i * sizeof ph)) != sizeof ph)
      return Error(Errc::kParse, path + ": truncated program headers");
    if (ph.p_type == PT_INTERP) return true;
  }
  return false;
}

// PATH search as execvp does it (but in the parent, before fork).
Result<std::string> find_program(const std::string& name) {
  if (name.empty()) return Error(Errc::kInvalidArgument, "empty program name");
  auto check = [](const std::string& p) -> int {
    struct stat sb {};
    if (::stat(p.c_str(), &sb) != 0) return errno;
    if (!S_ISREG(sb.st_mode)) return EACCES;
    if (::access(p.c_str(), X_OK) != 0) return errno;
    return 0;
  };
  if (name.find('/') != std::string::npos) {
    int err = check(name);
    if (err == ENOENT || err == ENOTDIR) return Error(Errc::kIo, "program " + name + " not found", ENOENT);
    if (err != 0) return Error(Errc::kPtraceDenied, "cannot execute " + name + ": " + strerror(err), err);
    return name;
  }
  const char* path_env = ::getenv("PATH");
  std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  int last = ENOENT;
  size_t pos = 0;
  for (;;) {
    size_t colon = path.find(':', pos);
    std::string dir = path.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + name;
    int err = check(cand);
    if (err == 0) return cand;
    if (err != ENOENT && err != ENOTDIR) last = err;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  if (last != ENOENT)
    return Error(Errc::kPtraceDenied, "cannot execute " + name + " found in PATH: " + strerror(last), last);
  return Error(Errc::kIo, "program " + name + " not found in PATH (" + path + ")", ENOENT);
}

}  // namespace

const char* event_kind_name(Event::Kind k) {
  switch (k) {
    case Event::Kind::kIntr: return "eintr";
    case Event::Kind::kGone: return "targgone";
    case Event::Kind::kDlopen: return "dlopen";
    case Event::Kind::kDlclose: return "dlclose";
    case Event::Kind::kExec: return "exec";
    case Event::Kind::kFork: return "fork";
    case Event::Kind::kExit: return "exit";
  }
  return "?";
}

struct Process::Impl {
  struct Thread {
    bool stopped = false;
    bool awaiting_attach = false;  // auto-attached clone: its first stop is still to come
    int pending_sig = 0;
    // Blocked in vfork until its child execs or exits: no PTRACE_INTERRUPT
    // stops it before then (the wait is killable only), and it runs no code
    // of its own, so stopping every thread does not wait for it. Its
    // PTRACE_EVENT_VFORK_DONE stop ends this.
    bool in_vfork = false;
  };

  pid_t pid = 0;
  bool launched = false;
  bool alive = true;
  bool closed = false;
  std::map<pid_t, Thread> threads;
  std::optional<remote::Memory> mem;
  UniqueFd wake;
  std::deque<Raw> queued;

  // Loader state.
  bool dynamic = false;
  uint64_t r_debug = 0, r_brk = 0, at_entry = 0, at_phdr = 0;
  std::vector<LoadedObject> objects;

  // Breakpoints: where to put them on the next resume, and those in memory.
  std::set<uint64_t> bp_addrs;
  std::map<uint64_t, std::byte> inserted;
  std::map<uint64_t, std::byte> last_removed;  // for stripping a fork child
  // A vforked child shares our memory and runs free: no breakpoint until it
  // has exec'd or exited (PTRACE_EVENT_VFORK_DONE).
  bool vfork_child_running = false;
  // This handle is a vfork child that still shares its parent's memory: it
  // never inserts breakpoints (they would land in the parent) until it execs.
  bool shares_parent_mm = false;

  ~Impl() = default;

  std::vector<pid_t> running_tids() const {
    std::vector<pid_t> v;
    for (auto& [tid, t] : threads)
      if (!t.stopped) v.push_back(tid);
    return v;
  }

  // ---- breakpoints ----

  Result<void> insert_bps() {
    if (vfork_child_running || shares_parent_mm) return ok();
    for (uint64_t a : bp_addrs) {
      if (inserted.count(a) != 0) continue;
      std::byte orig{};
      REMORA_TRY_CTX(mem->read(a, std::span(&orig, 1)), "insert breakpoint");
      const std::byte cc{0xCC};
      REMORA_TRY_CTX(mem->write(a, std::span(&cc, 1)), "insert breakpoint");
      inserted[a] = orig;
    }
    return ok();
  }

  // Restores every breakpoint's byte; `write_memory` false after an exec (the
  // memory they were in is gone) or when the process is gone.
  void remove_bps(bool write_memory = true) {
    last_removed = inserted;
    if (write_memory && mem)
      for (auto& [a, orig] : inserted) (void)mem->write(a, std::span(&orig, 1));
    inserted.clear();
  }

  // ---- thread-level stop handling ----

  // Handles one wait status of `tid`. In running mode (`stopping_all` false)
  // an uninteresting stop is dealt with and the thread resumed; in
  // stopping_all mode the thread is left stopped and what it reported is kept.
  // Returns a Raw for anything that needs a decision.
  std::optional<Raw> handle_status(pid_t tid, int st, bool stopping_all) {
    auto it = threads.find(tid);
    if (it == threads.end()) return std::nullopt;
    Thread& t = it->second;
    auto resume = [&](int sig) {
      if (stopping_all) {
        if (sig != 0) t.pending_sig = sig;
        t.stopped = true;
        return;
      }
      if (ptrace::cont(tid, sig)) t.stopped = false;  // else ESRCH: it is dying, its exit comes later
    };
    if (WIFEXITED(st) || WIFSIGNALED(st)) {
      threads.erase(it);
      if (tid == pid) {
        alive = false;
        return Raw{Raw::Kind::kGone, tid, 0, 0, WIFSIGNALED(st) ? WTERMSIG(st) : 0};
      }
      return std::nullopt;
    }
    if (!WIFSTOPPED(st)) return std::nullopt;
    t.stopped = true;
    const int sig = WSTOPSIG(st);
    const int ev = st >> 16;
    switch (ev) {
      case 0: break;
      case PTRACE_EVENT_STOP:
        if (t.awaiting_attach) {
          t.awaiting_attach = false;
          resume(0);
          return std::nullopt;
        }
        if (is_stop_signal(sig) && !stopping_all) {
          // Group-stop: leave it in the job-control stop, still traced.
          if (::ptrace(PTRACE_LISTEN, tid, nullptr, nullptr) == 0) t.stopped = false;
          return std::nullopt;
        }
        resume(0);
        return std::nullopt;
      case PTRACE_EVENT_CLONE: {
        auto ntid = static_cast<pid_t>(event_msg(tid));
        if (ntid > 0 && threads.count(ntid) == 0) threads[ntid] = Thread{false, true, 0};
        resume(0);
        return std::nullopt;
      }
      case PTRACE_EVENT_FORK:
      case PTRACE_EVENT_VFORK: {
        Raw r{ev == PTRACE_EVENT_FORK ? Raw::Kind::kFork : Raw::Kind::kVfork, tid};
        r.other = static_cast<pid_t>(event_msg(tid));
        return r;
      }
      case PTRACE_EVENT_VFORK_DONE: t.in_vfork = false; return Raw{Raw::Kind::kVforkDone, tid};
      case PTRACE_EVENT_EXEC: {
        Raw r{Raw::Kind::kExec, tid};
        r.other = static_cast<pid_t>(event_msg(tid));
        return r;
      }
      case PTRACE_EVENT_EXIT: {
        int status = static_cast<int>(event_msg(tid));
        if (tid == pid && WIFEXITED(status) && !another_thread_execs())
          return Raw{Raw::Kind::kExit, tid, 0, 0, status};
        resume(0);
        return std::nullopt;
      }
      default: resume(0); return std::nullopt;
    }
    if (sig == (SIGTRAP | 0x80)) {  // a syscall stop we never asked for
      resume(0);
      return std::nullopt;
    }
    if (sig == SIGTRAP) {
      auto si = ptrace::get_siginfo(tid);
      if (si && si->si_code == SI_KERNEL) {
        auto regs = ptrace::get_regs(tid);
        if (regs && inserted.count(regs->rip - 1) != 0) {
          regs->rip -= 1;
          (void)ptrace::set_regs(tid, *regs);
          if (stopping_all) return std::nullopt;  // hit again after the next resume
          return Raw{Raw::Kind::kTrap, tid, regs->rip};
        }
      }
    }
    // A signal for the process: deliver it (now, or when the thread next runs).
    resume(sig);
    return std::nullopt;
  }

  // An exec from a non-leader thread first kills the leader (de_thread), which
  // then stops at PTRACE_EVENT_EXIT like a real exit; the execing thread is
  // meanwhile blocked inside execve. Tell the two apart by that.
  bool another_thread_execs() const {
    for (auto& [tid, t] : threads) {
      if (tid == pid) continue;
      auto sc = procfs::read_syscall(pid, tid);
      if (sc && !sc->running && (sc->nr == SYS_execve || sc->nr == SYS_execveat)) return true;
    }
    return false;
  }

  // Interrupts every running thread and waits until all are stopped.
  Result<void> stop_all() {
    for (auto& [tid, t] : threads)
      if (!t.stopped && !t.awaiting_attach && !t.in_vfork) (void)ptrace::interrupt(tid);
    Deadline dl = Deadline::after(kStopAllTimeout);
    for (;;) {
      std::vector<pid_t> tids;
      for (auto& [tid, t] : threads)
        if (!t.stopped && !t.in_vfork) tids.push_back(tid);
      if (tids.empty()) return ok();
      auto w = wait_any(tids, dl, -1);
      if (w.kind == WaitResult::Kind::kTimeout) {
        std::string list;
        for (pid_t t : tids) list += " " + pid_str(t);
        return Error(Errc::kTimedOut, "threads of process " + pid_str(pid) + " did not stop:" + list);
      }
      if (w.kind == WaitResult::Kind::kVanished) {
        threads.erase(w.tid);
        if (w.tid == pid) {
          alive = false;
          queued.push_back(Raw{Raw::Kind::kGone, w.tid});
        }
        continue;
      }
      if (w.kind != WaitResult::Kind::kStatus) continue;
      if (auto r = handle_status(w.tid, w.status, true)) queued.push_back(*r);
    }
  }

  // Single-steps every stopped thread that stands on a breakpoint address (the
  // breakpoints are not in memory at this point).
  void step_over_bps() {
    if (bp_addrs.empty()) return;
    for (auto& [tid, t] : threads) {
      if (!t.stopped) continue;
      for (int attempt = 0; attempt < 3; ++attempt) {
        auto regs = ptrace::get_regs(tid);
        if (!regs || bp_addrs.count(regs->rip) == 0) break;
        if (::ptrace(PTRACE_SINGLESTEP, tid, nullptr, nullptr) != 0) break;
        t.stopped = false;
        auto w = wait_any({tid}, Deadline::after(kStopAllTimeout), -1);
        if (w.kind != WaitResult::Kind::kStatus) {
          if (w.kind == WaitResult::Kind::kVanished) threads.erase(tid);
          return;  // iterator may be invalid: stop here, the rest will hit and be handled
        }
        if (WIFSTOPPED(w.status) && WSTOPSIG(w.status) == SIGTRAP && (w.status >> 16) == 0) {
          t.stopped = true;
          break;
        }
        if (auto r = handle_status(tid, w.status, true)) queued.push_back(*r);
        if (threads.count(tid) == 0) return;
      }
    }
  }

  Result<void> resume_all() {
    step_over_bps();
    REMORA_TRY(insert_bps());
    for (auto& [tid, t] : threads) {
      if (!t.stopped) continue;
      int sig = std::exchange(t.pending_sig, 0);
      if (ptrace::cont(tid, sig)) t.stopped = false;
    }
    return ok();
  }

  // Runs the process until something needs a decision; returns with every
  // thread stopped and no breakpoint in memory.
  Result<Raw> run(const Deadline& deadline, bool watch_wake) {
    if (queued.empty()) {
      REMORA_TRY(resume_all());
      std::optional<Raw> got;
      while (!got) {
        auto tids = running_tids();
        if (tids.empty()) {
          // Nobody left to wait for: the leader vanished without a status.
          alive = false;
          got = Raw{Raw::Kind::kGone, pid};
          break;
        }
        auto w = wait_any(tids, deadline, watch_wake ? wake.get() : -1);
        switch (w.kind) {
          case WaitResult::Kind::kStatus: got = handle_status(w.tid, w.status, false); break;
          case WaitResult::Kind::kVanished:
            threads.erase(w.tid);
            if (w.tid == pid) {
              alive = false;
              got = Raw{Raw::Kind::kGone, w.tid};
            }
            break;
          case WaitResult::Kind::kWake: got = Raw{Raw::Kind::kWake}; break;
          case WaitResult::Kind::kSigIntr: got = Raw{Raw::Kind::kSigIntr}; break;
          case WaitResult::Kind::kTimeout: {
            auto s = stop_all();
            remove_bps(alive);
            if (!s) return std::move(s).error();
            return Error(Errc::kTimedOut, "process " + pid_str(pid) + ": no event before the deadline");
          }
        }
      }
      queued.push_front(*got);
      if (alive && got->kind != Raw::Kind::kExec) {
        auto s = stop_all();
        if (!s) {
          remove_bps(alive);
          return std::move(s).error();
        }
      }
    }
    Raw r = queued.front();
    queued.pop_front();
    if (r.kind == Raw::Kind::kExec) {
      // The old memory (and our breakpoints in it) is gone, unless it was
      // shared with a vfork parent: then it is the parent's, restore there.
      if (shares_parent_mm) {
        remove_bps(true);
      } else {
        remove_bps(false);
      }
    } else {
      remove_bps(alive);
    }
    if (r.kind == Raw::Kind::kWake) {
      uint64_t v;
      (void)!::read(wake.get(), &v, sizeof v);
    }
    return r;
  }

  // ---- loader state ----

  Result<void> read_auxv() {
    auto auxv = REMORA_TRY(procfs::read_auxv(pid));
    at_entry = procfs::auxv_get(auxv, AT_ENTRY).value_or(0);
    at_phdr = procfs::auxv_get(auxv, AT_PHDR).value_or(0);
    uint64_t at_base = procfs::auxv_get(auxv, AT_BASE).value_or(0);
    dynamic = at_base != 0;
    r_debug = r_brk = 0;
    if (!dynamic) return ok();
    auto maps = REMORA_TRY(procfs::read_maps(pid));
    auto lib = REMORA_TRY_CTX(remote::library_at(pid, maps, at_base), "find the dynamic loader");
    auto img = REMORA_TRY_CTX(remote::load_image(pid, lib, *mem, {}), "read the dynamic loader " + lib.path);
    auto dds = img.image->find_symbol("_dl_debug_state");
    auto rd = img.image->find_symbol("_r_debug");
    if (!dds || !rd)
      return Error(Errc::kNotSupported,
                   "the dynamic loader " + lib.path +
                       " exports no _dl_debug_state/_r_debug: not a glibc-compatible loader");
    r_brk = img.bias + dds->value;
    r_debug = img.bias + rd->value;
    return ok();
  }

  Result<int> read_r_state() { return REMORA_TRY(mem->read_value<int32_t>(r_debug + 24)); }

  Result<std::vector<LoadedObject>> read_link_map() {
    std::vector<LoadedObject> out;
    uint64_t lm = REMORA_TRY(mem->read_value<uint64_t>(r_debug + 8));
    // r_brk as the loader announces it wins over the symbol (they agree on glibc).
    if (uint64_t brk = mem->read_value<uint64_t>(r_debug + 16).value_or(0); brk != 0) r_brk = brk;
    auto maps = procfs::read_maps(pid);
    for (int n = 0; lm != 0 && n < 65536; ++n) {
      struct {
        uint64_t l_addr, l_name, l_ld, l_next, l_prev;
      } raw{};
      REMORA_TRY(mem->read(lm, std::as_writable_bytes(std::span(&raw, 1))));
      LoadedObject o;
      o.lm = lm;
      o.bias = raw.l_addr;
      o.dynamic = raw.l_ld;
      o.name = read_cstring(*mem, raw.l_name);
      if (o.name.empty() && out.empty()) {
        std::array<char, 4096> buf{};
        ssize_t k = ::readlink(("/proc/" + pid_str(pid) + "/exe").c_str(), buf.data(), buf.size() - 1);
        if (k > 0) o.name.assign(buf.data(), static_cast<size_t>(k));
      }
      if (maps) o.base = header_of(*maps, raw.l_ld);
      if (o.base != 0) {
        auto read = [this](uint64_t a, std::span<std::byte> b) { return mem->read(a, b); };
        if (auto img = elf::ElfImage::headers_from_memory(o.base, read)) o.build_id = (*img)->build_id_hex();
      }
      out.push_back(std::move(o));
      lm = raw.l_next;
    }
    return out;
  }

  // The address of the ELF header of the object whose dynamic section is at
  // `ld`: the mapping of the same file at file offset 0 (the highest one below
  // `ld`), or for an anonymous image (the vDSO) the start of its mapping.
  static uint64_t header_of(const std::vector<procfs::MapEntry>& maps, uint64_t ld) {
    const procfs::MapEntry* at = nullptr;
    for (auto& m : maps)
      if (ld >= m.start && ld < m.end) at = &m;
    if (at == nullptr) return 0;
    if (!at->file_backed()) return at->start;
    uint64_t best = 0;
    for (auto& m : maps)
      if (m.dev() == at->dev() && m.inode == at->inode && m.offset == 0 && m.start <= ld) best = m.start;
    return best;
  }

  // Every function the loader will call before main: DT_PREINIT_ARRAY,
  // DT_INIT and DT_INIT_ARRAY entries of every object, plus AT_ENTRY.
  // glibc never rewrites these dynamic tags in place (it adjusts only the
  // tags it dereferences itself), and .init_array may or may not be relocated
  // yet, so each value is taken as absolute when it is at or above the bias
  // and as an unbiased address otherwise. Only addresses inside an executable
  // mapping are kept: a breakpoint must never land in data.
  std::set<uint64_t> init_functions() {
    std::set<uint64_t> out;
    auto maps = procfs::read_maps(pid);
    if (!maps) return out;
    auto executable = [&](uint64_t a) {
      for (auto& m : *maps)
        if (a >= m.start && a < m.end) return m.exec;
      return false;
    };
    auto add = [&](uint64_t a) {
      if (a != 0 && executable(a)) out.insert(a);
    };
    for (auto& o : objects) {
      if (o.dynamic == 0) continue;
      auto adj = [&](uint64_t v) { return (o.bias == 0 || v >= o.bias) ? v : v + o.bias; };
      uint64_t init = 0, arr = 0, arrsz = 0, pre = 0, presz = 0;
      for (int i = 0; i < 1024; ++i) {
        auto d = mem->read_value<Elf64_Dyn>(o.dynamic + static_cast<uint64_t>(i) * sizeof(Elf64_Dyn));
        if (!d || d->d_tag == DT_NULL) break;
        switch (d->d_tag) {
          case DT_INIT: init = d->d_un.d_ptr; break;
          case DT_INIT_ARRAY: arr = d->d_un.d_ptr; break;
          case DT_INIT_ARRAYSZ: arrsz = d->d_un.d_val; break;
          case DT_PREINIT_ARRAY: pre = d->d_un.d_ptr; break;
          case DT_PREINIT_ARRAYSZ: presz = d->d_un.d_val; break;
          default: break;
        }
      }
      if (init != 0) add(adj(init));
      for (auto [a, sz] : {std::pair{arr, arrsz}, std::pair{pre, presz}}) {
        if (a == 0) continue;
        for (uint64_t k = 0; k < std::min<uint64_t>(sz / 8, 4096); ++k) {
          auto v = mem->read_value<uint64_t>(adj(a) + k * 8);
          if (!v || *v == 0 || *v == ~0ull) continue;
          add(adj(*v));
        }
      }
    }
    add(at_entry);
    return out;
  }

  // Brings a process that just exec'd (single thread, at the exec stop) to the
  // launch stop: relocated, no constructor run. Returns an Event when the
  // process exits (or is gone) on the way.
  Result<std::optional<Event>> sync_new_image(const Deadline& deadline) {
    auto m = REMORA_TRY(remote::Memory::open(pid));
    mem.emplace(std::move(m));
    inserted.clear();
    objects.clear();
    REMORA_TRY(read_auxv());
    if (!dynamic) {
      bp_addrs.clear();
      return std::optional<Event>();
    }
    // Phase 1: the loader's rendezvous with r_state == RT_CONSISTENT: every
    // initial object is mapped.
    bp_addrs = {r_brk};
    for (;;) {
      Raw r = REMORA_TRY(run(deadline, false));
      if (auto ev = terminal_event(r)) return ev;
      if (r.kind == Raw::Kind::kTrap && r.addr == r_brk && read_r_state().value_or(-1) == kRtConsistent)
        break;
      if (r.kind == Raw::Kind::kFork || r.kind == Raw::Kind::kVfork) REMORA_TRY(handle_fork(r, false));
    }
    objects = REMORA_TRY(read_link_map());
    // Phase 2: the first init function (or the entry point) reached.
    bp_addrs = init_functions();
    for (;;) {
      Raw r = REMORA_TRY(run(deadline, false));
      if (auto ev = terminal_event(r)) return ev;
      if (r.kind == Raw::Kind::kTrap && bp_addrs.count(r.addr) != 0) break;
      if (r.kind == Raw::Kind::kFork || r.kind == Raw::Kind::kVfork) REMORA_TRY(handle_fork(r, false));
    }
    bp_addrs = {r_brk};
    objects = REMORA_TRY(read_link_map());
    return std::optional<Event>();
  }

  std::optional<Event> terminal_event(const Raw& r) {
    if (r.kind == Raw::Kind::kGone) {
      Event e;
      e.kind = Event::Kind::kGone;
      e.signal = r.status;
      return e;
    }
    if (r.kind == Raw::Kind::kExit) {
      Event e;
      e.kind = Event::Kind::kExit;
      e.tid = r.tid;
      e.exit_status = r.status;
      return e;
    }
    return std::nullopt;
  }

  // The child of a fork/vfork that `r` reports: wait for its first stop,
  // strip our breakpoints from its copy of memory (not for vfork: the memory
  // is the parent's, and the parent's breakpoints are already out), then
  // either make a handle of it or let it run free.
  Result<Event> handle_fork(const Raw& r, bool want_child) {
    Event e;
    e.kind = Event::Kind::kFork;
    e.tid = r.tid;
    e.child_pid = r.other;
    e.vfork = r.kind == Raw::Kind::kVfork;
    if (auto it = threads.find(r.tid); e.vfork && it != threads.end()) it->second.in_vfork = true;
    pid_t c = r.other;
    if (c <= 0) return e;
    auto w = wait_any({c}, Deadline::after(kStopAllTimeout), -1);
    if (w.kind != WaitResult::Kind::kStatus || !WIFSTOPPED(w.status)) {
      return e;  // it died already (or never showed up): nothing to hold
    }
    int first_sig = 0;
    if ((w.status >> 16) != PTRACE_EVENT_STOP && WSTOPSIG(w.status) != SIGTRAP)
      first_sig = WSTOPSIG(w.status);
    if (!e.vfork && !last_removed.empty()) {
      if (auto cm = remote::Memory::open(c)) {
        for (auto& [a, orig] : last_removed) (void)cm->write(a, std::span(&orig, 1));
      }
    }
    if (want_child) {
      auto ci = std::make_unique<Impl>();
      ci->pid = c;
      ci->launched = false;
      ci->threads[c] = Thread{true, false, first_sig};
      auto cm = remote::Memory::open(c);
      if (!cm) return std::move(cm).error().with_context("open fork child " + pid_str(c));
      ci->mem.emplace(std::move(*cm));
      ci->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
      ci->dynamic = dynamic;
      ci->r_debug = r_debug;
      ci->r_brk = r_brk;
      ci->at_entry = at_entry;
      ci->at_phdr = at_phdr;
      ci->objects = objects;
      if (dynamic) ci->bp_addrs = {r_brk};
      ci->shares_parent_mm = e.vfork;
      e.child.reset(new Process(std::move(ci)));
    } else {
      (void)ptrace::detach(c, first_sig);
      if (e.vfork) vfork_child_running = true;
    }
    return e;
  }

  // ---- release ----

  void detach_all() {
    for (auto& [tid, t] : threads) (void)ptrace::detach(tid, t.pending_sig);
    threads.clear();
  }

  Result<void> suspend() {
    // Put the whole process in a job-control stop while still traced, then
    // detach: a thread detached during a group-stop stays stopped.
    if (::kill(pid, SIGSTOP) != 0) return Error::from_errno("kill SIGSTOP " + pid_str(pid));
    for (auto& [tid, t] : threads) {
      int sig = std::exchange(t.pending_sig, 0);
      if (sig == SIGCONT) sig = 0;  // it would end the stop we are asking for
      if (ptrace::cont(tid, sig)) t.stopped = false;
    }
    std::set<pid_t> group_stopped;
    Deadline dl = Deadline::after(kStopAllTimeout);
    while (group_stopped.size() < threads.size()) {
      std::vector<pid_t> tids;
      for (auto& [tid, t] : threads)
        if (group_stopped.count(tid) == 0) tids.push_back(tid);
      auto w = wait_any(tids, dl, -1);
      if (w.kind == WaitResult::Kind::kTimeout) break;
      if (w.kind == WaitResult::Kind::kVanished) {
        threads.erase(w.tid);
        continue;
      }
      if (w.kind != WaitResult::Kind::kStatus) continue;
      int st = w.status;
      if (WIFEXITED(st) || WIFSIGNALED(st)) {
        threads.erase(w.tid);
        continue;
      }
      int ev = st >> 16, sig = WSTOPSIG(st);
      if (ev == PTRACE_EVENT_STOP && is_stop_signal(sig)) {
        group_stopped.insert(w.tid);
        continue;
      }
      if (ev == PTRACE_EVENT_CLONE) {
        auto ntid = static_cast<pid_t>(event_msg(w.tid));
        if (ntid > 0) threads[ntid] = Thread{false, true, 0};
      }
      // Signals go through (SIGSTOP among them: that starts the group-stop).
      (void)ptrace::cont(w.tid, ev == 0 && sig != SIGTRAP ? sig : 0);
    }
    detach_all();
    return ok();
  }

  Result<void> kill_and_reap() {
    (void)::kill(pid, SIGKILL);
    // A process already exiting (stopped at PTRACE_EVENT_EXIT) ignores the
    // SIGKILL: let its stopped threads run on to their end.
    for (auto& [tid, t] : threads)
      if (t.stopped) (void)ptrace::cont(tid, 0);
    Deadline dl = Deadline::after(kStopAllTimeout);
    while (!threads.empty()) {
      std::vector<pid_t> tids;
      for (auto& [tid, t] : threads) tids.push_back(tid);
      auto w = wait_any(tids, dl, -1);
      if (w.kind == WaitResult::Kind::kTimeout)
        return Error(Errc::kTimedOut, "process " + pid_str(pid) + " did not die after SIGKILL");
      if (w.kind == WaitResult::Kind::kVanished) {
        threads.erase(w.tid);
        continue;
      }
      if (w.kind != WaitResult::Kind::kStatus) continue;
      if (WIFEXITED(w.status) || WIFSIGNALED(w.status)) {
        threads.erase(w.tid);
      } else {
        (void)ptrace::cont(w.tid, 0);
      }
    }
    alive = false;
    return ok();
  }
};

// ---- Process ----

Process::Process(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Process::~Process() { (void)close(CloseMode::kDefault); }

pid_t Process::pid() const { return impl_->pid; }
bool Process::launched() const { return impl_->launched; }
bool Process::alive() const { return impl_->alive && !impl_->closed; }
const std::vector<LoadedObject>& Process::objects() const { return impl_->objects; }
std::vector<pid_t> Process::threads() const {
  std::vector<pid_t> v;
  for (auto& [tid, t] : impl_->threads) v.push_back(tid);
  return v;
}

void Process::interrupt() {
  uint64_t one = 1;
  if (impl_->wake) (void)!::write(impl_->wake.get(), &one, sizeof one);
}

Result<std::unique_ptr<Process>> Process::open(pid_t pid) {
  const std::string ctx = "open process " + pid_str(pid);
  if (pid <= 0) return Error(Errc::kInvalidArgument, "invalid process id " + pid_str(pid)).with_context(ctx);
  if (pid == ::getpid())
    return Error(Errc::kOwnProcess, "a process cannot control itself; run the controller as another process")
        .with_context(ctx);
  auto st = procfs::read_status(pid);
  if (!st) return std::move(st).error().with_context(ctx);
  if (st->tgid == ::getpid())
    return Error(Errc::kOwnProcess, pid_str(pid) + " is a thread of the calling process").with_context(ctx);
  if (st->tgid != pid)
    return Error(Errc::kInvalidArgument,
                 pid_str(pid) + " is a thread of process " + pid_str(st->tgid) + "; open the process instead")
        .with_context(ctx);
  if (st->state == 'Z' || st->state == 'X')
    return Error(Errc::kZombie, "process " + pid_str(pid) + " has exited (zombie)").with_context(ctx);
  if ((st->kthread && *st->kthread) || !st->has_vm)
    return Error(Errc::kKernelThread, pid_str(pid) + " is a kernel thread").with_context(ctx);
  if (st->tracer_pid == ::getpid())
    return Error(Errc::kTracedByOther,
                 "process " + pid_str(pid) +
                     " is already held by another handle (or tracer) of this process; "
                     "close that handle first",
                 EBUSY)
        .with_context(ctx);
  if (st->tracer_pid != 0)
    (void)ptrace::wait_until_untraced(pid, 0, Deadline::after(ptrace::kPassingTracerGrace));
  if (auto pre = ptrace::precheck_attach(pid); !pre) return std::move(pre).error().with_context(ctx);

  auto impl = std::make_unique<Impl>();
  impl->pid = pid;
  impl->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  // Seize every thread; rescan until no new one appears. Threads cloned by a
  // thread already seized are attached automatically (PTRACE_O_TRACECLONE):
  // seizing them again fails, and their first stop is awaited instead.
  auto fail = [&](Error e) -> Result<std::unique_ptr<Process>> {
    (void)impl->stop_all();
    impl->detach_all();
    return std::move(e).with_context(ctx);
  };
  for (int round = 0; round < 1000; ++round) {
    auto tasks = procfs::list_tasks(pid);
    if (!tasks) return fail(std::move(tasks).error());
    bool added = false;
    for (pid_t tid : *tasks) {
      if (impl->threads.count(tid) != 0) continue;
      added = true;
      if (auto s = ptrace::seize(pid, tid, kOptions); !s) {
        auto ts = procfs::read_status(pid, tid);
        if (ts && ts->tracer_pid == ::getpid()) {
          impl->threads[tid] = Impl::Thread{false, true, 0};
          continue;
        }
        if (s.error().code() == Errc::kNoSuchProcess && tid != pid) continue;  // it exited
        return fail(std::move(s).error());
      }
      impl->threads[tid] = Impl::Thread{};
      (void)ptrace::interrupt(tid);
    }
    if (!added) break;
  }
  if (auto s = impl->stop_all(); !s) return fail(std::move(s).error());
  if (!impl->alive) return Error(Errc::kNoSuchProcess, "process exited while being opened").with_context(ctx);
  impl->queued.clear();  // events raced with the attach: they are part of the past

  auto m = remote::Memory::open(pid);
  if (!m) return fail(std::move(m).error());
  impl->mem.emplace(std::move(*m));
  if (auto s = impl->read_auxv(); !s) return fail(std::move(s).error());
  if (!impl->dynamic)
    return fail(Error(Errc::kStaticBinary, "process " + pid_str(pid) +
                                               " is statically linked: it has no dynamic loader to follow"));
  impl->bp_addrs = {impl->r_brk};
  // Caught in the middle of a dlopen/dlclose: run on to the consistent state.
  for (int i = 0; i < 100 && impl->read_r_state().value_or(kRtConsistent) != kRtConsistent; ++i) {
    auto r = impl->run(Deadline::after(std::chrono::seconds(10)), false);
    if (!r) return fail(std::move(r).error());
    if (r->kind == Raw::Kind::kGone || r->kind == Raw::Kind::kExit)
      return Error(Errc::kTargetExited, "process exited while being opened").with_context(ctx);
    if (r->kind != Raw::Kind::kTrap) impl->queued.push_back(*r);
    if (!impl->queued.empty()) break;
  }
  auto objs = impl->read_link_map();
  if (!objs) return fail(std::move(objs).error());
  impl->objects = std::move(*objs);
  return std::unique_ptr<Process>(new Process(std::move(impl)));
}

Result<std::unique_ptr<Process>> Process::launch(const LaunchOptions& opts) {
  if (opts.argv.empty()) return Error(Errc::kInvalidArgument, "launch: empty argv");
  const std::string ctx = "launch " + opts.argv[0];
  auto path = REMORA_TRY_CTX(find_program(opts.argv[0]), ctx);
  struct stat sb {};
  if (::stat(path.c_str(), &sb) != 0) return Error::from_errno("stat " + path).with_context(ctx);
  if (((sb.st_mode & S_ISUID) != 0 && sb.st_uid != ::geteuid()) ||
      ((sb.st_mode & S_ISGID) != 0 && (sb.st_mode & S_IXGRP) != 0 && sb.st_gid != ::getegid()))
    return Error(Errc::kPtraceDenied,
                 path +
                     " is set-uid/set-gid: under ptrace the kernel runs it without its privileges, so it "
                     "would not behave as it should; run it normally and open it once it is running",
                 EACCES)
        .with_context(ctx);
  bool dyn = REMORA_TRY_CTX(file_is_dynamic(path), ctx);
  if (!dyn)
    return Error(Errc::kStaticBinary, path + " is statically linked: it has no dynamic loader to follow")
        .with_context(ctx);

  // Environment and preloads, built before fork (the child may only make
  // async-signal-safe calls).
  std::vector<std::string> env;
  if (opts.env) {
    env = *opts.env;
  } else {
    for (char** e = environ; e != nullptr && *e != nullptr; ++e)
      if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) env.emplace_back(*e);
  }
  std::string preload;
  if (!opts.preload_dir.empty()) {
    std::string agent = opts.preload_dir + "/libremora-agent.so";
    if (::access(agent.c_str(), R_OK) != 0)
      return Error(Errc::kInvalidArgument, "no readable libremora-agent.so in " + opts.preload_dir, errno)
          .with_context(ctx);
    preload = agent;
  }
  if (!opts.ld_preload.empty()) preload += (preload.empty() ? "" : ":") + opts.ld_preload;
  if (!preload.empty()) {
    auto it = std::find_if(env.begin(), env.end(), [](auto& s) { return s.rfind("LD_PRELOAD=", 0) == 0; });
    if (it != env.end()) {
      std::string old = it->substr(11);
      *it = "LD_PRELOAD=" + preload + (old.empty() ? "" : ":" + old);
    } else {
      env.push_back("LD_PRELOAD=" + preload);
    }
  }
  std::vector<char*> argv_p, env_p;
  for (auto& a : opts.argv) argv_p.push_back(const_cast<char*>(a.c_str()));
  argv_p.push_back(nullptr);
  for (auto& e : env) env_p.push_back(const_cast<char*>(e.c_str()));
  env_p.push_back(nullptr);

  int go[2], err[2];
  if (::pipe2(go, O_CLOEXEC) != 0) return Error::from_errno("pipe").with_context(ctx);
  UniqueFd go_r(go[0]), go_w(go[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) return Error::from_errno("pipe").with_context(ctx);
  UniqueFd err_r(err[0]), err_w(err[1]);

  pid_t child = ::fork();
  if (child < 0) return Error::from_errno("fork").with_context(ctx);
  if (child == 0) {
    // Async-signal-safe only. Wait until the parent has seized us, so the
    // exec is the first thing it sees.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    char c;
    while (::read(go[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::execve(path.c_str(), argv_p.data(), env_p.data());
    int e = errno;
    (void)!::write(err[1], &e, sizeof e);
    ::_exit(127);
  }
  go_r.reset();
  err_w.reset();

  auto impl = std::make_unique<Impl>();
  impl->pid = child;
  impl->launched = true;
  impl->wake = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  impl->threads[child] = Impl::Thread{};
  auto reap = [&]() {
    impl->mem.reset();
    (void)impl->kill_and_reap();
  };
  if (auto s = ptrace::seize(child, child, kOptions); !s) {
    ::kill(child, SIGKILL);
    int st;
    ::waitpid(child, &st, 0);
    return std::move(s).error().with_context(ctx);
  }
  char c = 1;
  (void)!::write(go_w.get(), &c, 1);
  go_w.reset();

  Deadline dl = Deadline::after(opts.timeout);
  // EOF on the error pipe: exec succeeded (the pipe is close-on-exec).
  int exec_errno = 0;
  for (;;) {
    struct pollfd pfd {
      err_r.get(), POLLIN, 0
    };
    int n = ::poll(
        &pfd, 1,
        static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(dl.remaining()).count()));
    if (n == 0) {
      reap();
      return Error(Errc::kTimedOut, "the program did not exec in time").with_context(ctx);
    }
    if (n < 0 && errno == EINTR) continue;
    ssize_t k = ::read(err_r.get(), &exec_errno, sizeof exec_errno);
    if (k < 0 && errno == EINTR) continue;
    break;
  }
  if (exec_errno != 0) {
    reap();
    if (exec_errno == ENOENT)
      return Error(Errc::kIo, "exec " + path + ": " + strerror(exec_errno), ENOENT).with_context(ctx);
    return Error(Errc::kPtraceDenied, "exec " + path + ": " + strerror(exec_errno), exec_errno)
        .with_context(ctx);
  }
  // The exec stop.
  for (;;) {
    auto w = wait_any({child}, dl, -1);
    if (w.kind != WaitResult::Kind::kStatus) {
      reap();
      return Error(Errc::kTimedOut, "no exec stop").with_context(ctx);
    }
    if (WIFSTOPPED(w.status) && (w.status >> 16) == PTRACE_EVENT_EXEC) break;
    if (WIFEXITED(w.status) || WIFSIGNALED(w.status)) {
      impl->threads.clear();
      return Error(Errc::kTargetExited, "the program died before its exec").with_context(ctx);
    }
    (void)ptrace::cont(child,
                       (w.status >> 16) == 0 && WSTOPSIG(w.status) != SIGTRAP ? WSTOPSIG(w.status) : 0);
  }
  impl->threads[child].stopped = true;
  auto r = impl->sync_new_image(dl);
  if (!r) {
    reap();
    return std::move(r).error().with_context(ctx);
  }
  if (*r) {
    std::string how = (*r)->kind == Event::Kind::kExit
                          ? "exited with status " + std::to_string(WEXITSTATUS((*r)->exit_status))
                          : "was killed by signal " + std::to_string((*r)->signal);
    reap();
    return Error(Errc::kTargetExited,
                 "the program " + how + " before its first constructor (a missing library or symbol?)")
        .with_context(ctx);
  }
  if (!impl->dynamic) {
    reap();
    return Error(Errc::kStaticBinary, path + " runs without a dynamic loader").with_context(ctx);
  }
  return std::unique_ptr<Process>(new Process(std::move(impl)));
}

Result<Event> Process::cont(const ContOptions& opts) {
  Impl& p = *impl_;
  const std::string ctx = "continue process " + pid_str(p.pid);
  if (p.closed) return Error(Errc::kInvalidArgument, "the handle is closed").with_context(ctx);
  if (!p.alive) return Error(Errc::kTargetExited, "the process is gone").with_context(ctx);
  for (;;) {
    Raw r = REMORA_TRY_CTX(p.run(opts.deadline, true), ctx);
    if (auto ev = p.terminal_event(r)) {
      if (ev->kind == Event::Kind::kGone) {
        p.threads.clear();
        p.mem.reset();
      }
      return std::move(*ev);
    }
    switch (r.kind) {
      case Raw::Kind::kWake:
      case Raw::Kind::kSigIntr: {
        Event e;
        e.kind = Event::Kind::kIntr;
        return e;
      }
      case Raw::Kind::kTrap: {
        if (r.addr != p.r_brk) continue;
        auto state = p.read_r_state();
        if (!state || *state != kRtConsistent) continue;
        auto now = REMORA_TRY_CTX(p.read_link_map(), ctx);
        Event e;
        e.tid = r.tid;
        for (auto& o : now)
          if (std::find(p.objects.begin(), p.objects.end(), o) == p.objects.end()) e.added.push_back(o);
        for (auto& o : p.objects)
          if (std::find(now.begin(), now.end(), o) == now.end()) e.removed.push_back(o);
        p.objects = std::move(now);
        if (e.added.empty() && e.removed.empty()) continue;
        e.kind = e.added.empty() ? Event::Kind::kDlclose : Event::Kind::kDlopen;
        return e;
      }
      case Raw::Kind::kFork:
      case Raw::Kind::kVfork: return REMORA_TRY_CTX(p.handle_fork(r, opts.want_child), ctx);
      case Raw::Kind::kVforkDone: p.vfork_child_running = false; continue;
      case Raw::Kind::kExec: {
        // The execing thread now has the process id; the others are gone.
        for (auto& [tid, t] : p.threads) {
          if (tid == p.pid) continue;
          int st;
          (void)::waitpid(tid, &st, __WALL | WNOHANG);
        }
        p.threads.clear();
        p.threads[p.pid] = Impl::Thread{true, false, 0};
        p.shares_parent_mm = false;
        p.vfork_child_running = false;
        p.queued.clear();
        // The exec has happened: it is reported once the new program's
        // libraries are known, even past a short deadline (a deadline that
        // cut the loading short would lose the event).
        const Deadline sync_deadline =
            opts.deadline.remaining() > kStopAllTimeout ? opts.deadline : Deadline::after(kStopAllTimeout);
        auto ev = REMORA_TRY_CTX(p.sync_new_image(sync_deadline), ctx);
        if (ev) {
          if (ev->kind == Event::Kind::kGone) p.threads.clear();
          return std::move(*ev);
        }
        Event e;
        e.kind = Event::Kind::kExec;
        e.tid = p.pid;
        e.added = p.objects;
        return e;
      }
      default: continue;
    }
  }
}

Result<void> Process::close(CloseMode mode) {
  Impl& p = *impl_;
  if (p.closed) return ok();
  p.closed = true;
  if (!p.alive || p.threads.empty()) {
    // Reap what is left to reap (a launched child's zombie).
    for (auto& [tid, t] : p.threads) {
      int st;
      (void)::waitpid(tid, &st, __WALL | WNOHANG);
    }
    p.threads.clear();
    return ok();
  }
  if (mode == CloseMode::kDefault) mode = p.launched ? CloseMode::kKill : CloseMode::kResume;
  p.remove_bps(true);
  switch (mode) {
    case CloseMode::kResume: p.detach_all(); return ok();
    case CloseMode::kSuspend: return p.suspend();
    case CloseMode::kKill:
    case CloseMode::kDefault: return p.kill_and_reap();
  }
  return ok();
}

Result<void> Process::read(RemoteAddr addr, std::span<std::byte> out) const {
  if (!impl_->mem || impl_->closed) return Error(Errc::kTargetExited, "the process is gone or closed");
  return impl_->mem->read(addr.addr(), out);
}

Result<void> Process::write(RemoteAddr addr, std::span<const std::byte> in) {
  if (!impl_->mem || impl_->closed) return Error(Errc::kTargetExited, "the process is gone or closed");
  return impl_->mem->write(addr.addr(), in);
}

Result<RemoteAddr> Process::find_symbol(std::string_view library, std::string_view symbol) {
  if (!impl_->mem || impl_->closed) return Error(Errc::kTargetExited, "the process is gone or closed");
  auto sym = REMORA_TRY(remote::resolve_symbol(impl_->pid, *impl_->mem, library, symbol, impl_->at_phdr, {}));
  return RemoteAddr(sym.address);
}

Result<uint64_t> Process::call(RemoteAddr fn, std::span<const uint64_t> args, pid_t tid,
                               std::chrono::milliseconds timeout) {
  Impl& p = *impl_;
  if (!p.mem || p.closed || !p.alive) return Error(Errc::kTargetExited, "the process is gone or closed");
  if (args.size() > 6) return Error(Errc::kInvalidArgument, "at most six arguments");
  if (tid == 0 && !p.threads.empty()) tid = p.threads.begin()->first;
  auto it = p.threads.find(tid);
  if (it == p.threads.end() || !it->second.stopped)
    return Error(Errc::kInvalidArgument,
                 "thread " + pid_str(tid) + " is not a stopped thread of the process");
  if (p.at_entry == 0) return Error(Errc::kNotSupported, "no entry point to return to");
  // Save everything the call changes.
  auto saved = REMORA_TRY(ptrace::get_regs(tid));
  auto xstate = REMORA_TRY(ptrace::get_xstate(tid));
  auto mask = REMORA_TRY(ptrace::get_sigmask(tid));
  std::byte orig{};
  REMORA_TRY(p.mem->read(p.at_entry, std::span(&orig, 1)));
  const std::byte cc{0xCC};
  REMORA_TRY(p.mem->write(p.at_entry, std::span(&cc, 1)));
  auto restore = [&]() {
    (void)p.mem->write(p.at_entry, std::span(&orig, 1));
    (void)ptrace::set_xstate(tid, xstate);
    (void)ptrace::set_sigmask(tid, mask);
    (void)ptrace::set_regs(tid, saved);
  };
  auto regs = saved;
  uint64_t sp = ((saved.rsp - 256) & ~uint64_t{15}) - 8;  // below the red zone; aligned at the call
  uint64_t ret = p.at_entry;
  if (auto w = p.mem->write(sp, std::as_bytes(std::span(&ret, 1))); !w) {
    restore();
    return std::move(w).error();
  }
  uint64_t* slots[] = {&regs.rdi, &regs.rsi, &regs.rdx, &regs.rcx, &regs.r8, &regs.r9};
  for (size_t i = 0; i < args.size(); ++i) *slots[i] = args[i];
  regs.rsp = sp;
  regs.rip = fn.addr();
  regs.rax = 0;
  regs.orig_rax = static_cast<uint64_t>(-1);  // no syscall restart into our call
  (void)ptrace::set_sigmask(tid, ~uint64_t{0});
  (void)ptrace::set_regs(tid, regs);
  if (auto c = ptrace::cont(tid, 0); !c) {
    restore();
    return std::move(c).error();
  }
  it->second.stopped = false;
  Deadline dl = Deadline::after(timeout);
  for (;;) {
    auto w = wait_any({tid}, dl, -1);
    if (w.kind == WaitResult::Kind::kTimeout) {
      (void)ptrace::interrupt(tid);
      auto w2 = wait_any({tid}, Deadline::after(kStopAllTimeout), -1);
      if (w2.kind == WaitResult::Kind::kStatus && WIFSTOPPED(w2.status)) {
        p.threads[tid].stopped = true;
        restore();
      }
      return Error(Errc::kTimedOut, "the remote call did not return in time; the thread was restored");
    }
    if (w.kind != WaitResult::Kind::kStatus) continue;
    int st = w.status;
    if (WIFEXITED(st) || WIFSIGNALED(st)) {
      p.threads.erase(tid);
      if (tid == p.pid) p.alive = false;
      return Error(Errc::kTargetExited, "the process died during the remote call");
    }
    p.threads[tid].stopped = true;
    int sig = WSTOPSIG(st), ev = st >> 16;
    if (ev == 0 && sig == SIGTRAP) {
      auto r = ptrace::get_regs(tid);
      if (r && r->rip - 1 == p.at_entry) {
        uint64_t value = r->rax;
        restore();
        return value;
      }
    }
    if (ev == 0 && (sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP)) {
      restore();
      return Error(Errc::kFault, "the called function faulted with signal " + std::to_string(sig));
    }
    if (ev == 0) p.threads[tid].pending_sig = sig;  // kept for later
    if (ev == PTRACE_EVENT_CLONE) {
      auto ntid = static_cast<pid_t>(event_msg(tid));
      if (ntid > 0) p.threads[ntid] = Impl::Thread{false, true, 0};
    }
    (void)ptrace::cont(tid, 0);
    p.threads[tid].stopped = false;
  }
}

}  // namespace remora::control
