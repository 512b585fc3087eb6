// Reading a session's raw records (profile.remora, the protobuf message
// remora.raw.Session of proto/remora_raw.proto), written by the default tool
// inside the target at detach.
#ifndef REMORA_PROFILE_RECORDS_H_
#define REMORA_PROFILE_RECORDS_H_

#include <string>
#include <string_view>

#include "base/result.h"
#include "profile/model.h"

namespace remora::profile {

inline constexpr const char kRawRecordsFile[] = "profile.remora";
inline constexpr uint32_t kRawRecordsVersion = 1;

// Parses the bytes of a profile.remora. A file of a newer version than this
// reader's, or one that does not parse, is refused with what to do. Indices
// out of range (a stack, a traced function) are refused too: every writer
// may index without checks.
Result<RawProfile> parse_raw_records(std::string_view bytes);
Result<RawProfile> read_raw_records(const std::string& path);

}  // namespace remora::profile

#endif  // REMORA_PROFILE_RECORDS_H_
