// quant_config.h: which weights are quantised and how, in the words of transformers'
// BitsAndBytesConfig (the "quantization_config" block of a config.json, or of shardlm's JSON
// config), and `--quantize nf4|fp4|int8`.
//
// Honoured: load_in_4bit, load_in_8bit (not both), bnb_4bit_quant_type ("nf4" / "fp4"; transformers'
// default "fp4"), bnb_4bit_use_double_quant (default false), bnb_4bit_compute_dtype (the dtype the
// dequantised tiles are multiplied in: "float32", or "bfloat16" for bf16 training, which sets it;
// "float16" is refused by name), quant_method ("bitsandbytes"). Accepted at their defaults only: bnb_4bit_quant_storage
// ("uint8"), llm_int8_skip_modules (null or empty), llm_int8_has_fp16_weight (false),
// llm_int8_enable_fp32_cpu_offload (false). Ignored: llm_int8_threshold (the outlier split of
// LLM.int8()'s int8 x int8 product: shardlm multiplies dequantised weights in fp32 instead) and
// transformers' private "_load_in_4bit" / "_load_in_8bit" copies. Any other key is refused by name.
// Embeddings, norms and the LM head are never quantised (bitsandbytes keeps them too).
#ifndef SHARDLM_QUANT_CONFIG_H
#define SHARDLM_QUANT_CONFIG_H

#include <cjson/cJSON.h>
#include "shardlm/quant.h"

typedef struct {
    sl_quant_type type;      // SL_QUANT_NONE: nothing quantised
    int blocksize;           // 64 (bitsandbytes' default for 4-bit weights)
    int double_quant;        // bnb_4bit_use_double_quant
    sl_quant_dtype compute_dtype;
} sl_quant_config;

// type NONE, blocksize 64, no double quantisation, float32 compute.
void sl_quant_config_default(sl_quant_config *qc);

// Reads a BitsAndBytesConfig object (see above); `where` names it in messages ("DIR/config.json:
// quantization_config"). NULL / JSON null leave qc at the default (nothing quantised).
int sl_quant_config_parse(const cJSON *obj, sl_quant_config *qc, const char *where);

// --quantize VALUE: "nf4" (double quantisation on, as QLoRA), "fp4", "int8" or "none".
int sl_quant_config_from_flag(const char *value, sl_quant_config *qc);

// The quantization_config transformers writes for qc (type != NONE), as a new cJSON object.
cJSON *sl_quant_config_to_json(const sl_quant_config *qc);

// "nf4 (blocks of 64, double-quantised scales)" and so on, for the start-up line.
const char *sl_quant_config_describe(const sl_quant_config *qc, char *buf, size_t cap);

#endif
