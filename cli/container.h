// Targets by the names users know them by: a container's main process,
// found through the container runtime's own command (podman inspect, docker
// inspect), for `remora attach|status|detach --container NAME|ID`. The
// process is then attached as -p PID would be: with its tree, the session
// staged through the container's root (output_staging.h) and the results on
// this side, in ./remora-output.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "base/result.h"

namespace remora::cli {

struct ContainerTarget {
  pid_t pid = 0;        // the container's main process, as this machine sees it
  std::string runtime;  // "podman" or "docker"
  std::string name;     // as the runtime names it
  std::string id;       // the full ID
};

// Asks each runtime on PATH in turn (REMORA_CONTAINER_RUNTIME names one:
// "podman" or "docker"). Errors say what to do: kNotSupported when no
// runtime is on PATH, kNoSuchProcess when none knows the container or it
// is not running (its state named), kTimedOut after 30 s per runtime.
Result<ContainerTarget> find_container(const std::string& name_or_id);

// --container: finds the container (find_container), sets *pid to its main
// process, says which process it is (stderr), then returns run()'s exit
// code; or the error's, printed.
int run_in_container(const std::string& name_or_id, pid_t* pid, const std::function<int()>& run);

// The answer of `RUNTIME inspect --format` (kInspectFormat) parsed: "PID
// STATUS ID NAME". Pure, for tests.
inline constexpr const char* kInspectFormat = "{{.State.Pid}} {{.State.Status}} {{.Id}} {{.Name}}";
Result<ContainerTarget> parse_inspect(const std::string& runtime, const std::string& asked,
                                      const std::string& out);

}  // namespace remora::cli
