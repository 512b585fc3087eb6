#include "cli/call_args.h"

#include <cinttypes>
#include <cstdio>

#include "base/strings.h"

namespace remora::cli {

Result<SymbolSpec> parse_symbol_spec(std::string_view spec) {
  SymbolSpec out;
  size_t colon = spec.rfind(':');
  if (colon == std::string_view::npos) {
    out.symbol = spec;
  } else {
    out.library = spec.substr(0, colon);
    out.symbol = spec.substr(colon + 1);
  }
  if (out.symbol.empty()) {
    return Error(Errc::kInvalidArgument,
                 "missing symbol name in '" + std::string(spec) + "' (expected [LIB:]SYMBOL)");
  }
  for (char c : out.symbol) {
    // Symbols are arbitrary bytes in ELF, but a blank or slash here means the
    // user swapped the arguments ("remora call -p 1 0 malloc_trim").
    if (c == ' ' || c == '\t' || c == '/') {
      return Error(Errc::kInvalidArgument, "'" + out.symbol + "' is not a symbol name");
    }
  }
  return out;
}

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Result<std::string> unescape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i == s.size()) {
      return Error(Errc::kInvalidArgument, "string ends with a lone backslash (write \\\\ for one)");
    }
    switch (s[i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '0': out += '\0'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'e': out += '\x1b'; break;
      case '\\': out += '\\'; break;
      case '"': out += '"'; break;
      case '\'': out += '\''; break;
      case 'x': {
        int hi = i + 1 < s.size() ? hex_digit(s[i + 1]) : -1;
        int lo = i + 2 < s.size() ? hex_digit(s[i + 2]) : -1;
        if (hi < 0 || lo < 0) {
          return Error(Errc::kInvalidArgument, "\\x needs two hex digits in \"" + std::string(s) + "\"");
        }
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        break;
      }
      default:
        return Error(Errc::kInvalidArgument, std::string("unknown escape \\") + s[i] + " in \"" +
                                                 std::string(s) + R"(" (write \\ for a backslash))");
    }
  }
  return out;
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      default: {
        auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", u);
          out += buf;
        } else {
          out += c;
        }
      }
    }
  }
  out += '"';
  return out;
}

Result<ParsedArg> parse_call_arg(std::string_view text) {
  ParsedArg arg;
  bool forced_string = text.starts_with("s:");
  if (forced_string) text.remove_prefix(2);
  if (!forced_string) {
    if (auto v = parse_i64(text)) {
      arg.value = static_cast<uint64_t>(*v);
      return arg;
    }
  }
  // The shell usually strips the quotes; when they survive ('"text"'), they
  // delimit the string and are not part of it.
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
    text = text.substr(1, text.size() - 2);
  }
  arg.kind = ParsedArg::Kind::kString;
  arg.text = REMORA_TRY(unescape(text));
  return arg;
}

Result<ReturnType> parse_return_type(std::string_view name) {
  if (name == "long") return ReturnType::kLong;
  if (name == "int") return ReturnType::kInt;
  if (name == "ptr" || name == "pointer") return ReturnType::kPointer;
  if (name == "void") return ReturnType::kVoid;
  return Error(Errc::kInvalidArgument,
               "unknown return type '" + std::string(name) + "' (use long, int, ptr or void)");
}

std::string describe_call(const SymbolSpec& spec, std::span<const ParsedArg> args) {
  std::string out;
  if (!spec.library.empty()) {
    out += spec.library;
    out += ':';
  }
  out += spec.symbol;
  out += '(';
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out += ", ";
    if (args[i].kind == ParsedArg::Kind::kString) {
      out += quote(args[i].text);
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%" PRId64, static_cast<int64_t>(args[i].value));
      out += buf;
    }
  }
  out += ')';
  return out;
}

std::string format_result(std::string_view call, uint64_t value, ReturnType type, pid_t tid,
                          std::chrono::nanoseconds stopped) {
  char val[64];
  switch (type) {
    case ReturnType::kLong:
      std::snprintf(val, sizeof val, " = %" PRId64 " (0x%" PRIx64 ")", static_cast<int64_t>(value), value);
      break;
    case ReturnType::kInt: {
      // The callee only defined the low 32 bits of the register.
      auto low = static_cast<uint32_t>(value);
      std::snprintf(val, sizeof val, " = %" PRId32 " (0x%" PRIx32 ")", static_cast<int32_t>(low), low);
      break;
    }
    case ReturnType::kPointer: std::snprintf(val, sizeof val, " = 0x%" PRIx64, value); break;
    case ReturnType::kVoid: val[0] = '\0'; break;
  }
  char tail[96];
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(stopped).count();
  std::snprintf(tail, sizeof tail, "  [thread %d, stopped %lld us]", static_cast<int>(tid),
                static_cast<long long>(us));
  std::string out(call);
  out += val;
  out += tail;
  return out;
}

}  // namespace remora::cli
