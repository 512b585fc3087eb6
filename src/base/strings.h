// Small string helpers shared by the parsers and the CLI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace remora {

// Splits on any of `seps`, dropping empty pieces.
std::vector<std::string_view> split_fields(std::string_view s, std::string_view seps = " \t");
std::string_view trim(std::string_view s);
// Parses an unsigned integer in `base` (0 = accept 0x prefix); whole string must match.
std::optional<uint64_t> parse_u64(std::string_view s, int base = 10);
// Parses a signed integer, decimal or 0x hex, with optional leading '-'.
std::optional<int64_t> parse_i64(std::string_view s);
// Hex string of bytes ("a1b2...").
std::string to_hex(const void* data, size_t len);
// "0x7f12..." for an address.
std::string hex_addr(uint64_t addr);

}  // namespace remora
