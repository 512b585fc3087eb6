// remote::Target's session state, shared by the engine's files: target.cc
// (opening, symbols, the scratch, choosing threads and markers) and
// transaction.cc (one call on one thread). Internal to the remote layer.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "arch/host.h"
#include "base/deadline.h"
#include "base/result.h"
#include "base/unique_fd.h"
#include "procfs/procfs.h"
#include "remote/lookup.h"
#include "remote/memory.h"
#include "remote/scratch.h"
#include "remote/seccomp.h"
#include "remote/stack_room.h"
#include "remote/target.h"

namespace remora::remote {

// The scratch's layout (header, stubs, data): remote/scratch.h.
// The last quarter of the data area serves scratch_alloc (session memory);
// the rest holds the byte arguments of one call.
constexpr uint64_t session_area(uint64_t data_size) { return (data_size / 4) & ~uint64_t{15}; }
// Byte arguments up to this total travel on the called thread's stack.
inline constexpr uint64_t kStackArgsMax = 16 * 1024;
// The request of the transaction that creates the scratch: a call of the
// scratch's own setup routine, whose address only exists once it is mapped.
inline constexpr uint64_t kSetupRequest = ~uint64_t{0};

// "process 4242", or "process 4242 (pid 7 in its own pid namespace)" when the
// target lives in another pid namespace: users give the pid they see, the
// target knows itself by the other.
std::string process_str(pid_t pid, pid_t ns_pid);

// The header of a scratch mapping this controller creates at `base`
// (remote/scratch.h; scratch_reclaim.cc).
ScratchHeader own_header(uint64_t base);

// The two libc code addresses used before the scratch mapping exists.
struct Gadgets {
  uint64_t syscall_insn = 0;  // the `syscall` inside glibc's syscall(): followed by cmp; jae; ret
  uint64_t restore_rt = 0;    // glibc's __restore_rt: mov $15,%rax; syscall
};

struct Target::Impl {
  using Clock = std::chrono::steady_clock;

  pid_t pid = 0;
  pid_t ns_pid = 0;
  Memory mem;
  UniqueFd pidfd;
  uint64_t at_phdr = 0;
  bool is_static = false;
  std::optional<uint64_t> scratch;  // address of the stub code
  uint64_t scratch_base = 0;        // our own mapping's start (its header), while scratch_owned
  uint64_t data_base = 0, data_size = 0;
  bool scratch_owned = false;       // our own mapping (munmap at close), or adopted
  std::optional<uint64_t> retired;  // our own mapping's start, replaced by adopted stubs, not yet removed
  std::optional<Gadgets> gadgets;
  pid_t preferred_tid = 0;  // the last thread that worked well
  // CallOptions::running_grace of the call in progress (under `mu`).
  std::chrono::milliseconds running_grace{0};
  // Run system calls through libc's gadgets even when the scratch exists:
  // munmap of the scratch itself must not return into the page it removes.
  bool force_gadget = false;
  // A system call through libc's gadgets that must not create the scratch
  // (removing dead controllers' scratch at open: see scratch_reclaim.cc).
  bool gadget_only = false;
  uint64_t session_used = 0;  // bytes handed out by scratch_alloc
  uint64_t scratch_hint = 0;  // where the next scratch is asked for (scratch_address_hint), 0: anywhere
  // Marked calls (see choose_marker): the process's signal dispositions, as
  // last read, and a counter for the cookies that prove a call returned.
  uint64_t sig_ign = 0, sig_cgt = 0;
  int seccomp = 0;
  Clock::time_point dispositions_read{};
  uint64_t call_seq = 0;
  LookupOptions lookup_options;
  seccomp::Guard seccomp_guard;  // strict threads refused, filters checked (remote/seccomp.h)
  // Resolved (library, symbol) pairs of this session. A hit is re-validated
  // against the current maps (the code must still be mapped from the same
  // file), so a dlclose/dlopen in between can never send a call astray.
  struct CachedSymbol {
    uint64_t address, dev, inode;
  };
  std::map<std::pair<std::string, std::string>, CachedSymbol> symbols;
  ImageMemo images;  // cleared whenever a mapping it names has changed
  // The maps as last read, for the lookups that follow until this
  // controller next runs anything in the target (every transaction forgets
  // them: a call may map or unmap) or kMapsMemoAge passes. One attach looks
  // libraries up in several steps before its first call; each re-read of
  // /proc/PID/maps cost 30-80 us, and a large process's (a JVM's thousands
  // of mappings) far more.
  static constexpr std::chrono::milliseconds kMapsMemoAge{5};
  std::optional<std::vector<procfs::MapEntry>> maps_memo;
  Clock::time_point maps_memo_at{};
  void remember_maps(const std::vector<procfs::MapEntry>& maps) {
    maps_memo = maps;
    maps_memo_at = Clock::now();
  }
  void forget_maps() { maps_memo.reset(); }
  // The frame check of a call (Transaction::place_frame): stack ranges
  // judged safe before, and the maps memo that transact() hands the call
  // when a lookup just read them (none: the check reads them if it must).
  StackRanges safe_stacks;
  std::optional<std::vector<procfs::MapEntry>> call_maps;
  // The end of the byte arguments Target::call copied into the scratch's
  // data area for the call in flight (0: none): the scratch's own stack
  // stays above it.
  uint64_t data_args_end = 0;
  bool stack_refused = false;  // the last place_frame refused the thread's stack, changing nothing
  // Recursive: Target::call_prepared's `prepare` writes the new scratch
  // through Target's own methods while its transaction holds the lock.
  std::recursive_mutex mu;

  explicit Impl(Memory m) : mem(std::move(m)) {}

  Result<Gadgets> find_gadgets();
  Result<pid_t> pick_thread();
  Result<std::vector<procfs::MapEntry>> maps_for_lookup();
  // `lib`: `library` already found in `maps` (find_symbols' series), or null.
  Result<RemoteAddr> lookup(std::string_view library, std::string_view symbol, bool function,
                            std::vector<procfs::MapEntry>& maps, const MappedLibrary* lib = nullptr);
  int choose_marker(uint64_t blocked);
  Result<void> ensure_scratch(pid_t tid, std::chrono::milliseconds timeout);
  // Removes the scratch mappings of controllers that are gone (see
  // remote/scratch.h); returns how many. Never removes one it is unsure of.
  Result<int> reclaim_dead_scratch(const std::vector<procfs::MapEntry>& maps);
  Result<uint64_t> gadget_syscall(long nr, std::array<uint64_t, 6> args, std::chrono::milliseconds timeout);
  Result<std::pair<uint64_t, uint64_t>> thread_position(pid_t tid);  // pc, sp
  Result<std::vector<ThreadSnapshot>> survey_threads();

  // Where the stubs are for the next step: the scratch's, or libc's gadgets
  // before it exists (and for a system call while force_gadget holds).
  arch::host::StubSite stub_site(bool for_syscall) const {
    arch::host::StubSite s;
    if (scratch && !(for_syscall && force_gadget)) s.stub = scratch;
    if (gadgets) s.syscall_gadget = gadgets->syscall_insn, s.restore_rt_gadget = gadgets->restore_rt;
    return s;
  }
  // A scratch mapping of our own, just created at `base`, is the session's.
  void adopt_own_scratch(uint64_t base) {
    scratch = base + kScratchStub;
    scratch_base = base;
    data_base = base + kScratchData;
    data_size = kScratchSize - kScratchData;
    scratch_owned = true;
    session_used = 0;
  }

  // A byte argument that travels on the called thread's stack, written
  // with the restore frame; its address goes into argument register `reg`.
  struct StackArg {
    size_t reg;
    std::span<const std::byte> bytes;
  };
  // `then` (with the setup request only): the call the new scratch's setup
  // routine goes on to (Target::call_prepared; Transaction::prepare_next).
  Result<CallReport> transact(pid_t tid, bool is_syscall, uint64_t fn_or_nr, std::array<uint64_t, 6> args,
                              const Deadline& deadline, std::span<const StackArg> on_stack = {},
                              const Target::Prepare* then = nullptr);
  Result<CallReport> run(pid_t tid, bool is_syscall, uint64_t fn_or_nr, std::array<uint64_t, 6> args,
                         std::chrono::milliseconds timeout, std::span<const StackArg> on_stack = {},
                         const Target::Prepare* then = nullptr);
};

}  // namespace remora::remote
