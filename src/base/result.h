// Result<T> and Error: the one error type of Remora.
//
// An Error carries a code (what went wrong, stable and testable), the errno
// observed (0 when none), a message that tells the user what to do, and the
// chain of contexts it passed through on its way up ("attach pid 4242" ->
// "seize thread 4250"). Library code never throws and never aborts on input;
// it returns Result<T> and callers propagate with REMORA_TRY.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace remora {

// Stable error codes. Add at the end; tests and the C ABIs map them.
enum class Errc : int {
  kOk = 0,
  kInvalidArgument,   // the caller passed something unusable
  kNoSuchProcess,     // no process (or thread) with that id
  kOwnProcess,        // the caller's own process cannot be the target
  kZombie,            // the process has exited and waits to be reaped
  kKernelThread,      // kernel threads have no user space to call into
  kStaticBinary,      // no dynamic loader / libc to call through
  kTracedByOther,     // another tracer already holds the process
  kPtraceDenied,      // ptrace refused: uid, capability, Yama, dumpable
  kLibraryNotMapped,  // the named library is not in the target's maps
  kAmbiguousLibrary,  // the name matches more than one mapped library
  kSymbolNotFound,    // the library has no such symbol
  kTimedOut,          // a deadline passed
  kTargetExited,      // the target exited (or was killed) meanwhile
  kFault,             // the called function faulted in the target
  kParse,             // malformed input (a /proc file, an ELF image)
  kIo,                // a system call failed
  kNotSupported,      // the kernel, libc or architecture lacks a feature
  kIdentityMismatch,  // a file is not the one mapped in the target
  kInternal,          // a broken invariant: a bug in Remora
  kRefused,           // the target refuses tools (REMORA_TOOL_ATTACH=0)
  kNotAttachable,     // a tool lacks remora_configure_attach (or is no tool)
  kToolFailed,        // a tool failed to load, or a callback returned an error
  kNotAttached,       // detach without attached tools
  kAlreadyAttached,   // attach while tools are attached
};

// Short stable name of a code ("no-such-process"), for messages and tests.
std::string_view errc_name(Errc code);

class [[nodiscard]] Error {
 public:
  Error(Errc code, std::string message, int sys_errno = 0)
      : code_(code), errno_(sys_errno), message_(std::move(message)) {}

  // An Error for a failed system call: message "what: strerror(errno)".
  static Error from_errno(std::string_view what, int sys_errno = errno);

  Errc code() const { return code_; }
  int sys_errno() const { return errno_; }
  const std::string& message() const { return message_; }
  // Outermost context first.
  const std::vector<std::string>& context() const { return context_; }

  // Adds an outer context ("attach pid 42"); returns *this for chaining.
  Error& with_context(std::string ctx) & {
    context_.push_back(std::move(ctx));
    return *this;
  }
  Error&& with_context(std::string ctx) && {
    context_.push_back(std::move(ctx));
    return std::move(*this);
  }

  // "outer: inner: message".
  std::string to_string() const;

 private:
  Errc code_;
  int errno_;
  std::string message_;
  std::vector<std::string> context_;  // innermost first, printed reversed
};

// Result<T>: a T or an Error. Result<void> carries only success or an Error.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, Error> &&
           !std::is_same_v<std::decay_t<U>, Result>) Result(U&& value)
      : v_(std::in_place_index<0>, T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const& { return std::get<1>(v_); }
  Error& error() & { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

  T value_or(T other) const& { return ok() ? value() : std::move(other); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  void value() const {}
  const Error& error() const& { return err_; }
  Error& error() & { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_{Errc::kOk, {}};
  bool ok_ = true;
};

inline Result<void> ok() { return {}; }

}  // namespace remora

// REMORA_TRY(expr): evaluates a Result; on error returns the Error from the
// enclosing function, otherwise yields the value. Uses a GNU statement
// expression (g++ and clang both support it), as bpftrace and the kernel do.
#define REMORA_TRY(expr)                                                        \
  __extension__({                                                               \
    auto&& remora_try_result_ = (expr);                                         \
    if (!remora_try_result_.ok()) return std::move(remora_try_result_).error(); \
    std::move(remora_try_result_).value();                                      \
  })

// REMORA_TRY_CTX(expr, ctx): as REMORA_TRY, adding a context string.
#define REMORA_TRY_CTX(expr, ctx)                                                                 \
  __extension__({                                                                                 \
    auto&& remora_try_result_ = (expr);                                                           \
    if (!remora_try_result_.ok()) return std::move(remora_try_result_).error().with_context(ctx); \
    std::move(remora_try_result_).value();                                                        \
  })
