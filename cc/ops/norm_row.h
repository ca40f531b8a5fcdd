// One RMSNorm row on the host, the one definition every CPU handler that normalises a row
// calls (norm_quant_cpu.cc, qkv_rope_cpu.cc): the canonical sum of squares (numerics.h), the
// inverse RMS, then y = (h * inv) * (weight_offset + gamma), each operation rounded to f32.
#pragma once

#include <cstdint>

#include "cc/numerics.h"

namespace prism {

struct NormAttrs {
  float eps;
  float weight_offset;
};

// Normalises one row of already-summed activations h (f32) into y (f32; may alias h).
inline void NormRow(const float* h, const float* gamma, int64_t d, NormAttrs a, float* y) {
  const float ss = CanonicalSumHost(d, [&](int64_t i) { return h[i] * h[i]; });
  const float inv = InverseRms(ss, d, a.eps);
  for (int64_t i = 0; i < d; ++i) y[i] = (h[i] * inv) * (a.weight_offset + gamma[i]);
}

}  // namespace prism
