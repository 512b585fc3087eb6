// Table tests of the controller's side of the socket channel
// (attach/channel.h), for both architectures on any host: the endpoint
// parser and the choice of the thread the wake goes to. The agent's wake
// rules are tested in src/arch/wake_rules_test.cc.
#include "attach/channel.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace remora::attach::channel {
namespace {

constexpr uint64_t kFutexPrivate = 128;

// ---- parse_endpoint ----

TEST(ParseEndpoint, ThisProcesssName) {
  auto ep = parse_endpoint("@remora-agent.123.60", 123);
  ASSERT_TRUE(ep.has_value());
  EXPECT_EQ(ep->name, "remora-agent.123.60");
  EXPECT_EQ(ep->nspid, 123);
  EXPECT_EQ(ep->signo, 60);
  auto low = parse_endpoint("@remora-agent.7.32", 7);
  ASSERT_TRUE(low.has_value());
  EXPECT_EQ(low->signo, 32);
  auto high = parse_endpoint("@remora-agent.4194304.64", 4194304);
  ASSERT_TRUE(high.has_value());
  EXPECT_EQ(high->signo, 64);
}

TEST(ParseEndpoint, AnythingElse) {
  struct Case {
    const char* path;
    pid_t pid;
  };
  const Case cases[] = {
      {"@remora-agent.124.60", 123},  // another process
      {"@remora-agent.12.60", 123},
      {"@remora-agent.1234.60", 123},
      {"remora-agent.123.60", 123},  // not abstract
      {"/tmp/remora-agent.123.60", 123},
      {"@remora-agent.123.31", 123},  // not a real-time signal
      {"@remora-agent.123.65", 123},
      {"@remora-agent.123.0", 123},
      {"@remora-agent.123.-60", 123},
      {"@remora-agent.123.60x", 123},  // trailing junk
      {"@remora-agent.123.60.1", 123},
      {"@remora-agent.123.60 ", 123},
      {"@remora-agent.123x.60", 123},
      {"@remora-agent.123", 123},  // no signal
      {"@remora-agent.123.", 123},
      {"@remora-agent..60", 123},
      {"@remora-agent.+123.60", 123},
      {"@remora-agent.", 123},
      {"@remora-agent", 123},
      {"@remora-agentx123.60", 123},
      {"@other-agent.123.60", 123},
      {"@", 123},
      {"", 123},
  };
  for (const Case& c : cases) EXPECT_FALSE(parse_endpoint(c.path, c.pid).has_value()) << c.path;
}

// ---- choose_wake_thread ----

ThreadView thread(pid_t tid, char state) {
  ThreadView t;
  t.tid = tid;
  t.state = state;
  t.is_main = tid == 100;
  return t;
}

ThreadView in_call(pid_t tid, long nr, uint64_t arg1 = 0, uint64_t arg3 = 0) {
  ThreadView t = thread(tid, 'S');
  t.syscall_known = true;
  t.nr = nr;
  t.args[1] = arg1;
  t.args[3] = arg3;
  return t;
}

struct Numbers {
  bool x86;
  long read, futex, epoll, nanosleep;
};
constexpr Numbers kX86{true, 0, 202, 232, 230};
constexpr Numbers kA64{false, 63, 98, 22, 115};

class ChooseWakeThread : public ::testing::TestWithParam<Numbers> {};

TEST_P(ChooseWakeThread, BestFirst) {
  const Numbers n = GetParam();
  const ThreadView restartable = in_call(105, n.read);
  const ThreadView running = thread(104, 'R');
  const ThreadView sleeping_worker = thread(103, 'S');
  const ThreadView sleeping_main = thread(100, 'S');
  const ThreadView in_epoll = in_call(102, n.epoll);
  // Each rank beats every one below it, whatever the order listed.
  const std::vector<ThreadView> ranked = {restartable, running, sleeping_worker, sleeping_main, in_epoll};
  for (size_t best = 0; best < ranked.size(); ++best) {
    std::vector<ThreadView> rest(ranked.begin() + static_cast<long>(best), ranked.end());
    EXPECT_EQ(choose_wake_thread(rest, n.x86), ranked[best].tid) << "rank " << best;
    std::vector<ThreadView> reversed(rest.rbegin(), rest.rend());
    EXPECT_EQ(choose_wake_thread(reversed, n.x86), ranked[best].tid) << "rank " << best << ", reversed";
  }
}

TEST_P(ChooseWakeThread, FutexWaitCountsOnlyWithoutATimeout) {
  const Numbers n = GetParam();
  const std::vector<ThreadView> untimed = {thread(104, 'R'), in_call(105, n.futex, kFutexPrivate, 0)};
  EXPECT_EQ(choose_wake_thread(untimed, n.x86), 105);
  const std::vector<ThreadView> timed = {in_call(105, n.futex, kFutexPrivate, 0x7ffd0000), thread(104, 'R')};
  EXPECT_EQ(choose_wake_thread(timed, n.x86), 104);
  // A wait for a glibc lock (the word holds 2) may hold another lock: a
  // running thread comes first.
  ThreadView lock_wait = in_call(105, n.futex, kFutexPrivate, 0);
  lock_wait.args[2] = 2;
  const std::vector<ThreadView> on_lock = {lock_wait, thread(104, 'R')};
  EXPECT_EQ(choose_wake_thread(on_lock, n.x86), 104);
  const std::vector<ThreadView> bitset = {thread(100, 'S'), in_call(105, n.futex, 9 | kFutexPrivate, 0)};
  EXPECT_EQ(choose_wake_thread(bitset, n.x86), 105);
  const std::vector<ThreadView> only_timed = {in_call(105, n.futex, 0, 0x7ffd0000)};
  EXPECT_EQ(choose_wake_thread(only_timed, n.x86), 105) << "a known wait is still better than none";
}

TEST_P(ChooseWakeThread, NeverTheseThreads) {
  const Numbers n = GetParam();
  for (char state : {'D', 'T', 't', 'Z', 'X'}) {
    std::vector<ThreadView> one = {in_call(105, n.read)};
    one[0].state = state;
    EXPECT_EQ(choose_wake_thread(one, n.x86), 0) << state;
    one.push_back(in_call(106, n.nanosleep));
    EXPECT_EQ(choose_wake_thread(one, n.x86), 106) << state;
  }
  ThreadView blocking = in_call(105, n.read);
  blocking.blocks_signal = true;
  ThreadView running_blocking = thread(104, 'R');
  running_blocking.blocks_signal = true;
  ThreadView channel = thread(107, 'S');
  channel.channel_thread = true;
  ThreadView channel_running = thread(108, 'R');
  channel_running.channel_thread = true;
  std::vector<ThreadView> none = {blocking, running_blocking, channel, channel_running};
  EXPECT_EQ(choose_wake_thread(none, n.x86), 0);
  none.push_back(in_call(100, n.epoll));
  EXPECT_EQ(choose_wake_thread(none, n.x86), 100);
  EXPECT_EQ(choose_wake_thread({}, n.x86), 0);
}

TEST_P(ChooseWakeThread, SyscallFileSaysRunning) {
  const Numbers n = GetParam();
  ThreadView t = in_call(105, n.read);
  t.running = true;  // stat said S, the syscall file a moment later "running"
  const std::vector<ThreadView> threads = {t, thread(100, 'S')};
  EXPECT_EQ(choose_wake_thread(threads, n.x86), 100);
}

INSTANTIATE_TEST_SUITE_P(Arch, ChooseWakeThread, ::testing::Values(kX86, kA64),
                         [](const ::testing::TestParamInfo<Numbers>& i) {
                           return i.param.x86 ? std::string("x86_64") : std::string("aarch64");
                         });

TEST(ChooseWakeThreadNumbers, TheArchitecturesNumbersDecide) {
  // x86_64's read (0) is io_setup on aarch64; aarch64's read (63) is uname
  // on x86_64: restartable on one, a known other call on the other.
  const std::vector<ThreadView> x86_read = {thread(100, 'S'), in_call(105, 0)};
  EXPECT_EQ(choose_wake_thread(x86_read, true), 105);
  EXPECT_EQ(choose_wake_thread(x86_read, false), 100);
  const std::vector<ThreadView> a64_read = {thread(100, 'S'), in_call(105, 63)};
  EXPECT_EQ(choose_wake_thread(a64_read, false), 105);
  EXPECT_EQ(choose_wake_thread(a64_read, true), 100);
}

}  // namespace
}  // namespace remora::attach::channel
