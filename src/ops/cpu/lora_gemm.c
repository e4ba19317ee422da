// lora_gemm.c: the LoRA ops of ops_list.h on the fp32 CPU table, as four strided GEMMs with no
// elementwise pass: the forward's second GEMM adds scale * u @ B^T straight into y's column slice
// (beta 1, ldc = ld), and the backward's GEMMs read the output gradient's slice in place (lda = ld,
// alpha = scale) and add du @ A straight into dx. The adapter GEMMs are skinny (r columns or r deep,
// r = 8..64): OpenBLAS 0.3.21 runs those no faster on 2 threads than on 1, while oneDNN's sgemm
// splits them across threads, so they go through oneDNN whichever library the base's GEMMs use
// (gemm.c), a fixed choice: the same bits from run to run.
#include "ops/cpu/cpu_ops.h"

#define GEMM cpu_gemm_onednn

void cpu_lora_forward(sl_act *y_, sl_act *u_, sl_act *delta, const sl_act *x_, const sl_act *A_, const sl_act *B_,
                      float scale, int N, int in, int r, int out, int ld, int col0) {
    (void)delta;
    float *y = cpu_f32(y_), *u = cpu_f32(u_);
    const float *x = cpu_f32(x_), *A = cpu_f32(A_), *B = cpu_f32(B_);
    GEMM(0, 1, N, r, in, 1.0f, x, in, A, in, 0.0f, u, r);                  // u (N,r) = x @ A^T
    GEMM(0, 1, N, out, r, scale, u, r, B, r, 1.0f, y + col0, ld);          // y[:, slice] += scale * u @ B^T
}

void cpu_lora_backward(sl_act *dx_, float *dA, float *dB, sl_act *du_, sl_act *delta, sl_act *dh, const sl_act *dy_,
                       const sl_act *x_, const sl_act *u_, const sl_act *A_, const sl_act *B_, float scale, int N,
                       int in, int r, int out, int ld, int col0) {
    (void)delta;
    (void)dh;
    float *dx = cpu_f32(dx_), *du = cpu_f32(du_);
    const float *dy = cpu_f32(dy_) + col0, *x = cpu_f32(x_), *u = cpu_f32(u_), *A = cpu_f32(A_), *B = cpu_f32(B_);
    GEMM(1, 0, out, r, N, scale, dy, ld, u, r, 1.0f, dB, r);        // dB (out,r) += scale * dy[:, slice]^T @ u
    GEMM(0, 0, N, r, out, scale, dy, ld, B, r, 0.0f, du, r);        // du (N,r) = scale * dy[:, slice] @ B
    GEMM(1, 0, r, in, N, 1.0f, du, r, x, in, 1.0f, dA, in);         // dA (r,in) += du^T @ x
    if (dx) GEMM(0, 0, N, in, r, 1.0f, du, r, A, in, 1.0f, dx, in);  // dx (N,in) += du @ A
}
