// The dynamic loader's view of a control::Process: the auxiliary vector, the
// r_debug rendezvous (r_brk, r_state), the link map, and the functions the
// loader runs before main. Also bringing a freshly exec'd image to the
// launch stop.
#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "control/process_impl.h"
#include "elf/elf_image.h"
#include "procfs/procfs.h"
#include "remote/lookup.h"

namespace remora::control {
namespace {

// Reads a NUL-terminated string from the target (at most `max` bytes).
std::string read_cstring(const remote::Memory& mem, uint64_t addr, size_t max = 4096) {
  std::string out;
  if (addr == 0) return out;
  while (out.size() < max) {
    std::array<char, 256> buf{};
    // Do not cross a page boundary in one read: the next page may be unmapped.
    size_t n = std::min<size_t>(buf.size(), 4096 - ((addr + out.size()) & 4095));
    if (!mem.read(addr + out.size(), std::as_writable_bytes(std::span(buf.data(), n)))) break;
    size_t len = strnlen(buf.data(), n);
    out.append(buf.data(), len);
    if (len < n) break;
  }
  return out;
}

// The address of the ELF header of the object whose dynamic section is at
// `ld`: the mapping of the same file at file offset 0 (the highest one below
// `ld`), or for an anonymous image (the vDSO) the start of its mapping.
uint64_t header_of(const std::vector<procfs::MapEntry>& maps, uint64_t ld) {
  const procfs::MapEntry* at = nullptr;
  for (auto& m : maps)
    if (ld >= m.start && ld < m.end) at = &m;
  if (at == nullptr) return 0;
  if (!at->file_backed()) return at->start;
  uint64_t best = 0;
  for (auto& m : maps)
    if (m.dev() == at->dev() && m.inode == at->inode && m.offset == 0 && m.start <= ld) best = m.start;
  return best;
}

}  // namespace

Result<void> Process::Impl::read_auxv() {
  auto auxv = REMORA_TRY(procfs::read_auxv(pid));
  at_entry = procfs::auxv_get(auxv, AT_ENTRY).value_or(0);
  at_phdr = procfs::auxv_get(auxv, AT_PHDR).value_or(0);
  uint64_t at_base = procfs::auxv_get(auxv, AT_BASE).value_or(0);
  dynamic = at_base != 0;
  r_debug = r_brk = 0;
  if (!dynamic) return ok();
  auto maps = REMORA_TRY(procfs::read_maps(pid));
  auto lib = REMORA_TRY_CTX(remote::library_at(pid, maps, at_base), "find the dynamic loader");
  auto img = REMORA_TRY_CTX(remote::load_image(pid, lib, *mem, {}), "read the dynamic loader " + lib.path);
  auto dds = img.image->find_symbol("_dl_debug_state");
  auto rd = img.image->find_symbol("_r_debug");
  if (!dds || !rd)
    return Error(Errc::kNotSupported, "the dynamic loader " + lib.path +
                                          " exports no _dl_debug_state/_r_debug: not a glibc-compatible "
                                          "loader");
  r_brk = img.bias + dds->value;
  r_debug = img.bias + rd->value;
  return ok();
}

Result<int> Process::Impl::read_r_state() { return REMORA_TRY(mem->read_value<int32_t>(r_debug + 24)); }

Result<std::vector<LoadedObject>> Process::Impl::read_link_map() {
  std::vector<LoadedObject> out;
  uint64_t lm = REMORA_TRY(mem->read_value<uint64_t>(r_debug + 8));
  // r_brk as the loader announces it wins over the symbol (they agree on glibc).
  if (uint64_t brk = mem->read_value<uint64_t>(r_debug + 16).value_or(0); brk != 0) r_brk = brk;
  auto maps = procfs::read_maps(pid);
  const elf::ReadFn read = [this](uint64_t a, std::span<std::byte> b) { return mem->read(a, b); };
  for (int n = 0; lm != 0 && n < 65536; ++n) {
    struct {
      uint64_t l_addr, l_name, l_ld, l_next, l_prev;
    } raw{};
    REMORA_TRY(mem->read(lm, std::as_writable_bytes(std::span(&raw, 1))));
    LoadedObject o;
    o.lm = lm;
    o.bias = raw.l_addr;
    o.dynamic = raw.l_ld;
    o.name = read_cstring(*mem, raw.l_name);
    if (o.name.empty() && out.empty()) {
      std::array<char, 4096> buf{};
      ssize_t k = ::readlink(("/proc/" + pid_str(pid) + "/exe").c_str(), buf.data(), buf.size() - 1);
      if (k > 0) o.name.assign(buf.data(), static_cast<size_t>(k));
    }
    if (maps) o.base = header_of(*maps, raw.l_ld);
    if (o.base != 0) {
      if (auto img = elf::ElfImage::headers_from_memory(o.base, read)) o.build_id = (*img)->build_id_hex();
    }
    out.push_back(std::move(o));
    lm = raw.l_next;
  }
  return out;
}

// Every function the loader will call before main: DT_PREINIT_ARRAY,
// DT_INIT and DT_INIT_ARRAY entries of every object, plus AT_ENTRY.
// glibc never rewrites these dynamic tags in place (it adjusts only the
// tags it dereferences itself), and .init_array may or may not be relocated
// yet, so each value is taken as absolute when it is at or above the bias
// and as an unbiased address otherwise. Only addresses inside an executable
// mapping are kept: a breakpoint must never land in data.
std::set<uint64_t> Process::Impl::init_functions() {
  std::set<uint64_t> out;
  auto maps = procfs::read_maps(pid);
  if (!maps) return out;
  auto executable = [&](uint64_t a) {
    for (auto& m : *maps)
      if (a >= m.start && a < m.end) return m.exec;
    return false;
  };
  auto add = [&](uint64_t a) {
    if (a != 0 && executable(a)) out.insert(a);
  };
  const elf::ReadFn read = [this](uint64_t a, std::span<std::byte> b) { return mem->read(a, b); };
  for (auto& o : objects) {
    if (o.dynamic == 0) continue;
    auto adj = [&](uint64_t v) { return (o.bias == 0 || v >= o.bias) ? v : v + o.bias; };
    const elf::InitTags tags = elf::read_init_tags(o.dynamic, read);
    if (tags.init != 0) add(adj(tags.init));
    for (auto [a, sz] : {std::pair{tags.init_array, tags.init_arraysz},
                         std::pair{tags.preinit_array, tags.preinit_arraysz}}) {
      if (a == 0) continue;
      for (uint64_t k = 0; k < std::min<uint64_t>(sz / 8, 4096); ++k) {
        auto v = mem->read_value<uint64_t>(adj(a) + k * 8);
        if (!v || *v == 0 || *v == ~0ull) continue;
        add(adj(*v));
      }
    }
  }
  add(at_entry);
  return out;
}

std::optional<Event> Process::Impl::terminal_event(const Raw& r) {
  if (r.kind == Raw::Kind::kGone) {
    Event e;
    e.kind = Event::Kind::kGone;
    e.signal = r.status;
    return e;
  }
  if (r.kind == Raw::Kind::kExit) {
    Event e;
    e.kind = Event::Kind::kExit;
    e.tid = r.tid;
    e.exit_status = r.status;
    return e;
  }
  return std::nullopt;
}

template <typename Accept>
Result<std::optional<Event>> Process::Impl::run_to(const Deadline& deadline, Accept accept) {
  for (;;) {
    Raw r = REMORA_TRY(run(deadline, false));
    if (auto ev = terminal_event(r)) return ev;
    if (r.kind == Raw::Kind::kTrap && accept(r.addr)) return std::optional<Event>();
    if (r.kind == Raw::Kind::kFork || r.kind == Raw::Kind::kVfork) REMORA_TRY(handle_fork(r, false));
  }
}

Result<std::optional<Event>> Process::Impl::sync_new_image(const Deadline& deadline) {
  auto m = REMORA_TRY(remote::Memory::open(pid));
  mem.emplace(std::move(m));
  inserted.clear();
  objects.clear();
  REMORA_TRY(read_auxv());
  if (!dynamic) {
    bp_addrs.clear();
    return std::optional<Event>();
  }
  // Phase 1: the loader's rendezvous with r_state == RT_CONSISTENT: every
  // initial object is mapped.
  bp_addrs = {r_brk};
  auto ev = REMORA_TRY(run_to(
      deadline, [&](uint64_t at) { return at == r_brk && read_r_state().value_or(-1) == kRtConsistent; }));
  if (ev) return ev;
  objects = REMORA_TRY(read_link_map());
  // Phase 2: the first init function (or the entry point) reached.
  bp_addrs = init_functions();
  ev = REMORA_TRY(run_to(deadline, [&](uint64_t at) { return bp_addrs.count(at) != 0; }));
  if (ev) return ev;
  bp_addrs = {r_brk};
  objects = REMORA_TRY(read_link_map());
  return std::optional<Event>();
}

}  // namespace remora::control
