// What agent.cc and channel.cc (the socket channel, agent/channel_wire.h)
// share inside the agent. Nothing here is exported.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "agent/protocol.h"

namespace remora_agent {

// agent.cc
// A copy of remora_agent_info taken under the agent's lock.
void snapshot_info(struct remora_agent_info* out);

// channel.cc
// The opt-in, from the agent's constructor: when the environment says
// REMORA_TOOL_ATTACH=1 (or ROCP_TOOL_ATTACH=1), bind the abstract socket and
// install the wake handler. Starts no thread.
void channel_init();
// In a forked child (fork handler): the socket it inherited is its
// parent's; it binds one of its own (no thread either).
void channel_after_fork();
// In the destructor of an unload: the socket closed, the handler removed
// (a later wake must not jump into the unmapped agent).
void channel_fini();
// True while the socket channel listens: the agent is not unloaded then
// (the channel is how controllers reach the process, and its wake handler
// could be entered by a wake on its way).
bool channel_open();

}  // namespace remora_agent

// The entry points (agent.cc, agent/protocol.h), called by the channel
// thread as the listener's remote calls call them.
extern "C" {
extern struct remora_agent_info remora_agent_info;
int remora_agent_attach(const void* env_buffer, const char* tool_list);
int remora_agent_attach_leased(const void* env_buffer, const char* tool_list, void* scratch, size_t size,
                               int32_t lease_fd, int32_t controller_pid);
int remora_agent_detach(void);
}
