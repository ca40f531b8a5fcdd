// What the two readout ops' CUDA kernels share (candidate_head_cuda.cu, vocab_logsumexp_cuda.cu):
// the CPU's max and one thread per row for the sequential merges. Their handlers' checks are
// candidate_head.h, shared with the CPU.
#pragma once

#include <cuda_runtime.h>

#include "cc/cuda_common.cuh"

namespace prism {
namespace head {

constexpr int kRowThreads = 128;  // one thread per row for the sequential merges

// The CPU's std::max(mx, l): a NaN l leaves mx unchanged.
__device__ __forceinline__ float MaxLikeStd(float mx, float l) { return mx < l ? l : mx; }

}  // namespace head
}  // namespace prism
