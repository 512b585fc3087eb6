// trace.json: the timeline as Chrome trace-event JSON (nlohmann-json).
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "profile/writers.h"
#include "profile/writers_internal.h"

namespace remora::profile {

using namespace internal;

// ---- trace.json ----

namespace {

using nlohmann::json;

// Every string put in a json value is valid_utf8 already; the replace
// handler is the belt to those braces: dump() never fails (with exceptions
// off, nlohmann would abort on invalid UTF-8).
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Buffers events and writes them in large blocks.
class EventSink {
 public:
  explicit EventSink(FILE* out) : out_(out) { buf_.reserve(kFlushAt + 4096); }
  void add(const json& event) {
    if (!first_) buf_ += ",\n";
    first_ = false;
    buf_ += dump(event);
    if (buf_.size() >= kFlushAt) flush();
  }
  void raw(std::string_view s) { buf_ += s; }
  bool flush() {
    ok_ = internal::write_all(out_, buf_.data(), buf_.size()) && ok_;
    buf_.clear();
    return ok_;
  }

 private:
  static constexpr size_t kFlushAt = 1 << 20;
  FILE* out_;
  std::string buf_;
  bool first_ = true;
  bool ok_ = true;
};

// The traced calls as complete ("X") events on their thread. One event
// object, its fields assigned per call: sessions hold up to
// REMORA_MAX_EVENTS (a million) calls, and building each object anew costs
// more than writing it.
void add_call_events(const Profile& p, int pid, EventSink& sink) {
  std::vector<json> fn_names;
  fn_names.reserve(p.fn_names.size());
  for (const std::string& n : p.fn_names) fn_names.emplace_back(valid_utf8(n));
  const json unknown = "?";
  json call = {{"name", ""}, {"cat", "call"}, {"ph", "X"}, {"ts", 0.0},
               {"dur", 0.0}, {"pid", pid},    {"tid", 0}};
  json& name = call["name"];
  json& ts = call["ts"];
  json& dur = call["dur"];
  json& tid = call["tid"];
  for (const CallEvent& c : p.calls) {
    name = c.fn < fn_names.size() ? fn_names[c.fn] : unknown;
    ts = rel_us(p, c.start_ns);
    dur = static_cast<double>(c.dur_ns) / 1000.0;
    tid = c.tid;
    sink.add(call);
  }
}

// The samples of the timeline as instant events on their thread: the leaf
// function is the name, the stack (leaf last, at most 32 frames nearest the
// leaf) and the leaf's source line are in args.
void add_sample_events(const Profile& p, int pid, EventSink& sink) {
  const std::vector<std::string> labels =
      frame_labels(p, [](const Frame& f) { return valid_utf8(frame_label(f)); });
  for (const SampleEvent& s : p.samples) {
    const auto& frames = stack_at(p, s.stack);
    std::string stack;
    size_t first = frames.size() > 32 ? frames.size() - 32 : 0;
    for (size_t i = first; i < frames.size(); ++i) {
      if (!stack.empty()) stack += ';';
      stack += label_at(labels, frames[i]);
    }
    json args = {{"weight", s.weight}, {"stack", stack}};
    if (!frames.empty()) {
      const Frame& leaf = frame_at(p, frames.back());
      if (!leaf.file.empty()) args["source"] = valid_utf8(frame_source(leaf));
      if (!leaf.module.empty()) args["module"] = valid_utf8(leaf.module);
    }
    sink.add({{"name", frames.empty() ? std::string("?") : label_at(labels, frames.back())},
              {"cat", "sample"},
              {"ph", "i"},
              {"s", "t"},
              {"ts", rel_us(p, s.ts_ns)},
              {"pid", pid},
              {"tid", s.tid},
              {"args", std::move(args)}});
  }
}

}  // namespace

bool write_trace_json(const Profile& p, FILE* out) {
  const int pid = internal::trace_pid(p);
  json other = {{"tool", "remora"},
                {"pid", p.pid},
                {"session", p.session},
                {"sample_hz", p.sampling ? p.hz : 0},
                {"events_capped", p.events_capped}};
  if (pid != p.pid) other["ns_pid"] = pid;
  EventSink sink(out);
  sink.raw("{\"displayTimeUnit\":\"ns\",\"otherData\":" + dump(other) + ",\n\"traceEvents\":[\n");
  sink.add({{"name", "process_name"},
            {"ph", "M"},
            {"pid", pid},
            {"tid", pid},
            {"args", {{"name", valid_utf8(internal::process_label(p))}}}});
  for (int32_t tid : internal::all_tids(p))
    sink.add({{"name", "thread_name"},
              {"ph", "M"},
              {"pid", pid},
              {"tid", tid},
              {"args", {{"name", valid_utf8(internal::thread_name(p, tid))}}}});
  add_call_events(p, pid, sink);
  add_sample_events(p, pid, sink);
  sink.raw("\n]}\n");
  return sink.flush() && ferror(out) == 0;
}

}  // namespace remora::profile
