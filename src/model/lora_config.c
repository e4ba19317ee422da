// lora_config.c: PEFT's LoraConfig as shardlm reads and writes it (the train config's "lora" block,
// adapter_config.json). What shardlm computes (r, lora_alpha, lora_dropout, target_modules as a
// list, "all-linear" or a regular expression, use_rslora, use_dora, bias, layers_to_transform,
// exclude_modules, rank_pattern / alpha_pattern, modules_to_save, init_lora_weights) is read and
// range-checked; PEFT features that would change the maths and that shardlm does not compute (adapter
// biases, trainable tokens, ...) are refused by name when set; the rest (paths,
// versions, task type) is ignored.
#include "shardlm/lora.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void sl_lora_config_defaults(sl_lora_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->r = 8;
    cfg->lora_alpha = 8.0;
}

// A module name appended to a comma-joined list (target_modules' or exclude_modules', `field`).
static int append_name(char *list, const char *name, size_t len, const char *field, const char *where) {
    if (len == 0) return sl_errorf("%s: %s holds an empty name", where, field);
    if (len >= SL_LORA_NAME_MAX)
        return sl_errorf("%s: %s name '%.*s' is longer than %d characters", where, field, (int)len, name,
                         SL_LORA_NAME_MAX - 1);
    if (memchr(name, ',', len)) return sl_errorf("%s: %s name '%.*s' holds a comma", where, field, (int)len, name);
    size_t used = strlen(list);
    if (used + len + 2 > SL_LORA_TARGETS_MAX)
        return sl_errorf("%s: %s is longer than %d bytes; name the modules (q_proj, ...) instead of their paths",
                         where, field, SL_LORA_TARGETS_MAX);
    snprintf(list + used, SL_LORA_TARGETS_MAX - used, "%s%.*s", used ? "," : "", (int)len, name);
    return 0;
}

static int add_target(sl_lora_config *cfg, const char *name, size_t len, const char *where) {
    if (len == 10 && strncmp(name, "all-linear", 10) == 0) {
        cfg->all_linear = 1;
        return 0;
    }
    if (append_name(cfg->target_modules, name, len, "target_modules", where)) return -1;
    cfg->n_targets++;
    return 0;
}

int sl_lora_config_set_targets(sl_lora_config *cfg, const char *list, const char *where) {
    cfg->n_targets = 0;
    cfg->all_linear = 0;
    cfg->target_regex = 0;
    cfg->target_modules[0] = '\0';
    for (const char *p = list;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ')) p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (add_target(cfg, p, len, where)) return -1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

// A PEFT key whose non-empty value would change the maths: absent, null, false, "", {} or [] only.
static int refuse_if_set(const cJSON *obj, const char *key, const char *what, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child) return 0;
    if (cJSON_IsString(v) && v->valuestring[0] == '\0') return 0;
    return sl_errorf("%s: \"%s\" is set, but shardlm computes plain LoRA without %s (the adapter would give "
                     "other numbers here than in PEFT)", where, key, what);
}

// pattern compiled by PCRE2; NULL with PCRE2's reason ("... at offset N") in why.
static pcre2_code *compile_regex(const char *pattern, char *why, size_t cap) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        snprintf(why, cap, "%s at offset %zu", (const char *)msg, (size_t)at);
    }
    return re;
}

// One match of re against path from its start (options: PCRE2_ENDANCHORED too for a whole-path match):
// 1 (with group 1's integer in *group1 when asked and captured), 0, or -1 with the error.
static int match_regex(const pcre2_code *re, const char *path, uint32_t options, long *group1) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) return sl_errorf("out of memory matching a regular expression");
    int rc = pcre2_match(re, (PCRE2_SPTR)path, strlen(path), 0, PCRE2_ANCHORED | options, md, NULL);
    if (rc >= 2 && group1) *group1 = strtol(path + pcre2_get_ovector_pointer(md)[2], NULL, 10);
    pcre2_match_data_free(md);
    if (rc >= 0) return 1;
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return sl_errorf("matching a LoRA regular expression against '%s': PCRE2 %s", path, (const char *)msg);
}

// rank_pattern / alpha_pattern's keys, each compiled as "(.*\.)?(KEY)$" (PEFT's get_pattern_key).
typedef struct {
    int n;
    pcre2_code *re[];
} compiled_keys;

void sl_lora_keys_free(void *keys) {
    compiled_keys *k = keys;
    for (int i = 0; k && i < k->n; i++) pcre2_code_free(k->re[i]);
    free(k);
}

void *sl_lora_keys_compile(const sl_lora_pattern_map *map, const char *what) {
    compiled_keys *k = sl_calloc(1, sizeof *k + (size_t)(map->n + 1) * sizeof(pcre2_code *), "LoRA pattern keys");
    if (!k) return NULL;
    char regex[SL_LORA_TARGETS_MAX + 16], why[320];
    const char *key = map->keys;
    for (int i = 0; i < map->n; i++) {
        size_t len = strcspn(key, "\n");
        snprintf(regex, sizeof regex, "(.*\\.)?(%.*s)$", (int)len, key);
        if (!(k->re[i] = compile_regex(regex, why, sizeof why))) {
            sl_errorf("%s: the key '%.*s' is not a regular expression shardlm reads (PCRE2: %s)", what, (int)len, key,
                      why);
            sl_lora_keys_free(k);
            return NULL;
        }
        k->n++;
        key += len + 1;
    }
    return k;
}

int sl_lora_keys_find(const void *keys, const char *path, int from) {
    const compiled_keys *k = keys;
    for (int i = from; i < k->n; i++) {
        int m = match_regex(k->re[i], path, 0, NULL);
        if (m) return m < 0 ? -2 : i;
    }
    return -1;
}

void *sl_lora_target_regex(const char *pattern, const char *where) {
    char why[320];
    pcre2_code *re = compile_regex(pattern, why, sizeof why);
    if (!re)
        sl_errorf("%s: \"target_modules\" '%s' is not a regular expression shardlm reads (PCRE2: %s)", where, pattern,
                  why);
    return re;
}

void sl_lora_target_regex_free(void *re) { pcre2_code_free((pcre2_code *)re); }

// re.fullmatch: anchored at both ends (the engine backtracks for a match that ends at the end)
int sl_lora_target_regex_matches(const void *re, const char *path) {
    return match_regex((const pcre2_code *)re, path, PCRE2_ENDANCHORED, NULL);
}

// The block index PEFT (0.21) reads from a module's path for layers_to_transform: re.match of
// "(?:^|.*?\.)<pattern>\.(\d+)\." for each layers_pattern name in turn (the pattern may begin the path,
// as "transformer.h" does), ".*?\.[^.]*\.(\d+)\." without one: the first numbered segment either way;
// -1 when none matches (PEFT then does not adapt the module), -2 with the error on a PCRE2 failure.
int sl_lora_layer_index(const sl_lora_config *cfg, const char *path) {
    char names[SL_LORA_PATTERN_MAX + 1], regex[SL_LORA_PATTERN_MAX + 32], why[320];
    snprintf(names, sizeof names, "%s", cfg->layers_pattern[0] ? cfg->layers_pattern : "[^.]*");
    for (char *p = names; *p;) {
        size_t len = strcspn(p, ",");
        if (cfg->layers_pattern[0]) snprintf(regex, sizeof regex, "(?:^|.*?\\.)%.*s\\.(\\d+)\\.", (int)len, p);
        else snprintf(regex, sizeof regex, ".*?\\.%.*s\\.(\\d+)\\.", (int)len, p);
        p += len + (p[len] == ',');
        pcre2_code *re = compile_regex(regex, why, sizeof why);
        if (!re) {
            sl_errorf("lora: layers_pattern gives the regular expression '%s', which does not compile (PCRE2: %s)",
                      regex, why);
            return -2;
        }
        long index = -1;
        int m = match_regex(re, path, 0, &index);
        pcre2_code_free(re);
        if (m < 0) return -2;
        if (m > 0 && index >= 0) return index > 1000000 ? -1 : (int)index;
    }
    return -1;
}

static int parse_targets(sl_lora_config *cfg, const cJSON *v, const char *where) {
    cfg->n_targets = 0;
    cfg->all_linear = 0;
    cfg->target_regex = 0;
    cfg->target_modules[0] = '\0';
    if (cJSON_IsString(v)) {
        if (strcmp(v->valuestring, "all-linear") == 0) return add_target(cfg, "all-linear", 10, where);
        // PEFT: any other string is a regular expression that a module's whole path must match
        if (strlen(v->valuestring) >= sizeof cfg->target_modules)
            return sl_errorf("%s: \"target_modules\" is longer than %d bytes", where, SL_LORA_TARGETS_MAX - 1);
        void *re = sl_lora_target_regex(v->valuestring, where);
        if (!re) return -1;
        sl_lora_target_regex_free(re);
        snprintf(cfg->target_modules, sizeof cfg->target_modules, "%s", v->valuestring);
        cfg->target_regex = 1;
        return 0;
    }
    if (!cJSON_IsArray(v)) return sl_errorf("%s: \"target_modules\" must be a list of module names", where);
    // PEFT refuses an empty list (no module matches it); null or no key at all gives its defaults
    if (cJSON_GetArraySize(v) == 0)
        return sl_errorf("%s: \"target_modules\" is an empty list, which adapts no module (PEFT refuses it too); "
                         "leave the key out for PEFT's defaults (q_proj, v_proj / c_attn)", where);
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        if (!cJSON_IsString(item)) return sl_errorf("%s: \"target_modules\" must hold strings", where);
        // PEFT reads "all-linear" only as the whole value; in a list it is a name no module has
        if (strcmp(item->valuestring, "all-linear") == 0)
            return sl_errorf("%s: \"target_modules\" lists \"all-linear\", which PEFT reads only as the whole value "
                             "(\"target_modules\": \"all-linear\"), not as a list entry", where);
        if (add_target(cfg, item->valuestring, strlen(item->valuestring), where)) return -1;
    }
    return 0;
}

// exclude_modules: a list of names, or a string (a regular expression, checked to compile).
static int parse_exclude(sl_lora_config *cfg, const cJSON *obj, const char *where) {
    cfg->n_exclude = cfg->exclude_regex = 0;
    cfg->exclude_modules[0] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "exclude_modules");
    if (!v || cJSON_IsNull(v)) return 0;
    if (cJSON_IsString(v)) {
        if (v->valuestring[0] == '\0') return 0;  // PEFT: an empty string excludes nothing
        if (strlen(v->valuestring) >= sizeof cfg->exclude_modules)
            return sl_errorf("%s: \"exclude_modules\" is longer than %d bytes", where, SL_LORA_TARGETS_MAX - 1);
        char why[320];
        pcre2_code *re = compile_regex(v->valuestring, why, sizeof why);
        if (!re)
            return sl_errorf("%s: \"exclude_modules\" '%s' is not a regular expression shardlm reads (PCRE2: %s)",
                             where, v->valuestring, why);
        pcre2_code_free(re);
        snprintf(cfg->exclude_modules, sizeof cfg->exclude_modules, "%s", v->valuestring);
        cfg->exclude_regex = 1;
        return 0;
    }
    if (!cJSON_IsArray(v))
        return sl_errorf("%s: \"exclude_modules\" must be a list of module names or a string", where);
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        if (!cJSON_IsString(item)) return sl_errorf("%s: \"exclude_modules\" must hold strings", where);
        if (append_name(cfg->exclude_modules, item->valuestring, strlen(item->valuestring), "exclude_modules", where))
            return -1;
        cfg->n_exclude++;
    }
    return 0;
}

// modules_to_save: a list of names (null or [] for none).
static int parse_modules_to_save(sl_lora_config *cfg, const cJSON *obj, const char *where) {
    cfg->n_modules_to_save = 0;
    cfg->modules_to_save[0] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "modules_to_save");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsArray(v)) return sl_errorf("%s: \"modules_to_save\" must be a list of module names", where);
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        if (!cJSON_IsString(item)) return sl_errorf("%s: \"modules_to_save\" must hold strings", where);
        if (sl_lora_config_add_module_to_save(cfg, item->valuestring, where)) return -1;
    }
    return 0;
}

int sl_lora_config_set_modules_to_save(sl_lora_config *cfg, const char *list, const char *where) {
    cfg->n_modules_to_save = 0;
    cfg->modules_to_save[0] = '\0';
    for (const char *p = list; *p;) {  // empty items between commas are skipped
        size_t len = strcspn(p, ",");
        if (len && append_name(cfg->modules_to_save, p, len, "modules_to_save", where)) return -1;
        cfg->n_modules_to_save += len > 0;
        p += len + (p[len] == ',');
    }
    return 0;
}

int sl_lora_config_add_module_to_save(sl_lora_config *cfg, const char *name, const char *where) {
    if (append_name(cfg->modules_to_save, name, strlen(name), "modules_to_save", where)) return -1;
    cfg->n_modules_to_save++;
    return 0;
}

// A list of distinct token ids (non-negative integers) into cfg's token_indices.
static int parse_token_list(sl_lora_config *cfg, const cJSON *list, const char *where) {
    if (!cJSON_IsArray(list))
        return sl_errorf("%s: \"trainable_token_indices\" must be a list of token ids or an object of one module "
                         "name to such a list", where);
    const cJSON *item;
    cJSON_ArrayForEach(item, list) {
        double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
        if (!(v >= 0 && v <= 2147483647.0 && v == (double)(int)v))
            return sl_errorf("%s: \"trainable_token_indices\" holds something other than a token id (a non-negative "
                             "integer)", where);
        if (cfg->n_token_indices == SL_LORA_TOKENS_MAX)
            return sl_errorf("%s: \"trainable_token_indices\" holds more than %d tokens", where, SL_LORA_TOKENS_MAX);
        for (int i = 0; i < cfg->n_token_indices; i++)
            if (cfg->token_indices[i] == (int)v)
                return sl_errorf("%s: \"trainable_token_indices\" names token %d twice", where, (int)v);
        cfg->token_indices[cfg->n_token_indices++] = (int)v;
    }
    return 0;
}

int sl_lora_config_set_tokens(sl_lora_config *cfg, const char *list, const char *where) {
    char json[SL_LORA_TARGETS_MAX + 2];
    if (strlen(list) >= SL_LORA_TARGETS_MAX) return sl_errorf("%s: too long", where);
    snprintf(json, sizeof json, "[%s]", list);
    cJSON *ids = cJSON_ParseWithOpts(json, NULL, 1);  // nothing after the list ("5],6" is not [5])
    cfg->n_token_indices = 0;
    cfg->token_module[0] = '\0';
    int rc = ids ? parse_token_list(cfg, ids, where) : sl_errorf("%s: expected token ids separated by commas, got '%s'",
                                                                 where, list);
    cJSON_Delete(ids);
    return rc;
}

// trainable_token_indices: a list of token ids (the embedding's), or an object of one module name to one.
static int parse_token_indices(sl_lora_config *cfg, const cJSON *obj, const char *where) {
    cfg->n_token_indices = 0;
    cfg->token_module[0] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "trainable_token_indices");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v)) return parse_token_list(cfg, v, where);
    if (!v->child) return 0;
    if (v->child->next)
        return sl_errorf("%s: \"trainable_token_indices\" names several modules; shardlm trains tokens of the "
                         "embedding only (one key)", where);
    if (!v->child->string[0] || strlen(v->child->string) >= sizeof cfg->token_module || strchr(v->child->string, ','))
        return sl_errorf("%s: \"trainable_token_indices\" key '%s' is not a module name shardlm reads", where,
                         v->child->string);
    snprintf(cfg->token_module, sizeof cfg->token_module, "%s", v->child->string);
    if (parse_token_list(cfg, v->child, where)) return -1;
    if (!cfg->n_token_indices) cfg->token_module[0] = '\0';  // {"embed_tokens": []}: no tokens, as null
    return 0;
}

// rank_pattern (integer ranks > 0) or alpha_pattern (finite numbers): an object of keys to values, in
// the file's order; every key must compile.
static int parse_pattern_map(sl_lora_pattern_map *m, const cJSON *obj, const char *field, int ranks,
                             const char *where) {
    m->n = 0;
    m->keys[0] = '\0';
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v))
        return sl_errorf("%s: \"%s\" must be an object of module names (or patterns) to %s", where, field,
                         ranks ? "ranks" : "alphas");
    size_t used = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, v) {
        double x = cJSON_IsNumber(item) ? item->valuedouble : NAN;
        if (!isfinite(x) || (ranks && (x != floor(x) || x < 1 || x > 1e6)))
            return sl_errorf("%s: \"%s\" gives '%s' %s, expected %s", where, field, item->string,
                             cJSON_IsNumber(item) ? "a value out of range" : "something other than a number",
                             ranks ? "a positive integer rank" : "a finite lora_alpha");
        size_t len = strlen(item->string);
        if (strchr(item->string, '\n')) return sl_errorf("%s: a \"%s\" key holds a newline", where, field);
        if (m->n == SL_LORA_KEYS_MAX || used + len + 2 > sizeof m->keys)
            return sl_errorf("%s: \"%s\" holds more than %d keys or %d bytes of them", where, field,
                             SL_LORA_KEYS_MAX, SL_LORA_TARGETS_MAX - 1);
        memcpy(m->keys + used, item->string, len);
        m->keys[used + len] = '\n';
        used += len + 1;
        m->keys[used] = '\0';
        m->value[m->n++] = x;
    }
    char what[320];
    snprintf(what, sizeof what, "%s: \"%s\"", where, field);
    void *keys = sl_lora_keys_compile(m, what);
    sl_lora_keys_free(keys);
    return keys ? 0 : -1;
}

// layers_to_transform (an integer or a list of them) and layers_pattern (a string or a list of them), with
// PEFT's LoraConfig checks: neither with target_modules as a string, no pattern without layers.
static int parse_layers(sl_lora_config *cfg, const cJSON *obj, const char *where) {
    cfg->n_layers = 0;
    cfg->layers_pattern[0] = '\0';
    cfg->layers_pattern_list = 0;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(obj, "layers_to_transform");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(obj, "layers_pattern");
    if (lt && cJSON_IsNull(lt)) lt = NULL;
    if (lp && cJSON_IsNull(lp)) lp = NULL;
    if (lt) {
        const cJSON *item = cJSON_IsArray(lt) ? lt->child : lt;
        for (; item; item = cJSON_IsArray(lt) ? item->next : NULL) {
            if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble) || item->valuedouble < 0 ||
                item->valuedouble > 1e6)
                return sl_errorf("%s: \"layers_to_transform\" must be a block index or a list of them", where);
            if (cfg->n_layers == SL_LORA_LAYERS_MAX)
                return sl_errorf("%s: \"layers_to_transform\" lists more than %d blocks", where, SL_LORA_LAYERS_MAX);
            cfg->layers_to_transform[cfg->n_layers++] = (int)item->valuedouble;
        }
    }
    if (lp) {
        const cJSON *item = cJSON_IsArray(lp) ? lp->child : lp;
        cfg->layers_pattern_list = cJSON_IsArray(lp);
        size_t used = 0;
        for (; item; item = cJSON_IsArray(lp) ? item->next : NULL) {
            if (!cJSON_IsString(item) || strchr(item->valuestring, ','))
                return sl_errorf("%s: \"layers_pattern\" must be a name or a list of names", where);
            int n = snprintf(cfg->layers_pattern + used, sizeof cfg->layers_pattern - used, "%s%s", used ? "," : "",
                             item->valuestring);
            if (n < 0 || (size_t)n >= sizeof cfg->layers_pattern - used)
                return sl_errorf("%s: \"layers_pattern\" is longer than %d bytes", where, SL_LORA_PATTERN_MAX - 1);
            used += (size_t)n;
        }
    }
    if ((cfg->target_regex || cfg->all_linear) && (cfg->n_layers || cfg->layers_pattern[0]))
        return sl_errorf("%s: \"layers_to_transform\" / \"layers_pattern\" cannot be used with target_modules "
                         "given as a string (\"all-linear\" or a regular expression), as in PEFT: list the modules",
                         where);
    if (cfg->layers_pattern[0] && !cfg->n_layers)
        return sl_errorf("%s: \"layers_pattern\" is set without \"layers_to_transform\" (as PEFT, shardlm needs "
                         "both)", where);
    return 0;
}

int sl_lora_config_parse(sl_lora_config *cfg, const cJSON *obj, const char *where) {
    if (!cJSON_IsObject(obj)) return sl_errorf("%s: expected a JSON object of LoRA settings", where);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(obj, "peft_type");
    if (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "LORA") == 0))
        return sl_errorf("%s: \"peft_type\" must be \"LORA\" (the only adapter type shardlm computes)", where);
    if (sl_json_get_int(obj, "r", &cfg->r, 0, 1, where)) return -1;
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(obj, "lora_alpha");
    if (alpha && !cJSON_IsNull(alpha)) {
        if (!cJSON_IsNumber(alpha)) return sl_errorf("%s: \"lora_alpha\" must be a number", where);
        cfg->lora_alpha = alpha->valuedouble;
    }
    if (sl_json_get_float(obj, "lora_dropout", &cfg->lora_dropout, where) ||
        sl_json_get_bool(obj, "use_rslora", &cfg->use_rslora, where) ||
        sl_json_get_bool(obj, "use_dora", &cfg->use_dora, where) ||
        sl_json_get_bool(obj, "lora_bias", &cfg->lora_bias, where))
        return -1;
    char bias[32] = "none";
    if (sl_json_get_string(obj, "bias", bias, sizeof bias, where)) return -1;
    if (sl_lora_bias_parse(cfg, bias, where)) return -1;
    const cJSON *targets = cJSON_GetObjectItemCaseSensitive(obj, "target_modules");
    if (targets && !cJSON_IsNull(targets) && parse_targets(cfg, targets, where)) return -1;
    // PEFT LoraConfig keys for LoRA variants shardlm does not compute. aLoRA keeps the base model's output
    // before the invocation tokens: ignored, every token would be adapted (and merged, which PEFT refuses).
    static const struct { const char *key, *what; } refused[] = {
        {"use_qalora", "QALoRA"}, {"layer_replication", "layer replication"},
        {"target_parameters", "adapters on parameters"},
        {"alora_invocation_tokens", "activated LoRA (aLoRA: adapting only from the invocation tokens on)"},
        {"arrow_config", "Arrow routing"}, {"use_bdlora", "block-diagonal LoRA"},
        {"monteclora_config", "MonteCLoRA"}, {"velora_config", "VeLoRA"}, {"kasa_config", "KaSA"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (refuse_if_set(obj, refused[i].key, refused[i].what, where)) return -1;
    if (parse_layers(cfg, obj, where) || parse_exclude(cfg, obj, where) || parse_modules_to_save(cfg, obj, where) ||
        parse_token_indices(cfg, obj, where) ||
        parse_pattern_map(&cfg->rank_pattern, obj, "rank_pattern", 1, where) ||
        parse_pattern_map(&cfg->alpha_pattern, obj, "alpha_pattern", 0, where))
        return -1;
    const cJSON *init = cJSON_GetObjectItemCaseSensitive(obj, "init_lora_weights");
    if (init && !cJSON_IsNull(init)) {
        const char *v = cJSON_IsTrue(init)     ? "true"
                        : cJSON_IsFalse(init)  ? "false"
                        : cJSON_IsString(init) ? init->valuestring
                                               : "(not a string)";
        if (sl_lora_init_parse(cfg, v, where)) return -1;
    }
    return sl_lora_config_check(cfg, where);
}

const char *sl_lora_bias_name(int bias) {
    return bias == SL_LORA_BIAS_ALL ? "all" : bias == SL_LORA_BIAS_LORA_ONLY ? "lora_only" : "none";
}

int sl_lora_pattern_map_equal(const sl_lora_pattern_map *a, const sl_lora_pattern_map *b) {
    if (a->n != b->n || strcmp(a->keys, b->keys) != 0) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->value[i] != b->value[i]) return 0;
    return 1;
}

int sl_lora_init_parse(sl_lora_config *cfg, const char *value, const char *where) {
    if (strcmp(value, "true") == 0) cfg->init_lora_weights = SL_LORA_INIT_DEFAULT;
    else if (strcmp(value, "false") == 0) cfg->init_lora_weights = SL_LORA_INIT_NONE;
    else if (strcasecmp(value, "gaussian") == 0) cfg->init_lora_weights = SL_LORA_INIT_GAUSSIAN;  // PEFT: .lower()
    else
        return sl_errorf("%s: \"init_lora_weights\" '%s': shardlm computes true, false and \"gaussian\" (not PiSSA, "
                         "OLoRA, LoftQ, EVA, CorDA, ...)", where, value);
    return 0;
}

int sl_lora_bias_parse(sl_lora_config *cfg, const char *value, const char *where) {
    if (!strcmp(value, "none")) cfg->bias = SL_LORA_BIAS_NONE;
    else if (!strcmp(value, "all")) cfg->bias = SL_LORA_BIAS_ALL;
    else if (!strcmp(value, "lora_only")) cfg->bias = SL_LORA_BIAS_LORA_ONLY;
    else return sl_errorf("%s: \"bias\" is \"%s\"; expected \"none\", \"all\" or \"lora_only\" (PEFT's)", where, value);
    return 0;
}

int sl_lora_config_check(const sl_lora_config *cfg, const char *where) {
    if (cfg->r <= 0) return sl_errorf("%s: LoRA rank r must be a positive integer, found %d", where, cfg->r);
    if (cfg->bias != SL_LORA_BIAS_NONE && cfg->use_dora)  // DoRA's bias gradient is the unscaled output's
        return sl_errorf("%s: \"bias\" \"%s\" with use_dora: shardlm trains DoRA with frozen biases only", where,
                         sl_lora_bias_name(cfg->bias));
    if (cfg->lora_bias && cfg->use_dora)  // PEFT's LoraConfig refuses the pair too
        return sl_errorf("%s: lora_bias with use_dora: PEFT does not support lora_bias for DoRA, nor does shardlm",
                         where);
    if (cfg->lora_bias && cfg->init_lora_weights == SL_LORA_INIT_GAUSSIAN)  // as PEFT's LoraConfig
        return sl_errorf("%s: lora_bias is supported with init_lora_weights true or false (as in PEFT), not "
                         "\"gaussian\"", where);
    if (!isfinite(cfg->lora_alpha)) return sl_errorf("%s: lora_alpha must be a finite number", where);
    if (!(cfg->lora_dropout >= 0.0f && cfg->lora_dropout < 1.0f))
        return sl_errorf("%s: lora_dropout must be in [0, 1), found %g", where, (double)cfg->lora_dropout);
    return 0;
}

// A JSON list of the names of a comma-joined string: target_modules' (each under SL_LORA_NAME_MAX) or
// layers_pattern's (under SL_LORA_PATTERN_MAX). NULL when out of memory.
static cJSON *name_list(const char *joined) {
    cJSON *list = cJSON_CreateArray();
    char name[SL_LORA_PATTERN_MAX > SL_LORA_NAME_MAX ? SL_LORA_PATTERN_MAX : SL_LORA_NAME_MAX];
    for (const char *p = joined; list && *p;) {
        size_t len = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        cJSON_AddItemToArray(list, cJSON_CreateString(name));
        p += len + (p[len] == ',');
    }
    return list;
}

int sl_lora_config_to_json(const sl_lora_config *cfg, cJSON *obj) {
    // no targets: null, PEFT's None (the architecture's defaults), never the empty list PEFT refuses
    cJSON *targets = cfg->all_linear          ? cJSON_CreateString("all-linear")
                     : cfg->target_regex      ? cJSON_CreateString(cfg->target_modules)
                     : cfg->target_modules[0] ? name_list(cfg->target_modules)
                                              : cJSON_CreateNull();
    if (!targets || !cJSON_AddStringToObject(obj, "peft_type", "LORA") ||
        !cJSON_AddStringToObject(obj, "task_type", "CAUSAL_LM") || !cJSON_AddNumberToObject(obj, "r", cfg->r) ||
        !cJSON_AddNumberToObject(obj, "lora_alpha", cfg->lora_alpha) ||
        !cJSON_AddNumberToObject(obj, "lora_dropout", cfg->lora_dropout) ||
        !cJSON_AddBoolToObject(obj, "use_rslora", cfg->use_rslora) ||
        !cJSON_AddBoolToObject(obj, "use_dora", cfg->use_dora) ||
        !cJSON_AddBoolToObject(obj, "lora_bias", cfg->lora_bias) ||
        !cJSON_AddStringToObject(obj, "bias", sl_lora_bias_name(cfg->bias)) ||
        !cJSON_AddBoolToObject(obj, "inference_mode", 1) ||
        !(cfg->init_lora_weights == SL_LORA_INIT_GAUSSIAN
              ? cJSON_AddStringToObject(obj, "init_lora_weights", "gaussian")
              : cJSON_AddBoolToObject(obj, "init_lora_weights", cfg->init_lora_weights == SL_LORA_INIT_DEFAULT))) {
        cJSON_Delete(targets);
        return sl_errorf("out of memory writing adapter_config.json");
    }
    cJSON_AddItemToObject(obj, "target_modules", targets);
    if (cfg->n_layers) {
        cJSON *layers = cJSON_AddArrayToObject(obj, "layers_to_transform");
        for (int i = 0; layers && i < cfg->n_layers; i++)
            cJSON_AddItemToArray(layers, cJSON_CreateNumber(cfg->layers_to_transform[i]));
        if (!layers) return sl_errorf("out of memory writing adapter_config.json");
    }
    if (cfg->layers_pattern[0]) {
        cJSON *pattern = cfg->layers_pattern_list ? name_list(cfg->layers_pattern)
                                                  : cJSON_CreateString(cfg->layers_pattern);
        if (!pattern) return sl_errorf("out of memory writing adapter_config.json");
        cJSON_AddItemToObject(obj, "layers_pattern", pattern);
    }
    if (cfg->exclude_modules[0]) {
        cJSON *ex = cfg->exclude_regex ? cJSON_CreateString(cfg->exclude_modules) : name_list(cfg->exclude_modules);
        if (!ex) return sl_errorf("out of memory writing adapter_config.json");
        cJSON_AddItemToObject(obj, "exclude_modules", ex);
    }
    if (cfg->n_token_indices) {  // written in the form it was read
        cJSON *ids = cJSON_CreateIntArray(cfg->token_indices, cfg->n_token_indices), *tokens = ids;
        if (ids && cfg->token_module[0] && (tokens = cJSON_CreateObject()))
            cJSON_AddItemToObject(tokens, cfg->token_module, ids);
        else if (!tokens)
            cJSON_Delete(ids);
        if (!ids || !tokens) return sl_errorf("out of memory writing adapter_config.json");
        cJSON_AddItemToObject(obj, "trainable_token_indices", tokens);
    }
    if (cfg->n_modules_to_save) {
        cJSON *saved = name_list(cfg->modules_to_save);
        if (!saved) return sl_errorf("out of memory writing adapter_config.json");
        cJSON_AddItemToObject(obj, "modules_to_save", saved);
    }
    const sl_lora_pattern_map *maps[2] = {&cfg->rank_pattern, &cfg->alpha_pattern};
    for (int i = 0; i < 2; i++) {  // written as PEFT writes them: {} when empty
        cJSON *map = cJSON_AddObjectToObject(obj, i ? "alpha_pattern" : "rank_pattern");
        char key[SL_LORA_TARGETS_MAX];
        const char *k = maps[i]->keys;
        for (int j = 0; map && j < maps[i]->n; j++) {
            size_t len = strcspn(k, "\n");
            snprintf(key, sizeof key, "%.*s", (int)len, k);
            k += len + 1;
            if (!cJSON_AddNumberToObject(map, key, maps[i]->value[j])) map = NULL;
        }
        if (!map) return sl_errorf("out of memory writing adapter_config.json");
    }
    return 0;
}
