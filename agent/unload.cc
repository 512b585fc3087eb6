// The agent's half of the unload (agent/protocol.h, remora_agent_unload;
// docs/architecture.md, "The unload"): what its dlclose will unmap, told to
// the controller before, and the tools' own dlclose, in the agent's
// destructor once the controller has proven that no thread can be in any of
// it.
//
// Why the agent does not decide alone: a count of threads inside a tool's
// code that one thread reads while the others run proves nothing. A thread
// preempted between a signal handler's entry and its increment, or between
// its decrement and its return, is inside and uncounted. With every thread
// stopped, though, a thread is either counted (it called out of the tool:
// the real function of a wrapper, a system call of the handler) or its
// program counter is in the tool's code. So the controller stops every
// thread and checks both; only then does it have the agent dlclosed. The
// agent's part is to say where the code is and where the counts are.
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/internal.h"
#include "agent/protocol.h"
#include "remora/tool.h"

extern "C" {
extern struct remora_agent_info remora_agent_info;
// glibc's, exported since 2.3.2 and 2.2.5: pthread_atfork is
// __register_atfork with the caller's __dso_handle, and __cxa_finalize(d)
// runs d's exit functions (none are registered with our key) and then
// unregisters every fork handler registered with d.
int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void* dso_handle);
void __cxa_finalize(void* dso_handle);
}

namespace remora_agent {

namespace {

struct FindSegments {
  uintptr_t bias;
  const char* name;
  bool found;
  bool overflow;
};

// Appends the executable PT_LOAD segments of the object loaded at `bias` to
// unload_code (dl_iterate_phdr holds the loader's lock: the list is stable).
int add_segments(struct dl_phdr_info* info, size_t, void* data) {
  auto* f = static_cast<FindSegments*>(data);
  if (info->dlpi_addr != f->bias || f->found) return 0;
  if (f->name != nullptr && (info->dlpi_name == nullptr || strcmp(info->dlpi_name, f->name) != 0)) return 0;
  f->found = true;
  struct remora_agent_info& in = remora_agent_info;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    if (in.unload_code_count == REMORA_AGENT_UNLOAD_RANGES) {
      f->overflow = true;
      return 1;
    }
    const uint64_t start = info->dlpi_addr + ph.p_vaddr;
    in.unload_code[in.unload_code_count][0] = start;
    in.unload_code[in.unload_code_count][1] = start + ph.p_memsz;
    ++in.unload_code_count;
  }
  return 1;
}

// False when the object's segments were not found or did not all fit.
bool add_object(const link_map* map) {
  if (map == nullptr) return false;
  FindSegments f{static_cast<uintptr_t>(map->l_addr), map->l_name, false, false};
  dl_iterate_phdr(add_segments, &f);
  return f.found && !f.overflow;
}

void append_kept(const char* path) {
  char* out = remora_agent_info.kept;
  const size_t used = strlen(out);
  snprintf(out + used, sizeof remora_agent_info.kept - used, "%s%s", used ? ":" : "", path);
}

// A handler of ours still installed for some signal would be entered by
// the next such signal after the dlclose: the unload is not planned then.
// (Restoring one is the tool's tool_fini; a signal still pending for it was
// discarded when the tool set SIG_IGN first, and one already being
// delivered stops its thread in the handler, where the controller sees it.)
int signal_into_ranges() {
  const struct remora_agent_info& in = remora_agent_info;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction cur;
    if (sigaction(sig, nullptr, &cur) != 0) continue;  // glibc's own (SIGCANCEL, SIGSETXID)
    const auto h = (cur.sa_flags & SA_SIGINFO) != 0 ? reinterpret_cast<uintptr_t>(cur.sa_sigaction)
                                                    : reinterpret_cast<uintptr_t>(cur.sa_handler);
    for (uint32_t i = 0; i < in.unload_code_count; ++i)
      if (h >= in.unload_code[i][0] && h < in.unload_code[i][1]) return sig;
  }
  return 0;
}

char g_fork_key;

// [start, end) of the function at `fn`, from its symbol's size.
bool function_range(void* fn, uint64_t (&range)[2]) {
  Dl_info info{};
  ElfW(Sym)* sym = nullptr;
  if (dladdr1(fn, &info, reinterpret_cast<void**>(&sym), RTLD_DL_SYMENT) == 0 || sym == nullptr ||
      info.dli_saddr == nullptr || sym->st_size == 0)
    return false;
  range[0] = reinterpret_cast<uintptr_t>(info.dli_saddr);
  range[1] = range[0] + sym->st_size;
  return true;
}

}  // namespace

int register_fork_handlers(void (*prepare)(void), void (*parent)(void), void (*child)(void)) {
  return __register_atfork(prepare, parent, child, &g_fork_key);
}

void unregister_fork_handlers() { __cxa_finalize(&g_fork_key); }

void release_fork_handlers(const UnloadTool* tools, int count) {
  for (int i = count - 1; i >= 0; --i)
    if (tools[i].handle != nullptr && tools[i].fork_key != nullptr) __cxa_finalize(tools[i].fork_key);
  unregister_fork_handlers();
}

bool plan_unload(UnloadTool* tools, int count, const void* self_link_map, const long* hooks_inside, char* why,
                 size_t why_size) {
  struct remora_agent_info& in = remora_agent_info;
  in.unload_code_count = 0;
  in.unload_counter_count = 0;
  in.kept[0] = '\0';
  if (!add_object(static_cast<const link_map*>(self_link_map))) {
    snprintf(why, why_size, "the agent did not find its own segments");
    return false;
  }
  in.unload_counters[0][0] = reinterpret_cast<uintptr_t>(hooks_inside);
  in.unload_counters[0][1] = 1;
  in.unload_counters[0][2] = sizeof(long);
  in.unload_counter_count = 1;
  for (int i = 0; i < count; ++i) {
    if (tools[i].handle == nullptr) continue;
    const auto* q = static_cast<const remora_tool_quiesce_t*>(dlsym(tools[i].handle, "remora_tool_quiesce"));
    // The fields up to `pinned` (fork_key is read only where `size` covers it).
    const bool complete =
        q == nullptr || q->size >= offsetof(remora_tool_quiesce_t, pinned) + sizeof(q->pinned);
    tools[i].fork_key = nullptr;
    if (q != nullptr && q->size >= offsetof(remora_tool_quiesce_t, fork_key) + sizeof q->fork_key)
      tools[i].fork_key = q->fork_key;
    if (q != nullptr && complete && q->pinned != nullptr &&
        __atomic_load_n(q->pinned, __ATOMIC_ACQUIRE) != 0) {
      append_kept(tools[i].path);  // stays mapped (RTLD_NODELETE): not in the proof
      continue;
    }
    // glibc's dlopen handle is the object's link_map (no dlinfo: it is
    // GLIBC_2.34, above the agent's minimum).
    if (!add_object(static_cast<const link_map*>(tools[i].handle))) {
      snprintf(why, why_size, "the segments of tool %.512s were not found (or more than %d in all)",
               tools[i].path, REMORA_AGENT_UNLOAD_RANGES);
      return false;
    }
    if (q == nullptr) continue;
    if (!complete || q->counters == nullptr || in.unload_counter_count == REMORA_AGENT_UNLOAD_RANGES) {
      snprintf(why, why_size, "tool %.512s exports a remora_tool_quiesce the agent cannot read",
               tools[i].path);
      return false;
    }
    uint64_t* c = in.unload_counters[in.unload_counter_count++];
    c[0] = reinterpret_cast<uintptr_t>(q->counters);
    c[1] = q->stripes;
    c[2] = q->stride;
  }
  if (!function_range(reinterpret_cast<void*>(&fork), in.unload_fork)) {
    snprintf(why, why_size, "the C library's fork() was not found");
    return false;
  }
  if (!function_range(reinterpret_cast<void*>(&__register_atfork), in.unload_atfork)) {
    snprintf(why, why_size, "the C library's __register_atfork was not found");
    return false;
  }
  if (const int sig = signal_into_ranges(); sig != 0) {
    snprintf(why, why_size, "the handler of signal %d is still in the code the unload would unmap", sig);
    return false;
  }
  return true;
}

void release_tools(const UnloadTool* tools, int count) {
  for (int i = count - 1; i >= 0; --i) {
    if (tools[i].handle == nullptr) continue;
    if (auto release =
            reinterpret_cast<remora_tool_release_fn>(dlsym(tools[i].handle, "remora_tool_release")))
      release();
    // Within the agent's own dlclose: glibc defers the work of a dlclose
    // made by a destructor to the outer one, which unmaps the tool too.
    dlclose(tools[i].handle);
  }
}

}  // namespace remora_agent
