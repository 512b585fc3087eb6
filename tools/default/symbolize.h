// Symbolisation of sampled PCs, after the session (on the listener thread):
// the ELF symbol tables of each loaded object (.symtab when the file has one,
// so static functions have names, else .dynsym), then dladdr, demangled with
// abi::__cxa_demangle; a PC nothing names becomes "library+0xoffset".
#ifndef REMORA_TOOLS_DEFAULT_SYMBOLIZE_H_
#define REMORA_TOOLS_DEFAULT_SYMBOLIZE_H_

#include <stdint.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace remora_tool {

class Symbolizer {
 public:
  Symbolizer();  // snapshots the loaded objects
  ~Symbolizer();
  // `pc` is an address inside the function (a return address minus one).
  std::string name(uint64_t pc);
  // True for a PC inside libremora-tool.so itself (left out of stacks).
  bool in_tool(uint64_t pc) const;

 private:
  struct Object;
  std::vector<std::unique_ptr<Object>> objects_;
  std::unordered_map<uint64_t, std::string> cache_;
  uintptr_t self_base_ = 0;
};

std::string demangle(const char* name);

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_SYMBOLIZE_H_
