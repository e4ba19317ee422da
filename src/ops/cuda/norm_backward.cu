// norm_backward.cu: the LayerNorm (GPT-2) and RMSNorm (LLaMA) backwards on the GPU (ops.h
// layernorm_backward / rmsnorm_backward): dinp += the input gradient (the residual stream's, so it
// ACCUMULATES), dw (+ db) += the parameter gradients, column sums over the N rows.
//
// Fused (the default): one kernel reads x, dout, mean and rstd once from memory and writes dinp and
// one row of partial parameter sums per block; a second small kernel adds the blocks' partials.
//   norm_backward_fused_kernel, one 256-thread block (8 warps) per chunk of rows (the chunking is a
//   function of N only: at most NB_MAX_BLOCKS chunks of at least NB_MIN_ROWS rows, a multiple of 8).
//   The block walks its chunk in tiles of 8 rows:
//     1. warp w takes row t0 + w: lane l reads the columns of vectors l, l + 32, ... (16-byte vectors
//        of VEC elements when C % VEC == 0 and the four row pointers are 16-byte aligned, else VEC =
//        1), sums its two row terms, warp_sum's butterfly combines the lanes, and a second pass over
//        the same row (from L1) writes dinp;
//     2. thread t adds, for each of its columns c = t, t + 256, ... and each of the tile's rows in
//        order, dout * xhat (and dout) to the block's column sums in shared memory (acc_w, acc_b:
//        C floats each). The tile's rows were just read in step 1, so these loads hit L1 / L2; a
//        column's 16 loads (8 rows of dout and inp) are issued together, then summed in row order.
//   Step 1's second pass reads dinp's row for the first time; the lane prefetches it into L1 before
//   the first pass (vector path), so its latency overlaps x's and dout's.
//   At the end thread t writes its columns of acc_w / acc_b to row blockIdx.x of the partials.
//   Rows of at most NB_LANE_VECS vectors a lane (bf16 C <= 1024: GPT-2 124M and 355M) take
//   norm_backward_lanes_kernel instead: step 2 folded into step 1's first pass, each lane summing
//   its own columns' dw / db terms in registers (see it below).
//   norm_param_reduce_kernel: (32 columns x 8) threads a block; thread (x, y) sums partial rows
//   y, y + 8, ... in order, then y = 0 adds the 8 sums in y order and ACCUMULATES: dw[c] += sum.
// Split (SHARDLM_FUSED_KERNELS=0, or C too wide for the shared-memory sums on this GPU): the
// earlier structure, for A/B timing: one warp per row writes dinp (scalar loads), then a grid of
// (column block, chunk) threads each sum one column over one chunk into the partials, then the same
// reduction.
// Invariants: no atomics. Shared memory: each column of acc_w / acc_b is read and written by one
// thread only (the same t for the whole kernel), each dinp element by one lane, so no
// synchronisation is needed between steps 1 and 2 (step 2 reads only inputs; dinp never aliases
// dout or inp); the reduction's one __syncthreads orders its shared writes before the reads. Every
// sum has a fixed order that depends only on (N, C) and on which path runs, so a path is
// bit-identical run to run; the fused and split paths differ from each other in the last bits
// (the lanes' column order with vectors, the chunking of the parameter sums).
// Elementwise maths: the CPU's expressions in its evaluation order, with _rn intrinsics (no
// contraction); row and column sums are not in the CPU's order (OpenMP simd order).
// Cost (fused): x and dout read once from memory (re-reads from L1 / L2), dinp read and written
// once, 2 x n_chunks x C floats of partials written and read. Storage: inp, dout, dinp and w are T =
// floatX (w the bf16 shadow of the parameters with bf16 storage); dw, db, mean and rstd are fp32.
#include "ops/cuda/cuda_common.cuh"
#include "shardlm/settings.h"

#define NB_THREADS 256             // a block of both backward kernels: 8 warps
#define NB_WARPS (NB_THREADS / 32) // rows in flight per block (one per warp): a tile
#define NB_MAX_BLOCKS 1024         // row chunks at most (blocks of the fused kernel, rows of the partials)
#define NB_MIN_ROWS 32             // rows of a chunk at least
#define NB_REDUCE_Y 8              // threads per column of the reduction kernel

static sl_cuda_scratch norm_buf;  // the partials: grow-only scratch (cuda_common.cuh)

// The row chunking of the parameter-gradient partials: a function of N only (determinism).
static void norm_chunking(int N, int *rows_per_chunk, int *n_chunks) {
    int k = (N + NB_MIN_ROWS - 1) / NB_MIN_ROWS;
    if (k > NB_MAX_BLOCKS) k = NB_MAX_BLOCKS;
    int rows = (N + k - 1) / k;
    rows = (rows + NB_WARPS - 1) / NB_WARPS * NB_WARPS;
    *rows_per_chunk = rows;
    *n_chunks = (N + rows - 1) / rows;
}

// ---- per-row and per-element maths (both paths) ----------------------------------------------------

// The per-element maths of a row's input gradient. LayerNorm (LN): g = ((dnorm - mean(dnorm)) - xhat *
// mean(dnorm * xhat)) * r with dnorm = dy * w, xhat = (x - m) * r. RMSNorm: g = dy * w * r - x *
// (sum(dy * w * x) * r^3 / C).
// One element's terms of the row sums: LN s1 += dnorm, s2 += dnorm * xhat; RMS s1 += dnorm * x.
template <bool LN>
__device__ __forceinline__ void norm_bwd_sums(float &s1, float &s2, float x, float dy, float w, float m, float r) {
    const float dnorm = __fmul_rn(dy, w);
    if (LN) {
        s1 = __fadd_rn(s1, dnorm);
        s2 = __fadd_rn(s2, __fmul_rn(__fmul_rn(dnorm, __fsub_rn(x, m)), r));
    } else {
        s1 = __fadd_rn(s1, __fmul_rn(dnorm, x));
    }
}
// The row's coefficients from the lanes' sums: LN a = mean(dnorm), k = mean(dnorm * xhat); RMS
// k = dot * r^3 / C (a unused).
template <bool LN> __device__ __forceinline__ void norm_bwd_coefs(float s1, float s2, float r, int C, float &a, float &k) {
    a = 0.0f;
    if (LN) {
        a = __fdiv_rn(warp_sum(s1), (float)C);
        k = __fdiv_rn(warp_sum(s2), (float)C);
    } else {
        k = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(warp_sum(s1), r), r), r), (float)C);
    }
}
// One element's dinp: dx + g.
template <bool LN>
__device__ __forceinline__ float norm_bwd_dx(float dx, float x, float dy, float w, float m, float r, float a, float k) {
    const float dnorm = __fmul_rn(dy, w);
    float g;
    if (LN) {
        const float xhat = __fmul_rn(__fsub_rn(x, m), r);
        g = __fmul_rn(__fsub_rn(__fsub_rn(dnorm, a), __fmul_rn(xhat, k)), r);
    } else {
        g = __fsub_rn(__fmul_rn(dnorm, r), __fmul_rn(x, k));
    }
    return __fadd_rn(dx, g);
}

// The VEC elements of a row's dinp at column c: dx += g, in the second pass over the row (from L1).
template <typename T, int VEC, bool LN>
__device__ __forceinline__ void norm_bwd_dx_vec(T *__restrict__ dx, const T *__restrict__ dy, const T *__restrict__ x,
                                                const T *__restrict__ w, int c, float m, float r, float a, float k) {
    float xv[VEC], dyv[VEC], wv[VEC], dxv[VEC];
    load_vec<T, VEC>(xv, x + c);
    load_vec<T, VEC>(dyv, dy + c);
    load_vec<T, VEC>(wv, w + c);
    load_vec<T, VEC>(dxv, dx + c);
#pragma unroll
    for (int j = 0; j < VEC; j++) dxv[j] = norm_bwd_dx<LN>(dxv[j], xv[j], dyv[j], wv[j], m, r, a, k);
    store_vec<T, VEC>(dx + c, dxv);
}

// dinp (C) += the input gradient of one row, by one warp (lane 0..31, columns of vectors lane,
// lane + 32, ...): two passes over the row (the second from L1). dx's row is first-read in the
// second pass, after each vector's store of the one before (the compiler orders them: see the
// kernel's restrict), so with vectors the lane prefetches its dx vectors into L1 before the first
// pass: their memory latency overlaps x's and dy's instead of following it.
template <typename T, int VEC, bool LN>
__device__ __forceinline__ void norm_backward_row(T *__restrict__ dx, const T *__restrict__ dy, const T *__restrict__ x,
                                                  const T *__restrict__ w, float m, float r, int C, int lane) {
    if (VEC > 1)
        for (int c = lane * VEC; c < C; c += 32 * VEC)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(dx + c)));
    float s1 = 0.0f, s2 = 0.0f, a, k;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC], dyv[VEC], wv[VEC];
        load_vec<T, VEC>(xv, x + c);
        load_vec<T, VEC>(dyv, dy + c);
        load_vec<T, VEC>(wv, w + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) norm_bwd_sums<LN>(s1, s2, xv[j], dyv[j], wv[j], m, r);
    }
    norm_bwd_coefs<LN>(s1, s2, r, C, a, k);
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        norm_bwd_dx_vec<T, VEC, LN>(dx, dy, x, w, c, m, r, a, k);
    }
}

// One element's share of dw: dy * xhat (LN: xhat = (x - m) * r, as dy * (x - m) * r; RMS: dy * x * r).
template <bool LN> __device__ __forceinline__ float norm_dw_term(float dy, float x, float m, float r) {
    return LN ? __fmul_rn(__fmul_rn(dy, __fsub_rn(x, m)), r) : __fmul_rn(__fmul_rn(dy, x), r);
}

// ---- fused path ------------------------------------------------------------------------------------

// dinp (N,C) += the input gradient; part_w[blockIdx.x, c] = sum over the block's rows (in order) of
// dy * xhat, part_b likewise of dy (LN). part_w NULL: frozen parameters, dinp only. Shared memory:
// C floats (RMS) or 2 C (LN) when part_w is given, else none. See the top comment.
template <typename T, int VEC, bool LN>
__global__ void __launch_bounds__(NB_THREADS)
    norm_backward_fused_kernel(T *__restrict__ dinp, float *part_w, float *part_b, const T *__restrict__ dout,
                               const T *__restrict__ inp, const T *__restrict__ w, const float *mean,
                               const float *rstd, int N, int C, int rows_per_chunk) {
    // restrict: dinp is never dout, inp or w (the model's buffers), so the loads of a row's second
    // pass may go ahead of its stores (unrolled two vectors at a time) and dout / inp / w take the
    // read-only path
    extern __shared__ float acc[];  // acc_w (C), then acc_b (C, LN): this block's column sums
    float *acc_w = acc, *acc_b = acc + C;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const bool params = part_w != NULL;
    const int r0 = blockIdx.x * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    if (params)
        for (int c = tid; c < C; c += NB_THREADS) {
            acc_w[c] = 0.0f;
            if (LN) acc_b[c] = 0.0f;
        }
    for (int t0 = r0; t0 < r1; t0 += NB_WARPS) {
        const int n = t0 + warp;
        if (n < r1) {
            const size_t row = (size_t)n * C;
            norm_backward_row<T, VEC, LN>(dinp + row, dout + row, inp + row, w, LN ? mean[n] : 0.0f, rstd[n], C, lane);
        }
        if (!params) continue;
        const int rows = r1 - t0 < NB_WARPS ? r1 - t0 : NB_WARPS;
        float tm[NB_WARPS], tr[NB_WARPS];  // the tile's statistics, in registers
#pragma unroll
        for (int i = 0; i < NB_WARPS; i++) {
            tm[i] = LN && i < rows ? mean[t0 + i] : 0.0f;
            tr[i] = i < rows ? rstd[t0 + i] : 0.0f;
        }
        for (int c = tid; c < C; c += NB_THREADS) {
            float aw = acc_w[c], ab = LN ? acc_b[c] : 0.0f, dy[NB_WARPS], x[NB_WARPS];
            // every row's loads first (predicated, not behind a break: they issue together), then the
            // sums in row order
#pragma unroll
            for (int i = 0; i < NB_WARPS; i++) {
                const size_t at = (size_t)(t0 + i) * C + c;
                dy[i] = i < rows ? to_f32(dout[at]) : 0.0f;
                x[i] = i < rows ? to_f32(inp[at]) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < NB_WARPS; i++) {
                if (i >= rows) break;
                aw = __fadd_rn(aw, norm_dw_term<LN>(dy[i], x[i], tm[i], tr[i]));
                if (LN) ab = __fadd_rn(ab, dy[i]);
            }
            acc_w[c] = aw;
            if (LN) acc_b[c] = ab;
        }
    }
    if (!params) return;
    for (int c = tid; c < C; c += NB_THREADS) {
        part_w[(size_t)blockIdx.x * C + c] = acc_w[c];
        if (LN) part_b[(size_t)blockIdx.x * C + c] = acc_b[c];
    }
}

template <typename T, int VEC, bool LN>
static void launch_fused(T *dinp, float *part_w, float *part_b, const T *dout, const T *inp, const T *w,
                         const float *mean, const float *rstd, int N, int C, int rows_per_chunk, int n_chunks,
                         size_t smem) {
    auto kernel = norm_backward_fused_kernel<T, VEC, LN>;
    if (!sl_cuda_allow_smem(kernel, smem)) return;
    kernel<<<(unsigned int)n_chunks, NB_THREADS, smem, sl_cuda_stream()>>>(dinp, part_w, part_b, dout, inp, w, mean,
                                                                          rstd, N, C, rows_per_chunk);
    CUDA_LAUNCH_CHECK();
}

// ---- fused, the parameter sums in the lanes (C <= 32 VEC NB_LANE_VECS) --------------------------------

// The fused kernel's step 2 re-reads every tile element with scalar loads and recomputes its dw term:
// on an H200 (2026-11-28) the kernel ran at 58% of DRAM bandwidth with its SMs 69% busy. Where a row
// is at most NB_LANE_VECS vectors a lane, each lane already holds, in step 1's first pass, the x and
// dout of the same columns for every row its warp takes (rows r0 + warp, + NB_WARPS, ...), so it sums
// dw's (and db's) terms there, in registers, in row order; at the block's end the warps' sums meet in
// shared memory (one C-float row a warp, dw then db) and thread t adds column c's in warp order into
// the partials. The order is fixed by (N, C): bit-identical run to run (other bits than the
// tile-ordered kernel's, within the same bounds). Shared memory: NB_WARPS C floats.
#define NB_LANE_VECS 4  // vectors a lane at most (bf16: C <= 1024, fp32: C <= 512)

template <typename T, int VEC, int VPL, bool LN>
__global__ void __launch_bounds__(NB_THREADS)
    norm_backward_lanes_kernel(T *__restrict__ dinp, float *part_w, float *part_b, const T *__restrict__ dout,
                               const T *__restrict__ inp, const T *__restrict__ w, const float *mean,
                               const float *rstd, int N, int C, int rows_per_chunk) {
    extern __shared__ float warp_sums[];  // NB_WARPS rows of C: one parameter's sums, a row a warp
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const bool params = part_w != NULL;
    const int r0 = blockIdx.x * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    float sw[VPL][VEC], sb[VPL][VEC];
#pragma unroll
    for (int v = 0; v < VPL; v++)
#pragma unroll
        for (int j = 0; j < VEC; j++) sw[v][j] = sb[v][j] = 0.0f;
    for (int n = r0 + warp; n < r1; n += NB_WARPS) {
        const size_t row = (size_t)n * C;
        const T *x = inp + row, *dy = dout + row;
        T *dx = dinp + row;
        const float m = LN ? mean[n] : 0.0f, r = rstd[n];
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            const int c = (lane + 32 * v) * VEC;
            if (c < C) asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(dx + c)));
        }
        float s1 = 0.0f, s2 = 0.0f, a, k;
#pragma unroll
        for (int v = 0; v < VPL; v++) {  // pass 1: the row's sums, and the lane's dw / db terms
            const int c = (lane + 32 * v) * VEC;
            if (c >= C) continue;
            float xv[VEC], dyv[VEC], wv[VEC];
            load_vec<T, VEC>(xv, x + c);
            load_vec<T, VEC>(dyv, dy + c);
            load_vec<T, VEC>(wv, w + c);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                norm_bwd_sums<LN>(s1, s2, xv[j], dyv[j], wv[j], m, r);
                if (params) {
                    sw[v][j] = __fadd_rn(sw[v][j], norm_dw_term<LN>(dyv[j], xv[j], m, r));
                    if (LN) sb[v][j] = __fadd_rn(sb[v][j], dyv[j]);
                }
            }
        }
        norm_bwd_coefs<LN>(s1, s2, r, C, a, k);
#pragma unroll
        for (int v = 0; v < VPL; v++) {  // pass 2 (from L1): dinp
            const int c = (lane + 32 * v) * VEC;
            if (c >= C) continue;
            norm_bwd_dx_vec<T, VEC, LN>(dx, dy, x, w, c, m, r, a, k);
        }
    }
    if (!params) return;  // uniform across the block: no barrier is skipped by some threads only
    for (int p = 0; p < (LN ? 2 : 1); p++) {
        if (p) __syncthreads();  // the dw row sums are read before the db ones overwrite them
#pragma unroll
        for (int v = 0; v < VPL; v++) {
            const int c = (lane + 32 * v) * VEC;
            if (c >= C) continue;
#pragma unroll
            for (int j = 0; j < VEC; j++) warp_sums[warp * C + c + j] = p ? sb[v][j] : sw[v][j];
        }
        __syncthreads();
        float *part = p ? part_b : part_w;
        for (int c = tid; c < C; c += NB_THREADS) {
            float t = warp_sums[c];
#pragma unroll
            for (int i = 1; i < NB_WARPS; i++) t = __fadd_rn(t, warp_sums[i * C + c]);
            part[(size_t)blockIdx.x * C + c] = t;
        }
    }
}

template <typename T, int VEC, int VPL, bool LN>
static void launch_lanes(T *dinp, float *part_w, float *part_b, const T *dout, const T *inp, const T *w,
                         const float *mean, const float *rstd, int N, int C, int rows_per_chunk, int n_chunks) {
    auto kernel = norm_backward_lanes_kernel<T, VEC, VPL, LN>;
    const size_t smem = part_w ? sizeof(float) * NB_WARPS * (size_t)C : 0;
    if (!sl_cuda_allow_smem(kernel, smem)) return;
    kernel<<<(unsigned int)n_chunks, NB_THREADS, smem, sl_cuda_stream()>>>(dinp, part_w, part_b, dout, inp, w, mean,
                                                                          rstd, N, C, rows_per_chunk);
    CUDA_LAUNCH_CHECK();
}

// The lanes kernel for C's vectors a lane (1 .. NB_LANE_VECS); false when C is wider.
template <typename T, int VEC, bool LN>
static bool lanes(T *dinp, float *part_w, float *part_b, const T *dout, const T *inp, const T *w, const float *mean,
                  const float *rstd, int N, int C, int rows_per_chunk, int n_chunks) {
    switch ((C + 32 * VEC - 1) / (32 * VEC)) {
    case 1: launch_lanes<T, VEC, 1, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks); return true;
    case 2: launch_lanes<T, VEC, 2, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks); return true;
    case 3: launch_lanes<T, VEC, 3, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks); return true;
    case 4: launch_lanes<T, VEC, 4, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks); return true;
    default: return false;
    }
}

// ---- split path (SHARDLM_FUSED_KERNELS=0, or C too wide) -----------------------------------------

// dinp (N,C) += the input gradient. One warp per row, scalar loads.
template <typename T, bool LN>
__global__ void norm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                          const float *rstd, int N, int C) {
    int n = blockIdx.x * NB_WARPS + threadIdx.x / 32;
    if (n >= N) return;  // whole warps leave together
    size_t row = (size_t)n * C;
    norm_backward_row<T, 1, LN>(dinp + row, dout + row, inp + row, w, LN ? mean[n] : 0.0f, rstd[n], C, threadIdx.x % 32);
}

// part_w[k, c] = sum over the rows of chunk k (in order) of dy * xhat; part_b[k, c] of dy (LN).
// Grid: (ceil(C / NB_THREADS), n_chunks).
template <typename T, bool LN>
__global__ void norm_param_partials_kernel(float *part_w, float *part_b, const T *dout, const T *inp,
                                           const float *mean, const float *rstd, int N, int C, int rows_per_chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int k = blockIdx.y;
    int r0 = k * rows_per_chunk;
    int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    float aw = 0.0f, ab = 0.0f;
    for (int n = r0; n < r1; n++) {
        float dy = to_f32(dout[(size_t)n * C + c]);
        aw = __fadd_rn(aw, norm_dw_term<LN>(dy, to_f32(inp[(size_t)n * C + c]), LN ? mean[n] : 0.0f, rstd[n]));
        if (LN) ab = __fadd_rn(ab, dy);
    }
    part_w[(size_t)k * C + c] = aw;
    if (LN) part_b[(size_t)k * C + c] = ab;
}

// ---- the partials' reduction (both paths) --------------------------------------------------------

// dw[c] += sum over k of part_w[k, c]; db likewise when given. Block (32, NB_REDUCE_Y): thread (x, y)
// sums k = y, y + NB_REDUCE_Y, ... in order, then y = 0 adds the NB_REDUCE_Y sums in y order.
__global__ void __launch_bounds__(32 * NB_REDUCE_Y)
    norm_param_reduce_kernel(float *dw, float *db, const float *part_w, const float *part_b, int n_chunks, int C) {
    __shared__ float sw[NB_REDUCE_Y][32], sb[NB_REDUCE_Y][32];
    const int x = threadIdx.x, y = threadIdx.y, c = blockIdx.x * 32 + x;
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int k = y; k < n_chunks; k += NB_REDUCE_Y) {
            aw = __fadd_rn(aw, part_w[(size_t)k * C + c]);
            if (db) ab = __fadd_rn(ab, part_b[(size_t)k * C + c]);
        }
    sw[y][x] = aw;
    sb[y][x] = ab;
    __syncthreads();
    if (y != 0 || c >= C) return;
    for (int j = 1; j < NB_REDUCE_Y; j++) {
        aw = __fadd_rn(aw, sw[j][x]);
        ab = __fadd_rn(ab, sb[j][x]);
    }
    dw[c] = __fadd_rn(dw[c], aw);
    if (db) db[c] = __fadd_rn(db[c], ab);
}

// ---- entry points (cuda_ops.cuh) ------------------------------------------------------------------

// Both norms: dinp += ..., dw += ..., db += ... (LN; dw NULL: frozen, dinp only). mean unused for RMS.
template <typename T, bool LN>
static void norm_backward(T *dinp, float *dw, float *db, const T *dout, const T *inp, const T *w, const float *mean,
                          const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int rows_per_chunk, n_chunks;
    norm_chunking(N, &rows_per_chunk, &n_chunks);
    const size_t part = (size_t)n_chunks * C, sums = LN ? 2 : 1;
    float *part_w = NULL, *part_b = NULL;
    if (dw) {
        float *scratch = (float *)sl_cuda_scratch_get(&norm_buf, sizeof(float) * part * sums, "norm scratch");
        if (!scratch) return;
        part_w = scratch;
        part_b = LN ? scratch + part : NULL;
    }
    cudaStream_t s = sl_cuda_stream();
    const size_t smem = dw ? sizeof(float) * sums * (size_t)C : 0;
    const cudaDeviceProp *p = sl_cuda_device_props();
    if (sl_settings_get()->fused_kernels && (!p || smem <= p->sharedMemPerBlockOptin)) {
        constexpr int VEC = 16 / sizeof(T);
        const bool vec = C % VEC == 0 && sl_aligned16(dinp) && sl_aligned16(dout) && sl_aligned16(inp) && sl_aligned16(w);
        if (vec && lanes<T, VEC, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks))
            ;  // the parameter sums in the lanes (rows of at most NB_LANE_VECS vectors a lane)
        else if (vec)
            launch_fused<T, VEC, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks, smem);
        else
            launch_fused<T, 1, LN>(dinp, part_w, part_b, dout, inp, w, mean, rstd, N, C, rows_per_chunk, n_chunks, smem);
    } else {
        norm_backward_dinp_kernel<T, LN><<<ceil_div_u((size_t)N, NB_WARPS), NB_THREADS, 0, s>>>(dinp, dout, inp, w, mean,
                                                                                              rstd, N, C);
        CUDA_LAUNCH_CHECK();
        if (dw) {
            dim3 grid(ceil_div_u((size_t)C, NB_THREADS), (unsigned int)n_chunks);
            norm_param_partials_kernel<T, LN><<<grid, NB_THREADS, 0, s>>>(part_w, part_b, dout, inp, mean, rstd, N, C,
                                                                          rows_per_chunk);
            CUDA_LAUNCH_CHECK();
        }
    }
    if (!dw) return;
    norm_param_reduce_kernel<<<ceil_div_u((size_t)C, 32), dim3(32, NB_REDUCE_Y), 0, s>>>(dw, db, part_w, part_b,
                                                                                        n_chunks, C);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_layernorm_backward(sl_act *dinp, float *dw, float *db, const sl_act *dout, const sl_act *inp,
                             const sl_act *w, const float *mean, const float *rstd, int N, int C) {
    norm_backward<floatX, true>(as_storage<floatX>(dinp), dw, db, as_storage<floatX>(dout), as_storage<floatX>(inp),
                                as_storage<floatX>(w), mean, rstd, N, C);
}

template <typename floatX>
void cuda_rmsnorm_backward(sl_act *dinp, float *dw, const sl_act *dout, const sl_act *inp, const sl_act *w,
                           const float *rstd, int N, int C) {
    norm_backward<floatX, false>(as_storage<floatX>(dinp), dw, NULL, as_storage<floatX>(dout), as_storage<floatX>(inp),
                                 as_storage<floatX>(w), NULL, rstd, N, C);
}

SL_CUDA_STORAGE_INSTANCES(cuda_layernorm_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_rmsnorm_backward)
