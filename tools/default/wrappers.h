/* The C side of call tracing: the table of wrappers (wrappers.c) and the
 * recording hook they call (tracer.cc). Internal to libremora-tool.so. */
#ifndef REMORA_TOOLS_DEFAULT_WRAPPERS_H_
#define REMORA_TOOLS_DEFAULT_WRAPPERS_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct remora_fn_entry {
  const char* symbol;      /* the dynamic symbol whose GOT slots are patched */
  const char* reported_as; /* the name in the outputs and in REMORA_TRACE_FUNCTIONS */
  void* wrapper;
  int on_by_default;
};

/* Indexed by function id; remora_fn_count entries. */
extern const struct remora_fn_entry remora_fn_table[];
extern const unsigned remora_fn_count;
/* The implementation each wrapper calls, set before any slot points to it
 * and never cleared (a late caller must still reach the real function). */
extern void* remora_fn_real[];

/* Called by a wrapper after the real call returned. Async-signal-safe. */
void remora_record_call(uint32_t fn, uint64_t start_ns, uint64_t end_ns);

/* Threads inside the tool's code that can outlive a detach: a wrapper (a
 * thread blocked in read() returns into it) and the sampling handler. The
 * tool may only be unmapped once none is left (tool.cc, tool_fini), so each
 * counts itself in and out. Striped by thread so that threads on different
 * CPUs do not share one cache line per traced call; a thread always uses the
 * same stripe (its thread pointer never changes), so the sum of the stripes
 * is the number of threads inside. */
#define REMORA_INSIDE_STRIPES 64u
struct remora_inside_stripe {
  long n __attribute__((aligned(64)));
};
extern struct remora_inside_stripe remora_inside[REMORA_INSIDE_STRIPES];

static inline struct remora_inside_stripe* remora_inside_mine(void) {
  return &remora_inside[((uintptr_t)__builtin_thread_pointer() >> 12) % REMORA_INSIDE_STRIPES];
}
static inline void remora_inside_enter(struct remora_inside_stripe* s) {
  __atomic_fetch_add(&s->n, 1, __ATOMIC_SEQ_CST);
}
static inline void remora_inside_leave(struct remora_inside_stripe* s) {
  __atomic_fetch_sub(&s->n, 1, __ATOMIC_RELEASE);
}
/* The sum over the stripes (tool.cc). */
long remora_inside_count(void);

#ifdef __cplusplus
}
#endif

#endif /* REMORA_TOOLS_DEFAULT_WRAPPERS_H_ */
