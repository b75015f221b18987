// The fused GELU GEMMs of kernels/gemm_gelu.cuh as CUTLASS 3 kernels for sm_90a: TMA loads, warpgroup
// MMAs (wgmma) with fp32 accumulators, a producer warp and two consumer warpgroups, persistent over the
// tiles, and a TMA-store epilogue whose visitor tree is CUTLASS's own (bias per column, auxiliary store
// or load) with our GELU / GELU' as the activation. The library's forward kinds give each consumer
// warpgroup its own tile, the two taking turns at the tensor cores so that one's epilogue runs beside
// the other's main loop (the "ping-pong" schedule: ForwardConfig); its backward has both share one tile
// (the "cooperative" schedule: DefaultConfig, SingleConfig).
// Included by the instantiation files of this folder and by kernels/dev/gemm_gelu_lab.cu (which
// instantiates other tile shapes through GemmGelu's Config parameter).
//
// Layouts (CUTLASS's M, N, K; every matrix row-major in memory, nn.Linear's W[m, k]):
//   forward:  M = n tokens, N = m, K = k; A = x [n, k] (K-major), B = W [m, k] (K-major: a TN GEMM);
//             D = y [n, m], Aux = u [n, m]; per-column bias b[m].
//   backward: M = n, N = k, K = m; A = dy [n, m] (K-major), B = W [m, k] (N-major: wgmma reads it
//             transposed from shared memory); D = du [n, k], Aux = u [n, k] (loaded); in the library's
//             configuration also the column sums of each CTA tile's du (CUTLASS's row-vector
//             reduction, its per-tile form: no atomics, the rows added by column_sum_finalize_chunks).
#ifndef DST_KERNELS_CUTLASS_GEMM_GELU_IMPL_CUH
#define DST_KERNELS_CUTLASS_GEMM_GELU_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

// The kernels as programmatic dependents (kernels/launch.cuh): CUTLASS's producer warps wait for the
// previous kernel (griddepcontrol.wait) before their first load of its output, and the consumers let
// the next kernel launch once they start their last tile. Without the launch attribute (DST_PDL=0,
// run() below) the wait returns at once and the kernels behave as before.
#ifndef CUTLASS_ENABLE_GDC_FOR_SM90
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#endif

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/dispatch.cuh"
#include "kernels/gelu_math.cuh"
#include "kernels/gemm_gelu.cuh"
#include "kernels/launch.cuh"

namespace dst {
namespace cuda {
namespace gemm_gelu {

// CUTLASS's element type of a CUDA storage type.
template <typename T>
using Elem = std::conditional_t<std::is_same_v<T, __half>, cutlass::half_t, cutlass::bfloat16_t>;

// The activations' runtime arguments (CUTLASS hands a compute functor's Arguments to every call):
// none, the form being the kernel's template parameter.
struct GeluArgs {};

// Epilogue functors in CUTLASS's form: a template on the value type, called on fragments
// (Array<float, N>) with the Arguments. The scalar form only names the Arguments type, which
// CUTLASS reads from Functor<ElementCompute>.
//
// The GELU's form F is a compile-time constant of a kernel (one kernel per form): the epilogue is
// unrolled over every element a thread holds (128 in each of the library's configurations), and a
// runtime choice of form put both forms' code there for each, which overflowed the instruction cache
// (the backward's warps stalled half their cycles on instruction fetch: bench/RESULTS.md).
//
// Forward: z = acc + bias in fp32; u = z rounded to T is what the auxiliary store writes, and the
// activation takes u as stored (rounded here the same way), so y = GELU(u) as gelu_fwd computes it.
template <typename T, dst_gelu F, typename V>
struct GeluAct {
    using Arguments = GeluArgs;
};
template <typename T, dst_gelu F, int N>
struct GeluAct<T, F, cutlass::Array<float, N>> {
    using Arguments = GeluArgs;
    CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const &z, Arguments const &) const {
        cutlass::Array<float, N> y;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) y[i] = gelu_value(to_compute(to_storage<T>(z[i])), F, true);
        return y;
    }
};
// Backward: dg = acc rounded to T (the value linear_bwd_data would store), u loaded from the auxiliary
// tensor (exact in fp32); du = dg·GELU'(u) as gelu_bwd's map computes it, returned rounded to T (so the
// column sums beside the store add the values stored; the store's own rounding then changes nothing).
template <typename T, dst_gelu F, typename V>
struct DGeluAct {
    using Arguments = GeluArgs;
};
template <typename T, dst_gelu F, int N>
struct DGeluAct<T, F, cutlass::Array<float, N>> {
    using Arguments = GeluArgs;
    CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const &acc,
                                                       cutlass::Array<float, N> const &u, Arguments const &) const {
        cutlass::Array<float, N> du;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i)
            du[i] = to_compute(to_storage<T>(to_compute(to_storage<T>(acc[i])) * gelu_grad(u[i], F, true)));
        return du;
    }
};
// The lab's stand-ins for the activations (Config's kMath 1): the same visitor trees with the least
// arithmetic, to tell the trees' own cost from the GELU's (kernels/dev/gemm_gelu_lab.cu).
template <typename V>
struct IdentityAct {
    using Arguments = GeluArgs;
};
template <int N>
struct IdentityAct<cutlass::Array<float, N>> {
    using Arguments = GeluArgs;
    CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const &z, Arguments const &) const {
        return z;
    }
};
template <typename V>
struct ProductAct {
    using Arguments = GeluArgs;
};
template <int N>
struct ProductAct<cutlass::Array<float, N>> {
    using Arguments = GeluArgs;
    CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const &acc,
                                                       cutlass::Array<float, N> const &u, Arguments const &) const {
        cutlass::Array<float, N> r;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < N; ++i) r[i] = acc[i] * u[i];
        return r;
    }
};

// A kernel configuration: CTA tile (M, N, K), thread block cluster, mainloop and epilogue schedules;
// kMath is the lab's (kernels/dev/gemm_gelu_lab.cu): 0 the GELUs, 1 the same visitor trees with the
// identity (forward) and a product (backward) in their place, 2 no visitor tree (D = acc: the GEMM alone);
// ColSums: the backward also writes du's per-tile column sums (the library's; kernels/gemm_gelu.cuh's
// dgelu_partial_* describe them for its 128×256 tile). EpiTile: the epilogue's subtile (CUTLASS's choice
// by default: 128×32 in the cooperative schedule, 64×32 in ping-pong); it changes how the tile's
// results reach memory, not what they are.
template <int TM, int TN, int TK, int CM, int CN, typename MainSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative,
          typename EpiSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative, int Math = 0, bool ColSums = false,
          typename EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct Config {
    static constexpr int kMath = Math;
    static constexpr bool kColSums = ColSums;
    using Tile = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::Int<TK>>;
    using Cluster = cute::Shape<cute::Int<CM>, cute::Int<CN>, cute::_1>;
    using Main = MainSchedule;
    using Epi = EpiSchedule;
    using EpiTileMN = EpiTile;
};
// The library's backward: 128×256×64 tiles in clusters of two along M (each B tile multicast to both
// blocks), the cooperative schedule (kernels/dev/gemm_gelu_lab.cu, bench/RESULTS.md).
using DefaultConfig = Config<128, 256, 64, 2, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                             cutlass::epilogue::TmaWarpSpecializedCooperative, 0, true>;
// The same tiles without a cluster, for the row counts where the pairs cost a round of tiles
// (gemm_gelu_unclustered): the same sums in the same order, so the same bits.
using SingleConfig = Config<128, 256, 64, 1, 1, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                            cutlass::epilogue::TmaWarpSpecializedCooperative, 0, true>;
// The library's forward kinds: 128×128×64 tiles, no cluster, the ping-pong schedule (the lab's
// variant 8: under sustained load 0.89× the cooperative kernels' time in the inference form, 0.98× with
// u stored; the same bits). The backward keeps the cooperative tiles: with the column sums in its
// epilogue, a ping-pong backward took 1.7× as long (bench/RESULTS.md, twenty-fourth session).
using ForwardConfig = Config<128, 128, 64, 1, 1, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                             cutlass::epilogue::TmaWarpSpecialized>;
static_assert(kDgeluPartialRows == 128 && kDgeluPartialColumns == 256,
              "kernels/gemm_gelu.cuh's partial-sum layout is the library's backward tile");

// The backward's fusion with the column sums: LinCombDeEltAct's tree (D = DAct(acc, aux)) under
// CUTLASS's row-vector reduction in its per-tile form (FinalReduction false: each CTA tile writes its
// fp32 column sums to row m_tile of the buffer, ld = the columns rounded up to the tile's N), the
// stored type's conversion at the root. A tag type: the FusionCallbacks specialisation below builds it.
template <class GmemLayoutTagAux, template <class> class ActivationFn, class E>
struct DeEltActColPartials : cutlass::epilogue::fusion::LinCombDeEltAct<GmemLayoutTagAux, ActivationFn, E, float, E, void> {};

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst

namespace cutlass {
namespace epilogue {
namespace fusion {

// The callbacks of gemm_gelu::DeEltActColPartials, as CUTLASS's own LinCombDeEltActDePerRowBias is built
// (sm90_callbacks_tma_warpspecialized.hpp) with the row-vector reduction (over M: one sum per column of
// D) in place of its column-vector one, and no final reduction.
template <class CtaTileShapeMNK, class EpilogueTile, int Stages, class StrideAux, class SmemLayoutAtom, class CopyOpS2R,
          template <class> class ActivationFn, class E>
using Sm90DeEltActColPartials =
    Sm90EVT<Sm90Compute<epilogue::thread::Identity, E, float, FloatRoundStyle::round_to_nearest>,  // to E
            Sm90EVT<Sm90RowReduction<plus, plus, plus, 0, CtaTileShapeMNK, float, float,
                                     FloatRoundStyle::round_to_nearest, cute::Stride<cute::_0, cute::_1, cute::_0>, 4,
                                     /*EnableNullptr=*/true, /*FinalReduction=*/false>,  // column sums, per tile
                    Sm90LinCombDeEltAct<CtaTileShapeMNK, EpilogueTile, Stages, StrideAux, SmemLayoutAtom, CopyOpS2R,
                                        ActivationFn, float, float, E, void, float>>>;  // DAct(acc, aux)

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class GmemLayoutTagAux,
          template <class> class ActivationFn, class E, class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom,
          class CopyOpS2R>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       ::dst::cuda::gemm_gelu::DeEltActColPartials<GmemLayoutTagAux, ActivationFn, E>, CtaTileShapeMNK,
                       EpilogueTile, SmemLayoutAtom, CopyOpS2R>
    : Sm90DeEltActColPartials<CtaTileShapeMNK, EpilogueTile, StagesC, cutlass::gemm::TagToStrideC_t<GmemLayoutTagAux>,
                              SmemLayoutAtom, CopyOpS2R, ActivationFn, E> {
    using Impl = Sm90DeEltActColPartials<CtaTileShapeMNK, EpilogueTile, StagesC,
                                         cutlass::gemm::TagToStrideC_t<GmemLayoutTagAux>, SmemLayoutAtom, CopyOpS2R,
                                         ActivationFn, E>;
    using Operation = ::dst::cuda::gemm_gelu::DeEltActColPartials<GmemLayoutTagAux, ActivationFn, E>;

    struct Arguments {
        float alpha = 1.0f;
        float beta = 0.0f;
        using StrideAlpha = cute::Stride<cute::_0, cute::_0, int64_t>;
        using StrideBeta = cute::Stride<cute::_0, cute::_0, int64_t>;
        StrideAlpha dAlpha = {cute::_0{}, cute::_0{}, 0};
        StrideBeta dBeta = {cute::_0{}, cute::_0{}, 0};
        using ActivationArguments =
            typename Sm90Compute<ActivationFn, float, float, FloatRoundStyle::round_to_nearest>::Arguments;
        ActivationArguments activation = ActivationArguments();
        using StrideAux = cutlass::gemm::TagToStrideC_t<GmemLayoutTagAux>;
        E const *aux_ptr = nullptr;
        StrideAux dAux = {};
        float *partial_ptr = nullptr;  // null: no sums (the reduction is skipped)

        operator typename Impl::Arguments() const {
            return {
                // unary op: convert to E
                {
                    // unary op: the column sums of the activation's output (passed on unchanged)
                    {
                        // binary op: activation(beta * C + alpha * acc, aux)
                        {
                            // ternary op: beta * C + alpha * acc
                            {{beta}, {nullptr}, {dBeta}},  // leaf: beta
                            {},                            // leaf: C
                            {
                                // binary op: alpha * acc
                                {{alpha}, {nullptr}, {dAlpha}},  // leaf: alpha
                                {},                              // leaf: acc
                                {}                               // multiplies
                            },
                            {}  // multiply_add
                        },
                        {aux_ptr, E(0), dAux},  // leaf: aux
                        activation              // activation
                    },
                    {partial_ptr, 0.0f, {}}  // the reduction
                },
                {}  // identity
            };
        }
    };

    using Impl::Impl;
};

}  // namespace fusion
}  // namespace epilogue
}  // namespace cutlass

namespace dst {
namespace cuda {
namespace gemm_gelu {

// The GEMM of one kind (kernels/gemm_gelu.cuh's GemmGeluKind) for storage type T, a configuration and
// the GELU's form.
template <typename T, int kKind, typename Cfg = DefaultConfig, dst_gelu Form = DST_GELU_ERF>
struct GemmGelu {
    static constexpr bool kBwd = kKind == kGeluBackward;
    using E = Elem<T>;
    static constexpr int kAlign = 8;  // 16 bytes of a 16-bit type
    using LayoutA = cutlass::layout::RowMajor;
    using LayoutB = std::conditional_t<kBwd, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
    using LayoutD = cutlass::layout::RowMajor;
    static constexpr int kMath = Cfg::kMath;
    template <typename V>
    using Act = std::conditional_t<kMath == 1, IdentityAct<V>, GeluAct<T, Form, V>>;
    template <typename V>
    using DAct = std::conditional_t<kMath == 1, ProductAct<V>, DGeluAct<T, Form, V>>;
    static constexpr bool kColSums = kBwd && Cfg::kColSums && kMath != 2;
    // No C operand (void source): D = f(acc, …) only.
    using Fusion = std::conditional_t<
        kMath == 2, cutlass::epilogue::fusion::LinearCombination<E, float, void, float>,
        std::conditional_t<
        kBwd,
        std::conditional_t<kColSums, DeEltActColPartials<LayoutD, DAct, E>,
                           cutlass::epilogue::fusion::LinCombDeEltAct<LayoutD, DAct, E, float, E, void>>,
        std::conditional_t<kKind == kGeluForwardAux,
                           cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<LayoutD, Act, E, float, E, E, void>,
                           cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Act, E, float, E, void>>>>;
    using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Cfg::Tile, typename Cfg::Cluster,
        typename Cfg::EpiTileMN, float, float, void, LayoutD, kAlign, E, LayoutD, kAlign,
        typename Cfg::Epi, Fusion>::CollectiveOp;
    using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
        cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, LayoutA, kAlign, E, LayoutB, kAlign, float,
        typename Cfg::Tile, typename Cfg::Cluster,
        cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
        typename Cfg::Main>::CollectiveOp;
    using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;
    using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

    // CUTLASS's problem (M, N, K) of a call: forward (n, m, k), backward (n, k, m).
    static typename Gemm::Arguments arguments(const void *a, const void *w, const void *bias, void *d, void *aux,
                                              float *partial, int M, int N, int K, int sm_count) {
        using SA = typename Kernel::StrideA;
        using SB = typename Kernel::StrideB;
        using SD = typename Kernel::StrideD;
        const SD sd = cutlass::make_cute_packed_stride(SD{}, cute::make_shape(M, N, 1));
        typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                      {M, N, K, 1},
                                      {static_cast<const E *>(a), cutlass::make_cute_packed_stride(SA{}, cute::make_shape(M, K, 1)),
                                       static_cast<const E *>(w), cutlass::make_cute_packed_stride(SB{}, cute::make_shape(N, K, 1))},
                                      {{}, nullptr, {}, static_cast<E *>(d), sd}};
        if constexpr (kMath == 2) {
            (void)bias, (void)aux;
            args.epilogue.thread.alpha = 1.0f;
            args.epilogue.thread.beta = 0.0f;
        } else if constexpr (kBwd) {
            args.epilogue.thread.aux_ptr = static_cast<const E *>(aux);
            args.epilogue.thread.dAux = sd;
            if constexpr (kColSums) args.epilogue.thread.partial_ptr = partial;
        } else {
            args.epilogue.thread.bias_ptr = static_cast<const E *>(bias);
            if constexpr (kKind == kGeluForwardAux) {
                args.epilogue.thread.aux_ptr = static_cast<E *>(aux);
                args.epilogue.thread.dAux = sd;
            } else {
                (void)aux;
            }
        }
        args.hw_info.sm_count = sm_count;
        return args;
    }

    // Whether CUTLASS can run the problem (M, N, K) with these kernels and no workspace: host code,
    // arguments with stand-in 16-byte aligned pointers.
    static bool implementable(int M, int N, int K) {
        void *p = reinterpret_cast<void *>(uintptr_t(1) << 20);
        const typename Gemm::Arguments args = arguments(p, p, p, p, p, static_cast<float *>(p), M, N, K, 1);
        return Gemm::can_implement(args) == cutlass::Status::kSuccess && Gemm::get_workspace_size(args) == 0;
    }

    // Runs the GEMM on the stream. The kernels need no workspace with these schedules; a configuration
    // that asks for one (or that CUTLASS cannot run on this problem) is refused, never run half-set.
    static cudaError_t run(cudaStream_t stream, const void *a, const void *w, const void *bias, void *d, void *aux,
                           float *partial, int M, int N, int K, dst_gelu form, int sm_count) {
        if (kMath == 0 && form != Form) return cudaErrorInvalidValue;
        if (partial && !kColSums) return cudaErrorInvalidValue;  // a configuration without the sums
        const typename Gemm::Arguments args = arguments(a, w, bias, d, aux, partial, M, N, K, sm_count);
        if (Gemm::get_workspace_size(args) != 0) return cudaErrorInvalidValue;
        Gemm gemm;
        if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
        if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) {
            const cudaError_t e = cudaGetLastError();
            return e != cudaSuccess ? e : cudaErrorInvalidValue;
        }
        if (gemm.run(stream, nullptr, dependent_launch_enabled()) != cutlass::Status::kSuccess) {
            const cudaError_t e = cudaGetLastError();
            return e != cudaSuccess ? e : cudaErrorLaunchFailure;
        }
        return cudaGetLastError();
    }
};

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst

namespace dst {
namespace cuda {
namespace gemm_gelu {

// The launchers of kernels/gemm_gelu.cuh in the layer's terms (forward: n tokens, k inputs, m outputs;
// the backward's du is [n, k]) for type T and configuration Cfg: the kernel of the call's form, both
// forms when kTanh (the library), else the erf form only (the lab; the tanh form is refused).
template <typename T, typename Cfg, bool kTanh, dst_gelu F = DST_GELU_ERF>
cudaError_t launch_fwd(cudaStream_t stream, dst_gelu form, const void *x, const void *w, const void *b, void *y,
                       void *u, int64_t n, int64_t k, int64_t m, int sm_count) {
    if constexpr (kTanh && F == DST_GELU_ERF)
        if (form == DST_GELU_TANH)
            return launch_fwd<T, Cfg, kTanh, DST_GELU_TANH>(stream, form, x, w, b, y, u, n, k, m, sm_count);
    return u ? GemmGelu<T, kGeluForwardAux, Cfg, F>::run(stream, x, w, b, y, u, nullptr, int(n), int(m), int(k), form,
                                                         sm_count)
             : GemmGelu<T, kGeluForward, Cfg, F>::run(stream, x, w, b, y, nullptr, nullptr, int(n), int(m), int(k),
                                                      form, sm_count);
}
template <typename T, typename Cfg, bool kTanh, dst_gelu F = DST_GELU_ERF>
cudaError_t launch_bwd(cudaStream_t stream, dst_gelu form, const void *dy, const void *w, const void *u, void *du,
                       int64_t n, int64_t k, int64_t m, int sm_count, float *partial) {
    if constexpr (kTanh && F == DST_GELU_ERF)
        if (form == DST_GELU_TANH)
            return launch_bwd<T, Cfg, kTanh, DST_GELU_TANH>(stream, form, dy, w, u, du, n, k, m, sm_count, partial);
    return GemmGelu<T, kGeluBackward, Cfg, F>::run(stream, dy, w, nullptr, du, const_cast<void *>(u), partial, int(n),
                                                   int(k), int(m), form, sm_count);
}
// Whether CUTLASS takes the problem (the kernels of both forms share their tiling: the erf form's answer).
template <typename T, typename Cfg>
bool implementable(int kind, int64_t n, int64_t k, int64_t m) {
    switch (kind) {
        case kGeluForwardAux: return GemmGelu<T, kGeluForwardAux, Cfg>::implementable(int(n), int(m), int(k));
        case kGeluForward: return GemmGelu<T, kGeluForward, Cfg>::implementable(int(n), int(m), int(k));
        default: return GemmGelu<T, kGeluBackward, Cfg>::implementable(int(n), int(k), int(m));
    }
}

}  // namespace gemm_gelu
}  // namespace cuda
}  // namespace dst

// Defines the launchers of configuration CFG for storage type T as FWD and BWD (functions of
// kernels/gemm_gelu.cuh's argument lists without the dtype; FWD stores u unless it is null) and OK
// (kind, n, k, m: GemmGelu::implementable in the layer's terms), in the enclosing namespace: the
// lab's variants (TANH false: the erf form only). The library's per-type files define the forward
// and the backward with their own configurations (TANH true: both forms), through the three parts.
#define DST_GEMM_GELU_DEFINE_FWD(FWD, T, CFG, TANH)                                                                 \
    cudaError_t FWD(cudaStream_t stream, dst_gelu form, const void *x, const void *w, const void *b, void *y,        \
                    void *u, int64_t n, int64_t k, int64_t m, int sm_count) {                                       \
        return ::dst::cuda::gemm_gelu::launch_fwd<T, CFG, TANH>(stream, form, x, w, b, y, u, n, k, m, sm_count);     \
    }
#define DST_GEMM_GELU_DEFINE_BWD(BWD, T, CFG, TANH)                                                                 \
    cudaError_t BWD(cudaStream_t stream, dst_gelu form, const void *dy, const void *w, const void *u, void *du,      \
                    int64_t n, int64_t k, int64_t m, int sm_count, float *partial) {                                \
        return ::dst::cuda::gemm_gelu::launch_bwd<T, CFG, TANH>(stream, form, dy, w, u, du, n, k, m, sm_count,       \
                                                                partial);                                           \
    }
// OK answers for the forward kinds with FWD_CFG, for the backward with BWD_CFG.
#define DST_GEMM_GELU_DEFINE_OK(OK, T, FWD_CFG, BWD_CFG)                                                            \
    bool OK(int kind, int64_t n, int64_t k, int64_t m) {                                                            \
        return kind == ::dst::cuda::kGeluBackward                                                                   \
                   ? ::dst::cuda::gemm_gelu::implementable<T, BWD_CFG>(kind, n, k, m)                               \
                   : ::dst::cuda::gemm_gelu::implementable<T, FWD_CFG>(kind, n, k, m);                              \
    }
// OK (n, k, m) for the backward alone with CFG (the backward's second configuration, SingleConfig).
#define DST_GEMM_GELU_DEFINE_BWD_OK(OK, T, CFG)                                                                     \
    bool OK(int64_t n, int64_t k, int64_t m) {                                                                      \
        return ::dst::cuda::gemm_gelu::implementable<T, CFG>(::dst::cuda::kGeluBackward, n, k, m);                  \
    }
#define DST_GEMM_GELU_DEFINE(FWD, BWD, OK, T, CFG, TANH)                                                            \
    DST_GEMM_GELU_DEFINE_FWD(FWD, T, CFG, TANH)                                                                     \
    DST_GEMM_GELU_DEFINE_BWD(BWD, T, CFG, TANH)                                                                     \
    DST_GEMM_GELU_DEFINE_OK(OK, T, CFG, CFG)

#endif  // DST_KERNELS_CUTLASS_GEMM_GELU_IMPL_CUH
