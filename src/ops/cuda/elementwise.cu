// elementwise.cu: residual add, GELU (tanh approximation, "gelu_new") and SwiGLU on the GPU,
// forward and backward. One thread per element (grid-stride loops, size_t indices).
//
// Bit-identical to the CPU backend (src/ops/cpu/elementwise.c): the CPU is built without FP
// contraction (-std=c17) and uses vexpf/vtanhf from vec_math.h, so this file ports those two
// functions operation for operation and writes every expression with _rn intrinsics in the CPU's
// evaluation order (nvcc may not fuse them into FMAs). Requires the default nvcc float modes
// (no --use_fast_math / -ftz=true), which keep float subnormals as the CPU does.
// Invariants: no reductions, so nothing depends on launch shape; dinp is OVERWRITTEN (ops.h); all
// work queued on sl_cuda_stream(). Cost: one memory-bound pass per op.
// Storage: every argument is an activation (floatX); with bf16 each value is widened to fp32, the
// expression computed exactly as above, and the result rounded to nearest even once.
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_math.cuh"

// ---- kernels -------------------------------------------------------------------------------------

template <typename T>
__global__ void residual_forward_kernel(T *out, const T *a, const T *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_f32<T>(__fadd_rn(to_f32(a[i]), to_f32(b[i])));
}

template <typename T>
__global__ void gelu_forward_kernel(T *out, const T *inp, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_f32<T>(gelu_dev(to_f32(inp[i])));
}

template <typename T>
__global__ void gelu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t n) {
    GRID_STRIDE(i, n) dinp[i] = from_f32<T>(gelu_backward_dev(to_f32(inp[i]), to_f32(dout[i])));
}

// out (N,I) = silu(gate) * up with inp (N,2I) = gate | up.
template <typename T>
__global__ void swiglu_forward_kernel(T *out, const T *inp, size_t N, size_t I) {
    size_t total = N * I;
    GRID_STRIDE(idx, total) {
        size_t n = idx / I, i = idx % I;
        const T *g = inp + n * 2 * I;
        float gi = to_f32(g[i]), ui = to_f32(g[I + i]);
        out[idx] = from_f32<T>(__fmul_rn(__fdiv_rn(gi, __fadd_rn(1.0f, vexpf_dev(-gi))), ui));
    }
}

// dinp (N,2I) = d gate | d up (overwritten).
template <typename T>
__global__ void swiglu_backward_kernel(T *dinp, const T *inp, const T *dout, size_t N, size_t I) {
    size_t total = N * I;
    GRID_STRIDE(idx, total) {
        size_t n = idx / I, i = idx % I;
        const T *g = inp + n * 2 * I;
        T *dg = dinp + n * 2 * I;
        float gi = to_f32(g[i]), ui = to_f32(g[I + i]), d = to_f32(dout[idx]);
        float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, vexpf_dev(-gi)));
        float dsilu = __fadd_rn(1.0f, __fmul_rn(gi, __fsub_rn(1.0f, s)));  // 1 + g * (1 - s)
        dg[i] = from_f32<T>(__fmul_rn(__fmul_rn(__fmul_rn(d, ui), s), dsilu));
        dg[I + i] = from_f32<T>(__fmul_rn(__fmul_rn(d, gi), s));
    }
}

// ---- entry points (cuda_ops.cuh) ------------------------------------------------------------------

template <typename floatX>
void cuda_residual_forward(sl_act *out, const sl_act *a, const sl_act *b, size_t n) {
    if (n == 0) return;
    residual_forward_kernel<floatX><<<ew_grid(n), EW_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), as_storage<floatX>(a), as_storage<floatX>(b), n);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_gelu_forward(sl_act *out, const sl_act *inp, size_t n) {
    if (n == 0) return;
    gelu_forward_kernel<floatX><<<ew_grid(n), EW_THREADS, 0, sl_cuda_stream()>>>(as_storage<floatX>(out),
                                                                                  as_storage<floatX>(inp), n);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_gelu_backward(sl_act *dinp, const sl_act *inp, const sl_act *dout, size_t n) {
    if (n == 0) return;
    gelu_backward_kernel<floatX><<<ew_grid(n), EW_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(dinp), as_storage<floatX>(inp), as_storage<floatX>(dout), n);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_swiglu_forward(sl_act *out, const sl_act *inp, int N, int I) {
    if (N <= 0 || I <= 0) return;
    size_t total = (size_t)N * I;
    swiglu_forward_kernel<floatX><<<ew_grid(total), EW_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(out), as_storage<floatX>(inp), (size_t)N, (size_t)I);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_swiglu_backward(sl_act *dinp, const sl_act *inp, const sl_act *dout, int N, int I) {
    if (N <= 0 || I <= 0) return;
    size_t total = (size_t)N * I;
    swiglu_backward_kernel<floatX><<<ew_grid(total), EW_THREADS, 0, sl_cuda_stream()>>>(
        as_storage<floatX>(dinp), as_storage<floatX>(inp), as_storage<floatX>(dout), (size_t)N, (size_t)I);
    CUDA_LAUNCH_CHECK();
}

SL_CUDA_STORAGE_INSTANCES(cuda_residual_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_gelu_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_gelu_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_swiglu_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_swiglu_backward)
