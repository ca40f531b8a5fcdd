// Launching a kernel whose blocks form clusters along x (thread-block clusters, sm_90), as the
// small-M GEMM kernels that split K across a cluster do (int8_gemm_decode.cu, int8_gemm_tma.cu).
// Included only by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace prism {

// Launches kernel<<<blocks, threads, smem_bytes, stream>>>(args...) with clusters of
// cluster_x consecutive blocks (1: no cluster attribute). blocks must be a multiple of
// cluster_x. Returns the launch's status (cudaErrorInvalidValue for a grid past 2^31 - 1 blocks).
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchClusters(void (*kernel)(KernelArgs...), int64_t blocks, int threads,
                           size_t smem_bytes, int cluster_x, cudaStream_t stream, Args... args) {
  if (blocks > 0x7fffffff || blocks % cluster_x != 0) return cudaErrorInvalidValue;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(cluster_x);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = cluster_x > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

}  // namespace prism
