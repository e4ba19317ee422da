// config.h: the model's shape, read from and written to Hugging Face `config.json` key names
// (GPT2Config: n_embd, n_layer, n_head, n_positions, n_inner, layer_norm_epsilon;
//  LlamaConfig: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
//  intermediate_size, max_position_embeddings, rms_norm_eps, rope_theta, tie_word_embeddings).
#ifndef SHARDLM_CONFIG_H
#define SHARDLM_CONFIG_H

#include <stddef.h>

typedef enum { SL_ARCH_GPT2 = 0, SL_ARCH_LLAMA = 1 } sl_arch;

typedef struct {
    sl_arch arch;
    int vocab_size;         // real vocabulary (50257 for GPT-2)
    int padded_vocab_size;  // vocab_size rounded up to a multiple of 128; rows past vocab_size are zero
    int max_seq_len;        // n_positions / max_position_embeddings
    int n_layer;
    int n_head;
    int n_kv_head;          // == n_head for GPT-2; grouped-query attention when smaller (LLaMA)
    int n_embd;             // C
    int n_inner;            // MLP width: 4C for GPT-2, intermediate_size for LLaMA
    float norm_eps;         // layer_norm_epsilon / rms_norm_eps
    float rope_theta;       // LLaMA only
    int tie_word_embeddings;// GPT-2: 1 (lm_head shares wte); LLaMA: usually 0
    int bos_token_id;
    int eos_token_id;
} sl_model_config;

// Built-in presets: "gpt2" (124M), "gpt2-medium" (355M), "gpt2-large" (774M), "gpt2-xl" (1.5B),
// "gpt2-tiny", "gpt2-demo", "llama-tiny", "llama-demo". Returns -1 with a message for an unknown name.
int sl_config_preset(sl_model_config *cfg, const char *name);

// Reads a Hugging Face config.json (model_type "gpt2" or "llama"). Errors name the file and key.
int sl_config_load_json(sl_model_config *cfg, const char *path);
int sl_config_from_json_text(sl_model_config *cfg, const char *text, const char *where);

// Writes config.json in Hugging Face's format (architectures, model_type, the keys above).
// Returns a malloc'd string; NULL with an error set on failure.
char *sl_config_to_json_text(const sl_model_config *cfg);

// Fills derived fields (padded_vocab_size) and checks consistency (heads divide n_embd, ...).
int sl_config_validate(sl_model_config *cfg, const char *where);

static inline int sl_config_head_dim(const sl_model_config *c) { return c->n_embd / c->n_head; }

#endif
