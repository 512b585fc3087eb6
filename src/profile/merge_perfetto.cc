// trace.perfetto of a job (merge.h): the packets of every rank's
// trace.perfetto (perfetto.cc wrote them), decoded one packet at a time and
// written again with new ids, behind two packets of the merge's own.
//
// What changes in a rank's packets, and why:
//   - Track uuids: each rank numbers its tracks from its own pid
//     (perfetto.cc's Uuids), and ranks on different nodes share pids; every
//     uuid gets a fresh number instead, counted from 1 in rank order (0, the
//     trace's global track, stays 0).
//   - Sequence ids: interned data (function names, frames, callstacks) and
//     the incremental-state flags are per sequence, and every rank's writer
//     uses sequence 1; each (rank, sequence) gets a sequence of its own, so
//     that each rank's interned ids keep naming its own callstacks. The
//     rank's ClockSnapshot packet, the first of its sequence, is dropped
//     (one snapshot, the merge's, governs the whole trace): the flags it
//     carried (SEQ_INCREMENTAL_STATE_CLEARED, first_packet_on_sequence) move
//     to the next packet of that sequence.
//   - Pids and tids: Perfetto knows a process by its pid, and two ranks on
//     two nodes may both be pid 4242. Each rank's ids are replaced by fresh
//     ones from a block of its own: the k-th rank (node, then rank order)
//     starts at a multiple of 1000 (1000, 2000, ...: one more thousand for a
//     rank of more than 999 threads); its process gets the first, its
//     threads the next, the main thread keeping the process's id. The real
//     ids stay readable: the process is named "rank R on NODE: comm (pid
//     P)", each thread "name (tid T)".
//   - Timestamps: the node's CLOCK_MONOTONIC becomes the front's,
//     front_time() with the node's clock samples (job.h), drift included.
//     A packet of another clock (none that Remora writes) is left out.
//   - Node grouping: the root track descriptor (uuid 0) asks for processes
//     in explicit order (Perfetto v57 on), and each rank's process track
//     has its place as sibling_order_rank, so that the ranks of a node are
//     shown together, in rank order; the process also carries the labels
//     "node NODE" and "rank R".
// Packets or fields Remora's writer does not emit (ftrace, sequence
// defaults) are not remapped: they pass through as they are.
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "profile/merge_internal.h"
#include "profile/writers.h"

namespace remora::profile::merge {
namespace {

namespace pb = remora::perfetto_trace;

constexpr uint32_t kHeaderSequence = 1;
constexpr int32_t kPidBlock = 1000;

// The fresh ids of one rank, counted from the merger's next free ones and
// handed back only when the whole rank merged.
struct RankIds {
  uint64_t next_uuid;
  uint32_t next_sequence;
  int32_t next_pid;
  std::map<uint64_t, uint64_t> uuids;
  std::map<uint32_t, uint32_t> sequences;
  std::map<int64_t, int32_t> pids;             // pids and tids alike: a main thread's tid is its pid
  std::map<uint32_t, uint32_t> pending_flags;  // a new sequence -> flags of its dropped first packet
  std::map<uint32_t, bool> pending_first;
  std::map<uint32_t, bool> started;  // a packet of this new sequence was kept

  uint64_t uuid(uint64_t old) {
    if (old == 0) return 0;
    auto [it, added] = uuids.try_emplace(old, next_uuid);
    if (added) ++next_uuid;
    return it->second;
  }
  uint32_t sequence(uint32_t old) {
    auto [it, added] = sequences.try_emplace(old, next_sequence);
    if (added) ++next_sequence;
    return it->second;
  }
  int32_t pid(int64_t old) {
    if (old == 0) return 0;  // the idle task, or unknown: no process to confuse
    auto [it, added] = pids.try_emplace(old, next_pid);
    if (added) ++next_pid;
    return it->second;
  }
};

// Where a rank's packets stand while they are read.
struct RankState {
  const RankInput& in;
  RankIds ids;
  uint32_t trace_clock = pb::BUILTIN_CLOCK_BOOTTIME;  // Perfetto's default, until a snapshot says
  bool saw_process = false;
  uint64_t first_ts = 0;
  bool any_ts = false;
  size_t other_clock = 0;  // packets left out: a clock other than CLOCK_MONOTONIC
};

// A varint at data[*pos]; false when cut off or longer than 10 bytes.
bool read_varint(std::string_view data, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70 && *pos < data.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(data[(*pos)++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

void append_varint(std::string* out, uint64_t n) {
  for (; n >= 0x80; n >>= 7) *out += static_cast<char>((n & 0x7f) | 0x80);
  *out += static_cast<char>(n);
}

// Appends `packet` as a Trace's field 1 (tag 0x0a, length-delimited).
void append_packet(std::string* out, const pb::TracePacket& packet) {
  const std::string bytes = packet.SerializeAsString();
  *out += '\x0a';
  append_varint(out, bytes.size());
  *out += bytes;
}

// Calls fn(packet bytes) for each field 1 of a Trace message, skipping other
// fields as the wire format says; an error names the byte where it broke.
template <typename Fn>
Result<void> for_each_packet(std::string_view data, Fn fn) {
  size_t pos = 0, index = 0;
  while (pos < data.size()) {
    const size_t at = pos;
    uint64_t tag = 0, len = 0;
    if (!read_varint(data, &pos, &tag))
      return Error(Errc::kParse, "a field tag is cut off at byte " + std::to_string(at));
    switch (tag & 7) {
      case 0:
        if (!read_varint(data, &pos, &len))
          return Error(Errc::kParse, "a varint is cut off at byte " + std::to_string(at));
        continue;
      case 1: len = 8; break;
      case 5: len = 4; break;
      case 2:
        if (!read_varint(data, &pos, &len))
          return Error(Errc::kParse, "a length is cut off at byte " + std::to_string(at));
        break;
      default:
        return Error(Errc::kParse, "byte " + std::to_string(at) + " is no field of a trace (wire type " +
                                       std::to_string(tag & 7) + ")");
    }
    if (len > data.size() - pos)
      return Error(Errc::kParse,
                   "the field at byte " + std::to_string(at) + " runs past the end of the file");
    if (tag == ((1 << 3) | 2)) {
      auto r = fn(data.substr(pos, len));
      if (!r)
        return std::move(r).error().with_context("packet " + std::to_string(index) + " at byte " +
                                                 std::to_string(at));
      ++index;
    }
    pos += len;
  }
  return {};
}

void remap_descriptor(pb::TrackDescriptor* d, RankState& st) {
  d->set_uuid(st.ids.uuid(d->uuid()));
  if (d->has_parent_uuid()) d->set_parent_uuid(st.ids.uuid(d->parent_uuid()));
  const JobRank& r = *st.in.rank;
  if (d->has_process()) {
    pb::ProcessDescriptor* p = d->mutable_process();
    p->set_pid(st.ids.pid(p->pid()));
    JobRank named = r;
    if (named.comm.empty()) named.comm = p->process_name();
    p->set_process_name(valid_utf8(process_title(named)));
    p->clear_process_labels();
    p->add_process_labels(valid_utf8("node " + r.node));
    if (r.rank >= 0) p->add_process_labels("rank " + std::to_string(r.rank));
    d->set_sibling_order_rank(st.in.slot);
    st.saw_process = true;
  }
  if (d->has_thread()) {
    pb::ThreadDescriptor* t = d->mutable_thread();
    const int64_t tid = t->tid();
    t->set_pid(st.ids.pid(t->pid()));
    t->set_tid(st.ids.pid(tid));
    const std::string name = t->thread_name().empty() ? "thread" : t->thread_name();
    t->set_thread_name(name + " (tid " + std::to_string(tid) + ")");
  }
}

// Whether a packet stays: a rank's clock snapshots and root descriptor do
// not (the merge's own govern the trace); nor does a packet timed by a
// clock other than CLOCK_MONOTONIC, whose offset to the front is unknown.
bool keep(const pb::TracePacket& p, RankState& st) {
  if (p.has_clock_snapshot()) {
    if (p.clock_snapshot().has_primary_trace_clock())
      st.trace_clock = p.clock_snapshot().primary_trace_clock();
    return false;
  }
  if (p.has_track_descriptor() && p.track_descriptor().uuid() == 0 && !p.track_descriptor().has_process() &&
      !p.track_descriptor().has_thread())
    return false;
  if (p.has_timestamp()) {
    const uint32_t clock = p.has_timestamp_clock_id() ? p.timestamp_clock_id() : st.trace_clock;
    if (clock != pb::BUILTIN_CLOCK_MONOTONIC) {
      ++st.other_clock;
      return false;
    }
  }
  return true;
}

// Remaps one packet in place (see the file's comment); false when it is
// left out.
bool remap_packet(pb::TracePacket& p, RankState& st) {
  const uint32_t seq = st.ids.sequence(p.trusted_packet_sequence_id());
  if (!keep(p, st)) {
    // Its incremental-state flags belong to the next packet of its sequence.
    if (!st.ids.started[seq]) {
      st.ids.pending_flags[seq] |= p.sequence_flags() & pb::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED;
      st.ids.pending_first[seq] = st.ids.pending_first[seq] || p.first_packet_on_sequence();
    }
    return false;
  }
  p.set_trusted_packet_sequence_id(seq);
  if (!st.ids.started[seq]) {
    st.ids.started[seq] = true;
    if (uint32_t flags = st.ids.pending_flags[seq]) p.set_sequence_flags(p.sequence_flags() | flags);
    if (st.ids.pending_first[seq]) p.set_first_packet_on_sequence(true);
  }
  if (p.has_track_descriptor()) remap_descriptor(p.mutable_track_descriptor(), st);
  if (p.has_track_event() && p.track_event().has_track_uuid())
    p.mutable_track_event()->set_track_uuid(st.ids.uuid(p.track_event().track_uuid()));
  if (p.has_perf_sample()) {
    pb::PerfSample* s = p.mutable_perf_sample();
    if (s->has_pid()) s->set_pid(static_cast<uint32_t>(st.ids.pid(s->pid())));
    if (s->has_tid()) s->set_tid(static_cast<uint32_t>(st.ids.pid(s->tid())));
  }
  if (p.has_timestamp()) {
    const uint64_t ts = front_time(*st.in.clock, p.timestamp());
    p.set_timestamp(ts);
    if (!st.any_ts || ts < st.first_ts) st.first_ts = ts;
    st.any_ts = true;
  }
  return true;
}

}  // namespace

Result<std::string> TraceMerger::add(const RankInput& r, std::string_view bytes,
                                     std::vector<std::string>* warnings) {
  RankState st{r, RankIds{next_uuid_, next_sequence_, 0, {}, {}, {}, {}, {}, {}}};
  // The rank's block of ids: the next multiple of kPidBlock.
  const int64_t base = (static_cast<int64_t>(next_pid_) + kPidBlock) / kPidBlock * kPidBlock;
  if (base > std::numeric_limits<int32_t>::max() - kPidBlock)
    return Error(Errc::kNotSupported, "the job has too many processes and threads for one trace's pids");
  st.ids.next_pid = static_cast<int32_t>(base);
  std::string out;
  out.reserve(bytes.size() + bytes.size() / 8);
  pb::TracePacket packet;
  auto parsed = for_each_packet(bytes, [&](std::string_view data) -> Result<void> {
    if (!packet.ParseFromArray(data.data(), static_cast<int>(data.size())))
      return Error(Errc::kParse, "not a TracePacket");
    if (remap_packet(packet, st)) append_packet(&out, packet);
    return {};
  });
  if (!parsed) return std::move(parsed).error();
  if (!st.saw_process)
    return Error(Errc::kParse, "it holds no process track: it is not a trace of a session");
  if (st.other_clock > 0)
    warnings->push_back(rank_title(*r.rank) + ": " + std::to_string(st.other_clock) +
                        " packets of its trace.perfetto are timed by another clock than CLOCK_MONOTONIC, "
                        "which remora cannot align with the front's: left out");
  next_uuid_ = st.ids.next_uuid;
  next_sequence_ = st.ids.next_sequence;
  next_pid_ = st.ids.next_pid - 1;
  if (st.any_ts && (first_ts_ == 0 || st.first_ts < first_ts_)) first_ts_ = st.first_ts;
  return out;
}

std::string TraceMerger::header(uint64_t first_ts) {
  std::string out;
  pb::TracePacket clock;
  clock.set_trusted_packet_sequence_id(kHeaderSequence);
  clock.set_timestamp(first_ts);
  clock.set_timestamp_clock_id(pb::BUILTIN_CLOCK_MONOTONIC);
  clock.set_sequence_flags(pb::TracePacket::SEQ_INCREMENTAL_STATE_CLEARED);
  clock.set_first_packet_on_sequence(true);
  pb::ClockSnapshot* snap = clock.mutable_clock_snapshot();
  pb::ClockSnapshot::Clock* c = snap->add_clocks();
  c->set_clock_id(pb::BUILTIN_CLOCK_MONOTONIC);
  c->set_timestamp(first_ts);
  snap->set_primary_trace_clock(pb::BUILTIN_CLOCK_MONOTONIC);
  append_packet(&out, clock);
  pb::TracePacket root;
  root.set_trusted_packet_sequence_id(kHeaderSequence);
  pb::TrackDescriptor* d = root.mutable_track_descriptor();
  d->set_uuid(0);
  d->set_process_ordering(pb::TrackDescriptor::PROCESS_ORDERING_EXPLICIT);
  append_packet(&out, root);
  return out;
}

}  // namespace remora::profile::merge
