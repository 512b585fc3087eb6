#include "profile/names.h"

#include <sys/stat.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "profile/json_fields.h"

namespace remora::profile {
namespace {

using internal::Fields;
using internal::read_list;
using nlohmann::json;

constexpr const char* kFormat = "remora-names 1";

const char* level_name(DebugLevel l) {
  switch (l) {
    case DebugLevel::kDwarf: return "dwarf";
    case DebugLevel::kSymtab: return "symtab";
    case DebugLevel::kNone: break;
  }
  return "none";
}

bool level_from_name(const std::string& s, DebugLevel* out) {
  for (DebugLevel l : {DebugLevel::kNone, DebugLevel::kSymtab, DebugLevel::kDwarf})
    if (s == level_name(l)) {
      *out = l;
      return true;
    }
  return false;
}

json frame_json(const Frame& f) {
  json j = {{"function", f.function},
            {"address", f.address},
            {"offset", f.module_offset},
            {"kind", static_cast<int>(f.kind)}};
  if (!f.module.empty()) j["module"] = f.module;
  if (!f.file.empty()) j["file"] = f.file;
  if (f.line != 0) j["line"] = f.line;
  if (f.inlined) j["inlined"] = true;
  return j;
}

Frame read_frame(const json& j, const std::string& where, std::string* error) {
  Frame f;
  Fields r(j, where, error);
  r.str("function", &f.function);
  r.str("module", &f.module);
  r.u64("address", &f.address);
  r.u64("offset", &f.module_offset);
  r.str("file", &f.file);
  int line = 0, kind = 0;
  r.i32("line", &line);
  r.i32("kind", &kind);
  r.boolean("inlined", &f.inlined);
  if (line < 0 && error->empty()) *error = r.at("line") + " is negative";
  if ((kind < 0 || kind > static_cast<int>(FrameKind::kTruncated)) && error->empty())
    *error = r.at("kind") + " is no frame kind";
  f.line = static_cast<uint32_t>(std::max(line, 0));
  f.kind = static_cast<FrameKind>(std::clamp(kind, 0, static_cast<int>(FrameKind::kTruncated)));
  return f;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

NameTable record_names(const RawProfile& raw, Symbolizer& sym) {
  NameTable t;
  std::map<std::string, int32_t> object_index;
  for_each_address(raw, [&](uint64_t pc, bool ra) {
    NamedAddress a;
    a.pc = pc;
    a.return_address = ra;
    a.tool = sym.is_tool_frame(pc);
    if (!a.tool) {
      a.frames = sym.frames_at(pc, ra);
      if (auto n = sym.object_naming(pc, ra)) {
        auto [it, added] = object_index.emplace(n->path, static_cast<int32_t>(t.objects.size()));
        if (added) t.objects.push_back(std::move(*n));
        a.object = it->second;
      }
    }
    t.addresses.push_back(std::move(a));
  });
  t.warnings = sym.object_warnings();
  return t;
}

std::string names_to_json(const NameTable& t) {
  json objects = json::array(), addresses = json::array(), warnings = json::array();
  for (const auto& o : t.objects)
    objects.push_back({{"path", o.path}, {"build_id", o.build_id}, {"level", level_name(o.level)}});
  for (const auto& a : t.addresses) {
    json frames = json::array();
    for (const auto& f : a.frames) frames.push_back(frame_json(f));
    json j = {{"pc", a.pc}, {"frames", std::move(frames)}};
    if (a.return_address) j["return_address"] = true;
    if (a.tool) j["tool"] = true;
    if (a.object >= 0) j["object"] = a.object;
    addresses.push_back(std::move(j));
  }
  for (const auto& w : t.warnings) {
    json j = {{"text", w.text}};
    if (!w.object.empty()) j["object"] = w.object;
    warnings.push_back(std::move(j));
  }
  json j = {{"format", kFormat},
            {"objects", std::move(objects)},
            {"addresses", std::move(addresses)},
            {"warnings", std::move(warnings)},
            {"notes", t.notes}};
  if (t.realtime_offset_ns != 0) j["realtime_offset_ns"] = t.realtime_offset_ns;
  if (t.pid != 0) j["pid"] = t.pid;
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<NameTable> names_from_json(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Error(Errc::kInvalidArgument, std::string(kNamesFile) + " is not JSON");
  std::string error, format;
  Fields f(j, "", &error);
  f.str("format", &format);
  if (error.empty() && format != kFormat)
    return Error(Errc::kInvalidArgument, std::string(kNamesFile) + " is \"" + format + "\", not \"" +
                                             kFormat +
                                             "\": a newer remora wrote it; render it with that one");
  NameTable t;
  f.i64("realtime_offset_ns", &t.realtime_offset_ns);
  f.i32("pid", &t.pid);
  t.objects = read_list<ObjectNaming>(
      f, "objects",
      [&](const json& o, const std::string& at, std::string*) {
        ObjectNaming n;
        Fields r(o, at, &error);
        std::string level = "none";
        r.str("path", &n.path);
        r.str("build_id", &n.build_id);
        r.str("level", &level);
        if (!level_from_name(level, &n.level) && error.empty()) error = r.at("level") + " is no debug level";
        return n;
      },
      &error);
  t.addresses = read_list<NamedAddress>(
      f, "addresses",
      [&](const json& o, const std::string& at, std::string*) {
        NamedAddress a;
        Fields r(o, at, &error);
        r.u64("pc", &a.pc);
        r.boolean("return_address", &a.return_address);
        r.boolean("tool", &a.tool);
        r.i32("object", &a.object);
        if ((a.object < -1 || a.object >= static_cast<int32_t>(t.objects.size())) && error.empty())
          error = r.at("object") + " names no object";
        a.frames = read_list<Frame>(r, "frames", read_frame, &error);
        return a;
      },
      &error);
  t.warnings = read_list<ObjectWarning>(
      f, "warnings",
      [&](const json& o, const std::string& at, std::string*) {
        ObjectWarning w;
        Fields r(o, at, &error);
        r.str("object", &w.object);
        r.str("text", &w.text);
        return w;
      },
      &error);
  if (const json* notes = f.array("notes"))
    for (const auto& n : *notes) {
      if (!n.is_string()) {
        if (error.empty()) error = "notes holds a value that is not a string";
        break;
      }
      t.notes.push_back(n.get<std::string>());
    }
  if (!error.empty()) return Error(Errc::kInvalidArgument, std::string(kNamesFile) + ": " + error);
  return t;
}

std::string find_debug_file(const std::string& build_id, const std::vector<std::string>& dirs) {
  if (build_id.size() <= 2) return "";
  const std::string rel = "/.build-id/" + build_id.substr(0, 2) + "/" + build_id.substr(2) + ".debug";
  for (const auto& d : dirs)
    if (is_file(d + rel)) return d + rel;
  return is_file("/usr/lib/debug" + rel) ? "/usr/lib/debug" + rel : "";
}

size_t improve_names(NameTable* t, SymbolSource host) {
  std::map<int32_t, std::string> candidates;  // object -> the debug file found for it
  for (size_t i = 0; i < t->objects.size(); ++i) {
    const ObjectNaming& o = t->objects[i];
    if (o.level == DebugLevel::kDwarf || o.build_id.empty()) continue;
    std::string found = find_debug_file(o.build_id, host.debug_dirs);
    if (!found.empty()) candidates.emplace(static_cast<int32_t>(i), std::move(found));
  }
  if (candidates.empty()) return 0;
  host.pid = 0;  // this machine's files only: never a live process
  Symbolizer sym(std::move(host));
  std::map<int32_t, DebugLevel> improved;
  for (auto& a : t->addresses) {
    if (a.tool || candidates.count(a.object) == 0) continue;
    const ObjectNaming& was = t->objects[static_cast<size_t>(a.object)];
    std::vector<Frame> frames = sym.frames_at(a.pc, a.return_address);
    auto now = sym.object_naming(a.pc, a.return_address);
    if (!now || now->path != was.path || now->build_id != was.build_id || now->level <= was.level) continue;
    a.frames = std::move(frames);
    improved[a.object] = now->level;
  }
  for (const auto& [i, level] : improved) {
    ObjectNaming& o = t->objects[static_cast<size_t>(i)];
    const std::string note = "symbols: " + o.path + " (build ID " + o.build_id +
                             ") is named from debug info found after the session was recorded (" +
                             candidates[i] + "): these outputs differ from the first render in its frames";
    o.level = level;
    // The object's warning (one at most) becomes the note.
    auto& w = t->warnings;
    auto about = [&](const ObjectWarning& x) { return x.object == o.path; };
    auto first = std::find_if(w.begin(), w.end(), about);
    if (first == w.end()) {
      w.push_back({o.path, note});
      continue;
    }
    first->text = note;
    w.erase(std::remove_if(first + 1, w.end(), about), w.end());
  }
  return improved.size();
}

RecordedNames::RecordedNames(const NameTable& table) {
  for (const auto& a : table.addresses) {
    by_pc_[{a.pc, a.return_address}] = &a;
    if (a.tool) tool_pcs_.insert(a.pc);
  }
  for (const auto& w : table.warnings) warnings_.push_back(w.text);
}

std::vector<Frame> RecordedNames::frames_at(uint64_t pc, bool return_address) {
  auto it = by_pc_.find({pc, return_address});
  if (it != by_pc_.end() && !it->second->frames.empty()) return it->second->frames;
  // Not recorded (records changed after the collection): named as an
  // address in no object, never after a guess.
  Frame f;
  f.address = return_address && pc > 0 ? pc - 1 : pc;
  f.module_offset = f.address;
  f.function = "[unknown]";
  f.kind = FrameKind::kUnknown;
  return {f};
}

bool RecordedNames::is_tool_frame(uint64_t pc) const { return tool_pcs_.count(pc) != 0; }

std::vector<std::string> RecordedNames::warnings() const { return warnings_; }

}  // namespace remora::profile
