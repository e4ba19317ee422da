// quant_model.h: a model's quantised linear weights, and the files transformers + bitsandbytes write
// for 4-bit and 8-bit models (docs/quantization.md).
//
// Which tensors: every linear weight of the blocks (GPT-2 c_attn, attn.c_proj, c_fc, mlp.c_proj;
// LLaMA q/k/v/o_proj, gate/up/down_proj), each on its own with its own scales, as bitsandbytes'
// Linear4bit / Linear8bitLt replace each nn.Linear (and Conv1D, transposed to (out, in)). Embeddings,
// norms, biases and the LM head stay in full precision in the flat parameter buffer.
//
// File layout (one model.safetensors beside config.json, whose quantization_config is
// BitsAndBytesConfig's), for a linear X:
//   4-bit  X.weight                U8 [(numel + 1) / 2, 1]  packed codes (quant.h)
//          X.weight.absmax         F32 [blocks], or U8 [blocks] when double-quantised
//          X.weight.quant_map      F32 [16]                 the 4-bit table (must be bitsandbytes')
//          X.weight.nested_absmax  F32 [ceil(blocks / 256)] (double quantisation only)
//          X.weight.nested_quant_map F32 [256]              the dynamic map (double quantisation only)
//          X.weight.quant_state.bitsandbytes__nf4 (or __fp4)  U8 [len]: the JSON text
//            {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [OUT, IN],
//             "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0549...}
//   int8   X.weight I8 [OUT, IN], X.SCB F32 [OUT], X.weight_format U8 [] (0: row-major)
// Everything is checked before use: a missing or extra tensor, a wrong dtype or size, a quant_state
// that is not valid JSON or disagrees with the tensors (type, shape, block size, nested keys), a
// quant_map that is not bitsandbytes' table, a non-finite scale: a message naming the file and tensor.
#ifndef SHARDLM_QUANT_MODEL_H
#define SHARDLM_QUANT_MODEL_H

#include "shardlm/config.h"
#include "shardlm/layout.h"
#include "shardlm/quant.h"
#include "shardlm/quant_config.h"
#include "shardlm/quant_ops.h"

typedef struct {
    sl_quant_config qc;
    int n_tensors;     // the layout's
    sl_qtensor *q;     // [n_tensors]; q[t].type == SL_QUANT_NONE: tensor t stays in the parameter buffer
} sl_quant_model;

// 1 when layout tensor t is a linear weight that bitsandbytes quantises.
int sl_quant_model_wants(const sl_param_layout *L, int t);

// An empty qm for L quantised with qc (every tensor NONE until quantised or loaded).
int sl_quant_model_begin(sl_quant_model *qm, const sl_param_layout *L, const sl_quant_config *qc);
// Quantises layout tensor t (a wanted one) from w (numel floats, exact in src_dtype) with qm->qc.
int sl_quant_model_quantize_one(sl_quant_model *qm, const sl_param_layout *L, int t, const float *w,
                                sl_quant_dtype src_dtype);

// Quantises every wanted tensor of params (as loaded from fp32 / bf16 / fp16 safetensors, so exact in
// src_dtype, which quant_state records) with qc, then zeroes those tensors in params so that nothing
// can use the full-precision copy by mistake. On failure qm is empty and params untouched.
int sl_quant_model_quantize(sl_quant_model *qm, const sl_param_layout *L, float *params, const sl_quant_config *qc,
                            sl_quant_dtype src_dtype);

// Reads DIR/config.json's quantization_config (*present = 0 and qc at the default when absent).
int sl_quant_model_read_config(const char *dir, sl_quant_config *qc, int *present);

// Loads a directory written by transformers + bitsandbytes (or sl_quant_model_save): quantised
// linears into qm, everything else into params (zeros for the quantised tensors and padded rows).
int sl_quant_model_load(sl_quant_model *qm, const char *dir, const sl_param_layout *L, float *params);

// Writes DIR/model.safetensors (quantised linears + the rest of params in F32) and DIR/config.json
// with the quantization_config; the directory is created if needed; files appear whole or not at all.
int sl_quant_model_save(const char *dir, const sl_quant_model *qm, const sl_param_layout *L, const float *params);

// The linears the model calls, keyed by the address it passes (params + the first tensor's offset):
// 4 per block, LLaMA's q|k|v and gate|up as one linear of 3 and 2 parts. entries holds 4 * n_layer;
// *n gets the count. For sl_quant_ops_install (quant_ops.h); qm must outlive the installation.
int sl_quant_model_linears(const sl_quant_model *qm, const sl_param_layout *L, const float *params,
                           sl_quant_ops_entry *entries, int *n);

// Loads the weights of a model directory for computing with quantised linears: a bitsandbytes
// directory (config.json with a quantization_config) loads as it is (`want` must then be NONE or the
// file's type); any other weights directory is read in full precision (sl_hf_load) and quantised with
// `want` (nothing quantised when want->type is NONE: *quantised = 0, qm empty). The source dtype that
// quant_state records is config.json's "dtype" / "torch_dtype" (float32 when absent).
int sl_quant_model_load_any(sl_quant_model *qm, const char *dir, const sl_param_layout *L, float *params,
                            const sl_quant_config *want, int *quantised);

// The dtype quant_state records for weights read from dir: config.json's "dtype" / "torch_dtype"
// (float32 when absent or unknown).
sl_quant_dtype sl_quant_model_source_dtype(const char *dir);

// Bytes of all quantised tensors (codes and scales).
size_t sl_quant_model_bytes(const sl_quant_model *qm);
void sl_quant_model_free(sl_quant_model *qm);

#endif
