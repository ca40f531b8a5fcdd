// prism_l2_prefetch on CUDA (the contract is l2_prefetch.h): one kernel whose blocks each ask
// the L2 for a slice of x (PrefetchL2: bulk prefetches of up to 64 KB) and exit. The fills go
// on after the kernel ends, while the next kernels run: the model issues it ahead of a phase
// that leaves DRAM idle (attention) for the weights read right after (the o projection).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/l2_prefetch.cuh"
#include "cc/ops/l2_prefetch.h"

namespace prism {
namespace {

constexpr int64_t kSliceBytes = 256 << 10;  // per block: four bulk prefetches

__global__ void L2PrefetchKernel(const char* __restrict__ x, int64_t bytes, int64_t slice,
                                 int32_t* __restrict__ token) {
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * slice;
  if (threadIdx.x == 0 && lo < bytes) PrefetchL2(x + lo, std::min(slice, bytes - lo));
  if (blockIdx.x == 0 && threadIdx.x == 0) *token = 0;
}

ffi::Error L2PrefetchCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer after,
                          ffi::Result<ffi::BufferR1<ffi::S32>> token, int64_t max_bytes) {
  (void)after;
  int64_t bytes = 0;
  if (auto e = L2PrefetchBytes(x, token->dimensions()[0], max_bytes, &bytes); e.failure()) {
    return e;
  }
  // Enough blocks that each asks for at most kSliceBytes, and at least one (it writes the token).
  const int64_t blocks = std::max<int64_t>(1, CeilDiv(bytes, kSliceBytes));
  PRISM_REQUIRE(blocks <= 0x7fffffff, "prism_l2_prefetch: x is too large for one grid");
  L2PrefetchKernel<<<static_cast<unsigned>(blocks), kWarpSize, 0, stream>>>(
      static_cast<const char*>(x.untyped_data()), bytes, kSliceBytes, token->typed_data());
  return LaunchStatus("prism_l2_prefetch");
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismL2PrefetchCuda, prism::L2PrefetchCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // x
                                  .Arg<ffi::AnyBuffer>()            // after (never read)
                                  .Ret<ffi::BufferR1<ffi::S32>>()  // token [1]
                                  .Attr<int64_t>("max_bytes"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
