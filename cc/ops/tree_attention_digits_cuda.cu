// Tree attention in INT8 digits on CUDA, with the dots on INT8 tensor cores (mma.sync
// m16n8k32 s8 -> s32); arguments as prism_tree_attention (tree_attention.h), arithmetic in
// attention_digits.h, bits equal to the CPU handler (tree_attention_digits_cpu.cc).
//
// Rows R = (token, head) pairs: a block takes kRows rows, TB = kRows / G consecutive tokens of
// the step times the G query heads of one kv head (grid: token blocks x kv heads); warp w owns
// rows 16w .. 16w + 15, the M side of its MMAs. The block's tokens may belong to several
// chains: it runs one pass per chain (increasing chain id), each over the key tiles its rows
// see; rows of other chains sit the pass out. Per tile: the chain's 64 positions are resolved
// to pool rows, every k and v row is cut into digits in shared memory (k row-major, v
// transposed with its keys permuted so that the score fragments are the PV MMA's A operand
// as they lie in registers), then each warp computes its rows' scores (3 MMAs per 32 dims),
// weights and weighted values (5 u8 x s8 MMAs per 32 keys: the weights' byte planes) and
// merges the tile in order. Integer
// sums are exact in any order and every float operation is per element, so neither the
// tiling nor the MMA layout can change a bit.
// No host synchronisation, no allocation: command-buffer compatible.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/attention_digits.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/tree_attention.h"

namespace prism {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRows = 16 * kWarps;  // (token, head) rows per block
constexpr int kPad = 16;            // bytes after each code row: conflict-free fragment loads
#ifndef PRISM_DIGITS_BLOCKS_PER_SM
#define PRISM_DIGITS_BLOCKS_PER_SM 2
#endif
constexpr int kBlocksPerSm = PRISM_DIGITS_BLOCKS_PER_SM;  // the register budget, 65536 / (128 * kBlocksPerSm); 3 spills more at H = 128

// Shared memory of one block. Code rows are kRowBytes apart (q, k: [row][d]); v is transposed,
// vt[d][PermutedKey(key)], kVRowBytes apart.
template <int kH>
struct Smem {
  static constexpr int kRowBytes = kH + kPad;
  static constexpr int kVRowBytes = kAttnTile + kPad;
  int8_t q1[kRows * kRowBytes], q2[kRows * kRowBytes];
  int8_t k1[kAttnTile * kRowBytes], k2[kAttnTile * kRowBytes];
  int8_t v1[kH * kVRowBytes], v2[kH * kVRowBytes];
  float qs1[kRows], qs2[kRows];
  float ks1[kAttnTile], ks2[kAttnTile], vs1[kAttnTile], vs2[kAttnTile];
  int64_t krow[kAttnTile];  // pool row of each tile position, -1: not in the chain
  int32_t reduce[3];        // pass planning: next chain, first and last tile
};

// Column of key (0..63) in the transposed v tile. For each 32-key half, the C fragment of
// the score MMA gives thread t of a quad keys 8b + 2t + j (b = n-block 0..3, j = 0, 1); the A
// fragment of m16n8k32 wants k = 4t + i and 16 + 4t + i. Key 8b + 2t + j goes to column
// 16 (b / 2) + 4t + 2 (b % 2) + j, so a thread's own score registers are its A operand.
__device__ __forceinline__ int PermutedKey(int key) {
  const int half = key / 32, kl = key % 32, b = kl / 8, t = (kl % 8) / 2, j = kl % 2;
  return 32 * half + 16 * (b / 2) + 4 * t + 2 * (b % 2) + j;
}

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

// Lane l's elements of a row of kH: d = l + 32 e (coalesced loads, conflict-free byte stores).
template <int kH, typename T>
__device__ __forceinline__ void LoadRow(const T* __restrict__ p, float (&x)[kH / kWarpSize]) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int e = 0; e < kH / kWarpSize; ++e) x[e] = ToF32(p[lane + kWarpSize * e]);
}

// kR rows' two digits each (QuantizeRowDigits' arithmetic; maxima are exact in any order), the
// warp's lanes holding each row's elements as LoadRow does; the rows' shuffles interleave, so
// their latencies overlap. Zero rows give zero codes and scales.
template <int kR, int kE>
__device__ __forceinline__ void RowDigits(const float (&x)[kR][kE], int8_t (&c1)[kR][kE],
                                          int8_t (&c2)[kR][kE], float (&s1)[kR],
                                          float (&s2)[kR]) {
  float amax[kR], rmax[kR], r[kR][kE];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    amax[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) amax[i] = fmaxf(amax[i], fabsf(x[i][e]));
  }
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
#pragma unroll
    for (int i = 0; i < kR; ++i) amax[i] = fmaxf(amax[i], __shfl_xor_sync(kFullMask, amax[i], off));
  }
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const float inv = QuantInverse(amax[i]);
    s1[i] = QuantScale(amax[i]);
    rmax[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      c1[i][e] = QuantCode(x[i][e], inv);
      r[i][e] = QuantRemainder(x[i][e], c1[i][e], s1[i]);
      rmax[i] = fmaxf(rmax[i], fabsf(r[i][e]));
    }
  }
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) {
#pragma unroll
    for (int i = 0; i < kR; ++i) rmax[i] = fmaxf(rmax[i], __shfl_xor_sync(kFullMask, rmax[i], off));
  }
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const float rinv = QuantInverse(rmax[i]);
#pragma unroll
    for (int e = 0; e < kE; ++e) c2[i][e] = QuantCode(r[i][e], rinv);
    s2[i] = QuantScale(rmax[i]);
  }
}

// The block's rows: token index (or -1) and query head of row r.
struct RowPlace {
  int64_t token, head;
};
__device__ __forceinline__ RowPlace PlaceOf(int r, int64_t t0, const Dims& dm, int kvh) {
  const int64_t g = dm.n / dm.k, tb = kRows / g;
  const int64_t tl = r / g, t = t0 + tl;
  if (tl >= tb || t >= dm.t) return {-1, 0};
  return {t, kvh * g + r % g};
}

// Rows a warp cuts into digits at once (their loads in flight); fewer for H = 256, whose
// accumulators already take 128 registers a thread.
template <int kH>
constexpr int kStageRowsFor = kH > 128 ? 4 : 8;

// Digits of the block's query rows into shared memory, kStageRows consecutive rows a warp.
template <int kH, typename T>
__device__ void StageQueries(const T* __restrict__ q, const Dims& dm, int64_t t0, int kvh,
                             Smem<kH>& sm) {
  constexpr int kE = kH / kWarpSize, kB = Smem<kH>::kRowBytes, kStageRows = kStageRowsFor<kH>;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int r0 = kStageRows * warp; r0 < kRows; r0 += kStageRows * kWarps) {
    float x[kStageRows][kE] = {};
#pragma unroll
    for (int i = 0; i < kStageRows; ++i) {
      const RowPlace pl = PlaceOf(r0 + i, t0, dm, kvh);
      if (pl.token >= 0) LoadRow<kH>(q + (pl.token * dm.n + pl.head) * kH, x[i]);
    }
    int8_t c1[kStageRows][kE], c2[kStageRows][kE];
    float s1[kStageRows], s2[kStageRows];
    RowDigits(x, c1, c2, s1, s2);
#pragma unroll
    for (int i = 0; i < kStageRows; ++i) {
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        sm.q1[(r0 + i) * kB + lane + kWarpSize * e] = c1[i][e];
        sm.q2[(r0 + i) * kB + lane + kWarpSize * e] = c2[i][e];
      }
      if (lane == 0) sm.qs1[r0 + i] = s1[i], sm.qs2[r0 + i] = s2[i];
    }
  }
}

// 16 bytes of a packed row, or zeros for an absent one.
__device__ __forceinline__ uint4 Load16(const int8_t* __restrict__ row, int offset) {
  return row == nullptr ? make_uint4(0, 0, 0, 0)
                        : *reinterpret_cast<const uint4*>(row + offset);
}
__device__ __forceinline__ uint32_t Load4(const int8_t* __restrict__ row, int offset) {
  return row == nullptr ? 0u : *reinterpret_cast<const uint32_t*>(row + offset);
}

// Tile `tile` of chain `chain` for kv head kvh into shared memory from the packed pools: pool
// rows, k codes (row-major, 16-byte copies), v codes transposed with PermutedKey's columns
// (4 keys x 4 channels a thread, transposed in registers by byte permutes), the scales;
// absent keys as zero codes and scales.
template <int kH>
__device__ void StageTile(const int8_t* __restrict__ k_pool, const int8_t* __restrict__ v_pool,
                          const Dims& dm, const Tables& tb, int64_t chain, int kvh, int64_t tile,
                          Smem<kH>& sm) {
  constexpr int kB = Smem<kH>::kRowBytes, kVB = Smem<kH>::kVRowBytes;
  const int64_t row_bytes = PackedRowBytes(kH);
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < kAttnTile) {
    const int32_t* seg = tb.segs + chain * dm.s * kSegFields;
    const int64_t r = KeyRow(seg, dm.s, tb.pages_flat, dm.pt, dm.p, dm.l, tile * kAttnTile + tid);
    sm.krow[tid] = r;
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (r >= 0) {
      const int8_t* kr = k_pool + (r * dm.k + kvh) * row_bytes + PackedScaleOffset(kH);
      const int8_t* vr = v_pool + (r * dm.k + kvh) * row_bytes + PackedScaleOffset(kH);
      const float2 ks = *reinterpret_cast<const float2*>(kr);
      const float2 vs = *reinterpret_cast<const float2*>(vr);
      sc[0] = ks.x, sc[1] = ks.y, sc[2] = vs.x, sc[3] = vs.y;
    }
    sm.ks1[tid] = sc[0], sm.ks2[tid] = sc[1], sm.vs1[tid] = sc[2], sm.vs2[tid] = sc[3];
  }
  __syncthreads();
  auto row_of = [&](const int8_t* pool, int key) -> const int8_t* {
    const int64_t r = sm.krow[key];
    return r < 0 ? nullptr : pool + (r * dm.k + kvh) * row_bytes;
  };
  constexpr int kChunks = 2 * kH / 16;  // 16-byte chunks of a row's two code vectors
  for (int i = tid; i < kAttnTile * kChunks; i += kThreads) {
    const int key = i / kChunks, c = i % kChunks;
    const uint4 v = Load16(row_of(k_pool, key), 16 * c);
    int8_t* dst = (c < kChunks / 2 ? sm.k1 : sm.k2) + key * kB + 16 * (c % (kChunks / 2));
    *reinterpret_cast<uint4*>(dst) = v;
  }
  // v: block (digit, channel quad cq, key quad m); m = 8 half + 4 b2 + t holds keys
  // ka, ka + 1, ka + 8, ka + 9 with ka = 32 half + 16 b2 + 2 t, PermutedKey columns 4m .. 4m + 3.
  constexpr int kQuads = kH / 4;
  for (int i = tid; i < 2 * kQuads * 16; i += kThreads) {
    const int m = i % 16, cq = (i / 16) % kQuads, digit = i / (16 * kQuads);
    const int ka = 32 * (m / 8) + 16 * ((m / 4) % 2) + 2 * (m % 4);
    const int off = digit * kH + 4 * cq;
    const uint32_t w0 = Load4(row_of(v_pool, ka), off), w1 = Load4(row_of(v_pool, ka + 1), off);
    const uint32_t w2 = Load4(row_of(v_pool, ka + 8), off);
    const uint32_t w3 = Load4(row_of(v_pool, ka + 9), off);
    const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), lo23 = __byte_perm(w2, w3, 0x5140);
    const uint32_t hi01 = __byte_perm(w0, w1, 0x7362), hi23 = __byte_perm(w2, w3, 0x7362);
    int8_t* vt = (digit == 0 ? sm.v1 : sm.v2) + 4 * cq * kVB + 4 * m;
    *reinterpret_cast<uint32_t*>(vt) = __byte_perm(lo01, lo23, 0x5410);  // channel 4 cq
    *reinterpret_cast<uint32_t*>(vt + kVB) = __byte_perm(lo01, lo23, 0x7632);
    *reinterpret_cast<uint32_t*>(vt + 2 * kVB) = __byte_perm(hi01, hi23, 0x5410);
    *reinterpret_cast<uint32_t*>(vt + 3 * kVB) = __byte_perm(hi01, hi23, 0x7632);
  }
}

// The step's k/v rows cut into digits and packed into pool row slot[t] (attention_digits.h),
// a warp per (token, kv head, k or v) row, lane l holding elements kE l .. kE l + kE - 1.
template <typename T, int kH>
__global__ void __launch_bounds__(kThreads)
    DigitWriteKernel(const T* __restrict__ k_new, const T* __restrict__ v_new,
                     const int32_t* __restrict__ slot, Dims dm, int8_t* __restrict__ k_pool,
                     int8_t* __restrict__ v_pool) {
  constexpr int kE = kH / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t rows = dm.t * dm.k * 2, row_bytes = PackedRowBytes(kH);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t w = first; w < rows; w += stride) {
    const int64_t t = w / (2 * dm.k), kvh = (w / 2) % dm.k;
    const int64_t sl = slot[t];
    if (sl < 0 || sl >= dm.p * dm.l) continue;  // uniform per warp
    const T* src = ((w % 2) == 0 ? k_new : v_new) + (t * dm.k + kvh) * kH + kE * lane;
    float x[1][kE];
#pragma unroll
    for (int e = 0; e < kE; ++e) x[0][e] = ToF32(src[e]);
    int8_t c1[1][kE], c2[1][kE];
    float s1[1], s2[1];
    RowDigits(x, c1, c2, s1, s2);
    int8_t* dst = ((w % 2) == 0 ? k_pool : v_pool) + (sl * dm.k + kvh) * row_bytes;
#pragma unroll
    for (int e = 0; e < kE; ++e) dst[kE * lane + e] = c1[0][e], dst[kH + kE * lane + e] = c2[0][e];
    if (lane == 0) {
      const float4 tail = make_float4(s1[0], s2[0], 0.0f, 0.0f);  // the scales, then 8 zeros
      *reinterpret_cast<float4*>(dst + PackedScaleOffset(kH)) = tail;
    }
  }
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

// A-fragment register `reg` of 32-key half `half` (PermutedKey's order) from per-element
// values: row g (reg even) or g + 8, keys 8 n0 + 2 t + {0, 1} and 8 (n0 + 1) + 2 t + {0, 1}.
template <typename CodeFn>
__device__ __forceinline__ void FragmentCodes(int half, int reg, CodeFn code, int32_t (&c)[4]) {
  const int n0 = 4 * half + 2 * (reg / 2), i0 = 2 * (reg % 2);
  c[0] = code(n0, i0), c[1] = code(n0, i0 + 1), c[2] = code(n0 + 1, i0), c[3] = code(n0 + 1, i0 + 1);
}
// Byte plane `plane` (0: lowest) of four non-negative fixed-point weights, one u8 each.
__device__ __forceinline__ uint32_t BytePlane(const int32_t (&c)[4], int plane) {
  uint32_t r = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) r |= ((static_cast<uint32_t>(c[i]) >> (8 * plane)) & 0xffu) << (8 * i);
  return r;
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
  float w1max[2] = {0.0f, 0.0f}, w2max[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (!seen(nb, i)) continue;
      w1max[i / 2] = fmaxf(w1max[i / 2], RnMul(e[nb][i], sm.vs1[key_of(nb, i)]));
      w2max[i / 2] = fmaxf(w2max[i / 2], RnMul(e[nb][i], sm.vs2[key_of(nb, i)]));
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
    return seen(nb, i) ? FixedWeight(RnMul(e[nb][i], sm.vs1[key_of(nb, i)]), f1[i / 2], kW1Max)
                       : 0;
  };
  auto code2 = [&](int nb, int i) {
    return seen(nb, i) ? FixedWeight(RnMul(e[nb][i], sm.vs2[key_of(nb, i)]), f2[i / 2], kW2Max)
                       : 0;
  };
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      int32_t c[4];
      FragmentCodes(half, reg, code1, c);
#pragma unroll
      for (int p = 0; p < 3; ++p) w.f1[p][half][reg] = BytePlane(c, p);
      FragmentCodes(half, reg, code2, c);
#pragma unroll
      for (int p = 0; p < 2; ++p) w.f2[p][half][reg] = BytePlane(c, p);
    }
  }
}

// Scores s (in place: their exponentials) -> tile partial -> merged into the running state
// (attention_digits.h steps 3-4) for the warp's two rows per thread.
template <int kH>
__device__ __forceinline__ void TileUpdate(const Smem<kH>& sm, int64_t tile, int32_t window,
                                           const RowPass& rp, float (&s)[kAttnTile / 8][4],
                                           WarpState<kH>& st) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, g = lane / 4, t = lane % 4;
  uint32_t vis = 0;  // bit 4 nb + i: key 8 nb + 2 t + (i & 1) visible to row i / 2
  float mt[2] = {NegInf(), NegInf()};
  int any[2] = {0, 0};
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2, key = 8 * nb + 2 * t + (i & 1);
      if (rp.active[h] && sm.krow[key] >= 0 &&
          KeyVisible(tile * kAttnTile + key, rp.pos[h], window)) {
        vis |= 1u << (4 * nb + i);
        mt[h] = any[h] ? fmaxf(mt[h], s[nb][i]) : s[nb][i];
        any[h] = 1;
      }
    }
  }
  bool has[2];
  int32_t fixed[2] = {0, 0};
#pragma unroll
  for (int h = 0; h < 2; ++h) has[h] = QuadSum(any[h]) > 0, mt[h] = QuadMax(mt[h]);
#pragma unroll
  for (int nb = 0; nb < kAttnTile / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const bool v = (vis >> (4 * nb + i)) & 1u;
      s[nb][i] = v ? DigitExp(RnSub(s[nb][i], mt[i / 2])) : 0.0f;
      fixed[i / 2] += FixedE(s[nb][i]);
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
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = i / 2;
      if (!has[h]) continue;
      const int64_t a = j1[2][i] * 65536LL + j1[1][i] * 256LL + j1[0][i];
      const int64_t b = j2[1][i] * 256LL + j2[0][i];
      const float acct = DigitAcc(a, b, w.scale1[h], w.scale2[h]);
      st.acc[nb][i] = first[h] ? acct : DigitMerged(st.acc[nb][i], ka[h], acct, kb[h]);
    }
  }
}

__device__ __forceinline__ void StoreOut(float v0, float v1, float* p) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void StoreOut(float v0, float v1, uint16_t* p) {
  *reinterpret_cast<uint32_t*>(p) =
      static_cast<uint32_t>(F32ToBf16(v0)) | static_cast<uint32_t>(F32ToBf16(v1)) << 16;
}

// Pass planning: the smallest chain above `after` among the block's rows, and that chain's
// tile range. Every thread returns the same values.
template <int kH>
__device__ int64_t NextChain(const Dims& dm, const Tables& tb, int64_t t0, int kvh,
                             int64_t after, int32_t window, Smem<kH>& sm, int64_t* first,
                             int64_t* last) {
  if (threadIdx.x == 0) sm.reduce[0] = INT_MAX, sm.reduce[1] = INT_MAX, sm.reduce[2] = -1;
  __syncthreads();
  int64_t chain = -1, pos = -1;
  if (threadIdx.x < kRows) {
    const RowPlace pl = PlaceOf(static_cast<int>(threadIdx.x), t0, dm, kvh);
    if (pl.token >= 0) chain = tb.chain_of[pl.token], pos = tb.positions[pl.token];
    if (chain < 0 || chain >= dm.c || pos < 0) chain = -1;
    if (chain > after) atomicMin(&sm.reduce[0], static_cast<int32_t>(chain));
  }
  __syncthreads();
  const int32_t next = sm.reduce[0];
  if (next != INT_MAX && chain == next) {
    atomicMin(&sm.reduce[1], static_cast<int32_t>(FirstTile(pos, window)));
    atomicMax(&sm.reduce[2], static_cast<int32_t>(LastTile(pos)));
  }
  __syncthreads();
  *first = sm.reduce[1], *last = sm.reduce[2];
  const int64_t result = next == INT_MAX ? -1 : next;
  __syncthreads();  // everyone read reduce[] before the next call resets it
  return result;
}

template <typename T, int kH>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    DigitAttendKernel(const T* __restrict__ q, const int8_t* __restrict__ k_pool,
                      const int8_t* __restrict__ v_pool, Dims dm, Tables tb, float scale,
                      int32_t window, T* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<kH>& sm = *reinterpret_cast<Smem<kH>*>(smem_raw);
  const int kvh = static_cast<int>(blockIdx.y);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * (kRows / (dm.n / dm.k));
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize, g = lane / 4, t = lane % 4;
  StageQueries<kH>(q, dm, t0, kvh, sm);
  WarpState<kH> st;
#pragma unroll
  for (int nb = 0; nb < kH / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) st.acc[nb][i] = 0.0f;
  }
  st.m[0] = st.m[1] = 0.0f, st.l[0] = st.l[1] = 0.0f;
  RowPlace mine[2];
  int64_t my_chain[2], my_pos[2];
  for (int h = 0; h < 2; ++h) {
    mine[h] = PlaceOf(16 * warp + g + 8 * h, t0, dm, kvh);
    my_chain[h] = mine[h].token >= 0 ? tb.chain_of[mine[h].token] : -1;
    my_pos[h] = mine[h].token >= 0 ? tb.positions[mine[h].token] : -1;
    if (my_chain[h] >= dm.c || my_pos[h] < 0) my_chain[h] = -1;
  }
  int64_t first = 0, last = -1;
  for (int64_t chain = NextChain(dm, tb, t0, kvh, -1, window, sm, &first, &last); chain >= 0;
       chain = NextChain(dm, tb, t0, kvh, chain, window, sm, &first, &last)) {
    RowPass rp;
    for (int h = 0; h < 2; ++h) rp.active[h] = my_chain[h] == chain, rp.pos[h] = my_pos[h];
    const bool warp_active = __any_sync(kFullMask, rp.active[0] || rp.active[1]);
    for (int64_t tile = first; tile <= last; ++tile) {
      StageTile<kH>(k_pool, v_pool, dm, tb, chain, kvh, tile, sm);
      __syncthreads();
      if (warp_active) {
        float s[kAttnTile / 8][4];
        Scores<kH>(sm, warp, scale, s);
        TileUpdate<kH>(sm, tile, window, rp, s, st);
      }
      __syncthreads();  // the next tile overwrites the codes
    }
  }
  for (int h = 0; h < 2; ++h) {
    if (mine[h].token < 0) continue;
    T* o = out + (mine[h].token * dm.n + mine[h].head) * kH;
#pragma unroll
    for (int nb = 0; nb < kH / 8; ++nb) {
      const int ch = 8 * nb + 2 * t;
      StoreOut(Normalised(st.acc[nb][2 * h], st.l[h]), Normalised(st.acc[nb][2 * h + 1], st.l[h]),
               o + ch);
    }
  }
}

template <typename T, int kH>
ffi::Error LaunchAttend(cudaStream_t stream, const T* q, const int8_t* k_pool,
                        const int8_t* v_pool,
                        const Dims& dm, const Tables& tb, float scale, int32_t window, T* out) {
  const char* op = "prism_tree_attention_digits";
  auto* kernel = DigitAttendKernel<T, kH>;
  constexpr size_t kSmem = sizeof(Smem<kH>);
  static const cudaError_t attr = cudaFuncSetAttribute(  // once per instantiation
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  PRISM_REQUIRE(attr == cudaSuccess, std::string(op) + ": shared memory size refused");
  const int64_t tokens = kRows / dm.g();
  const int64_t blocks = CeilDiv(dm.t, tokens);
  if (blocks == 0) return ffi::Error::Success();
  PRISM_REQUIRE(blocks <= 0x7fffffff && dm.k <= 65535, std::string(op) + ": grid too large");
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(dm.k));
  kernel<<<grid, kThreads, kSmem, stream>>>(q, k_pool, v_pool, dm, tb, scale, window, out);
  return LaunchStatus(op);
}

template <typename T, int kH>
ffi::Error LaunchWrite(cudaStream_t stream, const T* k_new, const T* v_new, const Dims& dm,
                       const int32_t* slot, int8_t* k_pool, int8_t* v_pool) {
  const int64_t warps = dm.t * dm.k * 2;
  if (warps == 0) return ffi::Error::Success();
  const int64_t blocks = std::min<int64_t>(CeilDiv(warps, kThreads / kWarpSize), 4096);
  DigitWriteKernel<T, kH><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      k_new, v_new, slot, dm, k_pool, v_pool);
  return LaunchStatus("prism_tree_attention_digits");
}

template <typename T, int kH>
ffi::Error LaunchBoth(cudaStream_t stream, const T* q, const T* k_new, const T* v_new,
                      const Dims& dm, const Tables& tb, float scale, int32_t window, T* out,
                      int8_t* k_pool, int8_t* v_pool) {
  // First the writes, then (same stream) the reads.
  if (auto e = LaunchWrite<T, kH>(stream, k_new, v_new, dm, tb.slot, k_pool, v_pool);
      e.failure()) {
    return e;
  }
  return LaunchAttend<T, kH>(stream, q, k_pool, v_pool, dm, tb, scale, window, out);
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, const T* q, const T* k_new, const T* v_new,
                  const Dims& dm, const Tables& tb, float scale, int32_t window, T* out,
                  int8_t* k_pool, int8_t* v_pool) {
  switch (dm.h) {
    case 32: return LaunchBoth<T, 32>(stream, q, k_new, v_new, dm, tb, scale, window, out, k_pool, v_pool);
    case 64: return LaunchBoth<T, 64>(stream, q, k_new, v_new, dm, tb, scale, window, out, k_pool, v_pool);
    case 128: return LaunchBoth<T, 128>(stream, q, k_new, v_new, dm, tb, scale, window, out, k_pool, v_pool);
    case 256: return LaunchBoth<T, 256>(stream, q, k_new, v_new, dm, tb, scale, window, out, k_pool, v_pool);
    default: break;
  }
  return ffi::Error::InvalidArgument(
      "prism_tree_attention_digits: head dim H must be 32, 64, 128 or 256 on CUDA");
}

ffi::Error TreeAttentionDigitsCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k_new,
                                   ffi::AnyBuffer v_new, ffi::AnyBuffer k_pages,
                                   ffi::AnyBuffer v_pages, ffi::BufferR1<ffi::S32> slot,
                                   ffi::BufferR1<ffi::S32> positions,
                                   ffi::BufferR1<ffi::S32> chain_of, ffi::BufferR3<ffi::S32> segs,
                                   ffi::BufferR1<ffi::S32> pages_flat,
                                   ffi::Result<ffi::AnyBuffer> out,
                                   ffi::Result<ffi::AnyBuffer> k_out,
                                   ffi::Result<ffi::AnyBuffer> v_out, float scale,
                                   int32_t window) {
  const char* op = "prism_tree_attention_digits";
  Dims dm;
  if (auto e = CheckDigitAttentionShapes(q, k_new, v_new, k_pages, v_pages, slot.dimensions()[0],
                                         positions.dimensions()[0], chain_of.dimensions()[0],
                                         segs.dimensions(), &dm);
      e.failure()) {
    return e;
  }
  dm.pt = pages_flat.dimensions()[0];
  PRISM_REQUIRE(dm.g() <= kRows, std::string(op) + ": more than 64 query heads per kv head");
  for (auto [in, res] : {std::pair{&k_pages, &k_out}, std::pair{&v_pages, &v_out}}) {
    if ((*res)->untyped_data() != in->untyped_data() && in->size_bytes() > 0) {
      const cudaError_t e = cudaMemcpyAsync((*res)->untyped_data(), in->untyped_data(),
                                            in->size_bytes(), cudaMemcpyDeviceToDevice, stream);
      PRISM_REQUIRE(e == cudaSuccess, std::string(op) + ": pool copy failed");
    }
  }
  const Tables tb{slot.typed_data(), positions.typed_data(), chain_of.typed_data(),
                  segs.typed_data(), pages_flat.typed_data()};
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return Launch(stream, q.reinterpret_data<T>(), k_new.reinterpret_data<T>(),
                  v_new.reinterpret_data<T>(), dm, tb, scale, window, out->reinterpret_data<T>(),
                  k_out->reinterpret_data<int8_t>(), v_out->reinterpret_data<int8_t>());
  };
  if (q.element_type() == ffi::DataType::F32) return run(static_cast<float*>(nullptr));
  return run(static_cast<uint16_t*>(nullptr));
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismTreeAttentionDigitsCuda, prism::TreeAttentionDigitsCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // q [T, N, H]
                                  .Arg<ffi::AnyBuffer>()            // k_new [T, K, H]
                                  .Arg<ffi::AnyBuffer>()            // v_new [T, K, H]
                                  .Arg<ffi::AnyBuffer>()            // k_pages [P, L, K, H]
                                  .Arg<ffi::AnyBuffer>()            // v_pages [P, L, K, H]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // slot [T]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // positions [T]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // chain_of [T]
                                  .Arg<ffi::BufferR3<ffi::S32>>()  // chain_segments [C, S, 3]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // pages_flat [Pt]
                                  .Ret<ffi::AnyBuffer>()            // out [T, N, H] q's dtype
                                  .Ret<ffi::AnyBuffer>()            // k_pages (aliased)
                                  .Ret<ffi::AnyBuffer>()            // v_pages (aliased)
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("window"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
