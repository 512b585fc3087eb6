#include "base/strings.h"

#include <gtest/gtest.h>

namespace remora {
namespace {

TEST(Strings, ParseIntegers) {
  struct Case {
    const char* in;
    std::optional<int64_t> want;
  } cases[] = {
      {"0", 0},
      {"42", 42},
      {"-7", -7},
      {"0x10", 16},
      {"0XfF", 255},
      {"", std::nullopt},
      {"12a", std::nullopt},
      {"-", std::nullopt},
      {"0x", std::nullopt},
      {" 1", std::nullopt},
  };
  for (const auto& c : cases) EXPECT_EQ(parse_i64(c.in), c.want) << c.in;
  EXPECT_EQ(parse_u64("ff", 16), 255u);
  EXPECT_EQ(parse_u64("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(parse_u64("18446744073709551616"), std::nullopt);
}

TEST(Strings, SplitAndTrim) {
  auto f = split_fields("  a \tbb  c ");
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], "a");
  EXPECT_EQ(f[2], "c");
  EXPECT_EQ(trim(" \n x y \t"), "x y");
  EXPECT_EQ(to_hex("\x01\xab", 2), "01ab");
  EXPECT_EQ(hex_addr(0x7f00), "0x7f00");
}

}  // namespace
}  // namespace remora
