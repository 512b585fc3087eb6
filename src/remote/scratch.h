// The scratch mapping's ownership marker, and the decision whether a scratch
// mapping left in a target by another controller may be removed. Pure
// functions over bytes and parsed /proc data, tested from tables
// (scratch_test.cc); remote/scratch_reclaim.cc gathers the facts from the
// live process and removes what these functions allow.
//
// Why: a controller killed mid-call leaves its 64 KiB scratch behind (its
// thread restores itself through the frame, but nobody is left to munmap).
// The next controller that opens the process removes such mappings, but
// only those it can prove are Remora's (the header below, not a mapping name
// the kernel may not support), whose owner is gone (no such pid, or the pid
// now names another process: its start time differs), and in which no
// thread can still be running: not in a call (the busy word), no thread's
// pc inside, no word of a thread's live stack pointing at its code (a
// return address into a stub, a pthread start routine that is the loader
// trampoline). When unsure, it keeps the mapping: leaking 64 KiB is better
// than unmapping code under a thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "procfs/procfs.h"

namespace remora::remote {

inline constexpr uint64_t kPage = 4096;
// Layout of our own scratch mapping. Page 0 (R-X) holds the header, the
// mapping's name and the stubs; the rest (RW) starts with the echo slot (a
// marked call's stub writes its result and cookie there: its r12), then
// data for byte arguments and session memory.
//
// It is mapped R-X whole, the header and stubs are written (through
// /proc/PID/mem, as a debugger writes code), then pages 1-15 are made RW:
// from the first write on, it is recognisable whatever step a controller
// dies at, and no page is ever made executable by mprotect (which
// W^X policies such as systemd's MemoryDenyWriteExecute refuse).
inline constexpr uint64_t kScratchSize = 16 * kPage;
inline constexpr uint64_t kScratchNameOffset = 128;
inline constexpr uint64_t kScratchStub = 256;
inline constexpr uint64_t kScratchEcho = kPage;
// The setup status word, after the echo slot: 0 in the fresh mapping, the
// mapping's base once the setup routine has made the data pages writable
// (arch's Stub::kSetupStatus). Tells the routine's own failure from that of
// the call it went on to (Target::call_prepared).
inline constexpr uint64_t kScratchSetupStatus = kPage + 16;
inline constexpr uint64_t kScratchData = kPage + 64;

// "RMRSCRT" and a NUL, little-endian: the first eight bytes of a scratch.
inline constexpr uint64_t kScratchMagic = 0x0054524353524d52ull;
inline constexpr uint32_t kScratchVersion = 1;

// The header at the start of the scratch mapping. Written whole by the
// controller right after the mmap (before anything else), then only its
// call words change. Field offsets are fixed by the version.
struct ScratchHeader {
  uint64_t magic = kScratchMagic;
  uint32_t version = kScratchVersion;
  uint32_t header_size = sizeof(ScratchHeader);
  uint64_t base = 0;  // the mapping's own address: a copy elsewhere is no scratch
  uint64_t size = kScratchSize;
  // The owning controller: its pid as it sees itself, the start time of that
  // process (/proc/PID/stat field 22, clock ticks since boot: a reused pid has
  // another), and its pid namespace (st_dev, st_ino of /proc/self/ns/pid: a
  // controller in another namespace cannot look the pid up).
  int32_t owner_pid = 0;
  uint32_t reserved0 = 0;
  uint64_t owner_start_time = 0;
  uint64_t owner_pidns_dev = 0;
  uint64_t owner_pidns_ino = 0;
  // The busy word: the cookie of the function call in flight, set by the
  // controller before the thread runs it. The marked-call stub writes the
  // function's result and the same cookie into the echo slot (kScratchEcho)
  // when the function returns, so a call is over, whoever is left, once the
  // echo's cookie equals call_cookie. An unmarked call's stub writes
  // nothing: its controller writes the echo itself, and one killed mid-call
  // leaves the mapping busy for good (kept).
  uint64_t call_cookie = 0;
  // The thread of that call and the stub's stack pointer for it (the stub's
  // `call` pushes its return address just below): once that thread's stack
  // pointer is above it on the same stack, or the thread is gone, the call
  // is over even if nobody echoed the cookie (an unmarked call whose
  // controller died, or a call interrupted by another controller's).
  int32_t call_tid = 0;
  uint32_t reserved1 = 0;
  uint64_t call_sp = 0;
};
static_assert(sizeof(ScratchHeader) <= kScratchNameOffset);
inline constexpr uint64_t kScratchCookieOffset = offsetof(ScratchHeader, call_cookie);
// The engine writes cookie, tid and call_sp as three 64-bit words.
static_assert(offsetof(ScratchHeader, call_tid) == kScratchCookieOffset + 8 &&
              offsetof(ScratchHeader, call_sp) == kScratchCookieOffset + 16);

// Who a controller is, for the header and for judging another's.
struct OwnerIdentity {
  pid_t pid = 0;
  uint64_t start_time = 0;
  uint64_t pidns_dev = 0, pidns_ino = 0;
};

// The header's bytes if `bytes` (read from address `base`) start with a
// valid one of this version for a mapping at `base` of kScratchSize.
std::optional<ScratchHeader> parse_scratch_header(std::span<const std::byte> bytes, uint64_t base);
// A call is in flight: its cookie was set and the stub has not echoed it
// (`echo_cookie`: the second word of the echo slot).
bool scratch_busy(const ScratchHeader& h, uint64_t echo_cookie);

// Addresses where a scratch may start: a page of a private anonymous R-X
// mapping from which kScratchSize bytes are all private and anonymous.
// Every page of an R-X mapping up to kMaxScanPages long is one (the kernel
// merges a new mapping with a neighbour of the same protection, so a
// scratch's page 0 may sit inside a longer VMA); of a longer one (a JIT's
// code) only its first page. The header then decides.
inline constexpr uint64_t kMaxScanPages = 1024;
std::vector<uint64_t> scratch_candidates(std::span<const procfs::MapEntry> maps);

enum class OwnerState {
  kAlive,    // that pid runs, with the recorded start time
  kGone,     // no process with that pid
  kReused,   // the pid names another process now (another start time)
  kUnknown,  // another pid namespace, or unreadable: cannot tell
};
// `self` is the judging controller; `live_start_time` the start time of the
// process now at the header's owner pid in self's namespace (nullopt: no such
// process), `lookup_failed` when that could not be read for another reason.
OwnerState owner_state(const ScratchHeader& h, const OwnerIdentity& self,
                       std::optional<uint64_t> live_start_time, bool lookup_failed);

// What the judging controller knows of one candidate.
struct ScratchFacts {
  OwnerState owner = OwnerState::kUnknown;
  bool busy = false;           // scratch_busy
  bool threads_known = false;  // every thread's pc and live stack were examined
  bool thread_inside = false;  // a pc inside, or a live stack word into its code
};
enum class ScratchVerdict {
  kReclaim,
  kKeepOwnerAlive,
  kKeepOwnerUnknown,
  kKeepBusy,
  kKeepThreadsUnknown,
  kKeepThreadInside,
};
ScratchVerdict decide_scratch(const ScratchFacts& f);
std::string_view verdict_name(ScratchVerdict v);

// Whether any 8-byte word of `stack` lies in [lo, hi).
bool words_point_into(std::span<const std::byte> stack, uint64_t lo, uint64_t hi);

// Where to ask for a new scratch mapping (an mmap address hint, never
// MAP_FIXED): right below the lowest mapping above the largest free range
// under the main thread's [stack], with at least kScratchRoom free below
// it. There the kernel's own top-down placement goes once the small holes
// are used up, and the attach layer's loader stack (1 MiB, asked for right
// below the scratch) then lands next to it, so that one munmap removes both.
// Without a hint the kernel fills the smallest holes first: the one that
// ld.so's unmapped cache file leaves among the libraries took the scratch in
// 9 attaches of 10, with a library right below it. 0 (no hint) when the maps
// show no [stack] or no such range.
inline constexpr uint64_t kScratchRoom = 4 * 1024 * 1024;
uint64_t scratch_address_hint(std::span<const procfs::MapEntry> maps);

// One thread of the target as the survey saw it.
struct ThreadSnapshot {
  pid_t tid = 0;
  uint64_t pc = 0, sp = 0;
  uint64_t stack_lo = 0, stack_hi = 0;  // the mapping that holds sp
  std::vector<std::byte> stack;         // its live part: [sp & ~7, stack_hi)
};
// Whether a thread's pc is inside the scratch at `base`, or a word of its
// live stack points into the scratch's code page.
bool thread_inside(std::span<const ThreadSnapshot> threads, uint64_t base);
// Whether the call the header names may still run (the busy word, resolved
// with the survey: see ScratchHeader::call_sp). `echo_cookie` as for
// scratch_busy.
bool call_in_flight(const ScratchHeader& h, uint64_t echo_cookie, std::span<const ThreadSnapshot> threads,
                    uint64_t base);

// Ranges to munmap for `bases` (each a kScratchSize mapping): sorted, with
// adjacent ones joined, so that N dead scratches side by side (mmap places
// them so) cost one remote system call.
struct Range {
  uint64_t start = 0, end = 0;
};
std::vector<Range> coalesce_scratch(std::vector<uint64_t> bases);

}  // namespace remora::remote
