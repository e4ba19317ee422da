// attention_tc.cu: fused causal flash attention (flash-attention-2 style) on the tensor cores for bf16
// activation storage (attention_tc.cuh): every product of two tiles is a bf16 WMMA with fp32
// accumulation; softmax, masking and the running statistics are fp32 on the CUDA cores. Deterministic
// (fixed loop and shuffle order, each output written once, no atomics). The algorithm, numerics,
// invariants and limits are in docs/gpu.md, "Attention on the tensor cores (attention_tc.cu)".
#include "shardlm/settings.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/attention_tc.cuh"
#include "ops/cuda/attention_tc_call.cuh"

#include <math.h>
#include <mma.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;

namespace {

typedef __nv_bfloat16 bf16;
constexpr int TILE = 64;          // queries or keys per tile
constexpr int WARPS = 4;
constexpr int THREADS = WARPS * 32;
constexpr int WR = TILE / WARPS;  // rows per warp (16)
constexpr int SS = TILE + 4;      // row stride of an fp32 score tile (floats)
constexpr int PS = TILE + 8;      // row stride of a bf16 probability tile (elements)

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragBRow;  // B[k][n] at p[k*ld + n]
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBCol;  // B[k][n] at p[n*ld + k]
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;

// Byte sizes of the shared-memory pieces (each a multiple of 32 bytes, so every piece and every
// 16-row / 16-column fragment in it is 32-byte aligned as WMMA requires).
template <int D> struct Smem {
    static constexpr int DS = D + 8;  // row stride of a bf16 (64, D) tile
    static constexpr int OS = D + 4;  // row stride of an fp32 (64, D) tile
    static constexpr size_t tile = sizeof(bf16) * TILE * DS;
    static constexpr size_t scores = sizeof(float) * TILE * SS;
    static constexpr size_t probs = sizeof(bf16) * TILE * PS;
    static constexpr size_t acc = sizeof(float) * TILE * OS;
    static constexpr size_t forward = 3 * tile + scores + probs + acc + sizeof(float) * TILE;
    static constexpr size_t dkdv = 4 * tile + 2 * scores + 2 * probs + 2 * sizeof(float) * TILE;
    static constexpr size_t dq = 4 * tile + 2 * scores + probs;
    static_assert(acc <= 2 * tile, "the fp32 output staging fits in two bf16 tiles");
};

// dst (64, D; row stride D + 8) = rows 0..63 of a global matrix at src (row r at src + r*ld),
// rows at or past n_rows zero-filled; 16-byte vectors.
template <int D> __device__ __forceinline__ void load_tile(bf16 *dst, const bf16 *src, size_t ld, int n_rows) {
    constexpr int CH = D / 8;  // 16-byte chunks a row
#pragma unroll 4
    for (int i = threadIdx.x; i < TILE * CH; i += THREADS) {
        const int r = i / CH, c = (i - r * CH) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r < n_rows) v = *reinterpret_cast<const uint4 *>(src + (size_t)r * ld + c);
        *reinterpret_cast<uint4 *>(dst + r * Smem<D>::DS + c) = v;
    }
}

// Rows r0..r0+15 of an fp32 (64, D) staging tile (row stride D + 4), divided by denom[r] when
// denom is given, rounded to bf16 into global rows (row r at dst + r*ld) that are below n_rows. One warp.
template <int D>
__device__ __forceinline__ void store_rows(bf16 *dst, size_t ld, const float *src, const float *denom, int r0,
                                           int n_rows) {
    constexpr int CH = D / 8;
    for (int i = threadIdx.x % 32; i < WR * CH; i += 32) {
        const int r = r0 + i / CH, c = (i % CH) * 8;
        if (r >= n_rows) continue;
        uint4 pack;
        bf16 *pv = reinterpret_cast<bf16 *>(&pack);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float x = src[r * Smem<D>::OS + c + e];
            pv[e] = __float2bfloat16_rn(denom ? x / denom[r] : x);
        }
        *reinterpret_cast<uint4 *>(dst + (size_t)r * ld + c) = pack;
    }
}

// C (16 x 16, fp32 at dst, row stride SS) = A (16 rows of a bf16 tile at a) times the transpose of
// B (16 rows of a bf16 tile at b): the rows' dot products over D columns.
template <int D> __device__ __forceinline__ void rows_dot(float *dst, const bf16 *a, const bf16 *b) {
    FragC c;
    wmma::fill_fragment(c, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; k++) {
        FragA fa;
        FragBCol fb;
        wmma::load_matrix_sync(fa, a + k * 16, Smem<D>::DS);
        wmma::load_matrix_sync(fb, b + k * 16, Smem<D>::DS);
        wmma::mma_sync(c, fa, fb, c);
    }
    wmma::store_matrix_sync(dst, c, SS, wmma::mem_row_major);
}

__device__ __forceinline__ float pair_max(float v) { return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); }
__device__ __forceinline__ float pair_sum(float v) { return v + __shfl_xor_sync(0xffffffffu, v, 1); }

// ---- forward ----------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(THREADS) tc_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, int B, int T,
                                                             int NH, int NKV, float scale, int n_qt) {
    typedef Smem<D> S;
    extern __shared__ float smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem), *Ks = Qs + TILE * S::DS, *Vs = Ks + TILE * S::DS;
    float *Sf = reinterpret_cast<float *>(Vs + TILE * S::DS);
    bf16 *Pb = reinterpret_cast<bf16 *>(Sf + TILE * SS);
    float *Of = reinterpret_cast<float *>(Pb + TILE * PS), *Ls = Of + TILE * S::OS;

    const unsigned BH = (unsigned)B * (unsigned)NH;
    const int bh = (int)(blockIdx.x % BH), qt = n_qt - 1 - (int)(blockIdx.x / BH);
    const int b = bh / NH, h = bh % NH, g = h / (NH / NKV), q0 = qt * TILE;
    const size_t W = (size_t)(NH + 2 * NKV) * D;
    const bf16 *base = qkv + (size_t)b * T * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wr = warp * WR;
    const int row = wr + lane / 2, half = lane % 2, q = q0 + row;

    load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * D, W, T - q0);
    for (int i = lane; i < WR * S::OS; i += 32) Of[wr * S::OS + i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const int k_end = min(q0 + TILE, T);
    for (int k0 = 0; k0 < k_end; k0 += TILE) {
        __syncthreads();  // the previous tile's products are done with Ks and Vs
        load_tile<D>(Ks, base + (size_t)k0 * W + (size_t)(NH + g) * D, W, T - k0);
        load_tile<D>(Vs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * D, W, T - k0);
        __syncthreads();
        // key blocks of 16 this warp's rows can see: all, or on the diagonal those up to its own
        const int nkb = k0 == q0 ? warp + 1 : TILE / 16;
        for (int n = 0; n < nkb; n++) rows_dot<D>(Sf + wr * SS + n * 16, Qs + wr * S::DS, Ks + n * 16 * S::DS);
        __syncwarp();
        float mx = -INFINITY;
#pragma unroll 8
        for (int j = 0; j < TILE / 2; j++) {
            const int c = 2 * j + half;
            const float s = k0 + c <= q ? Sf[row * SS + c] * scale : -INFINITY;
            Sf[row * SS + c] = s;
            mx = fmaxf(mx, s);
        }
        const float m_new = fmaxf(m, pair_max(mx));
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing yet: no NaN
        const float corr = expf(m - m_use);                     // 0 on the first tile
        float sum = 0.0f;
#pragma unroll 8
        for (int j = 0; j < TILE / 2; j++) {
            const int c = 2 * j + half;
            const float p = expf(Sf[row * SS + c] - m_use);
            sum += p;
            Pb[row * PS + c] = __float2bfloat16_rn(p);
        }
        l = l * corr + pair_sum(sum);
        m = m_new;
        for (int j = 0; j < D / 2; j++) Of[row * S::OS + 2 * j + half] *= corr;
        __syncwarp();
        for (int n = 0; n < D / 16; n++) {
            FragC o;
            wmma::load_matrix_sync(o, Of + wr * S::OS + n * 16, S::OS, wmma::mem_row_major);
            for (int k = 0; k < nkb; k++) {
                FragA fp;
                FragBRow fv;
                wmma::load_matrix_sync(fp, Pb + wr * PS + k * 16, PS);
                wmma::load_matrix_sync(fv, Vs + k * 16 * S::DS + n * 16, S::DS);
                wmma::mma_sync(o, fp, fv, o);
            }
            __syncwarp();  // every lane's load of this Of tile is done before it is overwritten
            wmma::store_matrix_sync(Of + wr * S::OS + n * 16, o, S::OS, wmma::mem_row_major);
        }
        __syncwarp();  // Of is visible to every lane of the warp for the next rescale
    }
    if (half == 0) {
        Ls[row] = l;
        if (q < T) lse[(size_t)bh * T + q] = m + logf(l);
    }
    __syncwarp();
    store_rows<D>(out + ((size_t)b * T + q0) * NH * D + (size_t)h * D, (size_t)NH * D, Of, Ls, wr, T - q0);
}

// ---- backward ---------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(THREADS) tc_dkdv_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                                          const float *lse, const float *delta, int B, int T, int NH,
                                                          int NKV, float scale) {
    typedef Smem<D> S;
    extern __shared__ float smem[];
    bf16 *Ks = reinterpret_cast<bf16 *>(smem), *Vs = Ks + TILE * S::DS, *Qs = Vs + TILE * S::DS;
    bf16 *dOs = Qs + TILE * S::DS;
    float *St = reinterpret_cast<float *>(dOs + TILE * S::DS), *dPt = St + TILE * SS;
    bf16 *Pb = reinterpret_cast<bf16 *>(dPt + TILE * SS), *dSb = Pb + TILE * PS;
    float *lse_s = reinterpret_cast<float *>(dSb + TILE * PS), *delta_s = lse_s + TILE;

    const unsigned BG = (unsigned)B * (unsigned)NKV;
    const int bg = (int)(blockIdx.x % BG), kt = (int)(blockIdx.x / BG);  // key tile 0 (the most work) first
    const int b = bg / NKV, g = bg % NKV, k0 = kt * TILE, group = NH / NKV;
    const size_t W = (size_t)(NH + 2 * NKV) * D, WO = (size_t)NH * D;
    const bf16 *base = qkv + (size_t)b * T * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wr = warp * WR;
    const int row = wr + lane / 2, half = lane % 2, key = k0 + row;

    load_tile<D>(Ks, base + (size_t)k0 * W + (size_t)(NH + g) * D, W, T - k0);
    load_tile<D>(Vs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * D, W, T - k0);
    FragC dK[D / 16], dV[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
        wmma::fill_fragment(dK[n], 0.0f);
        wmma::fill_fragment(dV[n], 0.0f);
    }
    for (int j = 0; j < group; j++) {
        const int h = g * group + j;
        for (int q0 = k0; q0 < T; q0 += TILE) {  // query tiles from the diagonal on
            __syncthreads();  // the previous query tile is done with Qs, dOs and the statistics
            load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * D, W, T - q0);
            load_tile<D>(dOs, dout + ((size_t)b * T + q0) * WO + (size_t)h * D, WO, T - q0);
            for (int i = threadIdx.x; i < TILE; i += THREADS) {
                const int qq = q0 + i;
                lse_s[i] = qq < T ? lse[((size_t)b * NH + h) * T + qq] : INFINITY;
                delta_s[i] = qq < T ? delta[((size_t)b * NH + h) * T + qq] : 0.0f;
            }
            __syncthreads();
            // query blocks of 16 with a query at or after one of this warp's keys: on the diagonal
            // the blocks from the warp's own on
            const int n0 = q0 == k0 ? warp : 0;
            for (int n = n0; n < TILE / 16; n++) {
                rows_dot<D>(St + wr * SS + n * 16, Ks + wr * S::DS, Qs + n * 16 * S::DS);
                rows_dot<D>(dPt + wr * SS + n * 16, Vs + wr * S::DS, dOs + n * 16 * S::DS);
            }
            __syncwarp();
#pragma unroll 8
            for (int jj = 0; jj < TILE / 2; jj++) {
                const int c = 2 * jj + half, qq = q0 + c;
                float p = 0.0f, ds = 0.0f;
                if (qq >= key && qq < T) {  // causal: the key is at or before the query
                    p = expf(St[row * SS + c] * scale - lse_s[c]);
                    ds = p * (dPt[row * SS + c] - delta_s[c]) * scale;
                }
                Pb[row * PS + c] = __float2bfloat16_rn(p);
                dSb[row * PS + c] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
            for (int k = n0; k < TILE / 16; k++) {
                FragA fp, fds;
                wmma::load_matrix_sync(fp, Pb + wr * PS + k * 16, PS);
                wmma::load_matrix_sync(fds, dSb + wr * PS + k * 16, PS);
#pragma unroll
                for (int n = 0; n < D / 16; n++) {
                    FragBRow fdo, fq;
                    wmma::load_matrix_sync(fdo, dOs + k * 16 * S::DS + n * 16, S::DS);
                    wmma::mma_sync(dV[n], fp, fdo, dV[n]);
                    wmma::load_matrix_sync(fq, Qs + k * 16 * S::DS + n * 16, S::DS);
                    wmma::mma_sync(dK[n], fds, fq, dK[n]);
                }
            }
        }
    }
    __syncthreads();  // everyone is done with Qs and dOs: they become the fp32 staging tile
    float *stage = reinterpret_cast<float *>(Qs);
    bf16 *dst = dqkv + ((size_t)b * T + k0) * W;
#pragma unroll
    for (int n = 0; n < D / 16; n++)
        wmma::store_matrix_sync(stage + wr * S::OS + n * 16, dK[n], S::OS, wmma::mem_row_major);
    __syncwarp();
    store_rows<D>(dst + (size_t)(NH + g) * D, W, stage, nullptr, wr, T - k0);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 16; n++)
        wmma::store_matrix_sync(stage + wr * S::OS + n * 16, dV[n], S::OS, wmma::mem_row_major);
    __syncwarp();
    store_rows<D>(dst + (size_t)(NH + NKV + g) * D, W, stage, nullptr, wr, T - k0);
}

template <int D>
__global__ void __launch_bounds__(THREADS) tc_dq_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *qkv,
                                                        const float *lse, const float *delta, int B, int T, int NH,
                                                        int NKV, float scale, int n_qt) {
    typedef Smem<D> S;
    extern __shared__ float smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(smem), *dOs = Qs + TILE * S::DS, *Ks = dOs + TILE * S::DS;
    bf16 *Vs = Ks + TILE * S::DS;
    float *Sf = reinterpret_cast<float *>(Vs + TILE * S::DS), *dPf = Sf + TILE * SS;
    bf16 *dSb = reinterpret_cast<bf16 *>(dPf + TILE * SS);

    const unsigned BH = (unsigned)B * (unsigned)NH;
    const int bh = (int)(blockIdx.x % BH), qt = n_qt - 1 - (int)(blockIdx.x / BH);
    const int b = bh / NH, h = bh % NH, g = h / (NH / NKV), q0 = qt * TILE;
    const size_t W = (size_t)(NH + 2 * NKV) * D, WO = (size_t)NH * D;
    const bf16 *base = qkv + (size_t)b * T * W;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wr = warp * WR;
    const int row = wr + lane / 2, half = lane % 2, q = q0 + row;
    const float my_lse = q < T ? lse[(size_t)bh * T + q] : 0.0f;
    const float my_delta = q < T ? delta[(size_t)bh * T + q] : 0.0f;

    load_tile<D>(Qs, base + (size_t)q0 * W + (size_t)h * D, W, T - q0);
    load_tile<D>(dOs, dout + ((size_t)b * T + q0) * WO + (size_t)h * D, WO, T - q0);
    FragC dQ[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; n++) wmma::fill_fragment(dQ[n], 0.0f);
    for (int k0 = 0; k0 <= q0; k0 += TILE) {  // key tiles up to the diagonal
        __syncthreads();  // the previous key tile's products are done with Ks
        load_tile<D>(Ks, base + (size_t)k0 * W + (size_t)(NH + g) * D, W, T - k0);
        load_tile<D>(Vs, base + (size_t)k0 * W + (size_t)(NH + NKV + g) * D, W, T - k0);
        __syncthreads();
        const int nkb = k0 == q0 ? warp + 1 : TILE / 16;
        for (int n = 0; n < nkb; n++) {
            rows_dot<D>(Sf + wr * SS + n * 16, Qs + wr * S::DS, Ks + n * 16 * S::DS);
            rows_dot<D>(dPf + wr * SS + n * 16, dOs + wr * S::DS, Vs + n * 16 * S::DS);
        }
        __syncwarp();
#pragma unroll 8
        for (int jj = 0; jj < TILE / 2; jj++) {
            const int c = 2 * jj + half;
            float ds = 0.0f;
            if (k0 + c <= q && q < T) {
                const float p = expf(Sf[row * SS + c] * scale - my_lse);
                ds = p * (dPf[row * SS + c] - my_delta) * scale;
            }
            dSb[row * PS + c] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
        for (int k = 0; k < nkb; k++) {
            FragA fds;
            wmma::load_matrix_sync(fds, dSb + wr * PS + k * 16, PS);
#pragma unroll
            for (int n = 0; n < D / 16; n++) {
                FragBRow fk;
                wmma::load_matrix_sync(fk, Ks + k * 16 * S::DS + n * 16, S::DS);
                wmma::mma_sync(dQ[n], fds, fk, dQ[n]);
            }
        }
    }
    __syncthreads();  // everyone is done with Qs and dOs: they become the fp32 staging tile
    float *stage = reinterpret_cast<float *>(Qs);
#pragma unroll
    for (int n = 0; n < D / 16; n++)
        wmma::store_matrix_sync(stage + wr * S::OS + n * 16, dQ[n], S::OS, wmma::mem_row_major);
    __syncwarp();
    store_rows<D>(dqkv + ((size_t)b * T + q0) * W + (size_t)h * D, W, stage, nullptr, wr, T - q0);
}

// ---- host side --------------------------------------------------------------------------------

template <int D>
void launch_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV, float scale) {
    const int n_qt = (T + TILE - 1) / TILE;
    const size_t blocks = (size_t)n_qt * B * NH;
    auto kernel = tc_forward_kernel<D>;
    if (!sl_cuda_grid_ok(blocks, "cuda_attention_forward") || !sl_cuda_allow_smem(kernel, Smem<D>::forward)) return;
    kernel<<<(unsigned)blocks, THREADS, Smem<D>::forward, sl_cuda_stream()>>>(out, lse, qkv, B, T, NH, NKV, scale, n_qt);
    CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta, int B,
                     int T, int NH, int NKV, float scale) {
    const int n_t = (T + TILE - 1) / TILE;
    const size_t kv_blocks = (size_t)n_t * B * NKV, q_blocks = (size_t)n_t * B * NH;
    auto dkdv = tc_dkdv_kernel<D>;
    auto dq = tc_dq_kernel<D>;
    if (!sl_cuda_grid_ok(q_blocks, "cuda_attention_backward") || !sl_cuda_allow_smem(dkdv, Smem<D>::dkdv) ||
        !sl_cuda_allow_smem(dq, Smem<D>::dq))
        return;
    dkdv<<<(unsigned)kv_blocks, THREADS, Smem<D>::dkdv, sl_cuda_stream()>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV,
                                                                            scale);
    CUDA_LAUNCH_CHECK();
    dq<<<(unsigned)q_blocks, THREADS, Smem<D>::dq, sl_cuda_stream()>>>(dqkv, dout, qkv, lse, delta, B, T, NH, NKV,
                                                                       scale, n_t);
    CUDA_LAUNCH_CHECK();
}

// SHARDLM_ATTENTION=simt keeps bf16 attention on the SIMT kernels (a comparison, or a way around a
// problem): settings.h.
bool tc_enabled() { return sl_settings_get()->attention != SL_ATTENTION_SIMT; }

}  // namespace

bool attention_tc_forward(bf16 *out, float *lse, const bf16 *qkv, int B, int T, int NH, int NKV, int HD, float scale) {
    if (!tc_enabled() || !att_tc_head_dim(HD) || !att_tc_smem_fits<Smem>(HD, false) || !att_tc_aligned16(out) ||
        !att_tc_aligned16(qkv))
        return false;
    ATT_TC_DISPATCH(HD, launch_forward, out, lse, qkv, B, T, NH, NKV, scale);
    return true;
}

bool attention_tc_backward(bf16 *dqkv, const bf16 *dout, const bf16 *qkv, const float *lse, const float *delta, int B,
                           int T, int NH, int NKV, int HD, float scale) {
    if (!tc_enabled() || !att_tc_head_dim(HD) || !att_tc_smem_fits<Smem>(HD, true) || !att_tc_aligned16(dqkv) ||
        !att_tc_aligned16(dout) || !att_tc_aligned16(qkv))
        return false;
    ATT_TC_DISPATCH(HD, launch_backward, dqkv, dout, qkv, lse, delta, B, T, NH, NKV, scale);
    return true;
}
