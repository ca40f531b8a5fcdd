// The quantising norms' `digits` attribute (prism_rmsnorm_quant, prism_add_rmsnorm_quant,
// prism_norm_add_rmsnorm_quant; CPU and CUDA): 1, or 2 for float32 rows. With two, x_q
// [2M, D] and s_x [2M] hold the second digit's rows after the first, prism_quantize_rows'
// layout, so one call replaces the two-digit path's norm and prism_quantize_rows pair. Checks
// x's rank itself, so a handler may call it before its other checks.
// The _sum forms (prism_add_rmsnorm_quant_sum, prism_norm_add_rmsnorm_quant_sum) take x as a
// two-digit projection's partial products, x2 = [x1 W1; x2 W1] [2M, D] and x_w2 = x1 W2
// [M, D], both float32, and normalise x = x2[:M] + (x2[M:] + x_w2) (Int8Linear's order).
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

inline ffi::Error CheckNormSumParts(const ffi::AnyBuffer& x2, const ffi::AnyBuffer& x_w2,
                                    const std::string& op) {
  PRISM_REQUIRE(x2.element_type() == ffi::DataType::F32 &&
                    x_w2.element_type() == ffi::DataType::F32,
                op + ": the partial products x2 and x_w2 must be float32");
  const auto hi = x2.dimensions(), lo = x_w2.dimensions();
  PRISM_REQUIRE(lo.size() == 2 && hi.size() == 2 && hi[0] == 2 * lo[0] && hi[1] == lo[1],
                op + ": x2 must be [2M, D] (x1 W1 over x2 W1) for x_w2 [M, D], got x2 " +
                    DimsToString(hi) + " and x_w2 " + DimsToString(lo));
  return ffi::Error::Success();
}

}  // namespace prism
