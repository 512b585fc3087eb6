#include "procfs/procfs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include <linux/openat2.h>

#include "base/strings.h"
#include "base/unique_fd.h"

namespace remora::procfs {
namespace {

// ---- parsing helpers ----

Error parse_error(std::string_view what, size_t line_no, std::string_view line) {
  std::string msg(what);
  msg += ": line ";
  msg += std::to_string(line_no);
  msg += ": \"";
  msg += line;
  msg += '"';
  return Error(Errc::kParse, std::move(msg));
}

// Walks '\n'-terminated lines. The kernel ends every line, the last included,
// with '\n'; a final unterminated piece is accepted too (a test string, or a
// caller that trimmed the text).
class LineReader {
 public:
  explicit LineReader(std::string_view text) : rest_(text) {}
  // Sets `line` (without its '\n') and returns true, or false at the end.
  bool next(std::string_view& line) {
    if (rest_.empty()) return false;
    ++line_no_;
    size_t nl = rest_.find('\n');
    line = rest_.substr(0, nl);
    rest_ = nl == std::string_view::npos ? std::string_view{} : rest_.substr(nl + 1);
    return true;
  }
  size_t line_no() const { return line_no_; }

 private:
  std::string_view rest_;
  size_t line_no_ = 0;
};

// Takes the next space-delimited token from `rest`, skipping leading spaces.
std::string_view next_token(std::string_view& rest) {
  size_t b = rest.find_first_not_of(' ');
  if (b == std::string_view::npos) {
    rest = {};
    return {};
  }
  size_t e = rest.find(' ', b);
  if (e == std::string_view::npos) e = rest.size();
  std::string_view tok = rest.substr(b, e - b);
  rest.remove_prefix(e);
  return tok;
}

std::optional<pid_t> parse_pid(std::string_view s) {
  auto v = parse_u64(s, 10);
  if (!v || *v > static_cast<uint64_t>(std::numeric_limits<pid_t>::max())) return std::nullopt;
  return static_cast<pid_t>(*v);
}

std::optional<uint32_t> parse_u32(std::string_view s, int base) {
  auto v = parse_u64(s, base);
  if (!v || *v > std::numeric_limits<uint32_t>::max()) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

// "0x1f": the kernel prints syscall arguments with "0x%llx"; require the prefix
// so that a decimal field in the wrong place is not silently read as hex.
std::optional<uint64_t> parse_0x(std::string_view s) {
  if (s.size() < 3 || s[0] != '0' || s[1] != 'x') return std::nullopt;
  return parse_u64(s.substr(2), 16);
}

constexpr std::string_view kDeletedSuffix = " (deleted)";

Result<MapEntry> parse_maps_line(std::string_view line, size_t line_no) {
  auto bad = [&](std::string_view why) { return parse_error("maps: " + std::string(why), line_no, line); };
  MapEntry e;
  std::string_view rest = line;

  // Format (fs/proc/task_mmu.c show_vma_header_prefix):
  //   "%08lx-%08lx %c%c%c%c %08llx %02x:%02x %lu "
  // then, when the mapping has a name, spaces padding to a fixed column and
  // the name. Anonymous mappings end right after "inode ".
  std::string_view range = next_token(rest);
  size_t dash = range.find('-');
  if (dash == std::string_view::npos) return bad("address range without '-'");
  auto start = parse_u64(range.substr(0, dash), 16);
  auto end = parse_u64(range.substr(dash + 1), 16);
  if (!start || !end) return bad("bad address range");
  if (*start > *end) return bad("range start above end");
  e.start = *start;
  e.end = *end;

  std::string_view perms = next_token(rest);
  if (perms.size() != 4) return bad("bad permissions");
  auto flag = [](char c, char set, bool& out) {
    if (c == set) {
      out = true;
      return true;
    }
    return c == '-';
  };
  if (!flag(perms[0], 'r', e.read) || !flag(perms[1], 'w', e.write) || !flag(perms[2], 'x', e.exec))
    return bad("bad permissions");
  if (perms[3] == 's') {
    e.shared = true;
  } else if (perms[3] != 'p') {
    return bad("bad permissions");
  }

  auto offset = parse_u64(next_token(rest), 16);
  if (!offset) return bad("bad offset");
  e.offset = *offset;

  // Major and minor are hex; "%02x" is a minimum width, larger numbers print
  // more digits (minors go up to 20 bits).
  std::string_view dev = next_token(rest);
  size_t colon = dev.find(':');
  if (colon == std::string_view::npos) return bad("bad device");
  auto major = parse_u32(dev.substr(0, colon), 16);
  auto minor = parse_u32(dev.substr(colon + 1), 16);
  if (!major || !minor) return bad("bad device");
  e.dev_major = *major;
  e.dev_minor = *minor;

  auto inode = parse_u64(next_token(rest), 10);
  if (!inode) return bad("bad inode");
  e.inode = *inode;

  // The name is everything after the padding. It is not trimmed at the end:
  // a file name may end in spaces. It cannot contain '\n' (the kernel escapes
  // it as "\012"), so lines stay intact. File names always start with '/'
  // and pseudo names with '[' or a word ("anon_inode:..."), so skipping the
  // leading padding never eats part of a name.
  size_t b = rest.find_first_not_of(' ');
  std::string_view path = b == std::string_view::npos ? std::string_view{} : rest.substr(b);
  // d_path() appends " (deleted)" to an unlinked file's name. Only a suffix
  // counts: "/tmp/a (deleted) b" is a live file with an odd name. (A live file
  // literally named "x (deleted)" is indistinguishable here; the kernel gives
  // no way to tell, and callers that care compare inodes.)
  if (path.size() > kDeletedSuffix.size() && path.ends_with(kDeletedSuffix)) {
    path.remove_suffix(kDeletedSuffix.size());
    e.deleted = true;
  }
  e.path = std::string(path);
  return e;
}

// Error mapping for the live readers: the caller learns whether the process
// is gone, whether it may not look, or whether something else failed.
Error file_error(std::string_view op, const std::string& path, int err) {
  std::string what(op);
  what += ' ';
  what += path;
  switch (err) {
    case ENOENT:
    case ESRCH:
      // ENOENT: the /proc/PID directory is gone (or never existed). ESRCH:
      // the task exited between open() and read() (e.g. maps, auxv).
      return Error(Errc::kNoSuchProcess, what + ": no such process (it exited, or the pid is wrong)", err);
    case EACCES:
    case EPERM:
      // maps, auxv, syscall, environ... need PTRACE_MODE_READ (or ATTACH)
      // access to the target, checked at open and again at read.
      return Error(Errc::kPtraceDenied,
                   what + ": " + std::strerror(err) +
                       " (reading it needs ptrace access to the process: the same uid and a "
                       "dumpable process, or CAP_SYS_PTRACE; see also "
                       "/proc/sys/kernel/yama/ptrace_scope)",
                   err);
    default: return Error::from_errno(what, err);
  }
}

Result<UniqueFd> open_read(const std::string& path, int extra_flags = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return file_error("open", path, errno);
  return UniqueFd(fd);
}

// Appends the whole content of a /proc file to `out`. st_size is 0 for them,
// so read in chunks until read() returns 0. Each chunk lands on the stack
// first: growing `out` by a whole chunk before each read would zero 16 KiB
// twice for every small file (status, auxv, a single-page maps).
template <typename Buf>
Result<void> read_all(const std::string& path, Buf& out) {
  UniqueFd fd = REMORA_TRY(open_read(path));
  constexpr size_t kChunk = 16384;  // seq_file hands out at most about a page per read anyway
  alignas(16) char chunk[kChunk];
  for (;;) {
    ssize_t n = ::read(fd.get(), chunk, kChunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return file_error("read", path, errno);
    }
    if (n == 0) return ok();
    const size_t old = out.size();
    out.resize(old + static_cast<size_t>(n));
    std::memcpy(out.data() + old, chunk, static_cast<size_t>(n));
  }
}

std::string proc_path(pid_t pid, pid_t tid, std::string_view leaf) {
  std::string p = "/proc/" + std::to_string(pid);
  if (tid != 0) p += "/task/" + std::to_string(tid);
  p += '/';
  p += leaf;
  return p;
}

}  // namespace

uint64_t MapEntry::dev() const { return makedev(dev_major, dev_minor); }

Result<std::vector<MapEntry>> parse_maps(std::string_view text) {
  std::vector<MapEntry> out;
  LineReader lines(text);
  std::string_view line;
  while (lines.next(line)) out.push_back(REMORA_TRY(parse_maps_line(line, lines.line_no())));
  return out;
}

namespace {

// One "Key:\tvalue" line of /proc/PID/status into `st`; unknown keys are
// skipped (the kernel adds lines over time).
Result<void> parse_status_line(Status& st, std::string_view line, size_t line_no, bool& have_pid,
                               bool& have_state) {
  auto bad = [&](std::string_view why) { return parse_error("status: " + std::string(why), line_no, line); };
  // Every line is "Key:\tvalue" (fs/proc/array.c).
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return bad("line without ':'");
  std::string_view key = line.substr(0, colon);
  std::string_view raw = line.substr(colon + 1);
  std::string_view value = trim(raw);

  auto one_pid = [&](pid_t& out) -> Result<void> {
    auto v = parse_pid(value);
    if (!v) return bad("bad number");
    out = *v;
    return ok();
  };
  auto ids = [&](auto& out) -> Result<void> {
    auto f = split_fields(value, " \t");
    if (f.size() != out.size()) return bad("expected 4 ids");
    for (size_t i = 0; i < f.size(); ++i) {
      auto v = parse_u32(f[i], 10);
      if (!v) return bad("bad id");
      out[i] = *v;
    }
    return ok();
  };
  auto pid_list = [&](std::vector<pid_t>& out) -> Result<void> {
    // One field per pid namespace the task is visible in, outermost first.
    auto f = split_fields(value, " \t");
    if (f.empty()) return bad("empty pid list");
    out.clear();
    for (auto s : f) {
      auto v = parse_pid(s);
      if (!v) return bad("bad pid");
      out.push_back(*v);
    }
    return ok();
  };
  auto sigmask = [&](uint64_t& out) -> Result<void> {
    // render_sigset_t prints _NSIG/4 hex digits (16 on x86_64 and aarch64).
    auto v = parse_u64(value, 16);
    if (!v) return bad("bad signal mask");
    out = *v;
    return ok();
  };
  auto small_int = [&](int& out) -> Result<void> {
    auto v = parse_u64(value, 10);
    if (!v || *v > static_cast<uint64_t>(std::numeric_limits<int>::max())) return bad("bad number");
    out = static_cast<int>(*v);
    return ok();
  };

  if (key == "Name") {
    // "Name:\t" then the comm, escaped by the kernel ('\n' becomes "\\n").
    // It may begin or end with spaces, so drop only the one tab separator.
    std::string_view name = raw;
    if (name.starts_with('\t')) name.remove_prefix(1);
    st.name = std::string(name);
  } else if (key == "State") {
    // "State:\tS (sleeping)"
    if (value.empty()) return bad("empty state");
    st.state = value[0];
    have_state = true;
  } else if (key == "Tgid") {
    REMORA_TRY(one_pid(st.tgid));
  } else if (key == "Pid") {
    REMORA_TRY(one_pid(st.pid));
    have_pid = true;
  } else if (key == "PPid") {
    REMORA_TRY(one_pid(st.ppid));
  } else if (key == "TracerPid") {
    REMORA_TRY(one_pid(st.tracer_pid));
  } else if (key == "Uid") {
    REMORA_TRY(ids(st.uid));
  } else if (key == "Gid") {
    REMORA_TRY(ids(st.gid));
  } else if (key == "NStgid") {
    REMORA_TRY(pid_list(st.nstgid));
  } else if (key == "NSpid") {
    REMORA_TRY(pid_list(st.nspid));
  } else if (key == "SigPnd") {
    REMORA_TRY(sigmask(st.sig_pnd));
  } else if (key == "ShdPnd") {
    REMORA_TRY(sigmask(st.shd_pnd));
  } else if (key == "SigBlk") {
    REMORA_TRY(sigmask(st.sig_blk));
  } else if (key == "SigIgn") {
    REMORA_TRY(sigmask(st.sig_ign));
  } else if (key == "SigCgt") {
    REMORA_TRY(sigmask(st.sig_cgt));
  } else if (key == "Seccomp") {
    REMORA_TRY(small_int(st.seccomp));
  } else if (key == "Threads") {
    REMORA_TRY(small_int(st.threads));
  } else if (key == "Kthread") {
    // Added in Linux 6.10; older kernels need Stat::flags & PF_KTHREAD.
    if (value == "0") {
      st.kthread = false;
    } else if (value == "1") {
      st.kthread = true;
    } else {
      return bad("bad Kthread value");
    }
  } else if (key == "VmSize") {
    // Kernel threads (and zombies, whose mm is gone) have no Vm* lines.
    st.has_vm = true;
  }
  return ok();
}

}  // namespace

Result<Status> parse_status(std::string_view text) {
  Status st;
  bool have_pid = false, have_state = false;
  LineReader lines(text);
  std::string_view line;
  while (lines.next(line)) REMORA_TRY(parse_status_line(st, line, lines.line_no(), have_pid, have_state));
  if (!have_pid) return Error(Errc::kParse, "status: no Pid line");
  if (!have_state) return Error(Errc::kParse, "status: no State line");
  return st;
}

Result<Stat> parse_stat(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Error(Errc::kParse, "stat: " + std::string(why) + ": \"" + std::string(text) + '"');
  };
  // "pid (comm) state ppid ..." (fs/proc/array.c do_task_stat). The comm is
  // printed raw, unescaped: it may hold spaces, '(' , ')' and even '\n', so
  // only the last ')' in the text ends it; the numeric fields after it never
  // contain one.
  if (text.ends_with('\n')) text.remove_suffix(1);
  size_t open = text.find(" (");
  size_t close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open + 2)
    return bad("no (comm)");
  Stat st;
  auto pid = parse_pid(text.substr(0, open));
  if (!pid) return bad("bad pid");
  st.pid = *pid;
  st.comm = std::string(text.substr(open + 2, close - (open + 2)));

  // fields[0] is field 3 of proc(5) (state): field N is fields[N - 3].
  auto fields = split_fields(text.substr(close + 1), " ");
  if (fields.size() < 20) return bad("too few fields");
  if (fields[0].size() != 1) return bad("bad state");
  st.state = fields[0][0];
  auto ppid = parse_pid(fields[4 - 3]);
  if (!ppid) return bad("bad ppid");
  st.ppid = *ppid;
  auto flags = parse_u32(fields[9 - 3], 10);
  if (!flags) return bad("bad flags");
  st.flags = *flags;
  auto start = parse_u64(fields[22 - 3], 10);
  if (!start) return bad("bad starttime");
  st.start_time = *start;
  return st;
}

Result<std::vector<AuxEntry>> parse_auxv(std::span<const std::byte> data) {
  // Native 64-bit (type, value) pairs, as saved at exec (mm->saved_auxv).
  // The list ends with AT_NULL; anything after it is padding.
  constexpr size_t kPair = 2 * sizeof(uint64_t);
  std::vector<AuxEntry> out;
  for (size_t off = 0; off + kPair <= data.size(); off += kPair) {
    uint64_t pair[2];
    std::memcpy(pair, data.data() + off, kPair);  // the buffer may be unaligned
    if (pair[0] == 0) return out;                 // AT_NULL
    out.push_back(AuxEntry{pair[0], pair[1]});
  }
  return Error(Errc::kParse, "auxv: " + std::to_string(data.size()) + " bytes end before AT_NULL");
}

std::optional<uint64_t> auxv_get(std::span<const AuxEntry> auxv, uint64_t type) {
  for (const auto& e : auxv)
    if (e.type == type) return e.value;
  return std::nullopt;
}

Result<std::vector<pid_t>> parse_pid_list(std::string_view text) {
  std::vector<pid_t> out;
  for (auto f : split_fields(text, " \t\n")) {
    auto v = parse_pid(f);
    if (!v || *v == 0) return Error(Errc::kParse, "pid list: bad pid \"" + std::string(f) + '"');
    out.push_back(*v);
  }
  return out;
}

Result<SyscallState> parse_syscall(std::string_view text) {
  // fs/proc/base.c proc_pid_syscall:
  //   "running"                      the task is on a CPU (no stable state)
  //   "%d 0x%llx 0x%llx"             nr < 0: blocked, not in a syscall (sp pc)
  //   "%d 0x%llx x6 0x%llx 0x%llx"   in syscall nr: args, sp, pc
  auto bad = [&](std::string_view why) {
    return Error(Errc::kParse, "syscall: " + std::string(why) + ": \"" + std::string(text) + '"');
  };
  std::string_view t = trim(text);
  SyscallState s;
  if (t == "running") {
    s.running = true;
    return s;
  }
  auto f = split_fields(t, " ");
  if (f.empty()) return bad("empty");
  // NR is decimal ("%d"), possibly negative.
  std::string_view nr_text = f[0];
  bool neg = nr_text.starts_with('-');
  if (neg) nr_text.remove_prefix(1);
  auto nr = parse_u64(nr_text, 10);
  if (!nr || *nr > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    return bad("bad syscall number");
  s.nr = neg ? -static_cast<int64_t>(*nr) : static_cast<int64_t>(*nr);
  size_t want = s.nr < 0 ? 3 : 9;
  if (f.size() != want) return bad("expected " + std::to_string(want) + " fields");
  std::vector<uint64_t> vals;
  for (size_t i = 1; i < f.size(); ++i) {
    auto v = parse_0x(f[i]);
    if (!v) return bad("bad hex field");
    vals.push_back(*v);
  }
  if (s.nr >= 0) {
    std::copy_n(vals.begin(), 6, s.args.begin());
  }
  s.sp = vals[vals.size() - 2];
  s.pc = vals[vals.size() - 1];
  return s;
}

// ---- live readers ----

Result<std::string> read_text(const std::string& path) {
  std::string out;
  REMORA_TRY(read_all(path, out));
  return out;
}

Result<std::vector<std::byte>> read_bytes(const std::string& path) {
  std::vector<std::byte> out;
  REMORA_TRY(read_all(path, out));
  return out;
}

Result<std::vector<MapEntry>> read_maps(pid_t pid) {
  std::string path = proc_path(pid, 0, "maps");
  std::string text = REMORA_TRY(read_text(path));
  return REMORA_TRY_CTX(parse_maps(text), path);
}

Result<Status> read_status(pid_t pid, pid_t tid) {
  std::string path = proc_path(pid, tid, "status");
  std::string text = REMORA_TRY(read_text(path));
  return REMORA_TRY_CTX(parse_status(text), path);
}

Result<Stat> read_stat(pid_t pid, pid_t tid) {
  std::string path = proc_path(pid, tid, "stat");
  std::string text = REMORA_TRY(read_text(path));
  return REMORA_TRY_CTX(parse_stat(text), path);
}

Result<std::vector<AuxEntry>> read_auxv(pid_t pid) {
  std::string path = proc_path(pid, 0, "auxv");
  std::vector<std::byte> data = REMORA_TRY(read_bytes(path));
  return REMORA_TRY_CTX(parse_auxv(data), path);
}

Result<SyscallState> read_syscall(pid_t pid, pid_t tid) {
  std::string path = proc_path(pid, tid, "syscall");
  std::string text = REMORA_TRY(read_text(path));
  return REMORA_TRY_CTX(parse_syscall(text), path);
}

Result<std::vector<pid_t>> list_tasks(pid_t pid) {
  std::string path = proc_path(pid, 0, "task");
  // Open the fd ourselves so that it is O_CLOEXEC whatever the libc does.
  UniqueFd fd = REMORA_TRY(open_read(path, O_DIRECTORY));
  UniqueDir dir(::fdopendir(fd.get()));
  if (!dir) return file_error("opendir", path, errno);
  fd.release();  // now owned by `dir`
  std::vector<pid_t> tids;
  for (;;) {
    errno = 0;
    dirent* ent = ::readdir(dir.get());
    if (ent == nullptr) {
      if (errno != 0) return file_error("readdir", path, errno);
      break;
    }
    // "." and ".." are the only non-numeric entries.
    if (auto tid = parse_pid(ent->d_name)) tids.push_back(*tid);
  }
  // A process always has at least one task; none means it died while we read.
  if (tids.empty())
    return Error(Errc::kNoSuchProcess, "read " + path + ": no tasks (the process exited)", ESRCH);
  std::sort(tids.begin(), tids.end());
  return tids;
}

Result<std::vector<pid_t>> list_children(pid_t pid) {
  // task/TID/children lists the children *that thread* forked (each child's
  // parent is a thread, not the process), so a process's children are the
  // union over its threads. proc(5) warns the list is only stable while the
  // threads are stopped; callers that need certainty stop them first.
  std::vector<pid_t> tids = REMORA_TRY(list_tasks(pid));
  std::vector<pid_t> out;
  for (pid_t tid : tids) {
    std::string path = proc_path(pid, tid, "children");
    auto text = read_text(path);
    if (!text) {
      if (text.error().code() != Errc::kNoSuchProcess) return std::move(text).error();
      // ENOENT: either the thread exited since list_tasks (skip it), or the
      // kernel was built without CONFIG_PROC_CHILDREN and the file never
      // exists. Tell the two apart by whether the thread's directory remains.
      struct stat sb;
      std::string task_dir = proc_path(pid, tid, "");
      if (::stat(task_dir.c_str(), &sb) == 0)
        return Error(Errc::kNotSupported, path + ": missing (kernel built without CONFIG_PROC_CHILDREN?)",
                     ENOENT);
      continue;
    }
    auto kids = REMORA_TRY_CTX(parse_pid_list(*text), path);
    for (pid_t k : kids)
      if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  return out;
}

Result<pid_t> tid_from_target_ns(pid_t pid, pid_t ns_tid) {
  auto process = REMORA_TRY(read_status(pid));
  if (process.nspid.size() <= 1) return ns_tid;  // one namespace: the same ids
  for (pid_t tid : REMORA_TRY(list_tasks(pid))) {
    auto st = read_status(pid, tid);
    if (st && !st->nspid.empty() && st->nspid.back() == ns_tid) return tid;
  }
  return Error(Errc::kNoSuchProcess, "no thread of process " + std::to_string(pid) + " is thread " +
                                         std::to_string(ns_tid) + " of its pid namespace");
}

Result<pid_t> tid_in_target_ns(pid_t pid, pid_t tid) {
  auto st = REMORA_TRY(read_status(pid, tid));
  return st.nspid.empty() ? tid : st.nspid.back();
}

Result<UniqueFd> open_in_root(pid_t pid, const std::string& path) {
  std::string root = "/proc/" + std::to_string(pid) + "/root";
  int rfd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) return Error::from_errno("open " + root);
  UniqueFd root_fd(rfd);
  open_how how{};
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  long fd = ::syscall(SYS_openat2, root_fd.get(), path.c_str(), &how, sizeof how);
  if (fd < 0) {
    int err = errno;
    if (err == ENOSYS)
      return Error(Errc::kNotSupported,
                   "the kernel lacks openat2 (Linux 5.6+), needed to open " + path +
                       " safely inside the target's root",
                   err);
    return Error::from_errno("open " + path + " inside the root of process " + std::to_string(pid), err);
  }
  return UniqueFd(static_cast<int>(fd));
}

}  // namespace remora::procfs
