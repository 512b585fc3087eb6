// The libtnfctl-shaped C API (include/remora/compat/tnfctl.h) over
// control::Process. Built into libremora.so (target remora_capi).
#include "remora/compat/tnfctl.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <new>
#include <string>

#include "control/process.h"

using remora::Errc;
using remora::Error;
using namespace remora::control;

struct tnfctl_handle {
  std::unique_ptr<Process> proc;
  int exit_status = 0;
  bool exited = false;
};

namespace {

thread_local std::string g_last_error;

tnfctl_errcode_t map_error(const Error& e) {
  g_last_error = e.to_string();
  switch (e.code()) {
    case Errc::kOk: return TNFCTL_ERR_NONE;
    case Errc::kInvalidArgument:
    case Errc::kOwnProcess:
    case Errc::kKernelThread: return TNFCTL_ERR_BADARG;
    case Errc::kNoSuchProcess:
    case Errc::kZombie: return TNFCTL_ERR_NOPROCESS;
    case Errc::kStaticBinary: return TNFCTL_ERR_NOTDYNAMIC;
    case Errc::kTracedByOther: return TNFCTL_ERR_BUSY;
    case Errc::kPtraceDenied: return TNFCTL_ERR_ACCES;
    case Errc::kTargetExited: return TNFCTL_ERR_NOTARGET;
    case Errc::kTimedOut: return TNFCTL_ERR_TIMEDOUT;
    case Errc::kIo: return e.sys_errno() == ENOENT ? TNFCTL_ERR_FILENOTFOUND : TNFCTL_ERR_INTERNAL;
    default: return TNFCTL_ERR_INTERNAL;
  }
}

tnfctl_errcode_t wrap(std::unique_ptr<Process> p, tnfctl_handle_t** out) {
  auto* h = new (std::nothrow) tnfctl_handle;
  if (h == nullptr) return TNFCTL_ERR_ALLOCFAIL;
  h->proc = std::move(p);
  *out = h;
  return TNFCTL_ERR_NONE;
}

}  // namespace

extern "C" {

tnfctl_errcode_t tnfctl_pid_open(pid_t pid, tnfctl_handle_t** ret_val) {
  g_last_error.clear();
  if (ret_val == nullptr) return TNFCTL_ERR_BADARG;
  *ret_val = nullptr;
  auto p = Process::open(pid);
  if (!p.ok()) return map_error(p.error());
  return wrap(std::move(*p), ret_val);
}

tnfctl_errcode_t tnfctl_exec_open(const char* pgm_name, char* const* argv, char* const* envp,
                                  const char* libtnfprobe_path, const char* ld_preload,
                                  tnfctl_handle_t** ret_val) {
  g_last_error.clear();
  if (ret_val == nullptr || pgm_name == nullptr || pgm_name[0] == '\0') return TNFCTL_ERR_BADARG;
  *ret_val = nullptr;
  LaunchOptions o;
  o.argv.emplace_back(pgm_name);
  if (argv != nullptr && argv[0] != nullptr)
    for (char* const* a = argv + 1; *a != nullptr; ++a) o.argv.emplace_back(*a);
  if (envp != nullptr) {
    o.env.emplace();
    for (char* const* e = envp; *e != nullptr; ++e) o.env->emplace_back(*e);
  }
  if (libtnfprobe_path != nullptr) {
    std::string agent = std::string(libtnfprobe_path) + "/libremora-agent.so";
    if (::access(agent.c_str(), R_OK) != 0) {
      g_last_error = "no readable libremora-agent.so in " + std::string(libtnfprobe_path);
      return TNFCTL_ERR_NOLIBTNFPROBE;
    }
    o.preload_dir = libtnfprobe_path;
  }
  if (ld_preload != nullptr) o.ld_preload = ld_preload;
  auto p = Process::launch(o);
  if (!p.ok()) return map_error(p.error());
  return wrap(std::move(*p), ret_val);
}

tnfctl_errcode_t tnfctl_continue(tnfctl_handle_t* hndl, tnfctl_event_t* evt, tnfctl_handle_t** child_hndl) {
  g_last_error.clear();
  if (child_hndl != nullptr) *child_hndl = nullptr;
  if (hndl == nullptr || evt == nullptr || !hndl->proc) return TNFCTL_ERR_BADARG;
  ContOptions c;
  c.want_child = child_hndl != nullptr;
  auto ev = hndl->proc->cont(c);
  if (!ev.ok()) return map_error(ev.error());
  switch (ev->kind) {
    case Event::Kind::kIntr: *evt = TNFCTL_EVENT_EINTR; break;
    case Event::Kind::kGone: *evt = TNFCTL_EVENT_TARGGONE; break;
    case Event::Kind::kDlopen: *evt = TNFCTL_EVENT_DLOPEN; break;
    case Event::Kind::kDlclose: *evt = TNFCTL_EVENT_DLCLOSE; break;
    case Event::Kind::kExec: *evt = TNFCTL_EVENT_EXEC; break;
    case Event::Kind::kExit:
      *evt = TNFCTL_EVENT_EXIT;
      hndl->exited = true;
      hndl->exit_status = ev->exit_status;
      break;
    case Event::Kind::kFork:
      *evt = TNFCTL_EVENT_FORK;
      if (child_hndl != nullptr && ev->child) {
        auto err = wrap(std::move(ev->child), child_hndl);
        if (err != TNFCTL_ERR_NONE) return err;
      }
      break;
  }
  return TNFCTL_ERR_NONE;
}

tnfctl_errcode_t tnfctl_close(tnfctl_handle_t* hndl, tnfctl_targ_op_t action) {
  g_last_error.clear();
  if (hndl == nullptr) return TNFCTL_ERR_BADARG;
  CloseMode mode = CloseMode::kDefault;
  switch (action) {
    case TNFCTL_TARG_DEFAULT: mode = CloseMode::kDefault; break;
    case TNFCTL_TARG_KILL: mode = CloseMode::kKill; break;
    case TNFCTL_TARG_RESUME: mode = CloseMode::kResume; break;
    case TNFCTL_TARG_SUSPEND: mode = CloseMode::kSuspend; break;
    default: mode = CloseMode::kDefault; break;
  }
  tnfctl_errcode_t rc = TNFCTL_ERR_NONE;
  if (hndl->proc) {
    auto r = hndl->proc->close(mode);
    if (!r.ok()) rc = map_error(r.error());
  }
  delete hndl;
  return rc;
}

const char* tnfctl_strerror(tnfctl_errcode_t errcode) {
  switch (errcode) {
    case TNFCTL_ERR_NONE: return "success";
    case TNFCTL_ERR_ACCES: return "permission denied";
    case TNFCTL_ERR_NOTARGET: return "target process finished";
    case TNFCTL_ERR_ALLOCFAIL: return "memory allocation failure";
    case TNFCTL_ERR_INTERNAL: return "internal error";
    case TNFCTL_ERR_BADARG: return "bad input argument";
    case TNFCTL_ERR_NOTDYNAMIC: return "target is not a dynamic executable";
    case TNFCTL_ERR_NOLIBTNFPROBE: return "libremora-agent.so not found";
    case TNFCTL_ERR_NOPROCESS: return "no such target process";
    case TNFCTL_ERR_FILENOTFOUND: return "file not found";
    case TNFCTL_ERR_BUSY: return "target busy: another tracer or handle controls it";
    case TNFCTL_ERR_TIMEDOUT: return "timed out";
  }
  return "unknown error code";
}

void tnfctl_interrupt(tnfctl_handle_t* hndl) {
  if (hndl != nullptr && hndl->proc) hndl->proc->interrupt();
}

pid_t tnfctl_pid(const tnfctl_handle_t* hndl) {
  return hndl != nullptr && hndl->proc ? hndl->proc->pid() : -1;
}

tnfctl_errcode_t tnfctl_exit_status(const tnfctl_handle_t* hndl, int* status) {
  if (hndl == nullptr || status == nullptr || !hndl->exited) return TNFCTL_ERR_BADARG;
  *status = hndl->exit_status;
  return TNFCTL_ERR_NONE;
}

const char* tnfctl_last_error(void) { return g_last_error.c_str(); }

}  // extern "C"
