// vec_math.h: an expf that the compiler can vectorise inside `omp simd` loops (glibc's libmvec is
// only used under -ffast-math, which we do not build with; the Makefile's -fno-trapping-math lets
// GCC if-convert the clamps). Cody-Waite range reduction
// x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for e^r, then scaling by 2^n through the
// exponent bits. Max relative error ~2 ulp over the normal range; underflows to 0 below -87.3.
#ifndef SHARDLM_VEC_MATH_H
#define SHARDLM_VEC_MATH_H

#include <stdint.h>

static inline float vexpf(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    float xc = x < hi ? x : hi;
    xc = xc > lo ? xc : lo;
    // round to nearest by the 1.5 * 2^23 trick (|xc * log2 e| < 2^22): vectorises, unlike roundf
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;   // ln2 split in two parts for an exact first step
    r = r - n * -2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666418f + r * (0.00833336823f +
              r * 0.00138887205f)))));
    union { int32_t i; float f; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    float y = p * scale.f;
    return x < lo ? 0.0f : y;
}

// tanh through e^(2u): exact limits at +-1, absolute error ~1e-7 near 0.
static inline float vtanhf(float u) {
    float e = vexpf(2.0f * (u > 20.0f ? 20.0f : u));
    return 1.0f - 2.0f / (e + 1.0f);
}

// The activations, one element at a time, as every CPU table computes them: the fp32 ops and the bf16
// ops that read bf16 storage in place share these, so both give the same bits (-ffp-contract=off).
#define SL_GELU_K 0.7978845608028654f  // sqrt(2/pi)

// GELU, tanh approximation (GPT-2's "gelu_new").
static inline float gelu_value(float x) {
    return 0.5f * x * (1.0f + vtanhf(SL_GELU_K * (x + 0.044715f * x * x * x)));
}

// dout * gelu'(x).
static inline float gelu_grad(float x, float dout) {
    float th = vtanhf(SL_GELU_K * (x + 0.044715f * x * x * x));
    float du = SL_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    return dout * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du);
}

// SwiGLU: silu(g) * u; its gradients d * u * silu'(g) (into *dg) and d * silu(g) (into *du).
static inline float swiglu_value(float g, float u) { return g / (1.0f + vexpf(-g)) * u; }
static inline void swiglu_grad(float g, float u, float d, float *dg, float *du) {
    float s = 1.0f / (1.0f + vexpf(-g));
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * g * s;
}

// RoPE's rotation of one pair (x1, x2) by the angle with cosine c and sine s (s negated: its transpose,
// for the backward).
static inline void rope_rotate(float x1, float x2, float c, float s, float *y1, float *y2) {
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}

#endif
