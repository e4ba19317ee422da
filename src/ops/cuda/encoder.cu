// encoder.cu: the token (+ position) embedding on the GPU, forward and backward.
//
// Forward: out (N,C) = wte[inp[n]] (+ wpe[n % T]), one thread per element (grid-stride).
// Backward, deterministic and bit-identical to cpu_encoder_backward (which, per column, adds the rows
// n = 0..N-1 in order):
//   dwte: the N token ids are stable-sorted on the device (cub::DeviceRadixSort::SortPairs of
//         (token, row)), so each distinct token becomes one run of sorted positions whose rows are in
//         increasing order. A block owns a fixed range of ENC_RUN_RANGE sorted positions and one chunk
//         of columns; for every run that STARTS in its range it loads dwte[token, c] once, adds the
//         run's dout rows in row order in a register and stores once. Each (token, column) is
//         written by exactly one thread, so there are no atomics and no races.
//   dwpe: one thread per (t, c) adds dout[b, t, c] for b = 0..B-1 in order.
// Invariants: no floating-point atomics; every sum has a fixed order (the CPU's), so results are
// bit-identical run to run and to the CPU backend; all work is queued on sl_cuda_stream(), no host
// round trip. The sort scratch is a grow-only device buffer (one process drives one GPU).
// Storage: out and dout are activations, wte and wpe the model's parameter copy (floatX: with bf16
// storage the bf16 shadow of the parameters); their gradients dwte, dwpe are fp32.
// Cost: forward and dwpe are memory-bound passes; dwte is a radix sort of N ints (4 passes) plus one
// read of dout; a token repeated L times is a serial chain of L adds (loads batched 8 at a time).
#include "ops/cuda/cuda_common.cuh"

#include <cub/device/device_radix_sort.cuh>

#define ENC_THREADS 256
#define ENC_RUN_RANGE 32  // sorted positions per block in the dwte kernel

static sl_cuda_scratch encoder_buf;  // grow-only scratch (cuda_common.cuh)

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static unsigned int grid_for(size_t n) {
    size_t blocks = (n + ENC_THREADS - 1) / ENC_THREADS;
    return (unsigned int)(blocks < ((size_t)1 << 20) ? blocks : ((size_t)1 << 20));
}

// ---- forward -------------------------------------------------------------------------------------

// out (N,C) = wte[inp] (+ wpe[t]); wpe may be NULL.
template <typename T>
__global__ void encoder_forward_kernel(T *out, const int *inp, const T *wte, const T *wpe, size_t N, int T_len,
                                       int C) {
    size_t total = N * (size_t)C;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t n = idx / (size_t)C, c = idx % (size_t)C;
        float e = to_f32(wte[(size_t)inp[n] * C + c]);
        if (wpe) e = __fadd_rn(e, to_f32(wpe[(n % (size_t)T_len) * C + c]));
        out[idx] = from_f32<T>(e);
    }
}

// ---- backward ------------------------------------------------------------------------------------

__global__ void iota_kernel(int *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}

// First position in [lo, hi) whose key is greater than `tok` (keys ascending).
__device__ __forceinline__ int upper_bound_key(const int *keys, int lo, int hi, int tok) {
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (keys[mid] <= tok) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// dwte[tok] += dout[rows of tok], in row order. keys (N): sorted token ids; rows (N): their rows.
// Grid: (ceil(N / ENC_RUN_RANGE), ceil(C / ENC_THREADS)).
template <typename T>
__global__ void encoder_backward_wte_kernel(float *dwte, const T *dout, const int *keys, const int *rows, int N,
                                            int C) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int i0 = blockIdx.x * ENC_RUN_RANGE;
    int i1 = i0 + ENC_RUN_RANGE < N ? i0 + ENC_RUN_RANGE : N;
    int i = i0;
    // a run that began before this range belongs to the block where it began
    if (i > 0 && keys[i - 1] == keys[i]) i = upper_bound_key(keys, i, N, keys[i]);
    while (i < i1) {
        int tok = keys[i];
        int end = upper_bound_key(keys, i + 1, N, tok);
        float *w = dwte + (size_t)tok * C + c;
        float acc = *w;
        int j = i;
        for (; j + 8 <= end; j += 8) {  // 8 loads in flight, then the adds in row order
            float d[8];
#pragma unroll
            for (int u = 0; u < 8; u++) d[u] = to_f32(dout[(size_t)rows[j + u] * C + c]);
#pragma unroll
            for (int u = 0; u < 8; u++) acc = __fadd_rn(acc, d[u]);
        }
        for (; j < end; j++) acc = __fadd_rn(acc, to_f32(dout[(size_t)rows[j] * C + c]));
        *w = acc;
        i = end;
    }
}

// dwpe[t, c] += dout[b, t, c] for b = 0..B-1 in order; one thread per (t, c).
template <typename T>
__global__ void encoder_backward_wpe_kernel(float *dwpe, const T *dout, int B, int T_len, int C) {
    size_t TC = (size_t)T_len * C;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < TC;
         idx += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[idx];
        for (int b = 0; b < B; b++) acc = __fadd_rn(acc, to_f32(dout[(size_t)b * TC + idx]));
        dwpe[idx] = acc;
    }
}

// ---- entry points --------------------------------------------------------------------------------

template <typename floatX>
void cuda_encoder_forward(sl_act *out, const int *inp, const sl_act *wte, const sl_act *wpe, int B, int T, int C) {
    size_t N = (size_t)B * T, total = N * (size_t)C;
    if (total == 0) return;
    encoder_forward_kernel<floatX><<<grid_for(total), ENC_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), inp, as_storage<floatX>(wte), as_storage<floatX>(wpe), N, T, C);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_encoder_backward(float *dwte, float *dwpe, const sl_act *dout, const int *inp, int B, int T, int C) {
    int N = B * T;
    if (N <= 0 || C <= 0) return;
    cudaStream_t s = sl_cuda_stream();

    // scratch: sorted keys (N) | rows in (N) | rows out (N) | cub temp storage
    size_t temp_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp_bytes, inp, (int *)NULL, (const int *)NULL, (int *)NULL, N,
                                               0, (int)(sizeof(int) * 8), s));
    size_t vec = align256(sizeof(int) * (size_t)N);
    char *scratch = (char *)sl_cuda_scratch_get(&encoder_buf, 3 * vec + align256(temp_bytes), "encoder scratch");
    if (!scratch) return;
    int *keys = (int *)scratch, *rows_in = (int *)(scratch + vec), *rows = (int *)(scratch + 2 * vec);
    void *temp = scratch + 3 * vec;

    iota_kernel<<<grid_for((size_t)N), ENC_THREADS, 0, s>>>(rows_in, N);
    CUDA_LAUNCH_CHECK();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, inp, keys, rows_in, rows, N, 0,
                                               (int)(sizeof(int) * 8), s));
    dim3 grid(ceil_div_u((size_t)N, ENC_RUN_RANGE), ceil_div_u((size_t)C, ENC_THREADS));
    encoder_backward_wte_kernel<floatX><<<grid, ENC_THREADS, 0, s>>>(dwte, as_storage<floatX>(dout), keys, rows, N, C);
    CUDA_LAUNCH_CHECK();

    if (dwpe) {
        encoder_backward_wpe_kernel<floatX><<<grid_for((size_t)T * C), ENC_THREADS, 0, s>>>(
            dwpe, as_storage<floatX>(dout), B, T, C);
        CUDA_LAUNCH_CHECK();
    }
}

SL_CUDA_STORAGE_INSTANCES(cuda_encoder_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_encoder_backward)
