// config.c: model presets and Hugging Face config.json reading/writing (on cJSON).
// Invariant after sl_config_validate: n_head divides n_embd, n_kv_head divides n_head,
// head_dim is even for RoPE, padded_vocab_size is vocab_size rounded up to 128.
#include "shardlm/config.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *name; sl_model_config cfg; } preset;

#define GPT2(L, H, C, T, V) {SL_ARCH_GPT2, V, 0, T, L, H, H, C, 4 * (C), 1e-5f, 0.0f, 1, 50256, 50256}
#define LLAMA(L, H, KV, C, I, T, V) {SL_ARCH_LLAMA, V, 0, T, L, H, KV, C, I, 1e-5f, 10000.0f, 0, 1, 2}

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

int sl_config_validate(sl_model_config *c, const char *where) {
    if (c->vocab_size <= 0 || c->n_layer <= 0 || c->n_head <= 0 || c->n_embd <= 0 || c->max_seq_len <= 0 ||
        c->n_inner <= 0 || c->n_kv_head <= 0)
        return sl_errorf("%s: vocab_size, n_layer, n_head, n_kv_head, n_embd, n_inner and max positions must all be "
                         "positive (got %d, %d, %d, %d, %d, %d, %d)", where, c->vocab_size, c->n_layer, c->n_head,
                         c->n_kv_head, c->n_embd, c->n_inner, c->max_seq_len);
    if (c->n_embd % c->n_head != 0)
        return sl_errorf("%s: n_embd %d is not divisible by n_head %d", where, c->n_embd, c->n_head);
    if (c->n_head % c->n_kv_head != 0)
        return sl_errorf("%s: num_attention_heads %d is not divisible by num_key_value_heads %d", where,
                         c->n_head, c->n_kv_head);
    if (c->arch == SL_ARCH_GPT2 && c->n_kv_head != c->n_head)
        return sl_errorf("%s: GPT-2 models have n_kv_head == n_head", where);
    if (c->arch == SL_ARCH_LLAMA && (c->n_embd / c->n_head) % 2 != 0)
        return sl_errorf("%s: head_dim %d must be even for rotary embeddings", where, c->n_embd / c->n_head);
    if (!(c->norm_eps > 0.0f)) return sl_errorf("%s: norm epsilon must be positive", where);
    if (c->arch == SL_ARCH_LLAMA && !(c->rope_theta > 0.0f)) return sl_errorf("%s: rope_theta must be positive", where);
    if (c->vocab_size > (1 << 30) || c->n_layer > 100000 || c->n_embd > (1 << 20) || c->n_inner > (1 << 24) ||
        c->max_seq_len > (1 << 24))
        return sl_errorf("%s: model dimensions are implausibly large (vocab %d, layers %d, n_embd %d, inner %d, "
                         "positions %d)", where, c->vocab_size, c->n_layer, c->n_embd, c->n_inner, c->max_seq_len);
    c->padded_vocab_size = (c->vocab_size + 127) / 128 * 128;
    return 0;
}

// eos_token_id is an integer, or (newer LLaMA configs) a list whose first entry is the main one.
static int token_id(const cJSON *r, const char *key, int *out, const char *w) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
    if (cJSON_IsArray(v)) v = cJSON_GetArrayItem(v, 0);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= -1.0 && v->valuedouble <= 2147483647.0) ||
        v->valuedouble != floor(v->valuedouble))
        return sl_errorf("%s: \"%s\" must be an integer token id (or a list of them)", w, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int parse_gpt2(sl_model_config *c, const cJSON *r, const char *w) {
    *c = (sl_model_config){SL_ARCH_GPT2, 50257, 0, 1024, 12, 12, 12, 768, 0, 1e-5f, 0.0f, 1, 50256, 50256};
    if (sl_json_get_int(r, "vocab_size", &c->vocab_size, 1, 0, w) ||
        sl_json_get_int(r, "n_positions", &c->max_seq_len, 0, 0, w) ||
        sl_json_get_int(r, "n_layer", &c->n_layer, 1, 0, w) || sl_json_get_int(r, "n_head", &c->n_head, 1, 0, w) ||
        sl_json_get_int(r, "n_embd", &c->n_embd, 1, 0, w) || sl_json_get_int(r, "n_inner", &c->n_inner, 0, 0, w) ||
        sl_json_get_float(r, "layer_norm_epsilon", &c->norm_eps, w) ||
        sl_json_get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings, w) ||
        token_id(r, "bos_token_id", &c->bos_token_id, w) ||
        token_id(r, "eos_token_id", &c->eos_token_id, w))
        return -1;
    if (c->n_inner == 0) c->n_inner = 4 * c->n_embd;
    c->n_kv_head = c->n_head;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "activation_function");
    if (act && (!cJSON_IsString(act) ||
        (strcmp(act->valuestring, "gelu_new") && strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        return sl_errorf("%s: activation_function must be \"gelu_new\" (tanh GELU)", w);
    if (!c->tie_word_embeddings) return sl_errorf("%s: GPT-2 models must tie word embeddings", w);
    int scale_attn = 1;
    if (sl_json_get_bool(r, "scale_attn_weights", &scale_attn, w)) return -1;
    if (!scale_attn) return sl_errorf("%s: scale_attn_weights=false is not supported", w);
    const char *unsupported[] = {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"};
    for (int i = 0; i < 3; i++) {
        int on = 0;
        if (sl_json_get_bool(r, unsupported[i], &on, w)) return -1;
        if (on) return sl_errorf("%s: %s=true is not supported", w, unsupported[i]);
    }
    return 0;
}

static int parse_llama(sl_model_config *c, const cJSON *r, const char *w) {
    *c = (sl_model_config){SL_ARCH_LLAMA, 32000, 0, 2048, 0, 0, 0, 0, 0, 1e-6f, 10000.0f, 0, 1, 2};
    c->n_kv_head = -1;
    if (sl_json_get_int(r, "vocab_size", &c->vocab_size, 1, 0, w) ||
        sl_json_get_int(r, "max_position_embeddings", &c->max_seq_len, 0, 0, w) ||
        sl_json_get_int(r, "num_hidden_layers", &c->n_layer, 1, 0, w) ||
        sl_json_get_int(r, "num_attention_heads", &c->n_head, 1, 0, w) ||
        sl_json_get_int(r, "num_key_value_heads", &c->n_kv_head, 0, 0, w) ||
        sl_json_get_int(r, "hidden_size", &c->n_embd, 1, 0, w) ||
        sl_json_get_int(r, "intermediate_size", &c->n_inner, 1, 0, w) ||
        sl_json_get_float(r, "rms_norm_eps", &c->norm_eps, w) ||
        sl_json_get_float(r, "rope_theta", &c->rope_theta, w) ||
        sl_json_get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings, w) ||
        token_id(r, "bos_token_id", &c->bos_token_id, w) ||
        token_id(r, "eos_token_id", &c->eos_token_id, w))
        return -1;
    if (c->n_kv_head == -1) c->n_kv_head = c->n_head;
    int head_dim = 0;
    if (sl_json_get_int(r, "head_dim", &head_dim, 0, 1, w)) return -1;
    if (head_dim && c->n_head > 0 && head_dim * c->n_head != c->n_embd)
        return sl_errorf("%s: head_dim %d differs from hidden_size / num_attention_heads = %d (not supported)", w,
                         head_dim, c->n_embd / c->n_head);
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return sl_errorf("%s: hidden_act must be \"silu\"", w);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling");
    if (rs && !cJSON_IsNull(rs)) return sl_errorf("%s: rope_scaling is not supported (expected null)", w);
    int bias = 0;
    if (sl_json_get_bool(r, "attention_bias", &bias, w)) return -1;
    if (bias) return sl_errorf("%s: attention_bias=true is not supported", w);
    if (sl_json_get_bool(r, "mlp_bias", &bias, w)) return -1;
    if (bias) return sl_errorf("%s: mlp_bias=true is not supported", w);
    return 0;
}

int sl_config_from_json_text(sl_model_config *cfg, const char *text, const char *where) {
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return sl_errorf("%s: malformed JSON near byte %ld", where, at ? (long)(at - text) : -1L);
    }
    int rc;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsObject(root)) rc = sl_errorf("%s: expected a JSON object", where);
    else if (!cJSON_IsString(mt)) rc = sl_errorf("%s: missing string key \"model_type\" (\"gpt2\" or \"llama\")", where);
    else if (strcmp(mt->valuestring, "gpt2") == 0) rc = parse_gpt2(cfg, root, where);
    else if (strcmp(mt->valuestring, "llama") == 0) rc = parse_llama(cfg, root, where);
    else rc = sl_errorf("%s: model_type \"%s\" is not supported (expected \"gpt2\" or \"llama\")", where, mt->valuestring);
    cJSON_Delete(root);
    return rc ? rc : sl_config_validate(cfg, where);
}


int sl_config_load_json(sl_model_config *cfg, const char *path) {
    size_t len;
    char *text = sl_read_text_file(path, &len);
    if (!text) return -1;
    int rc = sl_config_from_json_text(cfg, text, path);
    free(text);
    return rc;
}

// The shortest decimal that reads back as the same float (1e-6f -> 1e-06, not 9.99999997e-07).
static double float_for_json(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

char *sl_config_to_json_text(const sl_model_config *c) {
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(r, "architectures");
    if (c->arch == SL_ARCH_GPT2) {
        cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
        cJSON_AddStringToObject(r, "model_type", "gpt2");
        cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
        cJSON_AddNumberToObject(r, "n_positions", c->max_seq_len);
        cJSON_AddNumberToObject(r, "n_ctx", c->max_seq_len);
        cJSON_AddNumberToObject(r, "n_embd", c->n_embd);
        cJSON_AddNumberToObject(r, "n_layer", c->n_layer);
        cJSON_AddNumberToObject(r, "n_head", c->n_head);
        cJSON_AddNumberToObject(r, "n_inner", c->n_inner);
        cJSON_AddNumberToObject(r, "layer_norm_epsilon", float_for_json(c->norm_eps));
        cJSON_AddStringToObject(r, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(r, "resid_pdrop", 0.0);
        cJSON_AddNumberToObject(r, "embd_pdrop", 0.0);
        cJSON_AddNumberToObject(r, "attn_pdrop", 0.0);
    } else {
        cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
        cJSON_AddStringToObject(r, "model_type", "llama");
        cJSON_AddNumberToObject(r, "vocab_size", c->vocab_size);
        cJSON_AddNumberToObject(r, "max_position_embeddings", c->max_seq_len);
        cJSON_AddNumberToObject(r, "hidden_size", c->n_embd);
        cJSON_AddNumberToObject(r, "intermediate_size", c->n_inner);
        cJSON_AddNumberToObject(r, "num_hidden_layers", c->n_layer);
        cJSON_AddNumberToObject(r, "num_attention_heads", c->n_head);
        cJSON_AddNumberToObject(r, "num_key_value_heads", c->n_kv_head);
        cJSON_AddNumberToObject(r, "rms_norm_eps", float_for_json(c->norm_eps));
        cJSON_AddNumberToObject(r, "rope_theta", float_for_json(c->rope_theta));
        cJSON_AddStringToObject(r, "hidden_act", "silu");
        cJSON_AddFalseToObject(r, "attention_bias");
        cJSON_AddFalseToObject(r, "mlp_bias");
    }
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddNumberToObject(r, "bos_token_id", c->bos_token_id);
    cJSON_AddNumberToObject(r, "eos_token_id", c->eos_token_id);
    cJSON_AddStringToObject(r, "torch_dtype", "float32");
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    if (!s) sl_errorf("out of memory writing config.json");
    return s;
}
