// lora_cols.cu: the elementwise ops LoRA adds, on the GPU: a scaled column slice added into a fused
// linear's output (add_columns), taken out of its gradient (take_columns), and inverted dropout with
// the counter-based mask of ops.h (sl_dropout_keep), which host and device compute alike.
// Bit-identical to src/ops/cpu/lora_cols.c: each expression is written with _rn intrinsics in the
// CPU's order (the CPU is built without FP contraction). One thread per element; no reductions.
// Storage: every argument is an activation (floatX), widened to fp32 and rounded once on write.
#include "ops/cuda/cuda_common.cuh"

// add: out[n, col0 + j] += scale * inp[n, j]; otherwise out[n, j] = scale * inp[n, col0 + j].
template <typename T>
__global__ void columns_kernel(T *out, const T *inp, float scale, size_t N, size_t W, size_t ld, size_t col0,
                               int add) {
    GRID_STRIDE(idx, N * W) {
        size_t n = idx / W, j = idx % W;
        if (add) {
            T *o = out + n * ld + col0 + j;
            *o = from_f32<T>(__fadd_rn(to_f32(*o), __fmul_rn(scale, to_f32(inp[idx]))));
        } else {
            out[idx] = from_f32<T>(__fmul_rn(scale, to_f32(inp[n * ld + col0 + j])));
        }
    }
}

template <typename T>
__global__ void dropout_kernel(T *out, const T *inp, size_t n, float p, uint64_t seed) {
    float k = __fdiv_rn(1.0f, __fsub_rn(1.0f, p));
    GRID_STRIDE(i, n) out[i] = from_f32<T>(sl_dropout_keep(seed, i, p) ? __fmul_rn(to_f32(inp[i]), k) : 0.0f);
}

template <typename floatX>
static void launch_columns(sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0, int add) {
    size_t total = (size_t)N * (size_t)W;
    if (total == 0) return;
    columns_kernel<floatX><<<ew_grid(total), EW_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), as_storage<floatX>(inp), scale, (size_t)N, (size_t)W, (size_t)ld, (size_t)col0, add);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_add_columns(sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0) {
    launch_columns<floatX>(out, inp, scale, N, W, ld, col0, 1);
}

template <typename floatX>
void cuda_take_columns(sl_act *out, const sl_act *inp, float scale, int N, int W, int ld, int col0) {
    launch_columns<floatX>(out, inp, scale, N, W, ld, col0, 0);
}

template <typename floatX>
static void launch_dropout(sl_act *out, const sl_act *inp, size_t n, float p, uint64_t seed) {
    if (n == 0) return;
    dropout_kernel<floatX><<<ew_grid(n), EW_THREADS, 0, sl_cuda_stream()>>>(as_storage<floatX>(out),
                                                                           as_storage<floatX>(inp), n, p, seed);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_dropout_forward(sl_act *out, const sl_act *inp, size_t n, float p, uint64_t seed) {
    launch_dropout<floatX>(out, inp, n, p, seed);
}

template <typename floatX>
void cuda_dropout_backward(sl_act *dinp, const sl_act *dout, size_t n, float p, uint64_t seed) {
    launch_dropout<floatX>(dinp, dout, n, p, seed);
}

// LoRA's ops composed from the GEMMs of matmul.cu and the column kernels above (as the CPU's bf16
// tables compose them, src/ops/lora_compose.h): u @ B^T, the scaled gradient slice and du @ A pass
// through the scratch delta / dh.
template <typename floatX>
void cuda_lora_forward(sl_act *y, sl_act *u, sl_act *delta, const sl_act *x, const sl_act *A, const sl_act *B,
                       float scale, int N, int in, int r, int out, int ld, int col0) {
    cuda_matmul_forward<floatX>(u, x, A, NULL, N, in, r);
    cuda_matmul_forward<floatX>(delta, u, B, NULL, N, r, out);
    launch_columns<floatX>(y, delta, scale, N, out, ld, col0, 1);
}

template <typename floatX>
void cuda_lora_backward(sl_act *dx, float *dA, float *dB, sl_act *du, sl_act *delta, sl_act *dh, const sl_act *dy,
                        const sl_act *x, const sl_act *u, const sl_act *A, const sl_act *B, float scale, int N, int in,
                        int r, int out, int ld, int col0) {
    launch_columns<floatX>(delta, dy, scale, N, out, ld, col0, 0);
    cuda_matmul_backward<floatX>(du, dB, NULL, delta, u, B, N, r, out);
    cuda_matmul_backward<floatX>(dx ? dh : NULL, dA, NULL, du, x, A, N, in, r);
    if (dx) cuda_residual_forward<floatX>(dx, dx, dh, (size_t)N * (size_t)in);
}

SL_CUDA_STORAGE_INSTANCES(cuda_add_columns)
SL_CUDA_STORAGE_INSTANCES(cuda_take_columns)
SL_CUDA_STORAGE_INSTANCES(cuda_dropout_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_dropout_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_lora_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_lora_backward)
