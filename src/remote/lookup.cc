#include "remote/lookup.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include <linux/openat2.h>

#include "base/log.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace remora::remote {
namespace {

std::string_view basename_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// A memfd shows in maps as "/memfd:NAME (deleted)"; Remora names the memfds
// it creates "remora:BASENAME", so the library keeps its own name.
bool is_memfd(std::string_view path) { return path.substr(0, 7) == "/memfd:"; }

std::string_view match_name(std::string_view path) {
  std::string_view base = basename_of(path);
  if (is_memfd(path)) {
    base = path.substr(7);
    if (base.substr(0, 7) == "remora:") base.remove_prefix(7);
  }
  return base;
}

std::string dev_string(uint64_t dev) { return std::to_string(major(dev)) + ":" + std::to_string(minor(dev)); }

std::string identity(uint64_t dev, uint64_t inode, const std::string& build_id_hex) {
  return "device " + dev_string(dev) + " inode " + std::to_string(inode) + ", build id " +
         (build_id_hex.empty() ? std::string("none") : build_id_hex);
}

// The mapping that holds the ELF header: an offset-0 mapping of the file.
// A process may map the same file again as data (also at offset 0); the image's
// header mapping is the one closest below the file's first executable mapping.
const procfs::MapEntry* header_mapping(const MappedLibrary& lib) {
  const procfs::MapEntry* best = nullptr;
  uint64_t best_gap = UINT64_MAX;
  for (const auto& m : lib.maps) {
    if (m.offset != 0) continue;
    uint64_t gap = UINT64_MAX - 1;
    for (const auto& x : lib.maps)
      if (x.exec && x.start >= m.start) gap = std::min(gap, x.start - m.start);
    if (best == nullptr || gap < best_gap) {
      best = &m;
      best_gap = gap;
    }
  }
  return best;
}

}  // namespace

// openat2(RESOLVE_IN_ROOT) keeps every absolute or ".." symlink inside the
// target's root: a container's /lib/libc.so.6 -> /opt/x/libc.so.6 resolves to
// <root>/opt/x/libc.so.6, never to the controller's own /opt/x.
std::vector<MappedLibrary> all_libraries(const std::vector<procfs::MapEntry>& maps) {
  std::vector<MappedLibrary> libs;
  for (const auto& m : maps) {
    if (!m.file_backed() || m.path.empty() || m.path[0] != '/') continue;
    auto it = std::find_if(libs.begin(), libs.end(), [&](const MappedLibrary& l) {
      return l.dev == m.dev() && l.inode == m.inode && l.path == m.path;
    });
    if (it == libs.end()) {
      libs.push_back(MappedLibrary{m.path, m.dev(), m.inode, m.deleted, {}});
      it = libs.end() - 1;
    }
    it->maps.push_back(m);
  }
  return libs;
}

Result<MappedLibrary> find_library(pid_t pid, const std::vector<procfs::MapEntry>& maps,
                                   std::string_view name) {
  if (name.empty()) return Error(Errc::kInvalidArgument, "empty library name");
  auto libs = all_libraries(maps);
  std::vector<const MappedLibrary*> tiers[3];
  for (const auto& lib : libs) {
    if (name.find('/') != std::string_view::npos) {
      if (lib.path == name) tiers[0].push_back(&lib);
      continue;
    }
    std::string_view base = match_name(lib.path);
    if (base == name) {
      tiers[0].push_back(&lib);
    } else if (base.size() > name.size() && base.substr(0, name.size()) == name) {
      char next = base[name.size()];
      // "libc" names libc.so.6 and libc-2.36.so, not libcrypt.so.1.
      tiers[(next == '.' || next == '-' || next == '_') ? 1 : 2].push_back(&lib);
    }
  }
  for (auto& tier : tiers) {
    if (tier.empty()) continue;
    if (tier.size() == 1) return *tier[0];
    std::string list;
    for (const auto* l : tier) list += "\n  " + l->path + (l->deleted ? " (deleted)" : "");
    return Error(Errc::kAmbiguousLibrary, "library name '" + std::string(name) + "' matches " +
                                              std::to_string(tier.size()) + " mapped files in process " +
                                              std::to_string(pid) + "; give the full path of one:" + list);
  }
  std::string list;
  size_t shown = 0;
  for (const auto& l : libs) {
    if (shown++ == 12) {
      list += ", ...";
      break;
    }
    list += (shown == 1 ? "" : ", ") + std::string(basename_of(l.path));
  }
  return Error(Errc::kLibraryNotMapped, "library '" + std::string(name) + "' is not mapped in process " +
                                            std::to_string(pid) + " (mapped: " + list +
                                            "); check the name, or load the library first");
}

Result<MappedLibrary> library_at(pid_t pid, const std::vector<procfs::MapEntry>& maps, uint64_t addr) {
  for (const auto& m : maps) {
    if (addr < m.start || addr >= m.end) continue;
    if (!m.file_backed()) break;
    for (auto& lib : all_libraries(maps))
      if (lib.dev == m.dev() && lib.inode == m.inode && lib.path == m.path) return lib;
  }
  return Error(Errc::kLibraryNotMapped,
               "no file is mapped at " + hex_addr(addr) + " in process " + std::to_string(pid));
}

Result<LoadedImage> load_image(pid_t pid, const MappedLibrary& lib, const Memory& mem,
                               const LookupOptions& opts) {
  const procfs::MapEntry* hdr = header_mapping(lib);
  if (hdr == nullptr)
    return Error(Errc::kParse, lib.path + " has no mapping at file offset 0 in process " +
                                   std::to_string(pid) + ": not a loaded ELF image");
  auto read = [&mem](uint64_t addr, std::span<std::byte> out) { return mem.read(addr, out); };
  // A file this controller has parsed before (every process of a tree maps
  // the same libc): one read of its Build ID note, where this mapping puts
  // it, proves the image is that build, as the headers' own note would.
  // (A memfd is new in every process: its images are cached by Build ID.)
  if (!is_memfd(lib.path))
    for (auto& cached : elf::ImageCache::global().with_build_id(lib.dev, lib.inode))
      if (auto bias = cached->bias_for_mapping(hdr->start, hdr->offset);
          bias && cached->build_id_mapped_at(*bias, read))
        return LoadedImage{std::move(cached), *bias, OpenRoute::kCache};
  auto in_memory = REMORA_TRY_CTX(elf::ElfImage::headers_from_memory(hdr->start, read),
                                  "read the image of " + lib.path + " from process " + std::to_string(pid));
  const std::string mem_build_id = in_memory->build_id_hex();

  OpenRoute route = OpenRoute::kCache;
  auto loader = [&]() -> Result<std::shared_ptr<const elf::ElfImage>> {
    if (opts.use_map_files) {
      char name[96];
      std::snprintf(name, sizeof name, "/proc/%d/map_files/%llx-%llx", pid,
                    static_cast<unsigned long long>(hdr->start), static_cast<unsigned long long>(hdr->end));
      int fd = ::open(name, O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        UniqueFd f(fd);
        struct stat st {};
        if (::fstat(f.get(), &st) == 0 && st.st_dev == lib.dev && st.st_ino == lib.inode) {
          route = OpenRoute::kMapFiles;
          return elf::ElfImage::from_fd(f.get());
        }
      }
      // EPERM/EACCES (map_files needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE
      // in the initial user namespace) or an unexpected identity: fall back.
      REMORA_LOG(kElf, "map_files route unavailable for %s (%s), using the target's root", lib.path.c_str(),
                 fd >= 0 ? "identity differs" : std::strerror(errno));
    }
    if (is_memfd(lib.path)) {
      // A memfd has no path to open: its image in memory is the only copy,
      // and by definition the one mapped.
      route = OpenRoute::kMemory;
      return elf::ElfImage::from_memory(hdr->start, read);
    }
    auto opened = open_in_root(pid, lib.path);
    if (!opened && opened.error().sys_errno() == ENOENT) {
      // A process that only chroot()ed (no pivot_root) shows paths of our
      // side in its maps: /srv/root/lib/x.so for its /lib/x.so. Retry with
      // the root's own prefix removed.
      char root[PATH_MAX];
      std::string link = "/proc/" + std::to_string(pid) + "/root";
      ssize_t n = ::readlink(link.c_str(), root, sizeof root - 1);
      if (n > 1) {
        std::string prefix(root, static_cast<size_t>(n));
        if (lib.path.size() > prefix.size() && lib.path.compare(0, prefix.size(), prefix) == 0 &&
            lib.path[prefix.size()] == '/')
          opened = open_in_root(pid, lib.path.substr(prefix.size()));
      }
    }
    if (!opened && opened.error().sys_errno() == ENOENT && lib.deleted) {
      // Deleted since it was loaded (a copy Remora placed in a root without
      // /proc, see remote/visible_file.h, or any library removed after its
      // load): as for a memfd, the image in memory is the one mapped.
      route = OpenRoute::kMemory;
      return elf::ElfImage::from_memory(hdr->start, read);
    }
    UniqueFd f = REMORA_TRY_CTX(
        std::move(opened), lib.deleted ? "the mapped file " + lib.path + " was deleted" : "open mapped file");
    struct stat st {};
    if (::fstat(f.get(), &st) != 0) return Error::from_errno("fstat " + lib.path);
    if (!S_ISREG(st.st_mode))
      return Error(Errc::kIdentityMismatch, lib.path + " inside the root of process " + std::to_string(pid) +
                                                " is not a regular file; refusing to read it");
    auto image = REMORA_TRY(elf::ElfImage::from_fd(f.get()));
    route = OpenRoute::kRootPath;
    const std::string file_build_id = image->build_id_hex();
    // Same device and inode is not proof on OverlayFS: a file rewritten in
    // place through the merged view is copied up and keeps its inode number,
    // while the process still maps the old lower file. Where both sides have
    // a Build ID it must agree even then.
    bool ids_conflict = !mem_build_id.empty() && !file_build_id.empty() && mem_build_id != file_build_id;
    if (st.st_dev == lib.dev && st.st_ino == lib.inode && !ids_conflict) return image;
    // Different device/inode: OverlayFS shows another identity for the same
    // file depending on how it is opened. Only an equal GNU Build ID proves
    // that this file is the image the target mapped.
    std::string why;
    if (mem_build_id.empty() && file_build_id.empty())
      why = "neither has a GNU Build ID to prove they are the same build";
    else if (mem_build_id.empty() || file_build_id.empty())
      why = "only one of them has a GNU Build ID";
    else if (mem_build_id != file_build_id)
      why = "their Build IDs differ: the file was replaced by another build after the process loaded it";
    if (!why.empty())
      return Error(Errc::kIdentityMismatch,
                   "refusing " + lib.path + " inside the root of process " + std::to_string(pid) + " (" +
                       identity(st.st_dev, st.st_ino, file_build_id) + ") for the mapped image (" +
                       identity(lib.dev, lib.inode, mem_build_id) + "): " + why +
                       (lib.deleted ? "; the mapped file was deleted" : ""));
    return image;
  };
  // A memfd's identity is new in every process (Remora's agent and tools
  // reach containers as memfds: remote/visible_file.h), so (device, inode)
  // would never hit and a tree of 32 would read the same image from memory
  // 32 times. Its Build ID names its contents: two memfds with the same one
  // hold the same build. (Without a Build ID: per memfd, as before.)
  const bool by_build_id = is_memfd(lib.path) && !mem_build_id.empty();
  elf::ImageCache::Key key = by_build_id ? elf::ImageCache::Key{0, 0, "memfd:" + mem_build_id}
                                         : elf::ImageCache::Key{lib.dev, lib.inode, mem_build_id};
  auto image = REMORA_TRY(elf::ImageCache::global().get_or_load(key, loader));

  // The bias: from the header mapping, confirmed by the executable mapping.
  uint64_t bias = REMORA_TRY_CTX(image->bias_for_mapping(hdr->start, hdr->offset),
                                 "compute the load bias of " + lib.path);
  return LoadedImage{std::move(image), bias, route};
}

Result<LoadedImage> load_image(pid_t pid, const MappedLibrary& lib, const Memory& mem,
                               const LookupOptions& opts, ImageMemo* memo) {
  if (memo == nullptr) return load_image(pid, lib, mem, opts);
  const procfs::MapEntry* hdr = header_mapping(lib);
  auto key = std::make_tuple(lib.dev, lib.inode, hdr ? hdr->start : 0);
  if (auto it = memo->find(key); it != memo->end()) return it->second;
  LoadedImage loaded = REMORA_TRY(load_image(pid, lib, mem, opts));
  (*memo)[key] = loaded;
  return loaded;
}

namespace {

Result<ResolvedSymbol> lookup_in(pid_t pid, const Memory& mem, const MappedLibrary& lib,
                                 std::string_view symbol, const LookupOptions& opts, bool want_code,
                                 bool* found, ImageMemo* memo) {
  *found = false;
  LoadedImage loaded = REMORA_TRY(load_image(pid, lib, mem, opts, memo));
  auto sym = loaded.image->find_symbol(symbol);
  if (!sym) return ResolvedSymbol{};
  *found = true;
  uint64_t addr = loaded.bias + sym->value;
  bool exec = false, mapped = false;
  for (const auto& m : lib.maps) {
    exec |= m.exec && addr >= m.start && addr < m.end;
    mapped |= addr >= m.start && addr < m.end;
  }
  if (!want_code) {
    // .bss lies past the file-backed mappings (in an anonymous one): a
    // variable is valid when a PT_LOAD segment covers it.
    if (!mapped && loaded.image->segment_for(sym->value) != nullptr) mapped = true;
    if (!mapped)
      return Error(Errc::kSymbolNotFound, "symbol '" + std::string(symbol) + "' of " + lib.path + " at " +
                                              hex_addr(addr) + " lies outside the library's mappings");
    return ResolvedSymbol{addr, false, lib.path};
  }
  if (!exec)
    return Error(Errc::kInvalidArgument, "symbol '" + std::string(symbol) + "' of " + lib.path + " at " +
                                             hex_addr(addr) +
                                             " is not in an executable mapping (it is data, not a function)");
  return ResolvedSymbol{addr, sym->type == STT_GNU_IFUNC, lib.path};
}

}  // namespace

Result<ResolvedSymbol> resolve_in_library(pid_t pid, const Memory& mem, const MappedLibrary& lib,
                                          std::string_view symbol, const LookupOptions& opts, bool want_code,
                                          ImageMemo* memo) {
  if (symbol.empty()) return Error(Errc::kInvalidArgument, "empty symbol name");
  bool found = false;
  auto r = REMORA_TRY(lookup_in(pid, mem, lib, symbol, opts, want_code, &found, memo));
  if (!found)
    return Error(Errc::kSymbolNotFound, "symbol '" + std::string(symbol) + "' is not defined in " + lib.path +
                                            " (searched .dynsym and .symtab); check the spelling, or whether "
                                            "it is a C++ name that needs its mangled form");
  return r;
}

Result<ResolvedSymbol> resolve_symbol(pid_t pid, const Memory& mem, std::string_view library,
                                      std::string_view symbol, uint64_t main_phdr, const LookupOptions& opts,
                                      bool want_code, const std::vector<procfs::MapEntry>* given_maps,
                                      ImageMemo* memo) {
  if (symbol.empty()) return Error(Errc::kInvalidArgument, "empty symbol name");
  std::vector<procfs::MapEntry> read_maps;
  if (given_maps == nullptr) read_maps = REMORA_TRY(procfs::read_maps(pid));
  const auto& maps = given_maps ? *given_maps : read_maps;
  bool found = false;
  if (!library.empty()) {
    auto lib = REMORA_TRY(find_library(pid, maps, library));
    return resolve_in_library(pid, mem, lib, symbol, opts, want_code, memo);
  }
  std::vector<MappedLibrary> order;
  if (auto main = library_at(pid, maps, main_phdr)) order.push_back(*main);
  for (auto& lib : all_libraries(maps))
    if (order.empty() || lib.inode != order[0].inode || lib.dev != order[0].dev)
      order.push_back(std::move(lib));
  size_t searched = 0;
  for (const auto& lib : order) {
    auto r = lookup_in(pid, mem, lib, symbol, opts, want_code, &found, memo);
    if (!r && !found) continue;  // not an ELF image we can read (a data file): skip
    ++searched;
    if (found) return r;
  }
  return Error(Errc::kSymbolNotFound,
               "symbol '" + std::string(symbol) + "' is not defined in the executable or in any of the " +
                   std::to_string(searched) + " libraries loaded by process " + std::to_string(pid));
}

}  // namespace remora::remote
