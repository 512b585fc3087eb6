// PLT stubs named after their targets (profile/plt.h), against objdump,
// which names them the same way ("<malloc@plt>"): every entry objdump names
// in .plt, .plt.sec and .plt.got of real objects of this machine (this
// test, the C and C++ runtimes, the python3 and remora binaries) is found,
// at the same address, with the same name; none is named that objdump does
// not name. Skipped, saying so, without objdump (binutils).
#include "profile/plt.h"

#include <fcntl.h>
#include <gelf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <regex>
#include <string>

namespace remora::profile {
namespace {

// objdump's names of the PLT entries of `path`: address -> "name@plt".
std::map<uint64_t, std::string> objdump_plt(const std::string& objdump, const std::string& path) {
  std::map<uint64_t, std::string> out;
  const std::string cmd = objdump + " -d -j .plt -j .plt.sec -j .plt.got '" + path + "' 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return out;
  static const std::regex kLabel("^([0-9a-f]+) <(.+@plt)>:$");
  char line[4096];
  while (fgets(line, sizeof line, p.get()) != nullptr) {
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    std::smatch m;
    if (std::regex_match(l, m, kLabel)) out[std::stoull(m[1], nullptr, 16)] = m[2];
  }
  return out;
}

std::map<uint64_t, std::string> ours(const std::string& path, uint16_t* machine) {
  std::map<uint64_t, std::string> out;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  GElf_Ehdr eh;
  *machine = elf != nullptr && gelf_getehdr(elf, &eh) != nullptr ? eh.e_machine : 0;
  for (const PltEntry& e : plt_entries(elf)) {
    out[e.start] = e.name;
    EXPECT_EQ(plt_entry_at(plt_entries(elf), e.start)->name, e.name);
    EXPECT_EQ(plt_entry_at(plt_entries(elf), e.end - 1)->name, e.name);
  }
  elf_end(elf);
  ::close(fd);
  return out;
}

bool native_is(uint16_t machine) {
#if defined(__x86_64__)
  return machine == EM_X86_64;
#elif defined(__aarch64__)
  return machine == EM_AARCH64;
#else
  return false;
#endif
}

TEST(PltNames, AgreeWithObjdump) {
  if (std::system("objdump --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "objdump (binutils) is not installed";
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof self - 1), 0);
  size_t compared = 0;
  for (std::string path :
       {std::string(self), std::string(REMORA_CLI_PATH), std::string("/usr/bin/python3"),
        std::string("/lib/x86_64-linux-gnu/libstdc++.so.6"),
        std::string("/lib/aarch64-linux-gnu/libstdc++.so.6"), std::string("/lib/x86_64-linux-gnu/libc.so.6"),
        std::string("/lib/aarch64-linux-gnu/libc.so.6")}) {
    if (::access(path.c_str(), R_OK) != 0) continue;
    char real[4096] = {};
    if (::realpath(path.c_str(), real) != nullptr) path = real;
    uint16_t machine = 0;
    auto got = ours(path, &machine);
    // This machine's objdump, or the cross binutils' for the other
    // architecture's libraries (multiarch).
    const std::string objdump = machine == EM_AARCH64 && !native_is(EM_AARCH64) ? "aarch64-linux-gnu-objdump"
                                : machine == EM_X86_64 && !native_is(EM_X86_64) ? "x86_64-linux-gnu-objdump"
                                                                                : "objdump";
    if (std::system((objdump + " --version > /dev/null 2>&1").c_str()) != 0) {
      printf("  %s: skipped, no %s to compare with\n", path.c_str(), objdump.c_str());
      continue;
    }
    auto want = objdump_plt(objdump, path);
    // objdump names an ifunc's entry "*ABS*+0xRESOLVER@plt"; we name it after
    // the function at that address where the object has one.
    size_t ifuncs = 0;
    for (auto& [addr, name] : want)
      if (name.rfind("*ABS*+", 0) == 0 && got.count(addr) != 0 && got[addr].size() > 4 &&
          got[addr].compare(got[addr].size() - 4, 4, "@plt") == 0) {
        name = got[addr];
        ++ifuncs;
      }
    EXPECT_EQ(got, want) << path;
    printf("  %s: %zu PLT entries named as %s names them (%zu ifuncs after their function)\n", path.c_str(),
           got.size(), objdump.c_str(), ifuncs);
    compared += want.size();
  }
  EXPECT_GT(compared, 100u) << "the objects here have PLTs: this test compared almost nothing";
}

TEST(PltNames, NoElfNoEntries) {
  EXPECT_TRUE(plt_entries(nullptr).empty());
  EXPECT_EQ(plt_entry_at({}, 0x1000), nullptr);
}

}  // namespace
}  // namespace remora::profile
