// Per-thread recording state of the default tool, shared by the sampler (a
// signal handler) and the call tracer (GOT wrappers).
//
// Everything the recording side touches is async-signal-safe: no malloc, no
// locks, no dynamic TLS. A thread finds its slot through one initial-exec TLS
// word (a plain load relative to the thread pointer, %fs or tpidr_el0;
// glibc zeroes it for every new thread, so a
// reused pthread descriptor never inherits a stale slot), or, in the sampling
// handler, through the slot index the timer carries in its sigev_value.
//
// Each slot owns two single-consumer rings, a sample ring and a call ring,
// filled only by its own thread (possibly re-entrantly: a signal handler can
// interrupt a wrapper on the same thread, so a position is reserved with an
// atomic fetch_add and each record is committed with a sequence number).
// The collector thread drains them every tick; detach drains the rest.
//
// Session safety: a producer marks its slot busy (seq_cst) and then re-checks
// that the session it saw is still active; detach clears `active` and waits
// for every live slot to be idle, so after detach_quiesce() returns nothing
// writes into the rings (the Dekker pattern: both sides store, then load,
// with sequential consistency).
#ifndef REMORA_TOOLS_DEFAULT_SLOTS_H_
#define REMORA_TOOLS_DEFAULT_SLOTS_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <atomic>

// The architecture seam, header-only (no Remora library is linked into the
// tool). Included by path from here, so that the tool and the tests that
// compile its sources need no include directory beyond tools/default.
#include "../../src/arch/sample_regs.h"

namespace remora_tool {

constexpr uint32_t kMaxThreads = 4096;  // slots per session (hash table size)
constexpr uint32_t kMaxFuncs = 96;      // traceable functions (see functions.def)
constexpr uint32_t kMaxFrames = 127;    // PCs kept per sample (the collector's unwind)
// Bytes of stack copied per sample from the interrupted sp upwards: perf's
// default for --call-graph dwarf. Deep enough for the frames that matter in
// -O2 code; frames beyond it are cut (the stack shows as truncated).
constexpr uint32_t kStackCopyBytes = 8192;
// The collector drains every 100 ms (more often at high rates, see tool.cc):
// at 99 Hz a thread takes ~10 samples in that time.
constexpr uint32_t kSampleRingSize = 16;
constexpr uint32_t kCallRingSize = 8192;  // calls per thread per 100 ms before dropping

// The interrupted registers the collector needs to unwind: the pc, the CFA
// bases (sp, the frame pointer) and every other register a CFI rule may
// restore a caller's value from (arch/sample_regs.h says which, per
// architecture, and captures them from the signal's ucontext).
constexpr uint32_t kRegPc = remora::arch::kSamplePc;
constexpr uint32_t kRegSp = remora::arch::kSampleSp;
constexpr uint32_t kRegFp = remora::arch::kSampleFp;
constexpr uint32_t kNumRegs = remora::arch::kNumSampleRegs;

// One sample as the handler captured it: raw, unwound later by the collector
// (unwind.h), never in the signal handler.
struct SampleRec {
  uint64_t ts_ns;             // CLOCK_MONOTONIC
  uint32_t weight;            // 1 + timer overruns
  uint32_t stack_len;         // bytes valid in stack[], copied from regs[kRegSp]
  std::atomic<uint64_t> seq;  // position + 1 once committed
  uint64_t regs[kNumRegs];
  alignas(16) unsigned char stack[kStackCopyBytes];
};

struct CallRec {
  uint64_t start_ns;
  uint64_t dur_ns;
  uint32_t fn;
  uint32_t pad;
  std::atomic<uint64_t> seq;
};

struct FuncCounters {
  std::atomic<uint64_t> calls;
  std::atomic<uint64_t> total_ns;
  std::atomic<uint64_t> max_ns;
};

// One mmap'ed block per slot, kept across sessions (unmapped only when the
// tool is unloaded: a thread still inside a wrapper when a session ends must
// find valid memory).
struct SlotMem {
  std::atomic<uint64_t> sample_head;
  std::atomic<uint64_t> sample_tail;
  std::atomic<uint64_t> samples_dropped;
  std::atomic<uint64_t> call_head;
  std::atomic<uint64_t> call_tail;
  std::atomic<uint64_t> calls_dropped;
  FuncCounters funcs[kMaxFuncs];
  SampleRec samples[kSampleRingSize];
  CallRec calls[kCallRingSize];
};

struct Slot {
  std::atomic<int32_t> tid;     // 0: free (open addressing by tid)
  std::atomic<uint32_t> ready;  // mem initialised for this session
  std::atomic<uint32_t> busy;   // producers inside a record on this slot
  uint32_t pad;
  SlotMem* mem;
  // The thread's stack [lo, hi) as the collector found it in /proc/self/maps
  // (0, 0: not known yet). Written by the collector only, read by the
  // handler: they bound the stack copy to the stack's end. A torn or stale
  // pair can only shorten or lengthen a copy that is made with a read that
  // cannot fault (own_memory.h), never make it unsafe.
  std::atomic<uint64_t> stack_lo;
  std::atomic<uint64_t> stack_hi;
};

// Global recording state.
extern std::atomic<bool> g_active;
extern std::atomic<uint32_t> g_gen;  // session generation, bumped at each attach
extern Slot g_slots[kMaxThreads];

// Marks the calling thread as the tool's own: nothing it does is recorded.
void set_thread_ignored(bool ignored);

// Finds or creates the slot of `tid` for the current generation. Async-signal
// -safe (mmap on first use of a slot index). Returns its index, or -1 when the
// table is full or the session is ending.
int claim_slot(int32_t tid, uint32_t gen);
// Slots with memory mapped: at most the threads one session had at once
// (a slot without memory takes a free slot's, adopt_idle_mem).
int mapped_slot_blocks();

// The calling thread's slot marked busy, or nullptr when nothing should be
// recorded (no session, a tool thread, no slot left). Pair with slot_leave.
Slot* slot_enter_current();
// Marks slot `index` busy if the session `gen` is still active; else nullptr.
Slot* slot_enter_index(uint32_t index, uint32_t gen);
inline void slot_leave(Slot* s) { s->busy.fetch_sub(1, std::memory_order_release); }

// Session boundaries, called on the listener thread only.
void session_begin();             // reset the table, bump gen, set active
void session_stop_and_quiesce();  // clear active, wait for producers to leave
// Unmaps every slot's memory. Only once no producer can run again: the
// handler and the wrappers are gone and none is inside (tool.cc, tool_fini).
void release_slot_memory();

uint64_t now_ns();  // CLOCK_MONOTONIC, via the vDSO

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_SLOTS_H_
