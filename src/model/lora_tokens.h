// lora_tokens.h: PEFT's trainable_token_indices (TrainableTokens) next to LoRA adapters; internal to the
// model. The listed rows of the embedding are trained whole (PEFT's trainable_tokens_delta, shape (n, C),
// saved as "base_model.model.<embedding>.token_adapter.trainable_tokens_delta", starting as the base's
// rows): the model looks tokens up in, and a tied head multiplies by, the embedding with those rows
// replaced. CPU backend only (host memory).
#ifndef SHARDLM_LORA_TOKENS_H
#define SHARDLM_LORA_TOKENS_H

#include "shardlm/layout.h"
#include "shardlm/lora.h"

// The rows' tensor in unit 0 (lo->tokens_delta) at *offset; the token ids checked against the
// vocabulary, the object form's key against the embedding's path (Python's endswith). -1 with the error.
int lora_tokens_add(sl_lora *lo, const sl_param_layout *L, size_t *offset);
// When attached: which row a token id trains (lo->token_slot), the embedding the model reads
// (lo->tokens_weight: a copy of the base's, wte, elements of act_elem bytes), and for fresh adapters the
// rows' start (the base's, from base_view). -1 with the error.
int lora_tokens_attach(sl_lora *lo, const sl_param_layout *L, float *const *base_view, const sl_act *wte,
                       size_t act_elem);
// Writes the trained rows (unit 0's view) into lo->tokens_weight: before each lookup.
void lora_tokens_refresh(sl_lora *lo);
// The rows' gradients: the lookup's (dout (N, C) rows of inputs that are trained tokens; the padding
// token's none, as nn.Embedding(padding_idx)) and a tied head's (row j of token v: the sum over n of
// dlogits[n, v] x[n], x (N, C) the head's input: one GEMM through the ops table; -1 with the error when
// its scratch cannot be allocated). Nothing without gradients or trained tokens.
void lora_tokens_lookup_grad(const sl_lora *lo, const sl_act *dout, const int *inputs, int N, int pad);
int lora_tokens_head_grad(const sl_lora *lo, const sl_act *dlogits, const sl_act *x, int N, int Vp);
// merge_and_unload's part: the rows over the embedding's in params (host, layout L; host the adapters').
void lora_tokens_merge(const sl_lora *lo, const sl_param_layout *L, const float *host, float *params);

#endif
