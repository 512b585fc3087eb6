#include "cli/session_support.h"

#include <dirent.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "cli/output_staging.h"
#include "cli/renderer.h"
#include "cli/session_args.h"
#include "procfs/procfs.h"

namespace remora::cli {
namespace {

bool readable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), R_OK) == 0;
}

std::string real_or_same(const std::string& p) {
  char real[PATH_MAX];
  return ::realpath(p.c_str(), real) ? std::string(real) : p;
}

std::string base_name(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string our_cwd() {
  char buf[PATH_MAX];
  return ::getcwd(buf, sizeof buf) ? std::string(buf) : std::string("/");
}

}  // namespace

Result<ToolSelection> select_tools(const std::optional<std::string>& spec) {
  ToolSelection sel;
  if (spec) {
    auto list = REMORA_TRY(split_tool_list(*spec));
    for (const auto& t : list) {
      if (!readable_file(t))
        return Error(Errc::kInvalidArgument,
                     "tool library " + t +
                         " not found (or not a readable file); -t takes paths, e.g. -t ./libmytool.so");
      sel.paths.push_back(real_or_same(t));
    }
  } else {
    std::string path;
    if (const char* env = std::getenv("REMORA_TOOL_PATH"); env && *env) {
      path = env;
      if (!readable_file(path))
        return Error(Errc::kToolFailed, "the default tool is missing: REMORA_TOOL_PATH=" + path +
                                            " is not a readable file; fix REMORA_TOOL_PATH or pass -t LIB");
    } else {
      auto agent = attach::find_agent_library();
      if (!agent) return std::move(agent).error();
      std::string dir = agent->substr(0, agent->rfind('/'));
      path = dir + "/" + kDefaultToolName;
      if (!readable_file(path))
        return Error(Errc::kToolFailed,
                     std::string("the default tool ") + kDefaultToolName + " is missing (looked for " + path +
                         ", next to the agent); build it (make) or pass -t LIB to name a tool");
    }
    sel.paths.push_back(real_or_same(path));
  }
  for (const auto& p : sel.paths)
    if (base_name(p) == kDefaultToolName) sel.default_tool = true;
  return sel;
}

Result<EnvList> parse_env_list(const std::vector<std::string>& items) {
  EnvList env;
  for (const auto& item : items) {
    auto kv = REMORA_TRY(parse_env_assignment(item));
    set_env(env, std::move(kv.first), std::move(kv.second));
  }
  return env;
}

Result<OutputPlan> prepare_output_path(EnvList& env, pid_t pid, bool socket, const std::string& output_dir) {
  // Set only for a session in memory (below); empty, it clears a value an
  // earlier session left in the target's environment. (Before find_env: it
  // may grow `env`.)
  set_env(env, "REMORA_OUTPUT_FD", "");
  const std::string* given = find_env(env, "REMORA_OUTPUT_PATH");
  OutputPlan plan;
  if (given && !given->empty()) {
    if (!output_dir.empty())
      return Error(Errc::kInvalidArgument,
                   "-o " + output_dir + " and -e REMORA_OUTPUT_PATH=" + *given +
                       " both say where the results go: give -o (a directory on this "
                       "side, whatever the target's root) or REMORA_OUTPUT_PATH (as the "
                       "target names it), not both");
    if ((*given)[0] == '/') {
      plan.root = absolute_path(*given, "/");
    } else {
      // Resolve as the target would: against its own working directory.
      char buf[PATH_MAX];
      std::string link = "/proc/" + std::to_string(pid) + "/cwd";
      ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
      if (n <= 0)
        return Error::from_errno("read the working directory of process " + std::to_string(pid) + " (" +
                                 link + ") to resolve REMORA_OUTPUT_PATH=" + *given +
                                 "; pass an absolute path");
      buf[n] = '\0';
      plan.root = absolute_path(*given, buf);
    }
    set_env(env, "REMORA_OUTPUT_PATH", plan.root);
    return plan;
  }
  const std::string cwd = our_cwd();
  plan.root = output_dir.empty() ? cwd + "/remora-output" : absolute_path(output_dir, cwd);
  // The directory as the target sees it decides: the same one (or, not made
  // yet, its nearest ancestor), where it may write, and the tool makes and
  // fills it itself, as its own user.
  std::string seen = plan.root;
  for (struct stat sb{}; ::stat(seen.c_str(), &sb) != 0 && seen.size() > 1;)
    seen = seen.rfind('/') == 0 ? "/" : seen.substr(0, seen.rfind('/'));
  const bool root_hidden =
      socket && ::access(("/proc/" + std::to_string(pid) + "/root/").c_str(), X_OK) != 0 && errno == EACCES;
  if (root_hidden || (target_sees_same_dir(pid, seen) && target_may_write(pid, plan.root))) {
    set_env(env, "REMORA_OUTPUT_PATH", plan.root);
    return plan;
  }
  // A root of its own (a container): the target writes into a private
  // directory of its root, and the finished sessions come out to plan.root.
  plan.staged = REMORA_TRY(StagedOutput::create(pid));
  set_env(env, "REMORA_OUTPUT_PATH", plan.staged->in_memory() ? plan.root : plan.staged->target_path());
  set_env(env, "REMORA_OUTPUT_FD", plan.staged->target_fd());
  return plan;
}

std::string OutputPlan::collect() const {
  if (!staged) return "";
  auto n = staged->bring_out(root);
  if (!n) return n.error().to_string();
  return "";
}

std::string process_comm(pid_t pid) {
  auto text = procfs::read_text("/proc/" + std::to_string(pid) + "/comm");
  if (!text) return "?";
  std::string s = *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.empty() ? "?" : s;
}

std::set<std::string> existing_outputs(const std::string& root) {
  std::set<std::string> names;
  if (DIR* d = ::opendir(root.c_str())) {
    while (dirent* e = ::readdir(d))
      if (output_dir_pid(e->d_name) != 0) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

std::vector<OutputDir> find_outputs(const std::string& root, const std::vector<pid_t>& pids,
                                    std::chrono::system_clock::time_point since_time,
                                    const std::set<std::string>& before) {
  struct Found {
    OutputDir dir;
    struct timespec mtime;
  };
  std::vector<Found> found;
  // Directory timestamps have the file system's granularity, and the tool
  // names its directory from its own clock: allow a second of slack.
  const time_t floor = std::chrono::system_clock::to_time_t(since_time) - 1;
  if (DIR* d = ::opendir(root.c_str())) {
    while (dirent* e = ::readdir(d)) {
      pid_t p = output_dir_pid(e->d_name);
      if (p == 0 || before.count(e->d_name) != 0) continue;
      std::string path = root + "/" + e->d_name;
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      if (st.st_mtim.tv_sec < floor) continue;
      // A session that did not finish (its process died while attached)
      // left only profile.remora.part: nothing to render.
      if (::access((path + "/profile.remora").c_str(), F_OK) != 0) continue;
      found.push_back({{p, path}, st.st_mtim});
    }
    ::closedir(d);
  }
  auto newer = [](const Found& a, const Found& b) {
    if (a.mtime.tv_sec != b.mtime.tv_sec) return a.mtime.tv_sec > b.mtime.tv_sec;
    if (a.mtime.tv_nsec != b.mtime.tv_nsec) return a.mtime.tv_nsec > b.mtime.tv_nsec;
    return a.dir.path > b.dir.path;  // "-2" after the first of the same second
  };
  std::sort(found.begin(), found.end(), newer);
  // The tool names its directory by its own pid, which in a pid namespace
  // of its own (a container) is not ours: match each pid by both.
  std::vector<OutputDir> out;
  std::vector<const Found*> listed;
  for (pid_t p : pids) {
    auto in_ns = procfs::tid_in_target_ns(p, p);
    const pid_t own = in_ns ? *in_ns : p;
    for (const auto& f : found) {
      if (f.dir.pid == p || f.dir.pid == own) {
        OutputDir d = f.dir;
        d.pid = p;
        d.host_pid = p;
        out.push_back(d);
        listed.push_back(&f);
        break;
      }
    }
  }
  for (const auto& f : found)
    if (std::find(listed.begin(), listed.end(), &f) == listed.end()) out.push_back(f.dir);
  return out;
}

Result<void> render_and_print(FILE* out, const OutputDir& d) {
  std::fprintf(out, "\n==> pid %d: %s\n", static_cast<int>(d.pid), d.path.c_str());
  // The tool left its raw records: name the addresses and write every
  // output here, in the controller (src/profile).
  auto rendered = render_session(d.path, d.host_pid);
  if (!rendered) {
    std::fprintf(out, "(not rendered: %s)\n", rendered.error().to_string().c_str());
    std::fflush(out);
    return rendered.error();
  }
  auto summary = procfs::read_text(d.path + "/summary.txt");
  if (summary) {
    std::fputs(summary->c_str(), out);
    if (!summary->empty() && summary->back() != '\n') std::fputc('\n', out);
  } else {
    std::fprintf(out, "(no summary.txt: %s)\n", summary.error().to_string().c_str());
  }
  std::fprintf(out, "Render again with: remora report %s\n", d.path.c_str());
  std::fflush(out);
  return {};
}

bool print_outputs(FILE* out, const std::string& root, const std::vector<OutputDir>& dirs) {
  if (dirs.empty()) {
    std::fprintf(
        out,
        "No output from the default tool under %s (it writes when it detaches; a tool error is printed "
        "on the target's stderr).\n",
        root.c_str());
    return false;
  }
  for (const auto& d : dirs) (void)render_and_print(out, d);
  std::fflush(out);
  return true;
}

void print_outcome_header(FILE* out) { std::fprintf(out, "  %-8s %-16s %s\n", "PID", "COMMAND", "RESULT"); }

void print_outcome(FILE* out, pid_t pid, const std::string& comm, const std::string& result) {
  std::fprintf(out, "  %-8d %-16s %s\n", static_cast<int>(pid), comm.c_str(), result.c_str());
}

std::string describe_attach(const attach::ProcessOutcome& o) {
  if (o.ok) {
    long ms = static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(o.elapsed).count());
    if (o.channel == attach::Channel::kSocket)
      return "attached through its socket channel (" + std::to_string(ms) + " ms)";
    return std::string("attached (") + (o.agent_loaded_now ? "agent loaded now, " : "agent was loaded, ") +
           std::to_string(ms) + " ms)";
  }
  // A zombie child of a tree has exited too; said as the engine says it.
  if (o.code == Errc::kZombie) return "not attached: " + o.message;
  if (is_gone(o.code)) return "exited before it could be attached";
  return "failed: " + o.message + " [" + std::string(errc_name(o.code)) + "]";
}

bool is_gone(Errc code) {
  return code == Errc::kTargetExited || code == Errc::kNoSuchProcess || code == Errc::kZombie;
}

Result<StopSignals> StopSignals::install() {
  StopSignals s;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  if (::pthread_sigmask(SIG_BLOCK, &set, &s.old_mask_) != 0) return Error::from_errno("block SIGINT/SIGTERM");
  int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return Error::from_errno("signalfd");
  s.fd_.reset(fd);
  return s;
}

std::optional<int> StopSignals::take(int* si_code) {
  signalfd_siginfo info{};
  ssize_t n = ::read(fd_.get(), &info, sizeof info);
  if (n != static_cast<ssize_t>(sizeof info)) return std::nullopt;
  if (si_code) *si_code = info.ssi_code;
  return static_cast<int>(info.ssi_signo);
}

UniqueFd open_pidfd(pid_t pid) { return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0))); }

bool pidfd_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

namespace {

// The kernel's struct pidfd_info up to exit_code (PIDFD_INFO_SIZE_VER0,
// Linux 6.15); Debian 12's headers predate it. A larger kernel struct is
// fine: the kernel copies what the size in the request number asks for.
struct PidfdInfo {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
static_assert(sizeof(PidfdInfo) == 64);
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfo);
constexpr uint64_t kPidfdInfoExit = 1u << 3;

std::optional<int> status_from_pidfd(int pidfd) {
  PidfdInfo info{};
  info.mask = kPidfdInfoExit;
  if (pidfd < 0 || ::ioctl(pidfd, kPidfdGetInfo, &info) != 0) return std::nullopt;
  if ((info.mask & kPidfdInfoExit) == 0) return std::nullopt;
  return info.exit_code;
}

// Field 52 of /proc/PID/stat, the wait status, readable while the process
// is a zombie (its parent has not reaped it yet).
std::optional<int> status_from_stat(pid_t pid) {
  auto text = procfs::read_text("/proc/" + std::to_string(pid) + "/stat");
  if (!text) return std::nullopt;
  size_t at = text->rfind(')');
  if (at == std::string::npos) return std::nullopt;
  int field = 2;  // the comm just ended
  const char* p = text->c_str() + at + 1;
  while (*p && field < 52) {
    while (*p == ' ') ++p;
    ++field;
    if (field == 52) break;
    while (*p && *p != ' ') ++p;
  }
  if (field != 52 || !*p) return std::nullopt;
  char state = text->size() > at + 2 ? (*text)[at + 2] : '?';
  if (state != 'Z' && state != 'X') return std::nullopt;  // not ended yet
  return std::atoi(p);
}

}  // namespace

std::optional<int> exit_status(pid_t pid, int pidfd) {
  // The pidfd says "exited" as the process turns zombie; the exit record of
  // PIDFD_GET_INFO is there from then on (or once it is reaped), /proc only
  // until then. Ask both, a few times over a few milliseconds.
  for (int i = 0; i < 10; ++i) {
    if (auto s = status_from_pidfd(pidfd)) return s;
    if (auto s = status_from_stat(pid)) return s;
    timespec ts{0, 2'000'000};
    ::nanosleep(&ts, nullptr);
  }
  return std::nullopt;
}

std::string describe_exit_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return std::string("was killed by ") + (name ? std::string("SIG") + name : "a signal") + " (signal " +
           std::to_string(sig) + (WCOREDUMP(status) ? ", core dumped)" : ")");
  }
  return "ended (wait status " + std::to_string(status) + ")";
}

std::chrono::milliseconds since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
}

std::string describe_unload(const attach::UnloadReport& u) {
  std::string out = "unloaded";
  for (size_t i = 0; i < u.kept_tools.size(); ++i)
    out += (i ? ", " : "; kept ") + u.kept_tools[i].substr(u.kept_tools[i].rfind('/') + 1);
  return u.kept_tools.empty() ? out : out + " (cannot be unloaded)";
}

void warn_kept_tools(pid_t pid, const attach::UnloadReport& u) {
  for (const auto& t : u.kept_tools)
    std::fprintf(stderr,
                 "remora: warning: tool %s stays loaded in process %d: its dlclose failed or left it mapped "
                 "(RTLD_NODELETE, unique symbols, or another library uses it); the agent and the other tools "
                 "were unloaded\n",
                 t.c_str(), static_cast<int>(pid));
}

}  // namespace remora::cli
