/* Remora's x86_64 stub block: the code Remora runs in a target process.
 *
 * The one source of these bytes. It is linked into remora_arch, where
 * arch::x86_64::stub_code() copies it into each scratch mapping the
 * controller creates, and into libremora-agent.so (assembled again with
 * REMORA_X86_64_STUB_AGENT defined), which exports the same block as
 * `remora_agent_stub` so that calls on the agent's listener need no scratch
 * mapping. The controller adopts the agent's copy only when it is byte for
 * byte stub_code(), so an agent of another build never runs stale code.
 *
 * One 256-byte block, 64-byte aligned, in a section of its own; every entry
 * sits at the offset src/arch/x86_64_stub.h names (and arch::x86_64::Stub
 * reads): `.org` places it, and the assembler stops with an error when an
 * instruction the engine recognises by its address ends elsewhere. Unused
 * bytes are int3 (0xcc): a thread that strays there traps instead of running
 * on. Encodings: Intel SDM vol. 2 (call r/m64 = FF /2; mov r/m64,r64 = 89 /r).
 *
 * At entry to the call and syscall stubs: rbx = address of the frame's
 * ucontext (rt_sigreturn finds the frame at rsp - 8), rsp = a 16-byte
 * aligned stack below the frame.
 *
 *  call stub    (r11 = function, rdi..r9 = arguments, rax = 0):
 *    call *%r11; mov %rax,%rdi; mov $15,%eax; mov %rbx,%rsp; syscall; ud2
 *  syscall stub (rax = number, rdi,rsi,rdx,r10,r8,r9 = arguments):
 *    syscall;    mov %rax,%rdi; mov $15,%eax; mov %rbx,%rsp; syscall; ud2
 *
 * Both end in rt_sigreturn on the frame, so a thread whose controller died
 * restores itself. A live controller stops the thread at the rt_sigreturn
 * syscall-entry (PTRACE_SYSCALL) and reads the result from rdi; then it lets
 * that rt_sigreturn run when the frame holds the exact resume state, and
 * restores the thread through ptrace otherwise (see remote/target.cc).
 *
 *  thread trampoline (a pthread start routine; rdi = a LoaderBlock):
 *    records its tid, detaches itself, dlopen(path, flags), records the
 *    handle and dlerror(); with a hook asked for (arch/loader_block.h),
 *    dlsym(handle, hook_name) and, when found, hook(hook_arg) into
 *    hook_rc (its end sits at the end of the block, where there was room);
 *    then sets `done` as its last store and returns into libc's thread
 *    exit. Used to load the agent on a fresh thread, so
 *    that dlopen never runs on an interrupted application thread.
 *  marked call stub (r11 = function, rdi..r9 = arguments, rbx = &frame.uc,
 *  r12 = a 16-byte result slot, r13 = marker signal, r14 = cookie):
 *    call *%r11; mov %rax,(%r12); mov %r14,8(%r12);
 *    tgkill(getpid(), gettid(), r13); rt_sigreturn on the frame; ud2
 *    The function runs under PTRACE_CONT, so its own system calls cost no
 *    stops. Every signal is blocked while it runs, so the marker stays
 *    pending until rt_sigreturn has restored the thread; then it is
 *    dequeued, and a tracer sees a signal-delivery stop of exactly that
 *    signal with the thread already restored. Untraced (the controller
 *    died) the marker is a signal the process ignores, and is discarded.
 *  scratch setup (a function: rdi = base, rsi = size, rdx = name,
 *  rcx = next function or 0, r8 = its argument):
 *    mprotect(base + page, size - page, PROT_READ | PROT_WRITE) for the
 *    data pages (on failure it returns that -errno and does nothing else),
 *    then the base into the setup status word (base + page + 16, 0 in the
 *    fresh mapping until then), prctl(PR_SET_VMA,
 *    PR_SET_VMA_ANON_NAME, base, size, name) (its failure on kernels without
 *    anonymous VMA names is harmless), madvise(base, size, MADV_DONTFORK);
 *    then, with a next function, a tail call of next(arg) (its result is
 *    the call's), else returns 0. Run once as the call that completes a new
 *    scratch mapping, with its result slot on the frame (the scratch's own
 *    echo slot lies in the pages it makes writable): three system calls that
 *    would otherwise cost two ptrace stops each, and the first call made
 *    into the new scratch (Target::call_prepared) in the same call.
 *  loader start (a function: rdi = a LoaderStart, arch/loader_block.h):
 *    mmap of the loader thread's stack, pthread_attr_init and
 *    pthread_attr_setstack naming it, then pthread_create of the thread
 *    trampoline on it; the intermediate results go into the block. One marked
 *    call where there were four remote calls.
 */
#include "arch/x86_64_stub.h"

/* Places the next instruction at `off` bytes into the block, int3 between.
 * `.org` refuses to move backwards, so code that outgrows the entry before
 * fails to assemble. */
#define REMORA_AT(off) .org remora_x86_64_stub + (off), 0xcc

/* Stops the assembly unless `label` lies `want` bytes after `from` (two
 * labels after the same `.org`, so their distance is known while
 * assembling). The error's line is the entry's check. */
#define REMORA_EXPECT_DISTANCE(from, label, want)                                                    \
  .if (label - from) != (want);                                                                      \
  .error "x86_64_stub.S: a watched instruction ends off the offset x86_64_stub.h names; fix one of them"; \
  .endif

  .section .text.remora_stub, "ax", @progbits
  .balign 64, 0xcc
  .globl remora_x86_64_stub
  .hidden remora_x86_64_stub
  .type remora_x86_64_stub, @object
  .size remora_x86_64_stub, REMORA_X86_64_STUB_SIZE
#if defined(REMORA_X86_64_STUB_AGENT)
  /* The agent's export of the same bytes (agent/agent.cc; looked up by
   * attach.cc's resolve_agent, which wants a function symbol). */
  .globl remora_agent_stub
  .type remora_agent_stub, @function
  .size remora_agent_stub, REMORA_X86_64_STUB_SIZE
remora_agent_stub:
#endif
remora_x86_64_stub:

/* ---- call stub ---- */
  REMORA_AT(REMORA_X86_64_STUB_CALL_ENTRY)
.Lcall_entry:
  call *%r11                           /* the function; its result in rax */
  mov %rax, %rdi                       /* result survives the syscall entry (read from rdi) */
  mov $REMORA_X86_64_NR_RT_SIGRETURN, %eax
  mov %rbx, %rsp                       /* rsp = &frame.uc */
  syscall                              /* rt_sigreturn on the frame */
.Lcall_return_syscall_end:
  ud2                                  /* never reached */
  REMORA_EXPECT_DISTANCE(.Lcall_entry, .Lcall_return_syscall_end,
                         REMORA_X86_64_STUB_CALL_RETURN_SYSCALL_END - REMORA_X86_64_STUB_CALL_ENTRY)

/* ---- syscall stub ---- */
  REMORA_AT(REMORA_X86_64_STUB_SYSCALL_ENTRY)
.Lsyscall_entry:
  syscall                              /* the requested system call */
.Lsyscall_end:
  mov %rax, %rdi                       /* result survives the syscall entry */
  mov $REMORA_X86_64_NR_RT_SIGRETURN, %eax
  mov %rbx, %rsp                       /* rsp = &frame.uc */
  syscall                              /* rt_sigreturn on the frame */
.Lsyscall_return_syscall_end:
  ud2                                  /* never reached */
  REMORA_EXPECT_DISTANCE(.Lsyscall_entry, .Lsyscall_end,
                         REMORA_X86_64_STUB_SYSCALL_END - REMORA_X86_64_STUB_SYSCALL_ENTRY)
  REMORA_EXPECT_DISTANCE(.Lsyscall_entry, .Lsyscall_return_syscall_end,
                         REMORA_X86_64_STUB_SYSCALL_RETURN_SYSCALL_END - REMORA_X86_64_STUB_SYSCALL_ENTRY)

/* ---- thread trampoline: rdi = LoaderBlock*, called by pthread_create's
 * new thread with the usual misaligned-by-8 stack. ---- */
  REMORA_AT(REMORA_X86_64_STUB_THREAD_TRAMPOLINE)
.Lthread_trampoline:
  push %rbx                            /* callee-saved; also aligns the stack */
  mov %rdi, %rbx                       /* rbx = the block, kept across calls */
  mov $REMORA_X86_64_NR_GETTID, %eax
  syscall
  mov %rax, REMORA_X86_64_LOADER_TID(%rbx)
  call *REMORA_X86_64_LOADER_PTHREAD_SELF_FN(%rbx)
  mov %rax, %rdi
  call *REMORA_X86_64_LOADER_PTHREAD_DETACH_FN(%rbx)  /* nobody joins it */
  mov REMORA_X86_64_LOADER_PATH(%rbx), %rdi
  mov REMORA_X86_64_LOADER_FLAGS(%rbx), %rsi
  call *REMORA_X86_64_LOADER_DLOPEN_FN(%rbx)
  mov %rax, REMORA_X86_64_LOADER_HANDLE(%rbx)
  call *REMORA_X86_64_LOADER_DLERROR_FN(%rbx)
  mov %rax, REMORA_X86_64_LOADER_ERROR(%rbx)
  jmp .Lthread_hook                    /* the rest at the block's end */

/* ---- marked call stub ---- */
  REMORA_AT(REMORA_X86_64_STUB_MARKED_CALL_ENTRY)
.Lmarked_call_entry:
  call *%r11                           /* the function, under PTRACE_CONT */
  mov %rax, (%r12)                     /* result */
  mov %r14, 8(%r12)                    /* cookie: the function returned */
  mov $REMORA_X86_64_NR_GETPID, %eax
  syscall
  mov %rax, %r15                       /* r15 = tgid (the frame restores it) */
  mov $REMORA_X86_64_NR_GETTID, %eax
  syscall
  mov %r15, %rdi                       /* tgkill(tgid, */
  mov %rax, %rsi                       /*        tid,  */
  mov %r13, %rdx                       /*        marker) */
  mov $REMORA_X86_64_NR_TGKILL, %eax   /* the marker, pending while blocked */
  syscall
  mov $REMORA_X86_64_NR_RT_SIGRETURN, %eax
  mov %rbx, %rsp                       /* rsp = &frame.uc */
  syscall                              /* rt_sigreturn on the frame */
.Lmarked_call_return_syscall_end:
  ud2                                  /* never reached */
  REMORA_EXPECT_DISTANCE(.Lmarked_call_entry, .Lmarked_call_return_syscall_end,
                         REMORA_X86_64_STUB_MARKED_CALL_RETURN_SYSCALL_END - REMORA_X86_64_STUB_MARKED_CALL_ENTRY)

/* ---- loader start: a function (rdi = LoaderStart*; arch/loader_block.h) ----
 * Entered with the ABI's call alignment (rsp = 8 mod 16). */
  REMORA_AT(REMORA_X86_64_STUB_LOADER_START)
  push %rbx
  push %r12
  sub $8, %rsp                         /* rsp 16-byte aligned for the calls */
  mov %rdi, %rbx                       /* rbx = the block */
  xor %r12d, %r12d                     /* r12 = the attr pthread_create gets: NULL until ours is set */
  cmpq $0, REMORA_X86_64_START_ATTR_INIT_FN(%rbx)
  je .Lstart_create                    /* no attr functions: libc's own stack */
  mov REMORA_X86_64_START_STACK_HINT(%rbx), %rdi
  mov REMORA_X86_64_START_STACK_SIZE(%rbx), %rsi
  mov $REMORA_X86_64_STACK_PROT, %edx
  mov $REMORA_X86_64_STACK_FLAGS, %r10d
  mov $-1, %r8                         /* fd */
  xor %r9d, %r9d                       /* offset */
  mov $REMORA_X86_64_NR_MMAP, %eax
  syscall
  mov %rax, REMORA_X86_64_START_STACK(%rbx)
  cmp $-4095, %rax
  jae .Lstart_out                      /* -errno: no stack, no thread */
  mov REMORA_X86_64_START_ATTR(%rbx), %rdi
  call *REMORA_X86_64_START_ATTR_INIT_FN(%rbx)
  movslq %eax, %rax
  mov %rax, REMORA_X86_64_START_ATTR_STATUS(%rbx)
  test %rax, %rax
  jne .Lstart_create                   /* refused: libc's own stack then */
  mov REMORA_X86_64_START_ATTR(%rbx), %rdi
  mov REMORA_X86_64_START_STACK(%rbx), %rsi
  mov REMORA_X86_64_START_STACK_SIZE(%rbx), %rdx
  call *REMORA_X86_64_START_ATTR_SETSTACK_FN(%rbx)
  movslq %eax, %rax
  mov %rax, REMORA_X86_64_START_ATTR_STATUS(%rbx)
  test %rax, %rax
  jne .Lstart_create
  mov REMORA_X86_64_START_ATTR(%rbx), %r12
.Lstart_create:
  mov REMORA_X86_64_START_THREAD_OUT(%rbx), %rdi
  mov %r12, %rsi
  mov REMORA_X86_64_START_TRAMPOLINE(%rbx), %rdx
  mov REMORA_X86_64_START_BLOCK(%rbx), %rcx
  call *REMORA_X86_64_START_PTHREAD_CREATE_FN(%rbx)
  movslq %eax, %rax
  mov %rax, REMORA_X86_64_START_CREATED(%rbx)
.Lstart_out:
  add $8, %rsp
  pop %r12
  pop %rbx
  ret                                  /* pthread_create's result, or mmap's -errno */

/* ---- scratch setup: a function (rdi = base, rsi = size, rdx = name,
 * rcx = next function or 0, r8 = its argument) ----
 * After the loader start: it outgrew the room before it. Every byte of its
 * room is used: the shortest encodings on purpose (jrcxz). */
  REMORA_AT(REMORA_X86_64_STUB_SCRATCH_SETUP)
.Lscratch_setup:
  push %rcx                            /* next and its argument, kept across the syscalls */
  push %r8                             /* (rsp as at entry again once both are popped) */
  mov %rdi, %r9                        /* base, size and name survive the syscalls */
  mov %rsi, %r10                       /* (r10 is prctl's arg 4: the size) */
  mov %rdx, %r8                        /* prctl arg 5: name */
  lea REMORA_X86_64_PAGE(%r9), %rdi    /* mprotect(base + page, size - page, RW): */
  lea -REMORA_X86_64_PAGE(%r10), %rsi  /* the data pages after the code's */
  mov $REMORA_X86_64_DATA_PROT, %edx
  mov $REMORA_X86_64_NR_MPROTECT, %eax
  syscall
  test %rax, %rax
  jnz .Lsetup_out                      /* -errno: nothing else done (the data stays read-only) */
  mov %r9, REMORA_X86_64_SETUP_STATUS(%r9)   /* the base: the data pages are writable */
  mov %r9, %rdx                        /* prctl arg 3: base */
  xor %esi, %esi                       /* PR_SET_VMA_ANON_NAME */
  .if REMORA_X86_64_PR_SET_VMA_ANON_NAME != 0
    .error "x86_64_stub.S: PR_SET_VMA_ANON_NAME is not 0, but the stub loads it with xor: use a mov"
  .endif
  mov $REMORA_X86_64_PR_SET_VMA, %edi
  mov $REMORA_X86_64_NR_PRCTL, %eax
  syscall                              /* failure is harmless (older kernels) */
  mov %r9, %rdi                        /* base */
  mov %r10, %rsi                       /* size */
  mov $REMORA_X86_64_MADV_DONTFORK, %edx
  mov $REMORA_X86_64_NR_MADVISE, %eax
  syscall                              /* its failure is not the scratch's: ignored */
  xor %eax, %eax
  pop %rdi                             /* next's argument */
  pop %rcx                             /* next */
  jrcxz .Lsetup_done                   /* none: return 0 */
  jmp *%rcx                            /* next(arg), returning to our caller */
.Lsetup_out:
  pop %rdi
  pop %rcx
.Lsetup_done:
  ret                                  /* 0, or mprotect's -errno */

/* ---- the thread trampoline's end (rbx = the block, rsp 16-byte aligned):
 * the hook, when it is asked for and found, then `done` ---- */
  REMORA_AT(REMORA_X86_64_STUB_THREAD_HOOK)
.Lthread_hook:
  mov REMORA_X86_64_LOADER_HOOK_NAME(%rbx), %rsi
  test %rsi, %rsi
  jz .Lthread_done                     /* no hook asked for */
  mov REMORA_X86_64_LOADER_HANDLE(%rbx), %rdi
  test %rdi, %rdi
  jz .Lthread_done                     /* nothing loaded */
  call *REMORA_X86_64_LOADER_DLSYM_FN(%rbx)
  test %rax, %rax
  jz .Lthread_done                     /* the library has no such function */
  mov REMORA_X86_64_LOADER_HOOK_ARG(%rbx), %rdi
  call *%rax
  movslq %eax, %rax
  mov %rax, REMORA_X86_64_LOADER_HOOK_RC(%rbx)
.Lthread_done:
  movq $1, REMORA_X86_64_LOADER_DONE(%rbx)  /* done: the trampoline's last store */
  xor %eax, %eax                       /* the thread's result: NULL */
  pop %rbx
  ret                                  /* into libc's thread exit */

  REMORA_AT(REMORA_X86_64_STUB_SIZE)
  .globl remora_x86_64_stub_end
  .hidden remora_x86_64_stub_end
remora_x86_64_stub_end:

  /* A stub needs no executable stack: without this note the linker would
   * ask for one in every binary that links it. */
  .section .note.GNU-stack, "", @progbits
