// prism_int8_gemm for 8 < M <= 64 (a follow-up question's 32 tokens, small decode batches): a
// weight-streaming kernel fed by the Hopper tensor-memory accelerator (TMA).
//
// Why not the decode kernel (int8_gemm_decode.cu): there every warp loads its own copy of x's
// chunk, so at M = 32 a lane loads twice as many x bytes as w bytes; and why not CUTLASS's
// swapped tiles: their 8-stage pipelines fit one CTA an SM, so gate_up's 336 tiles run in 2.55
// waves. XLA's Triton GEMM (16 x 128 tiles, TMA, 3 stages, several CTAs an SM) streamed gate_up
// at 4.06 TB/s at M = 16 where those did 3.59 (results/gemm_h200_session20/).
//
// Shapes: M tokens (<= 64), K inputs (% 16 == 0), N outputs; x [M, K], w [N, K], y [M, N].
// Block: kRows weight rows (64 or 128) x all M tokens, padded to kTokens = 16, 32 or 64. One
// producer warp issues a TMA load a stage: a [kRows x 128-byte] box of w and a [kTokens x 128]
// box of x (128-byte swizzle; rows past N or M and bytes past K arrive as zeros). Consumers,
// either kind adding exact int32 products:
//   mma.sync: kRows / 32 warps, each owning 32 weight rows: per 32-byte k-step, ldmatrix gives
//     two m16 A fragments of w and kTokens / 8 B fragments of x for mma.sync m16n8k32;
//   wgmma: kRows / 64 warpgroups, each owning 64 weight rows: per k-step one wgmma m64nNk32
//     (N = kTokens) reads both tiles straight from the stage (wgmma_s8.cuh).
// Stages turn over through full / empty mbarriers; their count is chosen at launch so that the
// whole grid is resident at once (PickStages).
//
// Split over K in a cluster (kSplit = 2 or 4): the kSplit CTAs of a cluster share one slab of
// weight rows, CTA r streaming the r-th contiguous share of its 128-byte K chunks; after a
// cluster barrier each CTA applies the epilogue to a share of the slab's outputs, adding the
// peers' int32 sums through distributed shared memory. The narrow weights (o, down: 42 slabs of
// 128 rows) otherwise leave most SMs idle. Integer sums are exact in any order, so every
// variant gives the same bits as the CPU.
//
// Measured on the H200 (results/gemm_h200_session21/, _session22/): gate_up at M = 16 / 32 with
// wgmma and 128 rows at 3.85 / 3.82 TB/s once the grid is resident (59.7 µs against 64.4 at two
// ~96 KB blocks an SM: the second wave's tail, not the consumers, had held it back); down at
// M = 16 / 32 with wgmma, 64 rows and twelve stages at 3.65 / 3.55; qkv and o at M = 16 with 64
// rows. At M = 64, and for qkv and o at M = 32, CUTLASS's swapped tiles stay ahead.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/cluster_launch.cuh"
#include "cc/ops/int8_gemm_tma.h"
#include "cc/ops/tma_pipeline.cuh"
#include "cc/ops/wgmma_s8.cuh"

namespace prism {
namespace {

namespace cg = cooperative_groups;

constexpr int kBoxK = kTmaBoxK;       // K bytes a stage: one 128-byte swizzle row per tile row
constexpr int kWarpRows = 32;         // weight rows a consumer warp owns (two m16 fragments)
constexpr int kMaxTokens = 64;
constexpr int kMaxStages = 8;  // the launch rule's cap (a forced count may exceed it)

// kWg: the consumers are warpgroups of wgmma (one per 64 weight rows), else warps of mma.sync
// (one per 32 rows).
template <int kRows_, int kTiles, bool kWg>
struct Config {
  static constexpr int kRows = kRows_;
  static_assert(kRows == 64 || kRows == 128, "tma kernel: 64 or 128 weight rows a block");
  static constexpr int kTokens = kTiles * 8;
  static constexpr int kConsumerWarps = kWg ? kRows / 64 * 4 : kRows / kWarpRows;
  // Arrivals that free a stage: one a warpgroup, or one a warp.
  static constexpr int kReleases = kWg ? kRows / 64 : kConsumerWarps;
  static constexpr int kThreads = (kConsumerWarps + 1) * kWarpSize;  // + the producer warp
  static constexpr int kWBytes = kRows * kBoxK, kXBytes = kTokens * kBoxK;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kSumRow = kRows + 1;  // int32 sums [kTokens][kSumRow]: +1 spreads banks
  // The sums reuse the stage memory, so a ring has at least the stages they fill, and two.
  static constexpr int kSumStages = (kTokens * kSumRow * 4 + kStageBytes - 1) / kStageBytes;
  static constexpr int kMinStages = kSumStages > 2 ? kSumStages : 2;
  static_assert(kXBytes % 1024 == 0 && kWBytes % 1024 == 0, "swizzled tiles stay 1024-aligned");
  // Stage tiles first (each 1024-byte aligned, as the 128-byte swizzle needs), then 2 x stages
  // mbarriers; + 1024 so the base can be aligned up.
  static constexpr size_t SmemBytes(int stages) {
    return static_cast<size_t>(stages) * kStageBytes + 2 * stages * sizeof(uint64_t) + 1024;
  }
};


__device__ __forceinline__ void Ldsm4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += A (16 x 32, row) . B (32 x 8, col), int8 in, int32 accumulate (exact).
__device__ __forceinline__ void Mma(int32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared address of 16-byte chunk c of tile row r under the 128-byte swizzle (the TMA's layout:
// chunk c of row r sits at chunk c ^ (r % 8)).
__device__ __forceinline__ uint32_t Swizzled(uint32_t tile, int r, int c) {
  return tile + r * kBoxK + ((c ^ (r & 7)) << 4);
}

// One stage's products for a consumer warp: rows w0 .. w0 + 31 of the w tile, every token.
// ldmatrix x4 on w: lane l addresses row l % 16 of the fragment, 16-byte half l / 16 of the
// k-step, giving a0..a3 in mma's order (rows g / g + 8, k bytes 0-15 / 16-31). On x: lane l
// addresses token l % 8 + 8 (l / 16), half (l / 8) % 2: b0, b1 of two 8-token tiles.
template <int kTiles>
__device__ __forceinline__ void StageProducts(uint32_t w_tile, uint32_t x_tile, int w0, int lane,
                                              int32_t (&acc)[2][kTiles][4]) {
#pragma unroll
  for (int kk = 0; kk < kBoxK / 32; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      Ldsm4(Swizzled(w_tile, w0 + 16 * f + lane % 16, 2 * kk + lane / 16), a[f]);
    }
#pragma unroll
    for (int j = 0; j < kTiles; j += 2) {
      uint32_t b[4];
      Ldsm4(Swizzled(x_tile, 8 * j + lane % 8 + 8 * (lane / 16), 2 * kk + (lane / 8) % 2), b);
#pragma unroll
      for (int f = 0; f < 2; ++f) {
        Mma(acc[f][j], a[f], b[0], b[1]);
        Mma(acc[f][j + 1], a[f], b[2], b[3]);
      }
    }
  }
}

// Waits for the consumer warps only (named barrier 1): the producer may still be returning.
template <class C>
__device__ __forceinline__ void ConsumersSync() {
  asm volatile("bar.sync 1, %0;" ::"n"(C::kConsumerWarps * kWarpSize) : "memory");
}

// The mma.sync consumers: warp `warp` adds rows 32 warp .. + 31 over the block's share of K,
// then stores its sums to sums[token][row] (the stage memory, once every consumer is done).
// Fragment layout: d0 (row g, token 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1).
template <class C>
__device__ __forceinline__ void ConsumeMmaSync(uint8_t* base, uint64_t* full, uint64_t* empty,
                                               int stages, int64_t count, int warp, int lane,
                                               int32_t* sums) {
  constexpr int kTiles = C::kTokens / 8;
  int32_t acc[2][kTiles][4] = {};
  RingPos pos(stages);
  for (int64_t i = 0; i < count; ++i, pos.Next()) {
    MbarWait(&full[pos.s], pos.phase);
    const uint32_t w_tile = SmemAddr(base + pos.s * C::kStageBytes);
    StageProducts<kTiles>(w_tile, w_tile + C::kWBytes, warp * kWarpRows, lane, acc);
    __syncwarp();
    if (lane == 0) MbarArrive(&empty[pos.s]);
  }
  ConsumersSync<C>();  // every stage consumed: its memory now holds the sums
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int f = 0; f < 2; ++f) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int r = warp * kWarpRows + 16 * f + g, tok = 8 * j + 2 * t;
      sums[tok * C::kSumRow + r] = acc[f][j][0];
      sums[(tok + 1) * C::kSumRow + r] = acc[f][j][1];
      sums[tok * C::kSumRow + r + 8] = acc[f][j][2];
      sums[(tok + 1) * C::kSumRow + r + 8] = acc[f][j][3];
    }
  }
}

// The wgmma consumers: warpgroup `group` adds rows 64 group .. + 63, four m64 x kTokens x k32
// products a stage read straight from the swizzled tiles. One stage's group stays in flight:
// stage i - 1 is released once stage i's products are issued and i - 1's have completed.
template <class C>
__device__ __forceinline__ void ConsumeWgmma(uint8_t* base, uint64_t* full, uint64_t* empty,
                                             int stages, int64_t count, int thread,
                                             int32_t* sums) {
  const int group = thread / 128, t = thread % 128;
  int32_t acc[C::kTokens / 2] = {};
  RingPos pos(stages);
  int previous = 0;  // the stage of chunk i - 1
  for (int64_t i = 0; i < count; ++i, pos.Next()) {
    MbarWait(&full[pos.s], pos.phase);
    const uint32_t w_tile = SmemAddr(base + pos.s * C::kStageBytes) + group * 64 * kBoxK;
    const uint32_t x_tile = SmemAddr(base + pos.s * C::kStageBytes + C::kWBytes);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBoxK / 32; ++kk) {
      WgmmaS8<C::kTokens>(acc, WgmmaDescSw128(w_tile + 32 * kk), WgmmaDescSw128(x_tile + 32 * kk));
    }
    WgmmaCommit();
    WgmmaWait<1>();
    if (i > 0 && t == 0) MbarArrive(&empty[previous]);
    previous = pos.s;
  }
  WgmmaWait<0>();
  ConsumersSync<C>();  // every stage consumed: its memory now holds the sums
  const int v = t / kWarpSize, l = t % kWarpSize;
#pragma unroll
  for (int r = 0; r < C::kTokens / 2; ++r) {
    const int row = group * 64 + 16 * v + l / 4 + 8 * ((r / 2) % 2);
    const int tok = 8 * (r / 4) + 2 * (l % 4) + r % 2;
    sums[tok * C::kSumRow + row] = acc[r];
  }
}

// Every thread, once the consumers have stored their sums: thread c < kRows owns column n0 + c
// and CTA `rank` every kSplit-th token, adding the peers' int32 sums through distributed shared
// memory. The loop is unrolled so its shared-memory loads are in flight together (one latency a
// block, not one an output, which had cost 13 µs at M = 64), and a warp's stores cover 128
// contiguous bytes of a y row. The epilogue's order is part of the contract: (acc * s_x) * s_w
// in fp32.
template <class C, int kSplit, typename OutT>
__device__ __forceinline__ void Epilogue(int32_t* sums, const float* s_x, const float* sw, OutT* y,
                                         int m, int64_t n, int64_t n0, int rank) {
  int32_t* peer[kSplit];
  if constexpr (kSplit == 1) {
    __syncthreads();
    peer[0] = sums;
  } else {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's sums complete and visible to the cluster
#pragma unroll
    for (int q = 0; q < kSplit; ++q) peer[q] = cluster.map_shared_rank(sums, q);
  }
  const int c = static_cast<int>(threadIdx.x);
  if (c < C::kRows && n0 + c < n) {
    const int64_t col = n0 + c;
    const float s_w = sw[col];
#pragma unroll
    for (int tok = rank; tok < C::kTokens; tok += kSplit) {
      if (tok < m) {
        int32_t acc_sum = 0;
#pragma unroll
        for (int q = 0; q < kSplit; ++q) acc_sum += peer[q][tok * C::kSumRow + c];  // exact
        const float v = __fmul_rn(__fmul_rn(static_cast<float>(acc_sum), s_x[tok]), s_w);
        FromF32(v, y + static_cast<int64_t>(tok) * n + col);
      }
    }
  }
  // A block's shared memory must outlive its peers' reads of it.
  if constexpr (kSplit > 1) cg::this_cluster().sync();
}

template <int kRows, int kTiles, int kSplit, bool kWg, typename OutT>
__global__ void __launch_bounds__(Config<kRows, kTiles, kWg>::kThreads)
    TmaStreamKernel(const __grid_constant__ CUtensorMap w_map,
                    const __grid_constant__ CUtensorMap x_map, const float* __restrict__ sx,
                    const float* __restrict__ sw, OutT* __restrict__ y, int m, int64_t k,
                    int64_t n, int stages) {
  using C = Config<kRows, kTiles, kWg>;
  extern __shared__ uint8_t raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(base + stages * C::kStageBytes);
  uint64_t* empty = full + stages;
  __shared__ float s_x[C::kTokens];  // loaded under the mainloop, read by the epilogue
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if (threadIdx.x < C::kTokens) s_x[threadIdx.x] = threadIdx.x < m ? sx[threadIdx.x] : 0.0f;
  if (threadIdx.x == C::kConsumerWarps * kWarpSize) {  // the producer, under the set-up
    TmaPrefetchMap(&w_map);
    TmaPrefetchMap(&x_map);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) MbarInit(&full[s], 1), MbarInit(&empty[s], C::kReleases);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the TMA
  }
  __syncthreads();

  // A cluster is kSplit consecutive blocks along x: one slab, rank = its share of K.
  int rank = 0;
  if constexpr (kSplit > 1) rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / kSplit) * kRows;
  const int64_t chunks = (k + kBoxK - 1) / kBoxK, share = (chunks + kSplit - 1) / kSplit;
  const int64_t c_lo = rank * share;
  const int64_t count = c_lo + share < chunks ? share : (chunks > c_lo ? chunks - c_lo : 0);

  int32_t* sums = reinterpret_cast<int32_t*>(base);
  if (warp == C::kConsumerWarps) {
    if (lane == 0) {  // the producer: a stage of round r once its consumers let go of round r - 1
      RingPos pos(stages);
      for (int64_t i = 0; i < count; ++i, pos.Next()) {
        if (i >= stages) MbarWait(&empty[pos.s], pos.phase ^ 1u);
        uint8_t* stage = base + pos.s * C::kStageBytes;
        const int k0 = static_cast<int>((c_lo + i) * kBoxK);
        MbarExpectTx(&full[pos.s], C::kStageBytes);
        TmaLoad(stage, &w_map, k0, static_cast<int>(n0), &full[pos.s]);
        TmaLoad(stage + C::kWBytes, &x_map, k0, 0, &full[pos.s]);
      }
    }
  } else if constexpr (kWg) {
    ConsumeWgmma<C>(base, full, empty, stages, count, static_cast<int>(threadIdx.x), sums);
  } else {
    ConsumeMmaSync<C>(base, full, empty, stages, count, warp, lane, sums);
  }
  Epilogue<C, kSplit>(sums, s_x, sw, y, m, n, n0, rank);
}

template <int kRows, int kTiles, int kSplit, bool kWg, typename OutT>
cudaError_t Launch(int forced_stages, cudaStream_t stream, const int8_t* x, const float* sx,
                   const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k, int64_t n) {
  using C = Config<kRows, kTiles, kWg>;
  CUtensorMap w_map, x_map;
  if (!EncodeRows(&w_map, w, n, k, kRows) || !EncodeRows(&x_map, x, m, k, C::kTokens)) {
    return cudaErrorNotSupported;
  }
  auto* kernel = TmaStreamKernel<kRows, kTiles, kSplit, kWg, OutT>;
  const int64_t blocks = CeilDiv(n, kRows) * kSplit;
  const int stages = PickStages<C>(kernel, blocks, forced_stages, kMaxStages);
  const size_t smem = C::SmemBytes(stages);
  // Per call, not once: the attribute belongs to the current device.
  const cudaError_t attr = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  return LaunchClusters(kernel, blocks, C::kThreads, smem, kSplit, stream, w_map, x_map, sx, sw,
                        y, static_cast<int>(m), k, n, stages);
}

template <int kRows, int kTiles, bool kWg, typename OutT>
cudaError_t LaunchSplit(const TmaConfig& c, cudaStream_t stream, const int8_t* x, const float* sx,
                        const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k,
                        int64_t n) {
  switch (c.split) {
    case 1: return Launch<kRows, kTiles, 1, kWg>(c.stages, stream, x, sx, w, sw, y, m, k, n);
    case 2: return Launch<kRows, kTiles, 2, kWg>(c.stages, stream, x, sx, w, sw, y, m, k, n);
    case 4: return Launch<kRows, kTiles, 4, kWg>(c.stages, stream, x, sx, w, sw, y, m, k, n);
    default: return cudaErrorNotSupported;
  }
}

// wgmma consumers are built for float32 output only (the dispatch's buckets; half the compile
// time); a bf16 call returns cudaErrorNotSupported and the dispatch runs its CUTLASS tile.
template <int kTiles, typename OutT>
cudaError_t LaunchRows(const TmaConfig& c, cudaStream_t stream, const int8_t* x, const float* sx,
                       const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k,
                       int64_t n) {
  if (c.wgmma) {
    if constexpr (std::is_same_v<OutT, float>) {
      if (c.rows == 64) return LaunchSplit<64, kTiles, true>(c, stream, x, sx, w, sw, y, m, k, n);
      if (c.rows == 128) {
        return LaunchSplit<128, kTiles, true>(c, stream, x, sx, w, sw, y, m, k, n);
      }
    }
    return cudaErrorNotSupported;
  }
  switch (c.rows) {
    case 64: return LaunchSplit<64, kTiles, false>(c, stream, x, sx, w, sw, y, m, k, n);
    case 128: return LaunchSplit<128, kTiles, false>(c, stream, x, sx, w, sw, y, m, k, n);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace

bool TmaSupports(const void* x, const void* w, int64_t m, int64_t k, int64_t n) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  // TMA: 16-byte row strides and base addresses; coordinates are int32.
  return m >= 1 && m <= kMaxTokens && k % 16 == 0 && k < (int64_t{1} << 31) &&
         n < (int64_t{1} << 31) && aligned(x) && aligned(w);
}

template <typename OutT>
cudaError_t RunTma(const TmaConfig& config, cudaStream_t stream, const int8_t* x, const float* sx,
                   const int8_t* w, const float* sw, OutT* y, int64_t m, int64_t k, int64_t n) {
  if (m <= 16) return LaunchRows<2>(config, stream, x, sx, w, sw, y, m, k, n);
  if (m <= 32) return LaunchRows<4>(config, stream, x, sx, w, sw, y, m, k, n);
  if (m <= 64) return LaunchRows<8>(config, stream, x, sx, w, sw, y, m, k, n);
  return cudaErrorNotSupported;
}

template cudaError_t RunTma<float>(const TmaConfig&, cudaStream_t, const int8_t*, const float*,
                                   const int8_t*, const float*, float*, int64_t, int64_t, int64_t);
template cudaError_t RunTma<uint16_t>(const TmaConfig&, cudaStream_t, const int8_t*,
                                      const float*, const int8_t*, const float*, uint16_t*,
                                      int64_t, int64_t, int64_t);

}  // namespace prism
