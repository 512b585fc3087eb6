#include "cli/exit_codes.h"

#include <array>
#include <cstdio>

namespace remora::cli {

ExitCode exit_code_for(Errc code) {
  // A switch without default: -Wswitch flags a new Errc that is not mapped here.
  switch (code) {
    case Errc::kInvalidArgument: return ExitCode::kUsage;
    case Errc::kNoSuchProcess:
    case Errc::kOwnProcess:
    case Errc::kZombie:
    case Errc::kKernelThread: return ExitCode::kNoTarget;
    case Errc::kTracedByOther:
    case Errc::kPtraceDenied: return ExitCode::kPermission;
    case Errc::kLibraryNotMapped:
    case Errc::kAmbiguousLibrary:
    case Errc::kSymbolNotFound:
    case Errc::kIdentityMismatch: return ExitCode::kSymbol;
    case Errc::kStaticBinary:
    case Errc::kNotSupported: return ExitCode::kNotSupported;
    case Errc::kTimedOut: return ExitCode::kTimedOut;
    case Errc::kTargetExited: return ExitCode::kTargetExited;
    case Errc::kFault: return ExitCode::kFault;
    case Errc::kIo:
    case Errc::kParse: return ExitCode::kSystem;
    case Errc::kRefused: return ExitCode::kRefused;
    case Errc::kNotAttachable:
    case Errc::kToolFailed: return ExitCode::kToolFailed;
    case Errc::kNotAttached:
    case Errc::kAlreadyAttached: return ExitCode::kSessionState;
    case Errc::kOk:  // an Error never carries kOk; if one does, that is our bug
    case Errc::kInternal: return ExitCode::kInternal;
  }
  return ExitCode::kInternal;
}

namespace {
constexpr std::array kTable = {
    ExitCodeDoc{ExitCode::kOk, "success"},
    ExitCodeDoc{ExitCode::kUsage, "usage: bad command line or argument value"},
    ExitCodeDoc{ExitCode::kNoTarget, "no such process or thread, zombie, kernel thread, or remora itself"},
    ExitCodeDoc{ExitCode::kPermission, "ptrace refused (uid, CAP_SYS_PTRACE, Yama), or already traced"},
    ExitCodeDoc{ExitCode::kSymbol, "library not mapped or ambiguous, symbol not found"},
    ExitCodeDoc{ExitCode::kNotSupported, "not supported: static binary, kernel, libc or architecture"},
    ExitCodeDoc{ExitCode::kTimedOut, "timed out (see --timeout)"},
    ExitCodeDoc{ExitCode::kTargetExited, "the target exited during the call, the attach or the session"},
    ExitCodeDoc{ExitCode::kFault, "the called function faulted in the target"},
    ExitCodeDoc{ExitCode::kSystem, "a system call failed, or a /proc or ELF file was malformed"},
    ExitCodeDoc{ExitCode::kInternal, "internal error in remora (please report)"},
    ExitCodeDoc{ExitCode::kRefused, "the target refuses tools (REMORA_TOOL_ATTACH=0)"},
    ExitCodeDoc{ExitCode::kToolFailed, "a tool is not attachable, failed to load, or a callback failed"},
    ExitCodeDoc{ExitCode::kSessionState, "not attached (detach), or already attached (attach)"},
    ExitCodeDoc{ExitCode::kPartial,
                "--slurm: part of the job was reached; the nodes or ranks that failed are named"},
};
}  // namespace

std::span<const ExitCodeDoc> exit_code_table() { return kTable; }

std::string exit_code_footer() {
  std::string out = "Exit codes:\n";
  for (const auto& row : kTable) {
    char num[16];
    std::snprintf(num, sizeof num, "  %2d  ", to_int(row.code));
    out += num;
    out += row.meaning;
    out += '\n';
  }
  return out;
}

}  // namespace remora::cli
