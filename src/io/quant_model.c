// quant_model.c: quantising a loaded model's linears, and reading / writing the 4-bit and 8-bit
// directories of transformers + bitsandbytes (see quant_model.h).
#include "shardlm/quant_model.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/hf_weights.h"
#include "shardlm/json_get.h"
#include "shardlm/quant_state.h"
#include "shardlm/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_CAP 160

int sl_quant_model_wants(const sl_param_layout *L, int t) { return sl_layout_is_block_linear(L, t); }

void sl_quant_model_free(sl_quant_model *qm) {
    for (int t = 0; qm->q && t < qm->n_tensors; t++) sl_qtensor_free(&qm->q[t]);
    free(qm->q);
    memset(qm, 0, sizeof *qm);
}

size_t sl_quant_model_bytes(const sl_quant_model *qm) {
    size_t b = 0;
    for (int t = 0; t < qm->n_tensors; t++)
        if (qm->q[t].type != SL_QUANT_NONE) b += sl_qtensor_bytes(&qm->q[t]);
    return b;
}

int sl_quant_model_begin(sl_quant_model *qm, const sl_param_layout *L, const sl_quant_config *qc) {
    memset(qm, 0, sizeof *qm);
    qm->qc = *qc;
    qm->q = sl_calloc((size_t)L->n_tensors, sizeof *qm->q, "quantised weights");
    if (!qm->q) return -1;
    qm->n_tensors = L->n_tensors;
    return 0;
}

int sl_quant_model_quantize_one(sl_quant_model *qm, const sl_param_layout *L, int t, const float *w,
                                sl_quant_dtype src_dtype) {
    const sl_tensor_info *x = &L->tensors[t];
    const sl_quant_config *qc = &qm->qc;
    int rc = qc->type == SL_QUANT_INT8
                 ? sl_quantize_int8(&qm->q[t], w, x->shape[0], x->shape[1], src_dtype)
                 : sl_quantize_4bit(&qm->q[t], w, x->shape[0], x->shape[1], qc->type, qc->blocksize, qc->double_quant,
                                    src_dtype, 0);
    return rc ? sl_error_context("quantising %s", x->name) : 0;
}

int sl_quant_model_quantize(sl_quant_model *qm, const sl_param_layout *L, float *params, const sl_quant_config *qc,
                            sl_quant_dtype src_dtype) {
    if (qc->type == SL_QUANT_NONE) return sl_errorf("quantising a model: no quantisation type given");
    for (int t = 0; t < L->n_tensors; t++)
        if (L->tensors[t].quantised)
            return sl_errorf("quantising a model: %s holds no full-precision values in this layout", L->tensors[t].name);
    if (sl_quant_model_begin(qm, L, qc)) return -1;
    for (int t = 0; t < L->n_tensors; t++) {
        if (!sl_quant_model_wants(L, t)) continue;
        if (sl_quant_model_quantize_one(qm, L, t, params + L->tensors[t].offset, src_dtype)) {
            sl_quant_model_free(qm);
            return -1;
        }
    }
    for (int t = 0; t < L->n_tensors; t++)
        if (qm->q[t].type != SL_QUANT_NONE) memset(params + L->tensors[t].offset, 0, L->tensors[t].numel * sizeof(float));
    return 0;
}

int sl_quant_model_read_config(const char *dir, sl_quant_config *qc, int *present) {
    char path[4200], where[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sl_quant_config_default(qc);
    *present = 0;
    cJSON *root = sl_json_read_strict(path);
    if (!root) return -1;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    snprintf(where, sizeof where, "%s: quantization_config", path);
    int rc = sl_quant_config_parse(q, qc, where);
    *present = !rc && q && !cJSON_IsNull(q);
    cJSON_Delete(root);
    return rc;
}

// One linear of `parts` consecutive layout tensors from `first` (contiguous in the flat buffer).
static int add_linear(const sl_quant_model *qm, const sl_param_layout *L, const float *params, int first, int parts,
                      sl_quant_ops_entry *e) {
    const sl_qtensor *q[SL_QLINEAR_MAX_PARTS];
    size_t off = L->tensors[first].offset;
    for (int k = 0; k < parts; k++) {
        int t = first + k;
        if (t >= L->n_tensors || qm->q[t].type == SL_QUANT_NONE || L->tensors[t].offset != off)
            return sl_errorf("%s: not a quantised part %d of the linear starting at %s", t < L->n_tensors ?
                             L->tensors[t].name : "(end)", k, L->tensors[first].name);
        q[k] = &qm->q[t];
        off += sl_layout_stored(&L->tensors[t]);
    }
    e->weight = params + L->tensors[first].offset;
    return sl_qlinear_init(&e->lin, parts, q, L->tensors[first].name);
}

int sl_quant_model_linears(const sl_quant_model *qm, const sl_param_layout *L, const float *params,
                           sl_quant_ops_entry *entries, int *n) {
    int gpt2 = L->cfg.arch == SL_ARCH_GPT2;
    *n = 0;
    for (int l = 0; l < L->cfg.n_layer; l++) {
        const sl_block_tensors *b = &L->blocks[l];
        if (add_linear(qm, L, params, b->qkv_w, gpt2 ? 1 : 3, &entries[(*n)++]) ||
            add_linear(qm, L, params, b->attn_proj_w, 1, &entries[(*n)++]) ||
            add_linear(qm, L, params, b->fc_w, gpt2 ? 1 : 2, &entries[(*n)++]) ||
            add_linear(qm, L, params, b->mlp_proj_w, 1, &entries[(*n)++]))
            return -1;
    }
    return 0;
}

// ---------------------------------------------------------------- reading

typedef struct {
    sl_st_file f;
    unsigned char *used;   // per file tensor: consumed by the model
} bnb_file;

// Finds "base+suffix"; -1 (no message) when absent.
static int find(bnb_file *b, const char *base, const char *suffix) {
    char name[NAME_CAP + 64];
    snprintf(name, sizeof name, "%s%s", base, suffix);
    return sl_st_find(&b->f, name);
}

// Tensor base+suffix must exist with dtype dt and numel elements; marks it used; returns its index.
static int expect(bnb_file *b, const char *base, const char *suffix, sl_st_dtype dt, size_t numel) {
    int i = find(b, base, suffix);
    if (i < 0) return sl_errorf("%s: tensor \"%s%s\" is missing", b->f.path, base, suffix), -1;
    const sl_st_tensor *t = &b->f.tensors[i];
    if (t->dtype != dt || t->numel != numel)
        return sl_errorf("%s: tensor \"%s\": %s with %zu elements, expected %s with %zu", b->f.path, t->name,
                         sl_st_dtype_name(t->dtype), t->numel, sl_st_dtype_name(dt), numel), -1;
    b->used[i] = 1;
    return i;
}

static int all_finite(const float *x, size_t n, const char *path, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return sl_errorf("%s: tensor \"%s\": element %zu is not finite", path, name, i);
    return 0;
}

// Reads tensor i's bytes into a new buffer of `bytes` bytes (checked by expect()).
static void *read_new(bnb_file *b, int i, size_t bytes, const char *what) {
    void *p = sl_malloc(bytes ? bytes : 1, what);
    if (p && sl_st_read_raw(&b->f, i, p, bytes)) { free(p); return NULL; }
    return p;
}

static int load_4bit(bnb_file *b, const char *base, const sl_tensor_info *x, int qs, sl_qtensor *q) {
    const sl_st_tensor *st = &b->f.tensors[qs];
    char where[NAME_CAP + 4400];
    snprintf(where, sizeof where, "%s: tensor \"%s\"", b->f.path, st->name);
    size_t len = st->numel;
    char *text = sl_malloc(len + 1, "quant_state");
    if (!text || sl_st_read_raw(&b->f, qs, text, len)) { free(text); return -1; }
    text[len] = 0;
    int rc = sl_quant_state_parse(text, len, q, where);
    free(text);
    if (rc) return -1;
    const char *suffix = strrchr(st->name, '_');   // ..._nf4 / ..._fp4 names the type too
    if (!suffix || strcmp(suffix + 1, sl_quant_name(q->type)))
        return sl_errorf("%s: quant_type \"%s\" disagrees with the tensor's name", where, sl_quant_name(q->type));
    if (q->rows != x->shape[0] || q->cols != x->shape[1])
        return sl_errorf("%s: shape [%lld, %lld], the model's %s is [%d, %d]", where, (long long)q->rows,
                         (long long)q->cols, x->name, x->shape[0], x->shape[1]);
    q->n_blocks = (q->numel + (size_t)q->blocksize - 1) / (size_t)q->blocksize;
    sl_quant_4bit_code(q->type, q->code);
    int i = expect(b, base, "", SL_ST_U8, (q->numel + 1) / 2);
    if (i < 0 || !(q->data = read_new(b, i, (q->numel + 1) / 2, "4-bit codes"))) return -1;
    float code[16];
    if ((i = expect(b, base, ".quant_map", SL_ST_F32, 16)) < 0 || sl_st_read_raw(&b->f, i, code, sizeof code)) return -1;
    if (memcmp(code, q->code, sizeof code))
        return sl_errorf("%s: tensor \"%s.quant_map\" is not bitsandbytes' %s table (corrupt, or a custom code shardlm "
                         "does not read)", b->f.path, base, sl_quant_name(q->type));
    if (!q->nested) {
        if ((i = expect(b, base, ".absmax", SL_ST_F32, q->n_blocks)) < 0 ||
            !(q->absmax = read_new(b, i, q->n_blocks * 4, "4-bit block scales")))
            return -1;
        return all_finite(q->absmax, q->n_blocks, b->f.path, b->f.tensors[i].name);
    }
    size_t nn = (q->n_blocks + SL_QUANT_NESTED_BLOCK - 1) / SL_QUANT_NESTED_BLOCK;
    if ((i = expect(b, base, ".absmax", SL_ST_U8, q->n_blocks)) < 0 || !(q->qabsmax = read_new(b, i, q->n_blocks, "scales")))
        return -1;
    if ((i = expect(b, base, ".nested_absmax", SL_ST_F32, nn)) < 0 ||
        !(q->nested_absmax = read_new(b, i, nn * 4, "nested scales")) ||
        all_finite(q->nested_absmax, nn, b->f.path, b->f.tensors[i].name))
        return -1;
    if ((i = expect(b, base, ".nested_quant_map", SL_ST_F32, 256)) < 0 ||
        sl_st_read_raw(&b->f, i, q->nested_code, sizeof q->nested_code) ||
        all_finite(q->nested_code, 256, b->f.path, b->f.tensors[i].name))
        return -1;
    return 0;
}

static int load_int8(bnb_file *b, const char *base, const char *mod, const sl_tensor_info *x, sl_qtensor *q) {
    q->type = SL_QUANT_INT8;
    q->rows = x->shape[0];
    q->cols = x->shape[1];
    q->numel = x->numel;
    int i = expect(b, base, "", SL_ST_I8, q->numel);
    if (i < 0 || !(q->data = read_new(b, i, q->numel, "int8 weight"))) return -1;
    if ((i = expect(b, mod, ".SCB", SL_ST_F32, (size_t)q->rows)) < 0 ||
        !(q->scb = read_new(b, i, (size_t)q->rows * 4, "SCB")) ||
        all_finite(q->scb, (size_t)q->rows, b->f.path, b->f.tensors[i].name))
        return -1;
    for (int64_t r = 0; r < q->rows; r++)
        if (q->scb[r] < 0) return sl_errorf("%s: tensor \"%s.SCB\": row %lld has a negative scale", b->f.path, mod, (long long)r);
    if ((i = find(b, mod, ".weight_format")) >= 0) {
        uint8_t fmt = 1;
        if (b->f.tensors[i].dtype != SL_ST_U8 || b->f.tensors[i].numel != 1 || sl_st_read_raw(&b->f, i, &fmt, 1) ||
            fmt != 0)
            return sl_errorf("%s: tensor \"%s.weight_format\" must be U8 0 (row-major, all bitsandbytes writes now)",
                             b->f.path, mod);
        b->used[i] = 1;
    }
    return 0;
}

// Reads tensor t of the layout kept in full precision (F32 / F16 / BF16 / F64) into params.
static int load_float(bnb_file *b, const sl_tensor_info *x, float *params) {
    int i = sl_st_find(&b->f, x->name);
    if (i < 0) return sl_errorf("%s: tensor \"%s\" is missing", b->f.path, x->name);
    const sl_st_tensor *st = &b->f.tensors[i];
    size_t stored = (size_t)x->hf_rows * (x->ndim == 2 ? (size_t)x->shape[1] : 1);
    int64_t want0 = x->ndim == 2 && x->hf_transposed ? x->shape[1] : x->hf_rows;
    if (x->hf_transposed || st->ndim != x->ndim || st->shape[0] != want0 || (x->ndim == 2 && st->shape[1] != x->shape[1]))
        return sl_errorf("%s: tensor \"%s\": shape or layout does not match the model's [%d%s%d]", b->f.path, x->name,
                         x->hf_rows, x->ndim == 2 ? ", " : "", x->ndim == 2 ? x->shape[1] : 0);
    b->used[i] = 1;
    float *dst = params + x->offset;
    if (sl_st_read_f32(&b->f, i, dst, stored)) return -1;
    memset(dst + stored, 0, (x->numel - stored) * sizeof(float));
    return 0;
}

// The module name of weight "X.weight" (X), or -1 when the name does not end in ".weight".
static int module_of(const char *name, char *mod, size_t cap) {
    size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 7, ".weight") || n - 7 >= cap) return -1;
    memcpy(mod, name, n - 7);
    mod[n - 7] = 0;
    return 0;
}

static int load_all(bnb_file *b, sl_quant_model *qm, const sl_param_layout *L, float *params) {
    for (int t = 0; t < L->n_tensors; t++) {
        const sl_tensor_info *x = &L->tensors[t];
        if (!sl_quant_model_wants(L, t)) { if (load_float(b, x, params)) return -1; continue; }
        char mod[NAME_CAP];
        if (module_of(x->name, mod, sizeof mod)) return sl_errorf("%s: not a linear weight's name", x->name);
        memset(params + x->offset, 0, sl_layout_stored(x) * sizeof(float));
        sl_qtensor *q = &qm->q[t];
        if (qm->qc.type == SL_QUANT_INT8) { if (load_int8(b, x->name, mod, x, q)) return -1; }
        else {
            const char *qsuffix = qm->qc.type == SL_QUANT_NF4 ? ".quant_state.bitsandbytes__nf4"
                                                               : ".quant_state.bitsandbytes__fp4";
            int qs = find(b, x->name, qsuffix);
            if (qs < 0) {
                int other = find(b, x->name, qm->qc.type == SL_QUANT_NF4 ? ".quant_state.bitsandbytes__fp4"
                                                                         : ".quant_state.bitsandbytes__nf4");
                return sl_errorf("%s: tensor \"%s%s\" is missing%s", b->f.path, x->name, qsuffix,
                                 other >= 0 ? " (the file holds the other 4-bit type than config.json says)" : "");
            }
            if (b->f.tensors[qs].dtype != SL_ST_U8)
                return sl_errorf("%s: tensor \"%s\": dtype %s, expected U8 (JSON bytes)", b->f.path,
                                 b->f.tensors[qs].name, sl_st_dtype_name(b->f.tensors[qs].dtype));
            b->used[qs] = 1;
            if (load_4bit(b, x->name, x, qs, q)) return -1;
            if (q->nested != qm->qc.double_quant) qm->qc.double_quant = q->nested;   // the file decides
        }
        char what[NAME_CAP + 4200];
        snprintf(what, sizeof what, "%s: %s", b->f.path, x->name);
        if (sl_qtensor_validate(q, what)) return -1;
    }
    // every tensor of the file belongs to the model (a tied lm_head equal to the embedding may be
    // written and is skipped)
    for (int i = 0; i < b->f.n_tensors; i++) {
        if (b->used[i]) continue;
        if (L->lm_head < 0 && strcmp(b->f.tensors[i].name, "lm_head.weight") == 0) {
            int e = sl_st_find(&b->f, L->tensors[L->wte].name);   // there: load_float read it by this name
            if (sl_hf_check_tied_head(&b->f, i, &b->f, e, L->cfg.arch)) return -1;
            continue;
        }
        return sl_errorf("%s: unexpected tensor \"%s\" (not part of this %s model quantised as %s)", b->f.path,
                         b->f.tensors[i].name, L->cfg.arch == SL_ARCH_GPT2 ? "GPT-2" : "LLaMA-family",
                         sl_quant_name(qm->qc.type));
    }
    return 0;
}

int sl_quant_model_load(sl_quant_model *qm, const char *dir, const sl_param_layout *L, float *params) {
    sl_quant_config qc;
    int present;
    memset(qm, 0, sizeof *qm);
    if (sl_quant_model_read_config(dir, &qc, &present)) return -1;
    if (!present) return sl_errorf("%s/config.json: no quantization_config (not a bitsandbytes 4-bit / 8-bit model)", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    bnb_file b = {0};
    if (sl_st_open(&b.f, path)) {
        char idx[4300];
        snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
        FILE *fi = fopen(idx, "rb");
        if (fi) { fclose(fi); return sl_errorf("%s: sharded quantised models are not read yet (one model.safetensors "
                                               "expected)", dir); }
        return -1;
    }
    float *staged = NULL;
    int rc = sl_quant_model_begin(qm, L, &qc);
    if (!rc && !(b.used = sl_calloc((size_t)b.f.n_tensors + 1, 1, "tensor marks"))) rc = -1;
    // params are written only when everything loaded: stage into a copy first
    if (!rc && !(staged = sl_malloc(L->total * sizeof(float), "staged parameters"))) rc = -1;
    if (!rc) {
        memcpy(staged, params, L->total * sizeof(float));
        rc = load_all(&b, qm, L, staged);
    }
    if (!rc) memcpy(params, staged, L->total * sizeof(float));
    free(staged);
    free(b.used);
    sl_st_close(&b.f);
    if (rc) { sl_quant_model_free(qm); return sl_error_context("loading quantised weights from %s", dir); }
    return 0;
}

// ---------------------------------------------------------------- writing

typedef struct {
    sl_st_desc *d;
    sl_st_dtype *dt;
    const void **data;   // per tensor: its bytes (NULL: params, read as float)
    char **names;
    char **owned;        // allocated data to free (quant_state texts)
    int n, cap, n_owned;
} plan;

static int plan_add(plan *p, const char *name, const char *suffix, sl_st_dtype dt, int ndim, int64_t d0, int64_t d1,
                    const void *data) {
    if (p->n == p->cap) return sl_errorf("internal: save plan full");
    char *nm = malloc(strlen(name) + strlen(suffix) + 1);
    if (!nm) return sl_errorf("out of memory");
    strcpy(nm, name);
    strcat(nm, suffix);
    p->names[p->n] = nm;
    p->d[p->n] = (sl_st_desc){.name = nm, .ndim = ndim, .shape = {d0, d1}};
    p->dt[p->n] = dt;
    p->data[p->n] = data;
    p->n++;
    return 0;
}

static int plan_tensor(plan *p, const sl_param_layout *L, int t, const sl_qtensor *q, const float *params) {
    const sl_tensor_info *x = &L->tensors[t];
    if (q->type == SL_QUANT_NONE) {
        if (x->hf_transposed) return sl_errorf("%s: a transposed full-precision weight cannot be saved here", x->name);
        return plan_add(p, x->name, "", SL_ST_F32, x->ndim, x->hf_rows, x->ndim == 2 ? x->shape[1] : 0,
                        params + x->offset);
    }
    if (q->type == SL_QUANT_INT8) {
        char mod[NAME_CAP];
        static const uint8_t row_major = 0;
        if (module_of(x->name, mod, sizeof mod)) return sl_errorf("%s: not a linear weight's name", x->name);
        return plan_add(p, x->name, "", SL_ST_I8, 2, q->rows, q->cols, q->data) ||
               plan_add(p, mod, ".SCB", SL_ST_F32, 1, q->rows, 0, q->scb) ||
               plan_add(p, mod, ".weight_format", SL_ST_U8, 0, 0, 0, &row_major);
    }
    char *js = sl_quant_state_json(q);
    if (!js) return -1;
    p->owned[p->n_owned++] = js;
    size_t nn = (q->n_blocks + SL_QUANT_NESTED_BLOCK - 1) / SL_QUANT_NESTED_BLOCK;
    int rc = plan_add(p, x->name, "", SL_ST_U8, 2, (int64_t)(q->numel + 1) / 2, 1, q->data) ||
             (q->nested ? plan_add(p, x->name, ".absmax", SL_ST_U8, 1, (int64_t)q->n_blocks, 0, q->qabsmax)
                        : plan_add(p, x->name, ".absmax", SL_ST_F32, 1, (int64_t)q->n_blocks, 0, q->absmax)) ||
             plan_add(p, x->name, ".quant_map", SL_ST_F32, 1, 16, 0, q->code);
    if (!rc && q->nested)
        rc = plan_add(p, x->name, ".nested_absmax", SL_ST_F32, 1, (int64_t)nn, 0, q->nested_absmax) ||
             plan_add(p, x->name, ".nested_quant_map", SL_ST_F32, 1, 256, 0, q->nested_code);
    if (!rc)
        rc = plan_add(p, x->name, q->type == SL_QUANT_NF4 ? ".quant_state.bitsandbytes__nf4"
                                                          : ".quant_state.bitsandbytes__fp4",
                      SL_ST_U8, 1, (int64_t)strlen(js), 0, js);
    return rc;
}

static size_t desc_bytes(const sl_st_desc *d, sl_st_dtype dt) {
    size_t n = sl_st_dtype_size(dt);
    for (int k = 0; k < d->ndim; k++) n *= (size_t)d->shape[k];
    return n;
}

static int write_config(const char *dir, const sl_quant_model *qm, const sl_model_config *cfg) {
    char *text = sl_config_to_json_text(cfg);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    cJSON *qj = root ? sl_quant_config_to_json(&qm->qc) : NULL;
    if (!qj) { cJSON_Delete(root); return sl_errorf("out of memory writing %s/config.json", dir); }
    cJSON_AddItemToObject(root, "quantization_config", qj);
    char *out = cJSON_Print(root);
    cJSON_Delete(root);
    if (!out) return sl_errorf("out of memory writing %s/config.json", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t n = strlen(out);
    out[n] = '\n';
    int rc = sl_write_file_atomic(path, out, n + 1);
    free(out);
    return rc;
}

int sl_quant_model_save(const char *dir, const sl_quant_model *qm, const sl_param_layout *L, const float *params) {
    if (qm->n_tensors != L->n_tensors) return sl_errorf("saving quantised weights: the model has another layout");
    plan p = {0};
    p.cap = 6 * L->n_tensors + 1;
    p.d = sl_calloc((size_t)p.cap, sizeof *p.d, "save plan");
    p.dt = sl_calloc((size_t)p.cap, sizeof *p.dt, "save plan");
    p.data = sl_calloc((size_t)p.cap, sizeof *p.data, "save plan");
    p.names = sl_calloc((size_t)p.cap, sizeof *p.names, "save plan");
    p.owned = sl_calloc((size_t)L->n_tensors + 1, sizeof *p.owned, "save plan");
    int rc = p.d && p.dt && p.data && p.names && p.owned ? 0 : -1;
    for (int t = 0; t < L->n_tensors && !rc; t++) rc = plan_tensor(&p, L, t, &qm->q[t], params);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    sl_st_writer *w = NULL;
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    if (!rc) rc = sl_mkdirs(dir);
    if (!rc) rc = sl_st_writer_open_dtypes(&w, path, p.n, p.d, p.dt, 1, mk, mv);
    for (int i = 0; i < p.n && !rc; i++) rc = sl_st_writer_write_raw(w, p.data[i], desc_bytes(&p.d[i], p.dt[i]));
    if (w) rc = rc ? (sl_st_writer_abort(w), -1) : sl_st_writer_finish(w);
    if (!rc) rc = write_config(dir, qm, &L->cfg);
    for (int i = 0; i < p.n; i++) free(p.names[i]);
    for (int i = 0; i < p.n_owned; i++) free(p.owned[i]);
    free(p.d); free(p.dt); free(p.data); free(p.names); free(p.owned);
    return rc ? sl_error_context("saving quantised weights to %s", dir) : 0;
}

// config.json's "dtype" (transformers 5) or "torch_dtype" (4.x); float32 when absent or unknown.
sl_quant_dtype sl_quant_model_source_dtype(const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sl_quant_dtype dt = SL_QDT_F32;
    cJSON *root = sl_json_read_strict(path);
    if (!root) return dt;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "dtype");
    if (!cJSON_IsString(d)) d = cJSON_GetObjectItemCaseSensitive(root, "torch_dtype");
    if (cJSON_IsString(d) && sl_quant_dtype_parse(d->valuestring, &dt)) dt = SL_QDT_F32;
    cJSON_Delete(root);
    return dt;
}

int sl_quant_model_load_any(sl_quant_model *qm, const char *dir, const sl_param_layout *L, float *params,
                            const sl_quant_config *want, int *quantised) {
    sl_quant_config file_qc;
    int present = 0;
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    memset(qm, 0, sizeof *qm);
    *quantised = 0;
    FILE *f = fopen(cfg, "rb");
    if (f) {
        fclose(f);
        if (sl_quant_model_read_config(dir, &file_qc, &present)) return -1;
    }
    if (present) {
        if (want->type != SL_QUANT_NONE && want->type != file_qc.type)
            return sl_errorf("%s is already quantised as %s: --quantize %s cannot change that", dir,
                             sl_quant_name(file_qc.type), sl_quant_name(want->type));
        if (sl_quant_model_load(qm, dir, L, params)) return -1;
        *quantised = 1;
        return 0;
    }
    if (sl_hf_load(dir, L, params)) return -1;
    if (want->type == SL_QUANT_NONE) return 0;
    if (sl_quant_model_quantize(qm, L, params, want, sl_quant_model_source_dtype(dir))) return -1;
    *quantised = 1;
    return 0;
}
