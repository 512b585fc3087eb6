// Readers of /proc: pure parsers over text (table-tested without live
// processes) and thin live wrappers that read the file and call them.
//
// Every parser accepts the exact text the kernel produces and rejects
// malformed input with Errc::kParse naming the offending line.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "base/unique_fd.h"

namespace remora::procfs {

// One line of /proc/PID/maps.
struct MapEntry {
  uint64_t start = 0;
  uint64_t end = 0;
  bool read = false, write = false, exec = false;
  bool shared = false;     // 's' rather than 'p'
  uint64_t offset = 0;     // file offset of `start`
  uint32_t dev_major = 0;  // hex in the file
  uint32_t dev_minor = 0;
  uint64_t inode = 0;
  // Path exactly as shown, minus a trailing " (deleted)" which sets `deleted`.
  // May contain spaces; pseudo names keep their brackets ("[stack]", "[vdso]",
  // "[anon:name]"). Empty for anonymous mappings.
  std::string path;
  bool deleted = false;

  bool file_backed() const { return inode != 0; }  // pseudo files have inode 0
  uint64_t size() const { return end - start; }
  // makedev() of the major/minor pair, comparable with struct stat st_dev.
  uint64_t dev() const;
};

Result<std::vector<MapEntry>> parse_maps(std::string_view text);

// /proc/PID/status (or /proc/PID/task/TID/status).
struct Status {
  std::string name;
  char state = '?';  // first letter of State: R S D T t X Z I
  pid_t tgid = 0, pid = 0, ppid = 0, tracer_pid = 0;
  std::array<uid_t, 4> uid{};  // real, effective, saved, filesystem
  std::array<gid_t, 4> gid{};
  std::vector<pid_t> nstgid, nspid;  // outermost namespace first
  uint64_t sig_pnd = 0, shd_pnd = 0, sig_blk = 0, sig_ign = 0, sig_cgt = 0;
  int seccomp = 0;  // 0 none, 1 strict, 2 filter
  int threads = 0;
  std::optional<bool> kthread;  // "Kthread:" line, when the kernel has it
  bool has_vm = false;          // a VmSize line exists (kernel threads have none)
};

Result<Status> parse_status(std::string_view text);

// /proc/PID/stat fields Remora needs. The comm field is in parentheses and may
// itself contain spaces and ')' — the last ')' ends it.
struct Stat {
  pid_t pid = 0;
  std::string comm;
  char state = '?';
  pid_t ppid = 0;
  unsigned flags = 0;       // PF_* (PF_KTHREAD = 0x00200000)
  uint64_t start_time = 0;  // clock ticks since boot
};

Result<Stat> parse_stat(std::string_view text);

// /proc/PID/auxv: pairs of (type, value) up to AT_NULL (not included).
struct AuxEntry {
  uint64_t type;
  uint64_t value;
};
Result<std::vector<AuxEntry>> parse_auxv(std::span<const std::byte> data);
std::optional<uint64_t> auxv_get(std::span<const AuxEntry> auxv, uint64_t type);

// Whitespace-separated pids, as in task/TID/children.
Result<std::vector<pid_t>> parse_pid_list(std::string_view text);

// /proc/PID/task/TID/syscall: "running", or "NR arg1..arg6 sp pc" in hex
// (NR decimal; -1 when blocked but not in a syscall).
struct SyscallState {
  bool running = false;
  int64_t nr = -1;
  std::array<uint64_t, 6> args{};
  uint64_t sp = 0, pc = 0;
};
Result<SyscallState> parse_syscall(std::string_view text);

// ---- live readers (thin: read the file, call the parser) ----

// Reads a whole /proc file (they report size 0, so read until EOF).
// ENOENT/ESRCH become Errc::kNoSuchProcess.
Result<std::string> read_text(const std::string& path);
Result<std::vector<std::byte>> read_bytes(const std::string& path);

Result<std::vector<MapEntry>> read_maps(pid_t pid);
Result<Status> read_status(pid_t pid, pid_t tid = 0);  // tid 0: the process
Result<Stat> read_stat(pid_t pid, pid_t tid = 0);
Result<std::vector<AuxEntry>> read_auxv(pid_t pid);
Result<SyscallState> read_syscall(pid_t pid, pid_t tid);
// Thread ids from /proc/PID/task, sorted.
Result<std::vector<pid_t>> list_tasks(pid_t pid);

// Opens `path` (read-only) as process `pid` sees it: resolved inside its
// root (/proc/PID/root, openat2 RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), so
// no absolute or ".." symlink leads out of a container to a file of ours.
Result<UniqueFd> open_in_root(pid_t pid, const std::string& path);
// Children of every thread of PID (union of task/*/children), in order seen.
Result<std::vector<pid_t>> list_children(pid_t pid);

// Thread ids across pid namespaces. A process in a pid namespace of its own
// (a container) knows its threads by the ids of that namespace, which is
// what it writes into memory (gettid()); this process names them by the ids
// of its own namespace. The NSpid lines of /proc/PID/task/TID/status hold
// both (ours first, the innermost last). Where they are the same (one
// entry), both functions return `tid` without a scan.
//
// The thread of `pid` that calls itself `ns_tid` in its own namespace, as
// this process names it; kNoSuchProcess when none does.
Result<pid_t> tid_from_target_ns(pid_t pid, pid_t ns_tid);
// How thread `tid` (as this process names it) of `pid` calls itself.
Result<pid_t> tid_in_target_ns(pid_t pid, pid_t tid);

}  // namespace remora::procfs
