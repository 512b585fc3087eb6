#include "procfs/procfs.h"

#include <elf.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

namespace remora::procfs {
namespace {

using namespace std::string_literals;

// ---------------------------------------------------------------- maps

struct MapsCase {
  const char* name;
  std::string line;
  uint64_t start, end;
  const char* perms;  // "rwxs" flags as the kernel prints them
  uint64_t offset;
  uint32_t major, minor;
  uint64_t inode;
  std::string path;
  bool deleted;
};

std::string perms_of(const MapEntry& e) {
  std::string p;
  p += e.read ? 'r' : '-';
  p += e.write ? 'w' : '-';
  p += e.exec ? 'x' : '-';
  p += e.shared ? 's' : 'p';
  return p;
}

const MapsCase kMapsCases[] = {
    {"file", "56188e6ec000-56188e6ee000 r--p 00000000 fe:00 247134                     /usr/bin/cat",
     0x56188e6ec000, 0x56188e6ee000, "r--p", 0, 0xfe, 0, 247134, "/usr/bin/cat", false},
    {"text",
     "7f7938bd7000-7f7938d2d000 r-xp 00026000 fe:00 332835                     "
     "/usr/lib/x86_64-linux-gnu/libc.so.6",
     0x7f7938bd7000, 0x7f7938d2d000, "r-xp", 0x26000, 0xfe, 0, 332835, "/usr/lib/x86_64-linux-gnu/libc.so.6",
     false},
    {"anon_trailing_space", "7f7938a8c000-7f7938b50000 rw-p 00000000 00:00 0 ", 0x7f7938a8c000,
     0x7f7938b50000, "rw-p", 0, 0, 0, 0, "", false},
    {"anon_no_trailing_space", "7f7938a8c000-7f7938b50000 rw-p 00000000 00:00 0", 0x7f7938a8c000,
     0x7f7938b50000, "rw-p", 0, 0, 0, 0, "", false},
    {"heap", "5618c3826000-5618c3847000 rw-p 00000000 00:00 0                          [heap]",
     0x5618c3826000, 0x5618c3847000, "rw-p", 0, 0, 0, 0, "[heap]", false},
    {"stack", "7ffc77279000-7ffc7729a000 rw-p 00000000 00:00 0                          [stack]",
     0x7ffc77279000, 0x7ffc7729a000, "rw-p", 0, 0, 0, 0, "[stack]", false},
    {"vdso", "7f7938da6000-7f7938da8000 r-xp 00000000 00:00 0                          [vdso]",
     0x7f7938da6000, 0x7f7938da8000, "r-xp", 0, 0, 0, 0, "[vdso]", false},
    {"vsyscall", "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]",
     0xffffffffff600000, 0xffffffffff601000, "--xp", 0, 0, 0, 0, "[vsyscall]", false},
    {"anon_named_with_spaces",
     "7f0000000000-7f0000021000 rw-p 00000000 00:00 0                          [anon:glibc malloc arena]",
     0x7f0000000000, 0x7f0000021000, "rw-p", 0, 0, 0, 0, "[anon:glibc malloc arena]", false},
    {"path_with_spaces",
     "7f0000000000-7f0000001000 r--p 00001000 08:11 42                         /tmp/my dir/lib foo.so",
     0x7f0000000000, 0x7f0000001000, "r--p", 0x1000, 8, 0x11, 42, "/tmp/my dir/lib foo.so", false},
    {"path_trailing_spaces_kept",
     "7f0000000000-7f0000001000 r--p 00000000 08:11 42                         /tmp/x  ", 0x7f0000000000,
     0x7f0000001000, "r--p", 0, 8, 0x11, 42, "/tmp/x  ", false},
    {"deleted_memfd",
     "7f0000000000-7f0000001000 r-xp 00000000 00:01 1337                       /memfd:remora-agent (deleted)",
     0x7f0000000000, 0x7f0000001000, "r-xp", 0, 0, 1, 1337, "/memfd:remora-agent", true},
    {"deleted_inside_name_kept",
     "7f0000000000-7f0000001000 r--p 00000000 08:11 42                         /tmp/a (deleted) b.so",
     0x7f0000000000, 0x7f0000001000, "r--p", 0, 8, 0x11, 42, "/tmp/a (deleted) b.so", false},
    {"deleted_inside_and_at_end",
     "7f0000000000-7f0000001000 r--p 00000000 08:11 42                         /tmp/a (deleted) b.so "
     "(deleted)",
     0x7f0000000000, 0x7f0000001000, "r--p", 0, 8, 0x11, 42, "/tmp/a (deleted) b.so", true},
    {"deleted_without_space_kept",
     "7f0000000000-7f0000001000 r--p 00000000 08:11 42                         /tmp/x(deleted)",
     0x7f0000000000, 0x7f0000001000, "r--p", 0, 8, 0x11, 42, "/tmp/x(deleted)", false},
    {"shared_sysv",
     "7f7938d96000-7f7938d9d000 rw-s 00000000 00:01 32769                      /SYSV00000000 (deleted)",
     0x7f7938d96000, 0x7f7938d9d000, "rw-s", 0, 0, 1, 32769, "/SYSV00000000", true},
    {"anon_inode",
     "7f0000000000-7f0000001000 rw-s 00000000 00:0e 10                         anon_inode:[perf_event]",
     0x7f0000000000, 0x7f0000001000, "rw-s", 0, 0, 0xe, 10, "anon_inode:[perf_event]", false},
    {"wide_dev_and_offset", "00400000-00401000 rwxp 7fffffff000 103:12345 18446744073709551615 /x", 0x400000,
     0x401000, "rwxp", 0x7fffffff000, 0x103, 0x12345, UINT64_MAX, "/x", false},
    {"no_perms", "7f0000000000-7f0000001000 ---p 00000000 00:00 0 ", 0x7f0000000000, 0x7f0000001000, "---p",
     0, 0, 0, 0, "", false},
};

class ParseMapsTest : public ::testing::TestWithParam<MapsCase> {};

TEST_P(ParseMapsTest, ParsesLine) {
  const MapsCase& c = GetParam();
  auto r = parse_maps(c.line + "\n");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 1u);
  const MapEntry& e = (*r)[0];
  EXPECT_EQ(e.start, c.start);
  EXPECT_EQ(e.end, c.end);
  EXPECT_EQ(perms_of(e), c.perms);
  EXPECT_EQ(e.offset, c.offset);
  EXPECT_EQ(e.dev_major, c.major);
  EXPECT_EQ(e.dev_minor, c.minor);
  EXPECT_EQ(e.inode, c.inode);
  EXPECT_EQ(e.path, c.path);
  EXPECT_EQ(e.deleted, c.deleted);
  EXPECT_EQ(e.file_backed(), c.inode != 0);
  EXPECT_EQ(e.size(), c.end - c.start);
  EXPECT_EQ(e.dev(), makedev(c.major, c.minor));
}

INSTANTIATE_TEST_SUITE_P(Lines, ParseMapsTest, ::testing::ValuesIn(kMapsCases),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(ParseMaps, WholeFileInOrder) {
  const char* text =
      "56188e6ec000-56188e6ee000 r--p 00000000 fe:00 247134                     /usr/bin/cat\n"
      "56188e6ee000-56188e6f3000 r-xp 00002000 fe:00 247134                     /usr/bin/cat\n"
      "5618c3826000-5618c3847000 rw-p 00000000 00:00 0                          [heap]\n"
      "7f7938a8c000-7f7938b50000 rw-p 00000000 00:00 0 \n"
      "7ffc77279000-7ffc7729a000 rw-p 00000000 00:00 0                          [stack]\n";
  auto r = parse_maps(text);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 5u);
  EXPECT_EQ((*r)[1].path, "/usr/bin/cat");
  EXPECT_TRUE((*r)[1].exec);
  EXPECT_EQ((*r)[3].path, "");
  EXPECT_EQ((*r)[4].path, "[stack]");
}

TEST(ParseMaps, EmptyTextIsNoMappings) {
  // Kernel threads and zombies have an empty maps file.
  auto r = parse_maps("");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

const char* const kBadMapsLines[] = {
    "",                                                    // blank line
    "zzzz-1000 r--p 00000000 00:00 0",                     // bad start
    "1000-zz r--p 00000000 00:00 0",                       // bad end
    "1000 r--p 00000000 00:00 0",                          // no dash
    "2000-1000 r--p 00000000 00:00 0",                     // start > end
    "1000-2000 rwxq 00000000 00:00 0",                     // bad share flag
    "1000-2000 r-- 00000000 00:00 0",                      // short perms
    "1000-2000 rwxpp 00000000 00:00 0",                    // long perms
    "1000-2000 wr-p 00000000 00:00 0",                     // letters out of place
    "1000-2000 r--p zz 00:00 0",                           // bad offset
    "1000-2000 r--p 00000000 0000 0",                      // dev without colon
    "1000-2000 r--p 00000000 0g:00 0",                     // bad major
    "1000-2000 r--p 00000000 00: 0",                       // empty minor
    "1000-2000 r--p 00000000 100000000:00 0",              // major overflows 32 bits
    "1000-2000 r--p 00000000 00:00 x",                     // bad inode
    "1000-2000 r--p 00000000 00:00 -1",                    // negative inode
    "1000-2000 r--p 00000000 00:00",                       // missing inode
    "1000-2000",                                           // truncated
    "1000-2000 r--p 00000000 00:00 0x10 /x",               // hex inode
    "10000000000000000-10000000000000001 r--p 0 00:00 0",  // address overflows 64 bits
};

class ParseMapsBadTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ParseMapsBadTest, RejectsWithLineNumberAndText) {
  std::string line = GetParam();
  std::string text = "00400000-00401000 r-xp 00000000 08:01 1 /bin/x\n" + line + "\n";
  auto r = parse_maps(text);
  ASSERT_FALSE(r.ok()) << "accepted: " << line;
  EXPECT_EQ(r.error().code(), Errc::kParse);
  EXPECT_NE(r.error().message().find("line 2"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("\"" + line + "\""), std::string::npos) << r.error().message();
}

INSTANTIATE_TEST_SUITE_P(Lines, ParseMapsBadTest, ::testing::ValuesIn(kBadMapsLines));

// ---------------------------------------------------------------- status

// A real 6.x status file (trimmed of lines Remora ignores only where noted).
const char* const kStatusText =
    "Name:\tmy prog\n"
    "Umask:\t0022\n"
    "State:\tS (sleeping)\n"
    "Tgid:\t4242\n"
    "Ngid:\t0\n"
    "Pid:\t4250\n"
    "PPid:\t4200\n"
    "TracerPid:\t4100\n"
    "Uid:\t1000\t1001\t1002\t1003\n"
    "Gid:\t2000\t2001\t2002\t2003\n"
    "FDSize:\t256\n"
    "Groups:\t \n"
    "NStgid:\t4242\t17\t1\n"
    "NSpid:\t4250\t25\t9\n"
    "NSpgid:\t4200\n"
    "NSsid:\t2324\n"
    "Kthread:\t0\n"
    "VmPeak:\t    3060 kB\n"
    "VmSize:\t    3060 kB\n"
    "VmRSS:\t    1740 kB\n"
    "untag_mask:\t0xffffffffffffffff\n"
    "Threads:\t7\n"
    "SigQ:\t0/96364\n"
    "SigPnd:\t0000000000000100\n"
    "ShdPnd:\t0000000000004000\n"
    "SigBlk:\t0000000000010000\n"
    "SigIgn:\t0000000000001000\n"
    "SigCgt:\tfffffffe00014a07\n"
    "CapInh:\t0000000000000000\n"
    "CapEff:\t000001fffeffffff\n"
    "NoNewPrivs:\t1\n"
    "Seccomp:\t2\n"
    "Seccomp_filters:\t1\n"
    "Speculation_Store_Bypass:\tvulnerable\n"
    "SpeculationIndirectBranch:\talways enabled\n"
    "Cpus_allowed_list:\t0-1\n"
    "voluntary_ctxt_switches:\t12\n";

TEST(ParseStatus, EveryField) {
  auto r = parse_status(kStatusText);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const Status& s = *r;
  EXPECT_EQ(s.name, "my prog");
  EXPECT_EQ(s.state, 'S');
  EXPECT_EQ(s.tgid, 4242);
  EXPECT_EQ(s.pid, 4250);
  EXPECT_EQ(s.ppid, 4200);
  EXPECT_EQ(s.tracer_pid, 4100);
  EXPECT_EQ(s.uid, (std::array<uid_t, 4>{1000, 1001, 1002, 1003}));
  EXPECT_EQ(s.gid, (std::array<gid_t, 4>{2000, 2001, 2002, 2003}));
  EXPECT_EQ(s.nstgid, (std::vector<pid_t>{4242, 17, 1}));
  EXPECT_EQ(s.nspid, (std::vector<pid_t>{4250, 25, 9}));
  EXPECT_EQ(s.sig_pnd, 0x100u);
  EXPECT_EQ(s.shd_pnd, 0x4000u);
  EXPECT_EQ(s.sig_blk, 0x10000u);
  EXPECT_EQ(s.sig_ign, 0x1000u);
  EXPECT_EQ(s.sig_cgt, 0xfffffffe00014a07u);
  EXPECT_EQ(s.seccomp, 2);
  EXPECT_EQ(s.threads, 7);
  ASSERT_TRUE(s.kthread.has_value());
  EXPECT_FALSE(*s.kthread);
  EXPECT_TRUE(s.has_vm);
}

TEST(ParseStatus, KernelThreadOnNewKernel) {
  const char* text =
      "Name:\tkworker/0:1H\n"
      "Umask:\t0000\n"
      "State:\tI (idle)\n"
      "Tgid:\t87\n"
      "Pid:\t87\n"
      "PPid:\t2\n"
      "TracerPid:\t0\n"
      "Uid:\t0\t0\t0\t0\n"
      "Gid:\t0\t0\t0\t0\n"
      "NStgid:\t87\n"
      "NSpid:\t87\n"
      "Kthread:\t1\n"
      "Threads:\t1\n"
      "SigPnd:\t0000000000000000\n"
      "ShdPnd:\t0000000000000000\n"
      "SigBlk:\t0000000000000000\n"
      "SigIgn:\tffffffffffffffff\n"
      "SigCgt:\t0000000000000000\n"
      "Seccomp:\t0\n";
  auto r = parse_status(text);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->name, "kworker/0:1H");
  EXPECT_EQ(r->state, 'I');
  EXPECT_EQ(r->ppid, 2);
  ASSERT_TRUE(r->kthread.has_value());
  EXPECT_TRUE(*r->kthread);
  EXPECT_FALSE(r->has_vm);
  EXPECT_EQ(r->sig_ign, UINT64_MAX);
  EXPECT_EQ(r->nstgid, std::vector<pid_t>{87});
}

TEST(ParseStatus, OlderKernelWithoutKthreadOrNamespaces) {
  auto r = parse_status("Name:\tx\nState:\tZ (zombie)\nTgid:\t5\nPid:\t5\nPPid:\t1\n");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->state, 'Z');
  EXPECT_FALSE(r->kthread.has_value());
  EXPECT_FALSE(r->has_vm);
  EXPECT_TRUE(r->nspid.empty());
}

struct NameCase {
  const char* label;
  std::string line;  // the value after "Name:\t", as the kernel prints it
  std::string want;
};

const NameCase kNameCases[] = {
    {"plain", "cat", "cat"},
    {"space", "my prog", "my prog"},
    {"leading_and_trailing_space", " lead ", " lead "},
    {"escaped_newline_kept", "a\\nb", "a\\nb"},
    {"parens_and_colon", "x) (y: z", "x) (y: z"},
    {"escaped_backslash", "a\\\\b", "a\\\\b"},
    {"empty", "", ""},
};

class ParseStatusNameTest : public ::testing::TestWithParam<NameCase> {};

TEST_P(ParseStatusNameTest, KeepsNameAsPrinted) {
  const NameCase& c = GetParam();
  auto r = parse_status("Name:\t" + c.line + "\nState:\tR (running)\nPid:\t1\n");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->name, c.want);
}

INSTANTIATE_TEST_SUITE_P(Names, ParseStatusNameTest, ::testing::ValuesIn(kNameCases),
                         [](const auto& p) { return std::string(p.param.label); });

struct BadStatusCase {
  const char* label;
  std::string text;
  const char* needle;  // expected in the message
};

const BadStatusCase kBadStatus[] = {
    {"missing_pid", "Name:\tx\nState:\tR (running)\n", "no Pid"},
    {"missing_state", "Name:\tx\nPid:\t1\n", "no State"},
    {"empty", "", "no Pid"},
    {"bad_pid", "State:\tR\nPid:\tx\n", "line 2"},
    {"negative_ppid", "State:\tR\nPid:\t1\nPPid:\t-1\n", "line 3"},
    {"pid_overflow", "State:\tR\nPid:\t2147483648\n", "line 2"},
    {"three_uids", "State:\tR\nPid:\t1\nUid:\t1\t2\t3\n", "line 3"},
    {"five_gids", "State:\tR\nPid:\t1\nGid:\t1\t2\t3\t4\t5\n", "line 3"},
    {"bad_uid", "State:\tR\nPid:\t1\nUid:\t1\t2\tx\t4\n", "line 3"},
    {"empty_nspid", "State:\tR\nPid:\t1\nNSpid:\t\n", "line 3"},
    {"bad_nstgid", "State:\tR\nPid:\t1\nNStgid:\t1\tq\n", "line 3"},
    {"bad_sigmask", "State:\tR\nPid:\t1\nSigBlk:\tzz00000000000000\n", "line 3"},
    {"bad_kthread", "State:\tR\nPid:\t1\nKthread:\t2\n", "line 3"},
    {"bad_threads", "State:\tR\nPid:\t1\nThreads:\t-1\n", "line 3"},
    {"bad_seccomp", "State:\tR\nPid:\t1\nSeccomp:\tfilter\n", "line 3"},
    {"empty_state", "State:\t\nPid:\t1\n", "line 1"},
    {"no_colon", "State:\tR\nPid:\t1\ngarbage\n", "line 3"},
};

class ParseStatusBadTest : public ::testing::TestWithParam<BadStatusCase> {};

TEST_P(ParseStatusBadTest, Rejects) {
  const BadStatusCase& c = GetParam();
  auto r = parse_status(c.text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kParse);
  EXPECT_NE(r.error().message().find(c.needle), std::string::npos) << r.error().message();
}

INSTANTIATE_TEST_SUITE_P(Inputs, ParseStatusBadTest, ::testing::ValuesIn(kBadStatus),
                         [](const auto& p) { return std::string(p.param.label); });

// ---------------------------------------------------------------- stat

// Fields 3.. of a real stat line after "(comm) ": state R, ppid 3086,
// flags 4194304, starttime 46669.
const std::string kStatTail =
    " 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 46669 3133440 404 "
    "18446744073709551615 93961228566528 93961228586409 140728798504384 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 "
    "93961228602416 93961228604032 93961870827520 140728798505414 140728798505434 140728798505434 "
    "140728798506987 0\n";

struct StatCase {
  const char* label;
  std::string text;
  pid_t pid;
  std::string comm;
  char state;
  pid_t ppid;
  unsigned flags;
  uint64_t start_time;
};

const StatCase kStatCases[] = {
    {"plain", "3091 (cat) R" + kStatTail, 3091, "cat", 'R', 3086, 4194304, 46669},
    {"spaces", "3091 (my prog) S" + kStatTail, 3091, "my prog", 'S', 3086, 4194304, 46669},
    {"close_open_inside", "42 (a) (b) t" + kStatTail, 42, "a) (b", 't', 3086, 4194304, 46669},
    {"only_parens", "42 ()) Z" + kStatTail, 42, ")", 'Z', 3086, 4194304, 46669},
    {"empty_comm", "42 () D" + kStatTail, 42, "", 'D', 3086, 4194304, 46669},
    {"raw_newline", "42 (a\nb) S" + kStatTail, 42, "a\nb", 'S', 3086, 4194304, 46669},
    {"kernel_thread",
     "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0 18446744073709551615 0 0 0 0 0 0 0 "
     "2147483647 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0",
     2, "kthreadd", 'S', 0, 2129984, 3},
    {"no_trailing_newline", "7 (x) R 1 1 1 0 -1 64 0 0 0 0 0 0 0 0 20 0 1 0 123456789012", 7, "x", 'R', 1, 64,
     123456789012},
};

class ParseStatTest : public ::testing::TestWithParam<StatCase> {};

TEST_P(ParseStatTest, Parses) {
  const StatCase& c = GetParam();
  auto r = parse_stat(c.text);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->pid, c.pid);
  EXPECT_EQ(r->comm, c.comm);
  EXPECT_EQ(r->state, c.state);
  EXPECT_EQ(r->ppid, c.ppid);
  EXPECT_EQ(r->flags, c.flags);
  EXPECT_EQ(r->start_time, c.start_time);
}

INSTANTIATE_TEST_SUITE_P(Lines, ParseStatTest, ::testing::ValuesIn(kStatCases),
                         [](const auto& p) { return std::string(p.param.label); });

TEST(ParseStat, KernelThreadFlag) {
  auto r = parse_stat(kStatCases[6].text);
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->flags & 0x00200000u, 0u);  // PF_KTHREAD
}

const char* const kBadStat[] = {
    "",
    "3091 cat R 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 46669",     // no parens
    "3091 (cat R 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 46669",    // no ')'
    "x (cat) R 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 46669",      // bad pid
    "3091 (cat) R 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0",         // starttime missing
    "3091 (cat) R -1 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 46669",     // bad ppid
    "3091 (cat) R 3086 3086 2324 0 -1 0x10 99 0 0 0 0 0 0 0 20 0 1 0 46669",      // bad flags
    "3091 (cat) R 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 x",       // bad starttime
    "3091 (cat) RS 3086 3086 2324 0 -1 4194304 99 0 0 0 0 0 0 0 20 0 1 0 46669",  // bad state
    "3091 (cat)",                                                                 // truncated
    ") 3091 (",                                                                   // ')' before '('
};

class ParseStatBadTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ParseStatBadTest, Rejects) {
  auto r = parse_stat(GetParam());
  ASSERT_FALSE(r.ok()) << "accepted: " << GetParam();
  EXPECT_EQ(r.error().code(), Errc::kParse);
}

INSTANTIATE_TEST_SUITE_P(Lines, ParseStatBadTest, ::testing::ValuesIn(kBadStat));

// ---------------------------------------------------------------- auxv

std::vector<std::byte> auxv_bytes(std::initializer_list<uint64_t> words) {
  std::vector<std::byte> out(words.size() * sizeof(uint64_t));
  size_t i = 0;
  for (uint64_t w : words) std::memcpy(out.data() + 8 * i++, &w, sizeof w);
  return out;
}

TEST(ParseAuxv, PairsUntilAtNull) {
  auto data =
      auxv_bytes({AT_PHDR, 0x400040, AT_PAGESZ, 4096, AT_BASE, 0x7f0000000000, AT_ENTRY, 0x401000, AT_NULL, 0,
                  /* padding after AT_NULL */ 0, 0});
  auto r = parse_auxv(data);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].type, uint64_t{AT_PHDR});
  EXPECT_EQ((*r)[0].value, 0x400040u);
  EXPECT_EQ(auxv_get(*r, AT_PAGESZ), 4096u);
  EXPECT_EQ(auxv_get(*r, AT_BASE), 0x7f0000000000u);
  EXPECT_EQ(auxv_get(*r, AT_ENTRY), 0x401000u);
  EXPECT_FALSE(auxv_get(*r, AT_SYSINFO_EHDR).has_value());
  EXPECT_FALSE(auxv_get(*r, AT_NULL).has_value());
}

TEST(ParseAuxv, OnlyAtNullIsEmpty) {
  auto r = parse_auxv(auxv_bytes({AT_NULL, 0}));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(ParseAuxv, UnalignedBuffer) {
  auto words = auxv_bytes({AT_PAGESZ, 16384, AT_NULL, 0});
  std::vector<std::byte> buf(words.size() + 1);
  std::memcpy(buf.data() + 1, words.data(), words.size());
  auto r = parse_auxv(std::span<const std::byte>(buf).subspan(1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(auxv_get(*r, AT_PAGESZ), 16384u);
}

struct BadAuxvCase {
  const char* label;
  std::vector<std::byte> data;
};

std::vector<std::byte> drop_tail(std::vector<std::byte> v, size_t n) {
  v.resize(v.size() - n);
  return v;
}

const BadAuxvCase kBadAuxv[] = {
    {"empty", {}},
    {"no_at_null", auxv_bytes({AT_PAGESZ, 4096, AT_ENTRY, 0x401000})},
    {"half_pair", auxv_bytes({AT_PAGESZ, 4096, AT_NULL})},
    {"cut_inside_at_null", drop_tail(auxv_bytes({AT_PAGESZ, 4096, AT_NULL, 0}), 9)},
    {"odd_bytes", drop_tail(auxv_bytes({AT_PAGESZ, 4096}), 3)},
};

class ParseAuxvBadTest : public ::testing::TestWithParam<BadAuxvCase> {};

TEST_P(ParseAuxvBadTest, RejectsTruncated) {
  auto r = parse_auxv(GetParam().data);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kParse);
}

INSTANTIATE_TEST_SUITE_P(Inputs, ParseAuxvBadTest, ::testing::ValuesIn(kBadAuxv),
                         [](const auto& p) { return std::string(p.param.label); });

// ---------------------------------------------------------------- pid lists

struct PidListCase {
  const char* label;
  std::string text;
  bool ok;
  std::vector<pid_t> want;
};

const PidListCase kPidLists[] = {
    {"kernel_children_format", "3108 \n", true, {3108}},
    {"several", "12 7 99999 ", true, {12, 7, 99999}},
    {"empty", "", true, {}},
    {"only_space", " \n", true, {}},
    {"word", "12 x ", false, {}},
    {"zero", "0 ", false, {}},
    {"negative", "-5 ", false, {}},
    {"hex", "0x10 ", false, {}},
    {"overflow", "4294967296 ", false, {}},
};

class ParsePidListTest : public ::testing::TestWithParam<PidListCase> {};

TEST_P(ParsePidListTest, Parses) {
  const PidListCase& c = GetParam();
  auto r = parse_pid_list(c.text);
  ASSERT_EQ(r.ok(), c.ok);
  if (c.ok) {
    EXPECT_EQ(*r, c.want);
  } else {
    EXPECT_EQ(r.error().code(), Errc::kParse);
  }
}

INSTANTIATE_TEST_SUITE_P(Inputs, ParsePidListTest, ::testing::ValuesIn(kPidLists),
                         [](const auto& p) { return std::string(p.param.label); });

// ---------------------------------------------------------------- syscall

TEST(ParseSyscall, Running) {
  auto r = parse_syscall("running\n");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->running);
}

TEST(ParseSyscall, InSyscall) {
  // A thread blocked in read(3, buf, 0x20000).
  auto r = parse_syscall(
      "0 0x3 0x7f9133690000 0x20000 0x7f9133721b60 0xffffffff 0x0 0x7ffc7729b078 0x7f913380a2ad\n");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_FALSE(r->running);
  EXPECT_EQ(r->nr, 0);
  EXPECT_EQ(r->args, (std::array<uint64_t, 6>{3, 0x7f9133690000, 0x20000, 0x7f9133721b60, 0xffffffff, 0}));
  EXPECT_EQ(r->sp, 0x7ffc7729b078u);
  EXPECT_EQ(r->pc, 0x7f913380a2adu);
}

TEST(ParseSyscall, FutexWithFullWidthArgs) {
  auto r =
      parse_syscall("202 0x7f0000001000 0x80 0x0 0x0 0x0 0xffffffffffffffff 0x7ffc00000000 0x7f00000000a0");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->nr, 202);
  EXPECT_EQ(r->args[5], UINT64_MAX);
}

TEST(ParseSyscall, BlockedOutsideSyscall) {
  auto r = parse_syscall("-1 0x7ffc7729b078 0x401000\n");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_FALSE(r->running);
  EXPECT_EQ(r->nr, -1);
  EXPECT_EQ(r->sp, 0x7ffc7729b078u);
  EXPECT_EQ(r->pc, 0x401000u);
  EXPECT_EQ(r->args, (std::array<uint64_t, 6>{}));
}

const char* const kBadSyscall[] = {
    "",
    "\n",
    "runnin",
    "abc 0x1 0x2",
    "0 0x1",                                        // too few for nr >= 0
    "0 0x1 0x2 0x3 0x4 0x5 0x6 0x7",                // one short
    "0 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8 0x9",        // one too many
    "-1 0x1 0x2 0x3",                               // too many for nr < 0
    "-1 0x1",                                       // too few for nr < 0
    "0 1 2 3 4 5 6 7 8",                            // args without 0x
    "0x0 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8",          // nr must be decimal
    "-1 0xzz 0x1",                                  // bad hex
    "- 0x1 0x2",                                    // lone minus
    "99999999999 0x1 0x2 0x3 0x4 0x5 0x6 0x7 0x8",  // nr out of int range
};

class ParseSyscallBadTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ParseSyscallBadTest, Rejects) {
  auto r = parse_syscall(GetParam());
  ASSERT_FALSE(r.ok()) << "accepted: " << GetParam();
  EXPECT_EQ(r.error().code(), Errc::kParse);
}

INSTANTIATE_TEST_SUITE_P(Lines, ParseSyscallBadTest, ::testing::ValuesIn(kBadSyscall));

// ---------------------------------------------------------------- live (smoke)

// Larger than any pid_max (at most 2^22), so never a live process.
constexpr pid_t kNoPid = 2147483647;

TEST(LiveProcfs, MissingProcessIsNoSuchProcess) {
  auto r = read_status(kNoPid);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kNoSuchProcess);
  EXPECT_NE(r.error().to_string().find("/proc/2147483647/status"), std::string::npos)
      << r.error().to_string();

  auto m = read_maps(kNoPid);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), Errc::kNoSuchProcess);
  EXPECT_EQ(list_tasks(kNoPid).error().code(), Errc::kNoSuchProcess);
  EXPECT_EQ(list_children(kNoPid).error().code(), Errc::kNoSuchProcess);
  EXPECT_EQ(read_syscall(kNoPid, kNoPid).error().code(), Errc::kNoSuchProcess);
}

TEST(LiveProcfs, OtherErrnoIsIo) {
  // open(O_RDONLY) of a directory succeeds; read() fails with EISDIR.
  auto r = read_text("/proc/self");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kIo);
  EXPECT_EQ(r.error().sys_errno(), EISDIR);
}

TEST(LiveProcfs, ReadMapsOfSelfFindsExecutableMapping) {
  auto r = read_maps(getpid());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  bool found = std::any_of(r->begin(), r->end(),
                           [](const MapEntry& e) { return e.exec && e.file_backed() && !e.path.empty(); });
  EXPECT_TRUE(found);
  // The function we are running in lies in an executable mapping.
  auto pc = reinterpret_cast<uint64_t>(&parse_maps);
  EXPECT_TRUE(std::any_of(r->begin(), r->end(),
                          [pc](const MapEntry& e) { return e.exec && e.start <= pc && pc < e.end; }));
}

TEST(LiveProcfs, ReadStatusStatAuxvOfSelf) {
  auto st = read_status(getpid());
  ASSERT_TRUE(st.ok()) << st.error().to_string();
  EXPECT_EQ(st->pid, getpid());
  EXPECT_EQ(st->tgid, getpid());
  EXPECT_EQ(st->ppid, getppid());
  EXPECT_TRUE(st->has_vm);
  EXPECT_GE(st->threads, 1);

  auto tst = read_status(getpid(), gettid());
  ASSERT_TRUE(tst.ok()) << tst.error().to_string();
  EXPECT_EQ(tst->pid, gettid());

  auto stat = read_stat(getpid());
  ASSERT_TRUE(stat.ok()) << stat.error().to_string();
  EXPECT_EQ(stat->pid, getpid());
  EXPECT_EQ(stat->ppid, getppid());
  EXPECT_EQ(stat->state, 'R');
  EXPECT_EQ(stat->flags & 0x00200000u, 0u);

  auto aux = read_auxv(getpid());
  ASSERT_TRUE(aux.ok()) << aux.error().to_string();
  EXPECT_EQ(auxv_get(*aux, AT_PAGESZ), static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));

  auto sc = read_syscall(getpid(), gettid());
  ASSERT_TRUE(sc.ok()) << sc.error().to_string();
  // A task reading its own syscall file is inside that read() while the
  // kernel formats it.
  EXPECT_FALSE(sc->running);
  EXPECT_EQ(sc->nr, SYS_read);
}

TEST(LiveProcfs, ListTasksSeesEveryThread) {
  std::promise<pid_t> started;
  std::promise<void> release;
  std::thread t([&] {
    started.set_value(gettid());
    release.get_future().wait();
  });
  auto tid_future = started.get_future();
  ASSERT_EQ(tid_future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  pid_t other = tid_future.get();
  auto r = list_tasks(getpid());
  release.set_value();
  t.join();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(std::is_sorted(r->begin(), r->end()));
  EXPECT_NE(std::find(r->begin(), r->end(), getpid()), r->end());
  EXPECT_NE(std::find(r->begin(), r->end(), other), r->end());
}

// A forked child blocked on a pipe read; killed and reaped on scope exit
// even when an assertion fails.
class BlockedChild {
 public:
  BlockedChild() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[1]);
      char c;
      // Returns 0 (EOF) once the parent closes the write end.
      ssize_t n = read(fds[0], &c, 1);
      _exit(n == 0 ? 0 : 1);
    }
    close(fds[0]);
    write_fd_ = fds[1];
  }
  ~BlockedChild() {
    if (write_fd_ >= 0) close(write_fd_);
    if (pid_ > 0) {
      if (!reaped(std::chrono::seconds(10))) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
  }
  BlockedChild(const BlockedChild&) = delete;
  BlockedChild& operator=(const BlockedChild&) = delete;

  pid_t pid() const { return pid_; }

  // Lets the child exit and reaps it within `deadline`; true if it exited 0.
  bool finish(std::chrono::milliseconds deadline) {
    close(write_fd_);
    write_fd_ = -1;
    return reaped(deadline) && status_ok_;
  }

 private:
  bool reaped(std::chrono::milliseconds deadline) {
    if (pid_ <= 0) return true;
    auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      pid_t w = waitpid(pid_, &status, WNOHANG);
      if (w == pid_) {
        status_ok_ = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        pid_ = -1;
        return true;
      }
      if (w < 0) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }

  pid_t pid_ = -1;
  int write_fd_ = -1;
  bool status_ok_ = false;
};

TEST(LiveProcfs, ListChildrenFindsForkedChild) {
  BlockedChild child;
  ASSERT_GT(child.pid(), 0) << "fork failed";
  auto r = list_children(getpid());
  if (!r.ok() && r.error().code() == Errc::kNotSupported) GTEST_SKIP() << r.error().to_string();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_NE(std::find(r->begin(), r->end(), child.pid()), r->end());
  EXPECT_TRUE(child.finish(std::chrono::seconds(10)));
}

}  // namespace
}  // namespace remora::procfs
