#include "cli/container.h"

#include "base/strings.h"

namespace remora::cli {

Result<ContainerTarget> parse_inspect(const std::string& runtime, const std::string& asked,
                                      const std::string& out) {
  auto words = split_fields(trim(out));
  auto pid = words.size() >= 4 ? parse_i64(words[0]) : std::nullopt;
  if (!pid || *pid < 0 || *pid > 0x7fffffff)
    return Error(Errc::kParse, runtime + " inspect " + asked + " answered \"" + std::string(trim(out)) +
                                   "\", not \"PID STATUS ID NAME\": is `" + runtime +
                                   "` a container runtime?");
  ContainerTarget t;
  t.runtime = runtime;
  t.pid = static_cast<pid_t>(*pid);
  t.id = std::string(words[2]);
  t.name = std::string(words[3]);
  if (!t.name.empty() && t.name[0] == '/') t.name.erase(0, 1);  // docker writes "/name"
  const std::string status(words[1]);
  if (t.pid == 0 || status != "running")
    return Error(Errc::kNoSuchProcess, "container " + t.name + " (" + runtime + ") is " + status +
                                           ", not running: start it (`" + runtime + " start " + t.name +
                                           "`), then attach");
  return t;
}

}  // namespace remora::cli
