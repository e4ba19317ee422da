// lora_saved.c: PEFT's modules_to_save (lora_saved.h). Which modules a name picks is read off the model's
// layout: a tensor's module is its name without the last part (".weight" / ".bias"); the modules shardlm
// copies are those of tensors outside the blocks' linears (embeddings, norms, an untied head), plus a tied
// model's lm_head, which the layout does not hold. Every other module with parameters (a linear of a block,
// or a container such as "transformer.h.0.mlp") that a name picks is an error: PEFT would train a copy of
// it, shardlm would not compute what PEFT does.
#include "model/lora_saved.h"
#include "model/lora_dora.h"
#include "model/lora_tokens.h"
#include "shardlm/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEFT_PREFIX "base_model.model."
#define TIED_HEAD "lm_head"

// Python's path.endswith(name).
static int ends_with(const char *path, const char *name, size_t len) {
    size_t lp = strlen(path);
    return lp >= len && memcmp(path + lp - len, name, len) == 0;
}

// The index of the first of cfg's names that `path` ends with, -1 when none.
static int picked(const sl_lora_config *cfg, const char *path) {
    const char *p = cfg->modules_to_save;
    for (int i = 0; i < cfg->n_modules_to_save; i++) {
        size_t len = strcspn(p, ",");
        if (ends_with(path, p, len)) return i;
        p += len + 1;
    }
    return -1;
}

// Tensor t's module path (its name up to the last '.') into buf.
static void module_of(const sl_tensor_info *t, char *buf, size_t cap) {
    const char *dot = strrchr(t->name, '.');
    snprintf(buf, cap, "%.*s", (int)(dot ? dot - t->name : (ptrdiff_t)strlen(t->name)), t->name);
}

// 1 when tensor t belongs to a linear of a block (its weight, or a bias beside it).
static int in_block_linear(const sl_param_layout *L, int t) {
    char module[sizeof L->tensors[t].name], weight[sizeof module + 8];
    module_of(&L->tensors[t], module, sizeof module);
    snprintf(weight, sizeof weight, "%.*s.weight", (int)(sizeof module - 1), module);
    int w = sl_layout_find(L, weight);
    return w >= 0 && sl_layout_is_block_linear(L, w);
}

// A module a name picks that shardlm does not copy: a block's linear, or any module holding one (every
// prefix of a linear's path), or a prefix of a copied module's path (a container: "transformer").
static int refuse_others(const sl_lora *lo, const sl_param_layout *L, int unit) {
    for (int t = 0; lo->cfg.n_modules_to_save && t < L->n_tensors; t++) {
        if (L->tensors[t].unit != unit) continue;
        char module[sizeof L->tensors[t].name];
        module_of(&L->tensors[t], module, sizeof module);
        int linear = in_block_linear(L, t), other = linear;
        // the module itself (when a linear), then each container above it
        for (;;) {
            int k = other ? picked(&lo->cfg, module) : -1;
            if (k >= 0) {
                const char *name = lo->cfg.modules_to_save;
                for (int i = 0; i < k; i++) name += strcspn(name, ",") + 1;
                return sl_errorf("lora: modules_to_save '%.*s' picks %s, %s; shardlm trains whole copies of "
                                 "embeddings, norms and the head only (adapt linears with target_modules)",
                                 (int)strcspn(name, ","), name, module, linear ? "a linear of a block" :
                                 "a module holding others");
            }
            char *end = strrchr(module, '.');
            if (!end) break;
            *end = '\0';
            other = 1;  // every module above this one is a container
            linear = 0;
        }
    }
    return 0;
}

int lora_saved_max_tensors(const sl_model_config *c) { return 10 * c->n_layer + 8; }

// The base tensor a copy stands for, into buf: its name without PEFT's prefix and without the
// ".base_layer" PEFT writes before an adapted linear's bias.
static void base_name(const sl_tensor_info *copy, char *buf, size_t cap) {
    const char *name = copy->name + strlen(PEFT_PREFIX), *wrap = strstr(name, ".base_layer.");
    if (wrap) snprintf(buf, cap, "%.*s%s", (int)(wrap - name), name, wrap + strlen(".base_layer"));
    else snprintf(buf, cap, "%s", name);
}

// 1 when layout tensor t is a bias PEFT's `bias` trains ("all": every bias; "lora_only": an adapted
// linear's); *adapted says whether its module carries adapters (PEFT then saves it as
// "<module>.base_layer.bias").
static int bias_trained(const sl_lora *lo, const sl_param_layout *L, int t, int *adapted) {
    const char *name = L->tensors[t].name;
    size_t len = strlen(name);
    *adapted = 0;
    if (lo->cfg.bias == SL_LORA_BIAS_NONE || len < 5 || strcmp(name + len - 5, ".bias") != 0) return 0;
    for (int a = 0; a < lo->n_adapters && !*adapted; a++) {
        size_t m = strlen(lo->adapters[a].module);
        *adapted = m == len - 5 && memcmp(name, lo->adapters[a].module, m) == 0;
    }
    return lo->cfg.bias == SL_LORA_BIAS_ALL || *adapted;
}

// 1 when a copy of base tensor t is in the table.
int lora_saved_has_copy(const sl_lora *lo, const sl_param_layout *L, int t) {
    char name[sizeof lo->tensors[0].name];
    for (int s = 0; s < lo->n_saved; s++) {
        base_name(&lo->tensors[lo->saved[s]], name, sizeof name);
        if (!strcmp(name, L->tensors[t].name)) return 1;
    }
    return 0;
}

// LLaMA-style q/k/v biases are one vector to the fused GEMM: copied all three or none.
static int check_fused_biases(const sl_lora *lo, const sl_param_layout *L, int unit) {
    if (unit < 1 || unit > L->cfg.n_layer || L->blocks[unit - 1].qkv_b < 0 || L->cfg.arch != SL_ARCH_LLAMA) return 0;
    int q = L->blocks[unit - 1].qkv_b;
    int n = lora_saved_has_copy(lo, L, q) + lora_saved_has_copy(lo, L, q + 1) + lora_saved_has_copy(lo, L, q + 2);
    if (n != 0 && n != 3)
        return sl_errorf("lora: bias \"%s\" trains %d of block %d's q/k/v biases, which this model adds as one fused "
                         "vector: adapt all of q_proj, k_proj and v_proj, or none", sl_lora_bias_name(lo->cfg.bias), n,
                         unit - 1);
    return 0;
}

// A copy of a tensor shaped (rows, cols) (cols 0: 1-D), rows_in_file of them saved (a padded vocabulary
// keeps its padding rows out of the file, as the base's do), named after the base tensor `name`.
int lora_saved_add_tensor(sl_lora *lo, size_t *offset, int unit, const sl_tensor_info *base, const char *name,
                          int copy) {
    sl_tensor_info *t = &lo->tensors[lo->n_tensors];
    *t = *base;
    if (snprintf(t->name, sizeof t->name, PEFT_PREFIX "%s", name) >= (int)sizeof t->name)
        return sl_errorf("lora: modules_to_save tensor name for %s is too long", name);
    t->offset = *offset;
    t->layer = unit - 1;
    t->unit = unit;
    t->hf_transposed = 0;
    t->quantised = 0;
    *offset += t->numel;
    if (copy) lo->saved[lo->n_saved++] = lo->n_tensors;
    return lo->n_tensors++;
}

int lora_saved_add(sl_lora *lo, const sl_param_layout *L, int unit, size_t *offset) {
    if (!lo->cfg.n_modules_to_save && lo->cfg.bias == SL_LORA_BIAS_NONE)
        return unit == 0 ? lora_tokens_add(lo, L, offset) : 0;
    if (refuse_others(lo, L, unit)) return -1;
    for (int t = 0; t < L->n_tensors; t++) {
        if (L->tensors[t].unit != unit) continue;
        char module[sizeof L->tensors[t].name], name[sizeof module + 16];
        module_of(&L->tensors[t], module, sizeof module);
        int saved = !in_block_linear(L, t) && picked(&lo->cfg, module) >= 0, adapted;
        int biased = bias_trained(lo, L, t, &adapted);
        if (saved && biased)
            return sl_errorf("lora: modules_to_save copies %s, whose bias \"bias\": \"%s\" trains too; keep one of "
                             "them", module, sl_lora_bias_name(lo->cfg.bias));
        if (!saved && !biased) continue;
        if (biased && adapted) snprintf(name, sizeof name, "%s.base_layer.bias", module);
        else snprintf(name, sizeof name, "%s", L->tensors[t].name);
        if (lora_saved_add_tensor(lo, offset, unit, &L->tensors[t], name, 1) < 0) return -1;
    }
    if (check_fused_biases(lo, L, unit)) return -1;
    // a tied model's head is the embedding: PEFT's copy of lm_head unties it (kept in unit 0 with it)
    if (unit == 0 && L->lm_head < 0 && picked(&lo->cfg, TIED_HEAD) >= 0) {
        sl_tensor_info head = L->tensors[L->wte];
        head.weight_decay = 1;  // a head's weight, as an untied lm_head's in the layout
        if ((lo->head_copy = lora_saved_add_tensor(lo, offset, unit, &head, TIED_HEAD ".weight", 1)) < 0) return -1;
    }
    if (unit == 0 && lora_tokens_add(lo, L, offset)) return -1;
    return 0;
}

void lora_saved_warn_unmatched(const sl_lora *lo) {
    const char *name = lo->cfg.modules_to_save;
    for (int i = 0; i < lo->cfg.n_modules_to_save; name += strcspn(name, ",") + 1, i++) {
        size_t len = strcspn(name, ",");
        int hit = 0;
        for (int s = 0; s < lo->n_saved && !hit; s++) {
            char module[sizeof lo->tensors[0].name];
            module_of(&lo->tensors[lo->saved[s]], module, sizeof module);
            hit = ends_with(module, name, len);
        }
        if (!hit)
            fprintf(stderr, "warning: lora: modules_to_save '%.*s' matches no module with parameters; ignored (as "
                    "PEFT ignores it)\n", (int)len, name);
    }
}

int lora_saved_attach(sl_lora *lo, const sl_param_layout *L, float *const *base_view, const sl_act *wte,
                      size_t act_elem) {
    free(lo->saved_of);
    lo->saved_of = NULL;
    if (!lo->n_saved && lo->tokens_delta < 0 && lo->embed_A < 0) return 0;
    if (lo->ops->on_device)
        return sl_errorf("lora: modules_to_save, bias, trainable_token_indices and LoRA on the embedding run on the "
                         "CPU backend only for now; this model is on %s", lo->ops->name);
    if (lora_tokens_attach(lo, L, base_view, wte, act_elem)) return -1;
    lo->saved_of = sl_malloc((size_t)L->n_tensors * sizeof(int), "modules_to_save");
    if (!lo->saved_of) return -1;
    for (int t = 0; t < L->n_tensors; t++) lo->saved_of[t] = -1;
    for (int s = 0; s < lo->n_saved; s++) {
        const sl_tensor_info *copy = &lo->tensors[lo->saved[s]];
        char name[sizeof copy->name];
        base_name(copy, name, sizeof name);
        int base = lo->saved[s] == lo->head_copy ? L->wte : sl_layout_find(L, name);
        if (base < 0 || L->tensors[base].numel != copy->numel)
            return sl_errorf("lora: trained copy %s has no counterpart in this model", copy->name);
        if (lo->saved[s] != lo->head_copy) lo->saved_of[base] = lo->saved[s];
        if (!lo->saved_init_pending) continue;
        const sl_tensor_info *b = &L->tensors[base];
        const float *src = base_view[b->unit] + (b->offset - L->unit_begin[b->unit]);
        lo->ops->copy(lo->params + copy->offset, src, copy->numel * sizeof(float));
    }
    // the lowest block holding a copy (-1: the embeddings, trained tokens included; a tied head's copy is
    // the head's): with one of its ln_1 / q-k-v bias, the backward needs that block's input gradient
    int n = L->cfg.n_layer, floor = lo->tokens_delta >= 0 || lo->embed_A >= 0 ? -1 : n;
    for (int s = 0; s < lo->n_saved; s++) {
        int unit = lo->tensors[lo->saved[s]].unit;
        if (lo->saved[s] != lo->head_copy && unit - 1 < floor) floor = unit - 1;
    }
    lo->saved_floor = floor;
    const sl_block_tensors *k = floor >= 0 && floor < n ? &L->blocks[floor] : NULL;
    lo->saved_ln1_at_floor = k && (lo->saved_of[k->ln1_w] >= 0 || (k->ln1_b >= 0 && lo->saved_of[k->ln1_b] >= 0) ||
                                   (k->qkv_b >= 0 && lo->saved_of[k->qkv_b] >= 0));
    if (lo->saved_init_pending) {
        lo->saved_init_pending = 0;
        return sl_lora_params_changed(lo);
    }
    return 0;
}

size_t sl_lora_saved_describe(const sl_lora *lo, char *buf, size_t cap) {
    size_t numel = 0, used = 0, biases = 0;
    char last[sizeof lo->tensors[0].name] = "";
    buf[0] = '\0';
    for (int s = 0; s < lo->n_saved; s++) {
        const sl_tensor_info *t = &lo->tensors[lo->saved[s]];
        char name[sizeof t->name], module[sizeof t->name];
        base_name(t, name, sizeof name);
        snprintf(module, sizeof module, "%.*s", (int)(strrchr(name, '.') - name), name);
        numel += (size_t)t->hf_rows * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        if (lo->saved[s] != lo->head_copy && picked(&lo->cfg, module) < 0) {  // a bias PEFT's `bias` trains
            biases++;
            continue;
        }
        if (strcmp(module, last) != 0 && used < cap)  // a module's weight and bias are named once
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", module);
        snprintf(last, sizeof last, "%s", module);
    }
    if (biases && used < cap)
        used += (size_t)snprintf(buf + used, cap - used, "%s%zu biases (bias \"%s\")", used ? ", " : "", biases,
                                 sl_lora_bias_name(lo->cfg.bias));
    if (lo->tokens_delta >= 0) {
        numel += lo->tensors[lo->tokens_delta].numel;
        if (used < cap)
            snprintf(buf + used, cap - used, "%s%d rows of the embedding (trainable_token_indices)", used ? ", " : "",
                     lo->cfg.n_token_indices);
    }
    return numel;
}

int lora_saved_merge(const sl_lora *lo, const sl_param_layout *L, const float *host, float *params) {
    for (int pass = 0; pass < 2; pass++)  // every copy checked before one is written
        for (int s = 0; s < lo->n_saved; s++) {
            const sl_tensor_info *copy = &lo->tensors[lo->saved[s]];
            char name[sizeof copy->name];
            base_name(copy, name, sizeof name);
            int base = lo->saved[s] == lo->head_copy ? L->wte : sl_layout_find(L, name);
            // a tied model's one matrix serves the lookup and the head, which the copies have parted
            if (L->lm_head < 0 && base == L->wte)
                return sl_errorf("merge: the adapter trains a copy of %s on a model whose head is its embedding "
                                 "matrix (tie_word_embeddings): merged, the lookup and the head would share one matrix "
                                 "again, which the adapted model does not; use the adapter unmerged (--adapter)",
                                 name);
            if (base < 0 || L->tensors[base].numel != copy->numel)
                return sl_errorf("merge: trained copy %s has no counterpart in the base", copy->name);
            if (pass) memcpy(params + L->tensors[base].offset, host + copy->offset, copy->numel * sizeof(float));
        }
    lora_tokens_merge(lo, L, host, params);
    return 0;
}

const sl_act *lora_saved_weight(const sl_lora *lo, int t) {
    if (lo->tokens_weight && t == lo->tokens_base) return lo->tokens_weight;
    int s = lo->saved_of ? lo->saved_of[t] : -1;
    return s >= 0 ? lora_weight(lo, s) : NULL;
}

float *lora_saved_grad(const sl_lora *lo, int t) {
    int s = lo->saved_of && t >= 0 ? lo->saved_of[t] : -1;
    return s >= 0 ? lora_grad(lo, s) : NULL;
}

void lora_saved_backward_floor(const sl_lora *lo, int *lowest, int *input) {
    int n = lo->model_cfg.n_layer, floor = lo->saved_floor;
    *lowest = lo->n_adapters ? lo->adapters[0].layer : n;
    *input = 0;
    if (floor < 0) {  // the embeddings' copies take the gradient of every block's input
        *lowest = 0;
        *input = 1;
    } else if (floor < n) {  // that block runs; its input's gradient only for an ln_1 copy there
        if (floor < *lowest) *lowest = floor;
        *input = lo->saved_ln1_at_floor && floor == *lowest;
    }
}

int lora_saved_embeddings(const sl_lora *lo) { return lo->saved_floor < 0; }
