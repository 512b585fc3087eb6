// Loading the agent into the target (docs/architecture.md, "Attach, step
// by step", step 2): finding the agent's file here, making a library
// visible inside the target, loading it on the loader thread (loader.cc),
// delivering the libraries of a tool that the target lacks, and
// ensure_agent, which resolves the agent or loads it first.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "base/log.h"
#include "base/unique_fd.h"
#include "elf/elf_image.h"
#include "procfs/procfs.h"
#include "remote/lookup.h"
#include "remote/remote_handle.h"
#include "remote/seccomp.h"
#include "remote/target.h"
#include "remote/visible_file.h"

#ifndef REMORA_INSTALL_LIBDIR
#define REMORA_INSTALL_LIBDIR "/usr/local/lib"
#endif

namespace remora::attach {

using detail::kAgentName;

namespace {

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_file(const std::string& p) { return ::access(p.c_str(), R_OK) == 0; }

}  // namespace

std::vector<std::byte> encode_env(const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::byte> out(4);
  uint32_t count = static_cast<uint32_t>(env.size());
  std::memcpy(out.data(), &count, 4);
  for (const auto& [name, value] : env) {
    for (const std::string* s : {&name, &value}) {
      auto bytes = std::as_bytes(std::span(s->data(), s->size()));
      out.insert(out.end(), bytes.begin(), bytes.end());
      out.push_back(std::byte{0});
    }
  }
  return out;
}

Result<std::string> find_agent_library(const std::string& explicit_path) {
  std::vector<std::string> tried;
  auto consider = [&](const std::string& p) -> bool {
    tried.push_back(p);
    return is_file(p);
  };
  auto absolute = [](const std::string& p) {
    char real[PATH_MAX];
    return std::string(::realpath(p.c_str(), real) ? real : p.c_str());
  };
  if (!explicit_path.empty()) {
    if (consider(explicit_path)) return absolute(explicit_path);
    return Error(Errc::kInvalidArgument, "agent library " + explicit_path + " not found or not readable");
  }
  if (const char* env = std::getenv("REMORA_AGENT_PATH"); env && *env) {
    if (consider(env)) return absolute(env);
  }
  std::vector<std::string> dirs;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_agent_library), &info) && info.dli_fname)
    dirs.push_back(dir_of(info.dli_fname));
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    std::string d = dir_of(exe);
    dirs.push_back(d + "/../lib");
    dirs.push_back(d);
  }
  dirs.push_back(REMORA_INSTALL_LIBDIR);
  for (const auto& d : dirs) {
    std::string p = d + "/" + kAgentName;
    char real[PATH_MAX];
    if (consider(p)) return std::string(::realpath(p.c_str(), real) ? real : p.c_str());
  }
  std::string list;
  for (const auto& t : tried) list += "\n  " + t;
  return Error(Errc::kInvalidArgument, std::string("cannot find ") + kAgentName +
                                           "; set REMORA_AGENT_PATH to its path. Looked at:" + list);
}

namespace detail {

Result<OwnedFile> make_visible_owned(remote::Target& t, const std::string& host_path,
                                     const CallOptions& close_on) {
  auto vf = REMORA_TRY(remote::make_visible(t, host_path));
  return OwnedFile{vf.path, remote::RemoteHandle::fd(t, vf.remote_fd, close_on), std::move(vf.placed)};
}

namespace {

// Loads the agent on a fresh thread (see attach.cc's file comment).
// Returns, for a stopped process, the tid of the agent's listener (it was
// created stopped and could not publish its tid); 0 otherwise.
// Loads library `path` (`what`: "the agent", "libunwind-x86_64.so.8") on a
// fresh thread of the target; returns the thread that appeared besides the
// loader when Remora had to drive it (the agent's listener).
// `stack_out`: see run_trampoline_thread.
// `hook`: the attach the loader thread hands the agent (LoaderAttach);
// `hook_taken` is set when the agent took it.
// `plain`: a hook without a request (the agent's listener start), when
// `hook` is null.
Result<pid_t> load_library(remote::Target& t, const std::string& path, const std::string& what,
                           const Deadline& deadline, OwnedFile* kept,
                           remote::RemoteHandle* stack_out = nullptr, uint64_t* handle_out = nullptr,
                           const LoaderAttach* hook = nullptr, bool* hook_taken = nullptr,
                           const PlainHook* plain = nullptr) {
  // The library's memfd (if it needs one) is closed in the target when `vf`
  // goes, if the load fails; loaded, it goes to `kept`.
  auto vf = REMORA_TRY_CTX(make_visible_owned(t, path), "make " + what + " visible to the target");
  LoaderRun run;
  run.hook = hook;
  run.plain = hook == nullptr ? plain : nullptr;
  const RemoteAddr pthread_create_fn = REMORA_TRY(find_loader_functions(t, &run.block, &run.stack_fns));
  REMORA_TRY(run_trampoline_thread(t, pthread_create_fn, run, vf.path, deadline, stack_out));
  // 0: taken; BUSY (another controller's in progress), BAD_ARGUMENT, or
  // kHookNotRun (an agent without the hook): the attach call does it.
  if (hook != nullptr && hook_taken != nullptr) *hook_taken = run.block.hook_rc == 0;
  pid_t listener = 0;
  if (run.driven && run.before) {
    // The thread that appeared besides the loader is the agent's listener.
    auto now = REMORA_TRY(procfs::list_tasks(t.pid()));
    for (pid_t tid : now)
      if (tid != run.loader && std::find(run.before->begin(), run.before->end(), tid) == run.before->end())
        listener = tid;
  }
  if (run.block.handle == 0) {
    char msg[512] = "";
    if (run.block.error)
      (void)t.read(RemoteAddr(run.block.error), std::as_writable_bytes(std::span(msg, sizeof msg - 1)));
    msg[sizeof msg - 1] = '\0';
    return Error(Errc::kToolFailed, "the target could not load " + what + ": " + msg);
  }
  *kept = std::move(vf);
  if (handle_out) *handle_out = run.block.handle;
  return listener;
}

// Libraries glibc itself provides: every glibc process has them.
bool is_glibc_library(const std::string& soname) {
  for (const char* p : {"libc.so.", "libm.so.", "libdl.so.", "libpthread.so.", "librt.so.", "libresolv.so.",
                        "libutil.so.", "ld-linux"})
    if (soname.rfind(p, 0) == 0) return true;
  return false;
}

// The directories a dynamic loader searches by default, as Debian and
// most distributions lay them out.
const std::vector<std::string>& library_dirs() {
  static const std::vector<std::string> dirs = {std::string("/lib/") + REMORA_MULTIARCH,
                                                std::string("/usr/lib/") + REMORA_MULTIARCH,
                                                "/lib64",
                                                "/usr/lib64",
                                                "/lib",
                                                "/usr/lib",
                                                "/usr/local/lib"};
  return dirs;
}

// Whether the target's loader finds `soname`: an object of that name is
// mapped, or a file of that name is in its root's library directories.
bool target_finds(pid_t pid, const std::vector<procfs::MapEntry>& maps, const std::string& soname) {
  for (const auto& m : maps)
    if (m.path.size() >= soname.size() &&
        m.path.compare(m.path.size() - soname.size(), soname.size(), soname) == 0)
      return true;
  for (const auto& d : library_dirs())
    if (remote::open_in_root(pid, d + "/" + soname)) return true;
  return false;
}

// A tool's libraries beyond glibc that the target lacks (a slim container
// image: the default tool's libunwind), ours loaded into it first, each
// after its own such libraries, so that the tool's DT_NEEDED entries find
// them by their DT_SONAME. Their memfds join `kept`.
// The DT_NEEDED entries of `library` beyond glibc's, parsed once per file
// (path, device, inode, mtime) and process: a tree's processes, one after
// another, ask for the same tools.
Result<std::vector<std::string>> needed_beyond_glibc(const std::string& library) {
  static std::mutex mu;
  static std::map<std::string, std::pair<std::string, std::vector<std::string>>> cache;
  int fd = ::open(library.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno("open " + library);
  UniqueFd f(fd);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) return Error::from_errno("stat " + library);
  const std::string key = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                          std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec);
  {
    std::lock_guard lock(mu);
    auto it = cache.find(library);
    if (it != cache.end() && it->second.first == key) return it->second.second;
  }
  auto img = REMORA_TRY_CTX(elf::ElfImage::from_fd(f.get()), library);
  std::vector<std::string> out;
  for (const auto& soname : img->needed())
    if (!is_glibc_library(soname)) out.push_back(soname);
  std::lock_guard lock(mu);
  cache[library] = {key, out};
  return out;
}

// The attach the loader thread can make itself (LoaderAttach), or nullopt:
// with a lease (armed within a remote call: remora_agent_attach_leased), a
// stopped process (whose listener could not remove our scratch), a tool
// the target does not see as it is (its memfd or copy is made by calls on
// the listener) or with libraries of its own the target cannot find
// itself (deliver_dependencies loads those), no dlsym in the
// target, or REMORA_INJECT_FAULT=listener-attach. The attach call on the
// listener does the rest, as before.
std::optional<LoaderAttach> loader_attach_for(remote::Target& t, const AttachOptions& opts) {
  if (opts.lease || t.stopped_at_open() || fault_injected("listener-attach")) return std::nullopt;
  LoaderAttach h;
  std::optional<std::vector<procfs::MapEntry>> maps;  // read once, for the first tool that needs libraries
  for (const auto& tool : opts.tools) {
    char real[PATH_MAX];
    if (::realpath(tool.c_str(), real) == nullptr || !remote::visible_as_is(t, real)) return std::nullopt;
    auto needed = needed_beyond_glibc(real);
    if (!needed) return std::nullopt;
    for (const auto& soname : *needed) {  // the target finds them itself (deliver_dependencies would not act)
      if (!maps) {
        auto m = procfs::read_maps(t.pid());
        if (!m) return std::nullopt;
        maps = std::move(*m);
      }
      if (!target_finds(t.pid(), *maps, soname)) return std::nullopt;
    }
    h.list += (h.list.empty() ? "" : ":") + std::string(real) + "|" + real;
  }
  h.env = encode_env(opts.env);
  static std::atomic<uint64_t> seq{0};
  h.id = (static_cast<uint64_t>(getpid()) << 32) | (++seq & 0xffffffffu);
  h.timeout = opts.timeout;
  if (h.list.empty() || h.list.size() + h.env.size() > 8192) return std::nullopt;  // the scratch's room
  auto dlsym_fn = find_dlsym(t);
  if (!dlsym_fn) return std::nullopt;
  h.dlsym_fn = *dlsym_fn;
  return h;
}

}  // namespace

Result<void> deliver_dependencies(remote::Target& t, const std::string& library, const Deadline& deadline,
                                  std::set<std::string>* seen, std::vector<OwnedFile>* kept) {
  auto needed = REMORA_TRY(needed_beyond_glibc(library));
  if (needed.empty()) return ok();
  auto maps = REMORA_TRY(procfs::read_maps(t.pid()));
  for (const auto& soname : needed) {
    if (!seen->insert(soname).second || target_finds(t.pid(), maps, soname)) continue;
    std::string ours;
    for (const auto& d : library_dirs())
      if (is_file(d + "/" + soname)) {
        ours = d + "/" + soname;
        break;
      }
    if (ours.empty())
      return Error(Errc::kToolFailed,
                   library + " needs " + soname + ", which process " + std::to_string(t.pid()) +
                       " lacks, and this machine has no copy of it either: install it here "
                       "(or in the target's image)");
    REMORA_TRY(deliver_dependencies(t, ours, deadline, seen, kept));
    kept->emplace_back();
    REMORA_TRY(load_library(t, ours, soname, deadline, &kept->back()));
    REMORA_LOG(kAttach, "pid %d: delivered %s (from %s), which %s needs", t.pid(), soname.c_str(),
               ours.c_str(), library.c_str());
  }
  return ok();
}

// Resolves the agent in the target, loading it first when it is not there.
// Returns the listener's tid when the load had to find it itself (a stopped
// process), else 0. `retired` receives our scratch mapping, which loaded the
// agent and in which nothing runs any more: it normally goes within the
// attach call; the handle removes it if a step fails before that call.
// `agent_file`: the agent's memfd, held open until the caller's tools are
// loaded. The dynamic loader knows a library by the path it was opened by,
// and "/proc/self/fd/N" of a closed memfd names the next memfd too: a tool
// given the agent's old number would be taken for the agent, loaded already.
// `loader_attach` receives the id of the attach the loader thread handed the
// agent (loader_attach_for), when the agent took it: then there is no
// retired scratch (the agent's listener removes it).
Result<pid_t> ensure_agent(remote::Target& t, pid_t pid, const AttachOptions& opts, const Deadline& deadline,
                           AgentSymbols* agent, remote::RemoteHandle* retired, bool* loaded_now,
                           OwnedFile* agent_file, std::optional<uint64_t>* loader_attach) {
  bool loaded = REMORA_TRY(resolve_agent(t, agent));
  REMORA_LOG(kAttach, "pid %d: agent %s", pid, loaded ? "present" : "absent");
  if (loaded) return 0;
  // Refused through the environment: nothing is touched. (A loaded agent
  // checks the same itself, in the target.)
  REMORA_TRY(check_environment(pid));
  REMORA_TRY(check_dynamic(t));
  auto path = REMORA_TRY(find_agent_library(opts.agent_path));
  // Before anything is injected: what the load makes, against the
  // target's seccomp filter (remote/seccomp.h).
  REMORA_TRY(t.check_syscalls(remote::seccomp::agent_load_syscalls(), "load the agent"));
  remote::RemoteHandle stack;  // the loader thread's, which is gone: removed on any failure
  JustLoaded just{0, path};
  const auto hook = loader_attach_for(t, opts);
  // Without the loader's attach, the loader thread still starts the
  // agent's listener (its constructor starts none: LISTENER_ON_REQUEST).
  PlainHook start;
  if (!hook) start = PlainHook{REMORA_TRY(find_dlsym(t)), kStartListenerFn, 0};
  bool taken = false;
  pid_t known_listener = REMORA_TRY(load_library(t, path, "the agent", deadline, agent_file, &stack,
                                                 &just.handle, hook ? &*hook : nullptr, &taken, &start));
  if (taken) *loader_attach = hook->id;
  REMORA_LOG(kAttach, "pid %d: agent loaded%s", pid, taken ? ", its attach handed to the listener" : "");
  loaded = REMORA_TRY(resolve_agent(t, agent, /*retire_own=*/true, &just));
  if (taken && loaded) {
    // Done with our scratch: the agent's listener may remove it.
    const uint64_t go = hook->id;
    REMORA_TRY_CTX(t.write(RemoteAddr(agent->info + offsetof(remora_agent_info, retire_go)),
                           std::as_bytes(std::span(&go, 1))),
                   "hand our scratch to the agent");
  }
  if (auto m = t.take_retired_scratch(); m && taken) {
    // The agent's listener removes it once the loader thread is gone.
  } else if (m) {
    // The loader's stack right below the scratch (start_loader_thread): one
    // range, removed within the attach call with the scratch.
    const auto st = stack.mapping();
    if (st.size != 0 && st.start.addr() + st.size == m->start.addr()) {
      stack.release();
      m = remote::Target::Mapping{st.start, st.size + m->size};
    }
    *retired = remote::RemoteHandle::mapping(t, *m);
  }
  REMORA_TRY_CTX(stack.reset(), "remove the loader thread's stack");  // elsewhere: by itself, as before
  if (!loaded) return Error(Errc::kInternal, "the agent was loaded but is not in the target's maps");
  *loaded_now = true;
  return known_listener;
}

}  // namespace detail

}  // namespace remora::attach
