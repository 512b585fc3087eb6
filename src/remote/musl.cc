#include "remote/musl.h"

#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"

namespace remora::remote {

namespace {

std::string_view basename_of(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// musl's loader, which is also its libc: ld-musl-ARCH.so.1 (Alpine also
// names it libc.musl-ARCH.so.1).
bool is_musl_name(std::string_view name) {
  return (name.rfind("ld-musl-", 0) == 0 || name.rfind("libc.musl-", 0) == 0) && name.size() > 5 &&
         name.substr(name.size() - 5) == ".so.1";
}

}  // namespace

bool maps_glibc(std::span<const procfs::MapEntry> maps) {
  for (const auto& m : maps)
    if (m.file_backed() && basename_of(m.path) == "libc.so.6") return true;
  return false;
}

std::optional<std::string> musl_loader(std::string_view interpreter, std::span<const procfs::MapEntry> maps) {
  // glibc's libc, whatever loader maps it (gcompat provides one too: let
  // the calls try).
  if (maps_glibc(maps)) return std::nullopt;
  if (is_musl_name(basename_of(interpreter))) return std::string(basename_of(interpreter));
  for (const auto& m : maps)
    if (m.file_backed() && is_musl_name(basename_of(m.path))) return std::string(basename_of(m.path));
  return std::nullopt;
}

Result<std::string> program_interpreter(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/exe";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::from_errno("open " + path);
  Elf64_Ehdr eh{};
  if (::pread(fd.get(), &eh, sizeof eh, 0) != static_cast<ssize_t>(sizeof eh) ||
      std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256)
    return std::string();  // not a 64-bit ELF we can read: say nothing
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  const auto want = static_cast<ssize_t>(ph.size() * sizeof(Elf64_Phdr));
  if (::pread(fd.get(), ph.data(), static_cast<size_t>(want), static_cast<off_t>(eh.e_phoff)) != want)
    return std::string();
  for (const auto& p : ph) {
    if (p.p_type != PT_INTERP || p.p_filesz == 0 || p.p_filesz > 4096) continue;
    std::string interp(p.p_filesz, '\0');
    if (::pread(fd.get(), interp.data(), interp.size(), static_cast<off_t>(p.p_offset)) !=
        static_cast<ssize_t>(interp.size()))
      return std::string();
    interp.resize(std::strlen(interp.c_str()));
    return interp;
  }
  return std::string();
}

Error musl_error(const std::string& process, const std::string& loader) {
  return Error(Errc::kNotSupported,
               process + " uses musl libc (" + loader +
                   "): Remora's remote calls, agent and tools need glibc (libc.so.6, " + kGlibcNeeded +
                   " or newer); attach to a glibc process, or run the program built against glibc (for "
                   "example from a Debian- or Ubuntu-based image instead of Alpine)");
}

}  // namespace remora::remote
