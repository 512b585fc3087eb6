#include "unwind.h"

// The generic (remote-capable) libunwind: no UNW_LOCAL_ONLY, so the names
// are the host architecture's _U<arch>_* (_Ux86_64_*, _Uaarch64_*); its
// local-only twin (_UL<arch>_*) cannot create an address space with our
// accessors. Registers are named by libunwind's numbers, which
// arch/sample_regs.h gives for each sample register.
#include <errno.h>
#include <fcntl.h>
#include <libunwind.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "own_memory.h"

namespace remora_tool {

namespace {

namespace arch = remora::arch;

// The seam's numbers are libunwind's: its generic names for the pc and the
// sp must be the registers the seam says.
static_assert(UNW_REG_IP == arch::kUnwindRegReturnAddress, "arch/sample_regs.h: libunwind's UNW_REG_IP");
static_assert(UNW_REG_SP == arch::kSampleUnwindRegs[kRegSp], "arch/sample_regs.h: libunwind's UNW_REG_SP");

uint64_t parse_hex(std::string_view& s, bool* ok) {
  uint64_t v = 0;
  size_t i = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) break;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  if (i == 0) *ok = false;
  s.remove_prefix(i);
  return v;
}

std::string_view next_field(std::string_view& s) {
  size_t b = s.find_first_not_of(' ');
  if (b == std::string_view::npos) {
    s = {};
    return {};
  }
  s.remove_prefix(b);
  size_t e = s.find(' ');
  std::string_view f = s.substr(0, e);
  s.remove_prefix(e == std::string_view::npos ? s.size() : e);
  return f;
}

bool parse_line(std::string_view line, Mapping* m) {
  bool ok = true;
  std::string_view range = next_field(line);
  m->start = parse_hex(range, &ok);
  if (!ok || range.empty() || range[0] != '-') return false;
  range.remove_prefix(1);
  m->end = parse_hex(range, &ok);
  std::string_view perms = next_field(line);
  if (!ok || !range.empty() || perms.size() != 4 || m->end <= m->start) return false;
  m->read = perms[0] == 'r';
  m->write = perms[1] == 'w';
  m->exec = perms[2] == 'x';
  m->shared = perms[3] == 's';
  next_field(line);  // offset
  next_field(line);  // device
  std::string_view inode = next_field(line);
  if (inode.empty()) return false;
  size_t b = line.find_first_not_of(' ');
  std::string_view path = b == std::string_view::npos ? std::string_view() : line.substr(b);
  m->file = inode != "0" && !path.empty() && path[0] == '/';
  m->stack = path == "[stack]";
  m->vdso = path == "[vdso]";
  return true;
}

// The accessors' view of one sample: its capture, and the registers of the
// frame being unwound (changed by a frame-pointer step).
struct Ctx {
  const SampleRec* rec;
  const MapsSnapshot* maps;
  Unwinder::PageCache* pages;
  uint64_t regs[kNumRegs];
};

// A word of an image, through the page cache.
bool read_image_word(Ctx& c, uint64_t addr, unw_word_t* val) {
  uint64_t page = addr & ~uint64_t{4095};
  uint32_t off = static_cast<uint32_t>(addr - page);
  if (off + sizeof *val > 4096 || c.pages == nullptr)
    return own_memory_read(val, addr, sizeof *val) == sizeof *val;
  uint32_t slot = static_cast<uint32_t>((page >> 12) % Unwinder::PageCache::kPages);
  if (c.pages->page[slot] != page) {
    // Mappings are page-aligned: the page of a readable image address lies
    // in that image.
    c.pages->len[slot] = static_cast<uint32_t>(own_memory_read(c.pages->data[slot], page, 4096));
    c.pages->page[slot] = page;
  }
  if (off + sizeof *val > c.pages->len[slot]) return false;
  memcpy(val, c.pages->data[slot] + off, sizeof *val);
  return true;
}

int access_mem(unw_addr_space_t, unw_word_t addr, unw_word_t* val, int write, void* arg) {
  if (write) return -UNW_EINVAL;
  auto* c = static_cast<Ctx*>(arg);
  uint64_t base = c->rec->regs[kRegSp], len = c->rec->stack_len;
  if (addr >= base && addr - base <= len && len - (addr - base) >= sizeof *val) {
    memcpy(val, c->rec->stack + (addr - base), sizeof *val);
    return 0;
  }
  if (c->maps->readable_image(addr, sizeof *val) && read_image_word(*c, addr, val)) return 0;
  return -UNW_EINVAL;
}

// The sample's index of libunwind's register `reg`, -1 when not captured.
int reg_index(unw_regnum_t reg) {
  for (uint32_t i = 0; i < kNumRegs; ++i)
    if (arch::kSampleUnwindRegs[i] == reg) return static_cast<int>(i);
  return -1;
}

int access_reg(unw_addr_space_t, unw_regnum_t reg, unw_word_t* val, int write, void* arg) {
  int i = reg_index(reg);
  // Caller-saved registers were not captured: a CFI rule that needs one
  // ends the unwind there.
  if (i < 0 || write) return -UNW_EBADREG;
  *val = static_cast<Ctx*>(arg)->regs[i];
  return 0;
}

int access_fpreg(unw_addr_space_t, unw_regnum_t, unw_fpreg_t*, int, void*) { return -UNW_EBADREG; }
int resume(unw_addr_space_t, unw_cursor_t*, void*) { return -UNW_EINVAL; }
int get_proc_name(unw_addr_space_t, unw_word_t, char*, size_t, unw_word_t*, void*) { return -UNW_ENOINFO; }
// The list of dynamically registered unwind info (_U_dyn_register) would be
// read through live pointers: not used.
int get_dyn_info_list_addr(unw_addr_space_t, unw_word_t*, void*) { return -UNW_ENOINFO; }

}  // namespace

std::vector<Mapping> parse_maps(std::string_view text) {
  std::vector<Mapping> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    Mapping m;
    if (parse_line(line, &m)) out.push_back(m);
  }
  std::sort(out.begin(), out.end(), [](const Mapping& a, const Mapping& b) { return a.start < b.start; });
  return out;
}

bool MapsSnapshot::refresh() {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string text;
  char buf[16384];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(fd);
  if (n < 0 || text.empty()) return false;
  if (text == text_) return true;
  text_ = std::move(text);
  maps_ = parse_maps(text_);
  ++version_;
  return true;
}

const Mapping* MapsSnapshot::find(uint64_t addr) const {
  auto it = std::upper_bound(maps_.begin(), maps_.end(), addr,
                             [](uint64_t a, const Mapping& m) { return a < m.start; });
  if (it == maps_.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

bool MapsSnapshot::readable_image(uint64_t addr, uint64_t len) const {
  const Mapping* m = find(addr);
  return m != nullptr && m->read && (m->file || m->vdso) && len <= m->end - addr;
}

bool MapsSnapshot::executable(uint64_t addr) const {
  const Mapping* m = find(addr);
  return m != nullptr && m->exec;
}

bool MapsSnapshot::stack_bounds(uint64_t sp, uint64_t* lo, uint64_t* hi) const {
  const Mapping* m = find(sp);
  if (m == nullptr || !m->read || !m->write || m->shared || m->file) return false;
  *lo = m->start;
  *hi = m->end;
  if (m->stack) {
    // The main thread's stack grows down below the start we see now, up to
    // RLIMIT_STACK: every sp in that range is on this stack.
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < m->end &&
        m->end - rl.rlim_cur < m->start)
      *lo = m->end - rl.rlim_cur;
  }
  return true;
}

const Mapping* MapsSnapshot::main_stack() const {
  for (const Mapping& m : maps_)
    if (m.stack) return &m;
  return nullptr;
}

Unwinder::Unwinder() {
  unw_accessors_t acc;
  memset(&acc, 0, sizeof acc);
  // Unwind tables: libunwind's own lookup for the loaded objects
  // (dl_iterate_phdr, then a binary search of .eh_frame_hdr), which reads
  // the tables through the address space it is given, i.e. access_mem.
  unw_accessors_t* local = unw_get_accessors(unw_local_addr_space);
  acc.find_proc_info = local->find_proc_info;
  acc.put_unwind_info = local->put_unwind_info;
  acc.get_dyn_info_list_addr = get_dyn_info_list_addr;
  acc.access_mem = access_mem;
  acc.access_reg = access_reg;
  acc.access_fpreg = access_fpreg;
  acc.resume = resume;
  acc.get_proc_name = get_proc_name;
  pages_.reset(new PageCache);
  for (uint64_t& p : pages_->page) p = ~uint64_t{0};
  unw_addr_space_t as = unw_create_addr_space(&acc, 0);
  if (as != nullptr) unw_set_caching_policy(as, UNW_CACHE_GLOBAL);
  as_ = as;
}

Unwinder::~Unwinder() {
  if (as_ != nullptr) unw_destroy_addr_space(static_cast<unw_addr_space_t>(as_));
}

void Unwinder::flush() {
  if (as_ != nullptr) unw_flush_cache(static_cast<unw_addr_space_t>(as_), 0, 0);
  cfi_.clear();
  if (pages_ != nullptr)
    for (uint64_t& p : pages_->page) p = ~uint64_t{0};
}

namespace {

// One step by the frame-pointer chain, for a frame without CFI (JIT code),
// as perf does. Safe: it reads two words at the frame pointer only when they
// lie inside the captured copy (memory we own), and accepts the result only
// if the return address is in an executable mapping and the new sp is above
// the old one; a garbage frame pointer gives at worst a wrong frame, never a
// read of live memory, and the increasing sp bounds the number of steps.
bool frame_pointer_step(Ctx& c, const MapsSnapshot& maps) {
  uint64_t base = c.rec->regs[kRegSp], len = c.rec->stack_len;
  uint64_t fp = c.regs[kRegFp], sp = c.regs[kRegSp];
  if (fp < sp || fp < base || fp - base > len || len - (fp - base) < arch::kFrameRecordSize) return false;
  uint64_t saved_fp, ret;
  memcpy(&saved_fp, c.rec->stack + (fp - base), 8);
  memcpy(&ret, c.rec->stack + (fp - base) + arch::kFrameRecordReturnOffset, 8);
  if (!maps.executable(ret)) return false;
  c.regs[kRegPc] = ret;
  // Exact on x86_64; on aarch64 the lowest the caller's sp can be, which
  // keeps the sp increasing (a caller with CFI finds its CFA from its own
  // frame pointer, as frame-pointer code does).
  c.regs[kRegSp] = fp + arch::kFrameRecordSize;
  c.regs[kRegFp] = saved_fp;
  return true;
}

}  // namespace

// Whether `ip` has CFI. unw_get_proc_info cannot tell: it reports success
// with a one-byte dummy range where there is none (for _start), and
// unw_step then follows its own rbp heuristic.
bool Unwinder::has_cfi(uint64_t ip, void* ctx) {
  auto it = cfi_.find(ip);
  if (it != cfi_.end()) return it->second;
  auto* as = static_cast<unw_addr_space_t>(as_);
  unw_proc_info_t pi;
  memset(&pi, 0, sizeof pi);
  bool found = unw_get_accessors(as)->find_proc_info(as, ip, &pi, 0, ctx) >= 0;
  if (found) unw_get_accessors(as)->put_unwind_info(as, &pi, ctx);
  // Bounded: a JIT's PCs are many. Past the bound, start over.
  if (cfi_.size() >= 65536) cfi_.clear();
  cfi_.emplace(ip, found);
  return found;
}

uint32_t Unwinder::unwind(const SampleRec& rec, const MapsSnapshot& maps, uint64_t* pcs, uint32_t max) {
  Ctx c{&rec, &maps, pages_.get(), {}};
  memcpy(c.regs, rec.regs, sizeof c.regs);
  uint32_t n = 0;
  pcs[n++] = rec.regs[kRegPc];
  auto* as = static_cast<unw_addr_space_t>(as_);
  if (as == nullptr || rec.stack_len == 0) return n;
  bool first_exact = true;  // false once a frame-pointer step gave a return address
  while (n < max) {
    // CFI steps from the frame in c.regs for as long as there is CFI.
    unw_cursor_t cur;
    if (unw_init_remote(&cur, as, &c) < 0) break;
    bool no_cfi = false;
    // The interrupted PC (and the PC a signal frame resumes at) is looked up
    // as it is; a return address at pc - 1, inside the call.
    bool exact_pc = first_exact;
    // The pc of the frame the cursor stands on, tracked here rather than
    // read back as UNW_REG_IP: that is the return-address register, which on
    // aarch64 (x30) holds the pc only after an ordinary step.
    unw_word_t ip = c.regs[kRegPc];
    // Steps in a row that left the sp where it was: a frameless leaf whose
    // return address is in a register (aarch64's x30; its CFA is its sp)
    // returns to its caller at the same sp. One such step at a time, to a
    // new pc, keeps the unwind from going round in circles.
    int same_sp_steps = 0;
    for (;;) {
      unw_word_t sp = 0, prev_sp = 0;
      const unw_word_t prev_ip = ip;
      unw_get_reg(&cur, UNW_REG_SP, &prev_sp);
      if (!has_cfi(ip - (exact_pc ? 0 : 1), &c)) {
        no_cfi = true;
        break;
      }
      // Out of a signal frame the sp may go down: a handler on an alternate
      // stack placed above the interrupted stack. Every other step must
      // move up the stack (or, once, stay: see same_sp_steps), or the
      // unwind is going round in circles.
      bool signal_frame = unw_is_signal_frame(&cur) > 0;
      exact_pc = signal_frame;
      if (unw_step(&cur) <= 0) break;
      const unw_regnum_t pc_reg = signal_frame ? arch::kUnwindRegPc : UNW_REG_IP;
      if (unw_get_reg(&cur, pc_reg, &ip) < 0 || unw_get_reg(&cur, UNW_REG_SP, &sp) < 0) break;
      if (ip == 0 || !maps.executable(ip)) break;
      if (!signal_frame && sp < prev_sp) break;
      same_sp_steps = sp == prev_sp ? same_sp_steps + 1 : 0;
      if (!signal_frame && sp == prev_sp && (ip == prev_ip || same_sp_steps > 1)) break;
      pcs[n++] = ip;
      ++cfi_steps_;
      if (n >= max) return n;
    }
    if (!no_cfi || n >= max) break;
    // The frame the cursor stands on has no CFI: take its registers as CFI
    // restored them, and try the frame-pointer chain once from there.
    c.regs[kRegPc] = ip;
    unw_word_t v;
    if (unw_get_reg(&cur, UNW_REG_SP, &v) == 0) c.regs[kRegSp] = v;
    for (uint32_t i = kRegFp; i < kNumRegs; ++i)
      if (unw_get_reg(&cur, arch::kSampleUnwindRegs[i], &v) == 0) c.regs[i] = v;
    if (!frame_pointer_step(c, maps)) break;
    pcs[n++] = c.regs[kRegPc];
    ++fp_steps_;
    first_exact = false;
  }
  return n;
}

}  // namespace remora_tool
