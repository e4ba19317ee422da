// matmul.cu: the linear layers on the GPU through cuBLASLt (ops.h matmul_forward / matmul_backward,
// matmul_gelu_forward / matmul_gelu_backward with the GELU epilogue), plus the deterministic
// bias-gradient column sum (fused with the GELU gradient). cuBLASLt is dlopen'ed at init. How the
// row-major products map onto cuBLASLt, the epilogues, compute types and invariants: docs/gpu.md,
// "GEMMs (matmul.cu)".
#include "shardlm/settings.h"
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/cuda_math.cuh"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "ops/cuda/cuda_ops.h"  // cuda_matmul_bias_grad_calls
#include "shardlm/cuda_dlopen.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"
}

#define SL_MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)
#define SL_MATMUL_BGRAD_FLOATS 65536  // the widest bias whose gradient the BGRADB epilogue writes (OC)
#define SL_MATMUL_CACHE_SIZE 128
#define SL_MATMUL_TUNE_CANDIDATES 8   // heuristic results timed per plan under SHARDLM_GEMM_AUTOTUNE=1
#define SL_MATMUL_TUNE_MARGIN 0.98f   // a later candidate must be 2% faster to replace an earlier one

// ---- cuBLASLt, loaded at run time ----------------------------------------------------------------

#define SL_LT_FUNCS(X)                                                                                   \
    X(cublasLtCreate) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescSetAttribute)                     \
    X(cublasLtMatmulDescDestroy) X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)           \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceSetAttribute)                           \
    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmul)              \
    X(cublasLtGetVersion)

static struct {
#define SL_LT_FIELD(f) decltype(&::f) f;
    SL_LT_FUNCS(SL_LT_FIELD)
#undef SL_LT_FIELD
    decltype(&::cublasLtGetStatusString) cublasLtGetStatusString;  // optional: messages only
} lt;

static void *lt_lib;                 // dlopen handle
static char lt_path[512];            // the file it came from
static cublasLtHandle_t lt_handle;
static void *workspace;              // SL_MATMUL_WORKSPACE_BYTES of device memory
static float *bgrad;                 // SL_MATMUL_BGRAD_FLOATS: the BGRADB epilogue's bias gradient (it overwrites)
static unsigned long bgrad_calls, bgrad_epilogue_calls;  // dbias sums queued, and of those by BGRADB
static cublasComputeType_t fp32_compute = CUBLAS_COMPUTE_32F;  // fp32 runs (TF32 with SHARDLM_TF32=1)
static int run_precision = SL_PRECISION_FP32;                   // set_precision's last value
// SHARDLM_GELU_EPILOGUE, SHARDLM_BIAS_GRAD_EPILOGUE and SHARDLM_GEMM_AUTOTUNE are read per call
// (settings.h: loaded once), so a test that reloads the settings can take both paths in one process.
static int gelu_epilogue(void) { return sl_settings_get()->gelu_epilogue; }
static int bias_grad_epilogue(void) { return sl_settings_get()->bias_grad_epilogue; }
static int autotune(void) { return sl_settings_get()->gemm_autotune; }

static const char *lt_status_string(cublasStatus_t s) {
    const char *msg = lt.cublasLtGetStatusString ? lt.cublasLtGetStatusString(s) : NULL;
    return msg ? msg : "unknown cuBLAS status";
}

// A failed cuBLASLt call is recorded (first failure wins) and reported by cuda_synchronize().
#define LT_CHECK(call)                                                                              \
    ([&]() -> int {                                                                                 \
        cublasStatus_t st_ = (call);                                                                \
        if (st_ == CUBLAS_STATUS_SUCCESS) return 0;                                                 \
        sl_cuda_record_failure("cuBLASLt error: %s (status %d) in %s at %s:%d", lt_status_string(st_), \
                               (int)st_, #call, __FILE__, __LINE__);                                \
        return -1;                                                                                  \
    }())

int sl_cuda_matmul_init(void) {
    if (lt_handle) return 0;
    static const char *const names[] = {"libcublasLt.so.13", "libcublasLt.so", NULL};
    char why[1024];
    if (!lt_lib) {
        lt_lib = sl_cuda_dlopen(names, why, sizeof why);
        if (!lt_lib)
            return sl_errorf("the CUDA backend needs cuBLASLt at run time, but libcublasLt.so.13 could not be "
                             "loaded (%s); install CUDA 13's cuBLAS or point CUDA_HOME at it", why);
    }
#define SL_LT_LOAD(f)                                                                                   \
    lt.f = (decltype(lt.f))dlsym(lt_lib, #f);                                                           \
    if (!lt.f) return sl_errorf("%s does not export %s (not a CUDA 13 cuBLASLt?)", lt_path[0] ? lt_path : "libcublasLt", #f);
    Dl_info info;
    void *probe = dlsym(lt_lib, "cublasLtGetVersion");
    if (probe && dladdr(probe, &info) && info.dli_fname) snprintf(lt_path, sizeof lt_path, "%s", info.dli_fname);
    SL_LT_FUNCS(SL_LT_LOAD)
#undef SL_LT_LOAD
    lt.cublasLtGetStatusString = (decltype(lt.cublasLtGetStatusString))dlsym(lt_lib, "cublasLtGetStatusString");

    // The header's types (descriptor structs, heuristic results) must be the loaded library's.
    size_t version = lt.cublasLtGetVersion();
    if ((int)(version / 10000) != CUBLAS_VER_MAJOR)
        return sl_errorf("%s is cuBLASLt %zu.%zu.%zu, but this binary was built against cuBLASLt %d.x; "
                         "install cuBLAS %d or rebuild", lt_path, version / 10000, version / 100 % 100,
                         version % 100, CUBLAS_VER_MAJOR, CUBLAS_VER_MAJOR);

    fp32_compute = sl_settings_get()->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

    cublasStatus_t st = lt.cublasLtCreate(&lt_handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
        lt_handle = NULL;
        return sl_errorf("cublasLtCreate failed: %s (status %d)", lt_status_string(st), (int)st);
    }
    cudaError_t err = cudaMalloc(&workspace, SL_MATMUL_WORKSPACE_BYTES);
    if (err != cudaSuccess) {
        cudaGetLastError();
        workspace = NULL;
        return sl_errorf("out of GPU memory allocating the cuBLASLt workspace (%zu bytes): %s",
                         SL_MATMUL_WORKSPACE_BYTES, cudaGetErrorString(err));
    }
    err = cudaMalloc(&bgrad, sizeof(float) * SL_MATMUL_BGRAD_FLOATS);
    if (err != cudaSuccess) {
        cudaGetLastError();
        bgrad = NULL;
        return sl_errorf("out of GPU memory allocating the bias-gradient vector (%zu bytes): %s",
                         sizeof(float) * SL_MATMUL_BGRAD_FLOATS, cudaGetErrorString(err));
    }
    return 0;
}

// ---- compute type ---------------------------------------------------------------------------------

void cuda_set_precision(int precision) { run_precision = precision; }

// The compute type of the GEMMs queued now (see the top comment).
static cublasComputeType_t compute_type(void) {
    if (run_precision == SL_PRECISION_BF16) return CUBLAS_COMPUTE_32F_FAST_16BF;
    if (run_precision == SL_PRECISION_FP16) return CUBLAS_COMPUTE_32F_FAST_16F;
    return fp32_compute;
}

// ---- one GEMM: descriptors and algorithm cached per shape --------------------------------------

typedef enum { GEMM_FORWARD = 0, GEMM_DINP = 1, GEMM_DWEIGHT = 2, GEMM_FORWARD_GELU = 3, GEMM_DINP_DGELU = 4 } gemm_kind;

// Everything that decides the descriptors and the algorithm. Compared with memcmp: always memset first.
// epilogue: a cublasLtEpilogue_t (DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU, BGRADB); aux_ld only
// with an aux.
typedef struct {
    int kind, transa, transb, epilogue;
    uint64_t m, n, k;
    int64_t lda, ldb, ldc, aux_ld;
    uint32_t align_a, align_b, align_c;     // pointer alignment (bytes, power of two, at most 256)
    uint32_t align_bias, align_aux;         // likewise for the epilogue's vectors (0: none)
    int compute;
    int ab_type, d_type;                    // cudaDataType_t of A and B, and of C = D (and bias, aux)
    int tune;                               // SHARDLM_GEMM_AUTOTUNE: candidates kept and timed
} gemm_key;

typedef struct {
    int used;
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int has_algo;  // 0: the heuristic found none (the call records an error)
    // the heuristic's usable results, best first (1 without autotune); tuned: timed (plan_tune)
    int n_candidates, tuned;
    cublasLtMatmulAlgo_t candidates[SL_MATMUL_TUNE_CANDIDATES];
} gemm_plan;

static gemm_plan plans[SL_MATMUL_CACHE_SIZE];
static int next_evict;

static uint32_t pointer_alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t align = 256;
    while (align > 1 && (a & (align - 1))) align >>= 1;
    return align;
}

static void plan_destroy(gemm_plan *p) {
    if (p->desc) lt.cublasLtMatmulDescDestroy(p->desc);
    if (p->a) lt.cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) lt.cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) lt.cublasLtMatrixLayoutDestroy(p->c);
    memset(p, 0, sizeof *p);
}

// Builds the descriptors of `key` and asks the heuristic for its best algorithm. -1 (recorded) when a
// descriptor call fails; has_algo = 0 when no algorithm fits. The epilogue's pointers are set before
// the heuristic runs: it reads their alignment from them (later calls share that alignment: the key).
static int plan_build(gemm_plan *p, const gemm_key *key, const void *bias, void *aux) {
    memset(p, 0, sizeof *p);
    p->key = *key;
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    // Stored shapes (before op): A is m x k (k x m when transposed), B is k x n (n x k when transposed).
    uint64_t a_rows = key->transa ? key->k : key->m, a_cols = key->transa ? key->m : key->k;
    uint64_t b_rows = key->transb ? key->n : key->k, b_cols = key->transb ? key->k : key->n;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)key->epilogue;
    if (LT_CHECK(lt.cublasLtMatmulDescCreate(&p->desc, (cublasComputeType_t)key->compute, CUDA_R_32F)) ||
        LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
        LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) ||
        (bias && LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                            sizeof bias))) ||
        (aux && LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                           &aux, sizeof aux))) ||
        (aux && LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                           &key->aux_ld, sizeof key->aux_ld))) ||
        LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->a, (cudaDataType_t)key->ab_type, a_rows, a_cols, key->lda)) ||
        LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->b, (cudaDataType_t)key->ab_type, b_rows, b_cols, key->ldb)) ||
        LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->c, (cudaDataType_t)key->d_type, key->m, key->n, key->ldc))) {
        plan_destroy(p);
        return -1;
    }
    cublasLtMatmulPreference_t pref = NULL;
    if (LT_CHECK(lt.cublasLtMatmulPreferenceCreate(&pref))) { plan_destroy(p); return -1; }
    size_t ws = SL_MATMUL_WORKSPACE_BYTES;
    int rc = LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &ws, sizeof ws)) ||
             LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                              &key->align_a, sizeof key->align_a)) ||
             LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                              &key->align_b, sizeof key->align_b)) ||
             LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                              &key->align_c, sizeof key->align_c)) ||
             LT_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                              &key->align_c, sizeof key->align_c));
    if (!rc) {
        cublasLtMatmulHeuristicResult_t results[SL_MATMUL_TUNE_CANDIDATES];
        memset(results, 0, sizeof results);
        int found = 0;
        cublasStatus_t st = lt.cublasLtMatmulAlgoGetHeuristic(lt_handle, p->desc, p->a, p->b, p->c, p->c, pref,
                                                              key->tune ? SL_MATMUL_TUNE_CANDIDATES : 1, results, &found);
        // NOT_SUPPORTED means "no algorithm for this configuration": the caller decides what to do.
        // So does any refusal of a GELU or bias-gradient epilogue (an unsupported combination with
        // the compute type or the bias type, say): its caller has the unfused path.
        int e = key->epilogue;
        int has_fallback = e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                           e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_BGRADB;
        for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found && i < SL_MATMUL_TUNE_CANDIDATES; i++)
            if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates[p->n_candidates++] = results[i].algo;
        if (p->n_candidates > 0) {
            p->algo = p->candidates[0];
            p->has_algo = 1;
        } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !has_fallback) {
            rc = LT_CHECK(st);
        }
    }
    lt.cublasLtMatmulPreferenceDestroy(pref);
    if (rc) { plan_destroy(p); return -1; }
    p->used = 1;
    return 0;
}

// The cached plan for key (built on first use; the oldest slot is reused when the table is full).
static gemm_plan *plan_get(const gemm_key *key, const void *bias, void *aux) {
    for (int i = 0; i < SL_MATMUL_CACHE_SIZE; i++)
        if (plans[i].used && !memcmp(&plans[i].key, key, sizeof *key)) return &plans[i];
    gemm_plan *slot = NULL;
    for (int i = 0; i < SL_MATMUL_CACHE_SIZE && !slot; i++)
        if (!plans[i].used) slot = &plans[i];
    if (!slot) {
        slot = &plans[next_evict];
        next_evict = (next_evict + 1) % SL_MATMUL_CACHE_SIZE;
        plan_destroy(slot);
    }
    return plan_build(slot, key, bias, aux) ? NULL : slot;
}

// SHARDLM_GEMM_AUTOTUNE=1: on a plan's first use, times each of its candidate algorithms once on
// the call's own operands (after one untimed run of the first: clocks and caches) and keeps the
// fastest; a later candidate must beat the best so far by SL_MATMUL_TUNE_MARGIN, so near-ties keep
// the heuristic's order. The trials write D (and a GELU_AUX's aux) before the real call overwrites
// them; a GEMM that accumulates (beta != 0) has D (d_bytes) saved first and restored after, and
// keeps the heuristic's choice when that copy cannot be allocated. Blocks the host once per plan.
// The choice holds for the plan's life (the run, unless evicted from the cache) but may differ from
// run to run: timings are not reproducible.
static void plan_tune(gemm_plan *p, const void *A, const void *B, void *D, float beta, size_t d_bytes) {
    p->tuned = 1;
    if (p->n_candidates < 2) return;
    cudaStream_t s = sl_cuda_stream();
    void *saved = NULL;
    if (beta != 0.0f) {
        if (cudaMallocAsync(&saved, d_bytes, s) != cudaSuccess) {
            cudaGetLastError();  // not enough memory for the copy: keep the heuristic's choice
            return;
        }
        CUDA_CHECK(cudaMemcpyAsync(saved, D, d_bytes, cudaMemcpyDeviceToDevice, s));
    }
    cudaEvent_t start = NULL, stop = NULL;
    if (cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
        const float alpha = 1.0f;
        int best = -1;
        float best_ms = 0.0f;
        lt.cublasLtMatmul(lt_handle, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c, &p->candidates[0],
                          workspace, SL_MATMUL_WORKSPACE_BYTES, s);
        for (int i = 0; i < p->n_candidates; i++) {
            cudaEventRecord(start, s);
            cublasStatus_t st = lt.cublasLtMatmul(lt_handle, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D,
                                                  p->c, &p->candidates[i], workspace, SL_MATMUL_WORKSPACE_BYTES, s);
            cudaEventRecord(stop, s);
            float ms = 0.0f;
            if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
                break;  // a CUDA error: left for the real call (and cuda_synchronize) to report
            if (st == CUBLAS_STATUS_SUCCESS && (best < 0 || ms < best_ms * SL_MATMUL_TUNE_MARGIN)) {
                best = i;
                best_ms = ms;
            }
        }
        if (best >= 0) p->algo = p->candidates[best];
    }
    cudaGetLastError();  // a failed candidate's launch error is not the run's
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (saved) {
        CUDA_CHECK(cudaMemcpyAsync(D, saved, d_bytes, cudaMemcpyDeviceToDevice, s));
        CUDA_CHECK(cudaFreeAsync(saved, s));
    }
}

static const char *kind_name(int kind) {
    switch (kind) {
    case GEMM_FORWARD: return "matmul_forward";
    case GEMM_DINP: return "matmul_backward (dinp)";
    case GEMM_DWEIGHT: return "matmul_backward (dweight)";
    case GEMM_DINP_DGELU: return "matmul_backward_gelu (dinp)";
    default: return "matmul_gelu_forward";
    }
}

// D (m x n, ld ldc) = op(A) @ op(B) + beta * D, column-major, with an epilogue: + bias over D's rows
// when bias != NULL; with aux != NULL, aux (m x n, ld ldc) = that result and D = gelu(it) (GELU_AUX),
// except for kind GEMM_DINP_DGELU, where aux is an input (the pre-activation, laid out like D) and
// D = the product * gelu'(aux) (DGELU; no bias). For kind GEMM_DWEIGHT bias is an output: the sums
// of op(B) over k, one a column of D, d_type, overwritten (BGRADB).
// A and B hold ab_type elements, D (and bias, aux) d_type: CUDA_R_32F, or CUDA_R_16BF for bf16
// storage (then computed in CUBLAS_COMPUTE_32F on the tensor cores whatever the precision says).
// Returns 1 when no algorithm exists with the epilogue asked for (nothing was queued; the caller does
// it unfused), 0 when queued, -1 when it failed (recorded).
static int gemm(int kind, int transa, int transb, int m, int n, int k, const void *A, int lda, const void *B,
                int ldb, void *D, int ldc, float beta, const void *bias, void *aux, cudaDataType_t ab_type,
                cudaDataType_t d_type) {
    if (!lt_handle) {
        sl_cuda_record_failure("%s called before cuda_backend_init (cuBLASLt is not loaded)", kind_name(kind));
        return -1;
    }
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.transa = transa;
    key.transb = transb;
    if (kind == GEMM_DINP_DGELU) key.epilogue = CUBLASLT_EPILOGUE_DGELU;
    else if (kind == GEMM_DWEIGHT) key.epilogue = bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
    else key.epilogue = aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                            : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    key.aux_ld = aux ? ldc : 0;
    key.m = (uint64_t)m;
    key.n = (uint64_t)n;
    key.k = (uint64_t)k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.align_a = pointer_alignment(A);
    key.align_b = pointer_alignment(B);
    key.align_c = pointer_alignment(D);
    key.align_bias = bias ? pointer_alignment(bias) : 0;
    key.align_aux = aux ? pointer_alignment(aux) : 0;
    key.ab_type = (int)ab_type;
    key.d_type = (int)d_type;
    key.compute = ab_type == CUDA_R_32F ? (int)compute_type() : (int)CUBLAS_COMPUTE_32F;
    key.tune = autotune();
    gemm_plan *p = plan_get(&key, bias, aux);
    if (!p) return -1;
    if (!p->has_algo && ab_type == CUDA_R_32F && key.compute != (int)fp32_compute) {
        // a 16-bit compute type the heuristic refuses for this shape / alignment: compute in fp32
        key.compute = (int)fp32_compute;
        if (!(p = plan_get(&key, bias, aux))) return -1;
    }
    if (!p->has_algo) {
        if (bias || aux) return 1;
        sl_cuda_record_failure("cuBLASLt has no algorithm for %s (m=%d n=%d k=%d, alignments %u/%u/%u bytes, %s)",
                               kind_name(kind), m, n, k, key.align_a, key.align_b, key.align_c,
                               ab_type == CUDA_R_32F ? "fp32" : "bf16");
        return -1;
    }
    if (bias && LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                           sizeof bias)))
        return -1;
    if (aux && LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                          sizeof aux)))
        return -1;
    if (key.tune && !p->tuned) {
        size_t elem = d_type == CUDA_R_32F ? sizeof(float) : sizeof(__nv_bfloat16);
        plan_tune(p, A, B, D, beta, elem * ((size_t)ldc * (size_t)(n - 1) + (size_t)m));
    }
    const float alpha = 1.0f;
    return LT_CHECK(lt.cublasLtMatmul(lt_handle, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c,
                                      &p->algo, workspace, SL_MATMUL_WORKSPACE_BYTES, sl_cuda_stream()));
}

// ---- kernels -------------------------------------------------------------------------------------

// out (N,OC) += bias (OC) broadcast over rows: the forward's bias when the epilogue is unavailable.
// Both storage-typed (the bias from the model's bf16 shadow with bf16 storage).
template <typename T>
static __global__ void add_bias_kernel(T *out, const T *bias, size_t total, int OC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] = from_f32<T>(to_f32(out[i]) + to_f32(bias[i % (size_t)OC]));
}

#define BIAS_COLS 32   // columns per block (one warp wide: coalesced row reads)
#define BIAS_LANES 8   // rows summed in parallel inside a block
#define BIAS_ROWS_PER_CHUNK 256

// Pass 1: block (x = column tile, y = row chunk) sums rows [chunk*rows_per_chunk, +rows_per_chunk) of
// its 32 columns, lane by lane in row order, then lanes in lane order. With one chunk it adds the
// sum straight into dbias; otherwise it writes partial[chunk][col]. With pre != NULL every element
// is first replaced by its GELU gradient, dpre = dout * gelu'(pre), written to dpre (which may be
// dout itself: each element is read and written by one thread), and dpre is what is summed.
template <typename T>
static __global__ void bias_grad_partial_kernel(float *partial, float *dbias, const T *dout, const T *pre, T *dpre,
                                                int N, int OC, int rows_per_chunk) {
    __shared__ float lanes[BIAS_LANES][BIAS_COLS + 1];
    int col = blockIdx.x * BIAS_COLS + threadIdx.x;
    int r0 = blockIdx.y * rows_per_chunk;
    int r1 = min(N, r0 + rows_per_chunk);
    float sum = 0.0f;
    if (col < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += BIAS_LANES) {
            size_t i = (size_t)r * OC + col;
            float d = to_f32(dout[i]);
            if (pre) {
                T stored = from_f32<T>(gelu_backward_dev(to_f32(pre[i]), d));
                dpre[i] = stored;
                d = to_f32(stored);  // the bias gradient sums dpre as stored, as the GEMMs read it
            }
            sum += d;
        }
    lanes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || col >= OC) return;
    float total = lanes[0][threadIdx.x];
    for (int l = 1; l < BIAS_LANES; l++) total += lanes[l][threadIdx.x];
    if (gridDim.y == 1) dbias[col] += total;
    else partial[(size_t)blockIdx.y * OC + col] = total;
}

// Pass 2: dbias[col] += the chunks' partial sums, in chunk order.
static __global__ void bias_grad_finish_kernel(float *dbias, const float *partial, int chunks, int OC) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) return;
    float total = 0.0f;
    for (int c = 0; c < chunks; c++) total += partial[(size_t)c * OC + col];
    dbias[col] += total;
}

// dbias (OC) += column sums of dout (N,OC). The chunk count depends only on (N, OC). With pre, the
// sums are of dpre = dout * gelu'(pre), which is written over dpre (see the partial kernel).
template <typename T>
static void bias_grad_accumulate(float *dbias, const T *dout, const T *pre, T *dpre, int N, int OC) {
    cudaStream_t s = sl_cuda_stream();
    int rows_per_chunk = BIAS_ROWS_PER_CHUNK;
    size_t max_chunks = SL_MATMUL_WORKSPACE_BYTES / (sizeof(float) * (size_t)OC);
    size_t chunks = ((size_t)N + rows_per_chunk - 1) / rows_per_chunk;
    if (chunks > 65535) chunks = 65535;           // grid.y limit
    if (chunks > max_chunks) chunks = max_chunks;  // partial sums must fit the workspace
    if (chunks < 1) chunks = 1;
    rows_per_chunk = (int)(((size_t)N + chunks - 1) / chunks);
    dim3 grid(ceil_div_u((size_t)OC, BIAS_COLS), (unsigned)chunks), block(BIAS_COLS, BIAS_LANES);
    bias_grad_partial_kernel<T><<<grid, block, 0, s>>>((float *)workspace, dbias, dout, pre, dpre, N, OC,
                                                    rows_per_chunk);
    CUDA_LAUNCH_CHECK();
    if (chunks > 1) {
        bias_grad_finish_kernel<<<ceil_div_u((size_t)OC, 256), 256, 0, s>>>(dbias, (const float *)workspace,
                                                                           (int)chunks, OC);
        CUDA_LAUNCH_CHECK();
    }
}

// ---- the ops (cuda_ops.cuh) ---------------------------------------------------------------------

// bias pointers below this alignment skip the epilogue (cuBLASLt reads the bias vector vectorised).
#define BIAS_EPILOGUE_MIN_ALIGN 16

// The cuBLASLt element type of a storage type.
template <typename floatX> static cudaDataType_t storage_type(void);
template <> cudaDataType_t storage_type<float>(void) { return CUDA_R_32F; }
template <> cudaDataType_t storage_type<__nv_bfloat16>(void) { return CUDA_R_16BF; }

template <typename floatX>
static void add_bias(floatX *out, const floatX *bias, int N, int OC) {
    size_t total = (size_t)N * OC;
    add_bias_kernel<floatX><<<ceil_div_u(total, 256), 256, 0, sl_cuda_stream()>>>(out, bias, total, OC);
    CUDA_LAUNCH_CHECK();
}

template <typename floatX>
void cuda_matmul_forward(sl_act *out_, const sl_act *inp_, const sl_act *weight_, const sl_act *bias_, int N,
                         int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    floatX *out = as_storage<floatX>(out_);
    const floatX *inp = as_storage<floatX>(inp_), *weight = as_storage<floatX>(weight_);
    const floatX *bias = as_storage<floatX>(bias_);
    const cudaDataType_t t = storage_type<floatX>();
    if (IC <= 0) {  // an empty product: out = bias (or 0)
        CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(floatX) * (size_t)N * OC, sl_cuda_stream()));
        if (bias) add_bias<floatX>(out, bias, N, OC);
        return;
    }
    const floatX *epi_bias = bias && pointer_alignment(bias) >= BIAS_EPILOGUE_MIN_ALIGN ? bias : NULL;
    // out^T (OC,N) = op(weight: col-major IC x OC, transposed) @ inp^T (col-major IC x N)
    int rc = gemm(GEMM_FORWARD, 1, 0, OC, N, IC, weight, IC, inp, IC, out, OC, 0.0f, epi_bias, NULL, t, t);
    if (rc == 1) {  // no algorithm with the bias epilogue for this shape: plain GEMM, then the bias kernel
        epi_bias = NULL;
        rc = gemm(GEMM_FORWARD, 1, 0, OC, N, IC, weight, IC, inp, IC, out, OC, 0.0f, NULL, NULL, t, t);
    }
    if (rc == 0 && bias && !epi_bias) add_bias<floatX>(out, bias, N, OC);
}

template <typename floatX>
void cuda_matmul_backward(sl_act *dinp_, float *dweight, float *dbias, const sl_act *dout_, const sl_act *inp_,
                          const sl_act *weight_, int N, int IC, int OC) {
    floatX *dinp = as_storage<floatX>(dinp_);
    const floatX *dout = as_storage<floatX>(dout_), *inp = as_storage<floatX>(inp_);
    const floatX *weight = as_storage<floatX>(weight_);
    const cudaDataType_t t = storage_type<floatX>();
    if (N <= 0 || OC <= 0 || IC <= 0) {
        // Nothing accumulates from an empty product; dinp (N,IC) with OC == 0 is all zeros.
        if (dinp && N > 0 && IC > 0)
            CUDA_CHECK(cudaMemsetAsync(dinp, 0, sizeof(floatX) * (size_t)N * IC, sl_cuda_stream()));
        return;
    }
    // dinp^T (IC,N) = weight^T (col-major IC x OC) @ dout^T (col-major OC x N)
    if (dinp) gemm(GEMM_DINP, 0, 0, IC, N, OC, weight, IC, dout, OC, dinp, IC, 0.0f, NULL, NULL, t, t);
    // dweight^T (IC,OC) += inp^T (col-major IC x N) @ op(dout^T: col-major OC x N, transposed); dweight
    // is an fp32 parameter gradient whatever the storage. With a bias, the GEMM's BGRADB epilogue sums
    // op(dout^T) over k = N as it reads it: dbias's addend, fp32, in bgrad (it overwrites; dbias
    // accumulates), so dout is not read a second time. Where cuBLASLt offers no such algorithm, with
    // SHARDLM_BIAS_GRAD_EPILOGUE=0, without dweight or wider than bgrad: the column-sum kernels.
    if (dbias) bgrad_calls++;
    if (dweight) {
        float *epi = dbias && bias_grad_epilogue() && OC <= SL_MATMUL_BGRAD_FLOATS ? bgrad : NULL;
        int rc = gemm(GEMM_DWEIGHT, 0, 1, IC, OC, N, inp, IC, dout, OC, dweight, IC, 1.0f, epi, NULL, t, CUDA_R_32F);
        if (rc == 1) {
            epi = NULL;
            rc = gemm(GEMM_DWEIGHT, 0, 1, IC, OC, N, inp, IC, dout, OC, dweight, IC, 1.0f, NULL, NULL, t, CUDA_R_32F);
        }
        if (rc == 0 && epi) {
            bias_grad_finish_kernel<<<ceil_div_u((size_t)OC, 256), 256, 0, sl_cuda_stream()>>>(dbias, bgrad, 1, OC);
            CUDA_LAUNCH_CHECK();
            bgrad_epilogue_calls++;
            dbias = NULL;
        }
    }
    if (dbias) bias_grad_accumulate<floatX>(dbias, dout, NULL, NULL, N, OC);
}

extern "C" unsigned long cuda_matmul_bias_grad_calls(unsigned long *epilogue) {
    if (epilogue) *epilogue = bgrad_epilogue_calls;
    return bgrad_calls;
}

// cuBLASLt's rule for the GELU auxiliary matrix's leading dimension (elements); out and pre below this
// alignment skip the epilogue (vectorised stores, as for the bias).
#define GELU_AUX_LD_MULTIPLE 8
#define GELU_EPILOGUE_MIN_ALIGN 16

template <typename floatX>
void cuda_matmul_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight, const sl_act *bias,
                              int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    int fused = gelu_epilogue() && IC > 0 && OC % GELU_AUX_LD_MULTIPLE == 0 &&
                pointer_alignment(out) >= GELU_EPILOGUE_MIN_ALIGN && pointer_alignment(pre) >= GELU_EPILOGUE_MIN_ALIGN &&
                (!bias || pointer_alignment(bias) >= BIAS_EPILOGUE_MIN_ALIGN);
    if (fused) {
        // out^T = gelu(weight^T-product + bias), pre^T = the product + bias (aux, same layout and type as out^T)
        const cudaDataType_t t = storage_type<floatX>();
        int rc = gemm(GEMM_FORWARD_GELU, 1, 0, OC, N, IC, as_storage<floatX>(weight), IC, as_storage<floatX>(inp), IC,
                      as_storage<floatX>(out), OC, 0.0f, as_storage<floatX>(bias), as_storage<floatX>(pre), t, t);
        if (rc != 1) return;  // queued, or failed (recorded)
    }
    // Unfused: switched off, OC not a multiple of 8, a misaligned out / pre / bias, or no algorithm
    // with the epilogue. (With bf16 storage the GELU then reads pre as stored, rounded; the epilogue
    // applies it to the fp32 sum: the two differ by bf16 rounding.)
    cuda_matmul_forward<floatX>(pre, inp, weight, bias, N, IC, OC);
    cuda_gelu_forward<floatX>(out, pre, (size_t)N * OC);
}

template <typename floatX>
void cuda_matmul_gelu_backward(sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre,
                               const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    // dout -> dpre in place, fused with dbias += colsum(dpre) when there is a bias
    if (dbias)
        bias_grad_accumulate<floatX>(dbias, as_storage<floatX>(dout), as_storage<floatX>(pre), as_storage<floatX>(dout),
                                     N, OC);
    else cuda_gelu_backward<floatX>(dout, pre, dout, (size_t)N * OC);
    cuda_matmul_backward<floatX>(dinp, dweight, NULL, dout, inp, weight, N, IC, OC);
}

// The c_proj backward of GPT-2's MLP: dinp = (dout @ weight) * gelu'(pre), the GELU gradient applied
// by the dinp GEMM's DGELU epilogue (pre, written by matmul_gelu_forward in D's layout: row-major
// (N, IC) = column-major IC x N, leading dimension IC, the aux layout the epilogue reads), then the
// dweight GEMM and dbias as in matmul_backward. Unfused (SHARDLM_GELU_EPILOGUE=0, IC not a multiple
// of 8, dinp or pre below 16-byte alignment, no algorithm with the epilogue): the dinp GEMM, then the
// GELU-gradient kernel in place (one rounding more with bf16 storage).
template <typename floatX>
void cuda_matmul_backward_gelu(sl_act *dinp_, float *dweight, float *dbias, const sl_act *dout_, const sl_act *inp,
                               const sl_act *weight_, const sl_act *pre_, int N, int IC, int OC) {
    floatX *dinp = as_storage<floatX>(dinp_);
    const floatX *pre = as_storage<floatX>(pre_);
    if (dinp && N > 0 && IC > 0 && OC > 0) {
        int fused = gelu_epilogue() && IC % GELU_AUX_LD_MULTIPLE == 0 &&
                    pointer_alignment(dinp) >= GELU_EPILOGUE_MIN_ALIGN &&
                    pointer_alignment(pre) >= GELU_EPILOGUE_MIN_ALIGN;
        const cudaDataType_t t = storage_type<floatX>();
        // dinp^T (IC,N) = weight^T (col-major IC x OC) @ dout^T (col-major OC x N), times gelu'(pre^T)
        int rc = fused ? gemm(GEMM_DINP_DGELU, 0, 0, IC, N, OC, as_storage<floatX>(weight_), IC,
                              as_storage<floatX>(dout_), OC, dinp, IC, 0.0f, NULL, (void *)pre, t, t)
                       : 1;
        if (rc == 1) {
            cuda_matmul_backward<floatX>(dinp_, NULL, NULL, dout_, inp, weight_, N, IC, OC);
            cuda_gelu_backward<floatX>(dinp_, pre_, dinp_, (size_t)N * IC);
        }
    } else if (dinp) {
        cuda_matmul_backward<floatX>(dinp_, NULL, NULL, dout_, inp, weight_, N, IC, OC);  // zeros when OC == 0
    }
    cuda_matmul_backward<floatX>(NULL, dweight, dbias, dout_, inp, weight_, N, IC, OC);
}

SL_CUDA_STORAGE_INSTANCES(cuda_matmul_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_matmul_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_matmul_gelu_forward)
SL_CUDA_STORAGE_INSTANCES(cuda_matmul_gelu_backward)
SL_CUDA_STORAGE_INSTANCES(cuda_matmul_backward_gelu)
