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

__global__ void L2PrefetchKernel(const char* __restrict__ x, int64_t bytes, int64_t slice) {
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * slice;
  if (threadIdx.x == 0 && lo < bytes) PrefetchL2(x + lo, std::min(slice, bytes - lo));
}

ffi::Error L2PrefetchCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer after,
                          ffi::Result<ffi::AnyBuffer> out, int64_t max_bytes) {
  int64_t bytes = 0;
  if (auto e = L2PrefetchBytes(x, after, *out, max_bytes, &bytes); e.failure()) return e;
  if (auto e = CopyUnlessAliasedAsync(stream, after, out, "prism_l2_prefetch"); e.failure()) {
    return e;
  }
  if (bytes == 0) return ffi::Error::Success();
  const int64_t blocks = CeilDiv(bytes, kSliceBytes);  // each asks for at most kSliceBytes
  PRISM_REQUIRE(blocks <= 0x7fffffff, "prism_l2_prefetch: x is too large for one grid");
  L2PrefetchKernel<<<static_cast<unsigned>(blocks), kWarpSize, 0, stream>>>(
      static_cast<const char*>(x.untyped_data()), bytes, kSliceBytes);
  return LaunchStatus("prism_l2_prefetch");
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismL2PrefetchCuda, prism::L2PrefetchCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // after
                                  .Ret<ffi::AnyBuffer>()  // after, unchanged (aliased)
                                  .Attr<int64_t>("max_bytes"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
