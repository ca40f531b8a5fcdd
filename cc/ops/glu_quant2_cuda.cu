// prism_glu_quant2 on CUDA; the specification is glu_quant2_cpu.cc (formulas: glu_quant.h).
//   gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8 [M, F], s2 f32 [M]; or gate_up
//   given as f32 partial sums (GluParts: the projection's two-digit partial products).
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

struct Glu2Out {
  int8_t* __restrict__ q1;
  float* __restrict__ s1;
  int8_t* __restrict__ q2;
  float* __restrict__ s2;
};

// Plain rows: gate_up [M, 2F], row r is gate, then up.
template <typename T>
struct PairRows {
  const T* __restrict__ gate_up;
  int64_t f;
  __device__ __forceinline__ void Chunk(int64_t row, Activation act, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    const T* gate = gate_up + row * 2 * f;
    GatedChunk(gate, gate + f, act, i0, cnt, v);
  }
};

// f32 rows given as partial sums (GluParts in glu_quant.h): row r of main, plus row r + m of
// main when stacked, plus row r of extra when there is one.
struct PartsRows {
  const float* __restrict__ main;
  const float* __restrict__ extra;  // nullptr: no extra partial
  int64_t f, m;
  bool stacked;
  __device__ __forceinline__ void Chunk(int64_t row, Activation act, int64_t i0, int cnt,
                                        float (&v)[kVec]) const {
    const float* g0 = main + row * 2 * f;
    const float* g1 = stacked ? main + (row + m) * 2 * f : nullptr;
    const float* g2 = extra != nullptr ? extra + row * 2 * f : nullptr;
    const PartRow gate{g0, g1, g2};
    const PartRow up{g0 + f, g1 != nullptr ? g1 + f : nullptr, g2 != nullptr ? g2 + f : nullptr};
    GatedPartsChunk(gate, up, act, i0, cnt, v);
  }
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

template <typename Rows>
__global__ void __launch_bounds__(kMaxThreads)
    Glu2RowsKernel(Rows rows, int64_t f, Activation act, Glu2Out o) {
  __shared__ float scratch1[kMaxThreads / kWarpSize], scratch2[kMaxThreads / kWarpSize];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  const int64_t row = blockIdx.x, out = row * f;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec, end = f;
  float v[kVec];
  int8_t codes[kVec];
  float amax = 0.0f;  // max is exact in any order: the block width never shows in the bits
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    rows.Chunk(row, act, i0, cnt, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {  // unrolled: keeps v in registers
      if (i < cnt) amax = fmaxf(amax, fabsf(v[i]));
    }
  }
  amax = BlockMax(amax, scratch1);
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    rows.Chunk(row, act, i0, cnt, v);
    FirstDigit(v, inv, scale, codes);
    StoreCodes(o.q1 + out + i0, cnt, codes);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt) rmax = fmaxf(rmax, fabsf(v[i]));
    }
  }
  rmax = BlockMax(rmax, scratch2);
  const float rinv = QuantInverse(rmax);
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    rows.Chunk(row, act, i0, cnt, v);
    FirstDigit(v, inv, scale, codes);
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], rinv);
    StoreCodes(o.q2 + out + i0, cnt, codes);
  }
  if (threadIdx.x == 0) {
    o.s1[row] = scale;
    o.s2[row] = QuantScale(rmax);
  }
}

template <typename Rows>
ffi::Error Launch(cudaStream_t stream, const Rows& rows, int64_t m, int64_t f, Activation act,
                  const Glu2Out& o) {
  if (m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(m <= 0x7fffffff, "prism_glu_quant2: too many rows for one grid");
  Glu2RowsKernel<Rows><<<static_cast<unsigned>(m), RowBlockThreads(m, f), 0, stream>>>(
      rows, f, act, o);
  return LaunchStatus("prism_glu_quant2");
}

ffi::Error GluQuant2Cuda(cudaStream_t stream, ffi::AnyBuffer gate_up, ffi::AnyBuffer extra,
                         ffi::Result<ffi::BufferR2<ffi::S8>> q1,
                         ffi::Result<ffi::BufferR1<ffi::F32>> s1,
                         ffi::Result<ffi::BufferR2<ffi::S8>> q2,
                         ffi::Result<ffi::BufferR1<ffi::F32>> s2, int32_t activation,
                         int32_t stacked) {
  GluParts parts;
  if (ffi::Error e = CheckGluParts("prism_glu_quant2", gate_up, extra, activation, stacked, &parts);
      e.failure()) {
    return e;
  }
  const auto act = static_cast<Activation>(activation);
  const Glu2Out o{q1->typed_data(), s1->typed_data(), q2->typed_data(), s2->typed_data()};
  if (parts.plain() && gate_up.element_type() == ffi::DataType::BF16) {
    return Launch(stream, PairRows<uint16_t>{gate_up.reinterpret_data<uint16_t>(), parts.f},
                  parts.m, parts.f, act, o);
  }
  const float* extra_rows = parts.extra ? extra.reinterpret_data<float>() : nullptr;
  const PartsRows rows{gate_up.reinterpret_data<float>(), extra_rows, parts.f, parts.m,
                       parts.stacked};
  return Launch(stream, rows, parts.m, parts.f, act, o);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2Cuda, prism::GluQuant2Cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // gate_up [M or 2M, 2F] f32|bf16
                                  .Arg<ffi::AnyBuffer>()  // extra [M or 0, 2F] f32 partial
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q1 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s1 [M]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q2 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s2 [M]
                                  .Attr<int32_t>("activation")
                                  .Attr<int32_t>("stacked"),  // 1: rows M..2M are a partial
                              {xla::ffi::Traits::kCmdBufferCompatible});
