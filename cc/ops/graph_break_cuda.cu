// prism_graph_break on CUDA (graph_break.h). Bound WITHOUT xla::ffi::Traits::kCmdBufferCompatible:
// that omission is the op's purpose, it ends XLA's current command buffer.
#include <cuda_runtime.h>

#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/ops/graph_break.h"

namespace prism {
namespace {

ffi::Error GraphBreakCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  if (auto e = CheckGraphBreak(x, *y); e.failure()) return e;
  if (y->untyped_data() == x.untyped_data()) return ffi::Error::Success();
  const cudaError_t e = cudaMemcpyAsync(y->untyped_data(), x.untyped_data(), x.size_bytes(),
                                        cudaMemcpyDeviceToDevice, stream);
  if (e == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("prism_graph_break: copy failed: ") +
                              cudaGetErrorString(e));
}

}  // namespace
}  // namespace prism

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGraphBreakCuda, prism::GraphBreakCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()    // x
                                  .Ret<xla::ffi::AnyBuffer>());  // y, aliased to x
