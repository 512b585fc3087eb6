#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

// REMORA_OUTPUT_FD="N:INODE:PID". The inode makes a value left in the
// environment by an earlier session (the agent keeps what it set) harmless:
// descriptor N is used only while it is that very memfd, never a file of the
// program's that took the number since. The pid (as this process sees
// itself) keeps a child forked since out: it inherited the very same memfd
// and the environment, and two writers would mix their sessions.
bool parse_output_fd(const char* v, int* out, std::string* error) {
  std::string s = trim(v);
  size_t colon = s.find(':');
  size_t colon2 = colon == std::string::npos ? colon : s.find(':', colon + 1);
  long fd = -1, pid = 0;
  unsigned long long ino = 0;
  char* end = nullptr;
  bool ok = colon != std::string::npos && colon > 0;
  if (ok) {
    errno = 0;
    fd = strtol(s.substr(0, colon).c_str(), &end, 10);
    ok = errno == 0 && *end == '\0' && fd >= 0 && fd <= 1 << 20;
  }
  if (ok && colon2 != std::string::npos) {
    std::string mid = s.substr(colon + 1, colon2 - colon - 1), tail = s.substr(colon2 + 1);
    errno = 0;
    ino = strtoull(mid.c_str(), &end, 10);
    ok = !mid.empty() && errno == 0 && *end == '\0' && ino != 0;
    if (ok) {
      pid = strtol(tail.c_str(), &end, 10);
      ok = !tail.empty() && errno == 0 && *end == '\0' && pid > 0;
    }
  } else {
    ok = false;
  }
  if (!ok) {
    *error = std::string("REMORA_OUTPUT_FD='") + v + "': expected N:INODE:PID (set by remora)";
    return false;
  }
  if (pid != static_cast<long>(getpid())) {
    *error = std::string("REMORA_OUTPUT_FD='") + v + "': made for process " + std::to_string(pid) +
             ", not this one (" + std::to_string(getpid()) +
             "): a process whose root has no writable directory is profiled alone (--attach-children=false)";
    return false;
  }
  struct stat st;
  if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode) || st.st_ino != ino) {
    *error = std::string("REMORA_OUTPUT_FD='") + v + "': descriptor " + std::to_string(fd) +
             " is not the memfd remora made for this session (closed, or another file)";
    return false;
  }
  *out = static_cast<int>(fd);
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
  if (const char* v = getenv_fn("REMORA_OUTPUT_FD"); v && *v)
    if (!parse_output_fd(v, &c.output_fd, error)) return false;
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
