// Reading a thread's seccomp filters through ptrace
// (PTRACE_SECCOMP_GET_FILTER, Linux 4.4+, CONFIG_CHECKPOINT_RESTORE).
//
// The kernel hands them out only to a tracer with CAP_SYS_ADMIN that is not
// itself under seccomp, and only while the thread is in a ptrace-stop of
// that tracer (kernel/seccomp.c, seccomp_get_filter). Must be called from
// the thread that seized `tid`, like every ptrace request.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <vector>

#include "base/deadline.h"
#include "base/result.h"

namespace remora::ptrace {

struct SeccompFilters {
  enum class State {
    kNone,        // EINVAL: the thread is not in filter mode (no filter, or strict mode)
    kRead,        // `programs` holds every filter
    kUnreadable,  // not allowed (EACCES/EPERM: no CAP_SYS_ADMIN, or we are under seccomp): `err`
  } state = State::kNone;
  int err = 0;
  // Oldest first: index 0 is the first filter installed (the kernel's
  // filter_off counts from the oldest).
  std::vector<std::vector<sock_filter>> programs;
};

// Reads every filter of stopped thread `tid`: index 0, 1, ... until ENOENT.
// Two requests per filter (its length, then its instructions) and one more;
// a thread not in filter mode costs one request. Errors other than those in
// State (ESRCH: not stopped by us; EMEDIUMTYPE: a filter the kernel keeps
// no classic program of) are returned as errors.
Result<SeccompFilters> read_seccomp_filters(pid_t tid);

// Seizes `tid` of `pid`, stops it, reads its filters and lets it go again
// untouched (a signal that was being delivered is delivered on detach, a
// group stop stays). For a check made outside a call (Target::check_syscalls).
Result<SeccompFilters> read_seccomp_filters_of_running(pid_t pid, pid_t tid, const Deadline& deadline);

}  // namespace remora::ptrace
