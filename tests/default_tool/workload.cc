#include "workload.h"

#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <random>

extern "C" __attribute__((noinline)) uint64_t workload_hash(const unsigned char* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int round = 0; round < 4; ++round)
    for (size_t i = 0; i < n; ++i) {
      h ^= data[i];
      h *= 1099511628211ull;
      __asm__ volatile("" : "+r"(h));  // keep the loop as written
    }
  return h;
}

extern "C" __attribute__((noinline)) void workload_spin_for_ms(int ms) {
  struct timespec start, now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
  volatile uint64_t x = 0;
  for (;;) {
    for (int i = 0; i < 10000; ++i) x = x + static_cast<uint64_t>(i);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >= ms) break;
  }
}

Workload::Workload(std::string dir) : dir_(std::move(dir)) {
  hash_input_.resize(64 * 1024);
  for (size_t i = 0; i < hash_input_.size(); ++i) hash_input_[i] = static_cast<unsigned char>(i * 131 + 7);
  hash_expected_ = workload_hash(hash_input_.data(), hash_input_.size());
  file_path_ = dir_ + "/workload-file.bin";
}

Workload::~Workload() {
  if (!threads_.empty()) stop_and_check();
}

void Workload::fail(const std::string& what) {
  pthread_mutex_lock(&fail_mu_);
  if (failures_.size() < 4096) failures_ += what + "\n";
  pthread_mutex_unlock(&fail_mu_);
}

void Workload::start() {
  if (pipe(pipe_) != 0) fail("pipe");
  auto run = [this](const char* name, void (Workload::*loop)()) {
    threads_.emplace_back([this, name, loop] {
      pthread_setname_np(pthread_self(), name);
      (this->*loop)();
    });
  };
  run("wl-hash", &Workload::hash_loop);
  run("wl-sort", &Workload::sort_loop);
  run("wl-file", &Workload::file_loop);
  run("wl-mutex-a", &Workload::mutex_loop);
  run("wl-mutex-b", &Workload::mutex_loop);
  run("wl-pipe", &Workload::pipe_loop);
}

void Workload::hash_loop() {
  while (!stop_.load(std::memory_order_relaxed)) {
    uint64_t h = workload_hash(hash_input_.data(), hash_input_.size());
    if (h != hash_expected_) fail("workload_hash returned a different value");
    hash_rounds_.fetch_add(1);
  }
}

void Workload::sort_loop() {
  std::mt19937 rng(42);
  std::vector<uint32_t> v(20000);
  while (!stop_.load(std::memory_order_relaxed)) {
    uint64_t sum = 0;
    for (auto& x : v) {
      x = rng();
      sum += x;
    }
    std::sort(v.begin(), v.end());
    uint64_t after = 0;
    for (auto x : v) after += x;
    if (!std::is_sorted(v.begin(), v.end()) || after != sum) fail("sort lost or misordered elements");
  }
}

void Workload::file_loop() {
  int fd = open(file_path_.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    fail("open " + file_path_);
    return;
  }
  unsigned char block[4096];
  uint64_t blocks = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    memset(block, static_cast<int>(blocks & 0xff), sizeof block);
    ssize_t n = write(fd, block, sizeof block);
    if (n != static_cast<ssize_t>(sizeof block)) fail("short write");
    ++blocks;
    if (blocks % 8 == 0 && fsync(fd) != 0) fail("fsync");
    if (blocks % 256 == 0) {  // keep the file small
      if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) fail("truncate");
      blocks = 0;
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, nullptr);
  }
  // Read back what is in the file now and check every block.
  off_t size = lseek(fd, 0, SEEK_END);
  if (size != static_cast<off_t>(blocks * sizeof block)) fail("file size does not match the blocks written");
  lseek(fd, 0, SEEK_SET);
  for (uint64_t b = 0; b < blocks; ++b) {
    if (read(fd, block, sizeof block) != static_cast<ssize_t>(sizeof block)) {
      fail("short read back");
      break;
    }
    for (unsigned char c : block)
      if (c != static_cast<unsigned char>(b & 0xff)) {
        fail("file content differs");
        b = blocks;
        break;
      }
  }
  close(fd);
  unlink(file_path_.c_str());
}

void Workload::mutex_loop() {
  while (!stop_.load(std::memory_order_relaxed)) {
    pthread_mutex_lock(&mu_);
    uint64_t c = counter_;
    // A little work inside the lock, so the two threads contend.
    volatile uint64_t x = 0;
    for (int i = 0; i < 2000; ++i) x = x + static_cast<uint64_t>(i);
    counter_ = c + 1;
    pthread_mutex_unlock(&mu_);
    increments_.fetch_add(1);
  }
}

void Workload::pipe_loop() {
  uint32_t expect = 0;
  for (;;) {
    uint32_t v;
    ssize_t n = read(pipe_[0], &v, sizeof v);
    if (n == 0) break;  // writer closed: done
    if (n != static_cast<ssize_t>(sizeof v)) {
      fail("pipe read returned " + std::to_string(n));
      break;
    }
    if (v != expect) fail("pipe message out of order");
    expect = v + 1;
    received_.store(expect);
  }
}

void Workload::feed_pipe() {
  uint32_t v = fed_++;
  if (write(pipe_[1], &v, sizeof v) != static_cast<ssize_t>(sizeof v)) fail("pipe write");
}

std::string Workload::stop_and_check() {
  stop_.store(true);
  if (pipe_[1] >= 0) close(pipe_[1]);
  pipe_[1] = -1;
  for (auto& t : threads_) t.join();
  threads_.clear();
  if (pipe_[0] >= 0) close(pipe_[0]);
  pipe_[0] = -1;
  if (counter_ != increments_.load())
    fail("mutex counter " + std::to_string(counter_) + " != increments " +
         std::to_string(increments_.load()));
  if (received_.load() != fed_)
    fail("pipe: fed " + std::to_string(fed_) + ", received " + std::to_string(received_.load()));
  if (hash_rounds_.load() == 0) fail("the hash thread never ran");
  return failures_;
}
