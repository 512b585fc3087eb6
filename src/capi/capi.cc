// libremora.so: the C API of include/remora/remora.h over one process-wide
// attach::Controller. This file only translates: C structs to AttachOptions,
// Result/Error to remora_status_t plus a per-thread message.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attach/attach.h"
#include "base/result.h"
#include "remora/remora.h"

namespace {

using remora::Errc;
using remora::Error;
using remora::Result;
namespace attach = remora::attach;

// Never destroyed: a static destructor at exit could run while another
// thread is still inside a call. Sessions hold only file descriptors (no
// ptrace stop outlives a call), which the kernel closes at exit; that close
// is what fires a lease.
attach::Controller& controller() {
  static attach::Controller* c = new attach::Controller;
  return *c;
}

thread_local std::string t_last_error;

// One status per Errc, same number. The switch has no default so that a new
// Errc makes -Wswitch point here.
remora_status_t to_status(Errc e) {
  switch (e) {
    case Errc::kOk: return REMORA_STATUS_SUCCESS;
    case Errc::kInvalidArgument: return REMORA_STATUS_INVALID_ARGUMENT;
    case Errc::kNoSuchProcess: return REMORA_STATUS_NO_SUCH_PROCESS;
    case Errc::kOwnProcess: return REMORA_STATUS_OWN_PROCESS;
    case Errc::kZombie: return REMORA_STATUS_ZOMBIE;
    case Errc::kKernelThread: return REMORA_STATUS_KERNEL_THREAD;
    case Errc::kStaticBinary: return REMORA_STATUS_STATIC_BINARY;
    case Errc::kTracedByOther: return REMORA_STATUS_TRACED_BY_OTHER;
    case Errc::kPtraceDenied: return REMORA_STATUS_PTRACE_DENIED;
    case Errc::kLibraryNotMapped: return REMORA_STATUS_LIBRARY_NOT_MAPPED;
    case Errc::kAmbiguousLibrary: return REMORA_STATUS_AMBIGUOUS_LIBRARY;
    case Errc::kSymbolNotFound: return REMORA_STATUS_SYMBOL_NOT_FOUND;
    case Errc::kTimedOut: return REMORA_STATUS_TIMED_OUT;
    case Errc::kTargetExited: return REMORA_STATUS_TARGET_EXITED;
    case Errc::kFault: return REMORA_STATUS_FAULT;
    case Errc::kParse: return REMORA_STATUS_PARSE;
    case Errc::kIo: return REMORA_STATUS_IO;
    case Errc::kNotSupported: return REMORA_STATUS_NOT_SUPPORTED;
    case Errc::kIdentityMismatch: return REMORA_STATUS_IDENTITY_MISMATCH;
    case Errc::kInternal: return REMORA_STATUS_INTERNAL;
    case Errc::kRefused: return REMORA_STATUS_REFUSED;
    case Errc::kNotAttachable: return REMORA_STATUS_NOT_ATTACHABLE;
    case Errc::kToolFailed: return REMORA_STATUS_TOOL_FAILED;
    case Errc::kNotAttached: return REMORA_STATUS_NOT_ATTACHED;
    case Errc::kAlreadyAttached: return REMORA_STATUS_ALREADY_ATTACHED;
  }
  return REMORA_STATUS_INTERNAL;
}

// The numbers are part of the ABI and equal Errc's; keep both in step.
static_assert(REMORA_STATUS_ALREADY_ATTACHED == static_cast<int>(Errc::kAlreadyAttached));
static_assert(REMORA_STATUS_REFUSED == static_cast<int>(Errc::kRefused));
static_assert(REMORA_STATUS_INTERNAL == static_cast<int>(Errc::kInternal));
static_assert(REMORA_STATUS_NO_SUCH_PROCESS == static_cast<int>(Errc::kNoSuchProcess));
static_assert(REMORA_STATUS_LAST == static_cast<int>(Errc::kAlreadyAttached) + 1,
              "a new Errc needs a REMORA_STATUS_ value (and a name and a string below)");

// v1 layouts, frozen: the smallest `size` a caller may pass.
constexpr size_t kOptionsV1Size = offsetof(remora_options_t, agent_path) + sizeof(const char*);
constexpr size_t kStateMinSize = offsetof(remora_agent_state_t, agent_loaded) + sizeof(bool);
constexpr size_t kDetachOptionsV1Size = sizeof(remora_detach_options_t);

remora_status_t fail(remora_status_t st, std::string message) {
  t_last_error = std::move(message);
  return st;
}
remora_status_t fail(const Error& e) { return fail(to_status(e.code()), e.to_string()); }

// Exceptions must not cross the C boundary. The engine does not throw, but
// the standard library may (std::bad_alloc, std::system_error from
// std::thread), so each entry point is fenced.
template <typename F>
remora_status_t fenced(const char* what, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    try {
      return fail(REMORA_STATUS_INTERNAL, std::string(what) + ": " + e.what());
    } catch (...) {
      return REMORA_STATUS_INTERNAL;
    }
  } catch (...) {
    return REMORA_STATUS_INTERNAL;
  }
}

Result<attach::Channel> channel_of(uint8_t c, const char* what) {
  switch (c) {
    case REMORA_CHANNEL_AUTO: return attach::Channel::kAuto;
    case REMORA_CHANNEL_PTRACE: return attach::Channel::kPtrace;
    case REMORA_CHANNEL_SOCKET: return attach::Channel::kSocket;
    default:
      return Error(Errc::kInvalidArgument, std::string(what) + ".channel is " + std::to_string(c) +
                                               "; use REMORA_CHANNEL_AUTO, REMORA_CHANNEL_PTRACE or "
                                               "REMORA_CHANNEL_SOCKET");
  }
}

Result<attach::AttachOptions> convert(const remora_options_t* o) {
  if (!o)
    return Error(Errc::kInvalidArgument, "remora_options_t is NULL; initialise one with remora_options_init");
  if (o->size < kOptionsV1Size)
    return Error(Errc::kInvalidArgument, "remora_options_t.size is " + std::to_string(o->size) +
                                             ", at least " + std::to_string(kOptionsV1Size) +
                                             " expected; initialise the options with remora_options_init");
  attach::AttachOptions out;
  std::string_view tools = o->tools ? o->tools : "";
  for (size_t start = 0; start <= tools.size();) {
    size_t colon = tools.find(':', start);
    if (colon == std::string_view::npos) colon = tools.size();
    if (colon > start) out.tools.emplace_back(tools.substr(start, colon - start));
    start = colon + 1;
  }
  if (out.tools.empty())
    return Error(Errc::kInvalidArgument,
                 "no tool library given: set remora_options_t.tools to a colon-separated list");
  if (o->env_count > 0 && !o->env)
    return Error(Errc::kInvalidArgument,
                 "remora_options_t.env is NULL but env_count is " + std::to_string(o->env_count));
  for (size_t i = 0; i < o->env_count; ++i) {
    const char* s = o->env[i];
    std::string_view var = s ? s : "";
    size_t eq = var.find('=');
    if (!s || eq == 0 || eq == std::string_view::npos)
      return Error(Errc::kInvalidArgument, "remora_options_t.env[" + std::to_string(i) + "] is \"" +
                                               std::string(var) + "\"; expected NAME=VALUE");
    out.env.emplace_back(std::string(var.substr(0, eq)), std::string(var.substr(eq + 1)));
  }
  if (o->timeout_msec != 0) out.timeout = std::chrono::milliseconds(o->timeout_msec);
  out.lease = o->lease;
  if (o->agent_path) out.agent_path = o->agent_path;
  out.channel = REMORA_TRY(channel_of(o->channel, "remora_options_t"));
  if (out.channel == attach::Channel::kSocket && o->attach_children)
    return Error(
        Errc::kInvalidArgument,
        "remora_options_t.attach_children with REMORA_CHANNEL_SOCKET: trees are walked through ptrace; "
        "attach each process of the tree through its own socket");
  return out;
}

// The result of a tree operation: SUCCESS, or the last failure seen, with
// every failed process listed in the message.
remora_status_t report(const char* what, pid_t root, Result<std::vector<attach::ProcessOutcome>>& r,
                       bool gone_child = false) {
  if (!r) return fail(std::move(r).error().with_context(std::string(what) + " " + std::to_string(root)));
  remora_status_t last = REMORA_STATUS_SUCCESS;
  size_t failed = 0;
  std::string lines;
  for (const auto& o : *r) {
    if (o.ok) continue;
    // A child that exited before it could be attached (a zombie among them)
    // is no failure of the tree: short-lived children come and go.
    if (gone_child && o.pid != root &&
        (o.code == Errc::kTargetExited || o.code == Errc::kNoSuchProcess || o.code == Errc::kZombie))
      continue;
    ++failed;
    last = o.code == Errc::kOk ? REMORA_STATUS_INTERNAL : to_status(o.code);
    lines += "\n  pid " + std::to_string(o.pid) + ": " +
             (o.message.empty() ? std::string(remora::errc_name(o.code)) : o.message);
  }
  if (failed == 0) return REMORA_STATUS_SUCCESS;
  return fail(last, std::string(what) + " " + std::to_string(root) + ": " + std::to_string(failed) + " of " +
                        std::to_string(r->size()) + " processes failed" + lines);
}

// The refusals about the process itself (attach::check_target), first,
// in the words of the attach: "attach to process N: process N is a zombie...".
remora_status_t check_target(pid_t pid, bool tree) {
  auto c = attach::check_target(pid, tree ? attach::TargetUse::kTree : attach::TargetUse::kProcess);
  if (!c) return fail(std::move(c).error().with_context("attach to process " + std::to_string(pid)));
  return REMORA_STATUS_SUCCESS;
}

// The same refusals, for the channel asked (an unknown one is the
// convert()'s to report): a ptrace refusal is none where the socket serves.
remora_status_t check_channel(pid_t pid, bool tree, uint8_t channel) {
  if (channel == REMORA_CHANNEL_PTRACE || channel > REMORA_CHANNEL_SOCKET) return check_target(pid, tree);
  auto c = attach::resolve_channel(
      pid, channel == REMORA_CHANNEL_SOCKET ? attach::Channel::kSocket : attach::Channel::kAuto,
      tree ? attach::TargetUse::kTree : attach::TargetUse::kProcess);
  if (!c) return fail(std::move(c).error().with_context("attach to process " + std::to_string(pid)));
  return REMORA_STATUS_SUCCESS;
}

remora_status_t attach_tree(pid_t root, const attach::AttachOptions& opts) {
  auto r = controller().attach_tree(root, opts);
  return report("attach tree", root, r, /*gone_child=*/true);
}

// Appends "PID PATH\n" per kept tool to `out` (NUL-terminated, cut at a line).
void add_kept(char* out, size_t cap, pid_t pid, const attach::UnloadReport& u) {
  size_t used = std::strlen(out);
  for (const auto& t : u.kept_tools) {
    std::string line = std::to_string(pid) + " " + t + "\n";
    if (used + line.size() + 1 > cap) return;
    std::memcpy(out + used, line.c_str(), line.size() + 1);
    used += line.size();
  }
}

remora_status_t check_pid(pid_t pid, bool zero_ok) {
  if (pid > 0 || (zero_ok && pid == 0)) return REMORA_STATUS_SUCCESS;
  return fail(REMORA_STATUS_INVALID_ARGUMENT,
              "pid " + std::to_string(pid) + " is not a process id" + (zero_ok ? " (0 means all)" : ""));
}

struct StatusText {
  const char* name;
  const char* text;
};

constexpr StatusText kStatusText[] = {
    {"REMORA_STATUS_SUCCESS", "success"},
    {"REMORA_STATUS_INVALID_ARGUMENT", "invalid argument"},
    {"REMORA_STATUS_NO_SUCH_PROCESS", "no process with that id"},
    {"REMORA_STATUS_OWN_PROCESS", "a process cannot attach to itself"},
    {"REMORA_STATUS_ZOMBIE", "the process has exited (zombie)"},
    {"REMORA_STATUS_KERNEL_THREAD", "kernel threads cannot be attached"},
    {"REMORA_STATUS_STATIC_BINARY", "statically linked processes cannot load tools"},
    {"REMORA_STATUS_TRACED_BY_OTHER", "another tracer holds the process"},
    {"REMORA_STATUS_PTRACE_DENIED", "ptrace not permitted (uid, capability, Yama ptrace_scope or dumpable)"},
    {"REMORA_STATUS_LIBRARY_NOT_MAPPED", "a required library is not loaded in the target"},
    {"REMORA_STATUS_AMBIGUOUS_LIBRARY", "a library name matches several libraries in the target"},
    {"REMORA_STATUS_SYMBOL_NOT_FOUND", "a required symbol was not found in the target"},
    {"REMORA_STATUS_TIMED_OUT", "the operation timed out"},
    {"REMORA_STATUS_TARGET_EXITED", "the target exited during the operation"},
    {"REMORA_STATUS_FAULT", "a call in the target faulted"},
    {"REMORA_STATUS_PARSE", "malformed /proc file or ELF image"},
    {"REMORA_STATUS_IO", "a system call failed"},
    {"REMORA_STATUS_NOT_SUPPORTED", "not supported by this kernel, libc or architecture"},
    {"REMORA_STATUS_IDENTITY_MISMATCH", "a file differs from the one mapped in the target"},
    {"REMORA_STATUS_INTERNAL", "internal error in Remora"},
    {"REMORA_STATUS_REFUSED",
     "the target refuses tool attachment (REMORA_TOOL_ATTACH=0 or ROCP_TOOL_ATTACH=0)"},
    {"REMORA_STATUS_NOT_ATTACHABLE", "the library is not an attachable tool (no remora_configure_attach)"},
    {"REMORA_STATUS_TOOL_FAILED", "a tool failed to load or its callback failed"},
    {"REMORA_STATUS_NOT_ATTACHED", "no tools are attached"},
    {"REMORA_STATUS_ALREADY_ATTACHED", "tools are already attached"},
};
static_assert(std::size(kStatusText) == REMORA_STATUS_LAST, "one name and string per status");

}  // namespace

extern "C" {

REMORA_API remora_status_t remora_options_init_sized(remora_options_t* opts, size_t size) {
  return fenced("remora_options_init", [&] {
    if (!opts) return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_options_init: options pointer is NULL");
    if (size < kOptionsV1Size)
      return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_options_init: size " + std::to_string(size) +
                                                      " is smaller than remora_options_t (" +
                                                      std::to_string(kOptionsV1Size) + ")");
    remora_options_t def{};
    def.timeout_msec = 10000;
    // A newer caller's struct may be larger: its extra fields are zeroed,
    // which every field added later must read as "default".
    std::memset(static_cast<void*>(opts), 0, size);
    std::memcpy(static_cast<void*>(opts), &def, std::min(size, sizeof def));
    opts->size = static_cast<uint32_t>(size);
    return REMORA_STATUS_SUCCESS;
  });
}

REMORA_API remora_status_t remora_attach(pid_t pid, const remora_options_t* opts) {
  return fenced("remora_attach", [&] {
    if (check_pid(pid, false) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    // A struct that cannot be read is the caller's bug, said first; then the
    // process, before the tools: a zombie is refused as such, also with a
    // tool list that would not do.
    if (!opts || opts->size < kOptionsV1Size) return fail(convert(opts).error());
    if (auto c = check_channel(pid, opts->attach_children, opts->channel); c != REMORA_STATUS_SUCCESS)
      return c;
    auto o = convert(opts);
    if (!o) return fail(o.error());
    if (opts->attach_children) return attach_tree(pid, *o);
    auto r = controller().attach(pid, *o);
    if (!r) return fail(r.error());
    return REMORA_STATUS_SUCCESS;
  });
}

REMORA_API remora_status_t remora_detach(pid_t pid) {
  return fenced("remora_detach", [&] {
    if (check_pid(pid, true) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    if (pid != 0) {
      auto r = controller().detach(pid);
      return r ? REMORA_STATUS_SUCCESS : fail(r.error());
    }
    // Detach all, one by one, so that every failure can be reported.
    // A session with nothing attached (one whose attach failed) is no
    // failure of "detach everything".
    remora_status_t last = REMORA_STATUS_SUCCESS;
    std::string lines;
    size_t failed = 0, total = 0;
    for (pid_t p : controller().sessions()) {
      ++total;
      auto r = controller().detach(p);
      if (r || r.error().code() == Errc::kNotAttached) continue;
      ++failed;
      last = to_status(r.error().code());
      lines += "\n  pid " + std::to_string(p) + ": " + r.error().to_string();
    }
    if (failed == 0) return REMORA_STATUS_SUCCESS;
    return fail(last, "detach all: " + std::to_string(failed) + " of " + std::to_string(total) +
                          " processes failed" + lines);
  });
}

REMORA_API remora_status_t remora_detach_options_init_sized(remora_detach_options_t* opts, size_t size) {
  return fenced("remora_detach_options_init", [&] {
    if (!opts)
      return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_detach_options_init: options pointer is NULL");
    if (size < kDetachOptionsV1Size)
      return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_detach_options_init: size " + std::to_string(size) +
                                                      " is smaller than remora_detach_options_t (" +
                                                      std::to_string(kDetachOptionsV1Size) + ")");
    std::memset(static_cast<void*>(opts), 0, size);  // later fields read 0 as "default"
    opts->size = static_cast<uint32_t>(size);
    opts->timeout_msec = 10000;
    return REMORA_STATUS_SUCCESS;
  });
}

REMORA_API remora_status_t remora_detach_with(pid_t pid, remora_detach_options_t* opts) {
  return fenced("remora_detach_with", [&] {
    if (!opts || opts->size < kDetachOptionsV1Size)
      return fail(
          REMORA_STATUS_INVALID_ARGUMENT,
          "remora_detach_with: options NULL or too small; initialise them with remora_detach_options_init");
    if (check_pid(pid, !opts->children) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    if ((opts->flags & ~REMORA_DETACH_UNLOAD) != 0)
      return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_detach_with: unknown flags " +
                                                      std::to_string(opts->flags & ~REMORA_DETACH_UNLOAD) +
                                                      " (this library knows REMORA_DETACH_UNLOAD)");
    attach::DetachOptions d;
    if (opts->timeout_msec != 0) d.timeout = std::chrono::milliseconds(opts->timeout_msec);
    d.unload = (opts->flags & REMORA_DETACH_UNLOAD) != 0;
    auto channel = channel_of(opts->channel, "remora_detach_options_t");
    if (!channel) return fail(channel.error());
    d.channel = *channel;
    opts->kept_tools[0] = '\0';
    if (opts->children) {
      auto r = controller().detach_tree(pid, d);
      if (r)
        for (const auto& o : *r) add_kept(opts->kept_tools, sizeof opts->kept_tools, o.pid, o.unload);
      return report(d.unload ? "detach and unload tree" : "detach tree", pid, r);
    }
    std::vector<pid_t> pids = pid != 0 ? std::vector<pid_t>{pid} : controller().sessions();
    remora_status_t last = REMORA_STATUS_SUCCESS;
    std::string lines;
    size_t failed = 0;
    for (pid_t p : pids) {
      auto r = controller().detach(p, d);
      if (r) add_kept(opts->kept_tools, sizeof opts->kept_tools, p, *r);
      if (r || (pid == 0 && r.error().code() == Errc::kNotAttached)) continue;
      if (pid != 0) return fail(r.error());
      ++failed;
      last = to_status(r.error().code());
      lines += "\n  pid " + std::to_string(p) + ": " + r.error().to_string();
    }
    if (failed == 0) return REMORA_STATUS_SUCCESS;
    return fail(last, "detach all: " + std::to_string(failed) + " of " + std::to_string(pids.size()) +
                          " processes failed" + lines);
  });
}

REMORA_API remora_status_t remora_attach_tree(pid_t root, const remora_options_t* opts) {
  return fenced("remora_attach_tree", [&] {
    if (check_pid(root, false) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    if (!opts || opts->size < kOptionsV1Size) return fail(convert(opts).error());
    if (auto c = check_target(root, true); c != REMORA_STATUS_SUCCESS) return c;
    auto o = convert(opts);
    if (!o) return fail(o.error());
    return attach_tree(root, *o);
  });
}

REMORA_API remora_status_t remora_detach_tree(pid_t root) {
  return fenced("remora_detach_tree", [&] {
    if (check_pid(root, false) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    auto r = controller().detach_tree(root);
    return report("detach tree", root, r);
  });
}

REMORA_API remora_status_t remora_status(pid_t pid, remora_agent_state_t* state) {
  return fenced("remora_status", [&] {
    if (check_pid(pid, false) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    if (!state) return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_status: state pointer is NULL");
    const size_t size = state->size;
    if (size < kStateMinSize)
      return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_status: state->size is " + std::to_string(size) +
                                                      "; set it to sizeof(remora_agent_state_t)");
    auto r = attach::Controller::status(pid);
    if (!r) return fail(std::move(r).error().with_context("status of process " + std::to_string(pid)));
    // Fill a full struct, then copy out what the caller's size holds.
    remora_agent_state_t full{};
    full.agent_loaded = r->agent_loaded;
    full.attached = r->attached;
    full.lease_expired = r->lease_expired;
    full.session_channel = static_cast<uint8_t>(
        r->session_channel == attach::Channel::kSocket ? REMORA_CHANNEL_SOCKET : REMORA_CHANNEL_PTRACE);
    full.sessions = r->sessions;
    full.detaches = r->detaches;
    full.listener_tid = r->listener_tid;
    full.lease_pid = r->lease_pid;
    std::strncpy(full.tools, r->tools.c_str(), sizeof full.tools - 1);
    std::strncpy(full.message, r->message.c_str(), sizeof full.message - 1);
    // Copy only whole fields (a cut string would lose its NUL): up to the
    // end of the last field that fits in the caller's size.
    constexpr size_t kFieldEnds[] = {
        offsetof(remora_agent_state_t, sessions),  // size and the flags
        offsetof(remora_agent_state_t, detaches),  offsetof(remora_agent_state_t, listener_tid),
        offsetof(remora_agent_state_t, lease_pid), offsetof(remora_agent_state_t, tools),
        offsetof(remora_agent_state_t, message),   sizeof(remora_agent_state_t),
    };
    size_t whole = kStateMinSize;
    for (size_t end : kFieldEnds)
      if (end <= size) whole = end;
    full.size = static_cast<uint32_t>(whole);
    std::memcpy(static_cast<void*>(state), &full, whole);
    return REMORA_STATUS_SUCCESS;
  });
}

REMORA_API remora_status_t remora_check_target(pid_t pid, uint32_t flags) {
  return fenced("remora_check_target", [&] {
    if (check_pid(pid, false) != REMORA_STATUS_SUCCESS) return REMORA_STATUS_INVALID_ARGUMENT;
    if ((flags & ~REMORA_CHECK_TREE) != 0)
      return fail(REMORA_STATUS_INVALID_ARGUMENT, "remora_check_target: unknown flags " +
                                                      std::to_string(flags & ~REMORA_CHECK_TREE) +
                                                      " (this library knows REMORA_CHECK_TREE)");
    return check_target(pid, (flags & REMORA_CHECK_TREE) != 0);
  });
}

REMORA_API const char* remora_last_error(void) { return t_last_error.c_str(); }

REMORA_API const char* remora_status_name(remora_status_t status) {
  int i = static_cast<int>(status);
  return i >= 0 && i < REMORA_STATUS_LAST ? kStatusText[i].name : "REMORA_STATUS_UNKNOWN";
}

REMORA_API const char* remora_status_string(remora_status_t status) {
  int i = static_cast<int>(status);
  return i >= 0 && i < REMORA_STATUS_LAST ? kStatusText[i].text : "unknown status";
}

}  // extern "C"
