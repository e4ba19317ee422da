// attention_cudnn.cuh: causal attention for bf16 activation storage through cuDNN's fused flash attention
// (scaled dot-product attention, SDPA), built as an operation graph with cuDNN's backend API
// (attention_cudnn.cu) and libcudnn loaded at run time, as cuBLASLt is. Picked by
// SHARDLM_ATTENTION=cudnn (issue 14 item 2: decide between it and the mma.sync kernels by measuring
// both); attention.cu's bf16 entry points try it first, then the mma.sync kernels.
#ifndef SHARDLM_ATTENTION_CUDNN_CUH
#define SHARDLM_ATTENTION_CUDNN_CUH

#include <cuda_bf16.h>

// ops.h attention_forward on bf16 storage (lse: the natural-log sum of exponentials of each row's scaled
// scores, what the other paths save). false, with nothing queued, when the call is not one this path
// takes: SHARDLM_ATTENTION is not cudnn, HD not a multiple of 8 up to 128, or a pointer not 16-byte
// aligned. true once queued or once a failure is recorded (libcudnn missing, a graph cuDNN refuses):
// cuda_synchronize then reports it, with cuDNN's own message.
bool attention_cudnn_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B, int T, int NH, int NKV,
                             int HD, float scale);
// ops.h attention_backward on bf16 storage from the forward's out and lse; dqkv is overwritten. Same
// conditions and return as attention_cudnn_forward.
bool attention_cudnn_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                              const __nv_bfloat16 *out, const float *lse, int B, int T, int NH, int NKV, int HD,
                              float scale);

#endif
