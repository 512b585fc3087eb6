// The outputs of a session, rendered by the controller from a symbolised
// Profile (model.h). Pure functions of the profile: unit-tested from
// hand-made ones, and each output parsed by an independent reader in the
// tests (python3's json, xml, csv, gzip and protobuf).
//
//   trace.json        Chrome trace-event JSON (nlohmann-json: always valid UTF-8)
//   trace.perfetto    native Perfetto trace (protobuf): process and thread
//                     tracks, CPU samples as interned callstacks, calls as
//                     slices, counters (RSS, CPU per thread)
//   profile.pb.gz     pprof (gzip'ed protobuf): go tool pprof, Pyroscope, speedscope
//   folded.txt        folded stacks (flamegraph.pl, speedscope)
//   flamegraph.svg    interactive flamegraph with search; source file:line in tooltips
//   stats.csv         per-function call statistics and samples per function
//                     and source line (RFC 4180)
//   summary.txt       the terminal summary (short C++ names)
#ifndef REMORA_PROFILE_WRITERS_H_
#define REMORA_PROFILE_WRITERS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "profile/model.h"

namespace remora::profile {

// Each writer returns false on an I/O error (errno set). Any thread may call
// them; each reads only `p` and writes only `out`. Names are arbitrary bytes:
// every output holds them as valid UTF-8 (ill-formed sequences become
// U+FFFD), and indices out of range (a stack's frame, a call's function)
// name "[unknown]" or "?" rather than fail.
bool write_trace_json(const Profile& p, FILE* out);
// Perfetto's own clock is BOOTTIME; this trace says it is CLOCK_MONOTONIC
// (a ClockSnapshot's primary_trace_clock and each packet's clock id).
bool write_perfetto(const Profile& p, FILE* out);
// gzip'ed. pprof's time_nanos is wall-clock time: the profile's monotonic
// start plus `realtime_minus_monotonic_ns` (CLOCK_REALTIME - CLOCK_MONOTONIC
// of the machine it ran on). Without it, the profile's own (the tool records
// it at the start), else this machine's offset now: right for
// a profile of this boot (`remora attach`, and `remora report` of a session
// recorded here since the last boot); the one part of a writer not a pure
// function of the profile.
bool write_pprof(const Profile& p, FILE* out, int64_t realtime_minus_monotonic_ns);
bool write_pprof(const Profile& p, FILE* out);
bool write_folded(const Profile& p, FILE* out);
bool write_flamegraph_svg(const Profile& p, FILE* out);
bool write_stats_csv(const Profile& p, FILE* out);
bool write_summary(const Profile& p, const std::string& dir, FILE* out);

// Helpers, exposed for the tests.
// A frame as the text outputs show it: "function" (folded, summary), with
// " (file:line)" added for tooltips and the CSV where known.
std::string frame_label(const Frame& f);
std::string frame_label_with_line(const Frame& f);
std::string frame_source(const Frame& f);  // "file:line", "file" (no line), "" (no file)
// xml_escape takes arbitrary bytes and returns valid UTF-8 text or an
// attribute value of an XML 1.0 document: each ill-formed sequence (RFC
// 3629's strict rules) becomes one U+FFFD per maximal subpart, markup and
// tab/LF/CR become references, characters XML 1.0 forbids become U+FFFD.
std::string xml_escape(const std::string& s);
std::string valid_utf8(const std::string& s);  // the same replacement, nothing escaped
std::string csv_field(const std::string& s);   // quoted when needed (RFC 4180)
// A C++ name shortened for the terminal summary (the files keep full names):
// each outermost template argument list becomes "<...>", unless it is flat
// and at most kShortTemplateArgs characters (see tools' former rules: names,
// operators, lambdas and Java's "<init>" are left alone). Pure.
inline constexpr size_t kShortTemplateArgs = 20;
std::string collapse_template_args(const std::string& name);
// "frame;frame;frame" -> count, merged over threads unless fold_threads.
std::map<std::string, uint64_t> folded_stacks(const Profile& p);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_WRITERS_H_
