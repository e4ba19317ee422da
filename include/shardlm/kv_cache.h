// kv_cache.h: incremental decoding with a key/value cache. Each call feeds one token at the next
// position and returns its logits; keys and values of every layer are kept for all earlier
// positions, so a token costs O(context) attention instead of recomputing the whole prefix.
#ifndef SHARDLM_KV_CACHE_H
#define SHARDLM_KV_CACHE_H

#include "shardlm/model.h"

typedef struct {
    const sl_model *model;
    int max_ctx;            // positions the cache holds (<= the model's max_seq_len)
    int pos;                // tokens fed so far
    float *k, *v;           // (n_layer, max_ctx, NKV*HD)
    float *x, *xn, *mean, *rstd, *qkv, *att, *fch, *fch_act, *tmp;  // one position's activations
    float *logits;          // (Vp)
    float *memory;
} sl_kv_cache;

int sl_kv_cache_init(sl_kv_cache *kv, const sl_model *model, int max_ctx);
void sl_kv_cache_free(sl_kv_cache *kv);
void sl_kv_cache_reset(sl_kv_cache *kv);

// Feeds `token` at position kv->pos and returns its logits (padded_vocab_size floats; the first
// vocab_size are real) through *logits. Errors: cache full, token out of range.
int sl_kv_cache_forward(sl_kv_cache *kv, int token, const float **logits);

#endif
