// The quantising norms' `digits` attribute (prism_rmsnorm_quant, prism_add_rmsnorm_quant,
// prism_norm_add_rmsnorm_quant; CPU and CUDA): 1, or 2 for float32 rows. With two, x_q
// [2M, D] and s_x [2M] hold the second digit's rows after the first, prism_quantize_rows'
// layout, so one call replaces the two-digit path's norm and prism_quantize_rows pair. Checks
// x's rank itself, so a handler may call it before its other checks.
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

inline ffi::Error CheckNormDigits(const ffi::AnyBuffer& x, ffi::AnyBuffer::Dimensions q,
                                  ffi::AnyBuffer::Dimensions s, int32_t digits,
                                  const std::string& op) {
  PRISM_REQUIRE(x.dimensions().size() == 2, op + ": x must be [M, D]");
  PRISM_REQUIRE(digits == 1 || digits == 2, op + ": digits must be 1 or 2");
  PRISM_REQUIRE(digits == 1 || x.element_type() == ffi::DataType::F32,
                op + ": two digits need float32 rows (the int8 model's activations)");
  const auto xd = x.dimensions();
  PRISM_REQUIRE(q.size() == 2 && q[0] == digits * xd[0] && q[1] == xd[1] && s.size() == 1 &&
                    s[0] == digits * xd[0],
                op + ": x_q must be [digits * M, D] and s_x [digits * M] for x " +
                    DimsToString(xd));
  return ffi::Error::Success();
}

}  // namespace prism
