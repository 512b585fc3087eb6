// Refusals about the process, before anything of the attach touches it
// (docs/architecture.md, "Attach, step by step", step 1): its environment
// refuses tools, it has no user space, it has no dynamic loader.
#include <string>
#include <string_view>

#include "attach/internal.h"
#include "procfs/procfs.h"
#include "remote/target.h"

namespace remora::attach::detail {

// Does the target refuse tools through its environment? (Read without
// stopping it.)
Result<void> check_environment(pid_t pid) {
  auto env = procfs::read_bytes("/proc/" + std::to_string(pid) + "/environ");
  if (!env) return ok();  // unreadable: the agent checks again in the target
  std::string_view all(reinterpret_cast<const char*>(env->data()), env->size());
  for (std::string_view var : {"REMORA_TOOL_ATTACH=0", "ROCP_TOOL_ATTACH=0"}) {
    size_t pos = 0;
    while ((pos = all.find(var, pos)) != std::string_view::npos) {
      bool starts = pos == 0 || all[pos - 1] == '\0';
      bool ends = pos + var.size() == all.size() || all[pos + var.size()] == '\0';
      if (starts && ends)
        return Error(Errc::kRefused, "process " + std::to_string(pid) +
                                         " refuses tool attachment: it was started with " + std::string(var) +
                                         " in its environment");
      pos += var.size();
    }
  }
  return ok();
}

// A zombie or a kernel thread has no user space to attach tools to: said
// as `remora call` says it (ptrace::precheck_open words the same). Any other
// trouble reading it is left to the attach, which reports it in context.
Result<void> refuse_no_user_space(pid_t pid) {
  auto st = procfs::read_status(pid);
  if (!st || st->tgid != pid) return ok();
  const std::string p = std::to_string(pid);
  if (st->state == 'Z' || st->state == 'X')
    return Error(Errc::kZombie, "process " + p + " is a zombie: it has exited and waits for its parent (" +
                                    std::to_string(st->ppid) +
                                    ") to reap it; there is nothing left to trace");
  bool kthread = st->kthread.value_or(false);
  if (!st->kthread) {
    auto stat = procfs::read_stat(pid);
    kthread = stat && (stat->flags & 0x00200000u) != 0;  // PF_KTHREAD
  }
  if (kthread)
    return Error(Errc::kKernelThread, "process " + p + " (" + st->name +
                                          ") is a kernel thread: it has no user space to trace; pick a "
                                          "user-space process");
  return ok();
}

// The agent is loaded through the target's dynamic loader (dlopen in its
// libc): a static program has none. Said as `remora call` says it, before
// any lookup fails on the symptom ("libc.so.6 is not mapped").
Result<void> check_dynamic(const remote::Target& t) {
  if (!t.is_static()) return ok();
  const pid_t pid = t.pid();
  return Error(Errc::kStaticBinary,
               "process " + std::to_string(pid) +
                   " is statically linked (no dynamic loader, no libc.so): Remora loads its agent and tools "
                   "through the target's shared libc and cannot attach tools to it");
}

}  // namespace remora::attach::detail
