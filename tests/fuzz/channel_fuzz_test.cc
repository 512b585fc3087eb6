// The socket channel's listener against malformed clients (agent/channel.cc,
// agent/channel_wire.h). A target opted in at launch is attached through the
// socket with a lease: the session that must stay unaffected. Then a seeded
// storm of connections sends it everything a request can get wrong (random
// bytes, cut headers and bodies, wrong fields, sizes and descriptor counts,
// broken environments, tool lists and leases, stalls, clients that go away),
// with a sprinkling of well-formed status and attach requests. Each reply
// must be the refusal (or the status) the request deserves, and carry the
// other session's state unchanged; afterwards the target holds no more
// descriptors than before, the session detaches cleanly (its tool saw one
// attach and one detach), and the target's own computation and its reader
// thread never noticed.
//
//   REMORA_FUZZ_SEED=N         another storm (the seed used is printed)
//   REMORA_FUZZ_CONNECTIONS=N  its length (default 3000)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "attach/attach.h"
#include "attach/channel.h"
#include "fuzz_client.h"
#include "fuzz_wire.h"

namespace remora::fuzz {
namespace {

using attach::AttachOptions;
using attach::Channel;
using attach::Controller;
using attach::DetachOptions;
using namespace std::chrono_literals;

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::strtoull(s, nullptr, 0) : fallback;
}

// The state every reply must show: the other session's.
struct Baseline {
  pid_t pid = 0;
  uint64_t sessions = 0, detaches = 0;
  pid_t lease_pid = 0;
};

// Why `o` is not the answer `w` deserves ("" when it is).
std::string judge(const Wire& w, const Outcome& o, const Baseline& b) {
  if (w.abandon) return "";
  if (!o.connected) return "could not connect";
  if (o.got < sizeof o.reply) {
    if (w.expect == Expect::kBadOrNothing && o.closed) return "";
    return o.closed ? "closed after " + std::to_string(o.got) + " bytes of a reply"
                    : "no reply before the deadline";
  }
  const remora_channel_reply& r = o.reply;
  if (r.magic != REMORA_CHANNEL_MAGIC || r.version != REMORA_CHANNEL_VERSION)
    return "a reply of another version";
  if (o.extra != 0) return std::to_string(o.extra) + " bytes after the reply";
  if (r.pid != b.pid) return "a reply from pid " + std::to_string(r.pid);
  if (r.attached != 1 || r.sessions != b.sessions || r.detaches != b.detaches || r.lease_pid != b.lease_pid ||
      r.lease_expired != 0)
    return "the other session changed: attached " + std::to_string(r.attached) + ", sessions " +
           std::to_string(r.sessions) + ", detaches " + std::to_string(r.detaches) + ", lease pid " +
           std::to_string(r.lease_pid) + ", expired " + std::to_string(r.lease_expired);
  const std::string got = "result " + std::to_string(r.result) + " ('" + r.message + "')";
  switch (w.expect) {
    case Expect::kBadArgument:
    case Expect::kBadOrNothing:
      if (r.result != REMORA_AGENT_ERR_BAD_ARGUMENT) return got + ", want BAD_ARGUMENT";
      if (r.message[0] == '\0') return "BAD_ARGUMENT without a message";
      return "";
    case Expect::kStatus: return r.result == REMORA_AGENT_OK ? "" : got + ", want OK";
    case Expect::kAlreadyAttached:
      if (r.result != REMORA_AGENT_ERR_ALREADY_ATTACHED) return got + ", want ALREADY_ATTACHED";
      return r.message[0] == '\0' ? "ALREADY_ATTACHED without a message" : "";
    case Expect::kNothing: return "";
  }
  return "?";
}

// A file for the hook tool's log, removed at the end.
class TempFile {
 public:
  TempFile() {
    char name[] = "/tmp/remora-fuzz-hook-XXXXXX";
    const int fd = ::mkstemp(name);
    if (fd >= 0) ::close(fd);
    path_ = name;
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  std::string read() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  std::string path_;
};

size_t count_lines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// A target attached through its socket with a lease (the other session),
// and what the tests need to check it.
class ChannelFuzz : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_unique<Target>(REMORA_FUZZ_TARGET, agent_path());
    ASSERT_TRUE(target_->ready()) << target_->error();
    auto ep = attach::channel::find_endpoint(target_->pid());
    ASSERT_TRUE(ep.ok()) << ep.error().to_string();
    ASSERT_TRUE(ep->has_value()) << "the target has no @remora-agent socket";
    endpoint_ = **ep;
    AttachOptions o;
    o.tools = {REMORA_HOOK_TOOL_A};
    o.channel = Channel::kSocket;
    o.lease = true;
    o.env = {{"REMORA_HOOK_LOG", log_.path()}};
    auto a = controller_.attach(target_->pid(), o);
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    auto st = Controller::status(target_->pid(), Channel::kSocket);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    ASSERT_TRUE(st->attached);
    ASSERT_EQ(st->tools, REMORA_HOOK_TOOL_A);
    baseline_ = {target_->pid(), st->sessions, st->detaches, st->lease_pid};
    EXPECT_EQ(baseline_.lease_pid, ::getpid());
    client_ = std::make_unique<RawClient>(target_->pid(), target_->reader_tid(), endpoint_);
  }

  // The agent built here, unless REMORA_FUZZ_AGENT names another build of it.
  static std::string agent_path() {
    const char* other = std::getenv("REMORA_FUZZ_AGENT");
    return other != nullptr && *other != '\0' ? other : REMORA_AGENT_BUILT;
  }

  // The target's descriptors right after a status that was read to the
  // agent's close (it closes the connection after what came with it).
  int settled_fds() {
    const Wire w = wire_of(with_sizes(Parts{valid_head(REMORA_CHANNEL_OP_STATUS), "", "", {}}),
                           Expect::kStatus, "a status");
    const Outcome o = client_->exchange(w, Deadline::after(10s));
    EXPECT_EQ(judge(w, o, baseline_), "");
    return count_fds(target_->pid());
  }

  // Has the target died? A connection closed without its reply may have
  // been the agent's end: its exit is waited for a moment then.
  bool died_after(const Wire& w, const Outcome& o) {
    const bool no_reply = !w.abandon && o.connected && o.got == 0 && o.closed;
    return no_reply ? target_->wait_exit(Deadline::after(200ms)) : !target_->alive();
  }

  // The session as a controller sees it, unchanged.
  void expect_session_unchanged() {
    auto st = Controller::status(target_->pid(), Channel::kSocket);
    ASSERT_TRUE(st.ok()) << st.error().to_string();
    EXPECT_TRUE(st->attached);
    EXPECT_EQ(st->tools, REMORA_HOOK_TOOL_A);
    EXPECT_EQ(st->sessions, baseline_.sessions);
    EXPECT_EQ(st->detaches, baseline_.detaches);
    EXPECT_EQ(st->lease_pid, baseline_.lease_pid);
    EXPECT_FALSE(st->lease_expired);
    EXPECT_EQ(st->session_channel, Channel::kSocket);
  }

  // Detaches through the socket, then lets the target finish: its tool saw
  // one attach and one detach, its computation and its reader thread
  // nothing.
  void detach_and_finish() {
    DetachOptions d;
    d.channel = Channel::kSocket;
    auto r = controller_.detach(target_->pid(), d);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    const std::string log = log_.read();
    EXPECT_EQ(count_lines(log, ":tool_attach "), 1u) << log;
    EXPECT_EQ(count_lines(log, ":tool_detach "), 1u) << log;
    target_->close_stdin();
    ASSERT_TRUE(target_->wait_exit(Deadline::after(30s))) << "the target did not exit once its stdin closed";
    EXPECT_EQ(target_->how_it_ended(), "exited 0");
    const std::string out = target_->read_stdout(Deadline::after(10s));
    unsigned long long rounds = 0, bad = 1;
    int eintr = -1;
    char reader[16] = {};
    ASSERT_EQ(
        std::sscanf(out.c_str(), "rounds=%llu bad=%llu eintr=%d reader=%15s", &rounds, &bad, &eintr, reader),
        4)
        << out;
    EXPECT_GT(rounds, 0u) << out;
    EXPECT_EQ(bad, 0u) << "the target's computation went wrong: " << out;
    EXPECT_EQ(eintr, 0) << "the target's read(2) saw EINTR: " << out;
    EXPECT_STREQ(reader, "ok") << out;
  }

  TempFile log_;
  std::unique_ptr<Target> target_;
  attach::channel::Endpoint endpoint_;
  Controller controller_;
  Baseline baseline_;
  std::unique_ptr<RawClient> client_;
};

// ---- one request of each kind, by hand ----

struct Row {
  std::string what;
  Wire wire;
};

Parts status_with(std::string env, std::string tools, std::vector<FdKind> fds) {
  return with_sizes(
      Parts{valid_head(REMORA_CHANNEL_OP_STATUS), std::move(env), std::move(tools), std::move(fds)});
}

Wire bad(Parts p) { return wire_of(p, Expect::kBadArgument, ""); }
Wire bad_tools(std::string list, int fds) {
  return bad(status_with("", list + '\0', std::vector<FdKind>(static_cast<size_t>(fds), FdKind::kDevNull)));
}

std::vector<Row> header_rows() {
  std::vector<Row> rows;
  Wire nothing;
  rows.push_back({"nothing at all", nothing});
  Wire short_head;
  short_head.pieces = {bytes_of(valid_head(REMORA_CHANNEL_OP_STATUS)).substr(0, 31)};
  rows.push_back({"31 bytes of a header", short_head});
  auto field = [&](const char* what, auto set) {
    Parts p = status_with("", "", {});
    set(p.head);
    rows.push_back({what, bad(p)});
  };
  field("bad magic", [](remora_channel_request& h) { h.magic = 0x12345678; });
  field("version 0", [](remora_channel_request& h) { h.version = 0; });
  field("version 2", [](remora_channel_request& h) { h.version = 2; });
  field("op 0", [](remora_channel_request& h) { h.op = 0; });
  field("op 4", [](remora_channel_request& h) { h.op = 4; });
  field("flags 2", [](remora_channel_request& h) { h.flags = 2; });
  field("a detach with flags 0x80000000", [](remora_channel_request& h) {
    h.op = REMORA_CHANNEL_OP_DETACH;
    h.flags = 0x80000000u;
  });
  field("env_size 8193", [](remora_channel_request& h) { h.env_size = REMORA_CHANNEL_ENV_MAX + 1; });
  field("tools_size 4097", [](remora_channel_request& h) { h.tools_size = REMORA_CHANNEL_TOOLS_MAX + 1; });
  field("fd_count 1, none sent", [](remora_channel_request& h) { h.fd_count = 1; });
  Parts cut = status_with(env_buffer(1, {{"A", "B"}}), "", {});
  Wire cut_body = bad(cut);
  cut_body.pieces[0].pop_back();
  rows.push_back({"a body one byte short", cut_body});
  return rows;
}

std::vector<Row> descriptor_rows() {
  std::vector<Row> rows;
  for (int sent : {1, 3, 17, 19, 20}) {
    Parts p = status_with("", "", std::vector<FdKind>(static_cast<size_t>(sent), FdKind::kDevNull));
    p.head.fd_count = 0;
    rows.push_back({std::to_string(sent) + " descriptors sent, none named", bad(p)});
  }
  Parts all_named = status_with("", "", std::vector<FdKind>(18, FdKind::kDevNull));
  rows.push_back({"18 descriptors sent, 18 named (one more than taken)", bad(all_named)});
  Parts one_short = all_named;
  one_short.head.fd_count = 17;
  rows.push_back({"18 descriptors sent, 17 named", bad(one_short)});
  return rows;
}

std::vector<Row> env_rows() {
  std::vector<Row> rows;
  rows.push_back({"an environment of 2 bytes", bad(status_with("ab", "", {}))});
  rows.push_back({"count 2, one pair", bad(status_with(env_buffer(2, {{"A", "B"}}), "", {}))});
  rows.push_back({"count 0, one pair", bad(status_with(env_buffer(0, {{"A", "B"}}), "", {}))});
  rows.push_back({"an empty name", bad(status_with(env_buffer(1, {{"", "B"}}), "", {}))});
  rows.push_back({"'=' in a name", bad(status_with(env_buffer(1, {{"A=B", "C"}}), "", {}))});
  std::string open_value = env_buffer(1, {{"A", "B"}});
  open_value.pop_back();
  rows.push_back({"an unterminated value", bad(status_with(open_value, "", {}))});
  rows.push_back({"count 0xffffffff", bad(status_with(env_buffer(0xffffffffu, {{"A", "B"}}), "", {}))});
  return rows;
}

std::vector<Row> tool_rows() {
  std::vector<Row> rows;
  rows.push_back({"a list without its NUL", bad(status_with("", "a|/x", {}))});
  rows.push_back({"a NUL inside the list", bad(status_with("", std::string("a|/x\0b|/y", 9) + '\0', {}))});
  rows.push_back({"an empty list", bad_tools("", 0)});
  rows.push_back({"'|x'", bad_tools("|x", 0)});
  rows.push_back({"'x|'", bad_tools("x|", 0)});
  rows.push_back({"'a::b'", bad_tools("a|/x::b|/y", 0)});
  rows.push_back({"':a'", bad_tools(":a|/x", 0)});
  rows.push_back({"'a:' (an empty last entry)", bad_tools("a|/x:", 0)});
  std::string many;
  for (int i = 0; i < 17; ++i) many += (i ? ":t" : "t") + std::to_string(i) + "|/x";
  rows.push_back({"17 entries", bad_tools(many, 0)});
  rows.push_back({"a path of 1024 bytes", bad_tools("/" + std::string(1023, 'p'), 0)});
  rows.push_back({"'x|#1' with one descriptor", bad_tools("x|#1", 1)});
  rows.push_back({"'x|#99'", bad_tools("x|#99", 1)});
  rows.push_back({"'x|#-1'", bad_tools("x|#-1", 1)});
  rows.push_back({"'x|#1x'", bad_tools("x|#1x", 2)});
  rows.push_back({"'x|#' (no index) with one descriptor", bad_tools("x|#", 1)});
  std::string grows;
  for (int i = 0; i < 4; ++i) grows += (i ? ":" : "") + std::string(1019, 'n') + "|#0";
  rows.push_back({"a list that outgrows the agent's as descriptors", bad_tools(grows, 1)});
  return rows;
}

std::vector<Row> lease_and_valid_rows() {
  std::vector<Row> rows;
  Parts status_lease = status_with("", "", {FdKind::kPipeRead});
  status_lease.head.flags = REMORA_CHANNEL_FLAG_LEASE;
  rows.push_back({"a status with a lease", bad(status_lease)});
  Parts null_lease = status_lease;
  null_lease.head.op = REMORA_CHANNEL_OP_ATTACH;
  null_lease.fds = {FdKind::kDevNull};
  rows.push_back({"an attach whose lease is /dev/null", bad(null_lease)});
  Parts no_lease =
      with_sizes(Parts{valid_head(REMORA_CHANNEL_OP_ATTACH), "", std::string("t|/x") + '\0', {}});
  no_lease.head.flags = REMORA_CHANNEL_FLAG_LEASE;
  rows.push_back({"an attach with a lease flag and no descriptor", bad(no_lease)});
  Parts detach_bad_env = with_sizes(Parts{valid_head(REMORA_CHANNEL_OP_DETACH), "xy", "", {}});
  rows.push_back({"a detach with a broken environment", bad(detach_bad_env)});
  rows.push_back({"a well-formed status", wire_of(status_with(env_buffer(1, {{"A", "B"}}),
                                                              std::string("t|#0") + '\0', {FdKind::kDevNull}),
                                                  Expect::kStatus, "")});
  Parts attach = with_sizes(Parts{valid_head(REMORA_CHANNEL_OP_ATTACH),
                                  "",
                                  std::string("t|#0") + '\0',
                                  {FdKind::kPipeRead, FdKind::kDevNull}});
  attach.head.flags = REMORA_CHANNEL_FLAG_LEASE;
  rows.push_back({"a well-formed leased attach", wire_of(attach, Expect::kAlreadyAttached, "")});
  return rows;
}

// Indexes past what an int holds: last, since one of them has taken the
// agent down.
std::vector<Row> overflow_rows() {
  std::vector<Row> rows;
  for (const char* k :
       {"4294967295", "4294967296", "9223372036854775807", "99999999999999999999", "2147483648"})
    rows.push_back({std::string("'x|#") + k + "' with one descriptor", bad_tools(std::string("x|#") + k, 1)});
  return rows;
}

TEST_F(ChannelFuzz, EachMalformedRequestIsRefused) {
  std::vector<Row> rows;
  for (auto* part : {header_rows, descriptor_rows, env_rows, tool_rows, lease_and_valid_rows, overflow_rows})
    for (Row& r : part()) rows.push_back(std::move(r));
  const int fds_before = settled_fds();
  for (Row& r : rows) {
    r.wire.what = r.what;
    const Outcome o = client_->exchange(r.wire, Deadline::after(10s));
    EXPECT_EQ(judge(r.wire, o, baseline_), "") << r.what;
    ASSERT_FALSE(died_after(r.wire, o))
        << "the target died (" << target_->how_it_ended() << ") after: " << r.what;
  }
  EXPECT_LE(settled_fds(), fds_before);
  expect_session_unchanged();
  detach_and_finish();
}

// ---- the storm ----

// Counts of what came back, by what was asked.
struct Tally {
  std::map<std::string, int> by_kind;  // "<expect> -> <result or no reply>"
  int mismatches = 0;
  std::vector<std::string> first_mismatches;  // two of each kind of request at most
  std::map<std::string, int> shown;
  void add(const Wire& w, const Outcome& o, const std::string& why) {
    const std::string got = w.abandon                 ? "not read"
                            : o.got >= sizeof o.reply ? "result " + std::to_string(o.reply.result)
                            : o.closed                ? "closed without a reply"
                                                      : "no reply";
    ++by_kind[std::string(expect_name(w.expect)) + " -> " + got];
    if (why.empty()) return;
    ++mismatches;
    const std::string kind = w.what.substr(0, w.what.find(','));
    if (first_mismatches.size() < 30 && ++shown[kind] <= 2) first_mismatches.push_back(w.what + ": " + why);
  }
};

// Requests through the controller's own client (channel::call): the parts
// of the protocol it can say wrong.
Wire call_through_controller(pid_t pid, const attach::channel::Endpoint& ep, int i, Outcome* out) {
  attach::channel::Request req;
  Wire w;
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  int lease[2] = {-1, -1};
  switch (i % 4) {
    case 0:
      req.op = 9;
      w.what = "channel::call with op 9";
      break;
    case 1:
      req.tools = "t|#2";
      req.tool_fds = {devnull.get()};
      w.what = "channel::call naming descriptor 2 of 1";
      break;
    case 2: {
      const std::string env = env_buffer(3, {{"A", "B"}});
      for (char c : env) req.env.push_back(static_cast<std::byte>(c));
      w.what = "channel::call with an environment counting 3 pairs, holding 1";
      break;
    }
    default:
      req.op = REMORA_CHANNEL_OP_ATTACH;
      req.tools = "t|#0";
      req.tool_fds = {devnull.get()};
      if (::pipe2(lease, O_CLOEXEC) == 0) req.lease_fd = lease[0];
      w.what = "channel::call: a well-formed leased attach";
      w.expect = Expect::kAlreadyAttached;
      break;
  }
  auto r = attach::channel::call(pid, ep, req, Deadline::after(10s));
  for (int fd : lease)
    if (fd >= 0) ::close(fd);
  out->connected = r.ok();
  if (r.ok()) {
    out->reply = *r;
    out->got = sizeof out->reply;
    out->closed = true;
  }
  return w;
}

std::string lines(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += "\n  " + s;
  return out;
}

TEST_F(ChannelFuzz, StormLeavesTheOtherSessionAlone) {
  const uint64_t seed = env_number("REMORA_FUZZ_SEED", 0x5eed2026);
  const int connections = static_cast<int>(env_number("REMORA_FUZZ_CONNECTIONS", 3000));
  std::printf("channel fuzz: seed %" PRIu64 " (REMORA_FUZZ_SEED), %d connections, target pid %d, @%s\n", seed,
              connections, target_->pid(), endpoint_.name.c_str());
  RecordProperty("seed", std::to_string(seed));
  Generator gen(seed);
  const int fds_before = settled_fds();
  // A few requests stall (the agent gives each up after its read timeout,
  // one after the other): opened together first, read at the end.
  const std::vector<Wire> stall_wires = gen.stalls();
  std::vector<UniqueFd> stalls;
  for (const Wire& w : stall_wires) stalls.push_back(client_->open(w));
  Tally tally;
  std::vector<std::string> recent;
  const auto t0 = std::chrono::steady_clock::now();
  // A backstop on a machine much slower than expected: fewer connections,
  // the same checks.
  const Deadline budget = Deadline::after(45s);
  int done = 0, idles = 0;
  for (; done < connections && !budget.expired(); ++done) {
    // Now and then the channel thread is let go (the next connection must
    // wake it); and wakes come while it runs (the handler finds it there).
    if (done % 500 == 499 && client_->wait_channel_gone(Deadline::after(10s))) ++idles;
    if (done % 7 == 3) client_->wake();
    Outcome o;
    const bool through_call = done % 97 == 96;
    const Wire w =
        through_call ? call_through_controller(target_->pid(), endpoint_, done / 97, &o) : gen.next();
    if (!through_call) o = client_->exchange(w, Deadline::after(15s));
    tally.add(w, o, judge(w, o, baseline_));
    recent.push_back(w.what);
    if (recent.size() > 5) recent.erase(recent.begin());
    if (!died_after(w, o)) continue;
    FAIL() << "the target died (" << target_->how_it_ended() << ") at connection " << done << " (seed "
           << seed << "); the last requests:" << lines(recent)
           << "\nthe requests answered wrong:" << lines(tally.first_mismatches);
  }
  for (size_t i = 0; i < stalls.size(); ++i) {
    const Outcome o = stalls[i] ? client_->finish(stalls[i].get(), Deadline::after(15s)) : Outcome{};
    tally.add(stall_wires[i], o, judge(stall_wires[i], o, baseline_));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "channel fuzz: %d connections and %zu stalls in %.1f s, %d wakes sent, the channel thread left %d "
      "times\n",
      done, stalls.size(), secs, client_->wakes(), idles);
  if (done < connections) std::printf("channel fuzz: the storm stopped at its time budget\n");
  for (const auto& [kind, n] : tally.by_kind) std::printf("  %6d  %s\n", n, kind.c_str());
  EXPECT_EQ(tally.mismatches, 0) << "seed " << seed << "; the first ones:" << lines(tally.first_mismatches);
  ASSERT_TRUE(target_->alive()) << target_->how_it_ended();
  const int fds_after = settled_fds();
  std::printf("channel fuzz: the target held %d descriptors before the storm, %d after\n", fds_before,
              fds_after);
  EXPECT_LE(fds_after, fds_before + 2)
      << "descriptors before the storm " << fds_before << ", after " << fds_after;
  expect_session_unchanged();
  detach_and_finish();
}

}  // namespace
}  // namespace remora::fuzz
