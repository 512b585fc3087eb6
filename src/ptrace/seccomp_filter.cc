// See seccomp_filter.h. The requests go through the ptrace layer's one
// wrapper (ptrace::seccomp_get_filter), logged on the "ptrace" channel.
#include "ptrace/seccomp_filter.h"

#include <sys/ptrace.h>

#include <cerrno>

#include "base/log.h"
#include "ptrace/ptrace.h"

namespace remora::ptrace {

namespace {

// A bound on the loop, above what the kernel allows: MAX_INSNS_PER_PATH
// (32768) instructions over the whole stack, each filter counting 4 more
// (kernel/seccomp.c), so at most 6553 filters.
constexpr long kMaxFilters = 8192;

// The request through the ptrace layer's one wrapper (logged there); -1 with
// errno set to the kernel's answer on failure, as the loop below reads it.
long get_filter(pid_t tid, unsigned long index, sock_filter* out) {
  auto r = seccomp_get_filter(tid, index, out);
  if (r) return *r;
  errno = r.error().sys_errno() != 0 ? r.error().sys_errno() : EIO;
  return -1;
}

}  // namespace

Result<SeccompFilters> read_seccomp_filters(pid_t tid) {
  SeccompFilters out;
  for (unsigned long index = 0;; ++index) {
    if (index >= kMaxFilters)
      return Error(Errc::kInternal, "PTRACE_SECCOMP_GET_FILTER reported more than 8192 filters");
    long len = get_filter(tid, index, nullptr);
    if (len < 0) {
      int err = errno;
      if (err == ENOENT) {
        out.state = SeccompFilters::State::kRead;
        return out;
      }
      if (index == 0 && err == EINVAL) return out;  // not in filter mode
      if (err == EACCES || err == EPERM) {
        out.state = SeccompFilters::State::kUnreadable;
        out.err = err;
        out.programs.clear();
        return out;
      }
      return Error::from_errno("read seccomp filter " + std::to_string(index) + " of thread " +
                                   std::to_string(tid) + " (PTRACE_SECCOMP_GET_FILTER)",
                               err);
    }
    if (len == 0 || len > BPF_MAXINSNS)
      return Error(Errc::kInternal,
                   "PTRACE_SECCOMP_GET_FILTER gave a filter of " + std::to_string(len) + " instructions");
    std::vector<sock_filter> prog(static_cast<size_t>(len));
    long again = get_filter(tid, index, prog.data());
    if (again != len)
      return Error::from_errno(
          "read seccomp filter " + std::to_string(index) + " of thread " + std::to_string(tid),
          again < 0 ? errno : EIO);
    out.programs.push_back(std::move(prog));
  }
}

Result<SeccompFilters> read_seccomp_filters_of_running(pid_t pid, pid_t tid, const Deadline& deadline) {
  REMORA_TRY(seize(pid, tid, 0));
  int detach_sig = 0;
  auto stopped = [&]() -> Result<void> {
    REMORA_TRY(interrupt(tid));
    for (;;) {
      auto s = REMORA_TRY(wait_stop(tid, deadline));
      switch (s.kind) {
        case Stop::Kind::kExited:
        case Stop::Kind::kKilled:
          return Error(Errc::kTargetExited, "thread " + std::to_string(tid) + " ended");
        case Stop::Kind::kSignalDelivery:
          // A ptrace-stop too: read there, and let the signal through on
          // detach, as if we had never been here.
          detach_sig = s.sig;
          return ok();
        default: return ok();  // our interrupt, or a group stop
      }
    }
  };
  auto st = stopped();
  if (!st) {
    if (st.error().code() != Errc::kTargetExited) (void)detach(tid, 0);
    return std::move(st).error();
  }
  auto filters = read_seccomp_filters(tid);
  (void)detach(tid, detach_sig);
  return filters;
}

}  // namespace remora::ptrace
