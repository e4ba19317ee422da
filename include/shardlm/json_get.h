// json_get.h: typed reads of one key of a cJSON object, for configuration parsing. Each returns 0
// and leaves *out untouched when the key is absent or null (unless `required`), 0 after storing a
// valid value, and -1 with a message naming `where` and the key when the value has the wrong type.
#ifndef SHARDLM_JSON_GET_H
#define SHARDLM_JSON_GET_H

#include <stddef.h>
#include <cjson/cJSON.h>

int sl_json_get_int(const cJSON *obj, const char *key, int *out, int required, int min_value, const char *where);
int sl_json_get_float(const cJSON *obj, const char *key, float *out, const char *where);
int sl_json_get_bool(const cJSON *obj, const char *key, int *out, const char *where);
int sl_json_get_string(const cJSON *obj, const char *key, char *out, size_t cap, const char *where);

// Writes into list (cap bytes) the keys of obj not in the NULL-terminated `known` list, ", "-separated
// (a key that does not fit is cut short and ends the list); returns the length of the whole keys
// written (0: every key is known).
size_t sl_json_unknown_keys(const cJSON *obj, const char *const *known, char *list, size_t cap);
// Writes a warning line to stderr naming every key of obj not in the NULL-terminated `known` list.
void sl_json_warn_unknown(const cJSON *obj, const char *const *known, const char *where);

#endif
