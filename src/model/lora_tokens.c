// lora_tokens.c: PEFT's trainable_token_indices (lora_tokens.h): some rows of the embedding trained whole
// next to the adapters. The rows live in the adapters' buffer (unit 0); the model reads the embedding
// through a copy of the base's in which they are written before each lookup, as PEFT's
// get_merged_weights index_copy's them in; their gradients come from the lookup and a tied head.
#include "model/lora_tokens.h"
#include "model/lora_dora.h"
#include "model/lora_saved.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// trainable_token_indices' rows (n, C) in unit 0, named as PEFT saves them; the token ids checked
// against the vocabulary, the key of the object form against the embedding's path.
int lora_tokens_add(sl_lora *lo, const sl_param_layout *L, size_t *offset) {
    const sl_lora_config *cfg = &lo->cfg;
    if (!cfg->n_token_indices) return 0;
    char module[sizeof L->tensors[0].name], name[sizeof module + 48];
    const char *wte = L->tensors[L->wte].name;
    snprintf(module, sizeof module, "%.*s", (int)(strrchr(wte, '.') - wte), wte);
    size_t key = strlen(cfg->token_module), len = strlen(module);  // the object form's key: Python's endswith
    if (key && (key > len || strcmp(module + len - key, cfg->token_module) != 0))
        return sl_errorf("lora: trainable_token_indices names module '%s'; shardlm trains tokens of the embedding (%s) "
                         "only", cfg->token_module, module);
    for (int i = 0; i < cfg->n_token_indices; i++)
        if (cfg->token_indices[i] >= L->cfg.vocab_size)
            return sl_errorf("lora: trainable_token_indices: token %d is past the vocabulary (%d tokens)",
                             cfg->token_indices[i], L->cfg.vocab_size);
    if (lora_saved_has_copy(lo, L, L->wte) || lo->head_copy >= 0)
        return sl_errorf("lora: trainable_token_indices with a modules_to_save copy of %s: keep one of them",
                         lo->head_copy >= 0 ? "lm_head (the tied embedding)" : module);
    sl_tensor_info rows = L->tensors[L->wte];
    rows.shape[0] = rows.hf_rows = cfg->n_token_indices;
    rows.numel = (size_t)cfg->n_token_indices * (size_t)rows.shape[1];
    rows.weight_decay = 0;  // an embedding's rows
    snprintf(name, sizeof name, "%s.token_adapter.trainable_tokens_delta", module);
    return (lo->tokens_delta = lora_saved_add_tensor(lo, offset, 0, &rows, name, 0)) < 0 ? -1 : 0;
}

// trainable_token_indices when attached: which row a token id trains, the embedding with those rows
// replaced (a copy of the base's as the ops read it), and for fresh adapters the rows' start, the base's.
int lora_tokens_attach(sl_lora *lo, const sl_param_layout *L, float *const *base_view, const sl_act *wte,
                       size_t act_elem) {
    free(lo->token_slot);
    lo->token_slot = NULL;
    if (lo->tokens_weight) lo->ops->dealloc(lo->tokens_weight);
    lo->tokens_weight = NULL;
    if (lo->tokens_delta < 0) return 0;
    const sl_tensor_info *e = &L->tensors[L->wte], *rows = &lo->tensors[lo->tokens_delta];
    int C = e->shape[1];
    lo->tokens_base = L->wte;
    lo->token_slot = sl_malloc((size_t)e->shape[0] * sizeof(int), "trainable tokens");
    lo->tokens_weight = lo->ops->alloc(e->numel * act_elem, "trainable tokens' embedding");
    if (!lo->token_slot || !lo->tokens_weight) return -1;
    for (int v = 0; v < e->shape[0]; v++) lo->token_slot[v] = -1;
    lo->ops->copy(lo->tokens_weight, wte, e->numel * act_elem);
    for (int j = 0; j < lo->cfg.n_token_indices; j++) {
        int v = lo->cfg.token_indices[j];
        lo->token_slot[v] = j;
        if (lo->saved_init_pending)  // PEFT's start: the base's rows
            lo->ops->copy(lo->params + rows->offset + (size_t)j * C,
                          base_view[e->unit] + (e->offset - L->unit_begin[e->unit]) + (size_t)v * C, C * sizeof(float));
    }
    return 0;
}


void lora_tokens_refresh(sl_lora *lo) {
    if (!lo->tokens_weight) return;
    int C = lo->model_cfg.n_embd, bf16 = lo->ops->act_bf16;
    const float *rows = lora_param(lo, lo->tokens_delta);
    for (int j = 0; j < lo->cfg.n_token_indices; j++) {
        sl_act *dst = sl_act_at(lo->tokens_weight, (size_t)lo->cfg.token_indices[j] * C, bf16 ? 2 : 4);
        if (bf16) lo->ops->to_storage((sl_bf16 *)(void *)dst, rows + (size_t)j * C, (size_t)C);
        else lo->ops->copy(dst, rows + (size_t)j * C, (size_t)C * sizeof(float));
    }
}

void lora_tokens_lookup_grad(const sl_lora *lo, const sl_act *dout, const int *inputs, int N, int pad) {
    float *g = lo->tokens_weight ? lora_grad(lo, lo->tokens_delta) : NULL;
    if (!g) return;
    int C = lo->model_cfg.n_embd, bf16 = lo->ops->act_bf16;
    for (int n = 0; n < N; n++) {  // in token order, as the embedding's scatter adds them
        int j = inputs[n] == pad ? -1 : lo->token_slot[inputs[n]];
        if (j < 0) continue;
        for (int c = 0; c < C; c++) g[(size_t)j * C + c] += lora_act_value(dout, (size_t)n * C + c, bf16);
    }
}

int lora_tokens_head_grad(const sl_lora *lo, const sl_act *dlogits, const sl_act *x, int N, int Vp) {
    float *g = lo->tokens_weight ? lora_grad(lo, lo->tokens_delta) : NULL;
    if (!g) return 0;
    // dlogits' columns of the trained tokens gathered (N, n), then g (n, C) += that^T @ x (N, C): one GEMM,
    // the head's weight gradient restricted to the trained rows (the weight is not read without dinp)
    int n = lo->cfg.n_token_indices;
    size_t e = lo->ops->act_bf16 ? 2 : 4;
    unsigned char *cols = lo->ops->alloc((size_t)N * (size_t)n * e, "trainable tokens' logits gradient");
    if (!cols) return -1;
    const unsigned char *d = (const unsigned char *)(const void *)dlogits;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < n; j++)
            memcpy(cols + ((size_t)r * n + j) * e, d + ((size_t)r * Vp + (size_t)lo->cfg.token_indices[j]) * e, e);
    lo->ops->matmul_backward(NULL, g, NULL, (const sl_act *)(void *)cols, x, lo->tokens_weight, N,
                             lo->model_cfg.n_embd, n);
    lo->ops->dealloc(cols);
    return 0;
}

void lora_tokens_merge(const sl_lora *lo, const sl_param_layout *L, const float *host, float *params) {
    if (lo->tokens_delta < 0) return;  // the trained rows replace the embedding's (a tied head's too: one matrix)
    const sl_tensor_info *e = &L->tensors[L->wte], *rows = &lo->tensors[lo->tokens_delta];
    for (int j = 0; j < lo->cfg.n_token_indices; j++)
        memcpy(params + e->offset + (size_t)lo->cfg.token_indices[j] * e->shape[1],
               host + rows->offset + (size_t)j * e->shape[1], (size_t)e->shape[1] * sizeof(float));
}
