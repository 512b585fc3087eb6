// ELF images, from a file or from another process's memory.
//
// Remora reads ELF with its own reader rather than elfutils' libelf: it must
// parse *partial* images straight out of a target's memory (only the bytes
// that PT_LOAD mapped, no section headers, reached through a read callback),
// treat every byte as untrusted (bounds-checked everywhere), and stay cheap to
// cache per (device, inode, build id). libelf's elf_memory() wants one
// contiguous, complete image and offers nothing for the PT_DYNAMIC-only route,
// so the reader would be half ours anyway. Only ELF64 little-endian images
// (x86_64, aarch64) are accepted.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/result.h"

namespace remora::elf {

struct LoadSegment {
  uint64_t vaddr = 0, memsz = 0;
  uint64_t offset = 0, filesz = 0;
  uint64_t align = 0;
  uint32_t flags = 0;  // PF_R | PF_W | PF_X
};

struct Symbol {
  std::string name;
  uint64_t value = 0;  // st_value: unbiased (add the load bias for a runtime address)
  uint64_t size = 0;
  unsigned char type = 0;  // STT_FUNC, STT_OBJECT, STT_GNU_IFUNC, ...
  unsigned char bind = 0;  // STB_GLOBAL, STB_WEAK, STB_LOCAL
  uint16_t shndx = 0;
};

// Reads `out.size()` bytes at virtual address `addr` of a running image.
using ReadFn = std::function<Result<void>(uint64_t addr, std::span<std::byte> out)>;

// A parsed, immutable ELF image. Thread-safe to share after construction.
class ElfImage {
 public:
  // Parses a complete file image (the whole file's bytes), for example read
  // from an fd. Section headers are used when present (.dynsym, .symtab);
  // otherwise the PT_DYNAMIC route (DT_SYMTAB/DT_STRTAB/DT_GNU_HASH/DT_HASH).
  static Result<std::shared_ptr<const ElfImage>> from_file_bytes(std::vector<std::byte> bytes);
  // Reads and parses the file behind `fd` (whole file; fd stays open and owned by the caller).
  static Result<std::shared_ptr<const ElfImage>> from_fd(int fd);
  // As from_fd, but parses only the ELF and program headers and the notes
  // (type, entry, segments, PT_INTERP, Build ID): no symbol tables. For
  // questions about a program file before it runs ("does it ask for a
  // dynamic loader?"), cheap even for a binary with a huge .symtab.
  static Result<std::shared_ptr<const ElfImage>> headers_from_fd(int fd);
  // Parses an image mapped at `base` (the address of its ELF header, i.e. the
  // start of the mapping with file offset 0) in another process, through
  // `read`. Only program headers and what PT_DYNAMIC points at are used; the
  // dynamic entries hold runtime (biased) addresses in a loaded image, which
  // the reader accounts for.
  static Result<std::shared_ptr<const ElfImage>> from_memory(uint64_t base, const ReadFn& read);
  // As from_memory, but reads only the ELF and program headers and the notes
  // (type, segments, Build ID): a few small reads, no symbol tables. Used to
  // identify a mapped image cheaply before its file is parsed or found cached.
  static Result<std::shared_ptr<const ElfImage>> headers_from_memory(uint64_t base, const ReadFn& read);

  uint16_t type() const { return type_; }        // ET_DYN, ET_EXEC
  uint16_t machine() const { return machine_; }  // EM_X86_64, EM_AARCH64
  uint64_t entry() const { return entry_; }
  bool has_interp() const { return has_interp_; }
  bool has_dynamic() const { return has_dynamic_; }
  const std::vector<LoadSegment>& load_segments() const { return loads_; }
  // GNU Build ID (NT_GNU_BUILD_ID in a PT_NOTE or .note.gnu.build-id); empty if none.
  const std::vector<std::byte>& build_id() const { return build_id_; }
  std::string build_id_hex() const;
  // Whether this file's Build ID note is where this file has it in an image
  // another process mapped at load bias `bias` (read through `read`): one
  // read of a few dozen bytes, where headers_from_memory makes three and a
  // parse. False when unknown: no Build ID, or one found only in a section
  // (then compare headers_from_memory's).
  bool build_id_mapped_at(uint64_t bias, const ReadFn& read) const;
  const std::string& soname() const { return soname_; }               // DT_SONAME, or empty
  const std::vector<std::string>& needed() const { return needed_; }  // DT_NEEDED, in order

  // Looks a defined symbol up by name: GNU hash, else SysV hash, else a linear
  // scan of .dynsym; then .symtab when present. Undefined symbols (shndx 0)
  // are never returned. A versioned default ("name@@VER") matches "name".
  // The first lookup that reaches .symtab builds its index (once; safe when
  // several threads look up at the same time); .dynsym hits never do.
  std::optional<Symbol> find_symbol(std::string_view name) const;

  // How many bytes of this image's tables (dynamic symbols, their names and
  // versions, the GNU hash) are viewed in place in a library this process has loaded for
  // good, the same build of libc or of the dynamic loader with the same
  // bytes, rather than copied: see "Resident tables" in the .cc. Lookups
  // answer the same either way.
  uint64_t borrowed_table_bytes() const;

  // All defined function symbols (dynsym and symtab, deduplicated by address).
  std::vector<Symbol> function_symbols() const;

  // The load bias given where one mapping of the file landed: `map_start` is
  // the mapping's start address and `map_offset` its file offset. The mapping
  // must correspond to a PT_LOAD (its offset equals that segment's
  // offset rounded down to the page size). Errc::kParse otherwise, and also
  // when that file page starts two PT_LOADs with different biases (the page
  // shared by the end of one segment and the RELRO start of the next), since
  // the mapping alone cannot say which one it is: pass the offset-0 mapping.
  Result<uint64_t> bias_for_mapping(uint64_t map_start, uint64_t map_offset, uint64_t page_size = 4096) const;

  // The PT_LOAD segment containing unbiased virtual address `vaddr`, if any.
  const LoadSegment* segment_for(uint64_t vaddr) const;

 private:
  friend class ElfParser;
  ElfImage() = default;

  uint16_t type_ = 0, machine_ = 0;
  uint64_t entry_ = 0;
  bool has_interp_ = false, has_dynamic_ = false;
  std::vector<LoadSegment> loads_;
  std::vector<std::byte> build_id_;
  std::optional<uint64_t> build_id_note_vaddr_;  // its note's header, from a PT_NOTE of the file
  std::string soname_;
  std::vector<std::string> needed_;
  // One symbol-table entry as the file stores it (Elf64_Sym's layout, checked
  // in the .cc), so that a table is copied out in one piece and no Symbol,
  // with its heap name, is built until a caller asks for it.
  struct RawSymbol {
    uint32_t name = 0;  // offset into the table's strings, checked at parse time
    unsigned char info = 0, other = 0;
    uint16_t shndx = 0;
    uint64_t value = 0, size = 0;
    unsigned char type() const { return info & 0xf; }  // ELF64_ST_TYPE
    unsigned char bind() const { return info >> 4; }   // ELF64_ST_BIND
    bool defined() const { return shndx != 0; }        // SHN_UNDEF is 0
  };
  // An array of a table the image either owns (copied out of the file or
  // the target's memory: from_fd unmaps the file after parsing, and a
  // target's memory is gone once read) or borrows from memory that outlives
  // every image: the same bytes of a library this very process has loaded
  // and can never unload (libc, the dynamic loader; see elf_image.cc,
  // "Resident tables"). Read-only either way; move-only, so that a view of
  // owned storage never outlives it.
  template <typename T>
  class Table {
   public:
    Table() = default;
    explicit Table(std::vector<T> owned) : owned_(std::move(owned)), view_(owned_) {}
    static Table borrowed(std::span<const T> view) {
      Table t;
      t.view_ = view;
      return t;
    }
    // A vector's move keeps its buffer, so the view stays valid in the copy.
    Table(Table&& o) noexcept : owned_(std::move(o.owned_)), view_(std::exchange(o.view_, {})) {}
    Table& operator=(Table&& o) noexcept {
      if (this == &o) return *this;
      owned_ = std::move(o.owned_);
      view_ = std::exchange(o.view_, {});
      return *this;
    }
    size_t size() const { return view_.size(); }
    bool empty() const { return view_.empty(); }
    const T* data() const { return view_.data(); }
    const T& operator[](size_t i) const { return view_[i]; }
    auto begin() const { return view_.begin(); }
    auto end() const { return view_.end(); }
    std::span<const T> span() const { return view_; }
    bool is_borrowed() const { return !view_.empty() && owned_.empty(); }

   private:
    std::vector<T> owned_;
    std::span<const T> view_;
  };
  // A symbol table with its own string table. The parser checked that every
  // entry's name offset starts a NUL-terminated string inside `strings`, so
  // the accessors need no checks that can fail.
  struct SymbolTable {
    Table<RawSymbol> entries;
    Table<std::byte> strings;
    std::string_view name(const RawSymbol& s) const {
      return std::string_view(reinterpret_cast<const char*>(strings.data()) + s.name);
    }
    // name(s) == want, for a `want` without NUL bytes (find_symbol refuses those).
    bool name_is(const RawSymbol& s, std::string_view want) const;
    Symbol symbol(const RawSymbol& s, std::string_view name) const;
    Symbol symbol(const RawSymbol& s) const { return symbol(s, name(s)); }
  };
  SymbolTable dynsym_;  // index order of .dynsym (hash buckets refer to indices)
  // Per dynsym index, its version index (.gnu.version); bit 15
  // (VERSYM_HIDDEN) marks a non-default "name@VER": dlsym() prefers the
  // default version, and so do we. Empty without version information.
  Table<uint16_t> dynsym_versym_;
  bool hidden_version(size_t idx) const {
    return idx < dynsym_versym_.size() && (dynsym_versym_[idx] & 0x8000) != 0;
  }
  SymbolTable symtab_;  // .symtab, when present
  // Hash tables over dynsym_ (either may be empty; the SysV one is kept
  // only when there is no GNU one, the one find_symbol prefers).
  struct GnuHash {
    uint32_t symoffset = 0, bloom_shift = 0;
    Table<uint64_t> bloom;
    Table<uint32_t> buckets, chain;
  } gnu_;
  struct SysvHash {
    std::vector<uint32_t> buckets, chain;
  } sysv_;
  // The .symtab lookup index: an open-addressed hash table (linear probing,
  // at most half full) with one slot per key, a key being a defined, named
  // entry's name or the "name" of a "name@@VER". Slots, not a node-based map
  // of string_views, so there is no allocation per key; hashed, not sorted by
  // name, because sorting a C++ binary's thousands of mangled names (long
  // shared prefixes) cost more than its whole parse. Built on the first
  // lookup that reaches .symtab, not at parse time: most images are asked
  // for a few .dynsym names or only for their headers. The once_flag makes
  // the build safe for the threads that share a const image.
  struct SymtabSlot {
    uint32_t hash = 0;   // of the key
    uint32_t index = 0;  // 1 + index into symtab_.entries; 0: an empty slot
    uint32_t len = 0;    // the key is the first `len` bytes of that entry's name
  };
  const std::vector<SymtabSlot>& symtab_index() const;
  std::optional<Symbol> find_in_symtab(std::string_view name) const;
  mutable std::once_flag symtab_index_once_;
  mutable std::vector<SymtabSlot> symtab_index_;
};

// Validates and walks an ELF note area (PT_NOTE contents). Returns the GNU
// Build ID (name "GNU", type NT_GNU_BUILD_ID) if one is present; checks
// bounds and 4-byte alignment of every note. Shared by the file and memory
// readers so both validate identically.
Result<std::optional<std::vector<std::byte>>> find_build_id_in_notes(std::span<const std::byte> notes);

// The initialisation entries of a dynamic section: what the loader runs
// before main. Values are as the entries hold them (glibc leaves these tags
// unrelocated in place, so they may be unbiased vaddrs; see the caller).
struct InitTags {
  uint64_t init = 0;                                // DT_INIT
  uint64_t init_array = 0, init_arraysz = 0;        // DT_INIT_ARRAY, DT_INIT_ARRAYSZ (bytes)
  uint64_t preinit_array = 0, preinit_arraysz = 0;  // DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ (bytes)
};
// Walks the dynamic section at `dynamic` (a loaded image's l_ld) through
// `read`, entry by entry up to DT_NULL (at most 1024 entries: the section's
// size is not known from l_ld). An entry that cannot be read ends the walk
// with what was found so far; never fails.
InitTags read_init_tags(uint64_t dynamic, const ReadFn& read);

// Hash functions used by the dynamic loader (exposed for tests).
uint32_t gnu_hash(std::string_view name);
uint32_t sysv_hash(std::string_view name);

// A process-wide cache of parsed images keyed by (device, inode, build id), so
// that attaching to many processes that share libc parses libc once.
class ImageCache {
 public:
  struct Key {
    uint64_t dev = 0, inode = 0;
    std::string build_id_hex;  // may be empty
    bool operator==(const Key&) const = default;
  };

  static ImageCache& global();

  // Returns the cached image for `key`, or calls `load` once and caches a
  // successful result. Concurrent callers for the same key may both load; one
  // result wins. Errors are not cached.
  Result<std::shared_ptr<const ElfImage>> get_or_load(
      const Key& key, const std::function<Result<std::shared_ptr<const ElfImage>>()>& load);

  // The cached images of the file (dev, inode) that have a Build ID, for
  // a caller that proves which one a process mapped by that ID alone
  // (ElfImage::build_id_mapped_at) before it reads any headers.
  std::vector<std::shared_ptr<const ElfImage>> with_build_id(uint64_t dev, uint64_t inode) const;

  size_t size() const;
  uint64_t loads() const;  // how many times `load` ran (for tests)
  void clear();

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  mutable std::mutex mu_;
  std::unordered_map<Key, std::shared_ptr<const ElfImage>, KeyHash> map_;
  uint64_t loads_ = 0;
};

}  // namespace remora::elf
