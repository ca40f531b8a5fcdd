// RMSNorm custom calls on CUDA; the specification is norm_quant_cpu.cc and the results are
// bit-identical to it. Shapes: M rows, D model dim.
//   prism_rmsnorm            x [M, D], gamma [D]            -> y [M, D] (x's dtype)
//   prism_rmsnorm_quant      x [M, D], gamma [D]            -> x_q s8 [M, D], s_x f32 [M]
//   prism_add_rmsnorm_quant  x, residual [M, D], gamma [D]  -> x_q, s_x, h = x + residual
//   prism_add_rmsnorm        x, residual [M, D], gamma [D]  -> y, h = x + residual
//   prism_add_rmsnorm_quant_sum  the _quant form of a two-digit projection's partial products
//                            (norm_digits.h): x2 [2M, D], x_w2 [M, D], residual [M, D] f32
// The quantising ones take `digits` (norm_digits.h): 2 (f32) also writes the second digit,
// NormArgs::q2 / s2, from the same registers or staged row.
// Rows of D <= kMaxRegChunks * kStride (5376 included) are held in registers: one warp per row
// (NormRegRowsKernel, norm_reg_rows.cuh) or W warps per row (NormSplitRowsKernel,
// norm_split_rows.cuh), W chosen by M and D (SplitWarps). Longer rows (or
// PRISM_RMSNORM_KERNEL=block) take NormRowsKernel, one block per row (width: RowBlockThreads):
// the block stages the row's h in shared memory (f32, D <= kMaxStagedD); warp 0 then takes the
// sum of squares in the canonical order (the only order-sensitive step) from shared memory; the
// whole block normalises, takes the (exact) amax and quantises, recomputing y rather than
// keeping it. Longer rows skip the staging: warp 0 streams the row from global memory and later
// passes read h back. All of them compute the same bits.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/norm_args.cuh"
#include "cc/ops/norm_block_rows.cuh"
#include "cc/ops/norm_digits.h"
#include "cc/ops/norm_launch.cuh"
#include "cc/ops/norm_reg_rows.cuh"
#include "cc/ops/norm_split_rows.cuh"
#include "cc/ops/norm_sum_parts.cuh"

namespace prism {
namespace {

static_assert(kMaxRegChunks <= 2 * kMaxSplitChunks, "two warps must hold the longest register row");

}  // namespace

template <typename T>
ffi::Error LaunchNorm(cudaStream_t stream, int64_t m, const NormArgs<T>& a, const char* op) {
  if (m == 0) return ffi::Error::Success();
  PRISM_REQUIRE(m <= 0x7fffffff, std::string(op) + ": too many rows for one grid");
  int forced = 0;
  if (auto e = ForcedNormKernel(&forced); e.failure()) return e;
  const unsigned grid = static_cast<unsigned>(m);
  const bool reg = a.d <= kStride || (a.d <= kMaxRegChunks * kStride && forced != -1);
  const bool lean = forced > kForceLean || (forced == 0 && m >= kLeanRows);
  const int warps = forced > 0 ? forced % kForceLean : SplitWarps(m, a.d, lean);
  if (a.x_hi != nullptr && !(reg && warps > 1)) {  // only the split kernel adds the parts
    NormArgs<T> summed = a;
    if (auto e = SumPartsIntoH(stream, m, &summed, op); e.failure()) return e;
    return LaunchNorm(stream, m, summed, op);
  }
  if (reg) {
    if (warps == 1) {
      LaunchRegRowsFor(stream, m, a);
    } else {  // d <= 21 chunks per lane over >= 2 warps: <= kMaxSplitChunks per warp
      LaunchSplitRowsFor(stream, m, warps, lean, a);
    }
  } else if (a.d <= kMaxStagedD) {
    const int threads = RowBlockThreads(m, a.d);
    const size_t smem = static_cast<size_t>(CeilDiv(a.d, kVec) * kVec) * sizeof(float);
    NormRowsKernel<T, true><<<grid, threads, smem, stream>>>(a);
  } else {
    NormRowsKernel<T, false><<<grid, kStreamThreads, 0, stream>>>(a);
  }
  return LaunchStatus(op);
}
template ffi::Error LaunchNorm<float>(cudaStream_t, int64_t, const NormArgs<float>&, const char*);
template ffi::Error LaunchNorm<uint16_t>(cudaStream_t, int64_t, const NormArgs<uint16_t>&,
                                         const char*);

namespace {

ffi::Error CheckRows(const ffi::AnyBuffer& x, const ffi::BufferR1<ffi::F32>& gamma,
                     const char* op) {
  const std::string name(op);
  PRISM_REQUIRE(x.dimensions().size() == 2, name + ": x must be [M, D]");
  PRISM_REQUIRE(IsFloatActivation(x.element_type()), name + ": x must be float32 or bfloat16");
  PRISM_REQUIRE(gamma.dimensions()[0] == x.dimensions()[1], name + ": gamma must be [D]");
  return ffi::Error::Success();
}

// Builds NormArgs<T> from raw buffers; absent parts are null.
template <typename T>
NormArgs<T> MakeArgs(const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
                     const ffi::BufferR1<ffi::F32>& gamma, void* h, void* y, int8_t* q,
                     float* s, float eps, float weight_offset) {
  return NormArgs<T>{x.reinterpret_data<T>(),
                     residual != nullptr ? residual->reinterpret_data<T>() : nullptr,
                     gamma.typed_data(),
                     static_cast<T*>(h),
                     static_cast<T*>(y),
                     q,
                     s,
                     x.dimensions()[1],
                     eps,
                     weight_offset};
}

// Dispatches on x's dtype (f32 or bf16 stored as uint16_t). digits = 2 (f32 only, checked):
// q and s hold 2M rows, the second digit's after the first's.
ffi::Error Run(cudaStream_t stream, const ffi::AnyBuffer& x, const ffi::AnyBuffer* residual,
               const ffi::BufferR1<ffi::F32>& gamma, void* h, void* y, int8_t* q, float* s,
               float eps, float weight_offset, const char* op, int32_t digits = 1) {
  const int64_t m = x.dimensions()[0];
  if (x.element_type() == ffi::DataType::F32) {
    NormArgs<float> a = MakeArgs<float>(x, residual, gamma, h, y, q, s, eps, weight_offset);
    if (digits == 2) a.q2 = q + m * a.d, a.s2 = s + m;
    return LaunchNorm(stream, m, a, op);
  }
  return LaunchNorm(
      stream, m, MakeArgs<uint16_t>(x, residual, gamma, h, y, q, s, eps, weight_offset), op);
}

ffi::Error RmsNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::BufferR1<ffi::F32> gamma,
                       ffi::Result<ffi::AnyBuffer> y, float eps, float weight_offset) {
  if (auto e = CheckRows(x, gamma, "prism_rmsnorm"); e.failure()) return e;
  PRISM_REQUIRE(y->element_type() == x.element_type(), "prism_rmsnorm: y must have x's dtype");
  return Run(stream, x, nullptr, gamma, nullptr, y->untyped_data(), nullptr, nullptr, eps,
             weight_offset, "prism_rmsnorm");
}

ffi::Error RmsNormQuantCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::BufferR1<ffi::F32> gamma,
                            ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                            ffi::Result<ffi::BufferR1<ffi::F32>> s_x, float eps,
                            float weight_offset, int32_t digits) {
  const char* op = "prism_rmsnorm_quant";
  if (auto e = CheckRows(x, gamma, op); e.failure()) return e;
  if (auto e = CheckNormDigits(x, x_q->dimensions(), s_x->dimensions(), digits, op);
      e.failure()) {
    return e;
  }
  return Run(stream, x, nullptr, gamma, nullptr, nullptr, x_q->typed_data(), s_x->typed_data(),
             eps, weight_offset, op, digits);
}

ffi::Error AddRmsNormQuantCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                               ffi::BufferR1<ffi::F32> gamma,
                               ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                               ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                               ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset,
                               int32_t digits) {
  const char* op = "prism_add_rmsnorm_quant";
  if (auto e = CheckRows(x, gamma, op); e.failure()) return e;
  PRISM_REQUIRE(residual.element_type() == x.element_type() &&
                    residual.element_count() == x.element_count(),
                "prism_add_rmsnorm_quant: residual must match x in shape and dtype");
  if (auto e = CheckNormDigits(x, x_q->dimensions(), s_x->dimensions(), digits, op);
      e.failure()) {
    return e;
  }
  return Run(stream, x, &residual, gamma, h->untyped_data(), nullptr, x_q->typed_data(),
             s_x->typed_data(), eps, weight_offset, op, digits);
}

// x = x2[:M] + (x2[M:] + x_w2) (norm_digits.h), added in the split kernel's loads.
ffi::Error AddRmsNormQuantSumCuda(cudaStream_t stream, ffi::AnyBuffer x2, ffi::AnyBuffer x_w2,
                                  ffi::AnyBuffer residual, ffi::BufferR1<ffi::F32> gamma,
                                  ffi::Result<ffi::BufferR2<ffi::S8>> x_q,
                                  ffi::Result<ffi::BufferR1<ffi::F32>> s_x,
                                  ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset,
                                  int32_t digits) {
  const char* op = "prism_add_rmsnorm_quant_sum";
  if (auto e = CheckNormSumParts(x2, x_w2, op); e.failure()) return e;
  if (auto e = CheckRows(x_w2, gamma, op); e.failure()) return e;
  PRISM_REQUIRE(residual.element_type() == x_w2.element_type() &&
                    residual.element_count() == x_w2.element_count(),
                "prism_add_rmsnorm_quant_sum: residual must match x_w2 in shape and dtype");
  if (auto e = CheckNormDigits(x_w2, x_q->dimensions(), s_x->dimensions(), digits, op);
      e.failure()) {
    return e;
  }
  const int64_t m = x_w2.dimensions()[0];
  NormArgs<float> a = MakeArgs<float>(x_w2, &residual, gamma, h->untyped_data(), nullptr,
                                      x_q->typed_data(), s_x->typed_data(), eps, weight_offset);
  a.x = x2.reinterpret_data<float>();
  a.x_hi = a.x + m * a.d;
  a.x_w2 = x_w2.reinterpret_data<float>();
  if (digits == 2) a.q2 = a.q + m * a.d, a.s2 = a.s + m;
  return LaunchNorm(stream, m, a, op);
}

ffi::Error AddRmsNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual,
                          ffi::BufferR1<ffi::F32> gamma, ffi::Result<ffi::AnyBuffer> y,
                          ffi::Result<ffi::AnyBuffer> h, float eps, float weight_offset) {
  if (auto e = CheckRows(x, gamma, "prism_add_rmsnorm"); e.failure()) return e;
  PRISM_REQUIRE(residual.element_type() == x.element_type() &&
                    residual.element_count() == x.element_count(),
                "prism_add_rmsnorm: residual must match x in shape and dtype");
  PRISM_REQUIRE(y->element_type() == x.element_type() && h->element_type() == x.element_type(),
                "prism_add_rmsnorm: y and h must have x's dtype");
  return Run(stream, x, &residual, gamma, h->untyped_data(), y->untyped_data(), nullptr, nullptr,
             eps, weight_offset, "prism_add_rmsnorm");
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormCuda, prism::AddRmsNormCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::AnyBuffer>()              // y [M, D] x's dtype
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormQuantSumCuda, prism::AddRmsNormQuantSumCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x2 [2M, D] f32
                                  .Arg<ffi::AnyBuffer>()              // x_w2 [M, D] f32
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D] f32
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [digits * M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [digits * M]
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismRmsNormCuda, prism::RmsNormCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::AnyBuffer>()              // y [M, D] x's dtype
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismRmsNormQuantCuda, prism::RmsNormQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismAddRmsNormQuantCuda, prism::AddRmsNormQuantCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()              // x [M, D] f32|bf16
                                  .Arg<ffi::AnyBuffer>()              // residual [M, D]
                                  .Arg<ffi::BufferR1<ffi::F32>>()    // gamma [D]
                                  .Ret<ffi::BufferR2<ffi::S8>>()     // x_q [M, D]
                                  .Ret<ffi::BufferR1<ffi::F32>>()    // s_x [M]
                                  .Ret<ffi::AnyBuffer>()              // h = x + residual
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("digits"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
