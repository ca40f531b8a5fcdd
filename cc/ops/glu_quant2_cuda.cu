// prism_glu_quant2 on CUDA; the specification is glu_quant2_cpu.cc (formulas: glu_quant.h).
//   gate_up [M, 2F] f32|bf16 -> q1 s8 [M, F], s1 f32 [M], q2 s8 [M, F], s2 f32 [M].
// One block per row, like glu_quant_cuda.cu. No F-sized scratch is passed in, so a is
// recomputed in each of three passes (same code, same inputs: same bits): pass 1 takes the
// row's amax, pass 2 writes q1 and takes the remainder's max, pass 3 writes q2. Both maxima
// are exact in any order, so the result depends only on the row, never on the block width.
//
// prism_glu_quant2_sum: the same digits of gate_up = y2[r] + (y2[M + r] + yw2[r]), the two-digit
// projection's partial products (Int8Linear: x1 W1, x2 W1, x1 W2), added here in the model's
// order instead of by an XLA pass that writes gate_up out and reads it back. Each input is
// read once: pass 1 keeps a in shared memory (F floats, when they fit) and pass 2 overwrites it
// with the remainders that pass 3 quantises; too long a row recomputes a instead (same bits).
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

// f32 only: the partial products are the int8 GEMM's f32 outputs.
struct Glu2SumArgs {
  const float* __restrict__ y2;   // [2M, 2F]: rows x1 W1, then rows x2 W1
  const float* __restrict__ yw2;  // [M, 2F]: x1 W2
  int8_t* __restrict__ q1;
  float* __restrict__ s1;
  int8_t* __restrict__ q2;
  float* __restrict__ s2;
  int64_t m, f;
  Activation act;
  bool cached;  // a (then the remainders) kept in dynamic shared memory, F floats
};
constexpr int64_t kMaxCachedBytes = 200 << 10;  // under the H200's 227 KB per block

// v = a + (b + c) for the chunk at i0: the model's order (Int8Linear), each add rounded.
__device__ __forceinline__ void SumChunk(const float* a, const float* b, const float* c,
                                         int64_t i0, int cnt, float (&v)[kVec]) {
  float u[kVec], w[kVec];
  LoadChunk(a + i0, cnt, v);
  LoadChunk(b + i0, cnt, u);
  LoadChunk(c + i0, cnt, w);
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fadd_rn(v[i], __fadd_rn(u[i], w[i]));
}

// GatedChunk (glu_rows.cuh) of the summed row: v = Activate(gate) * up.
__device__ __forceinline__ void SummedGatedChunk(const Glu2SumArgs& a, int64_t i0, int cnt,
                                                 float (&v)[kVec]) {
  const int64_t row = 2 * a.f;
  const float* x1 = a.y2 + static_cast<int64_t>(blockIdx.x) * row;
  const float* x2 = a.y2 + (a.m + static_cast<int64_t>(blockIdx.x)) * row;
  const float* w2 = a.yw2 + static_cast<int64_t>(blockIdx.x) * row;
  float u[kVec];
  SumChunk(x1, x2, w2, i0, cnt, v);                       // gate
  SumChunk(x1 + a.f, x2 + a.f, w2 + a.f, i0, cnt, u);     // up
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __fmul_rn(Activate(a.act, v[i]), u[i]);
}

// A thread's chunk of the cached row: two float4s when whole (i0 % kVec == 0 and the dynamic
// shared memory is 16-byte aligned), which halves the bank conflicts of scalar accesses.
static_assert(kVec == 8, "LoadCached / StoreCached move a chunk as two float4s");
__device__ __forceinline__ void LoadCached(const float* row, int64_t i0, int cnt,
                                           float (&v)[kVec]) {
  if (cnt == kVec) {
    const float4 a = reinterpret_cast<const float4*>(row + i0)[0];
    const float4 b = reinterpret_cast<const float4*>(row + i0)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = i < cnt ? row[i0 + i] : 0.0f;
}

__device__ __forceinline__ void StoreCached(float* row, int64_t i0, int cnt,
                                            const float (&v)[kVec]) {
  if (cnt == kVec) {
    reinterpret_cast<float4*>(row + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(row + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    if (i < cnt) row[i0 + i] = v[i];
  }
}

// Glu2RowsKernel's three passes; each thread only ever touches its own chunks of the cache.
__global__ void __launch_bounds__(kMaxThreads) Glu2SumRowsKernel(Glu2SumArgs a) {
  extern __shared__ float4 cache4[];  // [F] floats when a.cached (float4: 16-byte aligned)
  float* cache = reinterpret_cast<float*>(cache4);
  __shared__ float scratch1[kMaxThreads / kWarpSize], scratch2[kMaxThreads / kWarpSize];
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kVec;
  const int64_t out = static_cast<int64_t>(blockIdx.x) * a.f;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * kVec, end = a.f;
  float v[kVec];
  int8_t codes[kVec];
  float amax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    SummedGatedChunk(a, i0, cnt, v);
    if (a.cached) StoreCached(cache, i0, cnt, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt) amax = fmaxf(amax, fabsf(v[i]));
    }
  }
  amax = BlockMax(amax, scratch1);
  const float inv = QuantInverse(amax), scale = QuantScale(amax);
  float rmax = 0.0f;
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    if (a.cached) {
      LoadCached(cache, i0, cnt, v);
    } else {
      SummedGatedChunk(a, i0, cnt, v);
    }
    FirstDigit(v, inv, scale, codes);
    StoreCodes(a.q1 + out + i0, cnt, codes);
    if (a.cached) StoreCached(cache, i0, cnt, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (i < cnt) rmax = fmaxf(rmax, fabsf(v[i]));
    }
  }
  rmax = BlockMax(rmax, scratch2);
  const float rinv = QuantInverse(rmax);
  for (int64_t i0 = first; i0 < end; i0 += stride) {
    const int cnt = ChunkCount(i0, end);
    if (a.cached) {
      LoadCached(cache, i0, cnt, v);  // the remainders pass 2 left
    } else {
      SummedGatedChunk(a, i0, cnt, v);
      FirstDigit(v, inv, scale, codes);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) codes[i] = QuantCode(v[i], rinv);
    StoreCodes(a.q2 + out + i0, cnt, codes);
  }
  if (threadIdx.x == 0) {
    a.s1[blockIdx.x] = scale;
    a.s2[blockIdx.x] = QuantScale(rmax);
  }
}

ffi::Error LaunchSum(cudaStream_t stream, Glu2SumArgs a) {
  if (a.m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(a.m <= 0x7fffffff, "prism_glu_quant2_sum: too many rows for one grid");
  const int64_t bytes = a.f * static_cast<int64_t>(sizeof(float));
  a.cached = bytes <= kMaxCachedBytes;
  const size_t smem = a.cached ? static_cast<size_t>(bytes) : 0;
  if (smem > 48 * 1024) {  // above the default cap: opt in (not a stream operation)
    const cudaError_t e = cudaFuncSetAttribute(
        Glu2SumRowsKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: nothing was launched
      return ffi::Error::Internal(std::string("prism_glu_quant2_sum: shared memory for F = ") +
                                  std::to_string(a.f) + ": " + cudaGetErrorString(e));
    }
  }
  Glu2SumRowsKernel<<<static_cast<unsigned>(a.m), RowBlockThreads(a.m, a.f), smem, stream>>>(a);
  return LaunchStatus("prism_glu_quant2_sum");
}

ffi::Error GluQuant2SumCuda(cudaStream_t stream, ffi::BufferR2<ffi::F32> y2,
                            ffi::BufferR2<ffi::F32> yw2,
                            ffi::Result<ffi::BufferR2<ffi::S8>> q1,
                            ffi::Result<ffi::BufferR1<ffi::F32>> s1,
                            ffi::Result<ffi::BufferR2<ffi::S8>> q2,
                            ffi::Result<ffi::BufferR1<ffi::F32>> s2, int32_t activation) {
  if (ffi::Error e = CheckGluSumArgs(y2.dimensions(), yw2.dimensions(), activation); e.failure()) {
    return e;
  }
  const int64_t m = yw2.dimensions()[0], f = yw2.dimensions()[1] / 2;
  return LaunchSum(stream, {y2.typed_data(), yw2.typed_data(), q1->typed_data(), s1->typed_data(),
                            q2->typed_data(), s2->typed_data(), m, f,
                            static_cast<Activation>(activation), false});
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismGluQuant2SumCuda, prism::GluQuant2SumCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // y2 [2M, 2F]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // yw2 [M, 2F]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q1 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s1 [M]
                                  .Ret<ffi::BufferR2<ffi::S8>>()   // q2 [M, F]
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // s2 [M]
                                  .Attr<int32_t>("activation"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
