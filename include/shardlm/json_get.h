// json_get.h: typed reads of one key of a cJSON object, for configuration parsing. Each returns 0
// and leaves *out untouched when the key is absent or null (unless `required`), 0 after storing a
// valid value, and -1 with a message naming `where` and the key when the value has the wrong type.
#ifndef SHARDLM_JSON_GET_H
#define SHARDLM_JSON_GET_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

int sl_json_get_int(const cJSON *obj, const char *key, int *out, int required, int min_value, const char *where);
int sl_json_get_float(const cJSON *obj, const char *key, float *out, const char *where);
int sl_json_get_bool(const cJSON *obj, const char *key, int *out, const char *where);
int sl_json_get_string(const cJSON *obj, const char *key, char *out, size_t cap, const char *where);

// A 64-bit integer in [min_value, max_value]; both must lie within +-SL_JSON_INT_EXACT (the integers a
// JSON number, read as a double, holds exactly). Out of range: "WHERE: "KEY" must be an integer in
// [MIN, MAX], found 1e+30".
#define SL_JSON_INT_EXACT 9007199254740992LL  // 2^53
int sl_json_get_i64(const cJSON *obj, const char *key, int64_t *out, int required, int64_t min_value,
                    int64_t max_value, const char *where);

// v for messages: whole numbers below 1e21 in full, else the fewest digits (%.15g, else %.17g) that
// read back as v; returns buf.
const char *sl_json_number_str(char *buf, size_t cap, double v);

// Strict parsing (json_strict.c) for files shardlm reads back: text[0..len) must be one JSON value with
// nothing but whitespace after it, and no object may hold a key twice (cJSON would keep the first).
// Returns the tree (caller frees with cJSON_Delete), or NULL with an error naming `where` and the
// byte offset (line, column), saying when the parser's nesting limit (CJSON_NESTING_LIMIT) was hit,
// or naming the repeated key and the object holding it.
cJSON *sl_json_parse_strict(const char *text, size_t len, const char *where);
// Reads the file at path and parses it strictly (errors name the path).
cJSON *sl_json_read_strict(const char *path);

// Writes into list (cap bytes) the keys of obj not in the NULL-terminated `known` list, ", "-separated
// (a key that does not fit is cut short and ends the list); returns the length of the whole keys
// written (0: every key is known).
size_t sl_json_unknown_keys(const cJSON *obj, const char *const *known, char *list, size_t cap);
// Writes a warning line to stderr naming every key of obj not in the NULL-terminated `known` list.
void sl_json_warn_unknown(const cJSON *obj, const char *const *known, const char *where);

#endif
