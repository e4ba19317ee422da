// optim.c: the DeepSpeed "optimizer" block parser, the weight-decay mask built from the layout, an
// optimizer step's scalars (in double, as torch computes them) and segments, handed to a backend's
// multi-tensor passes (ops->adam_step / sgd_step: src/ops/cpu/optimizer.c, src/ops/cuda/optimizer.cu),
// and global-norm clipping. A step touches only [begin, end) of the flat buffer.
#include "shardlm/optim.h"
#include "shardlm/ops.h"
#include "shardlm/error.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

// ---- config ------------------------------------------------------------------------------------

void sl_optim_defaults(sl_optim_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->type = SL_OPTIM_ADAMW;
    cfg->lr = 1e-3;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.999;
    cfg->eps = 1e-8;
    cfg->min_8bit_size = 4096;
}

const char *sl_optim_name(sl_optim_type type) {
    switch (type) {
    case SL_OPTIM_ADAMW: return "AdamW";
    case SL_OPTIM_ADAM: return "Adam";
    case SL_OPTIM_SGD: return "SGD";
    case SL_OPTIM_ADAMW8BIT: return "AdamW8bit";
    }
    return "?";
}

int sl_optim_select(sl_optim_config *cfg, const char *name, const char *flag) {
    sl_optim_type type;
    if (strcasecmp(name, "adamw") == 0) type = SL_OPTIM_ADAMW;
    else if (strcasecmp(name, "adam") == 0) type = SL_OPTIM_ADAM;
    else if (strcasecmp(name, "sgd") == 0) type = SL_OPTIM_SGD;
    else if (strcasecmp(name, "adamw8bit") == 0) type = SL_OPTIM_ADAMW8BIT;
    else return sl_errorf("%s must be adamw, adam, sgd or adamw8bit (got '%s')", flag, name);
    sl_optim_config keep = *cfg;
    sl_optim_defaults(cfg);
    cfg->type = type;
    cfg->lr = keep.lr;
    cfg->weight_decay = keep.weight_decay;
    cfg->min_8bit_size = keep.min_8bit_size;
    if (type != SL_OPTIM_SGD) {
        cfg->beta1 = keep.beta1;
        cfg->beta2 = keep.beta2;
    }
    return 0;
}

int sl_optim_num_state_buffers(const sl_optim_config *cfg) {
    if (cfg->type == SL_OPTIM_SGD) return cfg->momentum != 0.0 ? 1 : 0;
    if (cfg->type == SL_OPTIM_ADAMW8BIT) return 0;
    return 2;
}

static int get_number(const cJSON *obj, const char *key, double *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v))
        return sl_errorf("%s: optimizer.params.%s must be a number", where, key);
    if (!isfinite(v->valuedouble))
        return sl_errorf("%s: optimizer.params.%s must be finite", where, key);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *obj, const char *key, int *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return sl_errorf("%s: optimizer.params.%s must be true or false", where, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return 0;
}

static int key_known(const char *key, const char *const *known) {
    for (int i = 0; known[i]; i++)
        if (strcmp(key, known[i]) == 0) return 1;
    return 0;
}

// Appends "key" to a comma-separated list of unknown keys in `warning`, truncating quietly.
static void note_unknown(char *warning, size_t cap, const char *prefix, const char *key) {
    size_t len = strlen(warning);
    if (len == 0) snprintf(warning, cap, "%s%s", prefix, key);
    else if (len < cap) snprintf(warning + len, cap - len, ", %s", key);
}

int sl_optim_parse(sl_optim_config *cfg, const cJSON *block, const char *where) {
    sl_optim_defaults(cfg);
    if (!block || cJSON_IsNull(block)) return 0;
    if (!cJSON_IsObject(block)) return sl_errorf("%s: \"optimizer\" must be an object", where);

    const cJSON *type = cJSON_GetObjectItemCaseSensitive(block, "type");
    if (!type || !cJSON_IsString(type))
        return sl_errorf("%s: optimizer.type must be a string (\"AdamW\", \"Adam\", \"SGD\" or \"AdamW8bit\")",
                         where);
    int is_adam = 0;
    if (strcasecmp(type->valuestring, "adamw") == 0) cfg->type = SL_OPTIM_ADAMW;
    else if (strcasecmp(type->valuestring, "adam") == 0) cfg->type = SL_OPTIM_ADAMW, is_adam = 1;
    else if (strcasecmp(type->valuestring, "sgd") == 0) cfg->type = SL_OPTIM_SGD;
    else if (strcasecmp(type->valuestring, "adamw8bit") == 0) cfg->type = SL_OPTIM_ADAMW8BIT;
    else
        return sl_errorf("%s: optimizer.type \"%s\" is not supported (expected \"AdamW\", \"Adam\", \"SGD\" or "
                         "\"AdamW8bit\")", where, type->valuestring);
    for (const cJSON *it = block->child; it; it = it->next)
        if (strcmp(it->string, "type") != 0 && strcmp(it->string, "params") != 0)
            note_unknown(cfg->warning, sizeof cfg->warning, "unknown optimizer keys ignored: ", it->string);

    const cJSON *params = cJSON_GetObjectItemCaseSensitive(block, "params");
    if (!params || cJSON_IsNull(params)) return 0;
    if (!cJSON_IsObject(params)) return sl_errorf("%s: optimizer.params must be an object", where);
    if (cJSON_GetObjectItemCaseSensitive(params, "max_grad_norm"))
        return sl_errorf("%s: optimizer.params.max_grad_norm is not supported; use the top-level "
                         "\"gradient_clipping\" key (as DeepSpeed requires)", where);

    static const char *const adam_keys[] = {"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                                            "decay_all", "bias_correction", "torch_adam", NULL};
    static const char *const sgd_keys[] = {"lr", "momentum", "dampening", "nesterov", "weight_decay",
                                           "decay_all", NULL};
    static const char *const adam8_keys[] = {"lr", "betas", "eps", "weight_decay", "decay_all", "min_8bit_size",
                                             NULL};
    const char *const *known = cfg->type == SL_OPTIM_SGD ? sgd_keys : cfg->type == SL_OPTIM_ADAMW8BIT ? adam8_keys
                                                                                                    : adam_keys;
    char unknown[256] = "";
    for (const cJSON *it = params->child; it; it = it->next)
        if (!key_known(it->string, known)) note_unknown(unknown, sizeof unknown, "", it->string);
    if (unknown[0]) {
        size_t len = strlen(cfg->warning);
        snprintf(cfg->warning + len, sizeof cfg->warning - len, "%sunknown optimizer.params keys ignored: %s",
                 len ? "; " : "", unknown);
    }

    if (get_number(params, "lr", &cfg->lr, where) || get_number(params, "eps", &cfg->eps, where) ||
        get_number(params, "weight_decay", &cfg->weight_decay, where) ||
        get_number(params, "momentum", &cfg->momentum, where) ||
        get_number(params, "dampening", &cfg->dampening, where) ||
        get_bool(params, "nesterov", &cfg->nesterov, where) ||
        get_bool(params, "decay_all", &cfg->decay_all, where))
        return -1;
    if (cfg->type == SL_OPTIM_ADAMW8BIT) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(params, "min_8bit_size");
        if (v && !cJSON_IsNull(v)) {
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !(v->valuedouble >= 0.0) ||
                v->valuedouble > 1e15)
                return sl_errorf("%s: optimizer.params.min_8bit_size must be a whole number >= 0 (elements)", where);
            cfg->min_8bit_size = (long long)v->valuedouble;
        }
    }
    if (cfg->type != SL_OPTIM_SGD) {
        int adam_w_mode = 1, bias_correction = 1, torch_adam = 0;
        if (get_bool(params, "adam_w_mode", &adam_w_mode, where) ||
            get_bool(params, "bias_correction", &bias_correction, where) ||
            get_bool(params, "torch_adam", &torch_adam, where))
            return -1;
        if (!bias_correction)
            return sl_errorf("%s: optimizer.params.bias_correction false is not supported", where);
        // DeepSpeed: "AdamW" always decouples; "Adam" decouples unless adam_w_mode is false.
        if (is_adam && !adam_w_mode) cfg->type = SL_OPTIM_ADAM;
        const cJSON *betas = cJSON_GetObjectItemCaseSensitive(params, "betas");
        if (betas && !cJSON_IsNull(betas)) {
            if (!cJSON_IsArray(betas) || cJSON_GetArraySize(betas) != 2 ||
                !cJSON_IsNumber(cJSON_GetArrayItem(betas, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(betas, 1)))
                return sl_errorf("%s: optimizer.params.betas must be an array of two numbers [beta1, beta2]", where);
            cfg->beta1 = cJSON_GetArrayItem(betas, 0)->valuedouble;
            cfg->beta2 = cJSON_GetArrayItem(betas, 1)->valuedouble;
        }
        if (!(cfg->beta1 >= 0.0 && cfg->beta1 < 1.0 && cfg->beta2 >= 0.0 && cfg->beta2 < 1.0))
            return sl_errorf("%s: optimizer.params.betas must lie in [0, 1), got [%g, %g]", where,
                             cfg->beta1, cfg->beta2);
        if (!(cfg->eps >= 0.0)) return sl_errorf("%s: optimizer.params.eps must be >= 0", where);
    }
    if (!(cfg->lr >= 0.0)) return sl_errorf("%s: optimizer.params.lr must be >= 0, got %g", where, cfg->lr);
    if (!(cfg->weight_decay >= 0.0))
        return sl_errorf("%s: optimizer.params.weight_decay must be >= 0, got %g", where, cfg->weight_decay);
    if (cfg->type == SL_OPTIM_SGD) {
        if (!(cfg->momentum >= 0.0)) return sl_errorf("%s: optimizer.params.momentum must be >= 0", where);
        if (cfg->nesterov && (cfg->momentum <= 0.0 || cfg->dampening != 0.0))
            return sl_errorf("%s: optimizer.params.nesterov requires momentum > 0 and dampening 0 "
                             "(as torch.optim.SGD)", where);
    }
    return 0;
}

// ---- decay mask --------------------------------------------------------------------------------

int sl_decay_mask_from_layout(sl_decay_mask *mask, const sl_param_layout *layout, int decay_all) {
    return sl_decay_mask_from_tensors(mask, layout->tensors, layout->n_tensors, decay_all);
}

int sl_decay_mask_from_tensors(sl_decay_mask *mask, const sl_tensor_info *tensors, int n_tensors, int decay_all) {
    mask->ranges = NULL;
    mask->n = 0;
    sl_range *r = sl_malloc((size_t)(n_tensors > 0 ? n_tensors : 1) * sizeof *r, "decay mask");
    if (!r) return -1;
    int n = 0;
    for (int i = 0; i < n_tensors; i++) {
        const sl_tensor_info *t = &tensors[i];
        if (!(decay_all || t->weight_decay) || t->numel == 0) continue;
        if (n > 0 && r[n - 1].end == t->offset) r[n - 1].end += t->numel;  // merge adjacent
        else r[n++] = (sl_range){t->offset, t->offset + t->numel};
    }
    mask->ranges = r;
    mask->n = n;
    return 0;
}

void sl_decay_mask_free(sl_decay_mask *mask) {
    free(mask->ranges);
    mask->ranges = NULL;
    mask->n = 0;
}

// Segments covering [begin, end) in order, offsets relative to `begin`, each inside or outside the
// mask (NULL mask: one decaying segment).
typedef struct { sl_segment *v; int n, cap; } seg_list;

static int push_segment(seg_list *l, size_t a, size_t b, int decay) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        sl_segment *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return sl_errorf("out of memory listing optimizer segments");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (sl_segment){a, b, decay};
    return 0;
}

static int collect_segments(const sl_decay_mask *mask, size_t begin, size_t end, seg_list *l) {
    if (begin >= end) return 0;
    if (!mask) return push_segment(l, 0, end - begin, 1);
    size_t pos = begin;
    // First range that ends after `begin` (binary search; ranges are sorted and disjoint).
    int lo = 0, hi = mask->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (mask->ranges[mid].end <= begin) lo = mid + 1;
        else hi = mid;
    }
    for (int i = lo; i < mask->n && pos < end; i++) {
        size_t a = mask->ranges[i].begin, b = mask->ranges[i].end;
        if (a >= end) break;
        if (a > pos) {
            if (push_segment(l, pos - begin, a - begin, 0)) return -1;
            pos = a;
        }
        size_t stop = b < end ? b : end;
        if (push_segment(l, pos - begin, stop - begin, 1)) return -1;
        pos = stop;
    }
    if (pos < end) return push_segment(l, pos - begin, end - begin, 0);
    return 0;
}

int sl_optim_segments(const sl_optim_config *cfg, const sl_decay_mask *mask, size_t begin, size_t end,
                      sl_segment **segs, int *n_segs) {
    seg_list l = {0};
    int rc = collect_segments(cfg->weight_decay == 0.0 ? NULL : mask, begin, end, &l);
    *segs = rc ? NULL : l.v;
    *n_segs = rc ? 0 : l.n;
    if (rc) free(l.v);
    return rc;
}

// ---- Adam / AdamW ------------------------------------------------------------------------------

void sl_adam_args_make(const sl_optim_config *cfg, double lr, int64_t step, sl_adam_args *a) {
    double dlr = lr, b1 = cfg->beta1, b2 = cfg->beta2, wd = cfg->weight_decay;
    double bc1 = 1.0 - pow(b1, (double)step);
    double bc2 = 1.0 - pow(b2, (double)step);
    int decoupled = cfg->type == SL_OPTIM_ADAMW;
    *a = (sl_adam_args){
        .decay_factor = decoupled && wd != 0.0 ? (float)(1.0 - dlr * wd) : 1.0f,
        .l2 = !decoupled && wd != 0.0 ? (float)wd : 0.0f,
        .w1 = (float)(1.0 - b1),
        .beta2 = (float)b2,
        .one_minus_beta2 = (float)(1.0 - b2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = (float)cfg->eps,
        .neg_step = (float)(-(dlr / bc1)),
        .grad_coef = 1.0f,
        .storage_bf16 = NULL,
    };
    a->lerp_low = a->w1 < 0.5f;
}

// ---- SGD ---------------------------------------------------------------------------------------

void sl_sgd_args_make(const sl_optim_config *cfg, double lr, int64_t step, sl_sgd_args *a) {
    *a = (sl_sgd_args){
        .wd = (float)cfg->weight_decay, .momentum = (float)cfg->momentum,
        .one_minus_dampening = (float)(1.0 - cfg->dampening),
        .neg_lr = (float)-lr, .first = step <= 1, .nesterov = cfg->nesterov, .has_buf = cfg->momentum != 0.0,
    };
}

int sl_optim_step_on(const sl_ops *ops, const sl_optim_config *cfg, double lr, int64_t step, float *params,
                     const float *grads, float grad_coef, void *storage_bf16, float *const *state,
                     const sl_decay_mask *mask, size_t begin, size_t end) {
    if (step < 1) return sl_errorf("optimizer step number must start at 1, got %lld", (long long)step);
    const int adam = cfg->type == SL_OPTIM_ADAM || cfg->type == SL_OPTIM_ADAMW;
    if (grad_coef != 1.0f && !adam)
        return sl_errorf("%s takes its gradients as they are (scale them first), not times %g",
                         sl_optim_name(cfg->type), (double)grad_coef);
    if (storage_bf16 && !adam)
        return sl_errorf("%s writes no bf16 copy of the parameters (convert them after the step)",
                         sl_optim_name(cfg->type));
    if (begin > end) return sl_errorf("optimizer range [%zu, %zu) is reversed", begin, end);
    int need = sl_optim_num_state_buffers(cfg);
    for (int i = 0; i < need; i++)
        if (!state || !state[i])
            return sl_errorf("%s needs %d state buffers; buffer %d is NULL", sl_optim_name(cfg->type), need, i);
    sl_segment *segs;
    int n;
    if (sl_optim_segments(cfg, mask, begin, end, &segs, &n)) return -1;
    if (cfg->type == SL_OPTIM_ADAMW8BIT) {
        free(segs);
        return sl_errorf("AdamW8bit keeps 8-bit state: step it with sl_adam8_step (optim_8bit.h)");
    }
    if (cfg->type == SL_OPTIM_SGD) {
        sl_sgd_args a;
        sl_sgd_args_make(cfg, lr, step, &a);
        ops->sgd_step(&a, params, grads, need ? state[0] : NULL, segs, n);
    } else {
        sl_adam_args a;
        sl_adam_args_make(cfg, lr, step, &a);
        a.grad_coef = grad_coef;
        a.storage_bf16 = storage_bf16;
        ops->adam_step(&a, params, grads, state[0], state[1], segs, n);
    }
    free(segs);
    return 0;
}

int sl_optim_step(const sl_optim_config *cfg, double lr, int64_t step, float *params, const float *grads,
                  float *const *state, const sl_decay_mask *mask, size_t begin, size_t end) {
    return sl_optim_step_on(&sl_ops_cpu, cfg, lr, step, params, grads, 1.0f, NULL, state, mask, begin, end);
}

// ---- gradient norm -----------------------------------------------------------------------------

double sl_clip_coef(double norm, float max_norm) {
    if (!(max_norm > 0.0f)) return 1.0;
    double coef = (double)max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

double sl_clip_grad_norm(float *g, size_t n, float max_norm) {
    double norm = sqrt(sl_ops_cpu.sumsq(g, n));
    double coef = sl_clip_coef(norm, max_norm);
    if (coef != 1.0) sl_ops_cpu.scale(g, n, (float)coef);
    return norm;
}
