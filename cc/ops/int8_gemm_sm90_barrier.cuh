// Stream-K barrier flags zeroed by a kernel of ours instead of CUTLASS's cudaMemsetAsync: the
// default since session 29; PRISM_INT8_GEMM_BARRIER=memset gives CUTLASS's own path back.
//
// CUTLASS's stream-K scheduler needs its barrier flags zero when the GEMM starts, and
// GemmUniversalAdapter::initialize clears them with cudaMemsetAsync on every call. In the 27B
// steps' traces that memset, and the gaps on either side of it, took ~6 µs per stream-K call
// (results/e2e_h200_session25/, a one-question step's down GEMMs). That is about what
// stream-K saves there. A memset node may cost more in a CUDA graph than a small kernel node
// does, so this path clears the same bytes with a kernel, then launches the GEMM from the same
// Params as initialize() would build. It is used only when its layout of the workspace adds up
// to CUTLASS's own workspace size; otherwise the call falls back to initialize().
// Measured on the H200 (results/e2e_h200_session29/): the one-digit 27B steps' traced idle
// time between kernels fell 0.23-0.93 ms a step, and the full GPU test set passed with it.
//
// The workspace, as the cooperative kernel's initialize_workspace lays it out: the epilogue's
// (0 bytes for this project's epilogue), then, 16-byte aligned, the scheduler's reduction
// partials followed by its barrier flags (PersistentTileSchedulerSm90StreamKParams).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/gemm_coord.h"

namespace prism {
namespace sm90 {

// Whether this path runs: unless PRISM_INT8_GEMM_BARRIER=memset asks for CUTLASS's. Read at
// every call, as the other PRISM_INT8_GEMM_* overrides are, so that tests can switch it within
// one process.
inline bool BarrierZeroedByKernel() {
  const char* v = std::getenv("PRISM_INT8_GEMM_BARRIER");
  return v == nullptr || std::strcmp(v, "memset") != 0;
}

namespace {  // every sm90 translation unit gets its own kernel (no duplicate host stubs)

// bytes of zeros from p; p 16-byte aligned (CUTLASS's MinWorkspaceAlignment).
__global__ void ZeroBytesKernel(uint8_t* p, size_t bytes) {
  const size_t words = bytes / 16;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < words; i += stride) reinterpret_cast<uint4*>(p)[i] = uint4{0, 0, 0, 0};
  for (size_t i = words * 16 + first; i < bytes; i += stride) p[i] = 0;
}

}  // namespace

// The barrier flags' byte range [*offset, *offset + *bytes) in the workspace of `args`, from the
// scheduler's own size function with the arguments the kernel passes it. False when that layout
// does not add up to Kernel::get_workspace_size(args) (then the caller keeps CUTLASS's path).
template <class Kernel>
bool BarrierRegion(const typename Kernel::Arguments& args, size_t* offset, size_t* bytes) {
  using Scheduler = typename Kernel::TileScheduler;
  using Epilogue = typename Kernel::CollectiveEpilogue;
  using Tile = typename Kernel::TileShape;
  using Cluster = typename Kernel::ClusterShape;
  const auto problem = cute::append<4>(args.problem_shape, 1);
  const dim3 blocks = Scheduler::get_tiled_cta_shape_mnl(problem, Tile{}, Cluster{});
  const uint32_t k_tiles = static_cast<uint32_t>(
      cute::size(cute::ceil_div(cute::shape<2>(problem), cute::shape<2>(Tile{}))));
  const cutlass::gemm::GemmCoord tile(cute::size<0>(Tile{}), cute::size<1>(Tile{}),
                                      cute::size<2>(Tile{}));
  const cutlass::gemm::GemmCoord cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}),
                                         cute::size<2>(Cluster{}));
  constexpr uint32_t kSubtiles = Epilogue::get_store_pipe_increment(Tile{});
  size_t barrier = 0, reduction = 0;
  const auto& s = args.scheduler;
  Scheduler::Params::get_workspace_component_sizes(
      blocks, k_tiles, tile, cluster, barrier, reduction, args.hw_info, s.splits,
      s.max_swizzle_size, s.raster_order, s.decomposition_mode, s.reduction_mode,
      Kernel::NumMmaWarpGroups, cutlass::sizeof_bits<typename Scheduler::BarrierType>::value,
      cutlass::sizeof_bits<typename Kernel::ElementAccumulator>::value, kSubtiles);
  // Each part starts 16-byte aligned (MinWorkspaceAlignment), as the kernel lays them out.
  auto align = [](size_t v) { return (v + 15) / 16 * 16; };
  const size_t scheduler = align(Epilogue::get_workspace_size(args.problem_shape, args.epilogue));
  if (align(scheduler + reduction + barrier) != Kernel::get_workspace_size(args)) return false;
  *offset = scheduler + reduction;
  *bytes = barrier;
  return true;
}

// The GEMM of `args` with its barrier flags cleared by ZeroBytesKernel: initialize()'s Params
// and shared-memory attribute, without its memset.
template <class Kernel, class Adapter>
cudaError_t RunWithZeroedBarriers(const typename Kernel::Arguments& args, void* workspace,
                                  size_t offset, size_t bytes, cudaStream_t stream) {
  static const cudaError_t smem = [] {
    constexpr int kSmem = Kernel::SharedStorageSize;
    if (kSmem < (48 << 10)) return cudaSuccess;
    return cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  }();
  if (smem != cudaSuccess) return smem;
  if (bytes > 0) {
    constexpr int kThreads = 256;
    const size_t words = (bytes + 15) / 16;
    const unsigned blocks = static_cast<unsigned>((words + kThreads - 1) / kThreads);
    ZeroBytesKernel<<<blocks < 64u ? blocks : 64u, kThreads, 0, stream>>>(
        static_cast<uint8_t*>(workspace) + offset, bytes);
  }
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  if (Adapter::run(params, stream) != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? cudaErrorLaunchFailure : e;
  }
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace prism
