#include "profile/session_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/unique_fd.h"

namespace remora::profile {
namespace {

std::string read_fd(int fd, size_t max) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() >= max) break;
  }
  return out;
}

}  // namespace

bool write_atomically(const std::string& path, const std::function<bool(FILE*)>& fn, std::string* error) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "we");
  if (f == nullptr) {
    *error = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  bool ok = fn(f);
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    *error = "cannot write " + tmp + ": " + std::strerror(err != 0 ? err : errno);
    ::unlink(tmp.c_str());
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

bool write_text_atomically(const std::string& path, const std::string& text, std::string* error) {
  return write_atomically(
      path, [&](FILE* out) { return std::fwrite(text.data(), 1, text.size(), out) == text.size(); }, error);
}

std::optional<std::string> read_session_file(const std::string& path, size_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  UniqueFd f(fd);
  return read_fd(f.get(), max);
}

}  // namespace remora::profile
