// GELU (erf and tanh forms) and its derivative on the compute type, shared by the elementwise maps
// (kernels/elementwise.cu) and the fused-epilogue GEMMs (kernels/cutlass/), so that a GELU computed
// in a GEMM's epilogue gives the bits of the map on the same stored input. Device compilation only.
#ifndef DST_KERNELS_GELU_MATH_CUH
#define DST_KERNELS_GELU_MATH_CUH

#include <type_traits>

#include "kernels/dispatch.cuh"

namespace dst {
namespace cuda {

// Φ(x) = P(X ≤ x) for the 16-bit types (their arithmetic is fp32), and with kGauss also e^(−x²/2):
//   Φ(x) = ½·erfc(z) for x < 0 and 1 − ½·erfc(z) otherwise, z = |x|/√2,
//   erfc(z) = t·exp(−z² + P(t)), t = 1/(1 + z/2), P of degree 9 (a Chebyshev fit of fractional error
//   below 1.2·10⁻⁷ for every z ≥ 0: Press et al., Numerical Recipes, §6.2, erfcc),
// on the hardware's approximate reciprocal and exp2 (docs/ops/gelu.md). Relative error against the exact
// Φ: below 1.5·10⁻⁶ for |x| ≤ 3 and 8·10⁻⁶ to |x| = 8, far under the rounding of a 16-bit result, and
// kept in the negative tail, where ½·(1 + erff(x/√2)) cancels (4.7 % off at x = −4, 0 below x ≈ −5.5).
// About half the instructions of the erff form (seven coefficient selects and a branch, and GELU's
// expf), which made the GELU passes bound by arithmetic: kernels/dev/elementwise_lab.cu times both and
// checks them against fp64 (the fp16 forward correctly rounded on every input it tries). fp32 and fp64
// keep erff / erf.
template <bool kGauss>
__device__ __forceinline__ float cdf16(float x, float *gauss) {
    constexpr float kLog2e = 1.4426950408889634f;
    const float z = fabsf(x) * 0.7071067811865476f;
    const float t = rcp_approx(fmaf(0.5f, z, 1.0f));  // ≥ 1: no rescaling needed
    float p = 0.17087277f * kLog2e;  // P(t)·log2(e), Horner
    p = fmaf(p, t, -0.82215223f * kLog2e);
    p = fmaf(p, t, 1.48851587f * kLog2e);
    p = fmaf(p, t, -1.13520398f * kLog2e);
    p = fmaf(p, t, 0.27886807f * kLog2e);
    p = fmaf(p, t, -0.18628806f * kLog2e);
    p = fmaf(p, t, 0.09678418f * kLog2e);
    p = fmaf(p, t, 0.37409196f * kLog2e);
    p = fmaf(p, t, 1.00002368f * kLog2e);
    p = fmaf(p, t, -1.26551223f * kLog2e);
    const float nz2 = -z * (z * kLog2e);  // −z²·log2(e)
    float erfc;
    if constexpr (kGauss) {
        *gauss = ex2_approx(nz2);
        erfc = t * *gauss * ex2_approx(p);
    } else {
        (void)gauss;
        erfc = t * ex2_approx(nz2 + p);
    }
    const float h = 0.5f * erfc;
    return x < 0.0f ? h : 1.0f - h;
}

// GELU and GELU'; `low` (16-bit storage, fp32 arithmetic) takes the erf form through cdf16.
template <typename C>
__device__ __forceinline__ C gelu_value(C x, dst_gelu form, bool low) {
    if (form == DST_GELU_TANH) {
        const C k0 = C(0.7978845608028654), k1 = C(0.044715);
        return C(0.5) * x * (C(1) + dtanh(k0 * (x + k1 * x * x * x)));
    }
    if constexpr (std::is_same_v<C, float>)
        if (low) return x * cdf16<false>(x, nullptr);
    return C(0.5) * x * (C(1) + derf(x * C(0.7071067811865476)));
}

template <typename C>
__device__ __forceinline__ C gelu_grad(C x, dst_gelu form, bool low) {
    if (form == DST_GELU_TANH) {
        const C k0 = C(0.7978845608028654), k1 = C(0.044715);
        const C t = dtanh(k0 * (x + k1 * x * x * x));
        return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k0 * (C(1) + C(3) * k1 * x * x);
    }
    if constexpr (std::is_same_v<C, float>) {
        if (low) {
            float gauss;  // e^(−x²/2)
            const float cdf = cdf16<true>(x, &gauss);
            return fmaf(x * 0.3989422804014327f, gauss, cdf);
        }
    }
    const C cdf = C(0.5) * (C(1) + derf(x * C(0.7071067811865476)));
    const C pdf = dexp(C(-0.5) * x * x) * C(0.3989422804014327);
    return cdf + x * pdf;
}

}  // namespace cuda
}  // namespace dst

#endif  // DST_KERNELS_GELU_MATH_CUH
