// lora_embed.h: PEFT's LoRA on the embedding (its lora.Embedding: target_modules naming "wte" /
// "embed_tokens"), next to the blocks' adapters; internal to the model. lora_embedding_A (r, vocab) and
// lora_embedding_B (C, r), saved under those names without ".weight", live in unit 0 of the adapters'
// buffer. The lookup adds scale * A^T[token] @ B^T to the token's embedding (no dropout, as PEFT's;
// a tied head keeps reading the base matrix); A^T's rows take the lookup's gradient (the padding
// token's none, as F.embedding(padding_idx)). CPU backend only (host loops for the gathers).
#ifndef SHARDLM_LORA_EMBED_H
#define SHARDLM_LORA_EMBED_H

#include "shardlm/layout.h"
#include "shardlm/lora.h"

// The pair's tensors in unit 0 at *offset (module: the embedding's path; r and scale its own, after
// rank_pattern / alpha_pattern). Refused beside trainable_token_indices or a modules_to_save copy of the
// embedding (or of a tied head). -1 with the error.
int lora_embed_add(sl_lora *lo, const sl_param_layout *L, size_t *offset, const char *module, int r, float scale);
// PEFT's start: A zero and B N(0, 1) with init_lora_weights true or "gaussian"; both N(0, 1) with false.
void lora_embed_init(const sl_lora *lo, float *host, uint64_t seed);
// Activations for N rows (u, delta, du), from the ops; -1 with the error.
int lora_embed_plan(sl_lora *lo, int N);
void lora_embed_free(sl_lora *lo);
// encoded (N, C) += scale * (A^T[inputs] @ B^T); inputs host token ids. Nothing without the pair.
void lora_embed_forward(sl_lora *lo, sl_act *encoded, const int *inputs, int N);
// From dout (N, C), the gradient of the lookup's output: dB += (scale dout)^T u, dA[:, token] += its row
// of du = (scale dout) B, in row order, the padding token (pad >= 0) skipped. Nothing without gradients.
void lora_embed_backward(const sl_lora *lo, const sl_act *dout, const int *inputs, int N, int pad);
// merge_and_unload's part: the embedding += (B A)^T scale (host params of layout L; host the adapters').
// Refused for a tied embedding (the merged head would read the delta that the adapted model's does not).
// round16: the merged dtype's rounding (NULL for fp32), applied to the delta first as PEFT does.
int lora_embed_merge(const sl_lora *lo, const sl_param_layout *L, const float *host, float *params,
                     float (*round16)(float));

#endif
