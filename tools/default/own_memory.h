// Reading the process's own memory without ever faulting.
//
// Both the sampling handler (the stack copy) and the collector's unwinder
// (eh_frame, code bytes) read memory whose mapping they cannot be sure of: a
// thread may be on a stack we never saw, a JIT may have unmapped code a
// moment ago. A plain load from such an address is a SIGSEGV in the target.
// A system call that reads it instead returns an error (EIO, EFAULT), so
// every read goes through one: pread on /proc/self/mem (opened once, at
// attach), which seccomp policies allow as plain file I/O, or, where /proc
// is not mounted and no seccomp filter is installed, process_vm_readv on our
// own pid. Should the application close our descriptor and reuse its number,
// a read fails (ESPIPE on a pipe or socket) or yields bytes that are only
// ever used as untrusted data; own_memory_check notices and reopens.
//
// Threads: own_memory_open/_close/_reopen_after_fork/_check on
// the listener, the collector or the fork child, one at a time; own_memory_read from any thread, including a
// signal handler: it is async-signal-safe (one system call, no lock, no allocation, errno restored by the
// caller).
#ifndef REMORA_TOOLS_DEFAULT_OWN_MEMORY_H_
#define REMORA_TOOLS_DEFAULT_OWN_MEMORY_H_

#include <stddef.h>
#include <stdint.h>

namespace remora_tool {

// Chooses the read method for this process. Returns a description of what
// is unavailable ("" when reads work); reads then return 0 bytes.
const char* own_memory_open();
// At detach, once nothing reads any more: leaves the process without our
// descriptor.
void own_memory_close();
// In a fork child: /proc/self/mem opened by the parent reads the parent.
void own_memory_reopen_after_fork();
// On the collector, once per thread scan: reopens /proc/self/mem if our
// descriptor is no longer it.
void own_memory_check();

// Copies up to `len` bytes at `addr` into `dst`. Returns the number of bytes
// copied from the start of the range (a shorter count where the range
// leaves mapped memory), 0 when nothing could be read. Never faults.
size_t own_memory_read(void* dst, uint64_t addr, size_t len);

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_OWN_MEMORY_H_
