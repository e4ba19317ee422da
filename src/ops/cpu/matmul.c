// matmul.c: linear layers through the CPU's sgemm (gemm.c); one row (decode) through the GEMV of gemv.c.
// Weights are (OC, IC) as nn.Linear stores them.
// The GEMM + GELU pair is the plain composition of the ops it fuses (matmul then gelu forward; gelu
// then matmul backward), so it gives their bits exactly; the fusion pays off on the GPU only.
#include "ops/cpu/cpu_ops.h"

#include <string.h>

void cpu_matmul_forward(sl_act *out_, const sl_act *inp_, const sl_act *weight_, const sl_act *bias_, int N, int IC,
                        int OC) {
    float *out = cpu_f32(out_);
    const float *inp = cpu_f32(inp_);
    const float *weight = cpu_f32(weight_);
    const float *bias = cpu_f32(bias_);
    if (N == 1) {  // one row (decode): a matrix-vector product at memory speed
        cpu_gemv_f32(out, weight, inp, bias, OC, IC);
        return;
    }
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if((size_t)N * OC >= SL_PAR_MIN_WORK)
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, sizeof(float) * (size_t)OC);
        beta = 1.0f;
    }
    // out (N,OC) = inp (N,IC) @ weight^T
    cpu_sgemm(0, 1, N, OC, IC, 1.0f, inp, IC, weight, IC, beta, out, OC);
}

void cpu_matmul_backward(sl_act *dinp_, float *dweight, float *dbias, const sl_act *dout_, const sl_act *inp_,
                         const sl_act *weight_, int N, int IC, int OC) {
    float *dinp = cpu_f32(dinp_);
    const float *dout = cpu_f32(dout_);
    const float *inp = cpu_f32(inp_);
    const float *weight = cpu_f32(weight_);
    // dinp (N,IC) = dout (N,OC) @ weight (OC,IC)
    if (dinp) cpu_sgemm(0, 0, N, IC, OC, 1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
    // dweight (OC,IC) += dout^T (OC,N) @ inp (N,IC)
    if (dweight) cpu_sgemm(1, 0, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
    if (!dbias) return;
    // column sums, each thread owning a block of columns: deterministic for any thread count
#pragma omp parallel if((size_t)N * OC >= SL_PAR_MIN_WORK)
    {
        size_t o0, o1;
        cpu_thread_range((size_t)OC, &o0, &o1);
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * OC;
            for (size_t o = o0; o < o1; o++) dbias[o] += d[o];
        }
    }
}

void cpu_matmul_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight, const sl_act *bias,
                             int N, int IC, int OC) {
    cpu_matmul_forward(pre, inp, weight, bias, N, IC, OC);
    cpu_gelu_forward(out, pre, (size_t)N * OC);
}

void cpu_matmul_gelu_backward(sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre,
                              const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    cpu_gelu_backward(dout, pre, dout, (size_t)N * OC);  // in place: dout becomes d(pre)
    cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

void cpu_matmul_backward_gelu(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,
                              const sl_act *weight, const sl_act *pre, int N, int IC, int OC) {
    cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (dinp) cpu_gelu_backward(dinp, pre, dinp, (size_t)N * IC);  // in place: dinp becomes d(pre)
}
