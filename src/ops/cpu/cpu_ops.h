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
void cpu_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD,
                           int window);
void cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                            int B, int T, int NH, int NKV, int HD, int window);
void cpu_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx, int NH,
                          int NKV, int HD);
double cpu_crossentropy_forward(float *lse, const float *logits, const int *targets, int N, int V, int Vp);
void cpu_crossentropy_backward(float *logits, const float *lse, const int *targets, int N, int V, int Vp, float dloss);

// What is not an op over activations (ops_cpu.c), shared by sl_ops_cpu and sl_ops_cpu_bf16: host
// memory (transfers are copies), the precision switch (nothing: OpenBLAS is fp32) and the optimizer
// step's passes over flat fp32 buffers.
void *cpu_alloc(size_t bytes, const char *what);
void cpu_dealloc(void *p);
void cpu_memzero(void *p, size_t bytes);
void cpu_copy(void *dst, const void *src, size_t bytes);
int cpu_synchronize(void);
void *cpu_stream(void);
size_t cpu_peak_bytes(void);
void cpu_reset_peak_bytes(void);
void cpu_scale(float *x, size_t n, float coef);
void cpu_add(float *x, const float *y, size_t n);
// optimizer.c: the optimizer passes (ops.h adam_step, sgd_step, sumsq, nonfinite)
void cpu_adam_step(const sl_adam_args *a, float *p, const float *g, float *m, float *v, const sl_segment *segs,
                   int n_segs);
void cpu_sgd_step(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs, int n_segs);
double cpu_sumsq(const float *g, size_t n);
int cpu_nonfinite(const float *g, size_t n);
void cpu_set_precision(int precision);
void cpu_round_to(float *x, size_t n, int precision);
void cpu_to_storage(void *dst, const float *src, size_t n);
// Those entries of a CPU table (designated initialisers).
#define SL_CPU_HOST_FNS                                                                                 \
    .set_precision = cpu_set_precision, .on_device = 0, .alloc = cpu_alloc, .dealloc = cpu_dealloc,     \
    .memzero = cpu_memzero, .upload = cpu_copy, .download = cpu_copy, .copy = cpu_copy,                 \
    .stream = cpu_stream, .peak_bytes = cpu_peak_bytes,                 \
    .reset_peak_bytes = cpu_reset_peak_bytes, .sumsq = cpu_sumsq, .scale = cpu_scale, .add = cpu_add,   \
    .nonfinite = cpu_nonfinite, .round_to = cpu_round_to, .to_storage = cpu_to_storage,                 \
    .adam_step = cpu_adam_step, .sgd_step = cpu_sgd_step

// Splits [0, n) into the calling thread's contiguous share inside an omp parallel region.
void cpu_thread_range(size_t n, size_t *begin, size_t *end);

#endif
