// hf_weights.c: Hugging Face weight directories <-> the flat parameter buffer (see hf_weights.h).
// Owns the mapping between HF file tensors and layout.h tensors: name normalisation (GPT-2's
// optional "transformer." prefix), which file tensors are ignored (buffers, a tied lm_head equal to
// the embedding: tied_head.c), the Conv1D transposition, and the padded-vocabulary rows.
// Invariants: sl_hf_load validates every name, dtype and shape in every file before writing a
// single float into params, so a failed load leaves params untouched; padded rows are zero after
// a successful load. sl_hf_save streams tensor by tensor (memory: one small transpose buffer).
#include "shardlm/hf_weights.h"
#include "shardlm/quant_model.h"
#include "shardlm/json_get.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/precision.h"
#include "shardlm/safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PATH_CAP 4096
#define TRANSPOSE_ROWS 64

// out = a + "/" + b; an error if it does not fit.
static int path_join(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap) return sl_errorf("path too long: %s/%s", a, b);
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}
static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

// The shape HF stores for tensor t: (in, out) for Conv1D weights, hf_rows rows otherwise.
static int hf_shape(const sl_tensor_info *t, int64_t shape[2]) {
    if (t->ndim == 1) { shape[0] = t->hf_rows; return 1; }
    if (t->hf_transposed) { shape[0] = t->shape[1]; shape[1] = t->shape[0]; }
    else { shape[0] = t->hf_rows; shape[1] = t->shape[1]; }
    return 2;
}

// ---------------------------------------------------------------- save

// Writes count floats as dtype: F32 as they are, F16 / BF16 rounded to nearest even through a bounded buffer.
static int write_values(sl_st_writer *w, const float *data, size_t count, sl_st_dtype dtype) {
    if (dtype == SL_ST_F32) return sl_st_writer_write(w, data, count);
    uint16_t half[4096];
    for (size_t done = 0; done < count;) {
        size_t n = count - done < 4096 ? count - done : 4096;
        if (dtype == SL_ST_BF16) sl_f32_to_bf16_array(data + done, half, n);
        else sl_f32_to_fp16_array(data + done, half, n);
        if (sl_st_writer_write_raw(w, half, n * sizeof half[0])) return -1;
        done += n;
    }
    return 0;
}

// Writes W (rows, cols) transposed, i.e. as (cols, rows), in blocks of TRANSPOSE_ROWS output rows.
static int write_transposed(sl_st_writer *w, const float *W, int rows, int cols, float *buf, sl_st_dtype dtype) {
    for (int i0 = 0; i0 < cols; i0 += TRANSPOSE_ROWS) {
        int nb = cols - i0 < TRANSPOSE_ROWS ? cols - i0 : TRANSPOSE_ROWS;
        for (int r = 0; r < rows; r++) {
            const float *src = W + (size_t)r * cols + i0;
            for (int i = 0; i < nb; i++) buf[(size_t)i * rows + r] = src[i];
        }
        if (write_values(w, buf, (size_t)nb * rows, dtype)) return -1;
    }
    return 0;
}

static int save_safetensors(const char *path, const sl_param_layout *L, const float *params, sl_st_dtype dtype) {
    if (dtype != SL_ST_F32 && dtype != SL_ST_F16 && dtype != SL_ST_BF16)
        return sl_errorf("%s: Hugging Face weights are written as F32, F16 or BF16, not %s", path,
                         sl_st_dtype_name(dtype));
    sl_st_desc *desc = sl_calloc((size_t)L->n_tensors, sizeof *desc, "HF save tensor list");
    sl_st_dtype *dtypes = sl_calloc((size_t)L->n_tensors, sizeof *dtypes, "HF save tensor list");
    if (!desc || !dtypes) { free(desc); free(dtypes); return -1; }
    int max_rows = 1;
    for (int i = 0; i < L->n_tensors; i++) {
        const sl_tensor_info *t = &L->tensors[i];
        dtypes[i] = dtype;
        desc[i].name = t->name;
        desc[i].ndim = hf_shape(t, desc[i].shape);
        if (t->hf_transposed && t->shape[0] > max_rows) max_rows = t->shape[0];
    }
    float *buf = sl_malloc((size_t)max_rows * TRANSPOSE_ROWS * sizeof(float), "HF save transpose buffer");
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    sl_st_writer *w = NULL;
    int rc = !buf ? -1 : sl_st_writer_open_dtypes(&w, path, L->n_tensors, desc, dtypes, 1, mk, mv);
    for (int i = 0; i < L->n_tensors && rc == 0; i++) {
        const sl_tensor_info *t = &L->tensors[i];
        const float *src = params + t->offset;
        if (t->hf_transposed) rc = write_transposed(w, src, t->shape[0], t->shape[1], buf, dtype);
        else rc = write_values(w, src, (size_t)t->hf_rows * (size_t)t->shape[1], dtype);
    }
    if (rc == 0) rc = sl_st_writer_finish(w);
    else sl_st_writer_abort(w);
    free(buf);
    free(desc);
    free(dtypes);
    return rc ? sl_error_context("saving Hugging Face weights to %s", path) : 0;
}

int sl_hf_save(const char *dir_or_file, const sl_param_layout *L, const float *params) {
    return sl_hf_save_as(dir_or_file, L, params, SL_ST_F32);
}

// config.json's text with torch_dtype / dtype naming the stored dtype (malloc'd).
static char *config_text(const sl_model_config *cfg, sl_st_dtype dtype) {
    char *json = sl_config_to_json_text(cfg);
    if (!json || dtype == SL_ST_F32) return json;
    cJSON *root = cJSON_Parse(json);
    free(json);
    const char *name = dtype == SL_ST_BF16 ? "bfloat16" : "float16";
    if (!root || !cJSON_ReplaceItemInObject(root, "torch_dtype", cJSON_CreateString(name)) ||
        !cJSON_ReplaceItemInObject(root, "dtype", cJSON_CreateString(name))) {
        cJSON_Delete(root);
        sl_errorf("out of memory writing config.json");
        return NULL;
    }
    json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!json) sl_errorf("out of memory writing config.json");
    return json;
}

int sl_hf_save_as(const char *dir_or_file, const sl_param_layout *L, const float *params, sl_st_dtype dtype) {
    if (ends_with(dir_or_file, ".safetensors")) return save_safetensors(dir_or_file, L, params, dtype);
    char path[PATH_CAP];
    if (sl_mkdirs(dir_or_file)) return -1;
    if (path_join(path, sizeof path, dir_or_file, "model.safetensors")) return -1;
    if (save_safetensors(path, L, params, dtype)) return -1;
    char *json = config_text(&L->cfg, dtype);
    if (!json) return -1;
    if (path_join(path, sizeof path, dir_or_file, "config.json")) { free(json); return -1; }
    size_t n = strlen(json);
    json[n] = '\n';   // overwrite the terminator: the file ends in a newline, the buffer is not reused as a string
    int rc = sl_write_file_atomic(path, json, n + 1);
    free(json);
    return rc;
}

int sl_hf_load_config(const char *dir, sl_model_config *cfg) {
    char path[PATH_CAP];
    if (ends_with(dir, ".json")) snprintf(path, sizeof path, "%s", dir);
    else if (path_join(path, sizeof path, dir, "config.json")) return -1;
    return sl_config_load_json(cfg, path);
}

// ---------------------------------------------------------------- load

typedef struct {
    char **paths;           // n_files shard paths
    sl_st_file *files;
    int n_files;
    cJSON *index;           // parsed index (weight_map), or NULL for a single file
    char index_path[PATH_CAP];
} source;

static void source_free(source *s) {
    for (int i = 0; i < s->n_files; i++) {  // files is NULL when the index failed before the shards opened
        if (s->files) sl_st_close(&s->files[i]);
        free(s->paths[i]);
    }
    free(s->files);
    free(s->paths);
    cJSON_Delete(s->index);
    memset(s, 0, sizeof *s);
}

static int add_path(source *s, const char *path) {
    for (int i = 0; i < s->n_files; i++) if (strcmp(s->paths[i], path) == 0) return 0;
    char **np = realloc(s->paths, (size_t)(s->n_files + 1) * sizeof *np);
    if (!np) return sl_errorf("out of memory");
    s->paths = np;
    s->paths[s->n_files] = strdup(path);
    if (!s->paths[s->n_files]) return sl_errorf("out of memory");
    s->n_files++;
    return 0;
}

// Reads a model.safetensors.index.json and lists the shard files it names (relative to its directory).
static int read_index(source *s, const char *index_path) {
    snprintf(s->index_path, sizeof s->index_path, "%s", index_path);
    // strict: a tensor named twice in weight_map, or trailing data, is an error (cJSON keeps the first)
    s->index = sl_json_read_strict(index_path);
    if (!s->index) return -1;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
    if (!cJSON_IsObject(wm)) return sl_errorf("%s: missing object \"weight_map\"", index_path);
    char dir[PATH_CAP];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0'; else snprintf(dir, sizeof dir, ".");
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e))
            return sl_errorf("%s: weight_map[\"%s\"] must be a file name string", index_path, e->string);
        const char *fn = e->valuestring;
        if (!*fn || strchr(fn, '/') || strcmp(fn, "..") == 0 || strcmp(fn, ".") == 0)
            return sl_errorf("%s: weight_map[\"%s\"] = \"%s\": expected a plain file name in the same directory",
                             index_path, e->string, fn);
        char p[PATH_CAP];
        if (path_join(p, sizeof p, dir, fn) || add_path(s, p)) return -1;
    }
    if (s->n_files == 0) return sl_errorf("%s: weight_map is empty", index_path);
    return 0;
}

static int source_open(source *s, const char *path) {
    char p[PATH_CAP];
    if (is_dir(path)) {
        if (path_join(p, sizeof p, path, "model.safetensors")) return -1;
        if (is_file(p)) { if (add_path(s, p)) return -1; }
        else {
            if (path_join(p, sizeof p, path, "model.safetensors.index.json")) return -1;
            if (!is_file(p))
                return sl_errorf("%s: no model.safetensors or model.safetensors.index.json in this directory", path);
            if (read_index(s, p)) return -1;
        }
    } else if (ends_with(path, ".json")) {
        if (read_index(s, path)) return -1;
    } else if (add_path(s, path)) return -1;
    s->files = sl_calloc((size_t)s->n_files, sizeof *s->files, "safetensors shards");
    if (!s->files) return -1;
    for (int i = 0; i < s->n_files; i++) s->files[i].fd = -1;
    for (int i = 0; i < s->n_files; i++)
        if (sl_st_open(&s->files[i], s->paths[i])) return -1;
    // Every tensor the index promises must be in the shard it names.
    const cJSON *wm = s->index ? cJSON_GetObjectItemCaseSensitive(s->index, "weight_map") : NULL;
    for (const cJSON *e = wm ? wm->child : NULL; e; e = e->next) {
        const char *fn = e->valuestring;
        for (int i = 0; i < s->n_files; i++) {
            const char *base = strrchr(s->paths[i], '/');
            if (strcmp(base ? base + 1 : s->paths[i], fn) != 0) continue;
            if (sl_st_find(&s->files[i], e->string) < 0)
                return sl_errorf("%s: weight_map says tensor \"%s\" is in %s, but that file does not contain it",
                                 s->index_path, e->string, s->paths[i]);
        }
    }
    return 0;
}

int sl_hf_weights_dtype(const char *dir, sl_st_dtype *dtype) {
    source s;
    memset(&s, 0, sizeof s);
    int rc = source_open(&s, dir);
    for (int f = 0; rc == 0 && f < s.n_files; f++)
        for (int i = 0; i < s.files[f].n_tensors; i++)
            if (sl_st_dtype_is_float(s.files[f].tensors[i].dtype)) {
                *dtype = s.files[f].tensors[i].dtype;
                source_free(&s);
                return 0;
            }
    source_free(&s);
    return rc ? -1 : sl_errorf("%s: no floating-point tensors", dir);
}

// Non-parameter buffers some checkpoints carry.
static int is_buffer(const char *name) {
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") || ends_with(name, "rotary_emb.inv_freq");
}

typedef struct { int file, idx; } tensor_ref;

static void append_name(char *list, size_t cap, int *count, const char *name) {
    if (*count < 8) {
        size_t n = strlen(list);
        snprintf(list + n, cap - n, "%s\"%s\"", n ? ", " : "", name);
    }
    (*count)++;
}

// Matches every file tensor to a layout tensor and checks dtype and shape. Fills refs.
static int match_tensors(const source *s, const sl_param_layout *L, tensor_ref *refs) {
    char unexpected[1024] = "";
    int n_unexpected = 0;
    tensor_ref head = {-1, -1};   // a tied model's lm_head.weight, checked against the embedding below
    for (int k = 0; k < L->n_tensors; k++) refs[k].file = -1;
    for (int f = 0; f < s->n_files; f++) {
        const sl_st_file *F = &s->files[f];
        for (int i = 0; i < F->n_tensors; i++) {
            const sl_st_tensor *t = &F->tensors[i];
            char name[512];
            if (L->cfg.arch == SL_ARCH_GPT2 && strncmp(t->name, "transformer.", 12) != 0 &&
                strncmp(t->name, "lm_head.", 8) != 0)
                snprintf(name, sizeof name, "transformer.%s", t->name);
            else snprintf(name, sizeof name, "%s", t->name);
            int k = sl_layout_find(L, name);
            if (k < 0) {
                if (is_buffer(name)) continue;
                if (strcmp(name, "lm_head.weight") == 0 && L->lm_head < 0) {   // tied to the embedding
                    head = (tensor_ref){f, i};
                    continue;
                }
                append_name(unexpected, sizeof unexpected, &n_unexpected, t->name);
                continue;
            }
            if (refs[k].file >= 0)
                return sl_errorf("tensor \"%s\" appears twice: in %s and in %s", L->tensors[k].name,
                                 s->paths[refs[k].file], F->path);
            if (!sl_st_dtype_is_float(t->dtype))
                return sl_errorf("%s: tensor \"%s\": dtype %s is not supported (expected F32, F16, BF16 or F64)",
                                 F->path, t->name, sl_st_dtype_name(t->dtype));
            int64_t want[2];
            int nd = hf_shape(&L->tensors[k], want);
            if (t->ndim != nd || t->shape[0] != want[0] || (nd == 2 && t->shape[1] != want[1])) {
                char a[128], b[128];
                return sl_errorf("%s: tensor \"%s\": expected shape %s, found %s", F->path, t->name,
                                 sl_st_shape_str(a, sizeof a, nd, want), sl_st_shape_str(b, sizeof b, t->ndim, t->shape));
            }
            refs[k] = (tensor_ref){f, i};
        }
    }
    if (n_unexpected)
        return sl_errorf("%d unexpected parameter tensor%s not in the %s model: %s%s", n_unexpected,
                         n_unexpected > 1 ? "s" : "", L->cfg.arch == SL_ARCH_GPT2 ? "GPT-2" : "LLaMA", unexpected,
                         n_unexpected > 8 ? ", ..." : "");
    char missing[1024] = "";
    int n_missing = 0;
    for (int k = 0; k < L->n_tensors; k++)
        if (refs[k].file < 0) append_name(missing, sizeof missing, &n_missing, L->tensors[k].name);
    if (n_missing)
        return sl_errorf("%d tensor%s missing: %s%s", n_missing, n_missing > 1 ? "s" : "", missing,
                         n_missing > 8 ? ", ..." : "");
    if (head.file >= 0) {
        tensor_ref e = refs[L->wte];
        return sl_hf_check_tied_head(&s->files[head.file], head.idx, &s->files[e.file], e.idx, L->cfg.arch);
    }
    return 0;
}

static int load_tensors(const source *s, const sl_param_layout *L, const tensor_ref *refs, float *params,
                        sl_hf_tensor_sink sink, void *ctx) {
    size_t max_t = 0, max_q = 0;
    for (int k = 0; k < L->n_tensors; k++) {
        if (L->tensors[k].hf_transposed && L->tensors[k].numel > max_t) max_t = L->tensors[k].numel;
        if (L->tensors[k].quantised && L->tensors[k].numel > max_q) max_q = L->tensors[k].numel;
    }
    if (max_q && !sink) return sl_errorf("internal: a quantised layout loaded without a quantiser");
    float *tmp = max_t ? sl_malloc(max_t * sizeof(float), "HF load transpose buffer") : NULL;
    float *one = max_q ? sl_malloc(max_q * sizeof(float), "HF load tensor buffer") : NULL;   // a quantised tensor
    int rc = (max_t && !tmp) || (max_q && !one) ? -1 : 0;
    for (int k = 0; k < L->n_tensors && !rc; k++) {
        const sl_tensor_info *t = &L->tensors[k];
        const sl_st_file *F = &s->files[refs[k].file];
        float *dst = t->quantised ? one : params + t->offset;
        if (!t->hf_transposed) {
            size_t stored = (size_t)t->hf_rows * (size_t)t->shape[1];
            rc = sl_st_read_f32(F, refs[k].idx, dst, stored);
            if (!rc) memset(dst + stored, 0, (t->numel - stored) * sizeof(float));   // padded vocabulary rows
        } else {
            int rows = t->shape[0], cols = t->shape[1];   // internal (out, in); file holds (in, out)
            rc = sl_st_read_f32(F, refs[k].idx, tmp, max_t);
            for (int i0 = 0; i0 < cols && !rc; i0 += TRANSPOSE_ROWS) {
                int nb = cols - i0 < TRANSPOSE_ROWS ? cols - i0 : TRANSPOSE_ROWS;
                for (int r = 0; r < rows; r++)
                    for (int i = 0; i < nb; i++) dst[(size_t)r * cols + i0 + i] = tmp[(size_t)(i0 + i) * rows + r];
            }
        }
        if (!rc && t->quantised) {
            params[t->offset] = 0.0f;   // the placeholder
            rc = sink(ctx, k, one);
        }
    }
    free(tmp);
    free(one);
    return rc;
}

int sl_hf_load(const char *dir, const sl_param_layout *L, float *params) {
    return sl_hf_load_each(dir, L, params, NULL, NULL);
}

int sl_hf_load_each(const char *dir, const sl_param_layout *L, float *params, sl_hf_tensor_sink sink, void *ctx) {
    char cfg[PATH_CAP];
    sl_quant_config qc;
    int quantised = 0;
    if (is_dir(dir) && !path_join(cfg, sizeof cfg, dir, "config.json") && is_file(cfg) &&
        sl_quant_model_read_config(dir, &qc, &quantised) == 0 && quantised)
        return sl_errorf("%s: a bitsandbytes %s model (config.json has a quantization_config): its weights load only "
                         "quantised (shardlm generate reads them), not as full-precision parameters", dir,
                         sl_quant_name(qc.type));
    source s = {0};
    tensor_ref *refs = sl_calloc((size_t)L->n_tensors, sizeof *refs, "HF load tensor map");
    int rc = !refs ? -1 : source_open(&s, dir);
    if (!rc) rc = match_tensors(&s, L, refs);
    if (!rc) rc = load_tensors(&s, L, refs, params, sink, ctx);
    source_free(&s);
    free(refs);
    return rc ? sl_error_context("loading Hugging Face weights from %s", dir) : 0;
}
