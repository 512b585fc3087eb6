// Refusals about the process, before anything of the attach touches it
// (docs/architecture.md, "Attach, step by step", step 1): check_target, the
// one source of the refusals of what the process is (gone, a zombie, a
// kernel thread, traced by another, statically linked, the caller itself),
// which every entry point makes first; its environment refuses tools.
#include <sys/auxv.h>
#include <unistd.h>

#include <string>
#include <string_view>

#include "attach/attach.h"
#include "attach/internal.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
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

namespace {

// The agent is loaded through the target's dynamic loader (dlopen in its
// libc): a static program has none. Said as `remora call` says it, before
// any lookup fails on the symptom ("libc.so.6 is not mapped").
Error static_binary(pid_t pid) {
  return Error(Errc::kStaticBinary,
               "process " + std::to_string(pid) +
                   " is statically linked (no dynamic loader, no libc.so): Remora loads its agent and tools "
                   "through the target's shared libc and cannot attach tools to it");
}

// No program interpreter, as remote::Target::open tells it: AT_BASE is the
// interpreter's load address, 0 when there is none. An auxv that cannot be
// read is left to the attach, which reports it in context.
bool is_static(pid_t pid) {
  auto auxv = procfs::read_auxv(pid);
  return auxv && procfs::auxv_get(*auxv, AT_BASE).value_or(1) == 0;
}

bool has_children(pid_t pid) {
  auto kids = procfs::list_children(pid);
  return kids && !kids->empty();
}

}  // namespace

Result<void> check_dynamic(const remote::Target& t) {
  if (!t.is_static()) return ok();
  return static_binary(t.pid());
}

}  // namespace remora::attach::detail

namespace remora::attach {

// Every refusal's text is the ptrace layer's (ptrace::precheck_open, which
// `remora call` gives through remote::Target::open) or static_binary's: one
// wording wherever the process is refused.
Result<void> check_target(pid_t pid, TargetUse use) {
  if (use == TargetUse::kRead) {
    // Reading its own agent's state is no tracing of itself.
    if (pid == ::getpid()) return ok();
    REMORA_TRY(ptrace::precheck_identity(pid));
    return ok();
  }
  Result<void> refused = ok();
  if (auto st = ptrace::precheck_open(pid); !st)
    refused = std::move(st).error();
  else if (detail::is_static(pid))
    refused = detail::static_binary(pid);
  if (refused || use == TargetUse::kProcess) return refused;
  // A tree: what rules out the root alone leaves its children to attach.
  switch (refused.error().code()) {
    case Errc::kOwnProcess:
    case Errc::kTracedByOther:
    case Errc::kPtraceDenied:
    case Errc::kStaticBinary:
      if (detail::has_children(pid)) return ok();
      break;
    default: break;
  }
  return refused;
}

}  // namespace remora::attach
