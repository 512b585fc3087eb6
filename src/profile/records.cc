#include "profile/records.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "base/unique_fd.h"
#include "profile/proto/remora_raw.pb.h"

namespace remora::profile {
namespace {

std::string hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Error corrupt(const std::string& what) {
  return Error(Errc::kParse, "the raw records are inconsistent (" + what +
                                 "): the file is damaged or was not written by Remora's default tool");
}

CallEvent call_of(const remora::raw::Call& c) { return CallEvent{c.tid(), c.fn(), c.start_ns(), c.dur_ns()}; }

void copy_header(const remora::raw::Session& s, RawProfile* p) {
  p->ns_pid = s.pid();
  p->pid = s.host_pid() != 0 ? s.host_pid() : s.pid();
  p->comm = s.comm();
  p->exe = s.exe();
  p->session = s.session();
  p->start_ns = s.start_ns();
  p->end_ns = s.end_ns();
  p->hz = s.hz();
  p->signal = s.signal();
  p->sampling = s.sampling();
  p->tracing = s.tracing();
  p->fold_threads = s.fold_threads();
  p->tool_path = s.tool_path();
  p->samples_total = s.samples_total();
  p->samples_dropped = s.samples_dropped();
  p->calls_dropped = s.calls_dropped();
  p->events_capped = s.events_capped();
  p->patched_slots = s.patched_slots();
  p->detach_cpu_ns = s.detach_cpu_ns();
  p->realtime_offset_ns = s.realtime_offset_ns();
  for (const auto& w : s.warnings()) p->warnings.push_back(w);
  for (const auto& t : s.threads()) p->threads[t.tid()] = t.name();
  for (const auto& f : s.fn_names()) p->fn_names.push_back(f);
}

Result<void> copy_events(const remora::raw::Session& s, RawProfile* p) {
  const size_t stacks = static_cast<size_t>(s.stacks_size());
  for (const auto& st : s.stacks()) {
    p->raw_stacks.emplace_back(st.pcs().begin(), st.pcs().end());
    p->truncated.push_back(st.truncated());
  }
  for (const auto& w : s.stack_weights()) {
    if (w.stack() >= stacks) return corrupt("a stack weight names stack " + std::to_string(w.stack()));
    p->stack_weights[{w.tid(), w.stack()}] += w.samples();
  }
  for (const auto& x : s.samples()) {
    if (x.stack() >= stacks) return corrupt("a sample names stack " + std::to_string(x.stack()));
    p->samples.push_back(SampleEvent{x.tid(), x.weight(), x.stack(), x.ts_ns()});
  }
  const size_t fns = p->fn_names.size();
  for (const auto& c : s.calls()) {
    if (c.fn() >= fns) return corrupt("a call names traced function " + std::to_string(c.fn()));
    p->calls.push_back(call_of(c));
  }
  for (const auto& c : s.slowest_calls()) {
    if (c.fn() >= fns) return corrupt("a slow call names traced function " + std::to_string(c.fn()));
    p->slowest_calls.push_back(call_of(c));
  }
  for (const auto& f : s.func_stats())
    p->func_stats.push_back(FuncStat{f.name(), f.calls(), f.total_ns(), f.max_ns()});
  for (const auto& c : s.counters()) {
    if (c.kind() != remora::raw::Counter::RSS_BYTES && c.kind() != remora::raw::Counter::THREAD_CPU_NS)
      continue;
    p->counters.push_back(CounterSample{static_cast<CounterKind>(c.kind()), c.tid(), c.ts_ns(), c.value()});
  }
  return {};
}

void copy_code(const remora::raw::Session& s, RawProfile* p) {
  for (const auto& m : s.maps())
    p->maps.push_back(Mapping{m.start(), m.end(), m.offset(), m.perms(), m.dev(), m.inode(), m.path()});
  for (const auto& m : s.modules()) {
    // The dynamic linker names the main program "": it is the exe.
    p->modules.push_back(Module{m.path().empty() ? s.exe() : m.path(), m.bias(), hex(m.build_id())});
  }
}

}  // namespace

Result<RawProfile> parse_raw_records(std::string_view bytes) {
  remora::raw::Session s;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !s.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error(Errc::kParse,
                 "the raw records do not parse (" + std::to_string(bytes.size()) +
                     " bytes): the file is damaged or cut short (was the session's detach interrupted?)");
  if (s.version() == 0 || s.version() > kRawRecordsVersion)
    return Error(Errc::kNotSupported, "the raw records are version " + std::to_string(s.version()) +
                                          "; this remora reads version " +
                                          std::to_string(kRawRecordsVersion) +
                                          ": render them with the remora that made them");
  RawProfile p;
  copy_header(s, &p);
  if (auto r = copy_events(s, &p); !r) return r.error();
  copy_code(s, &p);
  return p;
}

Result<RawProfile> read_raw_records(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno("open " + path);
  UniqueFd f(fd);
  std::string data;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(f.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::from_errno("read " + path);
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  auto p = parse_raw_records(data);
  if (!p) return Error(p.error().code(), path + ": " + p.error().message());
  return p;
}

}  // namespace remora::profile
