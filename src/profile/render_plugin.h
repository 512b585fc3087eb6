// The renderer as a plugin: libremora-render.so holds the profile layer and
// its libraries (libdw, libprotobuf, zlib), and the remora command loads it
// only when it renders a session. Everything else remora does (an attach with
// a tool of one's own, a call) starts without loading them (docs/benchmarks.md:
// the CLI's start-up).
//
// A C interface, so that the plugin and its user need not share a C++ ABI
// beyond the C one; versioned by name.
#ifndef REMORA_PROFILE_RENDER_PLUGIN_H_
#define REMORA_PROFILE_RENDER_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#define REMORA_RENDER_PLUGIN_NAME "libremora-render.so"
#define REMORA_RENDER_SESSION_SYMBOL "remora_render_session_v1"
#define REMORA_MERGE_JOB_SYMBOL "remora_merge_job_v1"

#ifdef __cplusplus
extern "C" {
#endif

struct remora_render_request_v1 {
  uint32_t size;    // sizeof(struct remora_render_request_v1)
  int32_t pid;      // the live target as the caller sees it: collected again (profile/collect.h);
                    // 0: collected only if it never was, with the pid in the records
  const char* dir;  // the session directory (holds profile.remora)
};

// Collects (profile::collect_session) and renders one session (profile::render_session). Returns 0, or the
// Errc of the failure with its message in err (NUL-terminated, cut to err_len).
typedef int (*remora_render_session_fn)(const struct remora_render_request_v1* request, char* err,
                                        size_t err_len);

struct remora_merge_request_v1 {
  uint32_t size;        // sizeof(struct remora_merge_request_v1)
  const char* job_dir;  // the job's directory (holds job.json)
};

// Merges the rendered sessions of a job's ranks into one profile in its
// directory (profile::merge_job, profile/merge.h); the merged summary.txt
// there says what was merged and what was left out. Returns 0, or the Errc
// of the failure with its message in err (NUL-terminated, cut to err_len).
// Any thread may call it, not twice at once for one directory. A plugin
// older than the merge lacks the symbol.
typedef int (*remora_merge_job_fn)(const struct remora_merge_request_v1* request, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif  // REMORA_PROFILE_RENDER_PLUGIN_H_
