// remora-sample-service: a small, busy, multi-threaded process for `make demo`
// (and for trying `remora call` by hand). It knows nothing about Remora.
//
// Threads, each doing real work that it checks (any mismatch counts in
// errors=, which must stay 0 whatever Remora does to the process):
//   main       heartbeat once a second (sigtimedwait on SIGTERM/SIGINT)
//   hash       FNV-1a over 1 MiB, compared with the value computed at start
//   sort       sorts 100k random integers, checks the order
//   file-io    writes 256 KiB to an unlinked temp file, reads it back, compares
//   lock-a/b   contend on one mutex; the shared counter must equal their sum
//   churn      mallocs and frees thousands of blocks of random sizes
//   pipe-read  blocked in read(2) on a pipe nobody writes until shutdown;
//              pipe_reads= must stay 0 (a remote call must not wake it)
// At start it also mallocs 64 MiB in small blocks and frees them behind a
// pinned block, so the heap keeps them resident and malloc_trim(0) has
// something to give back (watch rss= in the heartbeat).
//
// Runs until SIGTERM or SIGINT, then stops its threads, prints totals and
// exits 0 (1 if any check failed).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_hashes{0}, g_sorts{0}, g_file_rounds{0}, g_lock_rounds{0}, g_alloc_rounds{0};
std::atomic<uint64_t> g_pipe_reads{0}, g_errors{0};

void report_error(const char* what) {
  g_errors.fetch_add(1);
  std::fprintf(stderr, "sample-service: check failed: %s\n", what);
}

void nap(std::chrono::microseconds d) { std::this_thread::sleep_for(d); }

void name_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

uint64_t fnv1a(const unsigned char* p, size_t n, uint64_t h = 1469598103934665603ULL) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

void hash_worker() {
  name_thread("hash");
  std::vector<unsigned char> buf(1 << 20);
  std::mt19937_64 rng(1);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const uint64_t expected = fnv1a(buf.data(), buf.size());
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (fnv1a(buf.data(), buf.size()) != expected) report_error("hash of an unchanged buffer changed");
    g_hashes.fetch_add(1, std::memory_order_relaxed);
    nap(std::chrono::milliseconds(2));
  }
}

void sort_worker() {
  name_thread("sort");
  std::mt19937 rng(2);
  while (!g_stop.load(std::memory_order_relaxed)) {
    std::vector<uint32_t> v(100000);
    for (auto& x : v) x = rng();
    std::sort(v.begin(), v.end());
    if (!std::is_sorted(v.begin(), v.end())) report_error("std::sort left the vector unsorted");
    g_sorts.fetch_add(1, std::memory_order_relaxed);
    nap(std::chrono::milliseconds(5));
  }
}

void file_worker() {
  name_thread("file-io");
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/remora-sample-XXXXXX";
  int fd = mkstemp(path.data());
  if (fd < 0) {
    report_error("mkstemp failed");
    return;
  }
  unlink(path.c_str());  // nothing to clean up, even after SIGKILL
  std::vector<unsigned char> out(256 << 10), in(out.size());
  uint64_t round = 0;
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 31 + round);
    if (pwrite(fd, out.data(), out.size(), 0) != static_cast<ssize_t>(out.size()) ||
        pread(fd, in.data(), in.size(), 0) != static_cast<ssize_t>(in.size()) || in != out) {
      report_error("temp file did not read back what was written");
    }
    ++round;
    g_file_rounds.fetch_add(1, std::memory_order_relaxed);
    nap(std::chrono::milliseconds(10));
  }
  close(fd);
}

struct Shared {
  std::mutex mu;
  uint64_t total = 0;       // guarded by mu
  uint64_t by_thread[2]{};  // guarded by mu; total == by_thread[0] + by_thread[1]
  unsigned char scratch[64]{};
} g_shared;

void lock_worker(int index) {
  name_thread(index == 0 ? "lock-a" : "lock-b");
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 1000; ++i) {
      std::lock_guard<std::mutex> lock(g_shared.mu);
      ++g_shared.total;
      ++g_shared.by_thread[index];
      g_shared.scratch[i % 64] ^= static_cast<unsigned char>(fnv1a(g_shared.scratch, 64));
    }
    g_lock_rounds.fetch_add(1, std::memory_order_relaxed);
    nap(std::chrono::milliseconds(1));
  }
}

void churn_worker() {
  name_thread("churn");
  std::mt19937 rng(3);
  std::vector<char*> blocks(2000);
  while (!g_stop.load(std::memory_order_relaxed)) {
    for (auto& b : blocks) {
      size_t n = 16 + rng() % 4096;
      b = static_cast<char*>(std::malloc(n));
      if (!b) {
        report_error("malloc returned NULL");
        continue;
      }
      std::memset(b, 0x5a, n);
    }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (auto* b : blocks) std::free(b);
    g_alloc_rounds.fetch_add(1, std::memory_order_relaxed);
    nap(std::chrono::milliseconds(5));
  }
}

void pipe_reader(int fd) {
  name_thread("pipe-read");
  for (;;) {
    char c = 0;
    ssize_t n = read(fd, &c, 1);
    if (n == 1) {
      g_pipe_reads.fetch_add(1);
      if (c == 'q') return;
      continue;
    }
    // No signal handler is installed, so read() must never see EINTR; an
    // early return here would mean an interruption leaked into the program.
    report_error(n == 0 ? "pipe read returned EOF" : "pipe read failed");
    if (n == 0) return;
  }
}

// 64 MiB in 1 KiB blocks, freed again, with a pinned block above them: the
// freed memory stays resident (free() only trims at the top of the heap).
void* g_pin = nullptr;
void allocate_and_free_burst() {
  std::vector<void*> blocks(size_t{64} * 1024);
  for (auto& b : blocks) {
    b = std::malloc(1024);
    if (b) std::memset(b, 1, 1024);
  }
  g_pin = std::malloc(64);
  for (auto* b : blocks) std::free(b);
}

double rss_mib() {
  FILE* f = std::fopen("/proc/self/status", "re");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib < 0 ? -1 : static_cast<double>(kib) / 1024.0;
}

void print_counters(const char* prefix, long seconds) {
  uint64_t total = 0, a = 0, b = 0;
  {
    std::lock_guard<std::mutex> lock(g_shared.mu);
    total = g_shared.total;
    a = g_shared.by_thread[0];
    b = g_shared.by_thread[1];
  }
  if (total != a + b) report_error("mutex-guarded counter lost an update");
  std::printf(
      "%s pid %d t=%lds hashes=%" PRIu64 " sorts=%" PRIu64 " file_rounds=%" PRIu64 " lock_rounds=%" PRIu64
      " alloc_rounds=%" PRIu64 " pipe_reads=%" PRIu64 " errors=%" PRIu64 " rss=%.1fMiB\n",
      prefix, static_cast<int>(getpid()), seconds, g_hashes.load(), g_sorts.load(), g_file_rounds.load(),
      g_lock_rounds.load(), g_alloc_rounds.load(), g_pipe_reads.load(), g_errors.load(), rss_mib());
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // one heartbeat per line, even into a file or pipe

  // SIGTERM/SIGINT are taken synchronously by main's sigtimedwait; block
  // them before any thread starts so every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    std::perror("sample-service: pipe2");
    return 1;
  }

  allocate_and_free_burst();

  std::vector<std::thread> threads;
  threads.emplace_back(hash_worker);
  threads.emplace_back(sort_worker);
  threads.emplace_back(file_worker);
  threads.emplace_back(lock_worker, 0);
  threads.emplace_back(lock_worker, 1);
  threads.emplace_back(churn_worker);
  threads.emplace_back(pipe_reader, pipe_fds[0]);

  std::printf(
      "sample-service pid %d ready: %zu threads (main, hash, sort, file-io, lock-a, lock-b, churn, "
      "pipe-read); 64 MiB freed but still resident, rss=%.1fMiB\n",
      static_cast<int>(getpid()), threads.size() + 1, rss_mib());

  const auto start = std::chrono::steady_clock::now();
  auto next = start;
  int signo = 0;
  while (signo <= 0) {
    next += std::chrono::seconds(1);
    for (;;) {  // wait until the next heartbeat or a stop signal
      auto left = next - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds::zero()) break;
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      signo = sigtimedwait(&stop_signals, nullptr, &ts);
      if (signo > 0) break;
      if (errno != EAGAIN && errno != EINTR) {
        std::perror("sample-service: sigtimedwait");
        break;
      }
    }
    if (signo > 0) break;
    auto up = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
    print_counters("heartbeat:", static_cast<long>(up.count()));
  }

  std::printf("sample-service: got %s, stopping\n", strsignal(signo));
  g_stop.store(true);
  if (write(pipe_fds[1], "q", 1) != 1) report_error("could not wake the pipe reader");
  for (auto& t : threads) t.join();
  auto up = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start);
  // pipe_reads is 1 here: the shutdown byte.
  print_counters("final:", static_cast<long>(up.count()));
  std::free(g_pin);
  return g_errors.load() == 0 ? 0 : 1;
}
