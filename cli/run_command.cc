// `remora run`: starts a program with Remora's agent preloaded (it starts
// no thread until an attach asks for one), attaches the tools once the
// program's start-up has settled (RunAttacher), keeps them attached until
// the program exits, and exits with the program's status. remora's own messages go to
// stderr: stdout belongs to the program.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/channel_wire.h"
#include "attach/attach.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/common_options.h"
#include "cli/exit_codes.h"
#include "cli/session_args.h"
#include "cli/session_support.h"
#include "procfs/procfs.h"

extern char** environ;

namespace remora::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Shell conventions (and those of env, timeout, nohup): the program could
// not be found, or was found and could not be executed.
constexpr int kExitNotFound = 127;
constexpr int kExitCannotExecute = 126;

struct RunCommandOptions {
  std::string tools;
  bool tools_given = false;
  std::vector<std::string> env;
  bool no_tool = false;
  bool listen = false;  // opt in to the socket channel (REMORA_TOOL_ATTACH=1)
  long timeout_ms = 10000;
  std::vector<std::string> words;  // CMD [ARG...], verbatim
  std::string output;              // -o DIR
};

void note(const std::string& text) {
  std::fprintf(stderr, "remora: %s\n", text.c_str());
  std::fflush(stderr);
}

// CMD's environment: ours, LD_PRELOAD with the agent appended, then -e.
std::vector<std::string> child_environment(const std::string& agent, const EnvList& extra) {
  std::vector<std::string> env;
  std::string preload = agent;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    if (kv.starts_with("LD_PRELOAD=")) {
      std::string old(kv.substr(11));
      if (!old.empty()) preload = old + ":" + agent;
      continue;
    }
    bool overridden = false;
    for (const auto& [n, v] : extra)
      overridden = overridden || (kv.starts_with(n) && kv.size() > n.size() && kv[n.size()] == '=');
    if (!overridden) env.emplace_back(kv);
  }
  env.push_back("LD_PRELOAD=" + preload);
  for (const auto& [n, v] : extra) env.push_back(n + "=" + v);
  return env;
}

// Forwards a stop signal to CMD, unless the terminal already sent it to
// CMD's process group (a Ctrl-C reaches every process of the foreground
// group, with si_code SI_KERNEL): then CMD has it already.
void forward(pid_t child, int signo, int si_code) {
  if (si_code == SI_KERNEL && ::getpgid(child) == ::getpgrp()) return;
  ::kill(child, signo);
}

// Forks and execs CMD (`words`) with `envs` and the signal mask remora had
// before it blocked the stop signals. Returns its pid, or -1 with the exit
// code to leave with in `*exit_code` when it could not be run.
pid_t start_child(const std::vector<std::string>& words, std::vector<std::string> envs,
                  const StopSignals& signals, int* exit_code) {
  std::vector<char*> envp, argv;
  for (auto& s : envs) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = words;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    *exit_code = fail(Error::from_errno("pipe2"));
    return -1;
  }
  pid_t child = ::fork();
  if (child < 0) {
    *exit_code = fail(Error::from_errno("fork"));
    return -1;
  }
  if (child == 0) {
    // Only async-signal-safe calls from here to exec.
    ::close(report[0]);
    ::sigprocmask(SIG_SETMASK, &signals.old_mask(), nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    int err = errno;
    (void)!::write(report[1], &err, sizeof err);
    ::_exit(kExitNotFound);
  }
  ::close(report[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    int status = 0;
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    print_error("cannot run '" + words[0] + "': " + std::strerror(exec_errno));
    *exit_code = exec_errno == ENOENT ? kExitNotFound : kExitCannotExecute;
    return -1;
  }
  return child;
}

// CMD while it runs: the stop signals remora receives are forwarded to it.
struct Child {
  pid_t pid = 0;
  UniqueFd pidfd;
  StopSignals& signals;
  bool exited = false;

  // Waits up to `until` for a signal (forwarded) or CMD's exit.
  void wait_some(std::optional<Clock::time_point> until) {
    pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {pidfd.get(), POLLIN, 0}};
    int timeout = -1;
    if (until)
      timeout = static_cast<int>(std::max<long>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(*until - Clock::now()).count()));
    int n = ::poll(fds, pidfd ? 2 : 1, timeout);
    if (n <= 0) return;
    int code = 0;
    while (auto s = signals.take(&code)) forward(pid, *s, code);
    if (pidfd && fds[1].revents) exited = true;
  }
};

// The program's image: its auxiliary vector, which every exec writes anew
// (AT_RANDOM, AT_ENTRY, the stack's addresses), read without stopping it.
std::string image_of(pid_t pid) {
  auto auxv = procfs::read_bytes("/proc/" + std::to_string(pid) + "/auxv");
  return auxv ? std::string(reinterpret_cast<const char*>(auxv->data()), auxv->size()) : std::string();
}

// Attaches the tools to each program CMD becomes, once its start-up has
// settled: its agent loaded, and no exec for kSettle. A launcher that drops
// privileges and execs the real program (setpriv, su, runuser, capsh) is
// never attached: a thread of ours there would meet its credential change
// (glibc aborts a process whose set*id fails on one thread only), and the
// tools would go with its exec anyway. A program that execs later is
// attached again in its new image (its tools went with the old one).
class RunAttacher {
 public:
  // A launcher (setpriv, su, runuser) execs its program within a few ms of
  // its own exec; 100 ms leaves a loaded machine's scheduler room, and is
  // all a program's profile misses of its start.
  static constexpr auto kSettle = std::chrono::milliseconds(100);
  static constexpr auto kWatch = std::chrono::milliseconds(50);  // an exec, once attached

  RunAttacher(attach::Controller& ctl, const RunCommandOptions& o, const ToolSelection& tools,
              const EnvList& env, std::string agent)
      : ctl_(ctl), o_(o), tools_(tools), env_(env), agent_(std::move(agent)) {}

  // One look at CMD; returns when to look again.
  Clock::time_point step(Child& c) {
    const auto now = Clock::now();
    std::string image = image_of(c.pid);
    if (image.empty()) return now + kWatch;  // gone, or between exec's steps
    if (image != image_) {
      image_ = std::move(image);
      since_ = now;
      done_ = false;
    }
    if (done_) return now + kWatch;
    if (now - since_ < kSettle) return since_ + kSettle;
    auto st = attach::Controller::status(c.pid);
    if (!st || !st->agent_loaded) {
      if (now - since_ < std::chrono::milliseconds(o_.timeout_ms)) return now + std::chrono::milliseconds(5);
      done_ = true;
      if (!c.exited && !pidfd_exited(c.pidfd.get()))
        print_error("the agent did not load in pid " + std::to_string(c.pid) + " within " +
                    std::to_string(o_.timeout_ms) +
                    " ms (a statically linked or setuid program ignores LD_PRELOAD); it runs without tools");
      return now + kWatch;
    }
    done_ = true;
    attach_now(c);
    return Clock::now() + kWatch;
  }

 private:
  void attach_now(Child& c) {
    attach::AttachOptions opts;
    opts.tools = tools_.paths;
    opts.env = env_;
    opts.timeout = std::chrono::milliseconds(o_.timeout_ms);
    opts.lease = true;  // if remora dies, the tools detach (and write their output)
    opts.agent_path = agent_;
    auto r = ctl_.attach(c.pid, opts);
    if (r) {
      std::string names;
      for (const auto& p : tools_.paths) names += (names.empty() ? "" : ", ") + p.substr(p.rfind('/') + 1);
      note("attached " + names + " to pid " + std::to_string(c.pid) +
           (attached_once_ ? " (it exec'ed)" : "") + "; they stay attached until it exits");
      attached_once_ = true;
    } else if (!c.exited && !pidfd_exited(c.pidfd.get())) {
      print_error(r.error().to_string() + "; pid " + std::to_string(c.pid) + " runs on without tools");
    }
  }

  attach::Controller& ctl_;
  const RunCommandOptions& o_;
  const ToolSelection& tools_;
  const EnvList& env_;
  std::string agent_;
  std::string image_;
  Clock::time_point since_{};
  bool done_ = false;
  bool attached_once_ = false;
};

int run_run(const RunCommandOptions& o, const std::vector<std::string>& words) {
  if (words.empty()) {
    print_error("missing CMD (usage: remora run [-t LIB[:LIB...]] [-e NAME=VALUE]... -- CMD [ARG...])");
    return to_int(ExitCode::kUsage);
  }
  auto env = parse_env_list(o.env);
  if (!env) return fail(env.error());
  auto agent = attach::find_agent_library();
  if (!agent) return fail(agent.error());
  // The opt-in: the agent binds its socket (no thread) for remora attach
  // where ptrace is refused; with no -t nothing is attached now.
  if (o.listen) set_env(*env, "REMORA_TOOL_ATTACH", "1");
  std::optional<ToolSelection> tools;
  if (!o.no_tool && !(o.listen && !o.tools_given)) {
    auto t = select_tools(o.tools_given ? std::optional<std::string>(o.tools) : std::nullopt);
    if (!t) {
      print_error(t.error().to_string() + (o.tools_given ? "" : " (or --no-tool to preload the agent only)"));
      return to_int(exit_code_for(t.error().code()));
    }
    tools = std::move(*t);
  }
  std::string out_root;
  if (!o.output.empty() && !(tools && tools->default_tool))
    return fail(Error(Errc::kInvalidArgument, output_needs_default_tool(o.output)));
  if (tools && tools->default_tool) {
    // CMD starts in our working directory: resolve against it.
    auto plan = prepare_output_path(*env, ::getpid(), false, o.output);
    if (!plan) return fail(plan.error());
    out_root = plan->root;
  }
  auto signals = StopSignals::install();
  if (!signals) return fail(signals.error());

  const auto wall_start = std::chrono::system_clock::now();
  int exit_code = 0;
  pid_t pid = start_child(words, child_environment(*agent, *env), *signals, &exit_code);
  if (pid < 0) return exit_code;
  Child child{pid, open_pidfd(pid), *signals};
  note("started " + shell_quote(words[0]) + " (pid " + std::to_string(pid) + ") with " + *agent +
       " preloaded" +
       (o.listen ? ", listening on its socket channel (@" REMORA_CHANNEL_NAME_PREFIX + std::to_string(pid) +
                       ".*): attach with remora attach -p " + std::to_string(pid) + ", no ptrace needed"
                 : ""));

  attach::Controller ctl;
  std::optional<RunAttacher> attacher;
  if (tools) attacher.emplace(ctl, o, *tools, *env, *agent);
  while (!child.exited) child.wait_some(attacher ? std::optional(attacher->step(child)) : std::nullopt);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  if (WIFSIGNALED(status))
    note("pid " + std::to_string(pid) + " was killed by SIG" + sigabbrev_np(WTERMSIG(status)));
  if (tools && tools->default_tool)
    print_outputs(stderr, out_root, find_outputs(out_root, {pid}, wall_start));
  return code;
}

}  // namespace

void add_run_command(CLI::App& root, Dispatch& dispatch) {
  auto opts = std::make_shared<RunCommandOptions>();
  CLI::App* sub = root.add_subcommand(
      "run", "Start a program with the agent preloaded and tools attached until it exits");
  // Everything from CMD on is CMD's, its own options included.
  add_verbatim_words(sub, opts->words, "[--] CMD [ARG...]");
  auto* tools =
      sub->add_option("-t,--tools", opts->tools,
                      "Tool libraries LIB[:LIB...] (default: libremora-tool.so next to the agent, or "
                      "$REMORA_TOOL_PATH)");
  add_output_option(sub, opts->output);
  sub->add_option("-e,--env", opts->env, "Set NAME=VALUE in the program's environment (repeatable)")
      ->allow_extra_args(false);
  sub->add_flag("--no-tool", opts->no_tool, "Preload the agent only (attach later with remora attach -p PID)")
      ->excludes(tools);
  sub->add_flag("--listen", opts->listen,
                "Opt CMD in to the socket channel (REMORA_TOOL_ATTACH=1): remora attach -p PID then works "
                "without ptrace (non-dumpable programs, pods without CAP_SYS_PTRACE, seccomp profiles); "
                "attaches nothing now unless -t is given");
  add_timeout_option(
      sub, opts->timeout_ms,
      "Deadline for the agent to load in each program CMD runs and for the attach, in milliseconds");
  sub->footer(
      "CMD runs with LD_PRELOAD=<libremora-agent.so> (appended to an existing LD_PRELOAD)\n"
      "and remora's signal mask; SIGINT, SIGTERM and SIGHUP sent to remora are forwarded\n"
      "to it. remora writes its own messages to stderr and exits with CMD's status\n"
      "(128+N when a signal N killed it; 127: CMD not found, 126: not executable). The\n"
      "tools are attached once CMD's start-up settled (no exec for 100 ms), and again\n"
      "in each program it execs later: a launcher that drops privileges and execs\n"
      "(setpriv, su, runuser) is skipped. An attach that fails is reported, and CMD\n"
      "runs on without tools.\n"
      "\n"
      "Examples:\n"
      "  remora run -- ./server --port 8080\n"
      "  remora run --listen -- ./server   # later: remora attach -p PID, no ptrace\n"
      "  remora run -t ./libmytool.so -e MYTOOL_LEVEL=2 -- make -j8\n"
      "\n" +
      exit_code_footer());
  sub->callback([opts, tools, &dispatch] {
    opts->tools_given = tools->count() > 0;
    dispatch.run = [opts] { return run_run(*opts, opts->words); };
  });
}

}  // namespace remora::cli
