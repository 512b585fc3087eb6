// The controller's half of a default-tool session, for the tests that drive
// the tool inside their own process: the tool leaves raw records
// (profile.remora) at detach and the controller renders every output from
// them (src/profile/report.h), as `remora attach` does.
#ifndef REMORA_TESTS_DEFAULT_TOOL_RENDER_H_
#define REMORA_TESTS_DEFAULT_TOOL_RENDER_H_

#include <gtest/gtest.h>

#include <string>

#include "profile/report.h"

// Renders session directory `dir` and returns it ("" when it failed, with
// the reason as a test failure).
inline std::string rendered(const std::string& dir) {
  auto r = remora::profile::render_session(dir);
  if (!r) {
    ADD_FAILURE() << "render_session(" << dir << "): " << r.error().to_string();
    return "";
  }
  return dir;
}

#endif  // REMORA_TESTS_DEFAULT_TOOL_RENDER_H_
