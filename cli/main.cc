// The remora command: parses the command line, runs the chosen subcommand and
// maps its outcome to an exit code (exit_codes.h). Parsing errors exit 1.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <string>
#include <string_view>

#include "base/result.h"
#include "cli/cli11.h"
#include "cli/command.h"
#include "cli/exit_codes.h"

#ifndef REMORA_VERSION
#define REMORA_VERSION "unknown"
#endif

namespace remora::cli {

void print_error(const std::string& message) {
  std::fflush(stdout);  // keep stdout and stderr in order when both go to one file
  std::fprintf(stderr, "remora: error: %s\n", message.c_str());
}

int fail(const Error& e) {
  print_error(e.to_string());
  return to_int(exit_code_for(e.code()));
}

}  // namespace remora::cli

int main(int argc, char** argv) {
  using namespace remora::cli;
  CLI::App app{
      "Remora: attach tools to running processes and process trees, and make them call functions.\n"
      "Docs: docs/cli.md",
      "remora"};
  app.set_version_flag("--version", REMORA_VERSION);
  app.require_subcommand(1);
  // No extras anywhere: an unknown option or a stray word is a usage error
  // (subcommands inherit this). call and run take what follows their first
  // positional verbatim, events what follows "--" (common_options.h,
  // add_verbatim_words; events_command.cc).
  app.footer(exit_code_footer());

  // Only the command asked for is built: building all seven (their options,
  // validators and help texts) took 140 us of a 3 ms `remora attach`. The
  // root's own flags, a misspelt command or none build them all, for the
  // help and the error that list them.
  struct Command {
    const char* name;
    void (*add)(CLI::App&, Dispatch&);
  };
  static constexpr Command kCommands[] = {
      {"call", add_call_command},     {"attach", add_attach_command},
      {"detach", add_detach_command}, {"status", add_status_command},
      {"run", add_run_command},       {"events", add_events_command},
      {"report", add_report_command}, {"slurm-node", add_slurm_node_command}};
  Dispatch dispatch;
  const std::string_view asked = argc > 1 ? argv[1] : "";
  const bool known = std::any_of(std::begin(kCommands), std::end(kCommands),
                                 [&](const Command& c) { return asked == c.name; });
  for (const auto& c : kCommands)
    if (!known || asked == c.name) c.add(app, dispatch);

  // CLI11 reports through exceptions; they stop here. The library under us
  // never throws (style.md, "Errors").
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help, --help-all, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    auto stray = app.remaining();
    if (app.get_subcommands().empty() && !stray.empty()) {
      print_error("unknown command '" + stray.front() + "'");
    } else {
      print_error(e.what());
    }
    std::fprintf(stderr, "Run 'remora --help' or 'remora <command> --help' for usage.\n");
    return to_int(ExitCode::kUsage);
  }
  if (!dispatch.run) {  // require_subcommand(1) makes this unreachable; stay safe anyway
    print_error("no command given");
    return to_int(ExitCode::kUsage);
  }
  return dispatch.run();
}
