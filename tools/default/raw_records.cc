// The raw records writer (raw_records.h). Field numbers are those of
// src/profile/proto/remora_raw.proto; the round-trip test
// (tests/profile/records_test.cc) reads what this writes with libprotobuf.
#include "raw_records.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <string_view>

namespace remora_tool {

namespace {

enum : uint32_t { kVarint = 0, kLengthDelimited = 2 };

std::string read_all(const char* path) {
  std::string out;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

// One line of /proc/self/maps: "start-end perms offset major:minor inode path".
struct MapsLine {
  uint64_t start = 0, end = 0, offset = 0, dev = 0, inode = 0;
  std::string_view perms, path;
};

bool parse_hex(std::string_view& s, char stop, uint64_t* v) {
  uint64_t x = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] != stop; ++i) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    x = x << 4 | static_cast<uint64_t>(d);
  }
  if (i == 0 || i == s.size()) return false;
  s.remove_prefix(i + 1);
  *v = x;
  return true;
}

bool parse_maps_line(std::string_view s, MapsLine* m) {
  uint64_t major = 0, minor = 0;
  if (!parse_hex(s, '-', &m->start) || !parse_hex(s, ' ', &m->end)) return false;
  size_t sp = s.find(' ');
  if (sp == std::string_view::npos) return false;
  m->perms = s.substr(0, sp);
  s.remove_prefix(sp + 1);
  if (!parse_hex(s, ' ', &m->offset) || !parse_hex(s, ':', &major) || !parse_hex(s, ' ', &minor))
    return false;
  uint64_t inode = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i)
    inode = inode * 10 + static_cast<uint64_t>(s[i] - '0');
  s.remove_prefix(i);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  m->inode = inode;
  // makedev's encoding, as the controller's procfs layer reads it.
  m->dev = (major & 0xfffff000ull) << 32 | (major & 0xfffull) << 8 | (minor & 0xffffff00ull) << 12 |
           (minor & 0xffull);
  m->path = s;
  return true;
}

void encode_maps(WireWriter& w, const std::string& text) {
  std::string_view rest = text;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    MapsLine m;
    if (!parse_maps_line(line, &m)) continue;
    // Code lives in executable mappings and files: the rest ([heap],
    // [stack], a JVM's thousands of anonymous regions) names nothing.
    bool exec = m.perms.size() >= 3 && m.perms[2] == 'x';
    if (!exec && (m.path.empty() || m.path[0] == '[')) continue;
    size_t at = w.begin(22);
    w.varint_field(1, m.start);
    w.varint_field(2, m.end);
    w.varint_field(3, m.offset);
    w.bytes_field(4, m.perms);
    w.varint_field(5, m.dev);
    w.varint_field(6, m.inode);
    w.bytes_field(7, m.path);
    w.end(at);
  }
}

// The GNU build ID in an object's PT_NOTE segments, read from its own
// mapped image (the dynamic linker mapped it: this is the process's memory).
std::string_view build_id_of(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* n = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof *n;
      const char* desc = name + ((n->n_namesz + 3) & ~3u);
      const char* next = desc + ((n->n_descsz + 3) & ~3u);
      if (next > end) break;
      if (n->n_type == NT_GNU_BUILD_ID && n->n_namesz == 4 && memcmp(name, "GNU", 4) == 0)
        return {desc, n->n_descsz};
      p = next;
    }
  }
  return {};
}

int add_module(dl_phdr_info* info, size_t, void* arg) {
  auto& w = *static_cast<WireWriter*>(arg);
  size_t at = w.begin(23);
  w.bytes_field(1, info->dlpi_name != nullptr ? info->dlpi_name : "");
  w.varint_field(2, info->dlpi_addr);
  std::string_view id = build_id_of(info);
  if (!id.empty()) w.bytes_field(3, id);
  w.end(at);
  return 0;
}

void encode_stacks(WireWriter& w, const Profile& p) {
  for (const auto& raw : p.raw_stacks) {
    size_t at = w.begin(15);
    w.packed_field(1, raw);
    if (raw.size() >= kMaxFrames) w.varint_field(2, 1);
    w.end(at);
  }
  for (const auto& [key, n] : p.stack_weights) {
    size_t at = w.begin(16);
    w.sint_field(1, key.first);
    w.varint_field(2, key.second);
    w.varint_field(3, n);
    w.end(at);
  }
  for (const auto& s : p.samples) encode_sample(w, s);
}

void encode_calls(WireWriter& w, const Profile& p) {
  for (const auto& c : p.calls) encode_call(w, 18, c);
  for (const auto& f : p.func_stats) {
    size_t at = w.begin(19);
    w.bytes_field(1, f.name);
    w.varint_field(2, f.calls);
    w.varint_field(3, f.total_ns);
    w.varint_field(4, f.max_ns);
    w.end(at);
  }
  for (const auto& c : p.slowest_calls) encode_call(w, 20, c);
  for (const auto& c : p.counters) encode_counter(w, c);
}

}  // namespace

void encode_sample(WireWriter& w, const SampleEvent& s) {
  size_t at = w.begin(17);
  w.sint_field(1, s.tid);
  w.varint_field(2, s.weight);
  w.varint_field(3, s.stack);
  w.varint_field(4, s.ts_ns);
  w.end(at);
}

void encode_call(WireWriter& w, uint32_t field, const CallEvent& c) {
  size_t at = w.begin(field);
  w.sint_field(1, c.tid);
  w.varint_field(2, c.fn);
  w.varint_field(3, c.start_ns);
  w.varint_field(4, c.dur_ns);
  w.end(at);
}

void encode_counter(WireWriter& w, const CounterEvent& c) {
  size_t at = w.begin(21);
  w.varint_field(1, c.kind);
  w.sint_field(2, c.tid);
  w.varint_field(3, c.ts_ns);
  w.varint_field(4, c.value);
  w.end(at);
}

void WireWriter::varint(uint64_t v) {
  while (v >= 0x80) {
    buf_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  buf_.push_back(static_cast<char>(v));
}

void WireWriter::varint_field(uint32_t field, uint64_t v) {
  tag(field, kVarint);
  varint(v);
}

void WireWriter::bytes_field(uint32_t field, std::string_view bytes) {
  tag(field, kLengthDelimited);
  varint(bytes.size());
  buf_.append(bytes.data(), bytes.size());
}

void WireWriter::packed_field(uint32_t field, const std::vector<uint64_t>& values) {
  if (values.empty()) return;
  size_t at = begin(field);
  for (uint64_t v : values) varint(v);
  end(at);
}

// A nested message's length is only known at its end: reserve the longest
// varint a length can need here (5 bytes: messages stay under 4 GiB), then
// write it in place, padded (a varint may carry redundant 0x80 bytes; every
// protobuf reader accepts them).
size_t WireWriter::begin(uint32_t field) {
  tag(field, kLengthDelimited);
  size_t mark = buf_.size();
  buf_.append(5, '\0');
  return mark;
}

void WireWriter::end(size_t mark) {
  uint64_t len = buf_.size() - mark - 5;
  for (int i = 0; i < 5; ++i) {
    uint8_t b = static_cast<uint8_t>(len & 0x7f);
    len >>= 7;
    buf_[mark + static_cast<size_t>(i)] = static_cast<char>(i < 4 ? (b | 0x80) : b);
  }
}

RawContext capture_raw_context() {
  RawContext c;
  c.maps_text = read_all("/proc/self/maps");
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) c.exe.assign(exe, static_cast<size_t>(n));
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&capture_raw_context), &info) != 0 && info.dli_fname != nullptr)
    c.tool_path = info.dli_fname;
  return c;
}

std::string encode_raw_records(const Profile& p, const RawContext& ctx) {
  WireWriter w;
  w.varint_field(1, kRawRecordsVersion);
  w.sint_field(2, p.pid);
  w.bytes_field(3, p.comm);
  w.bytes_field(4, ctx.exe);
  w.varint_field(5, p.session);
  w.varint_field(6, p.start_ns);
  w.varint_field(7, p.end_ns);
  w.sint_field(8, p.hz);
  w.sint_field(9, p.signal);
  w.varint_field(10, p.sampling);
  w.varint_field(11, p.tracing);
  w.varint_field(12, p.fold_threads);
  for (const auto& [tid, name] : p.threads) {
    size_t at = w.begin(13);
    w.sint_field(1, tid);
    w.bytes_field(2, name);
    w.end(at);
  }
  for (const auto& f : p.fn_names) w.bytes_field(14, f);
  encode_stacks(w, p);
  encode_calls(w, p);
  encode_maps(w, ctx.maps_text);
  dl_iterate_phdr(add_module, &w);
  w.bytes_field(24, ctx.tool_path);
  w.varint_field(25, p.samples_total);
  w.varint_field(26, p.samples_dropped);
  w.varint_field(27, p.calls_dropped);
  w.varint_field(28, p.events_capped);
  w.varint_field(29, p.patched_slots);
  for (const auto& s : p.warnings) w.bytes_field(30, s);
  w.sint_field(33, p.realtime_offset_ns);
  return w.data();
}

namespace {

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

uint64_t thread_cpu_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

bool RawSpool::open(const std::string& dir, std::string* error) {
  const std::string path = dir + "/" + kRawRecordsFile + ".part";
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_APPEND, 0644);
  if (fd_ < 0) {
    *error = "cannot create " + path + ": " + strerror(errno);
    return false;
  }
  dir_ = dir;
  write_errno_ = 0;
  return true;
}

bool RawSpool::open_fd(int fd, const std::string& dir, std::string* error) {
  std::string header = std::string(kMemfdMagic) + "PART " + dir.substr(dir.rfind('/') + 1) + "\n";
  if (!write_all(fd, header)) {
    *error = "cannot write into REMORA_OUTPUT_FD " + std::to_string(fd) + ": " + strerror(errno);
    close(fd);
    return false;
  }
  fd_ = fd;
  dir_ = dir;
  write_errno_ = 0;
  in_memory_ = true;
  return true;
}

void RawSpool::flush() {
  if (fd_ < 0 || buf_.empty() || write_errno_ != 0) return;
  if (!write_all(fd_, buf_.data())) {
    write_errno_ = errno;  // the events stay buffered: finish() says what failed
    return;
  }
  buf_.clear();
}

bool RawSpool::finish(const std::string& dir, const std::string& rest, uint64_t cpu_start,
                      std::string* error) {
  const std::string final_path = dir + "/" + kRawRecordsFile;
  if (write_errno_ != 0) {
    *error = "cannot write " + dir_ + "/" + kRawRecordsFile +
             ".part during the session: " + strerror(write_errno_);
    discard();
    buf_.clear();
    return false;
  }
  const bool ours = fd_ >= 0 && dir == dir_;
  if (!ours) discard();
  int fd = ours ? fd_ : ::open(final_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  fd_ = -1;
  if (fd < 0) {
    *error = "cannot create " + final_path + ": " + strerror(errno);
    buf_.clear();
    return false;
  }
  bool ok = write_all(fd, buf_.data()) && write_all(fd, rest);
  buf_.clear();
  if (ok) {
    // Written last, so that it counts the writes before it.
    WireWriter trailer;
    trailer.varint_field(32, thread_cpu_now_ns() - cpu_start);
    ok = write_all(fd, trailer.data());
  }
  if (ok && ours && in_memory_) {
    // Complete: the controller reads DONE and lays it out as profile.remora.
    ok = pwrite(fd, "DONE", 4, static_cast<off_t>(kMemfdStateOffset)) == 4;
  }
  int err = errno;
  if (close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ours && !in_memory_ && rename((dir + "/" + kRawRecordsFile + ".part").c_str(), final_path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) *error = "cannot write " + (in_memory_ ? "REMORA_OUTPUT_FD" : final_path) + ": " + strerror(err);
  in_memory_ = false;
  return ok;
}

void RawSpool::forget() {
  if (fd_ >= 0) close(fd_);  // the child's copy of the parent's descriptor: the file stays the parent's
  fd_ = -1;
  dir_.clear();
  buf_.clear();
  write_errno_ = 0;
  in_memory_ = false;
}

void RawSpool::discard() {
  if (fd_ >= 0) {
    close(fd_);  // a memfd: what it holds stays the controller's (PART)
    if (!in_memory_) unlink((dir_ + "/" + kRawRecordsFile + ".part").c_str());
  }
  fd_ = -1;
  dir_.clear();
  write_errno_ = 0;
  in_memory_ = false;
}

}  // namespace remora_tool
