// test_ops_cuda.c: every op of the CUDA ops table (sl_ops_cuda) against the CPU table (sl_ops_cpu) on
// the same inputs, on one GPU (tests/gpu/run.sh compiles and runs it; `make test-gpu`). Not part of
// `make test`: it needs a GPU.
//
// For each case the inputs are random with fixed seeds. Every buffer an op writes, overwritten or
// accumulated (+=), starts from the same random values on both sides, so a wrong = / += shows. The
// CPU runs once; the CUDA op runs twice from identical starting state (uploaded through the table's
// upload, read back through download).
//   * error of a tensor = max_i |cuda_i - cpu_i| / max_i |cpu_i| (denominator floored at 1e-30; a NaN
//     or Inf where the other side has a finite value is an infinite error): must be <= 1e-5;
//   * the optimizer passes (adam_step, sgd_step), scale, add and round_to must give the CPU's exact bits;
//     nonfinite the same answer; sumsq (double, a different summation tree) within 1e-9 relative;
//   * determinism: the two CUDA runs must give identical bits (tensors and returned values).
// Shapes mix small odd ones (not multiples of 32 or 64, unaligned pointers, T = 1) with GPT-2 124M
// ones (C 768, NH 12, HD 64, T 1024, B 1); the norms also C = 5, 771, 1024, 4096 and N = 1, 1003,
// 4099 (NORM_SHAPES), and their backward once more on the split kernels (SHARDLM_FUSED_KERNELS=0). Also: every table entry is filled, an impossible
// allocation fails with a message and leaves the backend usable, and cuda_synchronize returns 0.
// Fused ops: matmul_gelu (cuBLASLt GELU_AUX epilogue where OC % 8 == 0, the unfused fallback where
// not) and residual + layernorm / rmsnorm against the CPU at 1e-5; on the GPU the fused residual +
// norm must equal residual_forward + the norm bit for bit, and crossentropy_fused (against the CPU's
// forward + backward at 1e-5) must equal the GPU's crossentropy_forward + crossentropy_backward bit for bit. 16-bit compute types: with
// set_precision(bf16 / fp16) the GEMMs run as CUBLAS_COMPUTE_32F_FAST_16BF / _16F; on inputs already
// rounded to that format they must stay within BF16_TOL (1e-2) of the CPU's fp32 GEMM on the same
// inputs (exact 16-bit products, fp32 accumulation: expect ~1e-6; the bound is the format's).
// bf16 activation storage (group "bf16"): sl_ops_cuda_bf16 (sl_ops_for_precision's table for bf16 on
// the GPU, ops.h act_bf16 = 1) against sl_ops_cpu_bf16 (the CPU emulation: widen, the fp32 CPU op,
// round) on the same bf16-storage inputs, every storage-typed op (ops.h lists which arguments are
// bf16 storage and which stay fp32). A bf16 tensor's error is taken on both sides widened to float,
// as above; the limit is BF16_STORAGE_TOL (2e-2): outputs are rounded to bf16 (one ulp is 2^-8 ~
// 3.9e-3 relative), and the GPU's and the CPU's fp32 values before that rounding differ by summation
// order, so an element may land one bf16 ulp apart (fused GEMM epilogues and unfused fallbacks round
// intermediates at different points too); fp32 parameter gradients and statistics computed from the
// same bf16 inputs, or from bf16-rounded intermediates, may differ slightly as well. Determinism
// (identical bytes from two CUDA runs) holds for bf16 and fp32 buffers alike.
// Prints "PASS name (max rel err X)" / "FAIL name: why" and ends with "N passed, N failed"; the exit
// status is non-zero on any failure. With no usable GPU it prints one SKIP line and exits 0.
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardlm/error.h"
#include "shardlm/ops.h"
#include "shardlm/rope.h"
#include "shardlm/optim.h"
#include "shardlm/settings.h"
#include "ops/cuda/attention_grid.h"
#include "ops/cuda/cuda_ops.h"

// A host fp32 array handed to the CPU table as activation storage (fp32 there).
#define ACT(p)                                                   \
    _Generic((p), float *: (sl_act *)(void *)(p),                \
             const float *: (const sl_act *)(const void *)(p),   \
             void *: (sl_act *)(p), const void *: (const sl_act *)(p))
#include "shardlm/precision.h"
#include "shardlm/rng.h"

#define REL_TOL 1e-5
// cuBLASLt's DGELU epilogue (matmul_backward_gelu, fp32) evaluates GELU's derivative with its own tanh:
// on an H100 (2026-11-27) 1.1e-5 from the CPU at GPT-2's c_proj shape, the fp32 GEMM alone 1.8e-6.
#define DGELU_TOL 3e-5
#define BF16_TOL 1e-2
#define SUMSQ_TOL 1e-9
#define BF16_STORAGE_TOL 2e-2   // the "bf16" group (see the top comment)
#define MAXBUF 12

// The tables compared; the "bf16" group swaps in their act_bf16 twins for its cases (see main).
static const sl_ops *gpu;
static const sl_ops *cpu = &sl_ops_cpu;
static sl_rng rng;
static int passed, failed;

// ---- host helpers -------------------------------------------------------------------------------

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) { fprintf(stderr, "out of host memory (%zu bytes)\n", bytes); exit(2); }
    return p;
}
static void *xdup(const void *src, size_t bytes) {
    void *p = xmalloc(bytes);
    memcpy(p, src, bytes);
    return p;
}
static float *frand(size_t n, float scale) {
    float *v = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) v[i] = scale * sl_rng_normal(&rng);
    return v;
}
static float *fpos(size_t n, float scale) {  // positive values (second moments)
    float *v = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) v[i] = scale * fabsf(sl_rng_normal(&rng));
    return v;
}
// Tokens / targets in [0, below); about `ignore_pct` percent are -1 (ignored targets).
static int *irand(size_t n, int below, int ignore_pct) {
    int *v = xmalloc(sizeof(int) * n);
    for (size_t i = 0; i < n; i++)
        v[i] = (int)sl_rng_below(&rng, 100) < ignore_pct ? -1 : (int)sl_rng_below(&rng, (uint64_t)below);
    return v;
}

static void pass(const char *name, double err) {
    printf("PASS %s (max rel err %.2e)\n", name, err);
    passed++;
}
static void fail(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(const char *name, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("FAIL %s: %s\n", name, why);
    failed++;
}

// max |got - want| / max |want| (see the top comment); *at = index of the worst element.
static double rel_err(const float *got, const float *want, size_t n, size_t *at) {
    double num = 0.0, den = 1e-30;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i], d;
        if (isnan(g) || isnan(w)) d = isnan(g) && isnan(w) ? 0.0 : INFINITY;
        else if (isinf(g) || isinf(w)) d = g == w ? 0.0 : INFINITY;
        else d = fabs(g - w);
        if (d > num) { num = d; *at = i; }
        if (isfinite(w) && fabs(w) > den) den = fabs(w);
    }
    return num / den;
}

// Element i of a host buffer of float (bf16 == 0) or bf16 storage, as a float and as its bits.
static float elem(const void *p, size_t i, int bf16) {
    return bf16 ? sl_bf16_to_f32(((const sl_bf16 *)p)[i]) : ((const float *)p)[i];
}
static uint32_t elem_bits(const void *p, size_t i, int bf16) {
    return bf16 ? ((const sl_bf16 *)p)[i] : ((const uint32_t *)p)[i];
}
// The index of the first element of size es where x and y (bytes long) differ.
static size_t first_diff(const void *x, const void *y, size_t bytes, size_t es) {
    const unsigned char *a = x, *b = y;
    size_t i = 0;
    while (i < bytes && a[i] == b[i]) i++;
    return i / es;
}
// n bf16 storage elements widened into a new float array.
static float *widen(const void *bf16, size_t n) {
    float *f = xmalloc(sizeof(float) * n);
    sl_bf16_to_f32_array(bf16, f, n);
    return f;
}

// ---- the case runner ----------------------------------------------------------------------------

// OUT buffers are compared after the op. BF16 marks bf16 storage (2-byte sl_bf16 elements, compared
// widened to float): BIN / BOUT / BINOUT.
enum { IN = 1, OUT = 2, INOUT = 3, BF16 = 4, BIN = IN | BF16, BOUT = OUT | BF16, BINOUT = INOUT | BF16 };
enum { CMP_REL = 0, CMP_BITS = 1 };

typedef struct {
    const char *name;
    const void *init;   // host contents uploaded before the op (NULL: the op gets a NULL pointer)
    size_t bytes;
    int role;           // IN / OUT / INOUT, | BF16 for bf16 storage
} tbuf;

// Every op's scalar arguments.
typedef struct {
    int B, T, C, N, IC, OC, NH, NKV, HD, I, V, Vp, pos0, n_ctx, precision, n_segs, off;
    size_t n;
    float eps, dloss, coef;
    sl_adam_args adam;
    sl_sgd_args sgd;
    const sl_segment *segs;   // host
} args;

// Runs the op on `ops` with buffers p[]; returns the op's scalar result (0 for void ops).
typedef double (*op_fn)(const sl_ops *ops, void **p, const args *a);

// Set while a case runs a GPU mode documented as not bit-reproducible (SHARDLM_ATTENTION_DQ=atomic):
// run_case then skips its two-runs-identical check (the comparison with the CPU still holds).
static int nondeterministic_mode;

// Runs `fn` on the CPU once and on the GPU twice, compares (mode, tol) and prints PASS / FAIL.
static void run_case(const char *name, op_fn fn, const args *a, const tbuf *b, int nb, int mode, double tol) {
    void *host[MAXBUF] = {0}, *res[2][MAXBUF] = {{0}};
    double cpu_value, gpu_value[2] = {0, 0};
    for (int i = 0; i < nb; i++) host[i] = b[i].init ? xdup(b[i].init, b[i].bytes) : NULL;
    cpu_value = fn(cpu, host, a);
    int broken = 0;
    for (int r = 0; r < 2 && !broken; r++) {
        void *dev[MAXBUF] = {0};
        for (int i = 0; i < nb && !broken; i++) {
            if (!b[i].init) continue;
            dev[i] = gpu->alloc(b[i].bytes, b[i].name);
            if (!dev[i]) { fail(name, "alloc %s: %s", b[i].name, sl_error()); broken = 1; break; }
            gpu->upload(dev[i], b[i].init, b[i].bytes);
        }
        if (!broken) gpu_value[r] = fn(gpu, dev, a);
        for (int i = 0; i < nb && !broken; i++) {
            if (!(b[i].role & OUT) || !dev[i]) continue;
            res[r][i] = xmalloc(b[i].bytes);
            gpu->download(res[r][i], dev[i], b[i].bytes);
        }
        if (!broken && gpu->synchronize()) { fail(name, "%s", sl_error()); broken = 1; }
        for (int i = 0; i < nb; i++) gpu->dealloc(dev[i]);
    }
    if (!broken) {
        double worst = 0.0;
        char why[512] = "";
        for (int i = 0; i < nb && !why[0]; i++) {
            if (!(b[i].role & OUT) || !host[i]) continue;
            const int bf = (b[i].role & BF16) != 0;
            const size_t es = bf ? sizeof(sl_bf16) : sizeof(float);
            const size_t n = b[i].bytes / es;
            size_t at = 0;
            if (mode == CMP_BITS) {
                if (memcmp(res[0][i], host[i], b[i].bytes)) {
                    at = first_diff(res[0][i], host[i], b[i].bytes, es);
                    snprintf(why, sizeof why, "%s differs from the CPU's bits at [%zu]: cuda %.9g (0x%08x), cpu %.9g (0x%08x)",
                             b[i].name, at, elem(res[0][i], at, bf), elem_bits(res[0][i], at, bf),
                             elem(host[i], at, bf), elem_bits(host[i], at, bf));
                }
            } else {
                float *got = bf ? widen(res[0][i], n) : res[0][i], *want = bf ? widen(host[i], n) : host[i];
                double e = rel_err(got, want, n, &at);
                if (e > worst) worst = e;
                if (!(e <= tol))
                    snprintf(why, sizeof why, "%s: rel err %.3e > %.0e (worst at [%zu]: cuda %.9g, cpu %.9g)", b[i].name, e,
                             tol, at, got[at], want[at]);
                if (bf) { free(got); free(want); }
            }
            if (!why[0] && !nondeterministic_mode && memcmp(res[0][i], res[1][i], b[i].bytes)) {
                at = first_diff(res[0][i], res[1][i], b[i].bytes, es);
                snprintf(why, sizeof why, "not deterministic: %s differs between two CUDA runs at [%zu] (%.9g vs %.9g)",
                         b[i].name, at, elem(res[0][i], at, bf), elem(res[1][i], at, bf));
            }
        }
        if (!why[0]) {
            double e = fabs(gpu_value[0] - cpu_value) / fmax(fabs(cpu_value), 1e-300);
            if (mode == CMP_BITS ? gpu_value[0] != cpu_value : !(e <= tol))
                snprintf(why, sizeof why, "returned %.17g, cpu %.17g (rel err %.3e)", gpu_value[0], cpu_value, e);
            else if (!nondeterministic_mode && memcmp(&gpu_value[0], &gpu_value[1], sizeof(double)))
                snprintf(why, sizeof why, "not deterministic: returned %.17g then %.17g", gpu_value[0], gpu_value[1]);
            else if (mode == CMP_REL && e > worst)
                worst = e;
        }
        if (why[0]) fail(name, "%s", why);
        else pass(name, worst);
    }
    for (int i = 0; i < nb; i++) { free(host[i]); free(res[0][i]); free(res[1][i]); }
}

#define F(n) ((n) * sizeof(float))
#define I(n) ((n) * sizeof(int))
#define RUN(name, fn, a, mode, tol, ...)                                                 \
    do {                                                                                 \
        const tbuf bufs_[] = {__VA_ARGS__};                                              \
        run_case(name, fn, a, bufs_, (int)(sizeof bufs_ / sizeof bufs_[0]), mode, tol); \
    } while (0)

// ---- op adapters: p[] in the op's argument order ------------------------------------------------

static double op_encoder_fwd(const sl_ops *o, void **p, const args *a) {
    o->encoder_forward(p[0], p[1], p[2], p[3], a->B, a->T, a->C);
    return 0;
}
static double op_encoder_bwd(const sl_ops *o, void **p, const args *a) {
    o->encoder_backward(p[0], p[1], p[2], p[3], a->B, a->T, a->C);
    return 0;
}
// Matmul buffers may be offset by a->off floats (unaligned pointers).
static void *at_off(void *p, const args *a) { return p ? (void *)((float *)p + a->off) : NULL; }
static double op_matmul_fwd(const sl_ops *o, void **p, const args *a) {
    o->matmul_forward(at_off(p[0], a), at_off(p[1], a), at_off(p[2], a), at_off(p[3], a), a->N, a->IC, a->OC);
    return 0;
}
static double op_matmul_bwd(const sl_ops *o, void **p, const args *a) {
    o->matmul_backward(at_off(p[0], a), at_off(p[1], a), at_off(p[2], a), at_off(p[3], a), at_off(p[4], a),
                       at_off(p[5], a), a->N, a->IC, a->OC);
    return 0;
}
// The GEMM ops under a->precision (set_precision before, fp32 again after; the CPU ignores it).
static double op_matmul_fwd_prec(const sl_ops *o, void **p, const args *a) {
    o->set_precision(a->precision);
    op_matmul_fwd(o, p, a);
    o->set_precision(SL_PRECISION_FP32);
    return 0;
}
static double op_matmul_bwd_prec(const sl_ops *o, void **p, const args *a) {
    o->set_precision(a->precision);
    op_matmul_bwd(o, p, a);
    o->set_precision(SL_PRECISION_FP32);
    return 0;
}
static double op_matmul_gelu_fwd(const sl_ops *o, void **p, const args *a) {
    o->set_precision(a->precision);
    o->matmul_gelu_forward(at_off(p[0], a), at_off(p[1], a), at_off(p[2], a), at_off(p[3], a), at_off(p[4], a), a->N,
                           a->IC, a->OC);
    o->set_precision(SL_PRECISION_FP32);
    return 0;
}
static double op_matmul_gelu_bwd(const sl_ops *o, void **p, const args *a) {
    o->set_precision(a->precision);
    o->matmul_gelu_backward(at_off(p[0], a), at_off(p[1], a), at_off(p[2], a), at_off(p[3], a), at_off(p[4], a),
                            at_off(p[5], a), at_off(p[6], a), a->N, a->IC, a->OC);
    o->set_precision(SL_PRECISION_FP32);
    return 0;
}
static double op_matmul_bwd_gelu(const sl_ops *o, void **p, const args *a) {
    o->set_precision(a->precision);
    o->matmul_backward_gelu(at_off(p[0], a), at_off(p[1], a), at_off(p[2], a), at_off(p[3], a), at_off(p[4], a),
                            at_off(p[5], a), at_off(p[6], a), a->N, a->IC, a->OC);
    o->set_precision(SL_PRECISION_FP32);
    return 0;
}
// Fused residual + norm; a->off == 1 runs it in place (resid = a, as the model calls it: p[0] holds a).
static double op_residual_layernorm_fwd(const sl_ops *o, void **p, const args *a) {
    o->residual_layernorm_forward(p[0], p[1], p[2], p[3], a->off ? p[0] : p[4], p[5], p[6], p[7], a->N, a->C, a->eps);
    return 0;
}
static double op_residual_rmsnorm_fwd(const sl_ops *o, void **p, const args *a) {
    o->residual_rmsnorm_forward(p[0], p[1], p[2], a->off ? p[0] : p[3], p[4], p[5], a->N, a->C, a->eps);
    return 0;
}
static double op_layernorm_fwd(const sl_ops *o, void **p, const args *a) {
    o->layernorm_forward(p[0], p[1], p[2], p[3], p[4], p[5], a->N, a->C, a->eps);
    return 0;
}
static double op_layernorm_bwd(const sl_ops *o, void **p, const args *a) {
    o->layernorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], a->N, a->C);
    return 0;
}
static double op_rmsnorm_fwd(const sl_ops *o, void **p, const args *a) {
    o->rmsnorm_forward(p[0], p[1], p[2], p[3], a->N, a->C, a->eps);
    return 0;
}
static double op_rmsnorm_bwd(const sl_ops *o, void **p, const args *a) {
    o->rmsnorm_backward(p[0], p[1], p[2], p[3], p[4], p[5], a->N, a->C);
    return 0;
}
static double op_residual(const sl_ops *o, void **p, const args *a) {
    o->residual_forward(p[0], p[1], p[2], a->n);
    return 0;
}
static double op_gelu_fwd(const sl_ops *o, void **p, const args *a) {
    o->gelu_forward(p[0], p[1], a->n);
    return 0;
}
static double op_gelu_bwd(const sl_ops *o, void **p, const args *a) {
    o->gelu_backward(p[0], p[1], p[2], a->n);
    return 0;
}
static double op_swiglu_fwd(const sl_ops *o, void **p, const args *a) {
    o->swiglu_forward(p[0], p[1], a->N, a->I);
    return 0;
}
static double op_swiglu_bwd(const sl_ops *o, void **p, const args *a) {
    o->swiglu_backward(p[0], p[1], p[2], a->N, a->I);
    return 0;
}
static double op_rope_fwd(const sl_ops *o, void **p, const args *a) {
    o->rope_forward(p[0], p[1], p[2], a->B, a->T, a->NH, a->NKV, a->HD, a->pos0);
    return 0;
}
static double op_rope_bwd(const sl_ops *o, void **p, const args *a) {
    o->rope_backward(p[0], p[1], p[2], a->B, a->T, a->NH, a->NKV, a->HD);
    return 0;
}
static double op_attention_fwd(const sl_ops *o, void **p, const args *a) {
    o->attention_forward(p[0], p[1], p[2], a->B, a->T, a->NH, a->NKV, a->HD, 0);
    return 0;
}
static double op_attention_bwd(const sl_ops *o, void **p, const args *a) {
    o->attention_backward(p[0], p[1], p[2], p[3], p[4], a->B, a->T, a->NH, a->NKV, a->HD, 0);
    return 0;
}
static double op_attention_decode(const sl_ops *o, void **p, const args *a) {
    o->attention_decode(p[0], p[1], p[2], p[3], a->n_ctx, a->NH, a->NKV, a->HD);
    return 0;
}
static double op_ce_fwd(const sl_ops *o, void **p, const args *a) {
    return o->crossentropy_forward(p[0], p[1], p[2], a->N, a->V, a->Vp);
}
static double op_ce_bwd(const sl_ops *o, void **p, const args *a) {
    o->crossentropy_backward(p[0], p[1], p[2], a->N, a->V, a->Vp, a->dloss);
    return 0;
}
static double op_ce_fused(const sl_ops *o, void **p, const args *a) {
    return o->crossentropy_fused(p[0], p[1], p[2], a->N, a->V, a->Vp, a->dloss);
}
static double op_sumsq(const sl_ops *o, void **p, const args *a) { return o->sumsq(p[0], a->n); }
static double op_scale(const sl_ops *o, void **p, const args *a) {
    o->scale(p[0], a->n, a->coef);
    return 0;
}
static double op_add(const sl_ops *o, void **p, const args *a) {
    o->add(p[0], p[1], a->n);
    return 0;
}
static double op_nonfinite(const sl_ops *o, void **p, const args *a) { return o->nonfinite(p[0], a->n); }
static double op_round_to(const sl_ops *o, void **p, const args *a) {
    o->round_to(p[0], a->n, a->precision);
    return 0;
}
static double op_adam(const sl_ops *o, void **p, const args *a) {
    sl_adam_args A = a->adam;
    A.storage_bf16 = p[4];  // the bf16 weight copy written in the pass (NULL: none)
    o->adam_step(&A, p[0], p[1], p[2], p[3], a->segs, a->n_segs);
    return 0;
}
static double op_sgd(const sl_ops *o, void **p, const args *a) {
    o->sgd_step(&a->sgd, p[0], p[1], p[2], a->segs, a->n_segs);
    return 0;
}

// ---- cases --------------------------------------------------------------------------------------

static void test_encoder(const char *tag, int B, int T, int C, int V, int with_wpe) {
    char name[128];
    args a = {.B = B, .T = T, .C = C};
    size_t N = (size_t)B * T;
    int *tok = irand(N, V, 0);
    for (size_t i = 1; i < N; i += 3) tok[i] = tok[0];  // repeated tokens: += into the same dwte row
    float *wte = frand((size_t)V * C, 0.02f), *wpe = with_wpe ? frand((size_t)T * C, 0.01f) : NULL;
    float *out = frand(N * C, 1.0f), *dout = frand(N * C, 1.0f);
    float *dwte = frand((size_t)V * C, 1.0f), *dwpe = with_wpe ? frand((size_t)T * C, 1.0f) : NULL;
    snprintf(name, sizeof name, "encoder_forward_%s", tag);
    RUN(name, op_encoder_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(N * C), OUT}, {"inp", tok, I(N), IN},
        {"wte", wte, F((size_t)V * C), IN}, {"wpe", wpe, with_wpe ? F((size_t)T * C) : 0, IN});
    snprintf(name, sizeof name, "encoder_backward_%s", tag);
    RUN(name, op_encoder_bwd, &a, CMP_REL, REL_TOL, {"dwte", dwte, F((size_t)V * C), INOUT},
        {"dwpe", dwpe, with_wpe ? F((size_t)T * C) : 0, INOUT}, {"dout", dout, F(N * C), IN}, {"inp", tok, I(N), IN});
    free(tok); free(wte); free(wpe); free(out); free(dout); free(dwte); free(dwpe);
}

static void test_matmul(const char *tag, int N, int IC, int OC, int with_bias, int off) {
    char name[128];
    args a = {.N = N, .IC = IC, .OC = OC, .off = off};
    size_t nin = (size_t)N * IC + off, nw = (size_t)OC * IC + off, nout = (size_t)N * OC + off, nb = (size_t)OC + off;
    float *inp = frand(nin, 1.0f), *w = frand(nw, 0.05f), *bias = with_bias ? frand(nb, 0.1f) : NULL;
    float *out = frand(nout, 1.0f), *dout = frand(nout, 1.0f), *dinp = frand(nin, 1.0f);
    float *dw = frand(nw, 1.0f), *db = with_bias ? frand(nb, 1.0f) : NULL;
    snprintf(name, sizeof name, "matmul_forward_%s", tag);
    RUN(name, op_matmul_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(nout), OUT}, {"inp", inp, F(nin), IN},
        {"weight", w, F(nw), IN}, {"bias", bias, with_bias ? F(nb) : 0, IN});
    snprintf(name, sizeof name, "matmul_backward_%s", tag);
    RUN(name, op_matmul_bwd, &a, CMP_REL, REL_TOL, {"dinp", dinp, F(nin), OUT}, {"dweight", dw, F(nw), INOUT},
        {"dbias", db, with_bias ? F(nb) : 0, INOUT}, {"dout", dout, F(nout), IN}, {"inp", inp, F(nin), IN},
        {"weight", w, F(nw), IN});
    snprintf(name, sizeof name, "matmul_backward_no_dinp_%s", tag);
    RUN(name, op_matmul_bwd, &a, CMP_REL, REL_TOL, {"dinp", NULL, 0, OUT}, {"dweight", dw, F(nw), INOUT},
        {"dbias", db, with_bias ? F(nb) : 0, INOUT}, {"dout", dout, F(nout), IN}, {"inp", inp, F(nin), IN},
        {"weight", w, F(nw), IN});
    free(inp); free(w); free(bias); free(out); free(dout); free(dinp); free(dw); free(db);
}

// matmul_gelu_forward / backward (OC % 8 != 0 takes the unfused path, OC % 8 == 0 the epilogue).
static void test_matmul_gelu(const char *tag, int N, int IC, int OC, int with_bias, int off) {
    char name[128];
    args a = {.N = N, .IC = IC, .OC = OC, .off = off, .precision = SL_PRECISION_FP32};
    size_t nin = (size_t)N * IC + off, nw = (size_t)OC * IC + off, nout = (size_t)N * OC + off, nb = (size_t)OC + off;
    float *inp = frand(nin, 1.0f), *w = frand(nw, 0.05f), *bias = with_bias ? frand(nb, 0.1f) : NULL;
    float *out = frand(nout, 1.0f), *pre = frand(nout, 1.5f), *dout = frand(nout, 1.0f), *dinp = frand(nin, 1.0f);
    float *dw = frand(nw, 1.0f), *db = with_bias ? frand(nb, 1.0f) : NULL;
    snprintf(name, sizeof name, "matmul_gelu_forward_%s", tag);
    RUN(name, op_matmul_gelu_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(nout), OUT}, {"pre", pre, F(nout), OUT},
        {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN}, {"bias", bias, with_bias ? F(nb) : 0, IN});
    snprintf(name, sizeof name, "matmul_gelu_backward_%s", tag);
    RUN(name, op_matmul_gelu_bwd, &a, CMP_REL, REL_TOL, {"dinp", dinp, F(nin), OUT}, {"dweight", dw, F(nw), INOUT},
        {"dbias", db, with_bias ? F(nb) : 0, INOUT}, {"dout", dout, F(nout), INOUT}, {"pre", pre, F(nout), IN},
        {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN});
    snprintf(name, sizeof name, "matmul_gelu_backward_no_dinp_%s", tag);
    RUN(name, op_matmul_gelu_bwd, &a, CMP_REL, REL_TOL, {"dinp", NULL, 0, OUT}, {"dweight", dw, F(nw), INOUT},
        {"dbias", db, with_bias ? F(nb) : 0, INOUT}, {"dout", dout, F(nout), INOUT}, {"pre", pre, F(nout), IN},
        {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN});
    free(inp); free(w); free(bias); free(out); free(pre); free(dout); free(dinp); free(dw); free(db);
}

// matmul_backward_gelu (GPT-2's c_proj backward, dinp = d(pre)): IC % 8 == 0 with aligned dinp and pre
// takes the DGELU epilogue, otherwise the dinp GEMM then the GELU-gradient kernel. pre is the
// up-projection's pre-activation (N, IC); inp = gelu(pre) as the CPU computes it (what the model saves).
static void test_matmul_backward_gelu(const char *tag, int N, int IC, int OC, int with_bias, int off) {
    char name[128];
    args a = {.N = N, .IC = IC, .OC = OC, .off = off, .precision = SL_PRECISION_FP32};
    size_t nin = (size_t)N * IC + off, nw = (size_t)OC * IC + off, nout = (size_t)N * OC + off, nb = (size_t)OC + off;
    float *pre = frand(nin, 1.5f), *inp = frand(nin, 1.0f), *w = frand(nw, 0.05f), *dout = frand(nout, 1.0f);
    float *dinp = frand(nin, 1.0f), *dw = frand(nw, 1.0f), *db = with_bias ? frand(nb, 1.0f) : NULL;
    sl_ops_cpu.gelu_forward((sl_act *)inp, (const sl_act *)pre, nin);
    for (int no_dinp = 0; no_dinp < 2; no_dinp++) {  // with dinp, then the parameter gradients alone
        snprintf(name, sizeof name, "matmul_backward_gelu_%s%s", no_dinp ? "no_dinp_" : "", tag);
        RUN(name, op_matmul_bwd_gelu, &a, CMP_REL, DGELU_TOL, {"dinp", no_dinp ? NULL : dinp, no_dinp ? 0 : F(nin), OUT},
            {"dweight", dw, F(nw), INOUT}, {"dbias", db, with_bias ? F(nb) : 0, INOUT}, {"dout", dout, F(nout), IN},
            {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN}, {"pre", pre, F(nin), IN});
    }
    free(pre); free(inp); free(w); free(dout); free(dinp); free(dw); free(db);
}

// x[i] rounded to the 16-bit format of `precision` (the engine's rounding of what the GEMMs read).
static void round_host(float *x, size_t n, int precision) {
    if (x) sl_ops_cpu.round_to(x, n, precision);
}

// The GEMMs under set_precision(bf16 / fp16) on inputs already rounded to that format, against the
// CPU's fp32 GEMMs on the same inputs, within BF16_TOL.
static void test_matmul_16bit(const char *tag, int precision, int N, int IC, int OC) {
    char name[160];
    const char *pname = precision == SL_PRECISION_BF16 ? "bf16" : "fp16";
    args a = {.N = N, .IC = IC, .OC = OC, .precision = precision};
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    float *inp = frand(nin, 1.0f), *w = frand(nw, 0.05f), *bias = frand(OC, 0.1f), *out = frand(nout, 1.0f);
    float *pre = frand(nout, 1.0f), *dout = frand(nout, 1.0f), *dinp = frand(nin, 1.0f), *dw = frand(nw, 1.0f);
    float *db = frand(OC, 1.0f);
    round_host(inp, nin, precision); round_host(w, nw, precision); round_host(bias, OC, precision);
    round_host(dout, nout, precision); round_host(pre, nout, precision);
    snprintf(name, sizeof name, "matmul_forward_%s_compute_%s", pname, tag);
    RUN(name, op_matmul_fwd_prec, &a, CMP_REL, BF16_TOL, {"out", out, F(nout), OUT}, {"inp", inp, F(nin), IN},
        {"weight", w, F(nw), IN}, {"bias", bias, F(OC), IN});
    snprintf(name, sizeof name, "matmul_backward_%s_compute_%s", pname, tag);
    RUN(name, op_matmul_bwd_prec, &a, CMP_REL, BF16_TOL, {"dinp", dinp, F(nin), OUT}, {"dweight", dw, F(nw), INOUT},
        {"dbias", db, F(OC), INOUT}, {"dout", dout, F(nout), IN}, {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN});
    snprintf(name, sizeof name, "matmul_gelu_forward_%s_compute_%s", pname, tag);
    RUN(name, op_matmul_gelu_fwd, &a, CMP_REL, BF16_TOL, {"out", out, F(nout), OUT}, {"pre", pre, F(nout), OUT},
        {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN}, {"bias", bias, F(OC), IN});
    // the DGELU GEMM with this shape read as a c_proj: dinp (N, IC) = d(pre) for pre = inp
    snprintf(name, sizeof name, "matmul_backward_gelu_%s_compute_%s", pname, tag);
    RUN(name, op_matmul_bwd_gelu, &a, CMP_REL, BF16_TOL, {"dinp", dinp, F(nin), OUT}, {"dweight", dw, F(nw), INOUT},
        {"dbias", db, F(OC), INOUT}, {"dout", dout, F(nout), IN}, {"inp", inp, F(nin), IN}, {"weight", w, F(nw), IN},
        {"pre", inp, F(nin), IN});
    free(inp); free(w); free(bias); free(out); free(pre); free(dout); free(dinp); free(dw); free(db);
}

// Fused residual + layernorm / rmsnorm against the CPU, out of place and in place (resid = a).
static void test_residual_norms(const char *tag, int N, int C) {
    char name[128];
    size_t n = (size_t)N * C;
    float *x = frand(n, 1.0f), *y = frand(n, 1.0f), *w = frand(C, 1.0f), *b = frand(C, 0.1f);
    float *resid = frand(n, 1.0f), *out = frand(n, 1.0f), *mean = frand(N, 1.0f), *rstd = frand(N, 1.0f);
    for (size_t i = 0; i < n; i++) x[i] += 0.5f;  // a non-zero mean
    for (int in_place = 0; in_place < 2; in_place++) {
        args a = {.N = N, .C = C, .eps = 1e-5f, .off = in_place};
        const char *how = in_place ? "in_place" : "out_of_place";
        snprintf(name, sizeof name, "residual_layernorm_forward_%s_%s", how, tag);
        float *r = in_place ? x : resid;  // in place: resid starts as a
        int r_role = in_place ? INOUT : OUT;
        RUN(name, op_residual_layernorm_fwd, &a, CMP_REL, REL_TOL, {"resid", r, F(n), r_role}, {"out", out, F(n), OUT},
            {"mean", mean, F(N), OUT}, {"rstd", rstd, F(N), OUT}, {"a", x, F(n), IN}, {"b", y, F(n), IN},
            {"w", w, F(C), IN}, {"bias", b, F(C), IN});
        a.eps = 1e-6f;
        snprintf(name, sizeof name, "residual_rmsnorm_forward_%s_%s", how, tag);
        RUN(name, op_residual_rmsnorm_fwd, &a, CMP_REL, REL_TOL, {"resid", r, F(n), r_role}, {"out", out, F(n), OUT},
            {"rstd", rstd, F(N), OUT}, {"a", x, F(n), IN}, {"b", y, F(n), IN}, {"w", w, F(C), IN});
    }
    free(x); free(y); free(w); free(b); free(resid); free(out); free(mean); free(rstd);
}

static void *to_bf16(float *f, size_t n);

// On the GPU, the fused residual + norm (in place, as the model calls it) gives the bits of
// residual_forward followed by the norm: resid, out, mean (layernorm) and rstd. b_shift 1: b starts one
// element into its buffer, not 16-byte aligned (an fp32 arena can place buffers at 8 mod 16): the fused
// call then reads its rows element by element and the separate norm (all pointers aligned) in vectors,
// the same columns in the same order. Buffers of the table's storage type (bf16 in the bf16 group).
static void test_residual_norm_fusion_exact(const char *tag, int N, int C, int b_shift) {
    const int bf16 = gpu->act_bf16 != 0;
    const size_t es = bf16 ? sizeof(sl_bf16) : sizeof(float), n = (size_t)N * C;
    const size_t sizes[8] = {es * n, es * (n + 1), es * C, es * C, es * n, es * n, F(N), F(N)};
    const size_t counts[4] = {n, n + 1, (size_t)C, (size_t)C};
    const float scales[4] = {1.0f, 1.0f, 1.0f, 0.1f};
    void *host[4];  // x (a), y (b, one element longer), w, bias in the storage type
    for (int i = 0; i < 4; i++) {
        float *f = frand(counts[i], scales[i]);
        host[i] = bf16 ? to_bf16(f, counts[i]) : f;
    }
    for (int rms = 0; rms < 2; rms++) {
        char name[160];
        snprintf(name, sizeof name, "residual_%s_fused_equals_unfused_bits_%s%s%s", rms ? "rmsnorm" : "layernorm",
                 bf16 ? "bf16_storage_" : "", tag, b_shift ? "_b_unaligned" : "");
        // per side (0: separate ops, 1: fused): x (a, and resid of the fused side), y (b), w, bias,
        // resid (separate side), out, mean, rstd
        void *d[2][8] = {{0}};
        void *h[2][4];
        int ok = 1;
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 8; i++) ok = ok && (d[k][i] = gpu->alloc(sizes[i], "fusion test buffer"));
        if (!ok) fail(name, "alloc: %s", sl_error());
        for (int k = 0; k < 2 && ok; k++) {
            void **b = d[k];
            for (int i = 0; i < 4; i++) gpu->upload(b[i], host[i], sizes[i]);
            void *yb = (char *)b[1] + (size_t)b_shift * es;
            if (k == 0) {
                gpu->residual_forward(b[4], b[0], yb, n);
                if (rms) gpu->rmsnorm_forward(b[5], b[7], b[4], b[2], N, C, 1e-6f);
                else gpu->layernorm_forward(b[5], b[6], b[7], b[4], b[2], b[3], N, C, 1e-5f);
            } else if (rms) {
                gpu->residual_rmsnorm_forward(b[0], b[5], b[7], b[0], yb, b[2], N, C, 1e-6f);
            } else {
                gpu->residual_layernorm_forward(b[0], b[5], b[6], b[7], b[0], yb, b[2], b[3], N, C, 1e-5f);
            }
            void *src[4] = {k == 0 ? b[4] : b[0], b[5], b[6], b[7]};
            for (int j = 0; j < 4; j++) {
                h[k][j] = xmalloc(sizes[4 + j]);
                gpu->download(h[k][j], src[j], sizes[4 + j]);
            }
        }
        if (ok && gpu->synchronize()) { fail(name, "%s", sl_error()); ok = -1; }
        if (ok == 1) {
            int same = 1;
            for (int j = 0; j < 4; j++) same = same && !memcmp(h[0][j], h[1][j], sizes[4 + j]);
            if (same) pass(name, 0.0);
            else fail(name, "resid/out/mean/rstd of the fused kernel differ from residual_forward + the norm");
        }
        for (int k = 0; k < 2 && ok; k++)
            for (int j = 0; j < 4; j++) free(h[k][j]);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 8; i++) gpu->dealloc(d[k][i]);
    }
    for (int i = 0; i < 4; i++) free(host[i]);
}

static void test_norms(const char *tag, int N, int C) {
    char name[128];
    args a = {.N = N, .C = C, .eps = 1e-5f};
    size_t n = (size_t)N * C;
    float *inp = frand(n, 1.0f), *w = frand(C, 1.0f), *b = frand(C, 0.1f), *out = frand(n, 1.0f);
    float *mean = frand(N, 1.0f), *rstd = frand(N, 1.0f), *dout = frand(n, 1.0f);
    float *dinp = frand(n, 1.0f), *dw = frand(C, 1.0f), *db = frand(C, 1.0f);
    for (size_t i = 0; i < n; i++) inp[i] += 0.5f;  // a non-zero mean
    snprintf(name, sizeof name, "layernorm_forward_%s", tag);
    RUN(name, op_layernorm_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(n), OUT}, {"mean", mean, F(N), OUT},
        {"rstd", rstd, F(N), OUT}, {"inp", inp, F(n), IN}, {"w", w, F(C), IN}, {"b", b, F(C), IN});
    cpu->layernorm_forward(ACT(out), mean, rstd, ACT(inp), ACT(w), ACT(b), N, C, a.eps);  // the saved statistics backward reads
    snprintf(name, sizeof name, "layernorm_backward_%s", tag);
    RUN(name, op_layernorm_bwd, &a, CMP_REL, REL_TOL, {"dinp", dinp, F(n), INOUT}, {"dw", dw, F(C), INOUT},
        {"db", db, F(C), INOUT}, {"dout", dout, F(n), IN}, {"inp", inp, F(n), IN}, {"w", w, F(C), IN},
        {"mean", mean, F(N), IN}, {"rstd", rstd, F(N), IN});
    // frozen parameters (LoRA's base): dinp only, no parameter sums
    snprintf(name, sizeof name, "layernorm_backward_frozen_%s", tag);
    RUN(name, op_layernorm_bwd, &a, CMP_REL, REL_TOL, {"dinp", dinp, F(n), INOUT}, {"dw", NULL, 0, INOUT},
        {"db", NULL, 0, INOUT}, {"dout", dout, F(n), IN}, {"inp", inp, F(n), IN}, {"w", w, F(C), IN},
        {"mean", mean, F(N), IN}, {"rstd", rstd, F(N), IN});
    a.eps = 1e-6f;
    snprintf(name, sizeof name, "rmsnorm_forward_%s", tag);
    RUN(name, op_rmsnorm_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(n), OUT}, {"rstd", rstd, F(N), OUT},
        {"inp", inp, F(n), IN}, {"w", w, F(C), IN});
    cpu->rmsnorm_forward(ACT(out), rstd, ACT(inp), ACT(w), N, C, a.eps);
    snprintf(name, sizeof name, "rmsnorm_backward_%s", tag);
    RUN(name, op_rmsnorm_bwd, &a, CMP_REL, REL_TOL, {"dinp", dinp, F(n), INOUT}, {"dw", dw, F(C), INOUT},
        {"dout", dout, F(n), IN}, {"inp", inp, F(n), IN}, {"w", w, F(C), IN}, {"rstd", rstd, F(N), IN});
    free(inp); free(w); free(b); free(out); free(mean); free(rstd); free(dout); free(dinp); free(dw); free(db);
}

static void test_elementwise(const char *tag, size_t n, int N, int I) {
    char name[128];
    args a = {.n = n, .N = N, .I = I};
    float *x = frand(n, 1.5f), *y = frand(n, 1.0f), *out = frand(n, 1.0f), *dout = frand(n, 1.0f);
    float *dinp = frand(n, 1.0f);
    snprintf(name, sizeof name, "residual_forward_%s", tag);
    RUN(name, op_residual, &a, CMP_REL, REL_TOL, {"out", out, F(n), OUT}, {"a", x, F(n), IN}, {"b", y, F(n), IN});
    snprintf(name, sizeof name, "gelu_forward_%s", tag);
    RUN(name, op_gelu_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(n), OUT}, {"inp", x, F(n), IN});
    snprintf(name, sizeof name, "gelu_backward_%s", tag);
    RUN(name, op_gelu_bwd, &a, CMP_REL, REL_TOL, {"dinp", dinp, F(n), OUT}, {"inp", x, F(n), IN},
        {"dout", dout, F(n), IN});
    size_t ni = (size_t)N * I;
    float *sin_ = frand(2 * ni, 1.5f), *sout = frand(ni, 1.0f), *sdout = frand(ni, 1.0f), *sdinp = frand(2 * ni, 1.0f);
    snprintf(name, sizeof name, "swiglu_forward_%s", tag);
    RUN(name, op_swiglu_fwd, &a, CMP_REL, REL_TOL, {"out", sout, F(ni), OUT}, {"inp", sin_, F(2 * ni), IN});
    snprintf(name, sizeof name, "swiglu_backward_%s", tag);
    RUN(name, op_swiglu_bwd, &a, CMP_REL, REL_TOL, {"dinp", sdinp, F(2 * ni), OUT}, {"inp", sin_, F(2 * ni), IN},
        {"dout", sdout, F(ni), IN});
    free(x); free(y); free(out); free(dout); free(dinp); free(sin_); free(sout); free(sdout); free(sdinp);
}

// LoRA's column slices (N rows, W columns at col0 = a->pos0 of a width a->IC output, scale a->coef)
// and dropout (p = a->eps, a fixed seed): the same expressions as the CPU's, so the same bits.
static double op_add_columns(const sl_ops *o, void **p, const args *a) {
    o->add_columns(p[0], p[1], a->coef, a->N, a->OC, a->IC, a->pos0);
    return 0;
}
static double op_take_columns(const sl_ops *o, void **p, const args *a) {
    o->take_columns(p[0], p[1], a->coef, a->N, a->OC, a->IC, a->pos0);
    return 0;
}
static double op_dropout_fwd(const sl_ops *o, void **p, const args *a) {
    o->dropout_forward(p[0], p[1], a->n, a->eps, 987654321u);
    return 0;
}
static double op_dropout_bwd(const sl_ops *o, void **p, const args *a) {
    o->dropout_backward(p[0], p[1], a->n, a->eps, 987654321u);
    return 0;
}

static void test_lora_ops(const char *tag, int N, int W, int ld, int col0) {
    char name[128];
    size_t nw = (size_t)N * W, nl = (size_t)N * ld;
    args a = {.N = N, .OC = W, .IC = ld, .pos0 = col0, .coef = 1.7f, .n = nl, .eps = 0.1f};
    float *x = frand(nw, 1.0f), *y = frand(nl, 1.0f), *z = frand(nw, 1.0f), *d = frand(nl, 1.0f);
    snprintf(name, sizeof name, "add_columns_%s", tag);
    RUN(name, op_add_columns, &a, CMP_BITS, 0, {"out", y, F(nl), INOUT}, {"inp", x, F(nw), IN});
    snprintf(name, sizeof name, "take_columns_%s", tag);
    RUN(name, op_take_columns, &a, CMP_BITS, 0, {"out", z, F(nw), OUT}, {"inp", y, F(nl), IN});
    snprintf(name, sizeof name, "dropout_forward_%s", tag);
    RUN(name, op_dropout_fwd, &a, CMP_BITS, 0, {"out", d, F(nl), OUT}, {"inp", y, F(nl), IN});
    snprintf(name, sizeof name, "dropout_backward_%s", tag);
    RUN(name, op_dropout_bwd, &a, CMP_BITS, 0, {"dinp", d, F(nl), OUT}, {"dout", y, F(nl), IN});
    free(x); free(y); free(z); free(d);
}

static void test_rope(const char *tag, int B, int T, int NH, int NKV, int HD, int pos0) {
    char name[128];
    args a = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .pos0 = pos0};
    int max_T = pos0 + T + 3;
    size_t n = (size_t)B * T * (NH + 2 * NKV) * HD, nt = (size_t)max_T * (HD / 2);
    float *cos_t = xmalloc(F(nt)), *sin_t = xmalloc(F(nt)), *qkv = frand(n, 1.0f);
    sl_rope_tables(cos_t, sin_t, max_T, HD, 10000.0f);
    snprintf(name, sizeof name, "rope_forward_%s_pos0_%d", tag, pos0);
    RUN(name, op_rope_fwd, &a, CMP_REL, REL_TOL, {"qkv", qkv, F(n), INOUT}, {"cos", cos_t, F(nt), IN},
        {"sin", sin_t, F(nt), IN});
    if (pos0 == 0) {
        snprintf(name, sizeof name, "rope_backward_%s", tag);
        RUN(name, op_rope_bwd, &a, CMP_REL, REL_TOL, {"dqkv", qkv, F(n), INOUT}, {"cos", cos_t, F(nt), IN},
            {"sin", sin_t, F(nt), IN});
    }
    free(cos_t); free(sin_t); free(qkv);
}

static void test_attention(const char *tag, int B, int T, int NH, int NKV, int HD) {
    char name[128];
    args a = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD};
    size_t N = (size_t)B * T, nqkv = N * (NH + 2 * NKV) * HD, nout = N * NH * HD, nlse = (size_t)B * NH * T;
    float *qkv = frand(nqkv, 1.0f), *out = frand(nout, 1.0f), *lse = frand(nlse, 1.0f);
    float *dout = frand(nout, 1.0f), *dqkv = frand(nqkv, 1.0f);
    snprintf(name, sizeof name, "attention_forward_%s", tag);
    RUN(name, op_attention_fwd, &a, CMP_REL, REL_TOL, {"out", out, F(nout), OUT}, {"lse", lse, F(nlse), OUT},
        {"qkv", qkv, F(nqkv), IN});
    cpu->attention_forward(ACT(out), lse, ACT(qkv), B, T, NH, NKV, HD, 0);  // what backward reads
    snprintf(name, sizeof name, "attention_backward_%s", tag);
    RUN(name, op_attention_bwd, &a, CMP_REL, REL_TOL, {"dqkv", dqkv, F(nqkv), OUT}, {"dout", dout, F(nout), IN},
        {"qkv", qkv, F(nqkv), IN}, {"out", out, F(nout), IN}, {"lse", lse, F(nlse), IN});
    free(qkv); free(out); free(lse); free(dout); free(dqkv);
}

static void test_decode(const char *tag, int n_ctx, int NH, int NKV, int HD) {
    char name[128];
    args a = {.n_ctx = n_ctx, .NH = NH, .NKV = NKV, .HD = HD};
    size_t nq = (size_t)NH * HD, nkv = (size_t)n_ctx * NKV * HD;
    float *out = frand(nq, 1.0f), *q = frand(nq, 1.0f), *k = frand(nkv, 1.0f), *v = frand(nkv, 1.0f);
    snprintf(name, sizeof name, "attention_decode_%s", tag);
    RUN(name, op_attention_decode, &a, CMP_REL, REL_TOL, {"out", out, F(nq), OUT}, {"q", q, F(nq), IN},
        {"k_cache", k, F(nkv), IN}, {"v_cache", v, F(nkv), IN});
    free(out); free(q); free(k); free(v);
}

// Cross-entropy's inputs: logits (N,Vp) whose padded columns are large (they must not count), lse (N),
// targets with about 20% ignored and one V - 1; returns the arguments (dloss = 1 / counted rows).
static args ce_inputs(int N, int V, int Vp, float **logits, float **lse, int **targets) {
    *logits = frand((size_t)N * Vp, 2.0f);
    *lse = frand(N, 1.0f);
    for (int r = 0; r < N; r++)
        for (int c = V; c < Vp; c++) (*logits)[(size_t)r * Vp + c] = 1e4f;
    int *t = *targets = irand(N, V, 20);
    t[0] = V - 1;
    int counted = 0;
    for (int r = 0; r < N; r++) counted += t[r] >= 0;
    return (args){.N = N, .V = V, .Vp = Vp, .dloss = 1.0f / (float)(counted ? counted : 1)};
}

static void test_crossentropy(const char *tag, int N, int V, int Vp) {
    char name[128];
    size_t n = (size_t)N * Vp;
    float *logits, *lse;
    int *targets;
    args a = ce_inputs(N, V, Vp, &logits, &lse, &targets);
    snprintf(name, sizeof name, "crossentropy_forward_%s", tag);
    RUN(name, op_ce_fwd, &a, CMP_REL, REL_TOL, {"lse", lse, F(N), OUT}, {"logits", logits, F(n), IN},
        {"targets", targets, I(N), IN});
    cpu->crossentropy_forward(lse, ACT(logits), targets, N, V, Vp);
    snprintf(name, sizeof name, "crossentropy_fused_%s", tag);
    RUN(name, op_ce_fused, &a, CMP_REL, REL_TOL, {"lse", lse, F(N), OUT}, {"logits", logits, F(n), INOUT},
        {"targets", targets, I(N), IN});
    snprintf(name, sizeof name, "crossentropy_backward_%s", tag);
    RUN(name, op_ce_bwd, &a, CMP_REL, REL_TOL, {"logits", logits, F(n), INOUT}, {"lse", lse, F(N), IN},
        {"targets", targets, I(N), IN});
    free(logits); free(lse); free(targets);
}

// ---- bf16 activation storage (group "bf16": cpu and gpu are the act_bf16 tables, see main) ----------
// Storage-typed arguments (ops.h) get bf16 host buffers (void *, H() bytes, roles BIN / BOUT / BINOUT);
// the rest stay fp32 (F(), IN / OUT / INOUT) as in the fp32 cases.

#define H(n) ((n) * sizeof(sl_bf16))

// f (n floats, freed) rounded into a new bf16 storage buffer.
static void *to_bf16(float *f, size_t n) {
    sl_bf16 *h = xmalloc(H(n));
    sl_f32_to_bf16_array(f, h, n);
    free(f);
    return h;
}
static void *brand(size_t n, float scale) { return to_bf16(frand(n, scale), n); }

// The bf16 group's case names, "<op>_bf16_storage_<tag>" (valid until the next call).
static const char *bname(const char *op, const char *tag) {
    static char name[160];
    snprintf(name, sizeof name, "%s_bf16_storage_%s", op, tag);
    return name;
}

// matmul and matmul_gelu forward / backward with a bias: weight and bias are bf16 (the model's shadow),
// dweight / dbias fp32 accumulating. matmul_gelu takes the epilogue where OC % 8 == 0, the fallback not.
static void test_bf16_matmul(const char *tag, int N, int IC, int OC) {
    args a = {.N = N, .IC = IC, .OC = OC, .precision = SL_PRECISION_BF16};
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    void *inp = brand(nin, 1.0f), *w = brand(nw, 0.05f), *bias = brand(OC, 0.1f), *out = brand(nout, 1.0f);
    void *pre = brand(nout, 1.5f), *dout = brand(nout, 1.0f), *dinp = brand(nin, 1.0f);
    float *dw = frand(nw, 1.0f), *db = frand(OC, 1.0f);
    RUN(bname("matmul_forward", tag), op_matmul_fwd_prec, &a, CMP_REL, BF16_STORAGE_TOL, {"out", out, H(nout), BOUT},
        {"inp", inp, H(nin), BIN}, {"weight", w, H(nw), BIN}, {"bias", bias, H(OC), BIN});
    RUN(bname("matmul_backward", tag), op_matmul_bwd_prec, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dinp", dinp, H(nin), BOUT}, {"dweight", dw, F(nw), INOUT}, {"dbias", db, F(OC), INOUT},
        {"dout", dout, H(nout), BIN}, {"inp", inp, H(nin), BIN}, {"weight", w, H(nw), BIN});
    RUN(bname("matmul_gelu_forward", tag), op_matmul_gelu_fwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"out", out, H(nout), BOUT}, {"pre", pre, H(nout), BOUT}, {"inp", inp, H(nin), BIN},
        {"weight", w, H(nw), BIN}, {"bias", bias, H(OC), BIN});
    RUN(bname("matmul_gelu_backward", tag), op_matmul_gelu_bwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dinp", dinp, H(nin), BOUT}, {"dweight", dw, F(nw), INOUT}, {"dbias", db, F(OC), INOUT},
        {"dout", dout, H(nout), BINOUT}, {"pre", pre, H(nout), BIN}, {"inp", inp, H(nin), BIN},
        {"weight", w, H(nw), BIN});
    // matmul_backward_gelu (the shape read as a c_proj, pre = inp): DGELU rounds d(pre) once, the
    // emulation (and the fallback where IC % 8 != 0) twice: within a bf16 step of each other
    RUN(bname("matmul_backward_gelu", tag), op_matmul_bwd_gelu, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dinp", dinp, H(nin), BOUT}, {"dweight", dw, F(nw), INOUT}, {"dbias", db, F(OC), INOUT},
        {"dout", dout, H(nout), BIN}, {"inp", inp, H(nin), BIN}, {"weight", w, H(nw), BIN},
        {"pre", inp, H(nin), BIN});
    free(inp); free(w); free(bias); free(out); free(pre); free(dout); free(dinp); free(dw); free(db);
}

// layernorm / rmsnorm forward and backward (dinp: bf16, accumulated into), and the fused residual
// norms out of place (resid = a + b stored as bf16); w and b bf16 (the parameters' shadow), their
// gradients and the statistics fp32.
static void test_bf16_norms(const char *tag, int N, int C) {
    args a = {.N = N, .C = C, .eps = 1e-5f};
    size_t n = (size_t)N * C;
    float *x = frand(n, 1.0f);
    for (size_t i = 0; i < n; i++) x[i] += 0.5f;  // a non-zero mean
    void *inp = to_bf16(x, n), *y = brand(n, 1.0f), *out = brand(n, 1.0f), *resid = brand(n, 1.0f);
    void *dout = brand(n, 1.0f), *dinp = brand(n, 1.0f);
    void *w = brand(C, 1.0f), *b = brand(C, 0.1f);  // the parameters' bf16 shadow
    float *mean = frand(N, 1.0f), *rstd = frand(N, 1.0f);
    float *dw = frand(C, 1.0f), *db = frand(C, 1.0f);
    RUN(bname("layernorm_forward", tag), op_layernorm_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"out", out, H(n), BOUT},
        {"mean", mean, F(N), OUT}, {"rstd", rstd, F(N), OUT}, {"inp", inp, H(n), BIN}, {"w", w, H(C), BIN},
        {"b", b, H(C), BIN});
    RUN(bname("residual_layernorm_forward", tag), op_residual_layernorm_fwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"resid", resid, H(n), BOUT}, {"out", out, H(n), BOUT}, {"mean", mean, F(N), OUT}, {"rstd", rstd, F(N), OUT},
        {"a", inp, H(n), BIN}, {"b", y, H(n), BIN}, {"w", w, H(C), BIN}, {"bias", b, H(C), BIN});
    cpu->layernorm_forward(ACT(out), mean, rstd, ACT(inp), ACT(w), ACT(b), N, C, a.eps);  // the statistics backward reads
    RUN(bname("layernorm_backward", tag), op_layernorm_bwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dinp", dinp, H(n), BINOUT}, {"dw", dw, F(C), INOUT}, {"db", db, F(C), INOUT}, {"dout", dout, H(n), BIN},
        {"inp", inp, H(n), BIN}, {"w", w, H(C), BIN}, {"mean", mean, F(N), IN}, {"rstd", rstd, F(N), IN});
    a.eps = 1e-6f;
    RUN(bname("rmsnorm_forward", tag), op_rmsnorm_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"out", out, H(n), BOUT},
        {"rstd", rstd, F(N), OUT}, {"inp", inp, H(n), BIN}, {"w", w, H(C), BIN});
    RUN(bname("residual_rmsnorm_forward", tag), op_residual_rmsnorm_fwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"resid", resid, H(n), BOUT}, {"out", out, H(n), BOUT}, {"rstd", rstd, F(N), OUT}, {"a", inp, H(n), BIN},
        {"b", y, H(n), BIN}, {"w", w, H(C), BIN});
    cpu->rmsnorm_forward(ACT(out), rstd, ACT(inp), ACT(w), N, C, a.eps);
    RUN(bname("rmsnorm_backward", tag), op_rmsnorm_bwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dinp", dinp, H(n), BINOUT}, {"dw", dw, F(C), INOUT}, {"dout", dout, H(n), BIN}, {"inp", inp, H(n), BIN},
        {"w", w, H(C), BIN}, {"rstd", rstd, F(N), IN});
    free(inp); free(y); free(out); free(resid); free(dout); free(dinp);
    free(w); free(b); free(mean); free(rstd); free(dw); free(db);
}

// residual_forward, gelu and swiglu forward / backward: every buffer bf16.
static void test_bf16_elementwise(const char *tag, size_t n, int N, int I) {
    args a = {.n = n, .N = N, .I = I};
    size_t ni = (size_t)N * I;
    void *x = brand(n, 1.5f), *y = brand(n, 1.0f), *out = brand(n, 1.0f), *dout = brand(n, 1.0f);
    void *dinp = brand(n, 1.0f), *sin_ = brand(2 * ni, 1.5f), *sout = brand(ni, 1.0f), *sdout = brand(ni, 1.0f);
    void *sdinp = brand(2 * ni, 1.0f);
    RUN(bname("residual_forward", tag), op_residual, &a, CMP_REL, BF16_STORAGE_TOL, {"out", out, H(n), BOUT},
        {"a", x, H(n), BIN}, {"b", y, H(n), BIN});
    RUN(bname("gelu_forward", tag), op_gelu_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"out", out, H(n), BOUT},
        {"inp", x, H(n), BIN});
    RUN(bname("gelu_backward", tag), op_gelu_bwd, &a, CMP_REL, BF16_STORAGE_TOL, {"dinp", dinp, H(n), BOUT},
        {"inp", x, H(n), BIN}, {"dout", dout, H(n), BIN});
    RUN(bname("swiglu_forward", tag), op_swiglu_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"out", sout, H(ni), BOUT},
        {"inp", sin_, H(2 * ni), BIN});
    RUN(bname("swiglu_backward", tag), op_swiglu_bwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dinp", sdinp, H(2 * ni), BOUT}, {"inp", sin_, H(2 * ni), BIN}, {"dout", sdout, H(ni), BIN});
    free(x); free(y); free(out); free(dout); free(dinp); free(sin_); free(sout); free(sdout); free(sdinp);
}

// rope forward (pos0 > 0) / backward in place on bf16 qkv; the cos / sin tables fp32.
static void test_bf16_rope(const char *tag, int B, int T, int NH, int NKV, int HD, int pos0) {
    args a = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .pos0 = pos0};
    int max_T = pos0 + T + 3;
    size_t n = (size_t)B * T * (NH + 2 * NKV) * HD, nt = (size_t)max_T * (HD / 2);
    float *cos_t = xmalloc(F(nt)), *sin_t = xmalloc(F(nt));
    void *qkv = brand(n, 1.0f);
    sl_rope_tables(cos_t, sin_t, max_T, HD, 10000.0f);
    RUN(bname("rope_forward", tag), op_rope_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"qkv", qkv, H(n), BINOUT},
        {"cos", cos_t, F(nt), IN}, {"sin", sin_t, F(nt), IN});
    RUN(bname("rope_backward", tag), op_rope_bwd, &a, CMP_REL, BF16_STORAGE_TOL, {"dqkv", qkv, H(n), BINOUT},
        {"cos", cos_t, F(nt), IN}, {"sin", sin_t, F(nt), IN});
    free(cos_t); free(sin_t); free(qkv);
}

// attention forward / backward (qkv, out, dout, dqkv bf16; lse fp32), and attention_decode of one
// query against a bf16 KV cache of T positions.
static void test_bf16_attention(const char *tag, int B, int T, int NH, int NKV, int HD) {
    args a = {.B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .n_ctx = T};
    size_t N = (size_t)B * T, nqkv = N * (NH + 2 * NKV) * HD, nout = N * NH * HD, nlse = (size_t)B * NH * T;
    size_t nq = (size_t)NH * HD, nkv = (size_t)T * NKV * HD;
    void *qkv = brand(nqkv, 1.0f), *out = brand(nout, 1.0f), *dout = brand(nout, 1.0f), *dqkv = brand(nqkv, 1.0f);
    void *q = brand(nq, 1.0f), *k = brand(nkv, 1.0f), *v = brand(nkv, 1.0f), *dec = brand(nq, 1.0f);
    float *lse = frand(nlse, 1.0f);
    RUN(bname("attention_forward", tag), op_attention_fwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"out", out, H(nout), BOUT}, {"lse", lse, F(nlse), OUT}, {"qkv", qkv, H(nqkv), BIN});
    cpu->attention_forward(ACT(out), lse, ACT(qkv), B, T, NH, NKV, HD, 0);  // what backward reads
    RUN(bname("attention_backward", tag), op_attention_bwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"dqkv", dqkv, H(nqkv), BOUT}, {"dout", dout, H(nout), BIN}, {"qkv", qkv, H(nqkv), BIN},
        {"out", out, H(nout), BIN}, {"lse", lse, F(nlse), IN});
    RUN(bname("attention_decode", tag), op_attention_decode, &a, CMP_REL, BF16_STORAGE_TOL,
        {"out", dec, H(nq), BOUT}, {"q", q, H(nq), BIN}, {"k_cache", k, H(nkv), BIN}, {"v_cache", v, H(nkv), BIN});
    free(qkv); free(out); free(dout); free(dqkv); free(q); free(k); free(v); free(dec); free(lse);
}

// encoder forward / backward: out, dout, wte and wpe bf16; the gradients dwte, dwpe fp32.
static void test_bf16_encoder(const char *tag, int B, int T, int C, int V) {
    args a = {.B = B, .T = T, .C = C};
    size_t N = (size_t)B * T, nte = (size_t)V * C, npe = (size_t)T * C;
    int *tok = irand(N, V, 0);
    for (size_t i = 1; i < N; i += 3) tok[i] = tok[0];  // repeated tokens: += into the same dwte row
    void *wte = brand(nte, 0.02f), *wpe = brand(npe, 0.01f);  // the parameters' bf16 shadow
    float *dwte = frand(nte, 1.0f), *dwpe = frand(npe, 1.0f);
    void *out = brand(N * C, 1.0f), *dout = brand(N * C, 1.0f);
    RUN(bname("encoder_forward", tag), op_encoder_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"out", out, H(N * C), BOUT},
        {"inp", tok, I(N), IN}, {"wte", wte, H(nte), BIN}, {"wpe", wpe, H(npe), BIN});
    RUN(bname("encoder_backward", tag), op_encoder_bwd, &a, CMP_REL, BF16_STORAGE_TOL, {"dwte", dwte, F(nte), INOUT},
        {"dwpe", dwpe, F(npe), INOUT}, {"dout", dout, H(N * C), BIN}, {"inp", tok, I(N), IN});
    free(tok); free(wte); free(wpe); free(dwte); free(dwpe); free(out); free(dout);
}

// crossentropy forward (the returned loss too) / backward / fused: logits (and dlogits over them)
// bf16, lse fp32.
static void test_bf16_crossentropy(const char *tag, int N, int V, int Vp) {
    size_t n = (size_t)N * Vp;
    float *l, *lse;
    int *targets;
    args a = ce_inputs(N, V, Vp, &l, &lse, &targets);
    void *logits = to_bf16(l, n);
    RUN(bname("crossentropy_forward", tag), op_ce_fwd, &a, CMP_REL, BF16_STORAGE_TOL, {"lse", lse, F(N), OUT},
        {"logits", logits, H(n), BIN}, {"targets", targets, I(N), IN});
    RUN(bname("crossentropy_fused", tag), op_ce_fused, &a, CMP_REL, BF16_STORAGE_TOL, {"lse", lse, F(N), OUT},
        {"logits", logits, H(n), BINOUT}, {"targets", targets, I(N), IN});
    cpu->crossentropy_forward(lse, ACT(logits), targets, N, V, Vp);
    RUN(bname("crossentropy_backward", tag), op_ce_bwd, &a, CMP_REL, BF16_STORAGE_TOL,
        {"logits", logits, H(n), BINOUT}, {"lse", lse, F(N), IN}, {"targets", targets, I(N), IN});
    free(logits); free(lse); free(targets);
}

// On the GPU table in use (fp32 or bf16 storage), crossentropy_fused must give crossentropy_forward's
// lse and loss and crossentropy_backward's gradient, bit for bit (the kernels share their row code).
static void test_crossentropy_fusion_exact(const char *tag, int N, int V, int Vp) {
    char name[160];
    snprintf(name, sizeof name, "crossentropy_fused_equals_forward_backward_bits_%s%s",
             gpu->act_bf16 ? "bf16_storage_" : "", tag);
    float *l, *lse;
    int *targets;
    args a = ce_inputs(N, V, Vp, &l, &lse, &targets);
    size_t n = (size_t)N * Vp, bytes = n * (gpu->act_bf16 ? sizeof(sl_bf16) : sizeof(float));
    void *host = gpu->act_bf16 ? to_bf16(l, n) : l;
    void *x[2] = {gpu->alloc(bytes, "logits"), gpu->alloc(bytes, "logits")};
    float *dl[2] = {gpu->alloc(F(N), "lse"), gpu->alloc(F(N), "lse")};
    int *dt = gpu->alloc(I(N), "targets");
    void *got[2] = {xmalloc(bytes), xmalloc(bytes)};
    float *got_lse[2] = {xmalloc(F(N)), xmalloc(F(N))};
    if (!x[0] || !x[1] || !dl[0] || !dl[1] || !dt) {
        fail(name, "alloc: %s", sl_error());
    } else {
        for (int k = 0; k < 2; k++) gpu->upload(x[k], host, bytes);
        gpu->upload(dt, targets, I(N));
        double t0 = gpu->crossentropy_forward(dl[0], x[0], dt, N, V, Vp);
        gpu->crossentropy_backward(x[0], dl[0], dt, N, V, Vp, a.dloss);
        double t1 = gpu->crossentropy_fused(dl[1], x[1], dt, N, V, Vp, a.dloss);
        for (int k = 0; k < 2; k++) {
            gpu->download(got[k], x[k], bytes);
            gpu->download(got_lse[k], dl[k], F(N));
        }
        if (gpu->synchronize()) fail(name, "%s", sl_error());
        else if (memcmp(&t0, &t1, sizeof t0)) fail(name, "loss %.17g fused, %.17g separate", t1, t0);
        else if (memcmp(got_lse[0], got_lse[1], F(N))) fail(name, "lse differs");
        else if (memcmp(got[0], got[1], bytes)) fail(name, "the gradient over the logits differs");
        else pass(name, 0.0);
    }
    for (int k = 0; k < 2; k++) {
        gpu->dealloc(x[k]);
        gpu->dealloc(dl[k]);
        free(got[k]);
        free(got_lse[k]);
    }
    gpu->dealloc(dt);
    free(host); free(lse); free(targets);
}

// Segments covering [0, n): sorted, disjoint, uneven lengths (one of a single element), decay alternating.
static int make_segments(sl_segment *segs, size_t n) {
    size_t cand[] = {1000, 1001, 5003, n / 2 + 7, n - 3}, prev = 0;
    int k = 0, nc = (int)(sizeof cand / sizeof cand[0]);
    for (int i = 1; i < nc; i++)  // sort the candidate cuts
        for (int j = i; j > 0 && cand[j] < cand[j - 1]; j--) { size_t t = cand[j]; cand[j] = cand[j - 1]; cand[j - 1] = t; }
    for (int i = 0; i < nc; i++) {
        if (cand[i] <= prev || cand[i] >= n) continue;
        segs[k] = (sl_segment){prev, cand[i], k % 2 == 0};
        prev = cand[i];
        k++;
    }
    segs[k] = (sl_segment){prev, n, k % 2 == 0};
    return k + 1;
}

static void test_optimizer(const char *tag, size_t n) {
    char name[128];
    sl_segment segs[8];
    args a = {.n = n, .segs = segs};
    a.n_segs = make_segments(segs, n);
    float *p = frand(n, 0.5f), *g = frand(n, 0.01f), *m = frand(n, 0.005f), *v = fpos(n, 1e-4f);
    sl_bf16 *bf16_zero = calloc(n, sizeof(sl_bf16));
    for (int step = 1; step <= 7; step += 6) {
        for (int type = 0; type < 4; type++) {  // AdamW (decoupled decay), Adam (L2); each also clipped
            sl_optim_config cfg;
            sl_optim_defaults(&cfg);
            cfg.type = type % 2 ? SL_OPTIM_ADAM : SL_OPTIM_ADAMW;
            cfg.weight_decay = 0.1;
            cfg.beta2 = 0.95;
            sl_adam_args_make(&cfg, 6e-4, step, &a.adam);
            a.adam.grad_coef = type >= 2 ? 0.3712f : 1.0f;  // gradient clipping's coefficient, in the pass
            snprintf(name, sizeof name, "adam_step_%s%s_%s_step%d", type % 2 ? "adam_l2" : "adamw",
                     type >= 2 ? "_clipped_bf16copy" : "", tag, step);
            // the clipped cases also write the parameters' bf16 copy in the pass (compared bit for bit)
            RUN(name, op_adam, &a, CMP_BITS, 0, {"p", p, F(n), INOUT}, {"g", g, F(n), IN}, {"m", m, F(n), INOUT},
                {"v", v, F(n), INOUT}, {"copy", type >= 2 ? bf16_zero : NULL, type >= 2 ? H(n) : 0, BOUT});
        }
    }
    const struct { const char *what; double momentum, dampening; int nesterov, step; } sgd[] = {
        {"plain", 0.0, 0.0, 0, 1}, {"momentum_first", 0.9, 0.0, 0, 1}, {"momentum", 0.9, 0.1, 0, 5},
        {"nesterov", 0.9, 0.0, 1, 5}};
    for (size_t i = 0; i < sizeof sgd / sizeof sgd[0]; i++) {
        sl_optim_config cfg;
        sl_optim_defaults(&cfg);
        cfg.type = SL_OPTIM_SGD;
        cfg.weight_decay = 0.01;
        cfg.momentum = sgd[i].momentum;
        cfg.dampening = sgd[i].dampening;
        cfg.nesterov = sgd[i].nesterov;
        sl_sgd_args_make(&cfg, 0.05, sgd[i].step, &a.sgd);
        snprintf(name, sizeof name, "sgd_step_%s_%s", sgd[i].what, tag);
        RUN(name, op_sgd, &a, CMP_BITS, 0, {"p", p, F(n), INOUT}, {"g", g, F(n), IN},
            {"buf", a.sgd.has_buf ? m : NULL, a.sgd.has_buf ? F(n) : 0, INOUT});
    }
    free(p); free(g); free(m); free(v); free(bf16_zero);
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_flat_passes(const char *tag, size_t n) {
    char name[128];
    args a = {.n = n};
    float *x = frand(n, 3.0f);
    snprintf(name, sizeof name, "sumsq_%s", tag);
    RUN(name, op_sumsq, &a, CMP_REL, SUMSQ_TOL, {"g", x, F(n), IN});
    a.coef = 0.3183f;
    snprintf(name, sizeof name, "scale_%s", tag);
    RUN(name, op_scale, &a, CMP_BITS, 0, {"x", x, F(n), INOUT});
    float *addend = frand(n, 2.0f);
    snprintf(name, sizeof name, "add_%s", tag);
    RUN(name, op_add, &a, CMP_BITS, 0, {"x", x, F(n), INOUT}, {"y", addend, F(n), IN});
    free(addend);
    // nonfinite: clean, then an Inf at the end, a NaN in the middle, -Inf first.
    snprintf(name, sizeof name, "nonfinite_clean_%s", tag);
    RUN(name, op_nonfinite, &a, CMP_BITS, 0, {"x", x, F(n), IN});
    float *y = xdup(x, F(n));
    y[n - 1] = INFINITY;
    snprintf(name, sizeof name, "nonfinite_inf_last_%s", tag);
    RUN(name, op_nonfinite, &a, CMP_BITS, 0, {"x", y, F(n), IN});
    memcpy(y, x, F(n));
    y[n / 3] = NAN;
    snprintf(name, sizeof name, "nonfinite_nan_%s", tag);
    RUN(name, op_nonfinite, &a, CMP_BITS, 0, {"x", y, F(n), IN});
    memcpy(y, x, F(n));
    y[0] = -INFINITY;
    snprintf(name, sizeof name, "nonfinite_neg_inf_first_%s", tag);
    RUN(name, op_nonfinite, &a, CMP_BITS, 0, {"x", y, F(n), IN});
    // round_to: ordinary values, exact ties, fp16 overflow and subnormals, float subnormals, +-Inf, +-0
    // (no NaN: CUDA's NaN bits differ from the CPU's, as precision.h records).
    memcpy(y, x, F(n));
    for (size_t i = 0; i + 16 < n; i += 97) {
        y[i] = from_bits(0x3F800000u | 0x8000u);          // 1 + 2^-8: bf16 tie -> even (1.0)
        y[i + 1] = from_bits(0x3F810000u | 0x8000u);      // a bf16 tie rounding up to even
        y[i + 2] = 1.0f + 0x1p-11f;                        // fp16 tie
        y[i + 3] = 65504.0f;                               // fp16 max
        y[i + 4] = 65519.0f;                               // rounds to fp16 max
        y[i + 5] = 65520.0f;                               // fp16 overflow -> Inf
        y[i + 6] = -1e6f;
        y[i + 7] = 3e-7f;                                  // fp16 subnormal
        y[i + 8] = 1e-9f;                                  // below fp16's smallest: 0
        y[i + 9] = 1e-40f;                                 // float subnormal
        y[i + 10] = INFINITY;
        y[i + 11] = -INFINITY;
        y[i + 12] = -0.0f;
        y[i + 13] = 3.4e38f;                               // bf16 overflow -> Inf
    }
    a.precision = SL_PRECISION_BF16;
    snprintf(name, sizeof name, "round_to_bf16_%s", tag);
    RUN(name, op_round_to, &a, CMP_BITS, 0, {"x", y, F(n), INOUT});
    a.precision = SL_PRECISION_FP16;
    snprintf(name, sizeof name, "round_to_fp16_%s", tag);
    RUN(name, op_round_to, &a, CMP_BITS, 0, {"x", y, F(n), INOUT});
    a.precision = SL_PRECISION_FP32;
    snprintf(name, sizeof name, "round_to_fp32_%s", tag);
    RUN(name, op_round_to, &a, CMP_BITS, 0, {"x", y, F(n), INOUT});
    free(x); free(y);
}

// ---- table and memory checks -------------------------------------------------------------------

#define SL_OPS_FNS(X)                                                                                      \
    X(encoder_forward) X(encoder_backward) X(matmul_forward) X(matmul_backward) X(matmul_gelu_forward)   \
    X(matmul_gelu_backward) X(layernorm_forward) X(layernorm_backward) X(rmsnorm_forward)                \
    X(rmsnorm_backward) X(residual_forward) X(residual_layernorm_forward) X(residual_rmsnorm_forward)    \
    X(gelu_forward) X(gelu_backward) X(swiglu_forward) X(swiglu_backward) X(rope_forward) X(rope_backward) \
    X(attention_forward) X(attention_backward) X(attention_decode) X(crossentropy_forward)              \
    X(crossentropy_backward) X(add_columns) X(take_columns) X(dropout_forward) X(dropout_backward) X(set_precision) X(alloc) X(dealloc) X(memzero) X(upload) X(download)      \
    X(copy) X(synchronize) X(sumsq) X(scale) X(nonfinite) X(round_to) X(adam_step) X(sgd_step)

static void test_table(void) {
    char missing[1024] = "";
#define CHECK_FIELD(f)                                                                     \
    if (!gpu->f) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " cuda:%s", #f); \
    if (!cpu->f) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " cpu:%s", #f);
    SL_OPS_FNS(CHECK_FIELD)
#undef CHECK_FIELD
    if (missing[0]) fail("ops_table_filled", "NULL entries:%s", missing);
    else if (!gpu->name || strcmp(gpu->name, "cuda") || gpu->on_device != 1)
        fail("ops_table_filled", "name '%s', on_device %d (want \"cuda\", 1)", gpu->name ? gpu->name : "(null)",
             gpu->on_device);
    else pass("ops_table_filled", 0.0);
}

static void test_memory(void) {
    // alloc is zero-filled; memzero, copy, upload/download round trip.
    size_t n = 1000003;
    float *h = frand(n, 1.0f), *back = xmalloc(F(n));
    float *d1 = gpu->alloc(F(n), "test buffer 1"), *d2 = gpu->alloc(F(n), "test buffer 2");
    if (!d1 || !d2) { fail("memory_round_trip", "alloc: %s", sl_error()); return; }
    gpu->download(back, d1, F(n));
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= back[i] == 0.0f;
    gpu->upload(d1, h, F(n));
    gpu->copy(d2, d1, F(n));
    gpu->download(back, d2, F(n));
    int same = !memcmp(back, h, F(n));
    gpu->memzero(d2 + 5, F(10));
    gpu->download(back, d2, F(n));
    int zeroed = back[4] == h[4] && back[5] == 0.0f && back[14] == 0.0f && back[15] == h[15];
    gpu->dealloc(d1);
    gpu->dealloc(d2);
    if (gpu->synchronize()) fail("memory_round_trip", "%s", sl_error());
    else if (!zero) fail("memory_round_trip", "alloc did not return zero-filled memory");
    else if (!same) fail("memory_round_trip", "upload + copy + download changed the data");
    else if (!zeroed) fail("memory_round_trip", "memzero cleared the wrong range");
    else pass("memory_round_trip", 0.0);
    free(h); free(back);

    // An impossible allocation: NULL with a message naming it, and the backend still works after.
    void *huge = gpu->alloc((size_t)1 << 50, "an impossible test buffer");
    if (huge) { fail("alloc_failure_message", "a 1 PiB allocation succeeded"); gpu->dealloc(huge); }
    else if (!strstr(sl_error(), "out of GPU memory allocating an impossible test buffer"))
        fail("alloc_failure_message", "unexpected message: %s", sl_error());
    else if (gpu->synchronize()) fail("alloc_failure_message", "synchronize after a failed alloc: %s", sl_error());
    else pass("alloc_failure_message", 0.0);
}

// Sets (value) or clears (NULL) an environment switch of settings.h and reloads the settings, which
// the backend reads once (a setenv alone would change nothing).
static void set_switch(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    if (sl_settings_load()) fail("settings_reload", "%s", sl_error());
}

// Which path the dbias sums queued since (all0, epi0) (cuda_matmul_bias_grad_calls) took. expect 0
// (SHARDLM_BIAS_GRAD_EPILOGUE=0): the column-sum kernels for all, else FAIL. expect 1: PASS when
// cuBLASLt's BGRADB epilogue summed every one, SKIP naming how many it did not (cuBLASLt offered no
// algorithm with it: the kernels ran, and the cases above checked them): the session's note of
// whether the epilogue is there to be timed.
static void check_bias_grad_path(const char *name, unsigned long all0, unsigned long epi0, int expect) {
    unsigned long epi, all = cuda_matmul_bias_grad_calls(&epi);
    all -= all0;
    epi -= epi0;
    if (all == 0) fail(name, "no bias gradient was queued through matmul_backward");
    else if (!expect && epi) fail(name, "%lu of %lu bias gradients took the BGRADB epilogue although it is switched off", epi, all);
    else if (expect && epi < all)
        printf("SKIP %s: %lu of %lu bias gradients took cuBLASLt's BGRADB epilogue, the rest the column-sum kernels\n",
               name, epi, all);
    else {
        printf("PASS %s (%lu of %lu bias gradients by %s)\n", name, expect ? epi : all - epi, all,
               expect ? "the BGRADB epilogue" : "the column-sum kernels");
        passed++;
    }
}

// The norm shapes: odd ones (C below a vector, C not a multiple of 8 or 4: the scalar path; N not a
// multiple of the 8-row tile or the 32-row chunk) and GPT-2 / LLaMA widths (768, 1024, 4096).
static const struct { const char *tag; int N, C; } NORM_SHAPES[] = {
    {"small", 37, 100},  {"gpt2", 1024, 768},     {"one_row_c5", 1, 5}, {"odd_c771", 1003, 771},
    {"n4099_c768", 4099, 768}, {"c1024", 515, 1024}, {"c4096", 77, 4096},
    // the backward's lanes kernel (rows of at most 4 vectors a lane) at one row and at a chunk
    // shorter than the 8 warps
    {"one_row_c768", 1, 768}, {"n7_c256", 7, 256},
    // the norm forwards' register path at every vector count (norm.cu: fp32 256 -> 2 vectors a lane,
    // 384 -> 3, 512 -> 4; bf16 256 -> 1, 512 -> 2, 1536 -> 6, 2048 -> 8; fp32 1536 and 2048: the loop)
    {"c256", 99, 256}, {"c384", 50, 384}, {"c512", 67, 512}, {"c1536", 45, 1536}, {"c2048", 33, 2048},
};
#define N_NORM_SHAPES ((int)(sizeof NORM_SHAPES / sizeof NORM_SHAPES[0]))

// Cross-entropy shapes: Vp a multiple of 8 (16-byte vectors, V inside a vector) and not (97: single
// elements), one row, GPT-2's padded vocabulary, more rows than a grid.
static const struct { const char *tag; int N, V, Vp; } CE_SHAPES[] = {
    {"small", 37, 100, 128}, {"odd_vp97", 5, 97, 97}, {"one_row_gpt2", 1, 50257, 50304}, {"gpt2", 64, 50257, 50304},
    {"rows1100", 1100, 100, 128},  // more rows than the fused kernels' grids: each block walks several
    {"gpt2_rows300", 300, 50257, 50304},  // GPT-2's rows, more than an SM count: the two-row form alternates
};
#define N_CE_SHAPES ((int)(sizeof CE_SHAPES / sizeof CE_SHAPES[0]))

// Attention shapes of the bf16 groups: head_dim 16..128 in the steps the tensor-core kernels take
// (attention_tc.cu, attention_mma.cu), T across tile edges (1, 64, 65, 77, 130, 200, 1024), MHA and GQA;
// head_dim 40 (the SIMT kernels under every SHARDLM_ATTENTION but cudnn, which takes it).
static const struct { const char *tag; int B, T, NH, NKV, HD; } ATT_SHAPES[] = {
    // GPT-2's shape first: a failure is sticky in the backend, so the commonest shape gets its say
    {"gpt2_T1024", 1, 1024, 12, 12, 64}, {"gqa_T77", 2, 77, 4, 2, 64},
    {"hd16_T1", 2, 1, 4, 1, 16},       {"hd32_T130", 1, 130, 4, 2, 32},
    {"hd80_T65", 2, 65, 2, 2, 80},     {"hd96_T64", 1, 64, 4, 4, 96},
    {"hd128_T200", 1, 200, 8, 2, 128}, {"hd40_T77", 1, 77, 4, 2, 40},
    // T a multiple of 128, which cuDNN before 9.16 takes: GQA and head dims 80 to 128 through cuDNN
    // (SHARDLM_ATTENTION=auto hands cuDNN only the heads a GPU run has checked: attention_cudnn.cu)
    {"gqa_T128", 2, 128, 8, 2, 64},    {"hd80_T128", 1, 128, 4, 4, 80},
    {"hd96_T128", 1, 128, 2, 2, 96},   {"hd128_T256", 1, 256, 8, 2, 128},
};
#define N_ATT_SHAPES ((int)(sizeof ATT_SHAPES / sizeof ATT_SHAPES[0]))

static void test_bf16_attention_shape(const char *prefix, int i) {
    char tag[64];
    snprintf(tag, sizeof tag, "%s%s", prefix, ATT_SHAPES[i].tag);
    test_bf16_attention(tag, ATT_SHAPES[i].B, ATT_SHAPES[i].T, ATT_SHAPES[i].NH, ATT_SHAPES[i].NKV, ATT_SHAPES[i].HD);
}

// Shapes for the block orders: GPT-2's heads at B = 3 (36 heads in chunks of 32 for the forward and dQ,
// 31 for dK / dV) and GQA at head_dim 128 (32 heads in chunks of 16; 8 kv heads in chunks of 3).
// B is the least batch; a GPU whose L2 takes more heads a chunk gets a larger one (grid_spans_chunks).
static const struct { const char *tag; int B, T, NH, NKV, HD; } GRID_SHAPES[] = {
    {"gpt2_T1024", 3, 1024, 12, 12, 64},
    {"gqa_hd128_T1024", 2, 1024, 16, 4, 128},
};
#define N_GRID_SHAPES ((int)(sizeof GRID_SHAPES / sizeof GRID_SHAPES[0]))

// Whether both backward kernels' and the forward's heads span more than one chunk of attention_grid.h
// (sl_grid_chunk_q / _kv at this GPU's share, as attention_mma.cu's launches size them).
static int grid_spans_chunks(int B, int T, int NH, int NKV, int HD, size_t share) {
    return sl_grid_chunk_q(B, T, NH, NKV, HD, share) < (unsigned)(B * NH) &&
           sl_grid_chunk_kv(B, T, NH, NKV, HD, share) < (unsigned)(B * NKV);
}

// What compare_attention_runs counts: a counter of the kernels or library calls under test, and how
// many the forward and backward of each of its two runs must add to it.
typedef struct {
    const char *what;
    unsigned long (*count)(void);
    unsigned long expect[2];
} att_calls;
static const att_calls MMA_LAUNCHES = {"mma.sync launches", cuda_attention_mma_launches, {2, 2}};

// The attention's forward and backward under two values of one switch (`var` = vals[0], then
// vals[1]) on the same inputs, each run making calls->expect[k] calls on the counted path. Bit for
// bit: out, lse and dqkv; but with dq_tol > 0 dqkv's dQ columns (each row's first NH * HD) only within
// dq_tol of the first run's (relative to their largest), the rest still bit for bit.
static void compare_attention_runs(const char *name, int B, int T, int NH, int NKV, int HD, const char *var,
                                   const char *const vals[2], double dq_tol, const att_calls *calls) {
    size_t N = (size_t)B * T, nqkv = N * (NH + 2 * NKV) * HD, nout = N * NH * HD, nlse = (size_t)B * NH * T;
    void *hqkv = brand(nqkv, 1.0f), *hdout = brand(nout, 1.0f);
    sl_act *qkv = gpu->alloc(H(nqkv), "qkv"), *dout = gpu->alloc(H(nout), "dout"), *out[2], *dqkv[2];
    float *lse[2];
    void *got_out[2], *got_dqkv[2], *got_lse[2];
    int ok = qkv && dout;
    for (int k = 0; k < 2; k++) {
        out[k] = gpu->alloc(H(nout), "out");
        dqkv[k] = gpu->alloc(H(nqkv), "dqkv");
        lse[k] = gpu->alloc(F(nlse), "lse");
        got_out[k] = xmalloc(H(nout));
        got_dqkv[k] = xmalloc(H(nqkv));
        got_lse[k] = xmalloc(F(nlse));
        ok = ok && out[k] && dqkv[k] && lse[k];
    }
    unsigned long ran[2] = {0, 0};
    if (!ok) {
        fail(name, "alloc: %s", sl_error());
    } else {
        gpu->upload(qkv, hqkv, H(nqkv));
        gpu->upload(dout, hdout, H(nout));
        for (int k = 0; k < 2; k++) {
            set_switch(var, vals[k]);
            const unsigned long before = calls->count();
            gpu->attention_forward(out[k], lse[k], qkv, B, T, NH, NKV, HD, 0);
            gpu->attention_backward(dqkv[k], dout, qkv, out[k], lse[k], B, T, NH, NKV, HD, 0);
            ran[k] = calls->count() - before;
            gpu->download(got_out[k], out[k], H(nout));
            gpu->download(got_dqkv[k], dqkv[k], H(nqkv));
            gpu->download(got_lse[k], lse[k], F(nlse));
        }
        set_switch(var, NULL);
        // dqkv row by row: its dQ columns (compared after, within dq_tol) and its dK, dV columns (exact)
        const size_t W = (size_t)(NH + 2 * NKV) * HD, nq = (size_t)NH * HD;
        const sl_bf16 *d0 = got_dqkv[0], *d1 = got_dqkv[1];
        int kv_same = 1;
        for (size_t r = 0; kv_same && r < N; r++)
            kv_same = !memcmp(d0 + r * W + nq, d1 + r * W + nq, (W - nq) * sizeof(sl_bf16));
        double dq_err = 0;
        if (dq_tol > 0) {
            float *a = widen(d0, nqkv), *b = widen(d1, nqkv);
            double worst = 0, top = 0;
            for (size_t r = 0; r < N; r++)
                for (size_t c = 0; c < nq; c++) {
                    worst = fmax(worst, fabs((double)a[r * W + c] - b[r * W + c]));
                    top = fmax(top, fabs((double)a[r * W + c]));
                }
            dq_err = top > 0 ? worst / top : worst;
            free(a);
            free(b);
        }
        if (gpu->synchronize()) fail(name, "%s", sl_error());
        else if (ran[0] != calls->expect[0] || ran[1] != calls->expect[1])
            fail(name, "%lu and %lu %s (%s, %s), expected %lu and %lu", ran[0], ran[1], calls->what,
                 vals[0] ? vals[0] : "unset", vals[1] ? vals[1] : "unset", calls->expect[0], calls->expect[1]);
        else if (memcmp(got_out[0], got_out[1], H(nout))) fail(name, "out differs");
        else if (memcmp(got_lse[0], got_lse[1], F(nlse))) fail(name, "lse differs");
        else if (!kv_same) fail(name, "dK / dV differ");
        else if (dq_tol == 0 && memcmp(got_dqkv[0], got_dqkv[1], H(nqkv))) fail(name, "dQ differs");
        else if (dq_tol > 0 && !(dq_err <= dq_tol)) fail(name, "dQ differs by %.2e (limit %.0e)", dq_err, dq_tol);
        else pass(name, dq_err);
    }
    for (int k = 0; k < 2; k++) {
        gpu->dealloc(out[k]);
        gpu->dealloc(dqkv[k]);
        gpu->dealloc(lse[k]);
        free(got_out[k]); free(got_dqkv[k]); free(got_lse[k]);
    }
    gpu->dealloc(qkv);
    gpu->dealloc(dout);
    free(hqkv); free(hdout);
}

// The mma.sync attention's two block orders (SHARDLM_ATTENTION_GRID=tiles, the default, and heads) hand
// the same blocks out in another order, each computing what it did: out, lse and dqkv bit-identical
// between them. The heads must span more than one chunk, or the heads order is the default's
// permutation and proves nothing: B grows from the table's until they do (at most 64).
static void test_attention_grid_exact(const char *tag, int B, int T, int NH, int NKV, int HD) {
    const char *name = bname("attention_grid_heads_equals_tiles_bits", tag);
    const size_t share = cuda_attention_grid_share();
    while (B < 64 && !grid_spans_chunks(B, T, NH, NKV, HD, share)) B++;
    if (!grid_spans_chunks(B, T, NH, NKV, HD, share)) {
        fail(name, "B = 64 still fits one chunk of heads (L2 share %zu bytes): both orders would be the same",
             share);
        return;
    }
    static const char *const orders[2] = {"tiles", "heads"};
    compare_attention_runs(name, B, T, NH, NKV, HD, "SHARDLM_ATTENTION_GRID", orders, 0.0,
                           &MMA_LAUNCHES);
}

// SHARDLM_ATTENTION_DQ=atomic (dQ added inside the dK / dV kernel with fp32 atomics, head dims up to 64)
// against the default split kernels: out, lse, dK and dV bit for bit (their maths is the same), dQ
// within 1e-2 of the split kernel's, relative to its largest (the same fp32 terms summed in another
// order, then rounded to bf16: about one bf16 step, 2^-8, where the sums straddle a rounding point;
// a wrong row, head or mask moves dQ by its own size).
static void test_attention_dq_atomic(const char *tag, int B, int T, int NH, int NKV, int HD) {
    static const char *const modes[2] = {"split", "atomic"};
    compare_attention_runs(bname("attention_dq_atomic_near_split", tag), B, T, NH, NKV, HD, "SHARDLM_ATTENTION_DQ",
                           modes, 1e-2, &MMA_LAUNCHES);
}

// SHARDLM_ATTENTION_DQ=ordered (the atomic mode's kernel, each dQ sum taking its key tiles' shares in
// order): near the split kernels as atomic is, and two runs byte for byte (the bits it keeps).
static void test_attention_dq_ordered(const char *tag, int B, int T, int NH, int NKV, int HD) {
    static const char *const near[2] = {"split", "ordered"}, *const twice[2] = {"ordered", "ordered"};
    compare_attention_runs(bname("attention_dq_ordered_near_split", tag), B, T, NH, NKV, HD, "SHARDLM_ATTENTION_DQ",
                           near, 1e-2, &MMA_LAUNCHES);
    compare_attention_runs(bname("attention_dq_ordered_repeats_bits", tag), B, T, NH, NKV, HD, "SHARDLM_ATTENTION_DQ",
                           twice, 0.0, &MMA_LAUNCHES);
}

// cuDNN's attention in batch slices (SHARDLM_CUDNN_WORKSPACE_MB; attention_cudnn.cu's slice_of):
// GPT-2's heads at B = 4, T = 1024, whose deterministic backward needs 24 MiB of workspace a sequence:
// one backward call under the default cap, two of two sequences under 60 MiB; the forward one call
// either way. Each sequence is computed as in the whole batch: out, lse and dqkv bit for bit.
static void test_attention_cudnn_slices(void) {
    static const char *const caps[2] = {NULL, "60"};
    static const att_calls cudnn_calls = {"cuDNN calls", cuda_attention_cudnn_calls, {2, 3}};
    compare_attention_runs("attention_cudnn_slices_equal_whole_bits_gpt2_T1024", 4, 1024, 12, 12, 64,
                           "SHARDLM_CUDNN_WORKSPACE_MB", caps, 0.0, &cudnn_calls);
}

// Every CE_SHAPES entry through check (against the CPU) and test_crossentropy_fusion_exact, with the
// fused classifier reading each row twice (SHARDLM_CE_ROW_SMEM=0), then with each row in shared memory (=1,
// the default), then with two rows a block (=2: the next row's copy in flight; one row where two do not
// fit, still the shared-memory kernel).
// That kernel must run exactly where it applies: 3 launches a shape (check runs the fused op twice,
// the exact test once) where it takes the rows (cuda_crossentropy_smem_takes: 16-byte vectors, and a
// row fits this GPU's shared memory), none otherwise (odd_vp97); under =2 its two-row form exactly
// where two rows fit (GPT-2's bf16 rows, not its fp32 ones).
static void crossentropy_cases(void (*check)(const char *tag, int N, int V, int Vp)) {
    static const char *const modes[3] = {"0", "1", "2"}, *const prefix[3] = {"", "smem_", "smem2_"};
    for (int smem = 0; smem < 3; smem++) {
        set_switch("SHARDLM_CE_ROW_SMEM", modes[smem]);
        for (int i = 0; i < N_CE_SHAPES; i++) {
            char tag[64];
            snprintf(tag, sizeof tag, "%s%s", prefix[smem], CE_SHAPES[i].tag);
            const unsigned long before = cuda_crossentropy_smem_launches();
            const unsigned long before2 = cuda_crossentropy_smem2_launches();
            check(tag, CE_SHAPES[i].N, CE_SHAPES[i].V, CE_SHAPES[i].Vp);
            test_crossentropy_fusion_exact(tag, CE_SHAPES[i].N, CE_SHAPES[i].V, CE_SHAPES[i].Vp);
            const unsigned long ran = cuda_crossentropy_smem_launches() - before;
            const unsigned long ran2 = cuda_crossentropy_smem2_launches() - before2;
            const int Vp = CE_SHAPES[i].Vp, bf16 = gpu->act_bf16 != 0;
            const unsigned long want = smem && cuda_crossentropy_smem_takes(Vp, bf16, 1) ? 3 : 0;
            const unsigned long want2 = smem == 2 && cuda_crossentropy_smem_takes(Vp, bf16, 2) ? 3 : 0;
            char name[128];
            snprintf(name, sizeof name, "crossentropy_smem_launches_%s%s", bf16 ? "bf16_storage_" : "", tag);
            if (ran == want && ran2 == want2) pass(name, 0.0);
            else fail(name, "%lu launches of the shared-memory row kernel (%lu of its two-row form), expected %lu (%lu)",
                      ran, ran2, want, want2);
        }
    }
    set_switch("SHARDLM_CE_ROW_SMEM", NULL);
}

// The op groups, each runnable alone (argv[2]): a CUDA error is sticky in the backend, so one failing op
// would fail every later case of its process; tests/gpu/run.sh runs each group as its own process.
static const char *const GROUPS[] = {"basics", "encoder", "matmul", "matmul_gelu", "matmul_16bit", "norm", "elementwise",
                                     "rope", "attention", "decode", "crossentropy", "optimizer", "bf16",
                                     "attention_mma", "attention_cudnn"};
static const char *only;   // the group to run; NULL: all

// The bf16-storage tables in the places of gpu and cpu for a group's cases (the caller keeps gpu's to put
// back): 1, or 0 with a failure when the backend gives no such table.
static int bf16_tables(void) {
    gpu = sl_ops_for_precision(gpu, SL_PRECISION_BF16);
    cpu = &sl_ops_cpu_bf16;
    if (gpu->act_bf16) return 1;
    fail("bf16_storage_table", "sl_ops_for_precision(bf16) gave %s, not a bf16-storage table", gpu->name);
    return 0;
}
static int group(const char *name) { return !only || !strcmp(only, name); }

// usage: test_ops_cuda [DEVICE [GROUP|all|list]]
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // line-buffered: a crash keeps the lines printed so far
    const char *device = argc > 1 ? argv[1] : "cuda:0";
    const int ngroups = (int)(sizeof GROUPS / sizeof GROUPS[0]);
    if (argc > 2 && !strcmp(argv[2], "list")) {
        for (int g = 0; g < ngroups; g++) printf("%s\n", GROUPS[g]);
        return 0;
    }
    if (argc > 2 && strcmp(argv[2], "all")) {
        only = argv[2];
        int known = 0;
        for (int g = 0; g < ngroups; g++) known |= !strcmp(only, GROUPS[g]);
        if (!known) {
            printf("FAIL op_group_known: no op group '%s' (test_ops_cuda %s list prints them)\n", only, device);
            printf("0 passed, 1 failed\n");
            return 1;
        }
    }
    gpu = sl_ops_for_device(device, 0);
    if (!gpu) {
        if (strstr(sl_error(), "no usable CUDA GPU")) {
            printf("SKIP test_ops_cuda: %s\n", sl_error());
            return 0;
        }
        printf("FAIL cuda_backend_init: %s\n", sl_error());
        printf("0 passed, 1 failed\n");
        return 1;
    }
    printf("comparing %s against cpu: error = max|cuda - cpu| / max|cpu| per tensor, limit %.0e; "
           "optimizer, scale and round_to: exact bits; every CUDA op run twice: identical bits\n",
           gpu->name, REL_TOL);
    fflush(stdout);
    rng = sl_rng_make(1234, 0, 0, SL_RNG_TEST);
    if (group("basics")) {
        test_table();
        test_memory();
    }

    if (group("encoder")) {
        test_encoder("small", 2, 37, 40, 97, 1);
        test_encoder("no_wpe", 3, 17, 64, 50, 0);
        test_encoder("gpt2", 1, 1024, 768, 50257, 1);
    }

    if (group("matmul")) {
        test_matmul("small_bias", 37, 19, 23, 1, 0);
        test_matmul("small_nobias", 37, 19, 23, 0, 0);
        test_matmul("unaligned_bias", 37, 19, 23, 1, 1);
        test_matmul("one_row", 1, 64, 96, 1, 0);
        unsigned long epi0, all0 = cuda_matmul_bias_grad_calls(&epi0);
        test_matmul("gpt2_qkv", 1024, 768, 2304, 1, 0);
        test_matmul("gpt2_fc", 1024, 768, 3072, 1, 0);
        test_matmul("gpt2_proj", 1024, 3072, 768, 1, 0);
        check_bias_grad_path("matmul_bias_grad_epilogue_gpt2_shapes", all0, epi0, 1);
        test_matmul("gpt2_lm_head", 256, 768, 50257, 0, 0);
        // the column-sum kernels, switched to (SHARDLM_BIAS_GRAD_EPILOGUE=0)
        set_switch("SHARDLM_BIAS_GRAD_EPILOGUE", "0");
        all0 = cuda_matmul_bias_grad_calls(&epi0);
        test_matmul("gpt2_fc_bias_grad_kernels", 1024, 768, 3072, 1, 0);
        check_bias_grad_path("matmul_bias_grad_switched_off", all0, epi0, 0);
        set_switch("SHARDLM_BIAS_GRAD_EPILOGUE", NULL);
    }

    if (group("matmul_gelu")) {
        test_matmul_gelu("small_bias_unfused", 37, 19, 23, 1, 0);   // OC % 8 != 0: the fallback path
        test_matmul_gelu("small_nobias_unfused", 37, 19, 23, 0, 0);
        test_matmul_gelu("small_bias", 37, 19, 24, 1, 0);           // the GELU_AUX_BIAS epilogue
        test_matmul_gelu("small_nobias", 37, 19, 24, 0, 0);         // GELU_AUX
        test_matmul_gelu("unaligned_bias", 37, 19, 24, 1, 1);
        test_matmul_gelu("one_row", 1, 64, 96, 1, 0);
        test_matmul_gelu("gpt2_fc", 1024, 768, 3072, 1, 0);
        test_matmul_gelu("gpt2_fc_nobias", 1024, 768, 3072, 0, 0);
        test_matmul_backward_gelu("small_unfused", 37, 23, 19, 1, 0);  // IC % 8 != 0: GEMM, then the GELU kernel
        test_matmul_backward_gelu("small", 37, 24, 19, 1, 0);          // the DGELU epilogue
        test_matmul_backward_gelu("small_nobias", 37, 24, 19, 0, 0);
        test_matmul_backward_gelu("unaligned", 37, 24, 19, 1, 1);      // 4-byte aligned: the fallback
        test_matmul_backward_gelu("one_row", 1, 96, 64, 1, 0);
        test_matmul_backward_gelu("gpt2_proj", 1024, 3072, 768, 1, 0);
        set_switch("SHARDLM_GELU_EPILOGUE", "0");
        test_matmul_backward_gelu("gpt2_proj_switched_off", 1024, 3072, 768, 1, 0);
        set_switch("SHARDLM_GELU_EPILOGUE", NULL);
        // SHARDLM_GEMM_AUTOTUNE=1: the timed choice, against the CPU and bit-identical on its second
        // call (the first call tunes; dweight and dbias accumulate, so the trials must leave no trace)
        set_switch("SHARDLM_GEMM_AUTOTUNE", "1");
        test_matmul("gpt2_proj_autotune", 1024, 3072, 768, 1, 0);
        test_matmul_gelu("gpt2_fc_autotune", 1024, 768, 3072, 1, 0);
        test_matmul_backward_gelu("gpt2_proj_autotune", 1024, 3072, 768, 1, 0);
        set_switch("SHARDLM_GEMM_AUTOTUNE", NULL);
    }

    if (group("matmul_16bit")) {
        test_matmul_16bit("small", SL_PRECISION_BF16, 37, 19, 24);
        test_matmul_16bit("gpt2_fc", SL_PRECISION_BF16, 1024, 768, 3072);
        test_matmul_16bit("gpt2_proj", SL_PRECISION_BF16, 1024, 3072, 768);
        test_matmul_16bit("gpt2_fc", SL_PRECISION_FP16, 1024, 768, 3072);
    }

    if (group("norm")) {
        for (int i = 0; i < N_NORM_SHAPES; i++) test_norms(NORM_SHAPES[i].tag, NORM_SHAPES[i].N, NORM_SHAPES[i].C);
        set_switch("SHARDLM_FUSED_KERNELS", "0");  // the split backward kernels (norm_backward.cu)
        test_norms("split_small", 37, 100);
        test_norms("split_gpt2", 1024, 768);
        set_switch("SHARDLM_FUSED_KERNELS", NULL);
        // every NORM_SHAPES width (fp32: the register path at 1, 2, 3, 4, 6 and 8 vectors a lane, the
        // vector loop from 1536, single elements at 5 and 771), b aligned and not; and with
        // SHARDLM_FUSED_KERNELS=0 (the earlier scalar kernels)
        for (int i = 0; i < N_NORM_SHAPES; i++) {
            test_residual_norms(NORM_SHAPES[i].tag, NORM_SHAPES[i].N, NORM_SHAPES[i].C);
            for (int shift = 0; shift < 2; shift++)
                test_residual_norm_fusion_exact(NORM_SHAPES[i].tag, NORM_SHAPES[i].N, NORM_SHAPES[i].C, shift);
        }
        set_switch("SHARDLM_FUSED_KERNELS", "0");
        test_residual_norms("split_gpt2", 1024, 768);
        test_residual_norm_fusion_exact("split_gpt2", 1024, 768, 0);
        set_switch("SHARDLM_FUSED_KERNELS", NULL);
    }

    if (group("elementwise")) {
        test_elementwise("small", 1001, 37, 100);
        test_elementwise("gpt2", (size_t)1024 * 3072 + 3, 1024, 2048);
        test_lora_ops("small", 37, 13, 50, 20);
        test_lora_ops("qkv", 1024, 768, 2304, 1536);
    }

    if (group("rope")) {
        test_rope("small", 2, 37, 4, 2, 64, 0);
        test_rope("small", 2, 37, 4, 2, 64, 5);
        test_rope("decode", 1, 1, 4, 2, 64, 77);
        test_rope("llama", 1, 130, 8, 2, 128, 0);
    }

    if (group("attention")) {
        test_attention("mha_T77", 2, 77, 4, 4, 64);
        test_attention("gqa_T100", 2, 100, 4, 2, 64);
        test_attention("gqa_T1", 3, 1, 4, 2, 64);
        test_attention("gqa_hd128_T130", 1, 130, 8, 2, 128);
        test_attention("gpt2_T1024", 1, 1024, 12, 12, 64);
    }

    if (group("decode")) {
        test_decode("ctx1", 1, 4, 2, 64);
        test_decode("gqa_ctx77", 77, 4, 2, 64);
        test_decode("gpt2_ctx1024", 1024, 12, 12, 64);
    }

    if (group("crossentropy")) crossentropy_cases(test_crossentropy);

    if (group("optimizer")) {
        test_flat_passes("small", 1001);
        test_flat_passes("large", (size_t)7 << 20);
        test_optimizer("small", 1001);
        test_optimizer("large", ((size_t)7 << 20) + 13);
    }

    if (group("bf16")) {
        // The act_bf16 tables take the places of gpu and cpu for this group's cases.
        const sl_ops *fp32_gpu = gpu;
        gpu = sl_ops_for_precision(gpu, SL_PRECISION_BF16);
        cpu = &sl_ops_cpu_bf16;
        printf("bf16: comparing %s against %s on bf16 activation storage: error as above on values widened to "
               "float, limit %.0e; every CUDA op run twice: identical bytes\n",
               gpu->name, cpu->name, BF16_STORAGE_TOL);
        if (!gpu->act_bf16) {
            fail("bf16_storage_table", "sl_ops_for_precision(bf16) gave %s, not a bf16-storage table "
                 "(SHARDLM_BF16_STORAGE=0 in the environment?)", gpu->name);
        } else {
            test_bf16_matmul("small_bias", 37, 19, 23);       // matmul_gelu: the unfused fallback (OC % 8 != 0)
            test_bf16_matmul("small_epilogue", 37, 19, 24);   // matmul_gelu: the GELU_AUX_BIAS epilogue
            unsigned long epi0, all0 = cuda_matmul_bias_grad_calls(&epi0);
            test_bf16_matmul("gpt2_fc", 1024, 768, 3072);
            check_bias_grad_path("matmul_bias_grad_epilogue_bf16_gpt2_fc", all0, epi0, 1);
            for (int i = 0; i < N_NORM_SHAPES; i++) {
                test_bf16_norms(NORM_SHAPES[i].tag, NORM_SHAPES[i].N, NORM_SHAPES[i].C);
                for (int shift = 0; shift < 2; shift++)  // bf16: the register path at 1, 2, 3, 4, 6 and 8 vectors
                    test_residual_norm_fusion_exact(NORM_SHAPES[i].tag, NORM_SHAPES[i].N, NORM_SHAPES[i].C, shift);
            }
            set_switch("SHARDLM_FUSED_KERNELS", "0");
            test_bf16_norms("split_small", 37, 100);
            test_bf16_norms("split_gpt2", 1024, 768);
            set_switch("SHARDLM_FUSED_KERNELS", NULL);
            test_bf16_elementwise("small", 1001, 37, 100);
            test_bf16_elementwise("gpt2", (size_t)1024 * 3072 + 3, 1024, 2048);
            test_bf16_rope("small", 2, 37, 4, 2, 64, 5);
            // every ATT_SHAPES entry on the default kernels (attention_mma.cu) and on the WMMA ones
            // (SHARDLM_ATTENTION=tc); then gqa_T77 and hd128_T200 with SHARDLM_ATTENTION=simt, which
            // keeps the SIMT kernels' bf16 instances covered
            for (int i = 0; i < N_ATT_SHAPES; i++) test_bf16_attention_shape("", i);
            set_switch("SHARDLM_ATTENTION", "tc");
            for (int i = 0; i < N_ATT_SHAPES; i++) test_bf16_attention_shape("tc_", i);
            set_switch("SHARDLM_ATTENTION", "simt");
            for (int i = 0; i < N_ATT_SHAPES; i++)
                if (!strcmp(ATT_SHAPES[i].tag, "gqa_T77") || !strcmp(ATT_SHAPES[i].tag, "hd128_T200"))
                    test_bf16_attention_shape("simt_", i);
            set_switch("SHARDLM_ATTENTION", NULL);
            test_bf16_encoder("small", 2, 37, 40, 97);
            crossentropy_cases(test_bf16_crossentropy);
        }
        gpu = fp32_gpu;
        cpu = &sl_ops_cpu;
    }

    if (group("attention_mma")) {
        // The register-resident mma.sync kernels (attention_mma.cu: SHARDLM_ATTENTION=mma, and auto's
        // choice outside a training engine, as here) on every shape of the bf16 group, against the CPU's
        // bf16 emulation, with their launch counter (the bf16 group runs them too, as auto's choice
        // here); a group of their own, so a fault in them
        // cannot hide the bf16 group's results.
        const sl_ops *fp32_gpu = gpu;
        if (bf16_tables()) {
            set_switch("SHARDLM_ATTENTION", "mma");
            for (int i = 0; i < N_ATT_SHAPES; i++) {
                const unsigned long before = cuda_attention_mma_launches();
                test_bf16_attention_shape("mma_", i);
                // head_dim 40 is not theirs (the SIMT kernels run it); every other shape must have run them
                const int theirs = ATT_SHAPES[i].HD != 40;
                const unsigned long ran = cuda_attention_mma_launches() - before;
                if (theirs == (ran > 0)) pass(bname("attention_mma_ran", ATT_SHAPES[i].tag), 0.0);
                else fail(bname("attention_mma_ran", ATT_SHAPES[i].tag), "%lu mma.sync launches (expected %s)", ran,
                          theirs ? "some" : "none");
            }
            // their other block order (SHARDLM_ATTENTION_GRID=heads) against the default, on shapes whose
            // heads span more than one of attention_grid.h's chunks on this GPU (with fewer, the two orders
            // are the same permutation)
            for (int i = 0; i < N_GRID_SHAPES; i++)
                test_attention_grid_exact(GRID_SHAPES[i].tag, GRID_SHAPES[i].B, GRID_SHAPES[i].T, GRID_SHAPES[i].NH,
                                          GRID_SHAPES[i].NKV, GRID_SHAPES[i].HD);
            // dQ by atomics inside the dK / dV kernel (SHARDLM_ATTENTION_DQ=atomic) on every shape it takes
            // (head_dim <= 64): against the split kernels, also in the heads order on two shapes, and on
            // GPT-2's heads at B = 3; then against the CPU element by element (dqkv starts as noise, so
            // every dQ column must be written), without the two-runs-identical check it does not keep
            // The same for dQ added in key-tile order (SHARDLM_ATTENTION_DQ=ordered), which also keeps the
            // two-runs-identical check
            for (int i = 0; i < N_ATT_SHAPES; i++)
                if (ATT_SHAPES[i].HD <= 64 && ATT_SHAPES[i].HD != 40) {
                    test_attention_dq_atomic(ATT_SHAPES[i].tag, ATT_SHAPES[i].B, ATT_SHAPES[i].T, ATT_SHAPES[i].NH,
                                             ATT_SHAPES[i].NKV, ATT_SHAPES[i].HD);
                    test_attention_dq_ordered(ATT_SHAPES[i].tag, ATT_SHAPES[i].B, ATT_SHAPES[i].T, ATT_SHAPES[i].NH,
                                              ATT_SHAPES[i].NKV, ATT_SHAPES[i].HD);
                }
            set_switch("SHARDLM_ATTENTION_GRID", "heads");
            test_attention_dq_atomic("heads_gqa_T77", 2, 77, 4, 2, 64);
            test_attention_dq_atomic("heads_hd16_T1", 2, 1, 4, 1, 16);
            test_attention_dq_ordered("heads_gqa_T77", 2, 77, 4, 2, 64);
            test_attention_dq_ordered("heads_gpt2_B3_T1024", 3, 1024, 12, 12, 64);
            set_switch("SHARDLM_ATTENTION_GRID", NULL);
            test_attention_dq_atomic("gpt2_B3_T1024", 3, 1024, 12, 12, 64);
            test_attention_dq_ordered("gpt2_B3_T1024", 3, 1024, 12, 12, 64);
            set_switch("SHARDLM_ATTENTION_DQ", "atomic");
            nondeterministic_mode = 1;
            for (int i = 0; i < N_ATT_SHAPES; i++)
                if (ATT_SHAPES[i].HD <= 64 && ATT_SHAPES[i].HD != 40) test_bf16_attention_shape("mma_dq_atomic_", i);
            nondeterministic_mode = 0;
            set_switch("SHARDLM_ATTENTION_DQ", "ordered");
            for (int i = 0; i < N_ATT_SHAPES; i++)
                if (ATT_SHAPES[i].HD <= 64 && ATT_SHAPES[i].HD != 40) test_bf16_attention_shape("mma_dq_ordered_", i);
            set_switch("SHARDLM_ATTENTION_DQ", NULL);
            set_switch("SHARDLM_ATTENTION", NULL);
        }
        gpu = fp32_gpu;
        cpu = &sl_ops_cpu;
    }

    if (group("attention_cudnn")) {
        // cuDNN's fused attention (attention_cudnn.cu, SHARDLM_ATTENTION=cudnn) on every shape of the bf16
        // group against the CPU's bf16 emulation, with its call counter: every shape but T = 1 (which
        // the mma.sync kernels take; before cuDNN 9.16 also T % 128 != 0) must have made its four calls
        // (forward and backward, each run twice) through cuDNN. First the backward's deterministic
        // form (the default: two runs give the same bytes), then dQ summed in fp32 in any order
        // (SHARDLM_ATTENTION_DQ=atomic; no two-runs check) on GQA, GPT-2's and head dim 128's shapes
        // (those with T a multiple of 128 too: cuDNN before 9.16 takes only those)
        // (each new shape is a kernel cuDNN compiles, seconds each). A failure names cuDNN's message.
        const sl_ops *fp32_gpu = gpu;
        if (bf16_tables()) {
            set_switch("SHARDLM_ATTENTION", "cudnn");
            const size_t version = cuda_attention_cudnn_version();
            printf("attention_cudnn: libcudnn version %zu (0: none loaded)\n", version);
            for (int dq = 0; dq < 2; dq++) {
                set_switch("SHARDLM_ATTENTION_DQ", dq ? "atomic" : NULL);
                nondeterministic_mode = dq;
                for (int i = 0; i < N_ATT_SHAPES; i++) {
                    static const char *const atomic_tags[] = {"gpt2_T1024", "gqa_T77", "hd128_T200", "gqa_T128",
                                                              "hd128_T256"};
                    int listed = 0;
                    for (int t = 0; t < 5; t++) listed |= !strcmp(ATT_SHAPES[i].tag, atomic_tags[t]);
                    if (dq && !listed) continue;
                    const unsigned long before = cuda_attention_cudnn_calls();
                    test_bf16_attention_shape(dq ? "cudnn_dq_atomic_" : "cudnn_", i);
                    const int theirs = ATT_SHAPES[i].T > 1 && (version >= 91600 || ATT_SHAPES[i].T % 128 == 0);
                    const unsigned long ran = cuda_attention_cudnn_calls() - before;
                    const char *name = bname(dq ? "attention_cudnn_dq_atomic_ran" : "attention_cudnn_ran",
                                             ATT_SHAPES[i].tag);
                    if (ran == (theirs ? 4u : 0u)) pass(name, 0.0);
                    else fail(name, "%lu cuDNN calls (expected %d)", ran, theirs ? 4 : 0);
                }
            }
            nondeterministic_mode = 0;
            set_switch("SHARDLM_ATTENTION_DQ", NULL);
            test_attention_cudnn_slices();
            double took, longest;
            const unsigned long built = cuda_attention_cudnn_plans(&took, &longest);
            printf("attention_cudnn: %lu plans built in %.1f s (the longest %.1f s)\n", built, took, longest);
            set_switch("SHARDLM_ATTENTION", NULL);
        }
        gpu = fp32_gpu;
        cpu = &sl_ops_cpu;
    }

    if (gpu->synchronize()) fail("synchronize_at_end", "%s", sl_error());
    else pass("synchronize_at_end", 0.0);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
