// Finding a library and a symbol in another process.
//
//  1. Find the library's mappings in the target's maps (exact path, soname /
//     basename, or basename prefix); more than one distinct file matching at
//     the best level is an ambiguity, refused with the candidates listed.
//  2. Read the image's GNU Build ID from the target's memory (the PT_NOTE
//     inside its first PT_LOAD), which keys the process-wide ImageCache
//     together with the mapping's device and inode. A file cached already
//     (every process of a tree maps the same libc) needs one read: its
//     image is taken when its own Build ID note is where this mapping puts
//     it (ElfImage::build_id_mapped_at); any other build of the file, the
//     headers are read as for a first lookup.
//  3. On a cache miss, open the exact mapped file: /proc/PID/map_files/<range>
//     with a strict device/inode check; when that is not allowed, the mapped
//     path resolved *inside* the target's root (/proc/PID/root, openat2 with
//     RESOLVE_IN_ROOT, so no symlink can lead out to a file of ours). A file
//     whose device/inode differ (OverlayFS) is accepted only when its Build ID
//     equals the in-memory one.
//  4. Compute the load bias from the PT_LOAD mappings, look the symbol up, and
//     check that the address lies in an executable mapping of that file.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"
#include "elf/elf_image.h"
#include "procfs/procfs.h"
#include "remote/memory.h"

namespace remora::remote {

// The mappings of one file in the target.
struct MappedLibrary {
  std::string path;  // as the target sees it
  uint64_t dev = 0, inode = 0;
  bool deleted = false;
  std::vector<procfs::MapEntry> maps;  // in address order
};

// How the image file was opened (for messages and tests).
enum class OpenRoute { kMapFiles, kRootPath, kMemory, kCache };

struct LoadedImage {
  std::shared_ptr<const elf::ElfImage> image;
  uint64_t bias = 0;
  OpenRoute route = OpenRoute::kCache;
};

struct ResolvedSymbol {
  uint64_t address = 0;
  bool ifunc = false;  // address is an IFUNC resolver: call it to get the function
  std::string library;
};

struct LookupOptions {
  // Tests set this to exercise the /proc/PID/root fallback.
  bool use_map_files = true;
};

// Opens `path` (read-only) inside process `pid`'s root: procfs::open_in_root.
using procfs::open_in_root;

// Finds a library by name. See the header comment for the rules.
Result<MappedLibrary> find_library(pid_t pid, const std::vector<procfs::MapEntry>& maps,
                                   std::string_view name);
// The file that contains `addr`, if any.
Result<MappedLibrary> library_at(pid_t pid, const std::vector<procfs::MapEntry>& maps, uint64_t addr);
// All file-backed ELF-looking libraries in map order (one entry per file).
std::vector<MappedLibrary> all_libraries(const std::vector<procfs::MapEntry>& maps);

Result<LoadedImage> load_image(pid_t pid, const MappedLibrary& lib, const Memory& mem,
                               const LookupOptions& opts);

// Resolves `symbol` in `library` (empty: the main executable, then every
// library in map order). `main_phdr` is AT_PHDR from the auxv, which
// identifies the main executable's mapping.
// `want_code`: the address must lie in an executable mapping (a function);
// false accepts any mapping of the library (a variable).
// Images already identified in one session, keyed by (device, inode, start
// of the header mapping): the same mapping needs no second look.
using ImageMemo = std::map<std::tuple<uint64_t, uint64_t, uint64_t>, LoadedImage>;
// load_image, through `memo` when given.
Result<LoadedImage> load_image(pid_t pid, const MappedLibrary& lib, const Memory& mem,
                               const LookupOptions& opts, ImageMemo* memo);
// `symbol` in one library already found by find_library, as resolve_symbol
// would resolve it there: for a series of lookups in one library, which then
// go through the maps once (a large process has thousands of mappings).
Result<ResolvedSymbol> resolve_in_library(pid_t pid, const Memory& mem, const MappedLibrary& lib,
                                          std::string_view symbol, const LookupOptions& opts,
                                          bool want_code = true, ImageMemo* memo = nullptr);
// `maps`: the maps just read (nullptr: read them); `memo`: optional.
Result<ResolvedSymbol> resolve_symbol(pid_t pid, const Memory& mem, std::string_view library,
                                      std::string_view symbol, uint64_t main_phdr, const LookupOptions& opts,
                                      bool want_code = true,
                                      const std::vector<procfs::MapEntry>* maps = nullptr,
                                      ImageMemo* memo = nullptr);

}  // namespace remora::remote
