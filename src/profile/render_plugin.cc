// libremora-render.so (render_plugin.h): the profile layer behind a C entry.
#include "profile/render_plugin.h"

#include <cstdio>

#include "profile/collect.h"
#include "profile/merge.h"
#include "profile/report.h"

#define REMORA_RENDER_EXPORT extern "C" __attribute__((visibility("default")))

REMORA_RENDER_EXPORT int remora_render_session_v1(const remora_render_request_v1* request, char* err,
                                                  size_t err_len) {
  if (request == nullptr || request->size < sizeof(remora_render_request_v1) || request->dir == nullptr) {
    if (err_len > 0) std::snprintf(err, err_len, "bad render request");
    return static_cast<int>(remora::Errc::kInvalidArgument);
  }
  // A pid: the session just ended (or `remora report -p PID`), collected
  // now from the live process. None: collected once, if it never was.
  remora::profile::CollectOptions collect;
  collect.pid = request->pid;
  collect.again = request->pid != 0;
  if (auto c = remora::profile::collect_session(request->dir, collect); !c) {
    if (err_len > 0) std::snprintf(err, err_len, "%s", c.error().message().c_str());
    return static_cast<int>(c.error().code());
  }
  auto r = remora::profile::render_session(request->dir);
  if (r) return 0;
  if (err_len > 0) std::snprintf(err, err_len, "%s", r.error().message().c_str());
  return static_cast<int>(r.error().code());
}

REMORA_RENDER_EXPORT int remora_merge_job_v1(const remora_merge_request_v1* request, char* err,
                                             size_t err_len) {
  if (request == nullptr || request->size < sizeof(remora_merge_request_v1) || request->job_dir == nullptr) {
    if (err_len > 0) std::snprintf(err, err_len, "bad merge request");
    return static_cast<int>(remora::Errc::kInvalidArgument);
  }
  auto r = remora::profile::merge_job(request->job_dir);
  if (r) return 0;
  if (err_len > 0) std::snprintf(err, err_len, "%s", r.error().to_string().c_str());
  return static_cast<int>(r.error().code());
}
