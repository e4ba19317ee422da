// kv_cache.c: the KV cache's buffers (see kv_cache.h); the forward that fills and reads them is the
// model's own (model.c, sl_model_forward_cached).
#include "shardlm/kv_cache.h"
#include "shardlm/error.h"

#include <stdlib.h>
#include <string.h>

int sl_kv_cache_init(sl_kv_cache *kv, sl_model *m, int max_ctx) {
    memset(kv, 0, sizeof *kv);
    const sl_model_config *c = &m->cfg;
    if (max_ctx <= 0 || max_ctx > sl_config_context(c)) max_ctx = sl_config_context(c);
    size_t elem = m->ops->act_bf16 ? sizeof(sl_bf16) : sizeof(float);
    size_t bytes = (size_t)c->n_layer * (size_t)max_ctx * (size_t)c->n_kv_head * (size_t)sl_config_head_dim(c) * elem;
    size_t Vp = (size_t)c->padded_vocab_size;
    kv->model = m;
    kv->max_ctx = max_ctx;
    kv->k = m->ops->alloc(bytes, "KV cache");
    kv->v = kv->k ? m->ops->alloc(bytes, "KV cache") : NULL;
    kv->logits = kv->v ? sl_malloc(Vp * sizeof(float), "KV cache logits") : NULL;
    kv->logits_bf16 = kv->logits && m->ops->act_bf16 ? sl_malloc(Vp * sizeof(sl_bf16), "KV cache logits") : NULL;
    if (!kv->logits || (m->ops->act_bf16 && !kv->logits_bf16)) {
        sl_kv_cache_free(kv);
        return -1;
    }
    return 0;
}

void sl_kv_cache_free(sl_kv_cache *kv) {
    if (kv->model) {
        if (kv->k) kv->model->ops->dealloc(kv->k);
        if (kv->v) kv->model->ops->dealloc(kv->v);
    }
    free(kv->logits);
    free(kv->logits_bf16);
    memset(kv, 0, sizeof *kv);
}

void sl_kv_cache_reset(sl_kv_cache *kv) { kv->pos = 0; }

int sl_kv_cache_forward(sl_kv_cache *kv, int token, const float **logits) {
    return sl_model_forward_cached(kv->model, kv, &token, 1, logits);
}
