// Pure parsing and formatting for `remora call`: the [LIB:]SYMBOL spec, the
// ARG list, and the result line. No process is touched here, so all of it is
// unit-tested from tables (call_args_test.cc).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace remora::cli {

// "[LIB:]SYMBOL". LIB is a path, a soname or a basename prefix; empty means
// the executable, then every library. The split is at the last ':' so that a
// path containing ':' still works (symbol names never contain one).
struct SymbolSpec {
  std::string library;
  std::string symbol;
};
Result<SymbolSpec> parse_symbol_spec(std::string_view spec);

// One ARG of a call, as the user meant it.
struct ParsedArg {
  enum class Kind { kInteger, kString };
  Kind kind = Kind::kInteger;
  uint64_t value = 0;  // kInteger: the register value (negative numbers in two's complement)
  std::string text;    // kString: the bytes after escape processing, without the NUL
};

// An ARG is an integer when it parses as one (decimal, -decimal, 0x hex,
// -0x hex); otherwise it is a string. "s:TEXT" forces a string ("s:42" is the
// string "42"). A string may carry a pair of surrounding double quotes (when
// the shell kept them) and C escapes: \n \t \r \0 \\ \" \' \a \b \f \v \e \xHH.
Result<ParsedArg> parse_call_arg(std::string_view text);

// Processes the C escapes listed above; an unknown or truncated escape is an
// invalid-argument error (so a typo never reaches the target silently).
Result<std::string> unescape(std::string_view s);

// `s` as a C string literal, quotes included, escaping what unescape() accepts.
std::string quote(std::string_view s);

// How to print the returned register.
enum class ReturnType { kLong, kInt, kPointer, kVoid };
Result<ReturnType> parse_return_type(std::string_view name);

// "malloc_trim(0)" / "libc.so.6:write(1, \"hi\\n\", 3)" — what the user asked for.
std::string describe_call(const SymbolSpec& spec, std::span<const ParsedArg> args);

// "malloc_trim(0) = 1 (0x1)  [thread 4242, stopped 41 us]".
std::string format_result(std::string_view call, uint64_t value, ReturnType type, pid_t tid,
                          std::chrono::nanoseconds stopped);

}  // namespace remora::cli
