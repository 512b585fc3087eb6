#include "profile/plt.h"

#include <gelf.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string_view>
#include <unordered_map>

#include "arch/plt.h"

namespace remora::profile {
namespace {

// The function symbols of the object by address (.dynsym, then .symtab):
// what an IRELATIVE slot's addend (its ifunc resolver) is called.
std::unordered_map<uint64_t, std::string> functions_by_address(Elf* elf) {
  std::unordered_map<uint64_t, std::string> out;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || (sh.sh_type != SHT_DYNSYM && sh.sh_type != SHT_SYMTAB) ||
        sh.sh_entsize == 0)
      continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    for (size_t i = 1; data != nullptr && i < sh.sh_size / sh.sh_entsize; ++i) {
      GElf_Sym s;
      if (gelf_getsym(data, static_cast<int>(i), &s) == nullptr) break;
      const int type = GELF_ST_TYPE(s.st_info);
      if (s.st_value == 0 || (type != STT_FUNC && type != STT_GNU_IFUNC)) continue;
      const char* name = elf_strptr(elf, sh.sh_link, s.st_name);
      if (name != nullptr && *name != '\0') out.emplace(s.st_value, name);
    }
  }
  return out;
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// GOT slot -> the symbol its relocation names, from every SHT_RELA section
// that refers to a symbol table (.rela.plt: JUMP_SLOT; .rela.dyn: GLOB_DAT,
// the slots .plt.got jumps through). A slot whose relocation names no
// symbol (IRELATIVE: an ifunc's) is named after the function at its addend,
// else "*ABS*+0xADDEND" as objdump writes it.
std::unordered_map<uint64_t, std::string> slot_names(Elf* elf) {
  std::unordered_map<uint64_t, std::string> out;
  std::unordered_map<uint64_t, std::string> functions;
  bool functions_read = false;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_RELA || sh.sh_link == 0) continue;
    Elf_Scn* symscn = elf_getscn(elf, sh.sh_link);
    GElf_Shdr symsh;
    Elf_Data* rel = elf_getdata(scn, nullptr);
    Elf_Data* syms = symscn != nullptr ? elf_getdata(symscn, nullptr) : nullptr;
    if (rel == nullptr || syms == nullptr || gelf_getshdr(symscn, &symsh) == nullptr ||
        (symsh.sh_type != SHT_DYNSYM && symsh.sh_type != SHT_SYMTAB) || sh.sh_entsize == 0)
      continue;
    const size_t n = sh.sh_size / sh.sh_entsize;
    for (size_t i = 0; i < n; ++i) {
      GElf_Rela r;
      GElf_Sym s;
      if (gelf_getrela(rel, static_cast<int>(i), &r) == nullptr) break;
      const size_t sym = GELF_R_SYM(r.r_info);
      if (sym == 0) {
        if (r.r_addend == 0) continue;
        if (!functions_read) {
          functions = functions_by_address(elf);
          functions_read = true;
        }
        const auto addend = static_cast<uint64_t>(r.r_addend);
        auto f = functions.find(addend);
        out.emplace(r.r_offset, f != functions.end() ? f->second : "*ABS*+" + hex(addend));
        continue;
      }
      if (gelf_getsym(syms, static_cast<int>(sym), &s) == nullptr) continue;
      const char* name = elf_strptr(elf, symsh.sh_link, s.st_name);
      if (name != nullptr && *name != '\0') out.emplace(r.r_offset, name);
    }
  }
  return out;
}

bool is_plt_section(std::string_view name) {
  return name == ".plt" || name == ".plt.sec" || name == ".plt.got";
}

}  // namespace

std::vector<PltEntry> plt_entries(Elf* elf) {
  std::vector<PltEntry> out;
  GElf_Ehdr eh;
  size_t shstrndx = 0;
  if (elf == nullptr || gelf_getehdr(elf, &eh) == nullptr || elf_getshdrstrndx(elf, &shstrndx) != 0)
    return out;
  std::unordered_map<uint64_t, std::string> names;
  bool names_read = false;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_PROGBITS) continue;
    const char* name = elf_strptr(elf, shstrndx, sh.sh_name);
    if (name == nullptr || !is_plt_section(name)) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr || data->d_size < sh.sh_size) continue;
    if (!names_read) {
      names = slot_names(elf);
      names_read = true;
    }
    // GNU ld sets each PLT section's entry size (16; 8 for a .plt.got
    // without IBT); 16 where it did not.
    const uint64_t step = sh.sh_entsize != 0 ? sh.sh_entsize : 16;
    std::span<const uint8_t> bytes(static_cast<const uint8_t*>(data->d_buf), sh.sh_size);
    for (uint64_t off = 0; off + step <= sh.sh_size; off += step) {
      auto slot = arch::plt_entry_slot(eh.e_machine, bytes.subspan(off, step), sh.sh_addr + off);
      if (!slot) continue;
      auto it = names.find(*slot);
      if (it != names.end()) out.push_back({sh.sh_addr + off, sh.sh_addr + off + step, it->second + "@plt"});
    }
  }
  std::sort(out.begin(), out.end(), [](const PltEntry& a, const PltEntry& b) { return a.start < b.start; });
  return out;
}

const PltEntry* plt_entry_at(const std::vector<PltEntry>& entries, uint64_t vaddr) {
  auto it = std::upper_bound(entries.begin(), entries.end(), vaddr,
                             [](uint64_t v, const PltEntry& e) { return v < e.start; });
  if (it == entries.begin()) return nullptr;
  --it;
  return vaddr < it->end ? &*it : nullptr;
}

}  // namespace remora::profile
