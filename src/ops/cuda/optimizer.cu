// optimizer.cu: the optimizer step's passes over flat fp32 buffers on the GPU: the gradient sum of
// squares (global-norm clipping), scaling, the Inf/NaN check (loss scaling), rounding to bf16/fp16
// storage precision, and the multi-tensor AdamW / Adam and SGD updates (see ops.h).
//
// Bit-identical to the CPU (src/train/optim.c, src/train/precision.c), by construction:
//   * sumsq uses cpu_sumsq's exact reduction tree: the buffer is cut into nb <= 256 blocks of
//     max(ceil(n/256), 1024) elements; in each block, lane j (j < 8) adds the squares of elements
//     j, j+8, j+16, ... in double, in order; the lanes combine as ((0+1)+(2+3))+((4+5)+(6+7)) and the
//     block partials are added serially. On the GPU each block is one 256-thread CUDA block: 7 warps
//     stage tiles of squares (exact in double) in shared memory, double-buffered, while lanes 0..7 of
//     warp 0 run the 8 serial chains. Cost: about n/256 dependent double adds per SM, near the
//     bandwidth bound on an H100; then one thread adds the <= 256 partials.
//   * adam/sgd: the per-element float operations of adam_loop / sgd_segment in the same order,
//     written as __fmaf_rn / __fmul_rn / __fadd_rn / __fdiv_rn / __fsqrt_rn so nvcc cannot contract
//     or approximate them (the CPU is built without contraction). Requires the default nvcc float
//     modes (no --use_fast_math / -ftz=true), which keep subnormals as the CPU does.
//   * round_to ports precision.c's integer bit manipulation (RNE, NaN -> quiet NaN, fp16 overflow
//     to Inf at |x| >= 65520, fp16 subnormals kept).
// Multi-tensor launch: the segments (a host array) travel in the kernel's parameter block
// (__grid_constant__, up to OPT_MAX_SEGS per launch; more segments take further launches, same
// result). Each thread strides over [first begin, last end) and finds its element's segment by
// binary search over the segment ends (only when it leaves its current segment); elements in gaps
// between segments are not touched.
// Invariants: no floating-point atomics (nonfinite uses an integer atomicOr on a flag); every launch
// on sl_cuda_stream(); sumsq and nonfinite wait for their one value (cuda_ops.h). The scratch is
// grow-only (one process drives one GPU). Cost: adam reads 16 and writes 12 bytes per element (14 with
// the bf16 copy), sgd 8-12 / 4-8, scale and round_to 4 / 4, nonfinite 4.
#include "ops/cuda/cuda_common.cuh"

#include <math.h>
#include <stdint.h>

extern "C" {
#include "shardlm/precision.h"  // sl_precision
}

#define OPT_THREADS 256
#define OPT_MAX_SEGS 1024
#define SUMSQ_MAX_BLOCKS 256   // = SUMSQ_BLOCKS of optim.c
#define SUMSQ_MIN_BLOCK 1024   // optim.c's smallest block
#define SUMSQ_LANES 8          // optim.c's double lanes per block
#define SUMSQ_TILE 2048        // doubles per shared-memory stage buffer (a multiple of SUMSQ_LANES)
#define OPT_MAX_STEP_BLOCKS 8192
#define OPT_SCRATCH_BYTES (sizeof(double) * (SUMSQ_MAX_BLOCKS + 1))  // sumsq partials + total; nonfinite flag

static sl_cuda_scratch optimizer_buf;  // grow-only scratch (cuda_common.cuh)

static unsigned int grid_for(size_t n, size_t max_blocks) {
    size_t blocks = (n + OPT_THREADS - 1) / OPT_THREADS;
    return (unsigned int)(blocks < max_blocks ? blocks : max_blocks);
}

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// ---- sum of squares ------------------------------------------------------------------------------

// Squares (exact in double) of elements [k*SUMSQ_TILE, ...) of the block into dst, by threads 32..255.
template <typename T>
__device__ __forceinline__ void sumsq_stage_tile(double *dst, const T *xb, size_t len, size_t k) {
    size_t base = k * SUMSQ_TILE;
    int tlen = (int)(len - base < (size_t)SUMSQ_TILE ? len - base : (size_t)SUMSQ_TILE);
    for (int i = (int)threadIdx.x - 32; i < tlen; i += OPT_THREADS - 32) {
        double d = (double)to_f32(xb[base + i]);
        dst[i] = __dmul_rn(d, d);
    }
}

// partial[b] = cpu_sumsq's block b: elements [b*block, min((b+1)*block, n)).
template <typename T>
__global__ void __launch_bounds__(OPT_THREADS) sumsq_blocks_kernel(double *partial, const T *x, size_t n,
                                                                   size_t block) {
    __shared__ double stage[2][SUMSQ_TILE];
    __shared__ double lane_sum[SUMSQ_LANES];
    size_t a = (size_t)blockIdx.x * block;
    size_t len = n - a < block ? n - a : block;
    const T *xb = x + a;
    size_t n_tiles = (len + SUMSQ_TILE - 1) / SUMSQ_TILE;
    int tid = threadIdx.x;
    double acc = 0.0;  // lane tid's chain (tid < SUMSQ_LANES)
    if (tid >= 32) sumsq_stage_tile(stage[0], xb, len, 0);
    __syncthreads();
    for (size_t k = 0; k < n_tiles; k++) {
        if (tid >= 32) {
            if (k + 1 < n_tiles) sumsq_stage_tile(stage[(k + 1) & 1], xb, len, k + 1);
        } else if (tid < SUMSQ_LANES) {
            // the tile starts at a multiple of 8, so tile offset i belongs to lane i % 8
            const double *sq = stage[k & 1];
            size_t base = k * SUMSQ_TILE;
            int tlen = (int)(len - base < (size_t)SUMSQ_TILE ? len - base : (size_t)SUMSQ_TILE);
            for (int i = tid; i < tlen; i += SUMSQ_LANES) acc = __dadd_rn(acc, sq[i]);
        }
        __syncthreads();  // tile k consumed, tile k+1 staged
    }
    if (tid < SUMSQ_LANES) lane_sum[tid] = acc;
    __syncthreads();
    if (tid == 0) {
        const double *l = lane_sum;
        partial[blockIdx.x] = __dadd_rn(__dadd_rn(__dadd_rn(l[0], l[1]), __dadd_rn(l[2], l[3])),
                                        __dadd_rn(__dadd_rn(l[4], l[5]), __dadd_rn(l[6], l[7])));
    }
}

// *total = partial[0] + partial[1] + ... in order (one thread).
__global__ void sumsq_total_kernel(double *total, const double *partial, int n_blocks) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double t = 0.0;
    for (int b = 0; b < n_blocks; b++) t = __dadd_rn(t, partial[b]);
    *total = t;
}

// ---- scale, nonfinite, round_to ------------------------------------------------------------------

template <typename T>
__global__ void scale_kernel(T *x, size_t n, float coef) {
    GRID_STRIDE(i, n) x[i] = from_f32<T>(__fmul_rn(to_f32(x[i]), coef));
}

__global__ void add_kernel(float *x, const float *y, size_t n) { GRID_STRIDE(i, n) x[i] = __fadd_rn(x[i], y[i]); }

// *flag |= 1 when any element is Inf or NaN (exponent bits all ones).
template <typename T>
__global__ void nonfinite_kernel(int *flag, const T *x, size_t n) {
    int bad = 0;
    GRID_STRIDE(i, n) bad |= (__float_as_uint(to_f32(x[i])) & 0x7F800000u) == 0x7F800000u;
    // every thread of the block reaches this (no early exit), as __any_sync requires
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1);
}

// precision.c's to_bf16 then from_bf16.
__device__ __forceinline__ float round_to_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return __uint_as_float(0x7FC0u << 16);
    return __uint_as_float(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}

// precision.c's to_fp16.
__device__ __forceinline__ uint32_t f32_to_fp16_bits(float x) {
    uint32_t u = __float_as_uint(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);  // NaN, quietened
    if (a >= 0x477FF000u) return sign | 0x7C00u;                        // |x| >= 65520 (or Inf): Inf
    if (a >= 0x38800000u) {                                             // a normal fp16
        uint32_t r = a - (112u << 23);
        r += 0x0FFFu + ((r >> 13) & 1u);
        return sign | (r >> 13);
    }
    uint32_t e = a >> 23;
    if (e < 102) return sign;  // |x| < 2^-25: zero
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t k = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (k & 1u))) k++;
    return sign | k;
}

// precision.c's from_fp16.
__device__ __forceinline__ float fp16_bits_to_f32(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) return __uint_as_float(sign | (m ? 0x7FC00000u | (m << 13) : 0x7F800000u));
    if (e == 0) {
        float v = __fmul_rn(__uint2float_rn(m), 0x1p-24f);  // m x 2^-24, exact
        return __uint_as_float(sign | __float_as_uint(v));
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

template <int PRECISION>
__global__ void round_to_kernel(float *x, size_t n) {
    GRID_STRIDE(i, n) {
        if (PRECISION == 1) x[i] = round_to_bf16(x[i]);
        else x[i] = fp16_bits_to_f32(f32_to_fp16_bits(x[i]));
    }
}

// round_to_bf16's bits: the top half of the rounded float (NaN -> 0x7FC0, as sl_f32_to_bf16).
__global__ void to_storage_kernel(uint16_t *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = (uint16_t)(__float_as_uint(round_to_bf16(src[i])) >> 16);
}

// ---- multi-tensor Adam / SGD ---------------------------------------------------------------------

// Up to OPT_MAX_SEGS sorted, disjoint, non-empty segments, passed by value in the parameter block.
struct segment_pack {
    size_t begin[OPT_MAX_SEGS];
    size_t end[OPT_MAX_SEGS];
    unsigned char decay[OPT_MAX_SEGS];
    int n;
    size_t lo, hi;  // begin of the first segment, end of the last
};

struct adam_launch {
    sl_adam_args a;
    segment_pack segs;
};

struct sgd_launch {
    sl_sgd_args a;
    segment_pack segs;
};

// The first segment in [from, n) whose end is past element i (ends ascend).
__device__ __forceinline__ int find_segment(const segment_pack &P, size_t i, int from) {
    int lo = from, hi = P.n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (P.end[mid] <= i) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Moves *s (-1 before the first call) to element i's segment, i ascending from call to call; returns
// that segment's decay flag, or -1 when i lies in a gap between segments.
__device__ __forceinline__ int segment_decay(const segment_pack &P, size_t i, int *s) {
    if (*s < 0 || (*s < P.n && i >= P.end[*s])) *s = find_segment(P, i, *s + 1);
    if (*s >= P.n || i < P.begin[*s]) return -1;
    return P.decay[*s];
}

// adam_loop of optim.c, element by element. p, g, m, v: the flat buffers (segment offsets index them).
__global__ void __launch_bounds__(OPT_THREADS)
    adam_kernel(const __grid_constant__ adam_launch L, float *p, const float *g, float *m, float *v) {
    const sl_adam_args &A = L.a;
    const size_t span = L.segs.hi - L.segs.lo;
    int s = -1;
    GRID_STRIDE(j, span) {
        const size_t i = L.segs.lo + j;
        const int decay = segment_decay(L.segs, i, &s);
        if (decay < 0) continue;
        const float decay_factor = decay ? A.decay_factor : 1.0f;
        const float l2 = decay ? A.l2 : 0.0f;
        const float p0 = p[i];
        const float gc = __fmul_rn(g[i], A.grad_coef);        // clip_grad_norm_'s g *= coef (1: none)
        const float gi = __fmaf_rn(l2, p0, gc);               // Adam: grad.add(param, alpha=wd)
        const float pi = __fmul_rn(p0, decay_factor);         // AdamW: param.mul_(1 - lr*wd)
        float mi = m[i];                                      // exp_avg.lerp_(grad, 1 - beta1)
        const float diff = __fsub_rn(gi, mi);
        mi = A.lerp_low ? __fmaf_rn(A.w1, diff, mi) : __fmaf_rn(__fsub_rn(A.w1, 1.0f), diff, gi);
        float vi = __fmul_rn(v[i], A.beta2);                  // exp_avg_sq.mul_(beta2)
        vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(A.one_minus_beta2, gi), gi));  // .addcmul_(g, g, 1-beta2)
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), A.bc2_sqrt), A.eps);  // sqrt(v)/sqrt(bc2)+eps
        const float pn = __fadd_rn(pi, __fmul_rn(A.neg_step, __fdiv_rn(mi, denom)));  // addcdiv_(m, denom, -step)
        p[i] = pn;
        m[i] = mi;
        v[i] = vi;
        if (A.storage_bf16)  // the bf16 weight copy, as to_storage_kernel writes it
            ((uint16_t *)A.storage_bf16)[i] = (uint16_t)(__float_as_uint(round_to_bf16(pn)) >> 16);
    }
}

// sgd_segment of optim.c, element by element. buf: the momentum buffer (NULL without momentum).
__global__ void __launch_bounds__(OPT_THREADS)
    sgd_kernel(const __grid_constant__ sgd_launch L, float *p, const float *g, float *buf) {
    const sl_sgd_args &A = L.a;
    const int use_buf = A.has_buf && buf != NULL;
    const size_t span = L.segs.hi - L.segs.lo;
    int s = -1;
    GRID_STRIDE(j, span) {
        const size_t i = L.segs.lo + j;
        const int decay = segment_decay(L.segs, i, &s);
        if (decay < 0) continue;
        const float wd = decay ? A.wd : 0.0f;
        const float pi = p[i];
        float gi = g[i];
        if (wd != 0.0f) gi = __fmaf_rn(wd, pi, gi);  // grad.add(param, alpha=wd)
        if (use_buf) {
            // buf.mul_(momentum).add_(grad, alpha=1-dampening); step 1: buf = grad
            const float bi = A.first ? gi : __fmaf_rn(A.one_minus_dampening, gi, __fmul_rn(buf[i], A.momentum));
            buf[i] = bi;
            gi = A.nesterov ? __fmaf_rn(A.momentum, bi, gi) : bi;  // grad.add(buf, alpha=momentum)
        }
        p[i] = __fmaf_rn(A.neg_lr, gi, pi);  // param.add_(grad, alpha=-lr)
    }
}

// Fills P with the non-empty segments of segs[*next..], up to OPT_MAX_SEGS; advances *next.
// Returns 0 when no non-empty segment was left.
static int pack_segments(segment_pack *P, const sl_segment *segs, int n_segs, int *next) {
    P->n = 0;
    while (*next < n_segs && P->n < OPT_MAX_SEGS) {
        const sl_segment *s = &segs[(*next)++];
        if (s->begin >= s->end) continue;
        P->begin[P->n] = s->begin;
        P->end[P->n] = s->end;
        P->decay[P->n] = s->decay ? 1 : 0;
        P->n++;
    }
    if (P->n == 0) return 0;
    P->lo = P->begin[0];
    P->hi = P->end[P->n - 1];
    return 1;
}


// ---- entry points --------------------------------------------------------------------------------

extern "C" double cuda_sumsq(const float *g, size_t n) {
    if (n == 0) return 0.0;
    size_t block = (n + SUMSQ_MAX_BLOCKS - 1) / SUMSQ_MAX_BLOCKS;
    if (block < SUMSQ_MIN_BLOCK) block = SUMSQ_MIN_BLOCK;
    int n_blocks = (int)((n + block - 1) / block);
    double *partial = (double *)sl_cuda_scratch_get(&optimizer_buf, OPT_SCRATCH_BYTES, "optimizer scratch");
    if (!partial) return NAN;
    double *total = partial + SUMSQ_MAX_BLOCKS;
    cudaStream_t s = sl_cuda_stream();
    sumsq_blocks_kernel<float><<<(unsigned int)n_blocks, OPT_THREADS, 0, s>>>(partial, g, n, block);
    CUDA_LAUNCH_CHECK();
    sumsq_total_kernel<<<1, 32, 0, s>>>(total, partial, n_blocks);
    CUDA_LAUNCH_CHECK();
    double host_total = NAN;  // stays NaN if the copy fails (the error is recorded)
    CUDA_CHECK(cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return host_total;
}

extern "C" void cuda_scale(float *x, size_t n, float coef) {
    if (n == 0 || coef == 1.0f) return;
    scale_kernel<float><<<grid_for(n, (size_t)1 << 20), OPT_THREADS, 0, sl_cuda_stream()>>>(x, n, coef);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_add(float *x, const float *y, size_t n) {
    if (n == 0) return;
    add_kernel<<<grid_for(n, (size_t)1 << 20), OPT_THREADS, 0, sl_cuda_stream()>>>(x, y, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" int cuda_nonfinite(const float *x, size_t n) {
    if (n == 0) return 0;
    int *flag = (int *)sl_cuda_scratch_get(&optimizer_buf, OPT_SCRATCH_BYTES, "optimizer scratch");
    if (!flag) return 1;  // cannot check: report non-finite so the step is skipped (error recorded)
    cudaStream_t s = sl_cuda_stream();
    CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
    nonfinite_kernel<float><<<grid_for(n, 4096), OPT_THREADS, 0, s>>>(flag, x, n);
    CUDA_LAUNCH_CHECK();
    int host_flag = 1;  // stays 1 (skip the step) if the copy fails (the error is recorded)
    CUDA_CHECK(cudaMemcpyAsync(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return host_flag != 0;
}

extern "C" void cuda_round_to(float *x, size_t n, int precision) {
    if (n == 0) return;
    unsigned int grid = grid_for(n, (size_t)1 << 20);
    if (precision == SL_PRECISION_BF16) round_to_kernel<1><<<grid, OPT_THREADS, 0, sl_cuda_stream()>>>(x, n);
    else if (precision == SL_PRECISION_FP16) round_to_kernel<2><<<grid, OPT_THREADS, 0, sl_cuda_stream()>>>(x, n);
    else return;  // fp32: nothing to do
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_to_storage(void *dst, const float *src, size_t n) {
    if (n == 0) return;
    unsigned int grid = grid_for(n, (size_t)1 << 20);
    to_storage_kernel<<<grid, OPT_THREADS, 0, sl_cuda_stream()>>>((uint16_t *)dst, src, n);
    CUDA_LAUNCH_CHECK();
}

extern "C" void cuda_adam_step(const sl_adam_args *a, float *p, const float *g, float *m, float *v,
                               const sl_segment *segs, int n_segs) {
    adam_launch L;  // ~17 KiB: copied into the kernel's parameter block at launch
    L.a = *a;
    int next = 0;
    while (pack_segments(&L.segs, segs, n_segs, &next)) {
        adam_kernel<<<grid_for(L.segs.hi - L.segs.lo, OPT_MAX_STEP_BLOCKS), OPT_THREADS, 0, sl_cuda_stream()>>>(
            L, p, g, m, v);
        CUDA_LAUNCH_CHECK();
    }
}

extern "C" void cuda_sgd_step(const sl_sgd_args *a, float *p, const float *g, float *buf, const sl_segment *segs,
                              int n_segs) {
    sgd_launch L;
    L.a = *a;
    int next = 0;
    while (pack_segments(&L.segs, segs, n_segs, &next)) {
        sgd_kernel<<<grid_for(L.segs.hi - L.segs.lo, OPT_MAX_STEP_BLOCKS), OPT_THREADS, 0, sl_cuda_stream()>>>(
            L, p, g, buf);
        CUDA_LAUNCH_CHECK();
    }
}
