// onednn_matmul.c: bf16 GEMMs on the CPU through oneDNN's matmul primitive (cpu_gemm_bf16, cpu_bf16.h):
// bf16 A and B, fp32 accumulation, C bf16 (rounded to nearest even once, from fp32) or fp32, either
// optionally accumulated into through a sum post-op (C += alpha A @ B, the sum taken in fp32 and, for a
// bf16 C, rounded once), an optional bf16 bias added in fp32 before C is stored; C may be a column slice
// of a wider matrix (ldc), and alpha scales the product (oneDNN's output scale). Creating a primitive JIT-compiles its kernel, so the ones made are kept, LRU, in a small cache
// keyed by everything that shapes them (transposes, M, N, K, leading dimensions, bias, C's type,
// accumulation, alpha, and the thread count, which oneDNN plans its blocking for), each with its memory
// objects, whose data pointers are set per call. One engine and one in-order stream per process; a
// mutex covers lookup and execution (an entry's memory objects are shared). cpu_gemm_bf16_serial, for
// products run by many threads of a parallel region at once, keeps a cache and a stream per thread
// instead (no lock; oneDNN runs a primitive on the calling thread alone inside a parallel region).
// Invariant: the result of a call depends only on its key and its data (oneDNN's CPU matmul gives the
// same bits run to run for a given primitive and thread count; tests/unit/test_cpu_bf16_native.c checks it).
#include "ops/cpu/cpu_bf16.h"
#include "shardlm/error.h"

#include <dnnl.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define CACHE_SIZE 192  // the model's linears (~25 shapes) plus attention's (~5 per query block length)

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc, bias, c_f32, accumulate, threads;
    float alpha;  // every field 4 bytes: no padding, so keys compare with memcmp
} gemm_key;

typedef struct {
    gemm_key key;
    dnnl_primitive_t prim;       // NULL: a free slot
    dnnl_memory_t a, b, bias, c;  // bias NULL without one
    unsigned long last_use;
    char impl[64];               // oneDNN's implementation name, e.g. "brg:avx512_core_bf16"
} gemm_entry;

// Two caches, each its entries and use clock (least recently used out): the shared one, under the
// lock, and cpu_gemm_bf16_serial's, one per thread (primitives planned for one thread) with the
// thread's own stream, so the threads of a parallel region run their products at once
static gemm_entry cache[CACHE_SIZE];
static unsigned long use_clock;
#define THREAD_CACHE_SIZE 32
static _Thread_local gemm_entry thread_cache[THREAD_CACHE_SIZE];
static _Thread_local unsigned long thread_clock;
static _Thread_local dnnl_stream_t thread_stream;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static dnnl_status_t engine_status = dnnl_success;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void) {
    engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
    if (engine_status == dnnl_success) engine_status = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags);
}

// "M=.. N=.. K=.. (A^T, B^T, bias, C fp32 +=)": the shape a message names.
static void describe(const gemm_key *k, char *buf, size_t cap) {
    snprintf(buf, cap, "M=%d N=%d K=%d (A%s lda %d, B%s ldb %d%s, C %s ldc %d%s, alpha %g)", k->M, k->N, k->K,
             k->ta ? "^T" : "", k->lda, k->tb ? "^T" : "", k->ldb, k->bias ? ", bf16 bias" : "",
             k->c_f32 ? "fp32" : "bf16", k->ldc, k->accumulate ? " +=" : "", (double)k->alpha);
}

// A (rows, cols) row-major matrix with leading dimension ld, read transposed when t is set.
static dnnl_status_t matrix_desc(dnnl_memory_desc_t *d, int rows, int cols, int t, int ld, dnnl_data_type_t type) {
    dnnl_dims_t dims = {rows, cols}, strides = {t ? 1 : ld, t ? ld : 1};
    return dnnl_memory_desc_init_by_strides(d, 2, dims, type, strides);
}

static void entry_free(gemm_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    dnnl_memory_t *mems[] = {&e->a, &e->b, &e->bias, &e->c};
    for (int i = 0; i < 4; i++)
        if (*mems[i]) dnnl_memory_destroy(*mems[i]);
    memset(e, 0, sizeof *e);
}

// Builds the primitive and memory objects of key k into e; the failing call's name on error.
static dnnl_status_t entry_create(gemm_entry *e, const gemm_key *k, const char **failed) {
    dnnl_memory_desc_t a, b, bias, c;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_matmul_desc_t desc;
    const char *impl = NULL;
    dnnl_status_t s;
    e->key = *k;
#define TRY(call)                              \
    if ((s = (call)) != dnnl_success) {        \
        *failed = #call;                       \
        goto done;                             \
    }
    TRY(matrix_desc(&a, k->M, k->K, k->ta, k->lda, dnnl_bf16));
    TRY(matrix_desc(&b, k->K, k->N, k->tb, k->ldb, dnnl_bf16));
    TRY(matrix_desc(&c, k->M, k->N, 0, k->ldc, k->c_f32 ? dnnl_f32 : dnnl_bf16));
    TRY(matrix_desc(&bias, 1, k->N, 0, k->N, dnnl_bf16));
    TRY(dnnl_matmul_desc_init(&desc, &a, &b, k->bias ? &bias : NULL, &c));
    TRY(dnnl_primitive_attr_create(&attr));
    if (k->alpha != 1.0f) TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha));
    if (k->accumulate) {
        TRY(dnnl_post_ops_create(&post));
        TRY(dnnl_post_ops_append_sum(post, 1.0f));
        TRY(dnnl_primitive_attr_set_post_ops(attr, post));
    }
    TRY(dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL));
    TRY(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    snprintf(e->impl, sizeof e->impl, "%s", impl ? impl : "?");
    TRY(dnnl_primitive_create(&e->prim, pd));
    TRY(dnnl_memory_create(&e->a, &a, engine, DNNL_MEMORY_NONE));
    TRY(dnnl_memory_create(&e->b, &b, engine, DNNL_MEMORY_NONE));
    TRY(dnnl_memory_create(&e->c, &c, engine, DNNL_MEMORY_NONE));
    if (k->bias) TRY(dnnl_memory_create(&e->bias, &bias, engine, DNNL_MEMORY_NONE));
#undef TRY
done:
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (post) dnnl_post_ops_destroy(post);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) entry_free(e);
    return s;
}

// 1 when slot e is a better one to (re)fill than slot than: free, or used less recently.
static int reuse_first(const gemm_entry *e, const gemm_entry *than) {
    if (!than->prim) return 0;
    return !e->prim || e->last_use < than->last_use;
}

// The cached entry of k, created (in a free or the least recently used slot) when missing; NULL on failure.
static gemm_entry *entry_for(gemm_entry *entries, int size, unsigned long *clock, const gemm_key *k,
                             dnnl_status_t *s, const char **failed) {
    gemm_entry *victim = &entries[0];
    for (int i = 0; i < size; i++) {
        gemm_entry *e = &entries[i];
        if (e->prim && !memcmp(&e->key, k, sizeof *k)) {
            e->last_use = ++*clock;
            return e;
        }
        if (reuse_first(e, victim)) victim = e;
    }
    entry_free(victim);
    if ((*s = entry_create(victim, k, failed)) != dnnl_success) return NULL;
    victim->last_use = ++*clock;
    return victim;
}

static dnnl_status_t execute(gemm_entry *e, dnnl_stream_t stream, const void *A, const void *B, const void *bias,
                             void *C, const char **failed) {
    dnnl_status_t s;
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_BIAS, e->bias}};
    if ((s = dnnl_memory_set_data_handle(e->a, (void *)A)) != dnnl_success ||
        (s = dnnl_memory_set_data_handle(e->b, (void *)B)) != dnnl_success ||
        (s = dnnl_memory_set_data_handle(e->c, C)) != dnnl_success ||
        (e->bias && (s = dnnl_memory_set_data_handle(e->bias, (void *)bias)) != dnnl_success)) {
        *failed = "dnnl_memory_set_data_handle";
        return s;
    }
    if ((s = dnnl_primitive_execute(e->prim, stream, e->bias ? 4 : 3, args)) != dnnl_success) {
        *failed = "dnnl_primitive_execute";
        return s;
    }
    if ((s = dnnl_stream_wait(stream)) != dnnl_success) *failed = "dnnl_stream_wait";
    return s;
}

// Runs (or, with A == NULL, only prepares) the GEMM of key k; impl (may be NULL) gets the kernel's name.
static int gemm(const char *op, const gemm_key *k, const void *A, const void *B, const void *bias, void *C,
                char *impl, size_t impl_cap) {
    pthread_once(&engine_once, engine_init);
    dnnl_status_t s = engine_status;
    const char *failed = "dnnl_engine_create / dnnl_stream_create";
    if (s == dnnl_success && k->threads == 0) {  // serial: this thread's cache and stream
        if (!thread_stream && (s = dnnl_stream_create(&thread_stream, engine, dnnl_stream_default_flags)) != dnnl_success)
            failed = "dnnl_stream_create";
        gemm_entry *e = s == dnnl_success ? entry_for(thread_cache, THREAD_CACHE_SIZE, &thread_clock, k, &s, &failed)
                                          : NULL;
        if (e && A) s = execute(e, thread_stream, A, B, bias, C, &failed);
    } else if (s == dnnl_success) {
        pthread_mutex_lock(&lock);
        gemm_entry *e = entry_for(cache, CACHE_SIZE, &use_clock, k, &s, &failed);
        if (e && impl) snprintf(impl, impl_cap, "%s", e->impl);
        if (e && A) s = execute(e, stream, A, B, bias, C, &failed);
        pthread_mutex_unlock(&lock);
    }
    if (s == dnnl_success) return 0;
    char shape[192];
    describe(k, shape, sizeof shape);
    return sl_errorf("%s: oneDNN bf16 matmul %s: %s failed: %s", op, shape, failed, dnnl_status2str(s));
}

// K = 0: C = bias or 0, or unchanged when accumulating (oneDNN 2.6 divides by K while planning).
static void empty_sum(int M, int N, const sl_bf16 *bias, void *C, int ldc, int c_f32, int accumulate) {
    for (int i = 0; !accumulate && i < M; i++)
        for (int j = 0; j < N; j++) {
            sl_bf16 b = bias ? bias[j] : 0;
            size_t at = (size_t)i * ldc + j;
            if (c_f32) ((float *)C)[at] = sl_bf16_to_f32(b);
            else ((sl_bf16 *)C)[at] = b;
        }
}

// threads 0: the serial products of cpu_gemm_bf16_serial
static int gemm_checked(const char *op, int ta, int tb, int M, int N, int K, float alpha, const sl_bf16 *A, int lda,
                        const sl_bf16 *B, int ldb, const sl_bf16 *bias, void *C, int ldc, int c_f32, int accumulate,
                        int threads) {
    gemm_key k = {ta != 0, tb != 0, M, N, K, lda, ldb, ldc, bias != NULL, c_f32 != 0, accumulate != 0, threads, alpha};
    char shape[192];
    if (M < 0 || N < 0 || K < 0 || ldc < N) {
        describe(&k, shape, sizeof shape);
        return sl_errorf("%s: oneDNN bf16 matmul %s: a negative dimension or ldc below N", op, shape);
    }
    if (M == 0 || N == 0) return 0;
    if (K == 0) {
        empty_sum(M, N, bias, C, ldc, c_f32, accumulate);
        return 0;
    }
    return gemm(op, &k, A, B, bias, C, NULL, 0);
}

int cpu_gemm_bf16(const char *op, int ta, int tb, int M, int N, int K, const sl_bf16 *A, int lda, const sl_bf16 *B,
                  int ldb, const sl_bf16 *bias, void *C, int c_f32, int accumulate) {
    return gemm_checked(op, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, bias, C, N, c_f32, accumulate,
                        omp_get_max_threads());
}

int cpu_gemm_bf16_scaled(const char *op, int ta, int tb, int M, int N, int K, float alpha, const sl_bf16 *A, int lda,
                         const sl_bf16 *B, int ldb, void *C, int ldc, int c_f32, int accumulate) {
    return gemm_checked(op, ta, tb, M, N, K, alpha, A, lda, B, ldb, NULL, C, ldc, c_f32, accumulate,
                        omp_get_max_threads());
}

int cpu_gemm_bf16_scaled_serial(const char *op, int ta, int tb, int M, int N, int K, float alpha, const sl_bf16 *A,
                                int lda, const sl_bf16 *B, int ldb, void *C, int ldc, int c_f32, int accumulate) {
    return gemm_checked(op, ta, tb, M, N, K, alpha, A, lda, B, ldb, NULL, C, ldc, c_f32, accumulate, 0);
}

int cpu_gemm_bf16_serial(const char *op, int ta, int tb, int M, int N, int K, const sl_bf16 *A, int lda,
                         const sl_bf16 *B, int ldb, const sl_bf16 *bias, void *C, int c_f32, int accumulate) {
    return gemm_checked(op, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, bias, C, N, c_f32, accumulate, 0);
}

int cpu_gemm_bf16_kernel(char *impl, size_t cap) {
    gemm_key k = {0, 1, 64, 64, 64, 64, 64, 64, 1, 0, 0, omp_get_max_threads(), 1.0f};  // a linear layer's forward
    return gemm("bf16 kernel probe", &k, NULL, NULL, NULL, NULL, impl, cap);
}
