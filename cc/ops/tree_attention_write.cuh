// Writing a step's k/v into the KV pools on CUDA, shared by the tree attention handlers: one
// kernel on the handler's stream before the attention kernel, so every write lands before any
// read.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/ops/tree_attention.h"

namespace prism {
// Internal linkage: each handler's translation unit keeps its own copy of the kernels.
namespace {

constexpr int kWriteThreads = 256;
constexpr int64_t kMaxWriteBlocks = 4096;

// Token t's k/v rows (row elements each) to pool row slot[t], one block per token at a time.
// kVec16: rows are whole 16-byte words at 16-byte aligned addresses, copied as such (a step's
// 27B rows are 8 KB each: per-element copies with a 64-bit division each ran at ~0.8 TB/s).
// The block reads slot[t] once, so the skip of an out-of-pool slot is uniform.
template <typename KV, bool kVec16>
__global__ void __launch_bounds__(kWriteThreads)
    WriteKernel(const KV* __restrict__ k_new, const KV* __restrict__ v_new,
                const int32_t* __restrict__ slot, int64_t t_count, int64_t row, int64_t rows,
                KV* __restrict__ k_pool, KV* __restrict__ v_pool) {
  for (int64_t t = blockIdx.x; t < t_count; t += gridDim.x) {
    const int64_t sl = slot[t];
    if (sl < 0 || sl >= rows) continue;  // uniform per block
    if constexpr (kVec16) {
      const int64_t words = row * static_cast<int64_t>(sizeof(KV)) / 16;
      const uint4* ks = reinterpret_cast<const uint4*>(k_new + t * row);
      const uint4* vs = reinterpret_cast<const uint4*>(v_new + t * row);
      uint4* kd = reinterpret_cast<uint4*>(k_pool + sl * row);
      uint4* vd = reinterpret_cast<uint4*>(v_pool + sl * row);
      for (int64_t i = threadIdx.x; i < words; i += blockDim.x) {
        const uint4 kw = ks[i], vw = vs[i];
        kd[i] = kw;
        vd[i] = vw;
      }
    } else {
      for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
        k_pool[sl * row + i] = k_new[t * row + i];
        v_pool[sl * row + i] = v_new[t * row + i];
      }
    }
  }
}

// Launches WriteKernel for the step's T rows (nothing when T * K * H is 0).
template <typename KV>
ffi::Error LaunchKvWrite(cudaStream_t stream, const KV* k_new, const KV* v_new, const Dims& dm,
                         const int32_t* slot, KV* k_pool, KV* v_pool, const char* op) {
  const int64_t row = dm.k * dm.h;
  if (dm.t * row == 0) return ffi::Error::Success();
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(dm.t, kMaxWriteBlocks));
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec16 = row * static_cast<int64_t>(sizeof(KV)) % 16 == 0 && aligned(k_new) &&
                     aligned(v_new) && aligned(k_pool) && aligned(v_pool);
  auto* write = vec16 ? WriteKernel<KV, true> : WriteKernel<KV, false>;
  write<<<blocks, kWriteThreads, 0, stream>>>(k_new, v_new, slot, dm.t, row, dm.p * dm.l, k_pool,
                                             v_pool);
  return LaunchStatus(op);
}

}  // namespace
}  // namespace prism
