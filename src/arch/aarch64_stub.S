/* Remora's aarch64 stub block: the code Remora runs in a target process.
 *
 * The one source of these bytes, as x86_64_stub.S is for x86_64: linked
 * into remora_arch (arch::aarch64::stub_code() copies it into each scratch
 * mapping) and, assembled again with REMORA_AARCH64_STUB_AGENT defined, into
 * libremora-agent.so, which exports it as `remora_agent_stub`.
 *
 * One block in a section of its own; every entry sits at the offset
 * src/arch/aarch64_stub.h names, and the assembler stops when a watched
 * instruction ends elsewhere. Unused words are 0 (`udf #0`: a thread that
 * strays there traps).
 *
 * At entry to the call and syscall stubs: x19 = the restore frame (the
 * rt_sigframe: rt_sigreturn reads it at sp), sp = a 16-byte aligned stack
 * below the frame. Every stub ends the same way:
 *   ldr x7, [x19, #FRAME_X7]   the thread's own x7 (see aarch64_stub.h)
 *   mov x8, #139; mov sp, x19; svc #0    rt_sigreturn on the frame
 * so a thread whose controller died restores itself. A live controller stops
 * the thread at that rt_sigreturn's syscall-entry (the result is its first
 * argument, x0) and either lets it run (exact frame) or restores through
 * ptrace with the system call skipped.
 *
 *  call stub    (x16 = function, x0-x5 = arguments):   blr x16; tail
 *  syscall stub (x8 = number, x0-x5 = arguments):      svc #0; tail
 *  thread trampoline (a pthread start routine; x0 = a LoaderBlock): records
 *    its tid, detaches itself, dlopen(path, flags), records the handle and
 *    dlerror(), then stores `done` (release) last and returns into libc's
 *    thread exit.
 *  marked call stub (x16 = function, x0-x5 = arguments, x19 = frame,
 *    x20 = marker signal, x21 = a 16-byte result slot, x22 = cookie):
 *    blr x16; str x0,[x21]; str x22,[x21,#8];
 *    tgkill(getpid(), gettid(), x20); tail
 *    (the contract is x86_64_stub.S's: the marker stays pending until
 *    rt_sigreturn has restored the thread.)
 *  scratch setup (a function: x0 = base, x1 = size, x2 = name, x3 = next
 *  function or 0, x4 = its argument):
 *    mprotect of the data pages (base + page on) to read-write, returning
 *    its -errno on failure, then the base into the setup status word (base
 *    + page + 16), prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, base, size, name) and
 *    madvise(base, size, MADV_DONTFORK); then a tail call of next(arg)
 *    (through x16, which a BTI `bti c` pad accepts from `br`) if there is
 *    one, else returns 0 (as x86_64_stub.S's).
 *  loader start (a function: x0 = a LoaderStart, arch/loader_block.h):
 *    mmap of the loader thread's stack, pthread_attr_init and
 *    pthread_attr_setstack naming it, then pthread_create of the thread
 *    trampoline on it, as x86_64_stub.S's.
 * The scratch is never mapped PROT_BTI, so no entry needs a landing pad;
 * functions the stubs call are entered with `blr`, which their own pads
 * accept.
 */
#include "arch/aarch64_stub.h"

#define REMORA_AT(off) .org remora_aarch64_stub + (off), 0

#define REMORA_EXPECT_DISTANCE(from, label, want)                                                      \
  .if (label - from) != (want);                                                                        \
  .error "aarch64_stub.S: a watched instruction ends off the offset aarch64_stub.h names; fix one of them"; \
  .endif

#define REMORA_TAIL                                 \
  ldr x7, [x19, #REMORA_AARCH64_FRAME_X7];          \
  mov x8, #REMORA_AARCH64_NR_RT_SIGRETURN;          \
  mov sp, x19;                                      \
  svc #0

  .section .text.remora_stub, "ax", %progbits
  .balign 64
  .globl remora_aarch64_stub
  .hidden remora_aarch64_stub
  .type remora_aarch64_stub, %object
  .size remora_aarch64_stub, REMORA_AARCH64_STUB_SIZE
#if defined(REMORA_AARCH64_STUB_AGENT)
  .globl remora_agent_stub
  .type remora_agent_stub, %function
  .size remora_agent_stub, REMORA_AARCH64_STUB_SIZE
remora_agent_stub:
#endif
remora_aarch64_stub:

/* ---- call stub ---- */
  REMORA_AT(REMORA_AARCH64_STUB_CALL_ENTRY)
.Lcall_entry:
  blr x16                                   /* the function; its result in x0 */
.Lcall_tail:
  REMORA_TAIL
.Lcall_return_syscall_end:
  brk #0x52                                 /* never reached */
  REMORA_EXPECT_DISTANCE(.Lcall_entry, .Lcall_tail, REMORA_AARCH64_STUB_CALL_TAIL)
  REMORA_EXPECT_DISTANCE(.Lcall_entry, .Lcall_return_syscall_end, REMORA_AARCH64_STUB_CALL_RETURN_SYSCALL_END)

/* ---- syscall stub ---- */
  REMORA_AT(REMORA_AARCH64_STUB_SYSCALL_ENTRY)
.Lsyscall_entry:
  svc #0                                    /* the requested system call */
.Lsyscall_end:
  REMORA_TAIL
  brk #0x52
  REMORA_EXPECT_DISTANCE(.Lsyscall_entry, .Lsyscall_end,
                         REMORA_AARCH64_STUB_SYSCALL_END - REMORA_AARCH64_STUB_SYSCALL_ENTRY)

/* ---- thread trampoline: x0 = LoaderBlock* ---- */
  REMORA_AT(REMORA_AARCH64_STUB_THREAD_TRAMPOLINE)
  stp x29, x30, [sp, #-32]!
  mov x29, sp
  str x19, [sp, #16]                        /* callee-saved */
  mov x19, x0                               /* x19 = the block, kept across calls */
  mov x8, #REMORA_AARCH64_NR_GETTID
  svc #0
  str x0, [x19, #REMORA_AARCH64_LOADER_TID]
  ldr x16, [x19, #REMORA_AARCH64_LOADER_PTHREAD_SELF_FN]
  blr x16
  ldr x16, [x19, #REMORA_AARCH64_LOADER_PTHREAD_DETACH_FN]
  blr x16                                   /* nobody joins it */
  ldr x0, [x19, #REMORA_AARCH64_LOADER_PATH]
  ldr x1, [x19, #REMORA_AARCH64_LOADER_FLAGS]
  ldr x16, [x19, #REMORA_AARCH64_LOADER_DLOPEN_FN]
  blr x16
  str x0, [x19, #REMORA_AARCH64_LOADER_HANDLE]
  ldr x16, [x19, #REMORA_AARCH64_LOADER_DLERROR_FN]
  blr x16
  str x0, [x19, #REMORA_AARCH64_LOADER_ERROR]
  b .Lthread_hook                           /* the rest at the block's end */

/* ---- marked call stub ---- */
  REMORA_AT(REMORA_AARCH64_STUB_MARKED_CALL_ENTRY)
.Lmarked_call_entry:
  blr x16
  str x0, [x21]                             /* the result */
  str x22, [x21, #8]                        /* the cookie: the function returned */
  mov x8, #REMORA_AARCH64_NR_GETPID
  svc #0
  mov x23, x0
  mov x8, #REMORA_AARCH64_NR_GETTID
  svc #0
  mov x1, x0
  mov x0, x23
  mov x2, x20
  mov x8, #REMORA_AARCH64_NR_TGKILL
  svc #0                                    /* the marker: pending, every signal blocked */
  REMORA_TAIL
.Lmarked_call_return_syscall_end:
  brk #0x52
  REMORA_EXPECT_DISTANCE(.Lmarked_call_entry, .Lmarked_call_return_syscall_end,
                         REMORA_AARCH64_STUB_MARKED_CALL_RETURN_SYSCALL_END - REMORA_AARCH64_STUB_MARKED_CALL_ENTRY)

/* ---- loader start: x0 = LoaderStart* (arch/loader_block.h) ---- */
  REMORA_AT(REMORA_AARCH64_STUB_LOADER_START)
  stp x29, x30, [sp, #-32]!
  mov x29, sp
  stp x19, x20, [sp, #16]                   /* callee-saved */
  mov x19, x0                               /* x19 = the block */
  mov x20, #0                               /* x20 = the attr pthread_create gets: NULL until ours is set */
  ldr x16, [x19, #REMORA_AARCH64_START_ATTR_INIT_FN]
  cbz x16, 1f                               /* no attr functions: libc's own stack */
  ldr x0, [x19, #REMORA_AARCH64_START_STACK_HINT]
  ldr x1, [x19, #REMORA_AARCH64_START_STACK_SIZE]
  mov x2, #REMORA_AARCH64_STACK_PROT
  movz x3, #(REMORA_AARCH64_STACK_FLAGS & 0xffff)
  movk x3, #(REMORA_AARCH64_STACK_FLAGS >> 16), lsl #16
  mov x4, #-1                               /* fd */
  mov x5, #0                                /* offset */
  mov x8, #REMORA_AARCH64_NR_MMAP
  svc #0
  str x0, [x19, #REMORA_AARCH64_START_STACK]
  cmn x0, #4095
  b.hs 2f                                   /* -errno: no stack, no thread */
  ldr x0, [x19, #REMORA_AARCH64_START_ATTR]
  ldr x16, [x19, #REMORA_AARCH64_START_ATTR_INIT_FN]
  blr x16
  sxtw x0, w0
  str x0, [x19, #REMORA_AARCH64_START_ATTR_STATUS]
  cbnz x0, 1f                               /* refused: libc's own stack then */
  ldr x0, [x19, #REMORA_AARCH64_START_ATTR]
  ldr x1, [x19, #REMORA_AARCH64_START_STACK]
  ldr x2, [x19, #REMORA_AARCH64_START_STACK_SIZE]
  ldr x16, [x19, #REMORA_AARCH64_START_ATTR_SETSTACK_FN]
  blr x16
  sxtw x0, w0
  str x0, [x19, #REMORA_AARCH64_START_ATTR_STATUS]
  cbnz x0, 1f
  ldr x20, [x19, #REMORA_AARCH64_START_ATTR]
1:
  ldr x0, [x19, #REMORA_AARCH64_START_THREAD_OUT]
  mov x1, x20
  ldr x2, [x19, #REMORA_AARCH64_START_TRAMPOLINE]
  ldr x3, [x19, #REMORA_AARCH64_START_BLOCK]
  ldr x16, [x19, #REMORA_AARCH64_START_PTHREAD_CREATE_FN]
  blr x16
  sxtw x0, w0
  str x0, [x19, #REMORA_AARCH64_START_CREATED]
2:
  ldp x19, x20, [sp, #16]
  ldp x29, x30, [sp], #32
  ret                                       /* pthread_create's result, or mmap's -errno */

/* ---- scratch setup: x0 = base, x1 = size, x2 = name ----
 * After the loader start: it outgrew the room before it. */
  REMORA_AT(REMORA_AARCH64_STUB_SCRATCH_SETUP)
  mov x16, x3                               /* next and its argument, kept across the svcs */
  mov x12, x4
  mov x9, x0                                /* base, size and name, kept across the svcs */
  mov x10, x1
  mov x11, x2
  add x0, x9, #REMORA_AARCH64_PAGE          /* mprotect(base + page, size - page, RW) */
  sub x1, x10, #REMORA_AARCH64_PAGE
  mov x2, #REMORA_AARCH64_DATA_PROT
  mov x8, #REMORA_AARCH64_NR_MPROTECT
  svc #0
  cbnz x0, 1f                               /* -errno: nothing else done */
  str x9, [x9, #REMORA_AARCH64_SETUP_STATUS]   /* the base: the data pages are writable */
  mov x4, x11
  mov x3, x10
  mov x2, x9
  movz x0, #(REMORA_AARCH64_PR_SET_VMA & 0xffff)
  movk x0, #(REMORA_AARCH64_PR_SET_VMA >> 16), lsl #16
  mov x1, #REMORA_AARCH64_PR_SET_VMA_ANON_NAME
  mov x8, #REMORA_AARCH64_NR_PRCTL
  svc #0                                    /* failure harmless: no anonymous VMA names */
  mov x0, x9
  mov x1, x10
  mov x2, #REMORA_AARCH64_MADV_DONTFORK
  mov x8, #REMORA_AARCH64_NR_MADVISE
  svc #0                                    /* its failure is not the scratch's: ignored */
  mov x0, #0
  cbz x16, 1f                               /* no next: return 0 */
  mov x0, x12
  br x16                                    /* next(arg), returning to our caller (lr) */
1:
  ret                                       /* 0, or mprotect's -errno */

/* ---- the thread trampoline's end (x19 = the block): the hook, when it
 * is asked for and found, then `done` ---- */
  REMORA_AT(REMORA_AARCH64_STUB_THREAD_HOOK)
.Lthread_hook:
  ldr x1, [x19, #REMORA_AARCH64_LOADER_HOOK_NAME]
  cbz x1, 1f                                /* no hook asked for */
  ldr x0, [x19, #REMORA_AARCH64_LOADER_HANDLE]
  cbz x0, 1f                                /* nothing loaded */
  ldr x16, [x19, #REMORA_AARCH64_LOADER_DLSYM_FN]
  blr x16
  cbz x0, 1f                                /* the library has no such function */
  mov x16, x0
  ldr x0, [x19, #REMORA_AARCH64_LOADER_HOOK_ARG]
  blr x16
  sxtw x0, w0
  str x0, [x19, #REMORA_AARCH64_LOADER_HOOK_RC]
1:
  mov x0, #1
  add x1, x19, #REMORA_AARCH64_LOADER_DONE
  stlr x0, [x1]                             /* done: the trampoline's last store */
  mov x0, #0                                /* the thread's result: NULL */
  ldr x19, [sp, #16]
  ldp x29, x30, [sp], #32
  ret                                       /* into libc's thread exit */

  REMORA_AT(REMORA_AARCH64_STUB_SIZE)
  .globl remora_aarch64_stub_end
  .hidden remora_aarch64_stub_end
remora_aarch64_stub_end:
  .section .note.GNU-stack, "", %progbits
