// json_get.c: typed, checked reads of configuration keys (see json_get.h).
#include "shardlm/json_get.h"
#include "shardlm/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_json_get_int(const cJSON *obj, const char *key, int *out, int required, int min_value, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return required ? sl_errorf("%s: missing required key \"%s\"", where, key) : 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < (double)min_value || d > 2147483647.0)
        return sl_errorf("%s: \"%s\" must be an integer >= %d", where, key, min_value);
    *out = (int)d;
    return 0;
}

const char *sl_json_number_str(char *buf, size_t cap, double v) {
    if (v == floor(v) && fabs(v) < 1e21) snprintf(buf, cap, "%.0f", v);   // whole numbers in full
    else snprintf(buf, cap, "%.15g", v);
    if (strtod(buf, NULL) != v) snprintf(buf, cap, "%.17g", v);
    return buf;
}

int sl_json_get_i64(const cJSON *obj, const char *key, int64_t *out, int required, int64_t min_value,
                    int64_t max_value, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return required ? sl_errorf("%s: missing required key \"%s\"", where, key) : 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d)) || d < (double)min_value || d > (double)max_value) {
        char found[48];
        if (cJSON_IsNumber(v)) sl_json_number_str(found, sizeof found, d);
        else snprintf(found, sizeof found, "%s", cJSON_IsString(v) ? "a string" : cJSON_IsBool(v) ? "a boolean" : "a non-number");
        return sl_errorf("%s: \"%s\" must be an integer in [%lld, %lld], found %s", where, key, (long long)min_value,
                         (long long)max_value, found);
    }
    *out = (int64_t)d;
    return 0;
}

int sl_json_get_float(const cJSON *obj, const char *key, float *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) <= 3.0e38))
        return sl_errorf("%s: \"%s\" must be a finite number", where, key);
    *out = (float)v->valuedouble;
    return 0;
}

int sl_json_get_bool(const cJSON *obj, const char *key, int *out, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return sl_errorf("%s: \"%s\" must be true or false", where, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

int sl_json_get_string(const cJSON *obj, const char *key, char *out, size_t cap, const char *where) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return sl_errorf("%s: \"%s\" must be a string", where, key);
    if (strlen(v->valuestring) >= cap) return sl_errorf("%s: \"%s\" is longer than %zu bytes", where, key, cap - 1);
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return 0;
}

size_t sl_json_unknown_keys(const cJSON *obj, const char *const *known, char *list, size_t cap) {
    size_t used = 0;
    if (cap) list[0] = '\0';
    for (const cJSON *it = obj->child; it; it = it->next) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(known[i], it->string) == 0;
        if (ok) continue;
        int n = snprintf(list + used, cap - used, "%s%s", used ? ", " : "", it->string);
        if (n < 0 || (size_t)n >= cap - used) break;  // the last key is left cut short
        used += (size_t)n;
    }
    return used;
}

void sl_json_warn_unknown(const cJSON *obj, const char *const *known, const char *where) {
    char list[1024];
    if (sl_json_unknown_keys(obj, known, list, sizeof list))
        fprintf(stderr, "warning: %s: unknown keys ignored: %s\n", where, list);
}
