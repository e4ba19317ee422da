// hf_config.c: Hugging Face config.json <-> sl_model_config, for model_type gpt2, llama, qwen2 and
// mistral, in both of transformers' layouts: 4.x top-level rope_theta / rope_scaling and 5.x
// rope_parameters. The discipline: a key that changes the computation is honoured or refused by
// name; a key that does not (metadata, generation defaults, dropout) is in an ignore list
// (docs/formats.md); any other key gets a one-line notice.
#include "shardlm/config.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"
#include "shardlm/quant_config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>

// Keys of PretrainedConfig and of the generation defaults that never change a forward or backward.
static const char *const common_ignored[] = {
    "architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
    "use_cache", "initializer_range", "output_attentions", "output_hidden_states", "return_dict",
    "is_encoder_decoder", "is_decoder", "tie_encoder_decoder", "chunk_size_feed_forward", "id2label",
    "label2id", "num_labels", "problem_type", "tokenizer_class", "prefix", "sep_token_id",
    "decoder_start_token_id", "task_specific_params", "finetuning_task", "pruned_heads", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "bad_words_ids", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    "cross_attention_hidden_size", "_attn_implementation", "attn_implementation",
    "_attn_implementation_autoset", "bos_token_id", "eos_token_id", NULL};

// Keys the model code of each family reads, honoured (or refused for values shardlm cannot compute).
static const char *const gpt2_known[] = {
    "vocab_size", "n_positions", "n_ctx", "n_layer", "n_head", "n_embd", "n_inner", "layer_norm_epsilon",
    "tie_word_embeddings", "activation_function", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "add_cross_attention", "pad_token_id",
    // dropout (shardlm trains without it) and GPT2DoubleHeadsModel's summary head
    "resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "quantization_config", NULL};
static const char *const llama_known[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
    "head_dim", "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor", "pad_token_id",
    "original_max_position_embeddings",
    "attention_dropout", "attention_bias", "mlp_bias", "pretraining_tp", "sliding_window",
    "use_sliding_window", "max_window_layers", "layer_types", "quantization_config", NULL};

static int unknown_notice(const cJSON *root, const char *const *known, const char *where) {
    char list[1024];
    size_t used = 0;
    list[0] = '\0';
    for (const cJSON *it = root->child; it; it = it->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(known[i], it->string) == 0;
        for (int i = 0; common_ignored[i] && !ok; i++) ok = strcmp(common_ignored[i], it->string) == 0;
        if (ok) continue;
        int n = snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", it->string);
        if (n < 0 || (size_t)n >= sizeof list - used) break;
        used += (size_t)n;
    }
    if (used) fprintf(stderr, "notice: %s: keys shardlm does not know, ignored: %s\n", where, list);
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

// A boolean key that shardlm supports only with one value.
static int require_bool(const cJSON *r, const char *key, int want, const char *w) {
    int v = want;
    if (sl_json_get_bool(r, key, &v, w)) return -1;
    if (v != want) return sl_errorf("%s: %s=%s is not supported", w, key, v ? "true" : "false");
    return 0;
}

// A number that must be absent or exactly `want` (dropout rates, partial_rotary_factor).
static int require_number(const cJSON *r, const char *key, double want, const char *why, const char *w) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return sl_errorf("%s: \"%s\" must be a number", w, key);
    if (v->valuedouble != want) return sl_errorf("%s: %s=%g is not supported (%s)", w, key, v->valuedouble, why);
    return 0;
}

// A bitsandbytes quantization_config must be one shardlm reads (quant_config.h); the weights loader
// (quant_model.h) reads it again with the weights.
static int check_quantization(const cJSON *r, const char *w) {
    char where[512];
    snprintf(where, sizeof where, "%s: quantization_config", w);
    sl_quant_config qc;
    return sl_quant_config_parse(cJSON_GetObjectItemCaseSensitive(r, "quantization_config"), &qc, where);
}

static int parse_gpt2(sl_model_config *c, const cJSON *r, const char *w) {
    *c = (sl_model_config){.arch = SL_ARCH_GPT2, .family = SL_FAMILY_GPT2, .vocab_size = 50257, .max_seq_len = 1024,
                           .n_layer = 12, .n_head = 12, .n_kv_head = 12, .n_embd = 768, .norm_eps = 1e-5f,
                           .tie_word_embeddings = 1, .bos_token_id = 50256, .eos_token_id = 50256,
                           .pad_token_id = -1};
    if (sl_json_get_int(r, "vocab_size", &c->vocab_size, 1, 0, w) ||
        sl_json_get_int(r, "n_positions", &c->max_seq_len, 0, 0, w) ||
        sl_json_get_int(r, "n_layer", &c->n_layer, 1, 0, w) || sl_json_get_int(r, "n_head", &c->n_head, 1, 0, w) ||
        sl_json_get_int(r, "n_embd", &c->n_embd, 1, 0, w) || sl_json_get_int(r, "n_inner", &c->n_inner, 0, 0, w) ||
        sl_json_get_float(r, "layer_norm_epsilon", &c->norm_eps, w) ||
        sl_json_get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings, w) ||
        token_id(r, "bos_token_id", &c->bos_token_id, w) || token_id(r, "eos_token_id", &c->eos_token_id, w))
        return -1;
    if (c->n_inner == 0) {  // transformers' default, 4 x n_embd, which must fit an int
        if (c->n_embd > INT_MAX / 4)
            return sl_errorf("%s: n_embd %d is too large (the default n_inner, 4 x n_embd, exceeds %d)", w, c->n_embd,
                             INT_MAX);
        c->n_inner = 4 * c->n_embd;
    }
    c->n_kv_head = c->n_head;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "activation_function");
    if (act && (!cJSON_IsString(act) ||
        (strcmp(act->valuestring, "gelu_new") && strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        return sl_errorf("%s: activation_function must be \"gelu_new\" (tanh GELU)", w);
    if (!c->tie_word_embeddings) return sl_errorf("%s: GPT-2 models must tie word embeddings", w);
    if (require_bool(r, "scale_attn_weights", 1, w) || require_bool(r, "scale_attn_by_inverse_layer_idx", 0, w) ||
        require_bool(r, "reorder_and_upcast_attn", 0, w) || require_bool(r, "add_cross_attention", 0, w))
        return -1;
    if (check_quantization(r, w)) return -1;
    return unknown_notice(r, gpt2_known, w);
}

// ---- RoPE: one rope_parameters / rope_scaling block -------------------------------------------

typedef struct { const char *name; sl_rope_type type; const char *const *keys; } rope_kind;
static const char *const keys_default[] = {NULL};
static const char *const keys_factor[] = {"factor", NULL};
static const char *const keys_llama3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings", NULL};
static const char *const keys_yarn[] = {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
                                        "beta_slow", "mscale", "mscale_all_dim", "truncate", NULL};
static const rope_kind rope_kinds[] = {
    {"default", SL_ROPE_DEFAULT, keys_default}, {"linear", SL_ROPE_LINEAR, keys_factor},
    {"dynamic", SL_ROPE_DYNAMIC, keys_factor},  {"llama3", SL_ROPE_LLAMA3, keys_llama3},
    {"yarn", SL_ROPE_YARN, keys_yarn},
};

static const rope_kind *rope_kind_of(sl_rope_type t) {
    for (size_t i = 0; i < sizeof rope_kinds / sizeof rope_kinds[0]; i++)
        if (rope_kinds[i].type == t) return &rope_kinds[i];
    return &rope_kinds[0];
}

// A positive number of a rope block (0 when absent and not required).
static int rope_number(const cJSON *blk, const char *key, float *out, int required, const char *w, const char *bname) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(blk, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return sl_errorf("%s: %s needs \"%s\" for this rope_type", w, bname, key);
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0.0 && v->valuedouble <= 3.0e38))
        return sl_errorf("%s: %s.%s must be a non-negative finite number", w, bname, key);
    *out = (float)v->valuedouble;
    return 0;
}

// Parses one block into r (theta left to the caller: *theta_given set when the block names it).
static int parse_rope_block(sl_rope_config *r, float *theta, int *theta_given, int *orig_given, const cJSON *blk,
                            const char *w, const char *bname) {
    memset(r, 0, sizeof *r);
    if (!cJSON_IsObject(blk)) return sl_errorf("%s: \"%s\" must be an object or null", w, bname);
    const cJSON *t1 = cJSON_GetObjectItemCaseSensitive(blk, "rope_type");
    const cJSON *t2 = cJSON_GetObjectItemCaseSensitive(blk, "type");
    if ((t1 && !cJSON_IsString(t1)) || (t2 && !cJSON_IsString(t2)))
        return sl_errorf("%s: %s.rope_type must be a string", w, bname);
    if (t1 && t2 && strcmp(t1->valuestring, t2->valuestring))
        return sl_errorf("%s: %s has rope_type \"%s\" and type \"%s\"; they must agree", w, bname, t1->valuestring,
                         t2->valuestring);
    const char *name = t1 ? t1->valuestring : t2 ? t2->valuestring : "default";
    const rope_kind *kind = NULL;
    for (size_t i = 0; i < sizeof rope_kinds / sizeof rope_kinds[0]; i++)
        if (strcmp(rope_kinds[i].name, name) == 0) kind = &rope_kinds[i];
    if (!kind)
        return sl_errorf("%s: %s.rope_type \"%s\" is not supported (expected default, linear, dynamic, llama3 or yarn)",
                         w, bname, name);
    r->type = kind->type;
    *theta_given = 0;
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(blk, "rope_theta");
    if (th && !cJSON_IsNull(th)) {
        if (!cJSON_IsNumber(th) || !(th->valuedouble > 0.0 && th->valuedouble <= 3.0e38))
            return sl_errorf("%s: %s.rope_theta must be a positive number", w, bname);
        *theta = (float)th->valuedouble;
        *theta_given = 1;
    }
    if (require_number(blk, "partial_rotary_factor", 1.0, "partial rotary embeddings are not computed", w)) return -1;
    int is_llama3 = r->type == SL_ROPE_LLAMA3, is_yarn = r->type == SL_ROPE_YARN;
    float orig = 0.0f;
    if ((r->type != SL_ROPE_DEFAULT && rope_number(blk, "factor", &r->factor, 1, w, bname)) ||
        (is_llama3 && (rope_number(blk, "low_freq_factor", &r->low_freq_factor, 1, w, bname) ||
                       rope_number(blk, "high_freq_factor", &r->high_freq_factor, 1, w, bname))) ||
        ((is_llama3 || is_yarn) && rope_number(blk, "original_max_position_embeddings", &orig, 0, w, bname)))
        return -1;
    if (orig != floorf(orig) || orig > 1e8f)
        return sl_errorf("%s: %s.original_max_position_embeddings must be an integer", w, bname);
    r->original_max_position_embeddings = (int)orig;
    *orig_given = orig > 0.0f;
    if (is_yarn) {
        r->truncate = 1;
        if (rope_number(blk, "attention_factor", &r->attention_factor, 0, w, bname) ||
            rope_number(blk, "beta_fast", &r->beta_fast, 0, w, bname) ||
            rope_number(blk, "beta_slow", &r->beta_slow, 0, w, bname) ||
            rope_number(blk, "mscale", &r->mscale, 0, w, bname) ||
            rope_number(blk, "mscale_all_dim", &r->mscale_all_dim, 0, w, bname) ||
            sl_json_get_bool(blk, "truncate", &r->truncate, w))
            return -1;
        const cJSON *af = cJSON_GetObjectItemCaseSensitive(blk, "attention_factor");
        if (af && !cJSON_IsNull(af) && !(r->attention_factor > 0.0f))
            return sl_errorf("%s: %s.attention_factor must be positive", w, bname);
    }
    // keys this rope_type does not read: a notice, as transformers' validation warns
    char list[512];
    const char *base[32];
    size_t n = 0;
    base[n++] = "rope_type";
    base[n++] = "type";
    base[n++] = "rope_theta";
    base[n++] = "partial_rotary_factor";
    for (int i = 0; kind->keys[i]; i++) base[n++] = kind->keys[i];
    base[n] = NULL;
    if (sl_json_unknown_keys(blk, base, list, sizeof list))
        fprintf(stderr, "notice: %s: %s keys that rope_type \"%s\" does not read, ignored: %s\n", w, bname, name, list);
    return 0;
}

static int rope_blocks_agree(const sl_rope_config *a, const sl_rope_config *b) {
    return a->type == b->type && a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->attention_factor == b->attention_factor &&
           a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow && a->mscale == b->mscale &&
           a->mscale_all_dim == b->mscale_all_dim && a->truncate == b->truncate;
}

// Reads the RoPE settings from whichever layout the config uses; where two places give one value
// differently, an error (transformers 5 would silently let one of them win).
static int parse_rope(sl_model_config *c, const cJSON *r, const char *w) {
    const cJSON *p5 = cJSON_GetObjectItemCaseSensitive(r, "rope_parameters");
    const cJSON *p4 = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling");
    if (p5 && cJSON_IsNull(p5)) p5 = NULL;
    if (p4 && cJSON_IsNull(p4)) p4 = NULL;
    float thetas[3];
    int n_theta = 0, theta5 = 0, theta4 = 0, orig5 = 0, orig4 = 0;
    sl_rope_config a = {.type = SL_ROPE_DEFAULT}, b;
    if (p5 && parse_rope_block(&a, &thetas[n_theta], &theta5, &orig5, p5, w, "rope_parameters")) return -1;
    n_theta += theta5;
    if (p4) {
        if (parse_rope_block(&b, &thetas[n_theta], &theta4, &orig4, p4, w, "rope_scaling")) return -1;
        n_theta += theta4;
        if (p5 && (!rope_blocks_agree(&a, &b) || (orig5 && orig4 && a.original_max_position_embeddings !=
                                                                         b.original_max_position_embeddings)))
            return sl_errorf("%s: rope_parameters and rope_scaling describe different RoPE settings; keep one "
                             "(transformers 5 reads rope_parameters' layout)", w);
        if (!p5 || (!orig5 && orig4)) {
            a = b;
            orig5 = orig4;
        }
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(r, "rope_theta");
    int top_theta = th && !cJSON_IsNull(th);
    if (top_theta) {
        if (!cJSON_IsNumber(th) || !(th->valuedouble > 0.0 && th->valuedouble <= 3.0e38))
            return sl_errorf("%s: rope_theta must be a positive number", w);
        thetas[n_theta++] = (float)th->valuedouble;
    }
    // With both blocks, transformers (4.x, and 5, which then takes rope_scaling as rope_parameters)
    // reads rope_scaling and the top-level keys only: a value found only in rope_parameters would be
    // dropped there and used here, so it is refused.
    if (p5 && p4 && theta5 && !theta4 && !top_theta)
        return sl_errorf("%s: rope_theta %g is given only inside rope_parameters, but rope_scaling is there too, "
                         "and transformers then reads rope_scaling and the top level (so theta 10000); keep one "
                         "block, or give rope_theta at the top level", w, (double)thetas[0]);
    for (int i = 1; i < n_theta; i++)
        if (thetas[i] != thetas[0])
            return sl_errorf("%s: rope_theta is given twice with different values (%g and %g)", w,
                             (double)thetas[0], (double)thetas[i]);
    a.theta = n_theta ? thetas[0] : 10000.0f;
    if (require_number(r, "partial_rotary_factor", 1.0, "partial rotary embeddings are not computed", w)) return -1;
    // transformers: a top-level original_max_position_embeddings (Phi-3 style) wins; else max positions
    int top_orig = 0;
    if (sl_json_get_int(r, "original_max_position_embeddings", &top_orig, 0, 1, w)) return -1;
    if (a.type == SL_ROPE_LLAMA3 || a.type == SL_ROPE_YARN) {
        if (p5 && p4 && orig5 && !orig4 && !top_orig)
            return sl_errorf("%s: original_max_position_embeddings is given only inside rope_parameters, but "
                             "rope_scaling is there too, and transformers then reads rope_scaling (where it is "
                             "missing, so max_position_embeddings is used); keep one block, or add it to rope_scaling",
                             w);
        if (top_orig && orig5 && top_orig != a.original_max_position_embeddings)
            return sl_errorf("%s: original_max_position_embeddings is %d at the top level and %d in the RoPE block", w,
                             top_orig, a.original_max_position_embeddings);
        if (top_orig) a.original_max_position_embeddings = top_orig;
        else if (!orig5) a.original_max_position_embeddings = c->max_seq_len;
    }
    c->rope = a;
    return 0;
}

// ---- the LLaMA family ---------------------------------------------------------------------------

// How many layer_types entries are sliding and full attention; anything else is refused.
static int count_layer_types(const cJSON *lt, int *sliding, int *full, const char *w) {
    *sliding = *full = 0;
    for (const cJSON *it = lt ? lt->child : NULL; it; it = it->next) {
        int is_sliding = cJSON_IsString(it) && !strcmp(it->valuestring, "sliding_attention");
        if (!is_sliding && (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention")))
            return sl_errorf("%s: layer_types: expected \"sliding_attention\" or \"full_attention\" entries", w);
        *sliding += is_sliding;
        *full += !is_sliding;
    }
    return 0;
}

// Mistral and Qwen2: transformers masks each layer by its layer_types entry. All "sliding_attention" is
// the window everywhere, all "full_attention" plain causal attention everywhere; a mix is not computed.
// Qwen2Config keeps its window only with use_sliding_window, and without layer_types makes the layers
// from max_window_layers (default 28) on sliding: so max_window_layers >= the layer count is full
// attention everywhere, 0 the window everywhere.
static int parse_sliding_layers(sl_model_config *c, const cJSON *r, const cJSON *lt, int window, const char *w) {
    int sliding, full, from_layer = 28;
    if (c->family == SL_FAMILY_QWEN2) {
        int use = 0;
        if (sl_json_get_bool(r, "use_sliding_window", &use, w) ||
            sl_json_get_int(r, "max_window_layers", &from_layer, 0, 0, w))
            return -1;
        if (!use) window = 0;
    }
    if (lt) {
        if (count_layer_types(lt, &sliding, &full, w)) return -1;
    } else if (c->family == SL_FAMILY_QWEN2) {
        int first = window ? (from_layer < c->n_layer ? from_layer : c->n_layer) : c->n_layer;
        full = first;
        sliding = c->n_layer - first;
    } else {  // Mistral: the window (when there is one) on every layer
        sliding = window ? c->n_layer : 0;
        full = c->n_layer - sliding;
    }
    if (sliding && full)
        return sl_errorf("%s: %s mixes sliding and full attention layers (%d and %d); only one kind for every layer "
                         "is supported", w, lt ? "layer_types" : "max_window_layers", sliding, full);
    if (sliding && !window)
        return sl_errorf("%s: layer_types asks for sliding attention, but %s", w,
                         c->family == SL_FAMILY_QWEN2 ? "use_sliding_window is false or sliding_window null"
                                                      : "sliding_window is null");
    c->sliding_window = sliding ? window : 0;
    return 0;
}

static int parse_sliding(sl_model_config *c, const cJSON *r, const char *w) {
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(r, "sliding_window");
    // MistralConfig's and Qwen2Config's default window is 4096 (a file without the key gets it; null turns it off)
    int windowed = c->family == SL_FAMILY_MISTRAL || c->family == SL_FAMILY_QWEN2;
    int window = windowed && !sw ? 4096 : 0;
    if (sw && !cJSON_IsNull(sw) && sl_json_get_int(r, "sliding_window", &window, 0, 1, w)) return -1;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(r, "layer_types");
    if (lt && cJSON_IsNull(lt)) lt = NULL;
    if (lt && !cJSON_IsArray(lt)) return sl_errorf("%s: layer_types must be a list", w);
    if (lt && cJSON_GetArraySize(lt) != c->n_layer)
        return sl_errorf("%s: layer_types has %d entries for %d layers", w, cJSON_GetArraySize(lt), c->n_layer);
    if (windowed) return parse_sliding_layers(c, r, lt, window, w);
    if (sw && !cJSON_IsNull(sw))
        return sl_errorf("%s: sliding_window is not a LlamaConfig key (use model_type \"mistral\")", w);
    // layer_types: every layer must be plain causal attention
    if (lt) {
        for (const cJSON *it = lt->child; it; it = it->next)
            if (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention"))
                return sl_errorf("%s: layer_types: only \"full_attention\" layers are supported", w);
    }
    return 0;
}

static int parse_llama(sl_model_config *c, const cJSON *r, sl_family family, const char *w) {
    // transformers' LlamaConfig / Qwen2Config / MistralConfig defaults for the keys a file may omit
    *c = (sl_model_config){.arch = SL_ARCH_LLAMA, .family = family, .vocab_size = 32000, .max_seq_len = 2048,
                           .norm_eps = 1e-6f, .bos_token_id = 1, .eos_token_id = 2, .pad_token_id = -1};
    if (family == SL_FAMILY_QWEN2) {
        c->vocab_size = 151936;
        c->max_seq_len = 32768;
        c->bos_token_id = c->eos_token_id = -1;
        c->qkv_bias = 1;
    } else if (family == SL_FAMILY_MISTRAL) {
        c->max_seq_len = 4096 * 32;
    }
    c->n_kv_head = -1;
    if (sl_json_get_int(r, "vocab_size", &c->vocab_size, 1, 0, w) ||
        sl_json_get_int(r, "max_position_embeddings", &c->max_seq_len, 0, 0, w) ||
        sl_json_get_int(r, "num_hidden_layers", &c->n_layer, 1, 0, w) ||
        sl_json_get_int(r, "num_attention_heads", &c->n_head, 1, 0, w) ||
        sl_json_get_int(r, "num_key_value_heads", &c->n_kv_head, 0, 0, w) ||
        sl_json_get_int(r, "hidden_size", &c->n_embd, 1, 0, w) ||
        sl_json_get_int(r, "intermediate_size", &c->n_inner, 1, 0, w) ||
        sl_json_get_int(r, "head_dim", &c->head_dim, 0, 1, w) || sl_json_get_float(r, "rms_norm_eps", &c->norm_eps, w) ||
        sl_json_get_bool(r, "tie_word_embeddings", &c->tie_word_embeddings, w) ||
        token_id(r, "bos_token_id", &c->bos_token_id, w) || token_id(r, "eos_token_id", &c->eos_token_id, w) ||
        token_id(r, "pad_token_id", &c->pad_token_id, w))
        return -1;
    if (c->n_kv_head == -1) {  // null: the head count in every class; absent: the class's default
        c->n_kv_head = c->n_head;
        if (!cJSON_GetObjectItemCaseSensitive(r, "num_key_value_heads") && family != SL_FAMILY_LLAMA)
            c->n_kv_head = family == SL_FAMILY_MISTRAL ? 8 : 32;  // MistralConfig's, Qwen2Config's
    }
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(r, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu")))
        return sl_errorf("%s: hidden_act must be \"silu\"", w);
    if (family == SL_FAMILY_LLAMA &&
        (require_bool(r, "attention_bias", 0, w) || require_bool(r, "mlp_bias", 0, w)))
        return -1;
    if (require_number(r, "attention_dropout", 0.0, "shardlm trains without dropout", w)) return -1;
    if (check_quantization(r, w)) return -1;
    if (parse_rope(c, r, w) || parse_sliding(c, r, w)) return -1;
    if (c->pad_token_id >= c->vocab_size)
        return sl_errorf("%s: pad_token_id %d is outside the vocabulary [0, %d)", w, c->pad_token_id, c->vocab_size);
    return unknown_notice(r, llama_known, w);
}

static const struct { const char *name; sl_family family; } families[] = {
    {"gpt2", SL_FAMILY_GPT2}, {"llama", SL_FAMILY_LLAMA}, {"qwen2", SL_FAMILY_QWEN2}, {"mistral", SL_FAMILY_MISTRAL}};

int sl_config_from_json_text(sl_model_config *cfg, const char *text, const char *where) {
    // strict: trailing data or a key given twice is an error (cJSON alone would keep the first)
    cJSON *root = sl_json_parse_strict(text, strlen(text), where);
    if (!root) return -1;
    int rc = -2;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsObject(root)) rc = sl_errorf("%s: expected a JSON object", where);
    else if (!cJSON_IsString(mt))
        rc = sl_errorf("%s: missing string key \"model_type\" (gpt2, llama, qwen2 or mistral)", where);
    for (size_t i = 0; rc == -2 && i < sizeof families / sizeof families[0]; i++)
        if (strcmp(mt->valuestring, families[i].name) == 0)
            rc = families[i].family == SL_FAMILY_GPT2 ? parse_gpt2(cfg, root, where)
                                                      : parse_llama(cfg, root, families[i].family, where);
    if (rc == -2)
        rc = sl_errorf("%s: model_type \"%s\" is not supported (expected gpt2, llama, qwen2 or mistral)", where,
                       mt->valuestring);
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

// ---- writing --------------------------------------------------------------------------------------

// The shortest decimal that reads back as the same float (1e-6f -> 1e-06, not 9.99999997e-07).
static double float_for_json(float f) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return strtod(buf, NULL);
}

// The RoPE block: rope_type, (rope_theta), and the keys its type reads.
static cJSON *rope_block(const sl_rope_config *p, int with_theta) {
    cJSON *o = cJSON_CreateObject();
    const rope_kind *kind = rope_kind_of(p->type);
    cJSON_AddStringToObject(o, "rope_type", kind->name);
    if (with_theta) cJSON_AddNumberToObject(o, "rope_theta", float_for_json(p->theta));
    if (p->type != SL_ROPE_DEFAULT) cJSON_AddNumberToObject(o, "factor", float_for_json(p->factor));
    if (p->type == SL_ROPE_LLAMA3) {
        cJSON_AddNumberToObject(o, "low_freq_factor", float_for_json(p->low_freq_factor));
        cJSON_AddNumberToObject(o, "high_freq_factor", float_for_json(p->high_freq_factor));
    }
    if (p->type == SL_ROPE_LLAMA3 || p->type == SL_ROPE_YARN)
        cJSON_AddNumberToObject(o, "original_max_position_embeddings", p->original_max_position_embeddings);
    if (p->type == SL_ROPE_YARN) {
        const struct { const char *k; float v; } opt[] = {{"attention_factor", p->attention_factor},
            {"beta_fast", p->beta_fast}, {"beta_slow", p->beta_slow}, {"mscale", p->mscale},
            {"mscale_all_dim", p->mscale_all_dim}};
        for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
            if (opt[i].v > 0.0f) cJSON_AddNumberToObject(o, opt[i].k, float_for_json(opt[i].v));
        if (!p->truncate) cJSON_AddFalseToObject(o, "truncate");
    }
    return o;
}

typedef struct { const char *key; int value; } int_key;

static void add_ints(cJSON *r, const int_key *keys, size_t n) {
    for (size_t i = 0; i < n; i++) cJSON_AddNumberToObject(r, keys[i].key, keys[i].value);
}

static void add_token(cJSON *r, const char *key, int id) {
    if (id >= 0) cJSON_AddNumberToObject(r, key, id);
    else cJSON_AddNullToObject(r, key);
}

static void write_llama(cJSON *r, const sl_model_config *c) {
    static const char *const names[][2] = {
        [SL_FAMILY_LLAMA] = {"LlamaForCausalLM", "llama"}, [SL_FAMILY_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
        [SL_FAMILY_MISTRAL] = {"MistralForCausalLM", "mistral"}};
    int f = c->family >= SL_FAMILY_LLAMA && c->family <= SL_FAMILY_MISTRAL ? (int)c->family : SL_FAMILY_LLAMA;
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(r, "architectures"), cJSON_CreateString(names[f][0]));
    cJSON_AddStringToObject(r, "model_type", names[f][1]);
    const int_key ints[] = {{"vocab_size", c->vocab_size}, {"max_position_embeddings", c->max_seq_len},
        {"hidden_size", c->n_embd}, {"intermediate_size", c->n_inner}, {"num_hidden_layers", c->n_layer},
        {"num_attention_heads", c->n_head}, {"num_key_value_heads", c->n_kv_head}};
    add_ints(r, ints, sizeof ints / sizeof ints[0]);
    // head_dim only where it is not hidden_size / heads (Qwen2Config has no such key by default)
    if (c->head_dim * c->n_head != c->n_embd) cJSON_AddNumberToObject(r, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(r, "rms_norm_eps", float_for_json(c->norm_eps));
    cJSON_AddStringToObject(r, "hidden_act", "silu");
    // transformers 5 reads rope_parameters; 4.x (4.45 on: rope_type) reads rope_theta and rope_scaling.
    // transformers 5 prefers rope_scaling when both are there and adds the top-level rope_theta to it,
    // so the two blocks are written to give it exactly rope_parameters either way.
    cJSON_AddItemToObject(r, "rope_parameters", rope_block(&c->rope, 1));
    cJSON_AddNumberToObject(r, "rope_theta", float_for_json(c->rope.theta));
    if (c->rope.type == SL_ROPE_DEFAULT) cJSON_AddNullToObject(r, "rope_scaling");
    else cJSON_AddItemToObject(r, "rope_scaling", rope_block(&c->rope, 0));
    cJSON_AddNumberToObject(r, "attention_dropout", 0.0);
    if (f == SL_FAMILY_LLAMA) {
        cJSON_AddFalseToObject(r, "attention_bias");
        cJSON_AddFalseToObject(r, "mlp_bias");
    } else if (f == SL_FAMILY_QWEN2) {  // a window on every layer: Qwen2Config's layers from max_window_layers 0 on
        cJSON_AddBoolToObject(r, "use_sliding_window", c->sliding_window > 0);
        if (c->sliding_window) {
            cJSON_AddNumberToObject(r, "sliding_window", c->sliding_window);
            cJSON_AddNumberToObject(r, "max_window_layers", 0);
        } else {
            cJSON_AddNullToObject(r, "sliding_window");
        }
    } else {
        if (c->sliding_window) cJSON_AddNumberToObject(r, "sliding_window", c->sliding_window);
        else cJSON_AddNullToObject(r, "sliding_window");
    }
    add_token(r, "pad_token_id", c->pad_token_id);
}

char *sl_config_to_json_text(const sl_model_config *c) {
    cJSON *r = cJSON_CreateObject();
    cJSON *arch = cJSON_AddArrayToObject(r, "architectures");
    if (c->arch == SL_ARCH_GPT2) {
        cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
        cJSON_AddStringToObject(r, "model_type", "gpt2");
        const int_key ints[] = {{"vocab_size", c->vocab_size}, {"n_positions", c->max_seq_len},
            {"n_ctx", c->max_seq_len}, {"n_embd", c->n_embd}, {"n_layer", c->n_layer}, {"n_head", c->n_head},
            {"n_inner", c->n_inner}};
        add_ints(r, ints, sizeof ints / sizeof ints[0]);
        cJSON_AddNumberToObject(r, "layer_norm_epsilon", float_for_json(c->norm_eps));
        cJSON_AddStringToObject(r, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(r, "resid_pdrop", 0.0);
        cJSON_AddNumberToObject(r, "embd_pdrop", 0.0);
        cJSON_AddNumberToObject(r, "attn_pdrop", 0.0);
    } else {
        write_llama(r, c);
    }
    cJSON_AddBoolToObject(r, "tie_word_embeddings", c->tie_word_embeddings);
    add_token(r, "bos_token_id", c->bos_token_id);
    add_token(r, "eos_token_id", c->eos_token_id);
    cJSON_AddStringToObject(r, "torch_dtype", "float32");
    cJSON_AddStringToObject(r, "dtype", "float32");
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    if (!s) sl_errorf("out of memory writing config.json");
    return s;
}
