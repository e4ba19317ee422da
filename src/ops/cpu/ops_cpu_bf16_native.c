// ops_cpu_bf16_native.c: sl_ops_cpu_bf16_native ("cpu-bf16-onednn"), bf16 activation storage on the CPU
// for real (ops.h act_bf16 = 1), for CPUs with bf16 instructions (sl_ops_cpu_bf16_native_usable). The
// GEMM ops run on the bf16 operands through oneDNN (matmul_bf16.c). Every other op is staged as the
// emulation (ops_cpu_bf16.c) stages it: the storage it reads widened to fp32, the CPU op, what it wrote
// rounded back (nearest even), so those ops give the emulation's bits for the same inputs; but the
// fp32 temporaries are scratch buffers kept across calls, one per argument position (no heap
// allocation per call), and cross-entropy is staged a block of rows at a time (its logits are the
// largest activation); attention_decode reads the bf16 KV cache in place (attention_decode.c), and
// residual_forward, add_columns and take_columns read and write their storage in place
// (elementwise_bf16.c), with the staged ops' bits. The composed ops are the emulation's compositions, except
// encoder_forward, which reads its rows of the bf16 tables directly, and the LoRA ops, four oneDNN bf16
// matmuls each (lora_bf16.c) instead of the emulation's composition with rounded intermediates. Memory functions and optimizer passes are the CPU's. The ops are called from one thread at
// a time (the model's), as the scratch buffers and the failure record assume.
#include "ops/cpu/cpu_bf16.h"
#include "shardlm/cpu_features.h"
#include "shardlm/error.h"
#include "shardlm/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const sl_ops *const cpu = &sl_ops_cpu;

// ---- failures and scratch ------------------------------------------------------------------------

// The first failure since the last synchronize(), which reports it (as a failed GPU call is reported).
static int g_failed;
static char g_failure[320];

void cpu_bf16_record_failure(void) {
    if (!g_failed) snprintf(g_failure, sizeof g_failure, "cpu-bf16-onednn: %s", sl_error());
    g_failed = 1;
}

int cpu_bf16_failed(void) { return g_failed; }

void cpu_bf16_region_report(const cpu_bf16_region_failure *f) {
    if (!f->failed) return;
    sl_errorf("%s", f->message);
    cpu_bf16_record_failure();
}

static int native_synchronize(void) {
    if (cpu_synchronize()) return -1;  // a failure of an fp32 op it stages through
    if (!g_failed) return 0;
    g_failed = 0;
    return sl_errorf("%s", g_failure);
}

static struct {
    float *p;
    size_t cap;
} slots[CPU_BF16_SLOTS];

float *cpu_bf16_scratch(int slot, size_t n) {
    if (n > slots[slot].cap) {
        free(slots[slot].p);
        slots[slot].cap = 0;
        if (!(slots[slot].p = malloc(n * sizeof(float)))) {
            sl_errorf("out of memory for a %zu-float scratch buffer", n);
            cpu_bf16_record_failure();
            return NULL;
        }
        slots[slot].cap = n;
    }
    return slots[slot].p;
}

// ---- staging -------------------------------------------------------------------------------------

// One call's staged storage arguments, in the order of the op's storage column: argument k is staged in
// scratch slot k.
typedef struct {
    struct {
        sl_act *storage;
        float *f32;
        size_t n;
        int write;
    } arg[CPU_BF16_SLOTS];
    int n;
} staging;

// The fp32 stand-in for storage p (n elements), widened from it when the op reads it; NULL for NULL (an
// optional argument) or after a failure.
static sl_act *stage(staging *st, const sl_act *p, size_t n, int read, int write) {
    if (!p || g_failed) return NULL;
    float *f = st->n < CPU_BF16_SLOTS ? cpu_bf16_scratch(st->n, n) : NULL;
    if (!f) {
        if (!g_failed) sl_errorf("an op with more than %d storage arguments", CPU_BF16_SLOTS);
        cpu_bf16_record_failure();
        return NULL;
    }
    if (read) sl_bf16_to_f32_array((const sl_bf16 *)(const void *)p, f, n);
    st->arg[st->n].storage = (sl_act *)p;
    st->arg[st->n].f32 = f;
    st->arg[st->n].n = n;
    st->arg[st->n++].write = write;
    return cpu_act(f);
}

// After the call: what the op wrote rounded back into its storage.
static void unstage(const staging *st) {
    for (int i = 0; i < st->n && !g_failed; i++)
        if (st->arg[i].write) sl_f32_to_bf16_array(st->arg[i].f32, (sl_bf16 *)(void *)st->arg[i].storage, st->arg[i].n);
}

#define SL_IN(p, n) p = stage(&st, p, n, 1, 0);
#define SL_OUT(p, n) p = stage(&st, p, n, 0, 1);
#define SL_INOUT(p, n) p = stage(&st, p, n, 1, 1);
#define CALL_void(name, args) \
    if (!g_failed) cpu->name args; \
    unstage(&st);
#define CALL_double(name, args)                       \
    double result = g_failed ? 0.0 : cpu->name args; \
    unstage(&st);                                     \
    return result;
// staged_<op> for every STAGED op of the list (the table's oneDNN GEMMs and blocked cross-entropy,
// below, override those entries).
#define WRAP_STAGED(ret, name, params, args, storage) \
    static ret staged_##name params {                 \
        staging st = {.n = 0};                        \
        storage CALL_##ret(name, args)                \
    }
#define WRAP_COMPOSED(ret, name, params, args, storage)
#define WRAP(ret, name, params, args, storage, flops, emulation) WRAP_##emulation(ret, name, params, args, storage)
SL_OPS(WRAP)
#undef WRAP

// ---- the COMPOSED ops -----------------------------------------------------------------------------

// out (B,T,C) = wte[inp] (+ wpe[t]) from the bf16 tables: the sum in fp32, rounded once; a copy without wpe.
static void composed_encoder_forward(sl_act *out_, const int *inp, const sl_act *wte_, const sl_act *wpe_, int B,
                                     int T, int C) {
    if (g_failed) return;
    sl_bf16 *out = (sl_bf16 *)(void *)out_;
    const sl_bf16 *wte = (const sl_bf16 *)(const void *)wte_, *wpe = (const sl_bf16 *)(const void *)wpe_;
#pragma omp parallel for schedule(static) if((size_t)B * T * C >= SL_PAR_MIN_WORK)
    for (int n = 0; n < B * T; n++) {
        sl_bf16 *o = out + (size_t)n * C;
        const sl_bf16 *e = wte + (size_t)inp[n] * C;
        if (!wpe) {
            memcpy(o, e, sizeof(sl_bf16) * (size_t)C);
            continue;
        }
        const sl_bf16 *p = wpe + (size_t)(n % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = sl_bf16_round(sl_bf16_widen(e[c]) + sl_bf16_widen(p[c]));
    }
}

// dout is overwritten with the pre-GELU gradient, stored (rounded); the GEMMs and the bias gradient
// then read it as stored, as the emulation and the GPU do.
static void composed_matmul_gelu_backward(sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre,
                                          const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    cpu_bf16_gelu_backward(dout, pre, dout, (size_t)N * OC);
    cpu_bf16_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

// dinp stored (rounded), then its GELU gradient stored over it, as the emulation does.
static void composed_matmul_backward_gelu(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout,
                                          const sl_act *inp, const sl_act *weight, const sl_act *pre, int N, int IC,
                                          int OC) {
    cpu_bf16_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (dinp) cpu_bf16_gelu_backward(dinp, pre, dinp, (size_t)N * IC);
}

// ---- row-blocked staging ----------------------------------------------------------------------------

// The other norms work row by row, so they are staged a block of rows at a time (RMSNorm's backward
// and RoPE run in place instead: norm_bf16.c, elementwise_bf16.c): the block's rows
// widened into scratch that stays in cache (about 64K floats an argument) instead of whole tensors
// streamed through memory three times. Each row gets the fp32 op's own code on the same values, and
// the weight gradients' column sums still add the rows in order (norm.c), so the bits are the
// emulation's (test: row_blocked_ops_give_the_emulations_bits).
// Cross-entropy (below) is staged the same way in larger blocks.
#define NORM_BLOCK_FLOATS 65536
static int rows_per_block(int width, int floats) { return width >= floats ? 1 : floats / width; }
#define ROWS(p, r0, C) ((p) ? sl_act_at((p), (size_t)(r0) * (size_t)(C), sizeof(sl_bf16)) : NULL)
// The blocks [r0, r0 + n) of N rows of `width` elements, about `floats` elements each, until a failure.
#define FOR_ROW_BLOCKS(N, width, floats)                                              \
    for (int r0 = 0, rows = rows_per_block(width, floats), n = (N) < rows ? (N) : rows; \
         r0 < (N) && !g_failed; r0 += rows, n = (N) - r0 < rows ? (N) - r0 : rows)

static void blocked_layernorm_forward(sl_act *out, float *mean, float *rstd, const sl_act *inp, const sl_act *w,
                                      const sl_act *b, int N, int C, float eps) {
    FOR_ROW_BLOCKS(N, C, NORM_BLOCK_FLOATS)
    staged_layernorm_forward(ROWS(out, r0, C), mean + r0, rstd + r0, ROWS(inp, r0, C), w, b, n, C, eps);
}

static void blocked_layernorm_backward(sl_act *dinp, float *dw, float *db, const sl_act *dout, const sl_act *inp,
                                       const sl_act *w, const float *mean, const float *rstd, int N, int C) {
    FOR_ROW_BLOCKS(N, C, NORM_BLOCK_FLOATS)
    staged_layernorm_backward(ROWS(dinp, r0, C), dw, db, ROWS(dout, r0, C), ROWS(inp, r0, C), w, mean + r0, rstd + r0,
                              n, C);
}

static void blocked_rmsnorm_forward(sl_act *out, float *rstd, const sl_act *inp, const sl_act *w, int N, int C,
                                    float eps) {
    FOR_ROW_BLOCKS(N, C, NORM_BLOCK_FLOATS)
    staged_rmsnorm_forward(ROWS(out, r0, C), rstd + r0, ROWS(inp, r0, C), w, n, C, eps);
}

// The fused residual norms: resid stored (rounded) first, the norm reads it back as stored.
static void composed_residual_layernorm_forward(sl_act *resid, sl_act *out, float *mean, float *rstd, const sl_act *a,
                                                const sl_act *b, const sl_act *w, const sl_act *bias, int N, int C,
                                                float eps) {
    cpu_bf16_residual_forward(resid, a, b, (size_t)N * C);
    blocked_layernorm_forward(out, mean, rstd, resid, w, bias, N, C, eps);
}

static void composed_residual_rmsnorm_forward(sl_act *resid, sl_act *out, float *rstd, const sl_act *a,
                                              const sl_act *b, const sl_act *w, int N, int C, float eps) {
    cpu_bf16_residual_forward(resid, a, b, (size_t)N * C);
    blocked_rmsnorm_forward(out, rstd, resid, w, N, C, eps);
}

// Attention on oneDNN's bf16 matmuls (attention_bf16.c), or with SHARDLM_ATTENTION=simt staged as the
// emulation stages it (its bits).
static void matrix_attention_forward(sl_act *out, float *lse, const sl_act *qkv, int B, int T, int NH, int NKV, int HD,
                                     int window) {
    if (sl_settings_get()->attention != SL_ATTENTION_SIMT)
        cpu_bf16_attention_forward(out, lse, qkv, B, T, NH, NKV, HD, window);
    else staged_attention_forward(out, lse, qkv, B, T, NH, NKV, HD, window);
}

static void matrix_attention_backward(sl_act *dqkv, const sl_act *dout, const sl_act *qkv, const sl_act *out,
                                      const float *lse, int B, int T, int NH, int NKV, int HD, int window) {
    if (sl_settings_get()->attention != SL_ATTENTION_SIMT)
        cpu_bf16_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, window);
    else staged_attention_backward(dqkv, dout, qkv, out, lse, B, T, NH, NKV, HD, window);
}

// LoRA's ops: four oneDNN bf16 matmuls each, the adapter's output added inside the second (lora_bf16.c),
// not the emulation's composition with its rounded intermediates.
static void composed_lora_forward(sl_act *y, sl_act *u, sl_act *delta, const sl_act *x, const sl_act *A,
                                  const sl_act *B, float scale, int N, int in, int r, int out, int ld, int col0) {
    cpu_bf16_lora_forward(y, u, delta, x, A, B, scale, N, in, r, out, ld, col0);
}

static void composed_lora_backward(sl_act *dx, float *dA, float *dB, sl_act *du, sl_act *delta, sl_act *dh,
                                   const sl_act *dy, const sl_act *x, const sl_act *u, const sl_act *A,
                                   const sl_act *B, float scale, int N, int in, int r, int out, int ld, int col0) {
    cpu_bf16_lora_backward(dx, dA, dB, du, delta, dh, dy, x, u, A, B, scale, N, in, r, out, ld, col0);
}

// Cross-entropy a block of rows at a time (its rows are independent), so the scratch holds about 512K
// logits (2 MB, 10 rows of GPT-2's) instead of all N * Vp of them (206 MB for GPT-2 at B*T = 1024);
// blocks of 2M logits were 5-20% slower (AMX Xeon, 1 and 2 threads). The forward's total
// is cpu_crossentropy_forward's own sum, each counted row's lse minus its target's logit added
// serially in double over all rows, so both ops give the emulation's bits.
#define CE_BLOCK_FLOATS (1 << 19)

// Adds to *total, in row order, the loss term of each counted row of [r0, r0 + n): its lse minus its
// target's logit as stored.
static void add_loss_terms(double *total, const float *lse, const sl_act *logits, const int *targets, int r0, int n,
                           int Vp) {
    const sl_bf16 *x = (const sl_bf16 *)(const void *)logits;
    for (int i = r0; i < r0 + n && !g_failed; i++)
        if (targets[i] >= 0) *total += (double)(lse[i] - sl_bf16_to_f32(x[(size_t)i * Vp + targets[i]]));
}

static double blocked_crossentropy_forward(float *lse, const sl_act *logits, const int *targets, int N, int V,
                                           int Vp) {
    FOR_ROW_BLOCKS(N, Vp, CE_BLOCK_FLOATS)
    staged_crossentropy_forward(lse + r0, ROWS(logits, r0, Vp), targets + r0, n, V, Vp);
    double total = 0.0;
    add_loss_terms(&total, lse, logits, targets, 0, N, Vp);
    return g_failed ? 0.0 : total;
}

static void blocked_crossentropy_backward(sl_act *logits, const float *lse, const int *targets, int N, int V, int Vp,
                                          float dloss) {
    FOR_ROW_BLOCKS(N, Vp, CE_BLOCK_FLOATS)
    staged_crossentropy_backward(ROWS(logits, r0, Vp), lse + r0, targets + r0, n, V, Vp, dloss);
}

// Both in one call, a block of rows at a time: each block's forward, its rows' loss terms (added in
// row order as blocked_crossentropy_forward adds them, so the same total), then its backward.
static double blocked_crossentropy_fused(float *lse, sl_act *logits, const int *targets, int N, int V, int Vp,
                                         float dloss) {
    double total = 0.0;
    FOR_ROW_BLOCKS(N, Vp, CE_BLOCK_FLOATS) {
        sl_act *block = ROWS(logits, r0, Vp);
        staged_crossentropy_forward(lse + r0, block, targets + r0, n, V, Vp);
        add_loss_terms(&total, lse, logits, targets, r0, n, Vp);
        staged_crossentropy_backward(block, lse + r0, targets + r0, n, V, Vp, dloss);
    }
    return g_failed ? 0.0 : total;
}

#define PICK_STAGED(name) staged_##name
#define PICK_COMPOSED(name) composed_##name
#define ENTRY(ret, name, params, args, storage, flops, emulation) .name = PICK_##emulation(name),

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"  // the entries below replace their staged ones
const sl_ops sl_ops_cpu_bf16_native = {
    .name = "cpu-bf16-onednn",
    SL_OPS(ENTRY)
    .matmul_forward = cpu_bf16_matmul_forward,
    .matmul_backward = cpu_bf16_matmul_backward,
    .matmul_gelu_forward = cpu_bf16_matmul_gelu_forward,
    .attention_forward = matrix_attention_forward,
    .attention_backward = matrix_attention_backward,
    .attention_decode = cpu_bf16_attention_decode,
    .residual_forward = cpu_bf16_residual_forward,
    .gelu_forward = cpu_bf16_gelu_forward,
    .gelu_backward = cpu_bf16_gelu_backward,
    .swiglu_forward = cpu_bf16_swiglu_forward,
    .swiglu_backward = cpu_bf16_swiglu_backward,
    .layernorm_forward = blocked_layernorm_forward,
    .layernorm_backward = blocked_layernorm_backward,
    .rmsnorm_forward = blocked_rmsnorm_forward,
    .rmsnorm_backward = cpu_bf16_rmsnorm_backward,
    .rope_forward = cpu_bf16_rope_forward,
    .rope_backward = cpu_bf16_rope_backward,
    .add_columns = cpu_bf16_add_columns,
    .take_columns = cpu_bf16_take_columns,
    .crossentropy_forward = blocked_crossentropy_forward,
    .crossentropy_backward = blocked_crossentropy_backward,
    .crossentropy_fused = blocked_crossentropy_fused,
    .act_bf16 = 1,
    .sliding_window = 1,
    .synchronize = native_synchronize,
    SL_CPU_HOST_FNS,  // memory functions and optimizer passes are the CPU's
};
#pragma GCC diagnostic pop

// ---- when it is used --------------------------------------------------------------------------------

int sl_ops_cpu_bf16_native_usable(char *why, size_t cap) {
    const sl_cpu_features *f = sl_cpu_features_get();
    char kernel[64];
    if (!sl_settings_get()->cpu_bf16) {
        snprintf(why, cap, "SHARDLM_CPU_BF16=0");
        return 0;
    }
    if (!f->avx512_bf16 && !f->amx_bf16) {
        snprintf(why, cap, "this CPU has no bf16 instructions (avx512_bf16 or amx_bf16)");
        return 0;
    }
    if (cpu_gemm_bf16_kernel(kernel, sizeof kernel)) {
        snprintf(why, cap, "%s", sl_error());
        return 0;
    }
    if (!strncmp(kernel, "ref", 3)) {
        snprintf(why, cap, "oneDNN has only its reference bf16 matmul (%s) for this CPU", kernel);
        return 0;
    }
    snprintf(why, cap, "oneDNN matmul %s", kernel);
    return 1;
}
