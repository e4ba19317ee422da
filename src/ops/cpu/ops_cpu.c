// ops_cpu.c: the CPU ops table and thread control (OpenMP and OpenBLAS share one count).
#include "ops/cpu/cpu_ops.h"
#include "shardlm/address_space.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

// Host memory: the CPU backend's "device" is the host, so transfers are plain copies.
// Buffers start on a 64-byte line (calloc's 16-byte alignment put every weight row of a GEMV across
// line boundaries, ~10% of the read rate measured on the AMD EPYC); zeroed by calloc, so pages never
// written stay unmapped. The offset from calloc's pointer sits in the byte below the returned one.
// Buffers of HUGE_MIN bytes or more (weights, their bf16 shadow, activations, the KV cache) ask the
// kernel for transparent huge pages over the 2 MiB-aligned part of them (madvise MADV_HUGEPAGE: a
// no-op where THP is "never", needed where it is "madvise", Debian's default). Decode streams every
// weight once per token, and with 4 KiB pages it pays a TLB miss every 4 KiB and its hardware
// prefetchers stop at each page's end: GEMVs over GPT-2 124M's bf16 weights read at 28.8 -> 33.1 GB/s
// with 2 threads and 20 -> 31 GB/s with 1 (AMD EPYC, interleaved in one process). The pages are
// taken when first written, so an untouched buffer still costs nothing.
#define HUGE_PAGE ((uintptr_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)
static void advise_huge_pages(unsigned char *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    if (bytes < HUGE_MIN) return;
    uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), b = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);  // advice only: a refusal changes no result
#else
    (void)p;
    (void)bytes;
#endif
}

void *cpu_alloc(size_t bytes, const char *what) {
    if (bytes > SIZE_MAX - 64) {
        sl_errorf("out of memory allocating %zu bytes for %s", bytes, what);
        return NULL;
    }
    unsigned char *raw = sl_calloc((bytes ? bytes : 1) + 64, 1, what);
    if (!raw) return NULL;
    unsigned char *p = raw + 64 - ((uintptr_t)raw & 63);
    p[-1] = (unsigned char)(p - raw);
    advise_huge_pages(p, bytes);
    return p;
}
void cpu_dealloc(void *p) {
    if (p) free((unsigned char *)p - ((unsigned char *)p)[-1]);
}
void cpu_memzero(void *p, size_t bytes) { if (bytes) memset(p, 0, bytes); }
void cpu_copy(void *dst, const void *src, size_t bytes) { if (bytes && dst != src) memmove(dst, src, bytes); }
// The first failure since the last synchronize() (cpu_ops.h cpu_record_failure).
static int g_failed;
static char g_failure[384];

void cpu_record_failure(const char *op) {
    if (!g_failed) snprintf(g_failure, sizeof g_failure, "%s: %s", op, sl_error());
    g_failed = 1;
}

int cpu_synchronize(void) {
    if (!g_failed) return 0;
    g_failed = 0;
    return sl_errorf("%s", g_failure);
}
void *cpu_stream(void) { return NULL; }
size_t cpu_peak_bytes(void) { return 0; }
void cpu_reset_peak_bytes(void) {}
// OpenBLAS computes in fp32 whatever the training precision: nothing to switch.
void cpu_set_precision(int precision) { (void)precision; }

void cpu_round_to(float *x, size_t n, int precision) {
    if (precision == SL_PRECISION_BF16) sl_round_to_bf16_array(x, n);
    else if (precision == SL_PRECISION_FP16) sl_round_to_fp16_array(x, n);
}

// The bf16 weight shadow of an act_bf16 table (cpu-bf16's).
void cpu_to_storage(void *dst, const float *src, size_t n) { sl_f32_to_bf16_array(src, (sl_bf16 *)dst, n); }

const sl_ops sl_ops_cpu = {
    .name = "cpu",
    SL_OPS(SL_CPU_OP_ENTRY)
    .act_bf16 = 0,
    .sliding_window = 1,
    .synchronize = cpu_synchronize,
    SL_CPU_HOST_FNS,
};

int sl_ops_cpu_set_threads(int n) {
    if (n <= 0) return 0;
    // the buffers of the threads so far are mapped already (checked before start-up: src/cli/preinit.c)
    const int now = omp_get_max_threads();
    long limit, more = (long)(n - now) * SL_OPENBLAS_BUFFER_MIB + SL_ADDRESS_HEADROOM_MIB;
    if (n > now && !sl_address_space_fits(more, &limit))
        return sl_errorf("%d threads under an address-space limit of %ld MiB (ulimit -v / RLIMIT_AS): OpenBLAS maps "
                         "a %d MiB GEMM buffer per thread (%ld MiB more than for %d threads, with headroom) and "
                         "retries forever when the limit refuses one; use fewer threads or raise the limit",
                         n, limit, SL_OPENBLAS_BUFFER_MIB, more, now);
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    return 0;
}

int sl_ops_cpu_threads(void) { return omp_get_max_threads(); }

void cpu_thread_range(size_t n, size_t *begin, size_t *end) {
    size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
    *begin = n * t / nt;
    *end = n * (t + 1) / nt;
}
