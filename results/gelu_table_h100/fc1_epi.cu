// Experiment: where fc1's erf-GELU epilogue time goes (CUTLASS sm90, bf16, 128x128x64 tiles).
// Variants: epilogue {bias+gelu, bias, gelu, plain, cheap act with bias} x {cooperative, pingpong},
// and the transposed product (D^T = w x^T, D column-major) whose bias is per row (registers, no smem).
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "gelu.h"
#include "gelu_table_evt.cuh"
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <type_traits>

using namespace cute;
using Bf16 = cutlass::bfloat16_t;

template <class T> struct Gelu {
    CUTLASS_HOST_DEVICE T operator()(T const &v) const {
#ifdef __CUDA_ARCH__
        return T(gelu_value<GELU_ERF, true>(round_bf16(float(v))));
#else
        return v;
#endif
    }
};
template <class T, int N> struct Gelu<cutlass::Array<T, N>> {
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
#else
        y = v;
#endif
        return y;
    }
};
template <class T> struct Cheap {
    CUTLASS_HOST_DEVICE T operator()(T const &v) const { return v * T(0.5f); }
};
template <class T, int N> struct Cheap<cutlass::Array<T, N>> {
    CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const &v) const {
        cutlass::Array<T, N> y;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; i++) y[i] = v[i] * T(0.5f);
        return y;
    }
};

using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;
struct Coop {
    using Kernel = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
    using Epilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
};
struct Ping {
    using Kernel = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
    using Epilogue = cutlass::epilogue::TmaWarpSpecialized;
};

template <class LayoutA, class LayoutB, class LayoutD, class FusionOp, class Sched, class EC = void, class ED = Bf16,
          class Tile = TileShape>
struct G {
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, ClusterShape,
        cutlass::epilogue::collective::EpilogueTileAuto, float, float, EC, LayoutD,
        std::is_void<EC>::value ? 8 : 16 / (int)sizeof(std::conditional_t<std::is_void<EC>::value, char, EC>),
        ED, LayoutD, 16 / (int)sizeof(ED), typename Sched::Epilogue, FusionOp>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA, 8, Bf16, LayoutB, 8, float, Tile,
        ClusterShape,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        typename Sched::Kernel>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

namespace fu = cutlass::epilogue::fusion;
using RM = cutlass::layout::RowMajor;
using CM = cutlass::layout::ColumnMajor;
using BiasGelu = fu::LinCombPerColBiasEltAct<Gelu, Bf16, float, Bf16>;
using BiasOnly = fu::LinCombPerColBias<Bf16, float, Bf16>;
using GeluOnly = fu::LinCombEltAct<Gelu, Bf16, float>;
using Plain = fu::LinearCombination<Bf16, float>;
using BiasCheap = fu::LinCombPerColBiasEltAct<Cheap, Bf16, float, Bf16>;
using RowBiasGelu = fu::LinCombPerRowBiasEltAct<Gelu, Bf16, float, Bf16>;
using RowBiasOnly = fu::LinCombPerRowBias<Bf16, float, Bf16>;
using TableEvt = GeluTableBiasEvt<TileShape, 8>;
static uint16_t *g_table;
using Residual = fu::LinCombPerColBias<float, float, Bf16, float>;
using RowResidual = fu::LinCombPerRowBias<float, float, Bf16, float>;

static int g_sms;

// D (n, m) = x (n, k) w^T (+ b): A = x RowMajor, B = w (m, k) "ColumnMajor", D RowMajor.
template <class Gm, bool HasBias, class TD = Bf16>
float time_fwd(const Bf16 *x, const Bf16 *w, const Bf16 *b, TD *y, int n, int k, int m, const TD *c = nullptr) {
    typename Gm::Arguments args;
    using K = typename Gm::GemmKernel;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {n, m, k, 1};
    args.mainloop.ptr_A = x;
    args.mainloop.dA = cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, k, 1});
    args.mainloop.ptr_B = w;
    args.mainloop.dB = cutlass::make_cute_packed_stride(typename K::StrideB{}, {m, k, 1});
    args.epilogue.ptr_C = c;
    args.epilogue.dC = cutlass::make_cute_packed_stride(typename K::StrideC{}, {n, m, 1});
    args.epilogue.ptr_D = y;
    args.epilogue.dD = cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, m, 1});
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = c ? 1.0f : 0.0f;
    if constexpr (HasBias) args.epilogue.thread.bias_ptr = b;
    args.hw_info.sm_count = g_sms;
    Gm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
    void *ws = nullptr;
    size_t wsz = Gm::get_workspace_size(args);
    if (wsz) cudaMalloc(&ws, wsz);
    if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) return -2;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int i = 0; i < 3; i++) gemm.run();
    for (int r = 0; r < 15; r++) {
        cudaEventRecord(e0);
        for (int i = 0; i < 10; i++) gemm.run();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms / 10);
    }
    if (ws) cudaFree(ws);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { printf("cuda error %s\n", cudaGetErrorString(e)); exit(1); }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

// The transposed product: D^T (m, n) = w (m, k) x^T, D^T column-major = D (n, m) row-major;
// the bias is then per row of D^T.
template <class Gm, bool HasBias, class TD = Bf16>
float time_fwd_t(const Bf16 *x, const Bf16 *w, const Bf16 *b, TD *y, int n, int k, int m, const TD *c = nullptr) {
    typename Gm::Arguments args;
    using K = typename Gm::GemmKernel;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {m, n, k, 1};
    args.mainloop.ptr_A = w;
    args.mainloop.dA = cutlass::make_cute_packed_stride(typename K::StrideA{}, {m, k, 1});
    args.mainloop.ptr_B = x;
    args.mainloop.dB = cutlass::make_cute_packed_stride(typename K::StrideB{}, {n, k, 1});
    args.epilogue.ptr_C = c;
    args.epilogue.dC = cutlass::make_cute_packed_stride(typename K::StrideC{}, {m, n, 1});
    args.epilogue.ptr_D = y;
    args.epilogue.dD = cutlass::make_cute_packed_stride(typename K::StrideD{}, {m, n, 1});
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = c ? 1.0f : 0.0f;
    if constexpr (HasBias) args.epilogue.thread.bias_ptr = b;
    args.hw_info.sm_count = g_sms;
    Gm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
    void *ws = nullptr;
    size_t wsz = Gm::get_workspace_size(args);
    if (wsz) cudaMalloc(&ws, wsz);
    if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) return -2;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int i = 0; i < 3; i++) gemm.run();
    for (int r = 0; r < 15; r++) {
        cudaEventRecord(e0);
        for (int i = 0; i < 10; i++) gemm.run();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms / 10);
    }
    if (ws) cudaFree(ws);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { printf("cuda error %s\n", cudaGetErrorString(e)); exit(1); }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

template <class Gm>
float time_table(const Bf16 *x, const Bf16 *w, const Bf16 *b, Bf16 *y, int n, int k, int m) {
    typename Gm::Arguments args;
    using K = typename Gm::GemmKernel;
    args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
    args.problem_shape = {n, m, k, 1};
    args.mainloop.ptr_A = x;
    args.mainloop.dA = cutlass::make_cute_packed_stride(typename K::StrideA{}, {n, k, 1});
    args.mainloop.ptr_B = w;
    args.mainloop.dB = cutlass::make_cute_packed_stride(typename K::StrideB{}, {m, k, 1});
    args.epilogue.ptr_C = nullptr;
    args.epilogue.ptr_D = y;
    args.epilogue.dD = cutlass::make_cute_packed_stride(typename K::StrideD{}, {n, m, 1});
    args.epilogue.thread = {{{}, {b, Bf16(0), {}}, {}}, {g_table}};
    args.hw_info.sm_count = g_sms;
    Gm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return -1;
    if (gemm.initialize(args, nullptr) != cutlass::Status::kSuccess) return -2;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int i = 0; i < 3; i++) gemm.run();
    for (int r = 0; r < 15; r++) {
        cudaEventRecord(e0);
        for (int i = 0; i < 10; i++) gemm.run();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        ts.push_back(ms / 10);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { printf("cuda error %s\n", cudaGetErrorString(e)); exit(1); }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

__global__ void table_kernel(uint16_t *table) {
    const unsigned s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= GELU_TABLE_N) return;
    const unsigned bits = (s % GELU_TABLE_SPAN + GELU_TABLE_LO) | (s / GELU_TABLE_SPAN) << 15;
    table[s] = __bfloat16_as_ushort(__float2bfloat16_rn(gelu_value<GELU_ERF, true>(__uint_as_float(bits << 16))));
}

__global__ void fill(Bf16 *p, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15;
        p[i] = Bf16(((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f) * scale);
    }
}

// max |a - b| over n bf16 values, element (r, c) of a row-major against the same of b
__global__ void cmp(const Bf16 *a, const Bf16 *b, size_t n, unsigned *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (*reinterpret_cast<const unsigned short *>(a + i) != *reinterpret_cast<const unsigned short *>(b + i))
            atomicAdd(bad, 1u);
}

int main(int argc, char **argv) {
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    g_sms = p.multiProcessorCount;
    printf("%s, %d SMs\n", p.name, g_sms);
    cudaMalloc(&g_table, GELU_TABLE_N * 2);
    table_kernel<<<(GELU_TABLE_N + 255) / 256, 256>>>(g_table);
    struct S { const char *name; int n, k, m; } shapes[] = {
        {"gspn_t 14^2 fc1", 128 * 196, 384, 1536},
        {"gspn_b 14^2 fc1", 128 * 196, 512, 2048},
        {"gspn_b 7^2 fc1", 128 * 49, 1024, 4096},
        {"gspn_b 28^2 fc1", 128 * 784, 256, 1024},
    };
    for (auto &s : shapes) {
        Bf16 *x, *w, *b, *y, *y2;
        cudaMalloc(&x, (size_t)s.n * s.k * 2);
        cudaMalloc(&w, (size_t)s.m * s.k * 2);
        cudaMalloc(&b, (size_t)s.m * 2);
        cudaMalloc(&y, (size_t)s.n * s.m * 2);
        cudaMalloc(&y2, (size_t)s.n * s.m * 2);
        fill<<<1024, 256>>>(x, (size_t)s.n * s.k, 1, 1.0f);
        fill<<<1024, 256>>>(w, (size_t)s.m * s.k, 2, 0.08f);
        fill<<<64, 256>>>(b, (size_t)s.m, 3, 0.5f);
        double fl = 2.0 * s.n * s.k * s.m;
        auto row = [&](const char *v, float ms) {
            printf("%-18s %-34s %8.4f ms %7.1f TFLOP/s\n", s.name, v, ms, ms > 0 ? fl / ms / 1e9 : 0.0);
        };
        row("coop bias+gelu", time_fwd<G<RM, CM, RM, BiasGelu, Coop>::Gemm, true>(x, w, b, y, s.n, s.k, s.m));
        auto diff = [&](const char *v) {
            unsigned *bad;
            cudaMalloc(&bad, 4);
            cudaMemset(bad, 0, 4);
            cmp<<<1024, 256>>>(y, y2, (size_t)s.n * s.m, bad);
            unsigned hb;
            cudaMemcpy(&hb, bad, 4, cudaMemcpyDeviceToHost);
            printf("%-18s %s: %u of %zu values differ from coop bias+gelu\n", s.name, v, hb, (size_t)s.n * s.m);
            cudaFree(bad);
        };
        row("coop table", time_table<G<RM, CM, RM, TableEvt, Coop>::Gemm>(x, w, b, y2, s.n, s.k, s.m));
        diff("coop table");
        row("ping table", time_table<G<RM, CM, RM, TableEvt, Ping>::Gemm>(x, w, b, y2, s.n, s.k, s.m));
        diff("ping table");
        row("coop bias", time_fwd<G<RM, CM, RM, BiasOnly, Coop>::Gemm, true>(x, w, b, y2, s.n, s.k, s.m));
        row("coop gelu (no bias)", time_fwd<G<RM, CM, RM, GeluOnly, Coop>::Gemm, false>(x, w, b, y2, s.n, s.k, s.m));
        row("coop plain", time_fwd<G<RM, CM, RM, Plain, Coop>::Gemm, false>(x, w, b, y2, s.n, s.k, s.m));
        row("coop bias+x/2", time_fwd<G<RM, CM, RM, BiasCheap, Coop>::Gemm, true>(x, w, b, y2, s.n, s.k, s.m));
        row("ping bias+gelu", time_fwd<G<RM, CM, RM, BiasGelu, Ping>::Gemm, true>(x, w, b, y2, s.n, s.k, s.m));
        row("ping bias", time_fwd<G<RM, CM, RM, BiasOnly, Ping>::Gemm, true>(x, w, b, y2, s.n, s.k, s.m));
        row("ping gelu (no bias)", time_fwd<G<RM, CM, RM, GeluOnly, Ping>::Gemm, false>(x, w, b, y2, s.n, s.k, s.m));
        row("ping plain", time_fwd<G<RM, CM, RM, Plain, Ping>::Gemm, false>(x, w, b, y2, s.n, s.k, s.m));
        cudaFree(x); cudaFree(w); cudaFree(b); cudaFree(y); cudaFree(y2);
    }
    return 0;
}
