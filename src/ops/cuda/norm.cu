// norm.cu: LayerNorm (GPT-2) and RMSNorm (LLaMA) on the GPU, forward and backward, and the forwards
// fused with the residual add before them (ops.h residual_layernorm_forward / residual_rmsnorm_forward).
//
// Forward and the dinp part of backward: one warp per row (8 rows per 256-thread block). Each lane
// sums columns lane, lane+32, ... in order, then warp_sum's fixed butterfly combines the lanes; the
// CPU's two-pass formulas are kept (mean first, then the variance about it; rstd = 1/sqrt(var+eps)),
// and every elementwise expression is written with _rn intrinsics in the CPU's evaluation order, so
// nvcc cannot contract it differently. Backward ACCUMULATES into dinp (ops.h: the residual stream).
// Parameter gradients (dw, db: column sums over N rows) in two deterministic passes:
//   1. grid (column chunk, row chunk): each thread sums its column over one chunk of rows in row
//      order into a float partial (scratch, n_chunks x C);
//   2. one thread per column adds the n_chunks partials in chunk order and ACCUMULATES: dw[c] += sum.
//   The chunking depends only on N, so the result is bit-identical run to run.
// Invariants: no atomics; all reductions in a fixed order; mean/rstd saved exactly as computed; all
// work queued on sl_cuda_stream(); the partials scratch is grow-only (one process drives one GPU).
// Cost: forward reads a row 3x (LN) / 2x (RMS) (cache-resident re-reads) and writes it once;
// backward reads dout, inp twice (dinp pass, parameter pass) plus 2 x n_chunks x C floats of partials.
// Row sums are not bit-identical to the CPU's (OpenMP simd order); the elementwise maths is.
// Fused residual + norm: the same warp first writes its row of resid = a + b (each lane its columns
// lane, lane+32, ...), then runs the very row function of the plain forward on it (each lane re-reads
// only what it wrote, from L1/L2), so fused == residual_forward + norm forward, bit for bit, and the
// separate residual pass (read a and b, write resid, read resid again) disappears.
// Storage: inp, out, dinp, dout, a, b and resid are activations, and w, b the model's parameter copy
// (T = floatX: with bf16 storage the bf16 shadow of the parameters, and the norm reads resid back
// rounded, as stored); dw, db, mean and rstd are fp32.
#include "ops/cuda/cuda_common.cuh"

#define NORM_THREADS 256
#define NORM_ROWS_PER_BLOCK (NORM_THREADS / 32)
#define NORM_MAX_CHUNKS 512   // row chunks of the parameter-gradient partials
#define NORM_MIN_CHUNK_ROWS 16

static sl_cuda_scratch norm_buf;  // grow-only scratch (cuda_common.cuh)

// The row chunking of the parameter-gradient partials: a function of N only (determinism).
static void norm_chunking(int N, int *rows_per_chunk, int *n_chunks) {
    int k = (N + NORM_MIN_CHUNK_ROWS - 1) / NORM_MIN_CHUNK_ROWS;
    if (k > NORM_MAX_CHUNKS) k = NORM_MAX_CHUNKS;
    int rows = (N + k - 1) / k;
    *rows_per_chunk = rows;
    *n_chunks = (N + rows - 1) / rows;
}

// ---- LayerNorm -----------------------------------------------------------------------------------

// One row of LayerNorm by one warp (lane 0..31): y (C) = (x - mean) * rstd * w + b; lane 0 saves the
// row's mean and rstd.
template <typename T>
__device__ __forceinline__ void layernorm_row(T *y, float *mean, float *rstd, const T *x, const T *w, const T *b,
                                              int C, float eps, int lane) {
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s = __fadd_rn(s, to_f32(x[c]));
    float m = __fdiv_rn(warp_sum(s), (float)C);
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = __fsub_rn(to_f32(x[c]), m);
        v = __fadd_rn(v, __fmul_rn(d, d));
    }
    v = __fdiv_rn(warp_sum(v), (float)C);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, eps)));
    for (int c = lane; c < C; c += 32) {
        float xhat_r = __fmul_rn(__fsub_rn(to_f32(x[c]), m), r);
        y[c] = from_f32<T>(__fadd_rn(__fmul_rn(xhat_r, to_f32(w[c])), to_f32(b[c])));
    }
    if (lane == 0) {
        *mean = m;
        *rstd = r;
    }
}

// resid (C) = a + b for one row by one warp, each lane its columns lane, lane+32, ... (resid may be a or b).
template <typename T>
__device__ __forceinline__ void residual_row(T *resid, const T *a, const T *b, int C, int lane) {
    for (int c = lane; c < C; c += 32) resid[c] = from_f32<T>(__fadd_rn(to_f32(a[c]), to_f32(b[c])));
}

// out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N). One warp per row.
template <typename T>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                                         int N, int C, float eps) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;  // whole warps leave together
    size_t row = (size_t)n * C;
    layernorm_row<T>(out + row, mean + n, rstd + n, inp + row, w, b, C, eps, lane);
}

// resid (N,C) = a + b, then out = LayerNorm(resid) as above. One warp per row.
template <typename T>
__global__ void residual_layernorm_forward_kernel(T *resid, T *out, float *mean, float *rstd, const T *a, const T *b,
                                                  const T *w, const T *bias, int N, int C, float eps) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    residual_row<T>(resid + row, a + row, b + row, C, lane);
    layernorm_row<T>(out + row, mean + n, rstd + n, resid + row, w, bias, C, eps, lane);
}

// dinp (N,C) += the LayerNorm input gradient. One warp per row.
template <typename T>
__global__ void layernorm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *mean,
                                               const float *rstd, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const T *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    T *dx = dinp + (size_t)n * C;
    float m = mean[n], r = rstd[n];
    float sum_dnorm = 0.0f, sum_dnorm_xhat = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dnorm = __fmul_rn(to_f32(dy[c]), to_f32(w[c]));
        sum_dnorm = __fadd_rn(sum_dnorm, dnorm);
        sum_dnorm_xhat = __fadd_rn(sum_dnorm_xhat, __fmul_rn(__fmul_rn(dnorm, __fsub_rn(to_f32(x[c]), m)), r));
    }
    float mean_dnorm = __fdiv_rn(warp_sum(sum_dnorm), (float)C);
    float mean_dnorm_xhat = __fdiv_rn(warp_sum(sum_dnorm_xhat), (float)C);
    for (int c = lane; c < C; c += 32) {
        float dnorm = __fmul_rn(to_f32(dy[c]), to_f32(w[c]));
        float xhat = __fmul_rn(__fsub_rn(to_f32(x[c]), m), r);
        float g = __fmul_rn(__fsub_rn(__fsub_rn(dnorm, mean_dnorm), __fmul_rn(xhat, mean_dnorm_xhat)), r);
        dx[c] = from_f32<T>(__fadd_rn(to_f32(dx[c]), g));
    }
}

// ---- RMSNorm -------------------------------------------------------------------------------------

// One row of RMSNorm by one warp: y (C) = w * (x * rstd); lane 0 saves rstd.
template <typename T>
__device__ __forceinline__ void rmsnorm_row(T *y, float *rstd, const T *x, const T *w, int C, float eps, int lane) {
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xc = to_f32(x[c]);
        ss = __fadd_rn(ss, __fmul_rn(xc, xc));
    }
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(warp_sum(ss), (float)C), eps)));
    // transformers computes (x * rstd) first, then multiplies by the weight
    for (int c = lane; c < C; c += 32) y[c] = from_f32<T>(__fmul_rn(to_f32(w[c]), __fmul_rn(to_f32(x[c]), r)));
    if (lane == 0) *rstd = r;
}

// out (N,C) = w * (inp * rstd); rstd (N). One warp per row.
template <typename T>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    rmsnorm_row<T>(out + row, rstd + n, inp + row, w, C, eps, lane);
}

// resid (N,C) = a + b, then out = RMSNorm(resid). One warp per row.
template <typename T>
__global__ void residual_rmsnorm_forward_kernel(T *resid, T *out, float *rstd, const T *a, const T *b, const T *w,
                                                int N, int C, float eps) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    residual_row<T>(resid + row, a + row, b + row, C, lane);
    rmsnorm_row<T>(out + row, rstd + n, resid + row, w, C, eps, lane);
}

// dinp (N,C) += the RMSNorm input gradient. One warp per row.
template <typename T>
__global__ void rmsnorm_backward_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w, const float *rstd,
                                             int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const T *x = inp + (size_t)n * C, *dy = dout + (size_t)n * C;
    T *dx = dinp + (size_t)n * C;
    float r = rstd[n], dot = 0.0f;
    for (int c = lane; c < C; c += 32)
        dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(to_f32(dy[c]), to_f32(w[c])), to_f32(x[c])));
    dot = warp_sum(dot);
    float k = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(dot, r), r), r), (float)C);
    for (int c = lane; c < C; c += 32) {
        float g = __fsub_rn(__fmul_rn(__fmul_rn(to_f32(dy[c]), to_f32(w[c])), r), __fmul_rn(to_f32(x[c]), k));
        dx[c] = from_f32<T>(__fadd_rn(to_f32(dx[c]), g));
    }
}

// ---- parameter gradients (both norms) ------------------------------------------------------------

// Pass 1: part_w[k, c] = sum over the rows of chunk k (in order) of dy * xhat; part_b[k, c] = sum of dy
// (LayerNorm, mean != NULL: xhat = (x - mean) * rstd; RMSNorm, mean == NULL: xhat = x * rstd, no part_b).
// Grid: (ceil(C / NORM_THREADS), n_chunks).
template <typename T>
__global__ void norm_param_partials_kernel(float *part_w, float *part_b, const T *dout, const T *inp,
                                           const float *mean, const float *rstd, int N, int C, int rows_per_chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int k = blockIdx.y;
    int r0 = k * rows_per_chunk;
    int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    float aw = 0.0f, ab = 0.0f;
    for (int n = r0; n < r1; n++) {
        float dy = to_f32(dout[(size_t)n * C + c]), x = to_f32(inp[(size_t)n * C + c]);
        if (mean) {
            aw = __fadd_rn(aw, __fmul_rn(__fmul_rn(dy, __fsub_rn(x, mean[n])), rstd[n]));  // dy * (x - m) * r
            ab = __fadd_rn(ab, dy);
        } else {
            aw = __fadd_rn(aw, __fmul_rn(__fmul_rn(dy, x), rstd[n]));  // dy * x * r
        }
    }
    part_w[(size_t)k * C + c] = aw;
    if (part_b) part_b[(size_t)k * C + c] = ab;
}

// Pass 2: dw[c] += sum over k (in order) of part_w[k, c]; db likewise when given. One thread per column.
__global__ void norm_param_reduce_kernel(float *dw, float *db, const float *part_w, const float *part_b, int n_chunks,
                                         int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.0f, sb = 0.0f;
    for (int k = 0; k < n_chunks; k++) {
        sw = __fadd_rn(sw, part_w[(size_t)k * C + c]);
        if (db) sb = __fadd_rn(sb, part_b[(size_t)k * C + c]);
    }
    dw[c] = __fadd_rn(dw[c], sw);
    if (db) db[c] = __fadd_rn(db[c], sb);
}

// Queues both passes: dw += colsum(dy * xhat), db += colsum(dy) (db NULL: RMSNorm).
template <typename T>
static void norm_param_backward(float *dw, float *db, const T *dout, const T *inp, const float *mean, const float *rstd,
                                int N, int C) {
    if (!dw) return;  // frozen weights (LoRA): only the input's gradient
    int rows_per_chunk, n_chunks;
    norm_chunking(N, &rows_per_chunk, &n_chunks);
    size_t part = (size_t)n_chunks * C;
    float *scratch = (float *)sl_cuda_scratch_get(&norm_buf, sizeof(float) * part * (db ? 2 : 1), "norm scratch");
    if (!scratch) return;
    float *part_w = scratch, *part_b = db ? scratch + part : NULL;
    cudaStream_t s = sl_cuda_stream();
    dim3 grid(ceil_div_u((size_t)C, NORM_THREADS), (unsigned int)n_chunks);
    norm_param_partials_kernel<T><<<grid, NORM_THREADS, 0, s>>>(part_w, part_b, dout, inp, mean, rstd, N, C,
                                                                rows_per_chunk);
    CUDA_LAUNCH_CHECK();
    norm_param_reduce_kernel<<<ceil_div_u((size_t)C, NORM_THREADS), NORM_THREADS, 0, s>>>(dw, db, part_w, part_b,
                                                                                            n_chunks, C);
    CUDA_LAUNCH_CHECK();
}

// ---- entry points (cuda_ops.cuh) ------------------------------------------------------------------

static unsigned int row_blocks(int N) { return ceil_div_u((size_t)N, NORM_ROWS_PER_BLOCK); }

template <typename floatX>
void cuda_layernorm_forward(sl_act *out, float *mean, float *rstd, const sl_act *inp, const sl_act *w,
                            const sl_act *b, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<floatX><<<row_blocks(N), NORM_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), mean, rstd, as_storage<floatX>(inp), as_storage<floatX>(w), as_storage<floatX>(b), N, C,
        eps);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_residual_layernorm_forward(sl_act *resid, sl_act *out, float *mean, float *rstd, const sl_act *a,
                                     const sl_act *b, const sl_act *w, const sl_act *bias, int N, int C,
                                     float eps) {
    if (N <= 0 || C <= 0) return;
    residual_layernorm_forward_kernel<floatX><<<row_blocks(N), NORM_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(resid), as_storage<floatX>(out), mean, rstd, as_storage<floatX>(a), as_storage<floatX>(b),
        as_storage<floatX>(w), as_storage<floatX>(bias), N, C, eps);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_layernorm_backward(sl_act *dinp, float *dw, float *db, const sl_act *dout, const sl_act *inp,
                             const sl_act *w, const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    layernorm_backward_dinp_kernel<floatX><<<row_blocks(N), NORM_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(dinp), as_storage<floatX>(dout), as_storage<floatX>(inp), as_storage<floatX>(w), mean, rstd, N,
        C);
    CUDA_LAUNCH_CHECK();
    norm_param_backward<floatX>(dw, db, as_storage<floatX>(dout), as_storage<floatX>(inp), mean, rstd, N, C);
}

template <typename floatX>
void cuda_rmsnorm_forward(sl_act *out, float *rstd, const sl_act *inp, const sl_act *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_forward_kernel<floatX><<<row_blocks(N), NORM_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), rstd, as_storage<floatX>(inp), as_storage<floatX>(w), N, C, eps);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_residual_rmsnorm_forward(sl_act *resid, sl_act *out, float *rstd, const sl_act *a, const sl_act *b,
                                   const sl_act *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    residual_rmsnorm_forward_kernel<floatX><<<row_blocks(N), NORM_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(resid), as_storage<floatX>(out), rstd, as_storage<floatX>(a), as_storage<floatX>(b),
        as_storage<floatX>(w), N, C, eps);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_rmsnorm_backward(sl_act *dinp, float *dw, const sl_act *dout, const sl_act *inp, const sl_act *w,
                           const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_backward_dinp_kernel<floatX><<<row_blocks(N), NORM_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(dinp), as_storage<floatX>(dout), as_storage<floatX>(inp), as_storage<floatX>(w), rstd, N, C);
    CUDA_LAUNCH_CHECK();
    norm_param_backward<floatX>(dw, NULL, as_storage<floatX>(dout), as_storage<floatX>(inp), NULL, rstd, N, C);
}

SL_CUDA_STORAGE_INSTANCES(cuda_layernorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_residual_layernorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_layernorm_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_rmsnorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_residual_rmsnorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_rmsnorm_backward)
