// What every RMSNorm kernel of norm_quant_cuda.cu takes: one launch's pointers and the value
// the row normalises when there is a residual. Included only by the norm_* CUDA files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"

namespace prism {

// One launch's pointers; null pointers switch parts off, as in the CPU's NormRows. h may alias
// x or residual, and y may alias x (in-place updates): each element is read, then written, by
// one thread, and later passes read only shared memory or h, so no __restrict__ here.
template <typename T>
struct NormArgs {
  const T* x;
  const T* residual;
  const float* gamma;
  T* h;
  T* y;
  int8_t* q;
  float* s;
  int64_t d;
  float eps;
  float weight_offset;
  // Gemma's post-norm fused in front (prism_norm_add_rmsnorm*): x is normalised with this
  // weight (same eps and offset) and rounded to T before the residual add. Null: x as it is.
  const float* x_gamma = nullptr;
  // The second digit (digits = 2, f32 rows only; q, s then hold the first): the row's
  // remainder y - code * s quantised with its own scale, as prism_quantize_rows writes it.
  int8_t* q2 = nullptr;
  float* s2 = nullptr;
  // A two-digit projection's partial products as x (prism_*add_rmsnorm_quant_sum, f32 only):
  // the row normalises x + (x_hi + x_w2) rounded to T, Int8Linear's order, where x and x_hi are
  // the halves of the stacked [x1 W1; x2 W1] rows and x_w2 is x1 W2. Null: x as it is.
  const T* x_hi = nullptr;
  const T* x_w2 = nullptr;
};

// One chunk's remainders after the first digit (quantize_rows' QuantRemainder of each code),
// in place; returns their max |r| over the cnt elements of the row.
__device__ __forceinline__ float ChunkRemainders(float (&y)[kVec], int cnt, float qinv,
                                                 float scale) {
  float rmax = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    y[i] = QuantRemainder(y[i], QuantCode(y[i], qinv), scale);
    if (i < cnt) rmax = fmaxf(rmax, fabsf(y[i]));
  }
  return rmax;
}

// The value the CPU normalises when there is a residual: x + residual rounded to T.
template <typename T>
__device__ __forceinline__ float RoundToStorage(float v) {
  T stored;
  FromF32(v, &stored);
  return ToF32(stored);
}

// Whether every chunk of every row is whole and 16-byte aligned (int8 codes: 8-byte).
template <typename T>
bool FullChunks(const NormArgs<T>& a) {
  auto ok = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return a.d % kVec == 0 && ok(a.x) && ok(a.residual) && ok(a.gamma) && ok(a.h) && ok(a.y) &&
         ok(a.q) && ok(a.x_hi) && ok(a.x_w2);
}

}  // namespace prism
