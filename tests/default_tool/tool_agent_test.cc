// The default tool loaded by the real agent, in-process: the agent's entry
// points are called directly (no ptrace), so this checks the tool under the
// agent's loading rules (dlopen RTLD_NOW|RTLD_LOCAL, env buffer, sessions,
// re-attach with the same list) without the attach engine.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "agent_entry.h"
#include "render.h"
#include "workload.h"

namespace fs = std::filesystem;

namespace {

TEST(DefaultToolUnderAgent, AttachDetachReattach) {
  const AgentEntry agent(REMORA_AGENT_PATH);
  ASSERT_TRUE(agent.ok()) << agent.error;
  const auto agent_attach = agent.attach;
  const auto agent_detach = agent.detach;

  char tmpl[] = "/tmp/remora-tool-agent-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, out = dir + "/out";
  Workload w(dir);
  w.start();
  auto env = env_buffer({{"REMORA_OUTPUT_PATH", out}, {"REMORA_SAMPLE_HZ", "499"}});
  for (int session = 1; session <= 2; ++session) {
    ASSERT_EQ(agent_attach(env.data(), REMORA_TOOL_PATH), 0) << "session " << session;
    for (int i = 0; i < 25; ++i) {
      w.feed_pipe();
      struct timespec ts = {0, 20000000};
      nanosleep(&ts, nullptr);
    }
    ASSERT_EQ(agent_detach(), 0) << "session " << session;
  }
  EXPECT_EQ(w.stop_and_check(), "");
  // One directory per session, named ...-s1-... and ...-s2-...
  int sessions = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    if (!e.is_directory()) continue;
    std::string name = e.path().filename().string();
    if (name.find("-s1-") != std::string::npos || name.find("-s2-") != std::string::npos) ++sessions;
    ASSERT_EQ(rendered(e.path().string()), e.path().string());
    std::string cmd = "python3 " REMORA_CHECK_SCRIPT " '" + e.path().string() +
                      "' --expect-calls read,write --expect-frame workload_hash";
    EXPECT_EQ(system(cmd.c_str()), 0) << cmd;
  }
  EXPECT_EQ(sessions, 2);
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
