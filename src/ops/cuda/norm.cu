// norm.cu: LayerNorm (GPT-2) and RMSNorm (LLaMA) forwards on the GPU, and the forwards fused with
// the residual add before them (ops.h residual_layernorm_forward / residual_rmsnorm_forward); the
// backwards are in norm_backward.cu.
//
// One warp per row (8 rows per 256-thread block). Each lane sums columns lane, lane+32, ... in order,
// then warp_sum's fixed butterfly combines the lanes; the CPU's two-pass formulas are kept (mean
// first, then the variance about it; rstd = 1/sqrt(var+eps)), and every elementwise expression is
// written with _rn intrinsics in the CPU's evaluation order, so nvcc cannot contract it differently.
// Invariants: no atomics; all reductions in a fixed order; mean/rstd saved exactly as computed; all
// work queued on sl_cuda_stream().
// Cost: forward reads a row 3x (LN) / 2x (RMS) (cache-resident re-reads) and writes it once.
// Row sums are not bit-identical to the CPU's (OpenMP simd order); the elementwise maths is.
// Fused residual + norm: the same warp first writes its row of resid = a + b (each lane its columns
// lane, lane+32, ...), then runs the very row function of the plain forward on it (each lane re-reads
// only what it wrote, from L1/L2), so fused == residual_forward + norm forward, bit for bit, and the
// separate residual pass (read a and b, write resid, read resid again) disappears.
// Storage: inp, out, a, b and resid are activations, and w, b the model's parameter copy (T = floatX:
// with bf16 storage the bf16 shadow of the parameters, and the norm reads resid back rounded, as
// stored); mean and rstd are fp32.
#include "ops/cuda/cuda_common.cuh"

#define NORM_THREADS 256
#define NORM_ROWS_PER_BLOCK (NORM_THREADS / 32)

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

SL_CUDA_STORAGE_INSTANCES(cuda_layernorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_residual_layernorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_rmsnorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_residual_rmsnorm_forward)
