/* The socket channel's wire format: what a controller and an opted-in agent
 * (REMORA_TOOL_ATTACH=1 or ROCP_TOOL_ATTACH=1 at launch, or
 * `remora run --listen`) say over the agent's unix socket, for attaching
 * where ptrace is not allowed. Shared by both sides; plain C layout,
 * versioned. docs/architecture.md, "The socket channel", has the design.
 *
 * Where: the abstract unix socket "\0remora-agent.<PID>.<SIGNO>", in the
 * target's network namespace. PID is the process's own getpid() (its pid
 * namespace's view, the last NSpid of /proc/PID/status); SIGNO is the
 * signal that wakes it. A controller finds it listed in /proc/PID/net/unix
 * as "@remora-agent.<PID>.<SIGNO>".
 *
 * The wake: the opted-in agent has no thread until a controller asks. The
 * controller connects (the kernel queues the connection), then sends SIGNO
 * to a thread of the target with tgkill; the agent's handler starts the
 * channel thread ("remora-channel") from a thread where that is safe
 * (src/arch/wake_rules.h), which accepts and serves connections one at a time
 * and leaves again once none came for a while. While it runs (its name is in
 * /proc/PID/task/TID/stat) no wake is needed.
 *
 * One request per connection: a request header, then env_size bytes of the
 * environment buffer (remora_agent_attach's: [uint32 count] then count pairs
 * NAME\0VALUE\0), then tools_size bytes of the tool list (NUL-terminated,
 * ':'-separated entries NAME|#K, K the index of the tool's descriptor among
 * the request's descriptors, or NAME|PATH, a path the target opens). The
 * descriptors come with the header's bytes (SCM_RIGHTS): for a leased
 * attach the first is the read end of a pipe whose only write end the
 * controller holds (the lease: its EOF detaches, as over ptrace), the tools'
 * follow. The agent answers with one reply and closes the connection.
 * Nothing in a request is trusted: sizes, descriptors, the list and the
 * environment are checked, and a request that fails a check gets
 * REMORA_AGENT_ERR_BAD_ARGUMENT and a message, nothing else.
 *
 * Who: SO_PEERCRED's uid must be 0, the process's real or effective uid, or
 * one listed in REMORA_ATTACH_UIDS (comma-separated, read at launch). */
#ifndef REMORA_AGENT_CHANNEL_WIRE_H_
#define REMORA_AGENT_CHANNEL_WIRE_H_

#include <stdint.h>

#include "agent/protocol.h"

#define REMORA_CHANNEL_MAGIC 0x4843524du /* "MRCH" */
#define REMORA_CHANNEL_VERSION 1u
#define REMORA_CHANNEL_NAME_PREFIX "remora-agent."
#define REMORA_CHANNEL_THREAD_NAME "remora-channel"
#define REMORA_CHANNEL_ENV_MAX 8192u
#define REMORA_CHANNEL_TOOLS_MAX REMORA_AGENT_TOOLS_SIZE
#define REMORA_CHANNEL_FDS_MAX 17u /* the lease and 16 tools */

enum remora_channel_op {
  REMORA_CHANNEL_OP_STATUS = 1, /* the agent's state, nothing changed */
  REMORA_CHANNEL_OP_ATTACH = 2, /* remora_agent_attach(_leased) */
  REMORA_CHANNEL_OP_DETACH = 3, /* remora_agent_detach */
};

/* Request flags. */
#define REMORA_CHANNEL_FLAG_LEASE 0x1u /* descriptor 0 is the lease's read end */

struct remora_channel_request {
  uint32_t magic;         /* REMORA_CHANNEL_MAGIC */
  uint32_t version;       /* REMORA_CHANNEL_VERSION */
  uint32_t op;            /* enum remora_channel_op */
  uint32_t flags;         /* REMORA_CHANNEL_FLAG_* */
  uint32_t env_size;      /* bytes of the environment buffer that follow (0: none) */
  uint32_t tools_size;    /* bytes of the tool list that follow, its NUL included (0: none) */
  uint32_t fd_count;      /* descriptors sent with the header */
  int32_t controller_pid; /* informational (SO_PEERCRED's pid is what the agent records) */
};

struct remora_channel_reply {
  uint32_t magic;   /* REMORA_CHANNEL_MAGIC */
  uint32_t version; /* REMORA_CHANNEL_VERSION */
  int32_t result;   /* enum remora_agent_result */
  int32_t attached; /* the remora_agent_info fields after the request */
  uint64_t sessions;
  uint64_t detaches;
  int32_t lease_pid;
  int32_t lease_expired;
  int32_t pid;       /* the target's own getpid() */
  uint32_t peer_uid; /* the uid the agent saw (SO_PEERCRED, in its user namespace) */
  int32_t forked_from;
  int32_t listener_tid;    /* the ptrace path's listener, 0 when none runs */
  int32_t session_channel; /* remora_agent_info.session_channel */
  int32_t reserved;
  char tools[REMORA_AGENT_TOOLS_SIZE];
  char message[REMORA_AGENT_MESSAGE_SIZE];
};

#endif /* REMORA_AGENT_CHANNEL_WIRE_H_ */
