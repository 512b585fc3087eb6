#include "base/result.h"

#include <gtest/gtest.h>

namespace remora {
namespace {

Result<int> half(int v) {
  if (v % 2 != 0) return Error(Errc::kInvalidArgument, "odd value", EINVAL);
  return v / 2;
}

Result<int> quarter(int v) {
  int h = REMORA_TRY_CTX(half(v), "first half");
  return REMORA_TRY_CTX(half(h), "second half");
}

TEST(Result, ValueAndError) {
  auto r = quarter(8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 2);

  auto e = quarter(6);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), Errc::kInvalidArgument);
  EXPECT_EQ(e.error().sys_errno(), EINVAL);
  EXPECT_EQ(e.error().to_string(), "second half: odd value");
}

TEST(Result, ContextChainsOutermostFirst) {
  Error err(Errc::kPtraceDenied, "EPERM");
  err.with_context("seize thread 4250").with_context("attach pid 4242");
  EXPECT_EQ(err.to_string(), "attach pid 4242: seize thread 4250: EPERM");
}

TEST(Result, VoidResult) {
  Result<void> good = ok();
  EXPECT_TRUE(good.ok());
  Result<void> bad = Error::from_errno("open /nope", ENOENT);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), Errc::kIo);
  EXPECT_NE(bad.error().message().find("No such file"), std::string::npos);
}

TEST(Result, ErrcNamesAreDistinct) {
  for (int a = 0; a <= static_cast<int>(Errc::kAlreadyAttached); ++a)
    for (int b = a + 1; b <= static_cast<int>(Errc::kAlreadyAttached); ++b)
      EXPECT_NE(errc_name(static_cast<Errc>(a)), errc_name(static_cast<Errc>(b)));
}

}  // namespace
}  // namespace remora
