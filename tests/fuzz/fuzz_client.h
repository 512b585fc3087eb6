// The fuzzer's side of a connection to the socket channel, with raw
// sockets (no controller code between the bytes and the agent), and the
// target program it talks to.
#pragma once

#include <sys/types.h>

#include <string>

#include "agent/channel_wire.h"
#include "attach/channel.h"
#include "base/deadline.h"
#include "base/unique_fd.h"
#include "fuzz_wire.h"

namespace remora::fuzz {

// The target program (fuzz_target.c), started with `agent` preloaded and
// the socket channel opted in (REMORA_TOOL_ATTACH=1). The destructor kills
// and reaps it whatever happened; it also dies with this thread
// (PR_SET_PDEATHSIG).
class Target {
 public:
  Target(const std::string& program, const std::string& agent);
  ~Target();
  Target(const Target&) = delete;
  Target& operator=(const Target&) = delete;

  // It said "ready" before its deadline (else error() says why).
  bool ready() const { return reader_tid_ > 0; }
  const std::string& error() const { return error_; }
  pid_t pid() const { return pid_; }
  pid_t reader_tid() const { return reader_tid_; }
  // Still running (reaps it when it has exited).
  bool alive();
  // How it ended ("running" while it runs).
  std::string how_it_ended() const;
  void close_stdin() { stdin_.reset(); }
  // Waits for its exit; true when it exited before the deadline.
  bool wait_exit(Deadline d);
  int exit_status() const { return status_; }
  // Everything it printed on stdout, up to its EOF or the deadline.
  std::string read_stdout(Deadline d);

 private:
  pid_t pid_ = -1;
  pid_t reader_tid_ = 0;
  bool reaped_ = false;
  int status_ = 0;
  UniqueFd stdin_, stdout_, pidfd_;
  std::string error_;
};

// What came back on one connection.
struct Outcome {
  bool connected = false;
  size_t got = 0;       // bytes of the reply
  size_t extra = 0;     // bytes after it (none expected)
  bool closed = false;  // the agent closed the connection (EOF, or a reset after its reply)
  remora_channel_reply reply{};
};

// Connections to one process's channel. Before it waits for a reply it
// makes sure the channel thread runs: when /proc shows none, it sends the
// wake signal itself (tgkill), to the main thread mostly, sometimes to the
// target's reader thread (a read(2) the kernel restarts).
class RawClient {
 public:
  RawClient(pid_t pid, pid_t reader_tid, attach::channel::Endpoint ep);

  // Connects and sends `w` (its descriptors made here and closed once
  // sent); shuts the write side when w.finish. Invalid: no connection.
  UniqueFd open(const Wire& w);
  // Reads the reply on `sock` until the agent closes it or the deadline.
  Outcome finish(int sock, Deadline d);
  // open, then finish (an abandoned wire: closed at once, nothing read).
  Outcome exchange(const Wire& w, Deadline d);

  bool channel_running() const;
  // Waits until the channel thread has left (idle), so that the next
  // connection needs a wake; false at the deadline.
  bool wait_channel_gone(Deadline d) const;
  // Sends the wake signal (tgkill), whether or not the thread runs.
  void wake();
  int wakes() const { return wakes_; }

 private:
  bool send_all(int sock, const std::string& bytes, const std::vector<int>& fds);

  pid_t pid_;
  pid_t reader_tid_;
  attach::channel::Endpoint ep_;
  UniqueFd devnull_;
  int wakes_ = 0;
};

// The descriptors process `pid` holds (/proc/PID/fd), -1 when unreadable.
int count_fds(pid_t pid);

}  // namespace remora::fuzz
