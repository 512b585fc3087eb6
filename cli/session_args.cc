#include "cli/session_args.h"

#include <cctype>
#include <cstdio>

namespace remora::cli {

Result<std::vector<std::string>> split_tool_list(std::string_view spec) {
  std::vector<std::string> out;
  if (spec.empty()) return Error(Errc::kInvalidArgument, "empty tool list (-t LIB[:LIB...])");
  size_t start = 0;
  for (;;) {
    size_t colon = spec.find(':', start);
    std::string_view item = spec.substr(start, colon == std::string_view::npos ? spec.npos : colon - start);
    if (item.empty())
      return Error(Errc::kInvalidArgument,
                   "empty entry in tool list '" + std::string(spec) + "' (separate libraries with one ':')");
    out.emplace_back(item);
    if (colon == std::string_view::npos) break;
    start = colon + 1;
  }
  return out;
}

Result<std::pair<std::string, std::string>> parse_env_assignment(std::string_view text) {
  size_t eq = text.find('=');
  if (eq == std::string_view::npos)
    return Error(Errc::kInvalidArgument, "-e takes NAME=VALUE, got '" + std::string(text) + "'");
  std::string_view name = text.substr(0, eq);
  bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) valid = valid && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!valid)
    return Error(Errc::kInvalidArgument,
                 "-e " + std::string(text) + ": '" + std::string(name) +
                     "' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
  return std::pair<std::string, std::string>(std::string(name), std::string(text.substr(eq + 1)));
}

std::vector<std::pair<std::string, std::string>> forwarded_environment(const char* const* envp) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* const* e = envp; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (!kv.starts_with("REMORA_") && !kv.starts_with("ROCP")) continue;
    auto parsed = parse_env_assignment(kv);
    if (!parsed) continue;
    set_env(out, std::move(parsed->first), std::move(parsed->second));
  }
  return out;
}

void set_env(std::vector<std::pair<std::string, std::string>>& env, std::string name, std::string value) {
  for (auto& [n, v] : env) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  env.emplace_back(std::move(name), std::move(value));
}

const std::string* find_env(const std::vector<std::pair<std::string, std::string>>& env,
                            std::string_view name) {
  for (const auto& [n, v] : env)
    if (n == name) return &v;
  return nullptr;
}

std::string absolute_path(std::string_view path, std::string_view base) {
  std::string joined =
      !path.empty() && path[0] == '/' ? std::string(path) : std::string(base) + "/" + std::string(path);
  std::vector<std::string_view> parts;
  std::string_view rest = joined;
  while (!rest.empty()) {
    size_t slash = rest.find('/');
    std::string_view seg = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (seg.empty() || seg == ".") continue;
    if (seg == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(seg);
  }
  std::string out;
  for (auto seg : parts) {
    out += '/';
    out += seg;
  }
  return out.empty() ? "/" : out;
}

pid_t output_dir_pid(std::string_view name) {
  // Parse from the right: comm may itself hold '-' and digits.
  // ...-<pid>-s<session>-<YYYYmmdd>-<HHMMSS>[-N]
  auto all_digits = [](std::string_view s) {
    if (s.empty()) return false;
    for (char c : s)
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    return true;
  };
  std::vector<std::string_view> fields;
  size_t start = 0;
  for (;;) {
    size_t dash = name.find('-', start);
    fields.push_back(name.substr(start, dash == std::string_view::npos ? name.npos : dash - start));
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  // From the right: fields[j] = "s<session>", then YYYYmmdd, HHMMSS and at
  // most one "-N"; fields[j-1] is the pid, and at least one comm field precedes.
  for (size_t j = fields.size(); j-- > 2;) {
    std::string_view s = fields[j];
    if (s.size() < 2 || s[0] != 's' || !all_digits(s.substr(1))) continue;
    size_t after = fields.size() - j - 1;
    if (after != 2 && after != 3) continue;
    if (fields[j + 1].size() != 8 || !all_digits(fields[j + 1])) continue;
    if (fields[j + 2].size() != 6 || !all_digits(fields[j + 2])) continue;
    if (after == 3 && !all_digits(fields[j + 3])) continue;
    std::string_view pid = fields[j - 1];
    if (!all_digits(pid) || pid.size() > 9) return 0;
    long v = 0;
    for (char c : pid) v = v * 10 + (c - '0');
    return v > 0 ? static_cast<pid_t>(v) : 0;
  }
  return 0;
}

std::string format_elapsed(std::chrono::milliseconds d) {
  long ms = static_cast<long>(d.count());
  if (ms < 0) ms = 0;
  char buf[64];
  if (ms < 10'000) {
    std::snprintf(buf, sizeof buf, "%ld.%ld s", ms / 1000, (ms % 1000) / 100);
  } else if (ms < 60'000) {
    std::snprintf(buf, sizeof buf, "%ld s", ms / 1000);
  } else if (ms < 3'600'000) {
    std::snprintf(buf, sizeof buf, "%ld min %02ld s", ms / 60'000, (ms / 1000) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld h %02ld min", ms / 3'600'000, (ms / 60'000) % 60);
  }
  return buf;
}

std::string count_noun(size_t n, std::string_view singular, std::string_view plural) {
  return std::to_string(n) + " " + std::string(n == 1 ? singular : plural);
}

std::string shell_quote(std::string_view s) {
  bool plain = !s.empty();
  for (char c : s) {
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) ||
                      std::string_view("_./:=+,@%-").find(c) != std::string_view::npos);
  }
  if (plain) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

}  // namespace remora::cli
