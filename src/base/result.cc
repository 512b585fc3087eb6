#include "base/result.h"

#include <cstring>

namespace remora {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::kOk: return "ok";
    case Errc::kInvalidArgument: return "invalid-argument";
    case Errc::kNoSuchProcess: return "no-such-process";
    case Errc::kOwnProcess: return "own-process";
    case Errc::kZombie: return "zombie";
    case Errc::kKernelThread: return "kernel-thread";
    case Errc::kStaticBinary: return "static-binary";
    case Errc::kTracedByOther: return "traced-by-other";
    case Errc::kPtraceDenied: return "ptrace-denied";
    case Errc::kLibraryNotMapped: return "library-not-mapped";
    case Errc::kAmbiguousLibrary: return "ambiguous-library";
    case Errc::kSymbolNotFound: return "symbol-not-found";
    case Errc::kTimedOut: return "timed-out";
    case Errc::kTargetExited: return "target-exited";
    case Errc::kFault: return "fault";
    case Errc::kParse: return "parse";
    case Errc::kIo: return "io";
    case Errc::kNotSupported: return "not-supported";
    case Errc::kIdentityMismatch: return "identity-mismatch";
    case Errc::kInternal: return "internal";
    case Errc::kRefused: return "refused";
    case Errc::kNotAttachable: return "not-attachable";
    case Errc::kToolFailed: return "tool-failed";
    case Errc::kNotAttached: return "not-attached";
    case Errc::kAlreadyAttached: return "already-attached";
  }
  return "unknown";
}

Error Error::from_errno(std::string_view what, int sys_errno) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(sys_errno);
  return Error(Errc::kIo, std::move(msg), sys_errno);
}

std::string Error::to_string() const {
  std::string out;
  for (auto it = context_.rbegin(); it != context_.rend(); ++it) {
    out += *it;
    out += ": ";
  }
  out += message_;
  return out;
}

}  // namespace remora
