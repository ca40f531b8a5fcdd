// The row-quantisation kernel on CUDA, shared by prism_glu_quant, prism_glu_quant2,
// prism_glu_quant2_sum and prism_quantize_rows (one block per row, or with
// PRISM_GLU_CLUSTER=on and few rows a cluster of blocks per row; thread t holds the
// kVec-element chunks first + k * stride of the row). A row source gives the values a to
// quantise: the gated activations compute a = Activate(gate) * up with GatedChunk, so
// glu_quant's codes and glu_quant2's first digit have the same bits; PlainRows reads a as it
// is. They differ only in that source and in whether a second digit follows.
//
// Passes, each over the thread's own chunks: 1. a and the row's amax (exact in any order, so
// neither the block width nor the cluster matters); 2. the codes (two digits: the first digit,
// then the remainder a - q1 * s1 and its max); 3. (two digits) the remainder's codes. When F
// floats fit in shared memory (GluRowsLaunch), pass 1 keeps a there and pass 2 overwrites it
// with the remainders, so every input is read once; longer rows recompute a from the inputs in
// each pass (the same operations on the same inputs: the same bits).
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/l2_prefetch.cuh"
#include "cc/numerics.h"
#include "cc/ops/cluster_launch.cuh"
#include "cc/ops/glu_quant.h"

namespace prism {

constexpr int kGluMaxThreads = 1024;
constexpr int64_t kGluLoadsAhead = 2;  // chunks a thread of pass 1 loads at once (its unroll)
constexpr int64_t kGluMaxCachedBytes = 200 << 10;  // under the H200's 227 KB per block
// Each row source below names kBlocksPerSm, the blocks an SM must hold, and kMaxThreads, the
// widest block (GluRowsKernel's __launch_bounds__). The pair and plain rows: two blocks of
// 1024, at most 32 registers a thread. Without the bound the kernel took 41, so one 1024-thread
// block filled an SM's registers and the 27B's F = 21504 rows (86 KB of shared memory each,
// two fit) ran one row per SM (Nsight Compute, results/ops_h200_session15/). SumRows spills
// ~0.5 KB a thread at 32 registers (three loads a chunk; at 768 threads and 40 registers, 0.2
// KB, and it ran slower than one block of 1024), so it takes two blocks of 512 threads (64
// registers, no spill) when the rows outnumber the SMs, and WideSumRows (one block of 1024)
// when every row gets an SM of its own. H200, F = 21504, kernel µs, one 1024-thread block ->
// two of 512 (results/e2e_h200_session17/): M = 256 59.4 -> 56.9, 448 101.6 -> 98.7, 4096
// 738.9 -> 687.5; but the 4K follow-up's M = 32 rows went 1.22 -> 1.46 ms a step (62 calls).

// v = Activate(gate) * up for the chunk at i0 (cnt valid elements).
template <typename T>
__device__ __forceinline__ void GatedChunk(const T* gate, const T* up, Activation act,
                                           int64_t i0, int cnt, float (&v)[kVec]) {
  float u[kVec];
  LoadChunk(gate + i0, cnt, v);
  LoadChunk(up + i0, cnt, u);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fmul_rn(Activate(act, v[i]), u[i]);
}

// Row source of glu_quant(2): gate_up [M, 2F] of T, row r is gate then up.
template <typename T>
struct PairRows {
  static constexpr int kBlocksPerSm = 2, kMaxThreads = kGluMaxThreads;
  const T* __restrict__ gate_up;
  int64_t m, f;
  __device__ __forceinline__ void Gated(int64_t r, Activation act, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    const T* gate = gate_up + r * 2 * f;
    GatedChunk(gate, gate + f, act, i0, cnt, v);
  }
  __device__ __forceinline__ void Prefetch(int64_t r, int64_t from) const {
    const T* gate = gate_up + r * 2 * f;
    PrefetchL2(gate + from, (f - from) * static_cast<int64_t>(sizeof(T)));
    PrefetchL2(gate + f + from, (f - from) * static_cast<int64_t>(sizeof(T)));
  }
};

// Row source of glu_quant2_sum: gate_up = y2[r] + (y2[M + r] + yw2[r]), the two-digit
// projection's partial products (x1 W1, x2 W1, x1 W2) added in Int8Linear's order, each add
// rounded; f32 only (the int8 GEMM's outputs).
struct SumRows {
  static constexpr int kBlocksPerSm = 2, kMaxThreads = 512;
  const float* __restrict__ y2;   // [2M, 2F]
  const float* __restrict__ yw2;  // [M, 2F]
  int64_t m, f;

  __device__ __forceinline__ static void Sum(const float* a, const float* b, const float* c,
                                             int64_t i0, int cnt, float (&v)[kVec]) {
    float u[kVec], w[kVec];
    LoadChunk(a + i0, cnt, v);
    LoadChunk(b + i0, cnt, u);
    LoadChunk(c + i0, cnt, w);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = __fadd_rn(v[i], __fadd_rn(u[i], w[i]));
  }
  __device__ __forceinline__ void Gated(int64_t r, Activation act, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    const float* x1 = y2 + r * 2 * f;
    const float* x2 = y2 + (m + r) * 2 * f;
    const float* w2 = yw2 + r * 2 * f;
    float u[kVec];
    Sum(x1, x2, w2, i0, cnt, v);              // gate
    Sum(x1 + f, x2 + f, w2 + f, i0, cnt, u);  // up
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = __fmul_rn(Activate(act, v[i]), u[i]);
  }
  __device__ __forceinline__ void Prefetch(int64_t r, int64_t from) const {
    const float* rows[3] = {y2 + r * 2 * f, y2 + (m + r) * 2 * f, yw2 + r * 2 * f};
    for (const float* row : rows) {  // gate, then up, of each partial product
      PrefetchL2(row + from, (f - from) * static_cast<int64_t>(sizeof(float)));
      PrefetchL2(row + f + from, (f - from) * static_cast<int64_t>(sizeof(float)));
    }
  }
};

// SumRows for at most one row an SM: one wide block a row (half the chunks a thread).
struct WideSumRows : SumRows {
  static constexpr int kBlocksPerSm = 1, kMaxThreads = kGluMaxThreads;
};

// Row source of quantize_rows: the rows themselves, f32 [M, D] (f == D; act unused).
struct PlainRows {
  static constexpr int kBlocksPerSm = 2, kMaxThreads = kGluMaxThreads;
  const float* __restrict__ y;
  int64_t m, f;
  __device__ __forceinline__ void Gated(int64_t r, Activation, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    LoadChunk(y + r * f + i0, cnt, v);
  }
  __device__ __forceinline__ void Prefetch(int64_t r, int64_t from) const {
    PrefetchL2(y + r * f + from, (f - from) * static_cast<int64_t>(sizeof(float)));
  }
};

// Outputs: codes and scales of the first digit; of the second when q2 is not null.
struct GluOut {
  int8_t* __restrict__ q1;
  float* __restrict__ s1;
  int8_t* __restrict__ q2;
  float* __restrict__ s2;
};

// The chunk's first-digit codes, and v overwritten by the remainders.
__device__ __forceinline__ void FirstDigit(float (&v)[kVec], float inv, float scale,
                                           int8_t (&codes)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    codes[i] = QuantCode(v[i], inv);
    v[i] = QuantRemainder(v[i], codes[i], scale);
  }
}

// A thread's chunk of the cached row: two float4s when whole (i0 % kVec == 0 and the dynamic
// shared memory is 16-byte aligned), which halves the bank conflicts of scalar accesses.
static_assert(kVec == 8, "LoadCached / StoreCached move a chunk as two float4s");
__device__ __forceinline__ void LoadCached(const float* row, int64_t i0, int cnt,
                                           float (&v)[kVec]) {
  if (cnt == kVec) {
    const float4 a = reinterpret_cast<const float4*>(row + i0)[0];
    const float4 b = reinterpret_cast<const float4*>(row + i0)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = i < cnt ? row[i0 + i] : 0.0f;
}

__device__ __forceinline__ void StoreCached(float* row, int64_t i0, int cnt,
                                            const float (&v)[kVec]) {
  if (cnt == kVec) {
    reinterpret_cast<float4*>(row + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(row + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (i < cnt) row[i0 + i] = v[i];
  }
}

__device__ __forceinline__ float ChunkMax(float m, const float (&v)[kVec], int cnt) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {  // unrolled: keeps v in registers
    if (i < cnt) m = fmaxf(m, fabsf(v[i]));
  }
  return m;
}

// The row's max over the `parts` blocks of its cluster (exact in any order), from each block's
// max m (equal on all its threads); slot is the block's own __shared__ word for it. Every
// thread of every block of the cluster must call it; the caller's closing cluster barrier
// keeps each slot alive until its peers have read it.
__device__ __forceinline__ float ClusterRowMax(float m, int parts, float* slot) {
  if (parts == 1) return m;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *slot = m;
  cluster.sync();  // every block's max is in its slot
  for (int q = 0; q < parts; ++q) m = fmaxf(m, *cluster.map_shared_rank(slot, q));
  return m;
}

// The passes at the top of this file for row blockIdx.x / parts. parts > 1 (a launch in
// clusters of `parts` blocks, GluRowsLaunch): the row's chunks are dealt over the cluster's
// threads as over one block parts times as wide, each block caches only its own chunks
// (compacted), and the row's maxes are exchanged through distributed shared memory
// (ClusterRowMax). Every value is computed as with one block and the maxes are exact, so the
// bits do not depend on parts. Each thread only ever touches its own chunks of the cache.
//
// prefetch (PRISM_GLU_PREFETCH=on): thread 0 first asks the L2 for the row's inputs past the
// chunks pass 1 loads at once (kGluLoadsAhead a thread). A row's block otherwise requests
// those only after its first loads return; in a one-wave grid (the 27B's 256-token step: 256
// rows on 132 SMs) every row waits the same way, so DRAM should idle between the two rounds.
// That is the expectation the A/B is to test (not measured yet). A hint: same bits.
// Both options are template flags (kPrefetch, kCluster; parts is read only with kCluster), so
// the default kernel's code is what it was before them: at 32 registers a thread, runtime
// flags alone raised its spills (glu_quant's stores 8 -> 32 bytes a thread,
// benchmarks/results/ptxas_session35/).
// A clustered row's block needs no company on its SM (the rows are fewer than the SMs), so
// its bound leaves it 64 registers: at 32 the two-digit form spilled ~0.2 KB a thread.
template <typename Src, bool kTwo, bool kPrefetch = false, bool kCluster = false>
__global__ void __launch_bounds__(Src::kMaxThreads, kCluster ? 1 : Src::kBlocksPerSm)
    GluRowsKernel(Src src, GluOut out, Activation act, bool cached, int parts) {
  extern __shared__ float4 cache4[];  // the block's chunks when cached (16-byte aligned)
  float* cache = reinterpret_cast<float*>(cache4);
  __shared__ float scratch1[kGluMaxThreads / kWarpSize], scratch2[kGluMaxThreads / kWarpSize];
  __shared__ float row_max[2];  // ClusterRowMax's slots: the codes' max, the remainders'
  const int n_parts = kCluster ? parts : 1;
  const int64_t r = kCluster ? blockIdx.x / n_parts : blockIdx.x;
  const int64_t rank = kCluster ? blockIdx.x % n_parts : 0;
  const int64_t span = static_cast<int64_t>(blockDim.x) * kVec, stride = n_parts * span;
  const int64_t own = static_cast<int64_t>(threadIdx.x) * kVec;
  const int64_t o = r * src.f, first = rank * span + own, end = src.f;
  // Chunk i0's place in the block's cache: its round times the block's span, plus the thread's
  // own offset (i0 itself with one block a row).
  const auto at = [&](int64_t i0) { return kCluster ? i0 / stride * span + own : i0; };
  float v[kVec];
  int8_t codes[kVec];
  float amax = 0.0f;
  if constexpr (kPrefetch) {
    if (rank == 0 && threadIdx.x == 0 && kGluLoadsAhead * stride < end) {
      src.Prefetch(r, kGluLoadsAhead * stride);
    }
  }
#pragma unroll 2  // kGluLoadsAhead: two chunks' loads in flight before either's activation
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    src.Gated(r, act, i0, cnt, v);
    if (cached) StoreCached(cache, at(i0), cnt, v);
    amax = ChunkMax(amax, v, cnt);
  }
  amax = BlockMax(amax, scratch1);
  if constexpr (kCluster) amax = ClusterRowMax(amax, n_parts, &row_max[0]);
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    if (cached) {
      LoadCached(cache, at(i0), cnt, v);
    } else {
      src.Gated(r, act, i0, cnt, v);
    }
    if constexpr (kTwo) {
      FirstDigit(v, inv, scale, codes);
      if (cached) StoreCached(cache, at(i0), cnt, v);
      rmax = ChunkMax(rmax, v, cnt);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], inv);
    }
    StoreCodes(out.q1 + o + i0, cnt, codes);
  }
  if (rank == 0 && threadIdx.x == 0) out.s1[r] = scale;
  if constexpr (kTwo) {
    rmax = BlockMax(rmax, scratch2);
    if constexpr (kCluster) rmax = ClusterRowMax(rmax, n_parts, &row_max[1]);
    const float rinv = QuantInverse(rmax);
    for (int64_t i0 = first; i0 < end; i0 += stride) {
      const int cnt = ChunkCount(i0, end);
      if (cached) {
        LoadCached(cache, at(i0), cnt, v);  // the remainders pass 2 left
      } else {
        src.Gated(r, act, i0, cnt, v);
        FirstDigit(v, inv, scale, codes);
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], rinv);
      StoreCodes(out.q2 + o + i0, cnt, codes);
    }
    if (rank == 0 && threadIdx.x == 0) out.s2[r] = QuantScale(rmax);
  }
  if constexpr (kCluster) cooperative_groups::this_cluster().sync();  // peers are done with slots
}

// Threads of a cached row's block. Few rows (latency-bound): one chunk per thread. Many rows:
// as many threads as leave the SM's 2048 to the blocks its shared memory holds (227 KB over
// F floats per row), at least 256, so the 27B's F = 21504 (two blocks per SM) keeps 1024
// threads while its D = 5376 rows (quantize_digits) take 256 and eight rows fit on an SM, not
// three (672 threads each: 0.7 TB/s at M = 4096 on the H200, results/ops_h200_session8/).
inline int CachedRowThreads(int64_t m, int64_t f) {
  constexpr int64_t kManyRows = 512, kSmemPerSm = 227 << 10, kThreadsPerSm = 2048;
  const int wide = RowBlockThreads(1, f);
  if (m < kManyRows) return wide;
  const int64_t per_sm = std::max<int64_t>(1, kSmemPerSm / std::max<int64_t>(f * 4, 1));
  const int64_t fill = kThreadsPerSm / per_sm / kWarpSize * kWarpSize;
  return static_cast<int>(std::min<int64_t>(wide, std::max<int64_t>(256, fill)));
}

// Blocks a row (PRISM_GLU_CLUSTER=on, GluRowsKernel's parts): the most of 8, 4, 2 whose blocks
// for all rows fit the SMs once and leave each block at least a warp of whole chunks; 1 when
// clusters are off or the rows fill the SMs. The 4K follow-up's 32-row steps run on 32 of the
// H200's 132 SMs otherwise (PairRows 8.3 us a call, session 31's trace).
inline int GluRowParts(int64_t m, int64_t f, bool allowed) {
  constexpr int kMaxParts = 8;  // the portable cluster size
  if (!allowed) return 1;
  for (int p = kMaxParts; p > 1; p /= 2) {
    if (m * p <= DeviceSmCount() && f >= int64_t{p} * kWarpSize * kVec) return p;
  }
  return 1;
}

// Dynamic shared memory of a cached row's block: the row (parts == 1: two 86 KB rows of the
// 27B share an SM), else its rounds of chunks times the block's span.
inline int64_t GluCacheBytes(int64_t f, int threads, int parts) {
  if (parts == 1) return f * static_cast<int64_t>(sizeof(float));
  const int64_t span = static_cast<int64_t>(threads) * kVec;
  return CeilDiv(f, span * parts) * span * static_cast<int64_t>(sizeof(float));
}

// Opts the kernel in to `smem` bytes of dynamic shared memory when above the default cap, and
// (two blocks an SM) to the largest carveout, then launches it over m * parts blocks in
// clusters of parts.
template <typename Src, bool kTwo, bool kPrefetch, bool kCluster>
ffi::Error LaunchGluRows(cudaStream_t stream, const Src& src, const GluOut& out, Activation act,
                         bool cached, int parts, int threads, size_t smem,
                         const std::string& op) {
  auto* kernel = GluRowsKernel<Src, kTwo, kPrefetch, kCluster>;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: nothing was launched
      return ffi::Error::Internal(op + ": shared memory for F = " + std::to_string(src.f) +
                                  ": " + cudaGetErrorString(e));
    }
  }
  if constexpr (Src::kBlocksPerSm > 1) {  // the largest carveout: two 86 KB rows share an SM
    static const cudaError_t carved = cudaFuncSetAttribute(  // a hint, once per kernel
        kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    (void)carved;
  }
  const cudaError_t e = LaunchClusters(kernel, src.m * parts, threads, smem, parts, stream, src,
                                       out, act, cached, parts);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it: the error is this call's, reported here
    return ffi::Error::Internal(op + ": CUDA launch failed: " + cudaGetErrorString(e));
  }
  return LaunchStatus(op.c_str());
}

// Launches GluRowsKernel over src.m rows, each over `parts` blocks (GluRowParts). A cached row
// takes its block's share of F floats of dynamic shared memory (CachedRowThreads sets the width
// of one block a row; split rows take RowBlockThreads' width for their share); uncached rows
// take RowBlockThreads' width.
template <typename Src, bool kTwo>
ffi::Error GluRowsLaunch(cudaStream_t stream, const Src& src, const GluOut& out, Activation act,
                         const std::string& op) {
  if (src.m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(src.m <= 0x7fffffff, op + ": too many rows for one grid");
  // The A/B knobs: PRISM_GLU_CACHE=off recomputes every row (tests compare both paths); the
  // opt-in PRISM_GLU_PREFETCH=on (GluRowsKernel's prefetch) and PRISM_GLU_CLUSTER=on
  // (GluRowParts) keep the bits, but on an H100 neither made a 27B step faster (session 37,
  // benchmarks/results/e2e_h100_session37/): they stay off.
  bool allowed = true, prefetch = false, clusters = false;
  PRISM_RETURN_IF_ERROR(EnvSwitch("PRISM_GLU_CACHE", true, op, &allowed));
  PRISM_RETURN_IF_ERROR(EnvSwitch("PRISM_GLU_PREFETCH", false, op, &prefetch));
  PRISM_RETURN_IF_ERROR(EnvSwitch("PRISM_GLU_CLUSTER", false, op, &clusters));
  const int parts = GluRowParts(src.m, src.f, clusters);
  const bool cached =
      allowed && src.f * static_cast<int64_t>(sizeof(float)) <= kGluMaxCachedBytes;
  static_assert(Src::kMaxThreads <= kGluMaxThreads && Src::kMaxThreads % kWarpSize == 0,
                "a row source's widest block is whole warps within the scratch arrays");
  const int width = parts > 1      ? RowBlockThreads(1, CeilDiv(src.f, parts))
                    : cached       ? CachedRowThreads(src.m, src.f)
                                   : RowBlockThreads(src.m, src.f);
  const int threads = std::min(Src::kMaxThreads, width);
  const size_t smem = cached ? static_cast<size_t>(GluCacheBytes(src.f, threads, parts)) : 0;
  const auto run = [&](auto prefetch_c, auto cluster_c) {
    return LaunchGluRows<Src, kTwo, decltype(prefetch_c)::value, decltype(cluster_c)::value>(
        stream, src, out, act, cached, parts, threads, smem, op);
  };
  using On = std::true_type;
  using Off = std::false_type;
  if (parts > 1) return prefetch ? run(On{}, On{}) : run(Off{}, On{});
  return prefetch ? run(On{}, Off{}) : run(Off{}, Off{});
}

}  // namespace prism
