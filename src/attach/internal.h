// What attach.cc and follow.cc share inside the attach layer (not part of
// its interface).
#pragma once

#include <cstddef>
#include <functional>

namespace remora::attach::detail {

// Runs work(i) for every i < n, on one thread per core but at most four,
// the calling one included; returns when every call has returned.
void for_each_parallel(size_t n, const std::function<void(size_t)>& work);

}  // namespace remora::attach::detail
