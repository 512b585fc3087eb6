// profile.pb.gz, folded.txt and flamegraph.svg of a job (merge.h), from
// each rank's profile.pb.gz (pprof.cc wrote it, on the rank's node, where
// its symbols are): the pprof files are the one output that holds every
// sample's whole stack with its names, files and lines, so all three
// merged outputs are built from them.
//
// A rank's profile is checked whole before any of it is used (every id and
// string index resolves): the merge then indexes without checks, and a
// damaged file costs one rank, not the merge.

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "profile/merge_internal.h"
#include "profile/writers.h"
#include "profile/writers_internal.h"

namespace remora::profile::merge {
namespace {

constexpr size_t kMaxPprofBytes = 1ull << 30;          // compressed, as read
constexpr size_t kMaxPprofInflatedBytes = 4ull << 30;  // decompressed

// gunzip of `data` (a gzip or zlib stream: windowBits 15 + 32 detects
// which); an error when it is damaged or too large.
Result<std::string> inflate_all(const std::string& data) {
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 32) != Z_OK) return Error(Errc::kInternal, "zlib: inflateInit2 failed");
  std::string out;
  char buf[1 << 16];
  size_t fed = 0;
  int rc = Z_OK;
  do {
    if (zs.avail_in == 0 && fed < data.size()) {  // avail_in is 32 bits: at most 1 GiB at a time
      const size_t n = std::min<size_t>(data.size() - fed, 1u << 30);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data() + fed));
      zs.avail_in = static_cast<uInt>(n);
      fed += n;
    }
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) break;        // damaged
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && fed == data.size()) break;  // cut off
    out.append(buf, sizeof buf - zs.avail_out);
    if (out.size() > kMaxPprofInflatedBytes) {
      inflateEnd(&zs);
      return Error(Errc::kParse,
                   "it inflates to more than " + std::to_string(kMaxPprofInflatedBytes >> 30) + " GiB");
    }
  } while (rc != Z_STREAM_END);
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) return Error(Errc::kParse, "its gzip stream is damaged or cut off");
  return out;
}

// What is wrong with `p` ("" nothing): an id or string index that does not
// resolve, or a sample of another number of values than sample types.
std::string check(const pprof::Profile& p) {
  const auto n = static_cast<int64_t>(p.string_table_size());
  if (n == 0 || !p.string_table(0).empty()) return "its string table does not start with \"\"";
  std::string bad;
  auto str = [&](const char* what, std::initializer_list<int64_t> indices) {
    for (int64_t i : indices)
      if ((i < 0 || i >= n) && bad.empty())
        bad = std::string(what) + " names string " + std::to_string(i) + " of " + std::to_string(n);
  };
  for (const auto& t : p.sample_type()) str("a sample type", {t.type(), t.unit()});
  str("the period type", {p.period_type().type(), p.period_type().unit()});
  for (int64_t c : p.comment()) str("a comment", {c});
  std::set<uint64_t> mappings, functions, locations;
  for (const auto& m : p.mapping()) {
    mappings.insert(m.id());
    str("a mapping", {m.filename(), m.build_id()});
  }
  for (const auto& f : p.function()) {
    functions.insert(f.id());
    str("a function", {f.name(), f.system_name(), f.filename()});
  }
  for (const auto& l : p.location()) {
    locations.insert(l.id());
    if (l.mapping_id() != 0 && !mappings.count(l.mapping_id()))
      return "a location names mapping " + std::to_string(l.mapping_id()) + ", which it does not hold";
    for (const auto& line : l.line())
      if (!functions.count(line.function_id()))
        return "a location names function " + std::to_string(line.function_id()) + ", which it does not hold";
  }
  for (const auto& s : p.sample()) {
    if (s.value_size() != p.sample_type_size())
      return "a sample has " + std::to_string(s.value_size()) + " values for " +
             std::to_string(p.sample_type_size()) + " sample types";
    for (uint64_t id : s.location_id())
      if (!locations.count(id))
        return "a sample names location " + std::to_string(id) + ", which it does not hold";
    for (const auto& l : s.label()) str("a label", {l.key(), l.str()});
  }
  return bad;
}

// The index of the sample type counting samples ("samples"), else the first.
int samples_index(const pprof::Profile& p) {
  for (int i = 0; i < p.sample_type_size(); ++i)
    if (p.string_table(static_cast<int>(p.sample_type(i).type())) == "samples") return i;
  return 0;
}

uint64_t weight(const pprof::Sample& s, int index) {
  return index < s.value_size() && s.value(index) > 0 ? static_cast<uint64_t>(s.value(index)) : 0;
}

// The messages of a (checked) profile by id.
struct Index {
  std::map<uint64_t, const pprof::Location*> locations;
  std::map<uint64_t, const pprof::Function*> functions;
  std::map<uint64_t, const pprof::Mapping*> mappings;
  explicit Index(const pprof::Profile& p) {
    for (const auto& l : p.location()) locations[l.id()] = &l;
    for (const auto& f : p.function()) functions[f.id()] = &f;
    for (const auto& m : p.mapping()) mappings[m.id()] = &m;
  }
};

const std::string& s_at(const pprof::Profile& p, int64_t i) { return p.string_table(static_cast<int>(i)); }

std::string type_names(const std::vector<std::pair<std::string, std::string>>& types) {
  std::string out;
  for (const auto& [type, unit] : types) out += (out.empty() ? "" : ", ") + type + "/" + unit;
  return out;
}

}  // namespace

Result<pprof::Profile> read_pprof(const std::string& path) {
  std::string bytes = REMORA_TRY(read_file(path, kMaxPprofBytes));
  if (bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x1f && static_cast<uint8_t>(bytes[1]) == 0x8b)
    bytes = REMORA_TRY(inflate_all(bytes));
  pprof::Profile p;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Error(Errc::kParse, "it is not a pprof profile");
  if (std::string why = check(p); !why.empty()) return Error(Errc::kParse, "it is inconsistent: " + why);
  return p;
}

RankSamples rank_samples(const pprof::Profile& p) {
  RankSamples out;
  const int vi = samples_index(p);
  const Index index(p);
  std::map<std::string, uint64_t> self;
  for (const auto& s : p.sample()) {
    const uint64_t w = weight(s, vi);
    out.total += w;
    if (s.location_id_size() == 0) continue;
    const pprof::Location* leaf = index.locations.at(s.location_id(0));
    if (leaf->line_size() == 0) continue;
    self[s_at(p, index.functions.at(leaf->line(0).function_id())->name())] += w;  // the innermost
  }
  for (const auto& [name, n] : self)  // by name: the first of equal counts wins, deterministically
    if (n > out.hottest_samples) out.hottest = name, out.hottest_samples = n;
  return out;
}

// ---- PprofMerger ----

PprofMerger::PprofMerger() { str(""); }  // string_table[0] is ""

int64_t PprofMerger::str(const std::string& s) {
  auto [it, added] = strings_.try_emplace(s, static_cast<int64_t>(strings_.size()));
  if (added) out_.add_string_table(s);
  return it->second;
}

uint64_t PprofMerger::function(const pprof::Profile& in, const pprof::Function& f) {
  std::tuple<std::string, std::string, std::string> key{s_at(in, f.name()), s_at(in, f.system_name()),
                                                        s_at(in, f.filename())};
  auto [it, added] = functions_.try_emplace(key, functions_.size() + 1);
  if (!added) return it->second;
  pprof::Function* out = out_.add_function();
  out->set_id(it->second);
  out->set_name(str(std::get<0>(key)));
  out->set_system_name(str(std::get<1>(key)));
  if (f.filename() != 0) out->set_filename(str(std::get<2>(key)));
  return it->second;
}

// Mappings and locations are shared only when equal in every field (after
// their ids are remapped): the same library at the same address in two
// ranks is one mapping; at another address, two.
uint64_t PprofMerger::mapping(const pprof::Profile& in, const pprof::Mapping& m) {
  pprof::Mapping copy = m;
  copy.clear_id();
  copy.set_filename(str(s_at(in, m.filename())));
  if (m.build_id() != 0) copy.set_build_id(str(s_at(in, m.build_id())));
  auto [it, added] = mappings_.try_emplace(copy.SerializeAsString(), mappings_.size() + 1);
  if (added) {
    copy.set_id(it->second);
    *out_.add_mapping() = std::move(copy);
  }
  return it->second;
}

uint64_t PprofMerger::location(const pprof::Location& l, const std::map<uint64_t, uint64_t>& mappings,
                               const std::map<uint64_t, uint64_t>& functions) {
  pprof::Location copy = l;
  copy.clear_id();
  if (l.mapping_id() != 0) copy.set_mapping_id(mappings.at(l.mapping_id()));
  for (auto& line : *copy.mutable_line()) line.set_function_id(functions.at(line.function_id()));
  auto [it, added] = locations_.try_emplace(copy.SerializeAsString(), locations_.size() + 1);
  if (added) {
    copy.set_id(it->second);
    *out_.add_location() = std::move(copy);
  }
  return it->second;
}

void PprofMerger::add_label(pprof::Sample* s, const std::string& key, const std::string* str_value,
                            int64_t num) {
  pprof::Label* l = s->add_label();
  l->set_key(str(key));
  if (str_value != nullptr)
    l->set_str(str(*str_value));
  else
    l->set_num(num);
}

Result<void> PprofMerger::add(const pprof::Profile& in, const JobRank& r) {
  std::vector<std::pair<std::string, std::string>> types;
  for (const auto& t : in.sample_type()) types.emplace_back(s_at(in, t.type()), s_at(in, t.unit()));
  if (profiles_ == 0) {
    sample_types_ = types;
    for (const auto& [type, unit] : types) {
      pprof::ValueType* v = out_.add_sample_type();
      v->set_type(str(type));
      v->set_unit(str(unit));
    }
    out_.mutable_period_type()->set_type(str(s_at(in, in.period_type().type())));
    out_.mutable_period_type()->set_unit(str(s_at(in, in.period_type().unit())));
    out_.set_period(in.period());
  } else if (types != sample_types_) {
    return Error(Errc::kParse, "its sample types (" + type_names(types) + ") are not the first rank's (" +
                                   type_names(sample_types_) + ")");
  }
  std::map<uint64_t, uint64_t> mappings, functions, locations;
  for (const auto& m : in.mapping()) mappings[m.id()] = mapping(in, m);
  for (const auto& f : in.function()) functions[f.id()] = function(in, f);
  for (const auto& l : in.location()) locations[l.id()] = location(l, mappings, functions);
  const std::string node = valid_utf8(r.node);
  for (const auto& s : in.sample()) {
    pprof::Sample* out = out_.add_sample();
    for (uint64_t id : s.location_id()) out->add_location_id(locations.at(id));
    *out->mutable_value() = s.value();
    for (const auto& l : s.label()) {
      pprof::Label* copy = out->add_label();
      *copy = l;
      copy->set_key(str(s_at(in, l.key())));
      if (l.str() != 0) copy->set_str(str(s_at(in, l.str())));
    }
    add_label(out, "node", &node, 0);
    add_label(out, "rank", nullptr, r.rank);
    add_label(out, "local_rank", nullptr, r.local_rank);
    add_label(out, "pid", nullptr, r.pid);
  }
  for (int64_t c : in.comment()) out_.add_comment(str(s_at(in, c)));
  if (in.time_nanos() != 0) {
    const int64_t end = in.time_nanos() + std::max<int64_t>(in.duration_nanos(), 0);
    if (first_ns_ == 0 || in.time_nanos() < first_ns_) first_ns_ = in.time_nanos();
    last_ns_ = std::max(last_ns_, end);
  }
  ++profiles_;
  return {};
}

pprof::Profile PprofMerger::take(const std::string& comment) {
  out_.add_comment(str(valid_utf8(comment)));
  out_.set_time_nanos(first_ns_);
  out_.set_duration_nanos(last_ns_ > first_ns_ ? last_ns_ - first_ns_ : 0);
  return std::move(out_);
}

// ---- StackModel ----

uint32_t StackModel::frame(const Frame& f) {
  auto [it, added] = frames_.try_emplace({f.function, f.file, f.line, f.module, f.inlined},
                                         static_cast<uint32_t>(p_.frames.size()));
  if (added) p_.frames.push_back(f);
  return it->second;
}

void StackModel::add(const pprof::Profile& in, const JobRank& r) {
  const Index index(in);
  const int vi = samples_index(in);
  Frame node_root, rank_root;
  node_root.function = r.node;
  rank_root.function = rank_frame(r);
  const uint32_t roots[] = {frame(node_root), frame(rank_root)};
  for (const auto& s : in.sample()) {
    std::vector<uint32_t> stack(std::begin(roots), std::end(roots));
    // pprof's locations are leaf first, each location's lines innermost
    // first; the model's stacks are root first.
    for (auto id = s.location_id().rbegin(); id != s.location_id().rend(); ++id) {
      const pprof::Location* loc = index.locations.at(*id);
      const pprof::Mapping* m = loc->mapping_id() != 0 ? index.mappings.at(loc->mapping_id()) : nullptr;
      for (int i = loc->line_size() - 1; i >= 0; --i) {
        const pprof::Function* fn = index.functions.at(loc->line(i).function_id());
        Frame f;
        f.function = s_at(in, fn->name());
        f.file = s_at(in, fn->filename());
        f.line = static_cast<uint32_t>(
            std::clamp<int64_t>(loc->line(i).line(), 0, std::numeric_limits<uint32_t>::max()));
        f.module = m != nullptr ? s_at(in, m->filename()) : "";
        f.address = loc->address();
        f.inlined = i != loc->line_size() - 1;  // all but the outermost were inlined into it
        stack.push_back(frame(f));
      }
    }
    const uint64_t w = weight(s, vi);
    if (w == 0) continue;
    auto [it, added] = stacks_.try_emplace(stack, static_cast<uint32_t>(p_.stacks.size()));
    if (added) p_.stacks.push_back(std::move(stack));
    p_.stack_weights[{0, it->second}] += w;
    p_.samples_total += w;
  }
}

// gzip'ed as pprof.cc writes a rank's profile.
bool write_pprof_gz(const pprof::Profile& p, FILE* out) {
  std::string data;
  if (!p.SerializeToString(&data)) {
    errno = EINVAL;
    return false;
  }
  return internal::write_gzip(data, out) && std::ferror(out) == 0;
}

}  // namespace remora::profile::merge
