// kv_cache.c: one-token-at-a-time forward with cached keys/values (see kv_cache.h). It runs the
// same ops as training with N = 1 row, plus attention_decode against the cache.
#include "shardlm/kv_cache.h"
#include "shardlm/error.h"
#include "shardlm/rope.h"

#include <stdlib.h>
#include <string.h>

#define P(m, idx) ((m)->params + (m)->layout.tensors[(idx)].offset)
#define P_OPT(m, idx) ((idx) >= 0 ? P(m, idx) : NULL)

int sl_kv_cache_init(sl_kv_cache *kv, const sl_model *m, int max_ctx) {
    memset(kv, 0, sizeof *kv);
    if (m->ops->act_bf16)  // its buffers are fp32 host memory
        return sl_errorf("KV cache: the %s backend stores activations in bf16; decode with the cpu backend",
                         m->ops->name);
    const sl_model_config *c = &m->cfg;
    if (max_ctx <= 0 || max_ctx > sl_config_context(c)) max_ctx = sl_config_context(c);
    size_t HD = (size_t)sl_config_head_dim(c), KV = (size_t)c->n_kv_head * HD, C = (size_t)c->n_embd;
    size_t QKV = (size_t)(c->n_head + 2 * c->n_kv_head) * HD, F = (size_t)c->n_inner;
    size_t FC = c->arch == SL_ARCH_LLAMA ? 2 * F : F, A = (size_t)sl_config_attn_width(c);
    size_t cache = (size_t)c->n_layer * (size_t)max_ctx * KV;
    size_t total = 2 * cache + 3 * C + 2 + QKV + A + FC + F + (size_t)c->padded_vocab_size + 2 * HD;
    kv->memory = sl_malloc(total * sizeof(float), "KV cache");
    if (!kv->memory) return -1;
    float *p = kv->memory;
    kv->k = p; p += cache;
    kv->v = p; p += cache;
    kv->x = p; p += C;
    kv->xn = p; p += C;
    kv->tmp = p; p += C;
    kv->mean = p++;
    kv->rstd = p++;
    kv->qkv = p; p += QKV;
    kv->att = p; p += A;
    kv->fch = p; p += FC;
    kv->fch_act = p; p += F;
    kv->logits = p; p += c->padded_vocab_size;
    kv->rope_row = p;  // cos then sin of one position (dynamic NTK RoPE)
    kv->model = m;
    kv->max_ctx = max_ctx;
    return 0;
}

void sl_kv_cache_free(sl_kv_cache *kv) {
    free(kv->memory);
    memset(kv, 0, sizeof *kv);
}

void sl_kv_cache_reset(sl_kv_cache *kv) { kv->pos = 0; }

static void norm1(const sl_model *m, float *out, float *mean, float *rstd, const float *inp, int w, int b) {
    const sl_model_config *c = &m->cfg;
    if (c->arch == SL_ARCH_GPT2) m->ops->layernorm_forward(out, mean, rstd, inp, P(m, w), P(m, b), 1, c->n_embd, c->norm_eps);
    else m->ops->rmsnorm_forward(out, rstd, inp, P(m, w), 1, c->n_embd, c->norm_eps);
}

int sl_kv_cache_forward(sl_kv_cache *kv, int token, const float **logits) {
    const sl_model *m = kv->model;
    const sl_model_config *c = &m->cfg;
    const sl_ops *ops = m->ops;
    const sl_param_layout *L = &m->layout;
    if (kv->pos >= kv->max_ctx) return sl_errorf("generate: context of %d positions is full", kv->max_ctx);
    if (token < 0 || token >= c->vocab_size)
        return sl_errorf("generate: token %d is outside the vocabulary [0, %d)", token, c->vocab_size);
    int C = c->n_embd, F = c->n_inner, NH = c->n_head, NKV = c->n_kv_head, HD = sl_config_head_dim(c);
    int KV = NKV * HD, QKV = (NH + 2 * NKV) * HD, FC = c->arch == SL_ARCH_LLAMA ? 2 * F : F, pos = kv->pos;
    int A = sl_config_attn_width(c);
    // the rotation of this position: the model's tables, or (dynamic NTK) one row for a context of pos + 1
    const float *rope_cos = m->rope_cos, *rope_sin = m->rope_sin;
    int rope_pos = pos;
    if (sl_rope_depends_on_length(c)) {
        float inv_freq[SL_KV_ROPE_MAX_HALF], scale;
        if (HD / 2 > SL_KV_ROPE_MAX_HALF) return sl_errorf("generate: head_dim %d is too large for dynamic RoPE", HD);
        sl_rope_inv_freq(c, pos + 1, inv_freq, &scale);
        sl_rope_fill(kv->rope_row, kv->rope_row + HD / 2, pos, 1, HD / 2, inv_freq, scale);
        rope_cos = kv->rope_row;
        rope_sin = kv->rope_row + HD / 2;
        rope_pos = 0;
    }
    // a sliding window (Mistral): the last sliding_window positions of the cache, this one included
    int first = c->sliding_window && pos + 1 > c->sliding_window ? pos + 1 - c->sliding_window : 0;

    if (ops->set_precision) ops->set_precision(m->precision);  // the GEMMs' compute type is the backend's last setting
    const float *wpe_row = L->wpe >= 0 ? P(m, L->wpe) + (size_t)pos * C : NULL;
    memcpy(kv->x, P(m, L->wte) + (size_t)token * C, sizeof(float) * C);
    if (wpe_row) ops->residual_forward(kv->x, kv->x, wpe_row, (size_t)C);
    for (int l = 0; l < c->n_layer; l++) {
        const sl_block_tensors *b = &L->blocks[l];
        float *kc = kv->k + (size_t)l * kv->max_ctx * KV, *vc = kv->v + (size_t)l * kv->max_ctx * KV;
        norm1(m, kv->xn, kv->mean, kv->rstd, kv->x, b->ln1_w, b->ln1_b);
        ops->matmul_forward(kv->qkv, kv->xn, P(m, b->qkv_w), P_OPT(m, b->qkv_b), 1, C, QKV);
        if (c->arch == SL_ARCH_LLAMA) ops->rope_forward(kv->qkv, rope_cos, rope_sin, 1, 1, NH, NKV, HD, rope_pos);
        memcpy(kc + (size_t)pos * KV, kv->qkv + (size_t)NH * HD, sizeof(float) * KV);
        memcpy(vc + (size_t)pos * KV, kv->qkv + (size_t)(NH + NKV) * HD, sizeof(float) * KV);
        ops->attention_decode(kv->att, kv->qkv, kc + (size_t)first * KV, vc + (size_t)first * KV, pos + 1 - first, NH,
                              NKV, HD);
        ops->matmul_forward(kv->tmp, kv->att, P(m, b->attn_proj_w), P_OPT(m, b->attn_proj_b), 1, A, C);
        ops->residual_forward(kv->x, kv->x, kv->tmp, (size_t)C);
        norm1(m, kv->xn, kv->mean, kv->rstd, kv->x, b->ln2_w, b->ln2_b);
        ops->matmul_forward(kv->fch, kv->xn, P(m, b->fc_w), P_OPT(m, b->fc_b), 1, C, FC);
        if (c->arch == SL_ARCH_GPT2) ops->gelu_forward(kv->fch_act, kv->fch, (size_t)F);
        else ops->swiglu_forward(kv->fch_act, kv->fch, 1, F);
        ops->matmul_forward(kv->tmp, kv->fch_act, P(m, b->mlp_proj_w), P_OPT(m, b->mlp_proj_b), 1, F, C);
        ops->residual_forward(kv->x, kv->x, kv->tmp, (size_t)C);
    }
    norm1(m, kv->xn, kv->mean, kv->rstd, kv->x, L->lnf_w, L->lnf_b);
    int head = L->lm_head >= 0 ? L->lm_head : L->wte;
    ops->matmul_forward(kv->logits, kv->xn, P(m, head), NULL, 1, C, c->padded_vocab_size);
    kv->pos++;
    *logits = kv->logits;
    return 0;
}
