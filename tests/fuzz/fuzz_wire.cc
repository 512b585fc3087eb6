// Requests for the socket channel, broken and not (fuzz_wire.h).
#include "fuzz_wire.h"

#include <algorithm>
#include <cstring>

namespace remora::fuzz {

const char* expect_name(Expect e) {
  switch (e) {
    case Expect::kBadArgument: return "BAD_ARGUMENT";
    case Expect::kStatus: return "the status";
    case Expect::kAlreadyAttached: return "ALREADY_ATTACHED";
    case Expect::kBadOrNothing: return "BAD_ARGUMENT or no reply";
    case Expect::kNothing: return "nothing (abandoned)";
  }
  return "?";
}

remora_channel_request valid_head(uint32_t op) {
  remora_channel_request h{};
  h.magic = REMORA_CHANNEL_MAGIC;
  h.version = REMORA_CHANNEL_VERSION;
  h.op = op;
  h.controller_pid = 1234567;  // informational; the agent records SO_PEERCRED's
  return h;
}

std::string bytes_of(const remora_channel_request& head) {
  return std::string(reinterpret_cast<const char*>(&head), sizeof head);
}

std::string bytes_of(const Parts& p) { return bytes_of(p.head) + p.env + p.tools; }

std::string env_buffer(uint32_t count, const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string out(sizeof count, '\0');
  std::memcpy(out.data(), &count, sizeof count);
  for (const auto& [name, value] : pairs) {
    out += name;
    out += '\0';
    out += value;
    out += '\0';
  }
  return out;
}

Parts with_sizes(Parts p) {
  p.head.env_size = static_cast<uint32_t>(p.env.size());
  p.head.tools_size = static_cast<uint32_t>(p.tools.size());
  p.head.fd_count = static_cast<uint32_t>(p.fds.size());
  return p;
}

Wire wire_of(const Parts& p, Expect expect, std::string what) {
  Wire w;
  w.what = std::move(what);
  w.pieces = {bytes_of(p)};
  w.fds = p.fds;
  w.expect = expect;
  return w;
}

// ---- the generator's pieces ----

std::string Generator::random_bytes(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng_() & 0xff);
  return s;
}

std::string Generator::name() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789abcdefghijklmnopqrstuvwxyz.-";
  std::string s = "F";
  const uint32_t n = below(8);
  for (uint32_t i = 0; i < n; ++i) s += kChars[below(sizeof kChars - 1)];
  return s;
}

std::string Generator::valid_env() {
  std::vector<std::pair<std::string, std::string>> pairs;
  const uint32_t n = below(4);
  for (uint32_t i = 0; i < n; ++i) {
    std::string value;
    for (uint32_t k = below(20); k > 0; --k) value += static_cast<char>(1 + below(255));  // anything but NUL
    pairs.emplace_back("REMORA_FUZZ_" + name(), value);
  }
  return env_buffer(n, pairs);
}

std::string Generator::valid_tools(int tool_fds) {
  const uint32_t n = 1 + below(4);
  std::string s;
  for (uint32_t i = 0; i < n; ++i) {
    if (i != 0) s += ':';
    if (tool_fds > 0 && chance(60))
      s += name() + "|#" + std::to_string(below(static_cast<uint32_t>(tool_fds)));
    else if (chance(50))
      s += name() + "|/nonexistent/" + name();
    else
      s += "/nonexistent/" + name() + ".so";
  }
  s += '\0';
  return s;
}

// A well-formed request: for an attach, maybe its lease first; 0..3 tool
// descriptors; maybe an environment; maybe a tool list using them.
Parts Generator::valid_parts(uint32_t op) {
  Parts p;
  p.head = valid_head(op);
  if (op == REMORA_CHANNEL_OP_ATTACH && chance(50)) {
    p.fds.push_back(FdKind::kPipeRead);
    p.head.flags = REMORA_CHANNEL_FLAG_LEASE;
  }
  const int tool_fds = static_cast<int>(below(4));
  for (int i = 0; i < tool_fds; ++i) p.fds.push_back(chance(70) ? FdKind::kDevNull : FdKind::kPipeRead);
  if (chance(50)) p.env = valid_env();
  if (chance(60)) p.tools = valid_tools(tool_fds);
  return with_sizes(std::move(p));
}

// The one piece cut in two or three (the agent reads a header that comes
// in pieces); the descriptors stay with the first, which is never empty.
Wire Generator::split(Wire w) {
  if (w.pieces.size() != 1 || w.pieces[0].size() < 2 || !chance(30)) return w;
  std::string all = std::move(w.pieces[0]);
  w.pieces.clear();
  size_t at = 0;
  const uint32_t cuts = 1 + below(2);
  for (uint32_t i = 0; i < cuts && at + 1 < all.size(); ++i) {
    const size_t len = 1 + below(static_cast<uint32_t>(all.size() - at - 1));
    w.pieces.push_back(all.substr(at, len));
    at += len;
  }
  w.pieces.push_back(all.substr(at));
  w.what += " (in " + std::to_string(w.pieces.size()) + " pieces)";
  return w;
}

// ---- well-formed requests ----

// The tool list as text (without its NUL).
std::string list_text(const Parts& p) { return p.tools.empty() ? "" : p.tools.substr(0, p.tools.size() - 1); }

Wire Generator::valid_status() {
  const Parts p = valid_parts(REMORA_CHANNEL_OP_STATUS);
  return wire_of(p, Expect::kStatus,
                 "a well-formed status (" + std::to_string(p.fds.size()) + " descriptors, tools '" +
                     list_text(p) + "')");
}

Wire Generator::valid_attach() {
  const Parts p = valid_parts(REMORA_CHANNEL_OP_ATTACH);
  const bool lease = (p.head.flags & REMORA_CHANNEL_FLAG_LEASE) != 0;
  return wire_of(p, Expect::kAlreadyAttached,
                 std::string("a well-formed attach") + (lease ? " with a lease" : "") + " (tools '" +
                     list_text(p) + "')");
}

// ---- defects found before the tool list is read (any request) ----

uint32_t any_op(uint32_t r) {
  static constexpr uint32_t kOps[] = {REMORA_CHANNEL_OP_STATUS, REMORA_CHANNEL_OP_ATTACH,
                                      REMORA_CHANNEL_OP_DETACH};
  return kOps[r % 3];
}

Wire Generator::random_garbage() {
  Wire w;
  std::string b = random_bytes(below(200));
  if (b.size() >= 4 && std::memcmp(b.data(), "MRCH", 4) == 0) b[0] = 'X';
  w.pieces = {b};
  if (!b.empty()) w.fds.assign(below(4), FdKind::kDevNull);
  w.what = std::to_string(b.size()) + " random bytes, " + std::to_string(w.fds.size()) + " descriptors";
  return w;
}

Wire Generator::truncated_head() {
  const Parts p = valid_parts(any_op(below(3)));
  Wire w;
  const size_t len = below(sizeof(remora_channel_request));
  w.pieces = {bytes_of(p.head).substr(0, len)};
  if (len != 0) w.fds = p.fds;
  w.what = "a header of " + std::to_string(len) + " bytes, op " + std::to_string(p.head.op);
  return w;
}

Wire Generator::bad_head_field() {
  Parts p = valid_parts(any_op(below(3)));
  std::string what;
  switch (below(6)) {
    case 0:
      p.head.magic = static_cast<uint32_t>(rng_());
      if (p.head.magic == REMORA_CHANNEL_MAGIC) p.head.magic ^= 1;
      what = "magic " + std::to_string(p.head.magic);
      break;
    case 1:
      p.head.version = chance(50) ? static_cast<uint32_t>(rng_()) | 2u : below(2) * 2;
      what = "version " + std::to_string(p.head.version);
      break;
    case 2: {
      static constexpr uint32_t kOps[] = {0, 4, 5, 255, 0x80000001u, 0xffffffffu};
      p.head.op = chance(50) ? kOps[below(6)] : 4 + static_cast<uint32_t>(rng_() % 0xfffffff0u);
      what = "op " + std::to_string(p.head.op);
      break;
    }
    case 3:
      p.head.flags |= 1u << (1 + below(31));
      what = "flags " + std::to_string(p.head.flags);
      break;
    case 4:
      p.head.env_size = chance(50) ? REMORA_CHANNEL_ENV_MAX + 1 + below(100000) : 0xffffffffu;
      what = "env_size " + std::to_string(p.head.env_size);
      break;
    default:
      p.head.tools_size = chance(50) ? REMORA_CHANNEL_TOOLS_MAX + 1 + below(100000) : 0xffffffffu;
      what = "tools_size " + std::to_string(p.head.tools_size);
      break;
  }
  return wire_of(p, Expect::kBadArgument, what + ", op field " + std::to_string(p.head.op));
}

// The header names another count than was sent (more than the agent takes
// makes the control message overflow: refused too).
Wire Generator::bad_descriptor_count() {
  Parts p = valid_parts(chance(50) ? REMORA_CHANNEL_OP_STATUS : REMORA_CHANNEL_OP_ATTACH);
  const uint32_t sent = below(21);
  p.fds.clear();
  for (uint32_t i = 0; i < sent; ++i) p.fds.push_back(chance(80) ? FdKind::kDevNull : FdKind::kPipeRead);
  uint32_t named = chance(80) ? below(21) : static_cast<uint32_t>(rng_());
  if (named == sent) named = sent + 1 + below(3);
  p.head.fd_count = named;
  return wire_of(p, Expect::kBadArgument,
                 std::to_string(sent) + " descriptors sent, " + std::to_string(named) + " named, op " +
                     std::to_string(p.head.op));
}

Wire Generator::short_body() {
  Parts p = valid_parts(any_op(below(3)));
  if (p.env.empty()) p.env = valid_env();
  p = with_sizes(std::move(p));
  const std::string all = bytes_of(p);
  const size_t head = sizeof(remora_channel_request);
  const size_t len = head + below(static_cast<uint32_t>(all.size() - head));
  Wire w = wire_of(p, Expect::kBadArgument, "");
  w.pieces = {all.substr(0, len)};
  w.what = "a body cut to " + std::to_string(len - head) + " of " + std::to_string(all.size() - head) +
           " bytes, op " + std::to_string(p.head.op);
  return w;
}

Wire Generator::bad_env() {
  Parts p = valid_parts(any_op(below(3)));
  std::vector<std::pair<std::string, std::string>> pairs;
  const uint32_t n = 1 + below(3);
  for (uint32_t i = 0; i < n; ++i) pairs.emplace_back("REMORA_FUZZ_" + name(), name());
  std::string what;
  switch (below(7)) {
    case 0:
      p.env = random_bytes(1 + below(3));
      what = "an environment of " + std::to_string(p.env.size()) + " bytes";
      break;
    case 1: {
      const uint32_t count = chance(70) ? n + 1 + below(5) : 0xffffffffu;
      p.env = env_buffer(count, pairs);
      what = "an environment counting " + std::to_string(count) + " pairs, holding " + std::to_string(n);
      break;
    }
    case 2: {
      const uint32_t count = below(n);
      p.env = env_buffer(count, pairs);
      what = "an environment counting " + std::to_string(count) + " pairs, holding " + std::to_string(n);
      break;
    }
    case 3:
      pairs[below(n)].first.clear();
      p.env = env_buffer(n, pairs);
      what = "an environment with an empty name";
      break;
    case 4:
      pairs[below(n)].first += "=X";
      p.env = env_buffer(n, pairs);
      what = "an environment with '=' in a name";
      break;
    case 5:
      p.env = env_buffer(n, pairs);
      p.env.pop_back();
      what = "an environment whose last value is not terminated";
      break;
    default:
      p.env = env_buffer(n, pairs) + random_bytes(1 + below(8));
      what = "an environment with bytes after its pairs";
      break;
  }
  p = with_sizes(std::move(p));
  return wire_of(p, Expect::kBadArgument, what + ", op " + std::to_string(p.head.op));
}

// ---- defects in the tool list and the lease (status and attach only) ----

// A tool list entry the agent must refuse; `tool_fds` descriptors follow
// the lease.
std::string Generator::bad_entry(int tool_fds, std::string* what) {
  // Indexes an int does not hold among them: a cast must not make one fit.
  static const char* const kIndexes[] = {"-1",
                                         "-5",
                                         "99",
                                         "1x",
                                         "0x1",
                                         "",
                                         "2147483648",
                                         "3000000000",
                                         "4294967295",
                                         "4294967296",
                                         "4294967297",
                                         "-2147483648",
                                         "9223372036854775807",
                                         "99999999999999999999",
                                         "-9223372036854775808"};
  switch (below(7)) {
    case 0: *what = "an entry '|x'"; return "|" + name();
    case 1: *what = "an entry 'x|'"; return name() + "|";
    case 2: *what = "an empty entry"; return "";
    case 3: {
      const uint32_t k = static_cast<uint32_t>(tool_fds) + below(4);
      *what = "descriptor #" + std::to_string(k) + " of " + std::to_string(tool_fds);
      return name() + "|#" + std::to_string(k);
    }
    case 4:
    case 5: {
      const char* k = kIndexes[below(sizeof kIndexes / sizeof kIndexes[0])];
      *what = std::string("descriptor #") + k;
      return name() + "|#" + k;
    }
    default: *what = "a path of 1024 bytes or more"; return "/" + std::string(1023 + below(60), 'p');
  }
}

Wire Generator::bad_tools() {
  Parts p = valid_parts(chance(50) ? REMORA_CHANNEL_OP_STATUS : REMORA_CHANNEL_OP_ATTACH);
  const bool lease = (p.head.flags & REMORA_CHANNEL_FLAG_LEASE) != 0;
  const int tool_fds = static_cast<int>(p.fds.size()) - (lease ? 1 : 0);
  std::string list = valid_tools(tool_fds);
  list.pop_back();  // its NUL
  std::string what;
  switch (below(8)) {
    case 0:
      p.tools = list;
      what = "a tool list without its NUL";
      break;
    case 1:
      p.tools = list + '\0';
      p.tools[below(static_cast<uint32_t>(list.size()))] = '\0';
      what = "a tool list with a NUL inside";
      break;
    case 2:
      p.tools = std::string(1, '\0');
      what = "an empty tool list";
      break;
    case 3:
    case 7: {
      std::string entry = bad_entry(tool_fds, &what);
      p.tools = chance(50) ? entry + ":" + list : list + ":" + entry;
      p.tools += '\0';
      break;
    }
    case 4:
      p.tools = list + ":" + '\0';
      what = "a tool list ending in ':'";
      break;
    case 5:
      p.tools.clear();
      for (int i = 0; i < 17 + static_cast<int>(below(4)); ++i) p.tools += (i ? ":" : "") + name() + "|/x";
      p.tools += '\0';
      what = "more than 16 tools";
      break;
    default:
      // Each NAME|#0 grows by 15 bytes or more as NAME|/proc/self/fd/N.
      p.tools.clear();
      if (tool_fds == 0) {
        p.fds.push_back(FdKind::kDevNull);
        ++p.head.fd_count;
      }
      for (int i = 0; i < 4; ++i) p.tools += (i ? ":" : "") + std::string(1019, 'n') + "|#0";
      p.tools += '\0';
      what = "a tool list that outgrows the agent's as descriptors";
      break;
  }
  p = with_sizes(std::move(p));
  return wire_of(p, Expect::kBadArgument,
                 what + ", op " + std::to_string(p.head.op) + ", " + std::to_string(p.fds.size()) +
                     " descriptors" + (lease ? " (a lease first)" : ""));
}

Wire Generator::bad_lease() {
  Parts p = valid_parts(REMORA_CHANNEL_OP_ATTACH);
  if ((p.head.flags & REMORA_CHANNEL_FLAG_LEASE) == 0) {
    p.head.flags = REMORA_CHANNEL_FLAG_LEASE;
    p.fds.push_back(FdKind::kPipeRead);
    std::rotate(p.fds.rbegin(), p.fds.rbegin() + 1, p.fds.rend());  // first
    // The tool descriptors moved up one: a list naming them is rebuilt.
    if (!p.tools.empty()) p.tools = valid_tools(static_cast<int>(p.fds.size()) - 1);
  }
  std::string what;
  switch (below(3)) {
    case 0:
      // A status or a detach: what the agent checks last (the lease flag
      // with a request that takes none) is the only defect.
      p.head.op = chance(50) ? REMORA_CHANNEL_OP_STATUS : REMORA_CHANNEL_OP_DETACH;
      what = "a lease with op " + std::to_string(p.head.op);
      break;
    case 1:
      p.fds[0] = FdKind::kDevNull;
      what = "a lease that is /dev/null";
      break;
    default:
      p.fds.clear();
      if (!p.tools.empty()) p.tools = "/nonexistent/" + name() + std::string(1, '\0');
      what = "a lease flag with no descriptor";
      break;
  }
  p = with_sizes(std::move(p));
  return wire_of(p, Expect::kBadArgument, what);
}

// Sent (whole or in part) and closed at once: the agent answers no one.
Wire Generator::abandoned() {
  Wire w = chance(50) ? bad_env() : valid_status();
  w.pieces[0] = w.pieces[0].substr(0, below(static_cast<uint32_t>(w.pieces[0].size()) + 1));
  if (w.pieces[0].empty()) w.fds.clear();
  w.abandon = true;
  w.expect = Expect::kNothing;
  w.what = "abandoned after " + std::to_string(w.pieces[0].size()) + " bytes: " + w.what;
  return w;
}

Wire Generator::next() {
  const uint32_t r = below(100);
  Wire w;
  if (r < 8)
    w = valid_status();
  else if (r < 12)
    w = valid_attach();
  else if (r < 20)
    w = random_garbage();
  else if (r < 28)
    w = truncated_head();
  else if (r < 42)
    w = bad_head_field();
  else if (r < 50)
    w = bad_descriptor_count();
  else if (r < 58)
    w = short_body();
  else if (r < 72)
    w = bad_env();
  else if (r < 92)
    w = bad_tools();
  else if (r < 98)
    w = bad_lease();
  else
    return abandoned();
  return split(std::move(w));
}

std::vector<Wire> Generator::stalls() {
  std::vector<Wire> out;
  Wire nothing;
  nothing.what = "a stall: nothing sent";
  out.push_back(nothing);
  Wire half_head;
  half_head.pieces = {bytes_of(valid_head(REMORA_CHANNEL_OP_STATUS)).substr(0, 16)};
  half_head.fds = {FdKind::kDevNull, FdKind::kPipeRead};
  half_head.what = "a stall: half a header, two descriptors";
  out.push_back(half_head);
  Parts p = valid_parts(REMORA_CHANNEL_OP_DETACH);
  p.env = valid_env();
  p.tools = valid_tools(static_cast<int>(p.fds.size()));
  p = with_sizes(std::move(p));
  Wire half_body = wire_of(p, Expect::kBadOrNothing, "a stall: a detach whose body stops half-way");
  half_body.pieces[0].resize(sizeof(remora_channel_request) + (p.env.size() + p.tools.size()) / 2);
  out.push_back(half_body);
  for (Wire& w : out) {
    w.finish = false;
    w.expect = Expect::kBadOrNothing;
  }
  return out;
}

}  // namespace remora::fuzz
