// The real agent loaded into the test process, its entry points called
// directly (no ptrace): what the in-process agent tests of the default tool
// share (tool_agent_test.cc, tool_agent_raw_test.cc).
#ifndef REMORA_TESTS_DEFAULT_TOOL_AGENT_ENTRY_H_
#define REMORA_TESTS_DEFAULT_TOOL_AGENT_ENTRY_H_

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <utility>
#include <vector>

// [uint32 count] then count pairs NAME\0VALUE\0 (agent/agent.cc).
inline std::vector<char> env_buffer(const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<char> b(sizeof(uint32_t));
  uint32_t n = static_cast<uint32_t>(vars.size());
  memcpy(b.data(), &n, sizeof n);
  for (const auto& [k, v] : vars) {
    b.insert(b.end(), k.begin(), k.end());
    b.push_back('\0');
    b.insert(b.end(), v.begin(), v.end());
    b.push_back('\0');
  }
  return b;
}

// The agent at `path`, dlopen'ed as the attach engine loads it, and its two
// entry points; `error` says what failed when one of them is null. Never
// closed: the agent's constructor starts its listener thread.
struct AgentEntry {
  int (*attach)(const void* env, const char* tools) = nullptr;
  int (*detach)() = nullptr;
  std::string error;

  explicit AgentEntry(const char* path) {
    void* agent = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (agent == nullptr) {
      error = dlerror();
      return;
    }
    attach = reinterpret_cast<int (*)(const void*, const char*)>(dlsym(agent, "remora_agent_attach"));
    detach = reinterpret_cast<int (*)()>(dlsym(agent, "remora_agent_detach"));
    if (attach == nullptr || detach == nullptr) error = "the agent lacks remora_agent_attach/detach";
  }
  bool ok() const { return attach != nullptr && detach != nullptr; }
};

#endif  // REMORA_TESTS_DEFAULT_TOOL_AGENT_ENTRY_H_
