// ops_cpu_bf16.c: sl_ops_cpu_bf16, a test backend emulating the GPU's bf16 activation storage
// (ops.h, act_bf16 = 1) on the CPU. Each op's storage arguments (ops_list.h) are staged: those it
// reads are widened from bf16 into fp32 temporaries, those it writes get fp32 temporaries; the CPU
// op runs on them, and what it wrote (in place and accumulated arguments included) is rounded back
// to bf16 (nearest even, as sl_f32_to_bf16). fp32 arguments (parameter gradients, statistics) pass
// straight through. The COMPOSED ops of the list are written by hand below: the fused ones as the
// ops they fuse, so their intermediate is stored rounded as on the GPU.
// Memory functions and optimizer passes are the CPU's. Slow (two conversions and a heap buffer per
// tensor per op): it exists so that CI runs the model's bf16 storage plumbing without a GPU.
#include "ops/cpu/cpu_ops.h"
#include "ops/lora_compose.h"
#include "shardlm/precision.h"

#include "shardlm/error.h"

#include <stdio.h>
#include <stdlib.h>

static const sl_ops *const cpu = &sl_ops_cpu;

// A temporary that could not be allocated: the op does nothing more, and the first failure is
// reported by synchronize() (as a failed GPU call is), which the engine checks every step.
static int g_failed;
static char g_failure[160];

static int bf16_synchronize(void) {
    if (cpu_synchronize()) return -1;  // a failure of the fp32 ops it stages through
    if (!g_failed) return 0;
    g_failed = 0;
    return sl_errorf("%s", g_failure);
}

// An fp32 temporary of n elements; NULL (failure recorded) when the heap is out.
static float *scratch(size_t n) {
    float *f = malloc((n ? n : 1) * sizeof(float));
    if (!f && !g_failed) {
        g_failed = 1;
        snprintf(g_failure, sizeof g_failure, "cpu-bf16: out of memory for a %zu-float temporary", n);
    }
    return f;
}

// bf16 storage (n elements) widened into a new fp32 temporary; NULL stays NULL.
static float *widen(const sl_act *storage, size_t n) {
    if (!storage) return NULL;
    float *f = scratch(n);
    if (f) sl_bf16_to_f32_array((const sl_bf16 *)(const void *)storage, f, n);
    return f;
}

// The fp32 temporary f rounded into bf16 storage (n elements; none for NULL storage), then freed.
static void narrow(sl_act *storage, float *f, size_t n) {
    if (storage && f && !g_failed) sl_f32_to_bf16_array(f, (sl_bf16 *)(void *)storage, n);
    free(f);
}

// ---- staging -------------------------------------------------------------------------------------

// One call's staged storage arguments: the caller's pointer, its fp32 temporary, the element count
// and whether the op writes it (rounded back after the call).
typedef struct {
    sl_act *orig;
    float *tmp;
    size_t n;
    int write;
} staged_arg;
typedef struct {
    staged_arg arg[8];
    int n;
} staging;

// The fp32 temporary standing in for storage p (n elements), widened from it when the op reads it;
// NULL for NULL (an optional argument) or when the heap is out (failure recorded).
static sl_act *stage(staging *st, const sl_act *p, size_t n, int read, int write) {
    if (!p) return NULL;
    if (st->n == (int)(sizeof st->arg / sizeof st->arg[0])) {
        if (!g_failed) snprintf(g_failure, sizeof g_failure, "cpu-bf16: an op with more than %d storage arguments",
                                st->n);
        g_failed = 1;
        return NULL;
    }
    float *t = read ? widen(p, n) : scratch(n);
    st->arg[st->n++] = (staged_arg){(sl_act *)p, t, n, write};
    return cpu_act(t);
}

// After the call: the written temporaries rounded back into their storage, every temporary freed.
static void unstage(staging *st) {
    for (int i = 0; i < st->n; i++) {
        staged_arg *a = &st->arg[i];
        if (a->write) narrow(a->orig, a->tmp, a->n);
        else free(a->tmp);
    }
}

#define SL_IN(p, n) p = stage(&st, p, n, 1, 0);
#define SL_OUT(p, n) p = stage(&st, p, n, 0, 1);
#define SL_INOUT(p, n) p = stage(&st, p, n, 1, 1);
#define CALL_void(name, args)        \
    if (!g_failed) cpu->name args; \
    unstage(&st);
#define CALL_double(name, args)                       \
    double result = g_failed ? 0.0 : cpu->name args; \
    unstage(&st);                                     \
    return result;
// emul_<op> for every STAGED op of the list; nothing for the COMPOSED ones.
#define WRAP_STAGED(ret, name, params, args, storage) \
    static ret emul_##name params {                   \
        staging st = {.n = 0};                        \
        storage CALL_##ret(name, args)                \
    }
#define WRAP_COMPOSED(ret, name, params, args, storage)
#define WRAP(ret, name, params, args, storage, flops, emulation) WRAP_##emulation(ret, name, params, args, storage)
SL_OPS(WRAP)
#undef WRAP

// ---- the COMPOSED ops -----------------------------------------------------------------------------

static size_t sz(int a, int b) { return (size_t)a * (size_t)b; }

// wte and wpe are bf16 (the parameters' shadow): the rows the batch reads are widened into a table
// of N rows that row n of the batch indexes (token ids 0..N-1), wpe whole.
static void composed_encoder_forward(sl_act *out, const int *inp, const sl_act *wte, const sl_act *wpe, int B, int T,
                                     int C) {
    size_t N = sz(B, T), n = sz(B * T, C);
    float *rows = scratch(n), *o = scratch(n), *pe = widen(wpe, sz(T, C));
    int *ids = (int *)(void *)scratch(N);
    for (size_t r = 0; !g_failed && r < N; r++) {
        ids[r] = (int)r;
        sl_bf16_to_f32_array((const sl_bf16 *)(const void *)wte + (size_t)inp[r] * C, rows + r * C, (size_t)C);
    }
    if (!g_failed) cpu->encoder_forward(cpu_act(o), ids, cpu_act(rows), cpu_act(pe), B, T, C);
    narrow(out, o, n);
    free(rows);
    free(pe);
    free(ids);
}

// dout is overwritten with the pre-GELU gradient, stored (rounded); the GEMMs and the bias gradient
// then read it as stored, as the GPU's fused kernel and its unfused path both do.
static void composed_matmul_gelu_backward(sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre,
                                          const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    emul_gelu_backward(dout, pre, dout, sz(N, OC));
    emul_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

// dinp is stored (rounded), then its GELU gradient is stored over it: two roundings, as the GPU's
// unfused path (its DGELU epilogue rounds once, within one bf16 step of this).
static void composed_matmul_backward_gelu(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout,
                                          const sl_act *inp, const sl_act *weight, const sl_act *pre, int N, int IC,
                                          int OC) {
    emul_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (dinp) emul_gelu_backward(dinp, pre, dinp, sz(N, IC));
}

// The fused residual norms: resid is stored (rounded) first and the norm reads it back as stored,
// as the GPU's kernels do and as residual_forward followed by the norm's forward would.
static void composed_residual_layernorm_forward(sl_act *resid, sl_act *out, float *mean, float *rstd, const sl_act *a,
                                                const sl_act *b, const sl_act *w, const sl_act *bias, int N, int C,
                                                float eps) {
    emul_residual_forward(resid, a, b, sz(N, C));
    emul_layernorm_forward(out, mean, rstd, resid, w, bias, N, C, eps);
}

static void composed_residual_rmsnorm_forward(sl_act *resid, sl_act *out, float *rstd, const sl_act *a,
                                              const sl_act *b, const sl_act *w, int N, int C, float eps) {
    emul_residual_forward(resid, a, b, sz(N, C));
    emul_rmsnorm_forward(out, rstd, resid, w, N, C, eps);
}

// LoRA's ops as the ops they are made of (lora_compose.h), each intermediate stored rounded.
SL_LORA_COMPOSED_OPS(sl_ops_cpu_bf16)

#define PICK_STAGED(name) emul_##name
#define PICK_COMPOSED(name) composed_##name
#define ENTRY(ret, name, params, args, storage, flops, emulation) .name = PICK_##emulation(name),

const sl_ops sl_ops_cpu_bf16 = {
    .name = "cpu-bf16",
    SL_OPS(ENTRY)
    .act_bf16 = 1,
    .sliding_window = 1,
    .synchronize = bf16_synchronize,
    SL_CPU_HOST_FNS,  // memory functions and optimizer passes are the CPU's
};
