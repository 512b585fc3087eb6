// profile.pb.gz: the CPU samples as a pprof profile (google/pprof's
// proto/profile.proto), gzip'ed as its readers expect (go tool pprof, Grafana
// Pyroscope, speedscope).
//
// Two sample types, samples/count and cpu/nanoseconds (one sample is 1e9/hz
// ns of the thread's CPU time); one Sample per (thread, stack) with labels
// "thread" (its name) and "tid"; one Location per address, holding a Line
// per function inlined there, the innermost first as the format says; one
// Function per (name, source file); one Mapping per module, with its build ID.
#include <time.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "profile/proto/pprof_profile.pb.h"
#include "profile/writers.h"
#include "profile/writers_internal.h"

namespace remora::profile {

namespace {

namespace pb = remora::pprof_profile;

int64_t clamp64(uint64_t v) {
  return static_cast<int64_t>(std::min<uint64_t>(v, std::numeric_limits<int64_t>::max()));
}

class Builder {
 public:
  explicit Builder(const Profile& p) : p_(p) { str(""); }  // string_table[0] is ""

  pb::Profile build(int64_t realtime_minus_monotonic_ns) {
    const int64_t period = p_.hz > 0 ? 1000000000 / p_.hz : 0;
    add_value_type(out_.add_sample_type(), "samples", "count");
    add_value_type(out_.add_sample_type(), "cpu", "nanoseconds");
    add_value_type(out_.mutable_period_type(), "cpu", "nanoseconds");
    out_.set_period(period);
    out_.set_time_nanos(clamp64(p_.start_ns) + realtime_minus_monotonic_ns);
    out_.set_duration_nanos(p_.end_ns > p_.start_ns ? clamp64(p_.end_ns - p_.start_ns) : 0);
    out_.add_comment(
        str("remora session " + std::to_string(p_.session) + " of " + internal::process_label(p_)));
    // Mappings in the dynamic linker's order, the program first: pprof
    // names the profile after its first mapping ("File: demo").
    std::set<std::string> used;
    for (const Frame& f : p_.frames) used.insert(f.module);
    for (const Module& m : p_.modules)
      if (used.count(m.path)) mapping(m.path);
    for (const auto& [key, weight] : p_.stack_weights) {
      pb::Sample* s = out_.add_sample();
      for (uint64_t id : locations(internal::stack_at(p_, key.second))) s->add_location_id(id);
      s->add_value(clamp64(weight));
      s->add_value(clamp64(weight) * period);
      pb::Label* thread = s->add_label();
      thread->set_key(str("thread"));
      thread->set_str(str(internal::thread_name(p_, key.first)));
      pb::Label* tid = s->add_label();
      tid->set_key(str("tid"));
      tid->set_num(key.first);
    }
    return std::move(out_);
  }

 private:
  // Strings are indices into the table; every one valid UTF-8 (a proto
  // string, which strict readers decode).
  int64_t str(const std::string& raw) {
    std::string s = valid_utf8(raw);
    auto [it, added] = strings_.try_emplace(s, static_cast<int64_t>(strings_.size()));
    if (added) out_.add_string_table(s);
    return it->second;
  }

  void add_value_type(pb::ValueType* v, const std::string& type, const std::string& unit) {
    v->set_type(str(type));
    v->set_unit(str(unit));
  }

  // The stack's locations, leaf first. A root-first stack holds the frames
  // of one address together: the function called, then what was inlined
  // into it (each `inlined`, at the same address).
  std::vector<uint64_t> locations(const std::vector<uint32_t>& stack) {
    std::vector<uint64_t> out;
    for (size_t i = 0; i < stack.size();) {
      const Frame& outer = internal::frame_at(p_, stack[i]);
      size_t j = i + 1;
      while (j < stack.size()) {
        const Frame& f = internal::frame_at(p_, stack[j]);
        if (!f.inlined || f.address != outer.address) break;
        ++j;
      }
      out.push_back(location(std::vector<uint32_t>(stack.begin() + static_cast<ptrdiff_t>(i),
                                                   stack.begin() + static_cast<ptrdiff_t>(j))));
      i = j;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }

  // `group`: the frames at one address, the outermost first.
  uint64_t location(const std::vector<uint32_t>& group) {
    auto [it, added] = locations_.try_emplace(group, locations_.size() + 1);
    if (!added) return it->second;
    const Frame& outer = internal::frame_at(p_, group.front());
    pb::Location* loc = out_.add_location();
    loc->set_id(it->second);
    loc->set_address(outer.address);
    if (uint64_t m = mapping(outer.module)) loc->set_mapping_id(m);
    for (auto fi = group.rbegin(); fi != group.rend(); ++fi) {  // innermost first
      const Frame& f = internal::frame_at(p_, *fi);
      pb::Line* line = loc->add_line();
      line->set_function_id(function(f));
      if (f.line) line->set_line(f.line);
    }
    return it->second;
  }

  uint64_t function(const Frame& f) {
    auto [it, added] = functions_.try_emplace({frame_label(f), f.file}, functions_.size() + 1);
    if (!added) return it->second;
    pb::Function* fn = out_.add_function();
    fn->set_id(it->second);
    fn->set_name(str(frame_label(f)));
    fn->set_system_name(fn->name());
    if (!f.file.empty()) fn->set_filename(str(f.file));
    return it->second;
  }

  // The module's Mapping, 0 for frames of no module (unknown addresses).
  uint64_t mapping(const std::string& module) {
    if (module.empty()) return 0;
    auto [it, added] = mappings_.try_emplace(module, mappings_.size() + 1);
    if (!added) return it->second;
    pb::Mapping* m = out_.add_mapping();
    m->set_id(it->second);
    uint64_t start = std::numeric_limits<uint64_t>::max(), end = 0, offset = 0;
    for (const Mapping& line : p_.maps) {
      if (line.path != module) continue;
      if (line.start < start) start = line.start, offset = line.offset;
      end = std::max(end, line.end);
    }
    if (end != 0) {
      m->set_memory_start(start);
      m->set_memory_limit(end);
      m->set_file_offset(offset);
    }
    m->set_filename(str(module));
    for (const Module& mod : p_.modules)
      if (mod.path == module && !mod.build_id.empty()) {
        m->set_build_id(str(mod.build_id));  // hex, as pprof prints and matches it
        break;
      }
    // Names are resolved already: pprof must not try to symbolise again.
    m->set_has_functions(true);
    for (const Frame& fr : p_.frames) {
      if (fr.module != module) continue;
      if (!fr.file.empty()) m->set_has_filenames(true);
      if (fr.line) m->set_has_line_numbers(true);
      if (fr.inlined) m->set_has_inline_frames(true);
    }
    return it->second;
  }

  const Profile& p_;
  pb::Profile out_;
  std::map<std::string, int64_t> strings_;
  std::map<std::vector<uint32_t>, uint64_t> locations_;
  std::map<std::pair<std::string, std::string>, uint64_t> functions_;
  std::map<std::string, uint64_t> mappings_;
};

}  // namespace

namespace internal {

// gzip (RFC 1952: zlib's windowBits 15 + 16), not a raw or zlib stream:
// pprof's readers look for the gzip magic.
bool write_gzip(const std::string& data, FILE* out) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    errno = ENOMEM;
    return false;
  }
  unsigned char buf[1 << 16];
  size_t fed = 0;
  int rc = Z_OK;
  bool ok = true;
  while (ok && rc != Z_STREAM_END) {
    if (zs.avail_in == 0 && fed < data.size()) {  // avail_in is 32 bits: feed at most 1 GiB at a time
      size_t n = std::min<size_t>(data.size() - fed, 1u << 30);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data() + fed));
      zs.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    zs.next_out = buf;
    zs.avail_out = sizeof buf;
    rc = deflate(&zs, fed == data.size() ? Z_FINISH : Z_NO_FLUSH);
    if (rc == Z_STREAM_ERROR) break;
    ok = internal::write_all(out, buf, sizeof buf - zs.avail_out);
  }
  deflateEnd(&zs);
  if (ok && rc != Z_STREAM_END) errno = EIO;
  return ok && rc == Z_STREAM_END;
}

}  // namespace internal

bool write_pprof(const Profile& p, FILE* out, int64_t realtime_minus_monotonic_ns) {
  std::string bytes;
  if (!Builder(p).build(realtime_minus_monotonic_ns).SerializeToString(&bytes)) {
    errno = EINVAL;
    return false;
  }
  return internal::write_gzip(bytes, out) && ferror(out) == 0;
}

bool write_pprof(const Profile& p, FILE* out) {
  if (p.realtime_offset_ns != 0) return write_pprof(p, out, p.realtime_offset_ns);  // the target's own
  timespec rt{}, mono{};
  clock_gettime(CLOCK_REALTIME, &rt);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  const int64_t offset =
      (static_cast<int64_t>(rt.tv_sec) - mono.tv_sec) * 1000000000 + (rt.tv_nsec - mono.tv_nsec);
  return write_pprof(p, out, offset);
}

}  // namespace remora::profile
