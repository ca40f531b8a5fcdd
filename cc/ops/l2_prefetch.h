// prism_l2_prefetch's contract, shared by the CPU and CUDA handlers:
//   x (any buffer), after (any buffer) -> after, unchanged (aliased: XLA passes the same
//   buffer back, so nothing is copied); attr max_bytes (>= 0).
// On CUDA it asks the L2 for x's first min(bytes of x, max_bytes) bytes (0: all of them) and
// returns at once; the L2 fills while the kernels after it run. Nothing is computed from x.
// `after` orders the call: it runs once `after` exists, and whatever consumes its result runs
// after it (a data dependency, which XLA keeps, unlike an optimization barrier, which its
// GPU and CPU pipelines expand away before scheduling). On the CPU it only passes `after` on.
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

// The bytes to prefetch, or an error for a bad max_bytes or a result unlike `after`.
inline ffi::Error L2PrefetchBytes(const ffi::AnyBuffer& x, const ffi::AnyBuffer& after,
                                  const ffi::AnyBuffer& out, int64_t max_bytes, int64_t* bytes) {
  PRISM_REQUIRE(max_bytes >= 0, "prism_l2_prefetch: max_bytes must be >= 0 (0: all of x), got " +
                                    std::to_string(max_bytes));
  PRISM_REQUIRE(out.size_bytes() == after.size_bytes() &&
                    out.element_type() == after.element_type(),
                "prism_l2_prefetch: the result must be `after` itself (same shape and dtype)");
  const auto size = static_cast<int64_t>(x.size_bytes());
  *bytes = max_bytes > 0 && max_bytes < size ? max_bytes : size;
  return ffi::Error::Success();
}

}  // namespace prism
