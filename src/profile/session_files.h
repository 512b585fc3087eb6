// Files of a session directory, read and written by the collection
// (collect.h) and the render (report.h): each written whole or not at all.
#ifndef REMORA_PROFILE_SESSION_FILES_H_
#define REMORA_PROFILE_SESSION_FILES_H_

#include <cstddef>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

namespace remora::profile {

// Writes `path` through fn into PATH.tmp, then renames it over `path`, so
// that a reader never sees half a file. False with *error set (what failed,
// with errno's text): PATH.tmp is then removed.
bool write_atomically(const std::string& path, const std::function<bool(FILE*)>& fn, std::string* error);
bool write_text_atomically(const std::string& path, const std::string& text, std::string* error);

// The first `max` bytes of a regular file of the directory (never followed
// through a symlink); nullopt when it is absent or unreadable.
std::optional<std::string> read_session_file(const std::string& path, size_t max);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_SESSION_FILES_H_
