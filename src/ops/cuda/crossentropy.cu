// crossentropy.cu: softmax cross-entropy over the first V of Vp (padded) logit columns and its
// gradient, in place over the logits, so the probabilities are never stored: forward (evaluation:
// the loss and each row's log-sum-exp), backward (the gradient from the saved log-sum-exp), and the
// fused classifier of training (llm.c's design), both in one pass over the logits.
//
// One CE_THREADS block per row. Thread t takes the vectors t, t + CE_THREADS, ... of the row (16-byte
// vectors of 8 bf16 / 4 fp32 when Vp is a multiple and the logits 16-byte aligned, else single
// elements).
//   row statistics (ce_row_lse): each thread keeps a running max m and sum s of exp(x - m) over its
//   columns below V, a vector at a time (ce_lse_vec: the vector's max, s moved to the new max once,
//   the vector's exponentials added pairwise); the lanes of a warp merge (m, s) pairs with xor
//   butterflies, lane 0s put the warps' pairs in shared memory, and every warp merges those the same
//   way, so every thread holds the same lse = m + log(s) bits. One read of the row.
//   gradient (ce_grad_row): x[v] = exp(x[v] - lse) * dloss (0 * ... on ignored rows), minus dloss at
//   the target, 0 in the padded columns: the CPU's expression, with the GPU's exponential
//   (ce_exp_from: expf for fp32 storage; for bf16 one FFMA and the SFU's ex2, 2^(x log2 e - lse log2 e)),
//   not the CPU's vexpf polynomial.
//   forward  = statistics; thread 0 writes lse and the row loss (double)(lse - x[target]) (0 for an
//              ignored row, target < 0) into a scratch vector;
//   backward = gradient from the saved lse;
//   fused    = thread 0 reads x[target] first, then statistics, lse and the row loss as forward,
//              then the gradient: one read of the row from memory (the second should come from
//              L2: a grid of 2 blocks per SM walks the rows, so 2 x 132 rows of 100 KB are in
//              flight on an H100, and the gradient pass reads and writes with the evict-first
//              hint, keeping L2 for rows still to be re-read), one write.
//   One 1024-thread block then sums the N row losses in double in a fixed order (strided serial
//   sums, then a shared-memory tree) and the total comes back to the host: the one synchronisation
//   of forward and fused (cuda_ops.h).
// Invariants: no atomics; every reduction has a fixed order (the (m, s) merge is symmetric, so both
// lanes of a butterfly get the same bits), so results are bit-identical run to run, and fused gives
// forward's lse and loss and backward's gradient bit for bit (the same device functions). In the
// fused kernel every read of the row (thread 0's x[target] included) happens before the block
// barrier inside ce_row_lse and every write after it. Not bit-identical to the CPU (OpenMP simd
// order, a two-pass max then sum, glibc logf, vexpf): within rounding of it (1e-5 in the fp32
// tests). The loss scratch is grow-only (one process drives one GPU). Cost: forward reads the
// logits once, backward reads and writes them once, fused reads them once from memory (plus the
// L2 re-read) and writes them once; two exponentials a logit (ce_exp_from), and under bf16 storage
// about six instructions a logit in each pass (2026-11-28: 15 and 14 before, a branch a logit, with
// the max moved logit by logit; the evaluation forward alone, a read of the logits, ran at 2.2 TB/s
// on the H200 against the backward's 4.0 with a read and a write: instruction-bound).
#include "ops/cuda/cuda_common.cuh"
#include "shardlm/settings.h"

#include <math.h>

#define CE_THREADS 512
#define CE_SUM_THREADS 1024
#define CE_RED 64  // floats of a row kernel's static red array: the warps' (m, s) pairs (ce_row_lse)
#define CE_FUSED_BLOCKS_PER_SM 2  // the fused kernel's grid: rows in flight (see crossentropy_fused_kernel)

static sl_cuda_scratch crossentropy_buf;  // grow-only scratch (cuda_common.cuh)
static unsigned long smem_launches, smem2_launches;  // cuda_crossentropy_smem(2)_launches; one host thread

extern "C" unsigned long cuda_crossentropy_smem_launches(void) { return smem_launches; }
extern "C" unsigned long cuda_crossentropy_smem2_launches(void) { return smem2_launches; }

// ---- row statistics ---------------------------------------------------------------------------------

#define CE_LOG2E 1.4426950408889634f

// 2^x in one SFU instruction, results below 2^-126 flushed to 0 (__expf adds three instructions of
// range fix-up for those: terms that small change neither a sum of exponentials nor a bf16 gradient).
__device__ __forceinline__ float ce_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// exp(x - m), as the storage type calls for: fp32 storage CUDA's expf (2 ulp); bf16 storage one FFMA
// and one SFU instruction, 2^(x log2(e) - m log2(e)) (x log2(e) exact inside the FFMA; the rounding of
// m log2(e), which the compiler computes once per m, moves the result by about 1e-7 |m| relative: far
// below the bf16 rounding of the gradient). m = -inf gives 0. Each logit takes two, and with the CPU's
// vexpf polynomial (about 40 instructions each, written without contraction) the classifier would be
// bound by instruction issue, not memory, on GPT-2's 3.3 G logits a step (the earlier kernels used
// it: 10.8 ms each way on an H100).
template <typename T> __device__ __forceinline__ float ce_exp_from(float x, float m) {
    return ce_ex2(__fmaf_rn(x, CE_LOG2E, -__fmul_rn(m, CE_LOG2E)));
}
template <> __device__ __forceinline__ float ce_exp_from<float>(float x, float m) { return expf(__fsub_rn(x, m)); }

// The factor that moves a sum of ce_exp_from(., m0) terms to a max m >= m0: bf16 storage
// 2^(m0 log2(e) - m log2(e)), the products rounded as the terms' were, so their rounding cancels (and
// a max that stays gives exactly 1); fp32 expf(m0 - m). m0 = -inf gives 0.
template <typename T> __device__ __forceinline__ float ce_rescale(float m0, float m) {
    return ce_ex2(__fsub_rn(__fmul_rn(m0, CE_LOG2E), __fmul_rn(m, CE_LOG2E)));
}
template <> __device__ __forceinline__ float ce_rescale<float>(float m0, float m) { return expf(__fsub_rn(m0, m)); }

// (m, s) <- the merge of (m, s) and (m2, s2): max and the sum of exp(x - max) over both sets. An empty
// set is (-inf, 0). Symmetric: merging (a, b) and (b, a) gives the same bits.
template <typename T> __device__ __forceinline__ void ce_merge(float &m, float &s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    float a = m == -INFINITY ? 0.0f : __fmul_rn(s, ce_rescale<T>(m, mx));
    float b = m2 == -INFINITY ? 0.0f : __fmul_rn(s2, ce_rescale<T>(m2, mx));
    m = mx;
    s = __fadd_rn(a, b);
}

template <typename T> __device__ __forceinline__ void ce_warp_merge(float &m, float &s) {
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ce_merge<T>(m, s, m2, s2);
    }
}

// One vector of a row into a thread's running (m, s): its max first, the running sum moved to the
// new max once (by exactly 1 when the max stays), then the vector's exponentials summed pairwise in a
// fixed order. A column a caller masks is -inf (adds 0). Per logit: one FMNMX, one FFMA, one SFU,
// one FADD (bf16 storage), against a branch and four more instructions a logit with the max moved
// logit by logit.
template <typename T, int VEC> __device__ __forceinline__ void ce_lse_vec(float &m, float &s, const float *xv) {
    float vm = xv[0];
#pragma unroll
    for (int j = 1; j < VEC; j++) vm = fmaxf(vm, xv[j]);
    const float mn = fmaxf(m, vm);
    float e[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) e[j] = ce_exp_from<T>(xv[j], mn);
#pragma unroll
    for (int w = 1; w < VEC; w *= 2)
#pragma unroll
        for (int j = 0; j + w < VEC; j += 2 * w) e[j] = __fadd_rn(e[j], e[j + w]);
    s = __fadd_rn(__fmul_rn(s, ce_rescale<T>(m, mn)), e[0]);
    m = mn;
}

// The log-sum-exp of x[0..V), by the whole block; every thread returns the same bits. red: CE_RED
// (2 x 32) floats of shared memory. Contains __syncthreads: every thread's reads of x precede the return.
template <typename T, int VEC> __device__ float ce_row_lse(const T *x, int V, float *red) {
    __syncthreads();  // red is free: a previous row's readers are done with it
    float m = -INFINITY, s = 0.0f;
    int v0 = threadIdx.x * VEC;
    for (; v0 + VEC <= V; v0 += CE_THREADS * VEC) {  // whole vectors below V: no column checks
        float xv[VEC];
        load_vec<T, VEC>(xv, x + v0);
        ce_lse_vec<T, VEC>(m, s, xv);
    }
    if (v0 < V) {  // the vector holding column V - 1 (one thread's): its columns past V masked
        float xv[VEC];
        load_vec<T, VEC>(xv, x + v0);
#pragma unroll
        for (int j = 0; j < VEC; j++)
            if (v0 + j >= V) xv[j] = -INFINITY;
        ce_lse_vec<T, VEC>(m, s, xv);
    }
    ce_warp_merge<T>(m, s);
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        red[warp] = m;
        red[32 + warp] = s;
    }
    __syncthreads();
    m = lane < CE_THREADS / 32 ? red[lane] : -INFINITY;
    s = lane < CE_THREADS / 32 ? red[32 + lane] : 0.0f;
    ce_warp_merge<T>(m, s);
    return __fadd_rn(m, logf(s));
}

// A row's loss: lse - x[target], or 0 for an ignored row.
__device__ __forceinline__ double ce_row_loss(float lse, int target, float x_target) {
    return target >= 0 ? (double)__fsub_rn(lse, x_target) : 0.0;
}

// dst (Vp) becomes the gradient of the row src holds (dst itself, or its copy in shared memory:
// SRC_SHARED), by the whole block (see the top comment). Whole vectors below V take no column checks
// (the target's vector, one a row, one branch); the vector holding column V - 1 and the padding after
// it check each column. The same expression for a column either way.
template <typename T, int VEC, bool SRC_SHARED = false>
__device__ __forceinline__ void ce_grad_row(T *dst, const T *src, float lse, int target, int V, int Vp, float dloss) {
    const float scale = target >= 0 ? dloss : 0.0f;
    auto load = [&](float *xv, int v0) {
        if constexpr (SRC_SHARED) load_vec<T, VEC>(xv, src + v0);
        else load_vec_cs<T, VEC>(xv, src + v0);  // the row's last read and its only write: evict first
    };
    int v0 = threadIdx.x * VEC;
    for (; v0 + VEC <= V; v0 += CE_THREADS * VEC) {
        float xv[VEC];
        load(xv, v0);
#pragma unroll
        for (int j = 0; j < VEC; j++) xv[j] = __fmul_rn(ce_exp_from<T>(xv[j], lse), scale);
        if ((unsigned)(target - v0) < (unsigned)VEC) {
#pragma unroll
            for (int j = 0; j < VEC; j++)
                if (v0 + j == target) xv[j] = __fsub_rn(xv[j], dloss);
        }
        store_vec_cs<T, VEC>(dst + v0, xv);
    }
    for (; v0 < Vp; v0 += CE_THREADS * VEC) {
        float xv[VEC];
        load(xv, v0);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const int v = v0 + j;
            float g = 0.0f;
            if (v < V) {
                g = __fmul_rn(ce_exp_from<T>(xv[j], lse), scale);
                if (v == target) g = __fsub_rn(g, dloss);
            }
            xv[j] = g;
        }
        store_vec_cs<T, VEC>(dst + v0, xv);
    }
}

// ---- kernels: one block per row of logits (N, Vp) ------------------------------------------------------

template <typename T, int VEC>
__global__ void __launch_bounds__(CE_THREADS)
    crossentropy_forward_kernel(float *lse, double *row_loss, const T *logits, const int *targets, int V, int Vp) {
    __shared__ float red[CE_RED];
    size_t n = blockIdx.x;
    const T *x = logits + n * (size_t)Vp;
    float l = ce_row_lse<T, VEC>(x, V, red);
    if (threadIdx.x == 0) {
        int target = targets[n];
        lse[n] = l;
        row_loss[n] = ce_row_loss(l, target, target >= 0 ? to_f32(x[target]) : 0.0f);
    }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(CE_THREADS)
    crossentropy_backward_kernel(T *logits, const float *lse, const int *targets, int V, int Vp, float dloss) {
    size_t n = blockIdx.x;
    ce_grad_row<T, VEC>(logits + n * (size_t)Vp, logits + n * (size_t)Vp, lse[n], targets[n], V, Vp, dloss);
}

// Rows n = blockIdx.x, + gridDim.x, ...: a grid of CE_FUSED_BLOCKS_PER_SM blocks per SM keeps the rows
// in flight (each read twice) within L2 (2 x 132 rows of 100 KB on an H100 for GPT-2's bf16 logits).
template <typename T, int VEC>
__global__ void __launch_bounds__(CE_THREADS) crossentropy_fused_kernel(float *lse, double *row_loss, T *logits,
                                                                        const int *targets, int N, int V, int Vp,
                                                                        float dloss) {
    __shared__ float red[CE_RED];
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        T *x = logits + (size_t)n * Vp;
        int target = targets[n];
        float x_target = threadIdx.x == 0 && target >= 0 ? to_f32(x[target]) : 0.0f;  // before any thread writes
        float l = ce_row_lse<T, VEC>(x, V, red);
        if (threadIdx.x == 0) {
            lse[n] = l;
            row_loss[n] = ce_row_loss(l, target, x_target);
        }
        ce_grad_row<T, VEC>(x, x, l, target, V, Vp, dloss);
    }
}

// The fused classifier with each row copied into shared memory first (SHARDLM_CE_ROW_SMEM=1, where a
// row of Vp elements fits; 16-byte vectors only): the statistics and the gradient read the copy, so
// the row comes from memory once and never through L2 again; cp.async keeps every thread's 16-byte
// copies in flight at once. The same device functions on the same values as crossentropy_fused_kernel:
// the same bits. Rows n = blockIdx.x, + gridDim.x, ... (as many blocks as fit an SM, times the SMs).
// TWO (SHARDLM_CE_ROW_SMEM=2, where two rows fit): two row buffers a block, and the copy of the block's
// next row is in flight while this one is used, so a block's memory traffic no longer stops while it
// computes (GPT-2's bf16 rows: one block an SM, 201 KB, against two of one row). The same bits.
template <typename T, int VEC, bool TWO>
__global__ void __launch_bounds__(CE_THREADS) crossentropy_fused_smem_kernel(float *lse, double *row_loss, T *logits,
                                                                             const int *targets, int N, int V, int Vp,
                                                                             float dloss) {
    __shared__ float red[CE_RED];
    extern __shared__ __align__(16) unsigned char row_smem[];
    T *rows = reinterpret_cast<T *>(row_smem);  // TWO: the block's k-th row in rows + (k % 2) Vp
    const int chunks = Vp / VEC;                // 16-byte chunks of a row
    // dst <- row n of the logits, every thread's chunks in flight at once, as one cp.async group
    auto copy_row = [&](T *dst, int n) {
        const T *src = logits + (size_t)n * Vp;
        for (int c = threadIdx.x; c < chunks; c += CE_THREADS) {
            const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst + (size_t)c * VEC);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src + (size_t)c * VEC) : "memory");
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    if (TWO && (int)blockIdx.x < N) copy_row(rows, blockIdx.x);  // the first row, ahead of the loop
    for (int n = blockIdx.x, k = 0; n < N; n += gridDim.x, k++) {
        T *x = logits + (size_t)n * Vp;
        T *row = rows + (TWO ? (size_t)(k & 1) * Vp : 0);
        __syncthreads();  // every thread is done reading the buffer the copy below fills (the previous row's)
        if (!TWO) {
            copy_row(row, n);
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        } else if (n + (int)gridDim.x < N) {
            copy_row(rows + (size_t)((k + 1) & 1) * Vp, n + (int)gridDim.x);
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this row's group landed; the next in flight
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        __syncthreads();  // the copy landed for every thread
        int target = targets[n];
        float x_target = threadIdx.x == 0 && target >= 0 ? to_f32(row[target]) : 0.0f;
        float l = ce_row_lse<T, VEC>(row, V, red);
        if (threadIdx.x == 0) {
            lse[n] = l;
            row_loss[n] = ce_row_loss(l, target, x_target);
        }
        ce_grad_row<T, VEC, true>(x, row, l, target, V, Vp, dloss);
    }
}

// *total = sum of row_loss[0..N) in a fixed order. One block of CE_SUM_THREADS threads.
__global__ void __launch_bounds__(CE_SUM_THREADS) loss_sum_kernel(double *total, const double *row_loss, int N) {
    __shared__ double s[CE_SUM_THREADS];
    double acc = 0.0;
    for (int i = threadIdx.x; i < N; i += CE_SUM_THREADS) acc = __dadd_rn(acc, row_loss[i]);
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int stride = CE_SUM_THREADS / 2; stride > 0; stride >>= 1) {
        if ((int)threadIdx.x < stride) s[threadIdx.x] = __dadd_rn(s[threadIdx.x], s[threadIdx.x + stride]);
        __syncthreads();
    }
    if (threadIdx.x == 0) *total = s[0];
}

// ---- entry points --------------------------------------------------------------------------------

// The vector width for rows of Vp elements at logits: 16 bytes when every row starts 16-byte aligned.
template <typename T> static bool ce_vectors(const void *logits, int Vp) {
    return Vp % (int)(16 / sizeof(T)) == 0 && sl_aligned16(logits);
}

// Whether the shared-memory row kernel takes rows of Vp elements of elem bytes, `rows` rows a block:
// 16-byte vectors, and the rows fit one block's shared memory beside its static red array, on this GPU
// (the logits' 16-byte alignment is checked apart, by ce_vectors).
static bool ce_row_kernel_takes(int Vp, size_t elem, int rows) {
    const cudaDeviceProp *p = sl_cuda_device_props();
    return Vp % (int)(16 / elem) == 0 && p &&
           (size_t)Vp * elem * (size_t)rows + CE_RED * sizeof(float) <= p->sharedMemPerBlockOptin;
}

extern "C" int cuda_crossentropy_smem_takes(int Vp, int bf16, int rows) {
    return ce_row_kernel_takes(Vp, bf16 ? 2 : 4, rows);
}

// Sums the N row losses queued before it and waits for the total (NaN when something failed).
static double ce_total(double *row_loss, int N) {
    double *total = row_loss + N;
    cudaStream_t s = sl_cuda_stream();
    loss_sum_kernel<<<1, CE_SUM_THREADS, 0, s>>>(total, row_loss, N);
    CUDA_LAUNCH_CHECK();
    double host_total = NAN;  // stays NaN if the copy fails (the error is recorded)
    CUDA_CHECK(cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return host_total;
}

static double *ce_row_losses(int N) {
    return (double *)sl_cuda_scratch_get(&crossentropy_buf, sizeof(double) * ((size_t)N + 1), "crossentropy scratch");
}

template <typename floatX>
double cuda_crossentropy_forward(float *lse, const sl_act *logits, const int *targets, int N, int V, int Vp) {
    if (N <= 0) return 0.0;
    double *row_loss = ce_row_losses(N);
    if (!row_loss) return NAN;
    const floatX *x = as_storage<floatX>(logits);
    cudaStream_t s = sl_cuda_stream();
    if (ce_vectors<floatX>(x, Vp))
        crossentropy_forward_kernel<floatX, 16 / sizeof(floatX)><<<(unsigned int)N, CE_THREADS, 0, s>>>(
            lse, row_loss, x, targets, V, Vp);
    else
        crossentropy_forward_kernel<floatX, 1><<<(unsigned int)N, CE_THREADS, 0, s>>>(lse, row_loss, x, targets, V, Vp);
    CUDA_LAUNCH_CHECK();
    return ce_total(row_loss, N);
}

template <typename floatX>
void cuda_crossentropy_backward(sl_act *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                float dloss) {
    if (N <= 0 || Vp <= 0) return;
    floatX *x = as_storage<floatX>(logits);
    cudaStream_t s = sl_cuda_stream();
    if (ce_vectors<floatX>(x, Vp))
        crossentropy_backward_kernel<floatX, 16 / sizeof(floatX)><<<(unsigned int)N, CE_THREADS, 0, s>>>(
            x, lse, targets, V, Vp, dloss);
    else
        crossentropy_backward_kernel<floatX, 1><<<(unsigned int)N, CE_THREADS, 0, s>>>(x, lse, targets, V, Vp, dloss);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
double cuda_crossentropy_fused(float *lse, sl_act *logits, const int *targets, int N, int V, int Vp, float dloss) {
    if (N <= 0) return 0.0;
    double *row_loss = ce_row_losses(N);
    if (!row_loss) return NAN;
    floatX *x = as_storage<floatX>(logits);
    cudaStream_t s = sl_cuda_stream();
    const cudaDeviceProp *p = sl_cuda_device_props();
    const int sms = p ? p->multiProcessorCount : 132;
    const size_t row_bytes = (size_t)Vp * sizeof(floatX);
    // SHARDLM_CE_ROW_SMEM=1: rows in shared memory where that kernel takes them; =2: two rows a block
    // where two fit (else one)
    const int smem_rows = sl_settings_get()->ce_row_smem;
    if (smem_rows && ce_vectors<floatX>(x, Vp) && ce_row_kernel_takes(Vp, sizeof(floatX), 1)) {
        const bool two = smem_rows == 2 && ce_row_kernel_takes(Vp, sizeof(floatX), 2);
        auto kernel = two ? crossentropy_fused_smem_kernel<floatX, 16 / sizeof(floatX), true>
                          : crossentropy_fused_smem_kernel<floatX, 16 / sizeof(floatX), false>;
        const size_t smem = (two ? 2 : 1) * row_bytes;
        if (!sl_cuda_allow_smem(kernel, smem)) return NAN;
        int per_sm = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, CE_THREADS, smem));
        const int blocks = (per_sm > 0 ? per_sm : 1) * sms;
        kernel<<<(unsigned int)(N < blocks ? N : blocks), CE_THREADS, smem, s>>>(lse, row_loss, x, targets, N, V, Vp,
                                                                                  dloss);
        CUDA_LAUNCH_CHECK();
        smem_launches++;
        smem2_launches += two;
        return ce_total(row_loss, N);
    }
    int blocks = CE_FUSED_BLOCKS_PER_SM * sms;
    unsigned int grid = (unsigned int)(N < blocks ? N : blocks);
    if (ce_vectors<floatX>(x, Vp))
        crossentropy_fused_kernel<floatX, 16 / sizeof(floatX)><<<grid, CE_THREADS, 0, s>>>(lse, row_loss, x, targets, N,
                                                                                          V, Vp, dloss);
    else
        crossentropy_fused_kernel<floatX, 1><<<grid, CE_THREADS, 0, s>>>(lse, row_loss, x, targets, N, V, Vp, dloss);
    CUDA_LAUNCH_CHECK();
    return ce_total(row_loss, N);
}

SL_CUDA_STORAGE_INSTANCES(cuda_crossentropy_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_crossentropy_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_crossentropy_fused)
