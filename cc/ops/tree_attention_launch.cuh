// Tree attention's kernel launchers for the lanes, block and split kernels, and the names that
// force a kernel (PRISM_TREE_ATTENTION_KERNEL). Included by tree_attention_cuda.cu only, whose
// handler picks a kernel (ChooseKernel) and calls these.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_block.cuh"
#include "cc/ops/tree_attention_lanes.cuh"
#include "cc/ops/tree_attention_split.cuh"

namespace prism {
namespace launch {
enum class Kernel { kAuto, kWarp, kLanes, kBlock, kSplit };

// PRISM_TREE_ATTENTION_KERNEL=warp|lanes|block|split (tests and benchmarks) forces a kernel;
// lanes, block and split need H in {64, 128, 256} (block and split also G dividing the block's
// pairs) and fall back to lanes, then warp.
inline Kernel ForcedKernel() {
  const char* name = std::getenv("PRISM_TREE_ATTENTION_KERNEL");
  const std::string s = name == nullptr ? "" : name;
  return s == "warp" ? Kernel::kWarp : s == "lanes" ? Kernel::kLanes
       : s == "block" ? Kernel::kBlock : s == "split" ? Kernel::kSplit : Kernel::kAuto;
}

// Records a merge warp keeps in flight (split::kMergeBatch*): steps of more than
// kBlockMinTokens tokens (a prompt, a forest: many pairs, short spans) take the short batch,
// smaller steps (a follow-up question, decode: few pairs, long spans) the long one.
// PRISM_TREE_ATTENTION_MERGE_BATCH=4|8 forces one (tests and benchmarks); same bits.
inline ffi::Error MergeBatch(bool big, int* batch) {
  const char* name = std::getenv("PRISM_TREE_ATTENTION_MERGE_BATCH");
  const std::string s = name == nullptr ? "" : name;
  PRISM_REQUIRE(s.empty() || s == "4" || s == "8",
                "prism_tree_attention: PRISM_TREE_ATTENTION_MERGE_BATCH must be 4 or 8 (or "
                "unset), not '" + s + "'");
  *batch = s.empty() ? (big ? split::kMergeBatchShort : split::kMergeBatchLong) : std::stoi(s);
  return ffi::Error::Success();
}

// The split kernel's f32 workspace, a result of the call (tree_attention_split.cuh).
struct Workspace {
  float* data;
  int64_t floats;
};

constexpr int kBlockPW = block::kPairsPerWarp;  // pairs per warp of the block kernel
// Step sizes of the kernel choice (ChooseKernel, below, says why).
constexpr int64_t kBlockMinTokens = 64;   // up to this: the lanes warp is the split's fallback
constexpr int64_t kSplitMaxTokens = 512;  // prism_jax/ops/tree_attention.py SPLIT_MAX_TOKENS

template <int kH, typename Q, typename KV>
ffi::Error LaunchLanes(unsigned grid, cudaStream_t stream, const Q* q, const KV* k_pool,
                       const KV* v_pool, const Dims& dm, const Tables& tb, float scale,
                       int32_t window, Q* out) {
  lanes::LaneAttendKernel<Q, KV, kH><<<grid, lanes::kWarps * kWarpSize, 0, stream>>>(
      q, k_pool, v_pool, dm, tb, scale, window, out);
  return LaunchStatus("prism_tree_attention");
}

template <int kH, typename Q, typename KV>
ffi::Error LaunchBlock(cudaStream_t stream, const Q* q, const KV* k_pool, const KV* v_pool,
                       const Dims& dm, const Tables& tb, float scale, int32_t window, Q* out) {
  constexpr size_t kSmem = block::SmemBytes<kH, kBlockPW>();
  auto* kernel = block::BlockAttendKernel<Q, KV, kH, kBlockPW>;
  static const cudaError_t attr = cudaFuncSetAttribute(  // once per instantiation
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  PRISM_REQUIRE(attr == cudaSuccess, "prism_tree_attention: block kernel shared memory refused");
  const int64_t qt = block::Shape<kH, kBlockPW>::kPairs / dm.g();
  const dim3 grid(static_cast<unsigned>(CeilDiv(dm.t, qt)), static_cast<unsigned>(dm.k));
  kernel<<<grid, block::kThreads, kSmem, stream>>>(q, k_pool, v_pool, dm, tb, scale, window, out);
  return LaunchStatus("prism_tree_attention");
}

// The split kernel's rounds (tree_attention_split.cuh): pass 1 then pass 2 per round, then the
// fallback for blocks beyond the rounds' coverage. A workspace too small for one round: lanes
// (an error when PRISM_TREE_ATTENTION_KERNEL=split asked for the split kernel).
template <int kH, typename Q, typename KV>
ffi::Error LaunchSplit(cudaStream_t stream, const Workspace& ws, const Q* q, const KV* k_pool,
                       const KV* v_pool, const Dims& dm, const Tables& tb, float scale,
                       int32_t window, Q* out) {
  constexpr size_t kSmem = block::SmemBytes<kH, kBlockPW>();
  auto* kernel = split::PartialKernel<Q, KV, kH, kBlockPW>;
  static const cudaError_t attr = cudaFuncSetAttribute(  // once per instantiation
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  PRISM_REQUIRE(attr == cudaSuccess, "prism_tree_attention: split kernel shared memory refused");
  const int qt = static_cast<int>(block::Shape<kH, kBlockPW>::kPairs / dm.g());
  const split::Plan plan = split::SplitPlan(dm, window, qt, ws.data, ws.floats);
  const unsigned warps = static_cast<unsigned>(CeilDiv(dm.t * dm.n, split::kMergeWarps));
  const bool big = dm.t > kBlockMinTokens;  // the fallback: block kernel, else the lanes warp
  if (plan.slots == 0) {
    PRISM_REQUIRE(ForcedKernel() != Kernel::kSplit,
                  "prism_tree_attention: PRISM_TREE_ATTENTION_KERNEL=split, but the workspace "
                  "holds no round (call it through prism_jax.ops.tree_attention)");
    if (big) return LaunchBlock<kH>(stream, q, k_pool, v_pool, dm, tb, scale, window, out);
    return LaunchLanes<kH>(warps, stream, q, k_pool, v_pool, dm, tb, scale, window, out);
  }
  // Persistent pass 1: as many blocks as fit on the GPU at once, never more than work items.
  static const int64_t resident = [&] {  // once per instantiation (one device kind)
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block::kThreads, kSmem);
    return DeviceSmCount() * std::max(per_sm, 1);
  }();
  const int64_t nb = CeilDiv(dm.t, qt);
  const unsigned grid = static_cast<unsigned>(std::min(resident, nb * dm.k * plan.slots));
  const int64_t covered = plan.rounds * plan.slots;
  int batch = 0;
  if (auto e = MergeBatch(big, &batch); e.failure()) return e;
  auto* merge = batch == split::kMergeBatchShort
                    ? split::MergeKernel<Q, kH, split::kMergeBatchShort>
                    : split::MergeKernel<Q, kH, split::kMergeBatchLong>;
  for (int64_t r = 0; r < plan.rounds; ++r) {
    const split::Round rd{r * plan.slots, plan.slots, covered};
    kernel<<<grid, block::kThreads, kSmem, stream>>>(q, k_pool, v_pool, dm, tb, scale, window,
                                                     rd, plan.part, plan.table);
    merge<<<warps, split::kMergeWarps * kWarpSize, 0, stream>>>(
        dm, qt, rd, r == 0, r + 1 == plan.rounds, plan.part, plan.table, plan.state, out);
  }
  if (big) {
    auto* fallback = split::BlockFallbackKernel<Q, KV, kH, kBlockPW>;
    static const cudaError_t fattr = cudaFuncSetAttribute(  // once per instantiation
        fallback, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
    PRISM_REQUIRE(fattr == cudaSuccess, "prism_tree_attention: fallback shared memory refused");
    const dim3 bgrid(static_cast<unsigned>(nb), static_cast<unsigned>(dm.k));
    fallback<<<bgrid, block::kThreads, kSmem, stream>>>(q, k_pool, v_pool, dm, tb, scale, window,
                                                        plan.table, out);
  } else {
    static_assert(lanes::kWarps == split::kMergeWarps, "fallback and merge use the same grid");
    split::FallbackKernel<Q, KV, kH><<<warps, lanes::kWarps * kWarpSize, 0, stream>>>(
        q, k_pool, v_pool, dm, tb, scale, window, qt, plan.table, out);
  }
  return LaunchStatus("prism_tree_attention");
}

}  // namespace launch
}  // namespace prism
