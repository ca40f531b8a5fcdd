// prism_qkv_rope on CUDA; the specification is qkv_rope.h. A head row of H <= 256 elements
// takes a segment of W lanes of a warp (W: the power of two >= H / 8; 32 / W rows a warp):
// sub-lane l holds elements [8 l, 8 l + 8), exactly canonical lane l's chunk (numerics.h), so
// the sum of squares is the sub-lane's eight in increasing d, then the butterfly's levels below
// W. The canonical levels at and above W add the partials of lanes that hold no element, +0,
// which leaves a sum of squares (never -0) as it is: NormRegRowsKernel's bits for a row of H.
// The rotation's partner y[d +- H / 2] lives H / 16 sub-lanes away and comes by one shuffle.
// Every load (x, gamma, cos, sin) is issued before the first use, so a row costs one memory
// round trip. Every multiply and add is separately rounded (-fmad=false, __fmul_rn / __fadd_rn).
// The _kv variants store k and v rows at their pool rows (KvDest) instead of the k/v results,
// which saves tree_attention's write kernel and a read and write of k and v per layer.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cc/common.h"
#include "cc/cuda_common.cuh"
#include "cc/numerics.h"
#include "cc/ops/qkv_rope.h"

namespace prism {
namespace {

constexpr int kRopeWarps = 4;  // warps per block
constexpr int64_t kMaxRopeHead = kWarpSize * kVec;  // one chunk per lane

struct QkvRopeArgs {
  const float* qkv;   // [T, K, G + 2, H]; or null, and the rows come from the partials:
  const float* y2;    // [2T, K, G + 2, H] (prism_qkv_rope_sum)
  const float* y_w2;  // [T, K, G + 2, H]
  const float* cos;
  const float* sin;
  const float* q_gamma;
  const float* k_gamma;
  float* q;
  KvDest kv;  // the k/v results, or the pools at slot[t]
  QkvRopeDims dm;
  float eps, weight_offset;
  bool qk_norm;
};

__device__ __forceinline__ void Load8(const float* p, float (&v)[kVec]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void Store8(float* p, const float (&v)[kVec]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Lanes per head row: the power of two holding H / 8 lanes.
inline int SegmentLanes(int64_t h) {
  int w = 1;
  while (w < h / kVec) w *= 2;
  return w;
}

__global__ void __launch_bounds__(kRopeWarps * kWarpSize)
    QkvRopeKernel(QkvRopeArgs a, int seg) {
  const QkvRopeDims& dm = a.dm;
  const int64_t slots = dm.g + 2, rows = dm.t * dm.k * slots;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize), sub = lane % seg;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRopeWarps + threadIdx.x / kWarpSize;
  const int64_t r = warp * (kWarpSize / seg) + lane / seg;
  const int live = static_cast<int>(dm.h / kVec), shift = live / 2;  // lanes holding elements
  const bool here = r < rows && sub < live;  // every lane stays for the shuffles below
  const int64_t slot = r % slots, tk = r / slots, t = tk / dm.k;
  const bool is_q = slot < dm.g, is_v = slot == dm.g + 1, low = sub < shift;
  float x[kVec] = {}, gm[kVec] = {}, c[kVec] = {}, s[kVec] = {};
  if (here) {
    if (a.qkv != nullptr) {  // uniform per kernel
      Load8(a.qkv + r * dm.h + sub * kVec, x);
    } else {  // y2[t] + (y2[T + t] + y_w2[t]), each add rounded (Int8Linear's order)
      float b[kVec], w2[kVec];
      Load8(a.y2 + r * dm.h + sub * kVec, x);
      Load8(a.y2 + (rows + r) * dm.h + sub * kVec, b);
      Load8(a.y_w2 + r * dm.h + sub * kVec, w2);
#pragma unroll
      for (int i = 0; i < kVec; ++i) x[i] = __fadd_rn(x[i], __fadd_rn(b[i], w2[i]));
    }
    if (!is_v) {
      if (a.qk_norm) Load8((is_q ? a.q_gamma : a.k_gamma) + sub * kVec, gm);
      const int64_t at = t * (dm.h / 2) + (low ? sub : sub - shift) * kVec;
      Load8(a.cos + at, c);
      Load8(a.sin + at, s);
    }
  }
  if (a.qk_norm) {  // uniform per kernel; v rows compute it too and drop it
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc = __fadd_rn(acc, __fmul_rn(x[i], x[i]));
    for (int off = seg / 2; off > 0; off /= 2) {
      acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, off));
    }
    const float inv = InverseRms(acc, dm.h, a.eps);
    if (!is_v) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        x[i] = __fmul_rn(__fmul_rn(x[i], inv), __fadd_rn(a.weight_offset, gm[i]));
      }
    }
  }
  const int partner = sub >= live ? lane : (low ? lane + shift : lane - shift);
  float p[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) p[i] = __shfl_sync(kFullMask, x[i], partner);
  if (!here) return;
  int64_t kv_row = tk;  // k and v: row t * K + kv head of the results, or of the pools
  if (!is_q && a.kv.slot != nullptr) {
    const int64_t sl = a.kv.slot[t];
    if (sl < 0 || sl >= a.kv.pool_rows) return;  // tree_attention's write skips it too
    kv_row = sl * dm.k + tk % dm.k;
  }
  if (is_v) {
    Store8(a.kv.v + kv_row * dm.h + sub * kVec, x);
    return;
  }
  float out[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float yc = __fmul_rn(x[i], c[i]), ps = __fmul_rn(p[i], s[i]);
    out[i] = low ? __fsub_rn(yc, ps) : __fadd_rn(yc, ps);
  }
  float* dst = is_q ? a.q + (tk * dm.g + slot) * dm.h : a.kv.k + kv_row * dm.h;
  Store8(dst + sub * kVec, out);
}

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// a's buffers are set and its dims checked; checks what the kernel needs and launches it.
ffi::Error Launch(cudaStream_t stream, const QkvRopeArgs& a) {
  const std::string op = "prism_qkv_rope (CUDA): ";
  PRISM_REQUIRE(a.dm.h % (2 * kVec) == 0 && a.dm.h <= kMaxRopeHead,
                op + "the head dim must be a multiple of 16 up to 256, got " +
                    std::to_string(a.dm.h) + " (ops.qkv_rope_supported says which the model "
                    "routes here)");
  for (const void* p : {static_cast<const void*>(a.qkv != nullptr ? a.qkv : a.y2),
                        static_cast<const void*>(a.qkv != nullptr ? a.qkv : a.y_w2),
                        static_cast<const void*>(a.cos),
                        static_cast<const void*>(a.sin), static_cast<const void*>(a.q_gamma),
                        static_cast<const void*>(a.k_gamma), static_cast<const void*>(a.q),
                        static_cast<const void*>(a.kv.k), static_cast<const void*>(a.kv.v)}) {
    PRISM_REQUIRE(Aligned(p), op + "every buffer must be 16-byte aligned");
  }
  const int64_t rows = a.dm.t * a.dm.k * (a.dm.g + 2);
  if (rows == 0) return ffi::Error::Success();
  const int seg = SegmentLanes(a.dm.h);
  const int64_t warps = CeilDiv(rows, kWarpSize / seg);
  const unsigned grid = static_cast<unsigned>(CeilDiv(warps, kRopeWarps));
  QkvRopeKernel<<<grid, kRopeWarps * kWarpSize, 0, stream>>>(a, seg);
  return LaunchStatus("prism_qkv_rope");
}

// The _kv variants' destination, once their shapes check: the result pools, holding the operand
// pools' contents first (XLA aliases them, so the copy is only for a caller that did not donate).
ffi::Error PoolDest(cudaStream_t stream, ffi::BufferR4<ffi::F32>& k_pages,
                    ffi::BufferR4<ffi::F32>& v_pages, ffi::BufferR1<ffi::S32>& slot,
                    ffi::Result<ffi::BufferR4<ffi::F32>>& k_out,
                    ffi::Result<ffi::BufferR4<ffi::F32>>& v_out, const QkvRopeDims& dm,
                    KvDest* dst) {
  int64_t pool_rows = 0;
  PRISM_RETURN_IF_ERROR(
      CheckKvPools(k_pages.dimensions(), v_pages.dimensions(), slot.dimensions(), dm, &pool_rows));
  PRISM_RETURN_IF_ERROR(CopyUnlessAliasedAsync(stream, k_pages, k_out, "prism_qkv_rope_kv"));
  PRISM_RETURN_IF_ERROR(CopyUnlessAliasedAsync(stream, v_pages, v_out, "prism_qkv_rope_kv"));
  *dst = {k_out->typed_data(), v_out->typed_data(), slot.typed_data(), pool_rows};
  return ffi::Error::Success();
}

ffi::Error QkvRopeCuda(cudaStream_t stream, ffi::BufferR4<ffi::F32> qkv,
                       ffi::BufferR2<ffi::F32> cos, ffi::BufferR2<ffi::F32> sin,
                       ffi::BufferR1<ffi::F32> q_gamma, ffi::BufferR1<ffi::F32> k_gamma,
                       ffi::Result<ffi::BufferR3<ffi::F32>> q,
                       ffi::Result<ffi::BufferR3<ffi::F32>> k,
                       ffi::Result<ffi::BufferR3<ffi::F32>> v, float eps, float weight_offset,
                       int32_t qk_norm) {
  QkvRopeArgs a{qkv.typed_data(), nullptr, nullptr, cos.typed_data(), sin.typed_data(),
                q_gamma.typed_data(), k_gamma.typed_data(), q->typed_data(),
                {k->typed_data(), v->typed_data(), nullptr, 0}, {}, eps, weight_offset,
                qk_norm != 0};
  PRISM_RETURN_IF_ERROR(CheckQkvRope(qkv.dimensions(), cos.dimensions(), sin.dimensions(),
                                     q_gamma.dimensions(), k_gamma.dimensions(),
                                     q->dimensions(), &a.dm));
  PRISM_RETURN_IF_ERROR(CheckKvRows(k->dimensions(), v->dimensions(), a.dm));
  return Launch(stream, a);
}

ffi::Error QkvRopeSumCuda(cudaStream_t stream, ffi::BufferR4<ffi::F32> y2,
                          ffi::BufferR4<ffi::F32> y_w2, ffi::BufferR2<ffi::F32> cos,
                          ffi::BufferR2<ffi::F32> sin, ffi::BufferR1<ffi::F32> q_gamma,
                          ffi::BufferR1<ffi::F32> k_gamma,
                          ffi::Result<ffi::BufferR3<ffi::F32>> q,
                          ffi::Result<ffi::BufferR3<ffi::F32>> k,
                          ffi::Result<ffi::BufferR3<ffi::F32>> v, float eps,
                          float weight_offset, int32_t qk_norm) {
  QkvRopeArgs a{nullptr, y2.typed_data(), y_w2.typed_data(), cos.typed_data(), sin.typed_data(),
                q_gamma.typed_data(), k_gamma.typed_data(), q->typed_data(),
                {k->typed_data(), v->typed_data(), nullptr, 0}, {}, eps, weight_offset,
                qk_norm != 0};
  PRISM_RETURN_IF_ERROR(CheckQkvRopeSum(y2.dimensions(), y_w2.dimensions(), cos.dimensions(),
                                        sin.dimensions(), q_gamma.dimensions(),
                                        k_gamma.dimensions(), q->dimensions(), &a.dm));
  PRISM_RETURN_IF_ERROR(CheckKvRows(k->dimensions(), v->dimensions(), a.dm));
  return Launch(stream, a);
}

ffi::Error QkvRopeKvCuda(cudaStream_t stream, ffi::BufferR4<ffi::F32> qkv,
                         ffi::BufferR2<ffi::F32> cos, ffi::BufferR2<ffi::F32> sin,
                         ffi::BufferR1<ffi::F32> q_gamma, ffi::BufferR1<ffi::F32> k_gamma,
                         ffi::BufferR4<ffi::F32> k_pages, ffi::BufferR4<ffi::F32> v_pages,
                         ffi::BufferR1<ffi::S32> slot, ffi::Result<ffi::BufferR3<ffi::F32>> q,
                         ffi::Result<ffi::BufferR4<ffi::F32>> k_out,
                         ffi::Result<ffi::BufferR4<ffi::F32>> v_out, float eps,
                         float weight_offset, int32_t qk_norm) {
  QkvRopeArgs a{qkv.typed_data(), nullptr, nullptr, cos.typed_data(), sin.typed_data(),
                q_gamma.typed_data(), k_gamma.typed_data(), q->typed_data(), {}, {}, eps,
                weight_offset, qk_norm != 0};
  PRISM_RETURN_IF_ERROR(CheckQkvRope(qkv.dimensions(), cos.dimensions(), sin.dimensions(),
                                     q_gamma.dimensions(), k_gamma.dimensions(),
                                     q->dimensions(), &a.dm));
  PRISM_RETURN_IF_ERROR(PoolDest(stream, k_pages, v_pages, slot, k_out, v_out, a.dm, &a.kv));
  return Launch(stream, a);
}

ffi::Error QkvRopeSumKvCuda(cudaStream_t stream, ffi::BufferR4<ffi::F32> y2,
                            ffi::BufferR4<ffi::F32> y_w2, ffi::BufferR2<ffi::F32> cos,
                            ffi::BufferR2<ffi::F32> sin, ffi::BufferR1<ffi::F32> q_gamma,
                            ffi::BufferR1<ffi::F32> k_gamma, ffi::BufferR4<ffi::F32> k_pages,
                            ffi::BufferR4<ffi::F32> v_pages, ffi::BufferR1<ffi::S32> slot,
                            ffi::Result<ffi::BufferR3<ffi::F32>> q,
                            ffi::Result<ffi::BufferR4<ffi::F32>> k_out,
                            ffi::Result<ffi::BufferR4<ffi::F32>> v_out, float eps,
                            float weight_offset, int32_t qk_norm) {
  QkvRopeArgs a{nullptr, y2.typed_data(), y_w2.typed_data(), cos.typed_data(), sin.typed_data(),
                q_gamma.typed_data(), k_gamma.typed_data(), q->typed_data(), {}, {}, eps,
                weight_offset, qk_norm != 0};
  PRISM_RETURN_IF_ERROR(CheckQkvRopeSum(y2.dimensions(), y_w2.dimensions(), cos.dimensions(),
                                        sin.dimensions(), q_gamma.dimensions(),
                                        k_gamma.dimensions(), q->dimensions(), &a.dm));
  PRISM_RETURN_IF_ERROR(PoolDest(stream, k_pages, v_pages, slot, k_out, v_out, a.dm, &a.kv));
  return Launch(stream, a);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeCuda, prism::QkvRopeCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // qkv [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_ROWS PRISM_ROPE_ATTRS,
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeSumCuda, prism::QkvRopeSumCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y2 [2T, K, G + 2, H]
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y_w2 [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_ROWS PRISM_ROPE_ATTRS,
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeKvCuda, prism::QkvRopeKvCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // qkv [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_POOLS PRISM_ROPE_ATTRS,
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeSumKvCuda, prism::QkvRopeSumKvCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y2 [2T, K, G + 2, H]
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y_w2 [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_POOLS PRISM_ROPE_ATTRS,
                              {xla::ffi::Traits::kCmdBufferCompatible});
