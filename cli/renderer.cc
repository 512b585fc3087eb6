#include "cli/renderer.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "attach/attach.h"
#include "profile/render_plugin.h"

namespace remora::cli {
namespace {

struct Plugin {
  remora_render_session_fn render = nullptr;
  remora_merge_job_fn merge = nullptr;
  std::string problem;        // why it is not there
  std::string merge_problem;  // why it cannot merge (a renderer of an older remora)
};

const Plugin& plugin() {
  static Plugin p;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string path;
    if (const char* env = std::getenv("REMORA_RENDER_PATH"); env && *env) {
      path = env;
    } else {
      auto agent = attach::find_agent_library();
      if (!agent) {
        p.problem = agent.error().message();
        return;
      }
      path = agent->substr(0, agent->rfind('/') + 1) + REMORA_RENDER_PLUGIN_NAME;
    }
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = ::dlerror();
      p.problem = "cannot load the renderer " + path + " (" + (why ? why : "?") +
                  "): build it (make), or set REMORA_RENDER_PATH to its path";
      return;
    }
    p.render = reinterpret_cast<remora_render_session_fn>(::dlsym(h, REMORA_RENDER_SESSION_SYMBOL));
    if (p.render == nullptr)
      p.problem = path + " is not this remora's renderer (no " REMORA_RENDER_SESSION_SYMBOL
                         "): install the libremora-render.so of the same version";
    p.merge = reinterpret_cast<remora_merge_job_fn>(::dlsym(h, REMORA_MERGE_JOB_SYMBOL));
    if (p.merge == nullptr)
      p.merge_problem = path +
                        " cannot merge a job's ranks (no " REMORA_MERGE_JOB_SYMBOL
                        "): it is an older remora's; install the libremora-render.so of the same version";
  });
  return p;
}

}  // namespace

Result<void> render_session(const std::string& dir, pid_t pid) {
  const Plugin& p = plugin();
  if (!p.problem.empty()) return Error(Errc::kNotSupported, p.problem);
  remora_render_request_v1 request{sizeof request, pid, dir.c_str()};
  char err[4096] = "";
  int rc = p.render(&request, err, sizeof err);
  if (rc == 0) return {};
  return Error(static_cast<Errc>(rc), err);
}

Result<void> merge_job(const std::string& job_dir) {
  const Plugin& p = plugin();
  if (!p.problem.empty()) return Error(Errc::kNotSupported, p.problem);
  if (p.merge == nullptr) return Error(Errc::kNotSupported, p.merge_problem);
  remora_merge_request_v1 request{sizeof request, job_dir.c_str()};
  char err[4096] = "";
  int rc = p.merge(&request, err, sizeof err);
  if (rc == 0) return {};
  return Error(static_cast<Errc>(rc), err);
}

}  // namespace remora::cli
