// quant_ops.c: sl_ops_cpu_quant, the CPU table whose linears read registered quantised weights
// (see quant_ops.h).
#include "shardlm/quant_ops.h"
#include "shardlm/error.h"
#include "ops/cpu/cpu_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sl_quant_ops_entry *registry;
static int n_registry;
static float *scratch;   // the tile buffer every registered linear uses
static sl_bf16 *scratch_bf16;   // and its bf16 twin (the bf16 tables, quant_ops_bf16.c)

int sl_quant_ops_install(const sl_quant_ops_entry *entries, int n) {
    free(registry);
    free(scratch);
    free(scratch_bf16);
    registry = NULL;
    scratch = NULL;
    scratch_bf16 = NULL;
    n_registry = 0;
    if (n <= 0) return 0;
    size_t most = 1, most_bf16 = 1;
    for (int i = 0; i < n; i++) {
        if (sl_qlinear_tile_floats(&entries[i].lin) > most) most = sl_qlinear_tile_floats(&entries[i].lin);
        if (sl_qlinear_bf16_tile_values(&entries[i].lin) > most_bf16)
            most_bf16 = sl_qlinear_bf16_tile_values(&entries[i].lin);
    }
    registry = sl_malloc((size_t)n * sizeof *registry, "quantised linear registry");
    scratch = sl_malloc(most * sizeof(float), "quantised linear tile");
    scratch_bf16 = sl_malloc(most_bf16 * sizeof(sl_bf16), "quantised linear bf16 tile");
    if (!registry || !scratch || !scratch_bf16) {
        sl_quant_ops_install(NULL, 0);
        return -1;
    }
    memcpy(registry, entries, (size_t)n * sizeof *registry);
    for (int i = 0; i < n; i++) {
        registry[i].lin.scratch = scratch;
        registry[i].lin.scratch_bf16 = scratch_bf16;
    }
    n_registry = n;
    return 0;
}

const sl_qlinear *sl_quant_ops_lookup(const sl_act *weight, int IC, int OC) {
    for (int i = 0; i < n_registry; i++) {
        if (registry[i].weight != (const void *)weight) continue;
        const sl_qlinear *l = &registry[i].lin;
        if (l->in_features != IC || l->out_features != OC) {
            fprintf(stderr, "fatal: quantised linear registered as [%lld, %lld] used as [%d, %d]\n",
                    (long long)l->out_features, (long long)l->in_features, OC, IC);
            abort();
        }
        return l;
    }
    return NULL;
}

static void q_matmul_forward(sl_act *out, const sl_act *inp, const sl_act *weight, const sl_act *bias, int N, int IC,
                             int OC) {
    const sl_qlinear *l = sl_quant_ops_lookup(weight, IC, OC);
    if (!l) { cpu_matmul_forward(out, inp, weight, bias, N, IC, OC); return; }
    sl_qlinear_forward(l, cpu_f32(out), cpu_f32(inp), cpu_f32(bias), N);   // with the scratch: cannot fail
}

static void q_matmul_backward(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,
                              const sl_act *weight, int N, int IC, int OC) {
    const sl_qlinear *l = sl_quant_ops_lookup(weight, IC, OC);
    if (!l) { cpu_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); return; }
    if (dinp) sl_qlinear_backward_input(l, cpu_f32(dinp), cpu_f32(dout), N, 0);
    // the bias is not quantised: cpu_matmul_backward's own column sums (no dinp, no dweight: weight unread)
    if (dbias) cpu_matmul_backward(NULL, NULL, dbias, dout, inp, weight, N, IC, OC);
}

static void q_matmul_gelu_forward(sl_act *out, sl_act *pre, const sl_act *inp, const sl_act *weight,
                                  const sl_act *bias, int N, int IC, int OC) {
    q_matmul_forward(pre, inp, weight, bias, N, IC, OC);
    cpu_gelu_forward(out, pre, (size_t)N * OC);
}

static void q_matmul_gelu_backward(sl_act *dinp, float *dweight, float *dbias, sl_act *dout, const sl_act *pre,
                                   const sl_act *inp, const sl_act *weight, int N, int IC, int OC) {
    cpu_gelu_backward(dout, pre, dout, (size_t)N * OC);
    q_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
}

static void q_matmul_backward_gelu(sl_act *dinp, float *dweight, float *dbias, const sl_act *dout, const sl_act *inp,
                                   const sl_act *weight, const sl_act *pre, int N, int IC, int OC) {
    q_matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
    if (dinp) cpu_gelu_backward(dinp, pre, dinp, (size_t)N * IC);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"  // the five linear entries replace the CPU ones
const sl_ops sl_ops_cpu_quant = {
    .name = "cpu-quant",
    SL_OPS(SL_CPU_OP_ENTRY)
    .matmul_forward = q_matmul_forward,
    .matmul_backward = q_matmul_backward,
    .matmul_gelu_forward = q_matmul_gelu_forward,
    .matmul_gelu_backward = q_matmul_gelu_backward,
    .matmul_backward_gelu = q_matmul_backward_gelu,
    .act_bf16 = 0,
    .sliding_window = 1,
    .synchronize = cpu_synchronize,
    SL_CPU_HOST_FNS,
};
#pragma GCC diagnostic pop
