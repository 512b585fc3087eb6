#include "tracer.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <unordered_map>

#include "../../src/arch/relocs.h"  // header-only, by path: see slots.h
#include "slots.h"
#include "wrappers.h"

// ---- recording (async-signal-safe) ----

extern "C" void remora_record_call(uint32_t fn, uint64_t start_ns, uint64_t end_ns) {
  using namespace remora_tool;
  if (fn >= kMaxFuncs) return;
  Slot* s = slot_enter_current();
  if (s == nullptr) return;
  SlotMem* m = s->mem;
  uint64_t dur = end_ns - start_ns;
  FuncCounters& f = m->funcs[fn];
  f.calls.fetch_add(1, std::memory_order_relaxed);
  f.total_ns.fetch_add(dur, std::memory_order_relaxed);
  uint64_t max = f.max_ns.load(std::memory_order_relaxed);
  while (dur > max && !f.max_ns.compare_exchange_weak(max, dur, std::memory_order_relaxed)) {
  }
  uint64_t head = m->call_head.load(std::memory_order_relaxed);
  uint64_t tail = m->call_tail.load(std::memory_order_acquire);
  // Headroom of 8 for records reserved re-entrantly (a signal handler of the
  // application calling a traced function while this thread records).
  if (head - tail >= kCallRingSize - 8) {
    m->calls_dropped.fetch_add(1, std::memory_order_relaxed);
  } else {
    uint64_t pos = m->call_head.fetch_add(1, std::memory_order_relaxed);
    CallRec& r = m->calls[pos % kCallRingSize];
    r.start_ns = start_ns;
    r.dur_ns = dur;
    r.fn = fn;
    r.seq.store(pos + 1, std::memory_order_release);
  }
  slot_leave(s);
}

namespace remora_tool {

namespace {

struct MapRange {
  uintptr_t start, end;
  int prot;
};

std::vector<MapRange> read_maps() {
  std::vector<MapRange> out;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  std::string text;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    unsigned long s = 0, e = 0;
    char perms[8] = {};
    if (sscanf(line.c_str(), "%lx-%lx %7s", &s, &e, perms) != 3) continue;
    int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
               (perms[2] == 'x' ? PROT_EXEC : 0);
    out.push_back({s, e, prot});
  }
  return out;
}

int prot_of(const std::vector<MapRange>& maps, uintptr_t addr) {
  for (const auto& m : maps)
    if (addr >= m.start && addr < m.end) return m.prot;
  return -1;
}

// Writes `value` into `slot` if it still holds `expected`, making the page
// writable for the store when it is not. Returns true when it wrote.
bool store_slot(void** slot, void* expected, void* value, const std::vector<MapRange>& maps) {
  uintptr_t page = reinterpret_cast<uintptr_t>(slot) & ~static_cast<uintptr_t>(getpagesize() - 1);
  int prot = prot_of(maps, reinterpret_cast<uintptr_t>(slot));
  if (prot < 0) return false;
  bool made_writable = false;
  if (!(prot & PROT_WRITE)) {
    if (mprotect(reinterpret_cast<void*>(page), static_cast<size_t>(getpagesize()), prot | PROT_WRITE) != 0)
      return false;
    made_writable = true;
  }
  // An aligned 8-byte compare-and-swap (single-copy atomic on x86_64 and
  // aarch64): a thread calling through the slot concurrently (a PLT entry's
  // one load of it) sees either the old or the new target.
  bool ok = __atomic_compare_exchange_n(slot, &expected, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  if (made_writable) mprotect(reinterpret_cast<void*>(page), static_cast<size_t>(getpagesize()), prot);
  return ok;
}

std::string base_name(const char* path) {
  const char* slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

// Objects whose slots are never patched.
bool skipped_object(const std::string& base) {
  static const char* const kSkip[] = {"libremora-tool", "libremora-agent", "libunwind", "liblzma", "ld-linux",
                                      "linux-vdso",     "linux-gate",      "libc.so",   "libc-"};
  for (const char* s : kSkip)
    if (base.compare(0, strlen(s), s) == 0) return true;
  return false;
}

uintptr_t self_base() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&self_base), &info) == 0) return 0;
  return reinterpret_cast<uintptr_t>(info.dli_fbase);
}

struct DynInfo {
  const ElfW(Sym) * symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela) * jmprel = nullptr;
  size_t jmprel_size = 0;
  bool pltrel_is_rela = true;
  const ElfW(Rela) * rela = nullptr;
  size_t rela_size = 0;
  size_t rela_ent = sizeof(ElfW(Rela));
  const ElfW(Versym) * versym = nullptr;
  const ElfW(Verneed) * verneed = nullptr;
  size_t verneed_num = 0;
};

// glibc relocates the d_ptr entries of a writable .dynamic in place (adds the
// load bias) for most objects, not for the vDSO nor on every architecture:
// a value below the bias is still an offset.
template <typename T>
const T* dyn_ptr(ElfW(Addr) value, uintptr_t base) {
  uintptr_t v = value;
  if (base != 0 && v < base) v += base;
  return reinterpret_cast<const T*>(v);
}

DynInfo read_dynamic(const dl_phdr_info* info) {
  DynInfo d;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  if (dyn == nullptr) return d;
  uintptr_t base = info->dlpi_addr;
  for (; dyn->d_tag != DT_NULL; ++dyn) {
    switch (dyn->d_tag) {
      case DT_SYMTAB: d.symtab = dyn_ptr<ElfW(Sym)>(dyn->d_un.d_ptr, base); break;
      case DT_STRTAB: d.strtab = dyn_ptr<char>(dyn->d_un.d_ptr, base); break;
      case DT_JMPREL: d.jmprel = dyn_ptr<ElfW(Rela)>(dyn->d_un.d_ptr, base); break;
      case DT_PLTRELSZ: d.jmprel_size = dyn->d_un.d_val; break;
      case DT_PLTREL: d.pltrel_is_rela = dyn->d_un.d_val == DT_RELA; break;
      case DT_RELA: d.rela = dyn_ptr<ElfW(Rela)>(dyn->d_un.d_ptr, base); break;
      case DT_RELASZ: d.rela_size = dyn->d_un.d_val; break;
      case DT_RELAENT: d.rela_ent = dyn->d_un.d_val; break;
      case DT_VERSYM: d.versym = dyn_ptr<ElfW(Versym)>(dyn->d_un.d_ptr, base); break;
      case DT_VERNEED: d.verneed = dyn_ptr<ElfW(Verneed)>(dyn->d_un.d_ptr, base); break;
      case DT_VERNEEDNUM: d.verneed_num = dyn->d_un.d_val; break;
      default: break;
    }
  }
  return d;
}

// The version a symbol reference asks for ("GLIBC_2.3.2"), or nullptr.
const char* required_version(const DynInfo& d, uint32_t symidx) {
  if (d.versym == nullptr || d.verneed == nullptr) return nullptr;
  uint16_t v = d.versym[symidx] & 0x7fff;
  if (v < 2) return nullptr;
  const ElfW(Verneed)* vn = d.verneed;
  for (size_t i = 0; i < d.verneed_num; ++i) {
    const ElfW(Vernaux)* aux =
        reinterpret_cast<const ElfW(Vernaux)*>(reinterpret_cast<const char*>(vn) + vn->vn_aux);
    for (unsigned j = 0; j < vn->vn_cnt; ++j) {
      if (aux->vna_other == v) return d.strtab + aux->vna_name;
      aux = reinterpret_cast<const ElfW(Vernaux)*>(reinterpret_cast<const char*>(aux) + aux->vna_next);
    }
    if (vn->vn_next == 0) break;
    vn = reinterpret_cast<const ElfW(Verneed)*>(reinterpret_cast<const char*>(vn) + vn->vn_next);
  }
  return nullptr;
}

bool in_object(const dl_phdr_info* info, uintptr_t addr) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    uintptr_t s = info->dlpi_addr + ph.p_vaddr;
    if (addr >= s && addr < s + ph.p_memsz) return true;
  }
  return false;
}

struct PatchPass {
  Tracer* tracer;
  std::unordered_map<std::string, uint32_t> wanted;  // symbol -> fn id
  std::vector<std::pair<uintptr_t, std::string>>* patched_objects;
  std::vector<PatchedSlot>* slots;
  std::vector<std::string>* warnings;
  uintptr_t self;
  int count = 0;
  unsigned long long adds = 0, subs = 0;
};

void patch_relocs(PatchPass& p, const dl_phdr_info* info, const DynInfo& d, const ElfW(Rela) * rel,
                  size_t size, size_t ent, const std::string& obj, std::vector<MapRange>* maps) {
  if (rel == nullptr || d.symtab == nullptr || d.strtab == nullptr || ent == 0) return;
  size_t n = size / ent;
  for (size_t i = 0; i < n; ++i) {
    const ElfW(Rela)* r = reinterpret_cast<const ElfW(Rela)*>(reinterpret_cast<const char*>(rel) + i * ent);
    uint32_t type = ELF64_R_TYPE(r->r_info);
    if (!remora::arch::is_got_slot_reloc(type)) continue;
    uint32_t symidx = ELF64_R_SYM(r->r_info);
    if (symidx == 0) continue;
    const char* name = d.strtab + d.symtab[symidx].st_name;
    auto it = p.wanted.find(name);
    if (it == p.wanted.end()) continue;
    uint32_t fn = it->second;
    void* real = remora_fn_real[fn];
    void* wrapper = remora_fn_table[fn].wrapper;
    void** slot = reinterpret_cast<void**>(info->dlpi_addr + r->r_offset);
    if (const char* ver = required_version(d, symidx)) {
      void* versioned = dlvsym(RTLD_DEFAULT, name, ver);
      if (versioned != nullptr && versioned != real) {
        p.warnings->push_back(obj + ": " + name + "@" + ver +
                              " is not the default version; not traced there");
        continue;
      }
    }
    void* cur = __atomic_load_n(slot, __ATOMIC_SEQ_CST);
    if (cur == nullptr || cur == wrapper) continue;  // unresolved weak reference, or already ours
    // A slot lazy binding has not resolved yet points into the object itself:
    // on x86_64 at its PLT entry's push, on aarch64 at PLT0 (the loader only
    // adds the bias to every JUMP_SLOT). Patching it skips the resolver.
    bool lazy = in_object(info, reinterpret_cast<uintptr_t>(cur));
    if (!lazy && cur != real) {
      // Bound to another definition (an interposer, a library loaded
      // RTLD_DEEPBIND/RTLD_LOCAL): the wrapper would call the wrong one.
      p.warnings->push_back(obj + ": " + name + " is bound to a different definition; not traced there");
      continue;
    }
    if (maps->empty()) *maps = read_maps();
    if (!store_slot(slot, cur, wrapper, *maps)) {
      // Lost a race with lazy binding (the slot was just resolved): retry once.
      cur = __atomic_load_n(slot, __ATOMIC_SEQ_CST);
      if (cur != real || !store_slot(slot, cur, wrapper, *maps)) {
        p.warnings->push_back(obj + ": could not patch the slot of " + name);
        continue;
      }
    }
    p.slots->push_back({slot, cur, wrapper, fn, info->dlpi_addr, obj});
    ++p.count;
  }
}

int patch_callback(dl_phdr_info* info, size_t, void* data) {
  PatchPass& p = *static_cast<PatchPass*>(data);
  p.adds = info->dlpi_adds;
  p.subs = info->dlpi_subs;
  std::string obj = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "[main]";
  if (info->dlpi_addr == p.self && info->dlpi_addr != 0) return 0;
  if (skipped_object(base_name(obj.c_str()))) return 0;
  std::pair<uintptr_t, std::string> key{info->dlpi_addr, obj};
  if (std::find(p.patched_objects->begin(), p.patched_objects->end(), key) != p.patched_objects->end())
    return 0;
  p.patched_objects->push_back(key);
  DynInfo d = read_dynamic(info);
  std::vector<MapRange> maps;
  if (d.pltrel_is_rela) patch_relocs(p, info, d, d.jmprel, d.jmprel_size, sizeof(ElfW(Rela)), obj, &maps);
  patch_relocs(p, info, d, d.rela, d.rela_size, d.rela_ent, obj, &maps);
  return 0;
}

struct HealPass {
  std::vector<PatchedSlot>* slots;
  int count = 0;
};

int heal_callback(dl_phdr_info* info, size_t, void* data) {
  HealPass& p = *static_cast<HealPass*>(data);
  std::string obj = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "[main]";
  std::vector<MapRange> maps;
  for (PatchedSlot& s : *p.slots) {
    if (s.object_base != info->dlpi_addr || s.object != obj) continue;
    void* real = remora_fn_real[s.fn];
    // Bound when patched: no resolution of it can have been in flight.
    if (s.original == real) continue;
    if (__atomic_load_n(s.slot, __ATOMIC_SEQ_CST) != real) continue;
    if (maps.empty()) maps = read_maps();
    if (store_slot(s.slot, real, s.wrapper, maps)) ++p.count;
  }
  return 0;
}

struct RestorePass {
  std::vector<PatchedSlot>* slots;
  std::vector<bool> done;
  std::vector<std::string>* warnings;
  int count = 0;
};

int restore_callback(dl_phdr_info* info, size_t, void* data) {
  RestorePass& p = *static_cast<RestorePass*>(data);
  std::string obj = info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "[main]";
  std::vector<MapRange> maps;
  for (size_t i = 0; i < p.slots->size(); ++i) {
    PatchedSlot& s = (*p.slots)[i];
    if (p.done[i] || s.object_base != info->dlpi_addr || s.object != obj) continue;
    p.done[i] = true;
    if (maps.empty()) maps = read_maps();
    if (store_slot(s.slot, s.wrapper, s.original, maps)) {
      ++p.count;
    } else {
      p.warnings->push_back(obj + ": the slot of " + remora_fn_table[s.fn].symbol +
                            " was changed by someone else while traced; left as it is");
    }
  }
  return 0;
}

}  // namespace

void Tracer::configure(const std::vector<std::string>& names, std::vector<std::string>* warnings) {
  enabled_.assign(remora_fn_count, false);
  for (const std::string& name : names) {
    bool known = false;
    for (uint32_t i = 0; i < remora_fn_count; ++i) {
      if (name != remora_fn_table[i].reported_as) continue;
      known = true;
      void* real = dlsym(RTLD_DEFAULT, remora_fn_table[i].symbol);
      if (real == nullptr) continue;  // e.g. a fortified variant this libc lacks
      // Set once and never cleared: a wrapper may run long after detach.
      if (remora_fn_real[i] == nullptr) __atomic_store_n(&remora_fn_real[i], real, __ATOMIC_RELEASE);
      enabled_[i] = remora_fn_real[i] == real;
    }
    if (!known)
      warnings->push_back("REMORA_TRACE_FUNCTIONS: " + name +
                          " cannot be traced (not in the list of supported functions; see docs/tool.md)");
  }
}

int Tracer::patch(std::vector<std::string>* warnings) {
  PatchPass p;
  p.tracer = this;
  for (uint32_t i = 0; i < remora_fn_count; ++i)
    if (enabled_.size() > i && enabled_[i]) p.wanted.emplace(remora_fn_table[i].symbol, i);
  p.patched_objects = &patched_objects_;
  p.slots = &slots_;
  p.warnings = warnings;
  p.self = self_base();
  const size_t before = slots_.size();
  if (!p.wanted.empty()) dl_iterate_phdr(patch_callback, &p);
  adds_seen_ = p.adds;
  subs_seen_ = p.subs;
  for (size_t i = before; i < slots_.size(); ++i)
    if (slots_[i].original != remora_fn_real[slots_[i].fn]) heal_pending_ = true;
  if (heal_pending_) heal_until_ns_ = 0;  // the window starts at the next heal()
  return p.count;
}

int Tracer::heal(uint64_t now_ns) {
  if (!heal_pending_ || slots_.empty()) return 0;
  if (heal_until_ns_ == 0) heal_until_ns_ = now_ns + kHealNs;
  if (now_ns > heal_until_ns_) {
    heal_pending_ = false;
    return 0;
  }
  HealPass p;
  p.slots = &slots_;
  dl_iterate_phdr(heal_callback, &p);
  return p.count;
}

bool Tracer::objects_changed() const {
  struct Counts {
    unsigned long long adds = 0, subs = 0;
  } c;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* cc = static_cast<Counts*>(data);
        cc->adds = info->dlpi_adds;
        cc->subs = info->dlpi_subs;
        return 1;  // the counters are the same in every entry: stop at the first
      },
      &c);
  return c.adds != adds_seen_ || c.subs != subs_seen_;
}

int Tracer::restore(std::vector<std::string>* warnings) {
  RestorePass p;
  p.slots = &slots_;
  p.done.assign(slots_.size(), false);
  p.warnings = warnings;
  if (!slots_.empty()) dl_iterate_phdr(restore_callback, &p);
  last_slots_ = slots_;
  slots_.clear();
  heal_pending_ = false;
  patched_objects_.clear();
  return p.count;
}

}  // namespace remora_tool
