// The collector's unwinder: turns a captured sample (registers and a stack
// copy, slots.h SampleRec) into PCs, with libunwind's remote API over an
// address space of our own accessors, so that it reads nothing it has not
// validated:
//   - a stack word comes from the copy when it lies inside it;
//   - any other address (eh_frame_hdr, eh_frame, code bytes for the signal
//     -frame check) only from a readable, file-backed mapping (or the vDSO)
//     of the last /proc/self/maps snapshot, read with own_memory_read, which
//     returns an error where the mapping went away instead of faulting;
//   - registers from the capture.
// Unwind tables are found by libunwind's local lookup (dl_iterate_phdr over
// the loaded objects, under the loader's lock), its reads going through the
// accessors above.
//
// Threads: the collector only (or detach, on the listener, with the
// collector stopped); not thread-safe.
#ifndef REMORA_TOOLS_DEFAULT_UNWIND_H_
#define REMORA_TOOLS_DEFAULT_UNWIND_H_

#include <stdint.h>

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "slots.h"

namespace remora_tool {

struct Mapping {
  uint64_t start = 0, end = 0;
  bool read = false, write = false, exec = false, shared = false;
  bool file = false;   // backed by a file (a path and an inode)
  bool stack = false;  // "[stack]", the main thread's
  bool vdso = false;   // "[vdso]": readable, never unmapped
};

// Parses the text of /proc/PID/maps; lines that do not parse are skipped.
// Sorted by start, as the kernel writes them.
std::vector<Mapping> parse_maps(std::string_view text);

class MapsSnapshot {
 public:
  // Reads /proc/self/maps again. False when it could not be read (the old
  // snapshot stays). version() changes when the mappings did.
  bool refresh();
  uint64_t version() const { return version_; }
  void assign(std::vector<Mapping> maps) {
    maps_ = std::move(maps);
    text_.clear();
    ++version_;
  }
  const Mapping* find(uint64_t addr) const;
  // [addr, addr + len) lies inside one readable, file-backed (or vDSO)
  // mapping.
  bool readable_image(uint64_t addr, uint64_t len) const;
  bool executable(uint64_t addr) const;
  // Where a thread whose sp is `sp` can have its stack copied: the private,
  // writable, anonymous mapping holding sp (or [stack]). False otherwise.
  bool stack_bounds(uint64_t sp, uint64_t* lo, uint64_t* hi) const;
  // The mapping "[stack]" (the main thread's stack).
  const Mapping* main_stack() const;
  size_t size() const { return maps_.size(); }

 private:
  std::vector<Mapping> maps_;
  std::string text_;  // as read, to tell whether anything changed
  uint64_t version_ = 0;
};

class Unwinder {
 public:
  Unwinder();
  ~Unwinder();
  Unwinder(const Unwinder&) = delete;
  Unwinder& operator=(const Unwinder&) = delete;

  // Forgets cached unwind information (objects may have been unloaded).
  void flush();
  // Writes the PCs of `rec` into pcs[0..max): pcs[0] the interrupted PC, the
  // others return addresses. Stops at an error, a PC outside any executable
  // mapping of `maps`, or an sp that does not increase; keeps the frames
  // found so far. Returns their number (>= 1).
  uint32_t unwind(const SampleRec& rec, const MapsSnapshot& maps, uint64_t* pcs, uint32_t max);

  // For tests and the summary: frames found with CFI, with the frame-pointer
  // fallback.
  uint64_t cfi_steps() const { return cfi_steps_; }
  uint64_t fp_steps() const { return fp_steps_; }

 private:
  bool has_cfi(uint64_t ip, void* ctx);

 public:
  // Pages of images read through own_memory_read, kept until the next
  // flush(): an unwind makes hundreds of small reads of .eh_frame_hdr and
  // .eh_frame, a system call each without it. (Public for unwind.cc's
  // accessors.)
  struct PageCache {
    static constexpr uint32_t kPages = 128;
    uint64_t page[kPages];  // address, ~0 when empty
    uint32_t len[kPages];   // bytes read
    unsigned char data[kPages][4096];
  };

 private:
  void* as_ = nullptr;  // unw_addr_space_t
  std::unique_ptr<PageCache> pages_;
  std::unordered_map<uint64_t, bool> cfi_;  // has_cfi by PC, until flush()
  uint64_t cfi_steps_ = 0, fp_steps_ = 0;
};

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_UNWIND_H_
