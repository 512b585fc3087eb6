// The layout of Remora's x86_64 stub block (src/arch/x86_64_stub.S): where
// each entry sits, and the numbers its code is built from. One table for its
// two readers: the assembler places every entry with `.org` at the offset
// named here and refuses to assemble when an instruction the engine watches
// for ends anywhere else, and arch::x86_64::Stub (x86_64.h) gives the same
// numbers to the C++ engine. x86_64.cc checks the LoaderBlock offsets, and
// the system call numbers that nr:: names too, against their C++ definitions
// at compile time; arch_test pins the assembled bytes.
//
// Macros only outside the __cplusplus part: the assembler's preprocessor
// reads this file too.
#pragma once

// Byte offsets from the start of the block.
#define REMORA_X86_64_STUB_CALL_ENTRY 0
#define REMORA_X86_64_STUB_CALL_RETURN_SYSCALL_END 16  // rip after the call stub's rt_sigreturn
#define REMORA_X86_64_STUB_SYSCALL_ENTRY 32
#define REMORA_X86_64_STUB_SYSCALL_END 34  // rip after the requested syscall
#define REMORA_X86_64_STUB_SYSCALL_RETURN_SYSCALL_END 47
#define REMORA_X86_64_STUB_THREAD_TRAMPOLINE 64
#define REMORA_X86_64_STUB_MARKED_CALL_ENTRY 128
#define REMORA_X86_64_STUB_MARKED_CALL_RETURN_SYSCALL_END 183  // rip after its rt_sigreturn
#define REMORA_X86_64_STUB_SCRATCH_SETUP 416
#define REMORA_X86_64_STUB_LOADER_START 256
#define REMORA_X86_64_STUB_THREAD_HOOK 512  // the trampoline's end: the hook, then `done`
#define REMORA_X86_64_STUB_SIZE 576

// Offsets in arch::x86_64::LoaderBlock, the thread trampoline's argument.
#define REMORA_X86_64_LOADER_DLOPEN_FN 0x00
#define REMORA_X86_64_LOADER_PATH 0x08
#define REMORA_X86_64_LOADER_FLAGS 0x10
#define REMORA_X86_64_LOADER_PTHREAD_SELF_FN 0x18
#define REMORA_X86_64_LOADER_PTHREAD_DETACH_FN 0x20
#define REMORA_X86_64_LOADER_DONE 0x28
#define REMORA_X86_64_LOADER_HANDLE 0x30
#define REMORA_X86_64_LOADER_TID 0x38
#define REMORA_X86_64_LOADER_DLERROR_FN 0x40
#define REMORA_X86_64_LOADER_ERROR 0x48
#define REMORA_X86_64_LOADER_DLSYM_FN 0x50
#define REMORA_X86_64_LOADER_HOOK_NAME 0x58
#define REMORA_X86_64_LOADER_HOOK_ARG 0x60
#define REMORA_X86_64_LOADER_HOOK_RC 0x68

// Offsets in arch::LoaderStart, the loader start routine's argument.
#define REMORA_X86_64_START_PTHREAD_CREATE_FN 0x00
#define REMORA_X86_64_START_ATTR_INIT_FN 0x08
#define REMORA_X86_64_START_ATTR_SETSTACK_FN 0x10
#define REMORA_X86_64_START_STACK_HINT 0x18
#define REMORA_X86_64_START_STACK_SIZE 0x20
#define REMORA_X86_64_START_ATTR 0x28
#define REMORA_X86_64_START_THREAD_OUT 0x30
#define REMORA_X86_64_START_TRAMPOLINE 0x38
#define REMORA_X86_64_START_BLOCK 0x40
#define REMORA_X86_64_START_STACK 0x48
#define REMORA_X86_64_START_ATTR_STATUS 0x50
#define REMORA_X86_64_START_CREATED 0x58

// The system calls the stubs make (arch::x86_64::nr).
#define REMORA_X86_64_NR_MMAP 9
#define REMORA_X86_64_NR_MPROTECT 10
#define REMORA_X86_64_NR_RT_SIGRETURN 15
#define REMORA_X86_64_NR_MADVISE 28
#define REMORA_X86_64_NR_GETPID 39
#define REMORA_X86_64_NR_PRCTL 157
#define REMORA_X86_64_NR_GETTID 186
#define REMORA_X86_64_NR_TGKILL 234

// prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, ...) and madvise(MADV_DONTFORK)
// (linux/prctl.h, asm-generic/mman-common.h; not included: they are not
// assembler-clean).
#define REMORA_X86_64_PR_SET_VMA 0x53564d41
#define REMORA_X86_64_PR_SET_VMA_ANON_NAME 0
#define REMORA_X86_64_MADV_DONTFORK 10
// The scratch's data pages: PROT_READ | PROT_WRITE, from the page after its code.
#define REMORA_X86_64_DATA_PROT 0x3
#define REMORA_X86_64_PAGE 4096
// The setup status word (base-relative, in the first data page, after the
// echo slot): 0 in the fresh mapping, the mapping's base once the setup
// routine made the data pages writable (remote/scratch.h's
// kScratchSetupStatus).
#define REMORA_X86_64_SETUP_STATUS (REMORA_X86_64_PAGE + 16)
// The loader stack's mmap: PROT_READ | PROT_WRITE, and MAP_PRIVATE |
// MAP_ANONYMOUS | MAP_STACK (asm-generic/mman*.h).
#define REMORA_X86_64_STACK_PROT 0x3
#define REMORA_X86_64_STACK_FLAGS 0x20022

#if defined(__cplusplus) && defined(__x86_64__)
// The assembled block, linked into remora_arch (and, as its own object of
// the same source, into the agent). Hidden: never exported from a shared
// object that links remora_arch, and addressed without a GOT entry. The end
// symbol is the byte after the block's last.
extern "C" __attribute__((visibility("hidden")))
const unsigned char remora_x86_64_stub[REMORA_X86_64_STUB_SIZE];
extern "C" __attribute__((visibility("hidden"))) const unsigned char remora_x86_64_stub_end[];
#endif
