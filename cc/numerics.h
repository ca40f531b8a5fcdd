// The numerics contract in code: every formula here is shared by the CPU and CUDA handlers so
// that a row's result depends only on the row (DESIGN.md, "Numerics contract").
//
// Canonical reduction order (used for every float sum and dot product over a row):
//   element d belongs to lane (d / kVec) % kLanes; each lane accumulates its elements in
//   increasing d with separate multiply and add (no FMA contraction); then the 32 lane sums are
//   combined by a butterfly: for off in 16, 8, 4, 2, 1: lane[i] = lane[i] + lane[i + off].
// A CUDA warp computes exactly this with __shfl_xor_sync, and the CPU emulates it, so sums of
// squares and candidate logits are bit-identical across devices as well as across batches.
// Floating-point flags that keep it so: CPU -ffp-contract=off, CUDA -fmad=false. The one
// exception is attention's dot on CUDA, which fuses its multiply-adds explicitly
// (tree_attention.h says why): CUDA and CPU attention agree to ulps there, not bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PRISM_HD __host__ __device__ __forceinline__
#else
#define PRISM_HD inline
#endif

namespace prism {

constexpr int kLanes = 32;           // lanes of the canonical reduction (one CUDA warp)
constexpr int kVec = 8;              // consecutive elements per lane per step (16 B of bf16)
constexpr int kStride = kLanes * kVec;
constexpr float kQMax = 127.0f;      // symmetric INT8: codes in [-127, 127]
constexpr int kVocabTile = 2048;     // vocab_logsumexp partial results per 2048 vocab rows

enum class Activation : int32_t { kGeluTanh = 0, kSilu = 1 };

PRISM_HD float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays a quiet NaN.
PRISM_HD uint16_t F32ToBf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

PRISM_HD float ToF32(float v) { return v; }
PRISM_HD float ToF32(uint16_t v) { return Bf16ToF32(v); }
PRISM_HD void FromF32(float v, float* out) { *out = v; }
PRISM_HD void FromF32(float v, uint16_t* out) { *out = F32ToBf16(v); }

// Canonical lane of element d.
PRISM_HD int LaneOf(int64_t d) { return static_cast<int>((d / kVec) % kLanes); }

// Division by a constant is written as multiplication by the float32 reciprocal everywhere:
// XLA rewrites x / c into x * (1/c), and the references must reproduce the kernels' bits.
//
// Per-row symmetric quantisation: scale = amax * (1/127), code = round_half_even(y * (127 /
// amax)). An all-zero row gets scale 0 and codes 0 (dequantises to exact zeros).
PRISM_HD float QuantScale(float amax) { return amax * (1.0f / kQMax); }
PRISM_HD float QuantInverse(float amax) { return amax > 0.0f ? kQMax / amax : 0.0f; }
PRISM_HD int8_t QuantCode(float y, float inverse) {
  float r = rintf(y * inverse);  // default rounding mode: half to even
  r = r > kQMax ? kQMax : (r < -kQMax ? -kQMax : r);
  return static_cast<int8_t>(r);
}

// RMSNorm factor 1 / sqrt(sum_squares * (1/D) + eps); sqrt and division are correctly rounded
// on both devices (CUDA without --use_fast_math), so this is bit-identical given the same sum.
PRISM_HD float InverseRms(float sum_squares, int64_t d, float eps) {
  const float inv_d = 1.0f / static_cast<float>(d);
  return 1.0f / sqrtf(sum_squares * inv_d + eps);
}

// GELU, tanh approximation (Gemma): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
PRISM_HD float GeluTanh(float x) {
  const float kAlpha = 0.7978845608028654f;
  float inner = kAlpha * (x + 0.044715f * ((x * x) * x));
  return 0.5f * x * (1.0f + tanhf(inner));
}

// SiLU (Llama, Qwen): x / (1 + exp(-x)).
PRISM_HD float Silu(float x) { return x / (1.0f + expf(-x)); }

PRISM_HD float Activate(Activation act, float x) {
  return act == Activation::kGeluTanh ? GeluTanh(x) : Silu(x);
}

// cap * tanh(logit * (1/cap)); cap <= 0 disables soft-capping.
PRISM_HD float Softcap(float logit, float cap) {
  return cap > 0.0f ? cap * tanhf(logit * (1.0f / cap)) : logit;
}

// Canonical sum of f(d) over d in [0, n) on the host (the CUDA version is a warp loop).
template <typename TermFn>
inline float CanonicalSumHost(int64_t n, TermFn term) {
  float lane[kLanes] = {0.0f};
  for (int64_t base = 0; base < n; base += kStride) {
    for (int l = 0; l < kLanes; ++l) {
      const int64_t start = base + static_cast<int64_t>(l) * kVec;
      for (int v = 0; v < kVec && start + v < n; ++v) lane[l] = lane[l] + term(start + v);
    }
  }
  for (int off = kLanes / 2; off > 0; off /= 2) {
    for (int i = 0; i < off; ++i) lane[i] = lane[i] + lane[i + off];
  }
  return lane[0];
}

}  // namespace prism
