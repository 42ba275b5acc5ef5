// CUDA: linear layers' GEMMs with epilogues that cuBLASLt lacks or runs slower
// (kernels/cuda/gemm_cutlass.h), through CUTLASS 3's sm_90 kernels (TMA loads, wgmma, a
// warp-specialized epilogue):
// - the erf GELU. cuBLASLt's GELU epilogues are the tanh form only, so without these an erf-GELU
//   MLP runs its GELU as a separate pass over the widest activation of the block: forward once
//   (pre -> y), backward once (dpre). Values are those of the unfused path, element by element:
//   the epilogue rounds the biased sum to the activation dtype before the GELU (pre as written),
//   and the backward rounds the product dy w before scaling it by gelu'(pre). GELU's formulas are
//   kernels/cuda/gelu.h's.
// - a bf16 product onto the fp32 residual stream (fp32 C and D), where cuBLASLt's kernel with the
//   same epilogue moved the stream more slowly.
#ifdef CGSPN_HAVE_CUTLASS
// CUTLASS first: its code says `Tensor` inside `using namespace cute`, which the project's
// ::Tensor (kernels/tensor.h) would make ambiguous.
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/util/packed_stride.hpp"
#endif
#include "gemm_cutlass.h"
#include "gelu.h"
#include <type_traits>

#ifdef CGSPN_HAVE_CUTLASS

namespace {

using namespace cute;
using Bf16 = cutlass::bfloat16_t;

// gelu(v) of v rounded to bf16 (the pre-activation as the unfused path stores it).
template <class T> struct GeluErfOfStored {
    CUTLASS_HOST_DEVICE T operator()(T const &v) const {
#ifdef __CUDA_ARCH__
        return T(gelu_value<GELU_ERF, true>(round_bf16(float(v))));
#else
        return v;
#endif
    }
};
// A fragment's values rounded in pairs (round_bf16_pair: one conversion on the ALU pipe for two).
template <class T, int N> struct GeluErfOfStored<cutlass::Array<T, N>> {
    CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &v) const {
        cutlass::Array<T, N> y;
#ifdef __CUDA_ARCH__
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i + 1 < N; i += 2) {
            float a = float(v[i]), b = float(v[i + 1]);
            round_bf16_pair(a, b);
            y[i] = T(gelu_value<GELU_ERF, true>(a));
            y[i + 1] = T(gelu_value<GELU_ERF, true>(b));
        }
        if (N % 2) y[N - 1] = GeluErfOfStored<T>{}(v[N - 1]);
#else
        y = v;
#endif
        return y;
    }
};

// d * gelu'(z): d, the product dy w, rounded to bf16 first (as the unfused path stores it).
template <class T> struct DGeluErfOfStored {
    CUTLASS_HOST_DEVICE T operator()(T const &d, T const &z) const {
#ifdef __CUDA_ARCH__
        return T(round_bf16(float(d)) * gelu_slope<GELU_ERF, true>(float(z)));
#else
        return d;
#endif
    }
};
template <class T, int N> struct DGeluErfOfStored<cutlass::Array<T, N>> {
    CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &d,
                                                       cutlass::Array<T, N> const &z) const {
        cutlass::Array<T, N> y;
#ifdef __CUDA_ARCH__
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i + 1 < N; i += 2) {   // d rounded in pairs, as GeluErfOfStored's v
            float a = float(d[i]), b = float(d[i + 1]);
            round_bf16_pair(a, b);
            y[i] = T(a * gelu_slope<GELU_ERF, true>(float(z[i])));
            y[i + 1] = T(b * gelu_slope<GELU_ERF, true>(float(z[i + 1])));
        }
        if (N % 2) y[N - 1] = DGeluErfOfStored<T>{}(d[N - 1], z[N - 1]);
#else
        y = d;
#endif
        return y;
    }
};

// One GEMM type per product: D (M, N) = A (M, K) B + epilogue, row-major A and D; B K-major
// (w (N, K) row-major: the forward) or N-major (w (K, N) row-major: the backward's dy w).
// 128 x 128 tiles, cooperative for the GELU epilogues: on gspn_t's MLPs (H100) the ping-pong
// schedule at 64 x 128 took 2.35 ms a batch-128 inference's fc1 + GELU where these took 1.77
// (cuBLASLt and the GELU pass: 1.95), at 128 x 128 1.81 against 1.54 (with the GELU's fit), and two
// load stages (two CTAs an SM) 2.22. The erf in the epilogue, not the loads, bounds these kernels
// at gspn_t's widths.
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;
constexpr int kAlign = 8;   // bf16 elements in 16 bytes: K and N multiples of 8

// Elements in 16 bytes (void, no tensor: kAlign).
template <class E> constexpr int elems16() {
    if constexpr (std::is_void<E>::value) return kAlign;
    else return 16 / (int)sizeof(E);
}

// The two warp-specialized schedules: both consumer warp groups on one 128 x 128 tile
// (cooperative), or each on its own, one's epilogue beside the other's products (ping-pong).
struct Cooperative {
    using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
    using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct PingPong {
    using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
    using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

// C (the source the epilogue adds; void: none) and D in their own types, 16-byte aligned rows.
template <class LayoutB, class FusionOp, class ElementC = void, class ElementD = Bf16,
          class Schedule = Cooperative>
struct EpilogueGemm {
    static constexpr int kAlignC = elems16<ElementC>();
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor,
        kAlignC, ElementD, cutlass::layout::RowMajor, elems16<ElementD>(), typename Schedule::Epilogue,
        FusionOp>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, cutlass::layout::RowMajor, kAlign, Bf16,
        LayoutB, kAlign, float, TileShape, ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
            sizeof(typename Epilogue::SharedStorage))>,
        typename Schedule::Kernel>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// y = gelu(pre), pre = x w^T + b: the aux output is pre, per-column (output feature) bias.
using FwdFusion = cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<
    cutlass::layout::RowMajor, GeluErfOfStored, Bf16, float, Bf16, Bf16>;
// dpre = (dy w) * gelu'(pre): pre read as aux.
using BwdFusion = cutlass::epilogue::fusion::LinCombDeEltAct<cutlass::layout::RowMajor, DGeluErfOfStored,
                                                             Bf16, float, Bf16>;
// y = gelu(x w^T + b) alone (pre not kept: inference, or an MLP that recomputes it).
using FwdNoAuxFusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<GeluErfOfStored, Bf16, float, Bf16>;
// y = res + (x w^T + b), res and y fp32 (a linear onto the fp32 residual stream). Ping-pong: gspn_t's
// 13 in inference 1.24 -> 1.16 ms against cooperative (H100).
using ResidualFusion = cutlass::epilogue::fusion::LinCombPerColBias<float, float, Bf16, float>;
using ResidualGemm = EpilogueGemm<cutlass::layout::ColumnMajor, ResidualFusion, float, float, PingPong>::Gemm;
using FwdGemm = EpilogueGemm<cutlass::layout::ColumnMajor, FwdFusion>::Gemm;   // B = w (N, K) row-major
using FwdNoAuxGemm = EpilogueGemm<cutlass::layout::ColumnMajor, FwdNoAuxFusion>::Gemm;
// The same on the ping-pong schedule, for K >= kPingPongMinK: there one warp group's products of a
// tile outlast the other's GELU epilogue. Per call in inference (H100): K = 768, 896 and 1024 (the
// 7^2 stages) 0.138 -> 0.132, 0.176 -> 0.162 and 0.208 -> 0.189 ms as the MLP; K = 384 to 512 (14^2)
// 0.182 -> 0.197, 0.238 -> 0.245 and 0.261 -> 0.266.
using FwdNoAuxPingPongGemm = EpilogueGemm<cutlass::layout::ColumnMajor, FwdNoAuxFusion, void, Bf16, PingPong>::Gemm;
constexpr int kPingPongMinK = 768;
using BwdGemm = EpilogueGemm<cutlass::layout::RowMajor, BwdFusion>::Gemm;      // B = w (K, N) row-major

// The kernels are built for sm_90a only (the Makefile): another GPU takes the unfused path.
bool device_is_sm90(Ctx *ctx) { return cuda_ctx_of(ctx)->cc == 90; }

template <class Gemm>
bool run(Ctx *ctx, typename Gemm::Arguments &args) {
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return false;
    const size_t ws = Gemm::get_workspace_size(args);
    void *workspace = ws ? cuda_scratch(ctx, ws) : nullptr;
    CG_CHECK(gemm.initialize(args, workspace, cuda_stream_of(ctx)) == cutlass::Status::kSuccess,
             "", "gemm_cutlass: CUTLASS could not initialize a GEMM it accepted");
    CG_CHECK(gemm.run(cuda_stream_of(ctx)) == cutlass::Status::kSuccess, "",
             "gemm_cutlass: CUTLASS GEMM launch failed");
    CUDA_CHECK_LAUNCH();
    return true;
}

bool aligned_rows(const void *p, int64_t ld) { return ((uintptr_t)p & 15u) == 0 && ld % kAlign == 0; }

// The forward's arguments: D (n, m) = x w^T + b (+ C), C the epilogue's source (its own dtype; NULL:
// none), y D in the GEMM's output dtype.
template <class Gemm>
typename Gemm::Arguments fwd_args(Ctx *ctx, const bf16 *x, const bf16 *w, const bf16 *b, const void *c, void *y,
                                  int n, int k, int m) {
    using StrideA = typename Gemm::GemmKernel::StrideA;
    using StrideB = typename Gemm::GemmKernel::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    typename Gemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {n, m, k, 1};
    args.mainloop.ptr_A = reinterpret_cast<const Bf16 *>(x);
    args.mainloop.dA = cutlass::make_cute_packed_stride(StrideA{}, {n, k, 1});
    args.mainloop.ptr_B = reinterpret_cast<const Bf16 *>(w);
    args.mainloop.dB = cutlass::make_cute_packed_stride(StrideB{}, {m, k, 1});
    args.epilogue.ptr_C = static_cast<decltype(args.epilogue.ptr_C)>(c);
    args.epilogue.dC = cutlass::make_cute_packed_stride(StrideC{}, {n, m, 1});
    args.epilogue.ptr_D = static_cast<decltype(args.epilogue.ptr_D)>(y);
    args.epilogue.dD = cutlass::make_cute_packed_stride(StrideD{}, {n, m, 1});
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = c ? 1.0f : 0.0f;
    args.epilogue.thread.bias_ptr = reinterpret_cast<const Bf16 *>(b);
    args.hw_info.sm_count = cuda_ctx_of(ctx)->sm_count;
    return args;
}

}  // namespace

bool cuda_gemm_gelu_erf_fwd(Ctx *ctx, const bf16 *x, const bf16 *w, const bf16 *b, bf16 *pre, bf16 *y,
                            int n, int k, int m) {
    if (!b || n <= 0 || !aligned_rows(x, k) || !aligned_rows(w, k) || !aligned_rows(y, m) ||
        (pre && !aligned_rows(pre, m)) || ((uintptr_t)b & 15u) != 0 || !device_is_sm90(ctx))
        return false;
    cuda_sanitize_mark_written(ctx, y, (size_t)n * m * sizeof(bf16));
    cuda_sanitize_mark_written(ctx, pre, pre ? (size_t)n * m * sizeof(bf16) : 0);
    if (!pre && k >= kPingPongMinK) {
        auto args = fwd_args<FwdNoAuxPingPongGemm>(ctx, x, w, b, nullptr, y, n, k, m);
        return run<FwdNoAuxPingPongGemm>(ctx, args);
    }
    if (!pre) {
        auto args = fwd_args<FwdNoAuxGemm>(ctx, x, w, b, nullptr, y, n, k, m);
        return run<FwdNoAuxGemm>(ctx, args);
    }
    auto args = fwd_args<FwdGemm>(ctx, x, w, b, nullptr, y, n, k, m);
    args.epilogue.thread.aux_ptr = reinterpret_cast<Bf16 *>(pre);
    args.epilogue.thread.dAux = cutlass::make_cute_packed_stride(typename FwdGemm::GemmKernel::StrideD{}, {n, m, 1});
    return run<FwdGemm>(ctx, args);
}

bool cuda_gemm_residual_fwd(Ctx *ctx, const bf16 *x, const bf16 *w, const bf16 *b, const float *res,
                            float *y, int n, int k, int m) {
    if (!b || n <= 0 || !aligned_rows(x, k) || !aligned_rows(w, k) || !aligned_rows(y, m) ||
        !aligned_rows(res, m) || ((uintptr_t)b & 15u) != 0 || !device_is_sm90(ctx))
        return false;
    cuda_sanitize_mark_written(ctx, y, (size_t)n * m * sizeof(float));
    auto args = fwd_args<ResidualGemm>(ctx, x, w, b, res, y, n, k, m);
    return run<ResidualGemm>(ctx, args);
}

bool cuda_gemm_dgelu_erf_bwd(Ctx *ctx, const bf16 *dy, const bf16 *w, const bf16 *pre, bf16 *dpre,
                             int n, int m, int k) {
    if (n <= 0 || !aligned_rows(dy, m) || !aligned_rows(w, k) || !aligned_rows(pre, k) ||
        !aligned_rows(dpre, k) || !device_is_sm90(ctx))
        return false;
    cuda_sanitize_mark_written(ctx, dpre, (size_t)n * k * sizeof(bf16));
    using StrideA = typename BwdGemm::GemmKernel::StrideA;
    using StrideB = typename BwdGemm::GemmKernel::StrideB;
    using StrideD = typename BwdGemm::GemmKernel::StrideD;
    typename BwdGemm::Arguments args;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {n, k, m, 1};   // D (n, k) = dy (n, m) w (m, k)
    args.mainloop.ptr_A = reinterpret_cast<const Bf16 *>(dy);
    args.mainloop.dA = cutlass::make_cute_packed_stride(StrideA{}, {n, m, 1});
    args.mainloop.ptr_B = reinterpret_cast<const Bf16 *>(w);
    args.mainloop.dB = cutlass::make_cute_packed_stride(StrideB{}, {k, m, 1});
    args.epilogue.ptr_C = nullptr;
    args.epilogue.ptr_D = reinterpret_cast<Bf16 *>(dpre);
    args.epilogue.dD = cutlass::make_cute_packed_stride(StrideD{}, {n, k, 1});
    auto &fu = args.epilogue.thread;
    fu.alpha = 1.0f;
    fu.beta = 0.0f;
    fu.aux_ptr = reinterpret_cast<const Bf16 *>(pre);
    fu.dAux = cutlass::make_cute_packed_stride(StrideD{}, {n, k, 1});
    args.hw_info.sm_count = cuda_ctx_of(ctx)->sm_count;
    return run<BwdGemm>(ctx, args);
}

#else   // built without CUTLASS: the callers take their unfused paths

bool cuda_gemm_gelu_erf_fwd(Ctx *, const bf16 *, const bf16 *, const bf16 *, bf16 *, bf16 *, int, int,
                            int) {
    return false;
}
bool cuda_gemm_dgelu_erf_bwd(Ctx *, const bf16 *, const bf16 *, const bf16 *, bf16 *, int, int, int) {
    return false;
}
bool cuda_gemm_residual_fwd(Ctx *, const bf16 *, const bf16 *, const bf16 *, const float *, float *, int, int,
                            int) {
    return false;
}

#endif
