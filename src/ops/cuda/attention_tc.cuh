// attention_tc.cuh: causal flash attention on the tensor cores, for bf16 activation storage
// (attention_tc.cu). attention.cu's bf16 entry points try these first and fall back to their fp32
// SIMT kernels when a call returns false.
#ifndef SHARDLM_ATTENTION_TC_CUH
#define SHARDLM_ATTENTION_TC_CUH

#include <cuda_bf16.h>

// ops.h attention_forward on bf16 storage, scale = 1/sqrt(HD). false, with nothing queued, when the
// call is not one these kernels take: HD not in {16, 32, 64, 80, 96, 128}, more shared memory than
// the GPU allows a block at that HD, a pointer not 16-byte aligned, or SHARDLM_ATTENTION=simt in the environment. true once queued (a launch failure is
// recorded for cuda_synchronize, as every op's).
bool attention_tc_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B, int T, int NH, int NKV,
                          int HD, float scale);
// ops.h attention_backward on bf16 storage, given delta[(b*NH + h)*T + t] = dout . out of that row.
// dqkv is overwritten. Same conditions and return as attention_tc_forward.
bool attention_tc_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                           const float *lse, const float *delta, int B, int T, int NH, int NKV, int HD, float scale);

#endif
