// sampler.h: picks the next token from a row of logits, with Hugging Face generate()'s semantics:
// temperature scaling, then top-k (ties with the k-th value are kept, as TopKLogitsWarper does),
// then top-p / nucleus (the smallest set of most probable tokens whose cumulative probability
// reaches top_p, always at least one), then one draw from the renormalised distribution.
#ifndef SHARDLM_SAMPLER_H
#define SHARDLM_SAMPLER_H

#include <stddef.h>
#include "shardlm/rng.h"

typedef struct {
    float temperature;  // 0: greedy (argmax, lowest index on ties); must be >= 0
    int top_k;          // 0: off
    float top_p;        // 1.0: off; must lie in (0, 1]
} sl_sampler_config;

// Index of the largest logit (the lowest such index on ties); -1 when n <= 0.
int sl_argmax(const float *logits, int n);

// Returns a token id in [0, n), drawing from `rng` (exactly one uniform per sampled token, none when
// greedy), or -1 with an error for bad arguments (n <= 0, temperature < 0, top_p outside (0, 1],
// top_k < 0), NaN logits, or out of memory. Partial selection keeps top_k small from sorting the
// whole vocabulary; only top_p without top_k sorts every token.
int sl_sample(const float *logits,  // (n,)
              int n, const sl_sampler_config *cfg, sl_rng *rng);

#endif
