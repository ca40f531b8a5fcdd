// prism_qkv_rope on the CPU; the specification is qkv_rope.h. Rows (token, kv head) are spread
// over XLA's thread pool; a row's bits never depend on which thread ran it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/ops/norm_row.h"
#include "cc/ops/qkv_rope.h"

namespace prism {
namespace {

constexpr int64_t kElementsPerItem = 1 << 15;  // enough work per item to amortise scheduling

// One q or k head: y = qk_norm ? NormRow(x) : x into buf, then the rotation into out.
void RotateHead(const float* x, const float* gamma, const float* cos, const float* sin,
                int64_t h, const NormAttrs* norm, float* buf, float* out) {
  if (norm != nullptr) {
    NormRow(x, gamma, h, *norm, buf);
  } else {
    std::copy(x, x + h, buf);
  }
  const int64_t half = h / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float lo = buf[i], hi = buf[i + half];
    out[i] = lo * cos[i] - hi * sin[i];
    out[i + half] = hi * cos[i] + lo * sin[i];
  }
}

// Where the rows come from: qkv itself, or (y2, y_w2) summed row by row into a buffer.
struct QkvSource {
  const float* qkv;  // [T, K, G + 2, H], or null with partials
  const float* y2;   // [2T, K, G + 2, H] (partials)
  const float* y_w2;  // [T, K, G + 2, H] (partials)
};

ffi::Error RopeRows(ffi::ThreadPool& pool, const QkvSource& in, const QkvRopeDims& dm,
                    ffi::BufferR2<ffi::F32>& cos, ffi::BufferR2<ffi::F32>& sin,
                    ffi::BufferR1<ffi::F32>& q_gamma, ffi::BufferR1<ffi::F32>& k_gamma,
                    ffi::Result<ffi::BufferR3<ffi::F32>>& q,
                    ffi::Result<ffi::BufferR3<ffi::F32>>& k,
                    ffi::Result<ffi::BufferR3<ffi::F32>>& v, float eps, float weight_offset,
                    int32_t qk_norm) {
  const NormAttrs attrs{eps, weight_offset};
  const NormAttrs* norm = qk_norm != 0 ? &attrs : nullptr;
  const int64_t rows = dm.t * dm.k, slots = dm.g + 2, h = dm.h;  // rows: (token, kv head)
  const int64_t per_item = std::max<int64_t>(1, kElementsPerItem / std::max<int64_t>(slots * h, 1));
  ParallelFor(pool, (rows + per_item - 1) / per_item, [&](int64_t item) {
    std::vector<float> buf(h), sum(in.qkv == nullptr ? slots * h : 0);
    const int64_t end = std::min(rows, (item + 1) * per_item);
    for (int64_t r = item * per_item; r < end; ++r) {
      const int64_t t = r / dm.k;
      const float* src = sum.data();
      if (in.qkv != nullptr) {
        src = in.qkv + r * slots * h;
      } else {  // y2[t] + (y2[T + t] + y_w2[t]), each add rounded
        const float *a = in.y2 + r * slots * h, *b = in.y2 + (rows + r) * slots * h;
        const float* c = in.y_w2 + r * slots * h;
        for (int64_t i = 0; i < slots * h; ++i) sum[i] = a[i] + (b[i] + c[i]);
      }
      const float* c = cos.typed_data() + t * (h / 2);
      const float* s = sin.typed_data() + t * (h / 2);
      for (int64_t j = 0; j < dm.g; ++j) {  // q heads r * G + j, in [T, K * G, H]
        RotateHead(src + j * h, q_gamma.typed_data(), c, s, h, norm, buf.data(),
                   q->typed_data() + (r * dm.g + j) * h);
      }
      RotateHead(src + dm.g * h, k_gamma.typed_data(), c, s, h, norm, buf.data(),
                 k->typed_data() + r * h);
      std::memcpy(v->typed_data() + r * h, src + (dm.g + 1) * h, h * sizeof(float));
    }
  });
  return ffi::Error::Success();
}

ffi::Error QkvRopeCpu(ffi::ThreadPool pool, ffi::BufferR4<ffi::F32> qkv,
                      ffi::BufferR2<ffi::F32> cos, ffi::BufferR2<ffi::F32> sin,
                      ffi::BufferR1<ffi::F32> q_gamma, ffi::BufferR1<ffi::F32> k_gamma,
                      ffi::Result<ffi::BufferR3<ffi::F32>> q,
                      ffi::Result<ffi::BufferR3<ffi::F32>> k,
                      ffi::Result<ffi::BufferR3<ffi::F32>> v, float eps, float weight_offset,
                      int32_t qk_norm) {
  QkvRopeDims dm;
  if (ffi::Error e = CheckQkvRope(qkv.dimensions(), cos.dimensions(), sin.dimensions(),
                                  q_gamma.dimensions(), k_gamma.dimensions(), q->dimensions(),
                                  k->dimensions(), v->dimensions(), &dm);
      e.failure()) {
    return e;
  }
  return RopeRows(pool, {qkv.typed_data(), nullptr, nullptr}, dm, cos, sin, q_gamma, k_gamma, q,
                  k, v, eps, weight_offset, qk_norm);
}

ffi::Error QkvRopeSumCpu(ffi::ThreadPool pool, ffi::BufferR4<ffi::F32> y2,
                         ffi::BufferR4<ffi::F32> y_w2, ffi::BufferR2<ffi::F32> cos,
                         ffi::BufferR2<ffi::F32> sin, ffi::BufferR1<ffi::F32> q_gamma,
                         ffi::BufferR1<ffi::F32> k_gamma,
                         ffi::Result<ffi::BufferR3<ffi::F32>> q,
                         ffi::Result<ffi::BufferR3<ffi::F32>> k,
                         ffi::Result<ffi::BufferR3<ffi::F32>> v, float eps, float weight_offset,
                         int32_t qk_norm) {
  QkvRopeDims dm;
  if (ffi::Error e = CheckQkvRopeSum(y2.dimensions(), y_w2.dimensions(), cos.dimensions(),
                                     sin.dimensions(), q_gamma.dimensions(), k_gamma.dimensions(),
                                     q->dimensions(), k->dimensions(), v->dimensions(), &dm);
      e.failure()) {
    return e;
  }
  return RopeRows(pool, {nullptr, y2.typed_data(), y_w2.typed_data()}, dm, cos, sin, q_gamma,
                  k_gamma, q, k, v, eps, weight_offset, qk_norm);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeCpu, prism::QkvRopeCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // qkv [T, K, G + 2, H]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // cos [T, H / 2]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // sin [T, H / 2]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // q_gamma [H]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // k_gamma [H]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // q [T, K * G, H]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // k [T, K, H]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // v [T, K, H]
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("qk_norm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeSumCpu, prism::QkvRopeSumCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y2 [2T, K, G + 2, H]
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y_w2 [T, K, G + 2, H]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // cos [T, H / 2]
                                  .Arg<ffi::BufferR2<ffi::F32>>()  // sin [T, H / 2]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // q_gamma [H]
                                  .Arg<ffi::BufferR1<ffi::F32>>()  // k_gamma [H]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // q [T, K * G, H]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // k [T, K, H]
                                  .Ret<ffi::BufferR3<ffi::F32>>()  // v [T, K, H]
                                  .Attr<float>("eps")
                                  .Attr<float>("weight_offset")
                                  .Attr<int32_t>("qk_norm"));
