// Tree attention in INT8 digits on CUDA, with the dots on INT8 tensor cores (mma.sync
// m16n8k32 s8 -> s32); arguments as prism_tree_attention (tree_attention.h), arithmetic in
// attention_digits.h, bits equal to the CPU handler (tree_attention_digits_cpu.cc).
//
// Rows R = (token, head) pairs: a block takes kRows rows, TB = kRows / G consecutive tokens of
// the step times the G query heads of one kv head (grid: token blocks x kv heads); warp w owns
// rows 16w .. 16w + 15, the M side of its MMAs. The block's tokens may belong to several
// chains: it runs one pass per chain (increasing chain id), each over the key tiles its rows
// see; rows of other chains sit the pass out. Per tile: the chain's 64 positions are resolved
// to pool rows, whose packed digit rows are copied into shared memory (k row-major, v
// transposed with its keys permuted so that the score fragments are the PV MMA's A operand
// as they lie in registers), then each warp computes its rows' scores (3 MMAs per 32 dims),
// weights and weighted values (5 u8 x s8 MMAs per 32 keys: the weights' byte planes) and
// merges the tile in order. Integer sums are exact in any order and every float operation is
// per element, so neither the tiling nor the MMA layout can change a bit. Steps of up to
// kSplitMaxTokens tokens split the tiles over more blocks and merge their partials in a second
// pass (tree_attention_digits_split.cuh), with the same bits. Building blocks:
// tree_attention_digits_stage.cuh (shared memory, staging), tree_attention_digits_tile.cuh (a
// tile's MMAs and merge), tree_attention_digits_attend.cuh (the attend kernel). No host
// synchronisation, no allocation (the split's workspace is a result of the call):
// command-buffer compatible.
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
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_digits_attend.cuh"
#include "cc/ops/tree_attention_digits_split.cuh"
#include "cc/ops/tree_attention_digits_stage.cuh"
#include "cc/ops/tree_attention_digits_tile.cuh"

namespace prism {
namespace {

using namespace digits;  // NOLINT: this handler's own building blocks

// One row of kH elements cut into digits and packed (attention_digits.h) at dst, by a warp:
// lane l holds elements kE l .. kE l + kE - 1 (a row's digits depend only on the row).
template <typename T, int kH>
__device__ __forceinline__ void PackRow(const T* __restrict__ src, int8_t* __restrict__ dst) {
  constexpr int kE = kH / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  float x[1][kE];
#pragma unroll
  for (int e = 0; e < kE; ++e) x[0][e] = ToF32(src[kE * lane + e]);
  int8_t c1[1][kE], c2[1][kE];
  float s1[1], s2[1];
  RowDigits(x, c1, c2, s1, s2);
#pragma unroll
  for (int e = 0; e < kE; ++e) dst[kE * lane + e] = c1[0][e], dst[kH + kE * lane + e] = c2[0][e];
  if (lane == 0) {
    const float4 tail = make_float4(s1[0], s2[0], 0.0f, 0.0f);  // the scales, then 8 zeros
    *reinterpret_cast<float4*>(dst + PackedScaleOffset(kH)) = tail;
  }
}

// The step's k/v rows cut into digits and packed into pool row slot[t], a warp per (token,
// kv head, k or v) row; then, for the split (q_packed not null), every (token, head) query row
// packed into q_packed [T * N] once, so that the split's blocks copy them.
template <typename T, int kH>
__global__ void __launch_bounds__(kThreads)
    DigitWriteKernel(const T* __restrict__ k_new, const T* __restrict__ v_new,
                     const T* __restrict__ q, const int32_t* __restrict__ slot, Dims dm,
                     int8_t* __restrict__ k_pool, int8_t* __restrict__ v_pool,
                     int8_t* __restrict__ q_packed) {
  const int64_t kv_rows = dm.t * dm.k * 2, row_bytes = PackedRowBytes(kH);
  const int64_t rows = kv_rows + (q_packed == nullptr ? 0 : dm.t * dm.n);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * (kThreads / kWarpSize);
  for (int64_t w = first; w < rows; w += stride) {  // every branch below is uniform per warp
    if (w >= kv_rows) {
      PackRow<T, kH>(q + (w - kv_rows) * kH, q_packed + (w - kv_rows) * row_bytes);
      continue;
    }
    const int64_t t = w / (2 * dm.k), kvh = (w / 2) % dm.k;
    const int64_t sl = slot[t];
    if (sl < 0 || sl >= dm.p * dm.l) continue;
    const int64_t at = (t * dm.k + kvh) * kH, to = (sl * dm.k + kvh) * row_bytes;
    if (w % 2 == 0) PackRow<T, kH>(k_new + at, k_pool + to);
    else PackRow<T, kH>(v_new + at, v_pool + to);
  }
}

// Blocks of one kernel instantiation resident on the whole GPU at once.
template <typename Kernel>
int64_t ResidentBlocks(Kernel kernel, size_t smem) {
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  return DeviceSmCount() * std::max(per_sm, 1);
}

template <typename T, int kH, Mode kMode>
ffi::Error LaunchAttend(cudaStream_t stream, const T* q, const int8_t* k_pool,
                        const int8_t* v_pool, const Dims& dm, const Tables& tb, float scale,
                        int32_t window, const Split& sp, T* out) {
  const char* op = "prism_tree_attention_digits";
  auto* kernel = DigitAttendKernel<T, kH, kMode>;
  constexpr size_t kSmem = sizeof(Smem<kH>);
  static const cudaError_t attr = cudaFuncSetAttribute(  // once per instantiation
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  PRISM_REQUIRE(attr == cudaSuccess, std::string(op) + ": shared memory size refused");
  const int64_t blocks = CeilDiv(dm.t, kRows / dm.g());
  if (blocks == 0) return ffi::Error::Success();
  PRISM_REQUIRE(blocks <= 0x7fffffff && dm.k <= 65535, std::string(op) + ": grid too large");
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(dm.k),
                  kMode == Mode::kPartial ? static_cast<unsigned>(sp.splits) : 1u);
  kernel<<<grid, kThreads, kSmem, stream>>>(q, k_pool, v_pool, dm, tb, scale, window, sp, out);
  return LaunchStatus(op);
}

// PRISM_TREE_ATTENTION_DIGITS_KERNEL=fused|split forces a kernel (tests); else steps of up to
// kSplitMaxTokens tokens split when the workspace holds a round.
inline std::string ForcedDigitsKernel() {
  const char* name = std::getenv("PRISM_TREE_ATTENTION_DIGITS_KERNEL");
  return name == nullptr ? "" : name;
}

// The split: rounds of the workspace's slots over every tile the pool can hold, each pass 1
// then pass 2, then the fallback for blocks whose rows see more.
template <typename T, int kH>
ffi::Error LaunchSplit(cudaStream_t stream, const T* q, const int8_t* k_pool,
                       const int8_t* v_pool, const Dims& dm, const Tables& tb, float scale,
                       int32_t window, Split sp, T* out) {
  const int64_t pool_tiles = CeilDiv(dm.p * dm.l, static_cast<int64_t>(kAttnTile));
  const int64_t rounds = CeilDiv(pool_tiles, sp.slots);
  sp.covered = rounds * sp.slots;
  static const int64_t resident = ResidentBlocks(
      DigitAttendKernel<T, kH, Mode::kPartial>, sizeof(Smem<kH>));  // once per instantiation
  const int64_t blocks = CeilDiv(dm.t, kRows / dm.g()) * dm.k;
  sp.splits = static_cast<int>(std::clamp<int64_t>(CeilDiv(2 * resident, blocks), 1,
                                                   std::min<int64_t>(sp.slots, 65535)));
  const int64_t merge_blocks = CeilDiv(dm.t * dm.n, static_cast<int64_t>(kMergeWarps));
  PRISM_REQUIRE(merge_blocks <= 0x7fffffff, "prism_tree_attention_digits: grid too large");
  for (int64_t r = 0; r < rounds; ++r) {
    sp.base = r * sp.slots;
    if (auto e = LaunchAttend<T, kH, Mode::kPartial>(stream, q, k_pool, v_pool, dm, tb, scale,
                                                      window, sp, out);
        e.failure()) {
      return e;
    }
    DigitMergeKernel<T, kH><<<static_cast<unsigned>(merge_blocks), kMergeWarps * kWarpSize, 0,
                              stream>>>(dm, tb, window, sp, r == 0, r + 1 == rounds, out);
    if (auto e = LaunchStatus("prism_tree_attention_digits"); e.failure()) return e;
  }
  return LaunchAttend<T, kH, Mode::kFallback>(stream, q, k_pool, v_pool, dm, tb, scale, window,
                                              sp, out);
}

template <typename T, int kH>
ffi::Error LaunchWrite(cudaStream_t stream, const T* k_new, const T* v_new, const T* q,
                       const Dims& dm, const int32_t* slot, int8_t* k_pool, int8_t* v_pool,
                       int8_t* q_packed) {
  const int64_t warps = dm.t * dm.k * 2 + (q_packed == nullptr ? 0 : dm.t * dm.n);
  if (warps == 0) return ffi::Error::Success();
  const int64_t blocks = std::min<int64_t>(CeilDiv(warps, kThreads / kWarpSize), 4096);
  DigitWriteKernel<T, kH><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      k_new, v_new, q, slot, dm, k_pool, v_pool, q_packed);
  return LaunchStatus("prism_tree_attention_digits");
}

// The split's workspace (tree_attention_digits_split.cuh): its record slots per round (0: no
// room for a round, so no split) and where its packed query rows start.
template <int kH>
Split SplitOf(const Dims& dm, float* ws, int64_t ws_floats) {
  const int64_t per_slot = dm.t * dm.n * Record<kH>();
  const int64_t q_floats = QueryFloats(dm.t * dm.n, kH);
  const int64_t slots = per_slot == 0 || ws_floats < q_floats
                            ? 0 : std::max<int64_t>((ws_floats - q_floats) / per_slot - 1, 0);
  int8_t* q_packed = reinterpret_cast<int8_t*>(ws + per_slot * (1 + slots));
  return Split{ws, slots, 0, 0, 1, slots > 0 ? q_packed : nullptr};
}

template <typename T, int kH>
ffi::Error LaunchBoth(cudaStream_t stream, const T* q, const T* k_new, const T* v_new,
                      const Dims& dm, const Tables& tb, float scale, int32_t window, T* out,
                      int8_t* k_pool, int8_t* v_pool, float* ws, int64_t ws_floats) {
  const std::string forced = ForcedDigitsKernel();
  Split sp = SplitOf<kH>(dm, ws, ws_floats);
  PRISM_REQUIRE(forced != "split" || sp.slots > 0,
                "prism_tree_attention_digits: PRISM_TREE_ATTENTION_DIGITS_KERNEL=split, but the "
                "workspace holds no round (call it through prism_jax.ops.tree_attention_digits)");
  const bool split = sp.slots > 0 && forced != "fused" &&
                     (dm.t <= kSplitMaxTokens || forced == "split");
  if (!split) sp.q_packed = nullptr;
  // First the writes (and the split's packed queries), then (same stream) the reads.
  if (auto e = LaunchWrite<T, kH>(stream, k_new, v_new, q, dm, tb.slot, k_pool, v_pool,
                                  sp.q_packed);
      e.failure()) {
    return e;
  }
  if (split) return LaunchSplit<T, kH>(stream, q, k_pool, v_pool, dm, tb, scale, window, sp, out);
  return LaunchAttend<T, kH, Mode::kFused>(stream, q, k_pool, v_pool, dm, tb, scale, window, sp,
                                           out);
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, const T* q, const T* k_new, const T* v_new,
                  const Dims& dm, const Tables& tb, float scale, int32_t window, T* out,
                  int8_t* k_pool, int8_t* v_pool, float* ws, int64_t ws_floats) {
  switch (dm.h) {
#define PRISM_DIGITS_CASE(H)                                                                   \
  case H:                                                                                      \
    return LaunchBoth<T, H>(stream, q, k_new, v_new, dm, tb, scale, window, out, k_pool, v_pool, \
                            ws, ws_floats);
    PRISM_DIGITS_CASE(32)
    PRISM_DIGITS_CASE(64)
    PRISM_DIGITS_CASE(128)
    PRISM_DIGITS_CASE(256)
#undef PRISM_DIGITS_CASE
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
                                   ffi::Result<ffi::AnyBuffer> v_out,
                                   ffi::Result<ffi::BufferR1<ffi::F32>> workspace, float scale,
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
  PRISM_RETURN_IF_ERROR(CopyUnlessAliasedAsync(stream, k_pages, k_out, op));
  PRISM_RETURN_IF_ERROR(CopyUnlessAliasedAsync(stream, v_pages, v_out, op));
  const Tables tb{slot.typed_data(), positions.typed_data(), chain_of.typed_data(),
                  segs.typed_data(), pages_flat.typed_data()};
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return Launch(stream, q.reinterpret_data<T>(), k_new.reinterpret_data<T>(),
                  v_new.reinterpret_data<T>(), dm, tb, scale, window, out->reinterpret_data<T>(),
                  k_out->reinterpret_data<int8_t>(), v_out->reinterpret_data<int8_t>(),
                  workspace->typed_data(), static_cast<int64_t>(workspace->element_count()));
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
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // split workspace
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("window"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
