// config.c: model presets, validation and comparison of sl_model_config (config.json is hf_config.c).
// Invariant after sl_config_validate: n_head divides n_embd, n_kv_head divides n_head, head_dim is
// set (and even for RoPE), padded_vocab_size is vocab_size rounded up to 128.
#include "shardlm/config.h"
#include "shardlm/error.h"

#include <string.h>

typedef struct { const char *name; sl_model_config cfg; } preset;

#define GPT2(L, H, C, T, V)                                                                                  \
    {.arch = SL_ARCH_GPT2, .family = SL_FAMILY_GPT2, .vocab_size = V, .max_seq_len = T, .n_layer = L,      \
     .n_head = H, .n_kv_head = H, .n_embd = C, .n_inner = 4 * (C), .norm_eps = 1e-5f,                      \
     .tie_word_embeddings = 1, .bos_token_id = 50256, .eos_token_id = 50256, .pad_token_id = -1}
#define LLAMA(L, H, KV, C, I, T, V)                                                                          \
    {.arch = SL_ARCH_LLAMA, .family = SL_FAMILY_LLAMA, .vocab_size = V, .max_seq_len = T, .n_layer = L,    \
     .n_head = H, .n_kv_head = KV, .n_embd = C, .n_inner = I, .norm_eps = 1e-5f, .bos_token_id = 1,        \
     .eos_token_id = 2, .pad_token_id = -1, .rope = {.type = SL_ROPE_DEFAULT, .theta = 10000.0f}}

static const preset presets[] = {
    {"gpt2", GPT2(12, 12, 768, 1024, 50257)},
    {"gpt2-medium", GPT2(24, 16, 1024, 1024, 50257)},
    {"gpt2-large", GPT2(36, 20, 1280, 1024, 50257)},
    {"gpt2-xl", GPT2(48, 25, 1600, 1024, 50257)},
    {"gpt2-demo", GPT2(4, 4, 256, 256, 50257)},
    {"gpt2-tiny", GPT2(2, 4, 32, 64, 100)},
    {"llama-demo", LLAMA(4, 8, 4, 256, 688, 256, 50257)},
    {"llama-tiny", LLAMA(2, 4, 2, 32, 64, 64, 100)},
};

int sl_config_preset(sl_model_config *cfg, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *cfg = presets[i].cfg;
            return sl_config_validate(cfg, name);
        }
    }
    return sl_errorf("unknown model preset '%s' (expected one of gpt2, gpt2-medium, gpt2-large, "
                     "gpt2-xl, gpt2-demo, gpt2-tiny, llama-demo, llama-tiny, or a config.json path)", name);
}

static int validate_rope(const sl_rope_config *r, int max_pos, const char *where) {
    if (!(r->theta > 0.0f)) return sl_errorf("%s: rope_theta must be positive", where);
    if (r->type == SL_ROPE_DEFAULT) return 0;
    if (!(r->factor >= 1.0f && r->factor <= 1e6f))
        return sl_errorf("%s: rope_parameters.factor must be a number >= 1 (got %g)", where, (double)r->factor);
    if (r->type == SL_ROPE_LLAMA3) {
        if (!(r->low_freq_factor > 0.0f) || !(r->high_freq_factor > r->low_freq_factor))
            return sl_errorf("%s: llama3 RoPE needs 0 < low_freq_factor < high_freq_factor (got %g, %g)", where,
                             (double)r->low_freq_factor, (double)r->high_freq_factor);
    }
    if ((r->type == SL_ROPE_LLAMA3 || r->type == SL_ROPE_YARN) && r->original_max_position_embeddings <= 0)
        return sl_errorf("%s: rope_parameters.original_max_position_embeddings must be a positive integer", where);
    if (r->type == SL_ROPE_YARN && r->attention_factor < 0.0f)
        return sl_errorf("%s: rope_parameters.attention_factor must be positive", where);
    if (r->type == SL_ROPE_DYNAMIC && (double)r->factor * max_pos > (double)(1 << 24))
        return sl_errorf("%s: dynamic RoPE factor x max_position_embeddings is implausibly large", where);
    return 0;
}

int sl_config_validate(sl_model_config *c, const char *where) {
    if (c->vocab_size <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->max_seq_len <= 0 ||
        c->n_inner <= 0 || c->n_kv_head <= 0 || c->head_dim < 0)
        return sl_errorf("%s: vocab_size, n_layer, n_head, n_kv_head, n_embd, n_inner and max positions must all be "
                         "positive (got %d, %d, %d, %d, %d, %d, %d)", where, c->vocab_size, c->n_layer, c->n_head,
                         c->n_kv_head, c->n_embd, c->n_inner, c->max_seq_len);
    if (c->head_dim == 0) {
        if (c->n_embd % c->n_head != 0)
            return sl_errorf("%s: n_embd %d is not divisible by n_head %d", where, c->n_embd, c->n_head);
        c->head_dim = c->n_embd / c->n_head;
    }
    if (c->n_head % c->n_kv_head != 0)
        return sl_errorf("%s: num_attention_heads %d is not divisible by num_key_value_heads %d", where,
                         c->n_head, c->n_kv_head);
    if (c->arch == SL_ARCH_GPT2 && (c->n_kv_head != c->n_head || c->head_dim * c->n_head != c->n_embd))
        return sl_errorf("%s: GPT-2 models have n_kv_head == n_head and head_dim == n_embd / n_head", where);
    if (c->arch == SL_ARCH_GPT2 && (c->qkv_bias || c->sliding_window))
        return sl_errorf("%s: GPT-2 models have no separate q/k/v biases or sliding window", where);
    if (c->arch == SL_ARCH_LLAMA && c->head_dim % 2 != 0)
        return sl_errorf("%s: head_dim %d must be even for rotary embeddings", where, c->head_dim);
    if (!(c->norm_eps > 0.0f)) return sl_errorf("%s: norm epsilon must be positive", where);
    if (c->sliding_window < 0) return sl_errorf("%s: sliding_window must be positive or null", where);
    if (c->arch == SL_ARCH_LLAMA && validate_rope(&c->rope, c->max_seq_len, where)) return -1;
    if (c->vocab_size > (1 << 30) || c->n_layer > 100000 || c->n_embd > (1 << 20) || c->n_inner > (1 << 24) ||
        c->max_seq_len > (1 << 24) || c->head_dim > (1 << 16) || (long long)c->n_head * c->head_dim > (1 << 20))
        return sl_errorf("%s: model dimensions are implausibly large (vocab %d, layers %d, n_embd %d, inner %d, "
                         "positions %d, heads %d x %d)", where, c->vocab_size, c->n_layer, c->n_embd, c->n_inner,
                         c->max_seq_len, c->n_head, c->head_dim);
    c->padded_vocab_size = (c->vocab_size + 127) / 128 * 128;
    return 0;
}

int sl_config_context(const sl_model_config *c) {
    if (c->arch == SL_ARCH_LLAMA && c->rope.type == SL_ROPE_DYNAMIC)
        return (int)((double)c->rope.factor * c->max_seq_len);
    return c->max_seq_len;
}

int sl_config_compare(const sl_model_config *a, const sl_model_config *b, const char *where) {
    const sl_rope_config *ra = &a->rope, *rb = &b->rope;
    struct { const char *name; double a, b; } f[] = {
        {"architecture", a->arch, b->arch}, {"model_type", a->family, b->family},
        {"vocab_size", a->vocab_size, b->vocab_size}, {"max positions", a->max_seq_len, b->max_seq_len},
        {"n_layer", a->n_layer, b->n_layer}, {"n_head", a->n_head, b->n_head},
        {"n_kv_head", a->n_kv_head, b->n_kv_head}, {"n_embd", a->n_embd, b->n_embd},
        {"n_inner", a->n_inner, b->n_inner}, {"head_dim", a->head_dim, b->head_dim},
        {"norm epsilon", a->norm_eps, b->norm_eps}, {"tie_word_embeddings", a->tie_word_embeddings, b->tie_word_embeddings},
        {"q/k/v biases", a->qkv_bias, b->qkv_bias}, {"pad_token_id", a->pad_token_id, b->pad_token_id}, {"sliding_window", a->sliding_window, b->sliding_window},
        {"rope_type", ra->type, rb->type}, {"rope_theta", ra->theta, rb->theta}, {"rope factor", ra->factor, rb->factor},
        {"rope low_freq_factor", ra->low_freq_factor, rb->low_freq_factor},
        {"rope high_freq_factor", ra->high_freq_factor, rb->high_freq_factor},
        {"rope original_max_position_embeddings", ra->original_max_position_embeddings,
         rb->original_max_position_embeddings},
        {"rope attention_factor", ra->attention_factor, rb->attention_factor},
        {"rope beta_fast", ra->beta_fast, rb->beta_fast}, {"rope beta_slow", ra->beta_slow, rb->beta_slow},
        {"rope mscale", ra->mscale, rb->mscale}, {"rope mscale_all_dim", ra->mscale_all_dim, rb->mscale_all_dim},
        {"rope truncate", ra->truncate, rb->truncate},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].a != f[i].b)
            return sl_errorf("%s: %s is %g there, %g here", where, f[i].name, f[i].a, f[i].b);
    return 0;
}
