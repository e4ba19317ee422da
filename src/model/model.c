// model.c: transformer forward and backward over the flat parameter buffer (see model.h).
// One batch flows: encoder -> n_layer x [norm, qkv GEMM, (RoPE), attention, proj GEMM, residual,
// norm, MLP GEMMs, activation, residual] -> final norm -> head GEMM -> fused cross-entropy.
// Backward walks the same path in reverse; dresid carries the residual stream's gradient.
// Fused ops: each residual add is done by the norm that reads the sum (residual_layernorm_forward /
// residual_rmsnorm_forward): the attention residual by ln2, a block's output residual by the next
// block's ln1 or the final norm; GPT-2's MLP up-projection and GELU are one matmul_gelu op. The fused
// ops compute exactly what the separate ones did (bit for bit on the CPU), and need no backward of
// their own: the norms' backward accumulates into dresid, the gradient of both addends.
#include "shardlm/model.h"
#include "shardlm/kv_cache.h"
#include "shardlm/lora.h"
#include "model/lora_dora.h"
#include "model/lora_embed.h"
#include "model/lora_saved.h"
#include "model/lora_tokens.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"
#include "shardlm/rope.h"
#include "shardlm/settings.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// A tensor's parameters / gradients, wherever its unit's view currently is.
static inline size_t unit_offset(const sl_model *m, int idx) {
    const sl_tensor_info *t = &m->layout.tensors[idx];
    return t->offset - m->layout.unit_begin[t->unit];
}
#define P(m, idx) ((m)->param_view[(m)->layout.tensors[(idx)].unit] + unit_offset((m), (idx)))
#define G(m, idx) ((m)->grad_view[(m)->layout.tensors[(idx)].unit] + unit_offset((m), (idx)))
// A base parameter as the ops read it (matmul weights and biases, norm weights and biases, wte / wpe):
// the bf16 copy with ops->act_bf16 (ops.h: storage-typed), else P itself, fp32 storage being fp32.
#define W_BASE(m, idx)                                                                                              \
    ((m)->ops->act_bf16                                                                                             \
         ? (const sl_act *)(const void *)((m)->weight_view[(m)->layout.tensors[(idx)].unit] + unit_offset((m), (idx))) \
         : (const sl_act *)(const void *)P(m, idx))
// What the model computes with: modules_to_save's trained copy of the tensor when it has one, else W_BASE.
static inline const sl_act *weight_of(const sl_model *m, int idx) {
    const sl_act *copy = m->lora ? lora_saved_weight(m->lora, idx) : NULL;
    return copy ? copy : W_BASE(m, idx);
}
#define W(m, idx) weight_of((m), (idx))
// Tells the unit hook (if any) about an event; returns -1 from the calling function on its error.
#define HOOK(m, event, unit, next)                                                                   \
    do {                                                                                             \
        if ((m)->unit_hook && (m)->unit_hook((m)->unit_hook_ctx, (event), (unit), (next))) return -1; \
    } while (0)
// Optional tensors (biases, GPT-2's wpe) are -1 in the layout: NULL pointers for the ops (WB, G_OPT).
#define WB(m, idx) ((idx) >= 0 ? W(m, idx) : NULL)
// A base tensor's gradient for the ops: while LoRA adapters are attached (frozen base) its copy's
// (modules_to_save), else NULL.
#define GB(m, idx) ((m)->lora ? lora_saved_grad((m)->lora, (idx)) : G(m, idx))
#define G_OPT(m, idx) ((idx) >= 0 ? GB(m, idx) : NULL)

static int qkv_width(const sl_model_config *c) { return (c->n_head + 2 * c->n_kv_head) * sl_config_head_dim(c); }
static int fc_width(const sl_model_config *c) { return c->arch == SL_ARCH_LLAMA ? 2 * c->n_inner : c->n_inner; }

// (Re)builds the RoPE tables for a forward whose positions run to seq_len - 1 (rope.h), on the host,
// then hands them to the backend. Only dynamic NTK depends on seq_len; rope_len remembers it.
static int rope_build(sl_model *m, int seq_len) {
    const sl_model_config *c = &m->cfg;
    int half = sl_config_head_dim(c) / 2, rows = sl_config_context(c);
    size_t n = (size_t)rows * (size_t)half;
    float *cos_t = sl_malloc(n * sizeof(float), "rope tables"), *sin_t = sl_malloc(n * sizeof(float), "rope tables");
    float *inv_freq = sl_malloc((size_t)half * sizeof(float), "rope tables"), scale;
    int ok = cos_t && sin_t && inv_freq;
    if (ok) {
        sl_rope_inv_freq(c, seq_len, inv_freq, &scale);
        sl_rope_fill(cos_t, sin_t, 0, rows, half, inv_freq, scale);
        m->ops->upload(m->rope_cos, cos_t, n * sizeof(float));
        m->ops->upload(m->rope_sin, sin_t, n * sizeof(float));
        m->rope_len = seq_len;
    }
    free(cos_t);
    free(sin_t);
    free(inv_freq);
    return ok ? 0 : -1;
}

// Dynamic NTK: the tables of a forward over T positions (transformers stretches theta once T passes
// max positions); nothing for the other rope types.
static int rope_for_length(sl_model *m, int T) {
    if (!sl_rope_depends_on_length(&m->cfg)) return 0;
    int want = T > m->cfg.max_seq_len ? T : m->cfg.max_seq_len;
    return want == m->rope_len ? 0 : rope_build(m, want);
}

static int create(sl_model *m, const sl_model_config *cfg, const sl_ops *ops, int quantised_linears) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->ops = ops;
    m->precision = SL_PRECISION_FP32;
    if ((quantised_linears ? sl_layout_build_quantised : sl_layout_build)(&m->layout, cfg)) return -1;
    m->params = ops->alloc(m->layout.total * sizeof(float), "parameters");
    m->grads = ops->alloc(m->layout.total * sizeof(float), "gradients");
    if (!m->params || !m->grads) { sl_model_free(m); return -1; }
    m->capacity = m->layout.total;
    if (ops->act_bf16 && !(m->weights_bf16 = ops->alloc(m->layout.total * sizeof(sl_bf16), "bf16 weights"))) {
        sl_model_free(m);
        return -1;
    }
    m->param_view = sl_calloc((size_t)m->layout.n_units, sizeof(float *), "unit views");
    m->grad_view = sl_calloc((size_t)m->layout.n_units, sizeof(float *), "unit views");
    m->weight_view = sl_calloc((size_t)m->layout.n_units, sizeof(sl_bf16 *), "unit views");
    if (!m->param_view || !m->grad_view || !m->weight_view) { sl_model_free(m); return -1; }
    sl_model_bind_views(m);
    if (cfg->arch == SL_ARCH_LLAMA) {
        size_t n = (size_t)sl_config_context(cfg) * (size_t)(sl_config_head_dim(cfg) / 2);
        m->rope_cos = ops->alloc(n * sizeof(float), "rope tables");
        m->rope_sin = ops->alloc(n * sizeof(float), "rope tables");
        if (!m->rope_cos || !m->rope_sin || rope_build(m, cfg->max_seq_len)) { sl_model_free(m); return -1; }
    }
    if (cfg->arch == SL_ARCH_LLAMA && cfg->pad_token_id >= 0 &&
        !(m->pad_row = ops->alloc((size_t)cfg->n_embd * sizeof(float), "padding row"))) {
        sl_model_free(m);
        return -1;
    }
    return 0;
}

// Frees a buffer of the model's backend (NULL-safe).
static void release(const sl_model *m, void *p) {
    if (p) m->ops->dealloc(p);
}

static void free_acts(sl_model *m) {
    release(m, m->act_memory);
    free(m->layers);
    release(m, m->inputs);
    release(m, m->targets);
    m->act_memory = NULL;
    m->act_bytes = 0;
    m->layers = NULL;
    m->inputs = m->targets = NULL;
    m->act_B = m->act_T = 0;
}

int sl_model_create(sl_model *m, const sl_model_config *cfg, const sl_ops *ops) { return create(m, cfg, ops, 0); }

int sl_model_create_quantised(sl_model *m, const sl_model_config *cfg, const sl_ops *ops) {
    return create(m, cfg, ops, 1);
}

void sl_model_free(sl_model *m) {
    if (!m->ops) return;  // never created (or already freed)
    free_acts(m);
    release(m, m->params);
    release(m, m->grads);
    release(m, m->weights_bf16);
    release(m, m->rope_cos);
    release(m, m->rope_sin);
    release(m, m->pad_row);
    free(m->param_view);
    free(m->grad_view);
    free(m->weight_view);
    sl_layout_free(&m->layout);
    memset(m, 0, sizeof *m);
}

void sl_model_zero_grad(sl_model *m) {
    if (m->grads) m->ops->memzero(m->grads, m->capacity * sizeof(float));
    if (m->lora) sl_lora_zero_grad(m->lora);
}

// DoRA's start: every adapter's fused base weight as the GEMMs take it (sl_lora_attached).
static int attach_dora(sl_model *m, sl_lora *lora) {
    if (!lora->cfg.use_dora) return 0;
    const sl_act **w = sl_calloc((size_t)lora->n_adapters + 1, sizeof *w, "DoRA base weights");
    if (!w) return -1;
    for (int a = 0; a < lora->n_adapters; a++) w[a] = W(m, lora_base_weight(&m->layout, &lora->adapters[a]));
    int rc = sl_lora_attached(lora, w);
    free(w);
    return rc;
}

// PEFT saves an adapted head's (or embedding's) weight with its adapters: it must be this base's
// (sl_lora_check_head_base / _embed_base); the copy goes once checked.
static int check_saved_base(sl_model *m, sl_lora *lora, float **saved, int tensor,
                            int (*check)(const sl_lora *, const float *)) {
    if (!*saved) return 0;
    size_t n = (size_t)m->cfg.vocab_size * (size_t)m->cfg.n_embd;  // the vocabulary's rows, not the padding
    float *base = sl_malloc(n * sizeof(float), "the base's matrix");
    if (!base) return -1;
    m->ops->download(base, P(m, tensor), n * sizeof(float));
    int rc = check(lora, base);
    free(base);
    free(*saved);
    *saved = NULL;
    return rc;
}

static int check_saved_bases(sl_model *m, sl_lora *lora) {
    return check_saved_base(m, lora, &lora->head_base, m->layout.lm_head, sl_lora_check_head_base) ||
           check_saved_base(m, lora, &lora->embed_base, m->layout.wte, sl_lora_check_embed_base);
}

int sl_model_attach_lora(sl_model *m, sl_lora *lora) {
    if (sl_config_compare(&lora->model_cfg, &m->cfg, "lora: the adapters were built for another model")) return -1;
    if (lora->ops != m->ops) return sl_errorf("lora: the adapters live on the %s backend, the model on %s",
                                              lora->ops->name, m->ops->name);
    if (m->unit_hook) return sl_errorf("lora: the model is being trained by an engine; attach adapters first");
    if (sl_model_params_changed(m)) return -1;  // the base's bf16 copy, once: it never changes again
    if (check_saved_bases(m, lora) || sl_lora_bias_attach(lora, &m->layout) || attach_dora(m, lora) ||
        lora_saved_attach(lora, &m->layout, m->param_view, W_BASE(m, m->layout.wte), m->ops->act_bf16 ? 2 : 4))
        return -1;
    release(m, m->grads);
    m->grads = NULL;
    m->lora = lora;
    sl_model_bind_views(m);
    return sl_lora_params_changed(lora);
}

void sl_model_bind_views(sl_model *m) {
    for (int u = 0; u < m->layout.n_units; u++) {
        m->param_view[u] = m->params ? m->params + m->layout.unit_begin[u] : NULL;
        m->grad_view[u] = m->grads ? m->grads + m->layout.unit_begin[u] : NULL;
        m->weight_view[u] = m->weights_bf16 ? m->weights_bf16 + m->layout.unit_begin[u] : NULL;
    }
}

int sl_model_for_inference(sl_model *m) {
    release(m, m->grads);
    m->grads = NULL;
    if (m->weights_bf16) {
        release(m, m->params);
        m->params = NULL;
    }
    m->inference_only = 1;
    sl_model_bind_views(m);
    return 0;
}

// Tensor i's initial values (numel floats) into p: a pure function of (seed, i).
static void init_tensor(const sl_model *m, int i, uint64_t seed, float *p) {
    const sl_param_layout *L = &m->layout;
    const sl_tensor_info *t = &L->tensors[i];
    if (t->ndim == 1) {  // norms weight 1, biases 0
        int is_bias = strstr(t->name, ".bias") != NULL;
        for (size_t j = 0; j < t->numel; j++) p[j] = is_bias ? 0.0f : 1.0f;
        return;
    }
    float std = 0.02f;
    if (m->cfg.arch == SL_ARCH_GPT2 && strstr(t->name, "c_proj.weight")) std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    sl_rng rng = sl_rng_make(seed, 0, (uint64_t)i, SL_RNG_INIT);
    size_t real = (size_t)t->hf_rows * (size_t)t->shape[1];
    for (size_t j = 0; j < t->numel; j++) p[j] = j < real ? std * sl_rng_normal(&rng) : 0.0f;
    // nn.Embedding(padding_idx=pad_token_id) starts its padding row at zero
    if (i == L->wte && m->cfg.arch == SL_ARCH_LLAMA && m->cfg.pad_token_id >= 0)
        memset(p + (size_t)m->cfg.pad_token_id * t->shape[1], 0, sizeof(float) * t->shape[1]);
}

void sl_model_init_tensor(const sl_model *m, int i, uint64_t seed, float *out) { init_tensor(m, i, seed, out); }

int sl_model_init_weights(sl_model *m, uint64_t seed) {
    const sl_param_layout *L = &m->layout;
    // computed on the host, then handed to the backend
    float *host = m->ops->on_device ? sl_malloc(L->total * sizeof(float), "initial weights") : m->params;
    if (!host) return -1;
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < L->n_tensors; i++) {
        float *p = host + L->tensors[i].offset;
        if (L->tensors[i].quantised) *p = 0.0f;   // a placeholder: the values live quantised (quant_base.h)
        else init_tensor(m, i, seed, p);
    }
    if (host != m->params) {
        m->ops->upload(m->params, host, L->total * sizeof(float));
        free(host);
    }
    return sl_model_params_changed(m);
}

int sl_model_params_changed(sl_model *m) {
    if (m->lora) return sl_lora_params_changed(m->lora);  // the frozen base's copy was made at attach
    if (m->weights_bf16 && m->params) m->ops->to_storage(m->weights_bf16, m->params, m->layout.total);
    return 0;
}

// The activation arena, planned in bytes: storage-typed tensors of `elem` bytes an element at `act`,
// fp32 statistics at `stat`. With fp32 storage both share one cursor, in the order the tensors are
// taken (the layout fp32 runs have always had); with bf16 storage the statistics follow all the
// activations and every tensor starts 16-byte aligned. base NULL: a sizing pass.
typedef struct {
    char *base;
    size_t elem, act, stat, stat_begin;
    int split;
} arena;

static size_t arena_round(const arena *a, size_t bytes) { return a->split ? (bytes + 15) / 16 * 16 : bytes; }

static void *take(arena *a, size_t n, int is_stat) {
    size_t *cursor = is_stat && a->split ? &a->stat : &a->act;
    size_t begin = *cursor + (cursor == &a->stat ? a->stat_begin : 0);
    *cursor += arena_round(a, n * (is_stat ? sizeof(float) : a->elem));
    return a->base ? a->base + begin : NULL;
}

// Points every activation into the arena (or, with base NULL, only sizes it); returns its bytes.
static size_t plan_acts(sl_model *m, arena *a, int B, int T) {
    const sl_model_config *c = &m->cfg;
    size_t N = (size_t)B * T, C = (size_t)c->n_embd, F = (size_t)c->n_inner, QKV = (size_t)qkv_width(c);
    size_t FC = (size_t)fc_width(c), NH = (size_t)c->n_head, Vp = (size_t)c->padded_vocab_size;
    size_t A = (size_t)sl_config_attn_width(c);
    size_t big = QKV > FC ? QKV : FC, mid = C > F ? C : F;
    if (A > mid) mid = A;
    sl_layer_acts scratch;
#define ACT(ptr, n) ((ptr) = take(a, (n), 0))
#define STAT(ptr, n) ((ptr) = take(a, (n), 1))
    ACT(m->encoded, N * C);
    for (int l = 0; l < c->n_layer; l++) {
        sl_layer_acts *x = a->base ? &m->layers[l] : &scratch;
        ACT(x->ln1, N * C); STAT(x->ln1_mean, N); STAT(x->ln1_rstd, N);
        ACT(x->qkv, N * QKV); ACT(x->att, N * A); STAT(x->lse, NH * N); ACT(x->resid2, N * C);
        ACT(x->ln2, N * C); STAT(x->ln2_mean, N); STAT(x->ln2_rstd, N);
        ACT(x->fch, N * FC); ACT(x->fch_act, N * F); ACT(x->resid3, N * C);
    }
    ACT(m->lnf, N * C); STAT(m->lnf_mean, N); STAT(m->lnf_rstd, N); ACT(m->logits, N * Vp); STAT(m->logits_lse, N);
    ACT(m->dresid, N * C); ACT(m->dln, N * C); ACT(m->dA, N * big); ACT(m->dB, N * mid);
#undef ACT
#undef STAT
    return a->act + a->stat;
}

// Plans every activation for (B, T) in one allocation.
static int alloc_acts(sl_model *m, int B, int T) {
    if (m->act_memory && B <= m->act_B && T <= m->act_T && (size_t)B * T <= (size_t)m->act_B * m->act_T) return 0;
    free_acts(m);
    const sl_model_config *c = &m->cfg;
    size_t N = (size_t)B * T;
    arena a = {NULL, m->ops->act_bf16 ? sizeof(sl_bf16) : sizeof(float), 0, 0, 0, m->ops->act_bf16};
    size_t total = plan_acts(m, &a, B, T);
    m->act_memory = m->ops->alloc(total, "activations");
    m->layers = sl_calloc((size_t)c->n_layer, sizeof(sl_layer_acts), "activations");
    m->inputs = m->ops->alloc(N * sizeof(int), "batch");
    m->targets = m->ops->alloc(N * sizeof(int), "batch");
    if (!m->act_memory || !m->layers || !m->inputs || !m->targets) {
        free_acts(m);
        return sl_error_context("planning activations for B=%d T=%d (%.1f MB)", B, T, total / 1e6);
    }
    arena real = {m->act_memory, a.elem, 0, 0, a.act, a.split};
    plan_acts(m, &real, B, T);
    m->act_elem = a.elem;
    m->act_bytes = total;
    m->act_B = B;
    m->act_T = T;
    return 0;
}

// Norm forward of either family: LayerNorm (weight, bias) for GPT-2, RMSNorm (weight) for LLaMA.
// With add != NULL the residual add before the norm is fused in: inp += add (in place), then the
// norm of the sum.
static void norm_forward(const sl_model *m, sl_act *out, float *mean, float *rstd, sl_act *inp, const sl_act *add,
                         int w_idx, int b_idx, int N) {
    const sl_model_config *c = &m->cfg;
    const sl_ops *ops = m->ops;
    int C = c->n_embd;
    if (c->arch == SL_ARCH_GPT2) {
        const sl_act *w = W(m, w_idx), *b = W(m, b_idx);
        if (add) ops->residual_layernorm_forward(inp, out, mean, rstd, inp, add, w, b, N, C, c->norm_eps);
        else ops->layernorm_forward(out, mean, rstd, inp, w, b, N, C, c->norm_eps);
    } else {
        if (add) ops->residual_rmsnorm_forward(inp, out, rstd, inp, add, W(m, w_idx), N, C, c->norm_eps);
        else ops->rmsnorm_forward(out, rstd, inp, W(m, w_idx), N, C, c->norm_eps);
    }
}

// Tells the backend the precision of this model's values (the GEMMs' compute type follows it).
static void announce_precision(const sl_model *m) {
    if (m->ops->set_precision) m->ops->set_precision(m->precision);
}

// The output gradient a linear's base GEMM takes: dy, or with DoRA adapters on it their rescaled copy.
static const sl_act *base_grad(sl_model *m, int l, sl_linear_kind linear, const sl_act *dy, int N, int ld) {
    return m->lora ? sl_lora_base_grad(m->lora, l, linear, dy, N, ld) : dy;
}

static void norm_backward(sl_model *m, sl_act *dinp, const sl_act *dout, const sl_act *inp, int w_idx, int b_idx,
                          const float *mean, const float *rstd, int N) {
    const sl_model_config *c = &m->cfg;
    if (c->arch == SL_ARCH_GPT2)
        m->ops->layernorm_backward(dinp, GB(m, w_idx), GB(m, b_idx), dout, inp, W(m, w_idx), mean, rstd, N, c->n_embd);
    else
        m->ops->rmsnorm_backward(dinp, GB(m, w_idx), dout, inp, W(m, w_idx), rstd, N, c->n_embd);
}

// The head GEMM's weight (the shadow with bf16 storage; the embedding's when tied): a tied head reads
// the base embedding even when the lookup reads a copy, unless modules_to_save copied lm_head itself.
static const sl_act *head_weight(const sl_model *m) {
    if (m->lora && m->lora->head_copy >= 0) return lora_weight(m->lora, m->lora->head_copy);
    if (m->lora && m->lora->tokens_weight && m->layout.lm_head < 0) return m->lora->tokens_weight;  // tied
    return m->layout.lm_head >= 0 ? W(m, m->layout.lm_head) : W_BASE(m, m->layout.wte);
}

// The head's gradient: the untied head's or the embedding's (tied); under LoRA only a copy's, else NULL.
static float *head_grad(sl_model *m) {
    const sl_param_layout *L = &m->layout;
    if (!m->lora) return G(m, L->lm_head >= 0 ? L->lm_head : L->wte);
    if (m->lora->head_copy < 0) return L->lm_head >= 0 ? GB(m, L->lm_head) : NULL;
    return lora_grad(m->lora, m->lora->head_copy);
}

// ---- the forward pass: training, prefill and decode ----------------------------------------------

// Dynamic NTK RoPE (rope.h): rows [pos0, pos0 + T) rotated for a sequence of pos0 + T positions,
// as transformers does for a forward ending there. Nothing for the other types (fixed tables).
static int rope_rows(sl_model *m, int pos0, int T) {
    const sl_model_config *c = &m->cfg;
    if (!sl_rope_depends_on_length(c)) return 0;
    int half = sl_config_head_dim(c) / 2, len = pos0 + T;
    if (len <= c->max_seq_len && m->rope_len == c->max_seq_len) return 0;  // the unstretched tables
    if (len <= c->max_seq_len) return rope_build(m, c->max_seq_len);
    size_t n = (size_t)T * half;
    float *cos_t = sl_malloc(n * sizeof(float), "rope tables"), *sin_t = sl_malloc(n * sizeof(float), "rope tables");
    float *inv_freq = sl_malloc((size_t)half * sizeof(float), "rope tables"), scale;
    int ok = cos_t && sin_t && inv_freq;
    if (ok) {
        sl_rope_inv_freq(c, len, inv_freq, &scale);
        sl_rope_fill(cos_t, sin_t, pos0, T, half, inv_freq, scale);
        m->ops->upload(m->rope_cos + (size_t)pos0 * half, cos_t, n * sizeof(float));
        m->ops->upload(m->rope_sin + (size_t)pos0 * half, sin_t, n * sizeof(float));
        m->rope_len = -1;  // rows of several lengths now: rebuilt whole when back at or below max positions
    }
    free(cos_t);
    free(sin_t);
    free(inv_freq);
    return ok ? 0 : -1;
}

// Appends the keys and values of positions pos0 .. pos0+T-1 (in qkv, after RoPE) to layer l's cache.
static void cache_append(const sl_model *m, sl_kv_cache *kv, int l, const sl_act *qkv, int T) {
    const sl_model_config *c = &m->cfg;
    size_t HD = (size_t)sl_config_head_dim(c), KV = (size_t)c->n_kv_head * HD, e = m->act_elem;
    size_t W = (size_t)(c->n_head + 2 * c->n_kv_head) * HD, row = ((size_t)l * kv->max_ctx + (size_t)kv->pos) * KV;
    for (int t = 0; t < T; t++) {
        m->ops->copy(sl_act_at(kv->k, row + (size_t)t * KV, e), sl_act_at(qkv, (size_t)t * W + (size_t)c->n_head * HD, e),
                     KV * e);
        m->ops->copy(sl_act_at(kv->v, row + (size_t)t * KV, e),
                     sl_act_at(qkv, (size_t)t * W + (size_t)(c->n_head + c->n_kv_head) * HD, e), KV * e);
    }
}

// dloss of the mean loss's gradient scaled by grad_scale: grad_scale / the counted targets.
static float loss_dlogits_scale(const sl_model *m, float grad_scale) {
    return m->n_valid_targets ? grad_scale / (float)m->n_valid_targets : 0.0f;
}

// One forward over inputs (B,T). Without a cache: training / full forward from position 0 (targets
// optional). With one (B = 1): the T tokens at positions kv->pos.. — a prefill from position 0 uses
// the full attention and fills the cache, one token after that attends to the cache (decode); only
// the last position's logits are computed.
static int forward(sl_model *m, sl_kv_cache *kv, const int *inputs, const int *targets, int B, int T, float *loss) {
    const sl_model_config *c = &m->cfg;
    const sl_ops *ops = m->ops;
    m->have_targets = 0;  // a failed forward must not leave a stale one for backward
    m->logits_rows = 0;
    m->logits_hold_grad = 0;
    int fuse_loss = m->expect_backward && targets && !kv && sl_settings_get()->fused_kernels;
    m->expect_backward = 0;  // for this forward only
    int pos0 = kv ? kv->pos : 0;
    if (B <= 0 || T <= 0) return sl_errorf("forward: batch %d x %d must be positive", B, T);
    if (pos0 + T > sl_config_context(c))
        return sl_errorf("forward: sequence length %d exceeds the model's maximum positions %d", pos0 + T,
                         sl_config_context(c));
    if (c->sliding_window && c->sliding_window < T && !ops->sliding_window)
        return sl_errorf("forward: sliding_window %d is shorter than the sequence (%d) and the %s backend computes "
                         "only full causal attention; use sequences of at most %d tokens or the cpu backend",
                         c->sliding_window, T, ops->name, c->sliding_window);
    size_t N = (size_t)B * T;
    for (size_t i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= c->vocab_size)
            return sl_errorf("forward: input token %d at batch row %zu position %zu is outside the vocabulary [0, %d)",
                             inputs[i], i / T, i % T + pos0, c->vocab_size);
        if (targets && targets[i] >= c->vocab_size)
            return sl_errorf("forward: target token %d at batch row %zu position %zu is outside the vocabulary [0, %d)",
                             targets[i], i / T, i % T, c->vocab_size);
    }
    if (alloc_acts(m, B, T) || (kv ? rope_rows(m, pos0, T) : rope_for_length(m, T))) return -1;
    if (m->lora) m->lora->backward_may_follow = targets != NULL && !m->inference_only;  // DoRA then keeps z
    if (m->lora && sl_lora_plan(m->lora, B * T)) return -1;
    m->B = B;
    m->T = T;
    announce_precision(m);
    // the batch to the backend (the one host-to-device copy of a step)
    ops->upload(m->inputs, inputs, N * sizeof(int));
    m->have_targets = targets != NULL;
    if (targets) ops->upload(m->targets, targets, N * sizeof(int));

    int C = c->n_embd, F = c->n_inner, NH = c->n_head, NKV = c->n_kv_head, HD = sl_config_head_dim(c);
    int QKV = qkv_width(c), FC = fc_width(c), A = sl_config_attn_width(c), window = c->sliding_window;
    const sl_param_layout *L = &m->layout;
    int last = L->n_units - 1, tied = L->lm_head < 0;
    HOOK(m, SL_PARAMS_GET, 0, 1);
    if (m->lora) lora_tokens_refresh(m->lora);  // trainable_token_indices' rows into the embedding read below
    const sl_act *wpe = L->wpe >= 0 ? sl_act_at(W(m, L->wpe), (size_t)pos0 * C, m->act_elem) : NULL;
    ops->encoder_forward(m->encoded, m->inputs, W(m, L->wte), wpe, B, T, C);
    if (m->lora) lora_embed_forward(m->lora, m->encoded, m->inputs, (int)N);  // LoRA on the embedding
    HOOK(m, SL_PARAMS_PUT, 0, 1);
    // resid: the residual stream entering the block; pending: what the norm reading it still has to
    // add to it (the previous block's resid2: its output's residual add is fused into the next norm)
    sl_act *resid = m->encoded;
    const sl_act *pending = NULL;
    for (int l = 0; l < c->n_layer; l++) {
        const sl_block_tensors *k = &L->blocks[l];
        sl_layer_acts *a = &m->layers[l];
        HOOK(m, SL_PARAMS_GET, l + 1, l + 2);
        norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, resid, pending, k->ln1_w, k->ln1_b, (int)N);
        ops->matmul_forward(a->qkv, a->ln1, W(m, k->qkv_w), WB(m, k->qkv_b), (int)N, C, QKV);
        if (m->lora)
            sl_lora_forward(m->lora, l, SL_LINEAR_QKV, a->ln1, a->qkv, W(m, k->qkv_w), WB(m, k->qkv_b), (int)N, QKV);
        if (c->arch == SL_ARCH_LLAMA) ops->rope_forward(a->qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HD, pos0);
        if (kv) cache_append(m, kv, l, a->qkv, T);
        if (kv && pos0 > 0) {  // one query against the cache (the window's part of it)
            int n = pos0 + 1, first = window && n > window ? n - window : 0;
            size_t off = ((size_t)l * kv->max_ctx + (size_t)first) * (size_t)NKV * HD;
            ops->attention_decode(a->att, a->qkv, sl_act_at(kv->k, off, m->act_elem), sl_act_at(kv->v, off, m->act_elem),
                                  n - first, NH, NKV, HD);
        } else {
            ops->attention_forward(a->att, a->lse, a->qkv, B, T, NH, NKV, HD, window);
        }
        ops->matmul_forward(a->resid2, a->att, W(m, k->attn_proj_w), WB(m, k->attn_proj_b), (int)N, A, C);
        if (m->lora)
            sl_lora_forward(m->lora, l, SL_LINEAR_ATTN_OUT, a->att, a->resid2, W(m, k->attn_proj_w),
                            WB(m, k->attn_proj_b), (int)N, C);
        // resid2 = attention output + resid, fused with ln2
        norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->resid2, resid, k->ln2_w, k->ln2_b, (int)N);
        int fc_adapted = m->lora && sl_lora_first_on(m->lora, l, SL_LINEAR_MLP_UP) >= 0;
        if (c->arch == SL_ARCH_GPT2 && !fc_adapted) {
            ops->matmul_gelu_forward(a->fch_act, a->fch, a->ln2, W(m, k->fc_w), WB(m, k->fc_b), (int)N, C, F);
        } else {  // an adapter adds to the up-projection before its activation
            ops->matmul_forward(a->fch, a->ln2, W(m, k->fc_w), WB(m, k->fc_b), (int)N, C, FC);
            if (fc_adapted)
                sl_lora_forward(m->lora, l, SL_LINEAR_MLP_UP, a->ln2, a->fch, W(m, k->fc_w), WB(m, k->fc_b), (int)N,
                                FC);
            if (c->arch == SL_ARCH_GPT2) ops->gelu_forward(a->fch_act, a->fch, (size_t)N * F);
            else ops->swiglu_forward(a->fch_act, a->fch, (int)N, F);
        }
        // resid3 = MLP output (+ resid2, added by the next norm)
        ops->matmul_forward(a->resid3, a->fch_act, W(m, k->mlp_proj_w), WB(m, k->mlp_proj_b), (int)N, F, C);
        if (m->lora)
            sl_lora_forward(m->lora, l, SL_LINEAR_MLP_DOWN, a->fch_act, a->resid3, W(m, k->mlp_proj_w),
                            WB(m, k->mlp_proj_b), (int)N, C);
        HOOK(m, SL_PARAMS_PUT, l + 1, l + 2);
        resid = a->resid3;
        pending = a->resid2;
    }
    HOOK(m, SL_PARAMS_GET, last, tied ? 0 : -1);
    // with a cache only the last position goes on: its final norm and logits (row 0 of lnf / logits)
    size_t rows = kv ? 1 : N, skip = N - rows;
    m->logits_rows = (int)rows;
    norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, sl_act_at(resid, skip * C, m->act_elem),
                 pending ? sl_act_at(pending, skip * C, m->act_elem) : NULL, L->lnf_w, L->lnf_b, (int)rows);
    if (tied) {  // the head is the embedding matrix
        HOOK(m, SL_PARAMS_PUT, last, 0);
        HOOK(m, SL_PARAMS_GET, 0, -1);
    }
    ops->matmul_forward(m->logits, m->lnf, head_weight(m), NULL, (int)rows, C, c->padded_vocab_size);
    if (m->lora)  // an adapter on an untied lm_head (its columns: the vocabulary, not the padding)
        sl_lora_forward(m->lora, c->n_layer, SL_LINEAR_HEAD, m->lnf, m->logits, head_weight(m), NULL, (int)rows,
                        c->padded_vocab_size);
    HOOK(m, SL_PARAMS_PUT, tied ? 0 : last, -1);
    if (kv) kv->pos += T;

    m->n_valid_targets = 0;
    m->loss = 0.0f;
    if (targets) {
        for (size_t i = 0; i < N; i++) m->n_valid_targets += targets[i] >= 0;
        double total;
        if (fuse_loss) {  // a training step: the loss and dlogits (in place) in one pass, for backward
            total = ops->crossentropy_fused(m->logits_lse, m->logits, m->targets, (int)N, c->vocab_size,
                                            c->padded_vocab_size, loss_dlogits_scale(m, m->expected_grad_scale));
            m->logits_hold_grad = 1;
            m->logits_rows = 0;
        } else {  // the loss and each row's log-sum-exp here (logits kept); backward writes dlogits in place
            total = ops->crossentropy_forward(m->logits_lse, m->logits, m->targets, (int)N, c->vocab_size,
                                              c->padded_vocab_size);
        }
        m->loss = m->n_valid_targets ? (float)(total / m->n_valid_targets) : 0.0f;
        if (loss) *loss = m->loss;
    }
    return 0;
}

int sl_model_forward(sl_model *m, const int *inputs, const int *targets, int B, int T, float *loss) {
    return forward(m, NULL, inputs, targets, B, T, loss);
}

int sl_model_forward_cached(sl_model *m, sl_kv_cache *kv, const int *tokens, int T, const float **logits) {
    if (kv->model != m) return sl_errorf("forward: the KV cache belongs to another model");
    if (T <= 0) return sl_errorf("forward: no tokens given");
    if (kv->pos + T > kv->max_ctx)
        return sl_errorf("generate: context of %d positions is full (%d cached, %d more)", kv->max_ctx, kv->pos, T);
    // a prefill from position 0 goes as one forward; later tokens one at a time against the cache
    int step = kv->pos == 0 ? T : 1;
    for (int done = 0; done < T; done += step)
        if (forward(m, kv, tokens + done, NULL, 1, step, NULL)) return -1;
    size_t Vp = (size_t)m->cfg.padded_vocab_size;
    if (m->ops->act_bf16) {  // bf16 storage: widened on the host
        m->ops->download(kv->logits_bf16, m->logits, Vp * sizeof(sl_bf16));
        sl_bf16_to_f32_array(kv->logits_bf16, kv->logits, Vp);
    } else {
        m->ops->download(kv->logits, m->logits, Vp * sizeof(float));
    }
    // an op that failed on the way (a device call, CPU scratch it could not allocate) is reported here,
    // never returned as logits
    if (m->ops->synchronize()) return sl_error_context("forward of %d tokens at position %d", T, kv->pos - T);
    *logits = kv->logits;
    return 0;
}

int sl_model_logits(const sl_model *m, int row0, int rows, float *out) {
    size_t V = (size_t)m->cfg.vocab_size, Vp = (size_t)m->cfg.padded_vocab_size, e = m->act_elem;
    if (row0 < 0 || rows < 0 || row0 + rows > m->logits_rows)
        return sl_errorf("logits: rows %d..%d asked for, the last forward computed %d", row0, row0 + rows - 1,
                         m->logits_rows);
    void *row = sl_malloc(Vp * e, "a row of logits");
    if (!row) return -1;
    for (int r = 0; r < rows; r++) {
        m->ops->download(row, sl_act_at(m->logits, (size_t)(row0 + r) * Vp, e), Vp * e);
        if (m->ops->act_bf16) sl_bf16_to_f32_array(row, out + (size_t)r * V, V);
        else memcpy(out + (size_t)r * V, row, V * sizeof(float));
    }
    free(row);
    return 0;
}

void sl_model_expect_backward(sl_model *m, float grad_scale) {
    m->expect_backward = 1;
    m->expected_grad_scale = grad_scale;
}

int sl_model_backward(sl_model *m, float grad_scale) {
    if (m->inference_only) return sl_errorf("backward: the model was set up for inference only (no gradients)");
    if (!m->have_targets)
        return sl_errorf("backward: needs a preceding forward with targets (none since the last backward or a failed forward)");
    if (m->logits_hold_grad && grad_scale != m->expected_grad_scale)
        return sl_errorf("backward: grad_scale %g differs from the %g announced before the forward "
                         "(sl_model_expect_backward), whose loss gradient is already computed",
                         (double)grad_scale, (double)m->expected_grad_scale);
    if (m->lora && sl_lora_check_backward(m->lora)) return -1;
    const sl_model_config *c = &m->cfg;
    const sl_ops *ops = m->ops;
    const sl_param_layout *L = &m->layout;
    int B = m->B, T = m->T, N = B * T;
    int C = c->n_embd, F = c->n_inner, NH = c->n_head, NKV = c->n_kv_head, HD = sl_config_head_dim(c);
    int QKV = qkv_width(c), FC = fc_width(c), Vp = c->padded_vocab_size, A = sl_config_attn_width(c);
    float dloss = loss_dlogits_scale(m, grad_scale);
    int logits_hold_grad = m->logits_hold_grad;
    m->logits_hold_grad = 0;
    m->have_targets = 0;  // logits become gradients below; a second backward would be wrong
    m->logits_rows = 0;
    announce_precision(m);
    int last = L->n_units - 1, tied = L->lm_head < 0, head_unit = tied ? 0 : last;

    // logits -> dlogits in place, then the head and the final norm
    HOOK(m, SL_PARAMS_GET, head_unit, tied ? last : c->n_layer);
    HOOK(m, SL_GRADS_GET, head_unit, -1);
    if (!logits_hold_grad) ops->crossentropy_backward(m->logits, m->logits_lse, m->targets, N, c->vocab_size, Vp, dloss);
    ops->matmul_backward(m->dln, head_grad(m), NULL, m->logits, m->lnf, head_weight(m), N, C, Vp);
    if (m->lora)
        sl_lora_backward(m->lora, c->n_layer, SL_LINEAR_HEAD, m->lnf, m->logits, m->dln, head_weight(m), N, Vp);
    if (m->lora && tied && lora_tokens_head_grad(m->lora, m->logits, m->lnf, N, Vp)) return -1;  // its token rows
    if (tied) {  // the embedding's gradients stay open until the encoder adds its part
        HOOK(m, SL_PARAMS_PUT, 0, last);
        HOOK(m, SL_PARAMS_GET, last, c->n_layer);
        HOOK(m, SL_GRADS_GET, last, -1);
    }
    ops->memzero(m->dresid, (size_t)N * C * m->act_elem);
    const sl_act *final_resid = m->layers[c->n_layer - 1].resid3;
    norm_backward(m, m->dresid, m->dln, final_resid, L->lnf_w, L->lnf_b, m->lnf_mean, m->lnf_rstd, N);
    // the final norm and an untied head are final now; a tied head (wte) only after the encoder
    HOOK(m, SL_PARAMS_PUT, last, c->n_layer);
    HOOK(m, SL_GRADS_PUT, last, c->n_layer);

    // a frozen base needs gradients only down to the lowest adapter (or modules_to_save copy)
    int lowest = 0, lowest_input = 1;
    if (m->lora) lora_saved_backward_floor(m->lora, &lowest, &lowest_input);
    for (int l = c->n_layer - 1; l >= lowest; l--) {
        const sl_block_tensors *k = &L->blocks[l];
        sl_layer_acts *a = &m->layers[l];
        const sl_act *resid_in = l > 0 ? m->layers[l - 1].resid3 : m->encoded;
        int unit = l + 1, next = l > 0 ? l : -1;
        HOOK(m, SL_PARAMS_GET, unit, next);
        HOOK(m, SL_GRADS_GET, unit, next);
        // MLP: dresid is d(resid3) and flows unchanged into d(resid2) through the residual
        if (c->arch == SL_ARCH_GPT2 && !m->lora && sl_settings_get()->fused_kernels) {
            // The down-projection's input gradient comes out as the pre-GELU gradient (on the GPU the
            // GELU gradient is that GEMM's epilogue), then the up-projection's plain backward. Not with
            // adapters: one on the down-projection adds to dB before the GELU gradient is taken.
            ops->matmul_backward_gelu(m->dB, GB(m, k->mlp_proj_w), G_OPT(m, k->mlp_proj_b), m->dresid, a->fch_act,
                                      W(m, k->mlp_proj_w), a->fch, N, F, C);
            ops->matmul_backward(m->dln, GB(m, k->fc_w), G_OPT(m, k->fc_b), m->dB, a->ln2, W(m, k->fc_w), N, C, F);
        } else {
            const sl_act *dy = base_grad(m, l, SL_LINEAR_MLP_DOWN, m->dresid, N, C);
            ops->matmul_backward(m->dB, GB(m, k->mlp_proj_w), G_OPT(m, k->mlp_proj_b), dy, a->fch_act,
                                 W(m, k->mlp_proj_w), N, F, C);
            if (m->lora)
                sl_lora_backward(m->lora, l, SL_LINEAR_MLP_DOWN, a->fch_act, dy, m->dB, W(m, k->mlp_proj_w), N, C);
            if (c->arch == SL_ARCH_GPT2 && !(m->lora && sl_lora_dora_on(m->lora, l, SL_LINEAR_MLP_UP))) {
                // dB (the GELU output's gradient) becomes the pre-GELU gradient
                ops->matmul_gelu_backward(m->dln, GB(m, k->fc_w), G_OPT(m, k->fc_b), m->dB, a->fch, a->ln2,
                                          W(m, k->fc_w), N, C, F);
                if (m->lora) sl_lora_backward(m->lora, l, SL_LINEAR_MLP_UP, a->ln2, m->dB, m->dln, W(m, k->fc_w), N, F);
            } else {  // LLaMA's SwiGLU, or DoRA on GPT-2's c_fc (its output gradient rescaled before the GEMM)
                if (c->arch == SL_ARCH_GPT2) ops->gelu_backward(m->dA, a->fch, m->dB, (size_t)N * F);
                else ops->swiglu_backward(m->dA, a->fch, m->dB, N, F);
                dy = base_grad(m, l, SL_LINEAR_MLP_UP, m->dA, N, FC);
                ops->matmul_backward(m->dln, GB(m, k->fc_w), G_OPT(m, k->fc_b), dy, a->ln2, W(m, k->fc_w), N, C, FC);
                if (m->lora) sl_lora_backward(m->lora, l, SL_LINEAR_MLP_UP, a->ln2, dy, m->dln, W(m, k->fc_w), N, FC);
            }
        }
        norm_backward(m, m->dresid, m->dln, a->resid2, k->ln2_w, k->ln2_b, a->ln2_mean, a->ln2_rstd, N);
        // attention
        const sl_act *dy = base_grad(m, l, SL_LINEAR_ATTN_OUT, m->dresid, N, C);
        ops->matmul_backward(m->dB, GB(m, k->attn_proj_w), G_OPT(m, k->attn_proj_b), dy, a->att,
                             W(m, k->attn_proj_w), N, A, C);
        if (m->lora) sl_lora_backward(m->lora, l, SL_LINEAR_ATTN_OUT, a->att, dy, m->dB, W(m, k->attn_proj_w), N, C);
        ops->attention_backward(m->dA, m->dB, a->qkv, a->att, a->lse, B, T, NH, NKV, HD, c->sliding_window);
        if (c->arch == SL_ARCH_LLAMA) ops->rope_backward(m->dA, m->rope_cos, m->rope_sin, B, T, NH, NKV, HD);
        // nothing below the lowest adapter needs the residual's gradient, so neither its ln1's
        sl_act *dln1 = !m->lora || l > lowest || lowest_input ? m->dln : NULL;
        dy = base_grad(m, l, SL_LINEAR_QKV, m->dA, N, QKV);
        if (dln1)  // (under LoRA the base has no gradient, so without dln1 nothing is left to compute)
            ops->matmul_backward(dln1, GB(m, k->qkv_w), G_OPT(m, k->qkv_b), dy, a->ln1, W(m, k->qkv_w), N, C, QKV);
        if (m->lora) sl_lora_backward(m->lora, l, SL_LINEAR_QKV, a->ln1, dy, dln1, W(m, k->qkv_w), N, QKV);
        if (dln1) norm_backward(m, m->dresid, m->dln, resid_in, k->ln1_w, k->ln1_b, a->ln1_mean, a->ln1_rstd, N);
        HOOK(m, SL_PARAMS_PUT, unit, next);
        HOOK(m, SL_GRADS_PUT, unit, next);
    }
    if (m->lora && !lora_saved_embeddings(m->lora)) {  // frozen embeddings: nothing more to compute; a tied
        if (tied) HOOK(m, SL_GRADS_PUT, 0, -1);         // head's adapter unit closes
        return 0;
    }
    if (!tied) HOOK(m, SL_GRADS_GET, 0, -1);
    // nn.Embedding(padding_idx): the padding token's row takes no gradient from the lookup (a tied
    // head's gradient for it stays): its gradient is put back as it was before the encoder's part
    float *dwte = GB(m, L->wte), *pad_grad = m->pad_row && dwte ? dwte + (size_t)c->pad_token_id * C : NULL;
    if (pad_grad) ops->copy(m->pad_row, pad_grad, (size_t)C * sizeof(float));
    ops->encoder_backward(dwte, G_OPT(m, L->wpe), m->dresid, m->inputs, B, T, C);
    if (m->lora) lora_tokens_lookup_grad(m->lora, m->dresid, m->inputs, N, m->pad_row ? c->pad_token_id : -1);
    if (m->lora && m->lora->embed_A >= 0) {  // the embedding's adapter reads its B: unit 0's parameters again
        HOOK(m, SL_PARAMS_GET, 0, -1);
        lora_embed_backward(m->lora, m->dresid, m->inputs, N, m->pad_row ? c->pad_token_id : -1);
        HOOK(m, SL_PARAMS_PUT, 0, -1);
    }
    if (pad_grad) ops->copy(pad_grad, m->pad_row, (size_t)C * sizeof(float));
    HOOK(m, SL_GRADS_PUT, 0, -1);
    return 0;
}
