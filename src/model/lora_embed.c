// lora_embed.c: PEFT's LoRA on the embedding (lora_embed.h). The lookup's share of the adapter,
// u = A^T[tokens] (N, r), is gathered on the host (A is (r, vocab): a token's column); its product with
// B and the scaled add, and their backward, go through the ops table like the blocks' adapters.
#include "model/lora_embed.h"
#include "model/lora_dora.h"
#include "model/lora_saved.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A 2-D tensor of unit 0 named as PEFT saves the Embedding's ParameterDict entries (no ".weight").
static int add_pair_tensor(sl_lora *lo, const sl_param_layout *L, size_t *offset, const char *module, const char *which,
                           int rows, int cols) {
    sl_tensor_info t = L->tensors[L->wte];
    char name[sizeof t.name];
    snprintf(name, sizeof name, "%s.%s", module, which);
    t.ndim = 2;
    t.shape[0] = t.hf_rows = rows;
    t.shape[1] = cols;
    t.numel = (size_t)rows * (size_t)cols;
    t.weight_decay = 1;  // an adapter's matrix, as the blocks' lora_A / lora_B
    return lora_saved_add_tensor(lo, offset, 0, &t, name, 0);
}

int lora_embed_add(sl_lora *lo, const sl_param_layout *L, size_t *offset, const char *module, int r, float scale) {
    if (lo->tokens_delta >= 0)
        return sl_errorf("lora: trainable_token_indices with a LoRA adapter on %s (target_modules): keep one of them",
                         module);
    if (lora_saved_has_copy(lo, L, L->wte) || lo->head_copy >= 0)
        return sl_errorf("lora: a modules_to_save copy of %s next to a LoRA adapter on it: keep one of them",
                         lo->head_copy >= 0 ? "lm_head (the tied embedding)" : module);
    snprintf(lo->embed_module, sizeof lo->embed_module, "%s", module);
    lo->saved_floor = -1;  // the backward runs down to the embedding (lora_saved_attach keeps it so)
    lo->embed_r = r;
    lo->embed_scale = scale;
    if ((lo->embed_A = add_pair_tensor(lo, L, offset, module, "lora_embedding_A", r, L->cfg.vocab_size)) < 0 ||
        (lo->embed_B = add_pair_tensor(lo, L, offset, module, "lora_embedding_B", L->cfg.n_embd, r)) < 0)
        return -1;
    return 0;
}

void lora_embed_init(const sl_lora *lo, float *host, uint64_t seed) {
    if (lo->embed_A < 0) return;
    const sl_tensor_info *A = &lo->tensors[lo->embed_A], *B = &lo->tensors[lo->embed_B];
    sl_rng rng = sl_rng_make(seed, 1, (uint64_t)lo->embed_A, SL_RNG_INIT);  // rank 1: apart from the base's
    int zero_a = lo->cfg.init_lora_weights != SL_LORA_INIT_NONE;
    for (size_t j = 0; j < A->numel; j++) host[A->offset + j] = zero_a ? 0.0f : sl_rng_normal(&rng);
    for (size_t j = 0; j < B->numel; j++) host[B->offset + j] = sl_rng_normal(&rng);
}

void lora_embed_free(sl_lora *lo) {
    if (lo->embed_u) lo->ops->dealloc(lo->embed_u);
    free(lo->embed_rows);
    lo->embed_rows = NULL;
    lo->embed_u = lo->embed_delta = lo->embed_du = NULL;
    lo->embed_N = 0;
}

int lora_embed_plan(sl_lora *lo, int N) {
    if (lo->embed_A < 0 || (lo->embed_u && N <= lo->embed_N)) return 0;
    lora_embed_free(lo);
    size_t e = lo->ops->act_bf16 ? sizeof(sl_bf16) : sizeof(float), n = (size_t)N, r = (size_t)lo->embed_r;
    lo->embed_u = lo->ops->alloc(n * (2 * r + (size_t)lo->model_cfg.n_embd) * e, "LoRA embedding activations");
    lo->embed_rows = sl_malloc(n * r * sizeof(float), "LoRA embedding rows");
    if (!lo->embed_u || !lo->embed_rows) {
        lora_embed_free(lo);
        return sl_error_context("planning the LoRA embedding adapter for %d rows", N);
    }
    lo->embed_du = sl_act_at(lo->embed_u, n * r, e);
    lo->embed_delta = sl_act_at(lo->embed_u, 2 * n * r, e);
    lo->embed_N = N;
    return 0;
}

void lora_embed_forward(sl_lora *lo, sl_act *encoded, const int *inputs, int N) {
    if (lo->embed_A < 0) return;
    const sl_ops *ops = lo->ops;
    int r = lo->embed_r, V = lo->model_cfg.vocab_size, C = lo->model_cfg.n_embd, bf16 = ops->act_bf16;
    const float *A = lora_param(lo, lo->embed_A);
    float *u = lo->embed_rows;
    for (int n = 0; n < N; n++)  // F.embedding(x, A^T): row n is the token's column of A
        for (int k = 0; k < r; k++) u[(size_t)n * r + k] = A[(size_t)k * V + inputs[n]];
    if (bf16) ops->to_storage((sl_bf16 *)(void *)lo->embed_u, u, (size_t)N * r);
    else ops->copy(lo->embed_u, u, (size_t)N * r * sizeof(float));
    ops->matmul_forward(lo->embed_delta, lo->embed_u, lora_weight(lo, lo->embed_B), NULL, N, r, C);  // u @ B^T
    ops->add_columns(encoded, lo->embed_delta, lo->embed_scale, N, C, C, 0);
}

void lora_embed_backward(const sl_lora *lo, const sl_act *dout, const int *inputs, int N, int pad) {
    float *dA = lo->embed_A >= 0 ? lora_grad(lo, lo->embed_A) : NULL;
    if (!dA) return;
    const sl_ops *ops = lo->ops;
    int r = lo->embed_r, V = lo->model_cfg.vocab_size, C = lo->model_cfg.n_embd, bf16 = ops->act_bf16;
    ops->take_columns(lo->embed_delta, dout, lo->embed_scale, N, C, C, 0);  // g = scale * dout
    ops->matmul_backward(lo->embed_du, lora_grad(lo, lo->embed_B), NULL, lo->embed_delta, lo->embed_u,
                         lora_weight(lo, lo->embed_B), N, r, C);  // du = g @ B, dB += g^T @ u
    for (int n = 0; n < N; n++) {  // A^T's rows take du's, in row order (the embedding scatter's)
        if (inputs[n] == pad) continue;
        for (int k = 0; k < r; k++)
            dA[(size_t)k * V + inputs[n]] += lora_act_value(lo->embed_du, (size_t)n * r + k, bf16);
    }
}

int lora_embed_merge(const sl_lora *lo, const sl_param_layout *L, const float *host, float *params,
                     float (*round16)(float)) {
    if (lo->embed_A < 0) return 0;
    if (L->lm_head < 0)
        return sl_errorf("merge: the LoRA adapter on %s cannot be merged on a model whose lm_head is that matrix "
                         "(tie_word_embeddings): the merged head would read the adapter's delta, which the adapted "
                         "model's head does not; keep the adapter separate", lo->embed_module);
    const float *A = host + lo->tensors[lo->embed_A].offset, *B = host + lo->tensors[lo->embed_B].offset;
    int r = lo->embed_r, V = lo->model_cfg.vocab_size, C = lo->model_cfg.n_embd;
    float *W = params + L->tensors[L->wte].offset;
    for (int v = 0; v < V; v++)  // W[v, c] += (B @ A)[c, v] * scale, each sum over k in order
        for (int c = 0; c < C; c++) {
            float d = 0.0f;
            for (int k = 0; k < r; k++) d = fmaf(B[(size_t)c * r + k], A[(size_t)k * V + v], d);
            float delta = d * lo->embed_scale;  // get_delta_weight, then .to(the base's dtype)
            W[(size_t)v * C + c] += round16 ? round16(delta) : delta;
        }
    return 0;
}
