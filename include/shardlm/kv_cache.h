// kv_cache.h: incremental decoding. The cache holds every layer's keys and values for the positions
// fed so far, in the backend's memory and activation storage type; sl_model_forward_cached runs the
// model's one forward pass over new tokens against it (model.c): a prompt from position 0 as one
// prefill, then one token at a time attending to the cache (ops->attention_decode), so each new token
// costs O(context) attention instead of recomputing the whole prefix.
#ifndef SHARDLM_KV_CACHE_H
#define SHARDLM_KV_CACHE_H

#include "shardlm/model.h"

typedef struct sl_kv_cache {
    sl_model *model;
    int max_ctx;            // positions the cache holds (<= sl_config_context: max positions, more for dynamic RoPE)
    int pos;                // tokens fed so far
    void *k, *v;            // (n_layer, max_ctx, NKV*HD) activations of the model's backend
    float *logits;          // (Vp) host: the last position's logits after each forward
    sl_bf16 *logits_bf16;   // (Vp) host: their bf16 storage, with bf16 activations
} sl_kv_cache;

// max_ctx <= 0 or beyond the model's context: the model's context.
int sl_kv_cache_init(sl_kv_cache *kv, sl_model *model, int max_ctx);
void sl_kv_cache_free(sl_kv_cache *kv);
void sl_kv_cache_reset(sl_kv_cache *kv);

// Feeds T tokens at positions kv->pos.. (sl_model_forward_cached) and returns the last one's logits
// (padded_vocab_size floats, host memory; the first vocab_size are real). Errors: cache full, token
// out of range.
int sl_model_forward_cached(sl_model *m, sl_kv_cache *kv, const int *tokens, int T, const float **logits);

// One token: sl_model_forward_cached(kv->model, kv, &token, 1, logits).
int sl_kv_cache_forward(sl_kv_cache *kv, int token, const float **logits);

#endif
