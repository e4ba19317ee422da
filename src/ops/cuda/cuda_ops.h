// cuda_ops.h: the CUDA backend's functions (C linkage), gathered into sl_ops_cuda by ops_cuda.cu.
// Every pointer is GPU memory unless it says host; shapes, accumulate/overwrite conventions and
// argument order are exactly those of ops.h. Every op is queued on the backend's stream and returns
// at once, except those returning a value to the host (crossentropy_forward, sumsq, nonfinite),
// which wait for that one value.
#ifndef SHARDLM_CUDA_OPS_H
#define SHARDLM_CUDA_OPS_H

#include <stddef.h>
#include "shardlm/ops.h"

// encoder.cu
void cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);
// matmul.cu (cuBLASLt)
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC);
void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, int N, int IC, int OC);
void cuda_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight, const float *bias,
                              int N, int IC, int OC);
void cuda_matmul_gelu_backward(float *dinp, float *dweight, float *dbias, float *dout, const float *pre,
                               const float *inp, const float *weight, int N, int IC, int OC);
void cuda_set_precision(int precision);  // the GEMMs' compute type (ops.h set_precision)
// norm.cu
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                            int N, int C, float eps);
void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                             const float *mean, const float *rstd, int N, int C);
void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void cuda_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                           const float *rstd, int N, int C);
void cuda_residual_layernorm_forward(float *resid, float *out, float *mean, float *rstd, const float *a,
                                     const float *b, const float *w, const float *bias, int N, int C, float eps);
void cuda_residual_rmsnorm_forward(float *resid, float *out, float *rstd, const float *a, const float *b,
                                   const float *w, int N, int C, float eps);
// elementwise.cu
void cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
void cuda_gelu_forward(float *out, const float *inp, size_t n);
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void cuda_swiglu_forward(float *out, const float *inp, int N, int I);
void cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int I);
// rope.cu
void cuda_rope_forward(float *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD, int pos0);
void cuda_rope_backward(float *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD);
// attention.cu (fused causal flash attention)
void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD);
void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                             int B, int T, int NH, int NKV, int HD);
void cuda_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx,
                           int NH, int NKV, int HD);
// crossentropy.cu (fused classifier)
double cuda_crossentropy_forward(float *lse, const float *logits, const int *targets, int N, int V, int Vp);
void cuda_crossentropy_backward(float *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                float dloss);
// optimizer.cu (flat-buffer passes of the optimizer step; see ops.h). The argument structs and
// `segs` are host memory.
double cuda_sumsq(const float *g, size_t n);
void cuda_scale(float *x, size_t n, float coef);
int cuda_nonfinite(const float *x, size_t n);
void cuda_round_to(float *x, size_t n, int precision);
void cuda_to_storage(void *dst, const float *src, size_t n);
void cuda_adam_step(const sl_adam_args *a, float *p, const float *g, float *m, float *v, const sl_segment *segs,
                    int n_segs);
void cuda_sgd_step(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs, int n_segs);

// ops_cuda.cu: memory, stream and errors
int cuda_backend_init(int device);  // selects the GPU, creates the stream and the cuBLASLt handle
int cuda_device_count(void);     // visible GPUs, or -1 with "no usable CUDA GPU: ..."
void *cuda_alloc(size_t bytes, const char *what);
void cuda_dealloc(void *p);
void cuda_memzero(void *p, size_t bytes);
void cuda_upload(void *dst, const void *host_src, size_t bytes);
void cuda_download(void *host_dst, const void *src, size_t bytes);
void cuda_copy(void *dst, const void *src, size_t bytes);
int cuda_synchronize(void);
void *cuda_stream_handle(void);
size_t cuda_peak_bytes(void);
void cuda_reset_peak_bytes(void);

#endif
