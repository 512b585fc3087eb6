#include "ctr_support.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "elf/elf_image.h"

namespace remora::ctr_test {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string errno_str(const std::string& what, int e = errno) { return what + ": " + std::strerror(e); }

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Reads from `fd` until `done(data)` holds, end of file, or the deadline.
// Returns false on timeout or a read error.
bool read_until(int fd, std::string* data, Clock::time_point deadline,
                const std::function<bool(const std::string&)>& done, bool* eof) {
  *eof = false;
  while (!done(*data)) {
    pollfd p{fd, POLLIN, 0};
    int n = ::poll(&p, 1, ms_left(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    char buf[4096];
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return false;
    if (got == 0) {
      *eof = true;
      return true;
    }
    data->append(buf, static_cast<size_t>(got));
  }
  return true;
}

// Waits for child `pid` until the deadline, then kills it; returns its status.
int reap(pid_t pid, Clock::time_point deadline) {
  int pfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) {
      if (pfd >= 0) ::close(pfd);
      return r == pid ? status : -1;
    }
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      deadline = Clock::now() + std::chrono::seconds(10);  // SIGKILL: only the kernel can delay it now
    }
    if (pfd >= 0) {
      pollfd p{pfd, POLLIN, 0};
      ::poll(&p, 1, std::min(ms_left(deadline), 1000));
    } else {
      ::usleep(10000);  // no pidfd_open (Linux < 5.3): a bounded polling loop
    }
  }
}

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

std::string describe_status(int status) {
  if (status < 0) return "not reaped";
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      ++i;
      out += s[i] == 'n' ? '\n' : s[i];
    } else {
      out += s[i];
    }
  }
  return out;
}

bool copy_bytes(const std::string& src, const std::string& dst, int flags, mode_t mode, std::string* err) {
  std::string data;
  if (!read_file(src, &data, err)) return false;
  int fd = ::open(dst.c_str(), flags | O_WRONLY | O_CLOEXEC, mode);
  if (fd < 0) {
    *err = errno_str("open " + dst);
    return false;
  }
  bool ok = write_all(fd, data);
  int e = errno;
  ::close(fd);
  if (!ok) *err = errno_str("write " + dst, e);
  return ok;
}

}  // namespace

bool read_file(const std::string& path, std::string* out, std::string* err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *err = errno_str("open " + path);
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool overlay_available() {
  std::string text, err;
  if (!read_file("/proc/filesystems", &text, &err)) return false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.size() >= 7 && line.compare(line.size() - 7, 7, "overlay") == 0) return true;
  return false;
}

std::string missing_feature() {
  if (::geteuid() != 0) return "needs root (to mount OverlayFS and create mount and pid namespaces)";
  // A child in new mount and pid namespaces that exits at once.
  long pid = ::syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (pid == 0) ::_exit(0);
  if (pid < 0) {
    int e = errno;
    if (e == EINVAL || e == ENOSYS || e == EPERM || e == ENOSPC || e == EUSERS)
      return errno_str("the kernel refuses new mount and pid namespaces: clone(CLONE_NEWNS|CLONE_NEWPID)", e);
    return "";  // anything else is ours to fail on
  }
  reap(static_cast<pid_t>(pid), Clock::now() + std::chrono::seconds(10));
  return "";
}

bool enter_private_mount_ns(std::string* err) {
  static bool done = false;
  if (done) return true;
  if (::unshare(CLONE_NEWNS) != 0) {
    *err = errno_str("unshare(CLONE_NEWNS)");
    return false;
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    *err = errno_str("make / private");
    return false;
  }
  done = true;
  return true;
}

// --- ContainerRoot ------------------------------------------------------------

std::unique_ptr<ContainerRoot> ContainerRoot::create(std::string* err) {
  char tmpl[] = "/tmp/remora-ctr-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    *err = errno_str("mkdtemp /tmp/remora-ctr-XXXXXX");
    return nullptr;
  }
  std::unique_ptr<ContainerRoot> root(new ContainerRoot(tmpl));
  // Its own tmpfs: the layers vanish with the mount, and OverlayFS accepts a
  // tmpfs upper layer wherever /tmp lives (even on another overlay).
  if (::mount("remora-ctr", tmpl, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=256m") != 0) {
    *err = errno_str(std::string("mount tmpfs on ") + tmpl);
    return nullptr;
  }
  root->tmpfs_ = true;
  for (const char* d : {"lower", "upper", "work", "merged", "host"}) {
    if (::mkdir((root->base_ + "/" + d).c_str(), 0755) != 0) {
      *err = errno_str("mkdir " + root->base_ + "/" + d);
      return nullptr;
    }
  }
  for (const char* d : {"/proc", "/tmp", "/lib", "/dev/shm", "/run"}) {
    std::error_code ec;
    fs::create_directories(root->lower() + d, ec);
    if (ec) {
      *err = "mkdir " + root->lower() + d + ": " + ec.message();
      return nullptr;
    }
  }
  // As in an image: everyone may create files in /tmp and /dev/shm.
  for (const char* d : {"/tmp", "/dev/shm"}) {
    if (::chmod((root->lower() + d).c_str(), 01777) != 0) {
      *err = errno_str("chmod 1777 " + root->lower() + d);
      return nullptr;
    }
  }
  return root;
}

ContainerRoot::~ContainerRoot() {
  if (mounted_) ::umount2(merged().c_str(), MNT_DETACH);
  if (tmpfs_) ::umount2(base_.c_str(), MNT_DETACH);
  std::error_code ec;
  fs::remove_all(base_, ec);
}

bool ContainerRoot::add_file(const std::string& src, const std::string& path, std::string* err) {
  std::string dst = lower() + path;
  std::error_code ec;
  fs::create_directories(fs::path(dst).parent_path(), ec);
  if (ec) {
    *err = "mkdir for " + dst + ": " + ec.message();
    return false;
  }
  struct stat st {};
  if (::stat(src.c_str(), &st) != 0) {
    *err = errno_str("stat " + src);
    return false;
  }
  mode_t mode = (st.st_mode & 0111) != 0 ? 0755 : 0644;
  if (!copy_bytes(src, dst, O_CREAT | O_EXCL, mode, err)) return false;
  ::chmod(dst.c_str(), mode);
  return true;
}

bool ContainerRoot::add_symlink(const std::string& points_to, const std::string& path, std::string* err) {
  std::string dst = lower() + path;
  std::error_code ec;
  fs::create_directories(fs::path(dst).parent_path(), ec);
  if (ec || ::symlink(points_to.c_str(), dst.c_str()) != 0) {
    *err = errno_str("symlink " + dst);
    return false;
  }
  return true;
}

bool ContainerRoot::add_program_with_libs(const std::string& program, const std::string& path,
                                          std::string* err) {
  if (!add_file(program, path, err)) return false;
  // ldd names the loader and every library; copy each to the same path.
  std::string cmd = "timeout 20 ldd '" + program + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *err = errno_str("popen " + cmd);
    return false;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = ::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  if (status != 0) {
    *err = cmd + " failed: " + out;
    return false;
  }
  std::istringstream in(out);
  std::string line;
  int copied = 0;
  while (std::getline(in, line)) {
    // "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "\t/lib64/ld-linux-x86-64.so.2 (0x...)"
    std::istringstream words(line);
    std::string w, lib;
    while (words >> w) {
      if (w == "=>") {
        words >> lib;
        break;
      }
      if (lib.empty() && w[0] == '/') lib = w;
    }
    if (lib.empty() || lib[0] != '/') continue;
    if (fs::exists(lower() + lib)) continue;
    if (!add_file(lib, lib, err)) return false;
    ++copied;
  }
  if (copied == 0) {
    *err = "ldd named no library for " + program + ":\n" + out;
    return false;
  }
  return true;
}

bool ContainerRoot::mount_overlay(std::string* err) {
  std::string opts = "lowerdir=" + lower() + ",upperdir=" + upper() + ",workdir=" + base_ + "/work";
  if (::mount("remora-ctr", merged().c_str(), "overlay", 0, opts.c_str()) != 0) {
    *err = errno_str("mount -t overlay -o " + opts + " " + merged());
    return false;
  }
  mounted_ = true;
  return true;
}

bool replace_by_rename(const std::string& path, const std::string& src, std::string* err) {
  std::string tmp = fs::path(path).parent_path().string() + "/.remora-new";
  if (!copy_bytes(src, tmp, O_CREAT | O_TRUNC, 0755, err)) return false;
  ::chmod(tmp.c_str(), 0755);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = errno_str("rename " + tmp + " " + path);
    return false;
  }
  return true;
}

bool replace_in_place(const std::string& path, const std::string& src, std::string* err) {
  return copy_bytes(src, path, O_TRUNC, 0, err);
}

bool replace_by_symlink(const std::string& path, const std::string& points_to, std::string* err) {
  std::string tmp = fs::path(path).parent_path().string() + "/.remora-link";
  ::unlink(tmp.c_str());
  if (::symlink(points_to.c_str(), tmp.c_str()) != 0) {
    *err = errno_str("symlink " + tmp);
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *err = errno_str("rename " + tmp + " " + path);
    return false;
  }
  return true;
}

// --- ContainerProcess -----------------------------------------------------------

std::unique_ptr<ContainerProcess> ContainerProcess::start(const std::string& root, const std::string& program,
                                                          const std::vector<std::string>& args,
                                                          std::string* err, RootChange how) {
  ContainerOptions options;
  options.how = how;
  return start(root, program, args, err, options);
}

std::unique_ptr<ContainerProcess> ContainerProcess::start(const std::string& root, const std::string& program,
                                                          const std::vector<std::string>& args,
                                                          std::string* err, const ContainerOptions& options) {
  const RootChange how = options.how;
  if (how != RootChange::kPivotRoot && (options.read_only_root || !options.tmpfs.empty())) {
    *err = "a read-only root and tmpfs mounts need RootChange::kPivotRoot";
    return nullptr;
  }
  std::vector<std::string> tmpfs_at;
  for (const auto& t : options.tmpfs) tmpfs_at.push_back(root + t.path);
  std::unique_ptr<ContainerProcess> proc(new ContainerProcess());
  int in[2], out[2], status_pipe[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(status_pipe, O_CLOEXEC) != 0) {
    *err = errno_str("pipe2");
    return nullptr;
  }
  // Everything the child needs is prepared before the clone.
  const std::string proc_dir = root + "/proc";
  std::vector<std::string> argv_s{program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_s.size() + 1);
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  char env_path[] = "PATH=/usr/bin:/bin";
  char* envp[] = {env_path, nullptr};

  long pid = ::syscall(SYS_clone, CLONE_NEWNS | CLONE_NEWPID | SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (pid == 0) {
    // The child: pid 1 of a new pid namespace, in a copy of our mount namespace.
    auto die = [&](const char* step) {
      char msg[512];
      int len = std::snprintf(msg, sizeof msg, "%s: %s", step, std::strerror(errno));
      if (len > 0) (void)!::write(status_pipe[1], msg, static_cast<size_t>(len));
      ::_exit(127);
    };
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die("prctl(PR_SET_PDEATHSIG)");
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) die("make / private");
    if (how == RootChange::kPivotRoot) {
      // pivot_root needs the new root to be a mount point.
      if (::mount(root.c_str(), root.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) die("bind the root");
    }
    if (options.read_only_root &&
        ::mount(nullptr, root.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0)
      die("make the root read-only");
    for (size_t i = 0; i < tmpfs_at.size(); ++i) {
      unsigned long flags = MS_NOSUID | MS_NODEV | (options.tmpfs[i].noexec ? MS_NOEXEC : 0);
      if (::mount("remora-ctr-tmp", tmpfs_at[i].c_str(), "tmpfs", flags, "mode=1777,size=64m") != 0)
        die("mount a tmpfs in the root");
    }
    if (options.mount_proc &&
        ::mount("proc", proc_dir.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
      die("mount proc in the root");
    if (how == RootChange::kPivotRoot) {
      // pivot_root(".", "."): the old root ends up on top of the new one,
      // from where it is detached.
      if (::chdir(root.c_str()) != 0) die("chdir to the root");
      if (::syscall(SYS_pivot_root, ".", ".") != 0) die("pivot_root");
      if (::umount2(".", MNT_DETACH) != 0) die("detach the old root");
    } else {
      if (::chroot(root.c_str()) != 0) die("chroot");
    }
    if (::chdir("/") != 0) die("chdir /");
    if (::dup2(in[0], 0) < 0 || ::dup2(out[1], 1) < 0) die("dup2");
    if (::setgroups(0, nullptr) != 0) die("setgroups");
    if (::setresgid(kGid, kGid, kGid) != 0) die("setresgid");
    if (::setresuid(kUid, kUid, kUid) != 0) die("setresuid");
    ::execve(program.c_str(), argv.data(), envp);
    die("execve");
  }
  int clone_errno = errno;
  ::close(in[0]);
  ::close(out[1]);
  ::close(status_pipe[1]);
  if (pid < 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(status_pipe[0]);
    *err = errno_str("clone(CLONE_NEWNS|CLONE_NEWPID)", clone_errno);
    return nullptr;
  }
  proc->pid_ = static_cast<pid_t>(pid);
  proc->stdin_fd_ = in[1];
  proc->stdout_fd_ = out[0];

  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::string why;
  bool eof = false;
  bool ok = read_until(
      status_pipe[0], &why, deadline, [](const std::string&) { return false; }, &eof);
  ::close(status_pipe[0]);
  if (!ok || !why.empty()) {
    *err = "starting " + program + " in " + root + ": " + (ok ? why : "no exec within 10 s");
    return nullptr;  // the destructor kills and reaps
  }
  std::string text;
  ok = read_until(
      proc->stdout_fd_, &text, deadline,
      [](const std::string& s) { return s.find('\n') != std::string::npos; }, &eof);
  if (!ok || text.rfind("ready ", 0) != 0) {
    *err = program + " in " + root + " did not say ready within 10 s; it said: '" + text + "'" +
           (eof ? " (end of output)" : "");
    return nullptr;
  }
  proc->printed_pid_ = std::atoi(text.c_str() + 6);
  return proc;
}

bool ContainerProcess::ask(const std::string& command, std::vector<std::string>* reply, std::string* err) {
  reply->clear();
  if (!write_all(stdin_fd_, command + "\n")) {
    *err = errno_str("send '" + command + "' to the target");
    return false;
  }
  std::string text;
  bool eof = false;
  auto done = [](const std::string& s) { return s == "end\n" || s.find("\nend\n") != std::string::npos; };
  if (!read_until(stdout_fd_, &text, Clock::now() + std::chrono::seconds(10), done, &eof) || !done(text)) {
    *err = "the target did not answer '" + command + "' within 10 s; it said: '" + text + "'" +
           (eof ? " (end of output)" : "");
    return false;
  }
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line) && line != "end") reply->push_back(line);
  return true;
}

ContainerProcess::~ContainerProcess() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    reap(pid_, Clock::now() + std::chrono::seconds(10));
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

// --- controller -------------------------------------------------------------------

std::string to_string(const Report& r) {
  std::string s = "{";
  for (const auto& [k, v] : r) s.append("\n  ").append(k).append(" = ").append(v);
  return s + "\n}";
}

Report run_controller(const std::function<void(Report&)>& body,
                      const std::function<bool(std::string*)>& as_root, std::chrono::milliseconds deadline_in,
                      bool stay_root) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return {{"failure", errno_str("pipe2")}};
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return {{"failure", errno_str("fork")}};
  if (pid == 0) {
    ::close(p[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    Report r;
    std::string err;
    if (as_root && !as_root(&err)) {
      r["failure"] = "controller setup as root: " + err;
    } else if (!stay_root && (::setgroups(0, nullptr) != 0 || ::setresgid(kGid, kGid, kGid) != 0 ||
                              ::setresuid(kUid, kUid, kUid) != 0)) {
      r["failure"] = errno_str("controller: drop to uid " + std::to_string(kUid));
    } else {
      // An exec'd unprivileged program is dumpable; a setuid() from root is not.
      ::prctl(PR_SET_DUMPABLE, 1);
      std::string status;
      if (read_file("/proc/self/status", &status, &err)) {
        auto at = status.find("CapEff:");
        if (at != std::string::npos)
          r["controller_cap_eff"] = status.substr(at + 7, status.find('\n', at) - at - 7);
      }
      r["controller_uid"] = std::to_string(::geteuid());
      elf::ImageCache::global().clear();
      try {
        body(r);
      } catch (const std::exception& e) {
        r["failure"] = std::string("controller threw: ") + e.what();
      }
    }
    std::string out;
    for (const auto& [k, v] : r) out += escape(k) + "\t" + escape(v) + "\n";
    write_all(p[1], out);
    ::_exit(0);
  }
  ::close(p[1]);
  const auto deadline = Clock::now() + deadline_in;
  std::string data;
  bool eof = false;
  bool ok = read_until(
      p[0], &data, deadline, [](const std::string&) { return false; }, &eof);
  ::close(p[0]);
  int status = reap(pid, ok ? Clock::now() + std::chrono::seconds(5) : Clock::now());
  Report r;
  std::istringstream in(data);
  std::string line;
  while (std::getline(in, line)) {
    auto tab = line.find('\t');
    if (tab != std::string::npos) r[unescape(line.substr(0, tab))] = unescape(line.substr(tab + 1));
  }
  if (!ok)
    r["failure"] = "controller gave no report within " + std::to_string(deadline_in.count()) + " ms (" +
                   describe_status(status) + ")";
  else if (data.empty())
    r["failure"] = "controller died without a report (" + describe_status(status) + ")";
  if (std::getenv("REMORA_CTR_VERBOSE") != nullptr)
    std::fprintf(stderr, "controller report: %s\n", to_string(r).c_str());
  return r;
}

}  // namespace remora::ctr_test
