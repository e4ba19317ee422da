// ops_cuda.cu: the CUDA backend's tables (sl_ops_cuda; sl_ops_cuda_bf16 with bf16 activation
// storage), device selection, its one stream, device memory, and the first-error record behind
// cuda_synchronize().
//
// Invariants:
//   - One process drives one GPU: cuda_backend_init(device) selects it once (again with the same
//     device is a no-op, another device is an error), creates the backend's non-blocking stream and
//     loads cuBLASLt (matmul.cu). Every op and memory call is queued on that stream.
//   - Ops never block the host and never report failure themselves: the first failing CUDA or cuBLASLt
//     call is recorded ("CUDA error: <why> in <call> at file:line") and kept; cuda_synchronize()
//     waits for the stream and, when anything was recorded (or the wait itself fails), calls
//     sl_errorf with it and returns -1. The record is never cleared: after a device-side fault the
//     context is unusable, and every later synchronize says why.
//   - Memory: cuda_alloc returns zero-filled memory (cudaMalloc + cudaMemsetAsync on the stream; it
//     waits for the fill, so the buffer is ready for any stream, NCCL's included), or NULL with
//     "out of GPU memory allocating <what> (<bytes> bytes): ..." set. upload queues the copy (from
//     pageable host memory the source may be reused as soon as it returns); download waits.
//   - Work queued here and NCCL's work on its own stream are ordered only when asked: a collective
//     on a buffer written by an op first calls sl_comm_order_after(group, ops->stream()) (comm.h),
//     which makes NCCL's stream wait for this one on the GPU.
#include "ops/cuda/cuda_common.cuh"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "shardlm/error.h"
}

static cudaStream_t stream;            // the backend's stream (0, the legacy stream, before init)
static int device_id = -1;             // the GPU chosen by cuda_backend_init, -1 before
static cudaDeviceProp device_props;

static pthread_mutex_t error_lock = PTHREAD_MUTEX_INITIALIZER;
static int error_recorded;
static char error_message[1024];

// ---- errors ---------------------------------------------------------------------------------------

void sl_cuda_record_failure(const char *fmt, ...) {
    pthread_mutex_lock(&error_lock);
    if (!error_recorded) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(error_message, sizeof error_message, fmt, ap);
        va_end(ap);
        error_recorded = 1;
    }
    pthread_mutex_unlock(&error_lock);
}

void sl_cuda_record_error(cudaError_t err, const char *what, const char *file, int line) {
    if (err == cudaSuccess) return;
    sl_cuda_record_failure("CUDA error: %s in %s at %s:%d", cudaGetErrorString(err), what, file, line);
}

// Reports (sl_errorf, -1) an error recorded so far, without waiting for the stream.
int sl_cuda_check_error(void) {
    pthread_mutex_lock(&error_lock);
    int recorded = error_recorded;
    char message[sizeof error_message];
    memcpy(message, error_message, sizeof message);
    pthread_mutex_unlock(&error_lock);
    return recorded ? sl_errorf("%s", message) : 0;
}

cudaStream_t sl_cuda_stream(void) { return stream; }

static void track_alloc(void *p, size_t bytes);
static void track_free(void *p);

// Scratch counts in peak_bytes like any buffer (torch's max_memory_allocated counts its temporaries
// too): the norm backward's partials, the classifier's, the attention's dQ sums (201 MB for GPT-2
// 124M at B = 64 under SHARDLM_ATTENTION_DQ=atomic).
void *sl_cuda_scratch_get(sl_cuda_scratch *s, size_t bytes, const char *what) {
    if (bytes <= s->cap) return s->buf;
    if (s->buf) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        track_free(s->buf);
        CUDA_CHECK(cudaFree(s->buf));
    }
    s->buf = NULL;
    s->cap = 0;
    cudaError_t err = cudaMalloc(&s->buf, bytes);
    if (err != cudaSuccess) {
        sl_cuda_record_failure("CUDA error: %s allocating %s (%zu bytes)", cudaGetErrorString(err), what, bytes);
        s->buf = NULL;
        return NULL;
    }
    track_alloc(s->buf, bytes);
    s->cap = bytes;
    return s->buf;
}

const cudaDeviceProp *sl_cuda_device_props(void) { return device_id >= 0 ? &device_props : NULL; }

int cuda_synchronize(void) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // A launch error some op did not check for is still pending here.
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) sl_cuda_record_error(err, "a kernel launch (found by cuda_synchronize)", __FILE__, __LINE__);
    return sl_cuda_check_error();
}

// ---- device selection ---------------------------------------------------------------------------

// The lowest compute capability this build has code for: nvcc lists the -gencode virtual
// architectures in __CUDA_ARCH_LIST__ (e.g. 900); PTX JIT-compiles for that one and newer.
static int min_built_arch(void) {
#ifdef __CUDA_ARCH_LIST__
    static const int archs[] = {__CUDA_ARCH_LIST__};
    int lo = archs[0];
    for (size_t i = 1; i < sizeof archs / sizeof archs[0]; i++)
        if (archs[i] < lo) lo = archs[i];
    return lo;
#else
    return 0;
#endif
}

// The number of GPUs visible to this process (backend.c maps "cuda" + LOCAL_RANK onto it), or -1 with
// "no usable CUDA GPU: <why>" when there is none or no driver.
extern "C" int cuda_device_count(void) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        int driver = 0;
        cudaDriverGetVersion(&driver);
        cudaGetLastError();
        if (driver == 0)
            return sl_errorf("no usable CUDA GPU: %s (no NVIDIA driver: libcuda.so.1 was not found)",
                             cudaGetErrorString(err));
        return sl_errorf("no usable CUDA GPU: %s (the driver supports CUDA %d.%d; this binary was built with CUDA %d.%d)",
                         cudaGetErrorString(err), driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000,
                         CUDART_VERSION % 1000 / 10);
    }
    if (count <= 0) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        return sl_errorf("no usable CUDA GPU: no device visible (CUDA_VISIBLE_DEVICES=%s)", visible ? visible : "unset");
    }
    return count;
}

int cuda_backend_init(int device) {
    if (device_id >= 0) {
        if (device == device_id) return 0;
        return sl_errorf("the CUDA backend already runs on GPU %d; one process drives one GPU (asked for GPU %d)",
                         device_id, device);
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    int count = cuda_device_count();
    if (count < 0) return -1;
    if (device < 0 || device >= count)
        return sl_errorf("GPU %d does not exist: %d GPU(s) visible, numbered 0..%d (CUDA_VISIBLE_DEVICES=%s)", device,
                         count, count - 1, visible ? visible : "unset");
    cudaError_t err = cudaGetDeviceProperties(&device_props, device);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return sl_errorf("no usable CUDA GPU: cudaGetDeviceProperties(%d): %s", device, cudaGetErrorString(err));
    }
    int cc = device_props.major * 100 + device_props.minor * 10, need = min_built_arch();
    if (cc < need)
        return sl_errorf("GPU %d (%s) has compute capability %d.%d, but this build has CUDA kernels only for %d.%d "
                         "and newer; rebuild with CUDA_GENCODE set for this GPU (see the Makefile)",
                         device, device_props.name, device_props.major, device_props.minor, need / 100,
                         need % 100 / 10);
    err = cudaSetDevice(device);
    if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        cudaGetLastError();
        stream = 0;
        return sl_errorf("no usable CUDA GPU: GPU %d (%s): %s", device, device_props.name, cudaGetErrorString(err));
    }
    if (sl_cuda_matmul_init()) {
        cudaStreamDestroy(stream);
        stream = 0;
        return -1;
    }
    device_id = device;
    return 0;
}

// ---- memory -------------------------------------------------------------------------------------

// Bytes held through cuda_alloc and sl_cuda_scratch_get, for peak_bytes (torch.cuda.max_memory_allocated's counterpart):
// a host list of live allocations (a model holds a few dozen).
typedef struct {
    void *p;
    size_t bytes;
} live_alloc;
static live_alloc *live;
static size_t n_live, cap_live, held_now, held_peak;

static void track_alloc(void *p, size_t bytes) {
    if (n_live == cap_live) {
        size_t cap = cap_live ? 2 * cap_live : 64;
        live_alloc *grown = (live_alloc *)realloc(live, cap * sizeof *live);
        if (!grown) return;  // untracked: peak_bytes undercounts rather than failing the allocation
        live = grown;
        cap_live = cap;
    }
    live[n_live++] = live_alloc{p, bytes};
    held_now += bytes;
    if (held_now > held_peak) held_peak = held_now;
}

static void track_free(void *p) {
    for (size_t i = n_live; i-- > 0;)
        if (live[i].p == p) {
            held_now -= live[i].bytes;
            live[i] = live[--n_live];
            return;
        }
}

void *cuda_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err == cudaSuccess) err = cudaMemsetAsync(p, 0, bytes, stream);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
        cudaGetLastError();  // clear a non-sticky error (out of memory) so later calls are not blamed
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        cudaGetLastError();
        if (p) cudaFree(p);
        sl_errorf("out of GPU memory allocating %s (%zu bytes): %s (%.2f of %.2f GiB free on GPU %d)",
                  what ? what : "a buffer", bytes, cudaGetErrorString(err), (double)free_b / 1073741824.0,
                  (double)total_b / 1073741824.0, device_id);
        return NULL;
    }
    track_alloc(p, bytes);
    return p;
}

void cuda_dealloc(void *p) {
    if (!p) return;
    track_free(p);
    CUDA_CHECK(cudaFree(p));
}

void *cuda_stream_handle(void) { return (void *)stream; }
size_t cuda_peak_bytes(void) { return held_peak; }
void cuda_reset_peak_bytes(void) { held_peak = held_now; }

void cuda_memzero(void *p, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
}

void cuda_upload(void *dst, const void *host_src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
}

void cuda_download(void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
}

void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
}

// ---- the tables ---------------------------------------------------------------------------------

// One table per activation storage type (ops.h act_bf16): the templated ops of ops_list.h
// instantiated for it, the same memory functions and optimizer passes.
template <typename floatX> static constexpr sl_ops cuda_table(const char *name, int act_bf16) {
    sl_ops t = {};
    t.name = name;
#define SL_CUDA_OP_ENTRY(ret, op, params, args, storage, flops, emulation) t.op = cuda_##op<floatX>;
    SL_OPS(SL_CUDA_OP_ENTRY)
#undef SL_CUDA_OP_ENTRY
    t.set_precision = cuda_set_precision;
    t.on_device = 1;
    t.act_bf16 = act_bf16;
    t.sliding_window = 0;
    t.alloc = cuda_alloc;
    t.dealloc = cuda_dealloc;
    t.memzero = cuda_memzero;
    t.upload = cuda_upload;
    t.download = cuda_download;
    t.copy = cuda_copy;
    t.synchronize = cuda_synchronize;
    t.stream = cuda_stream_handle;
    t.peak_bytes = cuda_peak_bytes;
    t.reset_peak_bytes = cuda_reset_peak_bytes;
    t.sumsq = cuda_sumsq;
    t.scale = cuda_scale;
    t.add = cuda_add;
    t.nonfinite = cuda_nonfinite;
    t.round_to = cuda_round_to;
    t.to_storage = cuda_to_storage;
    t.adam_step = cuda_adam_step;
    t.sgd_step = cuda_sgd_step;
    return t;
}

// Built at compile time (a constant expression, checked here), so no code runs to fill them.
static_assert(cuda_table<float>("cuda", 0).matmul_forward == cuda_matmul_forward<float>, "tables are constants");
extern "C" const sl_ops sl_ops_cuda = cuda_table<float>("cuda", 0);
extern "C" const sl_ops sl_ops_cuda_bf16 = cuda_table<__nv_bfloat16>("cuda-bf16", 1);
