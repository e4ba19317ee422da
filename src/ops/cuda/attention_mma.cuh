// attention_mma.cuh: causal flash attention with the running output, the scores and the probabilities
// in registers (flash-attention-2's structure: PTX mma.sync m16n8k16 on bf16, fp32 accumulation), for
// bf16 activation storage (attention_mma.cu). The default (SHARDLM_ATTENTION=mma; tc picks the WMMA
// kernels, simt the CUDA-core ones). attention.cu's bf16 entry points try these first, then
// attention_tc.cu's WMMA kernels, then the SIMT ones.
#ifndef SHARDLM_ATTENTION_MMA_CUH
#define SHARDLM_ATTENTION_MMA_CUH

#include <cuda_bf16.h>

// ops.h attention_forward on bf16 storage, scale = 1/sqrt(HD). false, with nothing queued, when the
// call is not one these kernels take: SHARDLM_ATTENTION is not mma, HD not in {16, 32, 64, 80, 96,
// 128}, more shared memory than the GPU allows a block at that HD, or a pointer not 16-byte aligned.
// true once queued (a launch failure is recorded for cuda_synchronize, as every op's).
bool attention_mma_forward(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *qkv, int B, int T, int NH, int NKV,
                           int HD, float scale);
// ops.h attention_backward on bf16 storage, given delta[(b*NH + h)*T + t] = dout . out of that row.
// dqkv is overwritten. Same conditions and return as attention_mma_forward.
bool attention_mma_backward(__nv_bfloat16 *dqkv, const __nv_bfloat16 *dout, const __nv_bfloat16 *qkv,
                            const float *lse, const float *delta, int B, int T, int NH, int NKV, int HD, float scale);

#endif
