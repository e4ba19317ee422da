// json_strict.c: strict JSON parsing for files shardlm reads back (training configs, trainer state,
// checkpoint manifests, vocabularies): one value and nothing after it, each object key once, and
// errors that give the byte offset (line, column) and say when the nesting limit was hit.
#include "shardlm/json_get.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Line and column (1-based) of byte `off` of text.
static void line_col(const char *text, size_t off, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

// The bracket depth at byte `off` (strings skipped): how deep the parser was when it stopped.
static int depth_at(const char *text, size_t off) {
    int depth = 0, in_string = 0;
    for (size_t i = 0; i < off; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') in_string = 1;
        else if (c == '[' || c == '{') depth++;
        else if (c == ']' || c == '}') depth--;
    }
    return depth;
}

static int only_space(const char *text, size_t from, size_t len) {
    while (from < len && (text[from] == ' ' || text[from] == '\t' || text[from] == '\n' || text[from] == '\r')) from++;
    return from >= len;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// First key that some object under v holds twice; its object's path (".a.b[2]") goes into path.
static const char *duplicate_key(const cJSON *v, char *path, size_t cap, size_t used) {
    if (!cJSON_IsObject(v) && !cJSON_IsArray(v)) return NULL;
    int n = cJSON_GetArraySize(v);
    if (cJSON_IsObject(v) && n > 1) {
        const char **keys = malloc((size_t)n * sizeof *keys);
        if (!keys) return NULL;  // the check is skipped, never wrong, when memory is short
        int k = 0;
        for (const cJSON *c = v->child; c; c = c->next) keys[k++] = c->string ? c->string : "";
        qsort(keys, (size_t)n, sizeof *keys, cmp_str);
        const char *dup = NULL;
        for (int i = 1; i < n && !dup; i++)
            if (strcmp(keys[i - 1], keys[i]) == 0) dup = keys[i];
        free(keys);
        if (dup) return dup;
    }
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
        int w = cJSON_IsObject(v) ? snprintf(path + used, cap - used, ".%s", c->string ? c->string : "")
                                  : snprintf(path + used, cap - used, "[%d]", i);
        size_t next = w > 0 && (size_t)w < cap - used ? used + (size_t)w : used;
        const char *dup = duplicate_key(c, path, cap, next);
        if (dup) return dup;
        path[used] = '\0';
    }
    return NULL;
}

cJSON *sl_json_parse_strict(const char *text, size_t len, const char *where) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    size_t off = end && end >= text && end <= text + len ? (size_t)(end - text) : len, line, col;
    if (!root) {
        line_col(text, off, &line, &col);
        if (depth_at(text, off) >= CJSON_NESTING_LIMIT)
            sl_errorf("%s: JSON nested deeper than %d levels (the parser's nesting limit) at byte %zu (line %zu, "
                      "column %zu)", where, CJSON_NESTING_LIMIT, off, line, col);
        else if (only_space(text, off + 1, len))
            sl_errorf("%s: malformed JSON: unexpected end of input at byte %zu (line %zu, column %zu; truncated?)",
                      where, off, line, col);
        else
            sl_errorf("%s: malformed JSON at byte %zu (line %zu, column %zu)", where, off, line, col);
        return NULL;
    }
    if (!only_space(text, off, len)) {
        while (text[off] == ' ' || text[off] == '\t' || text[off] == '\n' || text[off] == '\r') off++;
        line_col(text, off, &line, &col);
        sl_errorf("%s: unexpected data after the JSON value at byte %zu (line %zu, column %zu): expected the end of "
                  "the file", where, off, line, col);
        cJSON_Delete(root);
        return NULL;
    }
    char path[512] = "";
    const char *dup = duplicate_key(root, path, sizeof path, 0);
    if (dup) {
        sl_errorf("%s: key \"%s\" appears twice in %s%s; expected each key once", where, dup,
                  path[0] ? "object " : "the top-level object", path[0] ? path + 1 : "");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

cJSON *sl_json_read_strict(const char *path) {
    size_t len;
    char *text = sl_read_text_file(path, &len);
    if (!text) return NULL;
    cJSON *root = sl_json_parse_strict(text, len, path);
    free(text);
    return root;
}
