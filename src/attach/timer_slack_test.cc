// The controller thread's timer slack (attach/internal.h, ScopedTimerSlack):
// 1 ns while a Controller call waits, the caller's own value again once it
// returns, on the caller's thread only.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "attach/attach.h"
#include "attach/internal.h"

namespace remora::attach {
namespace {

long slack() { return ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0); }

// Sets this thread's slack for the test and puts the old one back.
class CallerSlack {
 public:
  explicit CallerSlack(unsigned long ns) : saved_(slack()) { ::prctl(PR_SET_TIMERSLACK, ns, 0, 0, 0); }
  ~CallerSlack() { ::prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(saved_), 0, 0, 0); }

 private:
  long saved_;
};

// A forked copy of this process blocked in read(2) on a pipe: it says
// "ready" on another pipe first, and dies with the test (the pipe's EOF,
// PR_SET_PDEATHSIG, and SIGKILL from the destructor).
class Target {
 public:
  Target() {
    int ready[2], hold[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(hold, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(ready[0]);
      ::close(hold[1]);
      char b = 'r';
      if (::write(ready[1], &b, 1) != 1) _exit(1);
      (void)!::read(hold[0], &b, 1);
      _exit(0);
    }
    ::close(ready[1]);
    ::close(hold[0]);
    hold_ = hold[1];
    char b = 0;
    ready_ = pid_ > 0 && ::read(ready[0], &b, 1) == 1;  // EOF if the child died: no hang
    ::close(ready[0]);
  }
  ~Target() {
    if (hold_ >= 0) ::close(hold_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  bool ready() const { return ready_; }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
  bool ready_ = false;
};

AttachOptions options() {
  AttachOptions o;
  o.agent_path = REMORA_AGENT_BUILT;
  o.tools = {REMORA_HOOK_TOOL_A};
  o.timeout = std::chrono::milliseconds(10000);
  return o;
}

TEST(TimerSlack, OneNanosecondInsideThenTheCallersAgain) {
  CallerSlack caller(70'000);
  ASSERT_EQ(slack(), 70'000);
  {
    detail::ScopedTimerSlack outer;
    EXPECT_EQ(slack(), 1);
    long in_thread = 0;
    std::thread([&] { in_thread = slack(); }).join();
    EXPECT_EQ(in_thread, 1) << "a worker started inside inherits it";
    {
      detail::ScopedTimerSlack inner;  // nested (attach_tree calls what attach calls)
      EXPECT_EQ(slack(), 1);
    }
    EXPECT_EQ(slack(), 1);
  }
  EXPECT_EQ(slack(), 70'000);
}

TEST(TimerSlack, AttachAndDetachLeaveTheCallersThreadAsItWas) {
  CallerSlack caller(70'000);
  Target t;
  ASSERT_TRUE(t.ready());
  Controller c;
  auto r = c.attach(t.pid(), options());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->agent_loaded_now);
  EXPECT_EQ(slack(), 70'000);
  auto d = c.detach(t.pid());
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(slack(), 70'000);
  // A failing call puts it back too.
  auto again = c.detach(t.pid());
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(slack(), 70'000);
}

TEST(TimerSlack, TreeAttachLeavesTheCallersThreadAsItWas) {
  CallerSlack caller(70'000);
  Target t;
  ASSERT_TRUE(t.ready());
  Controller c;
  auto r = c.attach_tree(t.pid(), options());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_TRUE(r->front().ok) << r->front().message;
  EXPECT_EQ(slack(), 70'000);
  auto d = c.detach_tree(t.pid());
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(slack(), 70'000);
}

}  // namespace
}  // namespace remora::attach
