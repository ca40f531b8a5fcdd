// prism_quantize_rows' argument check, shared by the CPU and CUDA handlers (the Python wrapper
// checks first, with friendlier words): y [M, D] -> q [digits * M, D], s [digits * M].
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

inline ffi::Error CheckQuantizeRows(ffi::AnyBuffer::Dimensions y, ffi::AnyBuffer::Dimensions q,
                                    ffi::AnyBuffer::Dimensions s, int32_t digits) {
  const std::string op = "prism_quantize_rows: ";
  PRISM_REQUIRE(digits == 1 || digits == 2, op + "digits must be 1 or 2");
  PRISM_REQUIRE(y.size() == 2, op + "y must be [M, D]");
  PRISM_REQUIRE(q.size() == 2 && q[0] == digits * y[0] && q[1] == y[1] && s.size() == 1 &&
                    s[0] == digits * y[0],
                op + "q must be [digits * M, D] and s [digits * M] for y " + DimsToString(y));
  return ffi::Error::Success();
}

}  // namespace prism
