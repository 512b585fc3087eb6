// Exit codes of the remora command: 0 success, 1 usage, then one code per
// family of remora::Errc. Scripts branch on these, so they are stable: add
// new families at the end and never renumber. docs/cli.md lists the same
// table; the --help footer is generated from it.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "base/result.h"

namespace remora::cli {

enum class ExitCode : int {
  kOk = 0,
  kUsage = 1,          // bad command line, or a value the engine refused (invalid-argument)
  kNoTarget = 2,       // no such process/thread, a zombie, a kernel thread, or remora itself
  kPermission = 3,     // ptrace refused, or another tracer holds the process
  kSymbol = 4,         // library not mapped, ambiguous, symbol not found, file identity mismatch
  kNotSupported = 5,   // statically linked target, or a missing kernel/libc/arch feature
  kTimedOut = 6,       // the call did not finish within --timeout
  kTargetExited = 7,   // the target exited or was killed during the call
  kFault = 8,          // the called function faulted in the target
  kSystem = 9,         // a system call failed or a /proc or ELF file was malformed
  kInternal = 10,      // a bug in remora: please report it
  kRefused = 11,       // the target refuses tools (REMORA_TOOL_ATTACH=0)
  kToolFailed = 12,    // a tool is not attachable, failed to load, or a callback failed
  kSessionState = 13,  // detach without attached tools, or attach while attached
  kPartial = 14,       // --slurm: the job was reached in part (some nodes or ranks failed; each is named)
};

// The exit code for an error of code `code`.
ExitCode exit_code_for(Errc code);

// One row of the documented table.
struct ExitCodeDoc {
  ExitCode code;
  std::string_view meaning;
};
std::span<const ExitCodeDoc> exit_code_table();

// "Exit codes:\n  0  success\n  1  ..." for --help footers.
std::string exit_code_footer();

inline int to_int(ExitCode c) { return static_cast<int>(c); }

}  // namespace remora::cli
