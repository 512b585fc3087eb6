// trace.perfetto: the session as a native Perfetto trace (protobuf), the
// format the Perfetto UI and trace_processor read without a legacy importer.
//
// One writer sequence (trusted_packet_sequence_id 1), in this order:
//   1. a ClockSnapshot saying trace time is CLOCK_MONOTONIC (Perfetto's
//      default is BOOTTIME); it is the sequence's first packet and clears its
//      incremental state (SEQ_INCREMENTAL_STATE_CLEARED);
//   2. TrackDescriptors: the process, each thread, and the counter tracks
//      (the process's RSS, each thread's CPU time);
//   3. one InternedData packet: function names, source paths, build IDs,
//      mapping paths, mappings, frames and callstacks;
//   4. the timed packets, sorted by time: PerfSamples, TrackEvent slices of
//      the traced calls and counter values. Each says its clock
//      (timestamp_clock_id = BUILTIN_CLOCK_MONOTONIC).
//
// CPU samples are PerfSample packets (what traced_perf writes), not
// StreamingProfilePacket: the latter is Chrome's sampler format, which
// trace_processor ties to a Chrome thread descriptor on the packet's own
// sequence (one sequence per sampled thread), and the UI shows its samples on
// Chrome's thread tracks only; PerfSample names its pid and tid in each
// sample and fills the perf_sample table, which the UI shows for any Linux
// process as a per-process and per-thread callstack track with a flamegraph.
// PerfSample has no weight: a sample that stands for several timer ticks
// (its weight) is written that many times, at most kMaxRepeat.
#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "profile/proto/perfetto_trace.pb.h"
#include "profile/writers.h"
#include "profile/writers_internal.h"

namespace remora::profile {

namespace {

namespace pb = remora::perfetto_trace;

constexpr uint32_t kSequence = 1;
constexpr uint32_t kClock = pb::BUILTIN_CLOCK_MONOTONIC;
constexpr uint32_t kMaxRepeat = 1000;

// Track uuids, unique within this trace and distinct from another
// process's: the pid in the high bits, the thread id below.
struct Uuids {
  uint64_t base;
  explicit Uuids(int pid) : base((1ull << 63) | (static_cast<uint64_t>(static_cast<uint32_t>(pid)) << 32)) {}
  uint64_t process() const { return base | 2; }
  uint64_t rss() const { return base | 3; }
  uint64_t thread(int32_t tid) const {
    return base | (static_cast<uint64_t>(static_cast<uint32_t>(tid)) << 2);
  }
  uint64_t cpu(int32_t tid) const { return thread(tid) | 1; }
};

// A trace file is a Trace message: each packet is its field 1 (tag 0x0a),
// length-delimited. Written as they come, not held as one message.
class PacketWriter {
 public:
  explicit PacketWriter(FILE* out) : out_(out) {}
  void add(const pb::TracePacket& packet) { add_serialized(packet.SerializeAsString()); }
  void add_serialized(const std::string& bytes) {
    buf_ += '\x0a';
    for (uint64_t n = bytes.size();; n >>= 7) {
      if (n < 0x80) {
        buf_ += static_cast<char>(n);
        break;
      }
      buf_ += static_cast<char>((n & 0x7f) | 0x80);
    }
    buf_ += bytes;
    if (buf_.size() >= (1u << 20)) flush();
  }
  bool flush() {
    ok_ = internal::write_all(out_, buf_.data(), buf_.size()) && ok_;
    buf_.clear();
    return ok_;
  }

 private:
  FILE* out_;
  std::string buf_;
  bool ok_ = true;
};

pb::TracePacket packet() {
  pb::TracePacket p;
  p.set_trusted_packet_sequence_id(kSequence);
  return p;
}

pb::TracePacket timed_packet(uint64_t ts) {
  pb::TracePacket p = packet();
  p.set_timestamp(ts);
  p.set_timestamp_clock_id(kClock);
  return p;
}

// Interns strings of one kind (function names, paths...): iids from 1.
class StringTable {
 public:
  explicit StringTable(google::protobuf::RepeatedPtrField<pb::InternedString>* out) : out_(out) {}
  uint64_t iid(const std::string& s) {
    auto [it, added] = ids_.try_emplace(s, ids_.size() + 1);
    if (added) {
      pb::InternedString* e = out_->Add();
      e->set_iid(it->second);
      e->set_str(s);
    }
    return it->second;
  }

 private:
  google::protobuf::RepeatedPtrField<pb::InternedString>* out_;
  std::map<std::string, uint64_t> ids_;
};

// Everything the samples refer to, interned once.
class Interner {
 public:
  Interner(const Profile& p, pb::InternedData* data)
      : p_(p),
        data_(data),
        functions_(data->mutable_function_names()),
        sources_(data->mutable_source_paths()),
        build_ids_(data->mutable_build_ids()),
        paths_(data->mutable_mapping_paths()) {}

  // The callstack iid of stack `i`, 0 when it has no frame.
  uint64_t callstack(uint32_t i) {
    const auto& frames = internal::stack_at(p_, i);
    if (frames.empty()) return 0;
    auto [it, added] = callstacks_.try_emplace(i, callstacks_.size() + 1);
    if (added) {
      pb::Callstack* cs = data_->add_callstacks();
      cs->set_iid(it->second);
      for (uint32_t fi : frames) cs->add_frame_ids(frame(fi));  // root first, as Perfetto wants
    }
    return it->second;
  }

 private:
  uint64_t frame(uint32_t i) {
    auto [it, added] = frames_.try_emplace(i, frames_.size() + 1);
    if (!added) return it->second;
    const Frame* f = &internal::frame_at(p_, i);
    pb::Frame* out = data_->add_frames();
    out->set_iid(it->second);
    out->set_function_name_id(functions_.iid(valid_utf8(frame_label(*f))));
    // Every frame has a mapping, "[unknown]" at worst: readers before
    // Perfetto v50 drop a callstack with a frame of no mapping.
    out->set_mapping_id(mapping(*f));
    out->set_rel_pc(f->module_offset);
    if (!f->file.empty()) out->set_source_path_iid(sources_.iid(valid_utf8(f->file)));
    if (f->line) out->set_line_number(f->line);
    switch (f->kind) {
      case FrameKind::kNative: out->set_kind(pb::Frame::KIND_NATIVE); break;
      case FrameKind::kJit: out->set_kind(pb::Frame::KIND_JIT); break;
      case FrameKind::kTruncated: out->set_kind_str("truncated"); break;
      case FrameKind::kUnknown: break;
    }
    return it->second;
  }

  uint64_t mapping(const Frame& f) {
    const std::string path = f.module.empty() ? "[unknown]" : f.module;
    auto [it, added] = mappings_.try_emplace(path, mappings_.size() + 1);
    if (!added) return it->second;
    pb::Mapping* m = data_->add_mappings();
    m->set_iid(it->second);
    // The object's extent in the target, from its lines of the maps; its
    // file offset is the first line's.
    uint64_t start = std::numeric_limits<uint64_t>::max(), end = 0, offset = 0;
    for (const Mapping& line : p_.maps) {
      if (line.path != path) continue;
      if (line.start < start) start = line.start, offset = line.offset;
      end = std::max(end, line.end);
    }
    if (end != 0) {
      m->set_start(start);
      m->set_end(end);
      m->set_exact_offset(offset);
    }
    for (const Module& mod : p_.modules) {
      if (mod.path != path) continue;
      if (std::string id = internal::hex_to_bytes(mod.build_id); !id.empty())
        m->set_build_id(build_ids_.iid(id));  // raw bytes, as traced_perf interns them
      break;
    }
    // "/usr/lib/libc.so.6" is ["usr", "lib", "libc.so.6"]: the reader puts
    // a '/' before each.
    std::string clean = valid_utf8(path);
    for (size_t pos = 0; pos < clean.size();) {
      size_t slash = clean.find('/', pos);
      if (slash == std::string::npos) slash = clean.size();
      if (slash > pos) m->add_path_string_ids(paths_.iid(clean.substr(pos, slash - pos)));
      pos = slash + 1;
    }
    return it->second;
  }

  const Profile& p_;
  pb::InternedData* data_;
  StringTable functions_, sources_, build_ids_, paths_;
  std::map<uint32_t, uint64_t> frames_, callstacks_;
  std::map<std::string, uint64_t> mappings_;
};

void add_descriptors(const Profile& p, const Uuids& uuids, PacketWriter& w) {
  const int pid = internal::trace_pid(p);
  pb::TracePacket proc = packet();
  pb::TrackDescriptor* d = proc.mutable_track_descriptor();
  d->set_uuid(uuids.process());
  d->mutable_process()->set_pid(pid);
  d->mutable_process()->set_process_name(valid_utf8(p.comm));
  w.add(proc);
  std::map<int32_t, bool> cpu_counted;
  bool rss = false;
  for (const CounterSample& c : p.counters) {
    if (c.kind == CounterKind::kThreadCpuNs) cpu_counted[c.tid] = true;
    if (c.kind == CounterKind::kRssBytes) rss = true;
  }
  for (int32_t tid : internal::all_tids(p)) {
    pb::TracePacket t = packet();
    d = t.mutable_track_descriptor();
    d->set_uuid(uuids.thread(tid));
    d->set_parent_uuid(uuids.process());
    d->mutable_thread()->set_pid(pid);
    d->mutable_thread()->set_tid(tid);
    d->mutable_thread()->set_thread_name(valid_utf8(internal::thread_name(p, tid)));
    w.add(t);
    if (!cpu_counted.count(tid)) continue;
    pb::TracePacket c = packet();
    d = c.mutable_track_descriptor();
    d->set_uuid(uuids.cpu(tid));
    d->set_parent_uuid(uuids.thread(tid));
    d->set_name(valid_utf8("CPU time " + internal::thread_label(p, tid)));
    d->mutable_counter()->set_unit(pb::CounterDescriptor::UNIT_TIME_NS);
    w.add(c);
  }
  if (rss) {
    pb::TracePacket c = packet();
    d = c.mutable_track_descriptor();
    d->set_uuid(uuids.rss());
    d->set_parent_uuid(uuids.process());
    d->set_name("RSS");
    d->mutable_counter()->set_unit(pb::CounterDescriptor::UNIT_SIZE_BYTES);
    w.add(c);
  }
}

using Timed = std::vector<std::pair<uint64_t, std::string>>;  // (timestamp, serialized packet)

void add_slice(const Profile& p, const Uuids& uuids, const CallEvent& c, uint64_t end, Timed& out) {
  pb::TracePacket begin = timed_packet(c.start_ns);
  pb::TrackEvent* e = begin.mutable_track_event();
  e->set_type(pb::TrackEvent::TYPE_SLICE_BEGIN);
  e->set_track_uuid(uuids.thread(c.tid));
  e->set_name(c.fn < p.fn_names.size() ? valid_utf8(p.fn_names[c.fn]) : "?");
  e->add_categories("call");
  out.emplace_back(c.start_ns, begin.SerializeAsString());
  pb::TracePacket finish = timed_packet(end);
  e = finish.mutable_track_event();
  e->set_type(pb::TrackEvent::TYPE_SLICE_END);
  e->set_track_uuid(uuids.thread(c.tid));
  out.emplace_back(end, finish.SerializeAsString());
}

// The calls of each thread as nested slices: begins and ends in time order,
// each end closing the innermost open slice. Calls from the target nest; a
// call that would outlast the one it started in (records that disagree) is
// cut at that one's end, so the slices always balance.
void add_slices(const Profile& p, const Uuids& uuids, Timed& out) {
  std::map<int32_t, std::vector<const CallEvent*>> by_thread;
  for (const CallEvent& c : p.calls) by_thread[c.tid].push_back(&c);
  for (auto& [tid, calls] : by_thread) {
    std::stable_sort(calls.begin(), calls.end(), [](const CallEvent* a, const CallEvent* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->dur_ns > b->dur_ns;
    });
    std::vector<std::pair<uint64_t, std::string>> open;  // (end, END packet), innermost last
    for (const CallEvent* c : calls) {
      while (!open.empty() && open.back().first <= c->start_ns) {
        out.push_back(std::move(open.back()));
        open.pop_back();
      }
      uint64_t end = c->start_ns + std::min(c->dur_ns, std::numeric_limits<uint64_t>::max() - c->start_ns);
      if (!open.empty()) end = std::min(end, open.back().first);
      Timed pair;
      add_slice(p, uuids, *c, end, pair);
      out.push_back(std::move(pair[0]));
      open.push_back(std::move(pair[1]));
    }
    for (; !open.empty(); open.pop_back()) out.push_back(std::move(open.back()));
  }
}

void add_counters(const Profile& p, const Uuids& uuids, Timed& out) {
  for (const CounterSample& c : p.counters) {
    if (c.kind != CounterKind::kRssBytes && c.kind != CounterKind::kThreadCpuNs) continue;
    pb::TracePacket t = timed_packet(c.ts_ns);
    pb::TrackEvent* e = t.mutable_track_event();
    e->set_type(pb::TrackEvent::TYPE_COUNTER);
    e->set_track_uuid(c.kind == CounterKind::kRssBytes ? uuids.rss() : uuids.cpu(c.tid));
    e->set_counter_value(
        static_cast<int64_t>(std::min<uint64_t>(c.value, std::numeric_limits<int64_t>::max())));
    out.emplace_back(c.ts_ns, t.SerializeAsString());
  }
}

void add_samples(const Profile& p, Interner& interner, Timed& out) {
  const auto pid = static_cast<uint32_t>(internal::trace_pid(p));
  for (const SampleEvent& s : p.samples) {
    pb::TracePacket t = timed_packet(s.ts_ns);
    t.set_sequence_flags(pb::TracePacket::SEQ_NEEDS_INCREMENTAL_STATE);
    pb::PerfSample* ps = t.mutable_perf_sample();
    ps->set_pid(pid);
    ps->set_tid(static_cast<uint32_t>(s.tid));
    if (uint64_t cs = interner.callstack(s.stack)) ps->set_callstack_iid(cs);
    std::string bytes = t.SerializeAsString();
    for (uint32_t n = std::clamp<uint32_t>(s.weight, 1, kMaxRepeat); n > 0; --n)
      out.emplace_back(s.ts_ns, bytes);
  }
}

}  // namespace

bool write_perfetto(const Profile& p, FILE* out) {
  PacketWriter w(out);
  const Uuids uuids(internal::trace_pid(p));
  pb::TracePacket clock = timed_packet(p.start_ns);
  clock.set_sequence_flags(pb::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED);
  clock.set_first_packet_on_sequence(true);
  pb::ClockSnapshot* snap = clock.mutable_clock_snapshot();
  pb::ClockSnapshot::Clock* c = snap->add_clocks();
  c->set_clock_id(kClock);
  c->set_timestamp(p.start_ns);
  snap->set_primary_trace_clock(pb::BUILTIN_CLOCK_MONOTONIC);
  w.add(clock);
  add_descriptors(p, uuids, w);

  // The samples first, so that the interned data they refer to is known
  // before it is written; the packet goes ahead of every timed one.
  Timed timed;
  pb::TracePacket interned = packet();
  interned.set_sequence_flags(pb::TracePacket::SEQ_NEEDS_INCREMENTAL_STATE);
  Interner interner(p, interned.mutable_interned_data());
  add_samples(p, interner, timed);
  w.add(interned);
  add_slices(p, uuids, timed);
  add_counters(p, uuids, timed);
  // Stable: the slices of a thread keep their order where times are equal
  // (an end before the next begin, a zero-length call's begin before its end).
  std::stable_sort(timed.begin(), timed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [ts, bytes] : timed) w.add_serialized(bytes);
  return w.flush() && ferror(out) == 0;
}

}  // namespace remora::profile
