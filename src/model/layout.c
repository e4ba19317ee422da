// layout.c: builds the offsets table for the flat, layer-major parameter buffer (see layout.h).
// Invariants: tensors are listed in buffer order with no gaps; block l's tensors lie exactly in
// [block_begin[l], block_begin[l+1]); fused groups (q/k/v, gate/up) are adjacent.
#include "shardlm/layout.h"
#include "shardlm/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

typedef struct { sl_param_layout *L; int cap; size_t offset; int quantised_linears; } builder;

__attribute__((format(printf, 8, 9)))
static int add(builder *b, int layer, int decay, int transposed, int hf_rows, int rows, int cols, const char *fmt, ...) {
    sl_tensor_info *t = &b->L->tensors[b->L->n_tensors];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->offset = b->offset;
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols > 0 ? cols : 1;
    t->numel = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    t->hf_rows = hf_rows;
    t->hf_transposed = transposed;
    t->layer = layer;
    t->weight_decay = decay;
    // a block's linear weight of a quantised base keeps only a placeholder here (layout.h)
    t->quantised = b->quantised_linears && layer >= 0 && decay && t->ndim == 2;
    b->offset += sl_layout_stored(t);
    return b->L->n_tensors++;
}

static void build_gpt2(builder *b, const sl_model_config *c) {
    sl_param_layout *L = b->L;
    int C = c->n_embd, F = c->n_inner;
    L->wte = add(b, -1, 0, 0, c->vocab_size, c->padded_vocab_size, C, "transformer.wte.weight");
    L->wpe = add(b, -1, 0, 0, c->max_seq_len, c->max_seq_len, C, "transformer.wpe.weight");
    for (int l = 0; l < c->n_layer; l++) {
        sl_block_tensors *k = &L->blocks[l];
        L->block_begin[l] = b->offset;
        k->ln1_w = add(b, l, 0, 0, C, C, 0, "transformer.h.%d.ln_1.weight", l);
        k->ln1_b = add(b, l, 0, 0, C, C, 0, "transformer.h.%d.ln_1.bias", l);
        k->qkv_w = add(b, l, 1, 1, 3 * C, 3 * C, C, "transformer.h.%d.attn.c_attn.weight", l);
        k->qkv_b = add(b, l, 0, 0, 3 * C, 3 * C, 0, "transformer.h.%d.attn.c_attn.bias", l);
        k->attn_proj_w = add(b, l, 1, 1, C, C, C, "transformer.h.%d.attn.c_proj.weight", l);
        k->attn_proj_b = add(b, l, 0, 0, C, C, 0, "transformer.h.%d.attn.c_proj.bias", l);
        k->ln2_w = add(b, l, 0, 0, C, C, 0, "transformer.h.%d.ln_2.weight", l);
        k->ln2_b = add(b, l, 0, 0, C, C, 0, "transformer.h.%d.ln_2.bias", l);
        k->fc_w = add(b, l, 1, 1, F, F, C, "transformer.h.%d.mlp.c_fc.weight", l);
        k->fc_b = add(b, l, 0, 0, F, F, 0, "transformer.h.%d.mlp.c_fc.bias", l);
        k->mlp_proj_w = add(b, l, 1, 1, C, C, F, "transformer.h.%d.mlp.c_proj.weight", l);
        k->mlp_proj_b = add(b, l, 0, 0, C, C, 0, "transformer.h.%d.mlp.c_proj.bias", l);
    }
    L->block_begin[c->n_layer] = b->offset;
    L->lnf_w = add(b, -1, 0, 0, C, C, 0, "transformer.ln_f.weight");
    L->lnf_b = add(b, -1, 0, 0, C, C, 0, "transformer.ln_f.bias");
    L->lm_head = -1;  // tied to wte
}

static void build_llama(builder *b, const sl_model_config *c) {
    sl_param_layout *L = b->L;
    int C = c->n_embd, F = c->n_inner, A = sl_config_attn_width(c), KV = c->n_kv_head * sl_config_head_dim(c);
    L->wte = add(b, -1, 0, 0, c->vocab_size, c->padded_vocab_size, C, "model.embed_tokens.weight");
    L->wpe = -1;
    for (int l = 0; l < c->n_layer; l++) {
        sl_block_tensors *k = &L->blocks[l];
        L->block_begin[l] = b->offset;
        k->ln1_w = add(b, l, 0, 0, C, C, 0, "model.layers.%d.input_layernorm.weight", l);
        k->ln1_b = -1;
        k->qkv_w = add(b, l, 1, 0, A, A, C, "model.layers.%d.self_attn.q_proj.weight", l);
        add(b, l, 1, 0, KV, KV, C, "model.layers.%d.self_attn.k_proj.weight", l);
        add(b, l, 1, 0, KV, KV, C, "model.layers.%d.self_attn.v_proj.weight", l);
        k->qkv_b = -1;
        if (c->qkv_bias) {  // Qwen2: one (A + 2KV) bias vector for the fused GEMM
            k->qkv_b = add(b, l, 0, 0, A, A, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add(b, l, 0, 0, KV, KV, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add(b, l, 0, 0, KV, KV, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        k->attn_proj_w = add(b, l, 1, 0, C, C, A, "model.layers.%d.self_attn.o_proj.weight", l);
        k->attn_proj_b = -1;
        k->ln2_w = add(b, l, 0, 0, C, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        k->ln2_b = -1;
        k->fc_w = add(b, l, 1, 0, F, F, C, "model.layers.%d.mlp.gate_proj.weight", l);
        add(b, l, 1, 0, F, F, C, "model.layers.%d.mlp.up_proj.weight", l);
        k->fc_b = -1;
        k->mlp_proj_w = add(b, l, 1, 0, C, C, F, "model.layers.%d.mlp.down_proj.weight", l);
        k->mlp_proj_b = -1;
    }
    L->block_begin[c->n_layer] = b->offset;
    L->lnf_w = add(b, -1, 0, 0, C, C, 0, "model.norm.weight");
    L->lnf_b = -1;
    L->lm_head = c->tie_word_embeddings ? -1
                                        : add(b, -1, 1, 0, c->vocab_size, c->padded_vocab_size, C, "lm_head.weight");
}

static int build(sl_param_layout *L, const sl_model_config *cfg, int quantised_linears) {
    memset(L, 0, sizeof *L);
    L->cfg = *cfg;
    int cap = 4 + 20 * cfg->n_layer;
    L->tensors = sl_calloc((size_t)cap, sizeof *L->tensors, "parameter layout");
    L->blocks = sl_calloc((size_t)cfg->n_layer, sizeof *L->blocks, "parameter layout");
    L->block_begin = sl_calloc((size_t)cfg->n_layer + 1, sizeof *L->block_begin, "parameter layout");
    if (!L->tensors || !L->blocks || !L->block_begin) { sl_layout_free(L); return -1; }
    builder b = {L, cap, 0, quantised_linears};
    if (cfg->arch == SL_ARCH_GPT2) build_gpt2(&b, cfg);
    else build_llama(&b, cfg);
    L->total = b.offset;
    L->n_units = cfg->n_layer + 2;
    L->unit_begin = sl_calloc((size_t)L->n_units + 1, sizeof *L->unit_begin, "parameter layout");
    if (!L->unit_begin) { sl_layout_free(L); return -1; }
    for (int l = 0; l <= cfg->n_layer; l++) L->unit_begin[l + 1] = L->block_begin[l];
    L->unit_begin[L->n_units] = L->total;
    for (int i = 0; i < L->n_tensors; i++) {
        sl_tensor_info *t = &L->tensors[i];
        t->unit = t->layer >= 0 ? t->layer + 1 : (t->offset < L->block_begin[0] ? 0 : L->n_units - 1);
    }
    return 0;
}

int sl_layout_build(sl_param_layout *L, const sl_model_config *cfg) { return build(L, cfg, 0); }
int sl_layout_build_quantised(sl_param_layout *L, const sl_model_config *cfg) { return build(L, cfg, 1); }

int sl_layout_is_block_linear(const sl_param_layout *L, int t) {
    const sl_tensor_info *x = &L->tensors[t];
    return x->ndim == 2 && x->layer >= 0 && x->weight_decay && t != L->wte && t != L->wpe && t != L->lm_head;
}

void sl_layout_free(sl_param_layout *L) {
    free(L->tensors);
    free(L->blocks);
    free(L->block_begin);
    free(L->unit_begin);
    memset(L, 0, sizeof *L);
}

int sl_layout_find(const sl_param_layout *L, const char *name) {
    for (int i = 0; i < L->n_tensors; i++)
        if (strcmp(L->tensors[i].name, name) == 0) return i;
    return -1;
}

size_t sl_layout_num_parameters(const sl_param_layout *L) {
    size_t n = 0;
    for (int i = 0; i < L->n_tensors; i++) {
        const sl_tensor_info *t = &L->tensors[i];
        n += (size_t)t->hf_rows * (size_t)t->shape[1];
    }
    return n;
}
