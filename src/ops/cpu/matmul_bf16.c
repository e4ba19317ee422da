// matmul_bf16.c: the linear layers of cpu-bf16-onednn: oneDNN bf16 GEMMs (onednn_matmul.c) straight on
// the bf16 activations and the model's bf16 weight shadow, fp32 accumulation, as cuda-bf16 runs them
// on cuBLASLt (one row, decode: the bf16 GEMV of gemv.c). Outputs in storage are rounded once from fp32 (the bias added before); the weight and
// bias gradients stay fp32 and accumulate (dweight through a sum post-op, dbias by the CPU's column
// sums in its order, so dbias equals the emulation's bit for bit). matmul_gelu_forward computes pre in
// fp32 scratch, stores it rounded and applies the CPU's GELU to the fp32 value, as the emulation does.
// The backward of the fused GEMM + GELU is composed in ops_cpu_bf16_native.c.
#include "ops/cpu/cpu_bf16.h"
#include "ops/cpu/vec_math.h"

#include <string.h>

#define BF16(p) ((const sl_bf16 *)(const void *)(p))

// bf16 bits widened to float: exact (sl_bf16_to_f32's value, inlined for the column sums).
static inline float widen(sl_bf16 h) {
    unsigned int u = (unsigned int)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void cpu_bf16_matmul_forward(sl_act *out, const sl_act *inp, const sl_act *weight, const sl_act *bias, int N, int IC,
                             int OC) {
    if (cpu_bf16_failed()) return;
    if (N == 1) {  // one row (decode): the bf16 GEMV into fp32 scratch, rounded once
        float *y = cpu_bf16_scratch(0, (size_t)OC);
        if (!y) return;
        cpu_gemv_bf16(y, BF16(weight), BF16(inp), BF16(bias), OC, IC);
        sl_f32_to_bf16_array(y, (sl_bf16 *)(void *)out, (size_t)OC);
        return;
    }
    // out (N,OC) = inp (N,IC) @ weight^T (IC,OC) + bias
    if (cpu_gemm_bf16("matmul_forward", 0, 1, N, OC, IC, BF16(inp), IC, BF16(weight), IC, BF16(bias), out, 0, 0))
        cpu_bf16_record_failure();
}

void cpu_bf16_matmul_backward(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout_, const sl_act *inp,
                              const sl_act *weight, int N, int IC, int OC) {
    if (cpu_bf16_failed()) return;
    const sl_bf16 *dout = BF16(dout_);
    // dinp (N,IC) = dout (N,OC) @ weight (OC,IC); dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC)
    if ((dinp && cpu_gemm_bf16("matmul_backward (dinp)", 0, 0, N, IC, OC, dout, OC, BF16(weight), IC, NULL, dinp, 0,
                               0)) ||
        (dweight &&
         cpu_gemm_bf16("matmul_backward (dweight)", 1, 0, OC, IC, N, dout, OC, BF16(inp), IC, NULL, dweight, 1, 1))) {
        cpu_bf16_record_failure();
        return;
    }
    if (!dbias) return;
    // column sums, each thread owning a block of columns: deterministic for any thread count
#pragma omp parallel if((size_t)N * OC >= SL_PAR_MIN_WORK)
    {
        size_t o0, o1;
        cpu_thread_range((size_t)OC, &o0, &o1);
        for (int n = 0; n < N; n++) {
            const sl_bf16 *d = dout + (size_t)n * OC;
            for (size_t o = o0; o < o1; o++) dbias[o] += widen(d[o]);
        }
    }
}

void cpu_bf16_matmul_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight,
                                  const sl_act *bias, int N, int IC, int OC) {
    size_t n = (size_t)N * OC;
    float *pre32 = cpu_bf16_failed() ? NULL : cpu_bf16_scratch(0, n);
    if (!pre32) return;
    // pre (N,OC) = inp @ weight^T + bias in fp32, stored rounded; out = gelu(pre) from the fp32 value
    if (N == 1) cpu_gemv_bf16(pre32, BF16(weight), BF16(inp), BF16(bias), OC, IC);
    else if (cpu_gemm_bf16("matmul_gelu_forward", 0, 1, N, OC, IC, BF16(inp), IC, BF16(weight), IC, BF16(bias), pre32, 1,
                      0)) {
        cpu_bf16_record_failure();
        return;
    }
    sl_bf16 *pre16 = (sl_bf16 *)(void *)pre, *out16 = (sl_bf16 *)(void *)out;
#pragma omp parallel for simd schedule(static) if(n >= SL_PAR_MIN_WORK)
    for (size_t i = 0; i < n; i++) {  // one pass over the fp32 scratch for both outputs
        pre16[i] = sl_bf16_round(pre32[i]);
        out16[i] = sl_bf16_round(gelu_value(pre32[i]));
    }
}
