// find_container and run_in_container (container.h): the runtime's command.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "base/strings.h"
#include "cli/command.h"
#include "cli/container.h"
#include "cli/session_support.h"
#include "cli/slurm_support.h"

namespace remora::cli {

using namespace std::chrono_literals;

Result<ContainerTarget> find_container(const std::string& name_or_id) {
  std::vector<std::string> runtimes;
  if (const char* only = std::getenv("REMORA_CONTAINER_RUNTIME"); only != nullptr && *only != '\0')
    runtimes.emplace_back(only);
  else
    runtimes = {"podman", "docker"};
  std::vector<std::string> answers;
  for (const auto& runtime : runtimes) {
    if (slurm::find_on_path(runtime).empty()) continue;
    auto r = slurm::run_capture(
        {runtime, "inspect", "--type", "container", "--format", kInspectFormat, name_or_id}, 30s);
    if (!r) {
      answers.push_back(runtime + ": " + r.error().to_string());
      continue;
    }
    if (WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0)
      return parse_inspect(runtime, name_or_id, r->out);
    std::string said(trim(r->err.empty() ? r->out : r->err));
    answers.push_back(runtime + ": " + (said.empty() ? describe_exit_status(r->status) : said));
  }
  if (answers.empty())
    return Error(
        Errc::kNotSupported,
        runtimes.size() == 1
            ? "REMORA_CONTAINER_RUNTIME names " + runtimes[0] + ", which is not on PATH"
            : std::string("--container needs podman or docker on PATH, and neither is: install one, or "
                          "give the container's main process with -p PID"));
  std::string all;
  for (const auto& a : answers) all += (all.empty() ? "" : "; ") + a;
  return Error(Errc::kNoSuchProcess, "no running container " + name_or_id + " (" + all +
                                         "): `podman ps` or `docker ps` lists the running ones");
}

int run_in_container(const std::string& name_or_id, pid_t* pid, const std::function<int()>& run) {
  auto c = find_container(name_or_id);
  if (!c) return fail(c.error());
  *pid = c->pid;
  std::fprintf(stderr, "remora: container %s (%s, %.12s): main process %d\n", c->name.c_str(),
               c->runtime.c_str(), c->id.c_str(), static_cast<int>(c->pid));
  return run();
}

}  // namespace remora::cli
