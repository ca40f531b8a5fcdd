// The RMSNorm launcher of norm_quant_cuda.cu (every kernel, chosen by shape or forced), shared
// with norm_add_norm_cuda.cu (the fused post-norm's handlers, whose unfused fallback it is).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "cc/common.h"
#include "cc/ops/norm_args.cuh"

namespace prism {

// PRISM_RMSNORM_KERNEL (tests and benchmarks compare the kernels bitwise): unset or empty
// chooses by shape; "block" forces the one-block-per-row kernel for D > kStride (shorter rows
// always take a register kernel); "reg1", "reg2", "reg4", "reg8" force the register kernels
// with that many warps per row for D <= kMaxRegChunks * kStride, "lean2", "lean4", "lean8"
// the split kernels' lean form (norm_split_rows.cuh). Returns 0 for "by shape", -1 for
// "block", the warps otherwise (plus kForceLean for the lean form); an unknown value is an
// error, so a typo cannot silently test the default kernel.
constexpr int kForceLean = 100;
inline ffi::Error ForcedNormKernel(int* forced) {
  const char* env = std::getenv("PRISM_RMSNORM_KERNEL");
  const std::string name = env != nullptr ? env : "";
  static constexpr struct {
    const char* name;
    int forced;
  } kChoices[] = {{"", 0}, {"block", -1}, {"reg1", 1}, {"reg2", 2}, {"reg4", 4}, {"reg8", 8},
                      {"lean2", kForceLean + 2}, {"lean4", kForceLean + 4},
                      {"lean8", kForceLean + 8}};
  for (const auto& choice : kChoices) {
    if (name == choice.name) {
      *forced = choice.forced;
      return ffi::Error::Success();
    }
  }
  return ffi::Error::InvalidArgument(
      "PRISM_RMSNORM_KERNEL must be unset, block, reg1, reg2, reg4, reg8, lean2, lean4 or lean8; "
      "got " + name);
}

// Launches the RMSNorm family's kernel for a's parts (null pointers switch parts off) over m
// rows: a register kernel for D <= kMaxRegChunks * kStride, else one block per row. a.x_gamma
// must be null (norm_add_norm_cuda.cu handles it). Defined in norm_quant_cuda.cu for T = float
// and uint16_t (bf16).
template <typename T>
ffi::Error LaunchNorm(cudaStream_t stream, int64_t m, const NormArgs<T>& a, const char* op);

}  // namespace prism
