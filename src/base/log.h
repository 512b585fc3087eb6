// Logging by channel, switched on by REMORA_LOG, e.g. REMORA_LOG=ptrace,remote
// or REMORA_LOG=all. Channel "ptrace" traces every ptrace request. Output goes
// to stderr with the thread id; nothing is logged unless asked for.
#pragma once

#include <cstdarg>

namespace remora::log {

enum class Channel : unsigned {
  kPtrace = 1u << 0,  // every ptrace request and wait result
  kRemote = 1u << 1,  // remote call transactions
  kElf = 1u << 2,     // image parsing and symbol lookup
  kProcfs = 1u << 3,  // /proc reads
  kControl = 1u << 4,
  kAttach = 1u << 5,
};

// True when the channel was enabled through REMORA_LOG (read once).
bool enabled(Channel c);

// printf-style message on a channel; cheap when the channel is off.
void write(Channel c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace remora::log

#define REMORA_LOG(chan, ...)                                          \
  do {                                                                 \
    if (::remora::log::enabled(::remora::log::Channel::chan))          \
      ::remora::log::write(::remora::log::Channel::chan, __VA_ARGS__); \
  } while (0)
