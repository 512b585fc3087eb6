#include "cli/call_args.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace remora::cli {
namespace {

using namespace std::chrono_literals;

TEST(SymbolSpec, Table) {
  struct Row {
    const char* in;
    const char* lib;
    const char* sym;
  };
  for (const Row& r : std::vector<Row>{
           {"malloc_trim", "", "malloc_trim"},
           {"libc.so.6:write", "libc.so.6", "write"},
           {"libc:write", "libc", "write"},
           {"/usr/lib/x86_64-linux-gnu/libc.so.6:getpid", "/usr/lib/x86_64-linux-gnu/libc.so.6", "getpid"},
           {"/odd:dir/libfoo.so:foo", "/odd:dir/libfoo.so", "foo"},
           {":getpid", "", "getpid"},
       }) {
    auto s = parse_symbol_spec(r.in);
    ASSERT_TRUE(s.ok()) << r.in;
    EXPECT_EQ(s->library, r.lib) << r.in;
    EXPECT_EQ(s->symbol, r.sym) << r.in;
  }
  for (const char* bad : {"", "libc:", "a b", "./x"}) {
    auto s = parse_symbol_spec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.error().code(), Errc::kInvalidArgument);
  }
}

TEST(CallArg, Integers) {
  struct Row {
    const char* in;
    uint64_t value;
  };
  for (const Row& r : std::vector<Row>{
           {"0", 0},
           {"42", 42},
           {"-1", ~uint64_t{0}},
           {"0x7f", 0x7f},
           {"0XFF", 0xff},
           {"-0x10", static_cast<uint64_t>(-16)},
           {"18446744073709551615", ~uint64_t{0}},
           {"-9223372036854775808", uint64_t{1} << 63},
       }) {
    auto a = parse_call_arg(r.in);
    ASSERT_TRUE(a.ok()) << r.in;
    EXPECT_EQ(a->kind, ParsedArg::Kind::kInteger) << r.in;
    EXPECT_EQ(a->value, r.value) << r.in;
  }
}

TEST(CallArg, Strings) {
  struct Row {
    const char* in;
    std::string text;
  };
  for (const Row& r : std::vector<Row>{
           {"hello", "hello"},
           {"hello from remora\\n", "hello from remora\n"},
           {"\"quoted\"", "quoted"},
           {"s:42", "42"},
           {"s:", ""},
           {"s:\"-1\"", "-1"},
           {"0x", "0x"},  // not a number: a string
           {"12abc", "12abc"},
           {"-", "-"},
           {"99999999999999999999", "99999999999999999999"},  // out of range: a string
           {R"(a\tb\\c\"d\'e)", "a\tb\\c\"d'e"},
           {R"(\x41\x7a\0)", std::string("Az\0", 3)},
           {"\\e[0m", "\x1b[0m"},
           {"\"", "\""},  // a lone quote is not a pair
       }) {
    auto a = parse_call_arg(r.in);
    ASSERT_TRUE(a.ok()) << r.in << ": " << a.error().to_string();
    EXPECT_EQ(a->kind, ParsedArg::Kind::kString) << r.in;
    EXPECT_EQ(a->text, r.text) << r.in;
  }
  for (const char* bad : {"oops\\", "\\q", "\\x4", "\\xZZ"}) {
    auto a = parse_call_arg(bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.error().code(), Errc::kInvalidArgument);
  }
}

TEST(Quote, RoundTripsThroughUnescape) {
  for (const std::string& s : {std::string("plain"), std::string("a\nb\tc\\d\"e"),
                               std::string("\x01\x7f\x1b", 3), std::string("nul\0inside", 10)}) {
    std::string q = quote(s);
    ASSERT_GE(q.size(), 2u);
    EXPECT_EQ(q.front(), '"');
    EXPECT_EQ(q.back(), '"');
    auto back = unescape(std::string_view(q).substr(1, q.size() - 2));
    ASSERT_TRUE(back.ok()) << q;
    EXPECT_EQ(*back, s) << q;
  }
}

TEST(ReturnType, Names) {
  EXPECT_EQ(*parse_return_type("long"), ReturnType::kLong);
  EXPECT_EQ(*parse_return_type("int"), ReturnType::kInt);
  EXPECT_EQ(*parse_return_type("ptr"), ReturnType::kPointer);
  EXPECT_EQ(*parse_return_type("pointer"), ReturnType::kPointer);
  EXPECT_EQ(*parse_return_type("void"), ReturnType::kVoid);
  EXPECT_FALSE(parse_return_type("float").ok());
}

TEST(Format, DescribeCall) {
  auto spec = *parse_symbol_spec("libc.so.6:write");
  std::vector<ParsedArg> args = {*parse_call_arg("1"), *parse_call_arg("hello from remora\\n"),
                                 *parse_call_arg("18")};
  EXPECT_EQ(describe_call(spec, args), "libc.so.6:write(1, \"hello from remora\\n\", 18)");
  EXPECT_EQ(describe_call(*parse_symbol_spec("getpid"), {}), "getpid()");
  std::vector<ParsedArg> neg = {*parse_call_arg("-1")};
  EXPECT_EQ(describe_call(*parse_symbol_spec("close"), neg), "close(-1)");
}

TEST(Format, Result) {
  EXPECT_EQ(format_result("malloc_trim(0)", 1, ReturnType::kLong, 4242, 41'300ns),
            "malloc_trim(0) = 1 (0x1)  [thread 4242, stopped 41 us]");
  EXPECT_EQ(format_result("close(-1)", ~uint64_t{0}, ReturnType::kLong, 7, 2ms),
            "close(-1) = -1 (0xffffffffffffffff)  [thread 7, stopped 2000 us]");
  // An int result: only the low 32 bits count, whatever the upper half holds.
  EXPECT_EQ(format_result("f()", 0xdeadbeefffffffffULL, ReturnType::kInt, 7, 0ns),
            "f() = -1 (0xffffffff)  [thread 7, stopped 0 us]");
  EXPECT_EQ(format_result("malloc(16)", 0x55d0c0de1000ULL, ReturnType::kPointer, 7, 0ns),
            "malloc(16) = 0x55d0c0de1000  [thread 7, stopped 0 us]");
  EXPECT_EQ(format_result("sync()", 123, ReturnType::kVoid, 7, 0ns), "sync()  [thread 7, stopped 0 us]");
}

}  // namespace
}  // namespace remora::cli
