// Tables for remote/seccomp.h: programs assembled by hand (one per rule of
// the interpreter), and programs made by libseccomp (seccomp_export_bpf),
// which is what real targets install.
#include "remote/seccomp.h"

#include <gtest/gtest.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "arch/arch.h"

#ifdef REMORA_HAVE_LIBSECCOMP
#include <seccomp.h>
#endif

namespace remora::remote::seccomp {
namespace {

sock_filter stmt(uint16_t code, uint32_t k) { return sock_filter{code, 0, 0, k}; }
sock_filter jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) { return sock_filter{code, jt, jf, k}; }

constexpr uint32_t kErrnoEperm = SECCOMP_RET_ERRNO | EPERM;

// The usual shape: check the architecture, then `action` for `nr`, else allow.
Program deny(long nr, uint32_t action) {
  return {
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      jump(BPF_JMP | BPF_JEQ | BPF_K, remora::arch::kAuditArch, 1, 0),
      stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      stmt(BPF_RET | BPF_K, action),
      stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
}

SyscallData call(long nr, std::array<uint64_t, 6> args = {}, uint8_t known = 0x3f) {
  SyscallData d;
  d.nr = static_cast<int32_t>(nr);
  d.arch = remora::arch::kAuditArch;
  d.args = args;
  d.args_known = known;
  return d;
}

std::vector<uint32_t> rets(const Outcome& o) {
  std::vector<uint32_t> v;
  for (const auto& x : o.verdicts) v.push_back(x.ret);
  return v;
}

TEST(SeccompBpf, ActionsAndNames) {
  struct Row {
    uint32_t ret;
    bool refuses;
    const char* name;
  } rows[] = {
      {SECCOMP_RET_ALLOW, false, "SECCOMP_RET_ALLOW"},
      {SECCOMP_RET_LOG, false, "SECCOMP_RET_LOG"},
      {SECCOMP_RET_USER_NOTIF, false, "SECCOMP_RET_USER_NOTIF"},
      {SECCOMP_RET_TRACE | 7, true, "SECCOMP_RET_TRACE"},
      {kErrnoEperm, true, "SECCOMP_RET_ERRNO(EPERM)"},
      {SECCOMP_RET_ERRNO | ENOSYS, true, "SECCOMP_RET_ERRNO(ENOSYS)"},
      {SECCOMP_RET_TRAP, true, "SECCOMP_RET_TRAP"},
      {SECCOMP_RET_KILL_THREAD, true, "SECCOMP_RET_KILL_THREAD"},
      {SECCOMP_RET_KILL_PROCESS, true, "SECCOMP_RET_KILL_PROCESS"},
      {0x12340000, true, "unknown action 0x12340000"},
  };
  for (const auto& r : rows) {
    Verdict v{r.ret};
    EXPECT_EQ(v.refuses(), r.refuses) << r.name;
    EXPECT_EQ(v.name(), r.name);
  }
  EXPECT_EQ(Verdict{kErrnoEperm}.effect(), "make it fail with EPERM (SECCOMP_RET_ERRNO(EPERM))");
  EXPECT_NE(Verdict{0x12340000}.effect().find("SECCOMP_RET_KILL_PROCESS"), std::string::npos);
}

TEST(SeccompBpf, DenyOneCall) {
  struct Row {
    uint32_t action;
    long nr;
    uint32_t want;
  } rows[] = {
      {SECCOMP_RET_KILL_PROCESS, SYS_mmap, SECCOMP_RET_KILL_PROCESS},
      {SECCOMP_RET_KILL_PROCESS, SYS_getpid, SECCOMP_RET_ALLOW},
      {kErrnoEperm, SYS_mmap, kErrnoEperm},
      {SECCOMP_RET_TRAP, SYS_mmap, SECCOMP_RET_TRAP},
  };
  for (const auto& r : rows) {
    Outcome o = evaluate(deny(SYS_mmap, r.action), call(r.nr));
    EXPECT_EQ(rets(o), std::vector<uint32_t>{r.want}) << r.nr;
    EXPECT_FALSE(o.malformed);
  }
  // Another architecture is killed by the arch check.
  SyscallData x32 = call(SYS_mmap);
  x32.arch = remora::arch::kAuditArch ^ 0x1;  // any other AUDIT_ARCH value
  EXPECT_EQ(rets(evaluate(deny(SYS_write, SECCOMP_RET_ALLOW), x32)),
            std::vector<uint32_t>{SECCOMP_RET_KILL_PROCESS});
}

// A program computing A and returning it: each ALU rule.
TEST(SeccompBpf, AluTable) {
  struct Row {
    uint16_t op;
    uint32_t a, b, want;
  } rows[] = {
      {BPF_ADD, 7, 5, 12},          {BPF_SUB, 5, 7, 0xfffffffe}, {BPF_MUL, 0x10000, 0x10000, 0},
      {BPF_DIV, 17, 5, 3},          {BPF_MOD, 17, 5, 2},         {BPF_OR, 0xf0, 0x0f, 0xff},
      {BPF_AND, 0xf0, 0x3c, 0x30},  {BPF_XOR, 0xff, 0x0f, 0xf0}, {BPF_LSH, 1, 31, 0x80000000},
      {BPF_RSH, 0x80000000, 31, 1},
  };
  for (const auto& r : rows) {
    Program k = {stmt(BPF_LD | BPF_IMM, r.a), stmt(BPF_ALU | r.op | BPF_K, r.b), stmt(BPF_RET | BPF_A, 0)};
    EXPECT_EQ(rets(evaluate(k, call(0))), std::vector<uint32_t>{r.want}) << "K op " << r.op;
    Program x = {stmt(BPF_LDX | BPF_IMM, r.b), stmt(BPF_LD | BPF_IMM, r.a), stmt(BPF_ALU | r.op | BPF_X, 0),
                 stmt(BPF_RET | BPF_A, 0)};
    EXPECT_EQ(rets(evaluate(x, call(0))), std::vector<uint32_t>{r.want}) << "X op " << r.op;
  }
  Program neg = {stmt(BPF_LD | BPF_IMM, 1), stmt(BPF_ALU | BPF_NEG, 0), stmt(BPF_RET | BPF_A, 0)};
  EXPECT_EQ(rets(evaluate(neg, call(0))), std::vector<uint32_t>{0xffffffff});
  // Division by a zero X at run time: the kernel's translation returns 0.
  Program div0 = {stmt(BPF_LDX | BPF_IMM, 0), stmt(BPF_LD | BPF_IMM, 9), stmt(BPF_ALU | BPF_DIV | BPF_X, 0),
                  stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
  EXPECT_EQ(rets(evaluate(div0, call(0))), std::vector<uint32_t>{SECCOMP_RET_KILL_THREAD});
}

TEST(SeccompBpf, LoadsStoresMiscAndJumps) {
  // M[3] = nr; X = M[3]; A = len; TXA: A = nr; ret A.
  Program p = {stmt(BPF_LD | BPF_W | BPF_ABS, 0), stmt(BPF_ST, 3),
               stmt(BPF_LDX | BPF_MEM, 3),        stmt(BPF_LD | BPF_W | BPF_LEN, 0),
               stmt(BPF_MISC | BPF_TXA, 0),       stmt(BPF_RET | BPF_A, 0)};
  EXPECT_EQ(rets(evaluate(p, call(42))), std::vector<uint32_t>{42});
  Program len = {stmt(BPF_LDX | BPF_W | BPF_LEN, 0), stmt(BPF_STX, 0), stmt(BPF_LD | BPF_MEM, 0),
                 stmt(BPF_RET | BPF_A, 0)};
  EXPECT_EQ(rets(evaluate(len, call(0))), std::vector<uint32_t>{64});
  // Jumps against X and K: JGT, JGE, JSET, JA. Arg 1's low word vs 10.
  struct Row {
    uint16_t op;
    uint64_t arg;
    bool taken;
  } rows[] = {
      {BPF_JGT, 11, true}, {BPF_JGT, 10, false}, {BPF_JGE, 10, true}, {BPF_JGE, 9, false},
      {BPF_JSET, 2, true}, {BPF_JSET, 5, false}, {BPF_JEQ, 10, true}, {BPF_JEQ, 0x100000000a, true},
  };
  for (const auto& r : rows) {
    for (uint16_t src : {uint16_t{BPF_K}, uint16_t{BPF_X}}) {
      Program j = {stmt(BPF_LDX | BPF_IMM, 10),
                   stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[1])),
                   jump(BPF_JMP | r.op | src, 10, 1, 0),
                   stmt(BPF_JMP | BPF_JA, 1),
                   stmt(BPF_RET | BPF_K, kErrnoEperm),
                   stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
      EXPECT_EQ(rets(evaluate(j, call(0, {0, r.arg}))),
                std::vector<uint32_t>{r.taken ? kErrnoEperm : SECCOMP_RET_ALLOW})
          << "op " << r.op << " src " << src << " arg " << r.arg;
    }
  }
}

TEST(SeccompBpf, MalformedIsKill) {
  const Program bad[] = {
      {stmt(BPF_LD | BPF_W | BPF_ABS, 64), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},  // past seccomp_data
      {stmt(BPF_LD | BPF_W | BPF_ABS, 2), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},   // unaligned
      {stmt(BPF_LD | BPF_H | BPF_ABS, 0), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},   // not a word
      {stmt(BPF_LD | BPF_W | BPF_IND, 0), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},   // IND
      {stmt(BPF_LD | BPF_MEM, 16), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},          // M[16]
      {stmt(BPF_ST, 99), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},
      {stmt(BPF_JMP | BPF_JA, 5), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},  // jump out
      {jump(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 9), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},
      {stmt(BPF_LD | BPF_IMM, 1), stmt(BPF_ALU | BPF_DIV | BPF_K, 0), stmt(BPF_RET | BPF_A, 0)},
      {stmt(BPF_LD | BPF_IMM, 1), stmt(BPF_ALU | BPF_LSH | BPF_K, 32), stmt(BPF_RET | BPF_A, 0)},
      {stmt(BPF_LD | BPF_IMM, 1)},                                // no final return
      {stmt(0xff, 0), stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)},  // no such instruction
      {stmt(BPF_RET | BPF_X, 0)},                                 // RET X
      {},                                                         // empty
  };
  for (size_t i = 0; i < std::size(bad); ++i) {
    Outcome o = evaluate(bad[i], call(SYS_mmap));
    EXPECT_TRUE(o.malformed) << "program " << i;
    EXPECT_EQ(rets(o), std::vector<uint32_t>{SECCOMP_RET_KILL_PROCESS}) << "program " << i;
  }
}

// mmap refused only with PROT_EXEC (args[2] & 4): known arguments decide,
// unknown ones give both verdicts.
TEST(SeccompBpf, UnknownArgumentsFollowBothPaths) {
  Program p = {
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 3),
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[2])),
      jump(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
      stmt(BPF_RET | BPF_K, kErrnoEperm),
      stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  EXPECT_EQ(rets(evaluate(p, call(SYS_mmap, {0, 0, PROT_READ}))), std::vector<uint32_t>{SECCOMP_RET_ALLOW});
  EXPECT_EQ(rets(evaluate(p, call(SYS_mmap, {0, 0, PROT_EXEC}))), std::vector<uint32_t>{kErrnoEperm});
  EXPECT_EQ(rets(evaluate(p, call(SYS_mmap, {}, 0))),
            (std::vector<uint32_t>{SECCOMP_RET_ALLOW, kErrnoEperm}));
  // check() refuses only when every path refuses.
  PlannedSyscall unknown{SYS_mmap, "for a test", {}, 0};
  const Program stack[] = {p};
  EXPECT_TRUE(check(stack, std::span(&unknown, 1), "test").ok());
  // A taken JEQ teaches the path the value: nr == mmap twice cannot fork.
  Program twice = {
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
      jump(BPF_JMP | BPF_JEQ | BPF_K, 5, 0, 3),
      stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])),
      jump(BPF_JMP | BPF_JEQ | BPF_K, 5, 1, 0),
      stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP),  // unreachable
      stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  EXPECT_EQ(rets(evaluate(twice, call(0, {}, 0))), std::vector<uint32_t>{SECCOMP_RET_ALLOW});
}

TEST(SeccompBpf, StackPrecedence) {
  struct Row {
    uint32_t older, newer, want;
  } rows[] = {
      {kErrnoEperm, SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_KILL_PROCESS},
      {SECCOMP_RET_KILL_THREAD, SECCOMP_RET_TRAP, SECCOMP_RET_KILL_THREAD},
      {SECCOMP_RET_TRAP, kErrnoEperm, SECCOMP_RET_TRAP},
      {SECCOMP_RET_TRACE, SECCOMP_RET_USER_NOTIF, SECCOMP_RET_USER_NOTIF},
      {SECCOMP_RET_LOG, SECCOMP_RET_TRACE, SECCOMP_RET_TRACE},
      {SECCOMP_RET_ALLOW, SECCOMP_RET_LOG, SECCOMP_RET_LOG},
      // A tie: the newer filter's data wins.
      {SECCOMP_RET_ERRNO | EACCES, kErrnoEperm, kErrnoEperm},
  };
  for (const auto& r : rows) {
    const Program stack[] = {deny(SYS_mmap, r.older), deny(SYS_mmap, r.newer)};
    EXPECT_EQ(rets(evaluate_stack(stack, call(SYS_mmap))), std::vector<uint32_t>{r.want})
        << std::hex << r.older << " " << r.newer;
  }
  EXPECT_EQ(rets(evaluate_stack({}, call(SYS_mmap))), std::vector<uint32_t>{SECCOMP_RET_ALLOW});
}

TEST(SeccompCheck, MessagesNameTheCallAndTheVerdict) {
  const Program kill_mmap[] = {deny(SYS_mmap, SECCOMP_RET_KILL_PROCESS)};
  auto plan = engine_syscalls({.creates_scratch = true});
  auto r = check(kill_mmap, plan, "call a function");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), Errc::kNotSupported);
  EXPECT_EQ(
      r.error().to_string(),
      "call a function: the target's seccomp filter would kill the process (SECCOMP_RET_KILL_PROCESS) on "
      "mmap, which Remora needs to create its scratch mapping; nothing was changed (use another thread "
      "with -T if one is not filtered this way)");
  // A session whose scratch exists makes no mmap.
  EXPECT_TRUE(check(kill_mmap, engine_syscalls({}), "call").ok());

  const Program eperm_tgkill[] = {deny(SYS_tgkill, kErrnoEperm)};
  auto t = check(eperm_tgkill, engine_syscalls({.marked_call = true}), "call");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message().find("on tgkill"), std::string::npos) << t.error().message();
  EXPECT_NE(t.error().message().find("SECCOMP_RET_ERRNO(EPERM)"), std::string::npos);
  EXPECT_TRUE(check(eperm_tgkill, engine_syscalls({.marked_call = false}), "call").ok());

  const Program trace_getppid[] = {deny(SYS_getppid, SECCOMP_RET_TRACE)};
  auto s = check(trace_getppid, engine_syscalls({.is_syscall = true, .nr = SYS_getppid}), "system call");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("ENOSYS"), std::string::npos);
  EXPECT_NE(s.error().message().find("on getppid, the system call asked for"), std::string::npos);

  // Naming the scratch may fail (old kernels do), killing for it may not.
  const Program eperm_prctl[] = {deny(SYS_prctl, kErrnoEperm)};
  EXPECT_TRUE(check(eperm_prctl, plan, "call").ok());
  const Program trap_prctl[] = {deny(SYS_prctl, SECCOMP_RET_TRAP)};
  EXPECT_FALSE(check(trap_prctl, plan, "call").ok());

  const Program notif[] = {deny(SYS_mmap, SECCOMP_RET_USER_NOTIF)};
  EXPECT_TRUE(check(notif, plan, "call").ok());
  EXPECT_TRUE(check({}, plan, "call").ok());
}

TEST(SeccompCheck, EnginePlan) {
  auto has = [](const std::vector<PlannedSyscall>& v, long nr) {
    for (const auto& p : v)
      if (p.nr == nr) return true;
    return false;
  };
  auto first = engine_syscalls({.marked_call = true, .creates_scratch = true, .swaps_mask = true});
  for (long nr : {SYS_mmap, SYS_mprotect, SYS_prctl, SYS_madvise, SYS_rt_sigprocmask, SYS_getpid, SYS_gettid,
                  SYS_tgkill, SYS_rt_sigreturn})
    EXPECT_TRUE(has(first, nr)) << syscall_name(nr);
  // The scratch's mmap is checked with the address it really asks for.
  auto hinted = engine_syscalls({.creates_scratch = true, .scratch_hint = 0x7f0000000000});
  ASSERT_FALSE(hinted.empty());
  EXPECT_EQ(hinted[0].nr, SYS_mmap);
  EXPECT_EQ(hinted[0].args[0], 0x7f0000000000u);
  auto plain = engine_syscalls({});
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].nr, SYS_rt_sigreturn);
  auto sys = engine_syscalls({.is_syscall = true, .nr = SYS_munmap, .args = {1, 2}});
  ASSERT_EQ(sys.size(), 2u);
  EXPECT_EQ(sys[0].nr, SYS_munmap);
  EXPECT_EQ(sys[0].args[1], 2u);
  EXPECT_TRUE(has({agent_load_syscalls().begin(), agent_load_syscalls().end()}, SYS_clone3));
  EXPECT_EQ(syscall_name(SYS_mmap), "mmap");
  EXPECT_EQ(syscall_name(100000), "system call 100000");
}

// Sandboxes hide clone3 with ENOSYS so that glibc falls back to clone, and
// glibc goes on when rseq fails: neither refuses the agent's load.
TEST(SeccompCheck, AgentLoadCopesLikeGlibc) {
  const Program hide_clone3[] = {deny(SYS_clone3, SECCOMP_RET_ERRNO | ENOSYS)};
  EXPECT_TRUE(check(hide_clone3, agent_load_syscalls(), "load the agent").ok());
  const Program no_clone[] = {deny(SYS_clone3, SECCOMP_RET_ERRNO | ENOSYS), deny(SYS_clone, kErrnoEperm)};
  auto r = check(no_clone, agent_load_syscalls(), "load the agent");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("on clone, which loading the agent"), std::string::npos)
      << r.error().message();
  const Program no_rseq[] = {deny(SYS_rseq, kErrnoEperm)};
  EXPECT_TRUE(check(no_rseq, agent_load_syscalls(), "load the agent").ok());
  const Program kill_rseq[] = {deny(SYS_rseq, SECCOMP_RET_KILL_PROCESS)};
  EXPECT_FALSE(check(kill_rseq, agent_load_syscalls(), "load the agent").ok());
}

TEST(SeccompCheck, DenialNote) {
  EXPECT_EQ(denial_note(SYS_mmap, -EPERM, false, false, 0), "");  // no filter: not seccomp
  EXPECT_EQ(denial_note(SYS_mmap, -ENOMEM, false, true, 0), "");  // not a denial's errno
  std::string n = denial_note(SYS_mmap, -EPERM, false, true, EACCES);
  EXPECT_NE(n.find("seccomp"), std::string::npos);
  EXPECT_NE(n.find("mmap (EPERM)"), std::string::npos);
  EXPECT_NE(n.find("could not read the filter"), std::string::npos);
  EXPECT_NE(n.find("EACCES"), std::string::npos);
  EXPECT_NE(n.find("CAP_SYS_ADMIN"), std::string::npos);
  EXPECT_NE(denial_note(SYS_tgkill, 0, true, true, 0).find("tgkill (SIGSYS)"), std::string::npos);
  // A kill rolls the call back: rax holds its own number.
  EXPECT_NE(denial_note(SYS_mmap, SYS_mmap, false, true, EACCES).find("killed the process on mmap"),
            std::string::npos);
}

#ifdef REMORA_HAVE_LIBSECCOMP
// The program libseccomp would install for `ctx`, read back from a memfd.
Program export_bpf(scmp_filter_ctx ctx) {
  int fd = static_cast<int>(::syscall(SYS_memfd_create, "bpf", 0));
  EXPECT_GE(fd, 0);
  EXPECT_EQ(seccomp_export_bpf(ctx, fd), 0);
  off_t size = ::lseek(fd, 0, SEEK_END);
  Program p(static_cast<size_t>(size) / sizeof(sock_filter));
  EXPECT_EQ(::pread(fd, p.data(), static_cast<size_t>(size), 0), size);
  ::close(fd);
  seccomp_release(ctx);
  return p;
}

TEST(SeccompLibseccomp, ProgramsItMakes) {
  // Default allow, mmap killed.
  scmp_filter_ctx kill = seccomp_init(SCMP_ACT_ALLOW);
  ASSERT_NE(kill, nullptr);
  ASSERT_EQ(seccomp_rule_add(kill, SCMP_ACT_KILL_PROCESS, SCMP_SYS(mmap), 0), 0);
  const Program kill_mmap[] = {export_bpf(kill)};
  auto r = check(kill_mmap, engine_syscalls({.creates_scratch = true}), "call");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("SECCOMP_RET_KILL_PROCESS) on mmap"), std::string::npos)
      << r.error().message();
  EXPECT_TRUE(check(kill_mmap, engine_syscalls({.marked_call = true}), "call").ok());

  // ERRNO(EPERM) on mmap with PROT_WRITE|PROT_EXEC (a W^X policy, as
  // systemd's MemoryDenyWriteExecute): the engine's mmap is R-X, never both.
  scmp_filter_ctx wx = seccomp_init(SCMP_ACT_ALLOW);
  ASSERT_EQ(seccomp_rule_add(wx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(mmap), 1,
                             SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE | PROT_EXEC)),
            0);
  const Program wx_mmap[] = {export_bpf(wx)};
  EXPECT_TRUE(check(wx_mmap, engine_syscalls({.creates_scratch = true}), "call").ok());
  // ERRNO(EPERM) on every mmap with PROT_EXEC: the scratch's code page is
  // mapped R-X, so that is refused before anything changes.
  scmp_filter_ctx exec = seccomp_init(SCMP_ACT_ALLOW);
  ASSERT_EQ(seccomp_rule_add(exec, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(mmap), 1,
                             SCMP_A2(SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC)),
            0);
  const Program exec_mmap[] = {export_bpf(exec)};
  EXPECT_FALSE(check(exec_mmap, engine_syscalls({.creates_scratch = true}), "call").ok());
  EXPECT_EQ(rets(evaluate(exec_mmap[0], call(SYS_mmap, {0, 4096, PROT_EXEC}))),
            std::vector<uint32_t>{kErrnoEperm});

  // A 64-bit argument compared half by half.
  scmp_filter_ctx wide = seccomp_init(SCMP_ACT_ALLOW);
  ASSERT_EQ(seccomp_rule_add(wide, SCMP_ACT_TRAP, SCMP_SYS(munmap), 1, SCMP_A0(SCMP_CMP_EQ, 0x1234567890ull)),
            0);
  const Program wide_munmap[] = {export_bpf(wide)};
  EXPECT_EQ(rets(evaluate(wide_munmap[0], call(SYS_munmap, {0x1234567890ull}))),
            std::vector<uint32_t>{SECCOMP_RET_TRAP});
  EXPECT_EQ(rets(evaluate(wide_munmap[0], call(SYS_munmap, {0x1234567891ull}))),
            std::vector<uint32_t>{SECCOMP_RET_ALLOW});
  EXPECT_EQ(rets(evaluate(wide_munmap[0], call(SYS_munmap, {0x9934567890ull}))),
            std::vector<uint32_t>{SECCOMP_RET_ALLOW});

  // An allow list (read, write, exit): the engine's first call is refused,
  // and the stack with an older allow-all keeps the refusal.
  scmp_filter_ctx list = seccomp_init(SCMP_ACT_ERRNO(EACCES));
  for (int nr : {SCMP_SYS(read), SCMP_SYS(write), SCMP_SYS(exit)})
    ASSERT_EQ(seccomp_rule_add(list, SCMP_ACT_ALLOW, nr, 0), 0);
  scmp_filter_ctx all = seccomp_init(SCMP_ACT_ALLOW);
  const Program stack[] = {export_bpf(all), export_bpf(list)};
  auto l = check(stack, engine_syscalls({}), "call");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message().find("SECCOMP_RET_ERRNO(EACCES)) on rt_sigreturn"), std::string::npos)
      << l.error().message();
}
#else
TEST(SeccompLibseccomp, ProgramsItMakes) {
  GTEST_SKIP() << "built without libseccomp (apt-get install libseccomp-dev): its tables are skipped";
}
#endif

}  // namespace
}  // namespace remora::remote::seccomp
