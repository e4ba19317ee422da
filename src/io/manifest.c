// manifest.c: reading and verifying a checkpoint's manifest.json (see manifest.h); engine_ckpt.c
// writes it. Invariants: a loaded manifest's shards tile [0, total) in order; a verified file had
// exactly the manifest's size and FNV-1a 64 when it was read.
#include "shardlm/manifest.h"
#include "shardlm/error.h"
#include "shardlm/fileio.h"
#include "shardlm/json_get.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int sl_file_fnv1a64(const char *path, uint64_t basis, uint64_t *hash, uint64_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return sl_errorf("%s: cannot open for checksum: %s", path, strerror(errno));
    struct stat st;
    const char *why = fstat(fileno(f), &st) != 0 ? "cannot stat" : sl_not_a_file(st.st_mode);
    if (why) { fclose(f); return sl_errorf("%s: %s", path, why); }
    uint64_t h = basis, n = 0;
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        h = sl_fnv1a64(h, buf, got);
        n += got;
    }
    int err = ferror(f);
    fclose(f);
    if (err) return sl_errorf("%s: read error while checksumming", path);
    *hash = h;
    *bytes = n;
    return 0;
}

// One "files" / "optimizer_shards" entry: a plain file name, its size and checksum, checked on disk
// when `verify`.
static int check_entry(const char *dir, const char *where, const cJSON *f, int i, uint64_t basis, int verify,
                       const char **name_out) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "file");
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(f, "fnv1a64");
    int64_t bytes = 0;
    if (!cJSON_IsString(name) || !name->valuestring[0] || strchr(name->valuestring, '/') || !cJSON_IsString(hash))
        return sl_errorf("%s: entry %d needs \"file\" (a plain name), \"bytes\" and \"fnv1a64\"", where, i);
    char field[4700];
    snprintf(field, sizeof field, "%s: entry \"%.200s\"", where, name->valuestring);
    if (sl_json_get_i64(f, "bytes", &bytes, 1, 0, SL_JSON_INT_EXACT, field)) return -1;
    *name_out = name->valuestring;
    if (!verify) return 0;
    char path[4400], hex[24];
    snprintf(path, sizeof path, "%s/%s", dir, name->valuestring);
    uint64_t h = 0, b = 0;
    if (sl_file_fnv1a64(path, basis, &h, &b)) return -1;
    snprintf(hex, sizeof hex, "%016" PRIx64, h);
    if (b != (uint64_t)bytes)
        return sl_errorf("%s: %lld bytes expected by the manifest, %" PRIu64 " found (truncated or replaced)", path,
                         (long long)bytes, b);
    if (strcmp(hex, hash->valuestring) != 0)
        return sl_errorf("%s: checksum %s differs from the manifest's %s (corrupted)", path, hex, hash->valuestring);
    return 0;
}

// One optimizer shard's range, integers in [0, total].
static int shard_range(const char *where, const cJSON *f, const char *name, size_t total, sl_manifest_shard *s) {
    char field[4700];
    snprintf(field, sizeof field, "%s: shard \"%.200s\"", where, name);
    int64_t b = 0, e = 0;
    int64_t t = total > 0 && total < (size_t)SL_JSON_INT_EXACT ? (int64_t)total : SL_JSON_INT_EXACT;
    if (sl_json_get_i64(f, "begin", &b, 1, 0, t, field) || sl_json_get_i64(f, "end", &e, 1, b, t, field)) return -1;
    snprintf(s->file, sizeof s->file, "%s", name);
    s->begin = (size_t)b;
    s->end = (size_t)e;
    return 0;
}

static int parse(sl_manifest *m, const cJSON *root, const char *dir, const char *where, size_t total,
                 sl_verify_level level) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *shards = cJSON_GetObjectItemCaseSensitive(root, "optimizer_shards");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(root, "state_tensors");
    int v2 = cJSON_IsString(fmt) && strcmp(fmt->valuestring, SL_MANIFEST_FORMAT_V2) == 0;
    if (!cJSON_IsString(fmt) || (!v2 && strcmp(fmt->valuestring, SL_MANIFEST_FORMAT) != 0))
        return sl_errorf("%s: format must be \"%s\" (or the older \"%s\")", where, SL_MANIFEST_FORMAT,
                         SL_MANIFEST_FORMAT_V2);
    if (!cJSON_IsArray(shards) || !cJSON_IsArray(files))
        return sl_errorf("%s: missing \"optimizer_shards\" or \"files\" arrays", where);
    uint64_t basis = v2 ? SL_FNV1A64_INIT_V2 : SL_FNV1A64_INIT;
    if (v2 && level != SL_VERIFY_NONE)
        fprintf(stderr, "note: %s is format %s, hashed from the old FNV-1a offset basis %llu: verified with it\n",
                where, SL_MANIFEST_FORMAT_V2, (unsigned long long)SL_FNV1A64_INIT_V2);
    for (const cJSON *it = cJSON_IsArray(names) ? names->child : NULL; it && m->n_state < 2; it = it->next)
        if (cJSON_IsString(it)) snprintf(m->state_names[m->n_state++], sizeof m->state_names[0], "%s", it->valuestring);
    int i = 0;
    const char *name;
    for (const cJSON *f = files->child; f; f = f->next, i++)
        if (check_entry(dir, where, f, i, basis, level >= SL_VERIFY_FILES, &name)) return -1;
    m->n_shards = cJSON_GetArraySize(shards);
    m->shards = m->n_shards > 0 ? sl_calloc((size_t)m->n_shards, sizeof *m->shards, "manifest") : NULL;
    if (m->n_shards > 0 && !m->shards) return -1;
    i = 0;
    for (const cJSON *f = shards->child; f; f = f->next, i++)
        if (check_entry(dir, where, f, i, basis, level >= SL_VERIFY_ALL, &name) ||
            shard_range(where, f, name, total, &m->shards[i]))
            return -1;
    size_t covered = 0;  // the shards must tile [0, total)
    for (i = 0; i < m->n_shards && total > 0; i++) {
        if (m->shards[i].begin != covered)
            return sl_errorf("%s: optimizer shards do not tile the state (gap or overlap at %zu)", where, covered);
        covered = m->shards[i].end;
    }
    if (m->n_shards > 0 && total > 0 && covered != total)
        return sl_errorf("%s: optimizer shards cover %zu of %zu elements", where, covered, total);
    return 0;
}

int sl_manifest_load(sl_manifest *m, const char *dir, size_t total, sl_verify_level level) {
    memset(m, 0, sizeof *m);
    char path[4400];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    cJSON *root = sl_json_read_strict(path);
    if (!root) return -1;
    int rc = parse(m, root, dir, path, total, level);
    cJSON_Delete(root);
    if (rc) sl_manifest_free(m);
    return rc;
}

void sl_manifest_free(sl_manifest *m) {
    free(m->shards);
    memset(m, 0, sizeof *m);
}

int sl_manifest_verify_weights_dir(const char *dir) {
    char manifest[4400], state[4400];
    struct stat st;
    snprintf(manifest, sizeof manifest, "%s/manifest.json", dir);
    snprintf(state, sizeof state, "%s/trainer_state.json", dir);
    int has_manifest = stat(manifest, &st) == 0, has_state = stat(state, &st) == 0;
    if (!has_manifest && !has_state) return 0;   // a Hugging Face directory: nothing to verify against
    if (!has_manifest)
        return sl_errorf("%s: a shardlm checkpoint (it has trainer_state.json) without manifest.json: its files "
                         "cannot be verified (pass --no-verify to load it anyway)", dir);
    sl_manifest m;
    int rc = sl_manifest_load(&m, dir, 0, SL_VERIFY_FILES);
    sl_manifest_free(&m);
    return rc ? sl_error_context("verifying checkpoint %s (pass --no-verify to skip)", dir) : 0;
}
