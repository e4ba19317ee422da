// generate.h: autoregressive sampling with the KV cache: the prompt runs as one forward (prefill),
// then each new token is drawn by the sampler (temperature / top-k / top-p) from a counter-based RNG
// stream, so the same (seed, prompt, settings) always gives the same text.
#ifndef SHARDLM_GENERATE_H
#define SHARDLM_GENERATE_H

#include <stdint.h>
#include <stdio.h>
#include "shardlm/model.h"
#include "shardlm/sampler.h"
#include "shardlm/tokenizer.h"

typedef struct {
    int max_new_tokens;
    sl_sampler_config sampler;
    uint64_t seed;
    int stop_at_eot;          // stop after sampling the end-of-text token (the tokenizer's eos) or
    const int *stop_ids;      // any of these (the model's eos_token_id list: LLaMA 3 Instruct's <|eot_id|>)
    int n_stop_ids;
} sl_generate_config;

// Generates after `prompt` (n_prompt >= 1 ids). New ids go to out_ids (capacity max_new_tokens;
// may be NULL) and, decoded, to `stream` as they are produced (may be NULL). *n_out receives the count.
int sl_generate(sl_model *m, const sl_tokenizer *tok, const int *prompt, int n_prompt,
                const sl_generate_config *cfg, int *out_ids, int *n_out, FILE *stream);

#endif
