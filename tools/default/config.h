// The default tool's settings, read from the environment at each attach
// (the attach's environment buffer sets them in the target). docs/tool.md
// documents every variable.
#ifndef REMORA_TOOLS_DEFAULT_CONFIG_H_
#define REMORA_TOOLS_DEFAULT_CONFIG_H_

#include <stddef.h>

#include <functional>
#include <string>
#include <vector>

namespace remora_tool {

struct Config {
  std::string output_path = "./remora-output";  // REMORA_OUTPUT_PATH
  // REMORA_OUTPUT_FD="N:INODE:PID": a memfd the controller made in this process
  // for a root where no directory is writable; the session goes into it
  // (raw_records.h, RawSpool::open_fd) instead of under output_path. -1: unset.
  int output_fd = -1;
  int hz = 99;                                  // REMORA_SAMPLE_HZ
  bool sampling = true;                         // REMORA_SAMPLING
  bool tracing = true;                          // REMORA_TRACING
  std::vector<std::string> functions;           // REMORA_TRACE_FUNCTIONS (reported names)
  int signal = 0;                               // REMORA_SAMPLE_SIGNAL (0: pick one)
  size_t max_events = 1000000;                  // REMORA_MAX_EVENTS
  bool fold_threads = false;                    // REMORA_FOLD_THREADS
};

// Names traced when REMORA_TRACE_FUNCTIONS is unset.
std::vector<std::string> default_functions();
// Every name REMORA_TRACE_FUNCTIONS accepts.
std::vector<std::string> supported_functions();

// Parses the settings through `getenv_fn` (getenv in the tool; a table in
// the tests). False with a message naming the variable on invalid input.
bool parse_config(const std::function<const char*(const char*)>& getenv_fn, Config* out, std::string* error);

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_CONFIG_H_
