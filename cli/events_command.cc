// `remora events (-p PID | -- CMD [ARGS...]) [--follow] [--timeout MSEC]`:
// prints what a process does with libraries and processes, as it happens:
//   DLOPEN libm.so.6 0x7f3a1c200000
//   FORK 4243
//   EXEC /bin/ls
//   EXIT 0
// The process is controlled by Remora's process-control layer
// (src/control): it stops at each event while the line is printed, and
// runs on. With --follow, fork children get handles of their own and their
// events are printed too, each line prefixed with the pid.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/strings.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "control/process.h"

namespace remora::cli {
namespace {

struct EventsArgs {
  int pid = 0;
  bool follow = false;
  int timeout_ms = 10000;
  std::vector<std::string> command;
};

std::string describe(const control::Event& ev, control::Process& p) {
  using K = control::Event::Kind;
  std::string out;
  switch (ev.kind) {
    case K::kDlopen:
      for (const auto& o : ev.added)
        out += (out.empty() ? "" : "\n") + std::string("DLOPEN ") + o.name + " " + hex_addr(o.base);
      break;
    case K::kDlclose:
      for (const auto& o : ev.removed)
        out += (out.empty() ? "" : "\n") + std::string("DLCLOSE ") + o.name + " " + hex_addr(o.base);
      break;
    case K::kFork: out = std::string(ev.vfork ? "VFORK " : "FORK ") + std::to_string(ev.child_pid); break;
    case K::kExec: out = "EXEC " + (p.objects().empty() ? std::string("?") : p.objects().front().name); break;
    case K::kExit:
      if (WIFEXITED(ev.exit_status))
        out = "EXIT " + std::to_string(WEXITSTATUS(ev.exit_status));
      else if (WIFSIGNALED(ev.exit_status))
        out = std::string("EXIT signal ") + sigabbrev_np(WTERMSIG(ev.exit_status));
      else
        out = "EXIT";
      break;
    case K::kGone:
      out = ev.signal ? std::string("GONE killed by SIG") + sigabbrev_np(ev.signal) : std::string("GONE");
      break;
    case K::kIntr: out = "INTERRUPTED"; break;
  }
  return out;
}

int run_events(const EventsArgs& a) {
  if ((a.pid != 0) == !a.command.empty()) {
    print_error("give either -p PID or -- CMD [ARGS...]");
    return to_int(ExitCode::kUsage);
  }
  // SIGINT/SIGTERM end the watch: a helper thread takes them and interrupts
  // every handle (interrupt() is the one call allowed from another thread).
  sigset_t stop_set;
  sigemptyset(&stop_set);
  sigaddset(&stop_set, SIGINT);
  sigaddset(&stop_set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_set, nullptr);

  std::vector<std::unique_ptr<control::Process>> procs;
  {
    Result<std::unique_ptr<control::Process>> first =
        a.pid != 0 ? control::Process::open(a.pid)
                   : control::Process::launch(control::LaunchOptions{
                         a.command, std::nullopt, {}, {}, std::chrono::milliseconds(a.timeout_ms)});
    if (!first) {
      print_error(first.error().to_string());
      return to_int(exit_code_for(first.error().code()));
    }
    procs.push_back(std::move(*first));
  }
  std::printf("[%d] %s\n", procs[0]->pid(),
              a.pid != 0 ? "OPENED" : "LAUNCHED (stopped before any constructor ran)");
  std::fflush(stdout);

  std::atomic<bool> stopping{false};
  std::atomic<control::Process*> current{nullptr};
  std::thread watcher([&]() {
    int sig = 0;
    sigwait(&stop_set, &sig);
    stopping = true;
    if (auto* p = current.load()) p->interrupt();
  });

  int exit_code = 0;
  size_t turn = 0;
  while (!procs.empty() && !stopping) {
    turn %= procs.size();
    control::Process& p = *procs[turn];
    control::ContOptions opts;
    opts.want_child = a.follow;
    // One process at a time gets a slice when several are followed.
    if (procs.size() > 1) opts.deadline = Deadline::after(std::chrono::milliseconds(50));
    current = &p;
    auto ev = p.cont(opts);
    current = nullptr;
    if (!ev) {
      if (ev.error().code() == Errc::kTimedOut) {
        ++turn;
        continue;
      }
      print_error(ev.error().to_string());
      exit_code = to_int(exit_code_for(ev.error().code()));
      break;
    }
    std::string text = describe(*ev, p);
    for (auto line : split_fields(text, "\n"))
      std::printf("[%d] %.*s\n", p.pid(), static_cast<int>(line.size()), line.data());
    std::fflush(stdout);
    using K = control::Event::Kind;
    if (ev->kind == K::kFork && ev->child) procs.push_back(std::move(ev->child));
    if (ev->kind == K::kGone || ev->kind == K::kIntr) {
      if (ev->kind == K::kGone) {
        procs.erase(procs.begin() + static_cast<long>(turn));
        continue;
      }
      break;
    }
    if (ev->kind != K::kExit) continue;
    if (procs.size() == 1 && WIFEXITED(ev->exit_status)) exit_code = WEXITSTATUS(ev->exit_status);
    ++turn;
  }
  for (auto& p : procs) (void)p->close(control::CloseMode::kDefault);
  if (!stopping) pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  return exit_code;
}

}  // namespace

void add_events_command(CLI::App& root, Dispatch& dispatch) {
  auto args = std::make_shared<EventsArgs>();
  CLI::App* sub =
      root.add_subcommand("events",
                          "Print a process's library, fork, exec and exit events as they happen.\n"
                          "Either attach to a running process (-p) or launch one (-- CMD ARGS...), stopped\n"
                          "before any of its constructors run. Ctrl-C stops watching: an opened process\n"
                          "resumes, a launched one is killed.");
  sub->add_option("-p,--pid", args->pid, "process to watch");
  sub->add_flag("--follow", args->follow, "follow fork children too (lines are prefixed with the pid)");
  sub->add_option("--timeout", args->timeout_ms, "deadline in ms to reach the launch stop (default 10000)");
  sub->add_option("command", args->command, "program and arguments to launch (after --)");
  // Once a positional is met every later word is one: a stray word before
  // "--" takes the rest into `command`, and the check below names it (else
  // the root would name only what follows "--").
  sub->positionals_at_end();
  sub->callback([args, sub, &dispatch]() {
    // CMD comes after "--" only, so a stray word is never launched. CLI11
    // keeps the "--" it consumed to fill a positional among the leftovers
    // (remaining() has it, remaining_size() does not count it).
    const auto left = sub->remaining();
    if (!args->command.empty() && std::find(left.begin(), left.end(), "--") == left.end())
      throw CLI::ExtrasError(sub->get_name(), args->command);
    dispatch.run = [args]() { return run_events(*args); };
  });
}

}  // namespace remora::cli
