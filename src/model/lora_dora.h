// lora_dora.h: DoRA (PEFT's use_dora) on top of the LoRA adapters of lora.c; internal to the model.
// A DoRA adapter on the output columns [col0, col0 + out) of a linear with weight W (out, in) and bias b
// computes, per output j, with the weight norm taken as a constant (PEFT detaches it):
//   n_j = || W_j + s (B A)_j ||_2,   g_j = m_j / n_j   (m: lora_magnitude_vector, trained)
//   y_j = g_j (x W_j^T + s (B A x)_j) + b_j                       (no dropout)
//   y_j = x W_j^T + b_j + (g_j - 1) x_d W_j^T + g_j s (B A x_d)_j  (dropout: x_d the dropped input)
// so the output gradient dy gives dm_j = sum over rows of dy_j z_j / n_j with z = (x_d) W^T + s B A x_d,
// the LoRA path the gradient g dy, and the base path dy scaled by g (no dropout) or dy plus the dropped
// path's (g - 1) dy (dropout). CPU backend only (host memory); fp32 or bf16 activation storage.
#ifndef SHARDLM_LORA_DORA_H
#define SHARDLM_LORA_DORA_H

#include "shardlm/layout.h"
#include "shardlm/lora.h"
#include "shardlm/precision.h"

// lora.c's helpers DoRA shares: a tensor as the GEMMs read it (the bf16 copy with bf16 storage), whether
// dropout runs, adapter a's dropout seed, the base weight (a tensor of L) an adapter's linear belongs to.
const sl_act *lora_weight(const sl_lora *lo, int idx);
// Element i of host activation storage as fp32 (bf16: widened exactly), for the CPU-only host loops.
static inline float lora_act_value(const sl_act *p, size_t i, int bf16) {
    return bf16 ? sl_bf16_widen(((const sl_bf16 *)(const void *)p)[i]) : ((const float *)(const void *)p)[i];
}
// Tensor idx's fp32 parameters and its gradient (NULL without gradients), through its unit's views.
const float *lora_param(const sl_lora *lo, int idx);
float *lora_grad(const sl_lora *lo, int idx);
int lora_dropping(const sl_lora *lo);
uint64_t lora_dropout_seed(const sl_lora *lo, int adapter);
int lora_base_weight(const sl_param_layout *L, const sl_lora_adapter *ad);
// The base bias (a tensor of L) of an adapter's linear, -1 when it has none (LLaMA's, lm_head).
int lora_base_bias(const sl_param_layout *L, const sl_lora_adapter *ad);

// Buffers for N rows (z only when a backward may follow: lo->backward_may_follow); no-op when large
// enough. The weight norms are taken again after each sl_lora_params_changed.
int lora_dora_plan(sl_lora *lo, int N);
void lora_dora_free(sl_lora *lo);
// Adapter a's forward: y (N, ld) holds the base GEMM's output (bias included); h is the adapter's input
// (x, or x dropped while training); W the fused GEMM's weight (its rows col0.. are the adapter's), bias
// its bias or NULL. u (lo->u[a]) keeps A h for the backward.
void lora_dora_forward(sl_lora *lo, int a, const sl_act *h, sl_act *y, const sl_act *W, const sl_act *bias, int N,
                       int ld);
// 0 when a backward may run (the last forward kept z), else -1 with the error.
int lora_dora_check_backward(const sl_lora *lo);
// Before the base GEMM's backward of (layer, linear): the magnitudes' gradients from dy (N, ld), and
// lo's copy of dy with every DoRA adapter's columns scaled by g. Returns the gradient the base GEMM
// takes: that copy without dropout, dy itself with it.
const sl_act *lora_dora_base_grad(sl_lora *lo, int layer, sl_linear_kind linear, const sl_act *dy, int N, int ld);
// Adapter a's backward (after lora_dora_base_grad): A's and B's gradients from the scaled copy, and
// dx (N, in; NULL: not wanted) += the adapter's part of the input gradient; dy is what the base GEMM took.
void lora_dora_backward(sl_lora *lo, int a, const sl_act *h, const sl_act *dy, sl_act *dx, const sl_act *W, int N,
                        int ld);
// Fresh adapters' magnitudes: m_j = || W_j + s (B A)_j || (PEFT's start), W[a] adapter a's fused base
// weight as the model hands its GEMM (a quantised linear's is dequantised). -1 with the error.
int lora_dora_init_magnitudes(sl_lora *lo, const sl_act *const *W);
// The merged row for merge_and_unload: w (in) holds W_j + s (B A)_j; scaled by m_j / ||w||.
void lora_dora_merge_row(float *w, int in, float magnitude);

#endif
