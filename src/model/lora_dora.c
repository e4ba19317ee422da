// lora_dora.c: DoRA's weight norms, forward and backward (lora_dora.h) on the CPU backend. The GEMMs
// go through the ops tables (the run's for activations, the fp32 CPU table for B A), the per-column
// scaling and the magnitudes' gradients are elementwise passes here, in fp32.
// Invariants: after a forward on N rows, norm[a] holds adapter a's n_j and z[a] its (N, out) z;
// lora_dora_base_grad fills dy (the scaled copy) for its linear before lora_dora_backward reads it.
#include "model/lora_dora.h"
#include "shardlm/error.h"
#include "shardlm/quant_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DM_COLS 64  // output columns a thread takes at a time in the magnitudes' gradient

struct sl_dora {
    float **norm;         // per adapter (out): n_j from the last forward
    uint64_t *version;    // per adapter: lo->version when norm was taken (reused until it changes)
    sl_act **z;           // per adapter (N, out), stored as the activations: x_d W^T + s B A x_d, for dm
                          // (NULL: no backward planned)
    int N;                // rows planned
    void *act;            // dy (N, ld_max), t (N, out_max), th (N, in_max), sl (N, out_max): activations
    sl_act *dy, *t, *th, *sl;
    float *ba, *at;       // (out_max, in_max) B A and (in_max, r_max) A^T, fp32
    float *va, *vb, *vm;  // (r_max, in_max), (out_max, r_max), (out_max): A, B, m widened from bf16
    float *g;             // (out_max): m / n of the adapter at hand
    float *w;             // (out_max, in_max): an adapter's base rows in fp32 (dequantised, or widened)
    sl_act *w_act;        // (out_max, in_max): the same rows as the GEMMs read them (a quantised base)
};

static int bf16(const sl_lora *lo) { return lo->ops->act_bf16; }

// One activation element as fp32 / stored (precision.h's inline conversions: the element loops vectorise).
static inline float get(const sl_act *p, size_t i, int is_bf16) { return lora_act_value(p, i, is_bf16); }

static inline void put(sl_act *p, size_t i, float v, int is_bf16) {
    if (is_bf16) ((sl_bf16 *)(void *)p)[i] = sl_bf16_round(v);
    else ((float *)(void *)p)[i] = v;
}

// A tensor's values as the GEMMs read them, in fp32: its master weights (through its unit's view), or
// with bf16 storage its bf16 copy widened into scratch, so that every ZeRO stage computes with the same
// 16-bit parameters (stages 1-3 hold only rounded values).
static const float *values(const sl_lora *lo, int idx, float *scratch) {
    const sl_tensor_info *t = &lo->tensors[idx];
    if (!bf16(lo)) return lo->param_view[t->unit] + (t->offset - lo->unit_begin[t->unit]);
    sl_bf16_to_f32_array((const sl_bf16 *)(const void *)lora_weight(lo, idx), scratch, t->numel);
    return scratch;
}

static float *master_grad(const sl_lora *lo, int idx) {
    const sl_tensor_info *t = &lo->tensors[idx];
    float *g = lo->grad_view[t->unit];
    return g ? g + (t->offset - lo->unit_begin[t->unit]) : NULL;
}

// The output width of the fused GEMM an adapter adds to (its weight's rows, `ld` in the forward).
static int fused_width(const sl_model_config *c, sl_linear_kind k) {
    switch (k) {
    case SL_LINEAR_QKV: return (c->n_head + 2 * c->n_kv_head) * sl_config_head_dim(c);
    case SL_LINEAR_MLP_UP: return c->arch == SL_ARCH_LLAMA ? 2 * c->n_inner : c->n_inner;
    default: return c->n_embd;
    }
}

// The widest fused output (ld), output, input and rank over the adapters.
static void widths(const sl_lora *lo, size_t *ld, size_t *out, size_t *in, size_t *r) {
    *ld = *out = *in = *r = 1;
    for (int k = SL_LINEAR_QKV; k <= SL_LINEAR_MLP_DOWN; k++)
        if ((size_t)fused_width(&lo->model_cfg, (sl_linear_kind)k) > *ld)
            *ld = (size_t)fused_width(&lo->model_cfg, (sl_linear_kind)k);
    for (int a = 0; a < lo->n_adapters; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        if ((size_t)ad->out_features > *out) *out = (size_t)ad->out_features;
        if ((size_t)ad->in_features > *in) *in = (size_t)ad->in_features;
        if ((size_t)ad->r > *r) *r = (size_t)ad->r;
    }
}

void lora_dora_free(sl_lora *lo) {
    struct sl_dora *d = lo->dora;
    if (!d) return;
    for (int a = 0; a < lo->n_adapters; a++) {
        if (d->norm) free(d->norm[a]);
        if (d->z) free(d->z[a]);
    }
    free(d->norm);
    free(d->version);
    free(d->z);
    if (d->act) lo->ops->dealloc(d->act);
    free(d->ba);
    free(d->at);
    free(d->va);
    free(d->vb);
    free(d->vm);
    free(d->g);
    free(d->w);
    if (d->w_act) lo->ops->dealloc(d->w_act);
    free(d);
    lo->dora = NULL;
}

int lora_dora_plan(sl_lora *lo, int N) {
    // z only when a backward may follow (the model says so: the forward has targets and may train)
    if (lo->dora && N <= lo->dora->N && (lo->dora->z || !lo->backward_may_follow)) return 0;
    lora_dora_free(lo);
    struct sl_dora *d = sl_calloc(1, sizeof *d, "DoRA state");
    if (!d) return -1;
    lo->dora = d;
    size_t ld, out, in, r, n = (size_t)N, e = bf16(lo) ? sizeof(sl_bf16) : sizeof(float);
    widths(lo, &ld, &out, &in, &r);
    d->norm = sl_calloc((size_t)lo->n_adapters + 1, sizeof(float *), "DoRA norms");
    d->version = sl_calloc((size_t)lo->n_adapters + 1, sizeof(uint64_t), "DoRA norms");
    d->act = lo->ops->alloc(n * (ld + 2 * out + in) * e, "DoRA activations");
    d->ba = sl_malloc(out * in * sizeof(float), "DoRA B A");
    d->at = sl_malloc(in * r * sizeof(float), "DoRA B A");
    d->va = sl_malloc(r * in * sizeof(float), "DoRA adapters");
    d->vb = sl_malloc(out * r * sizeof(float), "DoRA adapters");
    d->vm = sl_malloc(out * sizeof(float), "DoRA magnitudes");
    d->g = sl_malloc(out * sizeof(float), "DoRA magnitudes");
    d->w = sl_malloc(out * in * sizeof(float), "DoRA base rows");
    d->w_act = lo->ops->alloc(out * in * e, "DoRA base rows");
    if (!d->norm || !d->version || !d->act || !d->ba || !d->at || !d->va || !d->vb || !d->vm || !d->g || !d->w ||
        !d->w_act)
        goto fail;
    d->dy = sl_act_at(d->act, 0, e);
    d->t = sl_act_at(d->act, n * ld, e);
    d->th = sl_act_at(d->act, n * (ld + out), e);
    d->sl = sl_act_at(d->act, n * (ld + out + in), e);
    if (lo->backward_may_follow && !(d->z = sl_calloc((size_t)lo->n_adapters + 1, sizeof(sl_act *), "DoRA activations")))
        goto fail;
    for (int a = 0; a < lo->n_adapters; a++) {
        size_t o = (size_t)lo->adapters[a].out_features;
        if (!(d->norm[a] = sl_malloc(o * sizeof(float), "DoRA norms"))) goto fail;
        if (d->z && !(d->z[a] = sl_malloc(n * o * e, "DoRA activations"))) goto fail;
        d->version[a] = UINT64_MAX;
    }
    d->N = N;
    return 0;
fail:
    lora_dora_free(lo);
    return sl_error_context("planning DoRA's buffers for %d rows", N);
}

// The adapter's rows [col0, col0 + out) of W as the GEMMs read them: W's own storage, or for a
// quantised linear its rows dequantised by bitsandbytes' maths (the parts are stacked by rows) into
// d->w and stored as activations in d->w_act.
static const sl_act *base_rows(sl_lora *lo, const sl_lora_adapter *ad, const sl_act *W) {
    struct sl_dora *d = lo->dora;
    size_t in = (size_t)ad->in_features, n = (size_t)ad->out_features * in;
    // the quantised linear behind W (the fused GEMM's weight as the model hands it), NULL for a plain one
    const sl_qlinear *l = sl_quant_ops_lookup(W, ad->in_features, fused_width(&lo->model_cfg, ad->linear));
    if (!l) return sl_act_at(W, (size_t)ad->col0 * in, bf16(lo) ? sizeof(sl_bf16) : sizeof(float));
    int64_t row = ad->col0;
    size_t done = 0;
    for (int p = 0; p < l->n_parts && done < n; p++) {
        int64_t rows = l->part[p]->rows;
        if (row >= rows) {
            row -= rows;
            continue;
        }
        size_t take = (size_t)(rows - row) * in < n - done ? (size_t)(rows - row) * in : n - done;
        sl_dequantize_range(l->part[p], (size_t)row * in, take, d->w + done);
        done += take;
        row = 0;
    }
    if (bf16(lo)) sl_f32_to_bf16_array(d->w, (sl_bf16 *)(void *)d->w_act, n);
    else memcpy(d->w_act, d->w, n * sizeof(float));
    return d->w_act;
}

// n_j = || W_j + s (B A)_j || for adapter a into norm (double sums); Wa the adapter's rows (base_rows).
static void weight_norms(sl_lora *lo, int a, const sl_act *Wa, float *norm) {
    struct sl_dora *d = lo->dora;
    const sl_lora_adapter *ad = &lo->adapters[a];
    int in = ad->in_features, out = ad->out_features, r = ad->r, is_bf16 = bf16(lo);
    const float *A = values(lo, ad->lora_A, d->va), *B = values(lo, ad->lora_B, d->vb);
    for (int i = 0; i < in; i++)
        for (int k = 0; k < r; k++) d->at[(size_t)i * r + k] = A[(size_t)k * in + i];
    // B A (out, in) = B (out, r) against A^T (in, r) as matmul_forward's weight
    sl_ops_cpu.matmul_forward((sl_act *)(void *)d->ba, (const sl_act *)(const void *)B,
                              (const sl_act *)(const void *)d->at, NULL, out, r, in);
    float s = ad->scale;
#pragma omp parallel for schedule(static) if((size_t)out * in >= 65536)
    for (int j = 0; j < out; j++) {
        double sum = 0.0;
        const float *ba = d->ba + (size_t)j * in;
        for (int i = 0; i < in; i++) {
            size_t at = (size_t)j * in + i;
            double w = (double)get(Wa, at, is_bf16) + (double)s * ba[i];
            sum += w * w;
        }
        norm[j] = (float)sqrt(sum);
    }
}

// g_j + offset = m_j / n_j + offset of adapter a into d->g (m as the GEMMs read it, n from its forward).
static const float *gains(sl_lora *lo, int a, float offset) {
    struct sl_dora *d = lo->dora;
    const float *m = values(lo, lo->adapters[a].magnitude, d->vm), *norm = d->norm[a];
    for (int j = 0; j < lo->adapters[a].out_features; j++)
        d->g[j] = offset != 0.0f ? m[j] / norm[j] + offset : m[j] / norm[j];
    return d->g;
}

int lora_dora_init_magnitudes(sl_lora *lo, const sl_act *const *W) {
    if (!lo->cfg.use_dora) return 0;
    if (sl_lora_params_changed(lo) || lora_dora_plan(lo, 1)) return -1;  // A and B as the GEMMs will read them
    for (int a = 0; a < lo->n_adapters; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        weight_norms(lo, a, base_rows(lo, ad, W[a]), lo->dora->norm[a]);
        lo->dora->version[a] = UINT64_MAX;  // taken at the start, not for the forward's reuse
        const sl_tensor_info *t = &lo->tensors[ad->magnitude];
        lo->ops->upload(lo->params + t->offset, lo->dora->norm[a], t->numel * sizeof(float));
    }
    return sl_lora_params_changed(lo);
}

void lora_dora_forward(sl_lora *lo, int a, const sl_act *h, sl_act *y, const sl_act *W, const sl_act *bias, int N,
                       int ld) {
    struct sl_dora *d = lo->dora;
    const sl_ops *ops = lo->ops;
    const sl_lora_adapter *ad = &lo->adapters[a];
    int in = ad->in_features, out = ad->out_features, r = ad->r, is_bf16 = bf16(lo);
    int dropout = lora_dropping(lo), stale = d->version[a] != lo->version;
    const sl_act *Wa = stale || dropout ? base_rows(lo, ad, W) : NULL;
    // the norms are constants of the weights: taken again when sl_lora_params_changed says they changed
    if (stale) {
        weight_norms(lo, a, Wa, d->norm[a]);
        d->version[a] = lo->version;
    }
    // sl = s (h A^T) B^T with u = h A^T kept: plain LoRA's op (its skinny GEMMs) into a zeroed buffer
    size_t e = is_bf16 ? sizeof(sl_bf16) : sizeof(float);
    ops->memzero(d->sl, (size_t)N * out * e);
    ops->lora_forward(d->sl, lo->u[a], lo->delta, h, lora_weight(lo, ad->lora_A), lora_weight(lo, ad->lora_B),
                      ad->scale, N, in, r, out, out, 0);
    if (dropout) ops->matmul_forward(d->t, h, Wa, NULL, N, in, out);  // the dropped input's base path
    const float *gs = gains(lo, a, 0.0f);
    sl_act *z = d->z ? d->z[a] : NULL;
#pragma omp parallel for schedule(static) if((size_t)N * out >= 65536)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < out; j++) {
            size_t yi = (size_t)n * ld + ad->col0 + j, ti = (size_t)n * out + j;
            float g = gs[j], b = bias ? get(bias, (size_t)ad->col0 + j, is_bf16) : 0.0f;
            float lora = get(d->sl, ti, is_bf16), yv = get(y, yi, is_bf16);
            float base = dropout ? get(d->t, ti, is_bf16) : yv - b;
            if (z) put(z, ti, base + lora, is_bf16);
            put(y, yi, dropout ? yv + (g - 1.0f) * base + g * lora : g * (base + lora) + b, is_bf16);
        }
}

int lora_dora_check_backward(const sl_lora *lo) {
    if (!lo->cfg.use_dora || (lo->dora && lo->dora->z)) return 0;
    return sl_errorf("lora: DoRA's backward needs what its forward keeps, and that forward kept nothing (a "
                     "forward without targets, or on a model set up for inference)");
}

const sl_act *lora_dora_base_grad(sl_lora *lo, int layer, sl_linear_kind linear, const sl_act *dy, int N, int ld) {
    struct sl_dora *d = lo->dora;
    int is_bf16 = bf16(lo);
    lo->ops->copy(d->dy, dy, (size_t)N * ld * (is_bf16 ? sizeof(sl_bf16) : sizeof(float)));
    for (int a = lo->layer_first[layer]; a < lo->layer_first[layer + 1]; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        if (ad->linear != linear) continue;
        const float *gs = gains(lo, a, 0.0f), *norm = d->norm[a];
        const sl_act *z = d->z[a];
        float *dm = master_grad(lo, ad->magnitude);
        int out = ad->out_features, blocks = (out + DM_COLS - 1) / DM_COLS;
        // column blocks, rows in order within each: every dm_j summed over n ascending whatever the threads
#pragma omp parallel for schedule(static) if((size_t)N * out >= 65536)
        for (int bk = 0; bk < blocks; bk++) {
            int j0 = bk * DM_COLS, w = out - j0 < DM_COLS ? out - j0 : DM_COLS;
            double sum[DM_COLS] = {0};
            for (int n = 0; n < N; n++) {
                size_t yi = (size_t)n * ld + ad->col0 + j0;
                size_t zi = (size_t)n * out + j0;
                for (int j = 0; j < w; j++) {
                    float v = get(dy, yi + j, is_bf16);
                    sum[j] += (double)v * get(z, zi + j, is_bf16);
                    put(d->dy, yi + j, gs[j0 + j] * v, is_bf16);
                }
            }
            for (int j = 0; dm && j < w; j++) dm[j0 + j] += (float)(sum[j] / norm[j0 + j]);
        }
    }
    return lora_dropping(lo) ? dy : d->dy;
}

void lora_dora_backward(sl_lora *lo, int a, const sl_act *h, const sl_act *dy, sl_act *dx, const sl_act *W, int N,
                        int ld) {
    struct sl_dora *d = lo->dora;
    const sl_ops *ops = lo->ops;
    const sl_lora_adapter *ad = &lo->adapters[a];
    int in = ad->in_features, out = ad->out_features, r = ad->r, is_bf16 = bf16(lo);
    int dropout = lora_dropping(lo);
    const sl_act *A = lora_weight(lo, ad->lora_A), *B = lora_weight(lo, ad->lora_B);
    float *dA = master_grad(lo, ad->lora_A), *dB = master_grad(lo, ad->lora_B);
    // the LoRA path's gradient is g dy: the scaled copy, as plain LoRA's backward reads its slice
    ops->lora_backward(dropout ? NULL : dx, dA, dB, lo->du, lo->delta, lo->dh, d->dy, h, lo->u[a], A, B, ad->scale, N,
                       in, r, out, ld, ad->col0);
    if (!dropout || !dx) return;
    // the dropped input's gradient: du A + ((g - 1) dy) W, then the dropout mask, then into dx
    const float *gs = gains(lo, a, -1.0f);
#pragma omp parallel for schedule(static) if((size_t)N * out >= 65536)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < out; j++)
            put(d->t, (size_t)n * out + j, gs[j] * get(dy, (size_t)n * ld + ad->col0 + j, is_bf16), is_bf16);
    const sl_act *Wa = base_rows(lo, ad, W);
    size_t n_in = (size_t)N * in;
    ops->matmul_backward(lo->dh, NULL, NULL, lo->du, h, A, N, in, r);
    ops->matmul_backward(d->th, NULL, NULL, d->t, h, Wa, N, in, out);
    ops->residual_forward(lo->dh, lo->dh, d->th, n_in);
    ops->dropout_backward(lo->dh, lo->dh, n_in, lo->cfg.lora_dropout, lora_dropout_seed(lo, a));
    ops->residual_forward(dx, dx, lo->dh, n_in);
}

void lora_dora_merge_row(float *w, int in, float magnitude) {
    double sum = 0.0;
    for (int i = 0; i < in; i++) sum += (double)w[i] * w[i];
    float f = magnitude / (float)sqrt(sum);
    for (int i = 0; i < in; i++) w[i] *= f;
}
