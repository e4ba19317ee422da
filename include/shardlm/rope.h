// rope.h: rotary position embedding tables as transformers computes them for each rope_type
// (modeling_rope_utils.py: default, linear, dynamic NTK, llama3, yarn). A table row t holds
// cos / sin of t * inv_freq[i] for i < HD/2, times the type's attention scaling (yarn's mscale).
#ifndef SHARDLM_ROPE_H
#define SHARDLM_ROPE_H

#include "shardlm/config.h"

// The HD/2 inverse frequencies and the cos/sin scale for a forward whose positions run to seq_len - 1
// (only dynamic NTK depends on seq_len: it stretches theta once seq_len passes max positions).
void sl_rope_inv_freq(const sl_model_config *c, int seq_len, float *inv_freq, float *scale);

// Rows [pos0, pos0 + n) of the tables into cos_t / sin_t ((n, half) each).
void sl_rope_fill(float *cos_t, float *sin_t, int pos0, int n, int half, const float *inv_freq, float scale);

// Unscaled tables (max_T, HD/2) for theta: inv_freq[i] = 1 / theta^(2i/HD). -1: out of memory.
int sl_rope_tables(float *cos_t, float *sin_t, int max_T, int HD, float theta);

// Whether the tables of a forward depend on its length (dynamic NTK past max positions).
int sl_rope_depends_on_length(const sl_model_config *c);

#endif
