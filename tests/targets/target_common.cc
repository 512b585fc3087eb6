// Shared runtime of the target programs; see target_common.h.
#include "target_common.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace remora_target {

std::atomic<bool> g_stop{false};

namespace {

constexpr int kMaxWorkers = 160;
Worker g_workers[kMaxWorkers];
std::atomic<int> g_worker_count{0};

std::atomic<long> g_anomalies{0};
pthread_mutex_t g_detail_mu = PTHREAD_MUTEX_INITIALIZER;
char g_details[1536];
size_t g_details_len = 0;
int g_details_kept = 0;

std::atomic<long> g_probe_calls{0};
std::atomic<long> g_probe_string_calls{0};

void (*g_count_lock)() = nullptr;
void (*g_count_unlock)() = nullptr;

#if defined(__x86_64__)
bool g_have_avx = false;
bool g_have_avx512 = false;
#elif defined(__aarch64__)
bool g_have_sve = false;  // HWCAP_SVE
#endif

long g_fds_at_snapshot = 0;
long g_maps_at_snapshot = 0;

}  // namespace

extern "C" {
// Bumped by the entry stub of remora_probe when the stack is not aligned as
// the ABI requires at a call (x86_64: rsp % 16 == 8 at entry; aarch64:
// sp % 16 == 0).
__attribute__((visibility("hidden"), used)) std::atomic<long> remora_misaligned_entries{0};
}

pid_t gettid_() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void anomaly(const char* fmt, ...) {
  g_anomalies.fetch_add(1);
  // try-lock: a remote call may have interrupted a thread holding the lock;
  // losing a detail is better than deadlocking the probe.
  if (pthread_mutex_trylock(&g_detail_mu) != 0) return;
  if (g_details_kept < 8 && g_details_len + 4 < sizeof(g_details)) {
    if (g_details_len > 0) {
      memcpy(g_details + g_details_len, "; ", 2);
      g_details_len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_details + g_details_len, sizeof(g_details) - g_details_len, fmt, ap);
    va_end(ap);
    if (n > 0) g_details_len = std::min(sizeof(g_details) - 1, g_details_len + static_cast<size_t>(n));
    // Newlines would break the line protocol.
    for (size_t i = 0; i < g_details_len; ++i)
      if (g_details[i] == '\n') g_details[i] = ' ';
    ++g_details_kept;
  }
  pthread_mutex_unlock(&g_detail_mu);
}

long anomaly_count() { return g_anomalies.load(); }

Worker* register_worker(const char* role, bool expect_progress) {
  int i = g_worker_count.fetch_add(1);
  if (i >= kMaxWorkers) {
    fprintf(stderr, "target: too many workers\n");
    abort();
  }
  Worker* w = &g_workers[i];
  snprintf(w->role, sizeof(w->role), "%s", role);
  w->expect_progress = expect_progress;
  return w;
}

void worker_started(Worker* w) { w->tid.store(gettid_()); }

void wait_workers_started() {
  int64_t deadline = now_ns() + 10'000'000'000;
  for (;;) {
    bool all = true;
    for (int i = 0; i < g_worker_count.load(); ++i)
      if (g_workers[i].tid.load() == 0) all = false;
    if (all) return;
    if (now_ns() > deadline) {
      fprintf(stderr, "target: workers did not start within 10 s\n");
      abort();
    }
    timespec ts{0, 1'000'000};
    nanosleep(&ts, nullptr);
  }
}

void set_count_lock(void (*lock)(), void (*unlock)()) {
  g_count_lock = lock;
  g_count_unlock = unlock;
}

void warm_up_malloc() {
  // Large enough to create [heap] with brk, small enough to stay below the
  // mmap threshold.
  void* volatile p = malloc(64 * 1024);
  memset(p, 1, 64 * 1024);
  free(p);
}

void start_thread(void* (*fn)(void*), void* arg, size_t stack_size) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_size);
  pthread_t t;
  int rc = pthread_create(&t, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    fprintf(stderr, "target: pthread_create: %s\n", strerror(rc));
    abort();
  }
  pthread_detach(t);
}

void spin_politely() { setpriority(PRIO_PROCESS, static_cast<id_t>(gettid_()), 19); }

namespace {
thread_local bool t_amx_thread = false;
}  // namespace

void mark_amx_thread() { t_amx_thread = true; }

namespace {
thread_local bool t_sme_thread = false;
}  // namespace

void mark_sme_thread() { t_sme_thread = true; }

bool amx_usable(std::string* why) {
#if defined(__x86_64__)
  static int state = -1;  // -1 unknown, 0 no, 1 yes
  static std::string reason;
  if (state < 0) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    asm volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool tile = (d >> 24 & 1) != 0;  // CPUID.(7,0):EDX[24] AMX-TILE
    asm volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    uint64_t xcr0 = 0;
    if ((c >> 27 & 1) != 0) {  // OSXSAVE
      uint32_t lo = 0, hi = 0;
      asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
      xcr0 = (uint64_t{hi} << 32) | lo;
    }
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtileData = 18;
    if (!tile) {
      reason = "no AMX: the CPU has no AMX-TILE";
    } else if ((xcr0 & (3ULL << 17)) != (3ULL << 17)) {
      reason = "no AMX: the kernel did not enable tile state in XCR0";
    } else if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) != 0) {
      reason = std::string("no AMX: ARCH_REQ_XCOMP_PERM refused (") + strerror(errno) + ")";
    }
    state = reason.empty() ? 1 : 0;
  }
  if (why) *why = reason;
  return state == 1;
#else
  if (why) *why = "no AMX: not x86_64";
  return false;
#endif
}

#if defined(__aarch64__)
// Bits of AT_HWCAP/AT_HWCAP2 (arch/arm64/include/uapi/asm/hwcap.h); glibc
// 2.36's headers predate HWCAP2_SME.
constexpr unsigned long kHwcapSve = 1UL << 22;
constexpr unsigned long kHwcap2Sme = 1UL << 23;
#endif

bool sve_usable(std::string* why) {
#if defined(__aarch64__)
  const bool yes = (getauxval(AT_HWCAP) & kHwcapSve) != 0;
  if (why) *why = yes ? "" : "no SVE: AT_HWCAP lacks HWCAP_SVE";
  return yes;
#else
  if (why) *why = "no SVE: not aarch64";
  return false;
#endif
}

bool sme_usable(std::string* why) {
#if defined(__aarch64__)
  const bool yes = (getauxval(AT_HWCAP2) & kHwcap2Sme) != 0;
  if (why) *why = yes ? "" : "no SME: AT_HWCAP2 lacks HWCAP2_SME";
  return yes;
#else
  if (why) *why = "no SME: not aarch64";
  return false;
#endif
}

#if defined(__aarch64__)
__attribute__((target("+sve"))) static unsigned read_vl() {
  uint64_t vl = 0;
  asm volatile("rdvl %0, #1" : "=r"(vl));
  return static_cast<unsigned>(vl);
}
#endif

unsigned sve_vector_length() {
#if defined(__aarch64__)
  // rdvl only after the hwcap check: without SVE it is an undefined instruction.
  return sve_usable(nullptr) ? read_vl() : 0;
#else
  return 0;
#endif
}

bool write_all(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

namespace {

// Counting without malloc (opendir would allocate): getdents64 into a stack
// buffer. Returns -1 on error.
long count_own_fds() {
  int dfd = ::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -1;
  long count = 0;
  alignas(8) char buf[4096];
  for (;;) {
    long n = ::syscall(SYS_getdents64, dfd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      // struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
      unsigned short reclen;
      memcpy(&reclen, buf + off + 16, sizeof(reclen));
      const char* name = buf + off + 19;
      if (strcmp(name, ".") != 0 && strcmp(name, "..") != 0) ++count;
      off += reclen;
    }
  }
  ::close(dfd);
  return count - 1;  // the directory fd itself
}

long count_own_maps() {
  int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  long lines = 0;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] == '\n') ++lines;
  }
  ::close(fd);
  return lines;
}

void counts(long* fds, long* maps) {
  if (g_count_lock) g_count_lock();
  *fds = count_own_fds();
  *maps = count_own_maps();
  if (g_count_unlock) g_count_unlock();
}

void reply(const std::string& s) {
  std::string line = s + "\n";
  if (!write_all(1, line.data(), line.size())) _exit(3);  // the test went away
}

// Line reader over fd 0 (raw reads; EINTR retried).
bool read_line(std::string* line) {
  static char buf[4096];
  static size_t len = 0;
  for (;;) {
    if (void* nl = memchr(buf, '\n', len)) {
      size_t n = static_cast<size_t>(static_cast<char*>(nl) - buf);
      line->assign(buf, n);
      memmove(buf, buf + n + 1, len - n - 1);
      len -= n + 1;
      return true;
    }
    if (len == sizeof(buf)) len = 0;  // absurdly long line: drop it
    ssize_t r = ::read(0, buf + len, sizeof(buf) - len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    len += static_cast<size_t>(r);
  }
}

std::string report(ExtraReportFn extra) {
  // Wait until every worker has completed one more iteration: a check that
  // was in flight when the report was requested (a register loop, a blocked
  // read about to return EINTR) has then run to its end. Generous deadline:
  // the spinning workers run at nice 19 and a loaded machine may starve them.
  uint64_t at_request[kMaxWorkers];
  for (int i = 0; i < g_worker_count.load(); ++i) at_request[i] = g_workers[i].progress.load();
  int64_t deadline = now_ns() + 10'000'000'000;
  for (int i = 0; i < g_worker_count.load(); ++i) {
    Worker& w = g_workers[i];
    if (!w.expect_progress) continue;
    while (w.progress.load() <= at_request[i] && now_ns() < deadline) {
      timespec ts{0, 1'000'000};
      nanosleep(&ts, nullptr);
    }
    if (w.progress.load() <= at_request[i])
      anomaly("stalled %s (tid %d): no progress for 10 s", w.role, w.tid.load());
  }
  // Extra fields first: producing them may record anomalies.
  std::string extra_fields = extra ? extra() : std::string();
  long fds, maps;
  counts(&fds, &maps);
  long misaligned = remora_misaligned_entries.load();
  long anomalies = g_anomalies.load() + misaligned;
  std::string s = "anomalies=" + std::to_string(anomalies) +
                  " fds_delta=" + std::to_string(fds - g_fds_at_snapshot) +
                  " maps_delta=" + std::to_string(maps - g_maps_at_snapshot) +
                  " calls=" + std::to_string(g_probe_calls.load()) +
                  " strings=" + std::to_string(g_probe_string_calls.load()) + " fds=" + std::to_string(fds) +
                  " maps=" + std::to_string(maps);
  if (!extra_fields.empty()) s += " " + extra_fields;
  s += " detail:";
  pthread_mutex_lock(&g_detail_mu);
  if (g_details_len > 0) s += " " + std::string(g_details, g_details_len);
  pthread_mutex_unlock(&g_detail_mu);
  if (misaligned > 0) s += "; stack misaligned at remora_probe entry x" + std::to_string(misaligned);
  return s;
}

}  // namespace

int run_protocol(ExtraReportFn extra_report, ExtraCommandFn extra_cmd) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  g_have_avx = __builtin_cpu_supports("avx");
  g_have_avx512 = __builtin_cpu_supports("avx512f");
#elif defined(__aarch64__)
  g_have_sve = sve_usable(nullptr);
#endif
  warm_up_malloc();
  wait_workers_started();
  reply("ready " + std::to_string(getpid()));
  std::string cmd;
  while (read_line(&cmd)) {
    std::string out;
    if (cmd == "snapshot") {
      counts(&g_fds_at_snapshot, &g_maps_at_snapshot);
      reply("ok");
    } else if (cmd == "tids") {
      out = "tids main:" + std::to_string(gettid_());
      for (int i = 0; i < g_worker_count.load(); ++i)
        out += " " + std::string(g_workers[i].role) + ":" + std::to_string(g_workers[i].tid.load());
      reply(out);
    } else if (cmd == "report") {
      reply(report(extra_report));
    } else if (cmd == "quit") {
      g_stop.store(true);
      reply("bye");
      return 0;
    } else if (extra_cmd && extra_cmd(cmd, &out)) {
      reply(out);
    } else {
      reply("error unknown command: " + cmd);
    }
  }
  return 0;  // stdin closed: the test went away
}

}  // namespace remora_target

using remora_target::anomaly;

// ---------------------------------------------------------------------------
// The probes.

namespace {

#if defined(__x86_64__)
// Trashes every caller-saved vector and x87 register, as any function may.
void clobber_sse() {
  asm volatile(
      "pcmpeqb %%xmm0, %%xmm0\n\tpcmpeqb %%xmm1, %%xmm1\n\tpcmpeqb %%xmm2, %%xmm2\n\t"
      "pcmpeqb %%xmm3, %%xmm3\n\tpcmpeqb %%xmm4, %%xmm4\n\tpcmpeqb %%xmm5, %%xmm5\n\t"
      "pcmpeqb %%xmm6, %%xmm6\n\tpcmpeqb %%xmm7, %%xmm7\n\tpcmpeqb %%xmm8, %%xmm8\n\t"
      "pcmpeqb %%xmm9, %%xmm9\n\tpcmpeqb %%xmm10, %%xmm10\n\tpcmpeqb %%xmm11, %%xmm11\n\t"
      "pcmpeqb %%xmm12, %%xmm12\n\tpcmpeqb %%xmm13, %%xmm13\n\tpcmpeqb %%xmm14, %%xmm14\n\t"
      "pcmpeqb %%xmm15, %%xmm15\n\t"
      // Fill and empty the whole x87 stack: overwrites every physical register.
      "fldz\n\tfldz\n\tfldz\n\tfldz\n\tfldz\n\tfldz\n\tfldz\n\tfldz\n\t"
      "fstp %%st(0)\n\tfstp %%st(0)\n\tfstp %%st(0)\n\tfstp %%st(0)\n\t"
      "fstp %%st(0)\n\tfstp %%st(0)\n\tfstp %%st(0)\n\tfstp %%st(0)\n\t" ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15", "st", "st(1)", "st(2)", "st(3)", "st(4)", "st(5)", "st(6)",
            "st(7)");
}

__attribute__((target("avx"))) void clobber_avx() {
  asm volatile(
      "vpcmpeqb %%xmm0, %%xmm0, %%xmm0\n\t"
      "vinsertf128 $1, %%xmm0, %%ymm0, %%ymm0\n\t"
      "vmovaps %%ymm0, %%ymm8\n\tvmovaps %%ymm0, %%ymm9\n\tvmovaps %%ymm0, %%ymm10\n\t"
      "vmovaps %%ymm0, %%ymm11\n\tvmovaps %%ymm0, %%ymm12\n\tvmovaps %%ymm0, %%ymm13\n\t"
      "vmovaps %%ymm0, %%ymm14\n\tvmovaps %%ymm0, %%ymm15\n\t"
      "vzeroupper\n\t" ::
          : "xmm0", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

__attribute__((target("avx512f"))) void clobber_avx512() {
  asm volatile(
      "vpternlogd $0xff, %%zmm16, %%zmm16, %%zmm16\n\t"
      "vmovdqa64 %%zmm16, %%zmm0\n\tvmovdqa64 %%zmm16, %%zmm1\n\tvmovdqa64 %%zmm16, %%zmm2\n\t"
      "vmovdqa64 %%zmm16, %%zmm3\n\tvmovdqa64 %%zmm16, %%zmm4\n\tvmovdqa64 %%zmm16, %%zmm5\n\t"
      "vmovdqa64 %%zmm16, %%zmm6\n\tvmovdqa64 %%zmm16, %%zmm7\n\tvmovdqa64 %%zmm16, %%zmm8\n\t"
      "vmovdqa64 %%zmm16, %%zmm9\n\tvmovdqa64 %%zmm16, %%zmm10\n\tvmovdqa64 %%zmm16, %%zmm11\n\t"
      "vmovdqa64 %%zmm16, %%zmm12\n\tvmovdqa64 %%zmm16, %%zmm13\n\tvmovdqa64 %%zmm16, %%zmm14\n\t"
      "vmovdqa64 %%zmm16, %%zmm15\n\tkxnorw %%k1, %%k1, %%k0\n\t"
      "vmovdqa64 %%zmm16, %%zmm17\n\tvmovdqa64 %%zmm16, %%zmm18\n\tvmovdqa64 %%zmm16, %%zmm19\n\t"
      "vmovdqa64 %%zmm16, %%zmm20\n\tvmovdqa64 %%zmm16, %%zmm21\n\tvmovdqa64 %%zmm16, %%zmm22\n\t"
      "vmovdqa64 %%zmm16, %%zmm23\n\tvmovdqa64 %%zmm16, %%zmm24\n\tvmovdqa64 %%zmm16, %%zmm25\n\t"
      "vmovdqa64 %%zmm16, %%zmm26\n\tvmovdqa64 %%zmm16, %%zmm27\n\tvmovdqa64 %%zmm16, %%zmm28\n\t"
      "vmovdqa64 %%zmm16, %%zmm29\n\tvmovdqa64 %%zmm16, %%zmm30\n\tvmovdqa64 %%zmm16, %%zmm31\n\t"
      "kxnorw %%k0, %%k0, %%k1\n\tkxnorw %%k0, %%k0, %%k2\n\tkxnorw %%k0, %%k0, %%k3\n\t"
      "kxnorw %%k0, %%k0, %%k4\n\tkxnorw %%k0, %%k0, %%k5\n\tkxnorw %%k0, %%k0, %%k6\n\t"
      "kxnorw %%k0, %%k0, %%k7\n\t"
      "vzeroupper\n\t" ::
          : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
            "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k0", "k1", "k2",
            "k3", "k4", "k5", "k6", "k7");
}
#endif

#if defined(__x86_64__)
// The tiles and TILECFG of a thread that holds them (tilezero needs a valid
// configuration, which that thread has loaded).
void clobber_amx() {
  asm volatile(
      "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3\n\t"
      "tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7\n\t"
      "tilerelease\n\t" ::
          : "memory");
}
#endif

#if defined(__aarch64__)
// clang-format off
#define A64_X32(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15) \
  M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) M(25) M(26) M(27) M(28) M(29) M(30) M(31)
#define A64_V_ONES(n) "mov v" #n ".16b, v0.16b\n\t"
#define A64_Z_ONES(n) "mov z" #n ".d, z0.d\n\t"
#define A64_P_TRUE(n) "ptrue p" #n ".b\n\t"
// clang-format on
#define A64_V_CLOBBERS                                                                                  \
  "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15", \
      "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", \
      "v30", "v31"

// v0-v31 all ones and FPSR's cumulative flags set to a value no target
// holds. v8-v15 are listed as clobbered, so the compiler keeps their lower
// halves (d8-d15, callee-saved in AAPCS64) around the asm: the upper halves
// change, as any function may change them. FPCR (rounding mode) is left
// alone: a function that changes it for its caller breaks the ABI.
void clobber_fpsimd() {
  asm volatile("movi v0.16b, #0xff\n\t" A64_X32(A64_V_ONES)
               "mov x9, #0xe\n\t"  // DZC, OFC, UFC
               "msr fpsr, x9\n\t" ::
                   : "x9", A64_V_CLOBBERS);
}

// z0-z31 all ones (their bits above 128 are caller-saved), p0-p15 all true,
// FFR all true (a target's FFR holds a shorter first-fault pattern).
__attribute__((target("+sve"))) void clobber_sve() {
  asm volatile("mov z0.b, #-1\n\t" A64_X32(A64_Z_ONES) A64_P_TRUE(0) A64_P_TRUE(1) A64_P_TRUE(2) A64_P_TRUE(3)
                   A64_P_TRUE(4) A64_P_TRUE(5) A64_P_TRUE(6) A64_P_TRUE(7) A64_P_TRUE(8) A64_P_TRUE(9)
                       A64_P_TRUE(10) A64_P_TRUE(11) A64_P_TRUE(12) A64_P_TRUE(13) A64_P_TRUE(14)
                           A64_P_TRUE(15) "setffr\n\t" ::
                               : A64_V_CLOBBERS, "p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9",
                                 "p10", "p11", "p12", "p13", "p14", "p15", "ffr");
}
// ZA zeroed, on a thread that keeps ZA live (ZA on, with its rows
// loaded). smstart za leaves ZA as it is when it is already on (and enables
// it zeroed when the engine turned it off around the call); either way ZA
// then reads zero, so an engine that does not give the thread back its ZA
// is caught. ZA stays on: turning it off here would make the thread's next
// ZA access fault instead of being reported.
void clobber_za() { asm volatile(".arch_extension sme\n\tsmstart za\n\tzero {za}\n\t" ::: "memory"); }
#endif

void clobber_caller_saved_state() {
#if defined(__x86_64__)
  clobber_sse();
  if (remora_target::g_have_avx) clobber_avx();
  if (remora_target::g_have_avx512) clobber_avx512();
  if (remora_target::t_amx_thread) clobber_amx();
#elif defined(__aarch64__)
  clobber_fpsimd();
  if (remora_target::g_have_sve) clobber_sve();
  if (remora_target::t_sme_thread) clobber_za();
#endif
}

}  // namespace

#if defined(__x86_64__)
// remora_probe's entry checks the ABI's stack alignment (rsp + 8 is a
// multiple of 16 right after the call pushed the return address), then tail
// jumps to the C++ body. Written in assembly because the compiler assumes the
// alignment and would fold any check away.
extern "C" __attribute__((visibility("hidden"), used, noinline)) long remora_probe_body(long a, long b);
asm(R"(
    .text
    .globl remora_probe
    .type remora_probe, @function
    .p2align 4
remora_probe:
    .cfi_startproc
    leaq 8(%rsp), %rax
    testb $15, %al
    jz 1f
    lock incq remora_misaligned_entries(%rip)
1:  jmp remora_probe_body
    .cfi_endproc
    .size remora_probe, .-remora_probe
)");
extern "C" __attribute__((visibility("hidden"), used, noinline)) long remora_probe_body(long a, long b) {
#elif defined(__aarch64__)
// The same check for AAPCS64: sp is a multiple of 16 at every public
// interface. Only x9, x16 and x17 are used before the tail branch (scratch
// at a call; x0 and x1 carry the arguments). bti c (a hint: a no-op without
// BTI) makes the entry a landing pad, should the binary be built with
// branch protection. The counter is bumped with an exclusive-access loop
// (LSE atomics are not in the base architecture).
extern "C" __attribute__((visibility("hidden"), used, noinline)) long remora_probe_body(long a, long b);
asm(R"(
    .text
    .globl remora_probe
    .type remora_probe, %function
    .p2align 4
remora_probe:
    .cfi_startproc
    hint #34
    mov x16, sp
    tst x16, #15
    b.eq 2f
    adrp x16, remora_misaligned_entries
    add x16, x16, :lo12:remora_misaligned_entries
1:  ldxr x17, [x16]
    add x17, x17, #1
    stxr w9, x17, [x16]
    cbnz w9, 1b
2:  b remora_probe_body
    .cfi_endproc
    .size remora_probe, .-remora_probe
)");
extern "C" __attribute__((visibility("hidden"), used, noinline)) long remora_probe_body(long a, long b) {
#else
REMORA_EXPORT long remora_probe(long a, long b) {
#endif
  remora_target::g_probe_calls.fetch_add(1);
  clobber_caller_saved_state();
  return a * 31 + b;
}

// Strings of the form "check:<n>:<payload>" carry their own length and a
// payload 'a','b',...'z','a',... so the copy into the target is verified
// byte by byte.
REMORA_EXPORT long remora_probe_string(const char* s) {
  remora_target::g_probe_string_calls.fetch_add(1);
  if (s == nullptr) {
    anomaly("remora_probe_string got NULL");
    return -1;
  }
  size_t n = strlen(s);
  if (strncmp(s, "check:", 6) == 0) {
    char* end = nullptr;
    unsigned long want = strtoul(s + 6, &end, 10);
    if (end == nullptr || *end != ':') {
      anomaly("remora_probe_string: malformed check string");
    } else {
      const char* payload = end + 1;
      size_t got = strlen(payload);
      if (got != want) anomaly("remora_probe_string: payload length %zu, expected %lu", got, want);
      for (size_t i = 0; i < got; ++i) {
        if (payload[i] != static_cast<char>('a' + i % 26)) {
          anomaly("remora_probe_string: payload byte %zu is 0x%02x", i,
                  static_cast<unsigned char>(payload[i]));
          break;
        }
      }
    }
  }
  clobber_caller_saved_state();
  return static_cast<long>(n);
}

REMORA_EXPORT long remora_probe_calls(void) { return remora_target::g_probe_calls.load(); }
REMORA_EXPORT long remora_probe_string_calls(void) { return remora_target::g_probe_string_calls.load(); }
