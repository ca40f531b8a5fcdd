// prism_glu_quant on CUDA; the specification is glu_quant_cpu.cc. Shapes: M rows, F ffw dim.
//   gate_up [M, 2F] f32|bf16 -> a_q s8 [M, F], s_a f32 [M]; attr activation (numerics.h).
// a = Activate(gate) * up, then per-row symmetric INT8 quantisation. One block per row (width:
// RowBlockThreads): pass 1 takes the row's amax
// (exact in any order), pass 2 recomputes a (mostly from L2) and writes the codes, since no
// F-sized scratch is passed in. expf/tanhf are CUDA's, so a (and rarely a code) may differ
// from the CPU by an ulp-level amount; the result still depends only on the row.
#include <cuda_runtime.h>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/glu_quant.h"
#include "cc/ops/glu_rows.cuh"

namespace prism {
namespace {

constexpr int kMaxThreads = 1024;

template <typename T>
struct GluArgs {
  const T* __restrict__ gate_up;  // [M, 2F]: row r is gate, then up
  int8_t* __restrict__ q;
  float* __restrict__ s;
  int64_t f;
  Activation act;
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) GluRowsKernel(GluArgs<T> a) {
  __shared__ float scratch[kMaxThreads / kWarpSize];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  const T* gate = a.gate_up + static_cast<int64_t>(blockIdx.x) * 2 * a.f;
  const T* up = gate + a.f;
  int8_t* q = a.q + static_cast<int64_t>(blockIdx.x) * a.f;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec, end = a.f;
  const float amax = BlockMax(GatedAmax(gate, up, a.act, first, end, stride), scratch);
  const float inv = QuantInverse(amax);
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    float v[kVec];
    GatedChunk(gate, up, a.act, i0, cnt, v);
    int8_t codes[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], inv);
    StoreCodes(q + i0, cnt, codes);
  }
  if (threadIdx.x == 0) a.s[blockIdx.x] = QuantScale(amax);
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, const ffi::AnyBuffer& gate_up, int8_t* q, float* s,
                  Activation act) {
  const int64_t m = gate_up.dimensions()[0], f = gate_up.dimensions()[1] / 2;
  if (m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(m <= 0x7fffffff, "prism_glu_quant: too many rows for one grid");
  const GluArgs<T> a{gate_up.reinterpret_data<T>(), q, s, f, act};
  GluRowsKernel<T><<<static_cast<unsigned>(m), RowBlockThreads(m, f), 0, stream>>>(a);
  return LaunchStatus("prism_glu_quant");
}

ffi::Error GluQuantCuda(cudaStream_t stream, ffi::AnyBuffer gate_up,
                        ffi::Result<ffi::BufferR2<ffi::S8>> a_q,
                        ffi::Result<ffi::BufferR1<ffi::F32>> s_a, int32_t activation) {
  if (ffi::Error e = CheckGluArgs("prism_glu_quant", gate_up, activation); e.failure()) {
    return e;
  }
  const auto act = static_cast<Activation>(activation);
  if (gate_up.element_type() == ffi::DataType::F32) {
    return Launch<float>(stream, gate_up, a_q->typed_data(), s_a->typed_data(), act);
  }
  return Launch<uint16_t>(stream, gate_up, a_q->typed_data(), s_a->typed_data(), act);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuantCuda, prism::GluQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // gate_up [M, 2F] f32|bf16
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // a_q [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s_a [M]
                                  .Attr<int32_t>("activation"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
