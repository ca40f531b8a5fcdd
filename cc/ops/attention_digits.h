// Tree attention in INT8 digits ("digits" numerics): the arithmetic shared by the CPU and CUDA
// handlers of prism_tree_attention_digits, so that every kernel on every device gives the same
// bits. The key semantics of prism_tree_attention (tree_attention.h); the pools hold digits:
//   q               [T, N, H]        f32|bf16   queries
//   k_new, v_new    [T, K, H]        q's dtype  this step's keys and values (cut into digits
//                                               as they are written)
//   k_pages,v_pages [P, L, K, H']    s8         packed digit rows, H' = PackedRowBytes(H):
//                                               c1 [H] | c2 [H] | s1, s2 (f32 bytes) | 8 zero
//   -> out [T, N, H] q's dtype, k_pages, v_pages (aliased)
// A zero row (a fresh pool) is the digits of a zero vector.
//
//  1. Every q row (token, head), k row and v row (key, kv head) of H elements is written as two
//     INT8 digits with per-row scales, x ~ s1 * c1 + s2 * c2: QuantizeRowDigits (quantize_rows.h),
//     the rule of the two-digit GEMM path. A row's digits depend only on the row; k and v rows
//     are cut once, when written, so the attention kernels only copy them.
//  2. Score of query row q and key row k: exact int32 dots I11 = c1q.c1k, I12 = c1q.c2k,
//     I21 = c2q.c1k (the c2q.c2k term, ~2^-15 of the score, is dropped), then DigitScore.
//     Integer sums are exact in any order, so a tensor-core tile, a dp4a loop and the CPU agree.
//  3. Keys in tiles of kAttnTile absolute positions. Per tile and query row, over its visible
//     keys j: mt = max s_j (exact), e_j = DigitExp(s_j - mt) (<= 1, exactly 1 at the max),
//     lt = float(sum_j FixedE(e_j)) * 2^-23 (an exact integer sum), and the value weights
//     w1_j = e_j * s1v_j, w2_j = e_j * s2v_j (invisible keys: 0) as unsigned fixed point of the
//     tile's largest: W1 in 24 bits, W2 in 16 (FixedWeights). Then acct[d] = DigitAcc(J1_d,
//     J2_d) with exact J1_d = sum_j W1_j c1v_jd and J2_d = sum_j W2_j c2v_jd (int64; CUDA sums
//     them byte plane by byte plane on u8 x s8 tensor cores, which is the same integer).
//  4. Tile partials merge in increasing tile order exactly as tree_attention.h's MergeFactors /
//     Merged / Normalised, with DigitExp for expf: out = acc / l.
// DigitExp is built from correctly rounded +, *, rint and exponent bits, so unlike expf it is
// the same function on the CPU and CUDA: CPU and CUDA outputs are bit-identical. Precision: a
// row's digits hold it to ~1 / (127 * 254) of its max (bf16 holds 1 / 256 of each element).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cc/common.h"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"

namespace prism {

// Packed digit row of H codes: byte offsets of c2 and of the scales, and its size (a multiple
// of 16 for H a multiple of 8, so rows stay 16-byte aligned).
PRISM_HD int64_t PackedRowBytes(int64_t h) { return 2 * h + 16; }
PRISM_HD int64_t PackedScaleOffset(int64_t h) { return 2 * h; }

constexpr float kFixedEScale = 8388608.0f;            // 2^23: e in [0, 1] as a fixed-point int
constexpr float kFixedEInverse = 1.0f / 8388608.0f;   // exact power of two
constexpr int kDigitMaxHeadDim = 256;                 // the CUDA kernel's register budget

// Correctly rounded single operations that no compiler flag may fuse into an FMA.
PRISM_HD float RnMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // the CPU build passes -ffp-contract=off
#endif
}
PRISM_HD float RnAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
PRISM_HD float RnSub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// exp(x) for x <= 0 (what softmax needs): 2^n * p(f) with t = x * log2(e), n = rint(t),
// f = t - n in [-1/2, 1/2] (exact), p the degree-7 Taylor polynomial of 2^f in Horner form
// (relative error < 2e-7), 2^n from exponent bits. 0 below 2^-125; NaN stays NaN. Branch-free
// (selects at the end; n clamped so that every input converts a defined value): the CUDA
// kernels call it for every key of a tile, visible or not.
PRISM_HD float DigitExp(float x) {
  const float t = RnMul(x, 1.44269502162933349609375f);  // log2(e) in float32
  const float n = rintf(t);
  const float f = RnSub(t, n);
  float p = 1.5252733804059841e-05f;  // ln(2)^7 / 7!
  p = RnAdd(RnMul(p, f), 1.5403530393381609e-04f);
  p = RnAdd(RnMul(p, f), 1.3333558146428443e-03f);
  p = RnAdd(RnMul(p, f), 9.6181291076284772e-03f);
  p = RnAdd(RnMul(p, f), 5.5504108664821580e-02f);
  p = RnAdd(RnMul(p, f), 2.4022650695910071e-01f);
  p = RnAdd(RnMul(p, f), 6.9314718055994531e-01f);
  p = RnAdd(RnMul(p, f), 1.0f);
  const float nc = fminf(fmaxf(n, -126.0f), 127.0f);  // NaN -> -126: a normal power of two
  const int32_t e = static_cast<int32_t>(nc) + 127;
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float pow2;
  memcpy(&pow2, &bits, sizeof(pow2));
  const float r = RnMul(p, pow2);
  return x != x ? x : (n < -125.0f ? 0.0f : r);
}

// e in [0, 1] as an integer of 2^-23 units (round half to even): the tile sum lt is an
// integer sum, exact in any order (64 terms <= 2^29).
PRISM_HD int32_t FixedE(float e) { return static_cast<int32_t>(rintf(RnMul(e, kFixedEScale))); }
PRISM_HD float FixedESum(int32_t sum) { return RnMul(static_cast<float>(sum), kFixedEInverse); }

// Score from the three exact digit dots and the rows' scales (q1, q2: the query row's; k1, k2:
// the key row's). |I| <= 127^2 * 256 < 2^24, so each float(I) is exact.
PRISM_HD float DigitScore(int32_t i11, int32_t i12, int32_t i21, float q1, float q2, float k1,
                          float k2, float scale) {
  const float a = RnMul(RnMul(static_cast<float>(i11), q1), k1);
  const float b = RnMul(RnMul(static_cast<float>(i12), q1), k2);
  const float c = RnMul(RnMul(static_cast<float>(i21), q2), k1);
  return RnMul(RnAdd(a, RnAdd(b, c)), scale);
}

// A tile's value weights w >= 0 as unsigned fixed point of their largest, wmax:
// code = min(rint(w * (kMax / wmax)), kMax), value = code * (wmax / kMax); wmax = 0: all 0.
// W1 (w1 = e * s1v) takes 24 bits, W2 (e * s2v, ~1 / 254 of w1) 16: each ~2^-24 of w1's max.
constexpr float kW1Max = 16777215.0f;  // 2^24 - 1
constexpr float kW2Max = 65535.0f;     // 2^16 - 1
struct FixedWeights {
  float inverse, scale;  // kMax / wmax, wmax / kMax
};
PRISM_HD FixedWeights FixedWeightsOf(float wmax, float code_max) {
  return wmax > 0.0f ? FixedWeights{code_max / wmax, wmax / code_max} : FixedWeights{0.0f, 0.0f};
}
PRISM_HD int32_t FixedWeight(float w, FixedWeights f, float code_max) {
  const float r = rintf(RnMul(w, f.inverse));
  return static_cast<int32_t>(r < code_max ? r : code_max);
}

// A tile's weighted value sum for one channel from its two exact sums (|J1| <= 2^24 * 127 *
// 64), each converted to float once (round to nearest).
PRISM_HD float DigitAcc(int64_t j1, int64_t j2, float scale1, float scale2) {
  return RnAdd(RnMul(static_cast<float>(j1), scale1), RnMul(static_cast<float>(j2), scale2));
}

// Merging a tile partial into the running state (tree_attention.h's rule, DigitExp for expf).
struct DigitMerge {
  float m, a, b;
};
PRISM_HD DigitMerge DigitMergeFactors(float m, float mt) {
  const float mn = m < mt ? mt : m;
  return {mn, DigitExp(RnSub(m, mn)), DigitExp(RnSub(mt, mn))};
}
PRISM_HD float DigitMerged(float x, float a, float xt, float b) {
  return RnAdd(RnMul(x, a), RnMul(xt, b));
}

// Shapes and dtypes of prism_tree_attention_digits' buffers (a hand-written ffi_call must fail,
// never read out of bounds); fills dm (dm.h: q's H) on success.
inline ffi::Error CheckDigitAttentionShapes(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k_new,
                                            const ffi::AnyBuffer& v_new,
                                            const ffi::AnyBuffer& k_pages,
                                            const ffi::AnyBuffer& v_pages, int64_t slot_n,
                                            int64_t pos_n, int64_t chain_n,
                                            ffi::AnyBuffer::Dimensions seg, Dims* dm) {
  const std::string op = "prism_tree_attention_digits: ";
  PRISM_REQUIRE(q.dimensions().size() == 3, op + "q must be [T, N, H]");
  PRISM_REQUIRE(k_pages.dimensions().size() == 4, op + "k_pages must be [P, L, K, 2H + 16]");
  const auto qd = q.dimensions(), pd = k_pages.dimensions();
  *dm = {qd[0], qd[1], pd[2], qd[2], pd[0], pd[1], seg[0], seg.size() > 1 ? seg[1] : 0, 0};
  PRISM_REQUIRE(IsFloatActivation(q.element_type()), op + "q must be float32 or bfloat16");
  PRISM_REQUIRE(dm->h > 0 && dm->h % 8 == 0 && dm->h <= kDigitMaxHeadDim,
                op + "head dim H must be a multiple of 8, at most 256");
  PRISM_REQUIRE(k_pages.element_type() == ffi::DataType::S8 && pd[3] == PackedRowBytes(dm->h),
                op + "k_pages must be int8 [P, L, K, 2H + 16] (packed digit rows)");
  PRISM_REQUIRE(dm->k > 0 && dm->n % dm->k == 0, op + "N must be a multiple of K");
  PRISM_REQUIRE(dm->l > 0 && dm->p > 0, op + "P and the page size L must be positive");
  PRISM_REQUIRE(v_pages.element_type() == ffi::DataType::S8 &&
                    DimsToString(v_pages.dimensions()) == DimsToString(pd),
                op + "v_pages must match k_pages");
  const std::string kv = "[" + std::to_string(dm->t) + ", " + std::to_string(dm->k) + ", " +
                         std::to_string(dm->h) + "]";
  for (const ffi::AnyBuffer* b : {&k_new, &v_new}) {
    PRISM_REQUIRE(b->element_type() == q.element_type() && DimsToString(b->dimensions()) == kv,
                  op + "k_new and v_new must be " + kv + " in q's dtype");
  }
  PRISM_REQUIRE(slot_n == dm->t && pos_n == dm->t && chain_n == dm->t,
                op + "slot, positions and chain_of must be [T]");
  PRISM_REQUIRE(seg.size() == 3 && seg[2] == kSegFields, op + "chain_segments must be [C, S, 3]");
  return ffi::Error::Success();
}

}  // namespace prism
