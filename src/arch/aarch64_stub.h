// The layout of Remora's aarch64 stub block (src/arch/aarch64_stub.S): where
// each entry sits and the numbers its code is built from. One table for its
// two readers: the assembler places every entry with `.org` at the offset
// named here and refuses to assemble when an instruction the engine watches
// for ends anywhere else, and arch::aarch64::Stub (aarch64.h) gives the same
// numbers to the C++ engine. aarch64.cc checks the LoaderBlock and frame
// offsets and the system call numbers against their C++ definitions at
// compile time.
//
// Macros only outside the __cplusplus part: the assembler's preprocessor
// reads this file too.
#pragma once

// Byte offsets from the start of the block.
#define REMORA_AARCH64_STUB_CALL_ENTRY 0
#define REMORA_AARCH64_STUB_CALL_TAIL 4                 // the self-restoring tail after `blr`
#define REMORA_AARCH64_STUB_CALL_RETURN_SYSCALL_END 20  // pc after the call stub's rt_sigreturn `svc`
#define REMORA_AARCH64_STUB_SYSCALL_ENTRY 32
#define REMORA_AARCH64_STUB_SYSCALL_END 36  // pc after the requested `svc`
#define REMORA_AARCH64_STUB_THREAD_TRAMPOLINE 64
#define REMORA_AARCH64_STUB_MARKED_CALL_ENTRY 192
#define REMORA_AARCH64_STUB_MARKED_CALL_RETURN_SYSCALL_END 260  // pc after its rt_sigreturn `svc`
#define REMORA_AARCH64_STUB_SCRATCH_SETUP 576
#define REMORA_AARCH64_STUB_LOADER_START 384
#define REMORA_AARCH64_STUB_THREAD_HOOK 704  // the trampoline's end: the hook, then `done`
#define REMORA_AARCH64_STUB_SIZE 832

// Offsets in arch::aarch64::LoaderBlock, the thread trampoline's argument.
#define REMORA_AARCH64_LOADER_DLOPEN_FN 0x00
#define REMORA_AARCH64_LOADER_PATH 0x08
#define REMORA_AARCH64_LOADER_FLAGS 0x10
#define REMORA_AARCH64_LOADER_PTHREAD_SELF_FN 0x18
#define REMORA_AARCH64_LOADER_PTHREAD_DETACH_FN 0x20
#define REMORA_AARCH64_LOADER_DONE 0x28
#define REMORA_AARCH64_LOADER_HANDLE 0x30
#define REMORA_AARCH64_LOADER_TID 0x38
#define REMORA_AARCH64_LOADER_DLERROR_FN 0x40
#define REMORA_AARCH64_LOADER_ERROR 0x48
#define REMORA_AARCH64_LOADER_DLSYM_FN 0x50
#define REMORA_AARCH64_LOADER_HOOK_NAME 0x58
#define REMORA_AARCH64_LOADER_HOOK_ARG 0x60
#define REMORA_AARCH64_LOADER_HOOK_RC 0x68

// Offsets in arch::LoaderStart, the loader start routine's argument.
#define REMORA_AARCH64_START_PTHREAD_CREATE_FN 0x00
#define REMORA_AARCH64_START_ATTR_INIT_FN 0x08
#define REMORA_AARCH64_START_ATTR_SETSTACK_FN 0x10
#define REMORA_AARCH64_START_STACK_HINT 0x18
#define REMORA_AARCH64_START_STACK_SIZE 0x20
#define REMORA_AARCH64_START_ATTR 0x28
#define REMORA_AARCH64_START_THREAD_OUT 0x30
#define REMORA_AARCH64_START_TRAMPOLINE 0x38
#define REMORA_AARCH64_START_BLOCK 0x40
#define REMORA_AARCH64_START_STACK 0x48
#define REMORA_AARCH64_START_ATTR_STATUS 0x50
#define REMORA_AARCH64_START_CREATED 0x58

// Where x7 of the resume state sits in the restore frame, from the frame's
// start (the rt_sigframe: siginfo, then the ucontext whose uc_mcontext.regs
// hold x0-x30). The stubs reload x7 from there right before their final
// `svc`: at a ptrace syscall stop the kernel reports the stop's direction in
// x7 and afterwards puts back the x7 the thread entered with, whatever the
// tracer wrote (arch/arm64/kernel/ptrace.c, report_syscall). Entering with
// the thread's own x7 makes a ptrace restore at that stop exact.
#define REMORA_AARCH64_FRAME_X7 368

// The system calls the stubs make (arch::aarch64::nr).
#define REMORA_AARCH64_NR_RT_SIGRETURN 139
#define REMORA_AARCH64_NR_TGKILL 131
#define REMORA_AARCH64_NR_GETPID 172
#define REMORA_AARCH64_NR_GETTID 178
#define REMORA_AARCH64_NR_PRCTL 167
#define REMORA_AARCH64_NR_MADVISE 233
#define REMORA_AARCH64_NR_MMAP 222
#define REMORA_AARCH64_NR_MPROTECT 226

// prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, ...) and madvise(MADV_DONTFORK).
#define REMORA_AARCH64_PR_SET_VMA 0x53564d41
#define REMORA_AARCH64_PR_SET_VMA_ANON_NAME 0
#define REMORA_AARCH64_MADV_DONTFORK 10
// The scratch's data pages: PROT_READ | PROT_WRITE, from the page after its code.
#define REMORA_AARCH64_DATA_PROT 0x3
#define REMORA_AARCH64_PAGE 4096
// The setup status word (base-relative, in the first data page, after the
// echo slot): 0 in the fresh mapping, the mapping's base once the setup
// routine made the data pages writable (remote/scratch.h's
// kScratchSetupStatus).
#define REMORA_AARCH64_SETUP_STATUS (REMORA_AARCH64_PAGE + 16)
// The loader stack's mmap: PROT_READ | PROT_WRITE, and MAP_PRIVATE |
// MAP_ANONYMOUS | MAP_STACK (asm-generic/mman*.h).
#define REMORA_AARCH64_STACK_PROT 0x3
#define REMORA_AARCH64_STACK_FLAGS 0x20022

#if defined(__cplusplus) && defined(__aarch64__)
extern "C" __attribute__((visibility("hidden")))
const unsigned char remora_aarch64_stub[REMORA_AARCH64_STUB_SIZE];
extern "C" __attribute__((visibility("hidden"))) const unsigned char remora_aarch64_stub_end[];
#endif
