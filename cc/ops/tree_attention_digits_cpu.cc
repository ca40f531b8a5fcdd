// Tree attention in INT8 digits on the CPU (the specification of the CUDA kernels' bits):
//   prism_tree_attention_digits  arguments, layout and arithmetic in attention_digits.h.
// The step's k/v rows are cut into digits and packed into the pools first. Work: the queries
// of one chain in blocks of kQueryBlock (step order); a work item is (block, kv head). Each
// tile's packed keys and values are unpacked once per item and serve the block's G heads of
// every query. A query's arithmetic never depends on its block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/common.h"
#include "cc/cpu_parallel.h"
#include "cc/numerics.h"
#include "cc/ops/attention_digits.h"
#include "cc/ops/quantize_rows.h"
#include "cc/ops/tree_attention.h"
#include "cc/ops/tree_attention_host.h"

namespace prism {
namespace {

constexpr int kQueryBlock = 32;  // queries of one chain sharing each gathered tile

// Rows of H elements as two INT8 digits: c1, c2 [rows, H], s1, s2 [rows].
struct DigitRows {
  std::vector<int8_t> c1, c2;
  std::vector<float> s1, s2;
  DigitRows(int64_t rows, int64_t h) : c1(rows * h, 0), c2(rows * h, 0), s1(rows, 0), s2(rows, 0) {}
  // Row i from x (f32 or bf16) through QuantizeRowDigits; buf: scratch of 2 * H floats.
  template <typename T>
  void Set(int64_t i, const T* x, int64_t h, float* buf) {
    for (int64_t d = 0; d < h; ++d) buf[d] = ToF32(x[d]);
    QuantizeRowDigits(buf, h, buf + h, &c1[i * h], &s1[i], &c2[i * h], &s2[i]);
  }
  // Row i from a packed pool row (attention_digits.h), or zeros when packed is null.
  void Unpack(int64_t i, const int8_t* packed, int64_t h) {
    if (packed == nullptr) {
      std::fill(&c1[i * h], &c1[i * h] + h, int8_t{0});
      std::fill(&c2[i * h], &c2[i * h] + h, int8_t{0});
      s1[i] = s2[i] = 0.0f;
      return;
    }
    std::memcpy(&c1[i * h], packed, h);
    std::memcpy(&c2[i * h], packed + h, h);
    std::memcpy(&s1[i], packed + PackedScaleOffset(h), sizeof(float));
    std::memcpy(&s2[i], packed + PackedScaleOffset(h) + sizeof(float), sizeof(float));
  }
};

// The step's k/v rows, cut into digits, to pool row slot[t] (packed); other slots: nothing.
template <typename T>
void WriteDigitRows(const T* k_new, const T* v_new, const Dims& dm, const int32_t* slot,
                    int8_t* k_pool, int8_t* v_pool) {
  const int64_t h = dm.h, row = PackedRowBytes(h);
  std::vector<float> buf(2 * h);
  DigitRows one(1, h);
  for (int64_t t = 0; t < dm.t; ++t) {
    const int64_t sl = slot[t];
    if (sl < 0 || sl >= dm.p * dm.l) continue;
    for (int64_t kvh = 0; kvh < dm.k; ++kvh) {
      for (auto [src, pool] : {std::pair{k_new, k_pool}, std::pair{v_new, v_pool}}) {
        one.Set(0, src + (t * dm.k + kvh) * h, h, buf.data());
        int8_t* dst = pool + (sl * dm.k + kvh) * row;
        std::memset(dst, 0, row);
        std::memcpy(dst, one.c1.data(), h);
        std::memcpy(dst + h, one.c2.data(), h);
        std::memcpy(dst + PackedScaleOffset(h), &one.s1[0], sizeof(float));
        std::memcpy(dst + PackedScaleOffset(h) + sizeof(float), &one.s2[0], sizeof(float));
      }
    }
  }
}

inline int32_t IntDot(const int8_t* a, const int8_t* b, int64_t n) {
  int32_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
  return s;
}

// One tile's keys and values for one kv head; row[i] < 0: position not in the chain (zeros).
struct DigitTile {
  DigitRows k, v;
  int64_t row[kAttnTile];
};

bool GatherDigitTile(const int8_t* k_pool, const int8_t* v_pool, const Dims& dm,
                     const Tables& tb, int64_t chain, int64_t kvh, int64_t tile,
                     DigitTile* out) {
  const int32_t* seg = tb.segs + chain * dm.s * kSegFields;
  const int64_t row = PackedRowBytes(dm.h);
  bool any = false;
  for (int i = 0; i < kAttnTile; ++i) {
    const int64_t r = KeyRow(seg, dm.s, tb.pages_flat, dm.pt, dm.p, dm.l, tile * kAttnTile + i);
    out->row[i] = r;
    any = any || r >= 0;
    out->k.Unpack(i, r < 0 ? nullptr : k_pool + (r * dm.k + kvh) * row, dm.h);
    out->v.Unpack(i, r < 0 ? nullptr : v_pool + (r * dm.k + kvh) * row, dm.h);
  }
  return any;
}

// Running state of one query row: acc [H], max m, sum l (l == 0: nothing seen yet).
struct RowState {
  float* acc;
  float m, l;
};

// Scratch of one tile step.
struct StepScratch {
  std::vector<float> s, acct;
  std::vector<int32_t> w1, w2;
  explicit StepScratch(int64_t h) : s(kAttnTile), acct(h), w1(kAttnTile), w2(kAttnTile) {}
};

// Tile partial of query row qi (digits of qd) over the visible keys vis[0, nvis) (increasing),
// merged into st (attention_digits.h, steps 2-4).
void DigitTileStep(const DigitRows& qd, int64_t qi, const DigitTile& tile, const int* vis,
                   int nvis, const Dims& dm, float scale, StepScratch* sc, RowState* st) {
  const int64_t h = dm.h;
  const int8_t *q1 = &qd.c1[qi * h], *q2 = &qd.c2[qi * h];
  float mt = 0.0f;
  for (int j = 0; j < nvis; ++j) {
    const int64_t x = vis[j];
    const int8_t *k1 = &tile.k.c1[x * h], *k2 = &tile.k.c2[x * h];
    const float s = DigitScore(IntDot(q1, k1, h), IntDot(q1, k2, h), IntDot(q2, k1, h),
                               qd.s1[qi], qd.s2[qi], tile.k.s1[x], tile.k.s2[x], scale);
    sc->s[j] = s;
    mt = j == 0 || mt < s ? s : mt;
  }
  int32_t fixed = 0;
  float w1max = 0.0f, w2max = 0.0f;
  for (int j = 0; j < nvis; ++j) {
    const float e = DigitExp(RnSub(sc->s[j], mt));
    sc->s[j] = e;
    fixed += FixedE(e);
    w1max = std::max(w1max, RnMul(e, tile.v.s1[vis[j]]));
    w2max = std::max(w2max, RnMul(e, tile.v.s2[vis[j]]));
  }
  const float lt = FixedESum(fixed);
  const FixedWeights f1 = FixedWeightsOf(w1max, kW1Max), f2 = FixedWeightsOf(w2max, kW2Max);
  for (int j = 0; j < nvis; ++j) {
    sc->w1[j] = FixedWeight(RnMul(sc->s[j], tile.v.s1[vis[j]]), f1, kW1Max);
    sc->w2[j] = FixedWeight(RnMul(sc->s[j], tile.v.s2[vis[j]]), f2, kW2Max);
  }
  for (int64_t d = 0; d < h; ++d) {
    int64_t j1 = 0, j2 = 0;
    for (int j = 0; j < nvis; ++j) {
      const int64_t x = vis[j];
      j1 += static_cast<int64_t>(sc->w1[j]) * tile.v.c1[x * h + d];
      j2 += static_cast<int64_t>(sc->w2[j]) * tile.v.c2[x * h + d];
    }
    sc->acct[d] = DigitAcc(j1, j2, f1.scale, f2.scale);
  }
  if (st->l == 0.0f) {  // first non-empty tile
    st->m = mt, st->l = lt;
    std::copy(sc->acct.begin(), sc->acct.end(), st->acc);
    return;
  }
  const DigitMerge mw = DigitMergeFactors(st->m, mt);
  st->m = mw.m;
  st->l = DigitMerged(st->l, mw.a, lt, mw.b);
  for (int64_t d = 0; d < h; ++d) st->acc[d] = DigitMerged(st->acc[d], mw.a, sc->acct[d], mw.b);
}

// Attention for the queries ts (all of chain `chain`) and the G query heads of kv head kvh.
template <typename Q>
void AttendBlock(const Q* q, const int8_t* k_pool, const int8_t* v_pool, const Dims& dm,
                 const Tables& tb, float scale, int32_t window, const int32_t* ts, int nq,
                 int64_t chain, int64_t kvh, Q* out) {
  const int64_t g = dm.g(), h = dm.h, rows = nq * g;
  std::vector<float> buf(2 * h), acc(rows * h, 0.0f);
  DigitRows qd(rows, h);
  std::vector<RowState> st(rows);
  int64_t first = 0, last = -1;
  for (int i = 0; i < nq; ++i) {
    const int64_t pos = tb.positions[ts[i]];
    first = i == 0 ? FirstTile(pos, window) : std::min(first, FirstTile(pos, window));
    last = std::max(last, LastTile(pos));
    for (int64_t gi = 0; gi < g; ++gi) {
      qd.Set(i * g + gi, q + (ts[i] * dm.n + kvh * g + gi) * h, h, buf.data());
      st[i * g + gi] = {acc.data() + (i * g + gi) * h, 0.0f, 0.0f};
    }
  }
  DigitTile tile{DigitRows(kAttnTile, h), DigitRows(kAttnTile, h), {}};
  StepScratch sc(h);
  int vis[kAttnTile];
  for (int64_t j = first; j <= last; ++j) {
    if (!GatherDigitTile(k_pool, v_pool, dm, tb, chain, kvh, j, &tile)) continue;
    for (int i = 0; i < nq; ++i) {
      const int64_t pos = tb.positions[ts[i]];
      int nvis = 0;
      for (int x = 0; x < kAttnTile; ++x) {
        if (tile.row[x] >= 0 && KeyVisible(j * kAttnTile + x, pos, window)) vis[nvis++] = x;
      }
      if (nvis == 0) continue;
      for (int64_t gi = 0; gi < g; ++gi) {
        DigitTileStep(qd, i * g + gi, tile, vis, nvis, dm, scale, &sc, &st[i * g + gi]);
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

template <typename Q>
void Run(ffi::ThreadPool& pool, const Q* q, const Q* k_new, const Q* v_new, const Dims& dm,
         const Tables& tb, float scale, int32_t window, Q* out, int8_t* k_pool, int8_t* v_pool) {
  WriteDigitRows(k_new, v_new, dm, tb.slot, k_pool, v_pool);  // first write, then attend
  std::fill(out, out + dm.t * dm.n * dm.h, Q());           // +0 in either storage format
  const auto blocks = ChainQueryBlocks(dm, tb, kQueryBlock);
  const int64_t items = static_cast<int64_t>(blocks.size()) * dm.k;
  ParallelFor(pool, items, [&](int64_t it) {
    const auto& [chain, ts] = blocks[it / dm.k];
    AttendBlock(q, k_pool, v_pool, dm, tb, scale, window, ts.data(),
                static_cast<int>(ts.size()), chain, it % dm.k, out);
  });
}

ffi::Error TreeAttentionDigitsCpu(ffi::ThreadPool pool, ffi::AnyBuffer q, ffi::AnyBuffer k_new,
                                  ffi::AnyBuffer v_new, ffi::AnyBuffer k_pages,
                                  ffi::AnyBuffer v_pages, ffi::BufferR1<ffi::S32> slot,
                                  ffi::BufferR1<ffi::S32> positions,
                                  ffi::BufferR1<ffi::S32> chain_of, ffi::BufferR3<ffi::S32> segs,
                                  ffi::BufferR1<ffi::S32> pages_flat,
                                  ffi::Result<ffi::AnyBuffer> out,
                                  ffi::Result<ffi::AnyBuffer> k_out,
                                  ffi::Result<ffi::AnyBuffer> v_out,
                                  ffi::Result<ffi::BufferR1<ffi::F32>> /*workspace: CUDA's only*/,
                                  float scale,
                                  int32_t window) {
  Dims dm;
  if (auto e = CheckDigitAttentionShapes(q, k_new, v_new, k_pages, v_pages, slot.dimensions()[0],
                                         positions.dimensions()[0], chain_of.dimensions()[0],
                                         segs.dimensions(), &dm);
      e.failure()) {
    return e;
  }
  dm.pt = pages_flat.dimensions()[0];
  CopyUnlessAliased(k_pages, k_out);
  CopyUnlessAliased(v_pages, v_out);
  const Tables tb{slot.typed_data(), positions.typed_data(), chain_of.typed_data(),
                  segs.typed_data(), pages_flat.typed_data()};
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    Run(pool, q.reinterpret_data<T>(), k_new.reinterpret_data<T>(), v_new.reinterpret_data<T>(),
        dm, tb, scale, window, out->reinterpret_data<T>(), k_out->reinterpret_data<int8_t>(),
        v_out->reinterpret_data<int8_t>());
  };
  if (q.element_type() == ffi::DataType::F32) {
    run(static_cast<float*>(nullptr));
  } else {
    run(static_cast<uint16_t*>(nullptr));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace prism

namespace ffi = xla::ffi;

XLA_FFI_DEFINE_HANDLER_SYMBOL(PrismTreeAttentionDigitsCpu, prism::TreeAttentionDigitsCpu,
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
