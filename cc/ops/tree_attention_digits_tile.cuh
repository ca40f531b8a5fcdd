// One key tile of the digits attention on INT8 tensor cores (mma.sync m16n8k32): a warp's
// scores, softmax weights as fixed-point byte planes, weighted values and the in-order merge
// into its running state (attention_digits.h steps 2-4). Included by
// tree_attention_digits_cuda.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/cuda_common.cuh"
#include "cc/ops/attention_digits.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_digits_stage.cuh"

namespace prism {
namespace digits {

__device__ __forceinline__ void Mma(int32_t (&c)[4], const uint32_t (&a)[4],
                                    const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same with A unsigned (the value weights' fixed-point byte planes).
__device__ __forceinline__ void MmaU8(int32_t (&c)[4], const uint32_t (&a)[4],
                                      const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t Ld32(const int8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Over the 4 threads of a quad (the 4 holders of one MMA row).
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(kFullMask, v, 1));
  return fmaxf(v, __shfl_xor_sync(kFullMask, v, 2));
}
__device__ __forceinline__ int32_t QuadSum(int32_t v) {
  v += __shfl_xor_sync(kFullMask, v, 1);
  return v + __shfl_xor_sync(kFullMask, v, 2);
}

// One warp's running state: acc[n-block][fragment] for rows g (fragments 0, 1) and g + 8
// (2, 3) of its 16, channels 8 nb + 2 t + (i & 1); m and l per row.
template <int kH>
struct WarpState {
  float acc[kH / 8][4];
  float m[2], l[2];
};

// The warp's score tile: s[nb][i] for row (i < 2 ? g : g + 8), key 8 nb + 2 t + (i & 1).
template <int kH>
__device__ __forceinline__ void Scores(const Smem<kH>& sm, int warp, float scale,
                                       float (&s)[kAttnTile / 8][4]) {
  constexpr int kB = Smem<kH>::kRowBytes;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, g = lane / 4, t = lane % 4;
  const int r0 = 16 * warp + g;
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
    int32_t c11[4] = {}, c12[4] = {}, c21[4] = {};
#pragma unroll
    for (int ks = 0; ks < kH / 32; ++ks) {
      const int qa = r0 * kB + 32 * ks + 4 * t, qb = (r0 + 8) * kB + 32 * ks + 4 * t;
      const uint32_t a1[4] = {Ld32(sm.q1 + qa), Ld32(sm.q1 + qb), Ld32(sm.q1 + qa + 16),
                              Ld32(sm.q1 + qb + 16)};
      const uint32_t a2[4] = {Ld32(sm.q2 + qa), Ld32(sm.q2 + qb), Ld32(sm.q2 + qa + 16),
                              Ld32(sm.q2 + qb + 16)};
      const int kb = (8 * nb + g) * kB + 32 * ks + 4 * t;
      const uint32_t b1[2] = {Ld32(sm.k1 + kb), Ld32(sm.k1 + kb + 16)};
      const uint32_t b2[2] = {Ld32(sm.k2 + kb), Ld32(sm.k2 + kb + 16)};
      Mma(c11, a1, b1);
      Mma(c12, a1, b2);
      Mma(c21, a2, b1);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = i < 2 ? r0 : r0 + 8, key = 8 * nb + 2 * t + (i & 1);
      s[nb][i] = DigitScore(c11[i], c12[i], c21[i], sm.qs1[r], sm.qs2[r], sm.ks1[key],
                            sm.ks2[key], scale);
    }
  }
}

// Per-row facts of the warp's two rows for one pass.
struct RowPass {
  int64_t pos[2];
  bool active[2];
};

// Bit k: tile position k (absolute tile * kAttnTile + k) is in the chain (present) and visible
// to a query at pos (KeyVisible: k <= pos - base and, with a window, k > pos - window - base);
// 0 for an inactive row.
__device__ __forceinline__ uint64_t VisibleKeys(uint64_t present, int64_t tile, int64_t pos,
                                                int32_t window, bool active) {
  const int64_t base = tile * kAttnTile, hi = pos - base;
  const int64_t lo = window > 0 ? pos - window - base : -1;
  if (!active || hi < 0 || lo >= kAttnTile - 1) return 0;
  const uint64_t upto = hi >= kAttnTile - 1 ? ~0ull : (2ull << hi) - 1;  // bits 0 .. hi
  const uint64_t below = lo < 0 ? 0ull : (2ull << lo) - 1;               // bits 0 .. lo
  return present & upto & ~below;
}

// A-fragment register `reg` of 32-key half `half` (PermutedKey's order) from per-element
// values: row g (reg even) or g + 8, keys 8 n0 + 2 t + {0, 1} and 8 (n0 + 1) + 2 t + {0, 1}.
template <typename CodeFn>
__device__ __forceinline__ void FragmentCodes(int half, int reg, CodeFn code, int32_t (&c)[4]) {
  const int n0 = 4 * half + 2 * (reg / 2), i0 = 2 * (reg % 2);
  c[0] = code(n0, i0), c[1] = code(n0, i0 + 1), c[2] = code(n0 + 1, i0), c[3] = code(n0 + 1, i0 + 1);
}
// Byte planes 0 .. kPlanes - 1 (0: lowest) of four non-negative fixed-point weights, one u8 of
// each: plane p byte i = byte p of c[i], gathered by byte permutes.
template <int kPlanes>
__device__ __forceinline__ void BytePlanes(const int32_t (&c)[4], uint32_t* plane, int stride) {
  const uint32_t lo01 = __byte_perm(c[0], c[1], 0x5140);  // c0.b0 c1.b0 c0.b1 c1.b1
  const uint32_t lo23 = __byte_perm(c[2], c[3], 0x5140);
  plane[0] = __byte_perm(lo01, lo23, 0x5410);
  plane[stride] = __byte_perm(lo01, lo23, 0x7632);
  if constexpr (kPlanes > 2) {
    const uint32_t hi01 = __byte_perm(c[0], c[1], 0x7362);  // c0.b2 c1.b2 c0.b3 c1.b3
    const uint32_t hi23 = __byte_perm(c[2], c[3], 0x7362);
    plane[2 * stride] = __byte_perm(hi01, hi23, 0x5410);
  }
}

// The value weights of attention_digits.h step 3 from the tile's exponentials e (0 for
// invisible keys): W1 (24 bits) and W2 (16) as byte planes in the PV MMAs' A fragments
// [plane][half][reg], with their scales per row (h = 0: row g, 1: row g + 8).
struct Weights {
  uint32_t f1[3][2][4], f2[2][2][4];
  float scale1[2], scale2[2];
};

// vis: bit 4 nb + i set for visible keys. Invisible keys get exact zero weights, whatever their
// (never written, perhaps garbage) scales hold.
template <int kH>
__device__ __forceinline__ void WeightDigits(const Smem<kH>& sm, const float (&e)[kAttnTile / 8][4],
                                             uint32_t vis, Weights& w) {
  const int t = static_cast<int>(threadIdx.x) % 4;
  auto key_of = [t](int nb, int i) { return 8 * nb + 2 * t + (i & 1); };
  auto seen = [vis](int nb, int i) { return ((vis >> (4 * nb + i)) & 1u) != 0; };
  auto w1_of = [&](int nb, int i) {
    return seen(nb, i) ? RnMul(e[nb][i], sm.vs1[key_of(nb, i)]) : 0.0f;
  };
  auto w2_of = [&](int nb, int i) {
    return seen(nb, i) ? RnMul(e[nb][i], sm.vs2[key_of(nb, i)]) : 0.0f;
  };
  float w1max[2] = {0.0f, 0.0f}, w2max[2] = {0.0f, 0.0f};  // weights are >= 0
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w1max[i / 2] = fmaxf(w1max[i / 2], w1_of(nb, i));
      w2max[i / 2] = fmaxf(w2max[i / 2], w2_of(nb, i));
    }
  }
  FixedWeights f1[2], f2[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    f1[h] = FixedWeightsOf(QuadMax(w1max[h]), kW1Max);
    f2[h] = FixedWeightsOf(QuadMax(w2max[h]), kW2Max);
    w.scale1[h] = f1[h].scale, w.scale2[h] = f2[h].scale;
  }
  auto code1 = [&](int nb, int i) {
    return seen(nb, i) ? FixedWeight(w1_of(nb, i), f1[i / 2], kW1Max) : 0;
  };
  auto code2 = [&](int nb, int i) {
    return seen(nb, i) ? FixedWeight(w2_of(nb, i), f2[i / 2], kW2Max) : 0;
  };
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      int32_t c[4];
      FragmentCodes(half, reg, code1, c);
      BytePlanes<3>(c, &w.f1[0][half][reg], 8);
      FragmentCodes(half, reg, code2, c);
      BytePlanes<2>(c, &w.f2[0][half][reg], 8);
    }
  }
}

// FixedE (attention_digits.h) for e in [0, 1]: rint(e * 2^23) as e * 2^23 + 2^23, whose float
// bits are 0x4B000000 + the rounded integer (one add in place of rint and a conversion).
__device__ __forceinline__ int32_t FixedEOfUnit(float e) {
  return __float_as_int(RnAdd(RnMul(e, kFixedEScale), kFixedEScale)) - 0x4B000000;
}

// float(a) for a = c * 2^8 + j0 (|c| < 2^30, |j0| < 2^21), rounded once to nearest as
// static_cast<float>(int64_t) would: a = (c >> 6) 2^14 + ((c & 63) 2^8 + j0), two exact floats
// (< 2^24 and < 2^22 in magnitude), and their sum rounds once.
__device__ __forceinline__ float Int38ToFloat(int32_t c, int32_t j0) {
  const float hi = RnMul(static_cast<float>(c >> 6), 16384.0f);
  return RnAdd(hi, static_cast<float>((c & 63) * 256 + j0));
}

// Scores s (in place: their exponentials) -> tile partial -> merged into the running state
// (attention_digits.h steps 3-4) for the warp's two rows per thread.
// kPartial (the split's pass 1, l cleared before): the tile partial's acct goes straight to the
// rows' records rec[h] (null: not written this round) instead of a merge, so no accumulator
// stays live across the loop.
template <int kH, bool kPartial>
__device__ __forceinline__ void TileUpdate(const Smem<kH>& sm, int64_t tile, int32_t window,
                                           const RowPass& rp, float (&s)[kAttnTile / 8][4],
                                           WarpState<kH>& st, float* const (&rec)[2]) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, g = lane / 4, t = lane % 4;
  const uint64_t present = static_cast<uint64_t>(sm.present[1]) << 32 | sm.present[0];
  uint64_t keys[2];  // the row's visible keys, shifted to this thread's: bit 8 nb + (i & 1)
  bool has[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    keys[h] = VisibleKeys(present, tile, rp.pos[h], window, rp.active[h]);
    has[h] = keys[h] != 0;
    keys[h] >>= 2 * t;
  }
  uint32_t vis = 0;  // bit 4 nb + i: key 8 nb + 2 t + (i & 1) visible to row i / 2
  float mt[2] = {NegInf(), NegInf()};
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool v = ((keys[i / 2] >> (8 * nb + (i & 1))) & 1u) != 0;
      vis |= static_cast<uint32_t>(v) << (4 * nb + i);
      mt[i / 2] = fmaxf(mt[i / 2], v ? s[nb][i] : NegInf());
    }
  }
  int32_t fixed[2] = {0, 0};
#pragma unroll
  for (int h = 0; h < 2; ++h) mt[h] = QuadMax(mt[h]);
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // DigitExp(-inf) = 0: invisible keys, without a branch
      const bool v = ((vis >> (4 * nb + i)) & 1u) != 0;
      s[nb][i] = DigitExp(v ? RnSub(s[nb][i], mt[i / 2]) : NegInf());
      fixed[i / 2] += FixedEOfUnit(s[nb][i]);
    }
  }
  Weights w;
  WeightDigits<kH>(sm, s, vis, w);
  float ka[2], kb[2];
  bool first[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // merge factors (tree_attention.h): the first tile is copied
    const float lt = FixedESum(QuadSum(fixed[h]));
    first[h] = st.l[h] == 0.0f;
    const DigitMerge mw = DigitMergeFactors(st.m[h], mt[h]);
    ka[h] = mw.a, kb[h] = mw.b;
    if (has[h]) {
      st.l[h] = first[h] ? lt : DigitMerged(st.l[h], mw.a, lt, mw.b);
      st.m[h] = first[h] ? mt[h] : mw.m;
    }
  }
  constexpr int kVB = Smem<kH>::kVRowBytes;
#pragma unroll
  for (int nb = 0; nb < kH / 8; ++nb) {
    int32_t j1[3][4] = {}, j2[2][4] = {};  // byte planes' exact sums
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int vb = (8 * nb + g) * kVB + 32 * half + 4 * t;
      const uint32_t b1[2] = {Ld32(sm.v1 + vb), Ld32(sm.v1 + vb + 16)};
      const uint32_t b2[2] = {Ld32(sm.v2 + vb), Ld32(sm.v2 + vb + 16)};
#pragma unroll
      for (int p = 0; p < 3; ++p) MmaU8(j1[p], w.f1[p][half], b1);
#pragma unroll
      for (int p = 0; p < 2; ++p) MmaU8(j2[p], w.f2[p][half], b2);
    }
    float acct[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2;
      if (!has[h]) continue;
      const float a = Int38ToFloat(j1[2][i] * 256 + j1[1][i], j1[0][i]);  // float(J1)
      const float b = static_cast<float>(j2[1][i] * 256 + j2[0][i]);      // float(J2), exact int32
      acct[i] = RnAdd(RnMul(a, w.scale1[h]), RnMul(b, w.scale2[h]));      // DigitAcc
      if constexpr (!kPartial) {
        st.acc[nb][i] = first[h] ? acct[i] : DigitMerged(st.acc[nb][i], ka[h], acct[i], kb[h]);
      }
    }
    if constexpr (kPartial) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (!has[h] || rec[h] == nullptr) continue;
        *reinterpret_cast<float2*>(rec[h] + 8 * nb + 2 * t) = make_float2(acct[2 * h], acct[2 * h + 1]);
      }
    }
  }
}

}  // namespace digits
}  // namespace prism
