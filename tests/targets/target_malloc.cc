// Target "malloc": eight threads hammering malloc/free with random sizes,
// writing a pattern into every block and verifying it before freeing. A
// remote call usually lands inside malloc or free, with an arena lock held:
// the call must neither take that lock nor disturb the block contents.
//
// The live set per thread is bounded and the mmap threshold fixed, and each
// thread allocates its largest live set once before "ready", so that the
// count of mappings stays constant (glibc only grows an arena's heap by
// mprotect within one reserved mapping).
#include <malloc.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "target_common.h"

using namespace remora_target;

namespace {

constexpr int kThreads = 8;
constexpr int kSlots = 64;
constexpr size_t kMaxSize = 32 * 1024;

struct Block {
  uint8_t* p = nullptr;
  size_t size = 0;
  uint8_t seed = 0;
};

struct Hammer {
  Worker* w;
  int index;
  uint64_t rng;
  Block blocks[kSlots];
  std::atomic<bool> warmed{false};
};
Hammer g_hammers[kThreads];

uint64_t next(uint64_t* s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  *s = x;
  return x;
}

void fill(Block* b) {
  for (size_t i = 0; i < b->size; ++i) b->p[i] = static_cast<uint8_t>(b->seed + i * 7);
}

bool verify(const Block& b) {
  for (size_t i = 0; i < b.size; ++i)
    if (b.p[i] != static_cast<uint8_t>(b.seed + i * 7)) return false;
  return true;
}

bool allocate(Hammer* h, Block* b, size_t size) {
  b->size = size;
  b->seed = static_cast<uint8_t>(next(&h->rng));
  b->p = static_cast<uint8_t*>(malloc(size));
  if (b->p == nullptr) {
    anomaly("malloc %d: malloc(%zu) returned NULL", h->index, size);
    return false;
  }
  fill(b);
  return true;
}

void release(Hammer* h, Block* b) {
  if (!verify(*b)) anomaly("malloc %d: block of %zu bytes corrupted", h->index, b->size);
  free(b->p);
  b->p = nullptr;
}

void* hammer(void* arg) {
  Hammer* h = static_cast<Hammer*>(arg);
  // Warm-up: the largest live set, once.
  for (Block& b : h->blocks) allocate(h, &b, kMaxSize);
  for (Block& b : h->blocks) release(h, &b);
  h->warmed.store(true);
  worker_started(h->w);
  spin_politely();
  for (;;) {
    for (int i = 0; i < 256; ++i) {
      Block* b = &h->blocks[next(&h->rng) % kSlots];
      if (b->p != nullptr) {
        release(h, b);
      } else {
        uint64_t r = next(&h->rng);
        // Mostly small blocks, sometimes large ones.
        size_t size = (r & 7) == 0 ? 1 + (r >> 8) % kMaxSize : 1 + (r >> 8) % 512;
        allocate(h, b, size);
      }
    }
    h->w->progress++;
  }
}

}  // namespace

int main() {
  // A fixed threshold (setting it disables glibc's dynamic adjustment):
  // every block stays in an arena, none gets its own mapping.
  mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
  for (int i = 0; i < kThreads; ++i) {
    char role[16];
    snprintf(role, sizeof(role), "malloc%d", i);
    g_hammers[i].w = register_worker(role);
    g_hammers[i].index = i;
    g_hammers[i].rng = 0x12345678ULL * static_cast<uint64_t>(i + 1);
    start_thread(hammer, &g_hammers[i]);
  }
  return run_protocol();
}
