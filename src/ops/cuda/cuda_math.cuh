// cuda_math.cuh: device versions of the CPU's vectorised math (src/ops/cpu/vec_math.h) and of its
// tanh GELU, written with explicit round-to-nearest operations in the CPU's order so both backends
// get the same bits (elementwise.cu's GELU kernels and matmul.cu's fused GELU gradient share them).
#ifndef SHARDLM_CUDA_MATH_CUH
#define SHARDLM_CUDA_MATH_CUH

// vec_math.h's vexpf: same operations, same order, same clamps.
__device__ __forceinline__ float vexpf_dev(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    float xc = x < hi ? x : hi;
    xc = xc > lo ? xc : lo;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    float r = __fsub_rn(xc, __fmul_rn(n, 0.693359375f));
    r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
    float p = __fadd_rn(0.00833336823f, __fmul_rn(r, 0.00138887205f));
    p = __fadd_rn(0.0416666418f, __fmul_rn(r, p));
    p = __fadd_rn(0.166666672f, __fmul_rn(r, p));
    p = __fadd_rn(0.5f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    p = __fadd_rn(1.0f, __fmul_rn(r, p));
    float scale = __int_as_float(((int)n + 127) << 23);
    float y = __fmul_rn(p, scale);
    return x < lo ? 0.0f : y;
}

// vec_math.h's vtanhf: tanh(u) = 1 - 2 / (exp(2u) + 1), the argument clamped at 20.
__device__ __forceinline__ float vtanhf_dev(float u) {
    float e = vexpf_dev(__fmul_rn(2.0f, u > 20.0f ? 20.0f : u));
    return __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(e, 1.0f)));
}

// ---- the tanh GELU ("gelu_new") of src/ops/cpu/elementwise.c, in the CPU's evaluation order ----------

#define SL_GELU_K 0.7978845608028654f  // sqrt(2/pi)

// tanh(sqrt(2/pi) * (x + 0.044715 x^3))
__device__ __forceinline__ float gelu_tanh_arg(float x) {
    float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    return vtanhf_dev(__fmul_rn(SL_GELU_K, __fadd_rn(x, cube)));
}

// gelu(x) = 0.5 x (1 + tanh(...))
__device__ __forceinline__ float gelu_dev(float x) {
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, gelu_tanh_arg(x)));
}

// dout * gelu'(x): the gradient wrt the GELU input of dout, the gradient wrt its output.
__device__ __forceinline__ float gelu_backward_dev(float x, float dout) {
    float th = gelu_tanh_arg(x);
    // du = K * (1 + 3 * 0.044715 * x * x)
    float du = __fmul_rn(SL_GELU_K, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(__fmul_rn(3.0f, 0.044715f), x), x)));
    float left = __fmul_rn(0.5f, __fadd_rn(1.0f, th));
    float right = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fsub_rn(1.0f, __fmul_rn(th, th))), du);
    return __fmul_rn(dout, __fadd_rn(left, right));
}

#endif
