// kv_cache.h: incremental decoding with a key/value cache. Each call feeds one token at the next
// position and returns its logits; keys and values of every layer are kept for all earlier
// positions, so a token costs O(context) attention instead of recomputing the whole prefix.
#ifndef SHARDLM_KV_CACHE_H
#define SHARDLM_KV_CACHE_H

#include "shardlm/model.h"

// The widest head (HD/2 frequencies) the decode step's dynamic-RoPE row takes on the stack.
#define SL_KV_ROPE_MAX_HALF 1024

typedef struct {
    const sl_model *model;
    int max_ctx;            // positions the cache holds (<= sl_config_context: max positions, or more for dynamic RoPE)
    int pos;                // tokens fed so far
    float *k, *v;           // (n_layer, max_ctx, NKV*HD)
    float *x, *xn, *mean, *rstd, *qkv, *att, *fch, *fch_act, *tmp;  // one position's activations
    float *logits;          // (Vp)
    float *rope_row;        // (HD) cos and sin of the current position, for dynamic NTK RoPE
    float *memory;
} sl_kv_cache;

int sl_kv_cache_init(sl_kv_cache *kv, const sl_model *model, int max_ctx);
void sl_kv_cache_free(sl_kv_cache *kv);
void sl_kv_cache_reset(sl_kv_cache *kv);

// Feeds `token` at position kv->pos and returns its logits (padded_vocab_size floats; the first
// vocab_size are real) through *logits. Errors: cache full, token out of range.
int sl_kv_cache_forward(sl_kv_cache *kv, int token, const float **logits);

#endif
