// The unload's proof, its pure half (quiesce.h): the plan the agent
// publishes, read and checked; stopped threads judged from their program
// counters and the tools' counts. Tables, no process.
#include "attach/quiesce.h"

#include <gtest/gtest.h>

#include <array>
#include <utility>
#include <vector>

#include "arch/arch.h"

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
  info.unload_fork[0] = 0xd3e80;
  info.unload_fork[1] = 0xd4324;
  info.unload_atfork[0] = 0xd4430;
  info.unload_atfork[1] = 0xd45d2;
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
  EXPECT_EQ(plan->fork.start, 0xd3e80u);
  EXPECT_EQ(plan->fork.end, 0xd4324u);
  EXPECT_EQ(plan->atfork.start, 0xd4430u);
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
  remora_agent_info no_fork = plan_info({{0x1000, 0x2000}}, {});
  no_fork.unload_fork[1] = no_fork.unload_fork[0];
  remora_agent_info no_atfork = plan_info({{0x1000, 0x2000}}, {});
  no_atfork.unload_atfork[1] = 0;
  const Row rows[] = {
      {"no fork() range", no_fork, Errc::kParse},
      {"no __register_atfork range", no_atfork, Errc::kParse},
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
    std::vector<ThreadLook> threads;
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
      // Inside fork() matters to the first look only: by the second, no
      // fork handler of ours is registered.
      {"one inside fork()", {{10, 0x900}, {13, 0x7000, true}}, {0}, true, ""},
  };
  for (const auto& r : rows) {
    auto c = judge(plan, r.threads, r.inside);
    EXPECT_EQ(c.proven, r.proven) << r.what << ": " << c.why;
    EXPECT_NE(c.why.find(r.names), std::string::npos) << r.what << ": " << c.why;
    if (r.proven) {
      EXPECT_TRUE(c.why.empty()) << r.what;
    }
    EXPECT_EQ(c.threads, r.threads.size()) << r.what;
  }
}

TEST(JudgeForks, NoThreadInsideForkIsProven) {
  const std::vector<ThreadLook> none = {{10, 0x1000}, {11, 0x2000}};
  EXPECT_TRUE(judge_forks(none).proven);
  EXPECT_TRUE(judge_forks({}).proven);
  const std::vector<ThreadLook> one = {{10, 0x1000}, {12, 0x1000, true}, {13, 0x1000, true}};
  auto v = judge_forks(one);
  EXPECT_FALSE(v.proven);
  EXPECT_NE(v.why.find("thread 12 is inside fork()"), std::string::npos) << v.why;
  EXPECT_EQ(v.threads, 3u);
}

// A return address into fork() is any word past its entry up to its end
// (a call's return address can be the function's last byte + 1 only when
// the call is its last instruction: fork() ends with a return).
TEST(ForkScan, ReturnAddressesIntoForkAreFound) {
  const UnloadPlan::Range fork{0x1000, 0x1400};
  struct Row {
    const char* what;
    std::vector<uint64_t> stack;
    bool found;
  };
  const Row rows[] = {
      {"empty stack", {}, false},
      {"the entry itself is no return address", {0x1000}, false},
      {"one past the entry", {0x42, 0x1001}, true},
      {"the call before the end", {0x1400}, true},
      {"past the end", {0x1401, 0xfff}, false},
      {"deep in the window", {1, 2, 3, 4, 5, 6, 7, 0x13a0}, true},
  };
  for (const auto& r : rows) EXPECT_EQ(holds_return_into(r.stack, fork), r.found) << r.what;
}

// A return address signed by pointer authentication (aarch64 code built with
// branch protection) carries its code in the bits above the virtual address
// (NT_ARM_PAC_MASK's insn_mask, 48-bit addresses here): found once they
// are cleared, and only then. On x86_64 the mask is 0, and nothing changes.
TEST(ForkScan, SignedReturnAddressesAreFoundOnceTheirCodeIsCleared) {
  const UnloadPlan::Range fork{0xffff80001000, 0xffff80001400};
  const uint64_t mask = 0xff7f000000000000;  // bits 48..63, but bit 55 (which selects the address space half)
  struct Row {
    const char* what;
    uint64_t word, mask;
    bool found;
  };
  const Row rows[] = {
      {"plain", 0xffff80001100, 0, true},
      {"signed, no mask known", 0x002fffff80001100 | 0xffff80001100, 0, false},
      {"signed, mask applied", 0x3a2b000000000000 | 0xffff80001100, mask, true},
      {"signed entry is no return address", 0x3a2b000000000000 | 0xffff80001000, mask, false},
      {"signed, outside once cleared", 0x3a2b000000000000 | 0xffff80002000, mask, false},
  };
  for (const auto& r : rows) {
    const std::vector<uint64_t> words{r.word};
    EXPECT_EQ(holds_return_into(words, fork, r.mask), r.found) << r.what;
  }
}

// The link register is looked at as a stack word is: glibc's _Fork is a leaf
// on aarch64, and a thread stopped in its clone call has fork() in x30 only.
TEST(ForkScan, TheLinkRegisterIsAReturnAddress) {
  arch::HostRegs r{};
  arch::set_return_address(r, 0x1234);
  if (arch::kReturnAddressInRegister)
    EXPECT_EQ(arch::link_register(r), 0x1234u);
  else
    EXPECT_EQ(arch::link_register(r), 0u) << "a call pushes every return address here: no link register";
}

}  // namespace
}  // namespace remora::attach::detail
