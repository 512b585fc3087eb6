// The unload's proof (docs/architecture.md, "The unload"): with every
// thread of the process stopped, no thread is in the code the agent's
// dlclose will unmap, and no thread is counted inside a tool (a thread
// counted in has called out of the tool's code and will return into it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "agent/protocol.h"
#include "base/deadline.h"
#include "base/result.h"

namespace remora::attach::detail {

// What an unload will unmap and where its tools count their threads, as the
// agent published it (remora_agent_info, protocol 7).
struct UnloadPlan {
  struct Range {
    uint64_t start = 0, end = 0;
  };
  struct Counter {
    uint64_t address = 0, stripes = 0, stride = 0;
  };
  std::vector<Range> code;
  std::vector<Counter> counters;
};

// The plan in an info block read whole; an Error when the agent published
// none (it could not say what it would unmap) or an impossible one.
Result<UnloadPlan> unload_plan(const remora_agent_info& info);

// What one look at the stopped threads found.
struct QuiescenceCheck {
  bool proven = false;
  // Why not, for the user: the thread and what it was doing.
  std::string why;
  size_t threads = 0;  // threads stopped and looked at
};

// The pure half: given each stopped thread's program counter and the counts
// read meanwhile, is the plan's code free? (`pcs`: {tid, pc}.)
QuiescenceCheck judge(const UnloadPlan& plan, std::span<const std::pair<pid_t, uint64_t>> pcs,
                      std::span<const long> inside);

// Stops every thread of `pid` (PTRACE_SEIZE and PTRACE_INTERRUPT, from the
// calling thread; threads that appear meanwhile too), reads their program
// counters and the plan's counters, and lets them all go again, each with
// the signal it was about to take. A thread another tracer holds, one that
// does not stop before `deadline`, or one found inside makes `proven`
// false, with the reason; a system failure is an Error.
Result<QuiescenceCheck> check_quiescent(pid_t pid, const UnloadPlan& plan, const Deadline& deadline);

}  // namespace remora::attach::detail
