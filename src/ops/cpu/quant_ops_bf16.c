// quant_ops_bf16.c: the bf16-storage CPU tables with their linears on registered quantised weights in
// bf16 compute, and sl_quant_ops_for, which names the quantised table of a base table (quant_ops.h).
//
// Each table is a copy of its base (cpu-bf16-onednn, or the emulation cpu-bf16), made once, with the
// five linear entries replaced: a weight the registry knows goes through quant_linear.h's bf16
// functions (native: oneDNN for cpu-bf16-onednn; the fp32 GEMM on bf16 values for the emulation), any
// other through the base's own entry. As the base tables do: matmul_gelu_forward computes pre in fp32,
// stores it rounded and applies GELU to the fp32 value; matmul_gelu_backward is the base's
// gelu_backward (dout overwritten, stored rounded) then matmul_backward; the bias gradient is the CPU's
// column sum of the stored dout (cpu_bf16_matmul_backward's, the emulation's bits). Failures (oneDNN,
// scratch) are recorded as cpu-bf16-onednn's and reported by the table's synchronize().
#include "shardlm/quant_ops.h"
#include "shardlm/error.h"
#include "ops/cpu/cpu_bf16.h"

#include <pthread.h>

#define BF16(p) ((const sl_bf16 *)(const void *)(p))

// The fp32 work of one quantised linear call (cpu_bf16_scratch slot 6; slot 7 holds matmul_gelu's pre).
static float *work_for(const sl_qlinear *l, int N, int native) {
    return cpu_bf16_failed() ? NULL : cpu_bf16_scratch(6, sl_qlinear_bf16_work_floats(l, N, native));
}

static void forward(const sl_ops *base, int native, sl_act *out, const sl_act *inp, const sl_act *weight,
                    const sl_act *bias, int N, int IC, int OC) {
    const sl_qlinear *l = sl_quant_ops_lookup(weight, IC, OC);
    if (!l) { base->matmul_forward(out, inp, weight, bias, N, IC, OC); return; }
    float *work = work_for(l, N, native);
    if (work && sl_qlinear_forward_bf16(l, out, 0, BF16(inp), BF16(bias), N, work, native)) cpu_bf16_record_failure();
}

static void backward(const sl_ops *base, int native, sl_act *dinp, float *dweight, float *dbias, const sl_act *dout,
                     const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    const sl_qlinear *l = sl_quant_ops_lookup(weight, IC, OC);
    if (!l) { base->matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); return; }
    float *work = dinp ? work_for(l, N, native) : NULL;
    if (work && sl_qlinear_backward_input_bf16(l, (sl_bf16 *)(void *)dinp, BF16(dout), N, work, native))
        cpu_bf16_record_failure();
    // the bias is not quantised: its column sums (no dinp, no dweight: the weight is not read); the frozen
    // base has no weight gradient
    if (dbias) cpu_bf16_matmul_backward(NULL, NULL, dbias, dout, inp, weight, N, IC, OC);
}

static void gelu_forward(const sl_ops *base, int native, sl_act *out, sl_act *pre, const sl_act *inp,
                         const sl_act *weight, const sl_act *bias, int N, int IC, int OC) {
    const sl_qlinear *l = sl_quant_ops_lookup(weight, IC, OC);
    if (!l) { base->matmul_gelu_forward(out, pre, inp, weight, bias, N, IC, OC); return; }
    size_t n = (size_t)N * (size_t)OC;
    float *work = work_for(l, N, native), *pre32 = work ? cpu_bf16_scratch(7, n) : NULL;
    if (!pre32) return;
    if (sl_qlinear_forward_bf16(l, pre32, 1, BF16(inp), BF16(bias), N, work, native)) {
        cpu_bf16_record_failure();
        return;
    }
    sl_f32_to_bf16_array(pre32, (sl_bf16 *)(void *)pre, n);
    cpu_gelu_forward(cpu_act(pre32), cpu_act(pre32), n);   // in place, from the fp32 value
    sl_f32_to_bf16_array(pre32, (sl_bf16 *)(void *)out, n);
}

static void gelu_backward(const sl_ops *base, int native, sl_act *dinp, float *dweight, float *dbias, sl_act *dout,
                          const sl_act *pre, const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    if (!sl_quant_ops_lookup(weight, IC, OC)) {
        base->matmul_gelu_backward(dinp, dweight, dbias, dout, pre, inp, weight, N, IC, OC);
        return;
    }
    base->gelu_backward(dout, pre, dout, (size_t)N * (size_t)OC);
    backward(base, native, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

// dinp = dout @ W, then its GELU gradient in place (the order matmul_backward_gelu states).
static void backward_gelu(const sl_ops *base, int native, sl_act *dinp, float *dweight, float *dbias,
                          const sl_act *dout, const sl_act *inp, const sl_act *weight, const sl_act *pre, int N,
                          int IC, int OC) {
    if (!sl_quant_ops_lookup(weight, IC, OC)) {
        base->matmul_backward_gelu(dinp, dweight, dbias, dout, inp, weight, pre, N, IC, OC);
        return;
    }
    backward(base, native, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (dinp) base->gelu_backward(dinp, pre, dinp, (size_t)N * (size_t)IC);
}

// Both tables' failures: the base's own, then the quantised linears' (cpu-bf16-onednn's record).
static int synchronize_native(void) { return sl_ops_cpu_bf16_native.synchronize(); }
static int synchronize_emulated(void) {
    int a = sl_ops_cpu_bf16.synchronize(), b = sl_ops_cpu_bf16_native.synchronize();
    return a || b ? -1 : 0;
}

// The entries of one table: its base and native flag fixed.
#define QUANT_BF16_ENTRIES(tag, BASE, NATIVE)                                                                       \
    static void tag##_forward(sl_act *out, const sl_act *inp, const sl_act *weight, const sl_act *bias, int N,     \
                              int IC, int OC) {                                                                    \
        forward(&BASE, NATIVE, out, inp, weight, bias, N, IC, OC);                                                 \
    }                                                                                                              \
    static void tag##_backward(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,  \
                               const sl_act *weight, int N, int IC, int OC) {                                      \
        backward(&BASE, NATIVE, dinp, dweight, dbias, dout, inp, weight, N, IC, OC);                               \
    }                                                                                                              \
    static void tag##_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight,              \
                                   const sl_act *bias, int N, int IC, int OC) {                                    \
        gelu_forward(&BASE, NATIVE, out, pre, inp, weight, bias, N, IC, OC);                                       \
    }                                                                                                              \
    static void tag##_gelu_backward(sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre,   \
                                    const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {              \
        gelu_backward(&BASE, NATIVE, dinp, dweight, dbias, dout, pre, inp, weight, N, IC, OC);                     \
    }                                                                                                              \
    static void tag##_backward_gelu(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout,                \
                                    const sl_act *inp, const sl_act *weight, const sl_act *pre, int N, int IC,     \
                                    int OC) {                                                                      \
        backward_gelu(&BASE, NATIVE, dinp, dweight, dbias, dout, inp, weight, pre, N, IC, OC);                     \
    }
QUANT_BF16_ENTRIES(native, sl_ops_cpu_bf16_native, 1)
QUANT_BF16_ENTRIES(emulated, sl_ops_cpu_bf16, 0)

static sl_ops native_table, emulated_table;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

// t = base with the five linear entries of `tag` (QUANT_BF16_ENTRIES) and the synchronize above.
#define MAKE_TABLE(t, base, table_name, tag)         \
    do {                                             \
        t = base;                                    \
        t.name = table_name;                         \
        t.matmul_forward = tag##_forward;            \
        t.matmul_backward = tag##_backward;          \
        t.matmul_gelu_forward = tag##_gelu_forward;  \
        t.matmul_gelu_backward = tag##_gelu_backward; \
        t.matmul_backward_gelu = tag##_backward_gelu; \
        t.synchronize = synchronize_##tag;           \
    } while (0)

static void build_tables(void) {
    MAKE_TABLE(native_table, sl_ops_cpu_bf16_native, "cpu-bf16-onednn+quant", native);
    MAKE_TABLE(emulated_table, sl_ops_cpu_bf16, "cpu-bf16+quant", emulated);
}

const sl_ops *sl_quant_ops_for(const sl_ops *base) {
    if (base == &sl_ops_cpu) return &sl_ops_cpu_quant;
    pthread_once(&tables_once, build_tables);
    if (base == &sl_ops_cpu_bf16_native) return &native_table;
    if (base == &sl_ops_cpu_bf16) return &emulated_table;
    return NULL;
}
