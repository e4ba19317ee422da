// quant_base.h: a model whose frozen base weights are held quantised, and only quantised: QLoRA's base
// (shardlm train --quantize) and generate --quantize / a bitsandbytes directory (docs/quantization.md).
//
// The model is built on the quantised layout (layout.h sl_layout_build_quantised): its flat buffer
// holds the tensors bitsandbytes leaves in full precision (embeddings, norms, biases, an untied LM
// head) and a one-float placeholder per block linear weight; the linear weights live here as codes +
// block statistics (quant_model.h) and the model computes through sl_ops_cpu_quant (quant_ops.h),
// which dequantises a tile at a time. The base is frozen: no gradient, no optimizer state.
//
// Where the weights come from:
//   a bitsandbytes 4-bit / 8-bit directory (config.json with quantization_config): read as it is;
//   any other weights directory: read one tensor at a time, each linear weight quantised as it arrives
//     (sl_hf_load_each), so the full-precision model never exists in memory;
//   no weights (a preset or config.json): each tensor initialised as sl_model_init_weights would, the
//     linear weights quantised one at a time.
// Peak resident memory is therefore the quantised model plus one full-precision tensor.
//
// Tables: the CPU's fp32 table (bitsandbytes' compute dtype float32) or its bf16-storage tables
// (cpu-bf16-onednn, the emulation cpu-bf16: compute dtype bfloat16), quant_ops.h sl_quant_ops_for; a
// GPU table is refused here, fp16 training by the caller's checks.
// The ops' registry is one per process (quant_ops.h): one quantised base at a time.
#ifndef SHARDLM_QUANT_BASE_H
#define SHARDLM_QUANT_BASE_H

#include <stdint.h>
#include "shardlm/model.h"
#include "shardlm/model_source.h"
#include "shardlm/quant_model.h"

typedef struct {
    sl_quant_model qm;    // the quantised linears (codes + statistics), by layout tensor
    size_t full_bytes;    // what the quantised tensors would take in fp32
    int installed;        // the ops' registry points into qm
} sl_quant_base;

// 1 when the model at src is computed with a quantised base: want asks for one (type != NONE) or its
// weights directory is a bitsandbytes model; *resolved (may be NULL) then gets the quantisation that
// runs (the directory's own, which decides, or want). -1 on a config.json that cannot be read.
int sl_quant_base_wanted(const sl_model_source *src, const sl_quant_config *want, sl_quant_config *resolved);

// Creates m (sl_model_create_quantised on `ops`: sl_ops_cpu, sl_ops_cpu_bf16_native or sl_ops_cpu_bf16)
// with its weights from src (above; seed for a model without weights), the quantised linears installed
// and m->ops set to sl_quant_ops_for(ops). want: the quantisation (a bitsandbytes directory: NONE or the file's type).
// On failure nothing is left allocated or installed.
int sl_quant_base_create(sl_quant_base *qb, sl_model *m, const sl_model_source *src, const sl_quant_config *want,
                         const sl_ops *ops, uint64_t seed);

// Bytes of the quantised linears (codes + block statistics, quant.h sl_qtensor_bytes).
size_t sl_quant_base_bytes(const sl_quant_base *qb);

// Clears the ops' registry and frees the quantised weights (after the model that used them).
void sl_quant_base_free(sl_quant_base *qb);

#endif
