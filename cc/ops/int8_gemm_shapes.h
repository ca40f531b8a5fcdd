// prism_int8_gemm's shape contract, shared by the CPU and CUDA handlers.
//   x_q [R, K] int8, s_x [R] f32, w_q [N, K] int8, s_w [N] f32 -> y [M, N], M <= R.
// M is y's rows: the call uses the first M rows of x_q and s_x. The two-digit model keeps both
// digits of its rows stacked in one buffer ([x1; x2], one GEMM reads them whole) and needs x1
// alone against the weights' second digit: passing the stacked buffer with y of M = R / 2 rows
// reads x1 in place, where a slice would be a copy (XLA copies small slices of a custom call's
// operand, e.g. the [32] scales of a 32-token step: two copies a projection).
#pragma once

#include <cstdint>
#include <string>

#include "cc/common.h"

namespace prism {

inline ffi::Error CheckInt8GemmShapes(const ffi::BufferR2<ffi::S8>& x_q,
                                      const ffi::BufferR1<ffi::F32>& s_x,
                                      const ffi::BufferR2<ffi::S8>& w_q,
                                      const ffi::BufferR1<ffi::F32>& s_w,
                                      const ffi::AnyBuffer& y, int64_t* m, int64_t* k,
                                      int64_t* n) {
  const int64_t rows = x_q.dimensions()[0];
  *k = x_q.dimensions()[1];
  *n = w_q.dimensions()[0];
  PRISM_REQUIRE(w_q.dimensions()[1] == *k, "prism_int8_gemm: w_q must be [N, K] with x_q's K");
  PRISM_REQUIRE(s_x.dimensions()[0] == rows,
                "prism_int8_gemm: s_x must have one scale per row of x_q");
  PRISM_REQUIRE(s_w.dimensions()[0] == *n, "prism_int8_gemm: s_w must be [N]");
  const auto yd = y.dimensions();
  PRISM_REQUIRE(yd.size() == 2 && yd[0] <= rows && yd[1] == *n,
                "prism_int8_gemm: y must be [M, N] with M at most x_q's " +
                    std::to_string(rows) + " rows, got " + DimsToString(yd));
  *m = yd[0];
  return ffi::Error::Success();
}

}  // namespace prism
