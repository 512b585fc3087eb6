// Helpers for the suites that drive remote::Target (tests/remote and others).
// Header-only, so that remora_test_harness itself does not depend on the
// engine; include it only from suites that link remora_remote.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "harness.h"
#include "remote/target.h"

namespace remora::test {

// "kind: full message with contexts", for failure output.
inline std::string describe(const Error& e) {
  return std::string(errc_name(e.code())) + " (" + std::to_string(static_cast<int>(e.code())) +
         "): " + e.to_string();
}

// Opens a Target or throws HarnessError with the engine's message.
inline std::unique_ptr<remote::Target> open_target(pid_t pid) {
  auto r = remote::Target::open(pid);
  if (!r.ok()) throw HarnessError("Target::open(" + std::to_string(pid) + "): " + describe(r.error()));
  return std::move(r).value();
}

// remora_probe's result for (a, b), computed as the target does (two's
// complement wrap-around).
inline uint64_t probe_expected(int64_t a, int64_t b) {
  return static_cast<uint64_t>(a) * 31u + static_cast<uint64_t>(b);
}

inline std::vector<remote::CallArg> probe_args(int64_t a, int64_t b) {
  return {remote::CallArg::integer(static_cast<uint64_t>(a)),
          remote::CallArg::integer(static_cast<uint64_t>(b))};
}

// "check:<n>:abcd...": remora_probe_string verifies every payload byte.
inline std::string check_string(size_t n) {
  std::string s = "check:" + std::to_string(n) + ":";
  for (size_t i = 0; i < n; ++i) s += static_cast<char>('a' + i % 26);
  return s;
}

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

inline bool contains_icase(const std::string& hay, const std::string& needle) {
  return lower(hay).find(lower(needle)) != std::string::npos;
}

}  // namespace remora::test
