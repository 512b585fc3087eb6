// The front of `remora attach|detach|status --slurm` (slurm_front.h): one
// srun per node of the job (`--overlap`, one task, the job's own
// credentials), each running `remora slurm-node`; their events arrive on
// srun's standard output (the wire of slurm_job.h) and are shown per node
// and rank as they come. A node that fails is reported and the rest goes
// on; the exit code then says the job was reached in part.
#include "cli/slurm_front.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/renderer.h"
#include "cli/session_args.h"
#include "cli/session_support.h"
#include "cli/slurm_job.h"
#include "cli/slurm_support.h"
#include "profile/job.h"

namespace remora::cli::slurm {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int kClockPings = 5;  // per measurement; the shortest round trip wins

// One process the node side reported.
struct RankRecord {
  std::string node;
  pid_t pid = 0, root = 0;
  int rank = -1, local_rank = -1;
  std::string step, comm, result, end, detach, dir;
  bool ok = false, gone = false, signaled = false;
  int code = 0;
};

// One node: its srun, the events read so far, where it stands.
struct Link {
  enum class State { kStarting, kClock, kWorking, kAttached, kDetachClock, kDetaching, kDone, kFailed };
  std::string node;
  Child srun;
  EventReader reader;
  std::string err_tail;  // the last line of srun's (and the node side's) standard error
  std::string err_partial;
  State state = State::kStarting;
  std::string failure, transport;
  std::vector<ClockSample> attach_clock, detach_clock;
  uint64_t ping_sent = 0;
  int pings = 0;
  std::chrono::steady_clock::time_point last_heard;
  std::optional<int> srun_status;
  bool out_open = true, err_open = true;

  bool finished() const { return state == State::kDone || state == State::kFailed; }
  bool waiting_for_answer() const { return state != State::kAttached && !finished(); }
};

struct Front {
  FrontOptions o;
  JobSpec spec;
  JobInfo info;
  std::string job_dir;  // "" when no output is collected
  std::vector<Link> links;
  std::vector<RankRecord> ranks;
  std::vector<std::string> warnings;
  uint64_t window_start_ns = 0, window_end_ns = 0;
};

std::string trimmed(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The job as scontrol knows it; refuses what remora must not touch.
Result<JobInfo> resolve_job(const JobSpec& spec) {
  auto r = run_capture({"scontrol", "show", "job", "-o", spec.job}, 30s);
  if (!r) return std::move(r).error().with_context("ask Slurm about job " + spec.job);
  auto info = parse_show_job(r->out + r->err, spec.job);
  if (!info) {
    if (info.error().code() == Errc::kParse && !trimmed(r->err).empty())
      return Error(Errc::kNoSuchProcess, "scontrol show job " + spec.job + ": " + trimmed(r->err));
    return std::move(info).error();
  }
  if (info->state != "RUNNING")
    return Error(Errc::kNoSuchProcess, "job " + spec.job + " is " + info->state +
                                           ", not RUNNING: no rank of it runs now (squeue -j " + spec.job +
                                           ")");
  const uid_t me = ::getuid();
  if (me != 0 && info->uid != me)
    return Error(Errc::kPtraceDenied,
                 "job " + spec.job + " belongs to " + info->user + " (uid " + std::to_string(info->uid) +
                     "), and remora runs as uid " + std::to_string(me) +
                     ": only the job's owner or root may attach to its ranks (run remora as " + info->user +
                     ")");
  return info;
}

Result<std::vector<std::string>> job_nodes(const JobInfo& info) {
  if (info.node_list.empty()) return Error(Errc::kNoSuchProcess, "job " + info.id + " has no nodes yet");
  // The hostlist syntax remora reads itself spares a Slurm call; scontrol
  // expands what it does not read.
  if (auto nodes = expand_node_list(info.node_list)) return nodes;
  auto r = run_capture({"scontrol", "show", "hostnames", info.node_list}, 30s);
  if (r && WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start < r->out.size()) {
      size_t nl = r->out.find('\n', start);
      if (nl == std::string::npos) nl = r->out.size();
      if (auto n = trimmed(r->out.substr(start, nl - start)); !n.empty()) out.push_back(n);
      start = nl + 1;
    }
    if (!out.empty()) return out;
  }
  return expand_node_list(info.node_list);
}

std::string random_token() {
  unsigned char b[16] = {};
  std::ifstream("/dev/urandom", std::ios::binary).read(reinterpret_cast<char*>(b), sizeof b);
  static const char* hex = "0123456789abcdef";
  std::string t;
  for (unsigned char c : b) {
    t += hex[c >> 4];
    t += hex[c & 15];
  }
  return t;
}

std::string output_root(const std::string& output) {
  if (!output.empty()) return absolute_path(output, std::filesystem::current_path().string());
  if (const char* p = std::getenv("REMORA_OUTPUT_PATH"); p && *p)
    return absolute_path(p, std::filesystem::current_path().string());
  return std::filesystem::current_path().string() + "/remora-output";
}

// A new job directory "slurm-JOB[.STEP]-YYYYmmdd-HHMMSS" under the output
// root, with the token that tells a node it sees this very directory.
Result<std::string> make_job_dir(const JobSpec& spec, const std::string& output, std::string* token) {
  const std::string root = output_root(output);
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec)
    return Error(Errc::kIo, "cannot create the output directory " + root + ": " + ec.message() +
                                " (set REMORA_OUTPUT_PATH to a writable directory)");
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string dir = root + "/slurm-" + spec.text() + "-" + stamp;
  for (int n = 2; ::mkdir(dir.c_str(), 0755) != 0; ++n) {
    if (errno != EEXIST || n > 100) return Error::from_errno("mkdir " + dir);
    dir = root + "/slurm-" + spec.text() + "-" + stamp + "-" + std::to_string(n);
  }
  *token = random_token();
  std::ofstream(dir + "/.remora-token") << *token;
  return dir;
}

// The newest job directory of `spec` under the output root (remora detach
// --slurm after attach --keep), with its token.
std::string find_job_dir(const JobSpec& spec, const std::string& output, std::string* token) {
  std::string best;
  std::error_code ec;
  const std::string prefix = "slurm-" + spec.text() + "-";
  for (const auto& e : std::filesystem::directory_iterator(output_root(output), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && e.path().string() > best) best = e.path().string();
  }
  if (!best.empty()) std::getline(std::ifstream(best + "/.remora-token"), *token);
  return best;
}

std::string remora_exe() {
  if (const char* p = std::getenv("REMORA_SLURM_REMORA"); p && *p) return p;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "remora" : self.string();
}

std::vector<std::string> srun_argv(const Front& f, const std::string& node) {
  std::vector<std::string> a = {"srun",
                                "--jobid=" + f.o.node.job,
                                "--overlap",
                                "--nodes=1",
                                "--ntasks=1",
                                "--nodelist=" + node,
                                "--unbuffered",
                                "--quiet",
                                "--job-name=remora-" + f.o.node.op,
                                "--kill-on-bad-exit=0"};
  auto node_args = node_argv(remora_exe(), f.o.node);
  a.insert(a.end(), node_args.begin(), node_args.end());
  return a;
}

void send_line(Link& l, const std::string& line) {
  std::string s = line + "\n";
  if (l.srun.in && !write_all(l.srun.in.get(), s.data(), s.size())) l.srun.in.reset();
}

void fail_link(Link& l, const std::string& why) {
  if (l.finished()) return;
  l.state = Link::State::kFailed;
  l.failure = why;
  if (l.srun.pid > 0 && !l.srun_status) ::kill(l.srun.pid, SIGTERM);
}

void ping(Link& l) {
  l.ping_sent = mono_ns();
  send_line(l, "ping " + std::to_string(++l.pings));
}

RankRecord* record_of(Front& f, const std::string& node, pid_t pid) {
  for (auto& r : f.ranks)
    if (r.node == node && r.pid == pid) return &r;
  return nullptr;
}

std::string who(const RankRecord& r) {
  std::string s = r.rank >= 0 ? "rank " + std::to_string(r.rank) + " on " + r.node : r.node;
  return s + " (pid " + std::to_string(r.pid) + ", " + r.comm + ")";
}

// Five pings, the shortest round trip kept: for an attach once its ranks
// are attached (the node side then answers at once, and the attach did not
// wait for it), and before a detach.
void on_clock(Front& f, Link& l, const json& ev) {
  const uint64_t now = mono_ns();
  auto& samples = l.state == Link::State::kDetachClock ? l.detach_clock : l.attach_clock;
  samples.push_back(clock_sample(l.ping_sent, ev.value("mono_ns", uint64_t{0}), now));
  if (static_cast<int>(samples.size()) < kClockPings) return ping(l);
  if (l.state == Link::State::kDetachClock) {
    l.state = Link::State::kDetaching;
    send_line(l, "detach");
  } else if (f.o.node.op == "attach") {
    l.state = Link::State::kAttached;
  } else {
    l.state = Link::State::kWorking;
    send_line(l, f.o.node.op);
  }
}

void on_proc(Front& f, Link& l, const json& ev) {
  RankRecord r;
  r.node = l.node;
  r.pid = ev.value("pid", 0);
  r.root = ev.value("root", 0);
  r.rank = ev.value("rank", -1);
  r.local_rank = ev.value("local_rank", -1);
  r.step = ev.value("step", "");
  r.comm = ev.value("comm", "?");
  r.ok = ev.value("ok", false);
  r.gone = ev.value("gone", false);
  r.code = ev.value("code", 0);
  r.result = ev.value("result", "");
  std::printf("  %-10s %-5s %-8d %-16s %s\n", l.node.c_str(),
              r.rank >= 0 ? std::to_string(r.rank).c_str() : "-", static_cast<int>(r.pid), r.comm.c_str(),
              r.result.c_str());
  f.ranks.push_back(std::move(r));
}

void on_status(Front& f, Link& l, const json& ev) {
  const int rank = ev.value("rank", -1);
  RankRecord r;
  r.node = l.node;
  r.pid = ev.value("pid", 0);
  r.rank = rank;
  r.comm = ev.value("comm", "?");
  r.ok = !ev.contains("error");
  r.code = r.ok ? 0 : to_int(ExitCode::kNoTarget);
  f.ranks.push_back(r);
  std::string state;
  if (ev.contains("error")) {
    state = "error: " + ev.value("error", "");
  } else if (!ev.value("agent", false)) {
    state = "no agent";
  } else {
    state = ev.value("attached", false)
                ? "attached (" + ev.value("tools", "") + ", through " + ev.value("channel", "") + ")"
                : "agent loaded, not attached";
    if (ev.value("lease_expired", false))
      state += ", lease expired";
    else if (int holder = ev.value("lease_pid", 0))
      state += ", lease held by pid " + std::to_string(holder);
  }
  std::printf("  %-10s %-5s %-8d %-16s %s\n", l.node.c_str(), rank >= 0 ? std::to_string(rank).c_str() : "-",
              ev.value("pid", 0), ev.value("comm", "?").c_str(), state.c_str());
}

// A file of the node's outputs, through the stream: written under the job
// directory (never outside it, whatever the path says).
void on_file(Front& f, Link& l, const json& ev, const std::string& payload) {
  const std::string rel = ev.value("path", "");
  if (f.job_dir.empty() || !safe_relative_path(rel) || rel.rfind(l.node + "/", 0) != 0) {
    f.warnings.push_back(l.node + ": sent a file outside its directory (" + rel + "): dropped");
    return;
  }
  const std::filesystem::path path = std::filesystem::path(f.job_dir) / rel;
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary);
  out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  if (!out) f.warnings.push_back("cannot write " + path.string());
}

void on_event(Front& f, Link& l, const json& ev, const std::string& payload) {
  const std::string kind = ev.value("ev", "");
  l.last_heard = std::chrono::steady_clock::now();
  if (kind == "hello") {
    l.transport = ev.value("transport", "");
    if (f.o.node.op == "detach") {  // the node's clock first, then the word
      l.state = Link::State::kClock;
      ping(l);
    } else {  // an attach begins at once, a status only reads
      l.state = Link::State::kWorking;
    }
  } else if (kind == "pong") {
    on_clock(f, l, ev);
  } else if (kind == "proc") {
    on_proc(f, l, ev);
  } else if (kind == "attached") {
    if (l.state == Link::State::kWorking && f.o.node.keep) {
      l.state = Link::State::kAttached;  // the node side leaves now: no session to measure
    } else if (l.state == Link::State::kWorking) {
      l.state = Link::State::kClock;
      ping(l);
    }
  } else if (kind == "status") {
    on_status(f, l, ev);
  } else if (kind == "exit") {
    if (auto* r = record_of(f, l.node, ev.value("pid", 0))) {
      r->end = ev.value("how", "exited");
      r->signaled = ev.value("signaled", false);
      std::printf("  %s %s during the session\n", who(*r).c_str(), r->end.c_str());
    }
  } else if (kind == "detached") {
    RankRecord* r = record_of(f, l.node, ev.value("pid", 0));
    if (!r && f.o.node.op == "detach") {
      on_proc(f, l, ev);
      r = &f.ranks.back();
    }
    if (r) r->detach = ev.value("result", "");
  } else if (kind == "file") {
    on_file(f, l, ev, payload);
  } else if (kind == "output") {
    if (auto* r = record_of(f, l.node, ev.value("pid", 0))) r->dir = ev.value("dir", "");
    if (ev.contains("error")) f.warnings.push_back(l.node + ": " + ev.value("error", ""));
  } else if (kind == "error") {
    l.failure = ev.value("message", "failed");
  } else if (kind == "empty") {
    std::printf("  %-10s %-5s %-8s %-16s %s\n", l.node.c_str(), "-", "-", "-",
                ev.value("message", "").c_str());
  } else if (kind == "done") {
    l.state = l.failure.empty() ? Link::State::kDone : Link::State::kFailed;
  }
  std::fflush(stdout);
}

void read_link_output(Front& f, Link& l) {
  std::string buf;
  l.out_open = drain(l.srun.out.get(), buf);
  l.reader.feed(buf);
  while (auto e = l.reader.next()) {
    if (e->json.empty()) {  // srun's own words on the stream
      if (!e->payload.empty()) std::fprintf(stderr, "%s: %s\n", l.node.c_str(), e->payload.c_str());
      continue;
    }
    on_event(f, l, json::parse(e->json, nullptr, false), e->payload);
  }
}

void read_link_errors(Link& l) {
  std::string buf;
  l.err_open = drain(l.srun.err.get(), buf);
  l.err_partial += buf;
  size_t nl;
  while ((nl = l.err_partial.find('\n')) != std::string::npos) {
    std::string line = l.err_partial.substr(0, nl);
    l.err_partial.erase(0, nl + 1);
    std::fprintf(stderr, "%s: %s\n", l.node.c_str(), line.c_str());
    l.err_tail = line;
  }
}

// The srun of a link ended, or its stream did: what the node did not finish is a failure.
void check_link_end(Link& l) {
  if (!l.srun_status && l.srun.pid > 0) l.srun_status = try_reap(l.srun.pid);
  if (l.out_open || l.finished()) return;
  std::string why = "srun ended before the node side finished";
  if (l.srun_status) why += " (" + describe_exit_status(*l.srun_status) + ")";
  if (!l.err_tail.empty()) why += ": " + l.err_tail;
  fail_link(l, why);
}

// Reads every node until `done()` says so, a stop signal comes (returned),
// or an answer is overdue from a node (it is failed, the rest goes on).
std::optional<int> pump(Front& f, StopSignals* signals, const std::function<bool()>& done,
                        std::optional<std::chrono::steady_clock::time_point> until = std::nullopt) {
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (until && now >= *until) return std::nullopt;
    std::vector<pollfd> fds;
    std::vector<std::pair<Link*, bool>> who;  // (link, stdout?)
    for (auto& l : f.links) {
      // Starting and the clock: srun and the node side alone. Attaching or
      // detaching a rank may take its --timeout.
      const bool busy = l.state == Link::State::kWorking || l.state == Link::State::kDetaching;
      const auto quiet_limit = std::chrono::milliseconds(
          busy ? std::max(f.o.node_timeout_ms, f.o.node.timeout_ms + 5000) : f.o.node_timeout_ms);
      if (l.waiting_for_answer() && now - l.last_heard > quiet_limit)
        fail_link(l, "no answer from node " + l.node + " for " + std::to_string(quiet_limit.count() / 1000) +
                         " s (its slurmd may be down or stopped: scontrol show node " + l.node + ")" +
                         (l.err_tail.empty() ? "" : "; srun said: " + l.err_tail));
      if (l.out_open) {
        fds.push_back({l.srun.out.get(), POLLIN, 0});
        who.emplace_back(&l, true);
      }
      if (l.err_open) {
        fds.push_back({l.srun.err.get(), POLLIN, 0});
        who.emplace_back(&l, false);
      }
    }
    if (signals) fds.push_back({signals->fd(), POLLIN, 0});
    int timeout = 200;
    if (until)
      timeout = static_cast<int>(std::clamp<long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(*until - now).count() + 1, 1, 200));
    ::poll(fds.data(), fds.size(), timeout);
    for (size_t i = 0; i < who.size(); ++i) {
      if (!fds[i].revents) continue;
      if (who[i].second)
        read_link_output(f, *who[i].first);
      else
        read_link_errors(*who[i].first);
    }
    for (auto& l : f.links) check_link_end(l);
    if (signals && fds.back().revents)
      if (auto s = signals->take()) return *s;
  }
  return std::nullopt;
}

Result<void> start_links(Front& f, const std::vector<std::string>& nodes, const sigset_t& mask) {
  for (const auto& n : nodes) {
    Link l;
    l.node = n;
    l.last_heard = std::chrono::steady_clock::now();
    auto child = spawn(srun_argv(f, n), &mask);
    if (!child) return std::move(child).error().with_context("start srun for node " + n);
    l.srun = std::move(*child);
    f.links.push_back(std::move(l));
  }
  return {};
}

bool all_finished(const Front& f) {
  return std::all_of(f.links.begin(), f.links.end(), [](const Link& l) { return l.finished(); });
}

// Every srun ends: its standard input closes (the node side then leaves),
// and one that does not end within a few seconds is killed.
void stop_links(Front& f) {
  for (auto& l : f.links) l.srun.in.reset();
  const auto start = std::chrono::steady_clock::now();
  for (auto& l : f.links) {
    // A failed node's srun had its SIGTERM already; it may hang on the node.
    const auto end = start + (l.state == Link::State::kFailed ? 2s : 10s);
    while (!l.srun_status && std::chrono::steady_clock::now() < end) {
      l.srun_status = try_reap(l.srun.pid);
      if (!l.srun_status) ::usleep(20000);
    }
    if (!l.srun_status) {
      ::kill(l.srun.pid, SIGKILL);
      int st = 0;
      ::waitpid(l.srun.pid, &st, 0);
      l.srun_status = st;
    }
  }
}

// Asks every node still in its session to detach, measuring its clock first.
void request_detach(Front& f) {
  for (auto& l : f.links) {
    if (l.finished()) continue;
    l.last_heard = std::chrono::steady_clock::now();
    if (l.state == Link::State::kAttached) {
      l.state = Link::State::kDetachClock;
      ping(l);
    } else {
      send_line(l, "detach");
      l.state = Link::State::kDetaching;
    }
  }
}

void print_rank_header() {
  std::printf("  %-10s %-5s %-8s %-16s %s\n", "NODE", "RANK", "PID", "COMMAND", "RESULT");
}

size_t attached_count(const Front& f) {
  return static_cast<size_t>(
      std::count_if(f.ranks.begin(), f.ranks.end(), [](const RankRecord& r) { return r.ok; }));
}

// "4 ranks on 2 nodes (n1: 2, n2: 2)"
std::string attached_summary(const Front& f) {
  std::map<std::string, int> per_node;
  for (const auto& r : f.ranks)
    if (r.ok) ++per_node[r.node];
  std::string s = count_noun(attached_count(f), "process", "processes") + " on " +
                  count_noun(per_node.size(), "node", "nodes") + " (";
  bool first = true;
  for (const auto& [n, c] : per_node) {
    s += (first ? "" : ", ") + n + ": " + std::to_string(c);
    first = false;
  }
  return s + ")";
}

void print_failures(const Front& f) {
  for (const auto& l : f.links)
    if (l.state == Link::State::kFailed)
      std::printf("  node %s failed: %s\n", l.node.c_str(), l.failure.c_str());
  for (const auto& w : f.warnings) std::printf("  warning: %s\n", w.c_str());
  std::fflush(stdout);
}

// 0 when every node and rank did what was asked; kPartial when some did;
// when none did, the code of the first failure.
int exit_code_of(const Front& f) {
  int first = 0;
  bool failed = false;
  for (const auto& l : f.links)
    if (l.state == Link::State::kFailed) failed = true;
  for (const auto& r : f.ranks) {
    if (!r.ok && !r.gone) {
      failed = true;
      if (!first) first = r.code;
    }
    // Killed during the session, or attached and not detached (not gone).
    if (r.signaled || (r.ok && r.end.empty() && r.detach.rfind("failed", 0) == 0)) failed = true;
  }
  const bool any =
      f.o.node.op == "status" ? !f.ranks.empty() : attached_count(f) > 0 || f.o.node.op == "detach";
  if (!failed) return any ? 0 : to_int(ExitCode::kNoTarget);
  if (any && !f.ranks.empty()) return to_int(ExitCode::kPartial);
  return first ? first : to_int(ExitCode::kNoTarget);
}

// A node's best clock measure, as job.json keeps it.
std::optional<profile::ClockSample> job_clock(const std::vector<ClockSample>& samples, const char* when) {
  auto best = best_sample(samples);
  if (!best) return std::nullopt;
  return profile::ClockSample{best->node_mono_ns, best->offset_ns, best->uncertainty_ns, when};
}

// job.json, through its one writer (profile/job.h).
Result<void> write_manifest(const Front& f) {
  profile::JobManifest m;
  m.job = f.spec.job;
  m.step = f.spec.step;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  m.front_host = host;
  m.window = profile::JobWindow{f.window_start_ns, f.window_end_ns};
  for (const auto& l : f.links) {
    profile::JobNode n{l.node, l.transport, l.failure, {}};
    // The detach command's only measurement is at its detach.
    const char* first = f.o.node.op == "detach" ? "detach" : "attach";
    for (auto c : {job_clock(l.attach_clock, first), job_clock(l.detach_clock, "detach")})
      if (c) n.clock.push_back(*c);
    m.nodes.push_back(std::move(n));
  }
  for (const auto& r : f.ranks)
    m.ranks.push_back(profile::JobRank{r.node, r.rank, r.local_rank, r.pid, r.comm, r.dir,
                                       r.ok ? "attached" : r.result, r.end, r.detach});
  return profile::write_job_manifest(f.job_dir + "/" + profile::kJobManifestFile, m);
}

// job.json, then one profile of every rank (the renderer plugin's merge).
void finish_outputs(Front& f) {
  if (f.job_dir.empty()) return;
  bool any = std::any_of(f.ranks.begin(), f.ranks.end(), [](const RankRecord& r) { return !r.dir.empty(); });
  if (auto w = write_manifest(f); !w) print_error(w.error().to_string());
  if (!any) {
    std::printf("No rank's profile came back (job directory: %s).\n", f.job_dir.c_str());
    return;
  }
  const uint64_t t0 = mono_ns();
  auto m = merge_job(f.job_dir);
  const double ms = static_cast<double>(mono_ns() - t0) / 1e6;
  if (!m) {
    print_error("merging the ranks' profiles: " + m.error().to_string());
    return;
  }
  std::printf("\n==> job %s: %s (merged in %.0f ms)\n", f.spec.text().c_str(), f.job_dir.c_str(), ms);
  std::ifstream summary(f.job_dir + "/summary.txt");
  std::string line;
  while (std::getline(summary, line)) std::printf("%s\n", line.c_str());
  std::printf("Render again with: remora report %s\n", f.job_dir.c_str());
  std::fflush(stdout);
}

bool no_node_in_session(const Front& f) {
  return std::none_of(f.links.begin(), f.links.end(),
                      [](const Link& l) { return l.state == Link::State::kAttached; });
}

// The window: until -d passes, Enter (on our terminal), a stop signal, or
// no node has a session left (every rank exited). Says why it ended.
void hold_window(Front& f, StopSignals& signals) {
  const bool watch_stdin = ::isatty(STDIN_FILENO) == 1 && ::tcgetpgrp(STDIN_FILENO) == ::getpgrp();
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> end;
  if (f.o.duration_given) end = start + std::chrono::milliseconds(f.o.duration_ms);
  std::printf("Attached to %s; %s.\n", attached_summary(f).c_str(),
              end ? ("detaching after " + format_elapsed(std::chrono::milliseconds(f.o.duration_ms))).c_str()
                  : (watch_stdin ? "press Enter or Ctrl-C to detach" : "send SIGINT or SIGTERM to detach"));
  std::fflush(stdout);
  f.window_start_ns = mono_ns();
  auto stop = [&](const std::string& why) {
    f.window_end_ns = mono_ns();
    std::printf("%s\n", why.c_str());
    std::fflush(stdout);
  };
  auto next_alive = std::chrono::steady_clock::now();
  for (;;) {
    if (std::chrono::steady_clock::now() >= next_alive) {
      for (auto& l : f.links)
        if (l.state == Link::State::kAttached) send_line(l, "alive");
      next_alive += 1s;
    }
    auto slice = std::chrono::steady_clock::now() + 250ms;
    if (end) slice = std::min(slice, *end);
    if (auto s = pump(
            f, &signals, [&] { return no_node_in_session(f); }, slice))
      return stop(std::string("Got SIG") + sigabbrev_np(*s) + ": detaching.");
    if (no_node_in_session(f)) return stop("No node has a session left (its ranks exited, or it failed).");
    if (end && std::chrono::steady_clock::now() >= *end)
      return stop("Detaching after " + format_elapsed(std::chrono::milliseconds(f.o.duration_ms)) + ".");
    if (watch_stdin) {
      pollfd p{STDIN_FILENO, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) {
        char buf[256];
        ssize_t r = ::read(STDIN_FILENO, buf, sizeof buf);
        if (r <= 0 || std::string_view(buf, static_cast<size_t>(r)).find('\n') != std::string_view::npos)
          return stop("Detaching.");
      }
    }
  }
}

int attach_job(Front& f, StopSignals& signals) {
  print_rank_header();
  std::optional<int> sig = pump(f, &signals, [&] {
    return std::all_of(f.links.begin(), f.links.end(),
                       [](const Link& l) { return l.finished() || l.state == Link::State::kAttached; });
  });
  print_failures(f);
  const size_t attached = attached_count(f);
  if (attached == 0 || f.o.node.keep || sig) {
    if (sig) std::printf("Got SIG%s: detaching.\n", sigabbrev_np(*sig));
    if (attached == 0) {
      print_error("nothing of job " + f.spec.text() + " was attached (see each node above)");
      // Made for this run only, and nothing will come into it.
      std::error_code ec;
      if (!f.job_dir.empty()) std::filesystem::remove_all(f.job_dir, ec);
      f.job_dir.clear();
    }
  }
  if (f.o.node.keep && attached > 0) {
    std::printf(
        "\nThe tools stay attached to %s after remora exits (--keep: no lease).\n"
        "Detach later with:\n  remora detach --slurm %s\n",
        attached_summary(f).c_str(), f.spec.text().c_str());
    stop_links(f);
    return exit_code_of(f);
  }
  if (attached > 0 && !sig) hold_window(f, signals);
  const auto t0 = std::chrono::steady_clock::now();
  request_detach(f);
  pump(f, nullptr, [&] { return all_finished(f); });
  const auto detach_time = since(t0);
  stop_links(f);
  size_t detached = 0;
  for (const auto& r : f.ranks) {
    if (r.detach == "detached" || r.detach.rfind("unloaded", 0) == 0)
      ++detached;
    else if (r.ok && !r.detach.empty() && r.end.empty())
      std::printf("  detach failed for %s: %s\n", who(r).c_str(), r.detach.c_str());
  }
  if (attached > 0)
    std::printf("Detached from %s in %ld ms.\n", count_noun(detached, "process", "processes").c_str(),
                static_cast<long>(detach_time.count()));
  print_failures(f);
  finish_outputs(f);
  for (const auto& r : f.ranks)
    if (r.signaled) print_error("during the session, " + who(r) + " " + r.end);
  return exit_code_of(f);
}

int status_or_detach_job(Front& f) {
  print_rank_header();
  pump(f, nullptr, [&] { return all_finished(f); });
  stop_links(f);
  print_failures(f);
  if (f.o.node.op == "detach") finish_outputs(f);
  return exit_code_of(f);
}

// -t's files must exist here (and, at the same paths, on the nodes).
Result<void> check_tools(FrontOptions& o, bool* default_tool) {
  auto tools = select_tools(o.node.tools_given ? std::optional<std::string>(o.node.tools) : std::nullopt);
  if (!tools) return std::move(tools).error();
  *default_tool = tools->default_tool;
  if (o.node.tools_given) {
    o.node.tools.clear();
    for (const auto& t : tools->paths) o.node.tools += (o.node.tools.empty() ? "" : ":") + t;
  }
  return {};
}

}  // namespace

int run_front(const FrontOptions& asked) {
  Front f;
  f.o = asked;
  for (const char* tool : {"srun", "scontrol"})
    if (find_on_path(tool).empty()) {
      print_error(std::string("--slurm needs Slurm's srun and scontrol, and ") + tool +
                  " is not on PATH: run remora on a login or compute node of the cluster (Debian: apt-get "
                  "install slurm-client)");
      return to_int(ExitCode::kNotSupported);
    }
  auto spec = parse_job_spec(f.o.job);
  if (!spec) return fail(spec.error());
  f.spec = *spec;
  f.o.node.job = f.spec.job;
  f.o.node.step = f.spec.step;
  auto info = resolve_job(f.spec);
  if (!info) return fail(info.error());
  f.info = *info;
  // An array task (1234_7) is a job of its own (JobId=1240): srun and
  // listpids take that number.
  f.o.node.job = f.info.id;
  auto nodes = job_nodes(f.info);
  if (!nodes) return fail(nodes.error());
  bool default_tool = f.o.node.op == "detach";
  if (f.o.node.op == "attach")
    if (auto t = check_tools(f.o, &default_tool); !t) return fail(t.error());
  auto signals = StopSignals::install();
  if (!signals) return fail(signals.error());
  // A node's srun that ended (its node side is done, or it failed) makes a
  // write to it fail with EPIPE, which send_line takes: not a signal that
  // ends remora. Blocked after install(), so the sruns start without it.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  if (default_tool) {
    std::string token;
    std::string dir = f.o.node.op == "detach" ? find_job_dir(f.spec, f.o.output, &token) : "";
    if (dir.empty()) {
      auto made = make_job_dir(f.spec, f.o.output, &token);
      if (!made) return fail(made.error());
      dir = *made;
    }
    f.job_dir = dir;
    f.o.node.shared_dir = dir;
    f.o.node.token = token;
  }
  if (const char* t = std::getenv("REMORA_SLURM_TRANSPORT"); t && *t) f.o.node.transport = t;
  if (const char* t = std::getenv("REMORA_SLURM_FRONT_TIMEOUT"); t && std::atol(t) >= 1000)
    f.o.node.front_timeout_ms = std::atol(t);
  std::printf("%s job %s (%s, user %s) on %s: %s...\n",
              f.o.node.op == "attach"   ? "Attaching to"
              : f.o.node.op == "detach" ? "Detaching from"
                                        : "Status of",
              f.spec.text().c_str(), f.info.name.c_str(), f.info.user.c_str(),
              count_noun(nodes->size(), "node", "nodes").c_str(), f.info.node_list.c_str());
  std::fflush(stdout);
  if (auto s = start_links(f, *nodes, signals->old_mask()); !s) return fail(s.error());
  return f.o.node.op == "attach" ? attach_job(f, *signals) : status_or_detach_job(f);
}

}  // namespace remora::cli::slurm
