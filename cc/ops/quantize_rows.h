// Row quantisation shared by the handlers: prism_quantize_rows' argument check (CPU and CUDA;
// the Python wrapper checks first, with friendlier words): y [M, D] -> q [digits * M, D],
// s [digits * M]; and the CPU's per-row digits, which every CPU handler that quantises a row
// (norms, gated activations, quantize_rows) calls, so there is one definition of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"

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

// One row y [d] -> (q1, s1), and with q2 not null the remainder's (q2, s2): numerics.h's
// QuantScale / QuantInverse / QuantCode, the remainder as QuantRemainder (two rounded
// operations). buf (d floats, may be y itself) holds the remainders; unused for one digit.
inline void QuantizeRowDigits(const float* y, int64_t d, float* buf, int8_t* q1,
                              float* s1, int8_t* q2, float* s2) {
  float amax = 0.0f;
  for (int64_t i = 0; i < d; ++i) amax = std::max(amax, std::fabs(y[i]));
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i = 0; i < d; ++i) {
    q1[i] = QuantCode(y[i], inv);
    if (q2 == nullptr) continue;
    buf[i] = QuantRemainder(y[i], q1[i], scale);
    rmax = std::max(rmax, std::fabs(buf[i]));
  }
  *s1 = scale;
  if (q2 == nullptr) return;
  const float rinv = QuantInverse(rmax);
  for (int64_t i = 0; i < d; ++i) q2[i] = QuantCode(buf[i], rinv);
  *s2 = QuantScale(rmax);
}

}  // namespace prism
