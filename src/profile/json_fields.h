// Reading JSON written by Remora (job.json, names.json) without exceptions:
// the text is parsed with allow_exceptions = false, and every field's type is
// checked before it is read, so that a wrong type is a message naming the
// field ("ranks[2].pid is not an integer"), never a throw.
#ifndef REMORA_PROFILE_JSON_FIELDS_H_
#define REMORA_PROFILE_JSON_FIELDS_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace remora::profile::internal {

using nlohmann::json;

// Reads the fields of one JSON object, remembering the first problem. A
// missing key leaves the default; a key of the wrong type is an error that
// names it ("ranks[2].pid is not an integer").
class Fields {
 public:
  Fields(const json& j, std::string where, std::string* error)
      : j_(j), where_(std::move(where)), error_(error) {}

  void str(const char* key, std::string* out) {
    if (const json* v = find(key)) {
      if (v->is_string())
        *out = v->get<std::string>();
      else
        fail(key, "a string");
    }
  }
  void u64(const char* key, uint64_t* out) {
    if (const json* v = find(key)) {
      if (v->is_number_unsigned())
        *out = v->get<uint64_t>();
      else if (v->is_number_integer() && v->get<int64_t>() >= 0)
        *out = static_cast<uint64_t>(v->get<int64_t>());
      else
        fail(key, "an integer from 0 to 2^64-1");
    }
  }
  void i64(const char* key, int64_t* out, const char* what = "a 64-bit integer") {
    if (const json* v = find(key)) {
      if (v->is_number_unsigned() && v->get<uint64_t>() <= std::numeric_limits<int64_t>::max())
        *out = static_cast<int64_t>(v->get<uint64_t>());
      else if (v->is_number_integer() && !v->is_number_unsigned())
        *out = v->get<int64_t>();
      else
        fail(key, what);
    }
  }
  void i32(const char* key, int* out) {
    int64_t v = *out;
    i64(key, &v, "a 32-bit integer");
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
      fail(key, "a 32-bit integer");
    else
      *out = static_cast<int>(v);
  }
  void boolean(const char* key, bool* out) {
    if (const json* v = find(key)) {
      if (v->is_boolean())
        *out = v->get<bool>();
      else
        fail(key, "true or false");
    }
  }
  // The array at `key` (nullptr when absent or not an array, the latter an error).
  const json* array(const char* key) {
    const json* v = find(key);
    if (v != nullptr && !v->is_array()) {
      fail(key, "an array");
      return nullptr;
    }
    return v;
  }
  const json* object(const char* key) {
    const json* v = find(key);
    if (v != nullptr && !v->is_object()) {
      fail(key, "an object");
      return nullptr;
    }
    return v;
  }
  std::string at(const char* key) const { return where_.empty() ? key : where_ + "." + key; }

 private:
  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  void fail(const char* key, const char* what) {
    if (error_->empty()) *error_ = at(key) + " is not " + what;
  }

  const json& j_;
  std::string where_;
  std::string* error_;
};

// Each element of the array at `key` of `f`, an object, read by
// read(element, "key[i]" as a path, error); an element that is no object is
// an error (the first one is kept) and left out.
template <typename T, typename Read>
std::vector<T> read_list(Fields& f, const char* key, Read read, std::string* error) {
  std::vector<T> out;
  const json* list = f.array(key);
  if (list == nullptr) return out;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string at = f.at(key) + "[" + std::to_string(i) + "]";
    if (!(*list)[i].is_object()) {
      if (error->empty()) *error = at + " is not an object";
      continue;
    }
    out.push_back(read((*list)[i], at, error));
  }
  return out;
}

}  // namespace remora::profile::internal

#endif  // REMORA_PROFILE_JSON_FIELDS_H_
