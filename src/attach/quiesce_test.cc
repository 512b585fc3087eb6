// The unload's proof, its pure half (quiesce.h): the plan the agent
// publishes, read and checked; stopped threads judged from their program
// counters and the tools' counts. Tables, no process.
#include "attach/quiesce.h"

#include <gtest/gtest.h>

#include <array>
#include <utility>
#include <vector>

namespace remora::attach::detail {
namespace {

remora_agent_info plan_info(std::vector<std::pair<uint64_t, uint64_t>> code,
                            std::vector<std::array<uint64_t, 3>> counters) {
  remora_agent_info info{};
  info.version = REMORA_AGENT_PROTOCOL_VERSION;
  info.features = REMORA_AGENT_FEATURE_UNLOAD | REMORA_AGENT_FEATURE_PROVEN_UNLOAD;
  for (const auto& [s, e] : code) {
    info.unload_code[info.unload_code_count][0] = s;
    info.unload_code[info.unload_code_count][1] = e;
    ++info.unload_code_count;
  }
  for (const auto& c : counters) {
    for (int i = 0; i < 3; ++i) info.unload_counters[info.unload_counter_count][i] = c[i];
    ++info.unload_counter_count;
  }
  return info;
}

TEST(UnloadPlan, ReadFromTheInfoBlock) {
  auto plan = unload_plan(plan_info({{0x1000, 0x2000}, {0x7000, 0x7400}}, {{0x9000, 64, 64}}));
  ASSERT_TRUE(plan.ok()) << plan.error().to_string();
  ASSERT_EQ(plan->code.size(), 2u);
  EXPECT_EQ(plan->code[1].start, 0x7000u);
  EXPECT_EQ(plan->code[1].end, 0x7400u);
  ASSERT_EQ(plan->counters.size(), 1u);
  EXPECT_EQ(plan->counters[0].stripes, 64u);
}

TEST(UnloadPlan, RefusedWhenItCannotBeProven) {
  struct Row {
    const char* what;
    remora_agent_info info;
    Errc code;
  };
  remora_agent_info old_agent = plan_info({{0x1000, 0x2000}}, {});
  old_agent.features = REMORA_AGENT_FEATURE_UNLOAD;  // protocol 3-6
  remora_agent_info too_many = plan_info({{0x1000, 0x2000}}, {});
  too_many.unload_code_count = REMORA_AGENT_UNLOAD_RANGES + 1;
  const Row rows[] = {
      {"an agent older than protocol 7", old_agent, Errc::kNotSupported},
      {"no code published (the agent's plan failed)", plan_info({}, {}), Errc::kNotSupported},
      {"more ranges than the block holds", too_many, Errc::kNotSupported},
      {"an empty range", plan_info({{0x2000, 0x2000}}, {}), Errc::kParse},
      {"a range ending before it starts", plan_info({{0x3000, 0x2000}}, {}), Errc::kParse},
      {"no stripes", plan_info({{0x1000, 0x2000}}, {{0x9000, 0, 64}}), Errc::kParse},
      {"a stride smaller than a long", plan_info({{0x1000, 0x2000}}, {{0x9000, 64, 4}}), Errc::kParse},
      {"a huge table", plan_info({{0x1000, 0x2000}}, {{0x9000, 1u << 20, 64}}), Errc::kParse},
  };
  for (const auto& r : rows) {
    auto plan = unload_plan(r.info);
    ASSERT_FALSE(plan.ok()) << r.what;
    EXPECT_EQ(plan.error().code(), r.code) << r.what << ": " << plan.error().to_string();
  }
}

TEST(Judge, EveryThreadOutsideAndNoneCountedIsProven) {
  UnloadPlan plan;
  plan.code = {{0x1000, 0x2000}, {0x5000, 0x6000}};
  struct Row {
    const char* what;
    std::vector<std::pair<pid_t, uint64_t>> pcs;
    std::vector<long> inside;
    bool proven;
    const char* names;  // what the reason must name ("" when proven)
  };
  const Row rows[] = {
      {"all outside, none counted", {{10, 0x900}, {11, 0x2000}, {12, 0x4fff}}, {0, 0, 0}, true, ""},
      {"no threads at all", {}, {}, true, ""},
      {"one at the first byte of a range", {{10, 0x900}, {11, 0x1000}}, {0}, false, "thread 11"},
      {"one at the last byte of a range", {{12, 0x5fff}}, {0}, false, "pc 0x5fff"},
      {"one counted in (a call out of a wrapper)", {{10, 0x900}}, {0, 1, 0}, false, "1 thread(s)"},
      // A stripe shared by two threads: one counted in on it, the other's
      // decrement seen first. The sum is what counts.
      {"stripes that cancel out", {{10, 0x900}}, {-1, 1}, true, ""},
      {"two counted on two stripes", {{10, 0x900}}, {1, 0, 1}, false, "2 thread(s)"},
  };
  for (const auto& r : rows) {
    auto c = judge(plan, r.pcs, r.inside);
    EXPECT_EQ(c.proven, r.proven) << r.what << ": " << c.why;
    EXPECT_NE(c.why.find(r.names), std::string::npos) << r.what << ": " << c.why;
    if (r.proven) {
      EXPECT_TRUE(c.why.empty()) << r.what;
    }
    EXPECT_EQ(c.threads, r.pcs.size()) << r.what;
  }
}

}  // namespace
}  // namespace remora::attach::detail
