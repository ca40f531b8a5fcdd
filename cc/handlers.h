// Every FFI handler symbol of the extension, with its target name. One X-macro table so the
// module, the CPU and the CUDA builds cannot disagree on names.
#pragma once

#include "xla/ffi/api/ffi.h"

// X(target_name, cpu_symbol, cuda_symbol)
#define PRISM_FOR_EACH_HANDLER(X)                                              \
  X("prism_int8_gemm", PrismInt8GemmCpu, PrismInt8GemmCuda)                    \
  X("prism_rmsnorm", PrismRmsNormCpu, PrismRmsNormCuda)                        \
  X("prism_rmsnorm_quant", PrismRmsNormQuantCpu, PrismRmsNormQuantCuda)        \
  X("prism_add_rmsnorm_quant", PrismAddRmsNormQuantCpu, PrismAddRmsNormQuantCuda) \
  X("prism_add_rmsnorm", PrismAddRmsNormCpu, PrismAddRmsNormCuda)              \
  X("prism_norm_add_rmsnorm_quant", PrismNormAddRmsNormQuantCpu,               \
    PrismNormAddRmsNormQuantCuda)                                              \
  X("prism_norm_add_rmsnorm", PrismNormAddRmsNormCpu, PrismNormAddRmsNormCuda) \
  X("prism_add_rmsnorm_quant_sum", PrismAddRmsNormQuantSumCpu,                 \
    PrismAddRmsNormQuantSumCuda)                                               \
  X("prism_norm_add_rmsnorm_quant_sum", PrismNormAddRmsNormQuantSumCpu,        \
    PrismNormAddRmsNormQuantSumCuda)                                           \
  X("prism_glu_quant", PrismGluQuantCpu, PrismGluQuantCuda)                    \
  X("prism_glu_quant2", PrismGluQuant2Cpu, PrismGluQuant2Cuda)                 \
  X("prism_glu_quant2_sum", PrismGluQuant2SumCpu, PrismGluQuant2SumCuda)       \
  X("prism_quantize_rows", PrismQuantizeRowsCpu, PrismQuantizeRowsCuda)        \
  X("prism_qkv_rope", PrismQkvRopeCpu, PrismQkvRopeCuda)                      \
  X("prism_qkv_rope_sum", PrismQkvRopeSumCpu, PrismQkvRopeSumCuda)             \
  X("prism_qkv_rope_kv", PrismQkvRopeKvCpu, PrismQkvRopeKvCuda)                \
  X("prism_qkv_rope_sum_kv", PrismQkvRopeSumKvCpu, PrismQkvRopeSumKvCuda)      \
  X("prism_candidate_head", PrismCandidateHeadCpu, PrismCandidateHeadCuda)     \
  X("prism_vocab_logsumexp", PrismVocabLogSumExpCpu, PrismVocabLogSumExpCuda) \
  X("prism_tree_attention", PrismTreeAttentionCpu, PrismTreeAttentionCuda)      \
  X("prism_tree_attention_digits", PrismTreeAttentionDigitsCpu,                \
    PrismTreeAttentionDigitsCuda)

#define PRISM_DECLARE_CPU(name, cpu, cuda) XLA_FFI_DECLARE_HANDLER_SYMBOL(cpu);
#define PRISM_DECLARE_CUDA(name, cpu, cuda) XLA_FFI_DECLARE_HANDLER_SYMBOL(cuda);

#ifdef PRISM_WITH_CUDA
#include <cstddef>
#include <cstdint>
// Workspace bytes prism_int8_gemm's CUDA handler wants for [M, K] x [N, K] (int8_gemm_cuda.cu).
size_t PrismInt8GemmWorkspaceBytes(int64_t m, int64_t k, int64_t n, bool f32);
#endif
