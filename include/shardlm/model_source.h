// model_source.h: turns what a user names as "the model" into a config (and weights):
//   a preset name ("gpt2", "llama-demo", ...)                 -> config, no weights
//   a config.json path                                        -> config, no weights
//   a Hugging Face directory (config.json + *.safetensors)    -> config and weights
//   a shardlm checkpoint root (with `latest`) or tag directory -> config and weights
#ifndef SHARDLM_MODEL_SOURCE_H
#define SHARDLM_MODEL_SOURCE_H

#include "shardlm/config.h"

typedef struct {
    sl_model_config cfg;
    int has_weights;       // 1 when weights_dir holds loadable weights
    char weights_dir[4096];
} sl_model_source;

int sl_model_source_resolve(sl_model_source *src, const char *spec);

#endif
