// remora_test_harness: support for the remote-engine and attach tests.
//
//  * Spawned: a child process with pipes to its stdin and from its stdout,
//    in its own process group, killed (whole group) and reaped by the
//    destructor, so a failing test leaves nothing behind. The child also gets
//    PR_SET_PDEATHSIG(SIGKILL): if the test binary dies (ctest timeout, crash)
//    the child dies with it. Note that PDEATHSIG follows the *thread* that
//    spawned the child: spawn from the test's main thread.
//  * TargetProcess: a Spawned target program speaking the line protocol of
//    tests/targets/target_common.h.
//  * /proc helpers, wait_for, a signal storm, a per-test watchdog and a
//    GoogleTest fixture that starts it.
//
// Harness functions throw HarnessError on timeouts and protocol errors: a
// test fails with the message (GoogleTest reports uncaught exceptions) and
// the destructors still clean up. The library itself never uses exceptions;
// tests may, because unwinding is what guarantees the clean-up here.
//
// Never call waitpid on a target while a remote::Target may hold one of its
// threads: the test process is the target's parent *and* its tracer, and a
// waitpid here could consume a ptrace stop meant for the engine. Use alive()
// (which reads /proc) instead; wait_exit() only once no call is in flight.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace remora::test {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// How much slower than the machine the tests' limits were written for this
// one is: REMORA_TEST_TIME_SCALE, a factor >= 1 (1 when unset or invalid).
// The aarch64 guest's init measures it (tests/aarch64/guest_init.c: a
// calibration run there against the same run on the host that boots it) and
// sets it for every suite, so that an emulator's slowness stretches every
// deadline instead of failing a test. Read once.
double time_scale();
// `d` stretched by time_scale().
std::chrono::milliseconds scaled(std::chrono::milliseconds d);
// Every deadline of the tests: `d` from now, scaled (time_scale()).
inline Deadline after(std::chrono::milliseconds d) { return Clock::now() + scaled(d); }

class HarnessError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Path of a program built into the build's bin directory (REMORA_TEST_BIN_DIR).
std::string bin_path(std::string_view name);

// ---------------------------------------------------------------------------
// Child processes.

class Spawned {
 public:
  // Starts argv[0] (a path) with argv. Throws HarnessError if exec fails.
  static std::unique_ptr<Spawned> start(const std::vector<std::string>& argv);
  ~Spawned();  // kill_group(SIGKILL) and reap, unless already reaped
  Spawned(const Spawned&) = delete;
  Spawned& operator=(const Spawned&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // One line from the child's stdout, without the newline. nullopt on
  // timeout or EOF; `why` (if given) says which.
  std::optional<std::string> try_wait_line(Deadline deadline, std::string* why = nullptr);
  // As try_wait_line, but throws HarnessError naming the child and what was
  // awaited on timeout or EOF.
  std::string wait_line(Deadline deadline, std::string_view waiting_for = "a line");
  // Writes `line` and a newline to the child's stdin. Throws on error.
  void send(std::string_view line);
  // Closes the child's stdin (the targets exit on EOF).
  void close_stdin();

  void kill(int sig = SIGKILL);        // the process only
  void kill_group(int sig = SIGKILL);  // its whole process group
  // Reaps the child. Returns its wait status, or nullopt if it did not exit
  // by the deadline. Throws if it was already reaped by someone else
  // (ECHILD) unless `echild_ok`, in which case that also returns nullopt and
  // sets *was_echild.
  std::optional<int> wait_exit(Deadline deadline, bool echild_ok = false, bool* was_echild = nullptr);
  bool reaped() const { return reaped_; }

 private:
  Spawned() = default;
  pid_t pid_ = -1;
  std::string name_;
  int in_fd_ = -1;   // child's stdin
  int out_fd_ = -1;  // child's stdout
  std::string buf_;
  bool reaped_ = false;
};

// A parsed "report" line (see target_common.h).
struct Report {
  std::string raw;
  std::map<std::string, long long> fields;  // every key=value before "detail:"
  std::string detail;

  long long get(const std::string& key) const;  // throws if absent
  long long anomalies() const { return get("anomalies"); }
  long long fds_delta() const { return get("fds_delta"); }
  long long maps_delta() const { return get("maps_delta"); }
  long long calls() const { return get("calls"); }
  long long strings() const { return get("strings"); }
};
Report parse_report(std::string_view line);
// key=value fields of any line ("usr1=3 rt=7").
std::map<std::string, long long> parse_fields(std::string_view line);

class TargetProcess {
 public:
  // Starts bin_path(program) and waits (10 s) for "ready <pid>".
  explicit TargetProcess(const std::string& program, std::vector<std::string> args = {});
  ~TargetProcess();  // best-effort "quit", then Spawned's clean-up

  pid_t pid() const { return proc_->pid(); }
  Spawned& process() { return *proc_; }

  // Sends `cmd`, returns the reply line (deadline 30 s).
  std::string command(std::string_view cmd);
  void snapshot();                      // expects "ok"
  Report report();                      // "report", parsed
  std::map<std::string, pid_t> tids();  // role -> tid ("main" included)

 private:
  std::unique_ptr<Spawned> proc_;
};

// ---------------------------------------------------------------------------
// /proc helpers (for any pid, not only our children).

int count_fds(pid_t pid);   // entries of /proc/PID/fd; -1 on error
int count_maps(pid_t pid);  // lines of /proc/PID/maps; -1 on error
// State letter from /proc/PID/stat ('R', 'S', 'T', 'Z', ...); 0 if gone.
char process_state(pid_t pid);
// State letter of every thread, from /proc/PID/task/TID/stat.
std::map<pid_t, char> task_states(pid_t pid);
// Exists and is neither a zombie nor dead.
bool alive(pid_t pid);
// "State:" value of /proc/PID/status ("T (stopped)"), empty if gone.
std::string status_state(pid_t pid);
// A kernel thread's pid: 2 if it is kthreadd, else the first pid whose stat
// flags carry PF_KTHREAD; nullopt if none is visible (a pid namespace).
std::optional<pid_t> find_kernel_thread();
// Every thread's comm, state, wchan, syscall and kernel stack (when readable).
std::string describe_tasks(pid_t pid);

// Polls `pred` every millisecond until it holds or the deadline passes.
bool wait_for(const std::function<bool()>& pred, Deadline deadline);

// ---------------------------------------------------------------------------
// Signal storm: a thread of the test process that sends SIGUSR1, SIGUSR2
// (kill) and SIGRTMIN (sigqueue, value = sequence number) to `pid` until
// stopped or `max_rt` real-time signals went out. It counts only signals
// that the kernel accepted.
class SignalStorm {
 public:
  SignalStorm(pid_t pid, long max_rt = 20000);
  ~SignalStorm();  // stop()
  void stop();
  long usr1_sent() const { return usr1_.load(); }
  long usr2_sent() const { return usr2_.load(); }
  long rt_sent() const { return rt_.load(); }
  long long rt_sum() const { return rt_sum_.load(); }
  long errors() const { return errors_.load(); }

 private:
  void run(pid_t pid, long max_rt);
  std::atomic<bool> stop_{false};
  std::atomic<long> usr1_{0}, usr2_{0}, rt_{0}, errors_{0};
  std::atomic<long long> rt_sum_{0};
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// Watchdog: reports a hang, not a slow machine. If `limit` (scaled by
// time_scale()) passes with no progress, it prints the stacks (wchan,
// syscall, /proc stack) of every live Spawned child and of the test process
// to stderr, SIGKILLs every Spawned process group, and aborts. Progress is
// note_progress(): a test that repeats a step (load/unload cycles) calls it
// after each one, and then the limit bounds one step, not all of them; a
// test that never calls it gets `limit` for the whole of it.
class Watchdog {
 public:
  Watchdog(std::chrono::seconds limit, std::string what);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// One step of the running test is done: every live Watchdog's limit counts
// again from now. Any thread may call it.
void note_progress();

// Fixture: a watchdog per test (watchdog_seconds(), 60 s unless a fixture
// says otherwise; REMORA_TEST_WATCHDOG_S overrides; either is scaled by
// time_scale()) and SIGPIPE ignored (a dead target must not kill the test).
// Keep the ctest TIMEOUT above it, so the watchdog's stack dump is what a
// hung test leaves behind.
class IntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  virtual long watchdog_seconds() const { return 60; }

 private:
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace remora::test
