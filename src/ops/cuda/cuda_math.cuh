// cuda_math.cuh: device versions of the CPU's vectorised math (src/ops/cpu/vec_math.h), written
// with explicit round-to-nearest operations in the CPU's order so both backends get the same bits.
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

#endif
