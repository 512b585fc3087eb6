// Shared runtime of the test target programs.
//
// Every target is a "hostile" program: it keeps threads busy in ways that a
// careless remote call would disturb (blocking system calls, SIMD registers,
// malloc locks, signals) and counts what it observes. The test talks to it
// over stdin/stdout, one line per message:
//
//   target -> test   "ready <pid>"                 once its threads are set up
//   test -> target   "snapshot"   reply "ok"       records fd and maps counts
//   test -> target   "tids"       reply "tids role:tid role:tid ..."
//   test -> target   "report"     reply "anomalies=<n> fds_delta=<n>
//                                  maps_delta=<n> calls=<n> strings=<n>
//                                  [key=value ...] detail: <free text>"
//   test -> target   "quit"       reply "bye", exit 0
//
// "report" first waits (up to 10 s) until every registered worker completed
// one more iteration, so that checks in flight have finished, and a thread
// left stopped or stuck by the engine shows up as a "stalled <role>" anomaly.
//
// The protocol uses raw read()/write() with EINTR retries (no stdio), so that
// the signal storms of the signals target cannot break it.
//
// Every target exports, for the engine to call (extern "C", -rdynamic):
//   long remora_probe(long a, long b)       returns a*31+b, counts calls
//   long remora_probe_string(const char* s) returns strlen(s), checks s
//   long remora_probe_calls(void)           number of remora_probe calls
//   long remora_probe_string_calls(void)    number of remora_probe_string calls
// remora_probe also clobbers every caller-saved vector register (the ABI
// allows it), so an engine that does not restore the interrupted thread's
// FP/SIMD state is caught by the simd target: on x86_64 xmm/ymm/zmm, k0-k7,
// the x87 stack (and the tiles on an AMX thread); on aarch64 v0-v31 (v8-v15
// in their upper halves: AAPCS64 has the callee keep d8-d15), FPSR and, where
// the CPU has SVE, z0-z31, p0-p15 and FFR. Its entry checks the stack
// alignment the ABI promises at a call (counted in the report).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <string>

// For definitions of functions the tests call remotely.
#define REMORA_EXPORT extern "C" __attribute__((visibility("default"), used, noinline))

extern "C" long remora_probe(long a, long b);
extern "C" long remora_probe_string(const char* s);
extern "C" long remora_probe_calls(void);
extern "C" long remora_probe_string_calls(void);

namespace remora_target {

// Records an anomaly (thread-safe, never allocates; safe to call from any
// worker thread but not from a signal handler). The first few details are
// kept for the report.
void anomaly(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
long anomaly_count();

// A worker thread that the report expects to make progress. Registered once,
// before "ready"; the thread bumps `progress` every iteration.
struct Worker {
  char role[32] = {};
  std::atomic<pid_t> tid{0};
  std::atomic<uint64_t> progress{0};
  bool expect_progress = true;
};

// Registers a worker slot (call from the main thread before starting it).
Worker* register_worker(const char* role, bool expect_progress = true);
// Called by the worker thread itself, first thing: records its tid.
void worker_started(Worker* w);
// Blocks until every registered worker has called worker_started (deadline 10 s;
// aborts the target otherwise: a target that cannot start is a broken test).
void wait_workers_started();

// Extra "key=value ..." fields appended to the report (may be empty).
using ExtraReportFn = std::string (*)();
// Extra command handler: returns true and fills `reply` if it handled `cmd`.
using ExtraCommandFn = bool (*)(const std::string& cmd, std::string* reply);

// Hooks around fd/maps counting: targets whose threads open and close fds
// transiently (accept, connect) hold a lock while doing so; the counter takes
// the same lock, so the counts only see the steady state.
void set_count_lock(void (*lock)(), void (*unlock)());

// Prints "ready <pid>" and runs the command loop until "quit" or EOF.
// Returns the exit code for main().
int run_protocol(ExtraReportFn extra_report = nullptr, ExtraCommandFn extra_cmd = nullptr);

// Set when the test said "quit" (workers may poll it; they need not).
extern std::atomic<bool> g_stop;

// Helpers for workers.
pid_t gettid_();
int64_t now_ns();  // CLOCK_MONOTONIC
// Touches malloc once so that the main arena's [heap] exists before the
// snapshot (it appearing later would look like a leaked mapping).
void warm_up_malloc();
// Calls pthread_create with a small stack for `fn(arg)`; aborts on failure.
void start_thread(void* (*fn)(void*), void* arg, size_t stack_size = 256 * 1024);
// Makes the calling thread nice 19. For threads that spin without pause:
// on a small machine (CI has 2 cores) they would otherwise starve the test
// and the controller; at nice 19 they still use every idle cycle, so a remote
// call still interrupts them mid-loop.
void spin_politely();
// Writes all of `len` bytes (retries EINTR / short writes); false on error.
bool write_all(int fd, const void* buf, size_t len);

// AMX tiles: true when this process may use them: the CPU has AMX-TILE, the
// kernel enabled tile state (XCR0 bits 17 and 18) and granted this process
// permission (ARCH_REQ_XCOMP_PERM, asked here once). Otherwise `why` says
// which of these is missing.
bool amx_usable(std::string* why);
// Marks the calling thread as one that holds tiles: remora_probe clobbers
// them when it runs there (other threads never touch AMX: using it would
// enlarge their extended state, which is exactly what must stay small).
void mark_amx_thread();

// aarch64: whether this process may use SVE (AT_HWCAP has HWCAP_SVE: the CPU
// has it and the kernel manages its state) and SME (AT_HWCAP2 has
// HWCAP2_SME). Otherwise `why` says what is missing. Always false elsewhere.
bool sve_usable(std::string* why);
bool sme_usable(std::string* why);
// The calling thread's SVE vector length in bytes (rdvl); 0 without SVE.
unsigned sve_vector_length();
// Marks the calling thread as one that keeps ZA live (SME): remora_probe
// zeroes ZA when it runs there (other threads never enable ZA).
void mark_sme_thread();

}  // namespace remora_target
