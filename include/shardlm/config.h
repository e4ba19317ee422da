// config.h: the model's shape, read from and written to Hugging Face `config.json` (hf_config.c)
// for the families shardlm computes: GPT-2 (GPT2Config) and the LLaMA family (LlamaConfig, and
// Qwen2Config / MistralConfig, which are LLaMA plus q/k/v biases or a sliding attention window).
// RoPE follows transformers' rope_parameters (rope.h computes the frequencies).
#ifndef SHARDLM_CONFIG_H
#define SHARDLM_CONFIG_H

#include <stddef.h>

typedef enum { SL_ARCH_GPT2 = 0, SL_ARCH_LLAMA = 1 } sl_arch;

// The Hugging Face model_type a LLaMA-architecture config came from (and is written back as).
typedef enum { SL_FAMILY_GPT2 = 0, SL_FAMILY_LLAMA, SL_FAMILY_QWEN2, SL_FAMILY_MISTRAL } sl_family;

// transformers' rope_type values shardlm computes (modeling_rope_utils.py).
typedef enum { SL_ROPE_DEFAULT = 0, SL_ROPE_LINEAR, SL_ROPE_DYNAMIC, SL_ROPE_LLAMA3, SL_ROPE_YARN } sl_rope_type;

// RoPE parameters as transformers' rope_parameters block holds them. A field the type does not use
// is 0; for yarn's optional keys 0 also means "not given" (transformers then derives or defaults it).
typedef struct {
    sl_rope_type type;
    float theta;                // rope_theta
    float factor;               // linear, dynamic, llama3, yarn
    float low_freq_factor;      // llama3
    float high_freq_factor;     // llama3
    int original_max_position_embeddings;  // llama3, yarn
    float attention_factor;     // yarn (0: derived from factor / mscale)
    float beta_fast, beta_slow; // yarn (0: 32 and 1)
    float mscale, mscale_all_dim;  // yarn (DeepSeek style; 0: not given)
    int truncate;               // yarn: round the correction range (default 1)
} sl_rope_config;

typedef struct {
    sl_arch arch;
    sl_family family;
    int vocab_size;         // real vocabulary (50257 for GPT-2)
    int padded_vocab_size;  // vocab_size rounded up to a multiple of 128; rows past vocab_size are zero
    int max_seq_len;        // n_positions / max_position_embeddings
    int n_layer;
    int n_head;
    int n_kv_head;          // == n_head for GPT-2; grouped-query attention when smaller (LLaMA)
    int n_embd;             // C
    int n_inner;            // MLP width: 4C for GPT-2, intermediate_size for LLaMA
    float norm_eps;         // layer_norm_epsilon / rms_norm_eps
    int tie_word_embeddings;// GPT-2: 1 (lm_head shares wte); LLaMA: usually 0
    int bos_token_id;
    int eos_token_id;
    int pad_token_id;       // LLaMA family: nn.Embedding's padding_idx (its row gets no gradient); -1: none
    int head_dim;           // per-head width; n_embd / n_head unless the config says otherwise (LLaMA)
    int qkv_bias;           // q/k/v projections have biases (Qwen2)
    int sliding_window;     // attention sees the last sliding_window keys (Mistral); 0: all of them
    sl_rope_config rope;    // LLaMA family only
} sl_model_config;

// Built-in presets: "gpt2" (124M), "gpt2-medium" (355M), "gpt2-large" (774M), "gpt2-xl" (1.5B),
// "gpt2-tiny", "gpt2-demo", "llama-tiny", "llama-demo". Returns -1 with a message for an unknown name.
int sl_config_preset(sl_model_config *cfg, const char *name);

// Reads a Hugging Face config.json (model_type gpt2, llama, qwen2 or mistral; transformers 4.x
// top-level rope keys or 5.x rope_parameters). Every key that changes the computation is honoured or
// refused by name; keys that do not are ignored (docs/formats.md), unknown keys get a one-line notice.
int sl_config_load_json(sl_model_config *cfg, const char *path);
int sl_config_from_json_text(sl_model_config *cfg, const char *text, const char *where);

// Writes config.json as transformers 5 writes it (rope_parameters), plus the 4.x rope keys so older
// readers load the same model. Returns a malloc'd string; NULL with an error set on failure.
char *sl_config_to_json_text(const sl_model_config *cfg);

// Fills derived fields (padded_vocab_size, head_dim) and checks consistency (heads divide n_embd, ...).
int sl_config_validate(sl_model_config *cfg, const char *where);

// 0 when a and b describe the same model; else -1 with "<field> is <a> there, <b> here" as the error
// (prefixed by `where`).
int sl_config_compare(const sl_model_config *a, const sl_model_config *b, const char *where);

// The longest sequence the model computes: max positions, or factor x that for dynamic NTK RoPE
// (which exists to run past the trained length).
int sl_config_context(const sl_model_config *c);

static inline int sl_config_head_dim(const sl_model_config *c) { return c->head_dim; }
// Width of the attention output (the query heads): n_head x head_dim (== n_embd unless head_dim was given).
static inline int sl_config_attn_width(const sl_model_config *c) { return c->n_head * c->head_dim; }

#endif
