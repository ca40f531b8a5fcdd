// prism_l2_prefetch's contract, shared by the CPU and CUDA handlers:
//   x (any buffer), after (any buffer, never read) -> token s32 [1] = 0; attr max_bytes (>= 0).
// On CUDA it asks the L2 for x's first min(bytes of x, max_bytes) bytes (0: all of them) and
// returns at once; the L2 fills while the kernels after it run. Nothing is computed, so no
// result depends on it: the model orders it with `after` (it runs once `after` exists) and the
// token (its consumer waits for the call), ops.l2_prefetch says how. On the CPU it is a no-op.
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

// The bytes to prefetch, or an error for a bad max_bytes or token.
inline ffi::Error L2PrefetchBytes(const ffi::AnyBuffer& x, int64_t token_size, int64_t max_bytes,
                                  int64_t* bytes) {
  PRISM_REQUIRE(max_bytes >= 0, "prism_l2_prefetch: max_bytes must be >= 0 (0: all of x), got " +
                                    std::to_string(max_bytes));
  PRISM_REQUIRE(token_size == 1, "prism_l2_prefetch: the token must be int32 [1]");
  const auto size = static_cast<int64_t>(x.size_bytes());
  *bytes = max_bytes > 0 && max_bytes < size ? max_bytes : size;
  return ffi::Error::Success();
}

}  // namespace prism
