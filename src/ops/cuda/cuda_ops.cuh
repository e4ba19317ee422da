// cuda_ops.cuh: the CUDA backend's ops over activations, C++ templates on the activation storage
// type floatX: float for sl_ops_cuda, __nv_bfloat16 for sl_ops_cuda_bf16 (ops.h act_bf16). The
// prototypes are ops.h's, float * throughout; an op reads its storage-typed arguments (ops.h lists
// them) as floatX and its fp32 ones (parameters read elementwise, parameter gradients, statistics)
// as float. Every pointer is GPU memory; every op is queued on sl_cuda_stream() and returns at once,
// except crossentropy_forward, which waits for the loss it returns. Each .cu file defines its ops
// and instantiates them for both types (SL_CUDA_STORAGE_INSTANCES, at its end); ops_cuda.cu takes
// their addresses for the two tables.
#ifndef SHARDLM_CUDA_OPS_CUH
#define SHARDLM_CUDA_OPS_CUH

#include <cuda_bf16.h>
#include <stddef.h>

// The two storage types every templated op is compiled for (explicit instantiations of op `fn`).
#define SL_CUDA_STORAGE_INSTANCES(fn) \
    template decltype(fn<float>) fn<float>; \
    template decltype(fn<__nv_bfloat16>) fn<__nv_bfloat16>;

// encoder.cu
template <typename floatX>
void cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int B, int T, int C);
template <typename floatX>
void cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int B, int T, int C);
// matmul.cu (cuBLASLt)
template <typename floatX>
void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC);
template <typename floatX>
void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, int N, int IC, int OC);
template <typename floatX>
void cuda_matmul_gelu_forward(float *out, float *pre, const float *inp, const float *weight, const float *bias,
                              int N, int IC, int OC);
template <typename floatX>
void cuda_matmul_gelu_backward(float *dinp, float *dweight, float *dbias, float *dout, const float *pre,
                               const float *inp, const float *weight, int N, int IC, int OC);
// norm.cu
template <typename floatX>
void cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                            int N, int C, float eps);
template <typename floatX>
void cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                             const float *mean, const float *rstd, int N, int C);
template <typename floatX>
void cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
template <typename floatX>
void cuda_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                           const float *rstd, int N, int C);
template <typename floatX>
void cuda_residual_layernorm_forward(float *resid, float *out, float *mean, float *rstd, const float *a,
                                     const float *b, const float *w, const float *bias, int N, int C, float eps);
template <typename floatX>
void cuda_residual_rmsnorm_forward(float *resid, float *out, float *rstd, const float *a, const float *b,
                                   const float *w, int N, int C, float eps);
// elementwise.cu
template <typename floatX>
void cuda_residual_forward(float *out, const float *a, const float *b, size_t n);
template <typename floatX>
void cuda_gelu_forward(float *out, const float *inp, size_t n);
template <typename floatX>
void cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
template <typename floatX>
void cuda_swiglu_forward(float *out, const float *inp, int N, int I);
template <typename floatX>
void cuda_swiglu_backward(float *dinp, const float *inp, const float *dout, int N, int I);
// rope.cu
template <typename floatX>
void cuda_rope_forward(float *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD, int pos0);
template <typename floatX>
void cuda_rope_backward(float *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD);
// attention.cu (fused causal flash attention)
template <typename floatX>
void cuda_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HD,
                            int window);
template <typename floatX>
void cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                             int B, int T, int NH, int NKV, int HD, int window);
template <typename floatX>
void cuda_attention_decode(float *out, const float *q, const float *k_cache, const float *v_cache, int n_ctx,
                           int NH, int NKV, int HD);
// crossentropy.cu (fused classifier)
template <typename floatX>
double cuda_crossentropy_forward(float *lse, const float *logits, const int *targets, int N, int V, int Vp);
template <typename floatX>
void cuda_crossentropy_backward(float *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                float dloss);

#endif
