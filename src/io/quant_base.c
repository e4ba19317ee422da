// quant_base.c: a model built with only its quantised base weights (see quant_base.h).
// Invariant: while qb->installed, the ops' registry holds one entry per block linear of the model,
// keyed by its placeholder's address in m->params (in m->weights_bf16 under bf16 storage); neither
// buffer moves while installed: a quantised base trains only under adapters, and the engine, DDP and
// ZeRO 1-3 then work on the adapters' buffer, leaving the base's whole on every rank.
#include "shardlm/quant_base.h"
#include "shardlm/error.h"
#include "shardlm/hf_weights.h"
#include "shardlm/quant_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int has_config_json(const char *dir) {
    char p[4200];
    struct stat st;
    snprintf(p, sizeof p, "%s/config.json", dir);
    return stat(p, &st) == 0;
}

// The weights directory's own quantization_config (*present 0 when it has none).
static int file_quant(const sl_model_source *src, sl_quant_config *qc, int *present) {
    *present = 0;
    sl_quant_config_default(qc);
    if (!src->has_weights || !has_config_json(src->weights_dir)) return 0;
    return sl_quant_model_read_config(src->weights_dir, qc, present);
}

int sl_quant_base_wanted(const sl_model_source *src, const sl_quant_config *want, sl_quant_config *resolved) {
    sl_quant_config qc;
    int present;
    if (file_quant(src, &qc, &present)) return -1;
    if (resolved) *resolved = present ? qc : *want;
    return present || want->type != SL_QUANT_NONE;
}

typedef struct {
    sl_quant_model *qm;
    const sl_param_layout *L;
    sl_quant_dtype dtype;
} sink_ctx;

static int quantise_arriving(void *ctx, int t, const float *values) {
    sink_ctx *s = ctx;
    return sl_quant_model_quantize_one(s->qm, s->L, t, values, s->dtype);
}

// Every tensor from the seed: full-precision ones into params, the linears quantised one at a time.
static int init_quantised(sl_quant_model *qm, sl_model *m, uint64_t seed) {
    const sl_param_layout *L = &m->layout;
    if (sl_model_init_weights(m, seed)) return -1;   // the full-precision tensors (placeholders zero)
    size_t most = 0;
    for (int t = 0; t < L->n_tensors; t++)
        if (L->tensors[t].quantised && L->tensors[t].numel > most) most = L->tensors[t].numel;
    float *one = sl_malloc((most ? most : 1) * sizeof(float), "a weight to quantise");
    int rc = one ? 0 : -1;
    for (int t = 0; t < L->n_tensors && !rc; t++) {
        if (!L->tensors[t].quantised) continue;
        sl_model_init_tensor(m, t, seed, one);
        rc = sl_quant_model_quantize_one(qm, L, t, one, SL_QDT_F32);
    }
    free(one);
    return rc;
}

static int load_quantised(sl_quant_base *qb, sl_model *m, const sl_model_source *src, const sl_quant_config *want,
                          uint64_t seed) {
    sl_quant_config file_qc;
    int present;
    const sl_param_layout *L = &m->layout;
    if (file_quant(src, &file_qc, &present)) return -1;
    if (present) {
        if (want->type != SL_QUANT_NONE && want->type != file_qc.type)
            return sl_errorf("%s is already quantised as %s: --quantize %s cannot change that", src->weights_dir,
                             sl_quant_name(file_qc.type), sl_quant_name(want->type));
        return sl_quant_model_load(&qb->qm, src->weights_dir, L, m->params);
    }
    if (sl_quant_model_begin(&qb->qm, L, want)) return -1;
    if (!src->has_weights) return init_quantised(&qb->qm, m, seed);
    sink_ctx ctx = {&qb->qm, L, sl_quant_model_source_dtype(src->weights_dir)};
    return sl_hf_load_each(src->weights_dir, L, m->params, quantise_arriving, &ctx);
}

// The registry keyed by the addresses the model hands its linears: its placeholders in m->params, or
// under bf16 storage their twins in the bf16 weight shadow (model.c's W()).
static int install(sl_quant_base *qb, sl_model *m, const sl_ops *quant_ops) {
    sl_quant_ops_entry *e = sl_malloc(sizeof *e * 4 * (size_t)m->cfg.n_layer, "quantised linears");
    int n = 0, rc = !e || sl_quant_model_linears(&qb->qm, &m->layout, m->params, e, &n);
    for (int i = 0; !rc && m->weights_bf16 && i < n; i++)
        e[i].weight = m->weights_bf16 + ((const float *)e[i].weight - m->params);
    rc = rc || sl_quant_ops_install(e, n);
    free(e);
    if (rc) return -1;
    qb->installed = 1;
    m->ops = quant_ops;
    return 0;
}

int sl_quant_base_create(sl_quant_base *qb, sl_model *m, const sl_model_source *src, const sl_quant_config *want,
                         const sl_ops *ops, uint64_t seed) {
    memset(qb, 0, sizeof *qb);
    const sl_ops *quant_ops = sl_quant_ops_for(ops);
    if (!quant_ops)
        return sl_errorf("a quantised base (%s) computes with the CPU's ops only (fp32, or bf16 storage: "
                         "bitsandbytes' compute dtype float32 or bfloat16 on dequantised tiles); the %s ops table "
                         "cannot run it (use --device cpu)", sl_quant_name(want->type), ops->name);
    if (sl_model_create_quantised(m, &src->cfg, ops)) return -1;
    if (load_quantised(qb, m, src, want, seed) || install(qb, m, quant_ops)) {
        sl_model_free(m);
        sl_quant_base_free(qb);
        return -1;
    }
    for (int t = 0; t < m->layout.n_tensors; t++)
        if (m->layout.tensors[t].quantised) qb->full_bytes += m->layout.tensors[t].numel * sizeof(float);
    return 0;
}

size_t sl_quant_base_bytes(const sl_quant_base *qb) { return qb->qm.q ? sl_quant_model_bytes(&qb->qm) : 0; }

void sl_quant_base_free(sl_quant_base *qb) {
    if (qb->installed) sl_quant_ops_install(NULL, 0);
    sl_quant_model_free(&qb->qm);
    memset(qb, 0, sizeof *qb);
}
