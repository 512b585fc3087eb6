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

#ifdef __cplusplus
}
#endif

#endif /* REMORA_TOOLS_DEFAULT_WRAPPERS_H_ */
