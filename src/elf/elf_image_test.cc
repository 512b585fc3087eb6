#include "elf/elf_image.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <link.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <latch>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "base/unique_fd.h"

namespace remora::elf {
namespace {

// The host's ELF machine, as this test program's own header says it
// (e_machine, at offset 18 of every ELF header).
uint16_t host_machine() {
  static const uint16_t machine = [] {
    std::ifstream in("/proc/self/exe", std::ios::binary);
    char header[20] = {};
    in.read(header, sizeof header);
    uint16_t m = EM_NONE;
    if (in) std::memcpy(&m, header + 18, 2);
    return m;
  }();
  return machine;
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

Elf64_Ehdr get_ehdr(const std::vector<std::byte>& bytes) {
  Elf64_Ehdr eh{};
  std::memcpy(&eh, bytes.data(), std::min(bytes.size(), sizeof eh));
  return eh;
}

// The section headers of a file image, read by hand for the tests below.
std::vector<Elf64_Shdr> section_headers(const std::vector<std::byte>& bytes) {
  const Elf64_Ehdr eh = get_ehdr(bytes);
  std::vector<Elf64_Shdr> out(eh.e_shnum);
  if (eh.e_shoff == 0 || eh.e_shoff + out.size() * sizeof(Elf64_Shdr) > bytes.size()) return {};
  std::memcpy(out.data(), bytes.data() + eh.e_shoff, out.size() * sizeof(Elf64_Shdr));
  return out;
}

void put_ehdr(std::vector<std::byte>& bytes, const Elf64_Ehdr& eh) {
  std::memcpy(bytes.data(), &eh, sizeof eh);
}

// Forces the PT_DYNAMIC route: the file without its section header table.
std::vector<std::byte> without_section_headers(std::vector<std::byte> bytes) {
  Elf64_Ehdr eh = get_ehdr(bytes);
  eh.e_shoff = 0;
  eh.e_shnum = 0;
  eh.e_shstrndx = 0;
  put_ehdr(bytes, eh);
  return bytes;
}

std::shared_ptr<const ElfImage> load_bytes(std::vector<std::byte> bytes) {
  auto r = ElfImage::from_file_bytes(std::move(bytes));
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return r.ok() ? *r : nullptr;
}

std::shared_ptr<const ElfImage> load_path(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_TRUE(fd.valid()) << path;
  auto r = ElfImage::from_fd(fd.get());
  EXPECT_TRUE(r.ok()) << path << ": " << r.error().to_string();
  return r.ok() ? *r : nullptr;
}

// ---------------------------------------------------------------- hashes

TEST(ElfHash, GnuHashKnownValues) {
  EXPECT_EQ(gnu_hash(""), 5381u);
  EXPECT_EQ(gnu_hash("printf"), 0x156b2bb8u);
  EXPECT_EQ(gnu_hash("exit"), 0x7c967e3fu);
  EXPECT_EQ(gnu_hash("syscall"), 0xbac212a0u);
  EXPECT_EQ(gnu_hash("flapenguin.me"), 0x8ae9f18eu);
}

TEST(ElfHash, SysvHashKnownValues) {
  EXPECT_EQ(sysv_hash(""), 0u);
  EXPECT_EQ(sysv_hash("printf"), 0x077905a6u);
  EXPECT_EQ(sysv_hash("exit"), 0x0006cf04u);
  EXPECT_EQ(sysv_hash("syscall"), 0x0b09985cu);
  EXPECT_EQ(sysv_hash("freelocale"), 0x0c335095u);  // exercises the high-nibble fold
}

// ---------------------------------------------------------------- notes

void append_u32(std::vector<std::byte>& v, uint32_t x) {
  const auto* p = reinterpret_cast<const std::byte*>(&x);
  v.insert(v.end(), p, p + 4);
}

void append_padded(std::vector<std::byte>& v, std::string_view data, bool pad) {
  for (char c : data) v.push_back(static_cast<std::byte>(c));
  if (pad)
    while (v.size() % 4 != 0) v.push_back(std::byte{0});
}

// One note: the header says namesz/descsz; `name` and `desc` are the bytes
// actually written (padded to 4 unless pad is false).
std::vector<std::byte> note(uint32_t namesz, std::string_view name, uint32_t type, uint32_t descsz,
                            std::string_view desc, bool pad = true) {
  std::vector<std::byte> v;
  append_u32(v, namesz);
  append_u32(v, descsz);
  append_u32(v, type);
  append_padded(v, name, true);
  append_padded(v, desc, pad);
  return v;
}

std::vector<std::byte> concat(std::vector<std::byte> a, const std::vector<std::byte>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::string kId20 = "0123456789abcdefghij";
const std::string_view kGnu("GNU\0", 4);

enum class NoteOutcome { kFound, kNone, kError };

struct NoteCase {
  const char* name;
  std::vector<std::byte> blob;
  NoteOutcome outcome;
};

TEST(ElfNotes, Table) {
  std::vector<std::byte> valid = note(4, kGnu, NT_GNU_BUILD_ID, 20, kId20);
  std::vector<std::byte> abi_tag = note(4, kGnu, NT_GNU_ABI_TAG, 16, std::string(16, '\1'));
  std::vector<std::byte> truncated(valid.begin(), valid.begin() + 8);
  std::vector<std::byte> trailing = concat(valid, std::vector<std::byte>(4, std::byte{0}));
  std::vector<std::byte> cut_desc(valid.begin(), valid.end() - 1);
  const NoteCase cases[] = {
      {"build id", valid, NoteOutcome::kFound},
      {"after another note", concat(abi_tag, valid), NoteOutcome::kFound},
      {"empty area", {}, NoteOutcome::kNone},
      {"only an ABI tag", abi_tag, NoteOutcome::kNone},
      {"wrong name GNV", note(4, std::string_view("GNV\0", 4), NT_GNU_BUILD_ID, 20, kId20),
       NoteOutcome::kNone},
      {"namesz 3 (no NUL)", note(3, "GNU", NT_GNU_BUILD_ID, 20, kId20), NoteOutcome::kNone},
      {"wrong type", note(4, kGnu, 99, 20, kId20), NoteOutcome::kNone},
      {"truncated header", truncated, NoteOutcome::kError},
      {"trailing partial header", trailing, NoteOutcome::kError},
      {"desc cut short", cut_desc, NoteOutcome::kError},
      {"descsz overflow", note(4, kGnu, NT_GNU_BUILD_ID, 0xffffffffu, kId20), NoteOutcome::kError},
      {"namesz overflow", note(0xfffffffdu, kGnu, NT_GNU_BUILD_ID, 20, kId20), NoteOutcome::kError},
      {"misaligned desc (descsz 5, unpadded)", note(4, kGnu, NT_GNU_BUILD_ID, 5, "abcde", false),
       NoteOutcome::kError},
      {"build id of 0 bytes", note(4, kGnu, NT_GNU_BUILD_ID, 0, ""), NoteOutcome::kError},
      {"build id of 68 bytes", note(4, kGnu, NT_GNU_BUILD_ID, 68, std::string(68, 'x')), NoteOutcome::kError},
      {"malformed note after the build id", concat(valid, truncated), NoteOutcome::kError},
  };
  for (const NoteCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = find_build_id_in_notes(c.blob);
    switch (c.outcome) {
      case NoteOutcome::kFound:
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        ASSERT_TRUE(r->has_value());
        EXPECT_EQ((*r)->size(), 20u);
        EXPECT_EQ(std::memcmp((*r)->data(), kId20.data(), 20), 0);
        break;
      case NoteOutcome::kNone:
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        EXPECT_FALSE(r->has_value());
        break;
      case NoteOutcome::kError:
        ASSERT_FALSE(r.ok());
        EXPECT_EQ(r.error().code(), Errc::kParse);
        EXPECT_FALSE(r.error().message().empty());
        break;
    }
  }
}

// ---------------------------------------------------------------- malformed headers

TEST(ElfMalformed, HeadersAreRejectedWithParseErrors) {
  const std::vector<std::byte> good = read_file(REMORA_ELF_FIXTURE_GNU);
  ASSERT_GT(good.size(), sizeof(Elf64_Ehdr));
  struct Case {
    const char* name;
    std::function<void(std::vector<std::byte>&, Elf64_Ehdr&)> mutate;
    const char* message_part;
  };
  const Case cases[] = {
      {"truncated", [](auto& b, auto&) { b.resize(10); }, "truncated"},
      {"empty", [](auto& b, auto&) { b.clear(); }, "truncated"},
      {"bad magic", [](auto&, auto& eh) { eh.e_ident[EI_MAG1] = 'X'; }, "magic"},
      {"ELF32", [](auto&, auto& eh) { eh.e_ident[EI_CLASS] = ELFCLASS32; }, "ELFCLASS32"},
      {"class 7", [](auto&, auto& eh) { eh.e_ident[EI_CLASS] = 7; }, "class"},
      {"big-endian", [](auto&, auto& eh) { eh.e_ident[EI_DATA] = ELFDATA2MSB; }, "big-endian"},
      {"version 0", [](auto&, auto& eh) { eh.e_ident[EI_VERSION] = 0; }, "version"},
      {"relocatable", [](auto&, auto& eh) { eh.e_type = ET_REL; }, "ET_DYN"},
      {"no program headers", [](auto&, auto& eh) { eh.e_phnum = 0; }, "no program headers"},
      {"PN_XNUM", [](auto&, auto& eh) { eh.e_phnum = PN_XNUM; }, "PN_XNUM"},
      {"phentsize 32", [](auto&, auto& eh) { eh.e_phentsize = 32; }, "entry size"},
      {"phoff beyond file", [](auto& b, auto& eh) { eh.e_phoff = b.size() - 10; }, "beyond the end"},
      {"phoff wraps", [](auto&, auto& eh) { eh.e_phoff = ~uint64_t{0} - 8; }, "beyond the end"},
      {"phnum overflow", [](auto&, auto& eh) { eh.e_phnum = 0xfffe; }, "beyond the end"},
      {"shoff beyond file", [](auto& b, auto& eh) { eh.e_shoff = b.size() + 4096; }, "beyond the end"},
      {"shoff wraps", [](auto&, auto& eh) { eh.e_shoff = ~uint64_t{0} - 16; }, ""},
      {"shnum too large", [](auto&, auto& eh) { eh.e_shnum = 0xff00; }, "beyond the end"},
      {"shentsize 40", [](auto&, auto& eh) { eh.e_shentsize = 40; }, "entry size"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::byte> bytes = good;
    Elf64_Ehdr eh = get_ehdr(bytes);
    c.mutate(bytes, eh);
    if (bytes.size() >= sizeof eh) put_ehdr(bytes, eh);
    auto r = ElfImage::from_file_bytes(bytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), Errc::kParse) << r.error().to_string();
    EXPECT_NE(r.error().to_string().find(c.message_part), std::string::npos) << r.error().to_string();
  }
}

TEST(ElfMalformed, FromFdErrors) {
  auto bad = ElfImage::from_fd(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), Errc::kIo);

  char path[] = "/tmp/remora_elf_test_XXXXXX";
  UniqueFd fd(::mkstemp(path));
  ASSERT_TRUE(fd.valid());
  ::unlink(path);
  const char junk[] = "this is not an ELF file, just text";
  ASSERT_EQ(::write(fd.get(), junk, sizeof junk), static_cast<ssize_t>(sizeof junk));
  auto r = ElfImage::from_fd(fd.get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kParse);
}

// ---------------------------------------------------------------- fixture files

struct Variant {
  const char* name;
  const char* path;
  bool strip_section_headers;  // force the PT_DYNAMIC route
  bool has_symtab;
  bool has_build_id;
  const char* soname;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class ElfFixture : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    std::vector<std::byte> bytes = read_file(GetParam().path);
    ASSERT_GT(bytes.size(), 0u) << GetParam().path;
    if (GetParam().strip_section_headers) {
      image_ = load_bytes(without_section_headers(std::move(bytes)));
    } else {
      image_ = load_path(GetParam().path);
    }
    ASSERT_NE(image_, nullptr);
  }
  std::shared_ptr<const ElfImage> image_;
};

TEST_P(ElfFixture, HeaderFacts) {
  EXPECT_EQ(image_->type(), ET_DYN);
  EXPECT_EQ(image_->machine(), host_machine());
  EXPECT_TRUE(image_->has_dynamic());
  EXPECT_FALSE(image_->has_interp());
  EXPECT_GE(image_->load_segments().size(), 2u);
  EXPECT_EQ(image_->soname(), GetParam().soname);
  if (GetParam().has_build_id) {
    EXPECT_EQ(image_->build_id().size(), 20u);  // sha1
    EXPECT_EQ(image_->build_id_hex().size(), 40u);
  } else {
    EXPECT_TRUE(image_->build_id().empty());
    EXPECT_EQ(image_->build_id_hex(), "");
  }
}

TEST_P(ElfFixture, ExportedSymbolsFound) {
  for (std::string name : {"remora_fixture_add", "remora_fixture_answer", "remora_fixture_strlen",
                           "remora_fixture_f10", "remora_fixture_f47", "remora_fixture_f87"}) {
    SCOPED_TRACE(name);
    auto sym = image_->find_symbol(name);
    ASSERT_TRUE(sym.has_value());
    EXPECT_EQ(sym->name, name);
    EXPECT_EQ(sym->type, STT_FUNC);
    EXPECT_EQ(sym->bind, STB_GLOBAL);
    EXPECT_NE(sym->shndx, SHN_UNDEF);
    const LoadSegment* seg = image_->segment_for(sym->value);
    ASSERT_NE(seg, nullptr);
    EXPECT_TRUE(seg->flags & PF_X);
  }
  auto ifunc = image_->find_symbol("remora_fixture_ifunc");
  ASSERT_TRUE(ifunc.has_value());
  EXPECT_EQ(ifunc->type, STT_GNU_IFUNC);

  auto data = image_->find_symbol("remora_fixture_data");
  ASSERT_TRUE(data.has_value());
  EXPECT_EQ(data->type, STT_OBJECT);
  EXPECT_EQ(data->size, sizeof(int));
  const LoadSegment* seg = image_->segment_for(data->value);
  ASSERT_NE(seg, nullptr);
  EXPECT_FALSE(seg->flags & PF_X);
}

TEST_P(ElfFixture, UndefinedAndMissingSymbolsNotFound) {
  EXPECT_FALSE(image_->find_symbol("strlen").has_value());  // UND in .dynsym
  EXPECT_FALSE(image_->find_symbol("remora_fixture_nonexistent").has_value());
  EXPECT_FALSE(image_->find_symbol("").has_value());
  EXPECT_FALSE(image_->find_symbol("remora_fixture_f").has_value());
}

TEST_P(ElfFixture, LocalSymbolsOnlyWithSymtab) {
  auto local = image_->find_symbol("remora_fixture_local_helper");
  auto hidden = image_->find_symbol("remora_fixture_hidden");
  EXPECT_EQ(local.has_value(), GetParam().has_symtab);
  EXPECT_EQ(hidden.has_value(), GetParam().has_symtab);
  if (local) {
    EXPECT_EQ(local->bind, STB_LOCAL);
    EXPECT_EQ(local->type, STT_FUNC);
  }
}

TEST_P(ElfFixture, FunctionSymbols) {
  auto funcs = image_->function_symbols();
  std::set<std::pair<uint64_t, std::string>> seen;
  std::set<std::string> exported;
  for (const Symbol& s : funcs) {
    EXPECT_TRUE(seen.emplace(s.value, s.name).second) << "duplicate " << s.name;
    EXPECT_NE(s.shndx, SHN_UNDEF) << s.name;
    EXPECT_TRUE(s.type == STT_FUNC || s.type == STT_GNU_IFUNC) << s.name;
    if (s.name.rfind("remora_fixture_f", 0) == 0 && s.bind == STB_GLOBAL) exported.insert(s.name);
  }
  EXPECT_EQ(exported.size(), 64u);
  bool has_local = std::any_of(funcs.begin(), funcs.end(),
                               [](const Symbol& s) { return s.name == "remora_fixture_local_helper"; });
  EXPECT_EQ(has_local, GetParam().has_symtab);
  EXPECT_FALSE(std::any_of(funcs.begin(), funcs.end(), [](const Symbol& s) { return s.name == "strlen"; }));
}

TEST_P(ElfFixture, SegmentFor) {
  EXPECT_EQ(image_->segment_for(~uint64_t{0} - 1), nullptr);
  const LoadSegment& first = image_->load_segments().front();
  EXPECT_EQ(image_->segment_for(first.vaddr), &first);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ElfFixture,
    ::testing::Values(
        Variant{"gnu", REMORA_ELF_FIXTURE_GNU, false, true, true, "libremora_elf_fixture_gnu.so"},
        Variant{"sysv", REMORA_ELF_FIXTURE_SYSV, false, true, true, "libremora_elf_fixture_sysv.so"},
        Variant{"both_no_build_id", REMORA_ELF_FIXTURE_BOTH, false, true, false,
                "libremora_elf_fixture_both.so"},
        Variant{"stripped", REMORA_ELF_FIXTURE_STRIPPED, false, false, true, "libremora_elf_fixture_gnu.so"},
        Variant{"gnu_no_sections", REMORA_ELF_FIXTURE_GNU, true, false, true, "libremora_elf_fixture_gnu.so"},
        Variant{"sysv_no_sections", REMORA_ELF_FIXTURE_SYSV, true, false, true,
                "libremora_elf_fixture_sysv.so"},
        Variant{"both_no_sections", REMORA_ELF_FIXTURE_BOTH, true, false, false,
                "libremora_elf_fixture_both.so"},
        Variant{"stripped_no_sections", REMORA_ELF_FIXTURE_STRIPPED, true, false, true,
                "libremora_elf_fixture_gnu.so"}),
    [](const ::testing::TestParamInfo<Variant>& param_info) { return std::string(param_info.param.name); });

// The section route and the PT_DYNAMIC route agree on every dynamic symbol.
TEST(ElfRoutes, SectionAndDynamicRoutesAgree) {
  for (const char* path : {REMORA_ELF_FIXTURE_GNU, REMORA_ELF_FIXTURE_SYSV, REMORA_ELF_FIXTURE_BOTH}) {
    SCOPED_TRACE(path);
    auto stripped = load_bytes(without_section_headers(read_file(path)));
    auto full = load_path(path);
    ASSERT_TRUE(stripped && full);
    EXPECT_EQ(stripped->build_id(), full->build_id());
    auto dyn_funcs = stripped->function_symbols();
    ASSERT_FALSE(dyn_funcs.empty());
    for (const Symbol& s : dyn_funcs) {
      auto other = full->find_symbol(s.name);
      ASSERT_TRUE(other.has_value()) << s.name;
      EXPECT_EQ(other->value, s.value) << s.name;
      EXPECT_EQ(other->size, s.size) << s.name;
    }
  }
  // strip(1) keeps the layout: addresses and build id are unchanged.
  auto gnu = load_path(REMORA_ELF_FIXTURE_GNU);
  auto stripped = load_path(REMORA_ELF_FIXTURE_STRIPPED);
  ASSERT_TRUE(gnu && stripped);
  EXPECT_EQ(gnu->build_id_hex(), stripped->build_id_hex());
  EXPECT_EQ(gnu->find_symbol("remora_fixture_add")->value,
            stripped->find_symbol("remora_fixture_add")->value);
}

TEST(ElfVersions, DefaultVersionPreferred) {
  auto full = load_path(REMORA_ELF_FIXTURE_VERSIONED);
  ASSERT_TRUE(full);
  auto v1 = full->find_symbol("remora_vfunc_v1");  // .symtab (local)
  auto v2 = full->find_symbol("remora_vfunc_v2");
  ASSERT_TRUE(v1 && v2);
  ASSERT_NE(v1->value, v2->value);
  auto f = full->find_symbol("remora_vfunc");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->value, v2->value);
  auto dyn = load_bytes(without_section_headers(read_file(REMORA_ELF_FIXTURE_VERSIONED)));
  ASSERT_TRUE(dyn);
  auto g = dyn->find_symbol("remora_vfunc");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->value, v2->value);
  EXPECT_TRUE(dyn->find_symbol("remora_vother").has_value());
  // .symtab spells the versions out (binutils >= 2.35, Debian 12 has 2.40);
  // exact names match too.
  auto exact = full->find_symbol("remora_vfunc@@REMORA_V2");
  ASSERT_TRUE(exact.has_value());
  EXPECT_EQ(exact->value, v2->value);
  auto old_version = full->find_symbol("remora_vfunc@REMORA_V1");
  ASSERT_TRUE(old_version.has_value());
  EXPECT_EQ(old_version->value, v1->value);
  // "name" finds a .symtab-only "name@@VER" (the default version) ...
  auto hidden = full->find_symbol("remora_hfunc");
  auto hidden_impl = full->find_symbol("remora_hfunc_impl");
  ASSERT_TRUE(hidden && hidden_impl);
  EXPECT_EQ(hidden->name, "remora_hfunc@@REMORA_V2");
  EXPECT_EQ(hidden->value, hidden_impl->value);
  EXPECT_FALSE(dyn->find_symbol("remora_hfunc").has_value());
  // ... but never a non-default "name@VER" or a prefix.
  EXPECT_FALSE(full->find_symbol("remora_hfunc@@REMORA").has_value());
  EXPECT_FALSE(full->find_symbol("remora_hfun").has_value());
  // Both versions are functions at different addresses.
  int vfuncs = 0;
  for (const Symbol& s : dyn->function_symbols()) vfuncs += s.name == "remora_vfunc";
  EXPECT_EQ(vfuncs, 2);
}

// ---------------------------------------------------------------- memory

struct ReadableRange {
  uint64_t lo, hi;
};

struct MapsLine {
  uint64_t start, end, offset;
  std::string perms, path;
};

std::vector<MapsLine> self_maps() {
  std::vector<MapsLine> out;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    MapsLine m;
    std::string range, dev, inode;
    ls >> range >> m.perms >> std::hex >> m.offset >> dev >> inode;
    std::getline(ls >> std::ws, m.path);
    auto dash = range.find('-');
    m.start = std::stoull(range.substr(0, dash), nullptr, 16);
    m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    out.push_back(m);
  }
  return out;
}

// A ReadFn over this process's memory, refusing anything /proc/self/maps does
// not show readable, so that a parser bug reads as an error, not a SIGSEGV.
ReadFn self_reader() {
  std::vector<ReadableRange> ranges;
  for (const MapsLine& m : self_maps()) {
    if (m.perms.empty() || m.perms[0] != 'r') continue;
    if (!ranges.empty() && ranges.back().hi == m.start) {
      ranges.back().hi = m.end;
    } else {
      ranges.push_back({m.start, m.end});
    }
  }
  return [ranges](uint64_t addr, std::span<std::byte> out) -> Result<void> {
    for (const ReadableRange& r : ranges) {
      if (addr >= r.lo && addr <= r.hi && out.size() <= r.hi - addr) {
        std::memcpy(out.data(), reinterpret_cast<const void*>(addr), out.size());
        return ok();
      }
    }
    return Error(Errc::kFault, "address " + std::to_string(addr) + " is not readable");
  };
}

struct DlHandle {
  explicit DlHandle(const char* path, int flags = RTLD_NOW | RTLD_LOCAL) : h(::dlopen(path, flags)) {}
  ~DlHandle() {
    if (h) ::dlclose(h);
  }
  DlHandle(const DlHandle&) = delete;
  DlHandle& operator=(const DlHandle&) = delete;
  void* h;
};

struct Loaded {
  uint64_t base = 0;  // address of the ELF header
  uint64_t bias = 0;  // link_map l_addr
  std::string path;
};

Loaded loaded_info(void* handle, const char* some_symbol) {
  Loaded out;
  void* sym = ::dlsym(handle, some_symbol);
  Dl_info info{};
  if (sym && ::dladdr(sym, &info)) {
    out.base = reinterpret_cast<uint64_t>(info.dli_fbase);
    out.path = info.dli_fname;
  }
  struct link_map* lm = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm) out.bias = lm->l_addr;
  return out;
}

TEST(ElfMemory, LoadedFixtureMatchesDlsym) {
  for (const char* path : {REMORA_ELF_FIXTURE_GNU, REMORA_ELF_FIXTURE_SYSV, REMORA_ELF_FIXTURE_BOTH}) {
    SCOPED_TRACE(path);
    DlHandle lib(path);
    ASSERT_NE(lib.h, nullptr) << ::dlerror();
    Loaded l = loaded_info(lib.h, "remora_fixture_add");
    ASSERT_NE(l.base, 0u);
    auto mem = ElfImage::from_memory(l.base, self_reader());
    ASSERT_TRUE(mem.ok()) << mem.error().to_string();
    auto file = load_path(path);
    ASSERT_TRUE(file);
    EXPECT_EQ((*mem)->build_id(), file->build_id());
    EXPECT_EQ((*mem)->soname(), file->soname());
    EXPECT_EQ((*mem)->load_segments().size(), file->load_segments().size());
    for (const char* name : {"remora_fixture_add", "remora_fixture_answer", "remora_fixture_f33",
                             "remora_fixture_data", "remora_fixture_strlen"}) {
      SCOPED_TRACE(name);
      auto sym = (*mem)->find_symbol(name);
      ASSERT_TRUE(sym.has_value());
      EXPECT_EQ(sym->value + l.bias, reinterpret_cast<uint64_t>(::dlsym(lib.h, name)));
      EXPECT_EQ(sym->value, file->find_symbol(name)->value);
    }
    EXPECT_FALSE((*mem)->find_symbol("strlen").has_value());
    EXPECT_FALSE((*mem)->find_symbol("remora_fixture_local_helper").has_value());
    // Calling through the address we computed gives the fixture's answer.
    auto answer = (*mem)->find_symbol("remora_fixture_answer");
    ASSERT_TRUE(answer);
    auto fn = reinterpret_cast<int (*)()>(answer->value + l.bias);
    EXPECT_EQ(fn(), 42);
  }
}

// build_id_mapped_at: one read of the Build ID note where the file has it,
// at a given bias. True for the image loaded there; false at another bias,
// for another file's image there, for a file without a Build ID, and for a
// bias where nothing is readable.
TEST(ElfMemory, BuildIdMappedAtNamesTheImageAtThatBias) {
  DlHandle gnu(REMORA_ELF_FIXTURE_GNU), sysv(REMORA_ELF_FIXTURE_SYSV), both(REMORA_ELF_FIXTURE_BOTH);
  ASSERT_TRUE(gnu.h && sysv.h && both.h) << ::dlerror();
  const Loaded g = loaded_info(gnu.h, "remora_fixture_add"), s = loaded_info(sysv.h, "remora_fixture_add");
  const Loaded b = loaded_info(both.h, "remora_fixture_add");
  auto gnu_file = load_path(REMORA_ELF_FIXTURE_GNU), sysv_file = load_path(REMORA_ELF_FIXTURE_SYSV);
  auto both_file = load_path(REMORA_ELF_FIXTURE_BOTH);
  ASSERT_TRUE(gnu_file && sysv_file && both_file);
  ASSERT_NE(gnu_file->build_id(), sysv_file->build_id());
  int reads = 0;
  const ReadFn self = self_reader();
  const ReadFn counted = [&](uint64_t addr, std::span<std::byte> out) {
    ++reads;
    return self(addr, out);
  };
  EXPECT_TRUE(gnu_file->build_id_mapped_at(g.bias, counted));
  EXPECT_EQ(reads, 1);
  EXPECT_TRUE(sysv_file->build_id_mapped_at(s.bias, counted));
  EXPECT_FALSE(gnu_file->build_id_mapped_at(s.bias, counted));  // another file's image there
  EXPECT_FALSE(sysv_file->build_id_mapped_at(g.bias, counted));
  EXPECT_FALSE(gnu_file->build_id_mapped_at(g.bias + 4096, counted));
  EXPECT_FALSE(gnu_file->build_id_mapped_at(0x1000, counted));  // nothing readable there
  ASSERT_TRUE(both_file->build_id().empty());
  EXPECT_FALSE(both_file->build_id_mapped_at(b.bias, counted));  // no Build ID: unknown
}

TEST(ElfMemory, VersionedFixtureMatchesDlsym) {
  DlHandle lib(REMORA_ELF_FIXTURE_VERSIONED);
  ASSERT_NE(lib.h, nullptr) << ::dlerror();
  Loaded l = loaded_info(lib.h, "remora_vother");
  auto mem = ElfImage::from_memory(l.base, self_reader());
  ASSERT_TRUE(mem.ok()) << mem.error().to_string();
  auto sym = (*mem)->find_symbol("remora_vfunc");
  ASSERT_TRUE(sym);
  EXPECT_EQ(sym->value + l.bias, reinterpret_cast<uint64_t>(::dlsym(lib.h, "remora_vfunc")));
  EXPECT_EQ(reinterpret_cast<int (*)()>(sym->value + l.bias)(), 2);
}

TEST(ElfMemory, LibcFromMemoryAndFileMatchDlsym) {
  DlHandle libc("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(libc.h, nullptr) << ::dlerror();
  Loaded l = loaded_info(libc.h, "getpid");
  ASSERT_NE(l.base, 0u);
  auto mem = ElfImage::from_memory(l.base, self_reader());
  ASSERT_TRUE(mem.ok()) << mem.error().to_string();
  auto file = load_path(l.path);
  ASSERT_TRUE(file);
  EXPECT_FALSE(file->build_id().empty());
  EXPECT_EQ((*mem)->build_id_hex(), file->build_id_hex());
  EXPECT_EQ((*mem)->soname(), "libc.so.6");
  // pthread_cond_wait and realpath have an old, hidden version next to the
  // default one on x86_64; dlsym returns the default.
  for (const char* name : {"getpid", "pthread_cond_wait", "realpath", "fopen", "dlopen", "qsort"}) {
    SCOPED_TRACE(name);
    void* expected = ::dlsym(libc.h, name);
    if (!expected) continue;
    auto m = (*mem)->find_symbol(name);
    auto f = file->find_symbol(name);
    ASSERT_TRUE(m && f);
    EXPECT_EQ(m->value + l.bias, reinterpret_cast<uint64_t>(expected));
    EXPECT_EQ(m->value, f->value);
  }
}

// Resident tables: a file that is the build of libc this process runs views
// its .dynsym, .dynstr, .gnu.version and .gnu.hash in our own libc instead
// of copying them, and only where the bytes are the same; lookups answer
// the same.
struct LibcFile {
  std::string path;
  std::vector<std::byte> bytes;
  std::optional<Elf64_Shdr> section(uint32_t type, std::string_view name = {}) const {
    const std::vector<Elf64_Shdr> shdrs = section_headers(bytes);
    if (shdrs.empty()) return std::nullopt;
    const Elf64_Shdr& names = shdrs.at(get_ehdr(bytes).e_shstrndx);
    for (const Elf64_Shdr& sh : shdrs) {
      const char* n = reinterpret_cast<const char*>(bytes.data()) + names.sh_offset + sh.sh_name;
      if (sh.sh_type == type && (name.empty() || name == n)) return sh;
    }
    return std::nullopt;
  }
};

LibcFile this_libc() {
  Dl_info info{};
  EXPECT_NE(::dladdr(reinterpret_cast<void*>(&::getpid), &info), 0);
  LibcFile f{info.dli_fname, read_file(info.dli_fname)};
  EXPECT_GT(f.bytes.size(), sizeof(Elf64_Ehdr)) << f.path;
  return f;
}

void expect_same_lookups(const ElfImage& a, const ElfImage& b) {
  for (const char* name : {"getpid", "pthread_cond_wait", "realpath", "fopen", "dlopen", "qsort", "malloc",
                           "pthread_create", "__libc_start_main", "no_such_symbol_anywhere"}) {
    SCOPED_TRACE(name);
    auto x = a.find_symbol(name), y = b.find_symbol(name);
    ASSERT_EQ(x.has_value(), y.has_value());
    if (x) {
      EXPECT_EQ(x->value, y->value);
    }
  }
  auto fa = a.function_symbols(), fb = b.function_symbols();
  ASSERT_EQ(fa.size(), fb.size());
  for (size_t i = 0; i < fa.size(); ++i) {
    EXPECT_EQ(fa[i].name, fb[i].name);
    EXPECT_EQ(fa[i].value, fb[i].value);
  }
}

TEST(ElfResident, ThisProcessLibcAndLoaderAreViewedInPlace) {
  LibcFile libc = this_libc();
  auto dynsym = libc.section(SHT_DYNSYM), gnu = libc.section(SHT_GNU_HASH);
  auto versym = libc.section(SHT_GNU_versym);
  ASSERT_TRUE(dynsym && gnu && versym) << libc.path;
  auto dynstr = libc.section(SHT_STRTAB, ".dynstr");
  ASSERT_TRUE(dynstr);
  auto file = load_path(libc.path);
  ASSERT_TRUE(file);
  // All of .dynsym, .dynstr, .gnu.version and the GNU hash but its 16-byte header.
  EXPECT_EQ(file->borrowed_table_bytes(),
            dynsym->sh_size + dynstr->sh_size + versym->sh_size + gnu->sh_size - 16);

  // The same bytes with another Build ID are another build: copied.
  std::vector<std::byte> other = libc.bytes;
  auto note = libc.section(SHT_NOTE, ".note.gnu.build-id");
  ASSERT_TRUE(note);
  other[note->sh_offset + note->sh_size - 1] ^= std::byte{0xff};
  auto copied = load_bytes(other);
  ASSERT_TRUE(copied);
  EXPECT_NE(copied->build_id(), file->build_id());
  EXPECT_EQ(copied->borrowed_table_bytes(), 0u);
  expect_same_lookups(*file, *copied);

  // The dynamic loader is resident too.
  Dl_info loader{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(::getauxval(AT_BASE)), &loader), 0);
  auto ld = load_path(loader.dli_fname);
  ASSERT_TRUE(ld);
  EXPECT_GT(ld->borrowed_table_bytes(), 0u) << loader.dli_fname;

  // A PT_DYNAMIC-only copy (no section headers) is read as before: copied.
  auto dynamic_route = load_bytes(without_section_headers(libc.bytes));
  ASSERT_TRUE(dynamic_route);
  EXPECT_EQ(dynamic_route->borrowed_table_bytes(), 0u);
}

TEST(ElfResident, OnlyTheSameBytesAreViewed) {
  LibcFile libc = this_libc();
  auto dynstr = libc.section(SHT_STRTAB, ".dynstr");
  ASSERT_TRUE(dynstr);
  auto whole = load_path(libc.path);
  ASSERT_TRUE(whole);
  ASSERT_TRUE(whole->find_symbol("qsort"));
  // The same Build ID, one name changed: "qsort" becomes "qsorT". The
  // names are copied from this file (the lookup misses, as in the file);
  // the tables that did not change are still viewed in place.
  std::vector<std::byte> changed = libc.bytes;
  const char* names = reinterpret_cast<const char*>(changed.data()) + dynstr->sh_offset;
  std::string_view all(names, dynstr->sh_size);
  size_t at = std::string_view::npos;
  for (size_t pos = all.find("qsort"); pos != std::string_view::npos; pos = all.find("qsort", pos + 1))
    if ((pos == 0 || all[pos - 1] == '\0') && pos + 5 < all.size() && all[pos + 5] == '\0') at = pos;
  ASSERT_NE(at, std::string_view::npos);
  changed[dynstr->sh_offset + at + 4] = std::byte{'T'};
  auto image = load_bytes(changed);
  ASSERT_TRUE(image);
  EXPECT_EQ(image->build_id(), whole->build_id());
  EXPECT_EQ(image->borrowed_table_bytes(), whole->borrowed_table_bytes() - dynstr->sh_size);
  EXPECT_FALSE(image->find_symbol("qsort"));
  EXPECT_TRUE(image->find_symbol("malloc"));
  EXPECT_EQ(image->find_symbol("malloc")->value, whole->find_symbol("malloc")->value);
}

// A library this process loaded with dlopen can be unloaded: never viewed.
TEST(ElfResident, LibrariesThatCanBeUnloadedAreCopied) {
  DlHandle lib(REMORA_ELF_FIXTURE_GNU);
  ASSERT_NE(lib.h, nullptr) << ::dlerror();
  auto file = load_path(REMORA_ELF_FIXTURE_GNU);
  ASSERT_TRUE(file);
  EXPECT_FALSE(file->build_id().empty());
  EXPECT_EQ(file->borrowed_table_bytes(), 0u);
  EXPECT_TRUE(file->find_symbol("remora_fixture_add"));
}

TEST(ElfMemory, BiasFromSelfMaps) {
  DlHandle lib(REMORA_ELF_FIXTURE_GNU);
  ASSERT_NE(lib.h, nullptr) << ::dlerror();
  Loaded l = loaded_info(lib.h, "remora_fixture_add");
  auto file = load_path(REMORA_ELF_FIXTURE_GNU);
  ASSERT_TRUE(file);
  char real[PATH_MAX];
  ASSERT_NE(::realpath(REMORA_ELF_FIXTURE_GNU, real), nullptr);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  int matched = 0, mappings = 0;
  bool saw_offset0 = false;
  for (const MapsLine& m : self_maps()) {
    if (m.path != real) continue;
    ++mappings;
    auto bias = file->bias_for_mapping(m.start, m.offset, page);
    if (m.offset == 0) {
      saw_offset0 = true;
      ASSERT_TRUE(bias.ok()) << bias.error().to_string();
      EXPECT_EQ(m.start, l.base);
    }
    if (bias.ok()) {
      ++matched;
      EXPECT_EQ(*bias, l.bias) << std::hex << m.start << " offset " << m.offset;
    } else {
      // The part of .data after RELRO, or a file page two segments share.
      EXPECT_EQ(bias.error().code(), Errc::kParse);
    }
  }
  EXPECT_GE(mappings, 2);
  EXPECT_GE(matched, 2);
  EXPECT_TRUE(saw_offset0);
  auto none = file->bias_for_mapping(0x7f0000000000, 0x123000, page);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), Errc::kParse);
  auto bad_page = file->bias_for_mapping(0x7f0000000000, 0, 3000);
  ASSERT_FALSE(bad_page.ok());
}

// An image laid out in a buffer as a loader that does not relocate the
// dynamic section (musl) leaves it: d_ptr entries stay link-time vaddrs.
struct FakeImage {
  uint64_t base = 0x7f1234500000;
  std::vector<std::byte> mem;

  // Lays `bytes` out by the PT_LOAD segments of `layout`.
  FakeImage(const ElfImage& layout, const std::vector<std::byte>& bytes) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const LoadSegment& s : layout.load_segments()) {
      lo = std::min(lo, s.vaddr & ~uint64_t{0xfff});
      hi = std::max(hi, s.vaddr + s.memsz);
    }
    mem.assign(hi - lo, std::byte{0});
    for (const LoadSegment& s : layout.load_segments()) {
      const uint64_t n = std::min<uint64_t>(s.filesz, bytes.size() > s.offset ? bytes.size() - s.offset : 0);
      std::memcpy(mem.data() + (s.vaddr - lo), bytes.data() + s.offset, n);
    }
  }
  ReadFn reader() const {
    return [this](uint64_t addr, std::span<std::byte> out) -> Result<void> {
      if (addr < base || addr - base > mem.size() || out.size() > mem.size() - (addr - base)) {
        return Error(Errc::kFault, "outside the fake image");
      }
      std::memcpy(out.data(), mem.data() + (addr - base), out.size());
      return ok();
    };
  }
};

TEST(ElfMemory, UnrelocatedDynamicSection) {
  for (const char* path : {REMORA_ELF_FIXTURE_GNU, REMORA_ELF_FIXTURE_SYSV, REMORA_ELF_FIXTURE_VERSIONED}) {
    SCOPED_TRACE(path);
    auto bytes = read_file(path);
    auto file = load_bytes(bytes);
    ASSERT_TRUE(file);
    FakeImage fake(*file, bytes);
    auto mem = ElfImage::from_memory(fake.base, fake.reader());
    ASSERT_TRUE(mem.ok()) << mem.error().to_string();
    EXPECT_EQ((*mem)->build_id_hex(), file->build_id_hex());
    EXPECT_EQ((*mem)->soname(), file->soname());
    auto funcs = (*mem)->function_symbols();
    ASSERT_FALSE(funcs.empty());
    for (const Symbol& s : funcs) {
      auto f = file->find_symbol(s.name);
      ASSERT_TRUE(f) << s.name;
      auto m = (*mem)->find_symbol(s.name);
      ASSERT_TRUE(m) << s.name;
      EXPECT_EQ(m->value, f->value) << s.name;
    }
    auto bias = (*mem)->bias_for_mapping(fake.base, 0);
    ASSERT_TRUE(bias.ok());
    EXPECT_EQ(*bias, fake.base);
  }
}

TEST(ElfMemory, UnreadableImageIsAnError) {
  auto r = ElfImage::from_memory(0x1000, [](uint64_t, std::span<std::byte>) -> Result<void> {
    return Error(Errc::kFault, "no memory here");
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kFault);

  auto bytes = read_file(REMORA_ELF_FIXTURE_GNU);
  bytes[EI_DATA] = static_cast<std::byte>(ELFDATA2MSB);
  auto file = load_bytes(read_file(REMORA_ELF_FIXTURE_GNU));
  ASSERT_TRUE(file);
  FakeImage fake(*file, bytes);
  auto be = ElfImage::from_memory(fake.base, fake.reader());
  ASSERT_FALSE(be.ok());
  EXPECT_EQ(be.error().code(), Errc::kParse);
}

// ---------------------------------------------------------------- robustness

// Mutated and truncated images never crash; they parse or fail cleanly.
TEST(ElfRobustness, MutationsDoNotCrash) {
  const std::vector<std::byte> good = read_file(REMORA_ELF_FIXTURE_BOTH);
  auto layout = load_bytes(good);
  ASSERT_TRUE(layout);
  std::mt19937_64 rng(12345);
  int failures = 0, successes = 0;
  auto check = [&](const Result<std::shared_ptr<const ElfImage>>& r) {
    if (r.ok()) {
      ++successes;
      (void)(*r)->find_symbol("remora_fixture_add");
      (void)(*r)->find_symbol("remora_fixture_f55");
      (void)(*r)->function_symbols();
    } else {
      ++failures;
      EXPECT_NE(r.error().code(), Errc::kOk);
    }
  };
  for (size_t len = 0; len < good.size(); len += 97) {
    std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(len));
    check(ElfImage::from_file_bytes(cut));
    check(ElfImage::from_file_bytes(without_section_headers(cut.size() >= 64 ? cut : good)));
  }
  for (int iter = 0; iter < 1500; ++iter) {
    std::vector<std::byte> bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int i = 0; i < flips; ++i) {
      // Half the mutations hit the headers, where they matter most.
      size_t pos = (iter % 2 == 0) ? rng() % 1024 : rng() % bytes.size();
      bytes[pos] = static_cast<std::byte>(rng());
    }
    check(ElfImage::from_file_bytes(bytes));
    check(ElfImage::from_file_bytes(without_section_headers(bytes)));
    FakeImage fake(*layout, bytes);
    check(ElfImage::from_memory(fake.base, fake.reader()));
  }
  EXPECT_GT(failures, 0);
  EXPECT_GT(successes, 0);
}

// ---------------------------------------------------------------- cache

TEST(ImageCacheTest, SameKeyLoadsOnce) {
  ImageCache cache;
  auto image = load_path(REMORA_ELF_FIXTURE_GNU);
  ASSERT_TRUE(image);
  int calls = 0;
  auto loader = [&]() -> Result<std::shared_ptr<const ElfImage>> {
    ++calls;
    return image;
  };
  ImageCache::Key key{1, 2, image->build_id_hex()};
  auto a = cache.get_or_load(key, loader);
  auto b = cache.get_or_load(key, loader);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(cache.loads(), 1u);
  EXPECT_EQ(cache.size(), 1u);

  ImageCache::Key other{1, 3, image->build_id_hex()};
  ASSERT_TRUE(cache.get_or_load(other, loader).ok());
  EXPECT_EQ(cache.loads(), 2u);
  EXPECT_EQ(cache.size(), 2u);
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
  ASSERT_TRUE(cache.get_or_load(key, loader).ok());
  EXPECT_EQ(calls, 3);
}

TEST(ImageCacheTest, WithBuildIdNamesTheFilesImagesThatHaveOne) {
  ImageCache cache;
  auto gnu = load_path(REMORA_ELF_FIXTURE_GNU);
  auto sysv = load_path(REMORA_ELF_FIXTURE_SYSV);
  auto none = load_path(REMORA_ELF_FIXTURE_BOTH);  // linked without a Build ID
  ASSERT_TRUE(gnu && sysv && none);
  ASSERT_FALSE(gnu->build_id().empty());
  ASSERT_TRUE(none->build_id().empty());
  auto put = [&](ImageCache::Key key, std::shared_ptr<const ElfImage> image) {
    ASSERT_TRUE(cache.get_or_load(key, [&]() -> Result<std::shared_ptr<const ElfImage>> { return image; }));
  };
  put({1, 2, gnu->build_id_hex()}, gnu);
  put({1, 2, sysv->build_id_hex()}, sysv);  // the same file rewritten: two builds of it
  put({1, 2, ""}, none);                    // no Build ID to prove it by
  put({1, 3, gnu->build_id_hex()}, gnu);    // another file
  put({0, 0, "memfd:" + gnu->build_id_hex()}, gnu);
  auto got = cache.with_build_id(1, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(std::find(got.begin(), got.end(), gnu) != got.end());
  EXPECT_TRUE(std::find(got.begin(), got.end(), sysv) != got.end());
  EXPECT_EQ(cache.with_build_id(1, 3).size(), 1u);
  EXPECT_TRUE(cache.with_build_id(2, 2).empty());
}

TEST(ImageCacheTest, ErrorsAreNotCached) {
  ImageCache cache;
  ImageCache::Key key{7, 8, ""};
  auto failing = []() -> Result<std::shared_ptr<const ElfImage>> { return Error(Errc::kIo, "disk on fire"); };
  auto r = cache.get_or_load(key, failing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kIo);
  EXPECT_EQ(cache.size(), 0u);
  auto image = load_path(REMORA_ELF_FIXTURE_SYSV);
  ASSERT_TRUE(image);
  auto good = cache.get_or_load(key, [&]() -> Result<std::shared_ptr<const ElfImage>> { return image; });
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(good->get(), image.get());
  EXPECT_EQ(cache.loads(), 2u);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ImageCacheTest, ConcurrentGetOrLoad) {
  ImageCache cache;
  const std::vector<std::byte> bytes = read_file(REMORA_ELF_FIXTURE_GNU);
  std::atomic<int> calls{0};
  std::vector<const ElfImage*> got(8, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        ImageCache::Key key{42, static_cast<uint64_t>(round % 4), ""};
        auto r = cache.get_or_load(key, [&]() -> Result<std::shared_ptr<const ElfImage>> {
          ++calls;
          return ElfImage::from_file_bytes(bytes);
        });
        if (!r.ok()) return;
        if (round == 0) got[static_cast<size_t>(t)] = r->get();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const ElfImage* p : got) EXPECT_EQ(p, got[0]);  // one result won for key round 0
  EXPECT_NE(got[0], nullptr);
  EXPECT_EQ(cache.size(), 4u);
  EXPECT_EQ(cache.loads(), static_cast<uint64_t>(calls.load()));
  EXPECT_GE(calls.load(), 4);
  EXPECT_LE(calls.load(), 32);  // at most every thread once per key
}

TEST(ImageCacheTest, GlobalIsASingleton) { EXPECT_EQ(&ImageCache::global(), &ImageCache::global()); }

// Program headers only: this test program asks for a loader, the fixture
// (a shared object) does not; neither loads symbols.
TEST(ElfHeadersFromFd, InterpWithoutSymbols) {
  UniqueFd self(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(self);
  auto exe = ElfImage::headers_from_fd(self.get());
  ASSERT_TRUE(exe.ok()) << exe.error().to_string();
  EXPECT_TRUE((*exe)->has_interp());
  EXPECT_FALSE((*exe)->find_symbol("main").has_value());
  auto full = ElfImage::from_fd(self.get());
  ASSERT_TRUE(full.ok()) << full.error().to_string();
  EXPECT_EQ((*full)->build_id_hex(), (*exe)->build_id_hex());
  EXPECT_EQ((*full)->entry(), (*exe)->entry());

  UniqueFd lib(::open(REMORA_ELF_FIXTURE_GNU, O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(lib);
  auto so = ElfImage::headers_from_fd(lib.get());
  ASSERT_TRUE(so.ok()) << so.error().to_string();
  EXPECT_FALSE((*so)->has_interp());
  EXPECT_TRUE((*so)->has_dynamic());

  UniqueFd text(::open("/proc/self/status", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(text);
  auto bad = ElfImage::headers_from_fd(text.get());
  EXPECT_FALSE(bad.ok());
}

// The init tags of a dynamic section, read through a callback, from tables.
TEST(ElfInitTags, Table) {
  struct Case {
    const char* name;
    std::vector<Elf64_Dyn> dyn;
    size_t readable;  // entries the callback can read
    InitTags want;
  };
  auto e = [](int64_t tag, uint64_t v) {
    Elf64_Dyn d{};
    d.d_tag = tag;
    d.d_un.d_val = v;
    return d;
  };
  const std::vector<Case> cases = {
      {"all",
       {e(DT_INIT, 0x10), e(DT_INIT_ARRAY, 0x20), e(DT_INIT_ARRAYSZ, 16), e(DT_PREINIT_ARRAY, 0x30),
        e(DT_PREINIT_ARRAYSZ, 8), e(DT_NULL, 0)},
       6,
       {0x10, 0x20, 16, 0x30, 8}},
      {"stops at DT_NULL", {e(DT_NEEDED, 1), e(DT_NULL, 0), e(DT_INIT, 0x10)}, 3, {}},
      {"unreadable tail", {e(DT_INIT, 0x10), e(DT_INIT_ARRAY, 0x20)}, 1, {0x10, 0, 0, 0, 0}},
      {"nothing readable", {e(DT_INIT, 0x10)}, 0, {}},
  };
  constexpr uint64_t kBase = 0x1000;
  for (const Case& c : cases) {
    ReadFn read = [&](uint64_t addr, std::span<std::byte> out) -> Result<void> {
      const uint64_t limit = kBase + c.readable * sizeof(Elf64_Dyn);
      if (addr < kBase || addr + out.size() > limit) return Error(Errc::kIo, "unmapped");
      std::memcpy(out.data(), reinterpret_cast<const std::byte*>(c.dyn.data()) + (addr - kBase), out.size());
      return ok();
    };
    InitTags got = read_init_tags(kBase, read);
    EXPECT_EQ(got.init, c.want.init) << c.name;
    EXPECT_EQ(got.init_array, c.want.init_array) << c.name;
    EXPECT_EQ(got.init_arraysz, c.want.init_arraysz) << c.name;
    EXPECT_EQ(got.preinit_array, c.want.preinit_array) << c.name;
    EXPECT_EQ(got.preinit_arraysz, c.want.preinit_arraysz) << c.name;
  }
}

}  // namespace
}  // namespace remora::elf

namespace remora::elf {
namespace {

// DT_NEEDED, in order, from the file and from memory: this test program
// needs libc (and the C++ runtime) as its dynamic section says.
TEST(ElfNeeded, FromFileAndFromMemory) {
  int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto img = ElfImage::from_fd(fd);
  ::close(fd);
  ASSERT_TRUE(img.ok()) << img.error().to_string();
  const auto& needed = (*img)->needed();
  EXPECT_NE(std::find(needed.begin(), needed.end(), "libc.so.6"), needed.end());
  EXPECT_NE(std::find(needed.begin(), needed.end(), "libstdc++.so.6"), needed.end());
  EXPECT_TRUE((*img)->soname().empty());  // a program has none
}

}  // namespace
}  // namespace remora::elf

namespace remora::elf {
namespace {

// ---------------------------------------------------------------- compact symbol tables

std::optional<size_t> section_of_type(const std::vector<Elf64_Shdr>& shdrs, uint32_t type) {
  for (size_t i = 0; i < shdrs.size(); ++i)
    if (shdrs[i].sh_type == type) return i;
  return std::nullopt;
}

// What function_symbols() returned before the symbol tables were stored
// compactly, written out plainly as the reference: every defined FUNC or
// IFUNC of .dynsym, then of .symtab, the first of each (address, name
// without its "@..." version) kept.
std::vector<Symbol> reference_function_symbols(const std::vector<std::byte>& bytes, bool dynsym_only) {
  const std::vector<Elf64_Shdr> shdrs = section_headers(bytes);
  std::vector<Symbol> out;
  std::set<std::pair<uint64_t, std::string>> seen;
  for (uint32_t type : {uint32_t{SHT_DYNSYM}, uint32_t{SHT_SYMTAB}}) {
    if (type == SHT_SYMTAB && dynsym_only) break;
    auto idx = section_of_type(shdrs, type);
    if (!idx) continue;
    const Elf64_Shdr& sh = shdrs[*idx];
    const Elf64_Shdr& str = shdrs.at(sh.sh_link);
    const char* strings = reinterpret_cast<const char*>(bytes.data()) + str.sh_offset;
    for (uint64_t off = sh.sh_offset; off + sizeof(Elf64_Sym) <= sh.sh_offset + sh.sh_size;
         off += sizeof(Elf64_Sym)) {
      Elf64_Sym raw;
      std::memcpy(&raw, bytes.data() + off, sizeof raw);
      const unsigned char stype = ELF64_ST_TYPE(raw.st_info);
      if (raw.st_shndx == SHN_UNDEF || (stype != STT_FUNC && stype != STT_GNU_IFUNC)) continue;
      Symbol s;
      s.name = strings + raw.st_name;
      s.value = raw.st_value;
      s.size = raw.st_size;
      s.type = stype;
      s.bind = static_cast<unsigned char>(ELF64_ST_BIND(raw.st_info));
      s.shndx = raw.st_shndx;
      if (seen.emplace(s.value, s.name.substr(0, s.name.find('@'))).second) out.push_back(s);
    }
  }
  return out;
}

void expect_same_symbols(const std::vector<Symbol>& got, const std::vector<Symbol>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("function " + std::to_string(i) + " " + want[i].name);
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].value, want[i].value);
    EXPECT_EQ(got[i].size, want[i].size);
    EXPECT_EQ(got[i].type, want[i].type);
    EXPECT_EQ(got[i].bind, want[i].bind);
    EXPECT_EQ(got[i].shndx, want[i].shndx);
  }
}

// function_symbols() lists what it always did, in the same order, for every
// fixture and route.
TEST(ElfCompactTables, FunctionSymbolsMatchReference) {
  for (const char* path : {REMORA_ELF_FIXTURE_GNU, REMORA_ELF_FIXTURE_SYSV, REMORA_ELF_FIXTURE_BOTH,
                           REMORA_ELF_FIXTURE_STRIPPED, REMORA_ELF_FIXTURE_VERSIONED}) {
    SCOPED_TRACE(path);
    const std::vector<std::byte> bytes = read_file(path);
    auto full = load_path(path);
    auto dyn = load_bytes(without_section_headers(bytes));
    ASSERT_TRUE(full && dyn);
    expect_same_symbols(full->function_symbols(), reference_function_symbols(bytes, false));
    expect_same_symbols(dyn->function_symbols(), reference_function_symbols(bytes, true));
  }
  // A few entries spelled out: both versions of remora_vfunc (one address
  // each), .symtab's "name@@VER" spelling kept, file-local functions listed.
  auto versioned = load_path(REMORA_ELF_FIXTURE_VERSIONED);
  ASSERT_TRUE(versioned);
  const std::vector<Symbol> funcs = versioned->function_symbols();
  auto count = [&](std::string_view name) {
    return std::count_if(funcs.begin(), funcs.end(), [&](const Symbol& s) { return s.name == name; });
  };
  EXPECT_EQ(count("remora_vfunc"), 2);
  EXPECT_EQ(count("remora_vfunc@@REMORA_V2"), 0);  // same address and name as .dynsym's: deduplicated
  EXPECT_EQ(count("remora_hfunc@@REMORA_V2"), 1);  // only in .symtab
  EXPECT_EQ(count("remora_vfunc_v1"), 1);
  auto v1 = versioned->find_symbol("remora_vfunc_v1");
  auto v2 = versioned->find_symbol("remora_vfunc_v2");
  ASSERT_TRUE(v1 && v2);
  std::set<uint64_t> vfunc_values;
  for (const Symbol& s : funcs)
    if (s.name == "remora_vfunc") vfunc_values.insert(s.value);
  EXPECT_EQ(vfunc_values, (std::set<uint64_t>{v1->value, v2->value}));
}

// .symtab-only names are found after many .dynsym lookups (which never
// needed the .symtab index) and agree with a fresh image's first lookup.
TEST(ElfCompactTables, SymtabLookupAfterManyDynsymLookups) {
  auto image = load_path(REMORA_ELF_FIXTURE_GNU);
  auto fresh = load_path(REMORA_ELF_FIXTURE_GNU);
  ASSERT_TRUE(image && fresh);
  for (int round = 0; round < 20; ++round) {
    for (int n = 10; n < 90; ++n) {
      if (n % 10 > 7) continue;  // F8(n) defines n0..n7
      const std::string name = "remora_fixture_f" + std::to_string(n);
      auto sym = image->find_symbol(name);
      ASSERT_TRUE(sym.has_value()) << name;
      EXPECT_EQ(sym->name, name);
      EXPECT_EQ(sym->bind, STB_GLOBAL);
    }
    ASSERT_TRUE(image->find_symbol("remora_fixture_add").has_value());
  }
  auto local = image->find_symbol("remora_fixture_local_helper");
  ASSERT_TRUE(local.has_value());
  EXPECT_EQ(local->name, "remora_fixture_local_helper");
  EXPECT_EQ(local->bind, STB_LOCAL);
  EXPECT_EQ(local->type, STT_FUNC);
  auto fresh_local = fresh->find_symbol("remora_fixture_local_helper");
  ASSERT_TRUE(fresh_local.has_value());
  EXPECT_EQ(local->value, fresh_local->value);
  auto hidden = image->find_symbol("remora_fixture_hidden");
  ASSERT_TRUE(hidden.has_value());
  EXPECT_EQ(hidden->value, fresh->find_symbol("remora_fixture_hidden")->value);
  EXPECT_FALSE(image->find_symbol("remora_fixture_local_helpe").has_value());
  EXPECT_FALSE(image->find_symbol("remora_fixture_local_helperx").has_value());
  // A NUL inside the name never matches (stored names end at their NUL).
  EXPECT_FALSE(image->find_symbol(std::string_view("remora_fixture_add\0x", 20)).has_value());
  EXPECT_FALSE(image->find_symbol(std::string_view("remora_fixture_local_helper\0", 28)).has_value());
}

// Many threads look names up in one image at once, the first .symtab lookup
// (which builds the index) among them; all see the single-threaded answers.
TEST(ElfCompactTables, ConcurrentLookupsOnOneImage) {
  const std::vector<std::string> names = {"remora_fixture_local_helper",
                                          "remora_fixture_hidden",
                                          "remora_vfunc_v1",
                                          "remora_vfunc_v2",
                                          "remora_hfunc",
                                          "remora_hfunc_impl",
                                          "remora_vfunc",
                                          "remora_vother",
                                          "remora_vfunc@@REMORA_V2",
                                          "remora_vfunc@REMORA_V1",
                                          "remora_no_such_name",
                                          "remora_fixture_add"};
  auto reference = load_path(REMORA_ELF_FIXTURE_VERSIONED);
  ASSERT_TRUE(reference);
  std::vector<std::optional<Symbol>> want;
  for (const std::string& n : names) want.push_back(reference->find_symbol(n));
  ASSERT_TRUE(want[0].has_value() || want[2].has_value());  // the fixture has .symtab-only names

  constexpr int kThreads = 8;
  for (int trial = 0; trial < 20; ++trial) {
    auto image = load_path(REMORA_ELF_FIXTURE_VERSIONED);  // a fresh image: no index yet
    ASSERT_TRUE(image);
    std::latch start(kThreads);
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        // Start together so that several threads reach the lazy index at once.
        start.arrive_and_wait();
        for (size_t k = 0; k < names.size(); ++k) {
          const size_t i = (k + static_cast<size_t>(t)) % names.size();  // a different first name each
          auto got = image->find_symbol(names[i]);
          const bool same = got.has_value() == want[i].has_value() &&
                            (!got || (got->name == want[i]->name && got->value == want[i]->value &&
                                      got->bind == want[i]->bind));
          if (!same) mismatches.fetch_add(1);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0) << "trial " << trial;
  }
}

// A symbol whose st_name lies outside its string table, or names a string
// without a terminating NUL, fails the parse, with the table and the entry
// in the error, on both routes and in .symtab.
TEST(ElfCompactTables, BadNameOffsetRefusedAtParse) {
  const std::vector<std::byte> good = read_file(REMORA_ELF_FIXTURE_GNU);
  const std::vector<Elf64_Shdr> shdrs = section_headers(good);
  auto dynsym = section_of_type(shdrs, SHT_DYNSYM);
  auto symtab = section_of_type(shdrs, SHT_SYMTAB);
  ASSERT_TRUE(dynsym && symtab);
  auto set_name = [](std::vector<std::byte>& bytes, const Elf64_Shdr& table, size_t entry, uint32_t name) {
    std::memcpy(bytes.data() + table.sh_offset + entry * sizeof(Elf64_Sym) + offsetof(Elf64_Sym, st_name),
                &name, sizeof name);
  };
  struct Case {
    const char* name;
    size_t table;
    bool unterminated;  // else: beyond the string table
    bool no_sections;   // the PT_DYNAMIC route
    const char* context;
  };
  const Case cases[] = {
      {"dynsym beyond", *dynsym, false, false, ".dynsym entry 3: string offset"},
      {"dynsym unterminated", *dynsym, true, false, ".dynsym entry 3: string at offset"},
      {"symtab beyond", *symtab, false, false, ".symtab entry 3: string offset"},
      {"symtab unterminated", *symtab, true, false, ".symtab entry 3: string at offset"},
      {"dynamic route beyond", *dynsym, false, true, "dynamic symbol table entry 3: string offset"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::byte> bytes = good;
    const Elf64_Shdr& table = shdrs[c.table];
    const Elf64_Shdr& strtab = shdrs[table.sh_link];
    if (c.unterminated) {
      // The table's final NUL overwritten: its last string runs off the end.
      bytes[strtab.sh_offset + strtab.sh_size - 1] = std::byte{'x'};
      set_name(bytes, table, 3, static_cast<uint32_t>(strtab.sh_size - 1));
    } else {
      set_name(bytes, table, 3, static_cast<uint32_t>(strtab.sh_size + 100));
    }
    auto r = ElfImage::from_file_bytes(c.no_sections ? without_section_headers(bytes) : bytes);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), Errc::kParse);
    const std::string msg = r.error().to_string();
    EXPECT_NE(msg.find(c.context), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.unterminated ? "is not NUL-terminated" : "lies beyond the string table"),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace remora::elf
