// crossentropy.cu: softmax cross-entropy over the first V of Vp (padded) logit columns and its
// gradient, in place over the logits (the fused classifier of llm.c): forward keeps only each row's
// log-sum-exp, backward turns the logits into their gradient in one pass, so the probabilities are
// never stored separately.
//
// Forward: one 512-thread block per row: block max, then the sum of exp(x - max) (each thread
// strides the columns in order, warps combine with warp_sum's fixed butterfly, then warp 0's lanes
// combine the warps), lse = max + log(sum). Thread 0 writes the row loss (double)(lse - x[target])
// (0 for ignored rows, target < 0) into a scratch vector; one 1024-thread block then sums the N row
// losses in double in a fixed order (strided serial sums, then a shared-memory tree) and the total
// comes back to the host: the one synchronisation of this op (cuda_ops.h).
// Backward: one block per row; x[v] = exp(x[v] - lse) * dloss (0 * ... on ignored rows), minus dloss
// at the target, 0 in the padded columns: the CPU's expression, bit for bit (vexpf ported below).
// Invariants: no atomics; every reduction has a fixed order, so the results are bit-identical run to
// run; the loss scratch is grow-only (one process drives one GPU). Row sums are not bit-identical to
// the CPU's (OpenMP simd order, glibc logf). Cost: forward reads the logits twice (max pass, exp
// pass), backward reads and writes them once; the loss sum is N doubles.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_math.cuh"

#include <math.h>

#define CE_THREADS 512
#define CE_SUM_THREADS 1024

static sl_cuda_scratch crossentropy_buf;  // grow-only scratch (cuda_common.cuh)


// ---- block reductions (fixed order; every thread gets the result) -------------------------------

// red: CE_THREADS/32 floats of shared memory, free for reuse once this returns.
__device__ __forceinline__ float block_sum(float v, float *red) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();  // a previous reduction's readers are done with red
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_sum(lane < n_warps ? red[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float *red) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < n_warps ? red[lane] : -INFINITY);
}

// ---- kernels -------------------------------------------------------------------------------------

// lse (N), row_loss (N): one block per row of logits (N,Vp).
template <typename T>
__global__ void __launch_bounds__(CE_THREADS)
    crossentropy_forward_kernel(float *lse, double *row_loss, const T *logits, const int *targets, int V, int Vp) {
    __shared__ float red[CE_THREADS / 32];
    size_t n = blockIdx.x;
    const T *x = logits + n * (size_t)Vp;
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float xv = to_f32(x[v]);
        mx = xv > mx ? xv : mx;
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) sum = __fadd_rn(sum, vexpf_dev(__fsub_rn(to_f32(x[v]), mx)));
    sum = block_sum(sum, red);
    if (threadIdx.x == 0) {
        float l = __fadd_rn(mx, logf(sum));
        lse[n] = l;
        int target = targets[n];
        row_loss[n] = target >= 0 ? (double)__fsub_rn(l, to_f32(x[target])) : 0.0;
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

// logits (N,Vp) become (softmax - onehot) * dloss; padded columns and ignored rows 0. One block per row.
template <typename T>
__global__ void crossentropy_backward_kernel(T *logits, const float *lse, const int *targets, int V, int Vp,
                                             float dloss) {
    size_t n = blockIdx.x;
    T *x = logits + n * (size_t)Vp;
    int target = targets[n];
    float scale = target >= 0 ? dloss : 0.0f, l = lse[n];
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float g = 0.0f;
        if (v < V) {
            g = __fmul_rn(vexpf_dev(__fsub_rn(to_f32(x[v]), l)), scale);
            if (v == target) g = __fsub_rn(g, dloss);
        }
        x[v] = from_f32<T>(g);
    }
}

// ---- entry points --------------------------------------------------------------------------------

template <typename floatX>
double cuda_crossentropy_forward(float *lse, const sl_act *logits, const int *targets, int N, int V, int Vp) {
    if (N <= 0) return 0.0;
    double *row_loss = (double *)sl_cuda_scratch_get(&crossentropy_buf, sizeof(double) * ((size_t)N + 1), "crossentropy scratch");
    if (!row_loss) return NAN;
    double *total = row_loss + N;
    cudaStream_t s = sl_cuda_stream();
    crossentropy_forward_kernel<floatX><<<(unsigned int)N, CE_THREADS, 0, s>>>(lse, row_loss, as_storage<floatX>(logits),
                                                                              targets, V, Vp);
    CUDA_LAUNCH_CHECK();
    loss_sum_kernel<<<1, CE_SUM_THREADS, 0, s>>>(total, row_loss, N);
    CUDA_LAUNCH_CHECK();
    double host_total = NAN;  // stays NaN if the copy fails (the error is recorded)
    CUDA_CHECK(cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return host_total;
}

template <typename floatX>
void cuda_crossentropy_backward(sl_act *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                float dloss) {
    if (N <= 0 || Vp <= 0) return;
    crossentropy_backward_kernel<floatX><<<(unsigned int)N, CE_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(logits), lse, targets, V, Vp, dloss);
    CUDA_LAUNCH_CHECK();
}

SL_CUDA_STORAGE_INSTANCES(cuda_crossentropy_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_crossentropy_backward)
