// The program's name as the user started it (symlinks kept: redis-server,
// not redis-check-rdb), for the profile's title and output directory. Read
// in the target: only the target sees its own $PATH and files as it does.
#ifndef REMORA_TOOLS_DEFAULT_PROGRAM_NAME_H_
#define REMORA_TOOLS_DEFAULT_PROGRAM_NAME_H_

#include <functional>
#include <string>
#include <string_view>

namespace remora_tool {

// The name of the program as the user started it, for the profile's title
// and directory. `cmdline` is /proc/self/cmdline (NUL-separated), `comm`
// /proc/self/comm, `exe` the target of /proc/self/exe, `path_env` $PATH;
// `is_exe(path)` says whether `path` is the very file running (same device
// and inode as /proc/self/exe). The rule, first that applies:
//  1. `comm` when it is neither the exe's name nor argv[0]'s (both cut to
//     the kernel's 15 bytes) and not all digits: someone chose it (the
//     kernel names a #! script's process after the script; a program can
//     rename itself with PR_SET_NAME). All digits is the fd name Linux
//     before 6.14 gave a process started by execveat(fd, "").
//  2. argv[0]'s base name, when argv[0] names the running file: as a path
//     if it holds a '/', else through $PATH as the shell found it. Then the
//     same for argv[0] up to its first space (setproctitle, as redis does,
//     rewrites argv[0] to "/usr/bin/redis-server *:6379").
//     A symlink or hard link keeps the name it was started by (redis-server
//     is a symlink to redis-check-rdb) and a name longer than comm's 15
//     bytes is whole.
//  3. `comm`; 4. the exe's base name; 5. "process".
// Pure: every file check goes through `is_exe`.
std::string choose_program_name(std::string_view cmdline, std::string_view comm, std::string_view exe,
                                std::string_view path_env,
                                const std::function<bool(const std::string& path)>& is_exe);

// choose_program_name for this process, from /proc/self (the first 4 KiB
// of the command line).
std::string program_name();

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_PROGRAM_NAME_H_
