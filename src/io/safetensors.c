// safetensors.c: the safetensors reader and the streaming writer (F32, or raw bytes of any dtype) (see safetensors.h).
// Reader invariants after a successful sl_st_open: every tensor has a known dtype, 0 <= ndim <= 8,
// non-negative dims whose product times the dtype size equals end - begin (no overflow), and the
// tensors tile the data section exactly (contiguous from 0 to the file's end); names are unique. Only then is data read,
// with pread at checked offsets. Writer invariants: the file appears under its final name only
// when complete and fsync'd; the data section starts at a multiple of 8 (header padded with spaces).
// Assumes a little-endian host (as the format does).
#include "shardlm/safetensors.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

typedef struct { const char *name; sl_st_dtype dt; size_t size; } dtype_info;
static const dtype_info dtypes[] = {
    {"F32", SL_ST_F32, 4},   {"F16", SL_ST_F16, 2},   {"BF16", SL_ST_BF16, 2}, {"F64", SL_ST_F64, 8},
    {"I8", SL_ST_I8, 1},     {"U8", SL_ST_U8, 1},     {"I16", SL_ST_I16, 2},   {"U16", SL_ST_U16, 2},
    {"I32", SL_ST_I32, 4},   {"U32", SL_ST_U32, 4},   {"I64", SL_ST_I64, 8},   {"U64", SL_ST_U64, 8},
    {"BOOL", SL_ST_BOOL, 1}, {"F8_E4M3", SL_ST_F8_E4M3, 1}, {"F8_E5M2", SL_ST_F8_E5M2, 1},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *sl_st_dtype_name(sl_st_dtype dt) {
    for (size_t i = 0; i < N_DTYPES; i++) if (dtypes[i].dt == dt) return dtypes[i].name;
    return "?";
}
size_t sl_st_dtype_size(sl_st_dtype dt) {
    for (size_t i = 0; i < N_DTYPES; i++) if (dtypes[i].dt == dt) return dtypes[i].size;
    return 0;
}
int sl_st_dtype_is_float(sl_st_dtype dt) {
    return dt == SL_ST_F32 || dt == SL_ST_F16 || dt == SL_ST_BF16 || dt == SL_ST_F64;
}

char *sl_st_shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    n += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

// ---------------------------------------------------------------- reader

static void free_contents(sl_st_file *f) {
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) { free(f->meta_keys[i]); free(f->meta_values[i]); }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
}

void sl_st_close(sl_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free_contents(f);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

static int read_exact(int fd, void *buf, size_t len, uint64_t off) {
    char *p = buf;
    while (len > 0) {
        ssize_t r = pread(fd, p, len, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r; len -= (size_t)r; off += (uint64_t)r;
    }
    return 0;
}

// A JSON number that is a non-negative integer representable exactly (< 2^53).
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > 9007199254740992.0 || d != (double)(uint64_t)d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int parse_metadata(sl_st_file *f, const cJSON *meta) {
    const char *p = f->path;
    if (!cJSON_IsObject(meta)) return sl_errorf("%s: \"__metadata__\" must be an object of strings", p);
    int n = cJSON_GetArraySize(meta);
    f->meta_keys = sl_calloc((size_t)n, sizeof(char *), "safetensors metadata");
    f->meta_values = sl_calloc((size_t)n, sizeof(char *), "safetensors metadata");
    if (!f->meta_keys || !f->meta_values) return -1;
    for (const cJSON *m = meta->child; m; m = m->next) {
        if (!cJSON_IsString(m) || !m->string)
            return sl_errorf("%s: \"__metadata__\" key \"%s\": expected a string value", p, m->string ? m->string : "?");
        f->meta_keys[f->n_meta] = strdup(m->string);
        f->meta_values[f->n_meta] = strdup(m->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1]) return sl_errorf("out of memory");
    }
    return 0;
}

static int parse_tensor(sl_st_file *f, const cJSON *e, uint64_t data_size, sl_st_tensor *t) {
    const char *p = f->path, *name = e->string;
    char sbuf[256];
    if (!cJSON_IsObject(e)) return sl_errorf("%s: tensor \"%s\": expected an object with dtype, shape, data_offsets", p, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return sl_errorf("%s: tensor \"%s\": missing string field \"dtype\"", p, name);
    if (!cJSON_IsArray(sh)) return sl_errorf("%s: tensor \"%s\": missing array field \"shape\"", p, name);
    if (!cJSON_IsArray(of)) return sl_errorf("%s: tensor \"%s\": missing array field \"data_offsets\"", p, name);
    size_t esize = 0;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, dt->valuestring) == 0) { t->dtype = dtypes[i].dt; esize = dtypes[i].size; }
    if (!esize)
        return sl_errorf("%s: tensor \"%s\": unknown dtype \"%s\" (expected F32, F16, BF16, F64 or an integer type)",
                         p, name, dt->valuestring);
    int nd = cJSON_GetArraySize(sh);
    if (nd > SL_ST_MAX_DIMS) return sl_errorf("%s: tensor \"%s\": %d dims, at most %d supported", p, name, nd, SL_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (cJSON_IsNumber(d) && d->valuedouble < 0)
            return sl_errorf("%s: tensor \"%s\": negative dimension %g in shape", p, name, d->valuedouble);
        if (json_uint(d, &v)) {
            char num[40];
            return sl_errorf("%s: tensor \"%s\": shape entries must be integers in [0, 2^53], found %s", p, name,
                             cJSON_IsNumber(d) ? sl_json_number_str(num, sizeof num, d->valuedouble) : "a non-number");
        }
        t->shape[i] = (int64_t)v;
        if (v != 0 && numel > UINT64_MAX / v) return sl_errorf("%s: tensor \"%s\": shape product overflows", p, name);
        numel *= v;
    }
    if (cJSON_GetArraySize(of) != 2) return sl_errorf("%s: tensor \"%s\": data_offsets must be [begin, end]", p, name);
    for (const cJSON *o = of->child; o; o = o->next) {
        uint64_t v;
        char num[40];
        if (json_uint(o, &v))
            return sl_errorf("%s: tensor \"%s\": data_offsets must be integers in [0, 2^53] (at most the data "
                             "section's %llu bytes), found %s", p, name, (unsigned long long)data_size,
                             cJSON_IsNumber(o) ? sl_json_number_str(num, sizeof num, o->valuedouble) : "a non-number");
        if (o == of->child) t->begin = v;
        else t->end = v;
    }
    if (t->end < t->begin)
        return sl_errorf("%s: tensor \"%s\": data_offsets [%llu, %llu] end before begin", p, name,
                         (unsigned long long)t->begin, (unsigned long long)t->end);
    if (numel > UINT64_MAX / esize || numel * esize != t->end - t->begin)
        return sl_errorf("%s: tensor \"%s\": shape %s of %s needs %llu bytes, data_offsets [%llu, %llu] hold %llu", p, name,
                         sl_st_shape_str(sbuf, sizeof sbuf, nd, t->shape), dt->valuestring,
                         (unsigned long long)(numel * esize), (unsigned long long)t->begin,
                         (unsigned long long)t->end, (unsigned long long)(t->end - t->begin));
    if (t->end > data_size)
        return sl_errorf("%s: tensor \"%s\": data_offsets [%llu, %llu] extend past the data section (%llu bytes; file "
                         "truncated?)", p, name, (unsigned long long)t->begin, (unsigned long long)t->end,
                         (unsigned long long)data_size);
    if (numel > (uint64_t)SIZE_MAX) return sl_errorf("%s: tensor \"%s\" too large", p, name);
    t->numel = (size_t)numel;
    t->name = strdup(name);
    if (!t->name) return sl_errorf("out of memory");
    return 0;
}

static _Thread_local const sl_st_file *sort_ctx;
static int cmp_by_begin(const void *a, const void *b) {
    const sl_st_tensor *x = &sort_ctx->tensors[*(const int *)a], *y = &sort_ctx->tensors[*(const int *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}
static int cmp_by_name(const void *a, const void *b) {
    return strcmp(sort_ctx->tensors[*(const int *)a].name, sort_ctx->tensors[*(const int *)b].name);
}

// Names unique; the tensors tile the data section exactly: sorted by offset, the first begins at 0,
// each begins where the previous ends (no gap, no overlap) and the last ends at the file's end. A
// header length off by one (a padding space dropped) shifts the data section, and so fails here.
static int check_layout(sl_st_file *f, uint64_t data_size) {
    typedef unsigned long long ull;
    int n = f->n_tensors;
    int *ix = sl_malloc((size_t)(n > 0 ? n : 1) * sizeof(int), "safetensors index");
    if (!ix) return -1;
    for (int i = 0; i < n; i++) ix[i] = i;
    int rc = 0;
    sort_ctx = f;   // qsort has no context argument; the context is per thread
    qsort(ix, (size_t)n, sizeof(int), cmp_by_name);
    for (int i = 1; i < n && !rc; i++)
        if (strcmp(f->tensors[ix[i]].name, f->tensors[ix[i - 1]].name) == 0)
            rc = sl_errorf("%s: tensor \"%s\" appears twice in the header", f->path, f->tensors[ix[i]].name);
    qsort(ix, (size_t)n, sizeof(int), cmp_by_begin);
    uint64_t covered = 0;
    for (int i = 0; i < n && !rc; i++) {
        const sl_st_tensor *a = i ? &f->tensors[ix[i - 1]] : NULL, *b = &f->tensors[ix[i]];
        if (b->begin < covered)
            rc = sl_errorf("%s: tensor \"%s\" data_offsets [%llu, %llu] overlap tensor \"%s\" [%llu, %llu]", f->path,
                           b->name, (ull)b->begin, (ull)b->end, a->name, (ull)a->begin, (ull)a->end);
        else if (b->begin > covered)
            rc = sl_errorf("%s: data bytes [%llu, %llu) belong to no tensor (%s%s%s; tensor \"%s\" begins at %llu): "
                           "expected data_offsets contiguous from 0", f->path, (ull)covered, (ull)b->begin,
                           a ? "after tensor \"" : "the data section's start", a ? a->name : "", a ? "\"" : "",
                           b->name, (ull)b->begin);
        covered = b->end;
    }
    if (!rc && covered != data_size)
        rc = sl_errorf("%s: the tensors end at data byte %llu but the data section holds %llu bytes (file size %llu "
                       "minus 8 minus the header length %llu): expected them to cover it exactly (header length "
                       "wrong, or bytes after the last tensor)", f->path, (ull)covered, (ull)data_size,
                       (ull)f->file_size, (ull)(f->data_start - 8));
    sort_ctx = NULL;
    free(ix);
    return rc;
}

static int parse_header(sl_st_file *f, const char *json, size_t len, uint64_t data_size) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= json && at <= json + len ? (long)(at - json) : -1L;
        return sl_errorf("%s: header is not valid JSON (error near header byte %ld, file byte %ld)", f->path, off,
                         off >= 0 ? off + 8 : -1L);
    }
    int rc = 0;
    for (const char *q = end; q && q < json + len && !rc; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r' && *q != '\0')
            rc = sl_errorf("%s: unexpected bytes after the JSON header at header byte %ld", f->path, (long)(q - json));
    if (!rc && !cJSON_IsObject(root)) rc = sl_errorf("%s: header must be a JSON object", f->path);
    int n = rc ? 0 : cJSON_GetArraySize(root);
    if (!rc) {
        f->tensors = sl_calloc((size_t)n, sizeof *f->tensors, "safetensors header");
        if (!f->tensors) rc = -1;
    }
    for (const cJSON *e = rc ? NULL : root->child; e && !rc; e = e->next) {
        if (!e->string) { rc = sl_errorf("%s: header entry without a name", f->path); break; }
        if (strcmp(e->string, "__metadata__") == 0) {
            if (f->meta_keys) rc = sl_errorf("%s: \"__metadata__\" appears twice", f->path);
            else rc = parse_metadata(f, e);
            continue;
        }
        rc = parse_tensor(f, e, data_size, &f->tensors[f->n_tensors]);
        if (!rc) f->n_tensors++;
    }
    cJSON_Delete(root);
    if (!rc) rc = check_layout(f, data_size);
    return rc;
}

int sl_st_open(sl_st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) return sl_errorf("out of memory");
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) { int e = errno; sl_st_close(f); return sl_errorf("%s: cannot open: %s", path, strerror(e)); }
    struct stat st;
    if (fstat(f->fd, &st) != 0) { int e = errno; sl_st_close(f); return sl_errorf("%s: cannot stat: %s", path, strerror(e)); }
    if (sl_not_a_file(st.st_mode)) { sl_st_close(f); return sl_errorf("%s: %s", path, sl_not_a_file(st.st_mode)); }
    f->file_size = (uint64_t)st.st_size;
    unsigned char lenbuf[8];
    if (f->file_size < 8 || read_exact(f->fd, lenbuf, 8, 0)) {
        sl_st_close(f);
        return sl_errorf("%s: file is %llu bytes, too short for the 8-byte header length", path,
                         (unsigned long long)st.st_size);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenbuf[i];
    if (n > SL_ST_MAX_HEADER || n > f->file_size - 8) {
        sl_errorf("%s: header length %llu is %s (file is %llu bytes; at most %u accepted): not a safetensors file "
                         "or truncated", path, (unsigned long long)n, n > f->file_size - 8 ? "larger than the file" : "absurd",
                         (unsigned long long)f->file_size, SL_ST_MAX_HEADER);
        sl_st_close(f);
        return -1;
    }
    if (n < 2) { sl_st_close(f); return sl_errorf("%s: header length %llu is too small for a JSON object", path, (unsigned long long)n); }
    char *json = sl_malloc((size_t)n + 1, "safetensors header");
    if (!json) { sl_st_close(f); return -1; }
    if (read_exact(f->fd, json, (size_t)n, 8)) {
        free(json); sl_st_close(f);
        return sl_errorf("%s: short read of the %llu-byte header", path, (unsigned long long)n);
    }
    json[n] = '\0';
    f->data_start = 8 + n;
    int rc = parse_header(f, json, (size_t)n, f->file_size - f->data_start);
    free(json);
    if (rc) { sl_st_close(f); return -1; }
    return 0;
}

int sl_st_find(const sl_st_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return i;
    return -1;
}

const char *sl_st_metadata(const sl_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);           // inf / nan
    else if (exp != 0) bits = sign | ((exp + 112u) << 23) | (mant << 13); // normal: rebias 15 -> 127
    else if (mant == 0) bits = sign;                                     // +-0
    else {                                                               // subnormal: normalise
        int e = -1;
        do { e++; mant <<= 1; } while (!(mant & 0x400u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

int sl_st_read_f32_range(const sl_st_file *f, int idx, size_t first, size_t count, float *out) {
    if (idx < 0 || idx >= f->n_tensors) return sl_errorf("%s: tensor index %d out of range", f->path, idx);
    const sl_st_tensor *t = &f->tensors[idx];
    if (!sl_st_dtype_is_float(t->dtype))
        return sl_errorf("%s: tensor \"%s\": dtype %s is not supported (expected F32, F16, BF16 or F64)", f->path,
                         t->name, sl_st_dtype_name(t->dtype));
    if (first > t->numel || count > t->numel - first)
        return sl_errorf("%s: tensor \"%s\": range [%zu, %zu) outside its %zu elements", f->path, t->name, first,
                         first + count, t->numel);
    size_t es = sl_st_dtype_size(t->dtype);
    uint64_t off = f->data_start + t->begin + (uint64_t)first * es;
    if (t->dtype == SL_ST_F32) {
        if (read_exact(f->fd, out, count * 4, off))
            return sl_errorf("%s: tensor \"%s\": read failed at byte %llu (file changed or truncated?)", f->path, t->name,
                             (unsigned long long)off);
        return 0;
    }
    enum { CHUNK = 1 << 16 };
    unsigned char *buf = sl_malloc(CHUNK * 8, "safetensors read buffer");
    if (!buf) return -1;
    for (size_t done = 0; done < count;) {
        size_t m = count - done < CHUNK ? count - done : CHUNK;
        if (read_exact(f->fd, buf, m * es, off + done * es)) {
            free(buf);
            return sl_errorf("%s: tensor \"%s\": read failed at byte %llu (file changed or truncated?)", f->path, t->name,
                             (unsigned long long)(off + done * es));
        }
        for (size_t i = 0; i < m; i++) {
            if (t->dtype == SL_ST_F16 || t->dtype == SL_ST_BF16) {
                uint16_t h;
                memcpy(&h, buf + 2 * i, 2);
                if (t->dtype == SL_ST_F16) out[done + i] = half_to_float(h);
                else { uint32_t bits = (uint32_t)h << 16; memcpy(&out[done + i], &bits, 4); }
            } else {
                double d;
                memcpy(&d, buf + 8 * i, 8);
                out[done + i] = (float)d;
            }
        }
        done += m;
    }
    free(buf);
    return 0;
}

int sl_st_read_f32(const sl_st_file *f, int idx, float *out, size_t capacity) {
    if (idx < 0 || idx >= f->n_tensors) return sl_errorf("%s: tensor index %d out of range", f->path, idx);
    if (capacity < f->tensors[idx].numel)
        return sl_errorf("%s: tensor \"%s\": has %zu elements, destination holds %zu", f->path, f->tensors[idx].name,
                         f->tensors[idx].numel, capacity);
    return sl_st_read_f32_range(f, idx, 0, f->tensors[idx].numel, out);
}

int sl_st_read_raw(const sl_st_file *f, int idx, void *out, size_t cap) {
    if (idx < 0 || idx >= f->n_tensors) return sl_errorf("%s: tensor index %d out of range", f->path, idx);
    const sl_st_tensor *t = &f->tensors[idx];
    uint64_t bytes = t->end - t->begin;
    if (bytes > cap)
        return sl_errorf("%s: tensor \"%s\": has %llu bytes, destination holds %zu", f->path, t->name,
                         (unsigned long long)bytes, cap);
    if (bytes && read_exact(f->fd, out, (size_t)bytes, f->data_start + t->begin))
        return sl_errorf("%s: tensor \"%s\": read failed at byte %llu (file changed or truncated?)", f->path, t->name,
                         (unsigned long long)(f->data_start + t->begin));
    return 0;
}

// ---------------------------------------------------------------- writer

struct sl_st_writer {
    char *path, *tmp;
    int fd;
    uint64_t expected, written;   // data bytes
};

static int write_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w; len -= (size_t)w;
    }
    return 0;
}

void sl_st_writer_abort(sl_st_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w);
}

// Builds the padded header for desc; returns malloc'd bytes (length prefix included) or NULL.
static char *build_header(const char *path, int n, const sl_st_desc *desc, const sl_st_dtype *dtypes, int n_meta,
                          const char *const *mk, const char *const *mv, size_t *len_out, uint64_t *data_bytes) {
    cJSON *root = cJSON_CreateObject();
    if (!root) { sl_errorf("out of memory"); return NULL; }
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; m && i < n_meta; i++) cJSON_AddStringToObject(m, mk[i], mv[i]);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const sl_st_desc *d = &desc[i];
        if (!d->name || !*d->name || strcmp(d->name, "__metadata__") == 0 || d->ndim < 0 || d->ndim > SL_ST_MAX_DIMS) {
            cJSON_Delete(root);
            sl_errorf("%s: tensor %d (\"%s\"): invalid name or ndim %d", path, i, d->name ? d->name : "(null)", d->ndim);
            return NULL;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, d->name)) {
            cJSON_Delete(root);
            sl_errorf("%s: tensor \"%s\" given twice", path, d->name);
            return NULL;
        }
        uint64_t numel = 1;
        double shape[SL_ST_MAX_DIMS];
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] < 0) {
                cJSON_Delete(root);
                sl_errorf("%s: tensor \"%s\": negative dimension %lld", path, d->name, (long long)d->shape[k]);
                return NULL;
            }
            numel *= (uint64_t)d->shape[k];
            shape[k] = (double)d->shape[k];
        }
        sl_st_dtype dt = dtypes ? dtypes[i] : SL_ST_F32;
        size_t es = sl_st_dtype_size(dt);
        if (!es) {
            cJSON_Delete(root);
            sl_errorf("%s: tensor \"%s\": unknown dtype %d", path, d->name, (int)dt);
            return NULL;
        }
        cJSON *e = cJSON_AddObjectToObject(root, d->name);
        cJSON_AddStringToObject(e, "dtype", sl_st_dtype_name(dt));
        cJSON_AddItemToObject(e, "shape", cJSON_CreateDoubleArray(shape, d->ndim));
        double offs[2] = {(double)off, (double)(off + numel * es)};
        cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
        off += numel * es;
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) { sl_errorf("%s: out of memory building the header", path); return NULL; }
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;   // 8 + hl is a multiple of 8
    char *out = malloc(8 + hl);
    if (!out) { free(json); sl_errorf("out of memory"); return NULL; }
    for (int i = 0; i < 8; i++) out[i] = (char)(((uint64_t)hl >> (8 * i)) & 0xff);
    memcpy(out + 8, json, jl);
    memset(out + 8 + jl, ' ', hl - jl);
    free(json);
    *len_out = 8 + hl;
    *data_bytes = off;
    return out;
}

int sl_st_writer_open(sl_st_writer **wp, const char *path, int n, const sl_st_desc *desc, int n_meta,
                      const char *const *meta_keys, const char *const *meta_values) {
    return sl_st_writer_open_dtypes(wp, path, n, desc, NULL, n_meta, meta_keys, meta_values);
}

int sl_st_writer_open_dtypes(sl_st_writer **wp, const char *path, int n, const sl_st_desc *desc,
                             const sl_st_dtype *dtypes, int n_meta, const char *const *meta_keys,
                             const char *const *meta_values) {
    *wp = NULL;
    size_t hlen;
    uint64_t data_bytes;
    char *header = build_header(path, n, desc, dtypes, n_meta, meta_keys, meta_values, &hlen, &data_bytes);
    if (!header) return -1;
    sl_st_writer *w = calloc(1, sizeof *w);
    size_t tl = strlen(path) + 32;
    if (w) { w->fd = -1; w->path = strdup(path); w->tmp = malloc(tl); }
    if (!w || !w->path || !w->tmp) { free(header); sl_st_writer_abort(w); return sl_errorf("out of memory"); }
    snprintf(w->tmp, tl, "%s.tmp.%d", path, (int)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(header); free(w->tmp); w->tmp = NULL; sl_st_writer_abort(w);
        char tmpname[4096];
        snprintf(tmpname, sizeof tmpname, "%s.tmp.%d", path, (int)getpid());
        return sl_errorf("%s: cannot create: %s", tmpname, strerror(e));
    }
    w->expected = data_bytes;
    int rc = write_all(w->fd, header, hlen);
    free(header);
    if (rc) { int e = errno; rc = sl_errorf("%s: write failed: %s", w->tmp, strerror(e)); sl_st_writer_abort(w); return rc; }
    *wp = w;
    return 0;
}

int sl_st_writer_write_raw(sl_st_writer *w, const void *data, size_t bytes) {
    if (bytes > w->expected - w->written)
        return sl_errorf("%s: writing %zu more bytes than the header declares (%llu bytes)", w->path, bytes,
                         (unsigned long long)w->expected);
    if (write_all(w->fd, data, bytes))
        return sl_errorf("%s: write failed after %llu data bytes: %s", w->tmp, (unsigned long long)w->written,
                         strerror(errno));
    w->written += bytes;
    return 0;
}

int sl_st_writer_write(sl_st_writer *w, const float *data, size_t count) {
    if (count > (w->expected - w->written) / 4)
        return sl_errorf("%s: writing %zu more floats than the header declares (%llu bytes)", w->path, count,
                         (unsigned long long)w->expected);
    return sl_st_writer_write_raw(w, data, count * 4);
}

int sl_st_writer_finish(sl_st_writer *w) {
    int rc = 0;
    if (w->written != w->expected)
        rc = sl_errorf("%s: %llu data bytes written, the header declares %llu", w->path,
                       (unsigned long long)w->written, (unsigned long long)w->expected);
    else if (fsync(w->fd) != 0)
        rc = sl_errorf("%s: fsync failed: %s", w->tmp, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0 && !rc) rc = sl_errorf("%s: close failed: %s", w->tmp, strerror(errno));
    if (!rc && rename(w->tmp, w->path) != 0)
        rc = sl_errorf("%s: rename from %s failed: %s", w->path, w->tmp, strerror(errno));
    if (rc) { sl_st_writer_abort(w); return -1; }
    char *dir = strdup(w->path);
    free(w->tmp); w->tmp = NULL;   // renamed: nothing to remove
    rc = dir ? sl_fsync_dir(dirname(dir)) : sl_errorf("out of memory");
    free(dir);
    sl_st_writer_abort(w);
    return rc;
}

int sl_st_write_f32(const char *path, int n, const sl_st_desc *desc, const float *const *data, int n_meta,
                    const char *const *meta_keys, const char *const *meta_values) {
    sl_st_writer *w;
    if (sl_st_writer_open(&w, path, n, desc, n_meta, meta_keys, meta_values)) return -1;
    for (int i = 0; i < n; i++) {
        size_t numel = 1;
        for (int k = 0; k < desc[i].ndim; k++) numel *= (size_t)desc[i].shape[k];
        if (numel && sl_st_writer_write(w, data[i], numel)) { sl_st_writer_abort(w); return -1; }
    }
    return sl_st_writer_finish(w);
}
