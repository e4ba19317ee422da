// norm.cu: LayerNorm (GPT-2) and RMSNorm (LLaMA) forwards on the GPU, and the forwards fused with
// the residual add before them (ops.h residual_layernorm_forward / residual_rmsnorm_forward); the
// backwards are in norm_backward.cu.
//
// One warp per row (8 rows per 256-thread block). Lane l takes the VEC-wide vectors l, l + 32, ... of
// the row (VEC = 16 bytes of storage, 8 bf16 / 4 fp32, when C is a multiple of VEC, else VEC = 1,
// single elements; with a pointer not 16-byte aligned the same columns are read element by element,
// so the bits never depend on alignment). Two paths by row width:
//   registers (the default, aligned, C <= 32 * VEC * 8): the lane issues all its loads of the row (NV vectors,
//     NV = 1..8 rounded up to 1, 2, 3, 4, 6, 8) before it uses any, keeps them in registers, and the
//     mean, variance and output passes read the registers: the row is read from memory once, with
//     one round trip. The fused residual loads a's and b's vectors, then stores resid = a + b and
//     keeps the rounded sums as the row.
//   loop (wider or unaligned rows, or SHARDLM_FUSED_KERNELS=0: the earlier scalar kernels, for A/B
//     timing): each pass walks the row again (re-reads from L1 / L2); the fused residual writes its
//     row first and the norm reads it back. The register path sums in the vector loop's order.
// Each lane sums its columns in its order (vector by vector, element by element), then warp_sum's
// fixed butterfly combines the lanes; the CPU's two-pass formulas are kept (mean first, then the
// variance about it; rstd = 1/sqrt(var+eps)), and every elementwise expression is written with _rn
// intrinsics in the CPU's evaluation order, so nvcc cannot contract it differently.
// Invariants: no atomics; all reductions in a fixed order (a function of C and the switch); mean /
// rstd saved exactly as computed; all work queued on sl_cuda_stream(). resid may be a or b: every
// element is read and then written by the same lane.
// Fused residual + norm == residual_forward + the norm forward, bit for bit: the column order is a
// function of C (and the switch) alone, and the fused row is the rounded resid, as stored and read back.
// Row sums are not bit-identical to the CPU's (OpenMP simd order); the elementwise maths is.
// Storage: inp, out, a, b and resid are activations, and w, b the model's parameter copy (T = floatX:
// with bf16 storage the bf16 shadow of the parameters); mean and rstd are fp32.
#include "ops/cuda/cuda_common.cuh"
#include "shardlm/settings.h"

#include <initializer_list>
#include <type_traits>

#define NORM_THREADS 256
#define NORM_ROWS_PER_BLOCK (NORM_THREADS / 32)
#define NORM_MAX_NV 8  // vectors a lane holds on the register path

// ---- the elementwise maths of both paths ------------------------------------------------------------

// LayerNorm's output for one element: (x - mean) * rstd * w + b, in the CPU's order.
__device__ __forceinline__ float layernorm_out(float x, float m, float r, float w, float b) {
    return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x, m), r), w), b);
}
// RMSNorm's: w * (x * rstd) (transformers computes x * rstd first, then multiplies by the weight).
__device__ __forceinline__ float rmsnorm_out(float x, float r, float w) { return __fmul_rn(w, __fmul_rn(x, r)); }
// rstd from the mean of squares (LN: the variance): 1 / sqrt(ms + eps).
__device__ __forceinline__ float norm_rstd(float ms, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
}

// ---- register path: a lane's NV vectors of the row, loaded at once ----------------------------------------

template <typename T, int VEC, int NV> struct row_regs {
    sl_vec<T, VEC> v[NV];  // vector i: columns (i * 32 + lane) * VEC ... + VEC - 1 (unused at or past C)
};

// The lane's vectors of row x, every load issued before any is used.
template <typename T, int VEC, int NV>
__device__ __forceinline__ void regs_load(row_regs<T, VEC, NV> &r, const T *x, int C, int lane) {
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = (i * 32 + lane) * VEC;
        if (c < C) r.v[i] = *reinterpret_cast<const sl_vec<T, VEC> *>(x + c);
    }
}

// x = a + b rounded to T, stored to resid: every vector of a and b is loaded before the first store
// (resid may be a or b; each element is read and written by this lane only).
template <typename T, int VEC, int NV>
__device__ __forceinline__ void regs_residual(row_regs<T, VEC, NV> &x, T *resid, const T *a, const T *b, int C,
                                              int lane) {
    row_regs<T, VEC, NV> y;
    regs_load(x, a, C, lane);
    regs_load(y, b, C, lane);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = (i * 32 + lane) * VEC;
        if (c >= C) continue;
#pragma unroll
        for (int j = 0; j < VEC; j++) x.v[i].v[j] = from_f32<T>(__fadd_rn(to_f32(x.v[i].v[j]), to_f32(y.v[i].v[j])));
        *reinterpret_cast<sl_vec<T, VEC> *>(resid + c) = x.v[i];
    }
}

// The lane's sum of f(x) over its columns, in its order; the warp's total by warp_sum.
template <typename T, int VEC, int NV, typename F>
__device__ __forceinline__ float regs_sum(const row_regs<T, VEC, NV> &r, int C, int lane, F f) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        if ((i * 32 + lane) * VEC >= C) continue;
#pragma unroll
        for (int j = 0; j < VEC; j++) s = __fadd_rn(s, f(to_f32(r.v[i].v[j])));
    }
    return warp_sum(s);
}

// y = LayerNorm of the row in registers; lane 0 saves mean and rstd. y is never w or b (restrict: the
// loads of w and b may move ahead of the stores). w and b are loaded after the statistics, not with
// the row: held through them, they took GPT-2's bf16 row (NV 3) from 56 to 92 registers.
template <typename T, int VEC, int NV>
__device__ __forceinline__ void regs_layernorm(T *__restrict__ y, float *mean, float *rstd,
                                               const row_regs<T, VEC, NV> &x, const T *__restrict__ w,
                                               const T *__restrict__ b, int C, float eps, int lane) {
    const float m = __fdiv_rn(regs_sum(x, C, lane, [](float v) { return v; }), (float)C);
    const float var = __fdiv_rn(regs_sum(x, C, lane, [m](float v) {
                                    const float d = __fsub_rn(v, m);
                                    return __fmul_rn(d, d);
                                }),
                                (float)C);
    const float r = norm_rstd(var, eps);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = (i * 32 + lane) * VEC;
        if (c >= C) continue;
        float wv[VEC], bv[VEC], o[VEC];
        load_vec<T, VEC>(wv, w + c);
        load_vec<T, VEC>(bv, b + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = layernorm_out(to_f32(x.v[i].v[j]), m, r, wv[j], bv[j]);
        store_vec<T, VEC>(y + c, o);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = r;
    }
}

// y = RMSNorm of the row in registers; lane 0 saves rstd (y is never w, as above).
template <typename T, int VEC, int NV>
__device__ __forceinline__ void regs_rmsnorm(T *__restrict__ y, float *rstd, const row_regs<T, VEC, NV> &x,
                                             const T *__restrict__ w, int C, float eps, int lane) {
    const float ss = regs_sum(x, C, lane, [](float v) { return __fmul_rn(v, v); });
    const float r = norm_rstd(__fdiv_rn(ss, (float)C), eps);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = (i * 32 + lane) * VEC;
        if (c >= C) continue;
        float wv[VEC], o[VEC];
        load_vec<T, VEC>(wv, w + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = rmsnorm_out(to_f32(x.v[i].v[j]), r, wv[j]);
        store_vec<T, VEC>(y + c, o);
    }
    if (lane == 0) *rstd = r;
}

// ---- loop path: each pass walks the row (vectors of VEC, or single elements) ------------------------------

// VEC elements at p, widened: one 16-byte access when every pointer of the call is aligned (AL), else
// VEC element accesses. The same values in the same columns either way, so a call's sums depend on C
// alone, not on where its buffers start (the fused residual norm and residual_forward + the norm
// forward must agree whatever the alignment of a and b: an fp32 arena puts buffers at 8 mod 16).
template <typename T, int VEC, bool AL> __device__ __forceinline__ void row_load(float *f, const T *p) {
    if constexpr (AL) {
        load_vec<T, VEC>(f, p);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) f[j] = to_f32(p[j]);
    }
}
template <typename T, int VEC, bool AL> __device__ __forceinline__ void row_store(T *p, const float *f) {
    if constexpr (AL) {
        store_vec<T, VEC>(p, f);
    } else {
#pragma unroll
        for (int j = 0; j < VEC; j++) p[j] = from_f32<T>(f[j]);
    }
}

// One row of LayerNorm by one warp: y (C) = (x - mean) * rstd * w + b; lane 0 saves mean and rstd.
template <typename T, int VEC, bool AL>
__device__ __forceinline__ void layernorm_row(T *y, float *mean, float *rstd, const T *x, const T *w, const T *b,
                                              int C, float eps, int lane) {
    float s = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC];
        row_load<T, VEC, AL>(xv, x + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) s = __fadd_rn(s, xv[j]);
    }
    const float m = __fdiv_rn(warp_sum(s), (float)C);
    float v = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC];
        row_load<T, VEC, AL>(xv, x + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const float d = __fsub_rn(xv[j], m);
            v = __fadd_rn(v, __fmul_rn(d, d));
        }
    }
    const float r = norm_rstd(__fdiv_rn(warp_sum(v), (float)C), eps);
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC], wv[VEC], bv[VEC], o[VEC];
        row_load<T, VEC, AL>(xv, x + c);
        row_load<T, VEC, AL>(wv, w + c);
        row_load<T, VEC, AL>(bv, b + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = layernorm_out(xv[j], m, r, wv[j], bv[j]);
        row_store<T, VEC, AL>(y + c, o);
    }
    if (lane == 0) {
        *mean = m;
        *rstd = r;
    }
}

// resid (C) = a + b for one row by one warp, each lane its vectors (resid may be a or b).
template <typename T, int VEC, bool AL>
__device__ __forceinline__ void residual_row(T *resid, const T *a, const T *b, int C, int lane) {
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float av[VEC], bv[VEC];
        row_load<T, VEC, AL>(av, a + c);
        row_load<T, VEC, AL>(bv, b + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) av[j] = __fadd_rn(av[j], bv[j]);
        row_store<T, VEC, AL>(resid + c, av);
    }
}

// One row of RMSNorm by one warp: y (C) = w * (x * rstd); lane 0 saves rstd.
template <typename T, int VEC, bool AL>
__device__ __forceinline__ void rmsnorm_row(T *y, float *rstd, const T *x, const T *w, int C, float eps, int lane) {
    float ss = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC];
        row_load<T, VEC, AL>(xv, x + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) ss = __fadd_rn(ss, __fmul_rn(xv[j], xv[j]));
    }
    const float r = norm_rstd(__fdiv_rn(warp_sum(ss), (float)C), eps);
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC], wv[VEC], o[VEC];
        row_load<T, VEC, AL>(xv, x + c);
        row_load<T, VEC, AL>(wv, w + c);
#pragma unroll
        for (int j = 0; j < VEC; j++) o[j] = rmsnorm_out(xv[j], r, wv[j]);
        row_store<T, VEC, AL>(y + c, o);
    }
    if (lane == 0) *rstd = r;
}

// ---- the kernels: one warp per row (whole warps leave together); NV > 0 the register path (aligned
// rows, AL), NV == 0 the loop path ---------------------------------------------------------------------

template <typename T, int VEC, bool AL, int NV>
__global__ void layernorm_forward_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w, const T *b,
                                         int N, int C, float eps) {
    const int lane = threadIdx.x % 32, n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const size_t row = (size_t)n * C;
    if constexpr (NV > 0) {
        row_regs<T, VEC, NV> x;
        regs_load(x, inp + row, C, lane);
        regs_layernorm(out + row, mean + n, rstd + n, x, w, b, C, eps, lane);
    } else {
        layernorm_row<T, VEC, AL>(out + row, mean + n, rstd + n, inp + row, w, b, C, eps, lane);
    }
}

template <typename T, int VEC, bool AL, int NV>
__global__ void residual_layernorm_forward_kernel(T *resid, T *out, float *mean, float *rstd, const T *a, const T *b,
                                                  const T *w, const T *bias, int N, int C, float eps) {
    const int lane = threadIdx.x % 32, n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const size_t row = (size_t)n * C;
    if constexpr (NV > 0) {
        row_regs<T, VEC, NV> x;
        regs_residual(x, resid + row, a + row, b + row, C, lane);
        regs_layernorm(out + row, mean + n, rstd + n, x, w, bias, C, eps, lane);
    } else {
        residual_row<T, VEC, AL>(resid + row, a + row, b + row, C, lane);
        layernorm_row<T, VEC, AL>(out + row, mean + n, rstd + n, resid + row, w, bias, C, eps, lane);
    }
}

template <typename T, int VEC, bool AL, int NV>
__global__ void rmsnorm_forward_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C, float eps) {
    const int lane = threadIdx.x % 32, n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const size_t row = (size_t)n * C;
    if constexpr (NV > 0) {
        row_regs<T, VEC, NV> x;
        regs_load(x, inp + row, C, lane);
        regs_rmsnorm(out + row, rstd + n, x, w, C, eps, lane);
    } else {
        rmsnorm_row<T, VEC, AL>(out + row, rstd + n, inp + row, w, C, eps, lane);
    }
}

template <typename T, int VEC, bool AL, int NV>
__global__ void residual_rmsnorm_forward_kernel(T *resid, T *out, float *rstd, const T *a, const T *b, const T *w,
                                                int N, int C, float eps) {
    const int lane = threadIdx.x % 32, n = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (n >= N) return;
    const size_t row = (size_t)n * C;
    if constexpr (NV > 0) {
        row_regs<T, VEC, NV> x;
        regs_residual(x, resid + row, a + row, b + row, C, lane);
        regs_rmsnorm(out + row, rstd + n, x, w, C, eps, lane);
    } else {
        residual_row<T, VEC, AL>(resid + row, a + row, b + row, C, lane);
        rmsnorm_row<T, VEC, AL>(out + row, rstd + n, resid + row, w, C, eps, lane);
    }
}

// ---- entry points (cuda_ops.cuh) ------------------------------------------------------------------

static unsigned int row_blocks(int N) { return ceil_div_u((size_t)N, NORM_ROWS_PER_BLOCK); }

// Which path and width a call takes. vec: VEC (16 bytes of storage) when C is a multiple, so the
// lanes take their columns in vectors and sum them in that order, else 1 (single elements); aligned:
// every pointer 16-byte aligned (16-byte loads; else element loads in the same order: the same bits);
// nv > 0: the register path with nv vectors a lane (aligned rows up to NORM_MAX_NV vectors a lane).
// SHARDLM_FUSED_KERNELS=0: the earlier kernels (single elements). A function of C and the switch for
// the bits, of the pointers only for the loads.
struct norm_plan {
    int vec;
    bool aligned;
    int nv;
};
template <typename T> static norm_plan plan_norm(int C, std::initializer_list<const void *> ptrs) {
    constexpr int VEC = 16 / sizeof(T);
    if (!sl_settings_get()->fused_kernels || C % VEC != 0) return {1, true, 0};
    bool aligned = true;
    for (const void *q : ptrs) aligned = aligned && sl_aligned16(q);
    if (!aligned) return {VEC, false, 0};
    const int k = (C + 32 * VEC - 1) / (32 * VEC);  // vectors of the widest lane
    return {VEC, true, k <= 4 ? k : k <= 6 ? 6 : k <= NORM_MAX_NV ? NORM_MAX_NV : 0};
}

// The kernel a plan picks, launched on N rows: kernel(VEC, AL, NV), each a std::integral_constant,
// gives the op's kernel instance; all take the same arguments.
template <typename T, typename K, typename... A>
static void launch_norm(const norm_plan &p, int N, K kernel, A... args) {
    using vec = std::integral_constant<int, 16 / sizeof(T)>;
    using one = std::integral_constant<int, 1>;
    using loop = std::integral_constant<int, 0>;
    cudaStream_t s = sl_cuda_stream();
    auto go = [&](auto k) { k<<<row_blocks(N), NORM_THREADS, 0, s>>>(args...); };
    auto regs = [&](auto nv) { go(kernel(vec(), std::true_type(), nv)); };
    switch (p.nv) {
    case 0:
        if (p.vec == 1) go(kernel(one(), std::true_type(), loop()));
        else if (p.aligned) go(kernel(vec(), std::true_type(), loop()));
        else go(kernel(vec(), std::false_type(), loop()));
        break;
    case 1: regs(std::integral_constant<int, 1>()); break;
    case 2: regs(std::integral_constant<int, 2>()); break;
    case 3: regs(std::integral_constant<int, 3>()); break;
    case 4: regs(std::integral_constant<int, 4>()); break;
    case 6: regs(std::integral_constant<int, 6>()); break;
    default: regs(std::integral_constant<int, NORM_MAX_NV>()); break;
    }
    CUDA_LAUNCH_CHECK();
}

// An op's kernel instances, for launch_norm.
#define NORM_KERNEL(kernel)                                                                                  \
    [](auto vec, auto al, auto nv) {                                                                         \
        return kernel<floatX, decltype(vec)::value, decltype(al)::value, decltype(nv)::value>;               \
    }

template <typename floatX>
void cuda_layernorm_forward(sl_act *out, float *mean, float *rstd, const sl_act *inp, const sl_act *w,
                            const sl_act *b, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    floatX *o = as_storage<floatX>(out);
    const floatX *x = as_storage<floatX>(inp), *wt = as_storage<floatX>(w), *bs = as_storage<floatX>(b);
    launch_norm<floatX>(plan_norm<floatX>(C, {o, x, wt, bs}), N, NORM_KERNEL(layernorm_forward_kernel), o, mean, rstd,
                        x, wt, bs, N, C, eps);
}

template <typename floatX>
void cuda_residual_layernorm_forward(sl_act *resid, sl_act *out, float *mean, float *rstd, const sl_act *a,
                                     const sl_act *b, const sl_act *w, const sl_act *bias, int N, int C,
                                     float eps) {
    if (N <= 0 || C <= 0) return;
    floatX *r = as_storage<floatX>(resid), *o = as_storage<floatX>(out);
    const floatX *xa = as_storage<floatX>(a), *xb = as_storage<floatX>(b);
    const floatX *wt = as_storage<floatX>(w), *bs = as_storage<floatX>(bias);
    launch_norm<floatX>(plan_norm<floatX>(C, {r, o, xa, xb, wt, bs}), N, NORM_KERNEL(residual_layernorm_forward_kernel),
                        r, o, mean, rstd, xa, xb, wt, bs, N, C, eps);
}

template <typename floatX>
void cuda_rmsnorm_forward(sl_act *out, float *rstd, const sl_act *inp, const sl_act *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    floatX *o = as_storage<floatX>(out);
    const floatX *x = as_storage<floatX>(inp), *wt = as_storage<floatX>(w);
    launch_norm<floatX>(plan_norm<floatX>(C, {o, x, wt}), N, NORM_KERNEL(rmsnorm_forward_kernel), o, rstd, x, wt, N, C,
                        eps);
}

template <typename floatX>
void cuda_residual_rmsnorm_forward(sl_act *resid, sl_act *out, float *rstd, const sl_act *a, const sl_act *b,
                                   const sl_act *w, int N, int C, float eps) {
    if (N <= 0 || C <= 0) return;
    floatX *r = as_storage<floatX>(resid), *o = as_storage<floatX>(out);
    const floatX *xa = as_storage<floatX>(a), *xb = as_storage<floatX>(b), *wt = as_storage<floatX>(w);
    launch_norm<floatX>(plan_norm<floatX>(C, {r, o, xa, xb, wt}), N, NORM_KERNEL(residual_rmsnorm_forward_kernel), r, o,
                        rstd, xa, xb, wt, N, C, eps);
}

SL_CUDA_STORAGE_INSTANCES(cuda_layernorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_residual_layernorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_rmsnorm_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_residual_rmsnorm_forward)
