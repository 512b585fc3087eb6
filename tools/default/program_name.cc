// The program's name (program_name.h).
#include "program_name.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace remora_tool {

namespace {

std::string_view base_name(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// As the kernel stores comm: at most TASK_COMM_LEN - 1 bytes.
std::string_view comm_cut(std::string_view name) { return name.substr(0, 15); }

// Whether `arg` (a command's first word) names the running file: as a path
// when it holds a '/', else through $PATH, as execvp and the shells look
// it up (an empty entry is the current directory).
bool names_the_exe(std::string_view arg, std::string_view path_env,
                   const std::function<bool(const std::string&)>& is_exe) {
  if (arg.empty()) return false;
  if (arg.find('/') != std::string_view::npos) return is_exe(std::string(arg));
  while (true) {
    size_t colon = path_env.find(':');
    std::string_view dir = path_env.substr(0, colon);
    std::string candidate = dir.empty() ? std::string(arg) : std::string(dir) + "/" + std::string(arg);
    if (is_exe(candidate)) return true;
    if (colon == std::string_view::npos) return false;
    path_env.remove_prefix(colon + 1);
  }
}

}  // namespace

std::string choose_program_name(std::string_view cmdline, std::string_view comm, std::string_view exe,
                                std::string_view path_env,
                                const std::function<bool(const std::string& path)>& is_exe) {
  std::string_view argv0 = cmdline.substr(0, cmdline.find('\0'));
  // A binary replaced on disk (an upgrade) reads "/usr/bin/x (deleted)".
  constexpr std::string_view kDeleted = " (deleted)";
  if (exe.size() > kDeleted.size() && exe.substr(exe.size() - kDeleted.size()) == kDeleted)
    exe.remove_suffix(kDeleted.size());
  std::string_view exe_name = base_name(exe);
  // 2., computed first since rule 1 compares with it.
  std::string_view started_as;
  if (names_the_exe(argv0, path_env, is_exe)) {
    started_as = base_name(argv0);
  } else {
    std::string_view first_word = argv0.substr(0, argv0.find(' '));
    if (first_word.size() < argv0.size() && names_the_exe(first_word, path_env, is_exe))
      started_as = base_name(first_word);
  }
  bool digits =
      !comm.empty() && std::all_of(comm.begin(), comm.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!comm.empty() && !digits && comm != comm_cut(exe_name) &&
      (started_as.empty() || comm != comm_cut(started_as)))
    return std::string(comm);  // 1.
  if (!started_as.empty()) return std::string(started_as);
  if (!comm.empty()) return std::string(comm);
  if (!exe_name.empty()) return std::string(exe_name);
  return "process";
}

namespace {

std::string read_proc_file(const char* path, size_t max) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out(max, '\0');
  size_t got = 0;
  while (got < max) {
    ssize_t n = read(fd, out.data() + got, max - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(got);
  return out;
}

}  // namespace

std::string program_name() {
  std::string cmdline = read_proc_file("/proc/self/cmdline", 4096);
  std::string comm = read_proc_file("/proc/self/comm", 64);
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\0')) comm.pop_back();
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string exe_path = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
  // stat of the magic link: the running file's inode even when it was
  // deleted or lies in another mount namespace's view.
  struct stat self;
  bool have_self = stat("/proc/self/exe", &self) == 0;
  const char* path_env = getenv("PATH");
  // Unset, execvp searches glibc's default path.
  return choose_program_name(cmdline, comm, exe_path, path_env != nullptr ? path_env : "/bin:/usr/bin",
                             [&](const std::string& path) {
                               struct stat st;
                               return have_self && stat(path.c_str(), &st) == 0 && st.st_dev == self.st_dev &&
                                      st.st_ino == self.st_ino;
                             });
}

}  // namespace remora_tool
