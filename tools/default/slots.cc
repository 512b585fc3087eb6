#include "slots.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace remora_tool {

std::atomic<bool> g_active{false};
std::atomic<uint32_t> g_gen{0};
Slot g_slots[kMaxThreads];

namespace {

// Initial-exec TLS: 12 bytes of the static TLS surplus glibc keeps for
// dlopen'ed libraries (rtld.optional_static_tls, 512 bytes by default). A
// global-dynamic variable would go through __tls_get_addr, which may call
// malloc on a thread's first access: not allowed in a signal handler.
struct ThreadState {
  uint32_t gen;
  uint32_t index;
  uint32_t ignored;
};
__thread ThreadState t_state __attribute__((tls_model("initial-exec")));

// Producers that are claiming a slot (rare: once per thread and session).
std::atomic<uint32_t> g_registering{0};

int32_t gettid_raw() { return static_cast<int32_t>(syscall(SYS_gettid)); }

uint32_t hash_tid(int32_t tid) { return (static_cast<uint32_t>(tid) * 2654435761u) % kMaxThreads; }

bool thread_alive(int32_t tid) {
  // tgkill with signal 0 checks existence without sending anything.
  return syscall(SYS_tgkill, getpid(), tid, 0) == 0 || errno != ESRCH;
}

void reset_mem(SlotMem* m) {
  m->sample_head.store(0, std::memory_order_relaxed);
  m->sample_tail.store(0, std::memory_order_relaxed);
  m->samples_dropped.store(0, std::memory_order_relaxed);
  m->call_head.store(0, std::memory_order_relaxed);
  m->call_tail.store(0, std::memory_order_relaxed);
  m->calls_dropped.store(0, std::memory_order_relaxed);
  for (auto& f : m->funcs) {
    f.calls.store(0, std::memory_order_relaxed);
    f.total_ns.store(0, std::memory_order_relaxed);
    f.max_ns.store(0, std::memory_order_relaxed);
  }
  // Sequence numbers restart at 0: clear them so a record of the previous
  // session is never taken for a committed one of this session.
  for (auto& s : m->samples) s.seq.store(0, std::memory_order_relaxed);
  for (auto& c : m->calls) c.seq.store(0, std::memory_order_relaxed);
}

// A free slot's memory, taken for another slot: the threads of a new
// session hash to other slots than the last one's (new tids: the agent's
// listener, a pool's fresh threads), and mapping a block for each would grow
// the process by one block per thread and session. The donor is reserved
// while its memory is taken (a claimer skips it), and only one that no
// producer is inside (`busy`: a thread still in a wrapper of an earlier
// session writes to its slot's memory) gives it up.
constexpr int32_t kDonorReserved = -1;
SlotMem* adopt_idle_mem(uint32_t except) {
  for (uint32_t i = 0; i < kMaxThreads; ++i) {
    Slot& d = g_slots[i];
    if (i == except || d.mem == nullptr || d.tid.load(std::memory_order_relaxed) != 0) continue;
    int32_t expected = 0;
    if (!d.tid.compare_exchange_strong(expected, kDonorReserved, std::memory_order_acq_rel)) continue;
    SlotMem* m = nullptr;
    if (d.busy.load(std::memory_order_seq_cst) == 0) {
      m = d.mem;
      d.mem = nullptr;
    }
    d.tid.store(0, std::memory_order_release);
    if (m != nullptr) return m;
  }
  return nullptr;
}

}  // namespace

uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void set_thread_ignored(bool ignored) { t_state.ignored = ignored ? 1 : 0; }

int claim_slot(int32_t tid, uint32_t gen) {
  g_registering.fetch_add(1, std::memory_order_seq_cst);
  int result = -1;
  if (g_active.load(std::memory_order_seq_cst) && g_gen.load(std::memory_order_seq_cst) == gen) {
    uint32_t h = hash_tid(tid);
    for (uint32_t probe = 0; probe < kMaxThreads; ++probe) {
      uint32_t i = (h + probe) % kMaxThreads;
      Slot& s = g_slots[i];
      int32_t cur = s.tid.load(std::memory_order_acquire);
      if (cur == tid) {
        result = s.ready.load(std::memory_order_acquire) ? static_cast<int>(i) : -1;
        break;
      }
      if (cur != 0) continue;
      int32_t expected = 0;
      if (!s.tid.compare_exchange_strong(expected, tid, std::memory_order_acq_rel)) {
        if (expected == tid) {
          result = s.ready.load(std::memory_order_acquire) ? static_cast<int>(i) : -1;
          break;
        }
        continue;
      }
      // Ours: make sure it has memory (kept from an earlier session, or mapped
      // now; mmap is a plain system call, safe here).
      if (s.mem == nullptr) s.mem = adopt_idle_mem(i);
      if (s.mem == nullptr) {
        void* p = mmap(nullptr, sizeof(SlotMem), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) break;  // the slot stays claimed but never ready: no records for tid
        s.mem = static_cast<SlotMem*>(p);
      } else {
        reset_mem(s.mem);
      }
      // A new thread: its stack is learnt again (tool.cc, learn_stack).
      s.stack_hi.store(0, std::memory_order_relaxed);
      s.stack_lo.store(0, std::memory_order_relaxed);
      s.ready.store(1, std::memory_order_release);
      result = static_cast<int>(i);
      break;
    }
  }
  g_registering.fetch_sub(1, std::memory_order_seq_cst);
  return result;
}

Slot* slot_enter_index(uint32_t index, uint32_t gen) {
  if (index >= kMaxThreads) return nullptr;
  Slot* s = &g_slots[index];
  s->busy.fetch_add(1, std::memory_order_seq_cst);
  if (!g_active.load(std::memory_order_seq_cst) || g_gen.load(std::memory_order_relaxed) != gen ||
      !s->ready.load(std::memory_order_acquire)) {
    slot_leave(s);
    return nullptr;
  }
  return s;
}

Slot* slot_enter_current() {
  ThreadState& st = t_state;
  if (st.ignored) return nullptr;
  if (!g_active.load(std::memory_order_relaxed)) return nullptr;
  uint32_t gen = g_gen.load(std::memory_order_acquire);
  if (st.gen != gen) {
    int i = claim_slot(gettid_raw(), gen);
    if (i < 0) return nullptr;
    st.index = static_cast<uint32_t>(i);
    st.gen = gen;
  }
  return slot_enter_index(st.index, gen);
}

void session_begin() {
  for (auto& s : g_slots) {
    s.ready.store(0, std::memory_order_relaxed);
    s.tid.store(0, std::memory_order_relaxed);
  }
  // Generation 0 means "never seen" in a thread's TLS: skip it.
  uint32_t gen = g_gen.load(std::memory_order_relaxed) + 1;
  if (gen == 0) gen = 1;
  g_gen.store(gen, std::memory_order_seq_cst);
  g_active.store(true, std::memory_order_seq_cst);
}

void session_stop_and_quiesce() {
  g_active.store(false, std::memory_order_seq_cst);
  // A producer is only ever busy for a few microseconds (a record, or one
  // stack copy), but a thread that died in the middle of one (killed by an
  // asynchronous cancel, or not copied by fork()) stays "busy" forever: wait
  // for live threads only, and not longer than a second in any case.
  uint64_t deadline = now_ns() + 1000000000ull;
  struct timespec pause = {0, 200000};
  while (g_registering.load(std::memory_order_seq_cst) != 0 && now_ns() < deadline)
    nanosleep(&pause, nullptr);
  for (auto& s : g_slots) {
    while (s.busy.load(std::memory_order_seq_cst) != 0 && now_ns() < deadline) {
      int32_t tid = s.tid.load(std::memory_order_relaxed);
      if (tid != 0 && !thread_alive(tid)) break;
      nanosleep(&pause, nullptr);
    }
  }
}

int mapped_slot_blocks() {
  int n = 0;
  for (const auto& s : g_slots) n += s.mem != nullptr;
  return n;
}

void release_slot_memory() {
  for (auto& s : g_slots) {
    s.ready.store(0, std::memory_order_relaxed);
    s.tid.store(0, std::memory_order_relaxed);
    if (s.mem != nullptr) munmap(s.mem, sizeof(SlotMem));
    s.mem = nullptr;
  }
}

}  // namespace remora_tool
