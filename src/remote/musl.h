// Recognising a process that runs on musl libc (Alpine and others), which
// Remora cannot serve: its remote calls go through glibc's syscall() and
// __restore_rt, and its agent and tools link against glibc. Refused when the
// session opens (remote::Target::open), so `remora call` and `remora attach`
// both say so at once instead of failing later on a symptom.
#pragma once

#include <sys/types.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/result.h"
#include "procfs/procfs.h"

namespace remora::remote {

// The oldest glibc Remora's agent and default tool load into (x86_64; the
// highest GLIBC_ symbol version they reference, checked by tests/deps
// against MIN_GLIBC and stated in docs/tool.md); for the message only.
inline constexpr const char* kGlibcNeeded = "2.17";

// Whether the maps show glibc's libc (libc.so.6) mapped.
bool maps_glibc(std::span<const procfs::MapEntry> maps);

// The basename of musl's dynamic loader ("ld-musl-x86_64.so.1") when the
// program interpreter (PT_INTERP, `interpreter`; empty if unknown) or the
// maps show it, and no glibc (libc.so.6) is mapped; nullopt otherwise. The
// maps alone may not say: Debian's /lib/ld-musl-x86_64.so.1 is a link to
// /usr/lib/x86_64-linux-musl/libc.so, the name the maps show. A static musl
// program has no interpreter: the static-binary refusal covers it.
std::optional<std::string> musl_loader(std::string_view interpreter, std::span<const procfs::MapEntry> maps);

// The program interpreter the executable of `pid` asks for (its PT_INTERP),
// read through /proc/PID/exe; empty when it has none.
Result<std::string> program_interpreter(pid_t pid);

// The refusal: Errc::kNotSupported (exit 5, like a static binary), naming
// the loader and what to do.
Error musl_error(const std::string& process, const std::string& loader);

}  // namespace remora::remote
