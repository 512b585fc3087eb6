#include "cli/exit_codes.h"

#include <gtest/gtest.h>

#include <set>

namespace remora::cli {
namespace {

TEST(ExitCodes, EveryErrcMapsToADocumentedNonZeroCode) {
  std::set<int> documented;
  for (const auto& row : exit_code_table()) documented.insert(to_int(row.code));
  // Every code errc_name() knows: a new Errc shows up here (and in -Wswitch
  // in exit_codes.cc) until it is mapped.
  int known = 0;
  for (int i = 0; errc_name(static_cast<Errc>(i)) != "unknown"; ++i) {
    auto errc = static_cast<Errc>(i);
    ++known;
    int code = to_int(exit_code_for(errc));
    EXPECT_NE(code, 0) << errc_name(errc);
    EXPECT_TRUE(documented.count(code)) << errc_name(errc) << " -> " << code;
  }
  EXPECT_GT(known, static_cast<int>(Errc::kInternal));
}

TEST(ExitCodes, TableIsDenseAndOrdered) {
  int expected = 0;
  for (const auto& row : exit_code_table()) {
    EXPECT_EQ(to_int(row.code), expected++);
    EXPECT_FALSE(row.meaning.empty());
  }
}

TEST(ExitCodes, StableValues) {
  // Scripts depend on these numbers; docs/cli.md lists them.
  EXPECT_EQ(to_int(exit_code_for(Errc::kInvalidArgument)), 1);
  EXPECT_EQ(to_int(exit_code_for(Errc::kNoSuchProcess)), 2);
  EXPECT_EQ(to_int(exit_code_for(Errc::kPtraceDenied)), 3);
  EXPECT_EQ(to_int(exit_code_for(Errc::kSymbolNotFound)), 4);
  EXPECT_EQ(to_int(exit_code_for(Errc::kStaticBinary)), 5);
  EXPECT_EQ(to_int(exit_code_for(Errc::kTimedOut)), 6);
  EXPECT_EQ(to_int(exit_code_for(Errc::kTargetExited)), 7);
  EXPECT_EQ(to_int(exit_code_for(Errc::kFault)), 8);
  EXPECT_EQ(to_int(exit_code_for(Errc::kIo)), 9);
  EXPECT_EQ(to_int(exit_code_for(Errc::kInternal)), 10);
  EXPECT_EQ(to_int(exit_code_for(Errc::kRefused)), 11);
  EXPECT_EQ(to_int(exit_code_for(Errc::kToolFailed)), 12);
  EXPECT_EQ(to_int(exit_code_for(Errc::kAlreadyAttached)), 13);
}

TEST(ExitCodes, FooterListsEveryCode) {
  std::string footer = exit_code_footer();
  EXPECT_NE(footer.find("Exit codes:"), std::string::npos);
  for (const auto& row : exit_code_table()) {
    EXPECT_NE(footer.find(std::string(row.meaning)), std::string::npos) << row.meaning;
  }
}

}  // namespace
}  // namespace remora::cli
