// Tree attention on the CPU; arguments, semantics and numerics are in tree_attention.h:
//   prism_tree_attention  q [T, N, H], k_new, v_new [T, K, H], k_pages, v_pages [P, L, K, H],
//                         slot, positions, chain_of s32 [T], chain_segments s32 [C, S, 3],
//                         pages_flat s32 [Pt]  -> out [T, N, H], k_pages, v_pages
//                         attrs scale f32, window s32
// Work: the queries of one chain are cut into blocks of kQueryBlock (in step order); a work item
// is (block, kv head). Each tile's keys are gathered once per item into f32 scratch (keys in the
// canonical lane-major layout, so a dot is 32-wide vector adds) and serve the block's G heads of
// every query. A query's arithmetic never depends on its block: blocks only share loads.
// Items run on XLA's intra-op thread pool.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/numerics.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_host.h"

namespace prism {
namespace {

constexpr int kQueryBlock = 32;  // queries of one chain sharing each gathered tile

// Index of element d in the lane-major layout: chunk-of-256 major, then v, then lane.
inline int64_t LaneMajor(int64_t d) {
  return (d / kStride) * kStride + (d % kVec) * kLanes + (d % kStride) / kVec;
}

// The canonical dot of numerics.h on lane-major rows of length hp (zero padded: exact). The
// butterfly is spelled out with constant bounds so that it compiles to a few vector adds.
// Always inlined, so that it is compiled for the caller's target (TileStep's AVX2 clone).
__attribute__((always_inline)) inline float LaneMajorDot(const float* a, const float* b,
                                                        int64_t hp) {
  float lane[kLanes] = {0.0f};
  for (int64_t base = 0; base < hp; base += kLanes) {
    for (int i = 0; i < kLanes; ++i) lane[i] = lane[i] + a[base + i] * b[base + i];
  }
  static_assert(kLanes == 32, "the butterfly below is written for 32 lanes");
  for (int i = 0; i < 16; ++i) lane[i] = lane[i] + lane[i + 16];
  for (int i = 0; i < 8; ++i) lane[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) lane[i] = lane[i] + lane[i + 4];
  for (int i = 0; i < 2; ++i) lane[i] = lane[i] + lane[i + 2];
  return lane[0] + lane[1];
}

// Eight floats as one value (GCC/Clang vector extension): elementwise IEEE mul and add, so
// the bits equal the scalar loop's; it keeps accumulators in registers across the key loop.
typedef float F8 __attribute__((vector_size(32)));
constexpr int kBlock = 64;  // head-dim elements accumulated in registers (8 x F8)

// acct[0, n) = sum over j of w[j] * v_j[0, n), j in increasing order from +0 (mul then add);
// v_j = base + vis[j] * stride.
__attribute__((always_inline)) inline void WeightedSum(const float* w, const float* base,
                                                       const int* vis, int nvis, int64_t stride,
                                                       int n, float* acct) {
  if (n < kBlock) {
    std::fill(acct, acct + n, 0.0f);
    for (int j = 0; j < nvis; ++j) {
      const float* v = base + vis[j] * stride;
      for (int i = 0; i < n; ++i) acct[i] = acct[i] + w[j] * v[i];
    }
    return;
  }
  F8 a[kBlock / 8] = {};
  for (int j = 0; j < nvis; ++j) {
    const float* v = base + vis[j] * stride;
    for (int i = 0; i < kBlock / 8; ++i) {
      F8 x;
      std::memcpy(&x, v + 8 * i, sizeof(x));
      a[i] = a[i] + w[j] * x;  // the scalar is broadcast
    }
  }
  std::memcpy(acct, a, sizeof(a));
}

// Token t's k/v rows to pool row slot[t]; slots outside the pool write nothing. Sequential,
// so of tokens sharing a slot the last one's rows stay (qkv_rope_kv's CPU store keeps that).
template <typename KV>
void WriteNewRows(const KV* k_new, const KV* v_new, const Dims& dm, const int32_t* slot,
                  KV* k_pool, KV* v_pool) {
  const int64_t row = dm.k * dm.h;
  for (int64_t t = 0; t < dm.t; ++t) {
    const int64_t sl = slot[t];
    if (sl < 0 || sl >= dm.p * dm.l) continue;
    std::memcpy(k_pool + sl * row, k_new + t * row, row * sizeof(KV));
    std::memcpy(v_pool + sl * row, v_new + t * row, row * sizeof(KV));
  }
}

// Gathered keys and values of one tile for one kv head; row[i] < 0: position not in the chain.
struct Tile {
  std::vector<float> k, v;  // [kAttnTile, hp] lane-major, [kAttnTile, h]
  int64_t row[kAttnTile];
};

template <typename KV>
bool GatherTile(const KV* k_pool, const KV* v_pool, const Dims& dm, const Tables& tb,
                int64_t chain, int64_t kvh, int64_t tile, Tile* out) {
  const int32_t* seg = tb.segs + chain * dm.s * kSegFields;
  bool any = false;
  for (int i = 0; i < kAttnTile; ++i) {
    const int64_t r = KeyRow(seg, dm.s, tb.pages_flat, dm.pt, dm.p, dm.l, tile * kAttnTile + i);
    out->row[i] = r;
    if (r < 0) continue;
    any = true;
    const KV* kr = k_pool + (r * dm.k + kvh) * dm.h;
    const KV* vr = v_pool + (r * dm.k + kvh) * dm.h;
    float* kt = out->k.data() + i * dm.hp();
    for (int64_t d = 0; d < dm.h; ++d) kt[LaneMajor(d)] = ToF32(kr[d]);
    for (int64_t d = 0; d < dm.h; ++d) out->v[i * dm.h + d] = ToF32(vr[d]);
  }
  return any;
}

// Running softmax state of one (query, head): acc [h], max m, sum l (l == 0: nothing seen).
struct RowState {
  float* acc;
  float m, l;
};

// One tile's partial for one (query, head), merged into st. vis lists the visible tile indices
// in increasing position; e and acct are scratch [kAttnTile] and [h]. Compiled for AVX2 too:
// the same IEEE operations in the same order, so the bits do not depend on the clone.
__attribute__((target_clones("avx2", "default"))) void TileStep(
    const float* qt, const Tile& tile, const int* vis, int nvis, const Dims& dm, float scale,
    float* e, float* acct, RowState* st) {
  float mt = 0.0f;
  for (int j = 0; j < nvis; ++j) {
    const float s = LaneMajorDot(qt, tile.k.data() + vis[j] * dm.hp(), dm.hp()) * scale;
    e[j] = s;
    mt = j == 0 || mt < s ? s : mt;
  }
  float lt = 0.0f;
  for (int j = 0; j < nvis; ++j) {
    e[j] = expf(e[j] - mt);
    lt = lt + e[j];
  }
  for (int64_t d0 = 0; d0 < dm.h; d0 += kBlock) {
    const int n = static_cast<int>(std::min<int64_t>(kBlock, dm.h - d0));
    WeightedSum(e, tile.v.data() + d0, vis, nvis, dm.h, n, acct + d0);
  }
  if (st->l == 0.0f) {  // first non-empty tile
    st->m = mt, st->l = lt;
    std::copy(acct, acct + dm.h, st->acc);
    return;
  }
  const MergeWeights mw = MergeFactors(st->m, mt);
  st->m = mw.m;
  st->l = Merged(st->l, mw.a, lt, mw.b);
  for (int64_t d = 0; d < dm.h; ++d) st->acc[d] = Merged(st->acc[d], mw.a, acct[d], mw.b);
}

// Attention for the queries ts (all of chain `chain`) and the G query heads of kv head kvh.
template <typename Q, typename KV>
void AttendBlock(const Q* q, const KV* k_pool, const KV* v_pool, const Dims& dm,
                 const Tables& tb, float scale, int32_t window, const int32_t* ts, int nq,
                 int64_t chain, int64_t kvh, Q* out) {
  const int64_t g = dm.g(), h = dm.h, hp = dm.hp(), rows = nq * g;
  std::vector<float> qt(rows * hp, 0.0f), acc(rows * h, 0.0f), acct(h), e(kAttnTile);
  std::vector<RowState> st(rows);
  int64_t first = 0, last = -1;
  for (int i = 0; i < nq; ++i) {
    const int64_t pos = tb.positions[ts[i]];
    first = i == 0 ? FirstTile(pos, window) : std::min(first, FirstTile(pos, window));
    last = std::max(last, LastTile(pos));
    for (int64_t gi = 0; gi < g; ++gi) {
      const Q* qr = q + (ts[i] * dm.n + kvh * g + gi) * h;
      for (int64_t d = 0; d < h; ++d) qt[(i * g + gi) * hp + LaneMajor(d)] = ToF32(qr[d]);
      st[i * g + gi] = {acc.data() + (i * g + gi) * h, 0.0f, 0.0f};
    }
  }
  Tile tile{std::vector<float>(kAttnTile * hp, 0.0f), std::vector<float>(kAttnTile * h), {}};
  int vis[kAttnTile];
  for (int64_t j = first; j <= last; ++j) {
    if (!GatherTile(k_pool, v_pool, dm, tb, chain, kvh, j, &tile)) continue;
    for (int i = 0; i < nq; ++i) {
      const int64_t pos = tb.positions[ts[i]];
      int nvis = 0;
      for (int x = 0; x < kAttnTile; ++x) {
        if (tile.row[x] >= 0 && KeyVisible(j * kAttnTile + x, pos, window)) vis[nvis++] = x;
      }
      if (nvis == 0) continue;
      for (int64_t gi = 0; gi < g; ++gi) {
        TileStep(qt.data() + (i * g + gi) * hp, tile, vis, nvis, dm, scale, e.data(),
                 acct.data(), &st[i * g + gi]);
      }
    }
  }
  for (int i = 0; i < nq; ++i) {
    for (int64_t gi = 0; gi < g; ++gi) {
      const RowState& s = st[i * g + gi];
      Q* o = out + (ts[i] * dm.n + kvh * g + gi) * h;
      for (int64_t d = 0; d < h; ++d) FromF32(Normalised(s.acc[d], s.l), o + d);
    }
  }
}

template <typename Q, typename KV>
void Run(ffi::ThreadPool& pool, const Q* q, const KV* k_new, const KV* v_new, const Dims& dm,
         const Tables& tb, float scale, int32_t window, Q* out, KV* k_pool, KV* v_pool) {
  if (k_new != nullptr) WriteNewRows(k_new, v_new, dm, tb.slot, k_pool, v_pool);  // then attend
  const Q zero = Q();  // +0 in either storage format
  std::fill(out, out + dm.t * dm.n * dm.h, zero);
  const auto blocks = ChainQueryBlocks(dm, tb, kQueryBlock);
  const int64_t items = static_cast<int64_t>(blocks.size()) * dm.k;
  ParallelFor(pool, items, [&](int64_t it) {
    const auto& [chain, ts] = blocks[it / dm.k];
    AttendBlock(q, k_pool, v_pool, dm, tb, scale, window, ts.data(),
                static_cast<int>(ts.size()), chain, it % dm.k, out);
  });
}

ffi::Error TreeAttentionCpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_new,
                            ffi::AnyBuffer v_new, ffi::AnyBuffer k_pages, ffi::AnyBuffer v_pages,
                            ffi::BufferR1<ffi::S32> slot, ffi::BufferR1<ffi::S32> positions,
                            ffi::BufferR1<ffi::S32> chain_of, ffi::BufferR3<ffi::S32> segs,
                            ffi::BufferR1<ffi::S32> pages_flat, ffi::Result<ffi::AnyBuffer> out,
                            ffi::Result<ffi::AnyBuffer> k_out, ffi::Result<ffi::AnyBuffer> v_out,
                            ffi::Result<ffi::BufferR1<ffi::F32>> /*workspace: CUDA's only*/,
                            float scale, int32_t window) {
  Dims dm;
  if (auto e = CheckTreeAttentionShapes(q, k_new, v_new, k_pages, v_pages, slot.dimensions()[0],
                           positions.dimensions()[0], chain_of.dimensions()[0],
                           segs.dimensions(), pages_flat.dimensions()[0], &dm);
      e.failure()) {
    return e;
  }
  CopyUnlessAliased(k_pages, k_out);
  CopyUnlessAliased(v_pages, v_out);
  const Tables tb{slot.typed_data(), positions.typed_data(), chain_of.typed_data(),
                  segs.typed_data(), pages_flat.typed_data()};
  auto run = [&](auto* qp, auto* kvp) {
    using Q = std::remove_const_t<std::remove_pointer_t<decltype(qp)>>;
    using KV = std::remove_const_t<std::remove_pointer_t<decltype(kvp)>>;
    const bool write = WritesNewRows(k_new);  // else qkv_rope stored them
    Run(pool, qp, write ? k_new.reinterpret_data<KV>() : nullptr,
        write ? v_new.reinterpret_data<KV>() : nullptr, dm, tb, scale, window,
        out->reinterpret_data<Q>(), k_out->reinterpret_data<KV>(), v_out->reinterpret_data<KV>());
  };
  const bool q32 = q.element_type() == ffi::DataType::F32;
  const bool kv32 = k_pages.element_type() == ffi::DataType::F32;
  if (q32 && kv32) run(q.reinterpret_data<float>(), static_cast<float*>(nullptr));
  if (q32 && !kv32) run(q.reinterpret_data<float>(), static_cast<uint16_t*>(nullptr));
  if (!q32 && kv32) run(q.reinterpret_data<uint16_t>(), static_cast<float*>(nullptr));
  if (!q32 && !kv32) run(q.reinterpret_data<uint16_t>(), static_cast<uint16_t*>(nullptr));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismTreeAttentionCpu, prism::TreeAttentionCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()            // q [T, N, H]
                                  .Arg<ffi::AnyBuffer>()            // k_new [T, K, H]
                                  .Arg<ffi::AnyBuffer>()            // v_new [T, K, H]
                                  .Arg<ffi::AnyBuffer>()            // k_pages [P, L, K, H]
                                  .Arg<ffi::AnyBuffer>()            // v_pages [P, L, K, H]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // slot [T]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // positions [T]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // chain_of [T]
                                  .Arg<ffi::BufferR3<ffi::S32>>()  // chain_segments [C, S, 3]
                                  .Arg<ffi::BufferR1<ffi::S32>>()  // pages_flat [Pt]
                                  .Ret<ffi::AnyBuffer>()            // out [T, N, H] q's dtype
                                  .Ret<ffi::AnyBuffer>()            // k_pages (aliased)
                                  .Ret<ffi::AnyBuffer>()            // v_pages (aliased)
                                  .Ret<ffi::BufferR1<ffi::F32>>()  // workspace (CUDA split)
                                  .Attr<float>("scale")
                                  .Attr<int32_t>("window"));
