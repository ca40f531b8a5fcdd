// CUTLASS 3.x SM90 int8 GEMM with the contract's epilogue, as one template; the two
// int8_gemm_sm90_*.cu files instantiate it (one per output dtype, so they compile in parallel).
//
// Standard layout: D[M, N] = x[M, K] . w[N, K]^T, A = x (row-major), B = w (K-major), D row-major.
// Swapped layout (small M): D'[N, M] = w . x^T, A = w, B = x, D' column-major, which is y
// row-major; the big operand then fills the 128-row wgmma side and the few tokens the narrow one.
// Epilogue visitor tree, both layouts: Mul(Mul(float(acc), s_x), s_w), i.e. the contract's
// (acc * s_x[m]) * s_w[n] in fp32, the int32 -> fp32 conversion round-to-nearest (cvt.rn).
//
// Schedulers: the default persistent data-parallel one (one CTA owns an output tile's whole K),
// or CUTLASS's stream-K scheduler (kStreamK), which splits the last waves' tiles along K across
// CTAs so that a problem of fewer tiles than SMs (down and o at M = 256: 84 tiles on 132 SMs) or
// with a ragged last wave keeps every SM busy; Sm90Order::decomposition can make it run plain
// split-K or data-parallel instead. Split peers add their int32 partial accumulators in a workspace
// before the one epilogue; int32 addition is exact in any order, so CUTLASS's nondeterministic
// (lock-free order) reduction still gives the data-parallel kernel's bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cc/ops/int8_gemm_kernels.h"
#include "cc/ops/int8_gemm_sm90_barrier.cuh"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace prism {
namespace sm90 {

using namespace cute;  // NOLINT: CUTLASS's shape vocabulary (Shape, _128, ...)
namespace fusion = cutlass::epilogue::fusion;

template <class TileShape_, class ClusterShape_, class KernelSchedule_, class EpilogueSchedule_,
          bool kSwap_, bool kStreamK_ = false>
struct Config {
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  static constexpr bool kSwap = kSwap_;
  static constexpr bool kStreamK = kStreamK_;
  // void: CUTLASS's default (persistent, data-parallel) scheduler.
  using Scheduler = std::conditional_t<kStreamK_, cutlass::gemm::StreamKScheduler, void>;
};

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using Ping = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpiCoop = cutlass::epilogue::TmaWarpSpecializedCooperative;
using EpiPing = cutlass::epilogue::TmaWarpSpecialized;

using CfgCoop128x256 = Config<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Coop, EpiCoop, false>;
using CfgPing64x256 = Config<Shape<_64, _256, _128>, Shape<_2, _1, _1>, Ping, EpiPing, false>;
using CfgCoop128x128 = Config<Shape<_128, _128, _128>, Shape<_2, _1, _1>, Coop, EpiCoop, false>;
using CfgSwap128x64 = Config<Shape<_128, _64, _128>, Shape<_2, _1, _1>, Ping, EpiPing, true>;
// Stream-K runs only under the cooperative schedule in CUTLASS's SM90 kernels.
using CfgStreamK128x128 =
    Config<Shape<_128, _128, _128>, Shape<_2, _1, _1>, Coop, EpiCoop, false, true>;
using CfgStreamK128x256 =
    Config<Shape<_128, _256, _128>, Shape<_2, _1, _1>, Coop, EpiCoop, false, true>;
using CfgCoop128x192 = Config<Shape<_128, _192, _128>, Shape<_2, _1, _1>, Coop, EpiCoop, false>;
using CfgSwapPing64x32 = Config<Shape<_64, _32, _128>, Shape<_2, _1, _1>, Ping, EpiPing, true>;
using CfgSwapPing64x64 = Config<Shape<_64, _64, _128>, Shape<_2, _1, _1>, Ping, EpiPing, true>;

// The tile order (Sm90Order) as the persistent schedulers' arguments; 0 keeps the heuristic.
template <class SchedulerArgs>
void SetOrder(SchedulerArgs& args, Sm90Order order) {
  using Raster = std::remove_reference_t<decltype(args.raster_order)>;
  if (order.raster == 'm') args.raster_order = Raster::AlongM;
  if (order.raster == 'n') args.raster_order = Raster::AlongN;
  args.max_swizzle_size = order.swizzle;
}

template <class Cfg, class ElementD>
struct Gemm {
  using TileShape = typename Cfg::TileShape;
  static constexpr bool kSwap = Cfg::kSwap;
  using LayoutA = cutlass::layout::RowMajor;     // K-major
  using LayoutB = cutlass::layout::ColumnMajor;  // K-major
  using LayoutD = std::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  static constexpr int kAlignAB = 16;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  // Per token (s_x) and per weight row (s_w): a column vector of D when it is indexed by D's rows.
  using TokenScale = std::conditional_t<
      kSwap, fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>,
      fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>>>;
  using WeightScale = std::conditional_t<
      kSwap, fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, int64_t>>,
      fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, int64_t>>>;
  using AccTimesSx = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
      fusion::Sm90AccFetch, TokenScale>;
  using Epilogue = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::multiplies, ElementD, float, cutlass::FloatRoundStyle::round_to_nearest>,
      AccTimesSx, WeightScale>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, typename Cfg::ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, typename Cfg::EpilogueSchedule, Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, LayoutA, kAlignAB, int8_t,
      LayoutB, kAlignAB, int32_t, TileShape, typename Cfg::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, typename Cfg::Scheduler>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Adapter::Arguments MakeArgs(const int8_t* x, const float* sx, const int8_t* w,
                                              const float* sw, ElementD* y, int64_t m, int64_t k,
                                              int64_t n, Sm90Order order) {
    // GEMM rows/cols: (m, n) standard, (n, m) swapped; A is x or w accordingly.
    const int gm = static_cast<int>(kSwap ? n : m), gn = static_cast<int>(kSwap ? m : n);
    const int gk = static_cast<int>(k);
    const int8_t* a = kSwap ? w : x;
    const int8_t* b = kSwap ? x : w;
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    // Packed strides (the L mode, one batch, keeps 0): A and B K-major with leading dim K; D
    // row-major (leading dim gn) or, swapped, column-major (leading dim gm = N).
    StrideA stride_a{};
    StrideB stride_b{};
    StrideD stride_d{};
    get<0>(stride_a) = gk;
    get<0>(stride_b) = gk;
    if constexpr (kSwap) {
      get<1>(stride_d) = gm;
    } else {
      get<0>(stride_d) = gn;
    }

    typename Adapter::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {gm, gn, gk, 1},
        {a, stride_a, b, stride_b},
        {{}, nullptr, stride_d, y, stride_d}};
    // Visitor arguments: {{acc, s_x, mul}, s_w, mul}.
    args.epilogue.thread = {{{}, {sx}, {}}, {sw}, {}};
    args.hw_info.sm_count = SmCount();
    SetOrder(args.scheduler, order);
    if constexpr (Cfg::kStreamK) {
      // Int32 partials: any order of addition gives the same sum (see the file comment), so the
      // lock-free reduction costs no determinism. Heuristic: data-parallel waves, stream-K only
      // for the tiles a whole wave would leave ragged.
      using Scheduler = typename Kernel::TileScheduler;
      using Mode = typename Scheduler::DecompositionMode;
      args.scheduler.reduction_mode = Scheduler::ReductionMode::Nondeterministic;
      args.scheduler.decomposition_mode = Mode::Heuristic;
      switch (order.decomposition) {  // a bucket's or the benchmark override's choice
        case 's': args.scheduler.decomposition_mode = Mode::StreamK; break;
        case 'd': args.scheduler.decomposition_mode = Mode::DataParallel; break;
        case 'k':
          args.scheduler.splits = order.splits;
          args.scheduler.decomposition_mode = Mode::SplitK;
          break;
        default: break;
      }
    }
    return args;
  }

  // Bytes of workspace the call needs (0 for the data-parallel scheduler): stream-K's partial
  // accumulators and barriers, which depend on the shape and the SM count only.
  static size_t WorkspaceBytes(int64_t m, int64_t k, int64_t n, Sm90Order order) {
    return Adapter::get_workspace_size(
        MakeArgs(nullptr, nullptr, nullptr, nullptr, nullptr, m, k, n, order));
  }

  // workspace: WorkspaceBytes() bytes or more, owned by the caller (an XLA result, so the call
  // stays capturable in a command buffer); its barrier flags are zeroed by a kernel of ours, or
  // by CUTLASS's cudaMemsetAsync under PRISM_INT8_GEMM_BARRIER=memset.
  static cudaError_t Run(cudaStream_t stream, const int8_t* x, const float* sx, const int8_t* w,
                         const float* sw, ElementD* y, int64_t m, int64_t k, int64_t n,
                         void* workspace, size_t workspace_bytes, Sm90Order order) {
    typename Adapter::Arguments args = MakeArgs(x, sx, w, sw, y, m, k, n, order);
    Adapter gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorNotSupported;
    // Too little workspace (a forced kernel the caller did not size for): refuse before launch.
    if (Adapter::get_workspace_size(args) > workspace_bytes) return cudaErrorNotSupported;
    if constexpr (Cfg::kStreamK) {  // int8_gemm_sm90_barrier.cuh, unless ..._BARRIER=memset
      size_t offset = 0, bytes = 0;
      if (BarrierZeroedByKernel() && BarrierRegion<Kernel>(args, &offset, &bytes)) {
        return RunWithZeroedBarriers<Kernel, Adapter>(args, workspace, offset, bytes, stream);
      }
    }
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) {
      return cudaErrorNotSupported;
    }
    if (gemm.run(stream) != cutlass::Status::kSuccess) {
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? cudaErrorLaunchFailure : e;
    }
    return cudaGetLastError();
  }

  // Queried once per process: CUTLASS would otherwise ask the driver on every call.
  static int SmCount() {
    static const int count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(0);
    return count;
  }
};

}  // namespace sm90
}  // namespace prism
