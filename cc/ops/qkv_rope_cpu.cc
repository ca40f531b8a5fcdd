// prism_qkv_rope on the CPU; the specification is qkv_rope.h. Rows (token, kv head) are spread
// over XLA's thread pool; a row's bits never depend on which thread ran it.
#include <algorithm>
#include <cstring>
#include <unordered_map>
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

// The operands and attributes every variant shares.
struct RopeIo {
  const float *cos, *sin, *q_gamma, *k_gamma;
  float* q;
  float eps, weight_offset;
  int32_t qk_norm;
};

// Per token, whether its k/v rows are stored: with a slot table, only the last token of each
// slot inside the pool (tree_attention's CPU write copies token by token, so the last wins).
std::vector<char> StoredTokens(const KvDest& dst, int64_t t) {
  std::vector<char> stored(t, 1);
  if (dst.slot == nullptr) return stored;
  std::unordered_map<int32_t, int64_t> last;
  for (int64_t i = 0; i < t; ++i) last[dst.slot[i]] = i;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t sl = dst.slot[i];
    stored[i] = sl >= 0 && sl < dst.pool_rows && last[sl] == i;
  }
  return stored;
}

ffi::Error RopeRows(ffi::ThreadPool& pool, const QkvSource& in, const QkvRopeDims& dm,
                    const RopeIo& io, const KvDest& dst) {
  const NormAttrs attrs{io.eps, io.weight_offset};
  const NormAttrs* norm = io.qk_norm != 0 ? &attrs : nullptr;
  const int64_t rows = dm.t * dm.k, slots = dm.g + 2, h = dm.h;  // rows: (token, kv head)
  const int64_t per_item = std::max<int64_t>(1, kElementsPerItem / std::max<int64_t>(slots * h, 1));
  const std::vector<char> stored = StoredTokens(dst, dm.t);
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
      const float* c = io.cos + t * (h / 2);
      const float* s = io.sin + t * (h / 2);
      for (int64_t j = 0; j < dm.g; ++j) {  // q heads r * G + j, in [T, K * G, H]
        RotateHead(src + j * h, io.q_gamma, c, s, h, norm, buf.data(), io.q + (r * dm.g + j) * h);
      }
      if (!stored[t]) continue;
      const int64_t row = dst.slot == nullptr ? r : dst.slot[t] * dm.k + r % dm.k;
      RotateHead(src + dm.g * h, io.k_gamma, c, s, h, norm, buf.data(), dst.k + row * h);
      std::memcpy(dst.v + row * h, src + (dm.g + 1) * h, h * sizeof(float));
    }
  });
  return ffi::Error::Success();
}

RopeIo Io(ffi::BufferR2<ffi::F32>& cos, ffi::BufferR2<ffi::F32>& sin,
          ffi::BufferR1<ffi::F32>& q_gamma, ffi::BufferR1<ffi::F32>& k_gamma,
          ffi::Result<ffi::BufferR3<ffi::F32>>& q, float eps, float weight_offset,
          int32_t qk_norm) {
  return {cos.typed_data(), sin.typed_data(), q_gamma.typed_data(), k_gamma.typed_data(),
          q->typed_data(), eps, weight_offset, qk_norm};
}

// The _kv variants' destination, once their shapes check: the result pools, holding the operand
// pools' contents first (XLA aliases them, so the copy is only for a caller that did not donate).
ffi::Error PoolDest(ffi::BufferR4<ffi::F32>& k_pages, ffi::BufferR4<ffi::F32>& v_pages,
                    ffi::BufferR1<ffi::S32>& slot, ffi::Result<ffi::BufferR4<ffi::F32>>& k_out,
                    ffi::Result<ffi::BufferR4<ffi::F32>>& v_out, const QkvRopeDims& dm,
                    KvDest* dst) {
  int64_t pool_rows = 0;
  PRISM_RETURN_IF_ERROR(
      CheckKvPools(k_pages.dimensions(), v_pages.dimensions(), slot.dimensions(), dm, &pool_rows));
  CopyUnlessAliased(k_pages, k_out);
  CopyUnlessAliased(v_pages, v_out);
  *dst = {k_out->typed_data(), v_out->typed_data(), slot.typed_data(), pool_rows};
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
  PRISM_RETURN_IF_ERROR(CheckQkvRope(qkv.dimensions(), cos.dimensions(), sin.dimensions(),
                                     q_gamma.dimensions(), k_gamma.dimensions(),
                                     q->dimensions(), &dm));
  PRISM_RETURN_IF_ERROR(CheckKvRows(k->dimensions(), v->dimensions(), dm));
  return RopeRows(pool, {qkv.typed_data(), nullptr, nullptr}, dm,
                  Io(cos, sin, q_gamma, k_gamma, q, eps, weight_offset, qk_norm),
                  {k->typed_data(), v->typed_data(), nullptr, 0});
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
  PRISM_RETURN_IF_ERROR(CheckQkvRopeSum(y2.dimensions(), y_w2.dimensions(), cos.dimensions(),
                                        sin.dimensions(), q_gamma.dimensions(),
                                        k_gamma.dimensions(), q->dimensions(), &dm));
  PRISM_RETURN_IF_ERROR(CheckKvRows(k->dimensions(), v->dimensions(), dm));
  return RopeRows(pool, {nullptr, y2.typed_data(), y_w2.typed_data()}, dm,
                  Io(cos, sin, q_gamma, k_gamma, q, eps, weight_offset, qk_norm),
                  {k->typed_data(), v->typed_data(), nullptr, 0});
}

ffi::Error QkvRopeKvCpu(ffi::ThreadPool pool, ffi::BufferR4<ffi::F32> qkv,
                        ffi::BufferR2<ffi::F32> cos, ffi::BufferR2<ffi::F32> sin,
                        ffi::BufferR1<ffi::F32> q_gamma, ffi::BufferR1<ffi::F32> k_gamma,
                        ffi::BufferR4<ffi::F32> k_pages, ffi::BufferR4<ffi::F32> v_pages,
                        ffi::BufferR1<ffi::S32> slot, ffi::Result<ffi::BufferR3<ffi::F32>> q,
                        ffi::Result<ffi::BufferR4<ffi::F32>> k_out,
                        ffi::Result<ffi::BufferR4<ffi::F32>> v_out, float eps,
                        float weight_offset, int32_t qk_norm) {
  QkvRopeDims dm;
  KvDest dst{};
  PRISM_RETURN_IF_ERROR(CheckQkvRope(qkv.dimensions(), cos.dimensions(), sin.dimensions(),
                                     q_gamma.dimensions(), k_gamma.dimensions(),
                                     q->dimensions(), &dm));
  PRISM_RETURN_IF_ERROR(PoolDest(k_pages, v_pages, slot, k_out, v_out, dm, &dst));
  return RopeRows(pool, {qkv.typed_data(), nullptr, nullptr}, dm,
                  Io(cos, sin, q_gamma, k_gamma, q, eps, weight_offset, qk_norm), dst);
}

ffi::Error QkvRopeSumKvCpu(ffi::ThreadPool pool, ffi::BufferR4<ffi::F32> y2,
                           ffi::BufferR4<ffi::F32> y_w2, ffi::BufferR2<ffi::F32> cos,
                           ffi::BufferR2<ffi::F32> sin, ffi::BufferR1<ffi::F32> q_gamma,
                           ffi::BufferR1<ffi::F32> k_gamma, ffi::BufferR4<ffi::F32> k_pages,
                           ffi::BufferR4<ffi::F32> v_pages, ffi::BufferR1<ffi::S32> slot,
                           ffi::Result<ffi::BufferR3<ffi::F32>> q,
                           ffi::Result<ffi::BufferR4<ffi::F32>> k_out,
                           ffi::Result<ffi::BufferR4<ffi::F32>> v_out, float eps,
                           float weight_offset, int32_t qk_norm) {
  QkvRopeDims dm;
  KvDest dst{};
  PRISM_RETURN_IF_ERROR(CheckQkvRopeSum(y2.dimensions(), y_w2.dimensions(), cos.dimensions(),
                                        sin.dimensions(), q_gamma.dimensions(),
                                        k_gamma.dimensions(), q->dimensions(), &dm));
  PRISM_RETURN_IF_ERROR(PoolDest(k_pages, v_pages, slot, k_out, v_out, dm, &dst));
  return RopeRows(pool, {nullptr, y2.typed_data(), y_w2.typed_data()}, dm,
                  Io(cos, sin, q_gamma, k_gamma, q, eps, weight_offset, qk_norm), dst);
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeCpu, prism::QkvRopeCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // qkv [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_ROWS PRISM_ROPE_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeSumCpu, prism::QkvRopeSumCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y2 [2T, K, G + 2, H]
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y_w2 [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_ROWS PRISM_ROPE_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeKvCpu, prism::QkvRopeKvCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // qkv [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_POOLS PRISM_ROPE_ATTRS);

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismQkvRopeSumKvCpu, prism::QkvRopeSumKvCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y2 [2T, K, G + 2, H]
                                  .Arg<ffi::BufferR4<ffi::F32>>()  // y_w2 [T, K, G + 2, H]
                                  PRISM_ROPE_TABLES PRISM_ROPE_KV_POOLS PRISM_ROPE_ATTRS);
