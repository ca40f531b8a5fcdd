// prism_int8_gemm on CUDA; the specification is int8_gemm_cpu.cc.
//   y[m, n] = float(sum_k x_q[m, k] * w_q[n, k]) * s_x[m] * s_w[n], y f32 or bf16.
// Shapes: M tokens, K input features, N output features; x_q [M, K] and w_q [N, K] row-major.
//
// One kernel per call, picked from M, N and K (kBuckets below, chosen from measurements on an
// H200: benchmarks/results/gemm_h200*/):
//   M <= 8             the weight-streaming decode kernel (int8_gemm_decode.cu); N < 8192 in
//                      clusters of two blocks splitting K
//   M <= 16            the TMA-fed streaming kernel (int8_gemm_tma.cu) with wgmma consumers:
//                      128 weight rows a block for N >= 16384, 64 below (twelve stages for
//                      N < 8192 or K >= 8192)
//   M <= 32            the same for N >= 16384 (gate_up) and K >= 8192 (down)
//   larger M           a CUTLASS SM90 kernel (int8_gemm_sm90_*.cu), data-parallel or stream-K;
//                      stream-K's partial sums live in the call's workspace result
//   anything else      (K % 16 != 0, unaligned rows or pointers) the shared-memory __dp4a
//                      kernel (int8_gemm_simt.cu), correct for any M, K, N.
// Every kernel sums in int32 exactly and applies (acc * s_x) * s_w in fp32, so all give the CPU's
// bits and the choice never changes a result.
//
// PRISM_INT8_GEMM_KERNEL (benchmarks only) forces one kernel by name, read on every call:
// simt, decode16, decode32, decode64, decode16k<S> / decode32k<S> (S = 2, 4, 8: a cluster of S
// blocks splitting K), tma64 / tma128 and tma64k<S> / tma128k<S> (S = 2, 4; M <= 64; mma.sync
// consumers), tmawg64 / tmawg128 / tmawg64k<S> / tmawg128k<S> (the same with wgmma consumers,
// float32 output), each optionally suffixed s<2-32> (its stages), or a tile of Sm90TileName();
// unsupported shapes still fall back.
// PRISM_INT8_GEMM_RASTER=m|n and PRISM_INT8_GEMM_SWIZZLE=1|2|4|8 (benchmarks only) force the
// CUTLASS tile order, PRISM_INT8_GEMM_DECOMP=s|d|k<splits> a stream-K tile's decomposition
// (Sm90Order). Under a command buffer what is in force at capture is what
// is replayed.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/handlers.h"
#include "cc/numerics.h"
#include "cc/ops/int8_gemm_kernels.h"
#include "cc/ops/int8_gemm_shapes.h"
#include "cc/ops/int8_gemm_simt.h"
#include "cc/ops/int8_gemm_tma.h"

namespace prism {
namespace {

// What runs for M up to max_m (buckets in increasing order, the first match wins; the last one
// is open-ended). A bucket may also ask N >= min_n or K >= min_k. decode_rows > 0: the decode
// kernel with that many weight rows per block; else `tile`.
// From the H200 sweeps: M = 1: decode32 best or tied; M = 16: the decode kernel streamed gate_up
// at 2.3 TB/s where the swapped CUTLASS tile, at M = 64 already, did 2.8
// (results/gemm_h200/). Two sweeps of session 5 (results/gemm_h200_session5/, 5 runs a cell;
// the same kernel moved by up to 20 % between them), TOP/s: M = 64 and 128, the swapped tile,
// except gate_up at 128 where ping-pong 64x256 did 622 against 510 (the non-swapped 128-row
// tiles leave one CTA of each 2x1 cluster idle at M <= 128); stream-K pays on down (K = 21504:
// few output tiles, long K) at M = 256 (827 / 811 vs 797 / 775 for 128x128) and M = 1024 (1168
// / 1257 for 128x256 vs 1039 / 1077 ping-pong), less clearly at M = 512 (1047 / 829 vs 884 /
// 880 for 128x256), and loses on o (K = 4096; M = 1024: 734 vs 884 for 128x128). CUTLASS's
// heuristic runs the stream-K tiles data-parallel whenever the last wave is at least half full,
// at a cost over the plain data-parallel tile; forced stream-K ('s', session 23's kernel-time
// sweep, results/gemm_h200_session23/): down at M = 256 50.7 µs against 55.3, at M = 4096 599.0
// against 622.3 (128x192; 613.4 in the run after, so within the spread there); at M = 4096 the
// plain 128x256 beats the heuristic's: gate_up 1297.7 against 1335.3, qkv 246.3 against 250.5.
// Elsewhere: gate_up takes 128x256 at M = 256 (1002 / 958 vs 908 / 904) and 1024, ping-pong at 512
// (1067 / 1115 vs 1035 / 1082); qkv and o take 128x256 at 512 (qkv 909 / 917 vs 878 / 876
// ping-pong) and o 128x128 at 1024 (884 / 813). 2x2 clusters (x multicast too) lost or tied
// everywhere (cluster2x2_7d9ba2a/). M = 2048: ping-pong (results/gemm_h200/, not remeasured);
// M = 4096: only 128x256 was measured. Session 7, Nsight Compute device time (gemm_ncu.sh,
// results/gemm_h200_session7/): split-K pays only on down at M <= 64 (37.3 vs 44.4 µs at 64,
// 40.2 vs 47.4 at 32: its 42 weight-row tiles leave 90 SMs idle over K = 21504); on qkv and o
// it loses (19.4 / 16.1 vs 16.8 / 13.4 µs at 64), and at M = 128 it ties everywhere.
// Session 9 (results/gemm_h200_session9/, sweeps a-c, TOP/s, ~5 % run-to-run): above M = 256
// 128x192 tiles fit N = 5376 (o, down) in whole tiles and waves (down at M = 448: 4 x 28 = 112
// tiles in one wave where 128x128 stream-K took 767 TOP/s and 128x192 991-993; o at 448 / 512:
// 529-619 / 648-651 vs 484-501 / 538-547); gate_up takes stream-K 128x256 (448: 976-1039 vs
// ping-pong 870-920; at 512-4096 within 5 % of the best tile). At M = 4096 o and down gain from
// raster along M with swizzle 4 (1098-1146 vs 1017-1052; 1408-1412 vs 1324-1378), which halves
// them at M <= 512. Variants that lost or tied everywhere: 256x128 with a 1x2 cluster, 128x256
// without a cluster, ping-pong 128x128 (only M = 512-1024 qkv within noise of the best) and
// stream-K 128x192 were measured and removed.
// At M <= 64, kernel time (gemm_bench --device-time, results/gemm_h200_session9/small_m_b/):
// swapped tiles of 64 weight rows give qkv, o and down twice the CTAs of the 128-row tile. 64x32
// at M = 16 / 32: qkv 15.2 / 14.6 µs vs 17.1 / 17.2, o 10.1 / 9.9 vs 11.4 / 11.6, down 34.7 /
// 32.7 vs 38.8 / 39.2 (split-K); 64x64 at M = 64: qkv 15.2 vs 15.7, o 10.1 vs 11.6, down 32.5
// vs 37.1. gate_up (336 tiles of 128 rows already) keeps the 128x64 tile (60.8-64.2 µs, the
// 64-row tiles 61.1-84.7). Decode stays at M <= 8: qkv and o 13.8 / 8.9 µs at M = 1.
// Session 20 (results/gemm_h200_session20/decode_split/, kernel time at M = 1): the narrow weights
// (N < 8192: o and down, 168 blocks of 32 rows on 132 SMs) take clusters of two blocks splitting
// each slab's K: down 38.2 -> 31.4 µs (3.02 -> 3.68 TB/s), o 8.9 -> 8.2; qkv and gate_up lose
// (14.0 -> 19.6, 62 -> 78), and so does every split at M = 16-64 and of 4 or 8 blocks.
// Session 21 (results/gemm_h200_session21/, kernel time): the TMA-fed kernel (int8_gemm_tma.cu)
// in clusters of two at 8 < M <= 16 on down (K >= 8192): 32.9-34.1 µs against the swapped
// 64x32 tile's 34.3-35.7 in three runs. On gate_up one block a slab tied the swapped 128x64 tile
// (62.7-64.8 in three runs against 63.6-64.4 in four), and at M = 32-64 and on qkv and o it
// loses or ties. Where the TMA kernel cannot run (alignment), its bucket's CUTLASS tile does.
// Session 22 (results/gemm_h200_session22/): wgmma consumers and a stage count that keeps the
// whole grid resident. At M = 16: gate_up 59.7 µs (tmawg128) against the 128x64 tile's 63.5,
// qkv 14.3 (tmawg64) against 15.2, o 10.0 against 10.3; at M = 32 gate_up 60.2 against 64.3.
// qkv and o at M = 32, down, and every shape at M = 64 keep their kernels (ties or losses).
// Twelve stages for the narrow weights, whose 64-row grids hold one block an SM (84 blocks):
// down 31.7 / 32.6 µs at M = 16 / 32 against 33.9 / 34.7 at eight and 34.8 / 34.2 for the
// kernels before, o 9.4 against 9.9 at M = 16; qkv (128 blocks) 14.6 against 14.3 at eight.
struct Bucket {
  int64_t max_m;
  int decode_rows;
  Sm90Tile tile;
  int64_t min_n = 0;  // the bucket applies only to N >= min_n ...
  int64_t min_k = 0;  // ... and K >= min_k
  Sm90Order order = {};
  int split = 1;     // decode or tma: blocks (one cluster) sharing a slab's K
  int tma_rows = 0;  // > 0: the TMA-fed streaming kernel with that many weight rows per block
                     // (`tile` where it cannot run)
  bool tma_wgmma = false;  // its consumers: wgmma warpgroups, else mma.sync warps
  int tma_stages = 0;      // its ring's stages (0: all blocks resident, int8_gemm_tma.cu)
};
constexpr int64_t kWideN = 16384;  // gate_up (N = 43008) among the 27B shapes
constexpr int64_t kLongK = 8192;   // down (K = 21504)
constexpr int64_t kMidN = 8192;    // qkv (N = 8192) and gate_up, not o (N = 5376)
constexpr Bucket kBucketsF32[] = {
    {8, 32, Sm90Tile::kSwap128x64, kMidN},
    {8, 32, Sm90Tile::kSwap128x64, 0, 0, {}, 2},
    {16, 0, Sm90Tile::kSwap128x64, kWideN, 0, {}, 1, 128, true},
    {16, 0, Sm90Tile::kSwapPing64x32, 0, kLongK, {}, 1, 64, true, 12},
    {16, 0, Sm90Tile::kSwapPing64x32, kMidN, 0, {}, 1, 64, true},
    {16, 0, Sm90Tile::kSwapPing64x32, 0, 0, {}, 1, 64, true, 12},
    {32, 0, Sm90Tile::kSwap128x64, kWideN, 0, {}, 1, 128, true},
    {32, 0, Sm90Tile::kSwapPing64x32, 0, kLongK, {}, 1, 64, true, 12},
    {32, 0, Sm90Tile::kSwapPing64x32},
    {64, 0, Sm90Tile::kSwap128x64, kWideN},
    {64, 0, Sm90Tile::kSwapPing64x64},
    {128, 0, Sm90Tile::kPing64x256, kWideN},
    {128, 0, Sm90Tile::kSwap128x64},
    {256, 0, Sm90Tile::kCoop128x256, kWideN},
    {256, 0, Sm90Tile::kStreamK128x128, 0, kLongK, {0, 1, 's'}},
    {256, 0, Sm90Tile::kCoop128x128},
    {512, 0, Sm90Tile::kStreamK128x256, kWideN},
    {512, 0, Sm90Tile::kCoop128x256, kMidN},
    {512, 0, Sm90Tile::kCoop128x192},
    {1024, 0, Sm90Tile::kStreamK128x256, kWideN},
    {1024, 0, Sm90Tile::kStreamK128x256, 0, kLongK},
    {1024, 0, Sm90Tile::kCoop128x256, kMidN},
    {1024, 0, Sm90Tile::kCoop128x192},
    {2048, 0, Sm90Tile::kPing64x256},
    {INT64_MAX, 0, Sm90Tile::kCoop128x256, kMidN},
    {INT64_MAX, 0, Sm90Tile::kStreamK128x256, 0, kLongK, {0, 1, 's'}},
    {INT64_MAX, 0, Sm90Tile::kCoop128x192, 0, 0, {'m', 4}},
};
// bf16 output has two CUTLASS tiles built (int8_gemm_sm90_bf16.cu); not measured separately.
constexpr Bucket kBucketsBf16[] = {
    {8, 32, Sm90Tile::kSwap128x64},
    {128, 0, Sm90Tile::kSwap128x64},
    {INT64_MAX, 0, Sm90Tile::kCoop128x256},
};

template <size_t kCount>
Bucket Pick(const Bucket (&table)[kCount], int64_t m, int64_t k, int64_t n) {
  for (const Bucket& b : table) {
    if (m <= b.max_m && n >= b.min_n && k >= b.min_k) return b;
  }
  return table[kCount - 1];
}

// The benchmark overrides of the tile order (PRISM_INT8_GEMM_RASTER / _SWIZZLE), if set.
void ForceOrder(Sm90Order* order) {
  const char* raster = std::getenv("PRISM_INT8_GEMM_RASTER");
  if (raster != nullptr && (raster[0] == 'm' || raster[0] == 'n')) order->raster = raster[0];
  const char* swizzle = std::getenv("PRISM_INT8_GEMM_SWIZZLE");
  const int s = swizzle == nullptr ? 0 : std::atoi(swizzle);
  if (s == 1 || s == 2 || s == 4 || s == 8) order->swizzle = s;
  // PRISM_INT8_GEMM_DECOMP=s|d|k<2-8> (stream-K tiles only): the scheduler's decomposition.
  const char* decomp = std::getenv("PRISM_INT8_GEMM_DECOMP");
  if (decomp == nullptr) return;
  if ((decomp[0] == 's' || decomp[0] == 'd') && decomp[1] == '\0') order->decomposition = decomp[0];
  const int splits = decomp[0] == 'k' ? std::atoi(decomp + 1) : 0;
  if (splits >= 2 && splits <= 8) *order = {order->raster, order->swizzle, 'k', splits};
}

// tma<rows> / tmawg<rows> (one block a slab), ...k<split> (a cluster of split blocks), then
// optionally s<stages> (2-32: the ring's stages, as shared memory allows; else as many as keep
// the grid resident).
bool ForcedTma(const char* name, int64_t m, Bucket* choice) {
  for (const bool wgmma : {false, true}) {
    for (int rows : {64, 128}) {
      for (int split : {1, 2, 4}) {
        const std::string stem = std::string(wgmma ? "tmawg" : "tma") + std::to_string(rows) +
                                 (split > 1 ? "k" + std::to_string(split) : "");
        if (std::strncmp(name, stem.c_str(), stem.size()) != 0) continue;
        const char* rest = name + stem.size();
        int stages = 0;
        if (rest[0] == 's') {
          char* end = nullptr;
          stages = static_cast<int>(std::strtol(rest + 1, &end, 10));
          if (end == rest + 1 || *end != '\0' || stages < 2 || stages > 32) continue;
        } else if (rest[0] != '\0') {
          continue;
        }
        *choice = {m, 0, Sm90Tile::kCoop128x256, 0, 0, {}, split, rows, wgmma, stages};
        return true;
      }
    }
  }
  return false;
}

// The benchmark override (PRISM_INT8_GEMM_KERNEL): false when unset; simt set when it names
// the fallback kernel.
bool Forced(int64_t m, Bucket* choice, bool* simt) {
  const char* name = std::getenv("PRISM_INT8_GEMM_KERNEL");
  if (name == nullptr || *name == '\0') return false;
  *simt = std::strcmp(name, "simt") == 0;
  for (int rows : {16, 32, 64}) {
    for (int split : {1, 2, 4, 8}) {
      // decode<rows> (one block a slab) or decode<rows>k<split> (a cluster of split blocks)
      const std::string forced =
          "decode" + std::to_string(rows) + (split > 1 ? "k" + std::to_string(split) : "");
      if (std::strcmp(name, forced.c_str()) == 0) {
        *choice = {m, rows, Sm90Tile::kCoop128x256, 0, 0, {}, split};
        return true;
      }
    }
  }
  if (ForcedTma(name, m, choice)) return true;
  for (int t = 0; t < kSm90TileCount; ++t) {
    if (std::strcmp(name, Sm90TileName(static_cast<Sm90Tile>(t))) == 0) {
      *choice = {m, 0, static_cast<Sm90Tile>(t)};
      return true;
    }
  }
  return *simt;
}

// The kernel for this call: the benchmark override if set, else the bucket for (M, K, N).
template <typename OutT>
Bucket Choose(int64_t m, int64_t k, int64_t n, bool* simt) {
  Bucket choice;
  *simt = false;
  if (!Forced(m, &choice, simt)) {
    choice = std::is_same_v<OutT, float> ? Pick(kBucketsF32, m, k, n)
                                         : Pick(kBucketsBf16, m, k, n);
  }
  ForceOrder(&choice.order);
  return choice;
}

// The data-parallel tile of a stream-K one's shape: what runs when the workspace is too small.
Sm90Tile DataParallelTwin(Sm90Tile tile) {
  switch (tile) {
    case Sm90Tile::kStreamK128x128: return Sm90Tile::kCoop128x128;
    case Sm90Tile::kStreamK128x256: return Sm90Tile::kCoop128x256;
    default: return tile;
  }
}

template <typename OutT>
cudaError_t Dispatch(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                     const float* sw, OutT* y, int64_t m, int64_t k, int64_t n, void* workspace,
                     size_t workspace_bytes) {
  bool simt = false;
  const Bucket choice = Choose<OutT>(m, k, n, &simt);
  cudaError_t e = cudaErrorNotSupported;
  if (!simt && k >= 16) {
    if (choice.decode_rows > 0 && DecodeSupports(x, w, m, k)) {
      e = RunDecode(choice.decode_rows, choice.split, stream, x, sx, w, sw, y, m, k, n);
    } else if (choice.tma_rows > 0 && TmaSupports(x, w, m, k, n)) {
      const TmaConfig tma{choice.tma_rows, choice.split, choice.tma_wgmma, choice.tma_stages};
      e = RunTma(tma, stream, x, sx, w, sw, y, m, k, n);
    }
    // A TMA bucket the kernel does not build (bf16 wgmma) runs its CUTLASS tile.
    if (e == cudaErrorNotSupported && choice.decode_rows == 0 &&
        Sm90Supports(x, w, y, k, n, sizeof(OutT))) {
      e = RunSm90(choice.tile, stream, x, sx, w, sw, y, m, k, n, workspace, workspace_bytes,
                  choice.order);
      if (e == cudaErrorNotSupported && DataParallelTwin(choice.tile) != choice.tile) {
        e = RunSm90(DataParallelTwin(choice.tile), stream, x, sx, w, sw, y, m, k, n, nullptr, 0,
                    choice.order);
      }
    }
  }
  // Not supported for this shape or alignment (nothing was launched): the general kernel.
  if (e == cudaErrorNotSupported) e = RunSimt(stream, x, sx, w, sw, y, m, k, n);
  return e;
}

template <typename OutT>
ffi::Error Launch(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                  const float* sw, OutT* y, int64_t m, int64_t k, int64_t n, void* workspace,
                  size_t workspace_bytes) {
  const cudaError_t e = Dispatch(stream, x, sx, w, sw, y, m, k, n, workspace, workspace_bytes);
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("prism_int8_gemm: CUDA launch failed: ") +
                              cudaGetErrorString(e));
}

ffi::Error Int8GemmCuda(cudaStream_t stream, ffi::BufferR2<ffi::S8> x_q,
                        ffi::BufferR1<ffi::F32> s_x, ffi::BufferR2<ffi::S8> w_q,
                        ffi::BufferR1<ffi::F32> s_w, ffi::Result<ffi::AnyBuffer> y,
                        ffi::Result<ffi::BufferR1<ffi::U8>> workspace) {
  int64_t m = 0, k = 0, n = 0;
  if (auto e = CheckInt8GemmShapes(x_q, s_x, w_q, s_w, *y, &m, &k, &n); e.failure()) return e;
  const bool f32 = y->element_type() == ffi::DataType::F32;
  PRISM_REQUIRE(f32 || y->element_type() == ffi::DataType::BF16,
                "prism_int8_gemm: y must be float32 or bfloat16");
  if (m == 0 || n == 0) return ffi::Error::Success();
  void* ws = workspace->typed_data();
  const auto ws_bytes = static_cast<size_t>(workspace->dimensions()[0]);
  if (f32) {
    return Launch(stream, x_q.typed_data(), s_x.typed_data(), w_q.typed_data(), s_w.typed_data(),
                  y->typed_data<float>(), m, k, n, ws, ws_bytes);
  }
  return Launch(stream, x_q.typed_data(), s_x.typed_data(), w_q.typed_data(), s_w.typed_data(),
                y->reinterpret_data<uint16_t>(), m, k, n, ws, ws_bytes);
}

}  // namespace
}  // namespace prism

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismInt8GemmCuda, prism::Int8GemmCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // x_q [M, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_x [M]
                                  .Arg<xla::ffi::BufferR2<xla::ffi::S8>>()   // w_q [N, K]
                                  .Arg<xla::ffi::BufferR1<xla::ffi::F32>>()  // s_w [N]
                                  .Ret<xla::ffi::AnyBuffer>()                // y [M, N]
                                  .Ret<xla::ffi::BufferR1<xla::ffi::U8>>(),  // workspace [W]
                              {xla::ffi::Traits::kCmdBufferCompatible});

// Bytes of workspace prism_int8_gemm's CUDA handler wants for this call (the kernel Choose()
// picks now, PRISM_INT8_GEMM_KERNEL included); the Python wrapper sizes the workspace result
// with it at trace time.
size_t PrismInt8GemmWorkspaceBytes(int64_t m, int64_t k, int64_t n, bool f32) {
  if (!f32 || m <= 0 || n <= 0) return 0;  // no bf16 stream-K tile is built
  bool simt = false;
  const prism::Bucket choice = prism::Choose<float>(m, k, n, &simt);
  if (simt || choice.decode_rows > 0 || choice.tma_rows > 0) return 0;
  return prism::Sm90WorkspaceBytes(choice.tile, m, k, n, choice.order);
}
