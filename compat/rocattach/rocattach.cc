// ROCm's rocattach API (include/rocattach.h) over Remora's C API. The
// decisions that differ from a plain translation, and why:
//  - The tool list comes from the caller's ROCPROF_ATTACH_TOOL_LIBRARY (or
//    REMORA_ATTACH_TOOL_LIBRARY), read with secure_getenv: as in ROCm, a
//    setuid/setcap caller must not let its user pick the injected library.
//    Remora ships no default tool yet, so none set is INVALID_ARGUMENT.
//  - A refusing target (ROCP_TOOL_ATTACH=0) gives ROCATTACH_STATUS_ERROR:
//    ROCm returns ERROR for a target without attach support, and its tests
//    check for exactly that.
//  - Already attached / not attached give INVALID_ARGUMENT, as ROCm's
//    session table does; detach(0) returns SUCCESS, as ROCm's does.
#include "rocattach.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "remora/remora.h"

extern char** environ;

namespace {

constexpr const char kLog[] = "[rocprofiler-sdk-rocattach]";

struct StatusText {
  const char* name;
  const char* text;
};
constexpr StatusText kStatusText[] = {
    {"ROCATTACH_STATUS_SUCCESS", "Success"},
    {"ROCATTACH_STATUS_ERROR", "General error"},
    {"ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT", "Invalid function argument"},
    {"ROCATTACH_STATUS_ERROR_NOT_SUPPORTED", "Attachment not supported on this platform"},
    {"ROCATTACH_STATUS_ERROR_PTRACE_ERROR", "General ptrace error"},
    {"ROCATTACH_STATUS_ERROR_PTRACE_OPERATION_NOT_PERMITTED",
     "ptrace returned EPERM, operation not permitted"},
    {"ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND", "ptrace returned ESRCH, no such process"},
};
static_assert(std::size(kStatusText) == ROCATTACH_STATUS_LAST, "one name and string per status");

// See the table in rocattach.h. No default: a new remora_status_t makes
// -Wswitch point here.
rocattach_status_t to_rocattach(remora_status_t s) {
  switch (s) {
    case REMORA_STATUS_SUCCESS: return ROCATTACH_STATUS_SUCCESS;
    case REMORA_STATUS_NO_SUCH_PROCESS:
    case REMORA_STATUS_TARGET_EXITED:
    case REMORA_STATUS_ZOMBIE: return ROCATTACH_STATUS_ERROR_PTRACE_PROCESS_NOT_FOUND;
    case REMORA_STATUS_PTRACE_DENIED:
    case REMORA_STATUS_TRACED_BY_OTHER:
    case REMORA_STATUS_OWN_PROCESS: return ROCATTACH_STATUS_ERROR_PTRACE_OPERATION_NOT_PERMITTED;
    case REMORA_STATUS_KERNEL_THREAD:
    case REMORA_STATUS_LIBRARY_NOT_MAPPED:
    case REMORA_STATUS_AMBIGUOUS_LIBRARY:
    case REMORA_STATUS_SYMBOL_NOT_FOUND:
    case REMORA_STATUS_TIMED_OUT:
    case REMORA_STATUS_FAULT:
    case REMORA_STATUS_IDENTITY_MISMATCH: return ROCATTACH_STATUS_ERROR_PTRACE_ERROR;
    case REMORA_STATUS_INVALID_ARGUMENT:
    case REMORA_STATUS_NOT_ATTACHED:
    case REMORA_STATUS_ALREADY_ATTACHED: return ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT;
    case REMORA_STATUS_NOT_SUPPORTED:
    case REMORA_STATUS_STATIC_BINARY: return ROCATTACH_STATUS_ERROR_NOT_SUPPORTED;
    case REMORA_STATUS_REFUSED:
    case REMORA_STATUS_NOT_ATTACHABLE:
    case REMORA_STATUS_TOOL_FAILED:
    case REMORA_STATUS_PARSE:
    case REMORA_STATUS_IO:
    case REMORA_STATUS_INTERNAL:
    case REMORA_STATUS_LAST: return ROCATTACH_STATUS_ERROR;
  }
  return ROCATTACH_STATUS_ERROR;
}

void print_error(const std::string& what, const char* message) {
  std::fprintf(stderr, "%s %s failed: %s\n", kLog, what.c_str(), message);
}

// The rocattach status of a remora call; prints Remora's message on failure.
rocattach_status_t finish(const std::string& what, remora_status_t s) {
  if (s == REMORA_STATUS_SUCCESS) return ROCATTACH_STATUS_SUCCESS;
  print_error(what, remora_last_error());
  return to_rocattach(s);
}

// The options of an attach, owning the strings the remora_options_t points
// into.
struct Options {
  std::string tools;
  std::vector<std::string> env_storage;
  std::vector<const char*> env;
  remora_options_t opts{};
};

bool forwarded(const char* var) {
  return std::strncmp(var, "ROCP", 4) == 0 || std::strncmp(var, "REMORA_", 7) == 0;
}

// False (with a message printed) when no tool library is configured.
bool make_options(const std::string& what, Options* o) {
  const char* tools = secure_getenv("ROCPROF_ATTACH_TOOL_LIBRARY");
  if (!tools || !*tools) tools = secure_getenv("REMORA_ATTACH_TOOL_LIBRARY");
  if (!tools || !*tools) {
    print_error(what,
                "no tool library to attach: set ROCPROF_ATTACH_TOOL_LIBRARY (or REMORA_ATTACH_TOOL_LIBRARY) "
                "in this process's environment to the tool's path (colon-separated for several); the tool "
                "must implement Remora's tool ABI (remora/tool.h)");
    return false;
  }
  o->tools = tools;
  // environ is read as ROCm reads it; a concurrent setenv in another thread
  // is the caller's race, as with getenv.
  for (char** e = environ; e && *e; ++e)
    if (forwarded(*e) && std::strchr(*e, '=')) o->env_storage.emplace_back(*e);
  for (const auto& s : o->env_storage) o->env.push_back(s.c_str());
  remora_options_init(&o->opts);
  o->opts.tools = o->tools.c_str();
  o->opts.env = o->env.data();
  o->opts.env_count = o->env.size();
  o->opts.lease = false;  // tools stay attached until rocattach_detach, as in ROCm
  return true;
}

// Roots attached with rocattach_attach_tree, for rocattach_detach_tree.
std::mutex g_mu;
std::set<int>& tree_roots() {
  static auto* roots = new std::set<int>;  // never destroyed: see remora.h
  return *roots;
}

rocattach_status_t bad_pid(const std::string& what, int pid) {
  print_error(what, ("pid " + std::to_string(pid) + " is not a process id").c_str());
  return ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT;
}

template <typename F>
rocattach_status_t fenced(F&& f) noexcept {
  try {
    return f();
  } catch (...) {  // std::bad_alloc: nothing may unwind into C callers
    return ROCATTACH_STATUS_ERROR;
  }
}

}  // namespace

extern "C" {

ROCATTACH_API rocattach_status_t rocattach_get_version(uint32_t* major, uint32_t* minor, uint32_t* patch) {
  if (major) *major = ROCATTACH_VERSION_MAJOR;
  if (minor) *minor = ROCATTACH_VERSION_MINOR;
  if (patch) *patch = ROCATTACH_VERSION_PATCH;
  return ROCATTACH_STATUS_SUCCESS;
}

ROCATTACH_API rocattach_status_t rocattach_get_version_triplet(rocattach_version_triplet_t* info) {
  if (!info) return ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT;
  *info = {ROCATTACH_VERSION_MAJOR, ROCATTACH_VERSION_MINOR, ROCATTACH_VERSION_PATCH};
  return ROCATTACH_STATUS_SUCCESS;
}

ROCATTACH_API rocattach_status_t rocattach_attach(int pid) {
  return fenced([&] {
    const std::string what = "rocattach_attach(" + std::to_string(pid) + ")";
    if (pid <= 0) return bad_pid(what, pid);
    // The process first (a zombie, a kernel thread...), then the tools.
    if (remora_status_t c = remora_check_target(pid, 0); c != REMORA_STATUS_SUCCESS) return finish(what, c);
    Options o;
    if (!make_options(what, &o)) return ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT;
    return finish(what, remora_attach(pid, &o.opts));
  });
}

ROCATTACH_API rocattach_status_t rocattach_attach_tree(int pid) {
  return fenced([&] {
    const std::string what = "rocattach_attach_tree(" + std::to_string(pid) + ")";
    if (pid <= 0) return bad_pid(what, pid);
    if (remora_status_t c = remora_check_target(pid, REMORA_CHECK_TREE); c != REMORA_STATUS_SUCCESS)
      return finish(what, c);
    Options o;
    if (!make_options(what, &o)) return ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT;
    remora_status_t s = remora_attach_tree(pid, &o.opts);
    // Per-process failures leave the others attached: remember the tree
    // unless the root itself could not be walked.
    if (s != REMORA_STATUS_INVALID_ARGUMENT && !(::kill(pid, 0) != 0 && errno == ESRCH)) {
      std::lock_guard lock(g_mu);
      tree_roots().insert(pid);
    }
    return finish(what, s);
  });
}

ROCATTACH_API rocattach_status_t rocattach_detach(int pid) {
  return fenced([&] {
    const std::string what = "rocattach_detach(" + std::to_string(pid) + ")";
    if (pid < 0) return bad_pid(what, pid);
    remora_status_t s = remora_detach(pid);
    if (pid == 0) {
      std::lock_guard lock(g_mu);
      tree_roots().clear();
      if (s != REMORA_STATUS_SUCCESS) print_error(what, remora_last_error());
      return ROCATTACH_STATUS_SUCCESS;  // as ROCm: detach-all reports, never fails
    }
    return finish(what, s);
  });
}

ROCATTACH_API rocattach_status_t rocattach_detach_tree(int pid) {
  return fenced([&] {
    const std::string what = "rocattach_detach_tree(" + std::to_string(pid) + ")";
    {
      std::lock_guard lock(g_mu);
      if (tree_roots().erase(pid) == 0) {
        print_error(what, ("no process tree was attached from pid " + std::to_string(pid) +
                           " with rocattach_attach_tree")
                              .c_str());
        return ROCATTACH_STATUS_ERROR_INVALID_ARGUMENT;
      }
    }
    return finish(what, remora_detach_tree(pid));
  });
}

ROCATTACH_API const char* rocattach_get_status_name(rocattach_status_t status) {
  int i = static_cast<int>(status);
  return i >= 0 && i < ROCATTACH_STATUS_LAST ? kStatusText[i].name : nullptr;
}

ROCATTACH_API const char* rocattach_get_status_string(rocattach_status_t status) {
  int i = static_cast<int>(status);
  return i >= 0 && i < ROCATTACH_STATUS_LAST ? kStatusText[i].text : nullptr;
}

}  // extern "C"
