#include "symbolize.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

namespace remora_tool {

namespace {

// A map whose every line covers every PC would cost lines x PCs string
// copies; real maps cover each PC a few times. Past this many assignments
// the rest of the map is ignored (and work_capped says so).
constexpr uint64_t kMaxPerfMapWork = 16u << 20;

bool is_blank(char c) { return c == ' ' || c == '\t'; }

// A hex number of 1 to 16 digits, with or without 0x, at the start of `s`;
// consumes it.
bool take_hex(std::string_view* s, uint64_t* out) {
  std::string_view t = *s;
  if (t.size() >= 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) t.remove_prefix(2);
  uint64_t v = 0;
  size_t n = 0;
  for (; n < t.size(); ++n) {
    char c = t[n];
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) break;
    if (n == 16) return false;  // more than 64 bits
    v = v << 4 | static_cast<uint64_t>(d);
  }
  if (n == 0) return false;
  t.remove_prefix(n);
  *s = t;
  *out = v;
  return true;
}

size_t skip_blanks(std::string_view* s) {
  size_t n = 0;
  while (n < s->size() && is_blank((*s)[n])) ++n;
  s->remove_prefix(n);
  return n;
}

}  // namespace

bool parse_perf_map_line(std::string_view s, PerfMapLine* out) {
  PerfMapLine l;
  skip_blanks(&s);
  if (!take_hex(&s, &l.start) || skip_blanks(&s) == 0) return false;
  if (!take_hex(&s, &l.size) || skip_blanks(&s) == 0) return false;
  while (!s.empty() && (is_blank(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  if (s.empty() || l.size == 0 || l.start + l.size < l.start) return false;
  l.name = s;
  *out = l;
  return true;
}

PerfMapNames::PerfMapNames(std::vector<uint64_t> pcs) : pcs_(std::move(pcs)) {
  std::sort(pcs_.begin(), pcs_.end());
  pcs_.erase(std::unique(pcs_.begin(), pcs_.end()), pcs_.end());
  names_.resize(pcs_.size());
}

void PerfMapNames::line(std::string_view text) {
  ++lines_;
  PerfMapLine l;
  if (!parse_perf_map_line(text, &l)) {
    ++malformed_;
    return;
  }
  if (work_capped_) return;
  uint64_t end = l.start + l.size;
  std::string_view name = l.name.substr(0, kMaxName);
  for (auto it = std::lower_bound(pcs_.begin(), pcs_.end(), l.start); it != pcs_.end() && *it < end; ++it) {
    if (++work_ > kMaxPerfMapWork) {
      work_capped_ = true;
      return;
    }
    // The last entry wins: the runtime appends when code moves or is
    // replaced, so a later line describes what is at the address now.
    names_[static_cast<size_t>(it - pcs_.begin())].assign(name);
  }
}

void PerfMapNames::feed(std::string_view bytes) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    std::string_view piece = bytes.substr(0, nl);
    if (!skipping_) {
      if (partial_.size() + piece.size() > kMaxLine) {
        skipping_ = true;
        partial_.clear();
      } else if (nl != std::string_view::npos && partial_.empty()) {
        line(piece);  // the common case: a whole line inside one chunk, no copy
      } else {
        partial_.append(piece);
        if (nl != std::string_view::npos) {
          line(partial_);
          partial_.clear();
        }
      }
    }
    if (nl == std::string_view::npos) return;
    if (skipping_) {
      skipping_ = false;
      ++lines_;
      ++malformed_;
    }
    bytes.remove_prefix(nl + 1);
  }
}

void PerfMapNames::finish() {
  if (skipping_) {
    ++lines_;
    ++malformed_;
  } else if (!partial_.empty()) {
    line(partial_);
  }
  skipping_ = false;
  partial_.clear();
}

const std::string* PerfMapNames::find(uint64_t pc) const {
  auto it = std::lower_bound(pcs_.begin(), pcs_.end(), pc);
  if (it == pcs_.end() || *it != pc) return nullptr;
  const std::string& n = names_[static_cast<size_t>(it - pcs_.begin())];
  return n.empty() ? nullptr : &n;
}

size_t PerfMapNames::named() const {
  return static_cast<size_t>(
      std::count_if(names_.begin(), names_.end(), [](const std::string& n) { return !n.empty(); }));
}

PerfMapRead read_perf_map(const std::string& path, size_t max_bytes, PerfMapNames* names) {
  PerfMapRead r;
  // O_NONBLOCK: a FIFO planted at the path must not hang the detach.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno != ENOENT) r.problem = "cannot open " + path + ": " + strerror(errno);
    return r;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    r.problem = path + " is not a regular file: ignored";
  } else if (st.st_uid != geteuid() && st.st_uid != 0) {
    r.problem = path + " is owned by uid " + std::to_string(st.st_uid) + ", not by this process's uid " +
                std::to_string(geteuid()) +
                " or root: ignored, since another user could plant false names "
                "(remove the file, or let the runtime write it as the process's own user)";
  }
  if (!r.problem.empty()) {
    close(fd);
    return r;
  }
  r.found = true;
  r.file_size = static_cast<uint64_t>(st.st_size);
  off_t from = 0;
  size_t left = max_bytes;
  bool skip_first = false;
  if (r.file_size > max_bytes) {
    r.capped = true;
    // From the byte before the last max_bytes: the first line read from
    // the middle is partial and skipped up to its newline, and when that
    // byte is itself a newline no whole line is lost.
    from = static_cast<off_t>(r.file_size - max_bytes - 1);
    left = max_bytes + 1;
    skip_first = true;
  }
  std::vector<char> buf(1u << 20);
  while (left > 0) {
    ssize_t n = pread(fd, buf.data(), std::min(buf.size(), left), from);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    std::string_view chunk(buf.data(), static_cast<size_t>(n));
    from += n;
    left -= static_cast<size_t>(n);
    if (skip_first) {
      size_t nl = chunk.find('\n');
      if (nl == std::string_view::npos) continue;
      chunk.remove_prefix(nl + 1);
      skip_first = false;
    }
    names->feed(chunk);
  }
  names->finish();
  close(fd);
  return r;
}

struct Symbolizer::Object {
  std::string path;   // for opening
  std::string label;  // base name, for "lib+0x..."
  uintptr_t base = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // PT_LOAD, absolute
  bool loaded = false;
  struct Sym {
    uint64_t value, size;
    std::string name;
  };
  std::vector<Sym> syms;  // sorted by value (link-time addresses)

  bool contains(uintptr_t pc) const {
    for (const auto& [s, e] : ranges)
      if (pc >= s && pc < e) return true;
    return false;
  }

  void load() {
    loaded = true;
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
      close(fd);
      return;
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return;
    const char* img = static_cast<const char*>(map);
    auto* eh = reinterpret_cast<const Elf64_Ehdr*>(img);
    bool ok = memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
              eh->e_shoff != 0 && eh->e_shentsize == sizeof(Elf64_Shdr) &&
              eh->e_shoff + static_cast<uint64_t>(eh->e_shnum) * sizeof(Elf64_Shdr) <= size;
    if (ok) {
      auto* sh = reinterpret_cast<const Elf64_Shdr*>(img + eh->e_shoff);
      // Prefer .symtab (static functions too); fall back to .dynsym.
      for (uint32_t want : {static_cast<uint32_t>(SHT_SYMTAB), static_cast<uint32_t>(SHT_DYNSYM)}) {
        for (int i = 0; i < eh->e_shnum && syms.empty(); ++i) {
          if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum) continue;
          const Elf64_Shdr& strs = sh[sh[i].sh_link];
          if (sh[i].sh_offset + sh[i].sh_size > size || strs.sh_offset + strs.sh_size > size) continue;
          auto* sym = reinterpret_cast<const Elf64_Sym*>(img + sh[i].sh_offset);
          size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
          for (size_t k = 0; k < n; ++k) {
            int type = ELF64_ST_TYPE(sym[k].st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym[k].st_shndx == SHN_UNDEF ||
                sym[k].st_value == 0)
              continue;
            if (sym[k].st_name >= strs.sh_size) continue;
            const char* nm = img + strs.sh_offset + sym[k].st_name;
            size_t len = strnlen(nm, strs.sh_size - sym[k].st_name);
            syms.push_back({sym[k].st_value, sym[k].st_size, std::string(nm, len)});
          }
        }
        if (!syms.empty()) break;
      }
    }
    munmap(map, size);
    std::sort(syms.begin(), syms.end(), [](const Sym& a, const Sym& b) {
      if (a.value != b.value) return a.value < b.value;
      return a.size > b.size;  // prefer the sized symbol among aliases
    });
  }

  const Sym* find(uintptr_t pc) {
    if (!loaded) load();
    uint64_t off = pc - base;
    auto it =
        std::upper_bound(syms.begin(), syms.end(), off, [](uint64_t v, const Sym& s) { return v < s.value; });
    if (it == syms.begin()) return nullptr;
    // Among the symbols starting at or before `off`, the nearest that
    // contains it (aliases share a start).
    auto prev = it - 1;
    uint64_t start = prev->value;
    for (auto j = prev;; --j) {
      if (j->value != start) break;
      if (j->size == 0 || off < j->value + j->size) return &*j;
      if (j == syms.begin()) break;
    }
    return nullptr;
  }
};

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) {
      std::string out = d;
      free(d);
      return out;
    }
    free(d);
  }
  return name;
}

Symbolizer::Symbolizer() {
  Dl_info me;
  if (dladdr(reinterpret_cast<void*>(&demangle), &me) != 0)
    self_base_ = reinterpret_cast<uintptr_t>(me.dli_fbase);
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* self = static_cast<std::vector<std::unique_ptr<Object>>*>(data);
        auto o = std::make_unique<Object>();
        bool main = info->dlpi_name == nullptr || info->dlpi_name[0] == '\0';
        o->path = main ? "/proc/self/exe" : info->dlpi_name;
        if (main) {
          char buf[4096];
          ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
          o->label = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "[main]";
        } else {
          o->label = info->dlpi_name;
        }
        size_t slash = o->label.rfind('/');
        if (slash != std::string::npos) o->label = o->label.substr(slash + 1);
        o->base = info->dlpi_addr;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          if (ph.p_type == PT_LOAD)
            o->ranges.emplace_back(info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        // The vDSO has no file: dladdr names its symbols.
        if (o->label.rfind("linux-vdso", 0) == 0 || o->label.rfind("linux-gate", 0) == 0) o->loaded = true;
        self->push_back(std::move(o));
        return 0;
      },
      &objects_);
}

Symbolizer::~Symbolizer() = default;

bool Symbolizer::in_tool(uint64_t pc) const {
  for (const auto& o : objects_)
    if (o->base == self_base_ && o->contains(pc)) return true;
  return false;
}

Symbolizer::Object* Symbolizer::object_at(uint64_t pc) const {
  for (const auto& o : objects_)
    if (o->contains(pc)) return o.get();
  return nullptr;
}

void Symbolizer::name_jit_code(const std::vector<std::vector<uint64_t>>& raw_stacks,
                               std::vector<std::string>* warnings) {
  std::vector<uint64_t> all;
  for (const auto& raw : raw_stacks)
    for (size_t i = 0; i < raw.size(); ++i) all.push_back(i == 0 ? raw[i] : raw[i] - 1);  // as write_outputs
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::vector<uint64_t> pcs;
  for (uint64_t pc : all)
    if (object_at(pc) == nullptr) pcs.push_back(pc);
  if (pcs.empty()) return;  // native code only: no file to read
  size_t wanted = pcs.size();
  jit_ = std::make_unique<PerfMapNames>(std::move(pcs));
  std::string pid = std::to_string(getpid());
  std::string path = "/tmp/perf-" + pid + ".map";
  PerfMapRead r = read_perf_map(path, kMaxPerfMapBytes, jit_.get());
  // A JVM writes its map only when asked (DumpPerfMapAtExit: at exit, too
  // late for a profile of a live process).
  std::string how = "(node: start it with --perf-basic-prof; a JVM: run `jcmd " + pid +
                    " Compiler.perfmap` before the detach)";
  if (!r.problem.empty()) {
    warnings->push_back("JIT code: " + r.problem + "; code outside every loaded object reads [unknown]");
  } else if (!r.found) {
    warnings->push_back("JIT code: samples in code outside every loaded object read [unknown]: no perf map " +
                        path + " to name them; have the runtime write one " + how);
  } else if (jit_->named() == 0) {
    warnings->push_back("JIT code: " + path + " names none of the " + std::to_string(wanted) +
                        " sampled addresses outside every loaded object: it predates the code; have the "
                        "runtime write it again " +
                        how);
  }
  if (r.capped) {
    char buf[256];
    snprintf(buf, sizeof buf,
             "JIT code: %s is %.1f MiB; only its last %zu MiB (the newest entries) were read", path.c_str(),
             static_cast<double>(r.file_size) / (1 << 20), kMaxPerfMapBytes >> 20);
    warnings->push_back(std::string(buf) +
                        ": code named only by older entries reads [unknown] (restart the runtime to start a "
                        "new map; node's --perf-basic-prof-only-functions writes a smaller one)");
  }
  if (jit_->work_capped())
    warnings->push_back("JIT code: " + path +
                        " covers the same code over and over: the rest of it was ignored and some JIT "
                        "frames read [unknown] (restart the runtime to start a new map)");
}

std::string Symbolizer::name(uint64_t pc) {
  auto hit = cache_.find(pc);
  if (hit != cache_.end()) return hit->second;
  std::string out;
  Object* obj = object_at(pc);
  if (obj != nullptr) {
    if (const Object::Sym* s = obj->find(pc)) out = demangle(s->name.c_str());
  } else if (jit_ != nullptr) {
    if (const std::string* s = jit_->find(pc)) out = *s;
  }
  if (out.empty()) {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(pc), &info) != 0 && info.dli_sname != nullptr) {
      out = demangle(info.dli_sname);
    } else if (obj != nullptr) {
      char buf[64];
      snprintf(buf, sizeof buf, "+0x%lx", static_cast<unsigned long>(pc - obj->base));
      out = obj->label + buf;
    } else {
      char buf[64];
      snprintf(buf, sizeof buf, "[unknown]+0x%lx", static_cast<unsigned long>(pc));
      out = buf;
    }
  }
  cache_.emplace(pc, out);
  return out;
}

// ---- the program ----

namespace {

std::string_view base_name(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// As the kernel stores comm: at most TASK_COMM_LEN - 1 bytes.
std::string_view comm_cut(std::string_view name) { return name.substr(0, 15); }

// Whether `arg` (a command's first word) names the running file: as a path
// when it holds a '/', else through $PATH, as execvp and the shells look
// it up (an empty entry is the current directory).
bool names_the_exe(std::string_view arg, std::string_view path_env,
                   const std::function<bool(const std::string&)>& is_exe) {
  if (arg.empty()) return false;
  if (arg.find('/') != std::string_view::npos) return is_exe(std::string(arg));
  while (true) {
    size_t colon = path_env.find(':');
    std::string_view dir = path_env.substr(0, colon);
    std::string candidate = dir.empty() ? std::string(arg) : std::string(dir) + "/" + std::string(arg);
    if (is_exe(candidate)) return true;
    if (colon == std::string_view::npos) return false;
    path_env.remove_prefix(colon + 1);
  }
}

}  // namespace

std::string choose_program_name(std::string_view cmdline, std::string_view comm, std::string_view exe,
                                std::string_view path_env,
                                const std::function<bool(const std::string& path)>& is_exe) {
  std::string_view argv0 = cmdline.substr(0, cmdline.find('\0'));
  // A binary replaced on disk (an upgrade) reads "/usr/bin/x (deleted)".
  constexpr std::string_view kDeleted = " (deleted)";
  if (exe.size() > kDeleted.size() && exe.substr(exe.size() - kDeleted.size()) == kDeleted)
    exe.remove_suffix(kDeleted.size());
  std::string_view exe_name = base_name(exe);
  // 2., computed first since rule 1 compares with it.
  std::string_view started_as;
  if (names_the_exe(argv0, path_env, is_exe)) {
    started_as = base_name(argv0);
  } else {
    std::string_view first_word = argv0.substr(0, argv0.find(' '));
    if (first_word.size() < argv0.size() && names_the_exe(first_word, path_env, is_exe))
      started_as = base_name(first_word);
  }
  bool digits =
      !comm.empty() && std::all_of(comm.begin(), comm.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!comm.empty() && !digits && comm != comm_cut(exe_name) &&
      (started_as.empty() || comm != comm_cut(started_as)))
    return std::string(comm);  // 1.
  if (!started_as.empty()) return std::string(started_as);
  if (!comm.empty()) return std::string(comm);
  if (!exe_name.empty()) return std::string(exe_name);
  return "process";
}

namespace {

std::string read_proc_file(const char* path, size_t max) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out(max, '\0');
  size_t got = 0;
  while (got < max) {
    ssize_t n = read(fd, out.data() + got, max - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(got);
  return out;
}

}  // namespace

std::string program_name() {
  std::string cmdline = read_proc_file("/proc/self/cmdline", 4096);
  std::string comm = read_proc_file("/proc/self/comm", 64);
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\0')) comm.pop_back();
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string exe_path = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
  // stat of the magic link: the running file's inode even when it was
  // deleted or lies in another mount namespace's view.
  struct stat self;
  bool have_self = stat("/proc/self/exe", &self) == 0;
  const char* path_env = getenv("PATH");
  // Unset, execvp searches glibc's default path.
  return choose_program_name(cmdline, comm, exe_path, path_env != nullptr ? path_env : "/bin:/usr/bin",
                             [&](const std::string& path) {
                               struct stat st;
                               return have_self && stat(path.c_str(), &st) == 0 && st.st_dev == self.st_dev &&
                                      st.st_ino == self.st_ino;
                             });
}

}  // namespace remora_tool
