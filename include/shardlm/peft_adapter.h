// peft_adapter.h: LoRA adapters in PEFT's files, both ways. A directory holds
//   adapter_config.json        PEFT's LoraConfig (peft_type "LORA", r, lora_alpha, target_modules, ...)
//   adapter_model.safetensors  "base_model.model.<module>.lora_A.weight" (r, in) and ".lora_B.weight"
//                              (out, r) for every adapted module, F32 (F16 / BF16 / F64 read too)
// as peft.PeftModel.save_pretrained writes them and PeftModel.from_pretrained(base, dir) reads them.
#ifndef SHARDLM_PEFT_ADAPTER_H
#define SHARDLM_PEFT_ADAPTER_H

#include "shardlm/config.h"
#include "shardlm/lora.h"
#include "shardlm/ops.h"

// Reads DIR/adapter_config.json into cfg (sl_lora_config_parse; errors name the file).
int sl_peft_read_config(const char *dir, sl_lora_config *cfg);

// Builds the adapters DIR describes for a model of model_cfg on ops' backend and loads their
// weights. Every tensor is checked before any is used: a missing or unexpected tensor, a shape that
// is not this base's (an adapter for another model), a non-float dtype or a corrupt file is an error
// naming the file and the tensor. On failure *lora is freed.
int sl_peft_load(const char *dir, const sl_model_config *model_cfg, const sl_ops *ops, sl_lora *lora);

// Reads DIR's adapter weights into host (lora->total floats, lora's buffer order) for adapters already
// built: DIR's adapter_config.json must give the same r, lora_alpha, use_rslora and lora_dropout, and
// its safetensors exactly lora's tensors (checked as sl_peft_load does).
int sl_peft_read_weights(const char *dir, const sl_lora *lora, float *host);

// Writes DIR/adapter_model.safetensors and DIR/adapter_config.json (each atomically; DIR created if
// needed): the parameters from host (lora->total floats in host memory), or downloaded from
// lora->params when host is NULL. lora->base_model becomes "base_model_name_or_path".
int sl_peft_save(const char *dir, const sl_lora *lora, const float *host);

#endif
