// prism_glu_quant2 on CUDA; the specification is glu_quant2_cpu.cc (formulas: glu_quant.h).
//   gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8 [M, F], s2 f32 [M].
// One block per row, like glu_quant_cuda.cu. No F-sized scratch is passed in, so a is
// recomputed in each of three passes (same code, same inputs: same bits): pass 1 takes the
// row's amax, pass 2 writes q1 and takes the remainder's max, pass 3 writes q2. Both maxima
// are exact in any order, so the result depends only on the row, never on the block width.
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
struct Glu2Args {
  const T* __restrict__ gate_up;  // [M, 2F]: row r is gate, then up
  int8_t* __restrict__ q1;
  float* __restrict__ s1;
  int8_t* __restrict__ q2;
  float* __restrict__ s2;
  int64_t f;
  Activation act;
};

// The chunk's first-digit codes, and v overwritten by the remainders.
__device__ __forceinline__ void FirstDigit(float (&v)[kVec], float inv, float scale,
                                           int8_t (&codes)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    codes[i] = QuantCode(v[i], inv);
    v[i] = QuantRemainder(v[i], codes[i], scale);
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) Glu2RowsKernel(Glu2Args<T> a) {
  __shared__ float scratch1[kMaxThreads / kWarpSize], scratch2[kMaxThreads / kWarpSize];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  const T* gate = a.gate_up + static_cast<int64_t>(blockIdx.x) * 2 * a.f;
  const T* up = gate + a.f;
  const int64_t out = static_cast<int64_t>(blockIdx.x) * a.f;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec, end = a.f;
  float v[kVec];
  int8_t codes[kVec];
  const float amax = BlockMax(GatedAmax(gate, up, a.act, first, end, stride), scratch1);
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    GatedChunk(gate, up, a.act, i0, cnt, v);
    FirstDigit(v, inv, scale, codes);
    StoreCodes(a.q1 + out + i0, cnt, codes);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt) rmax = fmaxf(rmax, fabsf(v[i]));
    }
  }
  rmax = BlockMax(rmax, scratch2);
  const float rinv = QuantInverse(rmax);
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    GatedChunk(gate, up, a.act, i0, cnt, v);
    FirstDigit(v, inv, scale, codes);
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], rinv);
    StoreCodes(a.q2 + out + i0, cnt, codes);
  }
  if (threadIdx.x == 0) {
    a.s1[blockIdx.x] = scale;
    a.s2[blockIdx.x] = QuantScale(rmax);
  }
}

template <typename T>
ffi::Error Launch(cudaStream_t stream, const ffi::AnyBuffer& gate_up, int8_t* q1, float* s1,
                  int8_t* q2, float* s2, Activation act) {
  const int64_t m = gate_up.dimensions()[0], f = gate_up.dimensions()[1] / 2;
  if (m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(m <= 0x7fffffff, "prism_glu_quant2: too many rows for one grid");
  const Glu2Args<T> a{gate_up.reinterpret_data<T>(), q1, s1, q2, s2, f, act};
  Glu2RowsKernel<T><<<static_cast<unsigned>(m), RowBlockThreads(m, f), 0, stream>>>(a);
  return LaunchStatus("prism_glu_quant2");
}

ffi::Error GluQuant2Cuda(cudaStream_t stream, ffi::AnyBuffer gate_up,
                         ffi::Result<ffi::BufferR2<ffi::S8>> q1,
                         ffi::Result<ffi::BufferR1<ffi::F32>> s1,
                         ffi::Result<ffi::BufferR2<ffi::S8>> q2,
                         ffi::Result<ffi::BufferR1<ffi::F32>> s2, int32_t activation) {
  if (ffi::Error e = CheckGluArgs("prism_glu_quant2", gate_up, activation); e.failure()) {
    return e;
  }
  const auto act = static_cast<Activation>(activation);
  if (gate_up.element_type() == ffi::DataType::F32) {
    return Launch<float>(stream, gate_up, q1->typed_data(), s1->typed_data(), q2->typed_data(),
                         s2->typed_data(), act);
  }
  return Launch<uint16_t>(stream, gate_up, q1->typed_data(), s1->typed_data(), q2->typed_data(),
                          s2->typed_data(), act);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2Cuda, prism::GluQuant2Cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()            // gate_up [M, 2F] f32|bf16
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q1 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s1 [M]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q2 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s2 [M]
                                  .Attr<int32_t>("activation"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
