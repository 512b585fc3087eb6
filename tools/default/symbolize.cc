#include "symbolize.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace remora_tool {

struct Symbolizer::Object {
  std::string path;   // for opening
  std::string label;  // base name, for "lib+0x..."
  uintptr_t base = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // PT_LOAD, absolute
  bool loaded = false;
  struct Sym {
    uint64_t value, size;
    std::string name;
  };
  std::vector<Sym> syms;  // sorted by value (link-time addresses)

  bool contains(uintptr_t pc) const {
    for (const auto& [s, e] : ranges)
      if (pc >= s && pc < e) return true;
    return false;
  }

  void load() {
    loaded = true;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
      close(fd);
      return;
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return;
    const char* img = static_cast<const char*>(map);
    auto* eh = reinterpret_cast<const Elf64_Ehdr*>(img);
    bool ok = memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
              eh->e_shoff != 0 && eh->e_shentsize == sizeof(Elf64_Shdr) &&
              eh->e_shoff + static_cast<uint64_t>(eh->e_shnum) * sizeof(Elf64_Shdr) <= size;
    if (ok) {
      auto* sh = reinterpret_cast<const Elf64_Shdr*>(img + eh->e_shoff);
      // Prefer .symtab (static functions too); fall back to .dynsym.
      for (uint32_t want : {static_cast<uint32_t>(SHT_SYMTAB), static_cast<uint32_t>(SHT_DYNSYM)}) {
        for (int i = 0; i < eh->e_shnum && syms.empty(); ++i) {
          if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum) continue;
          const Elf64_Shdr& strs = sh[sh[i].sh_link];
          if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
          auto* sym = reinterpret_cast<const Elf64_Sym*>(img + sh[i].sh_offset);
          size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
          for (size_t k = 0; k < n; ++k) {
            int type = ELF64_ST_TYPE(sym[k].st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym[k].st_shndx == SHN_UNDEF ||
                sym[k].st_value == 0)
              continue;
            if (sym[k].st_name >= strs.sh_size) continue;
            const char* nm = img + strs.sh_offset + sym[k].st_name;
            size_t len = strnlen(nm, strs.sh_size - sym[k].st_name);
            syms.push_back({sym[k].st_value, sym[k].st_size, std::string(nm, len)});
          }
        }
        if (!syms.empty()) break;
      }
    }
    munmap(map, size);
    std::sort(syms.begin(), syms.end(), [](const Sym& a, const Sym& b) {
      if (a.value != b.value) return a.value < b.value;
      return a.size > b.size;  // prefer the sized symbol among aliases
    });
  }

  const Sym* find(uintptr_t pc) {
    if (!loaded) load();
    uint64_t off = pc - base;
    auto it =
        std::upper_bound(syms.begin(), syms.end(), off, [](uint64_t v, const Sym& s) { return v < s.value; });
    if (it == syms.begin()) return nullptr;
    // Among the symbols starting at or before `off`, the nearest that
    // contains it (aliases share a start).
    auto prev = it - 1;
    uint64_t start = prev->value;
    for (auto j = prev;; --j) {
      if (j->value != start) break;
      if (j->size == 0 || off < j->value + j->size) return &*j;
      if (j == syms.begin()) break;
    }
    return nullptr;
  }
};

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) {
      std::string out = d;
      free(d);
      return out;
    }
    free(d);
  }
  return name;
}

Symbolizer::Symbolizer() {
  Dl_info me;
  if (dladdr(reinterpret_cast<void*>(&demangle), &me) != 0)
    self_base_ = reinterpret_cast<uintptr_t>(me.dli_fbase);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* self = static_cast<std::vector<std::unique_ptr<Object>>*>(data);
        auto o = std::make_unique<Object>();
        bool main = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
        o->path = main ? "/proc/self/exe" : info->dlpi_name;
        if (main) {
          char buf[4096];
          ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
          o->label = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "[main]";
        } else {
          o->label = info->dlpi_name;
        }
        size_t slash = o->label.rfind('/');
        if (slash != std::string::npos) o->label = o->label.substr(slash + 1);
        o->base = info->dlpi_addr;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD)
            o->ranges.emplace_back(info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        // The vDSO has no file: dladdr names its symbols.
        if (o->label.rfind("linux-vdso", 0) == 0 || o->label.rfind("linux-gate", 0) == 0) o->loaded = true;
        self->push_back(std::move(o));
        return 0;
      },
      &objects_);
}

Symbolizer::~Symbolizer() = default;

bool Symbolizer::in_tool(uint64_t pc) const {
  for (const auto& o : objects_)
    if (o->base == self_base_ && o->contains(pc)) return true;
  return false;
}

std::string Symbolizer::name(uint64_t pc) {
  auto hit = cache_.find(pc);
  if (hit != cache_.end()) return hit->second;
  std::string out;
  Object* obj = nullptr;
  for (auto& o : objects_)
    if (o->contains(pc)) {
      obj = o.get();
      break;
    }
  if (obj != nullptr) {
    if (const Object::Sym* s = obj->find(pc)) out = demangle(s->name.c_str());
  }
  if (out.empty()) {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(pc), &info) != 0 && info.dli_sname != nullptr) {
      out = demangle(info.dli_sname);
    } else if (obj != nullptr) {
      char buf[64];
      snprintf(buf, sizeof buf, "+0x%lx", static_cast<unsigned long>(pc - obj->base));
      out = obj->label + buf;
    } else {
      char buf[64];
      snprintf(buf, sizeof buf, "[unknown]+0x%lx", static_cast<unsigned long>(pc));
      out = buf;
    }
  }
  cache_.emplace(pc, out);
  return out;
}

}  // namespace remora_tool
