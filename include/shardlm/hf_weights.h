// hf_weights.h: Hugging Face weight directories (config.json + model.safetensors, or a sharded set
// with model.safetensors.index.json) <-> the flat parameter buffer described by layout.h.
//
// Names are exactly those of GPT2LMHeadModel / LlamaForCausalLM state_dict(). On save and load,
// GPT-2 Conv1D weights (hf_transposed) are transposed between HF's (in, out) and our (out, in);
// embedding / lm_head rows past vocab_size (padding) are not written and are zero after load.
#ifndef SHARDLM_HF_WEIGHTS_H
#define SHARDLM_HF_WEIGHTS_H

#include "shardlm/config.h"
#include "shardlm/layout.h"
#include "shardlm/safetensors.h"

// Writes the weights. `dir_or_file` ending in ".safetensors" writes that one file; otherwise it is a
// directory (created if needed) that receives model.safetensors and config.json. The safetensors
// carries "__metadata__": {"format": "pt"}; tied lm_head is not written (HF drops it too).
int sl_hf_save(const char *dir_or_file, const sl_param_layout *L, const float *params);

// The same with every tensor stored as dtype (F32, F16 or BF16, rounded to nearest even) and
// config.json's torch_dtype saying so.
int sl_hf_save_as(const char *dir_or_file, const sl_param_layout *L, const float *params, sl_st_dtype dtype);
// The dtype of the model's floating-point weights in dir (as sl_hf_load finds them): the first
// tensor's of model.safetensors or of the index's first shard.
int sl_hf_weights_dtype(const char *dir, sl_st_dtype *dtype);
// Reads DIR/config.json (or the file itself if given a .json path).
int sl_hf_load_config(const char *dir, sl_model_config *cfg);

// Fills params (L->total floats) from a directory holding model.safetensors or
// model.safetensors.index.json, or from a single .safetensors / .index.json path.
// Accepts GPT-2 names with or without the "transformer." prefix, F32/F16/BF16/F64 data, and ignores
// non-parameter buffers (*.attn.bias, *.attn.masked_bias, *rotary_emb.inv_freq) and a tied
// lm_head.weight equal to the embedding (sl_hf_check_tied_head; a different one is an error).
// Missing, unexpected or duplicated tensors, shape and dtype mismatches are errors (named); all names
// and shapes are checked before params is written.
int sl_hf_load(const char *dir, const sl_param_layout *L, float *params);

// A tied model's file holding lm_head.weight too (file hf, tensor hi) beside the embedding (file ef,
// tensor ei): 0 when the two are equal value for value (as fp32), else an error that names the first
// difference and the way out (arch: SL_ARCH_*, for the advice). transformers 4.x drops such a tensor
// and ties the head to the embedding, transformers 5 uses it as the head: equal, the two agree.
int sl_hf_check_tied_head(const sl_st_file *hf, int hi, const sl_st_file *ef, int ei, int arch);

// Receives tensor t's values (numel floats, (out, in), padded rows zero) for a tensor the layout holds
// quantised; valid only during the call. Non-zero stops the load.
typedef int (*sl_hf_tensor_sink)(void *ctx, int t, const float *values);
// sl_hf_load for a layout with quantised tensors (sl_layout_build_quantised): each of those is read
// into a buffer of its own size and handed to sink (its placeholder in params set to zero), one at a
// time, so the full-precision model never exists in memory. After a failure params may be partly written.
int sl_hf_load_each(const char *dir, const sl_param_layout *L, float *params, sl_hf_tensor_sink sink, void *ctx);

#endif
