// The staging half of the digits attention kernels (tree_attention_digits_cuda.cu): the block
// geometry, its shared memory, query rows cut into digits, and a key tile's packed pool rows
// copied (k) or transposed (v) into the layout the tensor-core fragments read. Included by
// tree_attention_digits_cuda.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/attention_digits.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/tree_attention.h"

namespace prism {
namespace digits {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kRows = 16 * kWarps;  // (token, head) rows per block
constexpr int kPad = 16;            // bytes after each code row: conflict-free fragment loads
#ifndef PRISM_DIGITS_BLOCKS_PER_SM
#define PRISM_DIGITS_BLOCKS_PER_SM 2
#endif
// The fused kernel's register budget, 65536 / (128 * kBlocksPerSm) (3 spills more at H = 128);
// the split's pass 1 keeps no accumulators and takes one block more (kBlocksPerSmOf).
constexpr int kBlocksPerSm = PRISM_DIGITS_BLOCKS_PER_SM;

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
  uint32_t present[2];      // bit k of the pair: krow[k] >= 0
  int32_t reduce[4];        // pass planning: next chain, first and last tile, largest first tile
};

// Column of key (0..63) in the transposed v tile. For each 32-key half, the C fragment of
// the score MMA gives thread t of a quad keys 8b + 2t + j (b = n-block 0..3, j = 0, 1); the A
// fragment of m16n8k32 wants k = 4t + i and 16 + 4t + i. Key 8b + 2t + j goes to column
// 16 (b / 2) + 4t + 2 (b % 2) + j, so a thread's own score registers are its A operand.
__device__ __forceinline__ int PermutedKey(int key) {
  const int half = key / 32, kl = key % 32, b = kl / 8, t = (kl % 8) / 2, j = kl % 2;
  return 32 * half + 16 * (b / 2) + 4 * t + 2 * (b % 2) + j;
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

// The same from packed query rows [T * N][2H + 16] (the split: cut once per step, copied by
// every block), 16-byte copies; absent rows as zero codes and scales, as StageQueries.
template <int kH>
__device__ void StagePackedQueries(const int8_t* __restrict__ q_packed, const Dims& dm,
                                   int64_t t0, int kvh, Smem<kH>& sm) {
  constexpr int kB = Smem<kH>::kRowBytes, kChunks = 2 * kH / 16;
  const int64_t row_bytes = PackedRowBytes(kH);
  const int tid = static_cast<int>(threadIdx.x);
  auto row_of = [&](int r) -> const int8_t* {
    const RowPlace pl = PlaceOf(r, t0, dm, kvh);
    return pl.token < 0 ? nullptr : q_packed + (pl.token * dm.n + pl.head) * row_bytes;
  };
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const int8_t* row = row_of(r);
    const uint4 v = row == nullptr ? make_uint4(0, 0, 0, 0)
                                   : *reinterpret_cast<const uint4*>(row + 16 * c);
    int8_t* dst = (c < kChunks / 2 ? sm.q1 : sm.q2) + r * kB + 16 * (c % (kChunks / 2));
    *reinterpret_cast<uint4*>(dst) = v;
  }
  if (tid < kRows) {
    const int8_t* row = row_of(tid);
    const float2 sc = row == nullptr ? make_float2(0.0f, 0.0f)
                                     : *reinterpret_cast<const float2*>(row + PackedScaleOffset(kH));
    sm.qs1[tid] = sc.x, sm.qs2[tid] = sc.y;
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
    const uint32_t here = __ballot_sync(kFullMask, r >= 0);  // tid < 64: two whole warps
    if (tid % kWarpSize == 0) sm.present[tid / kWarpSize] = here;
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

}  // namespace digits
}  // namespace prism
