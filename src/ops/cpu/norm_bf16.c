// norm_bf16.c: RMSNorm's backward on cpu-bf16-onednn's bf16 storage, instead of staged a block of rows
// at a time (ops_cpu_bf16_native.c): each thread widens one row of the output gradient, the input and
// the input gradient into fp32 buffers of its own (L1-sized at LLaMA widths), runs norm.c's row code
// on them (cpu_rmsnorm_backward_row, the same machine code as the fp32 op) and rounds the input
// gradient back once to nearest even; the weight gradient's column sums add the rows in order by
// column blocks through norm.c's row code too (cpu_rmsnorm_weight_grad_row). So the staged op's bits
// for any thread count (test: row_blocked_ops_give_the_emulations_bits), without the blocks' scratch
// traffic.
#include "ops/cpu/cpu_bf16.h"

#include <omp.h>

void cpu_bf16_rmsnorm_backward(sl_act *dinp_, float *dw, const sl_act *dout_, const sl_act *inp_, const sl_act *w_,
                               const float *rstd, int N, int C) {
    if (cpu_bf16_failed()) return;
    sl_bf16 *dinp = bf16_of(dinp_);
    const sl_bf16 *dout = cbf16_of(dout_), *inp = cbf16_of(inp_);
    // the weight widened, then each thread's three rows (the table's scratch, kept across calls)
    size_t per_thread = 3 * (size_t)C;
    float *w = cpu_bf16_scratch(0, (size_t)C), *rows = cpu_bf16_scratch(1, (size_t)omp_get_max_threads() * per_thread);
    if (!w || !rows) return;
    sl_bf16_to_f32_array(cbf16_of(w_), w, (size_t)C);
#pragma omp parallel for schedule(static) if((size_t)N * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < N; n++) {
        float *dx = rows + (size_t)omp_get_thread_num() * per_thread, *dy = dx + C, *x = dy + C;
        sl_bf16 *d = dinp + (size_t)n * C;
        const sl_bf16 *g = dout + (size_t)n * C, *in = inp + (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++) {
            dx[c] = sl_bf16_widen(d[c]);
            dy[c] = sl_bf16_widen(g[c]);
            x[c] = sl_bf16_widen(in[c]);
        }
        cpu_rmsnorm_backward_row(dx, dy, x, w, rstd[n], C);
#pragma omp simd
        for (int c = 0; c < C; c++) d[c] = sl_bf16_round(dx[c]);
    }
    if (!dw) return;  // frozen weight (LoRA): only the input's gradient
    // the weight gradient: each thread's columns, the rows in order, widened a row at a time
#pragma omp parallel if((size_t)N * C >= SL_PAR_MIN_WORK)
    {
        size_t c0, c1;
        cpu_thread_range((size_t)C, &c0, &c1);
        int n_cols = (int)(c1 - c0);
        float *dy = rows + (size_t)omp_get_thread_num() * per_thread, *x = dy + n_cols;
        for (int n = 0; n_cols > 0 && n < N; n++) {
            const sl_bf16 *g = dout + (size_t)n * C + c0, *in = inp + (size_t)n * C + c0;
#pragma omp simd
            for (int c = 0; c < n_cols; c++) {
                dy[c] = sl_bf16_widen(g[c]);
                x[c] = sl_bf16_widen(in[c]);
            }
            cpu_rmsnorm_weight_grad_row(dw + c0, dy, x, rstd[n], n_cols);
        }
    }
}
