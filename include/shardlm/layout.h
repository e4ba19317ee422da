// layout.h: the parameter layout. Parameters, gradients and optimizer moments are each ONE
// contiguous float buffer, layer-major: embeddings -> block 0 ... block L-1 -> final norm / head.
// The offsets table names every tensor with its Hugging Face name, so checkpoints are views.
//
// Internal convention for every linear weight: shape (out_features, in_features), y = x W^T,
// as torch.nn.Linear stores it. GPT-2's Conv1D stores (in, out); `hf_transposed` marks those.
// Fused groups are contiguous on purpose: LLaMA's q_proj,k_proj,v_proj form one (C+2KV, C) matrix
// and gate_proj,up_proj one (2I, C) matrix, so each is a single GEMM.
#ifndef SHARDLM_LAYOUT_H
#define SHARDLM_LAYOUT_H

#include <stddef.h>
#include "shardlm/config.h"

typedef struct {
    char name[80];      // Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
    size_t offset;      // in floats, into the flat buffer
    size_t numel;
    int ndim;           // 1 or 2
    int shape[2];       // internal shape; for padded embeddings shape[0] is padded_vocab_size
    int hf_rows;        // rows stored in HF files (vocab_size for embeddings/head, else shape[0])
    int hf_transposed;  // 1: HF stores this weight as (in, out) (GPT-2 Conv1D)
    int layer;          // block index, or -1 for embeddings / final norm / head
    int unit;           // the unit (see sl_param_layout) this tensor belongs to
    int weight_decay;   // 1 for linear weights; 0 for norms, biases, embeddings
    int quantised;      // 1: held quantised outside the flat buffer (a quantised base, quant_base.h); its
                        // slot there is ONE placeholder float (zero) whose address names the weight to
                        // the ops table (quant_ops.h), so the buffer holds only what stays unquantised
} sl_tensor_info;

// Indices of each block's tensors in the table (per architecture; -1 when absent).
typedef struct {
    int ln1_w, ln1_b;           // GPT-2 ln_1 / LLaMA input_layernorm (no bias)
    int qkv_w, qkv_b;           // GPT-2 c_attn; LLaMA q_proj (k_proj, v_proj follow contiguously; so do
                                // Qwen2's q/k/v biases)
    int attn_proj_w, attn_proj_b;  // c_proj / o_proj
    int ln2_w, ln2_b;
    int fc_w, fc_b;             // GPT-2 mlp.c_fc; LLaMA gate_proj (up_proj follows contiguously)
    int mlp_proj_w, mlp_proj_b; // mlp.c_proj / down_proj
} sl_block_tensors;

typedef struct {
    sl_model_config cfg;
    sl_tensor_info *tensors;
    int n_tensors;
    size_t total;               // floats in the flat buffer
    int wte, wpe, lnf_w, lnf_b, lm_head;   // indices; -1 when absent (wpe for LLaMA, lm_head if tied)
    sl_block_tensors *blocks;   // n_layer entries
    size_t *block_begin;        // n_layer+1 offsets: block l is [block_begin[l], block_begin[l+1])
    // Units: the contiguous pieces the model announces as it uses them (ZeRO-3 gathers one unit at a
    // time, gradients are reduced one unit at a time). Unit 0 is the embeddings, unit 1 + l is block
    // l, unit n_layer + 1 the final norm and an untied head: unit u is [unit_begin[u], unit_begin[u+1]).
    int n_units;                // n_layer + 2
    size_t *unit_begin;         // n_units + 1 offsets
} sl_param_layout;

int sl_layout_build(sl_param_layout *layout, const sl_model_config *cfg);
// The layout of a model whose block linear weights (sl_layout_is_block_linear) are held quantised:
// the same tensors in the same order, each quantised one marked and given a one-float slot.
int sl_layout_build_quantised(sl_param_layout *layout, const sl_model_config *cfg);
// 1 when tensor t is a linear weight of a block (GPT-2 c_attn, attn.c_proj, c_fc, mlp.c_proj; LLaMA
// q/k/v/o_proj, gate/up/down_proj): the weights bitsandbytes quantises (embeddings, norms, biases and
// the LM head stay in full precision).
int sl_layout_is_block_linear(const sl_param_layout *layout, int t);
// Floats tensor t takes in the flat buffer: numel, or 1 for a quantised tensor's placeholder.
static inline size_t sl_layout_stored(const sl_tensor_info *t) { return t->quantised ? 1 : t->numel; }
void sl_layout_free(sl_param_layout *layout);
// Elements in unit u.
static inline size_t sl_layout_unit_size(const sl_param_layout *L, int u) { return L->unit_begin[u + 1] - L->unit_begin[u]; }
// Index of the tensor with this HF name, or -1.
int sl_layout_find(const sl_param_layout *layout, const char *name);
// Total count of real (unpadded) parameters, as a Hugging Face model reports num_parameters().
size_t sl_layout_num_parameters(const sl_param_layout *layout);

#endif
