// How subcommands plug into the remora command. Each subcommand lives in its
// own file (call_command.cc, later attach_command.cc, detach_command.cc,
// status_command.cc, run_command.cc, events_command.cc) and exposes one
// add_*_command function that registers its options on the root app and, from
// the subcommand's parse callback, stores in `Dispatch::run` the function that
// does the work. main() parses, then runs whatever was selected: parsing never
// touches a process, and every failure leaves through one exit-code mapping.
#pragma once

#include <functional>
#include <string>

namespace CLI {
class App;
}
namespace remora {
class Error;
}

namespace remora::cli {

struct Dispatch {
  // Set by the parsed subcommand; returns the process exit code (exit_codes.h).
  std::function<int()> run;
};

// `remora call -p PID [-T TID] [--timeout MSEC] [--ret TYPE] [LIB:]SYMBOL [ARG...]`
void add_call_command(CLI::App& root, Dispatch& dispatch);
// `remora attach -p PID [-t LIB[:LIB...]] [-d MSEC] [--attach-children=BOOL] [-e NAME=VALUE]... [--keep]`
void add_attach_command(CLI::App& root, Dispatch& dispatch);
// `remora detach -p PID [--tree]`
void add_detach_command(CLI::App& root, Dispatch& dispatch);
// `remora status -p PID [--tree]`
void add_status_command(CLI::App& root, Dispatch& dispatch);
// `remora run [-t LIB[:LIB...]] [-e NAME=VALUE]... [--no-tool] -- CMD [ARG...]`
void add_run_command(CLI::App& root, Dispatch& dispatch);

// `remora events (-p PID | -- CMD [ARGS...]) [--follow] [--timeout MSEC]`
void add_events_command(CLI::App& root, Dispatch& dispatch);

// `remora slurm-node ...`: the node side of --slurm, started by srun (not in --help).
void add_slurm_node_command(CLI::App& root, Dispatch& dispatch);

// `remora report DIR... [-p PID]`
void add_report_command(CLI::App& root, Dispatch& dispatch);
// Prints "remora: error: <message>" to stderr (the one error format of the CLI).
void print_error(const std::string& message);
// print_error(e), then the exit code e's code maps to (exit_codes.h).
int fail(const Error& e);

}  // namespace remora::cli
