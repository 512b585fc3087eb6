#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "wrappers.h"

namespace remora_tool {

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

bool parse_bool(const char* name, const char* v, bool* out, std::string* error) {
  std::string s = trim(v);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(tolower(c)); });
  if (s == "1" || s == "true" || s == "yes" || s == "on")
    *out = true;
  else if (s == "0" || s == "false" || s == "no" || s == "off")
    *out = false;
  else {
    *error = std::string(name) + "='" + v + "': expected 0 or 1";
    return false;
  }
  return true;
}

bool parse_int(const char* name, const char* v, long lo, long hi, long* out, std::string* error) {
  std::string s = trim(v);
  char* end = nullptr;
  errno = 0;
  long n = strtol(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0' || n < lo || n > hi) {
    *error = std::string(name) + "='" + v + "': expected an integer from " + std::to_string(lo) + " to " +
             std::to_string(hi);
    return false;
  }
  *out = n;
  return true;
}

void add_unique(std::vector<std::string>* v, const std::string& s) {
  if (std::find(v->begin(), v->end(), s) == v->end()) v->push_back(s);
}

}  // namespace

std::vector<std::string> default_functions() {
  std::vector<std::string> out;
  for (unsigned i = 0; i < remora_fn_count; ++i)
    if (remora_fn_table[i].on_by_default) add_unique(&out, remora_fn_table[i].reported_as);
  return out;
}

std::vector<std::string> supported_functions() {
  std::vector<std::string> out;
  for (unsigned i = 0; i < remora_fn_count; ++i) add_unique(&out, remora_fn_table[i].reported_as);
  return out;
}

bool parse_config(const std::function<const char*(const char*)>& getenv_fn, Config* out, std::string* error) {
  Config c;
  if (const char* v = getenv_fn("REMORA_OUTPUT_PATH"); v && *v) c.output_path = v;
  long n;
  if (const char* v = getenv_fn("REMORA_SAMPLE_HZ"); v && *v) {
    if (!parse_int("REMORA_SAMPLE_HZ", v, 1, 10000, &n, error)) return false;
    c.hz = static_cast<int>(n);
  }
  if (const char* v = getenv_fn("REMORA_SAMPLING"); v && *v)
    if (!parse_bool("REMORA_SAMPLING", v, &c.sampling, error)) return false;
  if (const char* v = getenv_fn("REMORA_TRACING"); v && *v)
    if (!parse_bool("REMORA_TRACING", v, &c.tracing, error)) return false;
  if (const char* v = getenv_fn("REMORA_FOLD_THREADS"); v && *v)
    if (!parse_bool("REMORA_FOLD_THREADS", v, &c.fold_threads, error)) return false;
  if (const char* v = getenv_fn("REMORA_SAMPLE_SIGNAL"); v && *v) {
    if (!parse_int("REMORA_SAMPLE_SIGNAL", v, 1, 64, &n, error)) return false;
    c.signal = static_cast<int>(n);
  }
  if (const char* v = getenv_fn("REMORA_MAX_EVENTS"); v && *v) {
    if (!parse_int("REMORA_MAX_EVENTS", v, 0, 100000000, &n, error)) return false;
    c.max_events = static_cast<size_t>(n);
  }
  // REMORA_TRACE_FUNCTIONS: "a,b,c" replaces the defaults; "+a,-b" (a list
  // whose first entry starts with + or -) edits them; "default", "all" and
  // "none" are sets.
  const char* tf = getenv_fn("REMORA_TRACE_FUNCTIONS");
  if (tf == nullptr) {
    c.functions = default_functions();
  } else {
    std::string list = tf;
    std::vector<std::string> tokens;
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t comma = list.find(',', pos);
      if (comma == std::string::npos) comma = list.size();
      std::string t = trim(list.substr(pos, comma - pos));
      if (!t.empty()) tokens.push_back(t);
      pos = comma + 1;
    }
    if (!tokens.empty() && (tokens[0][0] == '+' || tokens[0][0] == '-')) c.functions = default_functions();
    std::vector<std::string> supported = supported_functions();
    for (std::string t : tokens) {
      bool remove = t[0] == '-';
      if (t[0] == '+' || t[0] == '-') t = trim(t.substr(1));
      std::vector<std::string> names;
      if (t == "none") {
        if (!remove) c.functions.clear();
        continue;
      }
      if (t == "default")
        names = default_functions();
      else if (t == "all")
        names = supported;
      else
        names = {t};
      for (const auto& name : names) {
        if (remove)
          c.functions.erase(std::remove(c.functions.begin(), c.functions.end(), name), c.functions.end());
        else
          add_unique(&c.functions, name);
      }
    }
  }
  *out = c;
  return true;
}

}  // namespace remora_tool
