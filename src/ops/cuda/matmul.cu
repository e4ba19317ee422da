// matmul.cu: the linear layers (ops.h matmul_forward / matmul_backward) on the GPU through cuBLASLt,
// plus the deterministic bias-gradient column sum.
//
// cuBLASLt is not linked: sl_cuda_matmul_init() (called once by cuda_backend_init) dlopens
// libcublasLt.so.13 and dlsyms the functions below; <cublasLt.h> is included for its types only.
//
// Row-major C versus column-major cuBLAS. A row-major (R, C) matrix with leading dimension C is, byte
// for byte, the column-major (C, R) matrix, i.e. its transpose. So every row-major product
// Y = X1 @ X2 is computed as the column-major product Y^T = X2^T @ X1^T, with each buffer described
// by its own row-major shape read as column-major. The three GEMMs (m, n, k are cuBLAS's: D is m x n):
//   forward  out (N,OC) = inp @ weight^T       ->  out^T (OC,N) = op(weight) @ inp^T
//            A = weight as col-major (IC,OC) ld IC, transa = T; B = inp as (IC,N) ld IC, transb = N;
//            D = out as (OC,N) ld OC;  m = OC, n = N, k = IC; bias (OC) = D's rows: EPILOGUE_BIAS.
//   dinp     dinp (N,IC) = dout @ weight       ->  dinp^T (IC,N) = weight^T @ dout^T
//            A = weight as (IC,OC) ld IC, transa = N; B = dout as (OC,N) ld OC, transb = N;
//            D = dinp as (IC,N) ld IC;  m = IC, n = N, k = OC; beta = 0 (overwrite).
//   dweight  dweight (OC,IC) += dout^T @ inp   ->  dweight^T (IC,OC) += inp^T @ dout
//            A = inp as (IC,N) ld IC, transa = N; B = dout as (OC,N) ld OC, transb = T;
//            C = D = dweight as (IC,OC) ld IC;  m = IC, n = OC, k = N; beta = 1 (accumulate).
// dbias (OC) += column sums of dout (N,OC) is not a cuBLASLt epilogue: BGRADA/BGRADB overwrite the
// bias gradient instead of adding to it (and are not offered for every fp32 configuration), so a
// two-pass kernel does it: fixed row chunks -> partial sums, then each column's partials in chunk
// order, added to dbias. The chunking depends only on (N, OC), so the result is bit-reproducible.
//
// Invariants:
//   - fp32 in, fp32 out, CUBLAS_COMPUTE_32F (true fp32: results within ~1e-6 relative of the CPU).
//     SHARDLM_TF32=1 in the environment at init selects CUBLAS_COMPUTE_32F_FAST_TF32 instead.
//   - Deterministic: the algorithm of a GEMM is chosen by cuBLASLt's heuristic once per shape (and
//     pointer alignment) and cached with its descriptors; a fixed algorithm gives the same bits on
//     every call (cuBLASLt's split-K reductions are sequenced, not atomic).
//   - One 32 MiB workspace, allocated at init, shared by every GEMM and the bias-gradient partial
//     sums: all of them are queued on the one backend stream, so their uses never overlap.
//   - Errors (cuBLASLt status, no algorithm found) are recorded like CUDA errors and reported by
//     cuda_synchronize(); the ops themselves never block the host.
//   - The plan cache is not locked: ops are called from one host thread (as every op of the backend).
//     An evicted plan's descriptors may be destroyed while its GEMM is still queued: cublasLtMatmul
//     captures what it needs when it is called.
#include "ops/cuda/cuda_common.cuh"

#include <cublasLt.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "shardlm/cuda_dlopen.h"
#include "shardlm/error.h"
}

#define SL_MATMUL_WORKSPACE_BYTES ((size_t)32 << 20)
#define SL_MATMUL_CACHE_SIZE 128

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
static cublasComputeType_t compute_type = CUBLAS_COMPUTE_32F;

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

    const char *tf32 = getenv("SHARDLM_TF32");
    compute_type = (tf32 && !strcmp(tf32, "1")) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;

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
    return 0;
}

// ---- one GEMM: descriptors and algorithm cached per shape --------------------------------------

typedef enum { GEMM_FORWARD = 0, GEMM_DINP = 1, GEMM_DWEIGHT = 2 } gemm_kind;

// Everything that decides the descriptors and the algorithm. Compared with memcmp: always memset first.
typedef struct {
    int kind, transa, transb, bias_epilogue;
    uint64_t m, n, k;
    int64_t lda, ldb, ldc;
    uint32_t align_a, align_b, align_c;  // pointer alignment (bytes, power of two, at most 256)
    int compute;
} gemm_key;

typedef struct {
    int used;
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int has_algo;  // 0: the heuristic found none (the call records an error)
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
// descriptor call fails; has_algo = 0 when no algorithm fits.
static int plan_build(gemm_plan *p, const gemm_key *key) {
    memset(p, 0, sizeof *p);
    p->key = *key;
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    // Stored shapes (before op): A is m x k (k x m when transposed), B is k x n (n x k when transposed).
    uint64_t a_rows = key->transa ? key->k : key->m, a_cols = key->transa ? key->m : key->k;
    uint64_t b_rows = key->transb ? key->n : key->k, b_cols = key->transb ? key->k : key->n;
    cublasLtEpilogue_t epi = key->bias_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (LT_CHECK(lt.cublasLtMatmulDescCreate(&p->desc, (cublasComputeType_t)key->compute, CUDA_R_32F)) ||
        LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) ||
        LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) ||
        LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) ||
        LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->a, CUDA_R_32F, a_rows, a_cols, key->lda)) ||
        LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->b, CUDA_R_32F, b_rows, b_cols, key->ldb)) ||
        LT_CHECK(lt.cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, key->m, key->n, key->ldc))) {
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
        cublasLtMatmulHeuristicResult_t result;
        memset(&result, 0, sizeof result);
        int found = 0;
        cublasStatus_t st = lt.cublasLtMatmulAlgoGetHeuristic(lt_handle, p->desc, p->a, p->b, p->c, p->c, pref, 1,
                                                              &result, &found);
        // NOT_SUPPORTED means "no algorithm for this configuration": the caller decides what to do.
        if (st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
            p->algo = result.algo;
            p->has_algo = 1;
        } else if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) {
            rc = LT_CHECK(st);
        }
    }
    lt.cublasLtMatmulPreferenceDestroy(pref);
    if (rc) { plan_destroy(p); return -1; }
    p->used = 1;
    return 0;
}

// The cached plan for key (built on first use; the oldest slot is reused when the table is full).
static gemm_plan *plan_get(const gemm_key *key) {
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
    return plan_build(slot, key) ? NULL : slot;
}

static const char *kind_name(int kind) {
    return kind == GEMM_FORWARD ? "matmul_forward" : kind == GEMM_DINP ? "matmul_backward (dinp)"
                                                                       : "matmul_backward (dweight)";
}

// D (m x n, ld ldc) = op(A) @ op(B) + beta * D (+ bias over D's rows when bias != NULL), column-major.
// Returns 1 when no algorithm exists with the bias epilogue (nothing was queued; the caller adds the
// bias itself), 0 when queued, -1 when it failed (recorded).
static int gemm(int kind, int transa, int transb, int m, int n, int k, const float *A, int lda, const float *B,
                int ldb, float *D, int ldc, float beta, const float *bias) {
    if (!lt_handle) {
        sl_cuda_record_failure("%s called before cuda_backend_init (cuBLASLt is not loaded)", kind_name(kind));
        return -1;
    }
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.kind = kind;
    key.transa = transa;
    key.transb = transb;
    key.bias_epilogue = bias != NULL;
    key.m = (uint64_t)m;
    key.n = (uint64_t)n;
    key.k = (uint64_t)k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.align_a = pointer_alignment(A);
    key.align_b = pointer_alignment(B);
    key.align_c = pointer_alignment(D);
    key.compute = (int)compute_type;
    gemm_plan *p = plan_get(&key);
    if (!p) return -1;
    if (!p->has_algo) {
        if (bias) return 1;
        sl_cuda_record_failure("cuBLASLt has no algorithm for %s (m=%d n=%d k=%d, alignments %u/%u/%u bytes)",
                               kind_name(kind), m, n, k, key.align_a, key.align_b, key.align_c);
        return -1;
    }
    if (bias && LT_CHECK(lt.cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                           sizeof bias)))
        return -1;
    const float alpha = 1.0f;
    return LT_CHECK(lt.cublasLtMatmul(lt_handle, p->desc, &alpha, A, p->a, B, p->b, &beta, D, p->c, D, p->c,
                                      &p->algo, workspace, SL_MATMUL_WORKSPACE_BYTES, sl_cuda_stream()));
}

// ---- kernels -------------------------------------------------------------------------------------

// out (N,OC) += bias (OC) broadcast over rows: the forward's bias when the epilogue is unavailable.
static __global__ void add_bias_kernel(float *out, const float *bias, size_t total, int OC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) out[i] += bias[i % (size_t)OC];
}

#define BIAS_COLS 32   // columns per block (one warp wide: coalesced row reads)
#define BIAS_LANES 8   // rows summed in parallel inside a block
#define BIAS_ROWS_PER_CHUNK 256

// Pass 1: block (x = column tile, y = row chunk) sums rows [chunk*rows_per_chunk, +rows_per_chunk) of
// its 32 columns, lane by lane in row order, then lanes in lane order. With one chunk it adds the
// sum straight into dbias; otherwise it writes partial[chunk][col].
static __global__ void bias_grad_partial_kernel(float *partial, float *dbias, const float *dout, int N, int OC,
                                         int rows_per_chunk) {
    __shared__ float lanes[BIAS_LANES][BIAS_COLS + 1];
    int col = blockIdx.x * BIAS_COLS + threadIdx.x;
    int r0 = blockIdx.y * rows_per_chunk;
    int r1 = min(N, r0 + rows_per_chunk);
    float sum = 0.0f;
    if (col < OC)
        for (int r = r0 + threadIdx.y; r < r1; r += BIAS_LANES) sum += dout[(size_t)r * OC + col];
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

// dbias (OC) += column sums of dout (N,OC). The chunk count depends only on (N, OC).
static void bias_grad_accumulate(float *dbias, const float *dout, int N, int OC) {
    cudaStream_t s = sl_cuda_stream();
    int rows_per_chunk = BIAS_ROWS_PER_CHUNK;
    size_t max_chunks = SL_MATMUL_WORKSPACE_BYTES / (sizeof(float) * (size_t)OC);
    size_t chunks = ((size_t)N + rows_per_chunk - 1) / rows_per_chunk;
    if (chunks > 65535) chunks = 65535;           // grid.y limit
    if (chunks > max_chunks) chunks = max_chunks;  // partial sums must fit the workspace
    if (chunks < 1) chunks = 1;
    rows_per_chunk = (int)(((size_t)N + chunks - 1) / chunks);
    dim3 grid(ceil_div_u((size_t)OC, BIAS_COLS), (unsigned)chunks), block(BIAS_COLS, BIAS_LANES);
    bias_grad_partial_kernel<<<grid, block, 0, s>>>((float *)workspace, dbias, dout, N, OC, rows_per_chunk);
    CUDA_LAUNCH_CHECK();
    if (chunks > 1) {
        bias_grad_finish_kernel<<<ceil_div_u((size_t)OC, 256), 256, 0, s>>>(dbias, (const float *)workspace,
                                                                           (int)chunks, OC);
        CUDA_LAUNCH_CHECK();
    }
}

// ---- the ops --------------------------------------------------------------------------------------

// bias pointers below this alignment skip the epilogue (cuBLASLt reads the bias vector vectorised).
#define BIAS_EPILOGUE_MIN_ALIGN 16

void cuda_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC,
                         int OC) {
    if (N <= 0 || OC <= 0) return;
    if (IC <= 0) {  // an empty product: out = bias (or 0)
        CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(float) * (size_t)N * OC, sl_cuda_stream()));
        if (bias) {
            size_t total = (size_t)N * OC;
            add_bias_kernel<<<ceil_div_u(total, 256), 256, 0, sl_cuda_stream()>>>(out, bias, total, OC);
            CUDA_LAUNCH_CHECK();
        }
        return;
    }
    const float *epi_bias = bias && pointer_alignment(bias) >= BIAS_EPILOGUE_MIN_ALIGN ? bias : NULL;
    // out^T (OC,N) = op(weight: col-major IC x OC, transposed) @ inp^T (col-major IC x N)
    int rc = gemm(GEMM_FORWARD, 1, 0, OC, N, IC, weight, IC, inp, IC, out, OC, 0.0f, epi_bias);
    if (rc == 1) {  // no algorithm with the bias epilogue for this shape: plain GEMM, then the bias kernel
        epi_bias = NULL;
        rc = gemm(GEMM_FORWARD, 1, 0, OC, N, IC, weight, IC, inp, IC, out, OC, 0.0f, NULL);
    }
    if (rc == 0 && bias && !epi_bias) {
        size_t total = (size_t)N * OC;
        add_bias_kernel<<<ceil_div_u(total, 256), 256, 0, sl_cuda_stream()>>>(out, bias, total, OC);
        CUDA_LAUNCH_CHECK();
    }
}

void cuda_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0 || IC <= 0) {
        // Nothing accumulates from an empty product; dinp (N,IC) with OC == 0 is all zeros.
        if (dinp && N > 0 && IC > 0)
            CUDA_CHECK(cudaMemsetAsync(dinp, 0, sizeof(float) * (size_t)N * IC, sl_cuda_stream()));
        return;
    }
    // dinp^T (IC,N) = weight^T (col-major IC x OC) @ dout^T (col-major OC x N)
    if (dinp) gemm(GEMM_DINP, 0, 0, IC, N, OC, weight, IC, dout, OC, dinp, IC, 0.0f, NULL);
    // dweight^T (IC,OC) += inp^T (col-major IC x N) @ op(dout^T: col-major OC x N, transposed)
    if (dweight) gemm(GEMM_DWEIGHT, 0, 1, IC, OC, N, inp, IC, dout, OC, dweight, IC, 1.0f, NULL);
    if (dbias) bias_grad_accumulate(dbias, dout, N, OC);
}
