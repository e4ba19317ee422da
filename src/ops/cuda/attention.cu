// attention.cu: fused causal attention on the GPU (ops.h attention_forward / attention_backward /
// attention_decode), flash-attention-2 style, in fp32 on the CUDA cores, deterministic (no atomics);
// bf16 storage at the tensor-core head dims goes to attention_tc.cu. Tiling, kernels, invariants and
// limits: docs/gpu.md, "Attention (attention.cu)".
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/attention_cudnn.cuh"
#include "ops/cuda/attention_mma.cuh"
#include "ops/cuda/attention_tc.cuh"
#include "shardlm/attention_choice.h"
#include "shardlm/settings.h"

#include <math.h>
#include <stdint.h>
#include <type_traits>

namespace {

constexpr int BQ = 64;                // queries per tile
constexpr int BK = 64;                // keys per tile
constexpr int NT = 128;               // threads per block: 16 row groups x 8 column lanes
constexpr int TX = 8;                 // threads across a tile's columns (adjacent lanes)
constexpr int RM = BQ / (NT / TX);    // rows per thread (4)
constexpr int LS = BK + 2;            // row stride of a score tile: rows 4 apart land 8 banks apart
constexpr int HD_MAX = 128;
static_assert(BQ == 64 && BK == 64 && TX * 8 == BK && RM * (NT / TX) == BQ, "the 4 x 8 micro-tile layout");

// s[a][k] = sum_c A[r0+a][c] * B[tx+8k][c] for two (64, D) shared tiles with row stride D + 1:
// this thread's 4 x 8 piece of A B^T.
template <int D>
__device__ __forceinline__ void tile_abt(float (&s)[RM][8], const float *A, const float *B, int r0, int tx) {
    constexpr int L = D + 1;
#pragma unroll
    for (int a = 0; a < RM; a++)
#pragma unroll
        for (int k = 0; k < 8; k++) s[a][k] = 0.0f;
#pragma unroll 4
    for (int c = 0; c < D; c++) {
        float av[RM], bv[8];
#pragma unroll
        for (int a = 0; a < RM; a++) av[a] = A[(r0 + a) * L + c];
#pragma unroll
        for (int k = 0; k < 8; k++) bv[k] = B[(tx + 8 * k) * L + c];
#pragma unroll
        for (int a = 0; a < RM; a++)
#pragma unroll
            for (int k = 0; k < 8; k++) s[a][k] = fmaf(av[a], bv[k], s[a][k]);
    }
}

// acc[a][k] += sum_j P[r0+a][j] * V[j][tx+8k], j < 64: this thread's 4 x D/8 piece of P V for a
// (64, 64) score tile P (row stride LS) and a (64, D) shared tile V (row stride D + 1).
template <int D>
__device__ __forceinline__ void tile_pv(float (&acc)[RM][D / 8], const float *P, const float *V, int r0, int tx) {
    constexpr int L = D + 1;
#pragma unroll 2
    for (int j = 0; j < BK; j++) {
        float p[RM];
#pragma unroll
        for (int a = 0; a < RM; a++) p[a] = P[(r0 + a) * LS + j];
#pragma unroll
        for (int k = 0; k < D / 8; k++) {
            float v = V[j * L + tx + 8 * k];
#pragma unroll
            for (int a = 0; a < RM; a++) acc[a][k] = fmaf(p[a], v, acc[a][k]);
        }
    }
}

// dst (64, D; row stride D + 1) = 64 rows of a strided global matrix starting at src (row r at
// src + r*ld), columns 0..hd-1. Rows at or past n_rows and columns at or past hd are 0, so padding
// adds nothing to any product.
template <int D, typename floatX>
__device__ __forceinline__ void load_tile(float *dst, const floatX *src, size_t ld, int n_rows, int hd) {
#pragma unroll 4
    for (int idx = threadIdx.x; idx < 64 * D; idx += NT) {
        int r = idx / D, c = idx - r * D;
        float x = 0.0f;
        if (r < n_rows && c < hd) x = to_f32(src[(size_t)r * ld + c]);
        dst[r * (D + 1) + c] = x;
    }
}

__device__ __forceinline__ float row8_max(float v) {  // over the 8 adjacent lanes of a row
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
}
__device__ __forceinline__ float row8_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v + __shfl_xor_sync(0xffffffffu, v, 4);
}

// ---- forward ----------------------------------------------------------------------------------

// Block x -> (query tile, b*NH + h), the last (longest) query tiles first.
template <typename floatX, int D, bool PAD>
__global__ void __launch_bounds__(NT) attention_forward_kernel(floatX *out, float *lse, const floatX *qkv, int B,
                                                               int T, int NH, int NKV, int hd_arg, float scale,
                                                               int n_qt) {
    constexpr int L = D + 1;
    const int hd = PAD ? hd_arg : D;
    extern __shared__ float smem[];
    float *Qs = smem, *KVs = Qs + BQ * L, *Ps = KVs + BK * L;

    const unsigned BH = (unsigned)B * (unsigned)NH;
    const int bh = (int)(blockIdx.x % BH), qt = n_qt - 1 - (int)(blockIdx.x / BH);
    const int b = bh / NH, h = bh % NH, g = h / (NH / NKV), q0 = qt * BQ;
    const size_t W = (size_t)(NH + 2 * NKV) * hd;
    const floatX *base = qkv + (size_t)b * T * W;
    const int tx = threadIdx.x % TX, r0 = (threadIdx.x / TX) * RM;

    load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * hd, W, T - q0, hd);
    float acc[RM][D / 8], m[RM], l[RM];
#pragma unroll
    for (int a = 0; a < RM; a++) {
        m[a] = -INFINITY;
        l[a] = 0.0f;
#pragma unroll
        for (int k = 0; k < D / 8; k++) acc[a][k] = 0.0f;
    }

    const int k_end = min(q0 + BQ, T);  // keys 0..k_end-1 meet some query of this tile
    for (int k0 = 0; k0 < k_end; k0 += BK) {
        __syncthreads();  // the previous tile's P V is done with KVs and Ps (first pass: nothing)
        load_tile<D>(KVs, base + (size_t)k0 * W + (size_t)(NH + g) * hd, W, T - k0, hd);
        __syncthreads();
        float s[RM][8];
        tile_abt<D>(s, Qs, KVs, r0, tx);
#pragma unroll
        for (int a = 0; a < RM; a++) {
            const int q = q0 + r0 + a;
            float mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                s[a][k] = k0 + tx + 8 * k <= q ? s[a][k] * scale : -INFINITY;
                mx = fmaxf(mx, s[a][k]);
            }
            const float m_new = fmaxf(m[a], row8_max(mx));
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing yet: no NaN
            const float corr = expf(m[a] - m_use);                  // 0 on the first tile
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float p = expf(s[a][k] - m_use);
                Ps[(r0 + a) * LS + tx + 8 * k] = p;
                sum += p;
            }
            l[a] = l[a] * corr + row8_sum(sum);
            m[a] = m_new;
#pragma unroll
            for (int k = 0; k < D / 8; k++) acc[a][k] *= corr;
        }
        __syncthreads();  // every thread is done reading K
        load_tile<D>(KVs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * hd, W, T - k0, hd);
        __syncthreads();  // V and P are visible
        tile_pv<D>(acc, Ps, KVs, r0, tx);
    }

#pragma unroll
    for (int a = 0; a < RM; a++) {
        const int q = q0 + r0 + a;
        if (q >= T) continue;
        const float inv = 1.0f / l[a];
        floatX *o = out + ((size_t)b * T + q) * ((size_t)NH * hd) + (size_t)h * hd;
#pragma unroll
        for (int k = 0; k < D / 8; k++) {
            const int c = tx + 8 * k;
            if (!PAD || c < hd) o[c] = from_f32<floatX>(acc[a][k] * inv);
        }
        if (tx == 0) lse[((size_t)b * NH + h) * T + q] = m[a] + logf(l[a]);
    }
}

// ---- backward ---------------------------------------------------------------------------------

// delta[(b*NH + h)*T + t] = dout . out over the HD columns of (b, t, h); one warp per row.
template <typename floatX>
__global__ void attention_delta_kernel(float *delta, const floatX *dout, const floatX *out, int T, int NH, int hd,
                                       size_t n_rows) {
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + t)*NH + h
    if (row >= n_rows) return;  // uniform across the warp
    const int lane = threadIdx.x % 32;
    const floatX *x = dout + row * hd, *y = out + row * hd;
    float s = 0.0f;
    for (int c = lane; c < hd; c += 32) s = fmaf(to_f32(x[c]), to_f32(y[c]), s);
    s = warp_sum(s);
    if (lane == 0) {
        const size_t bt = row / NH, b = bt / T, t = bt % T;
        const int h = (int)(row % NH);
        delta[(b * NH + h) * T + t] = s;
    }
}

// Block x -> (key tile, b*NKV + g), the first (longest) key tiles first. Thread rows are keys here,
// columns queries: st = K Q^T, so the dK / dV accumulators sit with the rows they belong to.
template <typename floatX, int D, bool PAD>
__global__ void __launch_bounds__(NT) attention_dkdv_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv,
                                                            const float *lse, const float *delta, int B, int T,
                                                            int NH, int NKV, int hd_arg, float scale) {
    constexpr int L = D + 1;
    const int hd = PAD ? hd_arg : D;
    extern __shared__ float smem[];
    float *Ks = smem, *Vs = Ks + BK * L, *Qs = Vs + BK * L, *dOs = Qs + BQ * L;
    float *PdS = dOs + BQ * L;              // P^T, then dS^T (64 x LS)
    float *lse_s = PdS + BK * LS, *delta_s = lse_s + BQ;

    const unsigned BG = (unsigned)B * (unsigned)NKV;
    const int bg = (int)(blockIdx.x % BG), kt = (int)(blockIdx.x / BG);
    const int b = bg / NKV, g = bg % NKV, group = NH / NKV, k0 = kt * BK;
    const size_t W = (size_t)(NH + 2 * NKV) * hd, OS = (size_t)NH * hd;
    const floatX *base = qkv + (size_t)b * T * W, *dObase = dout + (size_t)b * T * OS;
    const int tid = threadIdx.x, tx = tid % TX, r0 = (tid / TX) * RM;

    load_tile<D>(Ks, base + (size_t)k0 * W + (size_t)(NH + g) * hd, W, T - k0, hd);
    load_tile<D>(Vs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * hd, W, T - k0, hd);
    float dk[RM][D / 8], dv[RM][D / 8];
#pragma unroll
    for (int a = 0; a < RM; a++)
#pragma unroll
        for (int k = 0; k < D / 8; k++) dk[a][k] = dv[a][k] = 0.0f;

    for (int h = g * group; h < (g + 1) * group; h++) {
        const float *lse_h = lse + ((size_t)b * NH + h) * T, *delta_h = delta + ((size_t)b * NH + h) * T;
        for (int q0 = k0 / BQ * BQ; q0 < T; q0 += BQ) {  // query tiles at or below the diagonal
            __syncthreads();  // the previous tile is done with Qs, dOs, PdS (first pass: K, V loads)
            load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * hd, W, T - q0, hd);
            load_tile<D>(dOs, dObase + (size_t)q0 * OS + (size_t)h * hd, OS, T - q0, hd);
            if (tid < BQ) {
                const bool in = q0 + tid < T;
                lse_s[tid] = in ? lse_h[q0 + tid] : 0.0f;
                delta_s[tid] = in ? delta_h[q0 + tid] : 0.0f;
            }
            __syncthreads();
            float f[RM][8];                    // P^T, then dS^T: one 4 x 8 piece live at a time
            tile_abt<D>(f, Ks, Qs, r0, tx);    // S^T = K Q^T
#pragma unroll
            for (int a = 0; a < RM; a++) {
                const int j = k0 + r0 + a;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const int i = tx + 8 * k, q = q0 + i;
                    PdS[(r0 + a) * LS + i] = j <= q && q < T ? expf(f[a][k] * scale - lse_s[i]) : 0.0f;
                }
            }
            __syncthreads();
            tile_pv<D>(dv, PdS, dOs, r0, tx);  // dV += P^T dO
            tile_abt<D>(f, Vs, dOs, r0, tx);   // dP^T = V dO^T
#pragma unroll
            for (int a = 0; a < RM; a++)       // dS^T from this thread's own P^T entries
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const int i = tx + 8 * k;
                    f[a][k] = PdS[(r0 + a) * LS + i] * (f[a][k] - delta_s[i]) * scale;
                }
            __syncthreads();  // every thread is done reading P^T
#pragma unroll
            for (int a = 0; a < RM; a++)
#pragma unroll
                for (int k = 0; k < 8; k++) PdS[(r0 + a) * LS + tx + 8 * k] = f[a][k];
            __syncthreads();
            tile_pv<D>(dk, PdS, Qs, r0, tx);   // dK += dS^T Q
        }
    }

#pragma unroll
    for (int a = 0; a < RM; a++) {
        const int j = k0 + r0 + a;
        if (j >= T) continue;
        floatX *row = dqkv + ((size_t)b * T + j) * W;
#pragma unroll
        for (int k = 0; k < D / 8; k++) {
            const int c = tx + 8 * k;
            if (PAD && c >= hd) continue;
            row[(size_t)(NH + g) * hd + c] = from_f32<floatX>(dk[a][k]);
            row[(size_t)(NH + NKV + g) * hd + c] = from_f32<floatX>(dv[a][k]);
        }
    }
}

// Block x -> (query tile, b*NH + h), the last (longest) query tiles first. V then K of each key tile
// pass through one buffer: dP = dO V^T first, then S = Q K^T, dS, and dQ += dS K.
template <typename floatX, int D, bool PAD>
__global__ void __launch_bounds__(NT) attention_dq_kernel(floatX *dqkv, const floatX *dout, const floatX *qkv,
                                                          const float *lse, const float *delta, int B, int T,
                                                          int NH, int NKV, int hd_arg, float scale, int n_qt) {
    constexpr int L = D + 1;
    const int hd = PAD ? hd_arg : D;
    extern __shared__ float smem[];
    float *Qs = smem, *dOs = Qs + BQ * L, *KVs = dOs + BQ * L, *dSs = KVs + BK * L;

    const unsigned BH = (unsigned)B * (unsigned)NH;
    const int bh = (int)(blockIdx.x % BH), qt = n_qt - 1 - (int)(blockIdx.x / BH);
    const int b = bh / NH, h = bh % NH, g = h / (NH / NKV), q0 = qt * BQ;
    const size_t W = (size_t)(NH + 2 * NKV) * hd, OS = (size_t)NH * hd;
    const floatX *base = qkv + (size_t)b * T * W;
    const int tx = threadIdx.x % TX, r0 = (threadIdx.x / TX) * RM;

    load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * hd, W, T - q0, hd);
    load_tile<D>(dOs, dout + (size_t)b * T * OS + (size_t)q0 * OS + (size_t)h * hd, OS, T - q0, hd);
    float lse_r[RM], delta_r[RM], acc[RM][D / 8];
#pragma unroll
    for (int a = 0; a < RM; a++) {
        const int q = q0 + r0 + a;
        const size_t at = ((size_t)b * NH + h) * T + q;
        lse_r[a] = q < T ? lse[at] : 0.0f;
        delta_r[a] = q < T ? delta[at] : 0.0f;
#pragma unroll
        for (int k = 0; k < D / 8; k++) acc[a][k] = 0.0f;
    }

    const int k_end = min(q0 + BQ, T);
    for (int k0 = 0; k0 < k_end; k0 += BK) {
        __syncthreads();  // the previous dS K is done with KVs and dSs
        load_tile<D>(KVs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * hd, W, T - k0, hd);
        __syncthreads();
        float dp[RM][8], s[RM][8];
        tile_abt<D>(dp, dOs, KVs, r0, tx);  // dP = dO V^T
        __syncthreads();  // every thread is done reading V
        load_tile<D>(KVs, base + (size_t)k0 * W + (size_t)(NH + g) * hd, W, T - k0, hd);
        __syncthreads();
        tile_abt<D>(s, Qs, KVs, r0, tx);    // S = Q K^T
#pragma unroll
        for (int a = 0; a < RM; a++) {
            const int q = q0 + r0 + a;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const int j = k0 + tx + 8 * k;
                const float p = j <= q && q < T ? expf(s[a][k] * scale - lse_r[a]) : 0.0f;
                dSs[(r0 + a) * LS + tx + 8 * k] = p * (dp[a][k] - delta_r[a]) * scale;
            }
        }
        __syncthreads();
        tile_pv<D>(acc, dSs, KVs, r0, tx);  // dQ += dS K
    }

#pragma unroll
    for (int a = 0; a < RM; a++) {
        const int q = q0 + r0 + a;
        if (q >= T) continue;
        floatX *row = dqkv + ((size_t)b * T + q) * W + (size_t)h * hd;
#pragma unroll
        for (int k = 0; k < D / 8; k++) {
            const int c = tx + 8 * k;
            if (!PAD || c < hd) row[c] = from_f32<floatX>(acc[a][k]);
        }
    }
}

// ---- decode -----------------------------------------------------------------------------------

constexpr int DEC_NT = 128;  // threads per block = keys per chunk = the largest HD
static_assert(DEC_NT >= HD_MAX, "one thread per output column");

template <typename floatX>
__global__ void __launch_bounds__(DEC_NT) attention_decode_kernel(floatX *out, const floatX *q, const floatX *k_cache,
                                                                  const floatX *v_cache, int n_ctx, int NH, int NKV,
                                                                  int hd, float scale) {
    __shared__ float qs[HD_MAX], sc[DEC_NT], ps[DEC_NT];
    const int h = blockIdx.x, g = h / (NH / NKV), tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const size_t stride = (size_t)NKV * hd;
    const floatX *kh = k_cache + (size_t)g * hd, *vh = v_cache + (size_t)g * hd;
    if (tid < hd) qs[tid] = to_f32(q[(size_t)h * hd + tid]);
    __syncthreads();

    float m = -INFINITY, l = 0.0f, acc = 0.0f;  // every thread keeps the same m and l
    for (int j0 = 0; j0 < n_ctx; j0 += DEC_NT) {
        const int n = min(DEC_NT, n_ctx - j0);
        for (int j = warp; j < n; j += DEC_NT / 32) {  // warp-uniform loop: one key per warp
            const floatX *kj = kh + (size_t)(j0 + j) * stride;
            float s = 0.0f;
            for (int c = lane; c < hd; c += 32) s = fmaf(qs[c], to_f32(kj[c]), s);
            s = warp_sum(s);
            if (lane == 0) sc[j] = s * scale;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int j = lane; j < n; j += 32) mx = fmaxf(mx, sc[j]);
        const float m_new = fmaxf(m, warp_max(mx));
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float corr = expf(m - m_use);
        if (tid < n) ps[tid] = expf(sc[tid] - m_use);
        __syncthreads();
        float sum = 0.0f;
        for (int j = lane; j < n; j += 32) sum += ps[j];
        l = l * corr + warp_sum(sum);
        m = m_new;
        if (tid < hd) {
            float a = acc * corr;
            for (int j = 0; j < n; j++) a = fmaf(ps[j], to_f32(vh[(size_t)(j0 + j) * stride + tid]), a);
            acc = a;
        }
        __syncthreads();  // sc and ps are rewritten by the next chunk
    }
    if (tid < hd) out[(size_t)h * hd + tid] = from_f32<floatX>(acc / l);
}

// ---- host side --------------------------------------------------------------------------------

constexpr size_t fwd_smem(int D) { return sizeof(float) * ((size_t)(BQ + BK) * (D + 1) + (size_t)BQ * LS); }
constexpr size_t dq_smem(int D) { return sizeof(float) * ((size_t)(2 * BQ + BK) * (D + 1) + (size_t)BQ * LS); }
constexpr size_t dkdv_smem(int D) {
    return sizeof(float) * ((size_t)(2 * BK + 2 * BQ) * (D + 1) + (size_t)BK * LS + 2 * BQ);
}

template <typename floatX, int D, bool PAD>
void launch_forward(floatX *out, float *lse, const floatX *qkv, int B, int T, int NH, int NKV, int HD, float scale) {
    const int n_qt = (T + BQ - 1) / BQ;
    const size_t blocks = (size_t)n_qt * B * NH, smem = fwd_smem(D);
    auto kernel = attention_forward_kernel<floatX, D, PAD>;
    if (!sl_cuda_grid_ok(blocks, "cuda_attention_forward") || !sl_cuda_allow_smem(kernel, smem)) return;
    kernel<<<(unsigned)blocks, NT, smem, sl_cuda_stream()>>>(out, lse, qkv, B, T, NH, NKV, HD, scale, n_qt);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX, int D, bool PAD>
void launch_backward(floatX *dqkv, const floatX *dout, const floatX *qkv, const float *lse, const float *delta, int B,
                     int T, int NH, int NKV, int HD, float scale) {
    const int n_t = (T + BQ - 1) / BQ;
    const size_t kv_blocks = (size_t)n_t * B * NKV, q_blocks = (size_t)n_t * B * NH;
    auto dkdv = attention_dkdv_kernel<floatX, D, PAD>;
    auto dq = attention_dq_kernel<floatX, D, PAD>;
    if (!sl_cuda_grid_ok(q_blocks, "cuda_attention_backward") || !sl_cuda_allow_smem(dkdv, dkdv_smem(D)) ||
        !sl_cuda_allow_smem(dq, dq_smem(D)))
        return;
    dkdv<<<(unsigned)kv_blocks, NT, dkdv_smem(D), sl_cuda_stream()>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV, HD,
                                                                      scale);
    CUDA_LAUNCH_CHECK();
    dq<<<(unsigned)q_blocks, NT, dq_smem(D), sl_cuda_stream()>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV, HD, scale,
                                                                 n_t);
    CUDA_LAUNCH_CHECK();
}

// Calls FN<X, D, PAD>(...) for the compile-time width D that holds hd (1 <= hd <= 128, checked
// first): the exact instance, or the next one up with the columns past hd zero-padded.
#define ATT_DISPATCH(X, hd, FN, ...)                               \
    do {                                                           \
        switch (hd) {                                              \
        case 8: FN<X, 8, false>(__VA_ARGS__); break;               \
        case 16: FN<X, 16, false>(__VA_ARGS__); break;             \
        case 32: FN<X, 32, false>(__VA_ARGS__); break;             \
        case 64: FN<X, 64, false>(__VA_ARGS__); break;             \
        case 80: FN<X, 80, false>(__VA_ARGS__); break;             \
        case 96: FN<X, 96, false>(__VA_ARGS__); break;             \
        case 128: FN<X, 128, false>(__VA_ARGS__); break;           \
        default:                                                   \
            if ((hd) < 8) FN<X, 8, true>(__VA_ARGS__);             \
            else if ((hd) < 32) FN<X, 32, true>(__VA_ARGS__);      \
            else if ((hd) < 64) FN<X, 64, true>(__VA_ARGS__);      \
            else FN<X, 128, true>(__VA_ARGS__);                    \
        }                                                          \
    } while (0)

// Shapes every entry point accepts; records why not and returns false otherwise.
bool shape_ok(const char *what, int NH, int NKV, int HD) {
    if (HD < 1 || HD > HD_MAX) {
        sl_cuda_record_failure("%s: head_dim %d is not supported (1..%d)", what, HD, HD_MAX);
        return false;
    }
    if (NH < 1 || NKV < 1 || NH % NKV != 0) {
        sl_cuda_record_failure("%s: n_head %d is not a multiple of n_kv_head %d", what, NH, NKV);
        return false;
    }
    return true;
}

// delta's scratch (B*NH*T floats): grows when a call needs more, kept for the life of the process.
float *delta_buffer(size_t n) {
    static sl_cuda_scratch delta;
    return (float *)sl_cuda_scratch_get(&delta, n * sizeof(float), "attention's delta scratch");
}

// The kernels are plain causal: a sliding window shorter than T is a failure (the model refuses it
// before, since this backend's table says sliding_window = 0).
bool window_ok(const char *op, int window, int T) {
    if (window <= 0 || window >= T) return true;
    sl_cuda_record_failure("%s: sliding-window attention (window %d < T %d) is not implemented on the GPU", op, window, T);
    return false;
}

}  // namespace

template <typename floatX>
void cuda_attention_forward(sl_act *out, float *lse, const sl_act *qkv, int B, int T, int NH, int NKV, int HD,
                            int window) {
    if (!shape_ok("cuda_attention_forward", NH, NKV, HD) || !window_ok("cuda_attention_forward", window, T) || B <= 0 ||
        T <= 0)
        return;
    const float scale = 1.0f / sqrtf((float)HD);
    // the first kernels that take the call (attention_choice.h notes which: the benchmarks record it)
    if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
        __nv_bfloat16 *o = as_storage<floatX>(out);
        const __nv_bfloat16 *x = as_storage<floatX>(qkv);
        int kind = -1;
        if (attention_cudnn_forward(o, lse, x, B, T, NH, NKV, HD, scale)) kind = SL_ATTENTION_CUDNN;
        else if (attention_mma_forward(o, lse, x, B, T, NH, NKV, HD, scale)) kind = SL_ATTENTION_MMA;
        else if (attention_tc_forward(o, lse, x, B, T, NH, NKV, HD, scale)) kind = SL_ATTENTION_TC;
        if (kind >= 0) {
            sl_attention_note_ran(kind);
            return;
        }
    }
    sl_attention_note_ran(SL_ATTENTION_SIMT);
    ATT_DISPATCH(floatX, HD, launch_forward, as_storage<floatX>(out), lse, as_storage<floatX>(qkv), B, T, NH, NKV, HD,
                 scale);
}

template <typename floatX>
void cuda_attention_backward(sl_act *dqkv, const sl_act *dout, const sl_act *qkv, const sl_act *out,
                             const float *lse, int B, int T, int NH, int NKV, int HD, int window) {
    if (!shape_ok("cuda_attention_backward", NH, NKV, HD) || !window_ok("cuda_attention_backward", window, T) ||
        B <= 0 || T <= 0)
        return;
    const float scale = 1.0f / sqrtf((float)HD);
    if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {  // cuDNN makes its own row sums (delta)
        if (attention_cudnn_backward(as_storage<floatX>(dqkv), as_storage<floatX>(dout), as_storage<floatX>(qkv),
                                     as_storage<floatX>(out), lse, B, T, NH, NKV, HD, scale)) {
            sl_attention_note_ran(SL_ATTENTION_CUDNN);
            return;
        }
    }
    const size_t rows = (size_t)B * T * NH;
    float *delta = delta_buffer(rows);
    if (!delta) return;
    const int warps = 8;
    if (!sl_cuda_grid_ok((rows + warps - 1) / warps, "cuda_attention_backward")) return;
    attention_delta_kernel<floatX><<<(unsigned)((rows + warps - 1) / warps), warps * 32, 0, sl_cuda_stream()>>>(
        delta, as_storage<floatX>(dout), as_storage<floatX>(out), T, NH, HD, rows);
    CUDA_LAUNCH_CHECK();
    if constexpr (std::is_same<floatX, __nv_bfloat16>::value) {
        __nv_bfloat16 *dx = as_storage<floatX>(dqkv);
        const __nv_bfloat16 *dy = as_storage<floatX>(dout), *x = as_storage<floatX>(qkv);
        int kind = -1;
        if (attention_mma_backward(dx, dy, x, lse, delta, B, T, NH, NKV, HD, scale)) kind = SL_ATTENTION_MMA;
        else if (attention_tc_backward(dx, dy, x, lse, delta, B, T, NH, NKV, HD, scale)) kind = SL_ATTENTION_TC;
        if (kind >= 0) {
            sl_attention_note_ran(kind);
            return;
        }
    }
    sl_attention_note_ran(SL_ATTENTION_SIMT);
    ATT_DISPATCH(floatX, HD, launch_backward, as_storage<floatX>(dqkv), as_storage<floatX>(dout),
                 as_storage<floatX>(qkv), lse, delta, B, T, NH, NKV, HD, scale);
}

template <typename floatX>
void cuda_attention_decode(sl_act *out, const sl_act *q, const sl_act *k_cache, const sl_act *v_cache, int n_ctx,
                           int NH, int NKV, int HD) {
    if (!shape_ok("cuda_attention_decode", NH, NKV, HD)) return;
    if (n_ctx < 1) {
        sl_cuda_record_failure("cuda_attention_decode: n_ctx %d (the cache holds at least the current position)",
                               n_ctx);
        return;
    }
    const float scale = 1.0f / sqrtf((float)HD);
    attention_decode_kernel<floatX><<<NH, DEC_NT, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), as_storage<floatX>(q), as_storage<floatX>(k_cache), as_storage<floatX>(v_cache), n_ctx,
        NH, NKV, HD, scale);
    CUDA_LAUNCH_CHECK();
}

SL_CUDA_STORAGE_INSTANCES(cuda_attention_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_attention_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_attention_decode)
