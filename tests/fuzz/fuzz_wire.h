// Requests for the socket channel (agent/channel_wire.h), broken in every
// way the agent must refuse, and the few well-formed ones it must serve:
// what one connection of the fuzzer sends, and what the agent must answer.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "agent/channel_wire.h"

namespace remora::fuzz {

// What the agent must answer.
enum class Expect {
  kBadArgument,      // REMORA_AGENT_ERR_BAD_ARGUMENT and a message
  kStatus,           // REMORA_AGENT_OK: the state, nothing changed
  kAlreadyAttached,  // a well-formed attach: refused, the other session holds the process
  kBadOrNothing,     // a request that stalls: BAD_ARGUMENT once the agent gives up on it, or closed
  kNothing,          // the client went away without reading
};
const char* expect_name(Expect e);

// A descriptor sent with the request (SCM_RIGHTS).
enum class FdKind { kDevNull, kPipeRead, kPipeWrite };

// One connection's worth.
struct Wire {
  std::string what;                 // for failure messages
  std::vector<std::string> pieces;  // sent in order, the descriptors with the first
  std::vector<FdKind> fds;
  bool finish = true;    // shut the write side after the last piece (else: a stall)
  bool abandon = false;  // close right after sending, read nothing
  Expect expect = Expect::kBadArgument;
};

// A request's parts before they are bytes.
struct Parts {
  remora_channel_request head{};
  std::string env;
  std::string tools;  // with its NUL, as sent
  std::vector<FdKind> fds;
};

remora_channel_request valid_head(uint32_t op);
std::string bytes_of(const remora_channel_request& head);
std::string bytes_of(const Parts& p);
// The agent's environment buffer: [uint32 count] then NAME\0VALUE\0 pairs.
std::string env_buffer(uint32_t count, const std::vector<std::pair<std::string, std::string>>& pairs);
// Parts whose sizes and descriptor count agree with what they hold.
Parts with_sizes(Parts p);
// A wire of well-formed pieces: `p` sent in one go.
Wire wire_of(const Parts& p, Expect expect, std::string what);

// The seeded generator of the storm. Detach requests always carry a defect
// that the agent finds before it looks at the tool list (a well-formed
// detach would end the session the fuzzer must leave alone).
class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}
  Wire next();
  // Requests that stop half-way and stay open (the agent gives up after
  // its read timeout).
  std::vector<Wire> stalls();

 private:
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }
  bool chance(uint32_t percent) { return below(100) < percent; }
  std::string random_bytes(size_t n);
  std::string name();
  std::string valid_env();
  // A tool list of 1..4 entries that is well-formed for `tool_fds`
  // descriptors after the lease (if any); NAME|#K entries use K < tool_fds.
  std::string valid_tools(int tool_fds);
  Parts valid_parts(uint32_t op);
  Wire split(Wire w);
  std::string bad_entry(int tool_fds, std::string* what);

  Wire valid_status();
  Wire valid_attach();
  Wire random_garbage();
  Wire truncated_head();
  Wire bad_head_field();
  Wire bad_descriptor_count();
  Wire short_body();
  Wire bad_env();
  Wire bad_tools();
  Wire bad_lease();
  Wire abandoned();

  std::mt19937_64 rng_;
};

}  // namespace remora::fuzz
