// Pure parsing and formatting shared by `remora attach`, `detach`, `status`
// and `run`: tool lists, NAME=VALUE assignments, output directory names,
// durations. No process is touched here (session_args_test.cc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace remora::cli {

// "LIB[:LIB...]" -> the libraries in order. Empty entries ("a::b", a
// trailing ':') are an error, so a typo never attaches fewer tools than meant.
Result<std::vector<std::string>> split_tool_list(std::string_view spec);

// "NAME=VALUE" (VALUE may be empty or hold '='). NAME must be a portable
// environment variable name: [A-Za-z_][A-Za-z0-9_]*.
Result<std::pair<std::string, std::string>> parse_env_assignment(std::string_view text);

// Sets NAME=VALUE in `env`, replacing an earlier NAME (the last one wins).
void set_env(std::vector<std::pair<std::string, std::string>>& env, std::string name, std::string value);
// The value of NAME in `env`, or nullptr.
const std::string* find_env(const std::vector<std::pair<std::string, std::string>>& env,
                            std::string_view name);

// The variables of `envp` (an environ-style array, NULL-terminated) that a
// session forwards to its targets, as the C API's rocattach layer and the
// Python package do: those whose name starts with REMORA_ or ROCP. Entries
// without '=' and names that are not portable are skipped. Command-line -e
// assignments are applied on top (set_env), so -e wins.
std::vector<std::pair<std::string, std::string>> forwarded_environment(const char* const* envp);

// `path` made absolute against `base` (an absolute directory), with "." and
// ".." segments and repeated slashes removed lexically (no symlink is
// resolved: the path names a directory as the target process will see it).
std::string absolute_path(std::string_view path, std::string_view base);

// The default tool names its session directories
// "<comm>-<pid>-s<session>-<YYYYmmdd-HHMMSS>[-N]" (tools/default/tool.cc).
// The pid in such a name, or 0 when `name` is not one (the "-latest" links
// are not session directories).
pid_t output_dir_pid(std::string_view name);

// "1.2 s", "12 s", "3 min 05 s", "2 h 03 min": for the progress line.
std::string format_elapsed(std::chrono::milliseconds d);

// "1 process" / "3 processes".
std::string count_noun(size_t n, std::string_view singular, std::string_view plural);

// `s` shell-quoted when it holds anything but [A-Za-z0-9_./:=+,@%-] (for
// commands printed for the user to paste).
std::string shell_quote(std::string_view s);

}  // namespace remora::cli
