// cpu_ops.h: the CPU backend's op functions (OpenBLAS for GEMM, OpenMP + vectorised C for the
// rest), gathered into sl_ops_cpu by ops_cpu.c. Semantics and shapes are documented in ops.h.
// Every op is deterministic for a given thread count; most are deterministic for any.
#ifndef SHARDLM_CPU_OPS_H
#define SHARDLM_CPU_OPS_H

#include "shardlm/ops.h"

// Below this much work (elements touched) an op runs on the calling thread: waking the team costs more.
#define SL_PAR_MIN_WORK ((size_t)32768)

void cpu_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);
void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC);
void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int IC, int OC);
void cpu_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight, const float *bias, int N,
                             int IC, int OC);
void cpu_matmul_gelu_backward(float *dinp, float *dweight, float *dbias, float *dout, const float *pre,
                              const float *inp, const float *weight, int N, int IC, int OC);
void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                           int N, int C, float eps);
void cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                            const float *mean, const float *rstd, int N, int C);
void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int N, int C);
void cpu_residual_forward(float *out, const float *a, const float *b, size_t n);
void cpu_residual_layernorm_forward(float *resid, float *out, float *mean, float *rstd, const float *a, const float *b,
                                    const float *w, const float *bias, int N, int C, float eps);
void cpu_residual_rmsnorm_forward(float *resid, float *out, float *rstd, const float *a, const float *b, const float *w,
                                  int N, int C, float eps);
void cpu_gelu_forward(float *out, const float *inp, size_t n);
void cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void cpu_swiglu_forward(float *out, const float *inp, int N, int I);
void cpu_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int I);
void cpu_rope_forward(float *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD, int pos0);
void cpu_rope_backward(float *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD);
void cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD);
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            int B, int T, int NH, int NKV, int HD);
void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx, int NH,
                          int NKV, int HD);
double cpu_crossentropy_forward(float *lse, const float *logits, const int *targets, int N, int V, int Vp);
void cpu_crossentropy_backward(float *logits, const float *lse, const int *targets, int N, int V, int Vp, float dloss);

// Splits [0, n) into the calling thread's contiguous share inside an omp parallel region.
void cpu_thread_range(size_t n, size_t *begin, size_t *end);

#endif
