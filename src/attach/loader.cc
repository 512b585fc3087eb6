// The loader thread: a fresh thread of the target, started by one call of
// the stub's loader start routine on an application thread, that runs
// Remora's trampoline, which dlopen()s a library (or, for an unload,
// dlcloses the agent) and, for a first attach, may hand the agent its attach
// (LoaderAttach). Also the waits for a target's thread to be gone, and the
// driving of a thread of a stopped process under ptrace (attach.cc's file
// comment tells why a fresh thread).
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol.h"
#include "attach/internal.h"
#include "base/log.h"
#include "procfs/procfs.h"
#include "ptrace/ptrace.h"
#include "remote/remote_handle.h"
#include "remote/scratch.h"
#include "remote/target.h"

namespace remora::attach::detail {

namespace {

// The loader thread's hook (LoaderAttach, internal.h).
constexpr char kLoaderAttachFn[] = "remora_agent_loader_attach";

Result<pid_t> drive_to_exit(pid_t pid, pid_t tid, const Deadline& deadline);

// Finds the thread that appeared since `before`, seizes it and lets it run
// (resuming it from every group stop) until it exits. Used when the process
// is stopped, so that the loader thread alone runs.
Result<pid_t> drive_new_thread(pid_t pid, const std::vector<pid_t>& before, const Deadline& deadline) {
  pid_t tid = 0;
  while (tid == 0) {
    auto now = REMORA_TRY(procfs::list_tasks(pid));
    for (pid_t t : now)
      if (std::find(before.begin(), before.end(), t) == before.end()) tid = t;
    if (tid != 0) break;
    if (deadline.expired()) return Error(Errc::kTimedOut, "the loader thread did not appear");
    pause_briefly(20'000);
  }
  return drive_to_exit(pid, tid, deadline);
}

// Seizes thread `tid` of a stopped process and lets it alone run (resuming
// it from every group stop) until it exits; returns its tid.
Result<pid_t> drive_to_exit(pid_t pid, pid_t tid, const Deadline& deadline) {
  REMORA_TRY(ptrace::seize(pid, tid, 0));
  (void)ptrace::interrupt(tid);
  for (;;) {
    auto s = ptrace::wait_stop(tid, deadline);
    if (!s) {
      (void)ptrace::detach(tid, 0);
      return std::move(s).error();
    }
    if (s->kind == ptrace::Stop::Kind::kExited || s->kind == ptrace::Stop::Kind::kKilled) return tid;
    int sig = s->kind == ptrace::Stop::Kind::kSignalDelivery ? s->sig : 0;
    if (auto r = ptrace::cont(tid, sig); !r) {
      if (r.error().code() == Errc::kTargetExited) return tid;
      return std::move(r).error();
    }
  }
}

// The loader thread's own stack (start_loader_thread).
constexpr uint64_t kLoaderStackSize = 1024 * 1024;

// How many bytes hook_bytes makes: the request, the hook's name, the tool
// list and the environment, in that order.
size_t hook_size(const LoaderAttach& h) {
  return sizeof(remora_agent_loader_request) + sizeof kLoaderAttachFn + h.list.size() + 1 + h.env.size();
}

// The hook's request (agent/protocol.h), its strings and the tool list, as
// the bytes to place at `at` in the scratch; the block's hook fields name
// them. The ranges to retire: our scratch (`scratch`, its base), and the
// stack the loader start routine is asked to map at `stack_hint` (the agent
// takes it only if the thread runs on exactly it).
std::vector<std::byte> hook_bytes(LoaderRun& run, uint64_t at, uint64_t scratch, uint64_t stack_hint,
                                  bool own_stack) {
  const LoaderAttach& h = *run.hook;
  const size_t name_len = sizeof kLoaderAttachFn, list_len = h.list.size() + 1;
  remora_agent_loader_request req{};
  const uint64_t name_at = at + sizeof req, list_at = name_at + name_len, env_at = list_at + list_len;
  req.magic = REMORA_AGENT_LOADER_MAGIC;
  req.env_buffer = h.env.empty() ? 0 : env_at;
  req.env_size = h.env.size();
  req.tool_list = list_at;
  req.retire[0][0] = scratch;
  req.retire[0][1] = remote::kScratchSize;
  req.id = h.id;
  req.ack_timeout_ms = static_cast<uint64_t>(h.timeout.count());
  req.scratch_magic = remote::kScratchMagic;
  if (own_stack && stack_hint != 0) {
    req.retire[1][0] = stack_hint;
    req.retire[1][1] = kLoaderStackSize;
  }
  std::vector<std::byte> bytes(hook_size(h));
  std::byte* out = bytes.data();  // never null: hook_size is at least the request's
  std::memcpy(out, &req, sizeof req);
  std::memcpy(out + sizeof req, kLoaderAttachFn, name_len);
  std::memcpy(out + sizeof req + name_len, h.list.c_str(), list_len);
  if (!h.env.empty()) std::memcpy(out + sizeof req + name_len + list_len, h.env.data(), h.env.size());
  run.block.dlsym_fn = h.dlsym_fn.addr();
  run.block.hook_name = name_at;
  run.block.hook_arg = at;
  run.block.hook_rc = kHookNotRun;
  return bytes;
}

// Writes what the loader thread works on into the scratch, in one
// allocation and one write: its block (and, when `path` is given, that path
// right after it, which block.path then names; dlclose_agent's block names
// a handle), the pthread_t pthread_create stores, the hook's request, then
// the loader start routine's block and room for its pthread_attr_t (56 bytes
// on x86_64 and aarch64); returns the routine's call. The `prepare` of
// Target::call_prepared: for a first attach it runs within the transaction
// that creates the scratch.
Result<remote::Target::Prepared> write_loader(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                              std::string_view path) {
  auto align = [](uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); };
  const size_t path_len = path.empty() ? 0 : path.size() + 1;
  const uint64_t thread_off = align(sizeof run.block + path_len, 8);
  const uint64_t hook_off = align(thread_off + 8, 16);
  const uint64_t below = t.scratch_address().value_or(0);
  const uint64_t stack_hint = below > kLoaderStackSize ? below - kLoaderStackSize : 0;
  const bool own_stack =
      !run.stack_fns[0].null() && !run.stack_fns[1].null() && !fault_injected("libc-stack");
  const auto fn = REMORA_TRY(t.loader_start());
  const auto tramp = REMORA_TRY(t.thread_trampoline());
  // The hook's bytes name their own addresses: sized first, placed once the
  // allocation is known.
  const size_t hook_len = run.hook ? hook_size(*run.hook) : run.plain ? std::strlen(run.plain->name) + 1 : 0;
  const uint64_t start_off = align(hook_off + hook_len, 16);
  const uint64_t total = start_off + sizeof(x::LoaderStart) + 64;
  const uint64_t at = REMORA_TRY(t.scratch_alloc(total)).addr();
  std::vector<std::byte> image(total);
  run.block_at = at;
  if (!path.empty()) {
    run.block.path = at + sizeof run.block;
    std::memcpy(image.data() + sizeof run.block, path.data(), path.size());  // NUL: the image is zeroed
  }
  if (run.hook) {
    const auto hook = hook_bytes(run, at + hook_off, below, stack_hint, own_stack);
    std::memcpy(image.data() + hook_off, hook.data(), hook.size());
  } else if (run.plain) {
    std::memcpy(image.data() + hook_off, run.plain->name, hook_len);
    run.block.dlsym_fn = run.plain->dlsym_fn.addr();
    run.block.hook_name = at + hook_off;
    run.block.hook_arg = run.plain->arg;
    run.block.hook_rc = kHookNotRun;
  }
  std::memcpy(image.data(), &run.block, sizeof run.block);
  x::LoaderStart& ls = run.start;
  ls = x::LoaderStart{};
  ls.pthread_create_fn = pthread_create_fn.addr();
  if (own_stack) {
    ls.attr_init_fn = run.stack_fns[0].addr();
    ls.attr_setstack_fn = run.stack_fns[1].addr();
  }
  ls.stack_hint = stack_hint;
  ls.stack_size = kLoaderStackSize;
  ls.attr = at + start_off + sizeof ls;
  ls.thread_out = at + thread_off;
  ls.trampoline = tramp.addr();
  ls.block = run.block_at;
  ls.created = ~uint64_t{0};  // stays so unless pthread_create ran
  std::memcpy(image.data() + start_off, &ls, sizeof ls);
  REMORA_TRY(t.write(RemoteAddr(at), image));
  run.before = procfs::list_tasks(t.pid());
  REMORA_LOG(kAttach, "pid %d: loader block written", t.pid());
  run.start_at = at + start_off;
  return remote::Target::Prepared{fn, run.start_at};
}

// Starts the loader thread: one call of the stub's loader start routine
// (arch/loader_block.h), which maps the thread's own stack, names it in a
// pthread_attr_t and runs pthread_create of the trampoline on it. One marked
// call where the mmap, pthread_attr_init, pthread_attr_setstack and
// pthread_create were four remote calls (about 120 us of a 1.4 ms first
// attach; docs/benchmarks.md). In a process without our scratch yet, the
// scratch's creation and setup and this call are one transaction on one
// thread (Target::call_prepared): one seize, stop and release fewer.
//
// The stack (1 MiB, read-write) is ours, not glibc's: glibc keeps the stacks
// it allocates itself in its stack cache once their thread exits, a mapping
// that would outlive an unload. It is held by `stack` (removed by the handle
// once the thread is gone); without pthread_attr_setstack in this libc, or
// when the attr calls refuse, the thread runs on libc's own stack instead.
// The stack's address is asked for right below our scratch mapping: as a
// hint only, never MAP_FIXED, so it can never land on anything of the
// target's, and with the flags it always had (a seccomp filter that looks at
// mmap's flags, as Chromium's does, sees nothing new). When the kernel takes
// the hint, the stack and the scratch are one range: the agent's attach call
// removes the retired scratch anyway and takes the stack with it (see
// ensure_agent).
Result<void> start_loader_thread(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                 std::string_view path, remote::RemoteHandle* stack) {
  auto rc = t.call_prepared([&] { return write_loader(t, pthread_create_fn, run, path); });
  if (run.start_at == 0) {  // nothing was started: the scratch or the blocks could not be made
    if (!rc) return std::move(rc).error().with_context("start the loader thread");
    return Error(Errc::kInternal, "the loader start block was never written");
  }
  const x::LoaderStart& ls = run.start;
  x::LoaderStart out{};
  const bool have_out = t.read(RemoteAddr(run.start_at), std::as_writable_bytes(std::span(&out, 1))).ok();
  const auto stack_v = static_cast<int64_t>(out.stack);
  if (have_out && ls.attr_init_fn != 0 && out.stack != 0 && !(stack_v < 0 && stack_v > -4096)) {
    *stack =
        remote::RemoteHandle::mapping(t, remote::Target::Mapping{RemoteAddr(out.stack), kLoaderStackSize});
    // A thread may run on it (the call's end was lost after pthread_create):
    // leaking the stack is the lesser harm.
    if (!rc && out.created != ~uint64_t{0}) stack->release();
  }
  if (!rc) return std::move(rc).error().with_context("start the loader thread");
  if (!have_out) return Error(Errc::kIo, "the loader start block could not be read back from the target");
  // On exactly the stack the hook's request names: the agent removes it.
  run.hook_takes_stack = run.hook != nullptr && ls.attr_init_fn != 0 && out.attr_status == 0 &&
                         out.stack == ls.stack_hint && ls.stack_hint != 0;
  if (ls.attr_init_fn != 0 && stack_v < 0 && stack_v > -4096)
    return Error(Errc::kIo, "mmap of the loader thread's stack failed in the target",
                 static_cast<int>(-stack_v));
  if (out.created != 0)
    return Error(Errc::kIo, "pthread_create failed in the target", static_cast<int>(out.created));
  // (No pthread_attr_destroy: an attribute that names no CPU set holds nothing.)
  return ok();
}

}  // namespace

// Fills the loader block with libc's functions (before glibc 2.34, dlopen
// and dlerror live in libdl.so.2), with one read of the maps for libc's.
// Returns pthread_create, which the hijacked thread calls.
// `stack_fns` receives pthread_attr_init and pthread_attr_setstack (null
// before glibc 2.34, where they live in libpthread: the thread then gets a
// stack of libc's own).
Result<RemoteAddr> find_loader_functions(remote::Target& t, x::LoaderBlock* block,
                                         std::array<RemoteAddr, 2>* stack_fns) {
  const remote::Target::SymbolQuery libc_fns[] = {{"pthread_create", true, false},
                                                  {"pthread_self", true, false},
                                                  {"pthread_detach", true, false},
                                                  {"dlopen", true, false},
                                                  {"dlerror", true, false},
                                                  {"pthread_attr_init", true, false},
                                                  {"pthread_attr_setstack", true, false}};
  auto fns = REMORA_TRY(t.find_symbols("libc.so.6", libc_fns));
  *stack_fns = {fns[5], fns[6]};
  block->pthread_self_fn = fns[1].addr();
  block->pthread_detach_fn = fns[2].addr();
  block->dlopen_fn = fns[3].addr();
  block->dlerror_fn = fns[4].addr();
  if (fns[0].null() || fns[1].null() || fns[2].null()) {
    // Before glibc 2.34 the thread functions live in libpthread.so.0, which
    // a program that never started a thread may not have loaded.
    const remote::Target::SymbolQuery pthread_fns[] = {
        {"pthread_create"}, {"pthread_self"}, {"pthread_detach"}};
    auto pt = t.find_symbols("libpthread.so.0", pthread_fns);
    if (!pt)
      return Error(
          Errc::kNotSupported,
          "process " + std::to_string(t.pid()) +
              " has no pthread_create: its glibc is older than 2.34 and it has not loaded libpthread.so.0 "
              "(a program that never starts a thread); Remora needs to start a thread in it");
    fns[0] = (*pt)[0];
    block->pthread_self_fn = (*pt)[1].addr();
    block->pthread_detach_fn = (*pt)[2].addr();
  }
  if (fns[3].null() || fns[4].null()) {
    const remote::Target::SymbolQuery libdl_fns[] = {{"dlopen"}, {"dlerror"}};
    auto dl = t.find_symbols("libdl.so.2", libdl_fns);
    if (!dl)
      return Error(Errc::kNotSupported, "process " + std::to_string(t.pid()) +
                                            " has no dlopen (neither libc.so.6 nor libdl.so.2 provides it)");
    block->dlopen_fn = (*dl)[0].addr();
    block->dlerror_fn = (*dl)[1].addr();
  }
  // No RTLD_NODELETE: an unload (DetachOptions::unload) dlcloses the agent,
  // once no thread of the target can be in its code any more (unload_agent).
  // Nothing else ever closes this reference.
  block->flags = RTLD_NOW;
  return fns[0];
}

Result<RemoteAddr> find_dlsym(remote::Target& t) {
  const remote::Target::SymbolQuery q[] = {{"dlsym", true, false}};
  auto fns = REMORA_TRY(t.find_symbols("libc.so.6", q));
  if (!fns[0].null()) return fns[0];
  const remote::Target::SymbolQuery dq[] = {{"dlsym"}};  // before glibc 2.34
  return REMORA_TRY(t.find_symbols("libdl.so.2", dq))[0];
}

// Waits for the trampoline to finish (its last store to the block). A
// stopped process (SIGSTOP) stops the new thread too: it would never run.
// Then Remora drives that one thread itself under ptrace, leaving every
// other thread stopped, and releases it only once it has exited.
Result<void> wait_loader_done(remote::Target& t, LoaderRun& run, const Deadline& deadline) {
  long nap = 20'000;
  // Looking for a stopped loader thread costs two /proc reads and more:
  // done every half millisecond, not at every look at the block; first at
  // once in a process that was stopped when it was opened (its loader cannot
  // run), else after a millisecond (a running process's loader is mostly
  // done by then; one stopped since waits that long to be driven).
  auto next_stop_check =
      std::chrono::steady_clock::now() +
      (t.stopped_at_open() ? std::chrono::microseconds(0) : std::chrono::microseconds(1000));
  for (;;) {
    // A nap first: the thread was started a moment ago, and no dlopen or
    // dlclose is over that soon (a read of the block saved).
    pause_briefly(nap);
    nap = std::min<long>(nap + 20'000, 200'000);
    REMORA_TRY_CTX(t.read(RemoteAddr(run.block_at), std::as_writable_bytes(std::span(&run.block, 1))),
                   "read the loader block");
    if (run.block.done == 1) return ok();
    // Whether the process is stopped is only known for sure by watching the
    // new thread: a thread we just released may still be on its way back
    // into the group stop when /proc is read.
    if (!run.driven && run.before && std::chrono::steady_clock::now() >= next_stop_check) {
      next_stop_check = std::chrono::steady_clock::now() + std::chrono::microseconds(500);
      auto now = procfs::list_tasks(t.pid());
      pid_t fresh = 0;
      if (now)
        for (pid_t tid : *now)
          if (std::find(run.before->begin(), run.before->end(), tid) == run.before->end()) fresh = tid;
      auto st =
          fresh ? procfs::read_stat(t.pid(), fresh) : Result<procfs::Stat>(Error(Errc::kNoSuchProcess, ""));
      if (st && st->state == 'T') {
        run.loader =
            REMORA_TRY_CTX(drive_new_thread(t.pid(), *run.before, deadline), "run the loader thread");
        run.driven = true;
        continue;
      }
    }
    if (deadline.expired()) {
      t.abandon_scratch();  // the loader thread may still run there
      return Error(Errc::kTimedOut,
                   "the agent did not finish loading in time (a constructor in the target may be "
                   "blocked); the loader thread was left running");
    }
    // The agent's dlopen takes about a millisecond: look often, without
    // spinning (the nap at the top).
  }
}

// Runs Remora's thread trampoline on a fresh thread of the target, on
// `run.block` (its fields filled in by the caller; written into the scratch
// with `path`, see write_loader), and waits for the thread to have left our
// scratch code (and its stack) for good, unless the agent's listener took
// both (it waits for that itself). The thread's stack is then removed, or,
// with `stack_out`, handed to the caller (who removes it with the scratch:
// ensure_agent).
Result<void> run_trampoline_thread(remote::Target& t, RemoteAddr pthread_create_fn, LoaderRun& run,
                                   std::string_view path, const Deadline& deadline,
                                   remote::RemoteHandle* stack_out) {
  remote::RemoteHandle stack;
  REMORA_TRY(start_loader_thread(t, pthread_create_fn, run, path, &stack));
  REMORA_LOG(kAttach, "pid %d: loader thread created", t.pid());
  auto keep_stack = [&](Error e) {
    stack.release();  // the thread may still run on it: leaking it is the lesser harm
    return e;
  };
  if (auto done = wait_loader_done(t, run, deadline); !done) return keep_stack(std::move(done).error());
  REMORA_LOG(kAttach, "pid %d: loader thread's call returned", t.pid());
  // The hook took the attach and the stack: the agent's listener waits for
  // the thread to be gone before it attaches, and removes the stack and our
  // scratch after (finish_loader_attach waits for that). Nothing of ours
  // needs the thread gone before.
  if (run.hook != nullptr && run.block.hook_rc == 0 && run.hook_takes_stack) {
    stack.release();
    return ok();
  }
  // Else for its thread to leave the scratch code and its stack for good
  // (after `done` it still returns through both). The block has the tid the
  // target's pid namespace gave it.
  if (auto gone = detail::wait_target_thread_gone(t.pid(), run.block.tid, t.in_nested_pid_ns(), deadline);
      !gone) {
    t.abandon_scratch();
    return keep_stack(std::move(gone).error().with_context("wait for the agent's loader thread to exit"));
  }
  if (stack_out) {
    *stack_out = std::move(stack);
    return ok();
  }
  return stack.reset();
}

// Waits until thread `tid` of `pid` is gone; in a stopped process it could
// never run to its end, so Remora drives it there itself.
Result<void> wait_thread_gone(pid_t pid, pid_t tid, const Deadline& deadline) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  for (long nap = 20'000; tid != 0 && ::access(task.c_str(), F_OK) == 0;
       nap = std::min<long>(nap + 20'000, 200'000)) {
    auto st = procfs::read_stat(pid, tid);
    if (st && st->state == 'T') {
      REMORA_TRY(drive_to_exit(pid, tid, deadline));
      continue;
    }
    if (deadline.expired())
      return Error(Errc::kTimedOut, "thread " + std::to_string(tid) + " did not exit in time");
    pause_briefly(nap);
  }
  return ok();
}

pid_t tid_as_we_name_it(pid_t pid, pid_t tid, bool nested_pid_ns) {
  if (tid == 0 || !nested_pid_ns) return tid;
  auto ours = procfs::tid_from_target_ns(pid, tid);
  return ours ? *ours : 0;
}

Result<void> wait_target_thread_gone(pid_t pid, pid_t tid, bool nested_pid_ns, const Deadline& deadline) {
  return wait_thread_gone(pid, tid_as_we_name_it(pid, tid, nested_pid_ns), deadline);
}

}  // namespace remora::attach::detail
