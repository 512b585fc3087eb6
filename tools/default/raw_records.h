// The raw records of a session, handed to the controller at detach: one file,
// profile.remora, in the session's output directory, in the protobuf wire
// format of src/profile/proto/remora_raw.proto (message remora.raw.Session).
// The controller names the addresses and renders every output from it
// (`remora report DIR`): the target pays only for writing what it collected.
//
// The encoder is a few lines of our own (varints and length-delimited
// fields), so that no protobuf library is loaded into the target.
#ifndef REMORA_TOOLS_DEFAULT_RAW_RECORDS_H_
#define REMORA_TOOLS_DEFAULT_RAW_RECORDS_H_

#include <stdint.h>

#include <string>
#include <string_view>
#include <vector>

#include "profile.h"
#include "slots.h"

namespace remora_tool {

inline constexpr uint32_t kRawRecordsVersion = 1;
inline constexpr const char kRawRecordsFile[] = "profile.remora";

// A session written into a descriptor (REMORA_OUTPUT_FD: a memfd the
// controller made in this process and reads from its side) instead of a
// directory: one line of header, then exactly the bytes profile.remora would
// hold. The header is "REMORA-OUTPUT 1 PART <session directory name>\n";
// PART becomes DONE, in place, once the session is complete (the controller
// lays out a PART one as profile.remora.part: what was recorded before the
// process ended). cli/output_staging.cc reads this format.
inline constexpr const char kMemfdMagic[] = "REMORA-OUTPUT 1 ";
inline constexpr size_t kMemfdStateOffset = sizeof kMemfdMagic - 1;  // "PART" / "DONE"

// Protobuf wire format, append-only: what the encoder writes (exposed for
// the round-trip test, which reads the result with libprotobuf).
class WireWriter {
 public:
  void clear() { buf_.clear(); }
  bool empty() const { return buf_.empty(); }
  void varint_field(uint32_t field, uint64_t v);
  void sint_field(uint32_t field, int64_t v) {
    varint_field(field, static_cast<uint64_t>(v));
  }  // int32/int64
  void bytes_field(uint32_t field, std::string_view bytes);
  void packed_field(uint32_t field, const std::vector<uint64_t>& values);
  // A nested message: begin returns a mark, end patches in its length.
  size_t begin(uint32_t field);
  void end(size_t mark);
  const std::string& data() const { return buf_; }

 private:
  void varint(uint64_t v);
  void tag(uint32_t field, uint32_t wire_type) { varint((static_cast<uint64_t>(field) << 3) | wire_type); }
  std::string buf_;
};

// What the target knows of its own code at detach: every line of its maps
// that can hold code or name a file, and the ELF objects the dynamic linker
// has loaded, with their GNU build IDs (read from their own notes in memory).
struct RawContext {
  std::string maps_text;  // /proc/self/maps
  std::string exe;        // /proc/self/exe
  std::string tool_path;  // this tool's own file (dladdr)
};
RawContext capture_raw_context();

// The timeline's events, as Session fields: samples (17), calls (18),
// counters (21).
void encode_sample(WireWriter& w, const SampleEvent& s);
void encode_call(WireWriter& w, uint32_t field, const CallEvent& c);
void encode_counter(WireWriter& w, const CounterEvent& c);

// The encoded Session message: everything but the events a RawSpool holds
// (p.samples, p.calls and p.counters are encoded too, when filled).
std::string encode_raw_records(const Profile& p, const RawContext& ctx);

// The session's timeline events, encoded as the collector drains them and
// appended to DIR/profile.remora.part at each of its ticks, so that the
// detach adds only the rest of the session (stacks, statistics, maps) and
// costs the target the same whatever the session's length. A message's
// fields may come in any order and repeated fields may be spread out:
// events first, the rest after, is one Session. Without a file (not opened,
// or after a fork: the parent's file is not the child's) the events stay in
// memory until finish().
class RawSpool {
 public:
  // Opens DIR/profile.remora.part (O_EXCL). False with *error set.
  bool open(const std::string& dir, std::string* error);
  // Writes into descriptor `fd` (a memfd, kMemfdMagic's format) for the
  // session directory `dir` (named, never made); the spool owns `fd` from
  // here and closes it in finish/forget/discard.
  bool open_fd(int fd, const std::string& dir, std::string* error);
  void sample(const SampleEvent& s) { encode_sample(buf_, s); }
  void call(const CallEvent& c) { encode_call(buf_, 18, c); }
  void counter(const CounterEvent& c) { encode_counter(buf_, c); }
  // Appends the buffered events to the file (no-op without one). A write
  // error is kept for finish() to report; the events stay buffered.
  void flush();
  // Writes the events and `rest`, then the detach's CPU time since
  // `cpu_start` (Session.detach_cpu_ns, this thread's CPU clock), into
  // DIR/profile.remora: by renaming the part file when DIR is the one
  // opened, else as a new file. Closes the spool.
  bool finish(const std::string& dir, const std::string& rest, uint64_t cpu_start, std::string* error);
  // Drops the file without touching it (a forked child), and the buffer.
  void forget();
  // Closes and removes the part file (a session that never finished).
  void discard();

 private:
  std::string dir_;
  int fd_ = -1;
  WireWriter buf_;
  int write_errno_ = 0;
  bool in_memory_ = false;  // fd_ is a memfd of the controller's (open_fd)
};

}  // namespace remora_tool

#endif  // REMORA_TOOLS_DEFAULT_RAW_RECORDS_H_
