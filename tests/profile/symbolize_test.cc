// The controller's symboliser (src/profile/symbolize.h) against real
// processes: the fixture program (sym_fixture.c) loads one build of the
// fixture library (sym_fixture_lib.cc), prints what the default tool would
// hand over (its modules with bias and build ID, marker addresses, a worker
// thread's return addresses) and says "ready". The maps come from
// /proc/PID/maps. Every expectation about names and lines is read from the
// library's source ("// @name" comments), not written down twice.
#include "profile/symbolize.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <libelf.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"
#include "procfs/procfs.h"
#include "profile/perf_map.h"
#include "profile/plt.h"

namespace remora::profile {
namespace {

namespace fs = std::filesystem;
using remora::test::after;
using remora::test::Spawned;
using std::chrono::seconds;

const std::string kDir = SYMFX_DIR;
const std::string kFull = kDir + "/full/libsymfx.so";

// Line numbers of the "// @name" markers in the library's source.
std::map<std::string, uint32_t> source_lines() {
  std::map<std::string, uint32_t> out;
  std::ifstream in(SYMFX_SOURCE);
  std::string line;
  for (uint32_t n = 1; std::getline(in, line); ++n) {
    size_t at = line.find("// @");
    if (at != std::string::npos) out[line.substr(at + 4)] = n;
  }
  return out;
}

uint64_t hex(const std::string& s) { return std::stoull(s, nullptr, 16); }

// One run of the fixture, as far as "ready".
struct Fixture {
  std::unique_ptr<Spawned> proc;
  int result = 0;
  uint64_t mark_inline = 0, mark_noinline = 0;
  std::vector<uint64_t> thread_stack;
  std::vector<Module> modules;

  explicit Fixture(const std::vector<std::string>& argv) {
    proc = Spawned::start(argv);
    auto deadline = after(seconds(20));
    while (true) {
      std::string line = proc->wait_line(deadline, "the fixture's records and \"ready\"");
      if (line == "ready") break;
      std::istringstream in(line);
      std::string key, a, b;
      in >> key;
      if (key == "result") {
        in >> result;
      } else if (key == "mark") {
        in >> a >> b;
        (a == "inline" ? mark_inline : mark_noinline) = hex(b);
      } else if (key == "thread_stack") {
        while (in >> a) thread_stack.push_back(hex(a));
      } else if (key == "module") {
        Module m;
        in >> a >> b;
        m.bias = hex(a);
        m.build_id = b == "-" ? "" : b;
        std::getline(in >> std::ws, m.path);
        modules.push_back(m);
      }
    }
  }
  pid_t pid() const { return proc->pid(); }
  const Module* module(std::string_view base) const {
    for (const auto& m : modules)
      if (fs::path(m.path).filename() == base) return &m;
    return nullptr;
  }
};

std::vector<Mapping> mappings(pid_t pid) {
  auto maps = procfs::read_maps(pid);
  if (!maps)
    throw std::runtime_error("read maps of " + std::to_string(pid) + ": " + maps.error().to_string());
  std::vector<Mapping> out;
  for (const auto& e : *maps) {
    Mapping m;
    m.start = e.start;
    m.end = e.end;
    m.offset = e.offset;
    m.perms = std::string{e.read ? 'r' : '-', e.write ? 'w' : '-', e.exec ? 'x' : '-', e.shared ? 's' : 'p'};
    m.dev = e.dev();
    m.inode = e.inode;
    m.path = e.path;
    out.push_back(m);
  }
  return out;
}

SymbolSource source_of(const Fixture& fx, std::vector<std::string> debug_dirs = {}) {
  SymbolSource s;
  s.pid = fx.pid();
  s.maps = mappings(fx.pid());
  s.modules = fx.modules;
  s.debug_dirs = std::move(debug_dirs);
  return s;
}

std::string describe(const std::vector<Frame>& frames) {
  std::string out;
  for (const auto& f : frames)
    out += "\n  " + f.function + " at " + f.file + ":" + std::to_string(f.line) +
           (f.inlined ? " (inlined)" : "") + " in " + f.module;
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += "\n  " + l;
  return out;
}

// A directory of its own under /tmp, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/remora-symfx-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The noinline function and the inline chain, in the order and with the
// lines addr2line -i prints, for a library whose DWARF was found.
void expect_full_names(Symbolizer& sym, const Fixture& fx, const std::string& lib_path,
                       const std::string& noinline = "fx::noinline_fn(int)") {
  auto lines = source_lines();
  const Module* mod = fx.module("libsymfx.so");
  ASSERT_NE(mod, nullptr) << "the fixture listed no libsymfx.so";

  auto f = sym.frames_at(fx.mark_noinline, false);
  ASSERT_EQ(f.size(), 1u) << describe(f);
  EXPECT_EQ(f[0].function, noinline);
  EXPECT_EQ(f[0].file, SYMFX_SOURCE);
  EXPECT_EQ(f[0].line, lines["noinline"]);
  EXPECT_EQ(f[0].module, lib_path);
  EXPECT_EQ(f[0].address, fx.mark_noinline);
  EXPECT_EQ(f[0].module_offset, fx.mark_noinline - mod->bias);
  EXPECT_EQ(f[0].kind, FrameKind::kNative);
  EXPECT_FALSE(f[0].inlined);

  // Inlined static functions have no linkage name: their names are
  // qualified from the DWARF scopes, without parameters.
  auto chain = sym.frames_at(fx.mark_inline, false);
  ASSERT_EQ(chain.size(), 3u) << describe(chain);
  EXPECT_EQ(chain[0].function, "fx::leaf_inl");
  EXPECT_EQ(chain[0].line, lines["leaf"]);
  EXPECT_TRUE(chain[0].inlined);
  EXPECT_EQ(chain[1].function, "fx::mid_inl");
  EXPECT_EQ(chain[1].line, lines["mid"]);  // where mid_inl calls leaf_inl
  EXPECT_TRUE(chain[1].inlined);
  EXPECT_EQ(chain[2].function, "fx::outer(int)");
  EXPECT_EQ(chain[2].line, lines["outer"]);  // where outer calls mid_inl
  EXPECT_FALSE(chain[2].inlined);
  for (const auto& c : chain) {
    EXPECT_EQ(c.file, SYMFX_SOURCE);
    EXPECT_EQ(c.address, fx.mark_inline);
    EXPECT_EQ(c.kind, FrameKind::kNative);
  }
}

TEST(Symbolize, NoinlineAndInlineChainFromDwarf) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  // The library ran (sym_fixture_lib.cc, by hand): outer(3) + noinline_fn(3).
  auto leaf = [](int x) { return (x ^ 0x55) * 7 + 1; };
  EXPECT_EQ(fx.result, (leaf((3 ^ 0x55) + 2) * 3 - 5) + ((3 ^ 0x55) + 11));
  Symbolizer sym(source_of(fx));
  expect_full_names(sym, fx, kFull);
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

// A file mapping no module claims (a tool that listed none, a library
// mapped by hand): its bias comes from the mapping and its PT_LOAD.
TEST(Symbolize, WithoutModulesTheMapsGiveTheBias) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  SymbolSource src = source_of(fx);
  src.modules.clear();
  Symbolizer sym(std::move(src));
  expect_full_names(sym, fx, kFull);
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

// A PC in a PLT stub of the program: named after the function the stub
// jumps to ("printf@plt"), not after what precedes .plt.
TEST(Symbolize, PltStubsAreNamedAfterTheirTargets) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  char real[PATH_MAX] = {};
  ASSERT_NE(::realpath(SYMFX_PROGRAM, real), nullptr);
  int fd = ::open(real, O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  std::vector<PltEntry> entries = plt_entries(elf);
  elf_end(elf);
  ::close(fd);
  ASSERT_FALSE(entries.empty()) << real << " calls libc through its PLT";
  uint64_t bias = UINT64_MAX;  // a PIE is linked at 0: its first mapping's start
  SymbolSource src = source_of(fx);
  for (const auto& m : src.maps)
    if (m.path == real && m.offset == 0) bias = std::min(bias, m.start);
  ASSERT_NE(bias, UINT64_MAX);
  Symbolizer sym(std::move(src));
  for (const PltEntry& e : entries) {
    auto frames = sym.frames_at(bias + e.start + (e.end - e.start) / 2, false);
    ASSERT_EQ(frames.size(), 1u) << e.name << describe(frames);
    EXPECT_EQ(frames[0].function, e.name);
    EXPECT_EQ(frames[0].module, real);
  }
}

TEST(Symbolize, ReturnAddressLooksUpTheCall) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  Symbolizer sym(source_of(fx));
  // The nop is one byte: mark + 1 "returns" to the instruction after it.
  auto f = sym.frames_at(fx.mark_noinline + 1, true);
  ASSERT_EQ(f.size(), 1u) << describe(f);
  EXPECT_EQ(f[0].address, fx.mark_noinline);
  EXPECT_EQ(f[0].function, "fx::noinline_fn(int)");
  EXPECT_EQ(f[0].line, source_lines()["noinline"]);
}

TEST(Symbolize, StrippedCopyUsesTheBuildIdDebugDir) {
  Fixture fx({SYMFX_PROGRAM, kDir + "/bid/libsymfx.so"});
  ASSERT_EQ(fx.module("libsymfx.so")->build_id, SYMFX_BUILD_ID);
  {
    // Without the directory: the symbol table names the function (it kept
    // .symtab), without a line; one warning says how to get the rest.
    Symbolizer sym(source_of(fx));
    auto f = sym.frames_at(fx.mark_noinline, false);
    ASSERT_EQ(f.size(), 1u) << describe(f);
    EXPECT_EQ(f[0].function, "fx::noinline_fn(int)");
    EXPECT_EQ(f[0].file, "");
    EXPECT_EQ(f[0].kind, FrameKind::kNative);
    auto w = sym.warnings();
    ASSERT_EQ(w.size(), 1u) << joined(w);
    EXPECT_NE(w[0].find("no debug info for " + kDir + "/bid/libsymfx.so"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("REMORA_DEBUG_PATH"), std::string::npos) << w[0];
    EXPECT_NE(w[0].find("-dbgsym"), std::string::npos) << w[0];
  }
  Symbolizer sym(source_of(fx, {kDir + "/debug"}));
  expect_full_names(sym, fx, kDir + "/bid/libsymfx.so");
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

// Debian's -dbgsym files are compressed with dwz: the inline functions'
// abstract instances, their names and namespaces, live in the common file
// that .gnu_debugaltlink names.
TEST(Symbolize, DwzDebugFileWithItsCommonFile) {
  if (!SYMFX_DWZ)
    GTEST_SKIP() << "dwz was not installed when the build was configured (Debian: apt-get install dwz)";
  Fixture fx({SYMFX_PROGRAM, kDir + "/bid/libsymfx.so"});
  Symbolizer sym(source_of(fx, {kDir + "/dwzdebug"}));
  expect_full_names(sym, fx, kDir + "/bid/libsymfx.so");
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

TEST(Symbolize, StrippedCopyUsesItsDebuglink) {
  Fixture fx({SYMFX_PROGRAM, kDir + "/link/libsymfx.so"});
  Symbolizer sym(source_of(fx));
  expect_full_names(sym, fx, kDir + "/link/libsymfx.so");
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

// Without a build ID the debuglink's CRC is the only proof that a debug
// file belongs to the object: a matching one is used, another build's not.
TEST(Symbolize, DebuglinkWithoutBuildIdIsCheckedByCrc) {
  {
    Fixture fx({SYMFX_PROGRAM, kDir + "/nolink/libsymfx.so"});
    ASSERT_EQ(fx.module("libsymfx.so")->build_id, "");
    Symbolizer sym(source_of(fx));
    expect_full_names(sym, fx, kDir + "/nolink/libsymfx.so");
    EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
  }
  Fixture fx({SYMFX_PROGRAM, kDir + "/badcrc/libsymfx.so"});
  Symbolizer sym(source_of(fx));
  auto f = sym.frames_at(fx.mark_noinline, false);
  ASSERT_EQ(f.size(), 1u) << describe(f);
  EXPECT_EQ(f[0].function, "fx::noinline_fn(int)");  // from its own symbol table
  EXPECT_EQ(f[0].file, "");
  auto w = sym.warnings();
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("no debug info for " + kDir + "/badcrc/libsymfx.so"), std::string::npos) << w[0];
}

TEST(Symbolize, FileWithAnotherBuildIdIsNotUsed) {
  TempDir tmp;
  std::string lib = tmp.path + "/libsymfx.so";
  fs::copy_file(kFull, lib);
  Fixture fx({SYMFX_PROGRAM, lib});
  // An upgrade: another build renamed over the path the process loaded.
  fs::copy_file(kDir + "/alt/libsymfx.so", tmp.path + "/new.so");
  fs::rename(tmp.path + "/new.so", lib);
  Symbolizer sym(source_of(fx));
  auto f = sym.frames_at(fx.mark_noinline, false);
  ASSERT_EQ(f.size(), 1u) << describe(f);
  uint64_t off = fx.mark_noinline - fx.module("libsymfx.so")->bias;
  char want[64];
  std::snprintf(want, sizeof want, "libsymfx.so+0x%llx", static_cast<unsigned long long>(off));
  EXPECT_EQ(f[0].function, want);
  EXPECT_EQ(f[0].kind, FrameKind::kUnknown);
  EXPECT_EQ(f[0].module, lib);
  EXPECT_EQ(f[0].module_offset, off);
  auto w = sym.warnings();
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find(lib), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("but the process loaded build ID " + std::string(SYMFX_BUILD_ID)), std::string::npos)
      << w[0];
}

TEST(Symbolize, MissingFileIsWarnedAbout) {
  TempDir tmp;
  std::string lib = tmp.path + "/libsymfx.so";
  fs::copy_file(kFull, lib);
  Fixture fx({SYMFX_PROGRAM, lib});
  fs::remove(lib);
  Symbolizer sym(source_of(fx));
  auto f = sym.frames_at(fx.mark_inline, false);
  ASSERT_EQ(f.size(), 1u) << describe(f);
  EXPECT_EQ(f[0].kind, FrameKind::kUnknown);
  EXPECT_EQ(f[0].function.rfind("libsymfx.so+0x", 0), 0u) << f[0].function;
  auto w = sym.warnings();
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("cannot open"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find(lib), std::string::npos) << w[0];
}

TEST(Symbolize, DeadProcessUsesTheFilesHere) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  SymbolSource src = source_of(fx);
  fx.proc->kill(SIGKILL);
  ASSERT_TRUE(fx.proc->wait_exit(after(seconds(10))).has_value());
  struct stat st {};
  ASSERT_NE(::stat(("/proc/" + std::to_string(src.pid)).c_str(), &st), 0) << "pid reused already";
  Symbolizer sym(std::move(src));
  expect_full_names(sym, fx, kFull);
}

TEST(Symbolize, LibcStartThreadAndClone3) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  const Module* libc = fx.module("libc.so.6");
  ASSERT_NE(libc, nullptr);
  ASSERT_GT(libc->build_id.size(), 2u);
  std::string debug =
      "/usr/lib/debug/.build-id/" + libc->build_id.substr(0, 2) + "/" + libc->build_id.substr(2) + ".debug";
  if (!fs::exists(debug))
    GTEST_SKIP() << "libc's debug file " << debug << " is not installed (Debian: apt-get install libc6-dbg)";
  ASSERT_GE(fx.thread_stack.size(), 3u);
  Symbolizer sym(source_of(fx));
  std::vector<Frame> all;
  for (size_t i = 1; i < fx.thread_stack.size(); ++i)
    for (const auto& f : sym.frames_at(fx.thread_stack[i], true)) all.push_back(f);
  bool start_thread = false, clone3 = false;
  for (const auto& f : all) {
    start_thread |= f.function == "start_thread";
    clone3 |= f.function.find("clone3") != std::string::npos;
    EXPECT_EQ(f.function.find("libc.so.6+"), std::string::npos) << describe(all);
  }
  std::printf("the worker thread's return addresses:%s\n", describe(all).c_str());
  EXPECT_TRUE(start_thread) << describe(all);
  EXPECT_TRUE(clone3) << describe(all);
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

TEST(Symbolize, ContainerRootNamesTheContainersCopy) {
  if (::geteuid() != 0 || !fs::exists("/usr/bin/unshare"))
    GTEST_SKIP() << "needs root and /usr/bin/unshare to bind-mount in a mount namespace of its own";
  TempDir tmp;
  std::string lib = tmp.path + "/libsymfx.so";
  std::string theirs = tmp.path + "/container-copy.so";
  fs::copy_file(kFull, lib);
  fs::copy_file(kDir + "/alt/libsymfx.so", theirs);
  // unshare -m (private propagation) and exec: the fixture keeps the pid,
  // and sees the other build at `lib`; this side sees the first.
  Fixture fx({"/usr/bin/unshare", "-m", "/bin/sh", "-c",
              "mount --bind " + theirs + " " + lib + " && exec " + SYMFX_PROGRAM + " " + lib});
  ASSERT_NE(fx.module("libsymfx.so"), nullptr);
  ASSERT_NE(fx.module("libsymfx.so")->build_id, SYMFX_BUILD_ID) << "the bind mount did not take";
  Symbolizer sym(source_of(fx));
  expect_full_names(sym, fx, lib, "fx::noinline_fn_alt(int)");
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

// The vDSO has no file: the symboliser's own stands in (the same kernel,
// checked by build ID), so clock_gettime's code is named.
TEST(Symbolize, VdsoIsNamed) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  SymbolSource src = source_of(fx);
  std::vector<uint64_t> pcs;
  for (const auto& m : src.maps)
    if (m.path == "[vdso]" && m.perms[2] == 'x')
      for (uint64_t a = m.start; a < m.end; a += 16) pcs.push_back(a);
  if (pcs.empty()) GTEST_SKIP() << "the fixture has no [vdso] mapping";
  Symbolizer sym(std::move(src));
  std::vector<Frame> all;
  for (uint64_t pc : pcs) all.push_back(sym.frames_at(pc, false).back());
  bool named = false;
  for (const auto& f : all) named |= f.function.find("clock_gettime") != std::string::npos;
  EXPECT_TRUE(named) << describe(all);
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

// The container's own /usr/lib/debug is searched through its root: here a
// private mount namespace with another build (stripped) at the library's
// path and a /usr/lib/debug of its own holding that build's debug file,
// which this side's /usr/lib/debug lacks.
TEST(Symbolize, ContainerDebugDirThroughItsRoot) {
  if (::geteuid() != 0 || !fs::exists("/usr/bin/unshare") || !fs::is_directory("/usr/lib/debug"))
    GTEST_SKIP() << "needs root, /usr/bin/unshare and a /usr/lib/debug to bind-mount over";
  std::string rel = std::string("/.build-id/") + std::string(SYMFX_ALT_BUILD_ID).substr(0, 2) + "/" +
                    std::string(SYMFX_ALT_BUILD_ID).substr(2) + ".debug";
  ASSERT_FALSE(fs::exists("/usr/lib/debug" + rel)) << "this machine has the container's debug file itself";
  TempDir tmp;
  std::string lib = tmp.path + "/libsymfx.so";
  fs::copy_file(kFull, lib);
  fs::copy_file(kDir + "/altbid/libsymfx.so", tmp.path + "/container-copy.so");
  Fixture fx({"/usr/bin/unshare", "-m", "/bin/sh", "-c",
              "mount --bind " + tmp.path + "/container-copy.so " + lib + " && mount --bind " + kDir +
                  "/altdebug /usr/lib/debug && exec " + SYMFX_PROGRAM + " " + lib});
  ASSERT_EQ(fx.module("libsymfx.so")->build_id, SYMFX_ALT_BUILD_ID);
  Symbolizer sym(source_of(fx));
  expect_full_names(sym, fx, lib, "fx::noinline_fn_alt(int)");
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
}

TEST(Symbolize, PerfMapNamesJitCode) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  SymbolSource src = source_of(fx);
  // An address no mapping covers (the top of the lower half).
  uint64_t jit = 0x7ffffff00000ull;
  for (const auto& m : src.maps) ASSERT_FALSE(jit >= m.start && jit < m.end);
  char text[256];
  std::snprintf(text, sizeof text, "%llx 100 LazyCompile:~old a.js:1\n%llx 40 LazyCompile:*hot a.js:2\n",
                static_cast<unsigned long long>(jit), static_cast<unsigned long long>(jit + 0x20));
  src.perf_maps = {text};
  Symbolizer sym(std::move(src));
  auto f = sym.frames_at(jit + 0x30, false);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].function, "LazyCompile:*hot a.js:2");
  EXPECT_EQ(f[0].module, "[jit]");
  EXPECT_EQ(f[0].kind, FrameKind::kJit);
  EXPECT_EQ(sym.frames_at(jit + 0x10, false)[0].function, "LazyCompile:~old a.js:1");
  EXPECT_TRUE(sym.warnings().empty()) << joined(sym.warnings());
  auto u = sym.frames_at(jit + 0x1000, false);
  ASSERT_EQ(u.size(), 1u);
  EXPECT_EQ(u[0].function, "[unknown]");
  EXPECT_EQ(u[0].kind, FrameKind::kUnknown);
  auto w = sym.warnings();
  ASSERT_EQ(w.size(), 1u) << joined(w);
  EXPECT_NE(w[0].find("perf-"), std::string::npos) << w[0];
}

TEST(Symbolize, ProfileStacksRootFirstWithoutToolFrames) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  ASSERT_GE(fx.thread_stack.size(), 2u);
  SymbolSource src = source_of(fx);
  // libc stands in for the tool: its frames must be left out.
  src.tool_path = fx.module("libc.so.6")->path;
  Symbolizer sym(std::move(src));
  uint64_t in_tool = fx.thread_stack[1];
  ASSERT_TRUE(sym.is_tool_frame(in_tool));
  ASSERT_FALSE(sym.is_tool_frame(fx.mark_inline));
  RawProfile raw;
  raw.raw_stacks = {{fx.mark_inline, fx.mark_noinline + 1, in_tool}, {fx.mark_inline, fx.mark_noinline + 1}};
  raw.truncated = {true, false};
  raw.warnings = {"from the tool"};
  Profile p = symbolize(std::move(raw), sym);
  ASSERT_EQ(p.stacks.size(), 2u);
  auto names = [&](size_t s) {
    std::vector<std::string> out;
    for (uint32_t i : p.stacks[s]) out.push_back(p.frames.at(i).function);
    return out;
  };
  std::vector<std::string> want{"fx::noinline_fn(int)", "fx::outer(int)", "fx::mid_inl", "fx::leaf_inl"};
  std::vector<std::string> truncated{"[truncated]"};
  truncated.insert(truncated.end(), want.begin(), want.end());
  EXPECT_EQ(names(0), truncated);
  EXPECT_EQ(names(1), want);
  EXPECT_EQ(p.frames.size(), 5u);  // deduplicated across the stacks
  EXPECT_EQ(p.frames.at(p.stacks[0][0]).kind, FrameKind::kTruncated);
  EXPECT_EQ(p.frames.at(p.stacks[0][1]).address, fx.mark_noinline);
  ASSERT_FALSE(p.warnings.empty());
  EXPECT_EQ(p.warnings[0], "from the tool");
}

// 10k distinct PCs spread over libc and the fixture: the bound is loose (a
// shared, loaded test machine); the time is printed for the record.
TEST(Symbolize, TenThousandPcsQuickly) {
  Fixture fx({SYMFX_PROGRAM, kFull});
  SymbolSource src = source_of(fx);
  std::vector<uint64_t> pcs;
  uint64_t text_bytes = 0;
  for (const auto& m : src.maps)
    if (m.perms[2] == 'x' && (m.path.find("libc.so") != std::string::npos || m.path == kFull))
      text_bytes += m.end - m.start;
  uint64_t step = std::max<uint64_t>(1, text_bytes / 10000);
  for (const auto& m : src.maps) {
    if (m.perms[2] != 'x' || (m.path.find("libc.so") == std::string::npos && m.path != kFull)) continue;
    for (uint64_t a = m.start; a < m.end && pcs.size() < 10000; a += step) pcs.push_back(a);
  }
  ASSERT_GE(pcs.size(), 9000u);
  auto t0 = std::chrono::steady_clock::now();
  Symbolizer sym(std::move(src));
  size_t named = 0, frames = 0;
  for (uint64_t pc : pcs) {
    auto f = sym.frames_at(pc, true);
    frames += f.size();
    named += f.back().kind == FrameKind::kNative;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("symbolised %zu distinct PCs (%zu frames, %zu named) in %.3f s\n", pcs.size(), frames, named,
              s);
  EXPECT_GT(named, pcs.size() * 9 / 10);
  EXPECT_LT(s, 10.0);
}

// ---- perf maps: pure parsing ----

TEST(PerfMap, ParsesLines) {
  struct Case {
    std::string_view line;
    bool ok;
    uint64_t start, size;
    std::string_view name;
  };
  const Case cases[] = {
      {"7f0012340000 1a0 LazyCompile:~main /app/x.js:3", true, 0x7f0012340000, 0x1a0,
       "LazyCompile:~main /app/x.js:3"},
      {"0x1000 0x10 java.lang.String::hashCode()", true, 0x1000, 0x10, "java.lang.String::hashCode()"},
      {"  1000\t20\t name with  spaces  \r", true, 0x1000, 0x20, "name with  spaces"},
      {"1000 20", false, 0, 0, ""},
      {"1000 0 empty", false, 0, 0, ""},
      {"zz 20 name", false, 0, 0, ""},
      {"1000 20x name", false, 0, 0, ""},
      {"ffffffffffffff00 1000 wraps", false, 0, 0, ""},
      {"10000000000000000 10 too long", false, 0, 0, ""},
      {"", false, 0, 0, ""},
  };
  for (const auto& c : cases) {
    auto l = parse_perf_map_line(c.line);
    ASSERT_EQ(l.has_value(), c.ok) << c.line;
    if (!c.ok) continue;
    EXPECT_EQ(l->start, c.start) << c.line;
    EXPECT_EQ(l->size, c.size) << c.line;
    EXPECT_EQ(l->name, c.name) << c.line;
  }
}

TEST(PerfMap, LaterLinesWinAndGarbageIsSkipped) {
  PerfMap m;
  m.add(
      "1000 100 first\n"
      "garbage line\n"
      "\n"
      "1040 20 second inside\n"
      "10f0 20 third across the end\n"
      "2000 10 far\n"
      "1000 8 fourth at the start");
  EXPECT_EQ(m.lines(), 6u);
  EXPECT_EQ(m.malformed(), 1u);
  auto name = [&](uint64_t pc) { return m.find(pc) ? *m.find(pc) : std::string("-"); };
  EXPECT_EQ(name(0xfff), "-");
  EXPECT_EQ(name(0x1000), "fourth at the start");
  EXPECT_EQ(name(0x1007), "fourth at the start");
  EXPECT_EQ(name(0x1008), "first");
  EXPECT_EQ(name(0x103f), "first");
  EXPECT_EQ(name(0x1040), "second inside");
  EXPECT_EQ(name(0x105f), "second inside");
  EXPECT_EQ(name(0x1060), "first");
  EXPECT_EQ(name(0x10ef), "first");
  EXPECT_EQ(name(0x10f0), "third across the end");
  EXPECT_EQ(name(0x110f), "third across the end");
  EXPECT_EQ(name(0x1110), "-");
  EXPECT_EQ(name(0x2000), "far");
  // A second text (another candidate file) wins over the first.
  m.add("1000 2000 covers everything\n");
  EXPECT_EQ(name(0x1040), "covers everything");
  EXPECT_EQ(name(0x2000), "covers everything");
  EXPECT_EQ(name(0x3000), "-");
}

TEST(PerfMap, Candidates) {
  EXPECT_EQ(perf_map_candidates(4242, 7), (std::vector<std::string>{"/proc/4242/root/tmp/perf-7.map",
                                                                    "/proc/4242/root/tmp/perf-4242.map"}));
  EXPECT_EQ(perf_map_candidates(4242, 0), (std::vector<std::string>{"/proc/4242/root/tmp/perf-4242.map"}));
  EXPECT_EQ(perf_map_candidates(4242, 4242), (std::vector<std::string>{"/proc/4242/root/tmp/perf-4242.map"}));
}

// The files of a live process, as its runtime would leave them in /tmp
// (this test's process stands in: its own pid, its own root).
TEST(PerfMap, ReadsTheTargetsFilesSafely) {
  pid_t me = ::getpid();
  std::string path = "/tmp/perf-" + std::to_string(me) + ".map";
  struct Cleanup {
    std::string path;
    ~Cleanup() { ::unlink(path.c_str()); }
  } cleanup{path};
  ::unlink(path.c_str());
  EXPECT_TRUE(read_perf_maps(me, 0).texts.empty());
  EXPECT_TRUE(read_perf_maps(me, 0).warnings.empty());
  {
    std::ofstream out(path);
    out << "1000 10 first\n2000 10 second\n3000 10 third\n";
  }
  auto all = read_perf_maps(me, 0);
  ASSERT_EQ(all.texts.size(), 1u);
  EXPECT_EQ(all.texts[0], "1000 10 first\n2000 10 second\n3000 10 third\n");
  EXPECT_TRUE(all.warnings.empty());
  // Cut to its last 20 bytes: the fragment of a line they start in is dropped.
  auto cut = read_perf_maps(me, 0, 20);
  ASSERT_EQ(cut.texts.size(), 1u);
  EXPECT_EQ(cut.texts[0], "3000 10 third\n");
  ASSERT_EQ(cut.warnings.size(), 1u);
  EXPECT_NE(cut.warnings[0].find("newest entries"), std::string::npos) << cut.warnings[0];
  // A FIFO planted there is refused, without blocking.
  ::unlink(path.c_str());
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto fifo = read_perf_maps(me, 0);
  EXPECT_TRUE(fifo.texts.empty());
  ASSERT_EQ(fifo.warnings.size(), 1u);
  EXPECT_NE(fifo.warnings[0].find("not a regular file"), std::string::npos) << fifo.warnings[0];
}

TEST(Symbolize, DebugDirsFromEnv) {
  EXPECT_TRUE(debug_dirs_from_env(nullptr).empty());
  EXPECT_EQ(debug_dirs_from_env("/a::/b/c:"), (std::vector<std::string>{"/a", "/b/c"}));
}

}  // namespace
}  // namespace remora::profile
