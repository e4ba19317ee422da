// lora_saved.h: PEFT's modules_to_save next to LoRA adapters; internal to the model. A module whose
// path ends with one of the config's names (Python's str.endswith, as PEFT tests it) is trained whole:
// the adapters' buffer holds a copy of each of its tensors, in the unit of the tensor it replaces, named
// as PEFT saves it ("base_model.model.<module>.weight" / ".bias"), and the model computes with the copy in
// the module's place. shardlm trains copies of embeddings (wte, wpe, embed_tokens), norms and the head;
// a name that picks a linear of the blocks or a container of modules is refused. On a model whose head is
// the embedding matrix (tied), "lm_head" gets its own copy (unit 0, where the tied head's weights are):
// the head computes with it while the embedding lookup keeps reading the (frozen or copied) embedding,
// as PEFT's deep copy unties them. PEFT's `bias` ("all": every bias, "lora_only": the adapted linears')
// trains biases the same way: copies named "<module>.bias" ("<module>.base_layer.bias" on an adapted
// linear, as PEFT 0.21 saves them). Fresh copies start as the base's values (lora_saved_attach).
#ifndef SHARDLM_LORA_SAVED_H
#define SHARDLM_LORA_SAVED_H

#include "shardlm/layout.h"
#include "shardlm/lora.h"

// The copies of unit `unit` of the model (layout L) appended to lo's tensor table at *offset; -1 with
// the error when a name picks a module shardlm cannot train whole.
int lora_saved_add(sl_lora *lo, const sl_param_layout *L, int unit, size_t *offset);
// After every unit: a warning for each name that picked nothing (PEFT ignores those).
void lora_saved_warn_unmatched(const sl_lora *lo);
// Most tensors the copies of a model of config c can take (the table's allocation).
int lora_saved_max_tensors(const sl_model_config *c);
// Binds the copies to the model's tensors (lo->saved_of, lo->head_copy) and, for fresh adapters,
// fills them from `base` (params: the base's fp32 values, a view per unit of L); trainable tokens' too
// (lora_tokens_attach: wte, the base embedding as the ops read it, of act_elem bytes an element). -1 with
// the error.
int lora_saved_attach(sl_lora *lo, const sl_param_layout *L, float *const *base_view, const sl_act *wte,
                      size_t act_elem);
// A tensor shaped as base (name its PEFT name without "base_model.model.") appended to lo's table in unit
// `unit` at *offset; copy: it is a trained copy of a base tensor (listed in lo->saved). Its index, -1.
int lora_saved_add_tensor(sl_lora *lo, size_t *offset, int unit, const sl_tensor_info *base, const char *name,
                          int copy);
// 1 when base tensor t of L has a trained copy in lo's table.
int lora_saved_has_copy(const sl_lora *lo, const sl_param_layout *L, int t);
// merge_and_unload's part: each copy replaces its base tensor in params (host, layout L); host holds the
// adapters' parameters. On a tied model a copy of the embedding or of lm_head cannot be merged (the
// merged model would read one matrix in both places again; an error says so).
int lora_saved_merge(const sl_lora *lo, const sl_param_layout *L, const float *host, float *params);
// The copy of base tensor t as the ops read it, or NULL when t has none.
const sl_act *lora_saved_weight(const sl_lora *lo, int t);
// The copy's gradient, NULL when t has none (or no gradients are kept).
float *lora_saved_grad(const sl_lora *lo, int t);
// The backward's floor: the lowest block whose backward runs (first adapter, first copy below the head),
// and whether that block's input gradient (its ln1's) is wanted too (a copy at or below it).
void lora_saved_backward_floor(const sl_lora *lo, int *lowest, int *input);
// 1 when the embeddings have copies or trained tokens (set when attached): the encoder's backward runs.
int lora_saved_embeddings(const sl_lora *lo);

#endif
