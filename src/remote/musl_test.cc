// Recognising a musl process from its maps, from tables.
#include "remote/musl.h"

#include <gtest/gtest.h>

#include <string>

namespace remora::remote {
namespace {

std::vector<procfs::MapEntry> maps_of(const std::string& text) {
  auto r = procfs::parse_maps(text);
  EXPECT_TRUE(r.ok());
  return r.ok() ? *r : std::vector<procfs::MapEntry>{};
}

TEST(Musl, LoaderWithoutGlibc) {
  struct Case {
    const char* name;
    std::string maps;
    std::optional<std::string> want;
  } cases[] = {
      {"Alpine x86_64",
       "55d0c000-55d0d000 r-xp 00001000 08:01 10 /usr/bin/app\n"
       "7f1c0000-7f1c5000 r-xp 00014000 08:01 11 /lib/ld-musl-x86_64.so.1\n",
       "ld-musl-x86_64.so.1"},
      {"aarch64 loader", "7f1c0000-7f1c5000 r-xp 00014000 08:01 11 /lib/ld-musl-aarch64.so.1\n",
       "ld-musl-aarch64.so.1"},
      {"opened as libc.musl", "7f1c0000-7f1c5000 r-xp 00014000 08:01 11 /usr/lib/libc.musl-x86_64.so.1\n",
       "libc.musl-x86_64.so.1"},
      {"glibc process",
       "7f1b0000-7f1b2000 r-xp 00028000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
       "7f1c0000-7f1c5000 r-xp 00001000 08:01 13 /usr/lib64/ld-linux-x86-64.so.2\n",
       std::nullopt},
      {"musl loader and glibc's libc (gcompat)",
       "7f1b0000-7f1b2000 r-xp 00028000 08:01 12 /lib/libc.so.6\n"
       "7f1c0000-7f1c5000 r-xp 00014000 08:01 11 /lib/ld-musl-x86_64.so.1\n",
       std::nullopt},
      {"anonymous and pseudo mappings only", "7ffc0000-7ffc1000 rw-p 00000000 00:00 0 [stack]\n",
       std::nullopt},
      {"a file merely named like it, not a loader",
       "7f1c0000-7f1c5000 r--p 00000000 08:01 11 /data/ld-musl-notes.txt\n", std::nullopt},
  };
  for (const auto& c : cases) EXPECT_EQ(musl_loader("", maps_of(c.maps)), c.want) << c.name;
}

// Debian's musl-tools: the interpreter /lib/ld-musl-x86_64.so.1 is a link
// to /usr/lib/x86_64-linux-musl/libc.so, the name the maps show.
TEST(Musl, InterpreterSaysWhatTheMapsDoNot) {
  const std::string debian =
      "55d0c000-55d0d000 r-xp 00001000 08:01 10 /tmp/app\n"
      "7f1c0000-7f1c5000 r-xp 00014000 08:01 11 /usr/lib/x86_64-linux-musl/libc.so\n";
  EXPECT_EQ(musl_loader("/lib/ld-musl-x86_64.so.1", maps_of(debian)), "ld-musl-x86_64.so.1");
  EXPECT_EQ(musl_loader("", maps_of(debian)), std::nullopt) << "no interpreter known: nothing to say";
  const std::string glibc = "7f1b0000-7f1b2000 r-xp 00028000 08:01 12 /usr/lib/x86_64-linux-gnu/libc.so.6\n";
  EXPECT_EQ(musl_loader("/lib64/ld-linux-x86-64.so.2", maps_of(glibc)), std::nullopt);
  EXPECT_EQ(musl_loader("/lib/ld-musl-x86_64.so.1", maps_of(glibc)), std::nullopt)
      << "glibc mapped (gcompat)";
  EXPECT_TRUE(maps_glibc(maps_of(glibc)));
  EXPECT_FALSE(maps_glibc(maps_of(debian)));
}

TEST(Musl, MessageSaysWhatAndWhatToDo) {
  auto e = musl_error("process 42", "ld-musl-x86_64.so.1");
  EXPECT_EQ(e.code(), Errc::kNotSupported);
  EXPECT_NE(e.message().find("process 42 uses musl libc (ld-musl-x86_64.so.1)"), std::string::npos)
      << e.message();
  EXPECT_NE(e.message().find("glibc"), std::string::npos);
  EXPECT_NE(e.message().find("attach to a glibc process"), std::string::npos);
}

}  // namespace
}  // namespace remora::remote
