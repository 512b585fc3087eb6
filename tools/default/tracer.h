// Call tracing by GOT patching.
//
// For every loaded object (dl_iterate_phdr) except the tool itself, its
// dependencies that must not be traced (libunwind, liblzma), the agent, the
// dynamic loader, libc and the vDSO, the tracer walks the PLT relocations
// (DT_JMPREL: JUMP_SLOT) and the other RELA relocations (DT_RELA:
// GLOB_DAT; arch/relocs.h names them per architecture) with the dynamic
// symbol table, and points each slot of a traced function at its wrapper
// with an atomic 8-byte exchange.
// Slots in RELRO pages are made writable for the store and put back to
// their previous protection (read from /proc/self/maps) right after.
//
// Patching and restoring run inside the dl_iterate_phdr callback, which holds
// the loader's lock: no object can be unloaded while its slots are written.
//
// A slot lazy binding has not resolved yet may be in the middle of its
// resolution when it is patched: the resolver (_dl_fixup) then stores the
// real function over the wrapper a moment later. heal() points such slots
// at the wrapper again, on the collector's ticks for a while after a patch
// (a resolution takes microseconds; seconds on an emulated CPU).
//
// Threads: patch() and restore() are called from one thread at a time (the
// listener, or the tool's collector thread for objects loaded later).
#ifndef REMORA_TOOLS_DEFAULT_TRACER_H_
#define REMORA_TOOLS_DEFAULT_TRACER_H_

#include <stdint.h>

#include <string>
#include <vector>

namespace remora_tool {

struct PatchedSlot {
  void** slot;
  void* original;  // the slot's value before patching (may be a lazy-binding PLT stub)
  void* wrapper;
  uint32_t fn;
  uintptr_t object_base;
  std::string object;
};

class Tracer {
 public:
  // Resolves the functions to trace; `names` are reported names (read, ...).
  // Unknown or unresolvable names are appended to `warnings`.
  void configure(const std::vector<std::string>& names, std::vector<std::string>* warnings);
  // Patches every loaded object not patched yet. Returns the number of new slots.
  int patch(std::vector<std::string>* warnings);
  // True when objects were loaded or unloaded since the last patch().
  bool objects_changed() const;
  // Re-patches the slots a lazy resolution in flight at patch() overwrote
  // with the real function; does nothing once kHealNs have passed since the
  // last patch() (`now_ns`: CLOCK_MONOTONIC). Returns the slots re-patched.
  int heal(uint64_t now_ns);
  static constexpr uint64_t kHealNs = 5000000000ull;
  // Puts every original back (compare-and-swap: a slot someone else changed
  // since is left alone and reported). Returns the number of slots restored.
  int restore(std::vector<std::string>* warnings);

  const std::vector<PatchedSlot>& slots() const { return slots_; }
  // The slots of the last session, kept after restore() for tests.
  const std::vector<PatchedSlot>& last_slots() const { return last_slots_; }
  bool enabled(uint32_t fn) const { return fn < enabled_.size() && enabled_[fn]; }

 private:
  friend struct TracerAccess;
  std::vector<bool> enabled_;
  std::vector<PatchedSlot> slots_;
  std::vector<PatchedSlot> last_slots_;
  std::vector<std::pair<uintptr_t, std::string>> patched_objects_;
  unsigned long long adds_seen_ = 0, subs_seen_ = 0;
  bool heal_pending_ = false;  // patch() patched a slot that was not resolved yet
  uint64_t heal_until_ns_ = 0;
};

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_TRACER_H_
