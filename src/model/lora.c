// lora.c: LoRA adapters (lora.h): which linears a PEFT target list (or regular expression) adapts,
// the adapters' flat layer-major buffer and its offsets table (PEFT names), PEFT's initialisation,
// and the adapters' forward and backward through the ops table (lora_forward / lora_backward, dropout).
// Invariants: tensors are in buffer order without gaps, block l's adapters (A then B of each
// module, modules in the model's order) lie in unit 1 + l; the activations planned for N rows hold
// each adapter's A output (and dropped input) from its forward until the backward.
#include "shardlm/lora.h"
#include "model/lora_dora.h"
#include "model/lora_embed.h"
#include "model/lora_saved.h"
#include "shardlm/error.h"
#include "shardlm/precision.h"
#include "shardlm/rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// One adaptable linear of a block: its module path after the block's prefix, the fused GEMM it is
// part of, and where its output columns start.
typedef struct {
    const char *name;
    sl_linear_kind linear;
    int col0, out, in;
} module_slot;

// The block's adaptable linears in the model's order; returns their count (at most 7).
static int block_modules(const sl_model_config *c, module_slot *s) {
    int C = c->n_embd, F = c->n_inner, A = sl_config_attn_width(c), KV = c->n_kv_head * sl_config_head_dim(c);
    if (c->arch == SL_ARCH_GPT2) {
        s[0] = (module_slot){"attn.c_attn", SL_LINEAR_QKV, 0, 3 * C, C};
        s[1] = (module_slot){"attn.c_proj", SL_LINEAR_ATTN_OUT, 0, C, C};
        s[2] = (module_slot){"mlp.c_fc", SL_LINEAR_MLP_UP, 0, F, C};
        s[3] = (module_slot){"mlp.c_proj", SL_LINEAR_MLP_DOWN, 0, C, F};
        return 4;
    }
    s[0] = (module_slot){"self_attn.q_proj", SL_LINEAR_QKV, 0, A, C};
    s[1] = (module_slot){"self_attn.k_proj", SL_LINEAR_QKV, A, KV, C};
    s[2] = (module_slot){"self_attn.v_proj", SL_LINEAR_QKV, A + KV, KV, C};
    s[3] = (module_slot){"self_attn.o_proj", SL_LINEAR_ATTN_OUT, 0, C, A};
    s[4] = (module_slot){"mlp.gate_proj", SL_LINEAR_MLP_UP, 0, F, C};
    s[5] = (module_slot){"mlp.up_proj", SL_LINEAR_MLP_UP, F, F, C};
    s[6] = (module_slot){"mlp.down_proj", SL_LINEAR_MLP_DOWN, 0, C, F};
    return 7;
}

#define HEAD_MODULE "lm_head"  // the LM head's module path, PEFT's target name for it

// The embedding's module path (PEFT's Embedding LoRA: target "wte" / "embed_tokens").
static const char *embed_module(const sl_model_config *c) {
    return c->arch == SL_ARCH_GPT2 ? "transformer.wte" : "model.embed_tokens";
}

static const char *block_prefix(const sl_model_config *c) {
    return c->arch == SL_ARCH_GPT2 ? "transformer.h.%d." : "model.layers.%d.";
}

void sl_lora_list_modules(const sl_model_config *c, char *buf, size_t cap) {
    module_slot s[8];
    int n = block_modules(c, s);
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", s[i].name);
}

// PEFT's rule: a module matches a target it equals or ends with after a '.'.
static int name_matches(const char *path, const char *target) {
    size_t lp = strlen(path), lt = strlen(target);
    if (lp == lt) return strcmp(path, target) == 0;
    return lp > lt && path[lp - lt - 1] == '.' && strcmp(path + lp - lt, target) == 0;
}

// The Hugging Face model's modules other than the blocks' adaptable linears, as named_modules() lists
// them ("%d": each block). PEFT matches a target_modules regular expression against every module: one
// that matched these would adapt the head or the embeddings, or be refused by PEFT (norms, activations,
// dropout, containers); shardlm adapts only the blocks' linears, so it refuses such a pattern.
static const char *const other_modules_gpt2[] = {
    "", "transformer", "transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h", "transformer.h.%d",
    "transformer.h.%d.ln_1", "transformer.h.%d.attn", "transformer.h.%d.attn.attn_dropout",
    "transformer.h.%d.attn.resid_dropout", "transformer.h.%d.ln_2", "transformer.h.%d.mlp", "transformer.h.%d.mlp.act",
    "transformer.h.%d.mlp.dropout", "transformer.ln_f", "lm_head", NULL};
static const char *const other_modules_llama[] = {
    "", "model", "model.embed_tokens", "model.layers", "model.layers.%d", "model.layers.%d.self_attn",
    "model.layers.%d.mlp", "model.layers.%d.mlp.act_fn", "model.layers.%d.input_layernorm",
    "model.layers.%d.post_attention_layernorm", "model.norm", "model.rotary_emb", "lm_head", NULL};

// exclude_modules (cfg), with its regular expression compiled (re) when it is one.
typedef struct {
    const sl_lora_config *cfg;
    void *re;
} exclusion;

// PEFT's rule: a module is excluded when its whole path matches the expression, or when it equals or
// ends with (after a '.') a listed name. 1 / 0; -1 with the error.
static int excluded(const exclusion *ex, const char *path) {
    if (ex->cfg->exclude_regex) return sl_lora_target_regex_matches(ex->re, path);
    char name[SL_LORA_NAME_MAX];
    for (const char *p = ex->cfg->exclude_modules; *p;) {
        size_t len = strcspn(p, ",");
        snprintf(name, sizeof name, "%.*s", (int)len, p);
        if (name_matches(path, name)) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

// The first module outside the blocks' linears (other_modules_*) for which pick(ctx, path) holds, into
// path: 1, 0 when none, -1 with the error.
static int find_other_module(const sl_model_config *mc, int (*pick)(const void *ctx, const char *path),
                             const void *ctx, char *path, size_t cap) {
    const char *const *other = mc->arch == SL_ARCH_GPT2 ? other_modules_gpt2 : other_modules_llama;
    for (int k = 0; other[k]; k++)
        for (int l = 0; l < (strstr(other[k], "%d") ? mc->n_layer : 1); l++) {
            snprintf(path, cap, other[k], l);
            int m = pick(ctx, path);
            if (m) return m;
        }
    return 0;
}

// What besides the blocks' linears is adapted: bit 0 the LM head (an untied one), bit 1 the embedding.
enum { PICK_HEAD = 1, PICK_EMBED = 2 };

typedef struct {
    void *target;
    const exclusion *ex;
    int head;  // PICK_* bits: those modules are adapted, so not among the "other" ones
    const char *embed;  // the embedding's path
} regex_pick;

// A module the target expression matches and exclude_modules does not exclude.
static int picked_by_regex(const void *ctx, const char *path) {
    const regex_pick *p = ctx;
    if (((p->head & PICK_HEAD) && strcmp(path, HEAD_MODULE) == 0) ||
        ((p->head & PICK_EMBED) && strcmp(path, p->embed) == 0))
        return 0;
    int m = sl_lora_target_regex_matches(p->target, path);
    int e = m > 0 ? excluded(p->ex, path) : 0;
    return m < 0 || e < 0 ? -1 : m && !e;
}

static int excluded_pick(const void *ctx, const char *path) { return excluded(ctx, path); }

// masks from target_modules as a regular expression (cfg->target_regex): a linear is adapted when its
// whole path matches (PEFT's re.fullmatch). An error when it matches no linear, or another module
// that exclude_modules does not exclude.
static int regex_slots(const sl_model_config *mc, const sl_lora_config *cfg, const exclusion *ex,
                       const module_slot *s, int n, unsigned *masks, int head) {
    void *re = sl_lora_target_regex(cfg->target_modules, "lora");
    if (!re) return -1;
    char prefix[32], path[SL_LORA_NAME_MAX + 32];
    int rc = 0, hit = 0;
    for (int l = 0; l < mc->n_layer && rc == 0; l++) {
        masks[l] = 0;
        snprintf(prefix, sizeof prefix, block_prefix(mc), l);
        for (int i = 0; i < n && rc == 0; i++) {
            snprintf(path, sizeof path, "%s%s", prefix, s[i].name);
            int m = sl_lora_target_regex_matches(re, path);
            if (m < 0) rc = -1;
            if (m > 0) masks[l] |= 1u << i, hit = 1;
        }
    }
    regex_pick pick = {re, ex, head, embed_module(mc)};
    int other = rc ? 0 : find_other_module(mc, picked_by_regex, &pick, path, sizeof path);
    if (other < 0) rc = -1;
    if (other > 0)
        rc = sl_errorf("lora: target_modules '%s' (a regular expression) also matches the module '%s', "
                       "which is not one of the blocks' linears (PEFT would adapt or refuse it; shardlm "
                       "adapts only those linears)", cfg->target_modules, path);
    if (rc == 0 && !hit && !head) {
        snprintf(prefix, sizeof prefix, block_prefix(mc), 0);
        rc = sl_errorf("lora: target_modules '%s' (a regular expression, matched against whole module paths such as "
                       "'%s%s') matches no linear of this %s model's blocks", cfg->target_modules, prefix, s[0].name,
                       mc->arch == SL_ARCH_GPT2 ? "gpt2" : "llama");
    }
    sl_lora_target_regex_free(re);
    return rc;
}

// Whether PEFT's layers_to_transform lets a module matched by the end of its path be adapted: always
// without it; else when the block index read from the path is listed (1 / 0; -1 with the error).
static int layer_allowed(const sl_lora_config *cfg, const char *path) {
    if (!cfg->n_layers) return 1;
    int idx = sl_lora_layer_index(cfg, path);
    if (idx == -2) return -1;
    for (int k = 0; idx >= 0 && k < cfg->n_layers; k++)
        if (cfg->layers_to_transform[k] == idx) return 1;
    return 0;
}

// exclude_modules takes its modules out of masks: an error when nothing is left (PEFT: "All modules
// were excluded"), a warning when it excludes no module of the model at all (PEFT warns too).
static int apply_exclude(const sl_model_config *mc, const exclusion *ex, const module_slot *s, int n,
                         unsigned *masks, int head) {
    if (!ex->cfg->exclude_modules[0]) return 0;
    char prefix[32], path[SL_LORA_NAME_MAX + 32];
    unsigned left = 0;
    int any = 0;
    for (int l = 0; l < mc->n_layer; l++) {
        snprintf(prefix, sizeof prefix, block_prefix(mc), l);
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s%s", prefix, s[i].name);
            int e = excluded(ex, path);
            if (e < 0) return -1;
            if (e) masks[l] &= ~(1u << i), any = 1;
        }
        left |= masks[l];
    }
    if (!left && !head)
        return sl_errorf("lora: exclude_modules '%s' excludes every module target_modules picks (PEFT: \"All modules "
                         "were excluded\")", ex->cfg->exclude_modules);
    if (!any && (any = find_other_module(mc, excluded_pick, ex, path, sizeof path)) < 0) return -1;
    if (!any) fprintf(stderr, "warning: lora: exclude_modules '%s' excludes no module of this model\n",
                      ex->cfg->exclude_modules);
    return 0;
}

// Which slots the target list (or "all-linear") picks in each block, checking every target names a
// linear of the model (in one of layers_to_transform's blocks, when given).
static int list_slots(const sl_model_config *mc, sl_lora_config *cfg, const module_slot *s, int n, unsigned *masks,
                      int head) {
    if (!cfg->all_linear && cfg->n_targets == 0) {  // PEFT's defaults for the architecture
        if (mc->arch == SL_ARCH_GPT2) sl_lora_config_set_targets(cfg, "c_attn", "lora");
        else sl_lora_config_set_targets(cfg, "q_proj,v_proj", "lora");
    }
    if (cfg->all_linear && cfg->n_layers)  // PEFT refuses it too (target_modules given as a string)
        return sl_errorf("lora: layers_to_transform cannot be used with \"all-linear\": list the modules");
    char prefix[32], path[SL_LORA_NAME_MAX + 32];
    for (int l = 0; l < mc->n_layer; l++) masks[l] = cfg->all_linear ? (1u << n) - 1 : 0;
    char target[SL_LORA_NAME_MAX];
    for (const char *p = cfg->target_modules; *p; p += strlen(target) + (p[strlen(target)] == ',')) {
        snprintf(target, sizeof target, "%.*s", (int)strcspn(p, ","), p);
        unsigned hit = 0;
        for (int l = 0; l < mc->n_layer; l++) {
            snprintf(prefix, sizeof prefix, block_prefix(mc), l);
            for (int i = 0; i < n; i++) {
                snprintf(path, sizeof path, "%s%s", prefix, s[i].name);
                if (!name_matches(path, target)) continue;
                // PEFT: a whole path listed is adapted wherever it is; a name it ends with, in the listed blocks
                int ok = strcmp(path, target) == 0 ? 1 : layer_allowed(cfg, path);
                if (ok < 0) return -1;
                if (ok) masks[l] |= 1u << i, hit = 1;
            }
        }
        if (!hit && !((head & PICK_HEAD) && strcmp(target, HEAD_MODULE) == 0) &&
            !((head & PICK_EMBED) && name_matches(embed_module(mc), target))) {
            char list[256], blocks[SL_LORA_PATTERN_MAX + 64] = "";
            sl_lora_list_modules(mc, list, sizeof list);
            if (cfg->n_layers)
                snprintf(blocks, sizeof blocks, " in layers_to_transform%s%s",
                         cfg->layers_pattern[0] ? " with layers_pattern " : "", cfg->layers_pattern);
            return sl_errorf("lora: target module '%s' matches no linear of this %s model's blocks%s (adaptable: %s%s)",
                             target, mc->arch == SL_ARCH_GPT2 ? "gpt2" : "llama", blocks, list,
                             cfg->n_layers ? "" : "; or \"all-linear\"");
        }
    }
    return 0;
}

// Whether target_modules picks a module outside the blocks (path): matched by the target expression, or
// listed by its whole path, or (by_suffix, without layers_to_transform) by a name the path ends with; not
// by "all-linear" (PEFT leaves those out), not when exclude_modules excludes it. 1 / 0, -1 with the error.
static int outside_picked(const sl_lora_config *cfg, const exclusion *ex, const char *path, int by_suffix) {
    int picked = 0;
    if (cfg->target_regex) {
        void *re = sl_lora_target_regex(cfg->target_modules, "lora");
        picked = re ? sl_lora_target_regex_matches(re, path) : -1;
        sl_lora_target_regex_free(re);
    } else if (!cfg->all_linear) {
        char target[SL_LORA_NAME_MAX];
        for (const char *p = cfg->target_modules; *p && !picked; p += strlen(target) + (p[strlen(target)] == ',')) {
            snprintf(target, sizeof target, "%.*s", (int)strcspn(p, ","), p);
            picked = strcmp(target, path) == 0 || (by_suffix && !cfg->n_layers && name_matches(path, target));
        }
    }
    int e = picked > 0 && ex->cfg->exclude_modules[0] ? excluded(ex, path) : 0;
    return picked < 0 || e < 0 ? -1 : picked && !e;
}

// Whether cfg adapts the LM head ("lm_head", as PEFT names it; PEFT adapts a listed whole path wherever
// it is, layers_to_transform aside). Only an untied head (its own weight) and without DoRA: 1 / 0, -1
// with the error.
static int head_picked(const sl_model_config *mc, const sl_lora_config *cfg, const exclusion *ex) {
    int picked = outside_picked(cfg, ex, HEAD_MODULE, 0);
    if (picked <= 0) return picked;
    if (mc->arch == SL_ARCH_GPT2 || mc->tie_word_embeddings)
        return sl_errorf("lora: target_modules picks lm_head, which on this model is the embedding matrix "
                         "(tie_word_embeddings); shardlm adapts an untied head only");
    if (cfg->use_dora) return sl_errorf("lora: DoRA (use_dora) on lm_head is not computed; leave lm_head out");
    return 1;
}

// Whether cfg adapts the embedding (PEFT's lora.Embedding; by a name its path ends with only without
// layers_to_transform: the embedding has no block index). Not with DoRA or lora_bias (PEFT refuses the
// latter for embeddings): 1 / 0, -1 with the error.
static int embed_picked(const sl_model_config *mc, const sl_lora_config *cfg, const exclusion *ex) {
    const char *path = embed_module(mc);
    int picked = outside_picked(cfg, ex, path, 1);
    if (picked <= 0) return picked;
    if (cfg->use_dora)
        return sl_errorf("lora: DoRA (use_dora) on the embedding (%s) is not computed; leave it out", path);
    if (cfg->lora_bias)
        return sl_errorf("lora: lora_bias with an adapter on the embedding (%s): PEFT does not support it for "
                         "embeddings, nor does shardlm", path);
    return 1;
}

// Which slots cfg adapts in each block (masks[l] bit i: slot i of block l): those target_modules picks
// that exclude_modules does not exclude; masks[n_layer] the PICK_* bits of the head and the embedding.
static int targeted_slots(const sl_model_config *mc, sl_lora_config *cfg, unsigned *masks) {
    module_slot s[8];
    int n = block_modules(mc, s);
    exclusion ex = {cfg, NULL};
    if (cfg->exclude_regex && !(ex.re = sl_lora_target_regex(cfg->exclude_modules, "lora: exclude_modules")))
        return -1;
    int head = head_picked(mc, cfg, &ex), embed = head < 0 ? 0 : embed_picked(mc, cfg, &ex);
    int rc = head < 0 || embed < 0;
    if (!rc) head = (head ? PICK_HEAD : 0) | (embed ? PICK_EMBED : 0);
    if (!rc) rc = cfg->target_regex ? regex_slots(mc, cfg, &ex, s, n, masks, head)
                                    : list_slots(mc, cfg, s, n, masks, head);
    if (rc == 0) rc = apply_exclude(mc, &ex, s, n, masks, head);
    masks[mc->n_layer] = rc ? 0 : (unsigned)head;  // PICK_HEAD: the head, "block n_layer"'s one slot; PICK_EMBED
    if (ex.re) sl_lora_target_regex_free(ex.re);
    return rc;
}

// A tensor of the table: (rows, cols), or (rows) with cols 0 (DoRA's magnitude, saved without ".weight").
static int add_tensor(sl_lora *lo, size_t *offset, int layer, int rows, int cols, const char *module,
                      const char *which) {
    sl_tensor_info *t = &lo->tensors[lo->n_tensors];
    memset(t, 0, sizeof *t);
    int len = snprintf(t->name, sizeof t->name, "base_model.model.%s.%s%s", module, which, cols ? ".weight" : "");
    if (len >= (int)sizeof t->name) return sl_errorf("lora: tensor name for %s is too long", module);
    t->offset = *offset;
    t->ndim = cols ? 2 : 1;
    t->shape[0] = t->hf_rows = rows;
    t->shape[1] = cols;
    t->numel = (size_t)rows * (size_t)(cols ? cols : 1);
    t->layer = layer;
    t->unit = layer + 1;
    t->weight_decay = 1;
    *offset += t->numel;
    return lo->n_tensors++;
}

// A module's value from a compiled rank_pattern / alpha_pattern (PEFT's get_pattern_key: the first key
// that matches), `fallback` when none does; NAN with the error on a matching failure.
static double pattern_value(const void *keys, const sl_lora_pattern_map *map, const char *path, double fallback) {
    int k = sl_lora_keys_find(keys, path, 0);
    return k == -2 ? NAN : k >= 0 ? map->value[k] : fallback;
}

// A warning naming the keys of a map that match no adapted module (PEFT warns and ignores them too).
static int warn_unmatched(const sl_lora *lo, const void *keys, const sl_lora_pattern_map *map, const char *field) {
    char *hit = sl_calloc((size_t)map->n + 1, 1, "LoRA pattern keys");
    if (!hit) return -1;
    for (int a = lo->embed_A >= 0 ? -1 : 0; a < lo->n_adapters; a++) {  // -1: the embedding's adapter
        const char *module = a < 0 ? lo->embed_module : lo->adapters[a].module;
        for (int k = sl_lora_keys_find(keys, module, 0); k != -1; k = sl_lora_keys_find(keys, module, k + 1)) {
            if (k == -2) { free(hit); return -1; }
            hit[k] = 1;
        }
    }
    const char *key = map->keys;
    for (int k = 0; k < map->n; key += strcspn(key, "\n") + 1, k++)
        if (!hit[k])
            fprintf(stderr, "warning: lora: %s key '%.*s' matches no adapted module; ignored\n", field,
                    (int)strcspn(key, "\n"), key);
    free(hit);
    return 0;
}

// Adapter of slot s in block `layer` (n_layer: the head), its module path prefix + s->name, with its
// A, B (and DoRA's magnitude) appended to the table at *offset.
static int add_adapter(sl_lora *lo, size_t *offset, int layer, const module_slot *s, const char *prefix,
                       const void *rank_keys, const void *alpha_keys) {
    const sl_lora_config *cfg = &lo->cfg;
    sl_lora_adapter *ad = &lo->adapters[lo->n_adapters++];
    ad->layer = layer;
    ad->linear = s->linear;
    ad->col0 = s->col0;
    ad->out_features = s->out;
    ad->in_features = s->in;
    snprintf(ad->module, sizeof ad->module, "%s%s", prefix, s->name);
    double r = pattern_value(rank_keys, &cfg->rank_pattern, ad->module, cfg->r);
    double alpha = pattern_value(alpha_keys, &cfg->alpha_pattern, ad->module, cfg->lora_alpha);
    if (isnan(r) || isnan(alpha)) return -1;
    ad->r = (int)r;
    ad->scale = (float)(cfg->use_rslora ? alpha / sqrt(r) : alpha / r);
    if ((ad->lora_A = add_tensor(lo, offset, layer, ad->r, s->in, ad->module, "lora_A")) < 0 ||
        (ad->lora_B = add_tensor(lo, offset, layer, s->out, ad->r, ad->module, "lora_B")) < 0)
        return -1;
    ad->lora_B_bias = -1;  // lora_bias: lora_B's bias, zero at first as PEFT's; not decayed (a bias, as the
    if (cfg->lora_bias) {  // Trainer's decay groups leave biases out)
        if ((ad->lora_B_bias = add_tensor(lo, offset, layer, s->out, 0, ad->module, "lora_B.bias")) < 0) return -1;
        lo->tensors[ad->lora_B_bias].weight_decay = 0;
    }
    ad->magnitude = -1;
    if (cfg->use_dora &&
        (ad->magnitude = add_tensor(lo, offset, layer, s->out, 0, ad->module, "lora_magnitude_vector")) < 0)
        return -1;
    return 0;
}

static int build_table(sl_lora *lo, const sl_param_layout *L, const unsigned *masks, const void *rank_keys,
                       const void *alpha_keys) {
    const sl_model_config *mc = &lo->model_cfg;
    module_slot s[8];
    int n = block_modules(mc, s), count = 0;
    for (int l = 0; l < mc->n_layer; l++)
        for (int i = 0; i < n; i++) count += (masks[l] >> i) & 1;
    count += masks[mc->n_layer] & PICK_HEAD;  // the head
    lo->head_copy = lo->tokens_delta = lo->tokens_base = lo->embed_A = lo->embed_B = -1;
    lo->saved_floor = mc->n_layer;
    lo->tensors = sl_calloc((size_t)(4 * count + lora_saved_max_tensors(mc)) + 3, sizeof *lo->tensors, "lora tensors");
    lo->saved = sl_calloc((size_t)lora_saved_max_tensors(mc), sizeof *lo->saved, "modules_to_save");
    lo->adapters = sl_calloc((size_t)count + 1, sizeof *lo->adapters, "lora adapters");
    lo->layer_first = sl_calloc((size_t)mc->n_layer + 2, sizeof(int), "lora adapters");
    lo->n_units = mc->n_layer + 2;
    lo->unit_begin = sl_calloc((size_t)lo->n_units + 1, sizeof(size_t), "lora units");
    lo->param_view = sl_calloc((size_t)lo->n_units, sizeof(float *), "lora views");
    lo->grad_view = sl_calloc((size_t)lo->n_units, sizeof(float *), "lora views");
    lo->weight_view = sl_calloc((size_t)lo->n_units, sizeof(sl_bf16 *), "lora views");
    if (!lo->tensors || !lo->saved || !lo->adapters || !lo->layer_first || !lo->unit_begin || !lo->param_view ||
        !lo->grad_view || !lo->weight_view)
        return -1;
    size_t offset = 0;
    if (lora_saved_add(lo, L, 0, &offset)) return -1;  // modules_to_save's copies of unit 0 (embeddings)
    if (masks[mc->n_layer] & PICK_EMBED) {  // LoRA on the embedding, in unit 0 too
        const char *path = embed_module(mc);
        double r = pattern_value(rank_keys, &lo->cfg.rank_pattern, path, lo->cfg.r);
        double alpha = pattern_value(alpha_keys, &lo->cfg.alpha_pattern, path, lo->cfg.lora_alpha);
        if (isnan(r) || isnan(alpha) ||
            lora_embed_add(lo, L, &offset, path, (int)r, (float)(lo->cfg.use_rslora ? alpha / sqrt(r) : alpha / r)))
            return -1;
    }
    for (int l = 0; l < mc->n_layer; l++) {
        lo->layer_first[l] = lo->n_adapters;
        lo->unit_begin[l + 1] = offset;
        char prefix[32];
        snprintf(prefix, sizeof prefix, block_prefix(mc), l);
        for (int i = 0; i < n; i++)
            if (((masks[l] >> i) & 1) && add_adapter(lo, &offset, l, &s[i], prefix, rank_keys, alpha_keys)) return -1;
        if (lora_saved_add(lo, L, l + 1, &offset)) return -1;
    }
    lo->layer_first[mc->n_layer] = lo->n_adapters;
    lo->unit_begin[mc->n_layer + 1] = offset;
    module_slot head = {HEAD_MODULE, SL_LINEAR_HEAD, 0, mc->vocab_size, mc->n_embd};  // its columns: the vocabulary
    if ((masks[mc->n_layer] & PICK_HEAD) && add_adapter(lo, &offset, mc->n_layer, &head, "", rank_keys, alpha_keys))
        return -1;
    lo->layer_first[mc->n_layer + 1] = lo->n_adapters;
    if (lora_saved_add(lo, L, mc->n_layer + 1, &offset)) return -1;  // the final norm's and the head's
    lo->unit_begin[mc->n_layer + 2] = offset;
    lo->total = offset;
    return 0;
}

int sl_lora_create(sl_lora *lo, const sl_model_config *mc, const sl_lora_config *cfg, const sl_ops *ops) {
    memset(lo, 0, sizeof *lo);
    lo->cfg = *cfg;
    lo->model_cfg = *mc;
    lo->ops = ops;
    unsigned *masks = sl_calloc((size_t)mc->n_layer + 1, sizeof(unsigned), "lora targets");
    void *rank_keys = masks ? sl_lora_keys_compile(&cfg->rank_pattern, "lora: rank_pattern") : NULL;
    void *alpha_keys = rank_keys ? sl_lora_keys_compile(&cfg->alpha_pattern, "lora: alpha_pattern") : NULL;
    sl_param_layout L;  // the model's tensors, for modules_to_save
    int have_layout = alpha_keys && sl_layout_build(&L, mc) == 0;
    int rc = !have_layout || sl_lora_config_check(cfg, "lora") || targeted_slots(mc, &lo->cfg, masks) ||
             build_table(lo, &L, masks, rank_keys, alpha_keys);
    if (have_layout) sl_layout_free(&L);
    // unused keys are worth a warning when the adapters are made, not when a memory estimate lists them
    if (!rc && ops) {
        rc = warn_unmatched(lo, rank_keys, &cfg->rank_pattern, "rank_pattern") ||
             warn_unmatched(lo, alpha_keys, &cfg->alpha_pattern, "alpha_pattern");
        lora_saved_warn_unmatched(lo);
    }
    sl_lora_keys_free(rank_keys);
    sl_lora_keys_free(alpha_keys);
    free(masks);
    if (rc) {
        sl_lora_free(lo);
        return -1;
    }
    if (!ops) return 0;  // the table only
    lo->capacity = lo->total;
    lo->params = ops->alloc((lo->total ? lo->total : 1) * sizeof(float), "lora parameters");
    if (!lo->params) { sl_lora_free(lo); return -1; }
    if (ops->act_bf16 && !(lo->weights_bf16 = ops->alloc((lo->total ? lo->total : 1) * sizeof(sl_bf16), "lora bf16"))) {
        sl_lora_free(lo);
        return -1;
    }
    sl_lora_bind_views(lo);
    return 0;
}

static void release(const sl_lora *lo, void *p) {
    if (p && lo->ops) lo->ops->dealloc(p);
}

void sl_lora_bind_views(sl_lora *lo) {
    for (int u = 0; u < lo->n_units; u++) {
        lo->param_view[u] = lo->params ? lo->params + lo->unit_begin[u] : NULL;
        lo->grad_view[u] = lo->grads ? lo->grads + lo->unit_begin[u] : NULL;
        lo->weight_view[u] = lo->weights_bf16 ? lo->weights_bf16 + lo->unit_begin[u] : NULL;
    }
}

static void free_acts(sl_lora *lo) {
    release(lo, lo->act_memory);
    free(lo->u);
    free(lo->xd);
    lo->act_memory = NULL;
    lo->u = lo->xd = NULL;
    lo->act_N = 0;
}

void sl_lora_free(sl_lora *lo) {
    free_acts(lo);
    lora_embed_free(lo);
    lora_dora_free(lo);
    release(lo, lo->params);
    release(lo, lo->grads);
    release(lo, lo->weights_bf16);
    free(lo->tensors);
    free(lo->saved);
    free(lo->saved_of);
    free(lo->token_slot);
    free(lo->head_base);
    free(lo->embed_base);
    release(lo, lo->tokens_weight);
    free(lo->adapters);
    free(lo->layer_first);
    free(lo->unit_begin);
    free(lo->param_view);
    free(lo->grad_view);
    free(lo->weight_view);
    memset(lo, 0, sizeof *lo);
}

int sl_lora_alloc_grads(sl_lora *lo) {
    if (lo->grads) return 0;
    lo->grads = lo->ops->alloc((lo->capacity ? lo->capacity : 1) * sizeof(float), "lora gradients");
    if (!lo->grads) return -1;
    sl_lora_bind_views(lo);
    return 0;
}

void sl_lora_zero_grad(sl_lora *lo) {
    if (lo->grads) lo->ops->memzero(lo->grads, lo->capacity * sizeof(float));
}

int sl_lora_init_weights(sl_lora *lo, uint64_t seed) {
    float *host = lo->ops->on_device ? sl_calloc(lo->total, sizeof(float), "lora initial weights") : lo->params;
    if (!host && lo->total) return -1;
    int mode = lo->cfg.init_lora_weights;
    for (int a = 0; a < lo->n_adapters; a++) {
        const sl_tensor_info *A = &lo->tensors[lo->adapters[a].lora_A], *B = &lo->tensors[lo->adapters[a].lora_B];
        // rank 1 of the key keeps these streams apart from the base model's (rank 0, same indices)
        sl_rng rng = sl_rng_make(seed, 1, (uint64_t)lo->adapters[a].lora_A, SL_RNG_INIT);
        if (mode == SL_LORA_INIT_GAUSSIAN) {
            float std = 1.0f / (float)lo->adapters[a].r;
            for (size_t j = 0; j < A->numel; j++) host[A->offset + j] = std * sl_rng_normal(&rng);
        } else {
            float bound = 1.0f / sqrtf((float)A->shape[1]);
            for (size_t j = 0; j < A->numel; j++) host[A->offset + j] = bound * (2.0f * sl_rng_uniform(&rng) - 1.0f);
        }
        const int bias = lo->adapters[a].lora_B_bias;  // lora_bias: zero, or nn.Linear's uniform with false
        const sl_tensor_info *b = bias >= 0 ? &lo->tensors[bias] : NULL;
        if (mode != SL_LORA_INIT_NONE) {
            memset(host + B->offset, 0, B->numel * sizeof(float));
            if (b) memset(host + b->offset, 0, b->numel * sizeof(float));
            continue;
        }
        sl_rng rng_b = sl_rng_make(seed, 1, (uint64_t)lo->adapters[a].lora_B, SL_RNG_INIT);
        float bound = 1.0f / sqrtf((float)B->shape[1]);  // nn.Linear(r, out)'s reset: fan_in r, for both
        for (size_t j = 0; j < B->numel; j++) host[B->offset + j] = bound * (2.0f * sl_rng_uniform(&rng_b) - 1.0f);
        for (size_t j = 0; b && j < b->numel; j++) host[b->offset + j] = bound * (2.0f * sl_rng_uniform(&rng_b) - 1.0f);
    }
    if (host != lo->params) {
        lo->ops->upload(lo->params, host, lo->total * sizeof(float));
        free(host);
    }
    lora_embed_init(lo, host, seed);
    lo->dora_init_pending = lo->cfg.use_dora;  // the magnitudes need the base (sl_lora_attached)
    lo->saved_init_pending = lo->n_saved > 0 || lo->tokens_delta >= 0;  // so do the copies and trained tokens
    return sl_lora_params_changed(lo);
}

int sl_lora_params_changed(sl_lora *lo) {
    lo->version++;
    if (lo->weights_bf16 && lo->params) lo->ops->to_storage(lo->weights_bf16, lo->params, lo->total);
    return 0;
}

int sl_lora_attached(sl_lora *lo, const sl_act *const *base_weights) {
    if (!lo->cfg.use_dora) return 0;
    if (lo->ops->on_device)
        return sl_errorf("lora: DoRA (use_dora) runs on the CPU backend only for now; this model is on %s",
                         lo->ops->name);
    if (!lo->dora_init_pending) return 0;
    if (lora_dora_init_magnitudes(lo, base_weights)) return -1;
    lo->dora_init_pending = 0;
    return 0;
}

void sl_lora_describe(const sl_lora *lo, int with_scale, char *buf, size_t cap) {
    int r0 = lo->cfg.r, r1 = r0;
    float s0 = 0.0f, s1 = 0.0f;
    for (int a = lo->embed_A >= 0 ? -1 : 0; a < lo->n_adapters; a++) {  // -1: the embedding's adapter
        int r = a < 0 ? lo->embed_r : lo->adapters[a].r, first = a == (lo->embed_A >= 0 ? -1 : 0);
        float scale = a < 0 ? lo->embed_scale : lo->adapters[a].scale;
        if (first || r < r0) r0 = r;
        if (first || r > r1) r1 = r;
        if (first || scale < s0) s0 = scale;
        if (first || scale > s1) s1 = scale;
    }
    int n = r0 == r1 ? snprintf(buf, cap, "r=%d", r0) : snprintf(buf, cap, "r=%d..%d", r0, r1);
    if (!with_scale || n < 0 || (size_t)n >= cap) return;
    if (s0 == s1) snprintf(buf + n, cap - (size_t)n, ", scale %g", (double)s0);
    else snprintf(buf + n, cap - (size_t)n, ", scale %g..%g", (double)s0, (double)s1);
}

int sl_lora_find(const sl_lora *lo, const char *name) {
    for (int i = 0; i < lo->n_tensors; i++)
        if (strcmp(lo->tensors[i].name, name) == 0) return i;
    return -1;
}

// The base weight (out, in) an adapter's linear belongs to; the fused GEMM's rows run on contiguously.
// The base tensor of an adapter's linear: its weight, or (bias) its bias, -1 when it has none.
static int base_tensor(const sl_param_layout *L, const sl_lora_adapter *ad, int bias) {
    if (ad->linear == SL_LINEAR_HEAD) return bias ? -1 : L->lm_head;  // an untied head (head_picked), no bias
    const sl_block_tensors *k = &L->blocks[ad->layer];
    switch (ad->linear) {
    case SL_LINEAR_QKV: return bias ? k->qkv_b : k->qkv_w;
    case SL_LINEAR_ATTN_OUT: return bias ? k->attn_proj_b : k->attn_proj_w;
    case SL_LINEAR_MLP_UP: return bias ? k->fc_b : k->fc_w;
    default: return bias ? k->mlp_proj_b : k->mlp_proj_w;
    }
}

int lora_base_weight(const sl_param_layout *L, const sl_lora_adapter *ad) { return base_tensor(L, ad, 0); }

int lora_base_bias(const sl_param_layout *L, const sl_lora_adapter *ad) { return base_tensor(L, ad, 1); }

int sl_lora_bias_attach(const sl_lora *lo, const sl_param_layout *L) {
    if (!lo->cfg.lora_bias) return 0;
    if (lo->ops->on_device)
        return sl_errorf("lora: lora_bias runs on the CPU backend only for now; this model is on %s", lo->ops->name);
    int without = 0, first = -1;
    for (int a = 0; a < lo->n_adapters; a++)
        if (lora_base_bias(L, &lo->adapters[a]) < 0 && without++ == 0) first = a;
    if (without)
        fprintf(stderr, "warning: lora: lora_bias with %d adapted linear(s) that have no bias (%s%s): training "
                "works, merging will not (as PEFT warns)\n", without, lo->adapters[first].module,
                without > 1 ? ", ..." : "");
    return 0;
}

// PEFT's copy (saved, (vocab, C)) of a base matrix it saves next to an adapter on it, against the base's.
static int check_saved_base(const sl_lora *lo, const float *saved, const float *base, const char *what,
                            const char *noun) {
    size_t n = (size_t)lo->model_cfg.vocab_size * (size_t)lo->model_cfg.n_embd;
    for (size_t i = 0; saved && i < n; i++) {
        float f = saved[i];  // PEFT loads it over the base's in the base's dtype: rounded to it
        if (base[i] != f && base[i] != sl_round_to_bf16(f) && base[i] != sl_round_to_fp16(f))
            return sl_errorf("lora: the adapter holds PEFT's copy of %s's weight (save_embedding_layers), and it "
                             "differs from this base's %s (element %zu: %g, the base's %g): an adapter for "
                             "another base, or one whose vocabulary was resized", what, noun, i, (double)f,
                             (double)base[i]);
    }
    return 0;
}

int sl_lora_check_head_base(const sl_lora *lo, const float *head) {
    return check_saved_base(lo, lo->head_base, head, "lm_head", "head");
}

int sl_lora_check_embed_base(const sl_lora *lo, const float *wte) {
    return check_saved_base(lo, lo->embed_base, wte, lo->embed_module, "embedding");
}

int sl_lora_merge(const sl_lora *lo, const sl_param_layout *L, float *params, float (*round16)(float)) {
    if (sl_config_compare(&lo->model_cfg, &L->cfg, "merge: the adapters were built for another model")) return -1;
    // PEFT's copy of the adapted head's weight must be this base's (as attaching checks)
    if (L->lm_head >= 0 && sl_lora_check_head_base(lo, params + L->tensors[L->lm_head].offset)) return -1;
    if (sl_lora_check_embed_base(lo, params + L->tensors[L->wte].offset)) return -1;  // and the embedding's
    for (int a = 0; a < lo->n_adapters; a++)  // lora_bias goes into the base's bias (a refusal writes nothing)
        if (lo->adapters[a].lora_B_bias >= 0 && lora_base_bias(L, &lo->adapters[a]) < 0)
            return sl_errorf("merge: %s has lora_bias, but its base layer has no bias to merge it into (PEFT's "
                             "merge refuses this too); keep the adapter separate", lo->adapters[a].module);
    float *host = sl_malloc((lo->total ? lo->total : 1) * sizeof(float), "adapter weights");
    if (!host) return -1;
    lo->ops->download(host, lo->params, lo->total * sizeof(float));
    // modules_to_save: the copies replace their modules, and the embedding's adapter (checked first: a
    // refusal writes nothing)
    if (lora_embed_merge(lo, L, host, params, round16) || lora_saved_merge(lo, L, host, params)) {
        free(host);
        return -1;
    }
    for (int a = 0; a < lo->n_adapters; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        const float *A = host + lo->tensors[ad->lora_A].offset, *B = host + lo->tensors[ad->lora_B].offset;
        int in = ad->in_features, r = ad->r;
        float *W = params + L->tensors[lora_base_weight(L, ad)].offset + (size_t)ad->col0 * in, scale = ad->scale;
        const float *magnitude = ad->magnitude >= 0 ? host + lo->tensors[ad->magnitude].offset : NULL;
        // delta[o, i] = sum over k of B[o, k] * A[k, i], each element on one thread (no reduction across them)
#pragma omp parallel for schedule(static) if((size_t)ad->out_features * in * r >= 65536)
        for (int o = 0; o < ad->out_features; o++) {
            float *w = W + (size_t)o * in;
            for (int i = 0; i < in; i++) {
                float d = 0.0f;
                for (int k = 0; k < r; k++) d = fmaf(B[(size_t)o * r + k], A[(size_t)k * in + i], d);
                w[i] += d * scale;
            }
            if (magnitude) lora_dora_merge_row(w, in, magnitude[o]);  // DoRA: m / ||W + delta|| per row
        }
        if (ad->lora_B_bias >= 0) {  // the base's bias += scale * lora_B's bias (PEFT's merge)
            const float *b = host + lo->tensors[ad->lora_B_bias].offset;
            float *bias = params + L->tensors[lora_base_bias(L, ad)].offset + ad->col0;
            for (int o = 0; o < ad->out_features; o++) bias[o] += b[o] * scale;
        }
    }
    free(host);
    return 0;
}

// ---- activations ---------------------------------------------------------------------------------

int sl_lora_plan(sl_lora *lo, int N) {
    if (lora_embed_plan(lo, N)) return -1;
    if (lo->act_memory && N <= lo->act_N) return lo->cfg.use_dora ? lora_dora_plan(lo, lo->act_N) : 0;
    free_acts(lo);
    size_t e = lo->ops->act_bf16 ? sizeof(sl_bf16) : sizeof(float), n = (size_t)N;
    size_t max_out = 0, max_in = 0, max_r = 0, elems = 0;
    int dropout = lo->cfg.lora_dropout > 0.0f;
    for (int a = 0; a < lo->n_adapters; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        if ((size_t)ad->out_features > max_out) max_out = (size_t)ad->out_features;
        if ((size_t)ad->in_features > max_in) max_in = (size_t)ad->in_features;
        if ((size_t)ad->r > max_r) max_r = (size_t)ad->r;
        elems += n * (size_t)ad->r + (dropout ? n * (size_t)ad->in_features : 0);
    }
    size_t scratch = n * (max_out + max_in + max_r);
    lo->act_memory = lo->ops->alloc((elems + scratch) * e + 1, "lora activations");
    lo->u = sl_calloc((size_t)lo->n_adapters + 1, sizeof(sl_act *), "lora activations");
    lo->xd = sl_calloc((size_t)lo->n_adapters + 1, sizeof(sl_act *), "lora activations");
    if (!lo->act_memory || !lo->u || !lo->xd) {
        free_acts(lo);
        return sl_error_context("planning LoRA activations for %d rows", N);
    }
    size_t at = 0;
    for (int a = 0; a < lo->n_adapters; a++) {
        lo->u[a] = sl_act_at(lo->act_memory, at, e);
        at += n * (size_t)lo->adapters[a].r;
        if (dropout) {
            lo->xd[a] = sl_act_at(lo->act_memory, at, e);
            at += n * (size_t)lo->adapters[a].in_features;
        }
    }
    lo->delta = sl_act_at(lo->act_memory, at, e);
    lo->dh = sl_act_at(lo->act_memory, at + n * max_out, e);
    lo->du = sl_act_at(lo->act_memory, at + n * (max_out + max_in), e);
    lo->act_N = N;
    return lo->cfg.use_dora ? lora_dora_plan(lo, N) : 0;
}

// ---- forward and backward ------------------------------------------------------------------------

// Where tensor idx starts within its unit's views.
static size_t unit_offset(const sl_lora *lo, int idx) {
    return lo->tensors[idx].offset - lo->unit_begin[lo->tensors[idx].unit];
}

// A tensor as the GEMMs read it (the bf16 copy with bf16 storage), through its unit's view.
const sl_act *lora_weight(const sl_lora *lo, int idx) {
    int u = lo->tensors[idx].unit;
    return lo->ops->act_bf16 ? (const sl_act *)(const void *)(lo->weight_view[u] + unit_offset(lo, idx))
                             : (const sl_act *)(const void *)(lo->param_view[u] + unit_offset(lo, idx));
}

// Its fp32 parameters, through its unit's view.
const float *lora_param(const sl_lora *lo, int idx) {
    return lo->param_view[lo->tensors[idx].unit] + unit_offset(lo, idx);
}

// Its gradient (accumulated into), NULL without gradients (generation).
float *lora_grad(const sl_lora *lo, int idx) {
    float *g = lo->grad_view[lo->tensors[idx].unit];
    return g ? g + unit_offset(lo, idx) : NULL;
}

uint64_t lora_dropout_seed(const sl_lora *lo, int adapter) {
    sl_rng rng = sl_rng_make(lo->dropout_seed, 0, (uint64_t)adapter, SL_RNG_DROPOUT);
    return sl_rng_u64(&rng);
}

int lora_dropping(const sl_lora *lo) { return lo->training && lo->cfg.lora_dropout > 0.0f; }

int sl_lora_first_on(const sl_lora *lo, int layer, sl_linear_kind linear) {
    for (int a = lo->layer_first[layer]; a < lo->layer_first[layer + 1]; a++)
        if (lo->adapters[a].linear == linear) return a;
    return -1;
}

int sl_lora_check_backward(const sl_lora *lo) { return lora_dora_check_backward(lo); }

int sl_lora_dora_on(const sl_lora *lo, int layer, sl_linear_kind linear) {
    return lo->cfg.use_dora && sl_lora_first_on(lo, layer, linear) >= 0;
}

const sl_act *sl_lora_base_grad(sl_lora *lo, int layer, sl_linear_kind linear, const sl_act *dy, int N, int ld) {
    return sl_lora_dora_on(lo, layer, linear) ? lora_dora_base_grad(lo, layer, linear, dy, N, ld) : dy;
}

void sl_lora_forward(sl_lora *lo, int layer, sl_linear_kind linear, const sl_act *x, sl_act *y, const sl_act *W,
                     const sl_act *bias, int N, int ld) {
    const sl_ops *ops = lo->ops;
    for (int a = lo->layer_first[layer]; a < lo->layer_first[layer + 1]; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        if (ad->linear != linear) continue;
        const sl_act *h = x;  // (N, in)
        if (lora_dropping(lo)) {
            ops->dropout_forward(lo->xd[a], x, (size_t)N * ad->in_features, lo->cfg.lora_dropout,
                                 lora_dropout_seed(lo, a));
            h = lo->xd[a];
        }
        if (ad->magnitude >= 0) {
            lora_dora_forward(lo, a, h, y, W, bias, N, ld);
            continue;
        }
        if (ad->lora_B_bias >= 0) {  // lora_bias: y += scale * (u @ B^T + b), PEFT's lora_B(u) * scaling
            ops->matmul_forward(lo->u[a], h, lora_weight(lo, ad->lora_A), NULL, N, ad->in_features, ad->r);
            ops->matmul_forward(lo->delta, lo->u[a], lora_weight(lo, ad->lora_B), lora_weight(lo, ad->lora_B_bias), N,
                                ad->r, ad->out_features);
            ops->add_columns(y, lo->delta, ad->scale, N, ad->out_features, ld, ad->col0);
            continue;
        }
        ops->lora_forward(y, lo->u[a], lo->delta, h, lora_weight(lo, ad->lora_A), lora_weight(lo, ad->lora_B),
                          ad->scale, N, ad->in_features, ad->r, ad->out_features, ld, ad->col0);
    }
}

void sl_lora_backward(sl_lora *lo, int layer, sl_linear_kind linear, const sl_act *x, const sl_act *dy, sl_act *dx,
                      const sl_act *W, int N, int ld) {
    const sl_ops *ops = lo->ops;
    for (int a = lo->layer_first[layer]; a < lo->layer_first[layer + 1]; a++) {
        const sl_lora_adapter *ad = &lo->adapters[a];
        if (ad->linear != linear) continue;
        int r = ad->r;
        size_t n_in = (size_t)N * ad->in_features;
        const sl_act *h = lora_dropping(lo) ? lo->xd[a] : x;
        if (ad->magnitude >= 0) {
            lora_dora_backward(lo, a, h, dy, dx, W, N, ld);
            continue;
        }
        const sl_act *A = lora_weight(lo, ad->lora_A);
        // dB += g^T u, du = g B with g = scale * dy's columns; dA += du^T h; dx += du A (through the
        // dropout mask when dropping, so then dh = du A is formed apart first)
        ops->lora_backward(lora_dropping(lo) ? NULL : dx, lora_grad(lo, ad->lora_A), lora_grad(lo, ad->lora_B),
                           lo->du, lo->delta, lo->dh, dy, h, lo->u[a], A, lora_weight(lo, ad->lora_B), ad->scale, N,
                           ad->in_features, r, ad->out_features, ld, ad->col0);
        if (ad->lora_B_bias >= 0) {  // lora_bias: db += the column sums of scale * dy's slice
            ops->take_columns(lo->delta, dy, ad->scale, N, ad->out_features, ld, ad->col0);
            ops->matmul_backward(NULL, NULL, lora_grad(lo, ad->lora_B_bias), lo->delta, NULL, NULL, N, 1,
                                 ad->out_features);
        }
        if (!lora_dropping(lo) || !dx) continue;
        ops->matmul_backward(lo->dh, NULL, NULL, lo->du, h, A, N, ad->in_features, r);
        ops->dropout_backward(lo->dh, lo->dh, n_in, lo->cfg.lora_dropout, lora_dropout_seed(lo, a));
        ops->residual_forward(dx, dx, lo->dh, n_in);
    }
}
