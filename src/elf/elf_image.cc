// ELF64 little-endian reader: files (whole bytes) and loaded images (through
// a read callback). Every offset, size and count comes from untrusted input
// and is checked, overflow-safe, before use; failures are Errc::kParse.
#include "elf/elf_image.h"

#include <elf.h>
#ifdef __GLIBC__
#include <gnu/libc-version.h>
#endif
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "base/strings.h"

namespace remora::elf {
namespace {

// Sanity limits. Real images stay far below them (libLLVM has ~100k dynamic
// symbols and a few MiB of .dynstr); they bound what a hostile image can make
// us allocate or read out of a target.
constexpr uint64_t kMaxSymbols = uint64_t{1} << 22;
constexpr uint64_t kMaxStringTable = uint64_t{256} << 20;
constexpr uint64_t kMaxHashWords = uint64_t{1} << 22;
constexpr uint64_t kMaxDynamicEntries = uint64_t{1} << 16;
constexpr uint64_t kMaxNoteBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxSections = uint64_t{1} << 20;
constexpr uint64_t kMaxFileBytes = uint64_t{4} << 30;
constexpr uint32_t kMaxBuildIdBytes = 64;

Error parse_error(std::string msg) { return Error(Errc::kParse, std::move(msg)); }

// [off, off+len) lies inside [0, size).
bool fits(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Reads bytes of one address space: file offsets, or unbiased virtual
// addresses (translated to file offsets or to target addresses).
using Reader = std::function<Result<void>(uint64_t addr, std::span<std::byte> out)>;

template <typename T>
Result<T> read_pod(const Reader& read, uint64_t addr) {
  T v{};
  REMORA_TRY(read(addr, std::as_writable_bytes(std::span<T>(&v, 1))));
  return v;
}

template <typename T>
Result<std::vector<T>> read_array(const Reader& read, uint64_t addr, uint64_t count, uint64_t max_count,
                                  std::string_view what) {
  if (count > max_count) {
    return parse_error(std::string(what) + ": " + std::to_string(count) + " entries exceeds the limit of " +
                       std::to_string(max_count));
  }
  auto len = checked_mul(count, sizeof(T));
  if (!len || !checked_add(addr, *len)) {
    return parse_error(std::string(what) + " at " + hex_addr(addr) + " wraps around the address space");
  }
  std::vector<T> out(count);
  if (count != 0) REMORA_TRY_CTX(read(addr, std::as_writable_bytes(std::span<T>(out))), std::string(what));
  return out;
}

Result<std::vector<std::byte>> read_bytes(const Reader& read, uint64_t addr, uint64_t len, uint64_t max_len,
                                          std::string_view what) {
  return read_array<std::byte>(read, addr, len, max_len, what);
}

// Reader over a byte buffer, addressed by offset.
Reader buffer_reader(std::span<const std::byte> bytes) {
  return [bytes](uint64_t off, std::span<std::byte> out) -> Result<void> {
    if (!fits(off, out.size(), bytes.size())) {
      return parse_error("range at offset " + hex_addr(off) + " (" + std::to_string(out.size()) +
                         " bytes) lies beyond the end of the file (" + std::to_string(bytes.size()) +
                         " bytes)");
    }
    if (!out.empty()) std::memcpy(out.data(), bytes.data() + off, out.size());
    return ok();
  };
}

Result<std::string_view> string_at(std::span<const std::byte> strtab, uint64_t off) {
  if (off >= strtab.size()) {
    return parse_error("string offset " + std::to_string(off) + " lies beyond the string table (" +
                       std::to_string(strtab.size()) + " bytes)");
  }
  const char* begin = reinterpret_cast<const char*>(strtab.data()) + off;
  const void* nul = std::memchr(begin, '\0', strtab.size() - off);
  if (nul == nullptr)
    return parse_error("string at offset " + std::to_string(off) + " is not NUL-terminated");
  return std::string_view(begin, static_cast<const char*>(nul) - begin);
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + (a - 1)) & ~(a - 1); }  // v < 2^40 here

// The note walker behind find_build_id_in_notes. `align` is 4 for nearly all
// notes; .note.gnu.property sits in a PT_NOTE with p_align 8 and uses 8-byte
// padding (gABI for ELF64), so the readers pass the segment's alignment.
// `found_at`, if given, receives the offset of the Build ID note's header.
Result<std::optional<std::vector<std::byte>>> walk_notes(std::span<const std::byte> notes, uint64_t align,
                                                         uint64_t* found_at = nullptr) {
  std::optional<std::vector<std::byte>> found;
  uint64_t pos = 0;
  const uint64_t size = notes.size();
  while (pos < size) {
    if (size - pos < sizeof(Elf64_Nhdr)) {
      return parse_error("truncated note header at offset " + std::to_string(pos) + ": " +
                         std::to_string(size - pos) + " bytes left, need 12");
    }
    Elf64_Nhdr nh;
    std::memcpy(&nh, notes.data() + pos, sizeof nh);
    // namesz and descsz are 32-bit, so these sums cannot overflow 64 bits.
    const uint64_t name_off = pos + sizeof nh;
    const uint64_t desc_off = align_up(name_off + nh.n_namesz, align);
    const uint64_t next = align_up(desc_off + nh.n_descsz, align);
    if (next > size) {
      return parse_error("note at offset " + std::to_string(pos) + " (namesz " + std::to_string(nh.n_namesz) +
                         ", descsz " + std::to_string(nh.n_descsz) + ", padded to " + std::to_string(align) +
                         ") extends past the end of the note area (" + std::to_string(size) + " bytes)");
    }
    const bool gnu_name = nh.n_namesz == 4 && std::memcmp(notes.data() + name_off, "GNU\0", 4) == 0;
    if (gnu_name && nh.n_type == NT_GNU_BUILD_ID) {
      if (nh.n_descsz == 0 || nh.n_descsz > kMaxBuildIdBytes) {
        return parse_error("GNU build id note has " + std::to_string(nh.n_descsz) + " bytes; expected 1 to " +
                           std::to_string(kMaxBuildIdBytes));
      }
      if (!found) {
        auto desc = notes.subspan(desc_off, nh.n_descsz);
        found.emplace(desc.begin(), desc.end());
        if (found_at) *found_at = pos;
      }
    }
    pos = next;
  }
  return found;
}

struct DynInfo {
  std::optional<uint64_t> symtab, strtab, strsz, syment, gnu_hash, hash, versym, soname;
  std::vector<uint64_t> needed;  // DT_NEEDED string offsets, in order
};

DynInfo parse_dynamic(std::span<const Elf64_Dyn> entries) {
  DynInfo info;
  for (const Elf64_Dyn& d : entries) {
    if (d.d_tag == DT_NULL) break;
    switch (d.d_tag) {
      case DT_SYMTAB: info.symtab = d.d_un.d_ptr; break;
      case DT_STRTAB: info.strtab = d.d_un.d_ptr; break;
      case DT_STRSZ: info.strsz = d.d_un.d_val; break;
      case DT_SYMENT: info.syment = d.d_un.d_val; break;
      case DT_GNU_HASH: info.gnu_hash = d.d_un.d_ptr; break;
      case DT_HASH: info.hash = d.d_un.d_ptr; break;
      case DT_VERSYM: info.versym = d.d_un.d_ptr; break;
      case DT_SONAME: info.soname = d.d_un.d_val; break;
      case DT_NEEDED: info.needed.push_back(d.d_un.d_val); break;
      default: break;
    }
  }
  return info;
}

Result<void> check_ehdr(const Elf64_Ehdr& eh) {
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    return parse_error("not an ELF image: bad magic " + to_hex(eh.e_ident, SELFMAG) + " (expected 7f454c46)");
  }
  if (eh.e_ident[EI_CLASS] == ELFCLASS32) {
    return parse_error("32-bit ELF (ELFCLASS32) is not supported: only ELF64 images (x86_64, aarch64) are");
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) {
    return parse_error("unknown ELF class " + std::to_string(eh.e_ident[EI_CLASS]) +
                       ": only ELF64 is supported");
  }
  if (eh.e_ident[EI_DATA] == ELFDATA2MSB) {
    return parse_error("big-endian ELF (ELFDATA2MSB) is not supported: only little-endian images are");
  }
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB) {
    return parse_error("unknown ELF data encoding " + std::to_string(eh.e_ident[EI_DATA]));
  }
  if (eh.e_ident[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT) {
    return parse_error("unknown ELF version " + std::to_string(eh.e_ident[EI_VERSION]));
  }
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) {
    return parse_error("ELF type " + std::to_string(eh.e_type) +
                       " is not an executable (ET_EXEC) or shared object (ET_DYN)");
  }
  if (eh.e_phnum == 0) return parse_error("ELF image has no program headers");
  if (eh.e_phnum == PN_XNUM) {
    return parse_error("extended program header numbering (e_phnum == PN_XNUM) is not supported");
  }
  if (eh.e_phentsize != sizeof(Elf64_Phdr)) {
    return parse_error("program header entry size " + std::to_string(eh.e_phentsize) + ", expected " +
                       std::to_string(sizeof(Elf64_Phdr)));
  }
  return ok();
}

// The end of the last NUL-terminated string in `strtab`: a name offset below
// it starts a terminated string, one at or past it does not. Found once per
// table so that checking thousands of names costs a compare each.
uint64_t terminated_prefix(std::span<const std::byte> strtab) {
  uint64_t end = strtab.size();
  while (end > 0 && strtab[end - 1] != std::byte{0}) --end;
  return end;
}

std::string_view unversioned(std::string_view name) {
  auto at = name.find('@');
  return at == std::string_view::npos ? name : name.substr(0, at);
}

long host_page_size() {
  long p = ::sysconf(_SC_PAGESIZE);
  return p > 0 ? p : 4096;
}

// Resident tables. The libraries this process loaded at start and can never
// unload, libc and the dynamic loader, keep their read-only segments mapped
// for as long as we live. When a file being parsed is the same build (GNU
// Build ID), a table whose bytes there equal the file's (compared, not
// assumed from the ID) is viewed in place instead of copied. For libc that
// is 126 KB of .dynsym, .dynstr, .gnu.version and .gnu.hash, some 30 fresh
// pages that a short-lived controller (`remora attach`) would otherwise
// fault in, zero and copy on every run, to look up a dozen names. Viewing
// them adds no risk of a fault: a truncated libc would take this process
// down through its own calls into it anyway.
struct ResidentObject {
  std::vector<std::byte> build_id;
  struct Segment {
    uint64_t offset = 0, filesz = 0;  // the file part of one read-only PT_LOAD
    const std::byte* mem = nullptr;   // where it lies here
  };
  std::vector<Segment> segments;

  // The bytes at file offset [off, off + len) as mapped here, or null when
  // no read-only segment holds all of them.
  const std::byte* at(uint64_t off, uint64_t len) const {
    for (const Segment& seg : segments)
      if (off >= seg.offset && fits(off - seg.offset, len, seg.filesz)) return seg.mem + (off - seg.offset);
    return nullptr;
  }
};

// An address in libc's own code. Not dl_iterate_phdr's: sanitizers
// intercept that one, and their copy lies in their runtime, not in libc.
uintptr_t libc_code_address() {
#ifdef __GLIBC__
  return reinterpret_cast<uintptr_t>(&::gnu_get_libc_version);
#else
  return reinterpret_cast<uintptr_t>(&::dl_iterate_phdr);
#endif
}

int add_if_resident(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::vector<ResidentObject>*>(data);
  const uintptr_t libc_code = libc_code_address();
  const unsigned long loader_base = ::getauxval(AT_BASE);
  bool resident = loader_base != 0 && info->dlpi_addr == loader_base;
  ResidentObject obj;
  std::vector<const ElfW(Phdr)*> notes;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_NOTE) notes.push_back(&ph);
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (libc_code >= start && libc_code - start < ph.p_memsz) resident = true;  // the object holding libc
    if ((ph.p_flags & PF_R) && !(ph.p_flags & PF_W))
      obj.segments.push_back({ph.p_offset, ph.p_filesz, reinterpret_cast<const std::byte*>(start)});
  }
  if (!resident) return 0;
  for (const ElfW(Phdr) * ph : notes) {
    auto* note = reinterpret_cast<const std::byte*>(info->dlpi_addr + ph->p_vaddr);
    const bool mapped = std::any_of(obj.segments.begin(), obj.segments.end(), [&](const auto& seg) {
      return note >= seg.mem && fits(static_cast<uint64_t>(note - seg.mem), ph->p_filesz, seg.filesz);
    });
    if (!mapped) continue;
    auto id = walk_notes(std::span(note, ph->p_filesz), ph->p_align == 8 ? 8 : 4, nullptr);
    if (id.ok() && *id) {
      obj.build_id = std::move(**id);
      out->push_back(std::move(obj));
      break;
    }
  }
  return 0;
}

const ResidentObject* resident_object(std::span<const std::byte> build_id) {
  static const std::vector<ResidentObject> objects = [] {
    std::vector<ResidentObject> found;
    ::dl_iterate_phdr(add_if_resident, &found);
    return found;
  }();
  if (build_id.empty()) return nullptr;
  for (const ResidentObject& obj : objects)
    if (std::equal(obj.build_id.begin(), obj.build_id.end(), build_id.begin(), build_id.end())) return &obj;
  return nullptr;
}

// A file's bytes and, when this process has the same build loaded for good,
// that build's read-only segments: where a table may be borrowed from.
struct Mirror {
  std::span<const std::byte> file;
  const ResidentObject* resident = nullptr;
};

}  // namespace

class ElfParser {
 public:
  static Result<std::shared_ptr<const ElfImage>> parse_file(std::span<const std::byte> bytes,
                                                            bool with_symbols = true);
  static Result<std::shared_ptr<const ElfImage>> parse_fd(int fd, bool with_symbols);
  static Result<std::shared_ptr<const ElfImage>> parse_memory(uint64_t base, const ReadFn& read,
                                                              bool with_symbols);

 private:
  struct Phdrs {
    std::vector<Elf64_Phdr> notes;
    std::optional<Elf64_Phdr> dynamic;
  };

  static Result<Phdrs> take_phdrs(std::span<const Elf64_Phdr> phdrs, ElfImage& img);
  static Result<void> load_dynamic_symbols(const Reader& vread, const DynInfo& info, ElfImage& img);
  // The tables of the hashes, the symbols and their names come from a
  // `mirror` when given (the section route of a file; "Resident tables").
  static Result<uint64_t> load_gnu_hash(const Reader& read, uint64_t addr, std::optional<uint64_t> nsyms,
                                        ElfImage& img, const Mirror* mirror = nullptr);
  // The table's symbol count (nchain); its buckets and chain too when
  // `tables` (find_symbol reads them only when there is no GNU table).
  static Result<uint64_t> load_sysv_hash(const Reader& read, uint64_t addr, ElfImage& img, bool tables);
  static Result<void> load_versym(const Reader& read, uint64_t addr, ElfImage& img,
                                  const Mirror* mirror = nullptr);
  static Result<void> load_sections(std::span<const std::byte> bytes, const Elf64_Ehdr& eh,
                                    bool need_build_id, ElfImage& img, bool& have_dynsym);
  static Result<ElfImage::SymbolTable> read_symbol_table(const Reader& read, uint64_t addr, uint64_t count,
                                                         ElfImage::Table<std::byte> strtab,
                                                         std::string_view what,
                                                         const Mirror* mirror = nullptr);
  template <typename T>
  static Result<ElfImage::Table<T>> take_array(const Reader& read, uint64_t off, uint64_t count,
                                               uint64_t max_count, std::string_view what,
                                               const Mirror* mirror);
};

// `count` entries of T at file offset `off`: viewed in the resident copy when
// it holds the same bytes, copied through `read` otherwise.
template <typename T>
Result<ElfImage::Table<T>> ElfParser::take_array(const Reader& read, uint64_t off, uint64_t count,
                                                 uint64_t max_count, std::string_view what,
                                                 const Mirror* mirror) {
  if (mirror != nullptr && mirror->resident != nullptr && count != 0 && count <= max_count) {
    const uint64_t len = count * sizeof(T);  // count <= 2^28: no overflow
    const std::byte* mem = fits(off, len, mirror->file.size()) ? mirror->resident->at(off, len) : nullptr;
    if (mem != nullptr && reinterpret_cast<uintptr_t>(mem) % alignof(T) == 0 &&
        std::memcmp(mem, mirror->file.data() + off, len) == 0)
      return ElfImage::Table<T>::borrowed(std::span(reinterpret_cast<const T*>(mem), count));
  }
  return ElfImage::Table<T>(REMORA_TRY(read_array<T>(read, off, count, max_count, what)));
}

// Every name offset is checked here, once, so that lookups and listings
// never meet a bad one; the error (and its context) is string_at's.
Result<ElfImage::SymbolTable> ElfParser::read_symbol_table(const Reader& read, uint64_t addr, uint64_t count,
                                                           ElfImage::Table<std::byte> strtab,
                                                           std::string_view what, const Mirror* mirror) {
  // The entries are copied straight into RawSymbol, so it must be Elf64_Sym.
  static_assert(sizeof(ElfImage::RawSymbol) == sizeof(Elf64_Sym));
  static_assert(offsetof(ElfImage::RawSymbol, name) == offsetof(Elf64_Sym, st_name));
  static_assert(offsetof(ElfImage::RawSymbol, info) == offsetof(Elf64_Sym, st_info));
  static_assert(offsetof(ElfImage::RawSymbol, other) == offsetof(Elf64_Sym, st_other));
  static_assert(offsetof(ElfImage::RawSymbol, shndx) == offsetof(Elf64_Sym, st_shndx));
  static_assert(offsetof(ElfImage::RawSymbol, value) == offsetof(Elf64_Sym, st_value));
  static_assert(offsetof(ElfImage::RawSymbol, size) == offsetof(Elf64_Sym, st_size));
  ElfImage::SymbolTable table;
  table.entries = REMORA_TRY(take_array<ElfImage::RawSymbol>(read, addr, count, kMaxSymbols, what, mirror));
  const uint64_t terminated = terminated_prefix(strtab.span());
  for (size_t i = 0; i < table.entries.size(); ++i) {
    if (table.entries[i].name < terminated) continue;
    auto name = string_at(strtab.span(), table.entries[i].name);
    if (!name.ok())
      return std::move(name.error()).with_context(std::string(what) + " entry " + std::to_string(i));
  }
  table.strings = std::move(strtab);
  return table;
}

Result<ElfParser::Phdrs> ElfParser::take_phdrs(std::span<const Elf64_Phdr> phdrs, ElfImage& img) {
  Phdrs out;
  for (size_t i = 0; i < phdrs.size(); ++i) {
    const Elf64_Phdr& p = phdrs[i];
    switch (p.p_type) {
      case PT_LOAD: {
        if (p.p_filesz > p.p_memsz) {
          return parse_error("PT_LOAD " + std::to_string(i) + ": p_filesz exceeds p_memsz");
        }
        if (!checked_add(p.p_vaddr, p.p_memsz) || !checked_add(p.p_offset, p.p_filesz)) {
          return parse_error("PT_LOAD " + std::to_string(i) + ": segment wraps around the address space");
        }
        LoadSegment seg;
        seg.vaddr = p.p_vaddr;
        seg.memsz = p.p_memsz;
        seg.offset = p.p_offset;
        seg.filesz = p.p_filesz;
        seg.align = p.p_align;
        seg.flags = p.p_flags;
        img.loads_.push_back(seg);
        break;
      }
      case PT_INTERP: img.has_interp_ = true; break;
      case PT_DYNAMIC:
        if (!out.dynamic) out.dynamic = p;
        img.has_dynamic_ = true;
        break;
      case PT_NOTE: out.notes.push_back(p); break;
      default: break;
    }
  }
  if (img.loads_.empty()) return parse_error("ELF image has no PT_LOAD segments");
  return out;
}

Result<uint64_t> ElfParser::load_gnu_hash(const Reader& read, uint64_t addr, std::optional<uint64_t> nsyms,
                                          ElfImage& img, const Mirror* mirror) {
  // Layout (ELF64): nbuckets, symoffset, bloom_size, bloom_shift (u32 each);
  // bloom[bloom_size] (u64); buckets[nbuckets] (u32); chain[] (u32), one per
  // dynsym index >= symoffset, the low bit marking the end of a chain.
  auto hdr = REMORA_TRY(read_array<uint32_t>(read, addr, 4, 4, "GNU hash header"));
  const uint32_t nbuckets = hdr[0], symoffset = hdr[1], bloom_size = hdr[2], shift = hdr[3];
  if (nbuckets == 0 || nbuckets > kMaxHashWords) {
    return parse_error("GNU hash table has " + std::to_string(nbuckets) + " buckets");
  }
  if (bloom_size == 0 || (bloom_size & (bloom_size - 1)) != 0 || bloom_size > kMaxHashWords) {
    return parse_error("GNU hash bloom filter size " + std::to_string(bloom_size) + " is not a power of two");
  }
  if (shift >= 32) return parse_error("GNU hash bloom shift " + std::to_string(shift) + " is not below 32");
  if (symoffset > kMaxSymbols)
    return parse_error("GNU hash symoffset " + std::to_string(symoffset) + " too large");
  const uint64_t bloom_addr = addr + 16;  // read_array checked addr+16 does not wrap
  auto bloom =
      REMORA_TRY(take_array<uint64_t>(read, bloom_addr, bloom_size, kMaxHashWords, "GNU hash bloom", mirror));
  const uint64_t buckets_addr = bloom_addr + uint64_t{bloom_size} * 8;  // checked by read_array
  auto buckets = REMORA_TRY(
      take_array<uint32_t>(read, buckets_addr, nbuckets, kMaxHashWords, "GNU hash buckets", mirror));
  const uint64_t chain_addr = buckets_addr + uint64_t{nbuckets} * 4;

  if (!nsyms) {
    // No section header tells the count: it is one past the last index of
    // the chain that starts at the highest bucket.
    const uint32_t max_bucket = *std::max_element(buckets.begin(), buckets.end());
    if (max_bucket == 0) {
      nsyms = symoffset;
    } else {
      if (max_bucket < symoffset) {
        return parse_error("GNU hash bucket " + std::to_string(max_bucket) + " lies below symoffset " +
                           std::to_string(symoffset));
      }
      uint64_t idx = max_bucket;
      while (true) {
        if (idx >= kMaxSymbols) return parse_error("GNU hash chain runs past " + std::to_string(kMaxSymbols));
        auto word =
            REMORA_TRY_CTX(read_pod<uint32_t>(read, chain_addr + (idx - symoffset) * 4), "GNU hash chain");
        if (word & 1) break;
        ++idx;
      }
      nsyms = idx + 1;
    }
  }
  const uint64_t chain_len = *nsyms > symoffset ? *nsyms - symoffset : 0;
  auto chain =
      REMORA_TRY(take_array<uint32_t>(read, chain_addr, chain_len, kMaxSymbols, "GNU hash chain", mirror));
  img.gnu_.symoffset = symoffset;
  img.gnu_.bloom_shift = shift;
  img.gnu_.bloom = std::move(bloom);
  img.gnu_.buckets = std::move(buckets);
  img.gnu_.chain = std::move(chain);
  return *nsyms;
}

Result<uint64_t> ElfParser::load_sysv_hash(const Reader& read, uint64_t addr, ElfImage& img, bool tables) {
  // Layout: nbucket, nchain (u32); buckets[nbucket]; chain[nchain]. nchain
  // equals the number of dynsym entries.
  auto hdr = REMORA_TRY(read_array<uint32_t>(read, addr, 2, 2, "SysV hash header"));
  const uint32_t nbucket = hdr[0], nchain = hdr[1];
  if (nbucket == 0 || nbucket > kMaxHashWords) {
    return parse_error("SysV hash table has " + std::to_string(nbucket) + " buckets");
  }
  if (!tables) return nchain;
  auto buckets =
      REMORA_TRY(read_array<uint32_t>(read, addr + 8, nbucket, kMaxHashWords, "SysV hash buckets"));
  auto chain = REMORA_TRY(
      read_array<uint32_t>(read, addr + 8 + uint64_t{nbucket} * 4, nchain, kMaxSymbols, "SysV hash chain"));
  img.sysv_.buckets = std::move(buckets);
  img.sysv_.chain = std::move(chain);
  return nchain;
}

Result<void> ElfParser::load_versym(const Reader& read, uint64_t addr, ElfImage& img, const Mirror* mirror) {
  img.dynsym_versym_ = REMORA_TRY(
      take_array<uint16_t>(read, addr, img.dynsym_.entries.size(), kMaxSymbols, "version table", mirror));
  return ok();
}

// The PT_DYNAMIC route: everything found from the dynamic section, through a
// reader of unbiased virtual addresses.
Result<void> ElfParser::load_dynamic_symbols(const Reader& vread, const DynInfo& info, ElfImage& img) {
  if (!info.strtab) return ok();  // nothing to name symbols with
  if (!info.strsz) return parse_error("dynamic section has DT_STRTAB but no DT_STRSZ");
  ElfImage::Table<std::byte> strtab(
      REMORA_TRY(read_bytes(vread, *info.strtab, *info.strsz, kMaxStringTable, "dynamic string table")));
  if (info.soname)
    img.soname_ = std::string(REMORA_TRY_CTX(string_at(strtab.span(), *info.soname), "DT_SONAME"));
  for (uint64_t off : info.needed)
    img.needed_.emplace_back(REMORA_TRY_CTX(string_at(strtab.span(), off), "DT_NEEDED"));
  if (!info.symtab) return ok();
  if (info.syment && *info.syment != sizeof(Elf64_Sym)) {
    return parse_error("DT_SYMENT is " + std::to_string(*info.syment) + ", expected " +
                       std::to_string(sizeof(Elf64_Sym)));
  }
  std::optional<uint64_t> nsyms;
  if (info.gnu_hash)
    nsyms = REMORA_TRY_CTX(load_gnu_hash(vread, *info.gnu_hash, std::nullopt, img), "DT_GNU_HASH");
  if (info.hash) {
    // nchain is exact; prefer it over the count walked out of the GNU table.
    nsyms = REMORA_TRY_CTX(load_sysv_hash(vread, *info.hash, img, !info.gnu_hash), "DT_HASH");
  }
  if (!nsyms) {
    // No hash table at all (rare; lld/ld always emit one): .dynstr follows
    // .dynsym in every linker's default layout, so the gap bounds the count.
    nsyms = *info.strtab > *info.symtab
                ? std::min<uint64_t>((*info.strtab - *info.symtab) / sizeof(Elf64_Sym), kMaxSymbols)
                : 0;
  }
  img.dynsym_ =
      REMORA_TRY(read_symbol_table(vread, *info.symtab, *nsyms, std::move(strtab), "dynamic symbol table"));
  if (img.dynsym_.entries.size() < img.gnu_.symoffset) {
    return parse_error("GNU hash symoffset " + std::to_string(img.gnu_.symoffset) + " exceeds the " +
                       std::to_string(img.dynsym_.entries.size()) + " dynamic symbols");
  }
  if (info.versym) REMORA_TRY_CTX(load_versym(vread, *info.versym, img), "DT_VERSYM");
  return ok();
}

Result<void> ElfParser::load_sections(std::span<const std::byte> bytes, const Elf64_Ehdr& eh,
                                      bool need_build_id, ElfImage& img, bool& have_dynsym) {
  const Reader fread = buffer_reader(bytes);
  if (eh.e_shentsize != sizeof(Elf64_Shdr)) {
    return parse_error("section header entry size " + std::to_string(eh.e_shentsize) + ", expected " +
                       std::to_string(sizeof(Elf64_Shdr)));
  }
  uint64_t shnum = eh.e_shnum;
  if (shnum == 0) {
    // Extended numbering: the count lives in section header 0's sh_size.
    auto sh0 = REMORA_TRY_CTX(read_pod<Elf64_Shdr>(fread, eh.e_shoff), "section header 0");
    shnum = sh0.sh_size;
    if (shnum == 0) return ok();
  }
  auto shdrs = REMORA_TRY(read_array<Elf64_Shdr>(fread, eh.e_shoff, shnum, kMaxSections, "section headers"));
  const Mirror mirror{bytes, resident_object(img.build_id_)};

  auto section_bytes = [&](size_t idx, uint64_t max,
                           std::string_view what) -> Result<std::vector<std::byte>> {
    const Elf64_Shdr& sh = shdrs[idx];
    if (sh.sh_type == SHT_NOBITS)
      return parse_error(std::string(what) + " has no file contents (SHT_NOBITS)");
    return read_bytes(fread, sh.sh_offset, sh.sh_size, max, what);
  };
  auto load_table = [&](size_t idx, std::string_view what) -> Result<ElfImage::SymbolTable> {
    const Elf64_Shdr& sh = shdrs[idx];
    if (sh.sh_entsize != sizeof(Elf64_Sym)) {
      return parse_error(std::string(what) + " entry size " + std::to_string(sh.sh_entsize) + ", expected " +
                         std::to_string(sizeof(Elf64_Sym)));
    }
    if (sh.sh_link == 0 || sh.sh_link >= shdrs.size() || shdrs[sh.sh_link].sh_type != SHT_STRTAB) {
      return parse_error(std::string(what) + " links to section " + std::to_string(sh.sh_link) +
                         ", which is not a string table");
    }
    const Elf64_Shdr& str = shdrs[sh.sh_link];
    if (str.sh_type == SHT_NOBITS) return parse_error("string table has no file contents (SHT_NOBITS)");
    auto strtab = REMORA_TRY(
        take_array<std::byte>(fread, str.sh_offset, str.sh_size, kMaxStringTable, "string table", &mirror));
    return read_symbol_table(fread, sh.sh_offset, sh.sh_size / sizeof(Elf64_Sym), std::move(strtab), what,
                             &mirror);
  };

  std::optional<size_t> dynsym, symtab, gnu_hash, sysv_hash, versym;
  std::vector<size_t> notes;
  for (size_t i = 0; i < shdrs.size(); ++i) {
    const Elf64_Shdr& sh = shdrs[i];
    if (sh.sh_type == SHT_NOBITS) continue;  // separate debug files keep headers without contents
    switch (sh.sh_type) {
      case SHT_DYNSYM:
        if (!dynsym) dynsym = i;
        break;
      case SHT_SYMTAB:
        if (!symtab) symtab = i;
        break;
      case SHT_GNU_HASH:
        if (!gnu_hash) gnu_hash = i;
        break;
      case SHT_HASH:
        if (!sysv_hash) sysv_hash = i;
        break;
      case SHT_GNU_versym:
        if (!versym) versym = i;
        break;
      case SHT_NOTE: notes.push_back(i); break;
      default: break;
    }
  }
  if (dynsym) {
    img.dynsym_ = REMORA_TRY_CTX(load_table(*dynsym, ".dynsym"), ".dynsym");
    have_dynsym = true;
    if (gnu_hash) {
      REMORA_TRY_CTX(
          load_gnu_hash(fread, shdrs[*gnu_hash].sh_offset, img.dynsym_.entries.size(), img, &mirror),
          ".gnu.hash");
    }
    // Lookups take the GNU table when there is one: the SysV one (16 KB in
    // libc, copied into fresh pages) only serves a file without it.
    if (sysv_hash && !gnu_hash)
      REMORA_TRY_CTX(load_sysv_hash(fread, shdrs[*sysv_hash].sh_offset, img, true), ".hash");
    if (versym) REMORA_TRY_CTX(load_versym(fread, shdrs[*versym].sh_offset, img, &mirror), ".gnu.version");
  }
  if (symtab) img.symtab_ = REMORA_TRY_CTX(load_table(*symtab, ".symtab"), ".symtab");
  if (need_build_id) {
    for (size_t idx : notes) {
      auto data = REMORA_TRY(section_bytes(idx, kMaxNoteBytes, "note section"));
      auto id = REMORA_TRY_CTX(walk_notes(data, shdrs[idx].sh_addralign == 8 ? 8 : 4), "note section");
      if (id) {
        img.build_id_ = std::move(*id);
        break;
      }
    }
  }
  return ok();
}

Result<std::shared_ptr<const ElfImage>> ElfParser::parse_file(std::span<const std::byte> bytes,
                                                              bool with_symbols) {
  if (bytes.size() < sizeof(Elf64_Ehdr)) {
    return parse_error("truncated ELF header: file has " + std::to_string(bytes.size()) + " bytes, need " +
                       std::to_string(sizeof(Elf64_Ehdr)));
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof eh);
  REMORA_TRY(check_ehdr(eh));
  const uint64_t ph_size = uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);  // e_phnum < 2^16: no overflow
  if (!fits(eh.e_phoff, ph_size, bytes.size())) {
    return parse_error("program headers (offset " + hex_addr(eh.e_phoff) + ", " + std::to_string(eh.e_phnum) +
                       " entries) lie beyond the end of the file (" + std::to_string(bytes.size()) +
                       " bytes)");
  }
  std::vector<Elf64_Phdr> phdrs(eh.e_phnum);
  std::memcpy(phdrs.data(), bytes.data() + eh.e_phoff, ph_size);

  std::shared_ptr<ElfImage> img(new ElfImage());
  img->type_ = eh.e_type;
  img->machine_ = eh.e_machine;
  img->entry_ = eh.e_entry;
  auto ph = REMORA_TRY(take_phdrs(phdrs, *img));

  const Reader fread = buffer_reader(bytes);
  // In a file, dynamic entries hold unbiased vaddrs; PT_LOAD maps them to offsets.
  const Reader vread = [&img, &fread](uint64_t vaddr, std::span<std::byte> out) -> Result<void> {
    for (const LoadSegment& seg : img->loads_) {
      if (vaddr >= seg.vaddr && fits(vaddr - seg.vaddr, out.size(), seg.filesz)) {
        return fread(seg.offset + (vaddr - seg.vaddr), out);
      }
    }
    return parse_error("virtual address " + hex_addr(vaddr) + " (" + std::to_string(out.size()) +
                       " bytes) is not in the file contents of any PT_LOAD segment");
  };

  for (const Elf64_Phdr& p : ph.notes) {
    auto data =
        REMORA_TRY_CTX(read_bytes(fread, p.p_offset, p.p_filesz, kMaxNoteBytes, "PT_NOTE"), "PT_NOTE");
    uint64_t at = 0;
    auto id = REMORA_TRY_CTX(walk_notes(data, p.p_align == 8 ? 8 : 4, &at), "PT_NOTE");
    if (id) {
      img->build_id_ = std::move(*id);
      img->build_id_note_vaddr_ = p.p_vaddr + at;
      break;
    }
  }
  if (!with_symbols) return std::shared_ptr<const ElfImage>(std::move(img));

  DynInfo info;
  if (ph.dynamic) {
    auto entries = REMORA_TRY_CTX(
        read_array<Elf64_Dyn>(fread, ph.dynamic->p_offset, ph.dynamic->p_filesz / sizeof(Elf64_Dyn),
                              kMaxDynamicEntries, "PT_DYNAMIC"),
        "PT_DYNAMIC");
    info = parse_dynamic(entries);
  }

  bool have_dynsym = false;
  if (eh.e_shoff != 0) {
    REMORA_TRY_CTX(load_sections(bytes, eh, img->build_id_.empty(), *img, have_dynsym), "section headers");
  }
  if (have_dynsym) {
    // Only the name is wanted from the dynamic section.
    if ((info.soname || !info.needed.empty()) && info.strtab && info.strsz) {
      auto strtab = REMORA_TRY(read_bytes(vread, *info.strtab, *info.strsz, kMaxStringTable, "DT_STRTAB"));
      if (info.soname)
        img->soname_ = std::string(REMORA_TRY_CTX(string_at(strtab, *info.soname), "DT_SONAME"));
      for (uint64_t off : info.needed)
        img->needed_.emplace_back(REMORA_TRY_CTX(string_at(strtab, off), "DT_NEEDED"));
    }
  } else {
    REMORA_TRY_CTX(load_dynamic_symbols(vread, info, *img), "PT_DYNAMIC");
  }
  return std::shared_ptr<const ElfImage>(std::move(img));
}

Result<std::shared_ptr<const ElfImage>> ElfParser::parse_memory(uint64_t base, const ReadFn& read,
                                                                bool with_symbols) {
  Elf64_Ehdr eh{};
  REMORA_TRY_CTX(read(base, std::as_writable_bytes(std::span<Elf64_Ehdr>(&eh, 1))),
                 "ELF header at " + hex_addr(base));
  REMORA_TRY(check_ehdr(eh));
  const uint64_t ph_size = uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr);
  auto ph_addr = checked_add(base, eh.e_phoff);
  if (!ph_addr || !checked_add(*ph_addr, ph_size)) {
    return parse_error("program headers at offset " + hex_addr(eh.e_phoff) +
                       " wrap around the address space");
  }
  std::vector<Elf64_Phdr> phdrs(eh.e_phnum);
  REMORA_TRY_CTX(read(*ph_addr, std::as_writable_bytes(std::span<Elf64_Phdr>(phdrs))), "program headers");

  std::shared_ptr<ElfImage> img(new ElfImage());
  img->type_ = eh.e_type;
  img->machine_ = eh.e_machine;
  img->entry_ = eh.e_entry;
  auto ph = REMORA_TRY(take_phdrs(phdrs, *img));

  // `base` maps file offset 0, which is the first PT_LOAD's page.
  const uint64_t page = static_cast<uint64_t>(host_page_size());
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const LoadSegment& seg : img->loads_) {
    lo = std::min(lo, seg.vaddr & ~(page - 1));
    hi = std::max(hi, seg.vaddr + seg.memsz);  // checked in take_phdrs
  }
  const uint64_t bias = base - lo;  // modular: the image may sit below its link address
  const uint64_t span = hi - lo;

  // Reads only what some PT_LOAD mapped (memsz: .bss reads as zeros).
  const Reader vread = [&img, &read, bias](uint64_t vaddr, std::span<std::byte> out) -> Result<void> {
    for (const LoadSegment& seg : img->loads_) {
      if (vaddr >= seg.vaddr && fits(vaddr - seg.vaddr, out.size(), seg.memsz))
        return read(vaddr + bias, out);
    }
    return parse_error("virtual address " + hex_addr(vaddr) + " (" + std::to_string(out.size()) +
                       " bytes) is not inside any PT_LOAD segment");
  };
  auto in_file_part = [&img](uint64_t vaddr, uint64_t len) {
    return std::any_of(img->loads_.begin(), img->loads_.end(), [&](const LoadSegment& seg) {
      return vaddr >= seg.vaddr && fits(vaddr - seg.vaddr, len, seg.filesz);
    });
  };

  for (const Elf64_Phdr& p : ph.notes) {
    if (!in_file_part(p.p_vaddr, p.p_filesz)) continue;  // not mapped: nothing to read
    auto data = REMORA_TRY_CTX(read_bytes(vread, p.p_vaddr, p.p_filesz, kMaxNoteBytes, "PT_NOTE"), "PT_NOTE");
    auto id = REMORA_TRY_CTX(walk_notes(data, p.p_align == 8 ? 8 : 4), "PT_NOTE");
    if (id) {
      img->build_id_ = std::move(*id);
      break;
    }
  }

  if (ph.dynamic && with_symbols) {
    auto entries = REMORA_TRY_CTX(
        read_array<Elf64_Dyn>(vread, ph.dynamic->p_vaddr, ph.dynamic->p_filesz / sizeof(Elf64_Dyn),
                              kMaxDynamicEntries, "PT_DYNAMIC"),
        "PT_DYNAMIC");
    DynInfo info = parse_dynamic(entries);
    // glibc's ld.so relocates the d_ptr entries in place (elf_get_dynamic_info,
    // unless the dynamic section is read-only as in the vDSO); musl's does
    // not. A value inside the runtime image is therefore already biased.
    auto unbias = [&](std::optional<uint64_t>& p) {
      if (p && *p >= base && *p - base < span) *p -= bias;
    };
    unbias(info.symtab);
    unbias(info.strtab);
    unbias(info.gnu_hash);
    unbias(info.hash);
    unbias(info.versym);
    REMORA_TRY_CTX(load_dynamic_symbols(vread, info, *img), "PT_DYNAMIC");
  }
  return std::shared_ptr<const ElfImage>(std::move(img));
}

Result<std::shared_ptr<const ElfImage>> ElfImage::from_file_bytes(std::vector<std::byte> bytes) {
  return ElfParser::parse_file(bytes);
}

Result<std::shared_ptr<const ElfImage>> ElfImage::from_fd(int fd) { return ElfParser::parse_fd(fd, true); }

Result<std::shared_ptr<const ElfImage>> ElfImage::headers_from_fd(int fd) {
  return ElfParser::parse_fd(fd, false);
}

Result<std::shared_ptr<const ElfImage>> ElfParser::parse_fd(int fd, bool with_symbols) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Error::from_errno("fstat ELF file");
  if (!S_ISREG(st.st_mode))
    return Error(Errc::kInvalidArgument, "not a regular file; cannot read it as an ELF image");
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > kMaxFileBytes) {
    return parse_error("ELF file of " + std::to_string(st.st_size) + " bytes exceeds the limit of " +
                       std::to_string(kMaxFileBytes));
  }
  // Mapped, not read: the parser touches only the headers, the symbol and
  // hash tables and the notes (a tenth of libc), and nothing is copied or
  // zeroed first; for libc, reading the whole file cost most of a cold
  // controller's first call. (A file truncated in place while it is parsed
  // would fault; mapped libraries are replaced, not truncated: truncating
  // one would crash every process that maps it.)
  if (st.st_size > 0) {
    const size_t size = static_cast<size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
      auto parsed = parse_file(std::span(static_cast<const std::byte*>(map), size), with_symbols);
      ::munmap(map, size);
      return parsed;
    }
  }
  // Not mappable (a pipe-like file, an odd filesystem): read it.
  std::vector<std::byte> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("read ELF file");
    }
    if (n == 0) break;  // the file shrank meanwhile: parse what is there
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  return parse_file(bytes, with_symbols);
}

Result<std::shared_ptr<const ElfImage>> ElfImage::from_memory(uint64_t base, const ReadFn& read) {
  return ElfParser::parse_memory(base, read, true);
}

Result<std::shared_ptr<const ElfImage>> ElfImage::headers_from_memory(uint64_t base, const ReadFn& read) {
  return ElfParser::parse_memory(base, read, false);
}

uint64_t ElfImage::borrowed_table_bytes() const {
  uint64_t n = 0;
  auto add = [&n](const auto& table) {
    if (table.is_borrowed()) n += table.size() * sizeof(table[0]);
  };
  add(dynsym_.entries);
  add(dynsym_.strings);
  add(gnu_.bloom);
  add(gnu_.buckets);
  add(gnu_.chain);
  add(dynsym_versym_);
  return n;
}

std::string ElfImage::build_id_hex() const { return to_hex(build_id_.data(), build_id_.size()); }

bool ElfImage::build_id_mapped_at(uint64_t bias, const ReadFn& read) const {
  if (build_id_.empty() || !build_id_note_vaddr_) return false;
  const uint64_t vaddr = *build_id_note_vaddr_;
  // The note as the file has it: header, "GNU\0", the descriptor (its
  // padding is not compared: it may lie past the segment's file part).
  Elf64_Nhdr nh{4, static_cast<Elf64_Word>(build_id_.size()), NT_GNU_BUILD_ID};
  std::vector<std::byte> want(sizeof nh + 4 + build_id_.size());
  std::memcpy(want.data(), &nh, sizeof nh);
  std::memcpy(want.data() + sizeof nh, "GNU", 4);
  std::memcpy(want.data() + sizeof nh + 4, build_id_.data(), build_id_.size());
  const LoadSegment* seg = segment_for(vaddr);
  if (seg == nullptr || !fits(vaddr - seg->vaddr, want.size(), seg->filesz)) return false;
  std::vector<std::byte> have(want.size());
  return read(bias + vaddr, have) && have == want;
}

bool ElfImage::SymbolTable::name_is(const RawSymbol& s, std::string_view want) const {
  // The parser checked that s.name starts a NUL-terminated string, so this
  // reads no further than that NUL: equal iff the first want.size() bytes
  // match and the string ends right there (want holds no NUL of its own).
  const uint64_t room = strings.size() - s.name;  // s.name < strings.size()
  return want.size() < room && std::memcmp(strings.data() + s.name, want.data(), want.size()) == 0 &&
         strings[s.name + want.size()] == std::byte{0};
}

Symbol ElfImage::SymbolTable::symbol(const RawSymbol& s, std::string_view name) const {
  Symbol out;
  out.name = std::string(name);
  out.value = s.value;
  out.size = s.size;
  out.type = s.type();
  out.bind = s.bind();
  out.shndx = s.shndx;
  return out;
}

namespace {
uint32_t symtab_hash(std::string_view key) {
  return static_cast<uint32_t>(std::hash<std::string_view>{}(key));
}
}  // namespace

const std::vector<ElfImage::SymtabSlot>& ElfImage::symtab_index() const {
  std::call_once(symtab_index_once_, [this] {
    // The keys first, in table order, so that the table can be sized to them.
    std::vector<SymtabSlot> keys;
    keys.reserve(symtab_.entries.size());
    auto key = [&](std::string_view k, size_t i) {
      // Sizes fit in 32 bits: kMaxSymbols entries, kMaxStringTable bytes.
      keys.push_back({symtab_hash(k), static_cast<uint32_t>(i + 1), static_cast<uint32_t>(k.size())});
    };
    for (size_t i = 0; i < symtab_.entries.size(); ++i) {
      const RawSymbol& s = symtab_.entries[i];
      const unsigned char type = s.type();
      if (!s.defined() || type == STT_SECTION || type == STT_FILE) continue;
      const std::string_view name = symtab_.name(s);
      if (name.empty()) continue;
      key(name, i);
      // "name@@VER" is the default version of "name"; "name@VER" is not.
      const auto at = name.find("@@");
      if (at != std::string_view::npos && at > 0) key(name.substr(0, at), i);
    }
    size_t capacity = 16;  // a power of two, at least twice the keys
    while (capacity < 2 * keys.size()) capacity *= 2;
    std::vector<SymtabSlot>& slots = symtab_index_;
    slots.assign(capacity, SymtabSlot{});
    const size_t mask = capacity - 1;
    // An equal key already present keeps its slot, except that a global or
    // weak definition beats a file-local one.
    for (const SymtabSlot& k : keys) {
      const RawSymbol& incoming = symtab_.entries[k.index - 1];
      for (size_t pos = k.hash & mask;; pos = (pos + 1) & mask) {
        SymtabSlot& slot = slots[pos];
        if (slot.index == 0) {
          slot = k;
          break;
        }
        if (slot.hash != k.hash || slot.len != k.len) continue;
        const RawSymbol& held = symtab_.entries[slot.index - 1];
        if (symtab_.name(held).substr(0, slot.len) != symtab_.name(incoming).substr(0, k.len)) continue;
        if (held.bind() == STB_LOCAL && incoming.bind() != STB_LOCAL) slot.index = k.index;
        break;
      }
    }
  });
  return symtab_index_;
}

std::optional<Symbol> ElfImage::find_in_symtab(std::string_view name) const {
  if (symtab_.entries.empty()) return std::nullopt;  // nothing to index
  const std::vector<SymtabSlot>& slots = symtab_index();
  const size_t mask = slots.size() - 1;
  const uint32_t h = symtab_hash(name);
  for (size_t pos = h & mask;; pos = (pos + 1) & mask) {  // ends: the table is at most half full
    const SymtabSlot& slot = slots[pos];
    if (slot.index == 0) return std::nullopt;
    if (slot.hash != h || slot.len != name.size()) continue;
    const RawSymbol& s = symtab_.entries[slot.index - 1];
    if (symtab_.name(s).substr(0, slot.len) == name) return symtab_.symbol(s);
  }
}

std::optional<Symbol> ElfImage::find_symbol(std::string_view name) const {
  // Stored names end at their first NUL, so a name holding one matches
  // nothing; refusing it here lets name_is compare by length.
  if (name.find('\0') != std::string_view::npos) return std::nullopt;
  // A match with a hidden version ("name@VER", not the default) is only a
  // fallback: dlsym() returns the default version when there is one.
  std::optional<size_t> hidden_match;
  auto matches = [&](size_t idx) -> bool {            // true: a default-version match, stop
    if (idx >= dynsym_.entries.size()) return false;  // hash chains are untrusted input
    const RawSymbol& s = dynsym_.entries[idx];
    if (!s.defined() || !dynsym_.name_is(s, name)) return false;
    if (hidden_version(idx)) {
      if (!hidden_match) hidden_match = idx;
      return false;
    }
    return true;
  };

  std::optional<size_t> hit;
  if (!gnu_.buckets.empty()) {
    const uint32_t h = gnu_hash(name);
    const uint64_t word = gnu_.bloom[(h / 64) & (gnu_.bloom.size() - 1)];
    const uint64_t mask = (uint64_t{1} << (h % 64)) | (uint64_t{1} << ((h >> gnu_.bloom_shift) % 64));
    if ((word & mask) == mask) {
      uint64_t idx = gnu_.buckets[h % gnu_.buckets.size()];
      if (idx >= gnu_.symoffset) {
        for (; idx - gnu_.symoffset < gnu_.chain.size(); ++idx) {
          const uint32_t h2 = gnu_.chain[idx - gnu_.symoffset];
          if ((h | 1) == (h2 | 1) && matches(idx)) {
            hit = idx;
            break;
          }
          if (h2 & 1) break;
        }
      }
    }
  } else if (!sysv_.buckets.empty()) {
    const uint32_t h = sysv_hash(name);
    uint64_t idx = sysv_.buckets[h % sysv_.buckets.size()];
    // Bounded by the chain length so that a cyclic chain cannot loop forever.
    for (size_t steps = 0; idx != STN_UNDEF && idx < sysv_.chain.size() && steps <= sysv_.chain.size();
         ++steps) {
      if (matches(idx)) {
        hit = idx;
        break;
      }
      idx = sysv_.chain[idx];
    }
  } else {
    for (size_t i = 0; i < dynsym_.entries.size(); ++i) {
      if (matches(i)) {
        hit = i;
        break;
      }
    }
  }
  if (!hit) hit = hidden_match;
  if (hit) return dynsym_.symbol(dynsym_.entries[*hit]);

  return find_in_symtab(name);
}

std::vector<Symbol> ElfImage::function_symbols() const {
  // Every defined function in table order (.dynsym, then .symtab), less any
  // that repeats the address and unversioned name of an earlier one: .symtab
  // spells versioned definitions "name@@VER" where .dynsym says "name".
  // Duplicates are found by sorting positions rather than through a set of
  // names, so that only the Symbols returned allocate.
  struct Candidate {
    uint64_t value;
    std::string_view name, key;  // key: the name without its version
    const SymbolTable* table;
    const RawSymbol* sym;
  };
  std::vector<Candidate> all;
  for (const SymbolTable* table : {&dynsym_, &symtab_}) {
    for (const RawSymbol& s : table->entries) {
      if (!s.defined() || (s.type() != STT_FUNC && s.type() != STT_GNU_IFUNC)) continue;
      const std::string_view name = table->name(s);
      all.push_back({s.value, name, unversioned(name), table, &s});
    }
  }
  std::vector<uint32_t> order(all.size());  // at most 2 * kMaxSymbols
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&all](uint32_t a, uint32_t b) {
    if (all[a].value != all[b].value) return all[a].value < all[b].value;
    if (all[a].key != all[b].key) return all[a].key < all[b].key;
    return a < b;
  });
  std::vector<bool> repeat(all.size(), false);
  for (size_t k = 1; k < order.size(); ++k) {
    const Candidate& prev = all[order[k - 1]];
    const Candidate& cur = all[order[k]];
    if (cur.value == prev.value && cur.key == prev.key) repeat[order[k]] = true;
  }
  std::vector<Symbol> out;
  out.reserve(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    if (!repeat[i]) out.push_back(all[i].table->symbol(*all[i].sym, all[i].name));
  }
  return out;
}

Result<uint64_t> ElfImage::bias_for_mapping(uint64_t map_start, uint64_t map_offset,
                                            uint64_t page_size) const {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    return Error(Errc::kInvalidArgument, "page size " + std::to_string(page_size) + " is not a power of two");
  }
  const uint64_t mask = ~(page_size - 1);
  std::optional<uint64_t> bias;
  for (const LoadSegment& seg : loads_) {
    if ((seg.offset & mask) != map_offset) continue;
    const uint64_t b = map_start - (seg.vaddr & mask);
    // Two segments can share a file page: ld places the RW segment's first
    // bytes (RELRO) in the file page that ends the previous R segment, at a
    // higher vaddr page. Both mappings then show that offset, usually both
    // r--p after RELRO's mprotect, so the mapping alone cannot tell which
    // segment it is; a guessed bias would make us call a wrong address.
    if (bias && *bias != b) {
      return parse_error(
          "file offset " + hex_addr(map_offset) +
          " begins two PT_LOAD segments, so this mapping is ambiguous; use the mapping at file "
          "offset 0 (or another offset owned by one segment)");
    }
    bias = b;
  }
  if (!bias) {
    return parse_error("no PT_LOAD segment starts at file offset " + hex_addr(map_offset) +
                       "; the mapping does not belong to this image");
  }
  return *bias;
}

const LoadSegment* ElfImage::segment_for(uint64_t vaddr) const {
  for (const LoadSegment& seg : loads_) {
    if (vaddr >= seg.vaddr && vaddr - seg.vaddr < seg.memsz) return &seg;
  }
  return nullptr;
}

InitTags read_init_tags(uint64_t dynamic, const ReadFn& read) {
  InitTags t;
  for (uint64_t i = 0; i < 1024; ++i) {
    auto addr = checked_add(dynamic, i * sizeof(Elf64_Dyn));
    if (!addr) break;
    auto d = read_pod<Elf64_Dyn>(read, *addr);
    if (!d || d->d_tag == DT_NULL) break;
    switch (d->d_tag) {
      case DT_INIT: t.init = d->d_un.d_ptr; break;
      case DT_INIT_ARRAY: t.init_array = d->d_un.d_ptr; break;
      case DT_INIT_ARRAYSZ: t.init_arraysz = d->d_un.d_val; break;
      case DT_PREINIT_ARRAY: t.preinit_array = d->d_un.d_ptr; break;
      case DT_PREINIT_ARRAYSZ: t.preinit_arraysz = d->d_un.d_val; break;
      default: break;
    }
  }
  return t;
}

Result<std::optional<std::vector<std::byte>>> find_build_id_in_notes(std::span<const std::byte> notes) {
  return walk_notes(notes, 4);
}

uint32_t gnu_hash(std::string_view name) {
  uint32_t h = 5381;
  for (unsigned char c : name) h = h * 33 + c;
  return h;
}

uint32_t sysv_hash(std::string_view name) {
  uint32_t h = 0;
  for (unsigned char c : name) {
    h = (h << 4) + c;
    uint32_t g = h & 0xf0000000u;
    if (g != 0) h ^= g >> 24;
    h &= ~g;
  }
  return h;
}

ImageCache& ImageCache::global() {
  static ImageCache* cache = new ImageCache();  // never destroyed: usable from any thread at exit
  return *cache;
}

size_t ImageCache::KeyHash::operator()(const Key& k) const {
  size_t h = std::hash<uint64_t>{}(k.dev);
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  mix(std::hash<uint64_t>{}(k.inode));
  mix(std::hash<std::string>{}(k.build_id_hex));
  return h;
}

Result<std::shared_ptr<const ElfImage>> ImageCache::get_or_load(
    const Key& key, const std::function<Result<std::shared_ptr<const ElfImage>>()>& load) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
    ++loads_;
  }
  // Loading runs unlocked: parsing libc must not stall lookups of other keys.
  auto loaded = load();
  if (!loaded.ok()) return std::move(loaded).error();
  if (!loaded.value()) return Error(Errc::kInternal, "image loader returned no image");
  std::lock_guard<std::mutex> lock(mu_);
  // One result wins: a concurrent loader that inserted first is kept.
  return map_.try_emplace(key, std::move(loaded).value()).first->second;
}

std::vector<std::shared_ptr<const ElfImage>> ImageCache::with_build_id(uint64_t dev, uint64_t inode) const {
  std::vector<std::shared_ptr<const ElfImage>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, image] : map_)
    if (key.dev == dev && key.inode == inode && !image->build_id().empty()) out.push_back(image);
  return out;
}

size_t ImageCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

uint64_t ImageCache::loads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_;
}

void ImageCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  map_.clear();
}

}  // namespace remora::elf
