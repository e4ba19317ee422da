// lora_compose.h: the LoRA ops of ops_list.h (lora_forward, lora_backward) composed from a table's
// own GEMM and column ops, for the tables whose storage is bf16 (the emulation and the native bf16
// table): each intermediate (u @ B^T, the scaled output-gradient slice, du @ A) is stored in the
// table's storage and read back as stored, as the GPU's composition (src/ops/cuda/lora_cols.cu) does.
// The fp32 CPU table runs its own fused GEMMs instead (src/ops/cpu/lora_gemm.c).
#ifndef SHARDLM_OPS_LORA_COMPOSE_H
#define SHARDLM_OPS_LORA_COMPOSE_H

#include "shardlm/ops.h"

static inline void sl_lora_compose_forward(const sl_ops *t, sl_act *y, sl_act *u, sl_act *delta, const sl_act *x,
                                           const sl_act *A, const sl_act *B, float scale, int N, int in, int r,
                                           int out, int ld, int col0) {
    t->matmul_forward(u, x, A, NULL, N, in, r);
    t->matmul_forward(delta, u, B, NULL, N, r, out);
    t->add_columns(y, delta, scale, N, out, ld, col0);
}

static inline void sl_lora_compose_backward(const sl_ops *t, sl_act *dx, float *dA, float *dB, sl_act *du,
                                            sl_act *delta, sl_act *dh, const sl_act *dy, const sl_act *x,
                                            const sl_act *u, const sl_act *A, const sl_act *B, float scale, int N,
                                            int in, int r, int out, int ld, int col0) {
    t->take_columns(delta, dy, scale, N, out, ld, col0);
    t->matmul_backward(du, dB, NULL, delta, u, B, N, r, out);
    t->matmul_backward(dx ? dh : NULL, dA, NULL, du, x, A, N, in, r);
    if (dx) t->residual_forward(dx, dx, dh, (size_t)N * (size_t)in);
}

// Defines composed_lora_forward / composed_lora_backward, a table's entries, composed over `table`.
#define SL_LORA_COMPOSED_OPS(table)                                                                            \
    static void composed_lora_forward(sl_act *y, sl_act *u, sl_act *delta, const sl_act *x, const sl_act *A,   \
                                      const sl_act *B, float scale, int N, int in, int r, int out, int ld,     \
                                      int col0) {                                                               \
        sl_lora_compose_forward(&(table), y, u, delta, x, A, B, scale, N, in, r, out, ld, col0);                \
    }                                                                                                           \
    static void composed_lora_backward(sl_act *dx, float *dA, float *dB, sl_act *du, sl_act *delta, sl_act *dh, \
                                       const sl_act *dy, const sl_act *x, const sl_act *u, const sl_act *A,     \
                                       const sl_act *B, float scale, int N, int in, int r, int out, int ld,    \
                                       int col0) {                                                              \
        sl_lora_compose_backward(&(table), dx, dA, dB, du, delta, dh, dy, x, u, A, B, scale, N, in, r, out, ld, \
                                 col0);                                                                         \
    }

#endif
