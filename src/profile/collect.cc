#include "profile/collect.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "base/strings.h"
#include "base/unique_fd.h"
#include "procfs/procfs.h"
#include "profile/names.h"
#include "profile/perf_map.h"
#include "profile/records.h"
#include "profile/session_files.h"
#include "profile/symbolize.h"

namespace remora::profile {
namespace {

constexpr size_t kMaxPerfMapBytes = 256u << 20;

// Whether `pid` is still the process that wrote the records: alive, not a
// zombie, and its innermost pid is the one the tool saw (a pid reused by
// another process has other maps and another perf map).
bool same_process_alive(pid_t pid, int ns_pid) {
  auto st = procfs::read_status(pid);
  if (!st || st->state == 'Z' || st->state == 'X') return false;
  return st->nspid.empty() || ns_pid == 0 || st->nspid.back() == ns_pid;
}

// The JVM's jcmd: next to the running java (/proc/PID/exe), as the JDK
// installs it; "" when there is none.
std::string jcmd_of(pid_t pid) {
  char exe[4096];
  ssize_t n = ::readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), exe, sizeof exe - 1);
  if (n <= 0) return "";
  std::string path(exe, static_cast<size_t>(n));
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  std::string jcmd = path.substr(0, slash + 1) + "jcmd";
  return ::access(jcmd.c_str(), X_OK) == 0 ? jcmd : "";
}

bool is_jvm(const RawProfile& raw) {
  for (const auto& m : raw.modules)
    if (m.path.size() >= 9 && m.path.compare(m.path.size() - 9, 9, "libjvm.so") == 0) return true;
  return false;
}

// Asks a live JVM to write /tmp/perf-PID.map (jcmd PID Compiler.perfmap,
// JDK 17+), as the JVM's own user: its attach mechanism answers only its
// user. Waits at most 10 s; a JVM in another mount namespace is not asked
// (jcmd would look in our /tmp). A failure costs only the Java names.
void ask_jvm_for_perf_map(pid_t pid, std::vector<std::string>* warnings) {
  struct stat ours, theirs;
  if (::stat("/proc/self/ns/mnt", &ours) != 0 ||
      ::stat(("/proc/" + std::to_string(pid) + "/ns/mnt").c_str(), &theirs) != 0 ||
      ours.st_ino != theirs.st_ino) {
    warnings->push_back(
        "Java frames are unnamed: the JVM runs in another mount namespace, so remora did not ask it "
        "for a perf map; start it with -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit, or run "
        "`jcmd " +
        std::to_string(pid) + " Compiler.perfmap` inside its container before the detach");
    return;
  }
  std::string jcmd = jcmd_of(pid);
  auto st = procfs::read_status(pid);
  if (jcmd.empty() || !st) {
    warnings->push_back("Java frames are unnamed: no jcmd next to the JVM's java; run `jcmd " +
                        std::to_string(pid) +
                        " Compiler.perfmap` before the detach, or install the JDK's jcmd");
    return;
  }
  const std::string spid = std::to_string(pid);
  pid_t child = ::fork();
  if (child == 0) {
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    if (::setgroups(0, nullptr) != 0 || ::setgid(st->gid[1]) != 0 || ::setuid(st->uid[1]) != 0) ::_exit(126);
    ::execl(jcmd.c_str(), "jcmd", spid.c_str(), "Compiler.perfmap", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (child < 0) return;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      warnings->push_back("Java frames may be unnamed: `jcmd " + spid +
                          " Compiler.perfmap` did not finish in 10 s");
      return;
    }
    ::poll(nullptr, 0, 20);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    warnings->push_back("Java frames may be unnamed: `jcmd " + spid +
                        " Compiler.perfmap` failed (a JDK before 17 lacks it: start the JVM with "
                        "-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit)");
}

// Removes `path` (a file) as process `pid` sees it: the directory opened
// inside its root, the name unlinked there, nothing followed.
void remove_in_root(pid_t pid, const std::string& path) {
  const size_t slash = path.rfind('/');
  auto dir = procfs::open_in_root(pid, path.substr(0, slash));
  if (dir) (void)::unlinkat(dir->get(), path.substr(slash + 1).c_str(), 0);
}

// The perf maps of the session: the live target's, read safely
// (read_perf_maps) and kept in DIR, else those kept in DIR before.
std::vector<std::string> perf_maps(const std::string& dir, const RawProfile& raw, bool alive,
                                   std::vector<std::string>* warnings) {
  const std::string kept = dir + "/perf-" + std::to_string(raw.ns_pid) + ".map";
  if (alive) {
    PerfMapFiles files = read_perf_maps(raw.pid, raw.ns_pid, kMaxPerfMapBytes);
    for (auto& w : files.warnings) warnings->push_back(std::move(w));
    if (!files.texts.empty()) {
      std::string all;
      for (const auto& t : files.texts) all += t.empty() || t.back() == '\n' ? t : t + "\n";
      std::string error;
      if (!write_text_atomically(kept, all, &error))
        warnings->push_back("the perf map was read but not kept for later renders: " + error);
      return files.texts;
    }
  }
  std::vector<std::string> texts;
  if (auto text = read_session_file(kept, kMaxPerfMapBytes)) texts.push_back(std::move(*text));
  return texts;
}

// The threads of a process in a pid namespace of its own are recorded by
// the ids of that namespace: each live thread's host id is read (NSpid) and
// kept in DIR/host-tids ("NS HOST" lines, added to those kept before), which
// the render names the records by (report.cc).
void keep_host_tids(const std::string& dir, const RawProfile& raw, std::vector<std::string>* warnings) {
  const std::string kept = dir + "/host-tids";
  std::map<int32_t, int32_t> map;
  if (auto text = read_session_file(kept, 1u << 20))
    for (auto line : split_fields(*text, "\n")) {
      auto words = split_fields(line);
      auto ns = words.size() == 2 ? parse_i64(words[0]) : std::nullopt;
      auto host = words.size() == 2 ? parse_i64(words[1]) : std::nullopt;
      if (ns && host) map[static_cast<int32_t>(*ns)] = static_cast<int32_t>(*host);
    }
  if (auto tasks = procfs::list_tasks(raw.pid))
    for (pid_t tid : *tasks)
      if (auto st = procfs::read_status(raw.pid, tid); st && !st->nspid.empty()) map[st->nspid.back()] = tid;
  std::string text, error;
  for (const auto& [ns, host] : map) text += std::to_string(ns) + " " + std::to_string(host) + "\n";
  if (!write_text_atomically(kept, text, &error))
    warnings->push_back("the host ids of the threads were not kept for later renders: " + error);
}

int64_t realtime_minus_monotonic_ns() {
  timespec rt{}, mono{};
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<int64_t>(rt.tv_sec) - mono.tv_sec) * 1000000000 + (rt.tv_nsec - mono.tv_nsec);
}

}  // namespace

std::vector<std::string> debug_dirs_with_env(std::vector<std::string> dirs) {
  for (auto& d : debug_dirs_from_env(std::getenv("REMORA_DEBUG_PATH"))) dirs.push_back(std::move(d));
  return dirs;
}

Result<CollectResult> collect_session(const std::string& dir, const CollectOptions& options) {
  CollectResult result;
  const std::string names_path = dir + "/" + kNamesFile;
  const bool recorded = ::access(names_path.c_str(), F_OK) == 0;
  if (recorded && !options.again) return result;
  auto raw = read_raw_records(dir + "/" + kRawRecordsFile);
  if (!raw) return raw.error();
  if (options.pid != 0) raw->pid = options.pid;
  result.target_alive = options.live && same_process_alive(raw->pid, raw->ns_pid);
  const bool alive = result.target_alive;
  // Asked again, but the process is gone: what was recorded while it lived
  // names more than this machine's files can now.
  if (recorded && !alive) return result;
  std::vector<std::string> notes;
  // A map remora had the JVM write is removed once read (kept in DIR): the
  // target's /tmp is left as it was.
  const std::string jvm_map = "/tmp/perf-" + std::to_string(raw->ns_pid) + ".map";
  bool made_jvm_map = false;
  if (alive && options.ask_jvm && is_jvm(*raw) && !procfs::open_in_root(raw->pid, jvm_map)) {
    ask_jvm_for_perf_map(raw->pid, &notes);
    made_jvm_map = true;
  }
  if (alive && raw->ns_pid != 0 && raw->ns_pid != raw->pid) keep_host_tids(dir, *raw, &notes);

  SymbolSource src;
  src.pid = alive ? raw->pid : 0;
  src.ns_pid = raw->ns_pid;
  src.maps = raw->maps;
  src.modules = raw->modules;
  src.tool_path = raw->tool_path;
  src.perf_maps = perf_maps(dir, *raw, alive, &notes);
  if (made_jvm_map) remove_in_root(raw->pid, jvm_map);
  src.debug_dirs = debug_dirs_with_env(options.debug_dirs);
  Symbolizer sym(std::move(src));
  NameTable table = record_names(*raw, sym);
  table.notes = std::move(notes);
  table.pid = raw->pid;
  if (raw->realtime_offset_ns == 0) table.realtime_offset_ns = realtime_minus_monotonic_ns();
  std::string error;
  if (!write_text_atomically(names_path, names_to_json(table), &error))
    return Error(Errc::kIo, error + ": make the directory writable, then run `remora report " + dir + "`");
  result.collected = true;
  return result;
}

}  // namespace remora::profile
