// quant_state.c: bitsandbytes' packed quant_state JSON (see quant_state.h).
#include "shardlm/quant_state.h"
#include "shardlm/error.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sl_python_float_repr(char *buf, size_t cap, double v) {
    if (isnan(v)) { snprintf(buf, cap, "NaN"); return buf; }
    if (isinf(v)) { snprintf(buf, cap, v < 0 ? "-Infinity" : "Infinity"); return buf; }   // json.dumps' words
    if (v == 0) { snprintf(buf, cap, signbit(v) ? "-0.0" : "0.0"); return buf; }
    char e[64];
    int p = 1;
    for (; p < 17; p++) {   // the fewest significant digits that read back as v
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, v);
    // e = [-]d[.ddd]e[+-]XX: its digits and exponent, then Python's layout
    const char *s = e;
    int neg = *s == '-';
    if (neg) s++;
    char digits[32];
    int nd = 0;
    for (; *s && *s != 'e'; s++) if (*s != '.') digits[nd++] = *s;
    digits[nd] = 0;
    int exp = atoi(s + 1);
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp < -4 || exp >= 16) {   // scientific: d[.ddd]e[+-]XX
        out[o++] = digits[0];
        if (nd > 1) { out[o++] = '.'; memcpy(out + o, digits + 1, (size_t)nd - 1); o += (size_t)nd - 1; }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {          // 0.000ddd
        out[o++] = '0'; out[o++] = '.';
        for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
        memcpy(out + o, digits, (size_t)nd); o += (size_t)nd;
    } else {                       // ddd.ddd, at least one digit after the point
        for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > exp + 1) { memcpy(out + o, digits + exp + 1, (size_t)(nd - exp - 1)); o += (size_t)(nd - exp - 1); }
        else out[o++] = '0';
    }
    out[o] = 0;
    snprintf(buf, cap, "%s", out);
    return buf;
}

char *sl_quant_state_json(const sl_qtensor *q) {
    char off[64], *s = malloc(512);
    if (!s) { sl_errorf("out of memory"); return NULL; }
    int n = snprintf(s, 512, "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [%lld, %lld]",
                     sl_quant_name(q->type), q->blocksize, sl_quant_dtype_name(q->dtype), (long long)q->rows,
                     (long long)q->cols);
    if (q->nested)
        n += snprintf(s + n, 512 - (size_t)n,
                      ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %s",
                      SL_QUANT_NESTED_BLOCK, sl_python_float_repr(off, sizeof off, (double)q->offset));
    snprintf(s + n, 512 - (size_t)n, "}");
    return s;
}

static const char *const keys[] = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize",
                                   "nested_dtype", "nested_offset", NULL};

static int parse_obj(const cJSON *o, sl_qtensor *q, const char *w) {
    if (!cJSON_IsObject(o)) return sl_errorf("%s: expected a JSON object", w);
    char unknown[256];
    if (sl_json_unknown_keys(o, keys, unknown, sizeof unknown))
        return sl_errorf("%s: unknown key(s) %s (expected quant_type, blocksize, dtype, shape and the nested_ keys)", w,
                         unknown);
    char qt[16] = "", dt[16] = "";
    int bs = 0;
    if (sl_json_get_string(o, "quant_type", qt, sizeof qt, w) || sl_json_get_string(o, "dtype", dt, sizeof dt, w) ||
        sl_json_get_int(o, "blocksize", &bs, 1, 1, w))
        return -1;
    if (strcmp(qt, "nf4") && strcmp(qt, "fp4"))
        return sl_errorf("%s: quant_type \"%s\" is unknown (expected \"nf4\" or \"fp4\")", w, qt);
    sl_quant_parse(qt, &q->type);
    if (sl_quant_dtype_parse(dt, &q->dtype)) return sl_error_context("%s: dtype", w);
    int ok_bs = 0;
    for (int v = 32; v <= 4096; v *= 2) ok_bs |= bs == v;
    if (!ok_bs) return sl_errorf("%s: blocksize %d (expected 32, 64, 128, ..., 4096)", w, bs);
    q->blocksize = bs;
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const cJSON *a = sh ? cJSON_GetArrayItem(sh, 0) : NULL, *b = sh ? cJSON_GetArrayItem(sh, 1) : NULL;
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
        a->valuedouble < 1 || b->valuedouble < 1 || a->valuedouble * b->valuedouble > 1e15 ||
        a->valuedouble != floor(a->valuedouble) || b->valuedouble != floor(b->valuedouble))
        return sl_errorf("%s: \"shape\" must be [out_features, in_features], two positive integers", w);
    q->rows = (int64_t)a->valuedouble;
    q->cols = (int64_t)b->valuedouble;
    q->numel = (size_t)q->rows * (size_t)q->cols;
    const cJSON *nb = cJSON_GetObjectItemCaseSensitive(o, "nested_blocksize");
    const cJSON *nd = cJSON_GetObjectItemCaseSensitive(o, "nested_dtype");
    const cJSON *no = cJSON_GetObjectItemCaseSensitive(o, "nested_offset");
    q->nested = nb || nd || no;
    if (!q->nested) return 0;
    if (!cJSON_IsNumber(nb) || nb->valuedouble != SL_QUANT_NESTED_BLOCK)
        return sl_errorf("%s: \"nested_blocksize\" must be %d (bitsandbytes' double quantisation)", w,
                         SL_QUANT_NESTED_BLOCK);
    if (!cJSON_IsString(nd) || strcmp(nd->valuestring, "float32"))
        return sl_errorf("%s: \"nested_dtype\" must be \"float32\"", w);
    if (!cJSON_IsNumber(no) || !isfinite(no->valuedouble) || !isfinite((float)no->valuedouble))
        return sl_errorf("%s: \"nested_offset\" must be a finite number", w);
    q->offset = (float)no->valuedouble;
    return 0;
}

int sl_quant_state_parse(const char *text, size_t len, sl_qtensor *q, const char *w) {
    cJSON *o = sl_json_parse_strict(text, len, w);
    if (!o) return -1;
    int rc = parse_obj(o, q, w);
    cJSON_Delete(o);
    return rc;
}
