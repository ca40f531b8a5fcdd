// prism_int8_gemm for M <= 32: weights streamed by the Hopper bulk-copy engine (TMA). At small M
// the GEMM is a read of w (N * K bytes), and the register-staged decode kernel
// (int8_gemm_decode.cu) kept too few bytes in flight and gave whole row slabs to blocks: o and
// down at N = 5376 are 168 slabs of 32 rows, 1.27 waves on 132 SMs (2.5-3.1 TB/s, H200).
//
// Work: units of kRows weight rows x kUnitK bytes of K, numbered slab-major (unit u is slab
// u / kcs, K chunk u % kcs). One persistent block per SM takes a contiguous run of units, so
// every SM streams the same bytes (+-1 unit) whatever N is. In a block, a producer thread keeps
// a ring of kStages shared-memory stages filled by the tensor-memory accelerator, one 2D box of
// w (32 rows x 1 KB, zeros past N and K) a stage, completion counted on the stage's `full`
// mbarrier. 8 consumer warps take each stage with mma.sync m16n8k32 (warp w: weight rows
// 16 (w / 4) .. + 16, the 64-byte chunks w % 4 + 4 q of the unit), x's pieces read through L1
// (issued before the wait), and release it on its `empty` mbarrier. On an H200 the TMA took
// ~0.5 us a stage at 10-16 KB: one 1D bulk copy per 256-byte row of w and x ran at 0.4-0.6
// TB/s, boxes of 32 rows x 256 bytes (w, and x in the stage) at 1.0-2.1, of 32 rows x 1 KB at
// 1.2-3.2 (results/gemm_h200_session10/).
//
// Sums are int32 and exact in any order. At the end of a slab (or of the block's run) the
// warps add their fragments in shared memory. A slab the block covered whole is written out
// directly; a slab shared with neighbouring blocks (at most the first and last of a run) is
// parked in the block's workspace slot, and the block whose units complete the slab's count
// (an atomic counter, zeroed by a memset before the launch) adds every contributor's slot and
// writes it. The epilogue is the contract's (acc * s_x) * s_w in fp32, so the bits are the
// other kernels'.
//
// K order inside a 64-byte chunk: as int8_gemm_decode.cu (lane (g, t) holds bytes 16t .. 16t+15
// of rows g and g + 8 and of token g; the same permutation of k for w and x).
#include <cuda.h>  // CUtensorMap; the encoder comes from the runtime's driver entry point
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/int8_gemm_kernels.h"

namespace prism {
namespace {

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * kWarpSize;
constexpr int kThreads = kConsumers + kWarpSize;  // + the producer warp
constexpr int kRows = 32;                          // weight rows per unit: two m16 tiles
constexpr int kUnitK = 1024;                       // K bytes per unit
constexpr int kChunks = kUnitK / 64;               // 64-byte chunks per unit row
constexpr int kBoxElem = 8;  // the maps' element: 8 bytes, so a 128-element box row is 1 KB
constexpr int kPitch = kUnitK;  // a box row in shared memory (dense: 2-way bank conflicts)
constexpr int kMaxTokens = 32;
constexpr int kSmemBudget = 200 * 1024;  // ring bytes: one block per SM, within the 227 KB
constexpr int kMaxStages = 16;
constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warps (0: __syncthreads)
constexpr int kWarpsPerTile = kConsumerWarps / 2;          // warps on each m16 tile of a unit
constexpr int kChunksPerWarp = kChunks / kWarpsPerTile;    // warp w: chunks w % 4 + 4 q
static_assert(kChunks % kWarpsPerTile == 0, "a unit row's chunks split evenly over the warps");

template <int kTokens>
constexpr int StageBytes() {  // w only: x is small and hot in L2, read by the consumers
  return kRows * kPitch;
}
template <int kTokens>
constexpr int Stages() {
  return std::min(kMaxStages, kSmemBudget / StageBytes<kTokens>());
}
constexpr int kRingAlign = 1024;  // stage boxes start 128-byte aligned (TMA); margin for it

// ---- mbarrier and bulk copy (PTX ISA 8.0, sm_90) ----
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}
__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@done bra.uni DONE;\n"
      "bra.uni WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}
// The box of `map` at (inner, row) into shared dst (128-byte aligned), counted on bar.
__device__ __forceinline__ void LoadBox(void* dst, const CUtensorMap& map, int inner, int row,
                                        uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(inner), "r"(row), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kConsumerBarrier), "n"(kConsumers) : "memory");
}

// d += A (16 x 32, row) . B (32 x 8, col), int8 in, int32 accumulate.
__device__ __forceinline__ void Mma(int32_t (&d)[4], int a0, int a1, int a2, int a3, int b0,
                                    int b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ int4 LoadShared(const int8_t* p) {
  return *reinterpret_cast<const int4*>(p);
}

// The call's geometry: units, the blocks' runs of them, and the workspace.
struct Plan {
  int64_t m, k, n;
  int64_t slabs, kcs, units;
  int64_t blocks;      // <= units: every block has at least one unit
  int32_t* counters;   // [slabs] contributed units of each shared slab
  int32_t* slots;      // [blocks][2][kTokens][kRows] partial slabs (first, last of a run)
  __device__ int64_t Lo(int64_t b) const { return b * units / blocks; }
  __device__ int64_t BlockOf(int64_t u) const { return ((u + 1) * blocks - 1) / units; }
};

template <typename OutT>
struct Io {
  const int8_t* __restrict__ x;
  const float* __restrict__ sx;
  const float* __restrict__ sw;
  OutT* __restrict__ y;
};

// Producer thread: fills the ring. Boxes are whole (zeros past N, M and K), so every stage
// counts the same bytes.
template <int kTokens>
__device__ void Produce(const Plan& p, const CUtensorMap& wmap, int8_t* ring, uint64_t* full, uint64_t* empty, int64_t lo, int64_t hi) {
  constexpr int kStages = Stages<kTokens>();
  for (int64_t u = lo, i = 0; u < hi; ++u, ++i) {
    const int stage = static_cast<int>(i % kStages);
    if (i >= kStages) MbarWait(&empty[stage], static_cast<uint32_t>((i / kStages - 1) & 1));
    const int slab = static_cast<int>(u / p.kcs), k0 = static_cast<int>((u % p.kcs) * kUnitK);
    int8_t* base = ring + static_cast<int64_t>(stage) * StageBytes<kTokens>();
    MbarExpectTx(&full[stage], static_cast<uint32_t>(StageBytes<kTokens>()));
    LoadBox(base, wmap, k0 / kBoxElem, slab * kRows, &full[stage]);
  }
}

// Writes sums [kTokens][kRows] (int32, shared or a global total) of slab s as y.
template <int kTokens, typename OutT, typename SumFn>
__device__ void Epilogue(const Plan& p, const Io<OutT>& io, int64_t s, SumFn sum) {
  for (int i = static_cast<int>(threadIdx.x); i < kTokens * kRows; i += kConsumers) {
    const int tok = i / kRows, r = i % kRows;
    const int64_t col = s * kRows + r;
    if (tok < p.m && col < p.n) {
      // Epilogue order is part of the contract: (acc * s_x) * s_w, in fp32.
      const float v = __fmul_rn(__fmul_rn(static_cast<float>(sum(i)), io.sx[tok]), io.sw[col]);
      FromF32(v, io.y + tok * p.n + col);
    }
  }
}

// The block's slab s, its sums in shared memory: written out, or parked for the block that
// completes it. Consumer threads only; leaves sums zeroed.
template <int kTokens, typename OutT>
__device__ void FlushSlab(const Plan& p, const Io<OutT>& io, int64_t s, int64_t lo, int64_t hi,
                          int32_t (&sums)[kTokens][kRows]) {
  __shared__ int last;
  const int64_t first_u = s * p.kcs, end_u = first_u + p.kcs;
  int32_t* flat = &sums[0][0];
  if (first_u >= lo && end_u <= hi) {
    Epilogue<kTokens>(p, io, s, [&](int i) { return flat[i]; });
  } else {
    const auto slot = [&](int64_t b) {  // b's slot for slab s: 0 if s is b's first slab
      const int64_t which = s == p.Lo(b) / p.kcs ? 0 : 1;
      return p.slots + (b * 2 + which) * (kTokens * kRows);
    };
    int32_t* mine = slot(blockIdx.x);
    for (int i = static_cast<int>(threadIdx.x); i < kTokens * kRows; i += kConsumers) {
      mine[i] = flat[i];
    }
    __threadfence();  // the slot before the count that publishes it
    ConsumerSync();
    if (threadIdx.x == 0) {
      const int32_t units = static_cast<int32_t>(std::min(end_u, hi) - std::max(first_u, lo));
      last = atomicAdd(&p.counters[s], units) + units == p.kcs;
    }
    ConsumerSync();
    if (last) {
      __threadfence();
      const int64_t b0 = p.BlockOf(first_u), b1 = p.BlockOf(end_u - 1);
      Epilogue<kTokens>(p, io, s, [&](int i) {
        int32_t total = 0;
        for (int64_t b = b0; b <= b1; ++b) total += __ldcg(slot(b) + i);
        return total;
      });
    }
  }
  ConsumerSync();
  for (int i = static_cast<int>(threadIdx.x); i < kTokens * kRows; i += kConsumers) flat[i] = 0;
  ConsumerSync();
}

template <int kTokens, typename OutT>
__device__ void Consume(const Plan& p, const Io<OutT>& io, const int8_t* ring, uint64_t* full,
                        uint64_t* empty, int64_t lo, int64_t hi) {
  constexpr int kStages = Stages<kTokens>(), kTiles = kTokens / 8;
  __shared__ int32_t sums[kTokens][kRows];
  for (int i = static_cast<int>(threadIdx.x); i < kTokens * kRows; i += kConsumers) {
    (&sums[0][0])[i] = 0;
  }
  ConsumerSync();
  const int warp = static_cast<int>(threadIdx.x / kWarpSize);
  const int lane = static_cast<int>(threadIdx.x % kWarpSize), g = lane / 4, t = lane % 4;
  const int tile = warp / kWarpsPerTile, at = 64 * (warp % kWarpsPerTile) + 16 * t;
  int32_t acc[kTiles][4] = {};
  for (int64_t u = lo, i = 0; u < hi; ++u, ++i) {
    const int stage = static_cast<int>(i % kStages);
    // x's pieces first: their L2 round trip overlaps the wait for the stage.
    const int64_t slab = u / p.kcs, k0 = (u % p.kcs) * kUnitK + at;
    int4 xs[kChunksPerWarp][kTiles];
#pragma unroll
    for (int q = 0; q < kChunksPerWarp; ++q) {
      const int64_t kq = k0 + 64 * kWarpsPerTile * q;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int tok = j * 8 + g;
        xs[q][j] = tok < p.m && kq < p.k  // K % 16 == 0: a piece is all in or all out
                       ? __ldg(reinterpret_cast<const int4*>(io.x + tok * p.k + kq))
                       : make_int4(0, 0, 0, 0);
      }
    }
    MbarWait(&full[stage], static_cast<uint32_t>((i / kStages) & 1));
    const int8_t* stage_base = ring + static_cast<int64_t>(stage) * StageBytes<kTokens>() + at;
#pragma unroll
    for (int q = 0; q < kChunksPerWarp; ++q) {
      const int8_t* base = stage_base + 64 * kWarpsPerTile * q;
      const int4 w0 = LoadShared(base + (tile * 16 + g) * kPitch);  // zeros past N and K
      const int4 w1 = LoadShared(base + (tile * 16 + g + 8) * kPitch);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int4 xv = xs[q][j];
        Mma(acc[j], w0.x, w1.x, w0.y, w1.y, xv.x, xv.y);
        Mma(acc[j], w0.z, w1.z, w0.w, w1.w, xv.z, xv.w);
      }
    }
    __syncwarp();
    if (lane == 0) MbarArrive(&empty[stage]);
    if (u + 1 == hi || (u + 1) % p.kcs == 0) {
      // Fragment layout: d0 (row g, token 2t), d1 (g, 2t + 1), d2 (g + 8, 2t), d3 (g + 8, 2t + 1).
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int r = tile * 16 + g, tok = j * 8 + 2 * t;
        atomicAdd(&sums[tok][r], acc[j][0]);
        atomicAdd(&sums[tok + 1][r], acc[j][1]);
        atomicAdd(&sums[tok][r + 8], acc[j][2]);
        atomicAdd(&sums[tok + 1][r + 8], acc[j][3]);
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[j][q] = 0;
      }
      ConsumerSync();
      FlushSlab<kTokens>(p, io, slab, lo, hi, sums);
    }
  }
}

template <int kTokens, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    StreamKernel(Plan p, Io<OutT> io, const __grid_constant__ CUtensorMap wmap) {
  constexpr int kStages = Stages<kTokens>();
  extern __shared__ int8_t smem[];
  int8_t* ring = smem + (kRingAlign - SmemAddr(smem) % kRingAlign) % kRingAlign;
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);                // the producer's expect_tx arrival
      MbarInit(&empty[s], kConsumerWarps);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();  // the last block-wide barrier: the roles split below
  const int64_t lo = p.Lo(blockIdx.x), hi = p.Lo(blockIdx.x + 1);
  if (threadIdx.x == kConsumers) {
    Produce<kTokens>(p, wmap, ring, full, empty, lo, hi);
  } else if (threadIdx.x < kConsumers) {
    Consume<kTokens>(p, io, ring, full, empty, lo, hi);
  }
}

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();  // clear it: the caller falls back to a default
    return 0;
  }
  return sms;
}

// cuTensorMapEncodeTiled, from the driver through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const auto fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The [rows, k] int8 matrix at base (16-byte aligned, k % 16 == 0) in boxes of box_rows x kUnitK
// bytes, zeros outside it. Elements of 8 bytes: a box row is at most 256 elements.
bool EncodeBoxes(CUtensorMap* map, const int8_t* base, int64_t rows, int64_t k, int box_rows) {
  const auto encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k / kBoxElem),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};  // bytes between rows
  const cuuint32_t box[2] = {kUnitK / kBoxElem, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t steps[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT64, 2, const_cast<int8_t*>(base), dims, strides,
                box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

constexpr int64_t kCounterAlign = 256;

int64_t TokensFor(int64_t m) { return m <= 8 ? 8 : m <= 16 ? 16 : 32; }

// Workspace for `blocks` blocks: counters [slabs] (aligned up), then the slots.
int64_t WorkspaceFor(int64_t m, int64_t n, int64_t blocks) {
  const int64_t counters = CeilDiv(CeilDiv(n, kRows) * 4, kCounterAlign) * kCounterAlign;
  return counters + blocks * 2 * TokensFor(m) * kRows * 4;
}

template <int kTokens, typename OutT>
cudaError_t Launch(cudaStream_t stream, const int8_t* w, const Io<OutT>& io,
                   int64_t m, int64_t k, int64_t n, void* workspace, size_t workspace_bytes) {
  CUtensorMap wmap;
  if (!EncodeBoxes(&wmap, w, n, k, kRows)) return cudaErrorNotSupported;
  Plan p{m, k, n, CeilDiv(n, kRows), CeilDiv(k, kUnitK), 0, 0, nullptr, nullptr};
  p.units = p.slabs * p.kcs;
  int64_t blocks = std::min<int64_t>(p.units, std::max(1, SmCount()));
  while (blocks > 1 && WorkspaceFor(m, n, blocks) > static_cast<int64_t>(workspace_bytes)) {
    blocks /= 2;  // a workspace sized for another device: fewer blocks, same bits
  }
  if (workspace == nullptr || WorkspaceFor(m, n, blocks) > static_cast<int64_t>(workspace_bytes)) {
    return cudaErrorNotSupported;
  }
  p.blocks = blocks;
  p.counters = static_cast<int32_t*>(workspace);
  const int64_t counter_bytes = CeilDiv(p.slabs * 4, kCounterAlign) * kCounterAlign;
  p.slots = reinterpret_cast<int32_t*>(static_cast<int8_t*>(workspace) + counter_bytes);
  constexpr int smem = Stages<kTokens>() * StageBytes<kTokens>() + kRingAlign;
  if (auto e = cudaFuncSetAttribute(StreamKernel<kTokens, OutT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess) {
    return e;
  }
  if (auto e = cudaMemsetAsync(p.counters, 0, p.slabs * 4, stream); e != cudaSuccess) return e;
  StreamKernel<kTokens, OutT><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(
      p, io, wmap);
  return cudaGetLastError();
}

}  // namespace

bool StreamSupports(const void* x, const void* w, int64_t m, int64_t k) {
  const auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return m >= 1 && m <= kMaxTokens && k % 16 == 0 && aligned(x) && aligned(w);
}

size_t StreamWorkspaceBytes(int64_t m, int64_t k, int64_t n) {
  if (m < 1 || m > kMaxTokens || n < 1) return 0;
  constexpr int kDefaultSms = 132;  // no device visible at trace time: an H200's count
  const int sms = SmCount();
  const int64_t units = CeilDiv(n, kRows) * CeilDiv(k, kUnitK);
  return static_cast<size_t>(WorkspaceFor(m, n, std::min<int64_t>(units, sms > 0 ? sms : kDefaultSms)));
}

template <typename OutT>
cudaError_t RunStream(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                      const float* sw, OutT* y, int64_t m, int64_t k, int64_t n, void* workspace,
                      size_t workspace_bytes) {
  if (!StreamSupports(x, w, m, k) || k < 16) return cudaErrorNotSupported;
  const Io<OutT> io{x, sx, sw, y};
  if (m <= 8) return Launch<8>(stream, w, io, m, k, n, workspace, workspace_bytes);
  if (m <= 16) return Launch<16>(stream, w, io, m, k, n, workspace, workspace_bytes);
  return Launch<32>(stream, w, io, m, k, n, workspace, workspace_bytes);
}

template cudaError_t RunStream<float>(cudaStream_t, const int8_t*, const float*, const int8_t*,
                                      const float*, float*, int64_t, int64_t, int64_t, void*,
                                      size_t);
template cudaError_t RunStream<uint16_t>(cudaStream_t, const int8_t*, const float*,
                                         const int8_t*, const float*, uint16_t*, int64_t,
                                         int64_t, int64_t, void*, size_t);

}  // namespace prism
