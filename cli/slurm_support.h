// What both sides of `remora ... --slurm` need from the system: running
// Slurm's commands (scontrol, srun) with pipes and deadlines, the monotonic
// clock, and the wire's writing side.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::cli::slurm {

uint64_t mono_ns();

// A program on PATH, or "" (srun, scontrol).
std::string find_on_path(const std::string& name);

// A child with its standard streams on pipes (stdin's write end, stdout's
// and stderr's read ends, all non-blocking and close-on-exec here). The
// child runs with `mask` as its signal mask (remora blocks its stop signals)
// and gets SIGTERM when this process dies (PR_SET_PDEATHSIG), so that an
// srun outlives no front that was killed; it runs in a process group of its
// own, out of reach of the terminal's signals.
struct Child {
  pid_t pid = 0;
  UniqueFd in, out, err;
};
Result<Child> spawn(const std::vector<std::string>& argv, const sigset_t* mask = nullptr);

// Runs argv to its end, collecting both outputs, within `timeout` (then
// SIGKILL). status is the wait status.
struct Captured {
  int status = 0;
  std::string out, err;
};
Result<Captured> run_capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

// Reads what is there from a non-blocking descriptor into `buf`; false at
// the end of the stream (or an error other than EAGAIN).
bool drain(int fd, std::string& buf);

// Writes all of `data` to a descriptor (blocking writes; EINTR retried);
// false when the reader is gone.
bool write_all(int fd, const void* data, size_t len);

// Reaps `pid` if it has ended: its wait status.
std::optional<int> try_reap(pid_t pid);

}  // namespace remora::cli::slurm
