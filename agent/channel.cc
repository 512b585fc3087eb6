// The socket channel, the agent's side (agent/channel_wire.h): attach where
// ptrace is not allowed, for a process that opted in at launch.
//
// The opt-in binds an abstract unix socket and installs a handler for the
// wake signal; it starts no thread (agent/protocol.h, LISTENER_ON_REQUEST:
// a thread started before main makes glibc abort programs that drop
// privileges). A controller connects, then sends the wake signal to a thread
// it chose; the handler judges the context it interrupted
// (arch/wake_rules.h): safe, it starts the channel thread right there;
// a wait that the signal made fail with EINTR, it re-issues the wait and
// starts the thread; anything else, it hands the wake on to another thread
// that is blocked in a call the kernel restarts. The channel thread serves
// the queued connections and leaves once none came for a while, so that a
// later credential change meets no thread of ours again.
#include "agent/channel.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/ucontext.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent/channel_wire.h"
#include "arch/wake_rules.h"

namespace remora_agent {
namespace {

namespace w = remora::arch::wake;

int g_listen_fd = -1;
int g_signo = 0;
// 0: no channel thread; 1: one is starting or serving.
uint32_t g_thread_state = 0;
// Forwards of the current wake (a wake from outside resets it).
uint32_t g_hops = 0;
constexpr uint32_t kMaxHops = 16;
// How long the channel thread waits for the next connection before it goes.
constexpr int kIdleMs = 500;
// How long one connection may take to send its request.
constexpr int kRequestTimeoutMs = 2000;

constexpr int kMaxAllowed = 16;
uid_t g_allowed[kMaxAllowed];
int g_allowed_count = 0;

// Executable ranges recorded at opt-in: every object's (code may be read
// there from the handler), and the program's own (its interruption holds
// no lock pthread_create takes; see record_ranges).
struct Range {
  uintptr_t start, end;
};
constexpr int kMaxRanges = 128;
Range g_code[kMaxRanges];
int g_code_count = 0;
Range g_program[kMaxRanges];
int g_program_count = 0;

bool in_ranges(const Range* r, int n, uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < n; ++i)
    if (lo >= r[i].start && hi <= r[i].end) return true;
  return false;
}

// ---- the opt-in ----

bool opted_in() {
  const char* a = getenv("REMORA_TOOL_ATTACH");
  const char* b = getenv("ROCP_TOOL_ATTACH");
  return (a && strcmp(a, "1") == 0) || (b && strcmp(b, "1") == 0);
}

void parse_allowed() {
  g_allowed_count = 0;
  const char* s = getenv("REMORA_ATTACH_UIDS");
  while (s != nullptr && *s != '\0' && g_allowed_count < kMaxAllowed) {
    char* end = nullptr;
    const unsigned long v = strtoul(s, &end, 10);
    if (end == s) break;
    g_allowed[g_allowed_count++] = static_cast<uid_t>(v);
    s = *end == ',' ? end + 1 : end;
    if (*end != ',') break;
  }
}

// Objects whose code may hold a lock that pthread_create takes while it
// runs, or that run inside such a lock: glibc, the dynamic loader, the
// unwinder, the vDSO, and the agent itself; the object that defines malloc
// is added when it is not libc (an allocator of the program's).
bool system_object(const char* name) {
  const char* base = strrchr(name, '/');
  base = base ? base + 1 : name;
  static const char* const kPrefixes[] = {"libc.so",       "ld-linux",   "ld64.so",
                                          "libpthread.so", "libdl.so",   "librt.so",
                                          "libgcc_s.so",   "linux-vdso", "linux-gate"};
  for (const char* p : kPrefixes)
    if (strncmp(base, p, strlen(p)) == 0) return true;
  return false;
}

struct RecordState {
  uintptr_t agent_base, malloc_base;
};

int record_object(dl_phdr_info* info, size_t, void* data) {
  const auto* st = static_cast<const RecordState*>(data);
  const char* name = info->dlpi_name ? info->dlpi_name : "";
  const bool program = !system_object(name) && info->dlpi_addr != st->agent_base &&
                       info->dlpi_addr != st->malloc_base &&
                       !(name[0] == '\0' && info->dlpi_addr != 0 && info->dlpi_phnum == 0);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0) continue;
    const Range r{info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz};
    if (g_code_count < kMaxRanges) g_code[g_code_count++] = r;
    if (program && g_program_count < kMaxRanges) g_program[g_program_count++] = r;
  }
  return 0;
}

void record_ranges() {
  RecordState st{0, 0};
  Dl_info di{};
  if (dladdr(reinterpret_cast<void*>(&record_ranges), &di) != 0)
    st.agent_base = reinterpret_cast<uintptr_t>(di.dli_fbase);
  void* m = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info mi{};
  if (m != nullptr && dladdr(m, &mi) != 0) st.malloc_base = reinterpret_cast<uintptr_t>(mi.dli_fbase);
  g_code_count = g_program_count = 0;
  dl_iterate_phdr(record_object, &st);
}

// A real-time signal nobody handles yet: the highest free one at or below
// SIGRTMAX - 4, unless REMORA_WAKE_SIGNAL names one.
int choose_signal() {
  if (const char* s = getenv("REMORA_WAKE_SIGNAL"); s != nullptr && *s != '\0') {
    const int v = atoi(s);
    return v >= SIGRTMIN && v <= SIGRTMAX ? v : 0;
  }
  for (int sig = SIGRTMAX - 4; sig >= SIGRTMIN + 2; --sig) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_DFL && (old.sa_flags & SA_SIGINFO) == 0)
      return sig;
  }
  return 0;
}

// Text without libc's formatting (which is not async-signal-safe): the
// handler and the fork child use these. Each returns the new end, never
// past `end` (which stays for a NUL).
char* put_str(char* p, char* end, const char* s) {
  while (*s != '\0' && p < end) *p++ = *s++;
  return p;
}
char* put_uint(char* p, char* end, unsigned long v) {
  char digits[24];
  int n = 0;
  do digits[n++] = static_cast<char>('0' + v % 10);
  while ((v /= 10) != 0);
  while (n > 0 && p < end) *p++ = digits[--n];
  return p;
}
unsigned long parse_uint(const char* s, int base) {
  unsigned long v = 0;
  for (;; ++s) {
    int d;
    if (*s >= '0' && *s <= '9')
      d = *s - '0';
    else if (base == 16 && *s >= 'a' && *s <= 'f')
      d = *s - 'a' + 10;
    else
      return v;
    v = v * static_cast<unsigned long>(base) + static_cast<unsigned long>(d);
  }
}
// "/proc/self/task/<tid>/<leaf>"
void task_path(char* out, size_t size, pid_t tid, const char* leaf) {
  char* end = out + size - 1;
  char* p = put_str(out, end, "/proc/self/task/");
  p = put_uint(p, end, static_cast<unsigned long>(tid));
  p = put_str(p, end, "/");
  p = put_str(p, end, leaf);
  *p = '\0';
}

// Binds "\0remora-agent.<pid>.<signo>" and listens (no thread). Runs in a
// fork's child too: no libc formatting.
int bind_socket(int signo) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  char* const start = addr.sun_path + 1;
  char* const end = addr.sun_path + sizeof addr.sun_path - 1;
  char* p = put_str(start, end, REMORA_CHANNEL_NAME_PREFIX);
  p = put_uint(p, end, static_cast<unsigned long>(getpid()));
  p = put_str(p, end, ".");
  p = put_uint(p, end, static_cast<unsigned long>(signo));
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + (p - start));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// ---- the wake handler (async-signal-safe from here to wake_handler) ----

void* channel_main(void*);

void start_thread_here() {
  uint32_t idle = 0;
  if (!__atomic_compare_exchange_n(&g_thread_state, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;  // one is running
  // Every signal is blocked in this handler (sa_mask): the thread inherits that.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t t;
  if (pthread_create(&t, &attr, channel_main, nullptr) != 0)
    __atomic_store_n(&g_thread_state, 0, __ATOMIC_RELEASE);
  pthread_attr_destroy(&attr);
}

// Reads a small /proc file with raw calls; returns its length (-1: none).
int read_small(const char* path, char* buf, int size) {
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t n = read(fd, buf, static_cast<size_t>(size - 1));
  close(fd);
  if (n < 0) return -1;
  buf[n] = '\0';
  return static_cast<int>(n);
}

// Does thread `tid` block our signal (its SigBlk)?
bool blocks_signal(pid_t tid) {
  char path[64], buf[2048];
  task_path(path, sizeof path, tid, "status");
  const int len = read_small(path, buf, sizeof buf);
  if (len < 0) return true;
  const char* p = static_cast<const char*>(memmem(buf, static_cast<size_t>(len), "SigBlk:", 7));
  if (p == nullptr) return true;
  p += 7;
  while (*p == '\t' || *p == ' ') ++p;
  const unsigned long mask = parse_uint(p, 16);
  return ((mask >> (g_signo - 1)) & 1) != 0;
}

// Hands the wake to a thread blocked in a call the kernel restarts after a
// handler (arch/wake_rules.h, restartable_wait), or else to a running one
// (its handler judges again). Returns false when there is none.
bool forward_wake(pid_t self) {
  if (__atomic_add_fetch(&g_hops, 1, __ATOMIC_ACQ_REL) > kMaxHops) return false;
  const int dfd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return false;
  alignas(8) char ents[4096];
  pid_t running = 0;
  pid_t chosen = 0;
  for (;;) {
    const long n = syscall(SYS_getdents64, dfd, ents, sizeof ents);
    if (n <= 0) break;
    for (long off = 0; off < n && chosen == 0;) {
      const auto* d = reinterpret_cast<const dirent64*>(ents + off);
      off += d->d_reclen;
      const pid_t tid = static_cast<pid_t>(parse_uint(d->d_name, 10));
      if (tid <= 0 || tid == self) continue;
      char path[64], line[256];
      task_path(path, sizeof path, tid, "syscall");
      const int len = read_small(path, line, sizeof line);
      if (len <= 0) continue;
      const w::SyscallLine sc = w::parse_syscall_line(line, len);
      if (!sc.ok) continue;
      const bool good = !sc.running && w::restartable_wait(w::kHostArch, sc.nr, sc.args);
      if ((good || (sc.running && running == 0)) && !blocks_signal(tid)) {
        if (good)
          chosen = tid;
        else
          running = tid;
      }
    }
    if (chosen != 0) break;
  }
  close(dfd);
  if (chosen == 0) chosen = running;
  if (chosen == 0) return false;
  return syscall(SYS_tgkill, getpid(), chosen, g_signo) == 0;
}

// Is the interrupted code inside a handler of the program's? Its mask
// blocks a signal that has one (a handler's own signal is blocked while it
// runs, unless SA_NODEFER).
bool in_program_handler(const sigset_t* mask) {
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == g_signo || sig == SIGKILL || sig == SIGSTOP || sigismember(mask, sig) != 1) continue;
    struct sigaction sa {};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    if ((sa.sa_flags & SA_SIGINFO) != 0 || (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN))
      return true;
  }
  return false;
}

w::Context read_context(const ucontext_t* uc) {
  w::Context c{};
  w::read_registers(uc, &c);
  const uintptr_t pc = static_cast<uintptr_t>(c.pc);
  c.has_code = pc >= 16 && in_ranges(g_code, g_code_count, pc - 16, pc + 4);
  if (c.has_code) {
    memcpy(c.before, reinterpret_cast<const void*>(pc - 16), 16);
    memcpy(c.at, reinterpret_cast<const void*>(pc), 4);
  }
  c.pc_in_program = in_ranges(g_program, g_program_count, pc, pc + 1);
  c.in_program_handler = in_program_handler(&uc->uc_sigmask);
  return c;
}

void wake_handler(int, siginfo_t* si, void* ucv) {
  const int saved_errno = errno;
  auto* uc = static_cast<ucontext_t*>(ucv);
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  const pid_t pid = getpid();
  // A wake from outside starts a new round of forwards; ours continue one.
  if (!(si->si_code == SI_TKILL && si->si_pid == pid)) __atomic_store_n(&g_hops, 0, __ATOMIC_RELEASE);
  const w::Context c = read_context(uc);
  long nr = -1;
  const w::Verdict v = w::judge(c, &nr);
  // An interrupted wait is re-issued whatever else happens: the signal
  // has made it fail already.
  if (v == w::Verdict::kRepairAndStart) w::apply_repair(uc, c, nr);
  if (__atomic_load_n(&g_thread_state, __ATOMIC_ACQUIRE) == 0 && g_listen_fd >= 0) {
    if (v == w::Verdict::kForward) {
      (void)forward_wake(self);
    } else {
      start_thread_here();
    }
  }
  errno = saved_errno;
}

// ---- the channel thread ----

bool uid_allowed(uid_t uid) {
  if (uid == 0 || uid == getuid() || uid == geteuid()) return true;
  for (int i = 0; i < g_allowed_count; ++i)
    if (g_allowed[i] == uid) return true;
  return false;
}

struct Request {
  remora_channel_request head;
  int fds[REMORA_CHANNEL_FDS_MAX];
  int fd_count;
  char env[REMORA_CHANNEL_ENV_MAX];
  char tools[REMORA_CHANNEL_TOOLS_MAX];
  char list[REMORA_CHANNEL_TOOLS_MAX];  // the tool list as dlopen names (fds as /proc/self/fd/N)
  bool lease_taken;                     // fds[0] is the agent's now
  int fd_received;                      // every descriptor that came, those closed included
};

struct Reply {
  remora_channel_reply r;
};

void reply_error(Reply* out, int result, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void reply_error(Reply* out, int result, const char* fmt, ...) {
  out->r.result = result;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out->r.message, sizeof out->r.message, fmt, ap);
  va_end(ap);
}

// The request's deadline (CLOCK_MONOTONIC, ms): a client has
// kRequestTimeoutMs for all of it, however it trickles in.
uint64_t g_request_deadline = 0;

uint64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000u + static_cast<uint64_t>(ts.tv_nsec) / 1000000u;
}

// Waits for bytes until the request's deadline.
bool readable_in_time(int fd) {
  for (;;) {
    const uint64_t now = now_ms();
    if (now >= g_request_deadline) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(g_request_deadline - now));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// Reads exactly `size` bytes before the request's deadline.
bool read_exact(int fd, void* buf, size_t size) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    if (!readable_in_time(fd)) return false;
    const ssize_t n = recv(fd, p, size, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The header and the descriptors that came with it.
bool read_head(int conn, Request* req, Reply* out) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * REMORA_CHANNEL_FDS_MAX)];
  iovec iov{&req->head, sizeof req->head};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = -1;
  while (readable_in_time(conn)) {
    n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n >= 0 || (errno != EINTR && errno != EAGAIN)) break;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      ++req->fd_received;
      if (req->fd_count < static_cast<int>(REMORA_CHANNEL_FDS_MAX))
        req->fds[req->fd_count++] = fd;
      else
        close(fd);
    }
  }
  if (n <= 0) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "no request came");
    return false;
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || req->fd_received > static_cast<int>(REMORA_CHANNEL_FDS_MAX)) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "more than %u descriptors sent", REMORA_CHANNEL_FDS_MAX);
    return false;
  }
  if (static_cast<size_t>(n) < sizeof req->head &&
      !read_exact(conn, reinterpret_cast<char*>(&req->head) + n, sizeof req->head - static_cast<size_t>(n))) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "the request header was cut short");
    return false;
  }
  return true;
}

// The environment buffer: a count, then exactly that many NAME\0VALUE\0
// pairs, filling the buffer.
bool valid_env(const char* buf, uint32_t size, Reply* out) {
  if (size == 0) return true;
  uint32_t count;
  if (size < sizeof count) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "the environment buffer is shorter than its count");
    return false;
  }
  memcpy(&count, buf, sizeof count);
  uint32_t at = sizeof count;
  for (uint32_t i = 0; i < count; ++i) {
    for (int part = 0; part < 2; ++part) {
      const void* nul = at < size ? memchr(buf + at, '\0', size - at) : nullptr;
      if (nul == nullptr) {
        reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "environment pair %u runs past the buffer", i);
        return false;
      }
      const uint32_t len = static_cast<uint32_t>(static_cast<const char*>(nul) - (buf + at));
      if (part == 0 && (len == 0 || memchr(buf + at, '=', len) != nullptr)) {
        reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "environment pair %u has an invalid name", i);
        return false;
      }
      at += len + 1;
    }
  }
  if (at != size) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "the environment buffer has %u bytes after its %u pairs",
                size - at, count);
    return false;
  }
  return true;
}

// The tool list, with each NAME|#K made NAME|/proc/self/fd/<descriptor K>.
bool build_list(Request* req, Reply* out) {
  const uint32_t size = req->head.tools_size;
  req->list[0] = '\0';
  if (size == 0) return true;
  if (req->tools[size - 1] != '\0' || memchr(req->tools, '\0', size - 1) != nullptr) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "the tool list is not one NUL-terminated string");
    return false;
  }
  size_t used = 0;
  const char* p = req->tools;
  const int first_tool_fd = (req->head.flags & REMORA_CHANNEL_FLAG_LEASE) != 0 ? 1 : 0;
  for (int entry = 0;; ++entry) {
    const char* end = strchr(p, ':');
    const size_t len = end ? static_cast<size_t>(end - p) : strlen(p);
    const char* bar = static_cast<const char*>(memchr(p, '|', len));
    if (len == 0 || bar == p || (bar && bar + 1 == p + len) || entry >= 16) {
      reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "tool list entry %d is empty or malformed", entry);
      return false;
    }
    char piece[1100];
    if (bar != nullptr && bar[1] == '#') {
      char* stop = nullptr;
      const bool digit = bar[2] >= '0' && bar[2] <= '9';
      const long k = digit ? strtol(bar + 2, &stop, 10) : -1;
      const int index =
          k >= 0 && k < static_cast<long>(REMORA_CHANNEL_FDS_MAX) ? first_tool_fd + static_cast<int>(k) : -1;
      if (!digit || stop != p + len || index < 0 || index >= req->fd_count) {
        reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "tool list entry %d names descriptor %.16s, not sent",
                    entry, bar + 1);
        return false;
      }
      snprintf(piece, sizeof piece, "%.*s|/proc/self/fd/%d", static_cast<int>(bar - p), p, req->fds[index]);
    } else {
      if (len >= 1024) {
        reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "tool list entry %d is longer than 1023 bytes",
                    entry);
        return false;
      }
      snprintf(piece, sizeof piece, "%.*s", static_cast<int>(len), p);
    }
    const size_t plen = strlen(piece);
    if (used + plen + 2 > sizeof req->list) {
      reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "the tool list is longer than %zu bytes",
                  sizeof req->list);
      return false;
    }
    if (used != 0) req->list[used++] = ':';
    memcpy(req->list + used, piece, plen + 1);
    used += plen;
    if (end == nullptr) break;
    p = end + 1;
  }
  return true;
}

bool read_request(int conn, Request* req, Reply* out) {
  if (!read_head(conn, req, out)) return false;
  const remora_channel_request& h = req->head;
  if (h.magic != REMORA_CHANNEL_MAGIC || h.version != REMORA_CHANNEL_VERSION) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "not a Remora channel request of version %u",
                REMORA_CHANNEL_VERSION);
    return false;
  }
  if (h.op != REMORA_CHANNEL_OP_STATUS && h.op != REMORA_CHANNEL_OP_ATTACH &&
      h.op != REMORA_CHANNEL_OP_DETACH) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "unknown request %u", h.op);
    return false;
  }
  if (h.env_size > REMORA_CHANNEL_ENV_MAX || h.tools_size > REMORA_CHANNEL_TOOLS_MAX ||
      h.fd_count != static_cast<uint32_t>(req->fd_received) || (h.flags & ~REMORA_CHANNEL_FLAG_LEASE) != 0) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT,
                "request sizes out of bounds (environment %u of %u, tools %u of %u, %u descriptors named, %d "
                "sent, flags %#x)",
                h.env_size, REMORA_CHANNEL_ENV_MAX, h.tools_size, REMORA_CHANNEL_TOOLS_MAX, h.fd_count,
                req->fd_received, h.flags);
    return false;
  }
  if (!read_exact(conn, req->env, h.env_size) || !read_exact(conn, req->tools, h.tools_size)) {
    reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT, "the request was cut short");
    return false;
  }
  if (!valid_env(req->env, h.env_size, out) || !build_list(req, out)) return false;
  if ((h.flags & REMORA_CHANNEL_FLAG_LEASE) != 0) {
    struct stat st {};
    if (h.op != REMORA_CHANNEL_OP_ATTACH || req->fd_count < 1 || fstat(req->fds[0], &st) != 0 ||
        !S_ISFIFO(st.st_mode) || (fcntl(req->fds[0], F_GETFL) & O_ACCMODE) != O_RDONLY) {
      reply_error(out, REMORA_AGENT_ERR_BAD_ARGUMENT,
                  "a lease must come as a pipe's read end with an attach");
      return false;
    }
  }
  return true;
}

void run_request(Request* req, int32_t peer_pid, Reply* out) {
  const remora_channel_request& h = req->head;
  const void* env = h.env_size != 0 ? req->env : nullptr;
  int rc = REMORA_AGENT_OK;
  if (h.op == REMORA_CHANNEL_OP_ATTACH && (h.flags & REMORA_CHANNEL_FLAG_LEASE) != 0) {
    req->lease_taken = true;  // the agent owns it from the call on, whatever it returns
    rc = remora_agent_attach_leased(env, req->list, nullptr, 0, req->fds[0], peer_pid);
  } else if (h.op == REMORA_CHANNEL_OP_ATTACH) {
    rc = remora_agent_attach(env, req->list);
  } else if (h.op == REMORA_CHANNEL_OP_DETACH) {
    rc = remora_agent_detach();
  }
  if (h.op == REMORA_CHANNEL_OP_ATTACH && rc == REMORA_AGENT_OK)
    __atomic_store_n(&remora_agent_info.session_channel, 1, __ATOMIC_RELEASE);
  out->r.result = rc;
}

void fill_reply(Reply* out, uid_t peer_uid) {
  static struct remora_agent_info info;  // the channel thread's only
  snapshot_info(&info);
  remora_channel_reply& r = out->r;
  r.magic = REMORA_CHANNEL_MAGIC;
  r.version = REMORA_CHANNEL_VERSION;
  r.attached = info.attached;
  r.sessions = info.sessions;
  r.detaches = info.detaches;
  r.lease_pid = info.lease_pid;
  r.lease_expired = info.lease_expired;
  r.pid = static_cast<int32_t>(getpid());
  r.peer_uid = peer_uid;
  r.forked_from = info.forked_from;
  r.listener_tid = info.listener_tid;
  r.session_channel = info.session_channel;
  memcpy(r.tools, info.tools, sizeof r.tools);
  if (r.result != REMORA_AGENT_OK && r.message[0] == '\0') memcpy(r.message, info.message, sizeof r.message);
}

void serve(int conn) {
  static Request req;  // the channel thread's only
  static Reply out;
  memset(&req.head, 0, sizeof req.head);
  req.fd_count = 0;
  req.fd_received = 0;
  req.lease_taken = false;
  memset(&out, 0, sizeof out);
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  g_request_deadline = now_ms() + kRequestTimeoutMs;
  timeval tv{kRequestTimeoutMs / 1000, (kRequestTimeoutMs % 1000) * 1000};
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) return;
  if (!uid_allowed(cred.uid)) {
    char allowed[160] = "";
    size_t used = 0;
    for (int i = 0; i < g_allowed_count && used + 12 < sizeof allowed; ++i)
      used += static_cast<size_t>(snprintf(allowed + used, sizeof allowed - used, "%s%u", i ? "," : "",
                                           static_cast<unsigned>(g_allowed[i])));
    reply_error(
        &out, REMORA_AGENT_ERR_REFUSED,
        "uid %u may not attach to process %d (uid %u): its socket channel admits root, its own uid%s%s; "
        "start it with REMORA_ATTACH_UIDS=%u (comma-separated) to admit that uid",
        static_cast<unsigned>(cred.uid), static_cast<int>(getpid()), static_cast<unsigned>(getuid()),
        g_allowed_count ? " and REMORA_ATTACH_UIDS=" : "", allowed, static_cast<unsigned>(cred.uid));
  } else if (read_request(conn, &req, &out)) {
    // The lease's holder as this process names it; a controller in a pid
    // namespace it cannot see (the host's, for a container) is named by
    // the pid it gave.
    run_request(&req, cred.pid != 0 ? cred.pid : req.head.controller_pid, &out);
  }
  fill_reply(&out, cred.uid);
  const char* p = reinterpret_cast<const char*>(&out.r);
  size_t left = sizeof out.r;
  while (left > 0) {
    const ssize_t n = send(conn, p, left, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
  for (int i = req.lease_taken ? 1 : 0; i < req.fd_count; ++i) close(req.fds[i]);
}

void* channel_main(void*) {
  pthread_setname_np(pthread_self(), REMORA_CHANNEL_THREAD_NAME);
  for (;;) {
    pollfd p{g_listen_fd, POLLIN, 0};
    const int n = poll(&p, 1, kIdleMs);
    if (n == 0) {
      // Idle: go, unless a connection came in between (its controller saw
      // this thread and sent no wake).
      __atomic_store_n(&g_thread_state, 0, __ATOMIC_RELEASE);
      pollfd again{g_listen_fd, POLLIN, 0};
      uint32_t idle = 0;
      if (poll(&again, 1, 0) > 0 &&
          __atomic_compare_exchange_n(&g_thread_state, &idle, 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;
      return nullptr;
    }
    if (n < 0) continue;
    const int conn = accept4(g_listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    serve(conn);
    close(conn);
  }
}

// The wake signal's disposition before ours, put back by channel_fini.
struct sigaction g_old_wake_action;
bool g_wake_installed = false;

void install_handler(int signo) {
  struct sigaction sa {};
  sa.sa_sigaction = wake_handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&sa.sa_mask);
  g_wake_installed = sigaction(signo, &sa, &g_old_wake_action) == 0;
}

}  // namespace

void channel_init() {
  if (!opted_in()) return;
  g_signo = choose_signal();
  if (g_signo == 0) return;
  parse_allowed();
  record_ranges();
  g_listen_fd = bind_socket(g_signo);
  if (g_listen_fd < 0) return;
  install_handler(g_signo);
}

void channel_after_fork() {
  __atomic_store_n(&g_thread_state, 0, __ATOMIC_RELEASE);  // the parent's thread did not come along
  if (g_listen_fd < 0) return;
  close(g_listen_fd);  // the parent's name
  g_listen_fd = bind_socket(g_signo);
}

bool channel_open() { return g_signo != 0 && g_listen_fd >= 0; }

void channel_fini() {
  if (g_signo == 0) return;
  if (g_listen_fd >= 0) close(g_listen_fd);
  g_listen_fd = -1;
  if (!g_wake_installed) return;  // the socket was never bound: the disposition is the process's own
  // SIG_IGN first discards a wake still pending in any thread (POSIX); then
  // the disposition the process had.
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  sigaction(g_signo, &sa, nullptr);
  sigaction(g_signo, &g_old_wake_action, nullptr);
  g_wake_installed = false;
}

}  // namespace remora_agent
