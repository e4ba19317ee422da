// peft_adapter.c: PEFT adapter directories (peft_adapter.h) <-> sl_lora. Reading trusts nothing:
// the config is parsed strictly, the adapters it describes are built for the base, and every tensor
// of the safetensors file is matched by name, shape and dtype against them before one byte of
// weights is used. Writing stages the parameters through host memory and writes each file atomically.
#include "shardlm/peft_adapter.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"
#include "shardlm/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATH_CAP 4096

static int join(char *out, const char *dir, const char *name) {
    if (snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP) return sl_errorf("path too long: %s/%s", dir, name);
    return 0;
}

int sl_peft_read_config(const char *dir, sl_lora_config *cfg) {
    char path[PATH_CAP];
    if (join(path, dir, "adapter_config.json")) return -1;
    cJSON *root = sl_json_read_strict(path);
    if (!root) return -1;
    sl_lora_config_defaults(cfg);
    int rc = sl_lora_config_parse(cfg, root, path);
    cJSON_Delete(root);
    return rc;
}

// Every tensor of f is one of the adapters', with its shape and a float dtype, and every adapter
// tensor is there.
// PEFT (save_embedding_layers "auto") saves an adapted head's own weight next to its adapters.
#define HEAD_BASE "base_model.model.lm_head.base_layer.weight"

// 1 when tensor t is PEFT's copy of the adapted head's weight: (vocab, C) of a model whose lm_head lo adapts.
static int is_head_base(const sl_st_tensor *t, const sl_lora *lo) {
    int adapted = lo->n_adapters && lo->adapters[lo->n_adapters - 1].linear == SL_LINEAR_HEAD;
    return adapted && strcmp(t->name, HEAD_BASE) == 0 && t->ndim == 2 && t->shape[0] == lo->model_cfg.vocab_size &&
           t->shape[1] == lo->model_cfg.n_embd && sl_st_dtype_is_float(t->dtype);
}

// The name PEFT saves an adapted embedding's own weight under ("" without an embedding adapter).
static void embed_base_name(const sl_lora *lo, char *name, size_t cap) {
    name[0] = '\0';
    if (lo->embed_A >= 0) snprintf(name, cap, "base_model.model.%s.base_layer.weight", lo->embed_module);
}

// 1 when tensor t is PEFT's copy of the embedding an adapter adapts ((vocab, C), under embed_base_name).
static int is_embed_base(const sl_st_tensor *t, const sl_lora *lo) {
    char name[sizeof lo->tensors[0].name + 32];
    embed_base_name(lo, name, sizeof name);
    return name[0] && strcmp(t->name, name) == 0 && t->ndim == 2 && t->shape[0] == lo->model_cfg.vocab_size &&
           t->shape[1] == lo->model_cfg.n_embd && sl_st_dtype_is_float(t->dtype);
}

static int check_tensors(const sl_st_file *f, const sl_lora *lo, const char *path) {
    for (int i = 0; i < f->n_tensors; i++) {
        const sl_st_tensor *t = &f->tensors[i];
        if (is_head_base(t, lo) || is_embed_base(t, lo)) continue;  // checked against the base's when attached
        int idx = sl_lora_find(lo, t->name);
        char got[64], want[64];
        if (idx < 0)
            return sl_errorf("%s: tensor %s is not an adapter of this model with this adapter_config.json (expected "
                             "%d tensors named like %s)", path, t->name, lo->n_tensors,
                             lo->n_tensors ? lo->tensors[0].name : "(none)");
        const sl_tensor_info *e = &lo->tensors[idx];
        int64_t shape[2] = {e->hf_rows, e->shape[1]};  // a copied embedding's padding rows are not in files
        if (t->ndim != e->ndim || t->shape[0] != shape[0] || (e->ndim == 2 && t->shape[1] != shape[1]))
            return sl_errorf("%s: tensor %s has shape %s, this base model needs %s (an adapter for another base "
                             "model, or another r?%s)", path, t->name,
                             sl_st_shape_str(got, sizeof got, t->ndim, t->shape),
                             sl_st_shape_str(want, sizeof want, e->ndim, shape),
                             lo->cfg.rank_pattern.n ? " rank_pattern's keys are tried in the file's order, and PEFT "
                             "writes them sorted: keys that overlap can give a module another rank than in training"
                                                    : "");
        if (!sl_st_dtype_is_float(t->dtype))
            return sl_errorf("%s: tensor %s has dtype %s, expected F32, F16, BF16 or F64", path, t->name,
                             sl_st_dtype_name(t->dtype));
    }
    for (int i = 0; i < lo->n_tensors; i++)
        if (sl_st_find(f, lo->tensors[i].name) < 0)
            return sl_errorf("%s: tensor %s is missing (adapter_config.json's target_modules or modules_to_save "
                             "name it)", path, lo->tensors[i].name);
    return 0;
}

// The settings that change the maths must be the run's.
static int same_settings(const sl_lora_config *a, const sl_lora_config *b, const char *path) {
    if (!sl_lora_pattern_map_equal(&a->rank_pattern, &b->rank_pattern) ||
        !sl_lora_pattern_map_equal(&a->alpha_pattern, &b->alpha_pattern))
        return sl_errorf("%s: rank_pattern / alpha_pattern differ from this run's", path);
    if (a->n_modules_to_save != b->n_modules_to_save || strcmp(a->modules_to_save, b->modules_to_save) != 0)
        return sl_errorf("%s: modules_to_save [%s]; this run has [%s]", path, a->modules_to_save, b->modules_to_save);
    if (a->n_token_indices != b->n_token_indices || strcmp(a->token_module, b->token_module) != 0 ||
        memcmp(a->token_indices, b->token_indices, sizeof(int) * (size_t)a->n_token_indices) != 0)
        return sl_errorf("%s: trainable_token_indices (%d tokens) differ from this run's (%d tokens)", path,
                         a->n_token_indices, b->n_token_indices);
    if (a->bias != b->bias)
        return sl_errorf("%s: bias \"%s\"; this run has bias \"%s\"", path, sl_lora_bias_name(a->bias),
                         sl_lora_bias_name(b->bias));
    if (a->use_dora != b->use_dora)
        return sl_errorf("%s: use_dora %d; this run has use_dora %d", path, a->use_dora, b->use_dora);
    if (a->lora_bias != b->lora_bias)
        return sl_errorf("%s: lora_bias %d; this run has lora_bias %d", path, a->lora_bias, b->lora_bias);
    if (a->r != b->r || a->lora_alpha != b->lora_alpha || a->use_rslora != b->use_rslora ||
        a->lora_dropout != b->lora_dropout)
        return sl_errorf("%s: r %d, lora_alpha %g, use_rslora %d, lora_dropout %g; this run has r %d, lora_alpha %g, "
                         "use_rslora %d, lora_dropout %g", path, a->r, a->lora_alpha, a->use_rslora,
                         (double)a->lora_dropout, b->r, b->lora_alpha, b->use_rslora, (double)b->lora_dropout);
    return 0;
}

int sl_peft_read_weights(const char *dir, const sl_lora *lo, float *host) {
    char path[PATH_CAP];
    sl_lora_config cfg;
    if (sl_peft_read_config(dir, &cfg) || join(path, dir, "adapter_config.json") || same_settings(&cfg, &lo->cfg, path) ||
        join(path, dir, "adapter_model.safetensors"))
        return -1;
    sl_st_file f;
    if (access(path, F_OK) != 0) {
        char bin[PATH_CAP];
        if (!join(bin, dir, "adapter_model.bin") && access(bin, F_OK) == 0)
            return sl_errorf("%s: no adapter_model.safetensors, only adapter_model.bin (a pickle, which shardlm does "
                             "not read); save the adapter with safe_serialization=True (PEFT's default)", dir);
    }
    if (sl_st_open(&f, path)) return -1;
    int rc = check_tensors(&f, lo, path);
    for (int i = 0; rc == 0 && i < lo->n_tensors; i++) {
        const sl_tensor_info *t = &lo->tensors[i];
        size_t in_file = (size_t)t->hf_rows * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
        rc = sl_st_read_f32(&f, sl_st_find(&f, t->name), host + t->offset, in_file);
        memset(host + t->offset + in_file, 0, (t->numel - in_file) * sizeof(float));
    }
    sl_st_close(&f);
    return rc;
}

// PEFT's copy of the adapted head's weight, when the file holds one, into lo->head_base (host floats),
// for sl_model_attach_lora to compare with the base's head.
static int read_head_base(const char *dir, sl_lora *lo) {
    char path[PATH_CAP];
    sl_st_file f;
    if (join(path, dir, "adapter_model.safetensors") || sl_st_open(&f, path)) return -1;
    int i = sl_st_find(&f, HEAD_BASE), rc = 0;
    size_t n = (size_t)lo->model_cfg.vocab_size * (size_t)lo->model_cfg.n_embd;
    if (i >= 0 && is_head_base(&f.tensors[i], lo)) {
        lo->head_base = sl_malloc(n * sizeof(float), "the adapter's lm_head");
        rc = lo->head_base ? sl_st_read_f32(&f, i, lo->head_base, n) : -1;
    }
    char name[sizeof lo->tensors[0].name + 32];  // and of an adapted embedding
    embed_base_name(lo, name, sizeof name);
    i = name[0] ? sl_st_find(&f, name) : -1;
    if (rc == 0 && i >= 0 && is_embed_base(&f.tensors[i], lo)) {
        lo->embed_base = sl_malloc(n * sizeof(float), "the adapter's embedding");
        rc = lo->embed_base ? sl_st_read_f32(&f, i, lo->embed_base, n) : -1;
    }
    sl_st_close(&f);
    return rc;
}

static int load_weights(const char *dir, sl_lora *lo) {
    float *host = sl_malloc((lo->total ? lo->total : 1) * sizeof(float), "adapter weights");
    int rc = host ? sl_peft_read_weights(dir, lo, host) : -1;
    if (rc == 0) rc = read_head_base(dir, lo);
    if (rc == 0) {
        lo->ops->upload(lo->params, host, lo->total * sizeof(float));
        rc = sl_lora_params_changed(lo);
    }
    free(host);
    return rc;
}

int sl_peft_load(const char *dir, const sl_model_config *model_cfg, const sl_ops *ops, sl_lora *lora) {
    sl_lora_config cfg;
    memset(lora, 0, sizeof *lora);
    if (sl_peft_read_config(dir, &cfg) || sl_lora_create(lora, model_cfg, &cfg, ops) || load_weights(dir, lora)) {
        sl_lora_free(lora);
        return sl_error_context("loading the PEFT adapter %s", dir);
    }
    return 0;
}

static int save_weights(const char *path, const sl_lora *lo, const float *given) {
    sl_st_desc *desc = sl_calloc((size_t)lo->n_tensors + 1, sizeof *desc, "adapter tensors");
    float *own = given ? NULL : sl_malloc((lo->total ? lo->total : 1) * sizeof(float), "adapter weights");
    const float *host = given ? given : own;
    const float **data = sl_calloc((size_t)lo->n_tensors + 1, sizeof *data, "adapter tensors");
    int rc = desc && host && data ? 0 : -1;
    if (rc == 0) {
        if (own) lo->ops->download(own, lo->params, lo->total * sizeof(float));
        for (int i = 0; i < lo->n_tensors; i++) {
            const sl_tensor_info *t = &lo->tensors[i];
            desc[i] = (sl_st_desc){.name = t->name, .ndim = t->ndim, .shape = {t->hf_rows, t->shape[1]}};
            data[i] = host + t->offset;
        }
        const char *keys[] = {"format"}, *values[] = {"pt"};
        rc = sl_st_write_f32(path, lo->n_tensors, desc, data, 1, keys, values);
    }
    free(desc);
    free(own);
    free(data);
    return rc;
}

static int save_config(const char *path, const sl_lora *lo) {
    const char *base_model = lo->base_model[0] ? lo->base_model : NULL;
    cJSON *root = cJSON_CreateObject();
    int rc = root ? sl_lora_config_to_json(&lo->cfg, root) : sl_errorf("out of memory writing %s", path);
    if (rc == 0 && (!cJSON_AddBoolToObject(root, "fan_in_fan_out", lo->model_cfg.arch == SL_ARCH_GPT2) ||
                    !(base_model ? cJSON_AddStringToObject(root, "base_model_name_or_path", base_model)
                                 : cJSON_AddNullToObject(root, "base_model_name_or_path"))))
        rc = sl_errorf("out of memory writing %s", path);
    char *text = rc == 0 ? cJSON_Print(root) : NULL;
    if (rc == 0 && !text) rc = sl_errorf("out of memory writing %s", path);
    if (rc == 0) rc = sl_write_file_atomic(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
    return rc;
}

int sl_peft_save(const char *dir, const sl_lora *lora, const float *host) {
    char path[PATH_CAP];
    if (sl_mkdirs(dir) || join(path, dir, "adapter_model.safetensors") || save_weights(path, lora, host) ||
        join(path, dir, "adapter_config.json") || save_config(path, lora))
        return sl_error_context("saving the PEFT adapter to %s", dir);
    return 0;
}
