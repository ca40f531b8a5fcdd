// The TMA pipeline's building blocks, for the TMA-fed GEMM kernel (int8_gemm_tma.cu): shared
// addresses, mbarriers, a ring position, 2-D tensor-map loads, and on the host the tensor-map
// encoding of a row-major int8 matrix and the ring's stage count. sm_90a; included only by .cu
// files.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace prism {

constexpr int kTmaBoxK = 128;  // K bytes a box row: one 128-byte swizzle row

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Position in the ring of stages: stage s, and the parity of the round (stages are reused every
// `stages` chunks), advanced chunk by chunk (no division by the run-time stage count).
struct RingPos {
  int stages, s = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ explicit RingPos(int n) : stages(n) {}
  __device__ __forceinline__ void Next() {
    if (++s == stages) s = 0, phase ^= 1u;
  }
};

__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SmemAddr(bar)), "r"(count));
}

__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SmemAddr(bar)) : "memory");
}

// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT;\n\t}" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
}

// Fetches a tensor map (a __grid_constant__ kernel parameter) into the TMA unit's cache ahead
// of its first load.
__device__ __forceinline__ void TmaPrefetchMap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// A [rows x 128-byte] box at (k0, row0) of the tensor map into dst, completing on bar.
__device__ __forceinline__ void TmaLoad(void* dst, const CUtensorMap* map, int k0, int row0,
                                        uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(SmemAddr(bar))
      : "memory");
}

// cuTensorMapEncodeTiled from the driver, found through the runtime (no libcuda link).
inline PFN_cuTensorMapEncodeTiled_v12000 Encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                           cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p)
               : nullptr;
  }();
  return fn;
}

// The map of a row-major int8 [rows, k] matrix in boxes of [box_rows x 128 bytes].
inline bool EncodeRows(CUtensorMap* map, const int8_t* p, int64_t rows, int64_t k, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = Encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k)};  // bytes between rows
  const cuuint32_t box[2] = {kTmaBoxK, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t step[2] = {1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t*>(p), dims, strides,
                box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Host side. Stages a block of C for a grid of `blocks`: as many as let every block be resident at once
// where registers and threads allow (a weight stream gains nothing from a second wave, whose
// tail leaves SMs idle: session 22's gate_up at M = 16 took 59.7 µs resident in one wave against
// 64.4 in 1.3 waves of ~96 KB blocks), at most max_stages, at least C::kMinStages (the sums
// reuse them). forced > 0: that many, within the same bounds. C: a kernel configuration with
// kThreads, kStageBytes, kMinStages and SmemBytes(stages).
template <class C, typename Kernel>
int PickStages(Kernel* kernel, int64_t blocks, int forced, int max_stages) {
  int device = 0, sms = 0, smem_sm = 0, smem_block = 0, reserved = 0, fit = 0;
  const bool known =
      cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) ==
          cudaSuccess &&
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, C::kThreads, 0) == cudaSuccess;
  if (!known || sms <= 0 || fit <= 0) return C::kMinStages;
  int stages = forced;
  if (stages <= 0) {
    // Blocks an SM must hold for one wave, capped by what its registers and threads allow.
    const int64_t per_sm = std::min<int64_t>((blocks + sms - 1) / sms, fit);
    const int64_t budget = std::min<int64_t>(smem_sm / per_sm - reserved - 256, smem_block);
    const int64_t per_stage = C::kStageBytes + 2 * static_cast<int64_t>(sizeof(uint64_t));
    stages = static_cast<int>(std::clamp<int64_t>((budget - 1024) / per_stage, 1, max_stages));
  }
  while (stages > C::kMinStages && C::SmemBytes(stages) > static_cast<size_t>(smem_block)) {
    --stages;
  }
  return std::max(stages, C::kMinStages);
}

}  // namespace prism
