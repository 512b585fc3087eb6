// The options several subcommands share, declared in one place so that they
// parse, check and read alike in every --help: -p/--pid (attach, detach,
// status, call), --timeout (attach, detach, call, run), --channel (attach,
// detach, status) and the verbatim words that end call's and run's command
// lines.
#pragma once

#include <sys/types.h>

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli11.h"

namespace remora::cli {

// -p,--pid PID: required; a pid (1 to INT_MAX).
inline CLI::Option* add_pid_option(CLI::App* sub, pid_t& pid, const std::string& help) {
  return sub->add_option("-p,--pid", pid, help)
      ->required()
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
}

// --timeout MSEC: 1 ms to 1 hour; the default (the option's initial value)
// is shown in --help.
inline CLI::Option* add_timeout_option(CLI::App* sub, long& timeout_ms, const std::string& help) {
  return sub->add_option("--timeout", timeout_ms, help)
      ->capture_default_str()
      ->check(CLI::Range(1L, 3600L * 1000L));
}

// --channel auto|ptrace|socket: how the agent is reached (attach, detach,
// status; attach::Channel).
inline CLI::Option* add_channel_option(CLI::App* sub, std::string& channel) {
  return sub
      ->add_option("--channel", channel,
                   "How to reach the agent: ptrace, socket (a process started with remora run --listen or "
                   "REMORA_TOOL_ATTACH=1: no ptrace needed), or auto (ptrace where allowed, else the socket)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "ptrace", "socket"}));
}

// --slurm JOBID[.STEP]: the command for every rank of a running Slurm job,
// on every node (slurm_front.h), instead of -p. -p is then optional; the
// subcommand's callback calls require_target.
inline CLI::Option* add_slurm_option(CLI::App* sub, CLI::Option* pid, std::string& job,
                                     const std::string& help) {
  pid->required(false);
  return sub->add_option("--slurm", job, help)->excludes(pid);
}
// -o,--output DIR: where the default tool's results land, on this side
// (attach, run, --slurm; session_support.h, prepare_output_path).
inline CLI::Option* add_output_option(CLI::App* sub, std::string& dir) {
  return sub->add_option("-o,--output", dir,
                         "Where the default tool's results land, on this side, whatever the target's working "
                         "directory, user or root (created if missing; default ./remora-output)");
}
// -o needs the default tool: a tool of one's own is told where by its own setting.
inline std::string output_needs_default_tool(const std::string& dir) {
  return "-o " + dir +
         " says where the default tool's results go, and -t does not include it: give the tool's own "
         "setting with -e, or add the default tool (libremora-tool.so) to -t";
}

// --container NAME|ID: the main process of a running container, found by
// podman or docker (container.h), instead of -p; with its tree.
inline CLI::Option* add_container_option(CLI::App* sub, CLI::Option* pid, CLI::Option* slurm,
                                         std::string& container, const std::string& help) {
  pid->required(false);
  return sub->add_option("--container", container, help)->excludes(pid)->excludes(slurm);
}
inline void require_target(const CLI::Option* pid, const CLI::Option* slurm, const CLI::Option* container) {
  if (pid->count() == 0 && slurm->count() == 0 && container->count() == 0)
    throw CLI::RequiredError("--pid (or --slurm JOBID, or --container NAME)");
}

// CLI11 2.1 prints a positional by its name only, and names cannot hold
// "[:]" or spaces: the usage line of add_verbatim_words is written here, and
// its positional is not listed (the subcommand's footer describes it).
class VerbatimWordsFormatter : public CLI::Formatter {
 public:
  explicit VerbatimWordsFormatter(std::string usage) : usage_(std::move(usage)) {}
  std::string make_usage(const CLI::App* /*app*/, std::string name) const override {
    return get_label("Usage") + ": " + name + " [" + get_label("OPTIONS") + "] " + usage_ + "\n";
  }
  std::string make_positionals(const CLI::App* /*app*/) const override { return {}; }

 private:
  std::string usage_;
};

// The words from the first positional on, taken verbatim: call's
// [LIB:]SYMBOL [ARG...], run's CMD [ARG...]. Once a positional is met every
// later word is one (CLI11's positionals_at_end), so "-1" or a program's own
// "--flag" is never taken for an option of ours; "--" before them is
// accepted and dropped. An unknown option before them is an error, as in
// every other subcommand. `usage` spells them in the usage line, e.g.
// "[LIB:]SYMBOL [ARG...]".
inline CLI::Option* add_verbatim_words(CLI::App* sub, std::vector<std::string>& words, std::string usage) {
  sub->formatter(std::make_shared<VerbatimWordsFormatter>(std::move(usage)));
  sub->positionals_at_end();
  return sub->add_option("words", words);
}

}  // namespace remora::cli
