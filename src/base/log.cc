#include "base/log.h"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace remora::log {
namespace {

struct ChannelName {
  Channel channel;
  const char* name;
};
constexpr ChannelName kChannels[] = {
    {Channel::kPtrace, "ptrace"}, {Channel::kRemote, "remote"},   {Channel::kElf, "elf"},
    {Channel::kProcfs, "procfs"}, {Channel::kControl, "control"}, {Channel::kAttach, "attach"},
};

unsigned parse_mask() {
  const char* env = std::getenv("REMORA_LOG");
  if (env == nullptr) return 0;
  std::string_view rest(env);
  unsigned mask = 0;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    if (item == "all") mask = ~0u;
    for (const auto& c : kChannels)
      if (item == c.name) mask |= static_cast<unsigned>(c.channel);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return mask;
}

const char* name_of(Channel c) {
  for (const auto& ch : kChannels)
    if (ch.channel == c) return ch.name;
  return "?";
}

}  // namespace

bool enabled(Channel c) {
  static const unsigned mask = parse_mask();
  return (mask & static_cast<unsigned>(c)) != 0;
}

void write(Channel c, const char* fmt, ...) {
  char buf[1024];
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  int n = std::snprintf(buf, sizeof buf, "[remora %ld.%06ld %s %d] ", static_cast<long>(ts.tv_sec),
                        ts.tv_nsec / 1000, name_of(c), static_cast<int>(gettid()));
  va_list ap;
  va_start(ap, fmt);
  if (n > 0 && static_cast<size_t>(n) < sizeof buf)
    std::vsnprintf(buf + n, sizeof buf - static_cast<size_t>(n), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%s\n", buf);
}

}  // namespace remora::log
