// rope.cu: rotary position embeddings (rotate-half convention of LlamaForCausalLM) on the GPU, in
// place on the query and key heads of the fused qkv activation (B,T,(NH+2NKV)*HD) (layout: ops.h).
//
// One thread per rotated pair (b, t, head, i < HD/2), heads 0..NH-1 being the queries and
// NH..NH+NKV-1 the keys (they are contiguous in a row); value heads are untouched. The pair
// (x[i], x[i + HD/2]) of position pos0 + t becomes
//     (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
// and backward applies the transpose (sin negated, positions from 0), exactly as
// src/ops/cpu/elementwise.c rope_apply, with _rn intrinsics so the result is bit-identical to it.
// Invariants: each element is read and written by one thread (in place is safe); no reductions;
// queued on sl_cuda_stream(). Cost: one memory-bound pass over the q and k columns. qkv is storage-typed
// (floatX); the cos / sin tables are fp32.
#include "ops/cuda/cuda_common.cuh"

#define ROPE_THREADS 256

// qkv (B,T,W) with W = (NH+2NKV)*HD; cos_t/sin_t (max_T, HD/2); sign -1 applies the transpose.
template <typename T>
__global__ void rope_kernel(T *qkv, const float *cos_t, const float *sin_t, int B, int T_len, int NH, int NKV,
                            int HD, int pos0, float sign) {
    size_t half = (size_t)(HD / 2), heads = (size_t)(NH + NKV), W = (size_t)(NH + 2 * NKV) * HD;
    size_t total = (size_t)B * T_len * heads * half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t i = idx % half, rest = idx / half;
        size_t h = rest % heads, bt = rest / heads;
        size_t t = bt % (size_t)T_len;
        size_t tab = ((size_t)pos0 + t) * half + i;
        float c = cos_t[tab], si = __fmul_rn(sign, sin_t[tab]);
        T *x = qkv + bt * W + h * (size_t)HD;
        float x1 = to_f32(x[i]), x2 = to_f32(x[i + half]);
        x[i] = from_f32<T>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, si)));
        x[i + half] = from_f32<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, si)));
    }
}

template <typename floatX>
static void rope_launch(sl_act *qkv, const float *cos_t, const float *sin_t, int B, int T, int NH, int NKV, int HD,
                        int pos0, float sign) {
    size_t total = (size_t)B * T * (size_t)(NH + NKV) * (size_t)(HD / 2);
    if (B <= 0 || T <= 0 || HD < 2 || total == 0) return;
    size_t blocks = (total + ROPE_THREADS - 1) / ROPE_THREADS;
    if (blocks > ((size_t)1 << 20)) blocks = (size_t)1 << 20;
    rope_kernel<floatX><<<(unsigned int)blocks, ROPE_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(qkv), cos_t, sin_t, B, T, NH, NKV, HD, pos0, sign);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_rope_forward(sl_act *qkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD,
                       int pos0) {
    rope_launch<floatX>(qkv, cos, sin, B, T, NH, NKV, HD, pos0, 1.0f);
}

template <typename floatX>
void cuda_rope_backward(sl_act *dqkv, const float *cos, const float *sin, int B, int T, int NH, int NKV, int HD) {
    rope_launch<floatX>(dqkv, cos, sin, B, T, NH, NKV, HD, 0, -1.0f);
}

SL_CUDA_STORAGE_INSTANCES(cuda_rope_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_rope_backward)
