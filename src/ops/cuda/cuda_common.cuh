// cuda_common.cuh: what every CUDA op file shares: the error check, the stream every op is queued
// on, launch helpers and the storage-type conversions the templated kernels use.
// Invariants: every op is queued on sl_cuda_stream() and returns without synchronising (no host
// round trip inside a step); a failed CUDA call is recorded (first error wins) and reported by
// cuda_synchronize() / sl_cuda_check_error(), never silently ignored.
#ifndef SHARDLM_CUDA_COMMON_CUH
#define SHARDLM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "ops/cuda/cuda_ops.h"
}
#include "ops/cuda/cuda_ops.cuh"

// Records the first failing CUDA call (file:line and cudaGetErrorString) for cuda_synchronize().
void sl_cuda_record_error(cudaError_t err, const char *what, const char *file, int line);
#define CUDA_CHECK(call)                                                         \
    do {                                                                         \
        cudaError_t err_ = (call);                                               \
        if (err_ != cudaSuccess) sl_cuda_record_error(err_, #call, __FILE__, __LINE__); \
    } while (0)
// After a kernel launch: records a launch-configuration error.
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

// Records the first failure with a formatted message (values included), for cuda_synchronize().
void sl_cuda_record_failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// -1 (with the message set through sl_errorf) when a failure was recorded, else 0.
int sl_cuda_check_error(void);
// The selected GPU's properties (NULL before cuda_backend_init).
const cudaDeviceProp *sl_cuda_device_props(void);
// matmul.cu: loads cuBLASLt and creates its handle and workspace (called by cuda_backend_init).
int sl_cuda_matmul_init(void);

// The stream every op runs on (created by cuda_backend_init; the legacy default stream before).
cudaStream_t sl_cuda_stream(void);

// A grow-only device buffer kept between calls (one per op file). Growing waits for the queued
// work first, so no kernel still reading the old buffer is affected.
typedef struct {
    void *buf;
    size_t cap;
} sl_cuda_scratch;
// At least `bytes` of s; NULL (failure recorded, naming `what`) when cudaMalloc fails.
void *sl_cuda_scratch_get(sl_cuda_scratch *s, size_t bytes, const char *what);

static inline unsigned int ceil_div_u(size_t a, size_t b) { return (unsigned int)((a + b - 1) / b); }

// Elementwise kernels: EW_THREADS a block, at most 2^20 blocks, each thread striding over [0, n).
#define EW_THREADS 256
static inline unsigned int ew_grid(size_t n) {
    size_t blocks = (n + EW_THREADS - 1) / EW_THREADS;
    return (unsigned int)(blocks < ((size_t)1 << 20) ? blocks : ((size_t)1 << 20));
}
#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// A kernel's shared memory above the 48 KiB default (its dynamic `bytes` plus its static arrays) must be
// opted into; set on every launch (cheap, and right whichever device is current). false (failure
// recorded) when the GPU allows less.
template <typename Kernel> bool sl_cuda_allow_smem(Kernel kernel, size_t bytes) {
    cudaFuncAttributes fa;
    if (bytes == 0 || (bytes <= 48 * 1024 && cudaFuncGetAttributes(&fa, kernel) == cudaSuccess &&
                       bytes + fa.sharedSizeBytes <= 48 * 1024))
        return true;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (err != cudaSuccess) {
        sl_cuda_record_failure("CUDA error: %s setting %zu bytes of shared memory (this GPU allows less) at %s:%d",
                               cudaGetErrorString(err), bytes, __FILE__, __LINE__);
        return false;
    }
    return true;
}

// A 1-D grid of `blocks` fits the launch limit; false (failure recorded, naming `what`) otherwise.
static inline bool sl_cuda_grid_ok(size_t blocks, const char *what) {
    if (blocks <= 0x7fffffffu) return true;
    sl_cuda_record_failure("%s: %zu blocks exceed the grid limit (batch x heads x tiles too large)", what, blocks);
    return false;
}

// An op's storage-typed argument (ops.h: float * in the prototype) as what it points to: floatX.
template <typename floatX> inline floatX *as_storage(sl_act *p) { return reinterpret_cast<floatX *>(p); }
template <typename floatX> inline const floatX *as_storage(const sl_act *p) { return reinterpret_cast<const floatX *>(p); }

// Storage-type conversions for the templated kernels (float, and __nv_bfloat16 for bf16 storage).
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// VEC elements of storage type T moved as one access (16 bytes: VEC = 16 / sizeof(T)), widened to /
// rounded from fp32. The pointer must be aligned to the vector (sl_aligned16 for 16 bytes).
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) sl_vec {
    T v[VEC];
};
template <typename T, int VEC> __device__ __forceinline__ void load_vec(float *f, const T *p) {
    sl_vec<T, VEC> a = *reinterpret_cast<const sl_vec<T, VEC> *>(p);
#pragma unroll
    for (int j = 0; j < VEC; j++) f[j] = to_f32(a.v[j]);
}
template <typename T, int VEC> __device__ __forceinline__ void store_vec(T *p, const float *f) {
    sl_vec<T, VEC> a;
#pragma unroll
    for (int j = 0; j < VEC; j++) a.v[j] = from_f32<T>(f[j]);
    *reinterpret_cast<sl_vec<T, VEC> *>(p) = a;
}
// The same for data seen for the last time: 16-byte vectors with the evict-first cache hint (ld / st
// .cs), so a streaming pass does not push data still to be re-read out of L2; narrower ones plain.
template <typename T, int VEC> __device__ __forceinline__ void load_vec_cs(float *f, const T *p) {
    if constexpr (sizeof(sl_vec<T, VEC>) == 16) {
        sl_vec<T, VEC> a;
        *reinterpret_cast<int4 *>(&a) = __ldcs(reinterpret_cast<const int4 *>(p));
#pragma unroll
        for (int j = 0; j < VEC; j++) f[j] = to_f32(a.v[j]);
    } else {
        load_vec<T, VEC>(f, p);
    }
}
template <typename T, int VEC> __device__ __forceinline__ void store_vec_cs(T *p, const float *f) {
    if constexpr (sizeof(sl_vec<T, VEC>) == 16) {
        sl_vec<T, VEC> a;
#pragma unroll
        for (int j = 0; j < VEC; j++) a.v[j] = from_f32<T>(f[j]);
        __stcs(reinterpret_cast<int4 *>(p), *reinterpret_cast<const int4 *>(&a));
    } else {
        store_vec<T, VEC>(p, f);
    }
}
static inline bool sl_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// Warp-level sum / max (all 32 lanes take part).
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
