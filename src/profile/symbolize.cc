#include "profile/symbolize.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "base/result.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "procfs/procfs.h"
#include "profile/perf_map.h"
#include "profile/plt.h"

namespace remora::profile {
namespace {

std::string base_name(std::string_view path) {
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

std::string dir_name(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  return slash == 0 ? "/" : std::string(path.substr(0, slash));
}

Result<UniqueFd> open_on_host(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return Error::from_errno("open " + path);
  return UniqueFd(fd);
}

// The GNU build ID of the ELF file behind `fd` (hex; "" when it has none or
// is no ELF file). libelf reads the note sections first, which is what a
// separate debug file needs: its program headers describe the stripped file.
std::string file_build_id(int fd) {
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) return "";
  const void* bits = nullptr;
  ssize_t n = dwelf_elf_gnu_build_id(elf, &bits);
  std::string hex = n > 0 ? to_hex(bits, static_cast<size_t>(n)) : "";
  elf_end(elf);
  return hex;
}

// The .gnu_debugaltlink of a debug file (dwz's shared part): the alt
// file's name and build ID (hex), or two empty strings.
std::pair<std::string, std::string> debug_altlink(int fd) {
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) return {};
  std::pair<std::string, std::string> out;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) == 0) {
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
      GElf_Shdr shdr;
      if (gelf_getshdr(scn, &shdr) == nullptr) continue;
      const char* name = elf_strptr(elf, shstrndx, shdr.sh_name);
      if (name == nullptr || std::strcmp(name, ".gnu_debugaltlink") != 0) continue;
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (data == nullptr || data->d_buf == nullptr) break;
      const char* p = static_cast<const char*>(data->d_buf);
      size_t len = strnlen(p, data->d_size);
      if (len + 1 < data->d_size) out = {std::string(p, len), to_hex(p + len + 1, data->d_size - len - 1)};
      break;
    }
  }
  elf_end(elf);
  return out;
}

uint32_t file_crc32(int fd) {
  uLong crc = crc32(0L, Z_NULL, 0);
  char buf[1 << 16];
  off_t at = 0;
  while (true) {
    ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf), static_cast<uInt>(n));
    at += n;
  }
  return static_cast<uint32_t>(crc);
}

std::string demangle(const char* name) {
  if (name == nullptr) return "";
  // Itanium C++ mangling only; Rust v0 ("_R") and others stay as written.
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) {
      std::string out = d;
      std::free(d);
      return out;
    }
    std::free(d);
  }
  return name;
}

// Where an inlined instance was called from: DW_AT_call_file (an index into
// its CU's file table) and DW_AT_call_line.
void call_site(Dwarf_Die* inlined, std::string* file, uint32_t* line) {
  file->clear();
  *line = 0;
  Dwarf_Attribute attr;
  Dwarf_Word value = 0;
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &attr), &value) == 0)
    *line = static_cast<uint32_t>(value);
  if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &attr), &value) != 0) return;
  Dwarf_Die cu;
  Dwarf_Files* files = nullptr;
  size_t nfiles = 0;
  if (dwarf_diecu(inlined, &cu, nullptr, nullptr) == nullptr ||
      dwarf_getsrcfiles(&cu, &files, &nfiles) != 0 || value >= nfiles)
    return;
  const char* name = dwarf_filesrc(files, value, nullptr, nullptr);
  if (name != nullptr) *file = name;
}

// The function scopes of one CU, walked once: dwarf_getscopes walks the
// CU's DIE tree from its root for every address, which for 10k addresses
// over libc cost most of a second.
struct CuIndex {
  struct Node {
    Dwarf_Die die;
    int parent = -1;  // the enclosing function scope; -1 at the top
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    std::vector<int> children;
  };
  std::vector<Node> nodes;
  struct Top {
    uint64_t low = 0, high = 0;
    int node = 0;
  };
  std::vector<Top> top;  // top-level functions' ranges, by low
  // C++ only: the namespaces and classes around each subprogram DIE
  // ("fx::Widget::"), to qualify names that have no linkage name (static
  // and inline functions).
  bool cxx = false;
  // Keyed by the DIE's file and offset: a dwz file's DIEs (imported
  // partial units) have offsets of their own file.
  struct DieKey {
    const Dwarf* file = nullptr;
    Dwarf_Off offset = 0;
    bool operator==(const DieKey&) const = default;
  };
  struct DieKeyHash {
    size_t operator()(const DieKey& k) const {
      return std::hash<const void*>{}(k.file) ^ (std::hash<Dwarf_Off>{}(k.offset) * 0x9e3779b97f4a7c15ULL);
    }
  };
  std::unordered_map<DieKey, std::string, DieKeyHash> prefix;
  static DieKey key(Dwarf_Die* die) { return DieKey{dwarf_cu_getdwarf(die->cu), dwarf_dieoffset(die)}; }
};

// A module's function symbols by address, for the modules (and addresses)
// DWARF does not cover; dwfl_module_addrinfo scans every symbol each call.
struct SymbolTable {
  struct Sym {
    uint64_t addr = 0, size = 0;
    const char* name = nullptr;  // owned by the module's Elf
  };
  bool built = false;
  std::vector<Sym> syms;  // by addr; of aliases, the preferred name first
};

std::vector<std::pair<uint64_t, uint64_t>> die_ranges(Dwarf_Die* die) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  Dwarf_Addr base = 0, start = 0, end = 0;
  for (ptrdiff_t off = 0; (off = dwarf_ranges(die, off, &base, &start, &end)) > 0;)
    if (end > start) out.emplace_back(start, end);
  return out;
}

// Hostile or broken DWARF must not exhaust the stack.
constexpr int kMaxScopeDepth = 256;

void walk_scopes(CuIndex& cu, Dwarf_Die* parent, int parent_node, const std::string& prefix, int depth) {
  Dwarf_Die child;
  if (depth > kMaxScopeDepth || dwarf_child(parent, &child) != 0) return;
  do {
    int tag = dwarf_tag(&child);
    switch (tag) {
      case DW_TAG_namespace:
      case DW_TAG_class_type:
      case DW_TAG_structure_type:
      case DW_TAG_union_type: {
        if (!cu.cxx) break;
        const char* name = dwarf_diename(&child);
        walk_scopes(cu, &child, parent_node,
                    prefix + (name != nullptr ? name : "(anonymous namespace)") + "::", depth + 1);
        break;
      }
      case DW_TAG_subprogram:
      case DW_TAG_inlined_subroutine:
      case DW_TAG_entry_point: {
        if (cu.cxx && tag == DW_TAG_subprogram) cu.prefix.emplace(CuIndex::key(&child), prefix);
        auto ranges = die_ranges(&child);
        if (ranges.empty()) break;  // a declaration or abstract instance: no code
        int node = static_cast<int>(cu.nodes.size());
        cu.nodes.push_back(CuIndex::Node{child, parent_node, ranges, {}});
        if (parent_node < 0) {
          for (const auto& [lo, hi] : ranges) cu.top.push_back(CuIndex::Top{lo, hi, node});
        } else {
          cu.nodes[static_cast<size_t>(parent_node)].children.push_back(node);
        }
        walk_scopes(cu, &child, node, prefix, depth + 1);
        break;
      }
      case DW_TAG_lexical_block:
      case DW_TAG_try_block:
      case DW_TAG_catch_block: walk_scopes(cu, &child, parent_node, prefix, depth + 1); break;
      case DW_TAG_imported_unit: {
        // dwz moves shared DIEs into partial units that CUs import.
        Dwarf_Attribute attr;
        Dwarf_Die unit;
        if (dwarf_formref_die(dwarf_attr(&child, DW_AT_import, &attr), &unit) != nullptr)
          walk_scopes(cu, &unit, parent_node, prefix, depth + 1);
        break;
      }
      default: break;
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

std::unique_ptr<CuIndex> index_cu(Dwarf_Die* cudie) {
  auto cu = std::make_unique<CuIndex>();
  int lang = dwarf_srclang(cudie);
  cu->cxx = lang == DW_LANG_C_plus_plus || lang == DW_LANG_C_plus_plus_03 || lang == DW_LANG_C_plus_plus_11 ||
            lang == DW_LANG_C_plus_plus_14;
  walk_scopes(*cu, cudie, -1, "", 0);
  std::sort(cu->top.begin(), cu->top.end(),
            [](const CuIndex::Top& a, const CuIndex::Top& b) { return a.low < b.low; });
  return cu;
}

// The innermost function scope at `addr` (a DWARF address), or -1.
int innermost_scope(const CuIndex& cu, uint64_t addr) {
  auto it = std::upper_bound(cu.top.begin(), cu.top.end(), addr,
                             [](uint64_t a, const CuIndex::Top& t) { return a < t.low; });
  // Top-level functions do not overlap, but a range list may nest in
  // another's gaps: look back over the few that start below addr.
  int node = -1;
  for (int back = 0; it != cu.top.begin() && back < 8; ++back) {
    --it;
    if (addr < it->high) {
      node = it->node;
      break;
    }
  }
  if (node < 0) return -1;
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (int c : cu.nodes[static_cast<size_t>(node)].children) {
      for (const auto& [lo, hi] : cu.nodes[static_cast<size_t>(c)].ranges)
        if (addr >= lo && addr < hi) deeper = true;
      if (deeper) {
        node = c;
        break;
      }
    }
  }
  return node;
}

// The DIE that names a function instance: through DW_AT_abstract_origin
// (inlined and out-of-line instances) and DW_AT_specification (definitions
// of declared members).
Dwarf_Die naming_die(Dwarf_Die die) {
  for (int hops = 0; hops < 8; ++hops) {
    Dwarf_Attribute attr;
    Dwarf_Die next;
    if (dwarf_formref_die(dwarf_attr(&die, DW_AT_abstract_origin, &attr), &next) == nullptr &&
        dwarf_formref_die(dwarf_attr(&die, DW_AT_specification, &attr), &next) == nullptr)
      break;
    die = next;
  }
  return die;
}

// Which of two aliases (one address) names the code: a global over a weak
// over a local one, then the fewest leading underscores (clone3 over
// __clone3 and __GI___clone3), then the shorter.
bool better_alias(const GElf_Sym& a, const char* an, const GElf_Sym& b, const char* bn) {
  auto rank = [](unsigned char bind) { return bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2; };
  int ra = rank(GELF_ST_BIND(a.st_info)), rb = rank(GELF_ST_BIND(b.st_info));
  if (ra != rb) return ra < rb;
  size_t ua = std::strspn(an, "_"), ub = std::strspn(bn, "_");
  if (ua != ub) return ua < ub;
  return std::strlen(an) < std::strlen(bn);
}

void build_symbols(Dwfl_Module* mod, SymbolTable& table) {
  table.built = true;
  struct Entry {
    SymbolTable::Sym sym;
    GElf_Sym raw;
  };
  std::vector<Entry> all;
  int n = dwfl_module_getsymtab(mod);
  for (int i = 1; i < n; ++i) {
    GElf_Sym sym;
    GElf_Addr addr = 0;
    GElf_Word shndx = 0;
    const char* name = dwfl_module_getsym_info(mod, i, &sym, &addr, &shndx, nullptr, nullptr);
    int type = GELF_ST_TYPE(sym.st_info);
    if (name == nullptr || name[0] == '\0' || shndx == SHN_UNDEF ||
        (type != STT_FUNC && type != STT_GNU_IFUNC))
      continue;
    all.push_back(Entry{SymbolTable::Sym{addr, sym.st_size, name}, sym});
  }
  std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
    if (a.sym.addr != b.sym.addr) return a.sym.addr < b.sym.addr;
    if ((a.sym.size == 0) != (b.sym.size == 0)) return a.sym.size != 0;
    return better_alias(a.raw, a.sym.name, b.raw, b.sym.name);
  });
  table.syms.reserve(all.size());
  for (const auto& e : all)
    if (table.syms.empty() || table.syms.back().addr != e.sym.addr) table.syms.push_back(e.sym);
}

const SymbolTable::Sym* find_symbol(const SymbolTable& table, uint64_t addr) {
  auto it = std::upper_bound(table.syms.begin(), table.syms.end(), addr,
                             [](uint64_t a, const SymbolTable::Sym& s) { return a < s.addr; });
  if (it == table.syms.begin()) return nullptr;
  --it;
  // A sized symbol must contain addr; an unsized one (assembly) reaches
  // to the next symbol.
  if (it->size != 0 && addr >= it->addr + it->size) return nullptr;
  return &*it;
}

// A function DIE's name: the linkage name demangled (it carries the
// namespace, class and parameters, as perf prints C++ frames), else its
// plain name, qualified in C++ with the namespaces and classes around its
// declaration.
std::string function_name(const CuIndex& cu, Dwarf_Die die) {
  Dwarf_Die named = naming_die(die);
  Dwarf_Attribute attr;
  const char* name = dwarf_formstring(dwarf_attr_integrate(&named, DW_AT_linkage_name, &attr));
  if (name == nullptr) name = dwarf_formstring(dwarf_attr_integrate(&named, DW_AT_MIPS_linkage_name, &attr));
  if (name != nullptr) return demangle(name);
  name = dwarf_formstring(dwarf_attr_integrate(&named, DW_AT_name, &attr));
  if (name == nullptr) return "";
  if (cu.cxx)
    if (auto it = cu.prefix.find(CuIndex::key(&named)); it != cu.prefix.end()) return it->second + name;
  return name;
}

// Where the root of the target lies as seen from here.
enum class Root { kTarget, kHost };

// One object of the target: a Module the tool reported, or a file mapping
// it did not (its bias then comes from the mapping).
struct Object {
  std::string path;         // as the target's maps name it (its real path)
  std::string module_path;  // as its dynamic linker names it; "" no module
  std::string label;        // its base name, for "libx.so+0x1f0"
  uint64_t bias = 0;
  bool bias_known = false;
  uint64_t map_start = 0, map_offset = 0;  // an executable mapping, when !bias_known
  std::string want_build_id;               // Module::build_id; "" unknown
  bool vdso = false;

  bool loaded = false;         // open attempted
  Dwfl_Module* mod = nullptr;  // null: no usable file (problem says why)
  std::string problem;
  bool mismatch = false;  // the file there is another build
  Root opened_in = Root::kHost;
  std::string build_id;  // the file's

  // Debug info, found by the find_debuginfo callback.
  bool debug_found = false;
  Root debug_root = Root::kHost;
  std::string debug_path;
  bool dwarf_checked = false, has_dwarf = false;
  std::unordered_map<Dwarf_Off, std::unique_ptr<CuIndex>> cus;
  SymbolTable symtab;
  bool plt_read = false;
  std::vector<PltEntry> plt;  // its PLT stubs, named after their targets

  uint64_t frames = 0;  // addresses looked up in it
};

struct AddrRange {
  uint64_t start = 0, end = 0;
  Object* object = nullptr;
};

}  // namespace

struct Symbolizer::Impl {
  SymbolSource src;
  bool target_root = false;    // the target lives: open files through its root
  bool distinct_root = false;  // ... and its root is not ours (a container)
  Dwfl* dwfl = nullptr;
  Dwfl_Callbacks callbacks{};
  std::vector<std::unique_ptr<Object>> objects;
  std::vector<AddrRange> ranges;  // executable mappings, sorted
  std::vector<std::pair<uint64_t, uint64_t>> tool_ranges;
  PerfMap jit;
  uint64_t jit_frames = 0, unknown_frames = 0;
  std::vector<char> vdso_image;  // our own vDSO's bytes, for the target's (same kernel)
  std::unordered_map<uint64_t, std::vector<Frame>> cache;

  Result<UniqueFd> open(Root root, const std::string& path) const {
    if (root == Root::kTarget) return procfs::open_in_root(src.pid, path);
    return open_on_host(path);
  }

  bool target_lives() const {
    struct stat st {};
    return ::stat(("/proc/" + std::to_string(src.pid) + "/root").c_str(), &st) == 0;
  }
  void index_objects();
  void load(Object& o);
  void load_vdso(Object& o);
  int find_debug(Object& o, Dwfl_Module* mod, const char* debuglink, GElf_Word crc, char** found_name);
  int try_debug_file(Object& o, Root root, const std::string& path, const std::string& want_bid,
                     GElf_Word crc, char** found_name);
  Object* object_at(uint64_t addr);
  const Object* object_at(uint64_t addr) const { return const_cast<Impl*>(this)->object_at(addr); }
  bool load_debug_only(Object& o);
  void dwarf_frames(Object& o, uint64_t addr, std::vector<Frame>* out);
  void symtab_frame(Object& o, uint64_t addr, std::vector<Frame>* out);
  void plt_frame(Object& o, uint64_t addr, std::vector<Frame>* out);
  Frame base_frame(const Object& o, uint64_t addr) const;

  // libdwfl's callbacks. Each module's userdata is a CallbackData: the
  // object it stands for, and the symboliser that owns it.
  struct CallbackData {
    Impl* impl = nullptr;
    Object* object = nullptr;
  };
  void attach_userdata(Object& o) {
    void** userdata = nullptr;
    dwfl_module_info(o.mod, &userdata, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    *userdata = new CallbackData{this, &o};
  }
  static int find_debuginfo_cb(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, const char*,
                               const char* debuglink, GElf_Word crc, char** found_name);
  static int find_elf_cb(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, char**, Elf** elfp);
  static int free_userdata(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, void*);
};

// Objects from the maps (executable mappings: code is where PCs are),
// each matched to the tool's module: by path, else by bias, since the
// dynamic linker names a file as it opened it (/lib/x86_64-linux-gnu/
// libc.so.6, a symlink's name) and the maps by its real path
// (/usr/lib/...); the file's header mapping starts at the bias for every
// object linked at 0. A mapping no module claims gets an object of its own.
void Symbolizer::Impl::index_objects() {
  std::unordered_map<std::string, const Module*> module_by_path;
  std::unordered_map<uint64_t, const Module*> module_by_bias;
  for (const Module& m : src.modules) {
    module_by_path.emplace(m.path, &m);
    module_by_bias.emplace(m.bias, &m);
  }
  // The lowest offset-0 mapping of each file: where its ELF header is.
  std::unordered_map<std::string, uint64_t> header_at;
  for (const Mapping& m : src.maps)
    if (m.offset == 0 && !m.path.empty() && (header_at.count(m.path) == 0 || m.start < header_at[m.path]))
      header_at[m.path] = m.start;
  std::unordered_map<std::string, Object*> by_path;
  for (const Mapping& m : src.maps) {
    if (m.perms.size() < 3 || m.perms[2] != 'x' || m.path.empty()) continue;
    bool vdso = m.path == "[vdso]";
    if (!vdso && m.path[0] != '/') continue;  // [vsyscall], anonymous names
    Object*& o = by_path[m.path];
    if (o == nullptr) {
      const Module* mod = nullptr;
      if (auto it = module_by_path.find(m.path); it != module_by_path.end()) {
        mod = it->second;
      } else if (auto h = header_at.find(m.path); h != header_at.end()) {
        if (auto b = module_by_bias.find(h->second); b != module_by_bias.end()) mod = b->second;
      }
      auto made = std::make_unique<Object>();
      made->path = m.path;
      made->label = vdso ? m.path : base_name(m.path);
      made->vdso = vdso;
      made->map_start = m.start;
      made->map_offset = m.offset;
      if (mod != nullptr) {
        made->bias = mod->bias;
        made->bias_known = true;
        made->want_build_id = mod->build_id;
        made->module_path = mod->path;
      } else if (vdso) {
        made->bias = m.start;  // a vDSO is linked at 0
        made->bias_known = true;
      }
      o = made.get();
      objects.push_back(std::move(made));
    }
    if (!src.tool_path.empty() && (m.path == src.tool_path || o->module_path == src.tool_path))
      tool_ranges.emplace_back(m.start, m.end);
    ranges.push_back(AddrRange{m.start, m.end, o});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const AddrRange& a, const AddrRange& b) { return a.start < b.start; });
}

Object* Symbolizer::Impl::object_at(uint64_t addr) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), addr,
                             [](uint64_t a, const AddrRange& r) { return a < r.start; });
  if (it == ranges.begin()) return nullptr;
  --it;
  return addr < it->end ? it->object : nullptr;
}

// Opens the object's file as the target sees it, checks that it is the build
// the target loaded, and reports it to libdwfl at the target's load bias.
void Symbolizer::Impl::load(Object& o) {
  o.loaded = true;
  if (o.vdso) return load_vdso(o);
  Root root = target_root ? Root::kTarget : Root::kHost;
  auto opened = open(root, o.path);
  if (!opened && root == Root::kTarget && !target_lives()) {
    // It exited meanwhile: what this machine has at the path, checked below.
    root = Root::kHost;
    opened = open(root, o.path);
  }
  if (!opened) {
    o.problem = "cannot open it (" + opened.error().to_string() + ")";
    load_debug_only(o);
    return;
  }
  UniqueFd fd = std::move(*opened);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    o.problem = "it is not a regular file";
    load_debug_only(o);
    return;
  }
  o.opened_in = root;
  o.build_id = file_build_id(fd.get());
  if (!o.want_build_id.empty() && o.build_id != o.want_build_id) {
    o.mismatch = true;
    o.problem = "the file there has build ID " + (o.build_id.empty() ? std::string("none") : o.build_id) +
                " but the process loaded build ID " + o.want_build_id +
                " (the file was replaced, by an upgrade or a rebuild, after the process started)";
    load_debug_only(o);
    return;
  }
  uint64_t bias = o.bias;
  if (!o.bias_known) {
    // A mapping the tool did not list as a module: the executable PT_LOAD
    // it maps (its file offset rounded down to a page is the mapping's)
    // says which address file offset map_offset was linked at.
    Elf* elf = elf_begin(fd.get(), ELF_C_READ_MMAP, nullptr);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    size_t n = 0;
    bool found = false;
    if (elf != nullptr && elf_getphdrnum(elf, &n) == 0) {
      for (size_t i = 0; i < n && !found; ++i) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD ||
            (ph.p_flags & PF_X) == 0 || ph.p_offset < o.map_offset || ph.p_offset - o.map_offset >= page)
          continue;
        bias = o.map_start + (ph.p_offset - o.map_offset) - ph.p_vaddr;
        found = true;
      }
    }
    if (elf != nullptr) elf_end(elf);
    if (!found) {
      o.problem = "no PT_LOAD of the file matches its executable mapping";
      return;
    }
    o.bias = bias;
    o.bias_known = true;
  }
  dwfl_report_begin_add(dwfl);
  // dwfl_report_elf consumes the fd on success only.
  int raw = fd.get();
  o.mod = dwfl_report_elf(dwfl, o.path.c_str(), o.path.c_str(), raw, bias, true);
  if (o.mod != nullptr) fd.release();
  dwfl_report_end(dwfl, nullptr, nullptr);
  if (o.mod == nullptr) {
    o.problem = std::string("libdwfl cannot read it: ") + dwfl_errmsg(-1);
    return;
  }
  attach_userdata(o);
}

// The object's own file is gone or another build: its debug file, found by
// the build ID the target loaded, stands in for it (a debug file keeps the
// program headers, the symbol table and the DWARF, as eu-addr2line -e reads
// it). Looked for where find_debug looks by build ID. False: none found, and
// the object keeps its problem.
bool Symbolizer::Impl::load_debug_only(Object& o) {
  const std::string& want = o.want_build_id;
  if (want.size() <= 2 || !o.bias_known) return false;
  const std::string rel = "/.build-id/" + want.substr(0, 2) + "/" + want.substr(2) + ".debug";
  std::vector<std::pair<Root, std::string>> candidates;
  for (const auto& d : src.debug_dirs) candidates.emplace_back(Root::kHost, d + rel);
  if (distinct_root) candidates.emplace_back(Root::kTarget, "/usr/lib/debug" + rel);
  candidates.emplace_back(Root::kHost, "/usr/lib/debug" + rel);
  for (const auto& [root, path] : candidates) {
    auto opened = open(root, path);
    struct stat st {};
    if (!opened || ::fstat(opened->get(), &st) != 0 || !S_ISREG(st.st_mode) ||
        file_build_id(opened->get()) != want)
      continue;
    dwfl_report_begin_add(dwfl);
    int raw = opened->get();
    o.mod = dwfl_report_elf(dwfl, o.path.c_str(), path.c_str(), raw, o.bias, true);
    if (o.mod != nullptr) opened->release();
    dwfl_report_end(dwfl, nullptr, nullptr);
    if (o.mod == nullptr) continue;
    o.problem.clear();
    o.mismatch = false;
    o.build_id = want;
    o.opened_in = o.debug_root = root;
    o.debug_found = true;
    o.debug_path = path;
    attach_userdata(o);
    return true;
  }
  return false;
}

// The target's vDSO has no file; a process on this kernel maps the very same
// image, so ours stands in for it when the build IDs agree.
void Symbolizer::Impl::load_vdso(Object& o) {
  unsigned long base = getauxval(AT_SYSINFO_EHDR);
  if (base == 0 || !o.bias_known) return;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  uint64_t start = 0, end = 0;
  while (std::getline(maps, line)) {
    if (line.size() < 6 || line.compare(line.size() - 6, 6, "[vdso]") != 0) continue;
    std::istringstream in(line);
    char dash = 0;
    in >> std::hex >> start >> dash >> end;
  }
  if (start != base || end <= start) return;
  vdso_image.assign(reinterpret_cast<const char*>(base), reinterpret_cast<const char*>(end));
  Elf* elf = elf_memory(vdso_image.data(), vdso_image.size());
  if (elf == nullptr) return;
  const void* bits = nullptr;
  ssize_t n = dwelf_elf_gnu_build_id(elf, &bits);
  std::string bid = n > 0 ? to_hex(bits, static_cast<size_t>(n)) : "";
  uint64_t lo = UINT64_MAX, hi = 0;
  size_t nph = 0;
  if (elf_getphdrnum(elf, &nph) == 0) {
    for (size_t i = 0; i < nph; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
      lo = std::min(lo, ph.p_vaddr & ~uint64_t{0xfff});
      hi = std::max(hi, ph.p_vaddr + ph.p_memsz);
    }
  }
  elf_end(elf);
  if (bid.empty() || bid != o.want_build_id || lo >= hi) return;  // another kernel: "[vdso]+0x..."
  o.build_id = bid;
  dwfl_report_begin_add(dwfl);
  o.mod = dwfl_report_module(dwfl, o.path.c_str(), o.bias + lo, o.bias + hi);
  dwfl_report_end(dwfl, nullptr, nullptr);
  if (o.mod == nullptr) return;
  attach_userdata(o);
}

// One candidate debug file: used when its build ID is the one wanted, or,
// where no build ID is known, when its CRC is the one .gnu_debuglink gives.
int Symbolizer::Impl::try_debug_file(Object& o, Root root, const std::string& path,
                                     const std::string& want_bid, GElf_Word crc, char** found_name) {
  auto opened = open(root, path);
  if (!opened) return -1;
  struct stat st {};
  if (::fstat(opened->get(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  std::string bid = file_build_id(opened->get());
  bool ok = !want_bid.empty() ? bid == want_bid : crc != 0 && file_crc32(opened->get()) == crc;
  if (!ok) return -1;
  std::string shown = root == Root::kTarget ? path + " (in the target's root)" : path;
  *found_name = strdup(shown.c_str());
  if (!o.debug_found) {
    o.debug_found = true;
    o.debug_root = root;
    o.debug_path = path;
  }
  return opened->release();
}

// libdwfl's find_debuginfo, with dwfl_standard_find_debuginfo's order
// (build ID, then .gnu_debuglink next to the file, in .debug/ and under
// /usr/lib/debug) but every file opened as the target sees it and checked:
// SymbolSource::debug_dirs first, then the target's own /usr/lib/debug
// (through its root), then ours. Called a second time, once the debug file
// is found, for the dwz file its .gnu_debugaltlink names.
int Symbolizer::Impl::find_debug(Object& o, Dwfl_Module* mod, const char* debuglink, GElf_Word crc,
                                 char** found_name) {
  std::string want = o.build_id;
  std::string link = debuglink != nullptr ? debuglink : "";
  // libdwfl asks for the dwz file with its name in place of the debuglink:
  // after the debug file was found, or for a main file that holds its own
  // (dwz-compressed) DWARF, under a name that is not its .gnu_debuglink.
  bool alt = o.debug_found;
  if (!alt && debuglink != nullptr) {
    Dwarf_Addr bias = 0;
    GElf_Word own_crc = 0;
    Elf* elf = dwfl_module_getelf(mod, &bias);
    const char* own = elf != nullptr ? dwelf_elf_gnu_debuglink(elf, &own_crc) : nullptr;
    alt = own == nullptr || std::strcmp(own, debuglink) != 0;
  }
  if (alt) {
    auto main = o.debug_found ? open(o.debug_root, o.debug_path) : open(o.opened_in, o.path);
    if (!main) return -1;
    auto [alt_name, alt_bid] = debug_altlink(main->get());
    if (alt_bid.empty()) return -1;
    want = alt_bid;
    link = alt_name;
    crc = 0;
  }
  std::vector<Root> roots;
  if (distinct_root) roots.push_back(Root::kTarget);
  roots.push_back(Root::kHost);
  if (want.size() > 2) {
    std::string rel = "/.build-id/" + want.substr(0, 2) + "/" + want.substr(2) + ".debug";
    for (const auto& d : src.debug_dirs)
      if (int fd = try_debug_file(o, Root::kHost, d + rel, want, 0, found_name); fd >= 0) return fd;
    for (Root r : roots)
      if (int fd = try_debug_file(o, r, "/usr/lib/debug" + rel, want, 0, found_name); fd >= 0) return fd;
  }
  if (link.empty()) return -1;
  std::vector<std::pair<Root, std::string>> paths;
  if (link[0] == '/') {
    for (Root r : roots) paths.emplace_back(r, link);
  } else {
    std::string dir = alt && o.debug_found ? dir_name(o.debug_path) : dir_name(o.path);
    for (const auto& d : src.debug_dirs) {
      paths.emplace_back(Root::kHost, d + "/" + link);
      paths.emplace_back(Root::kHost, d + dir + "/" + link);
    }
    // Next to the file first where the file itself was found.
    std::vector<Root> order = roots;
    if (o.opened_in == Root::kHost) order = {Root::kHost};
    for (Root r : order) {
      paths.emplace_back(r, dir + "/" + link);
      paths.emplace_back(r, dir + "/.debug/" + link);
      paths.emplace_back(r, "/usr/lib/debug" + dir + "/" + link);
    }
  }
  for (const auto& [r, p] : paths)
    if (int fd = try_debug_file(o, r, p, want, crc, found_name); fd >= 0) return fd;
  return -1;
}

int Symbolizer::Impl::find_debuginfo_cb(Dwfl_Module* mod, void** userdata, const char*, Dwarf_Addr,
                                        const char*, const char* debuglink, GElf_Word crc,
                                        char** found_name) {
  auto* data = static_cast<CallbackData*>(*userdata);
  if (data == nullptr) return -1;
  return data->impl->find_debug(*data->object, mod, debuglink, crc, found_name);
}

// Only the vDSO is reported without a file (dwfl_report_elf never asks).
int Symbolizer::Impl::find_elf_cb(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, char**,
                                  Elf** elfp) {
  auto* data = static_cast<CallbackData*>(*userdata);
  if (data == nullptr || !data->object->vdso || data->impl->vdso_image.empty()) return -1;
  *elfp = elf_memory(data->impl->vdso_image.data(), data->impl->vdso_image.size());
  return -1;
}

int Symbolizer::Impl::free_userdata(Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, void*) {
  delete static_cast<CallbackData*>(*userdata);
  *userdata = nullptr;
  return DWARF_CB_OK;
}

Frame Symbolizer::Impl::base_frame(const Object& o, uint64_t addr) const {
  Frame f;
  f.module = o.path;
  f.address = addr;
  f.module_offset = o.bias_known ? addr - o.bias : addr - o.map_start + o.map_offset;
  return f;
}

// A PLT stub, named after the function it jumps to ("malloc@plt"): its
// symbol table would name it after whatever precedes .plt, and DWARF has
// nothing there.
void Symbolizer::Impl::plt_frame(Object& o, uint64_t addr, std::vector<Frame>* out) {
  if (!o.plt_read) {
    o.plt_read = true;
    Dwarf_Addr bias = 0;
    o.plt = plt_entries(dwfl_module_getelf(o.mod, &bias));
  }
  Frame f = base_frame(o, addr);
  if (const PltEntry* e = plt_entry_at(o.plt, f.module_offset)) {
    f.function = e->name;
    out->push_back(std::move(f));
  }
}

// The inline chain at `addr` from DWARF: the innermost scope's function
// first, its file:line from the line table; each function it was inlined
// into next, at the call site its inlined instance records (what
// addr2line -i prints). Leaves `out` empty without DWARF for addr.
void Symbolizer::Impl::dwarf_frames(Object& o, uint64_t addr, std::vector<Frame>* out) {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cudie = dwfl_module_addrdie(o.mod, addr, &bias);
  if (cudie == nullptr) return;
  std::string file;
  uint32_t line = 0;
  if (Dwfl_Line* l = dwfl_module_getsrc(o.mod, addr)) {
    int lineno = 0;
    const char* name = dwfl_lineinfo(l, nullptr, &lineno, nullptr, nullptr, nullptr);
    if (name != nullptr) {
      file = name;
      line = static_cast<uint32_t>(lineno);
    }
  }
  auto& slot = o.cus[dwarf_dieoffset(cudie)];
  if (slot == nullptr) slot = index_cu(cudie);
  const CuIndex& cu = *slot;
  int node = innermost_scope(cu, addr - bias);
  if (node < 0) {
    if (!file.empty()) {
      // Line info but no function DIE (assembly): the symbol names it.
      symtab_frame(o, addr, out);
      if (!out->empty()) {
        out->back().file = file;
        out->back().line = line;
      }
    }
    return;
  }
  for (; node >= 0; node = cu.nodes[static_cast<size_t>(node)].parent) {
    Dwarf_Die die = cu.nodes[static_cast<size_t>(node)].die;
    Frame f = base_frame(o, addr);
    f.function = function_name(cu, die);
    f.file = file;
    f.line = line;
    f.inlined = dwarf_tag(&die) == DW_TAG_inlined_subroutine;
    out->push_back(std::move(f));
    if (!out->back().inlined) break;  // the function it all was inlined into
    call_site(&die, &file, &line);
  }
  // A nameless outermost function (artificial code) takes the symbol's name.
  if (!out->empty() && out->back().function.empty()) {
    std::vector<Frame> sym;
    symtab_frame(o, addr, &sym);
    out->back().function = sym.empty() ? "[unknown]" : sym.back().function;
  }
  // An inlined instance whose origin cannot be read (a dwz common file
  // that is missing) still shows where it was.
  for (auto& f : *out)
    if (f.function.empty()) f.function = "[unknown]";
}

void Symbolizer::Impl::symtab_frame(Object& o, uint64_t addr, std::vector<Frame>* out) {
  if (!o.symtab.built) build_symbols(o.mod, o.symtab);
  const SymbolTable::Sym* sym = find_symbol(o.symtab, addr);
  if (sym == nullptr) return;
  Frame f = base_frame(o, addr);
  f.function = demangle(sym->name);
  out->push_back(std::move(f));
}

Symbolizer::Symbolizer(SymbolSource source) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.src = std::move(source);
  if (s.src.pid > 0) {
    std::string root = "/proc/" + std::to_string(s.src.pid) + "/root";
    std::string mnt = "/proc/" + std::to_string(s.src.pid) + "/ns/mnt";
    struct stat theirs {
    }, ours{}, their_ns{}, our_ns{};
    if (::stat(root.c_str(), &theirs) == 0) {
      s.target_root = true;
      // Another root, or the same one with other mounts on it (a private
      // mount namespace can bind another /usr/lib/debug): look in both.
      bool same_root =
          ::stat("/", &ours) == 0 && theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino;
      bool same_ns = ::stat(mnt.c_str(), &their_ns) == 0 && ::stat("/proc/self/ns/mnt", &our_ns) == 0 &&
                     their_ns.st_ino == our_ns.st_ino && their_ns.st_dev == our_ns.st_dev;
      s.distinct_root = !same_root || !same_ns;
    }
  }
  for (const auto& text : s.src.perf_maps) s.jit.add(text);
  // libelf refuses every elf_begin until a version is agreed (libdwfl
  // does this too, but the build-ID checks must not depend on it).
  elf_version(EV_CURRENT);
  s.callbacks.find_elf = Impl::find_elf_cb;
  s.callbacks.find_debuginfo = Impl::find_debuginfo_cb;
  s.callbacks.section_address = dwfl_offline_section_address;
  s.dwfl = dwfl_begin(&s.callbacks);
  s.index_objects();
}

Symbolizer::~Symbolizer() {
  if (impl_->dwfl != nullptr) {
    dwfl_getmodules(impl_->dwfl, Impl::free_userdata, nullptr, 0);
    dwfl_end(impl_->dwfl);
  }
}

bool Symbolizer::is_tool_frame(uint64_t pc) const {
  for (const auto& [start, end] : impl_->tool_ranges)
    if (pc >= start && pc < end) return true;
  return false;
}

std::vector<Frame> Symbolizer::frames_at(uint64_t pc, bool return_address) {
  Impl& s = *impl_;
  // A return address is the instruction after the call; pc - 1 lies in the
  // call itself, so in the calling line and inline scope (perf, addr2line).
  uint64_t addr = return_address && pc > 0 ? pc - 1 : pc;
  if (auto hit = s.cache.find(addr); hit != s.cache.end()) return hit->second;
  std::vector<Frame> out;
  Object* o = s.object_at(addr);
  if (o == nullptr) {
    Frame f;
    f.address = addr;
    f.module_offset = addr;
    if (const std::string* name = s.jit.find(addr)) {
      f.function = *name;
      f.module = "[jit]";
      f.kind = FrameKind::kJit;
      ++s.jit_frames;
    } else {
      f.function = "[unknown]";
      f.kind = FrameKind::kUnknown;
      ++s.unknown_frames;
    }
    out.push_back(std::move(f));
  } else {
    if (!o->loaded && s.dwfl != nullptr) s.load(*o);
    ++o->frames;
    if (o->mod != nullptr) {
      if (!o->dwarf_checked) {
        Dwarf_Addr bias = 0;
        o->dwarf_checked = true;
        o->has_dwarf = dwfl_module_getdwarf(o->mod, &bias) != nullptr;
      }
      s.plt_frame(*o, addr, &out);
      if (out.empty() && o->has_dwarf) s.dwarf_frames(*o, addr, &out);
      if (out.empty()) s.symtab_frame(*o, addr, &out);
    }
    if (out.empty()) {
      Frame f = s.base_frame(*o, addr);
      f.function = o->label + "+" + hex_addr(f.module_offset);
      f.kind = FrameKind::kUnknown;
      out.push_back(std::move(f));
    }
  }
  s.cache.emplace(addr, out);
  return out;
}

std::vector<ObjectWarning> Symbolizer::object_warnings() const {
  const Impl& s = *impl_;
  std::vector<ObjectWarning> out;
  const std::string fix =
      "install its debug symbols (Debian: the -dbgsym/-dbg package), or set REMORA_DEBUG_PATH to a directory "
      "holding .build-id/xx/rest.debug files";
  for (const auto& o : s.objects) {
    if (o->frames == 0) continue;
    const std::string& name = o->path;
    if (o->vdso && o->mod == nullptr) continue;  // another kernel's vDSO: nothing the user can install
    if (o->mod == nullptr) {
      std::string where = s.distinct_root ? " inside the target's root (its container)" : "";
      std::string what = o->mismatch ? "restart the process to profile the installed build, or put the build "
                                       "it loaded back at " +
                                           o->path + where
                                     : "make the file the process loaded readable at " + o->path + where;
      out.push_back({o->path, "symbols: " + name + ": " + o->problem + "; its " + std::to_string(o->frames) +
                                  " addresses read " + o->label + "+0x...; " + what});
    } else if (!o->has_dwarf && !o->vdso) {
      out.push_back(
          {o->path,
           "symbols: no debug info for " + o->path + " (build ID " +
               (o->build_id.empty() ? std::string("none") : o->build_id) + "): its " +
               std::to_string(o->frames) +
               " addresses are named from its symbol table only, without source lines and inline frames; " +
               fix});
    }
  }
  if (s.unknown_frames > 0) {
    std::string pid = std::to_string(s.src.ns_pid > 0 ? s.src.ns_pid : s.src.pid);
    out.push_back(
        {"", "symbols: " + std::to_string(s.unknown_frames) + " addresses lie outside every loaded object" +
                 (s.jit.empty() ? std::string(" and no perf map names them")
                                : std::string(" and the perf map does not name them")) +
                 ": they read [unknown]; for JIT code have the runtime write /tmp/perf-" + pid +
                 ".map (node --perf-basic-prof; a JVM: jcmd " + pid + " Compiler.perfmap) while it runs"});
  }
  return out;
}

std::vector<std::string> Symbolizer::warnings() const {
  std::vector<std::string> out;
  for (auto& w : object_warnings()) out.push_back(std::move(w.text));
  return out;
}

std::optional<ObjectNaming> Symbolizer::object_naming(uint64_t pc, bool return_address) const {
  const uint64_t addr = return_address && pc > 0 ? pc - 1 : pc;
  const Object* o = impl_->object_at(addr);
  if (o == nullptr) return std::nullopt;
  ObjectNaming n;
  n.path = o->path;
  n.build_id = o->build_id.empty() ? o->want_build_id : o->build_id;
  n.level = o->mod == nullptr ? DebugLevel::kNone : o->has_dwarf ? DebugLevel::kDwarf : DebugLevel::kSymtab;
  return n;
}

}  // namespace remora::profile
