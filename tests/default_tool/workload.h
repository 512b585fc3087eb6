// A small multi-threaded workload for the default tool's tests: each thread
// does one recognisable kind of work and checks its own results, so a test
// can assert both what the tool saw and that the program still computes
// correctly under it.
//
//   hash    workload_hash() over a fixed buffer (the hot function)
//   sort    std::sort of pseudo-random numbers
//   file    write() + fsync() into a temporary file, read back at the end
//   mutex   two threads incrementing a counter under pthread_mutex_lock
//   pipe    a thread blocked in read() on a pipe, fed by the main thread
#ifndef REMORA_TESTS_DEFAULT_TOOL_WORKLOAD_H_
#define REMORA_TESTS_DEFAULT_TOOL_WORKLOAD_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

extern "C" uint64_t workload_hash(const unsigned char* data, size_t n);
extern "C" void workload_spin_for_ms(int ms);  // a distinct hot function for late threads

class Workload {
 public:
  explicit Workload(std::string dir);  // temporary files go there
  ~Workload();
  void start();
  // Feeds the pipe reader one message (call it from the test thread).
  void feed_pipe();
  // Stops every thread and checks every result. Empty when all is well,
  // else a description of what went wrong.
  std::string stop_and_check();

  uint64_t hash_rounds() const { return hash_rounds_.load(); }

 private:
  void hash_loop();
  void sort_loop();
  void file_loop();
  void mutex_loop();
  void pipe_loop();
  void fail(const std::string& what);

  std::string dir_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::vector<unsigned char> hash_input_;
  uint64_t hash_expected_ = 0;
  std::atomic<uint64_t> hash_rounds_{0};
  pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
  uint64_t counter_ = 0;
  std::atomic<uint64_t> increments_{0};
  int pipe_[2] = {-1, -1};
  uint32_t fed_ = 0;
  std::atomic<uint32_t> received_{0};
  std::atomic<uint64_t> file_bytes_{0};
  std::string file_path_;
  pthread_mutex_t fail_mu_ = PTHREAD_MUTEX_INITIALIZER;
  std::string failures_;
};

#endif  // REMORA_TESTS_DEFAULT_TOOL_WORKLOAD_H_
